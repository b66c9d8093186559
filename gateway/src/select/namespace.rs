//! Cache namespaces: what keeps two requests with the same prompt from sharing a cached
//! prefix on a worker. SGLang keys its prefix cache by the LoRA adapter (`lora_path`, or
//! `lora_id`) and by `extra_key`, and vLLM-style clients send `cache_salt` so that tenants
//! never hit each other's cache; a prefix-aware policy that ignored them would send a
//! tenant where its prompt is cached *for another tenant* and get no hit (smg issue 2420).
//!
//! A request's namespace is a stable hash of those fields as it sent them (0 when it sends
//! none); [`scoped`] puts it in front of the prompt key (tag `n`, then 8 bytes), so the
//! prefix trees of `cache_aware` (and `manual`, and `kv_aware`'s fallback) keep each
//! namespace in a subtree of its own, and [`prompt_of`] takes it off again where the
//! token ids are wanted.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The tag byte of a key scoped to a namespace.
pub const TAG: u8 = b'n';

/// The fields that name a namespace, as the request wrote them.
#[derive(Deserialize)]
struct Fields<'a> {
    #[serde(borrow, default)]
    lora_path: Option<&'a RawValue>,
    #[serde(borrow, default)]
    lora_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    extra_key: Option<&'a RawValue>,
}

/// The namespace of a request `body` (0: none of the fields, or `null` in all of them).
pub fn of(body: &[u8]) -> u64 {
    // Most requests name none: skip the parse unless one of the names is in the body.
    let named = [
        "\"lora_path\"",
        "\"lora_id\"",
        "\"cache_salt\"",
        "\"extra_key\"",
    ]
    .iter()
    .any(|n| memchr::memmem::find(body, n.as_bytes()).is_some());
    if !named {
        return 0;
    }
    let Ok(f) = serde_json::from_slice::<Fields<'_>>(body) else {
        return 0;
    };
    let mut buf = Vec::new();
    let mut any = false;
    for (i, v) in [f.lora_path, f.lora_id, f.cache_salt, f.extra_key]
        .into_iter()
        .enumerate()
    {
        let v = v.map(RawValue::get).filter(|v| *v != "null");
        buf.push(i as u8);
        if let Some(v) = v {
            any = true;
            buf.extend_from_slice(v.as_bytes());
        }
        buf.push(0x1f);
    }
    if !any {
        return 0;
    }
    rapidhash::v3::rapidhash_v3(&buf).max(1)
}

/// `key` in namespace `ns` (unchanged for 0).
pub fn scoped(key: Vec<u8>, ns: u64) -> Vec<u8> {
    if ns == 0 {
        return key;
    }
    let mut out = Vec::with_capacity(key.len() + 9);
    out.push(TAG);
    out.extend_from_slice(&ns.to_le_bytes());
    out.extend_from_slice(&key);
    out
}

/// The prompt part of a key, its namespace taken off.
pub fn prompt_of(key: &[u8]) -> &[u8] {
    match key.split_first() {
        Some((&TAG, rest)) if rest.len() >= 8 => &rest[8..],
        _ => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_make_the_namespace_and_nothing_else_does() {
        let plain = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(of(plain), 0);
        assert_eq!(of(br#"{"cache_salt":null,"prompt":"x"}"#), 0);
        let a = of(br#"{"cache_salt":"tenant-a","prompt":"x"}"#);
        let b = of(br#"{"cache_salt":"tenant-b","prompt":"x"}"#);
        assert!(a != 0 && b != 0 && a != b);
        // The same salt is the same namespace whatever else the body says.
        assert_eq!(
            a,
            of(br#"{"prompt":"other","cache_salt":"tenant-a","n":2}"#)
        );
        // Each field counts apart: the same value in two fields is two namespaces.
        let lora = of(br#"{"lora_path":"tenant-a","prompt":"x"}"#);
        let extra = of(br#"{"extra_key":"tenant-a","prompt":"x"}"#);
        assert!(lora != a && extra != a && lora != extra);
        // A body that does not parse has none (the proxy rejects it anyway).
        assert_eq!(of(br#"{"cache_salt": "#), 0);
    }

    #[test]
    fn a_scoped_key_gives_its_prompt_back() {
        assert_eq!(scoped(b"tabc".to_vec(), 0), b"tabc");
        let k = scoped(b"i\x01\x00\x00\x00".to_vec(), 42);
        assert_eq!(k[0], TAG);
        assert_eq!(prompt_of(&k), b"i\x01\x00\x00\x00");
        assert_eq!(prompt_of(b"tabc"), b"tabc");
        assert_ne!(scoped(b"tabc".to_vec(), 1), scoped(b"tabc".to_vec(), 2));
    }
}
