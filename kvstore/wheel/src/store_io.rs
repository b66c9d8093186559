//! `MooncakeDistributedStore`'s data path: put / get, their zero-copy forms over memory
//! registered with `register_buffer` (one master request per step and one transfer batch
//! for a whole batch, as `kvclient::StoreClient` does them), the multi-buffer and ranged
//! forms, upserts and `BufferHandle`.
//!
//! Return values are Mooncake's: puts answer 0 (also for a key that already exists) or a
//! negative code; `get` answers `b""` on a miss; `get_into` and friends the bytes read or a
//! negative code. The multi-buffer and ranged forms gather and scatter through one copy.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use kvclient::{BufRange, StoreError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use transfer::RegisteredBuffer;

use crate::codes::{self, INVALID_PARAMS, OK};
use crate::replicate::ReplicateConfig;
use crate::runtime::block_here;
use crate::store::{MooncakeDistributedStore, StoreState};

/// A value read by `get_buffer`: registered memory holding it (`ptr()`, `size()`,
/// `bytes(handle)`).
#[pyclass(module = "moongate.store", frozen)]
pub struct BufferHandle {
    buf: RegisteredBuffer,
    len: usize,
}

#[pymethods]
impl BufferHandle {
    /// Address of the first byte.
    fn ptr(&self) -> u64 {
        self.buf.addr()
    }

    /// Bytes held.
    fn size(&self) -> usize {
        self.len
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let v = self
            .buf
            .to_vec(0, self.len)
            .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
        Ok(PyBytes::new(py, &v))
    }
}

/// The bytes of a Python value: `bytes` as they are, anything with the buffer protocol
/// (bytearray, memoryview, numpy) through `memoryview(v).tobytes()`; else `TypeError`.
pub(crate) fn value_bytes<'a>(v: &'a Bound<'_, PyAny>) -> PyResult<Cow<'a, [u8]>> {
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(Cow::Borrowed(b.as_bytes()));
    }
    let mv = v
        .py()
        .import("builtins")?
        .getattr("memoryview")?
        .call1((v,))?;
    let bytes = mv.call_method0("tobytes")?;
    Ok(Cow::Owned(bytes.cast::<PyBytes>()?.as_bytes().to_vec()))
}

/// The client handle for a put with `config` (the default one without), or `-600`.
pub(crate) fn placed(
    s: &StoreState,
    config: Option<&ReplicateConfig>,
) -> Result<kvclient::StoreClient, i32> {
    match config {
        None => Ok(s.client.clone()),
        Some(c) => c
            .to_master()
            .map(|mut m| {
                for p in &mut m.preferred_segments {
                    *p = s.segment_named(p);
                }
                s.client.with_replication(m)
            })
            .map_err(|e| codes::invalid("put", e)),
    }
}

/// A resolved zero-copy item: key, registration, offset, length.
type Resolved = (String, RegisteredBuffer, usize, usize);

/// Resolves `(ptr, size)` of each key against the registered buffers; the failures get
/// `-600` in their slot of `out`.
fn resolve_all(
    s: &StoreState,
    op: &str,
    keys: Vec<String>,
    ptrs: &[u64],
    sizes: &[u64],
    out: &mut [i64],
) -> Vec<(usize, Resolved)> {
    let mut ok = Vec::with_capacity(keys.len());
    for (i, key) in keys.into_iter().enumerate() {
        match s.regions.resolve(ptrs[i], sizes[i]) {
            Ok((buf, off)) => ok.push((i, (key, buf, off, sizes[i] as usize))),
            Err(e) => out[i] = i64::from(codes::invalid(op, format!("{key:?}: {e}"))),
        }
    }
    ok
}

fn lengths_match(op: &str, a: usize, b: usize, c: usize) -> Result<(), i32> {
    if a == b && b == c {
        Ok(())
    } else {
        Err(codes::invalid(
            op,
            format!("keys, pointers and sizes differ in length ({a}, {b}, {c})"),
        ))
    }
}

impl MooncakeDistributedStore {
    fn with_state<T>(&self, op: &str, or: T, f: impl FnOnce(&Arc<StoreState>) -> T) -> T {
        match self.state() {
            Some(s) => f(&s),
            None => {
                codes::invalid(op, "the store is not set up");
                or
            }
        }
    }

    /// The state for a multi-buffer call whose lists agree in length, or the code to answer.
    fn multi_state(
        &self,
        op: &str,
        keys: &[String],
        ptrs: &[Vec<u64>],
        sizes: &[Vec<u64>],
    ) -> Result<Arc<StoreState>, i32> {
        lengths_match(op, keys.len(), ptrs.len(), sizes.len())?;
        self.state()
            .ok_or_else(|| codes::invalid(op, "the store is not set up"))
    }

    /// The copying puts: refused when `local_buffer_size` was 0.
    pub(crate) fn put_values(
        &self,
        py: Python<'_>,
        op: &str,
        keys: &[String],
        values: &[Cow<'_, [u8]>],
        config: Option<&ReplicateConfig>,
        upsert: bool,
    ) -> Vec<i32> {
        self.with_state(op, vec![INVALID_PARAMS; keys.len()], |s| {
            if s.zero_copy_only {
                return vec![
                    codes::invalid(op, "local_buffer_size is 0: use put_from");
                    keys.len()
                ];
            }
            let client = match placed(s, config) {
                Ok(c) => c,
                Err(code) => return vec![code; keys.len()],
            };
            let items: Vec<(&str, &[u8])> = keys
                .iter()
                .map(String::as_str)
                .zip(values.iter().map(|v| &**v))
                .collect();
            block_here(py, async {
                let mut out = client.batch_put(&items).await;
                if upsert {
                    replace_existing(&client, &mut out, |i| client.put(items[i].0, items[i].1))
                        .await;
                }
                out.iter().map(|r| codes::put_code(op, r)).collect()
            })
        })
    }

    /// The zero-copy puts.
    #[allow(clippy::too_many_arguments)]
    fn put_from_ptrs(
        &self,
        py: Python<'_>,
        op: &str,
        keys: Vec<String>,
        ptrs: Vec<u64>,
        sizes: Vec<u64>,
        config: Option<&ReplicateConfig>,
        upsert: bool,
    ) -> Vec<i32> {
        if let Err(code) = lengths_match(op, keys.len(), ptrs.len(), sizes.len()) {
            return vec![code; keys.len()];
        }
        let n = keys.len();
        self.with_state(op, vec![INVALID_PARAMS; n], |s| {
            let client = match placed(s, config) {
                Ok(c) => c,
                Err(code) => return vec![code; n],
            };
            let mut out = vec![0i64; n];
            let ok = resolve_all(s, op, keys, &ptrs, &sizes, &mut out);
            let items: Vec<(&str, BufRange<'_>)> = ok
                .iter()
                .map(|(_, (k, b, o, l))| (k.as_str(), BufRange::new(b, *o, *l)))
                .collect();
            let results = block_here(py, async {
                let mut r = client.batch_put_from(&items).await;
                if upsert {
                    replace_existing(&client, &mut r, |i| client.put_from(items[i].0, items[i].1))
                        .await;
                }
                r
            });
            for ((i, _), r) in ok.iter().zip(&results) {
                out[*i] = i64::from(codes::put_code(op, r));
            }
            out.into_iter().map(|c| c as i32).collect()
        })
    }

    /// The zero-copy gets: bytes read or a negative code per key.
    fn get_into_ptrs(
        &self,
        py: Python<'_>,
        op: &str,
        keys: Vec<String>,
        ptrs: Vec<u64>,
        sizes: Vec<u64>,
    ) -> Vec<i64> {
        if let Err(code) = lengths_match(op, keys.len(), ptrs.len(), sizes.len()) {
            return vec![i64::from(code); keys.len()];
        }
        let n = keys.len();
        self.with_state(op, vec![i64::from(INVALID_PARAMS); n], |s| {
            let mut out = vec![0i64; n];
            let ok = resolve_all(s, op, keys, &ptrs, &sizes, &mut out);
            let items: Vec<(&str, BufRange<'_>)> = ok
                .iter()
                .map(|(_, (k, b, o, l))| (k.as_str(), BufRange::new(b, *o, *l)))
                .collect();
            let results = block_here(py, s.client.batch_get_into(&items));
            for ((i, _), r) in ok.iter().zip(results) {
                out[*i] = match r {
                    Ok(len) => i64::try_from(len).unwrap_or(i64::MAX),
                    Err(e) => i64::from(codes::store_code(op, &e)),
                };
            }
            out
        })
    }

    /// Values of `keys` (copied: straight out of mapped memory, else through the copy
    /// buffer), one master request.
    fn get_values(
        &self,
        py: Python<'_>,
        op: &str,
        keys: &[String],
    ) -> Vec<Result<bytes::Bytes, i32>> {
        self.with_state(op, vec![Err(INVALID_PARAMS); keys.len()], |s| {
            if s.zero_copy_only {
                return vec![
                    Err(codes::invalid(op, "local_buffer_size is 0: use get_into"));
                    keys.len()
                ];
            }
            block_here(py, s.client.batch_get(keys))
                .into_iter()
                .map(|r| r.map_err(|e| codes::store_code(op, &e)))
                .collect()
        })
    }
}

/// Puts and upserts share their arguments and differ in what an existing key does (a put
/// keeps it and answers 0, an upsert replaces it): one `#[pymethods]` block per method.
macro_rules! put_methods {
    ($($(#[$doc:meta])* $name:ident: $shape:ident, upsert = $upsert:expr;)*) => {$(
        put_methods!(@$shape $(#[$doc])* $name, $upsert);
    )*};
    (@value $(#[$doc:meta])* $name:ident, $upsert:expr) => {
        #[pymethods]
        impl MooncakeDistributedStore {
            $(#[$doc])*
            #[pyo3(signature = (key, value, config = None))]
            fn $name(&self, py: Python<'_>, key: String, value: &Bound<'_, PyAny>, config: Option<ReplicateConfig>) -> PyResult<i32> {
                let v = value_bytes(value)?;
                Ok(self.put_values(py, stringify!($name), &[key], &[v], config.as_ref(), $upsert)[0])
            }
        }
    };
    (@parts $(#[$doc:meta])* $name:ident, $upsert:expr) => {
        #[pymethods]
        impl MooncakeDistributedStore {
            $(#[$doc])*
            #[pyo3(signature = (key, *args, config = None))]
            fn $name(&self, py: Python<'_>, key: String, args: &Bound<'_, pyo3::types::PyTuple>, config: Option<ReplicateConfig>) -> PyResult<i32> {
                let v = Cow::Owned(crate::parts::joined(args)?);
                Ok(self.put_values(py, stringify!($name), &[key], &[v], config.as_ref(), $upsert)[0])
            }
        }
    };
    (@values $(#[$doc:meta])* $name:ident, $upsert:expr) => {
        #[pymethods]
        impl MooncakeDistributedStore {
            $(#[$doc])*
            #[pyo3(signature = (keys, values, config = None))]
            fn $name(&self, py: Python<'_>, keys: Vec<String>, values: Vec<Bound<'_, PyAny>>, config: Option<ReplicateConfig>) -> PyResult<i32> {
                let op = stringify!($name);
                if keys.len() != values.len() {
                    return Ok(codes::invalid(op, "keys and values differ in length"));
                }
                let vs = values.iter().map(value_bytes).collect::<PyResult<Vec<_>>>()?;
                Ok(first_error(&self.put_values(py, op, &keys, &vs, config.as_ref(), $upsert)))
            }
        }
    };
    (@ptr $(#[$doc:meta])* $name:ident, $upsert:expr) => {
        #[pymethods]
        impl MooncakeDistributedStore {
            $(#[$doc])*
            #[pyo3(signature = (key, buffer_ptr, size, config = None))]
            fn $name(&self, py: Python<'_>, key: String, buffer_ptr: u64, size: u64, config: Option<ReplicateConfig>) -> i32 {
                let (keys, ptrs, sizes) = (vec![key], vec![buffer_ptr], vec![size]);
                self.put_from_ptrs(py, stringify!($name), keys, ptrs, sizes, config.as_ref(), $upsert)[0]
            }
        }
    };
    (@ptrs $(#[$doc:meta])* $name:ident, $upsert:expr) => {
        #[pymethods]
        impl MooncakeDistributedStore {
            $(#[$doc])*
            #[pyo3(signature = (keys, buffer_ptrs, sizes, config = None))]
            fn $name(&self, py: Python<'_>, keys: Vec<String>, buffer_ptrs: Vec<u64>, sizes: Vec<u64>, config: Option<ReplicateConfig>) -> Vec<i32> {
                self.put_from_ptrs(py, stringify!($name), keys, buffer_ptrs, sizes, config.as_ref(), $upsert)
            }
        }
    };
}

put_methods! {
    /// Stores `value` (bytes or any buffer) under `key`. 0 (also when `key` exists) or a
    /// negative code.
    put: value, upsert = false;
    /// Inserts or replaces `key`.
    upsert: value, upsert = true;
    /// Stores the concatenation of `args` (bytes-like parts) under `key`, as `put` does.
    put_parts: parts, upsert = false;
    /// Inserts or replaces `key` with the concatenation of `args`.
    upsert_parts: parts, upsert = true;
    /// Stores many values, one master request per step; 0 or the first failure's code.
    put_batch: values, upsert = false;
    /// Inserts or replaces many keys; 0 or the first failure's code.
    upsert_batch: values, upsert = true;
    /// Stores `size` bytes at `buffer_ptr` (inside a registered buffer), zero-copy.
    put_from: ptr, upsert = false;
    /// Inserts or replaces `key` from registered memory.
    upsert_from: ptr, upsert = true;
    /// Zero-copy puts of many keys: one master request per step, one transfer batch.
    batch_put_from: ptrs, upsert = false;
    /// Zero-copy upserts of many keys.
    batch_upsert_from: ptrs, upsert = true;
}

/// Upsert: a put refused because the key exists removes the old object (refused while a
/// read lease on it is live: `OBJECT_HAS_LEASE`) and puts again. Not atomic: a reader in
/// between sees a miss, never a mix.
async fn replace_existing<F, Fut>(
    client: &kvclient::StoreClient,
    out: &mut [Result<(), StoreError>],
    put: F,
) where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), StoreError>>,
{
    for (i, slot) in out.iter_mut().enumerate() {
        if let Err(StoreError::Master(openapi::master::MasterError::ObjectAlreadyExists(key))) =
            slot
        {
            let key = key.clone();
            *slot = match client.remove(&key, false).await {
                Ok(()) => put(i).await,
                Err(e) => Err(e),
            };
        }
    }
}

/// One error for a whole batch call, as Mooncake's `put_batch` answers: 0 or the first
/// failure's code.
fn first_error(codes: &[i32]) -> i32 {
    codes.iter().copied().find(|&c| c != OK).unwrap_or(OK)
}

#[pymethods]
impl MooncakeDistributedStore {
    /// The value of `key`, or `b""` on a miss or an error.
    fn get<'py>(&self, py: Python<'py>, key: String) -> Bound<'py, PyBytes> {
        match self.get_values(py, "get", &[key]).pop() {
            Some(Ok(v)) => PyBytes::new(py, &v),
            _ => PyBytes::new(py, b""),
        }
    }

    /// The values of many keys (`b""` for each miss), one master request.
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
        self.get_values(py, "get_batch", &keys)
            .into_iter()
            .map(|r| PyBytes::new(py, r.as_deref().unwrap_or(b"")))
            .collect()
    }

    /// The value of `key` in registered memory, or None.
    fn get_buffer(&self, py: Python<'_>, key: String) -> Option<BufferHandle> {
        self.batch_get_buffer(py, vec![key]).pop().flatten()
    }

    /// `get_buffer` of many keys (None for each miss).
    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<String>) -> Vec<Option<BufferHandle>> {
        let n = keys.len();
        self.with_state("batch_get_buffer", (0..n).map(|_| None).collect(), |s| {
            block_here(py, async {
                let mut out = Vec::with_capacity(n);
                for key in &keys {
                    let got = async {
                        let len = s.client.size(key).await?;
                        let buf = s.client.alloc((len as usize).max(1))?;
                        let n = s
                            .client
                            .get_into(key, BufRange::new(&buf, 0, buf.len()))
                            .await?;
                        Ok::<_, StoreError>(BufferHandle {
                            buf,
                            len: n as usize,
                        })
                    };
                    out.push(
                        got.await
                            .map_err(|e| codes::store_code("get_buffer", &e))
                            .ok(),
                    );
                }
                out
            })
        })
    }

    /// Reads `key` into `[buffer_ptr, +size)` (registered); bytes read or a negative code.
    fn get_into(&self, py: Python<'_>, key: String, buffer_ptr: u64, size: u64) -> i64 {
        self.get_into_ptrs(py, "get_into", vec![key], vec![buffer_ptr], vec![size])[0]
    }

    /// Zero-copy gets of many keys: bytes read or a negative code per key.
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<u64>,
        sizes: Vec<u64>,
    ) -> Vec<i64> {
        self.get_into_ptrs(py, "batch_get_into", keys, buffer_ptrs, sizes)
    }

    /// Each object is the concatenation of its buffers (SGLang's layer-first MLA layout).
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config = None))]
    pub(crate) fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        config: Option<ReplicateConfig>,
    ) -> Vec<i32> {
        let op = "batch_put_from_multi_buffers";
        let s = match self.multi_state(op, &keys, &all_buffer_ptrs, &all_sizes) {
            Ok(s) => s,
            Err(code) => return vec![code; keys.len()],
        };
        let mut out = vec![OK; keys.len()];
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for (i, key) in keys.into_iter().enumerate() {
            match gather(&s, &all_buffer_ptrs[i], &all_sizes[i]) {
                Ok(v) => {
                    ks.push((i, key));
                    vs.push(Cow::Owned(v));
                }
                Err(e) => out[i] = codes::invalid(op, format!("{key:?}: {e}")),
            }
        }
        let names: Vec<String> = ks.iter().map(|(_, k)| k.clone()).collect();
        let rs = self.put_values(py, op, &names, &vs, config.as_ref(), false);
        for ((i, _), r) in ks.iter().zip(rs) {
            out[*i] = r;
        }
        out
    }

    /// Reads each object across its buffers, in order; total bytes read or a negative code.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node = false))]
    fn batch_get_into_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<u64>>,
        all_sizes: Vec<Vec<u64>>,
        prefer_alloc_in_same_node: bool,
    ) -> Vec<i64> {
        let _ = prefer_alloc_in_same_node;
        let op = "batch_get_into_multi_buffers";
        let s = match self.multi_state(op, &keys, &all_buffer_ptrs, &all_sizes) {
            Ok(s) => s,
            Err(code) => return vec![i64::from(code); keys.len()],
        };
        let got = self.get_values(py, op, &keys);
        got.into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Ok(v) => scatter(&s, &v, &all_buffer_ptrs[i], &all_sizes[i])
                    .map(|n| n as i64)
                    .unwrap_or_else(|e| {
                        i64::from(codes::invalid(op, format!("{:?}: {e}", keys[i])))
                    }),
                Err(code) => i64::from(code),
            })
            .collect()
    }

    /// Buffer-major ranged reads: for buffer `i`, key `j` of `all_keys[i]`, range `k`, copies
    /// `all_sizes[i][j][k]` bytes from offset `all_src_offsets[i][j][k]` of the object to
    /// offset `all_dst_offsets[i][j][k]` of buffer `i`. Bytes copied or a negative code per
    /// range, in the same shape.
    fn get_into_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: Vec<u64>,
        all_keys: Vec<Vec<String>>,
        all_dst_offsets: Vec<Vec<Vec<u64>>>,
        all_src_offsets: Vec<Vec<Vec<u64>>>,
        all_sizes: Vec<Vec<Vec<u64>>>,
    ) -> Vec<Vec<Vec<i64>>> {
        let op = "get_into_ranges";
        let bad = i64::from(INVALID_PARAMS);
        let mut keys: Vec<String> = all_keys.iter().flatten().cloned().collect();
        keys.sort();
        keys.dedup();
        let got: HashMap<String, Result<bytes::Bytes, i32>> = keys
            .iter()
            .cloned()
            .zip(self.get_values(py, op, &keys))
            .collect();
        let s = self.state();
        let mut out = Vec::with_capacity(buffer_ptrs.len());
        for (i, &base) in buffer_ptrs.iter().enumerate() {
            let ks = all_keys.get(i).cloned().unwrap_or_default();
            let mut per_key = Vec::with_capacity(ks.len());
            for (j, key) in ks.iter().enumerate() {
                let dst = all_dst_offsets.get(i).and_then(|v| v.get(j));
                let src = all_src_offsets.get(i).and_then(|v| v.get(j));
                let len = all_sizes.get(i).and_then(|v| v.get(j));
                let (Some(dst), Some(src), Some(len)) = (dst, src, len) else {
                    per_key.push(vec![i64::from(codes::invalid(op, "ranges are missing")); 1]);
                    continue;
                };
                if dst.len() != src.len() || dst.len() != len.len() {
                    codes::invalid(op, format!("{key:?}: offsets and sizes differ in length"));
                    per_key.push(vec![bad; dst.len().max(src.len()).max(len.len()).max(1)]);
                    continue;
                }
                let value = &got[key];
                let ranges = (0..dst.len())
                    .map(|k| match (value, &s) {
                        (Err(code), _) => i64::from(*code),
                        (Ok(_), None) => bad,
                        (Ok(v), Some(s)) => copy_range(s, v, base, dst[k], src[k], len[k])
                            .unwrap_or_else(|e| {
                                i64::from(codes::invalid(op, format!("{key:?}: {e}")))
                            }),
                    })
                    .collect();
                per_key.push(ranges);
            }
            out.push(per_key);
        }
        out
    }
}

/// The bytes of `(ptr, size)` pieces of registered memory, concatenated.
fn gather(s: &StoreState, ptrs: &[u64], sizes: &[u64]) -> Result<Vec<u8>, String> {
    if ptrs.len() != sizes.len() {
        return Err("pointers and sizes differ in length".into());
    }
    let total: u64 = sizes.iter().sum();
    let mut v = vec![0u8; usize::try_from(total).map_err(|e| e.to_string())?];
    let mut at = 0usize;
    for (&p, &n) in ptrs.iter().zip(sizes) {
        let (buf, off) = s.regions.resolve(p, n)?;
        let n = n as usize;
        buf.region()
            .read_at(off, &mut v[at..at + n])
            .map_err(|e| e.to_string())?;
        at += n;
    }
    Ok(v)
}

/// Writes `value` across the `(ptr, size)` pieces in order; the bytes written.
fn scatter(s: &StoreState, value: &[u8], ptrs: &[u64], sizes: &[u64]) -> Result<usize, String> {
    if ptrs.len() != sizes.len() {
        return Err("pointers and sizes differ in length".into());
    }
    let room: u64 = sizes.iter().sum();
    if value.len() as u64 > room {
        return Err(format!(
            "the value is {} bytes, the buffers hold {room}",
            value.len()
        ));
    }
    let mut at = 0usize;
    for (&p, &n) in ptrs.iter().zip(sizes) {
        if at >= value.len() {
            break;
        }
        let take = (n as usize).min(value.len() - at);
        let (buf, off) = s.regions.resolve(p, take as u64)?;
        buf.write_at(off, &value[at..at + take])
            .map_err(|e| e.to_string())?;
        at += take;
    }
    Ok(at)
}

/// One range of `get_into_ranges`.
fn copy_range(
    s: &StoreState,
    value: &[u8],
    base: u64,
    dst: u64,
    src: u64,
    len: u64,
) -> Result<i64, String> {
    let piece = src
        .checked_add(len)
        .and_then(|end| value.get(src as usize..end as usize))
        .ok_or_else(|| {
            format!(
                "source range [{src}, +{len}) is outside the {}-byte object",
                value.len()
            )
        })?;
    let at = base.checked_add(dst).ok_or("destination overflows")?;
    let (buf, off) = s.regions.resolve(at, len)?;
    buf.write_at(off, piece).map_err(|e| e.to_string())?;
    Ok(len as i64)
}
