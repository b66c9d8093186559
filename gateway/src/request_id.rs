//! Request ids: the client's `x-request-id` when it sends a usable one, else a fresh
//! UUID-shaped id from a per-process random prefix and a counter (no syscall, no lock).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderValue};

use crate::proxy::dispatch::X_REQUEST_ID;

/// Longest client-supplied id kept.
const MAX_LEN: usize = 256;

/// Returns the request's id, inserting a minted one into `headers` when the client sent
/// none (or an empty or oversized one).
pub fn ensure(headers: &mut HeaderMap) -> HeaderValue {
    if let Some(v) = headers.get(&X_REQUEST_ID)
        && !v.is_empty()
        && v.len() <= MAX_LEN
    {
        return v.clone();
    }
    let id = mint();
    headers.insert(X_REQUEST_ID.clone(), id.clone());
    id
}

/// A new id, `xxxxxxxx-xxxx-4xxx-8xxx-xxxxxxxxxxxx`.
pub fn mint() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(rand::random::<u64>);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let hi = prefix;
    let lo = n ^ (prefix.rotate_left(17) & 0x0000_ffff_0000_0000);
    let mut buf = [0u8; 36];
    let hex = b"0123456789abcdef";
    let digits = (hi as u128) << 64 | lo as u128;
    let mut j = 0;
    for i in 0..32 {
        if matches!(i, 8 | 12 | 16 | 20) {
            buf[j] = b'-';
            j += 1;
        }
        let nib = match i {
            12 => 4,
            16 => 8 | ((digits >> (124 - 4 * i)) & 0x3) as usize,
            _ => ((digits >> (124 - 4 * i)) & 0xf) as usize,
        };
        buf[j] = hex[nib];
        j += 1;
    }
    HeaderValue::from_bytes(&buf).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_client_ids_and_mints_unique_ones() {
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID.clone(), HeaderValue::from_static("abc"));
        assert_eq!(ensure(&mut h), "abc");
        let mut h = HeaderMap::new();
        let a = ensure(&mut h);
        assert_eq!(h.get(&X_REQUEST_ID), Some(&a));
        let b = mint();
        assert_ne!(a, b);
        let s = a.to_str().unwrap();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "4");
        assert!(uuid::Uuid::parse_str(s).is_ok(), "{s}");
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID.clone(), HeaderValue::from_static(""));
        assert_ne!(ensure(&mut h), "");
    }
}
