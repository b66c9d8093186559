//! Puts of one object from several pieces, as Mooncake's: one object, the pieces in order.
//! `put_from_with_metadata` (a metadata buffer, then a data buffer, both registered
//! memory) is here; `put_parts` and `upsert_parts` (bytes-like parts) are `store_io`'s
//! put methods over [`joined`].

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::replicate::ReplicateConfig;
use crate::store::MooncakeDistributedStore;
use crate::store_io::value_bytes;

/// The parts' bytes, concatenated.
pub(crate) fn joined(parts: &Bound<'_, PyTuple>) -> PyResult<Vec<u8>> {
    let mut v = Vec::new();
    for p in parts.iter() {
        v.extend_from_slice(&value_bytes(&p)?);
    }
    Ok(v)
}

#[pymethods]
impl MooncakeDistributedStore {
    /// Puts `metadata_size` bytes at `metadata_buffer_ptr` followed by `size` bytes at
    /// `buffer_ptr` (registered memory) as the object `key`: 0 or a negative code (0, and
    /// nothing stored, for `size` 0, as Mooncake).
    #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_from_with_metadata(
        &self,
        py: Python<'_>,
        key: String,
        buffer_ptr: u64,
        metadata_buffer_ptr: u64,
        size: u64,
        metadata_size: u64,
        config: Option<ReplicateConfig>,
    ) -> i32 {
        if size == 0 {
            tracing::warn!(key, "put_from_with_metadata of empty data: nothing stored");
            return 0;
        }
        self.batch_put_from_multi_buffers(
            py,
            vec![key],
            vec![vec![metadata_buffer_ptr, buffer_ptr]],
            vec![vec![metadata_size, size]],
            config,
        )[0]
    }
}
