//! Mooncake's return codes, as the Python API answers them.
//!
//! The transfer engine answers 0 for success and -1 for any failure (batch ids: 0 for a
//! failed submission); the store answers 0 or a negative `ErrorCode` (`types.h`), which
//! `kvclient::StoreError::code` already computes.

use kvclient::StoreError;

/// Success.
pub const OK: i32 = 0;
/// The transfer engine's failure answer.
pub const FAILED: i32 = -1;
/// `INVALID_PARAMS`: bad arguments, or a store used before `setup` / after `close`.
pub const INVALID_PARAMS: i32 = -600;
/// `OBJECT_NOT_FOUND`.
pub const OBJECT_NOT_FOUND: i32 = -704;

/// The code of a store error, logged once at the level its kind deserves.
pub fn store_code(op: &str, e: &StoreError) -> i32 {
    if e.code() == OBJECT_NOT_FOUND {
        tracing::debug!(op, error = %e, "store call failed");
    } else {
        tracing::warn!(op, code = e.code(), error = %e, "store call failed");
    }
    e.code()
}

/// 0 or the error's code; a put of a key that already exists counts as done (Mooncake).
pub fn put_code(op: &str, r: &Result<(), StoreError>) -> i32 {
    match r {
        Ok(()) => OK,
        Err(StoreError::Master(openapi::master::MasterError::ObjectAlreadyExists(_))) => OK,
        Err(e) => store_code(op, e),
    }
}

/// A refusal before anything was sent: logged, answered `INVALID_PARAMS`.
pub fn invalid(op: &str, why: impl std::fmt::Display) -> i32 {
    tracing::warn!(op, "invalid arguments: {why}");
    INVALID_PARAMS
}
