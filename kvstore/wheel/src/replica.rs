//! Where values lie: `get_replica_desc` and `batch_get_replica_desc`, with Mooncake's
//! descriptor classes (`ReplicaDescriptor`, `MemoryDescriptor`, `Descriptor`,
//! `DiskDescriptor`) and enums (`ReplicaStatus`, `ObjectDataType`); and clearing them
//! (`batch_replica_clear`).
//!
//! Every replica described is complete: in a segment's memory, or (a value on a client's
//! disk tier) one with `is_local_disk_replica()` and a `DiskDescriptor`. Describing grants no read
//! lease and reads nothing back from disk (Mooncake's promotion is not a side effect of a
//! description either).

use std::collections::HashMap;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::codes;
use crate::runtime::block_here;
use crate::store::MooncakeDistributedStore;

/// Generates a pybind-style enum: uppercase members, `name` and `value`.
macro_rules! mooncake_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $py:literal = $v:literal,)* }) => {
        $(#[$doc])*
        #[pyclass(module = "moongate.store", eq, eq_int, from_py_object)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
        pub enum $name {
            $($(#[$vdoc])* #[pyo3(name = $py)] $variant = $v,)*
        }

        #[pymethods]
        impl $name {
            /// The member's name, as pybind11 enums have it.
            #[getter]
            fn name(&self) -> &'static str {
                match self { $(Self::$variant => $py,)* }
            }

            /// The member's value.
            #[getter]
            fn value(&self) -> i64 {
                *self as i64
            }

            fn __repr__(&self) -> String {
                format!("<{}.{}: {}>", stringify!($name), self.name(), *self as i64)
            }

            fn __str__(&self) -> String {
                format!("{}.{}", stringify!($name), self.name())
            }
        }
    };
}

mooncake_enum! {
    /// A replica's state (Mooncake's `ReplicaStatus`).
    ReplicaStatus {
        /// Not set.
        #[default]
        Undefined = "UNDEFINED" = 0,
        /// Allocated, not yet written.
        Initialized = "INITIALIZED" = 1,
        /// Being written.
        Processing = "PROCESSING" = 2,
        /// Written and readable.
        Complete = "COMPLETE" = 3,
        /// Removed.
        Removed = "REMOVED" = 4,
        /// Its write failed.
        Failed = "FAILED" = 5,
    }
}

mooncake_enum! {
    /// What an object holds (Mooncake's `ObjectDataType`; `ReplicateConfig.data_type`).
    ObjectDataType {
        /// Not said.
        #[default]
        Unknown = "UNKNOWN" = 0,
        /// KV cache pages.
        Kvcache = "KVCACHE" = 1,
        /// A tensor.
        Tensor = "TENSOR" = 2,
        /// Model weights.
        Weight = "WEIGHT" = 3,
        /// A sample.
        Sample = "SAMPLE" = 4,
        /// Activations.
        Activation = "ACTIVATION" = 5,
        /// Gradients.
        Gradient = "GRADIENT" = 6,
        /// Optimizer state.
        OptimizerState = "OPTIMIZER_STATE" = 7,
        /// Metadata.
        Metadata = "METADATA" = 8,
        /// Anything else.
        General = "GENERAL" = 9,
    }
}

/// One memory replica's place: its size, address and the transfer endpoint holding it.
#[pyclass(module = "moongate.store", frozen, from_py_object)]
#[derive(Clone, Debug)]
pub struct Descriptor {
    /// Bytes.
    #[pyo3(get)]
    size: u64,
    /// Address in the holder's memory.
    #[pyo3(get)]
    buffer_address: u64,
    /// The holder's transfer endpoint (`host:port`).
    #[pyo3(get)]
    transport_endpoint: String,
}

#[pymethods]
impl Descriptor {
    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

/// A memory replica (`ReplicaDescriptor.get_memory_descriptor()`).
#[pyclass(module = "moongate.store", frozen)]
#[derive(Clone, Debug)]
pub struct MemoryDescriptor {
    /// Where it lies.
    #[pyo3(get)]
    buffer_descriptor: Descriptor,
}

/// A replica on disk: for a `LOCAL_DISK` replica, `file_path` names the transfer endpoint
/// of the client whose disk tier holds it (a read brings it back into that client's
/// memory).
#[pyclass(module = "moongate.store", frozen)]
#[derive(Clone, Debug)]
pub struct DiskDescriptor {
    /// The file.
    #[pyo3(get)]
    file_path: String,
    /// Bytes.
    #[pyo3(get)]
    object_size: u64,
}

/// One replica of an object.
#[pyclass(module = "moongate.store", frozen)]
#[derive(Clone, Debug)]
pub struct ReplicaDescriptor {
    /// Its state.
    #[pyo3(get)]
    status: ReplicaStatus,
    memory: Descriptor,
    /// On the disk of `memory.transport_endpoint`'s client (Mooncake's `LOCAL_DISK`).
    on_disk: bool,
}

#[pymethods]
impl ReplicaDescriptor {
    /// Whether it is in a segment's memory.
    fn is_memory_replica(&self) -> bool {
        !self.on_disk
    }

    /// Whether it is on a disk: Moongate's disk replicas are all local disks.
    fn is_disk_replica(&self) -> bool {
        self.on_disk
    }

    /// Whether it is on the disk tier of a client (Mooncake's `LOCAL_DISK`).
    fn is_local_disk_replica(&self) -> bool {
        self.on_disk
    }

    /// Where a memory replica lies; a `RuntimeError` for one on disk, as in Mooncake.
    fn get_memory_descriptor(&self) -> PyResult<MemoryDescriptor> {
        if self.on_disk {
            return Err(PyRuntimeError::new_err("Expected MemoryDescriptor"));
        }
        Ok(MemoryDescriptor {
            buffer_descriptor: self.memory.clone(),
        })
    }

    /// The disk holding a replica on disk (`file_path`: the holder's endpoint); a
    /// `RuntimeError` for a memory replica, as in Mooncake.
    fn get_disk_descriptor(&self) -> PyResult<DiskDescriptor> {
        if !self.on_disk {
            return Err(PyRuntimeError::new_err("Expected DiskDescriptor"));
        }
        Ok(DiskDescriptor {
            file_path: self.memory.transport_endpoint.clone(),
            object_size: self.memory.size,
        })
    }
}

impl MooncakeDistributedStore {
    /// Each key's replicas as they lie, memory and disk (one request; no lease, nothing
    /// read back from disk); a key that fails is logged and answered `None`.
    fn describe(
        &self,
        py: Python<'_>,
        op: &str,
        keys: &[String],
    ) -> Vec<Option<Vec<ReplicaDescriptor>>> {
        let Some(s) = self.state() else {
            codes::invalid(op, "the store is not set up");
            return vec![None; keys.len()];
        };
        let names: Vec<&str> = keys.iter().map(String::as_str).collect();
        block_here(py, s.client.describe_replicas(&names))
            .into_iter()
            .map(|r| match r {
                Ok((length, replicas)) => Some(
                    replicas
                        .into_iter()
                        .map(|r| ReplicaDescriptor {
                            on_disk: r.kind == openapi::master::ReplicaKind::LocalDisk,
                            status: ReplicaStatus::Complete,
                            memory: Descriptor {
                                size: length,
                                buffer_address: r.address,
                                transport_endpoint: r.endpoint,
                            },
                        })
                        .collect(),
                ),
                Err(e) => {
                    codes::store_code(op, &e);
                    None
                }
            })
            .collect()
    }
}

#[pymethods]
impl MooncakeDistributedStore {
    /// The replicas of `key`, memory and disk (no lease is granted, nothing is read back
    /// from disk); an empty list when it cannot be read (not found, not complete, the
    /// master unreachable).
    fn get_replica_desc(&self, py: Python<'_>, key: String) -> Vec<ReplicaDescriptor> {
        let keys = [key];
        self.describe(py, "get_replica_desc", &keys)
            .pop()
            .flatten()
            .unwrap_or_default()
    }

    /// Clears the replicas this client's objects `keys` have on `segment_name` (its
    /// `get_hostname()` names this client's own segment; empty: every replica, so the objects
    /// go). Read-leased and unfinished objects, another client's and missing ones are left
    /// alone, as Mooncake's are. The keys cleared (an empty list when the call fails).
    #[pyo3(signature = (keys, segment_name = String::new()))]
    fn batch_replica_clear(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        segment_name: String,
    ) -> Vec<String> {
        let op = "batch_replica_clear";
        let Some(s) = self.state() else {
            codes::invalid(op, "the store is not set up");
            return Vec::new();
        };
        let segment = (!segment_name.is_empty()).then(|| s.segment_named(&segment_name));
        match block_here(py, s.client.replica_clear(&keys, segment.as_deref())) {
            Ok(cleared) => cleared,
            Err(e) => {
                codes::store_code(op, &e);
                Vec::new()
            }
        }
    }

    /// The replicas of each of `keys` that can be read (one request); the others are left
    /// out of the answer.
    fn batch_get_replica_desc(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
    ) -> HashMap<String, Vec<ReplicaDescriptor>> {
        let got = self.describe(py, "batch_get_replica_desc", &keys);
        keys.into_iter()
            .zip(got)
            .filter_map(|(k, d)| d.map(|d| (k, d)))
            .collect()
    }
}
