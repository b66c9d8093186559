//! A request body changed a few top-level members at a time, never re-serialized: members
//! the gateway owns are taken out ([`without`]: every other member copied as the client
//! wrote it) and new ones are spliced in front of the object's closing brace
//! ([`append`]). PD's bootstrap fields and `--dp-aware`'s rank ([`with_dp_rank`]) are
//! written this way, so every other byte the client sent reaches the worker unchanged.

use std::fmt;

use bytes::Bytes;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::GatewayError;
use crate::proxy::inspect::KeyName;

/// The member `--dp-aware` writes: the data-parallel rank SGLang runs the request on
/// (every SGLang release since the field came accepts it; newer ones also call it
/// `routed_dp_rank`).
pub const DP_RANK_KEY: &str = "data_parallel_rank";

/// The object `body` with `"data_parallel_rank": rank` as its last member (a member of
/// that name the client sent is taken out first, so the key appears once).
pub fn with_dp_rank(body: &[u8], rank: u32) -> Result<Bytes, GatewayError> {
    let member = format!("\"{DP_RANK_KEY}\":{rank}");
    let quoted = b"\"data_parallel_rank\"";
    if body.windows(quoted.len()).any(|w| w == quoted) {
        let clean = without(body, &[DP_RANK_KEY])?;
        return append(&clean, member.as_bytes());
    }
    append(body, member.as_bytes())
}

/// The object `body` without its top-level members named in `keys`: every other member
/// copied as the client wrote it (keys re-escaped, values byte for byte).
pub fn without(body: &[u8], keys: &[&str]) -> Result<Vec<u8>, GatewayError> {
    let mut out = Vec::with_capacity(body.len());
    let mut de = serde_json::Deserializer::from_slice(body);
    Members {
        out: &mut out,
        drop: keys,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end())
    .map_err(|e| GatewayError::InvalidRequest(format!("invalid request: {e}")))?;
    Ok(out)
}

/// Writes an object's members, those named in `drop` left out, as an object into `out`.
struct Members<'o> {
    out: &'o mut Vec<u8>,
    drop: &'o [&'o str],
}

impl<'de> DeserializeSeed<'de> for Members<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Members<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.out.push(b'{');
        let mut first = true;
        while let Some(KeyName(k)) = map.next_key::<KeyName<'de>>()? {
            let v: &'de RawValue = map.next_value()?;
            if self.drop.contains(&k.as_ref()) {
                continue;
            }
            if !first {
                self.out.push(b',');
            }
            first = false;
            serde_json::to_writer(&mut *self.out, k.as_ref()).map_err(serde::de::Error::custom)?;
            self.out.push(b':');
            self.out.extend_from_slice(v.get().as_bytes());
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// The object `body` with `members` (`"key":value` pairs joined by commas, already JSON)
/// spliced in front of its closing brace; everything before it is copied unchanged.
pub fn append(body: &[u8], members: &[u8]) -> Result<Bytes, GatewayError> {
    let not_object =
        || GatewayError::InvalidRequest("the request body must be a JSON object".into());
    let is_ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let open = body.iter().position(|b| !is_ws(b)).ok_or_else(not_object)?;
    let close = body
        .iter()
        .rposition(|b| !is_ws(b))
        .ok_or_else(not_object)?;
    if body[open] != b'{' || body[close] != b'}' || close <= open {
        return Err(not_object());
    }
    let empty = body[open + 1..close].iter().all(is_ws);
    let mut out = Vec::with_capacity(close + 2 + members.len());
    out.extend_from_slice(&body[..close]);
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(members);
    out.push(b'}');
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn parse(b: &[u8]) -> Value {
        serde_json::from_slice(b).expect("valid JSON")
    }

    #[test]
    fn the_rank_is_the_last_member_and_appears_once() {
        let b = with_dp_rank(br#"{"text":"a b","stream":true}"#, 3).unwrap();
        assert_eq!(
            &b[..],
            br#"{"text":"a b","stream":true,"data_parallel_rank":3}"#
        );
        let b = with_dp_rank(b" { } ", 0).unwrap();
        assert_eq!(parse(&b), json!({"data_parallel_rank": 0}));
        // The client's own rank is replaced, whatever it was; nested ones stay.
        let b = with_dp_rank(
            br#"{"data_parallel_rank":7,"x":{"data_parallel_rank":1},"y":[1, 2]}"#,
            2,
        )
        .unwrap();
        assert_eq!(
            &b[..],
            br#"{"x":{"data_parallel_rank":1},"y":[1, 2],"data_parallel_rank":2}"#
        );
        for bad in [&b"[1]"[..], b"", b"{", b"\"x\""] {
            assert!(with_dp_rank(bad, 1).is_err(), "{bad:?}");
        }
    }
}
