//! `ReplicateConfig` and `SoftPinAction`: Mooncake's placement settings of a put.
//!
//! Moongate's master places by replica count, preferred segments and pins; the other
//! fields are kept (so code that sets them runs unchanged) and have no effect: the
//! NoF/DFS replica counts, `prefer_alloc_in_same_node`, `data_type` and `group_ids`.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// What a put does to the object's soft pin (Mooncake 0.3.13).
#[pyclass(module = "moongate.store", eq, eq_int, from_py_object)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SoftPinAction {
    /// Leave it as it is (a new object: not soft-pinned).
    #[default]
    #[pyo3(name = "PRESERVE")]
    Preserve = 0,
    /// Soft-pin the object: evicted only after every unpinned one.
    #[pyo3(name = "ENABLE")]
    Enable = 1,
    /// Remove the soft pin.
    #[pyo3(name = "DISABLE")]
    Disable = 2,
}

#[pymethods]
impl SoftPinAction {
    /// The member's name, as pybind11 enums have it.
    #[getter]
    fn name(&self) -> &'static str {
        match self {
            Self::Preserve => "PRESERVE",
            Self::Enable => "ENABLE",
            Self::Disable => "DISABLE",
        }
    }

    /// The member's value.
    #[getter]
    fn value(&self) -> i64 {
        *self as i64
    }
}

/// Placement of a put: replicas on distinct segments, preferred segments, pins.
#[pyclass(module = "moongate.store", from_py_object)]
#[derive(Clone, Debug)]
pub struct ReplicateConfig {
    /// Replicas wanted (best effort, at least 1).
    #[pyo3(get, set)]
    pub replica_num: u32,
    /// Never evicted.
    #[pyo3(get, set)]
    pub with_hard_pin: bool,
    /// A segment tried first (`get_hostname()` of a store).
    #[pyo3(get, set)]
    pub preferred_segment: String,
    /// Segments tried first, in order.
    #[pyo3(get, set)]
    pub preferred_segments: Vec<String>,
    /// What the put does to the soft pin.
    #[pyo3(get, set)]
    pub soft_pin_action: SoftPinAction,
    soft_pin_ttl_ms: Option<u64>,
    /// Mooncake's NoF replicas (no effect).
    #[pyo3(get, set)]
    pub nof_replica_num: u32,
    /// Mooncake's DFS replicas (no effect).
    #[pyo3(get, set)]
    pub dfs_replica_num: u32,
    /// Mooncake's NoF segments (no effect).
    #[pyo3(get, set)]
    pub preferred_nof_segments: Vec<String>,
    /// Mooncake's same-node preference (no effect: preferred segments say it).
    #[pyo3(get, set)]
    pub prefer_alloc_in_same_node: bool,
    /// What the object holds (no effect).
    #[pyo3(get, set)]
    pub data_type: crate::replica::ObjectDataType,
    /// Mooncake's group ids (no effect); `None` by default, as Mooncake's.
    #[pyo3(get, set)]
    pub group_ids: Option<Vec<String>>,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        Self {
            replica_num: 1,
            with_hard_pin: false,
            preferred_segment: String::new(),
            preferred_segments: Vec::new(),
            soft_pin_action: SoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            preferred_nof_segments: Vec::new(),
            prefer_alloc_in_same_node: false,
            data_type: Default::default(),
            group_ids: None,
        }
    }
}

impl ReplicateConfig {
    /// The master's placement for a put with these settings; a soft-pin TTL without
    /// `SoftPinAction.ENABLE` is refused (Mooncake answers it `INVALID_PARAMS`).
    pub fn to_master(&self) -> Result<openapi::master::ReplicateConfig, String> {
        if self.soft_pin_ttl_ms.is_some() && self.soft_pin_action != SoftPinAction::Enable {
            return Err("soft_pin_ttl_ms needs soft_pin_action = SoftPinAction.ENABLE".into());
        }
        let mut preferred = Vec::new();
        if !self.preferred_segment.is_empty() {
            preferred.push(self.preferred_segment.clone());
        }
        preferred.extend(
            self.preferred_segments
                .iter()
                .filter(|s| !s.is_empty() && **s != self.preferred_segment)
                .cloned(),
        );
        Ok(openapi::master::ReplicateConfig {
            replica_num: self.replica_num.max(1),
            preferred_segments: preferred,
            soft_pin: self.soft_pin_action == SoftPinAction::Enable,
            hard_pin: self.with_hard_pin,
        })
    }
}

#[pymethods]
impl ReplicateConfig {
    #[new]
    fn py_new() -> Self {
        Self::default()
    }

    /// Soft-pin time to live, ms, or None (the master's default).
    #[getter]
    fn get_soft_pin_ttl_ms(&self) -> Option<u64> {
        self.soft_pin_ttl_ms
    }

    /// Refuses what is not a non-negative 64-bit int with `TypeError` (as Mooncake does).
    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.soft_pin_ttl_ms = match value {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => Some(v.extract::<u64>().map_err(|_| {
                PyTypeError::new_err("soft_pin_ttl_ms must be None or an int in 0..2**64")
            })?),
        };
        Ok(())
    }

    fn __str__(&self) -> String {
        format!(
            "ReplicateConfig: {{ replica_num: {}, with_hard_pin: {}, soft_pin_action: {:?}, preferred_segments: {:?} }}",
            self.replica_num,
            self.with_hard_pin,
            self.soft_pin_action,
            self.to_master()
                .map(|m| m.preferred_segments)
                .unwrap_or_default()
        )
    }

    fn __repr__(&self) -> String {
        self.__str__()
    }
}
