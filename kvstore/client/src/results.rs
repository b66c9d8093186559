//! Per-item results of batch calls: one result per item, in request order, whatever the
//! master answered or failed with.

use openapi::master as wire;

use crate::error::{StoreError, StoreResult};
use crate::rpc::item_error;

/// The same failure for each of `n` items.
pub(crate) fn fail_all<T>(n: usize, e: StoreError) -> Vec<StoreResult<T>> {
    (0..n).map(|_| Err(e.clone())).collect()
}

/// Lines a batch answer up with its request: one result per item, in order.
pub(crate) fn align<R, T>(
    n: usize,
    results: Vec<R>,
    f: impl Fn(R) -> StoreResult<T>,
) -> Vec<StoreResult<T>> {
    if results.len() != n {
        let e = StoreError::Rpc {
            url: String::new(),
            reason: format!("batch answer has {} results for {n} items", results.len()),
        };
        return fail_all(n, e);
    }
    results.into_iter().map(f).collect()
}

/// Per-key results of a batch put-end / put-revoke / remove.
pub(crate) fn key_results(
    n: usize,
    r: StoreResult<wire::BatchKeyResponse>,
) -> Vec<StoreResult<()>> {
    match r {
        Ok(r) => align(n, r.results, |r| {
            r.error.map_or(Ok(()), |e| Err(item_error(e)))
        }),
        Err(e) => fail_all(n, e),
    }
}
