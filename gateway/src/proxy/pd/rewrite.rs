//! Rewrite: put SGLang's bootstrap fields into the request body.
//!
//! `bootstrap_host` (the prefill worker's host), `bootstrap_port` (its bootstrap port, or
//! `null`) and `bootstrap_room` (random in `0..2^63`) are written as scalars for a single
//! request and as lists of one entry per item for a batch, each item with a fresh room.
//!
//! The body is not re-serialized: the fields are spliced in front of the object's closing
//! brace, so every byte the client sent reaches both workers unchanged (a copy of the body
//! plus ~100 bytes per item is all the work). Only when the client sent bootstrap fields
//! itself is the object written again without them, so no key appears twice: its members
//! are copied as the client wrote them (values byte for byte), and only the top-level
//! bootstrap keys are left out. Either way the new body is the old one's size plus the
//! fields, and the rooms are minted only for a batch within `--max-batch-size`.

use std::io::Write;

use bytes::Bytes;

use crate::error::GatewayError;
use crate::proxy::members;

/// The keys the rewrite owns.
const BOOTSTRAP_KEYS: [&str; 3] = ["bootstrap_host", "bootstrap_port", "bootstrap_room"];

/// The rooms of one attempt: one, or one per item of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rooms {
    /// A single request's room.
    One(u64),
    /// One room per batch item.
    Many(Vec<u64>),
}

impl Rooms {
    /// Fresh rooms for a request (`batch`: `Some(n)` for `n` items); a batch over `limit`
    /// (`--max-batch-size`) gets none.
    pub fn mint(batch: Option<usize>, limit: usize) -> Result<Self, GatewayError> {
        match batch {
            None => Ok(Rooms::One(new_room())),
            Some(n) if n > limit => Err(GatewayError::TooMany {
                field: "bootstrap_room",
                count: n as u64,
                limit,
            }),
            Some(n) => Ok(Rooms::Many((0..n).map(|_| new_room()).collect())),
        }
    }

    /// The rooms moved so that each is `rank` modulo `size` (`--dp-aware`, a prefill
    /// worker with several ranks): a decode worker finds the prefill rank holding a
    /// room's KV as the room modulo the prefill's `dp_size` (what SGLang's decode side
    /// does when it is not told the rank), so the room must agree with the rank the
    /// prefill request was sent to.
    pub fn align(&mut self, rank: u32, size: u32) {
        let size = u64::from(size.max(1));
        let rank = u64::from(rank) % size;
        let fix = |r: &mut u64| {
            let mut v = *r - *r % size + rank;
            if v >= 1 << 63 {
                v -= size;
            }
            *r = v;
        };
        match self {
            Rooms::One(r) => fix(r),
            Rooms::Many(v) => v.iter_mut().for_each(fix),
        }
    }

    /// Every room, in item order.
    pub fn as_slice(&self) -> &[u64] {
        match self {
            Rooms::One(r) => std::slice::from_ref(r),
            Rooms::Many(v) => v,
        }
    }
}

/// A random room in `0..2^63` (SGLang's rooms are non-negative 64-bit integers).
pub fn new_room() -> u64 {
    rand::random::<u64>() >> 1
}

/// The body with the bootstrap fields for `host`, `port` and `rooms` added (see the module
/// doc). `body` must be a JSON object (the inspection step checked that); `replace` says
/// the client sent bootstrap fields that must go first.
pub fn inject(
    body: &[u8],
    host: &str,
    port: Option<u16>,
    rooms: &Rooms,
    replace: bool,
) -> Result<Bytes, GatewayError> {
    if replace {
        let clean = members::without(body, &BOOTSTRAP_KEYS)?;
        return splice(&clean, host, port, rooms);
    }
    splice(body, host, port, rooms)
}

fn splice(
    body: &[u8],
    host: &str,
    port: Option<u16>,
    rooms: &Rooms,
) -> Result<Bytes, GatewayError> {
    let n = rooms.as_slice().len();
    let mut out = Vec::with_capacity(64 + n * (host.len() + 32));
    let host_json =
        serde_json::to_string(host).map_err(|e| GatewayError::Internal(e.to_string()))?;
    let port_json = |out: &mut Vec<u8>| match port {
        Some(p) => {
            let _ = write!(out, "{p}");
        }
        None => out.extend_from_slice(b"null"),
    };
    match rooms {
        Rooms::One(room) => {
            out.extend_from_slice(b"\"bootstrap_host\":");
            out.extend_from_slice(host_json.as_bytes());
            out.extend_from_slice(b",\"bootstrap_port\":");
            port_json(&mut out);
            let _ = write!(out, ",\"bootstrap_room\":{room}");
        }
        Rooms::Many(rooms) => {
            out.extend_from_slice(b"\"bootstrap_host\":[");
            for i in 0..n {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(host_json.as_bytes());
            }
            out.extend_from_slice(b"],\"bootstrap_port\":[");
            for i in 0..n {
                if i > 0 {
                    out.push(b',');
                }
                port_json(&mut out);
            }
            out.extend_from_slice(b"],\"bootstrap_room\":[");
            for (i, room) in rooms.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let _ = write!(out, "{room}");
            }
            out.push(b']');
        }
    }
    members::append(body, &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    fn parse(b: &[u8]) -> Map<String, Value> {
        serde_json::from_slice(b).expect("valid JSON after the splice")
    }

    #[test]
    fn scalars_lists_and_empty_objects() {
        let b = inject(
            br#"{"text":"hi"}"#,
            "10.0.0.1",
            Some(8998),
            &Rooms::One(7),
            false,
        )
        .unwrap();
        assert_eq!(
            &b[..],
            br#"{"text":"hi","bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":7}"#
        );
        let b = inject(b" { \n} \n", "h", None, &Rooms::Many(vec![1, 2]), false).unwrap();
        assert_eq!(
            parse(&b),
            parse(br#"{"bootstrap_host":["h","h"],"bootstrap_port":[null,null],"bootstrap_room":[1,2]}"#)
        );
        let b = inject(br#"{"a":{}}"#, "[::1]", None, &Rooms::Many(vec![]), false).unwrap();
        assert_eq!(
            parse(&b),
            parse(br#"{"a":{},"bootstrap_host":[],"bootstrap_port":[],"bootstrap_room":[]}"#)
        );
        for bad in [&b"[1]"[..], b"", b"  ", b"\"x\""] {
            assert!(inject(bad, "h", None, &Rooms::One(1), false).is_err());
        }
    }

    #[test]
    fn client_bootstrap_fields_are_replaced_not_duplicated() {
        let body =
            br#"{"text":"a","bootstrap_room":5,"bootstrap_host":null,"n":{"bootstrap_room":1}}"#;
        let b = inject(body, "p", Some(1), &Rooms::One(9), true).unwrap();
        let text = std::str::from_utf8(&b).unwrap();
        assert_eq!(text.matches("\"bootstrap_host\"").count(), 1, "{text}");
        let m = parse(&b);
        assert_eq!(m["bootstrap_room"], 9);
        assert_eq!(m["n"]["bootstrap_room"], 1, "nested keys are untouched");
    }

    #[test]
    fn rooms_are_fresh_63_bit_values() {
        let Rooms::Many(r) = Rooms::mint(Some(64), 64).unwrap() else {
            panic!("a batch gets a list");
        };
        let distinct: std::collections::HashSet<_> = r.iter().collect();
        assert_eq!(distinct.len(), 64);
        assert!(r.iter().all(|&x| x < 1 << 63));
        assert!(matches!(Rooms::mint(None, 1), Ok(Rooms::One(x)) if x < 1 << 63));
        // Aligned to a prefill rank: each room is the rank modulo the size, still 63-bit.
        let mut m = Rooms::Many(vec![0, 5, (1 << 63) - 1, 1 << 40]);
        m.align(3, 4);
        assert!(
            m.as_slice().iter().all(|r| r % 4 == 3 && *r < 1 << 63),
            "{m:?}"
        );
        let mut top = Rooms::One((1 << 63) - 1);
        top.align(6, 7);
        assert!(matches!(top, Rooms::One(x) if x % 7 == 6 && x < 1 << 63));
        // Over the limit: no room is minted at all.
        let e = Rooms::mint(Some(100_000_000_000), 4096).unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
        assert!(e.to_string().contains("--max-batch-size"), "{e}");
    }

    /// Arbitrary JSON values (strings with escapes and non-ASCII, nested objects, lists).
    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            // Floats that print and parse back exactly (serde_json's default parser is not
            // exact for every float, which would fail the comparison, not the splice).
            (any::<i16>(), 0u32..8).prop_map(|(m, e)| json!(f64::from(m) / f64::from(1u32 << e))),
            ".{0,12}".prop_map(Value::String),
            "[\"\\\\\\n\\t\u{1}-\u{1f}}{,:]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever the object holds (unknown fields, escapes, nesting, batches, any
        /// spacing), the result parses to the original object plus the three fields, and
        /// the client's bytes come through unchanged in front of them.
        #[test]
        fn splice_keeps_every_byte_and_adds_the_fields(
            fields in prop::collection::btree_map("[a-z_\\\\\"é]{1,10}", value(), 0..8),
            batch in prop::option::of(0usize..5),
            port in prop::option::of(1u16..),
            pretty in any::<bool>(),
            pad in "[ \t\r\n]{0,3}",
        ) {
            let mut obj: Map<String, Value> = fields.into_iter().collect();
            for k in ["bootstrap_host", "bootstrap_port", "bootstrap_room"] {
                obj.remove(k);
            }
            let mut body = pad.clone().into_bytes();
            body.extend(if pretty { serde_json::to_vec_pretty(&obj) } else { serde_json::to_vec(&obj) }.unwrap());
            body.extend_from_slice(pad.as_bytes());
            let rooms = Rooms::mint(batch, 8).unwrap();
            let out = inject(&body, "prefill-0.local", port, &rooms, false).unwrap();
            let mut got = parse(&out);
            let port_v = port.map_or(Value::Null, |p| json!(p));
            let (h, p, r) = match batch {
                None => (json!("prefill-0.local"), port_v, json!(rooms.as_slice()[0])),
                Some(n) => (json!(vec!["prefill-0.local"; n]), json!(vec![port_v; n]), json!(rooms.as_slice())),
            };
            prop_assert_eq!(got.remove("bootstrap_host"), Some(h));
            prop_assert_eq!(got.remove("bootstrap_port"), Some(p));
            prop_assert_eq!(got.remove("bootstrap_room"), Some(r));
            prop_assert_eq!(&got, &obj);
            let close = body.iter().rposition(|&b| b == b'}').unwrap();
            prop_assert_eq!(&out[..close], &body[..close]);
        }

        /// The replace path gives the same object as a splice of a body that never had them.
        #[test]
        fn replace_drops_the_clients_fields(
            fields in prop::collection::btree_map("[a-z]{1,6}", value(), 0..5),
            client_room in any::<u64>(),
        ) {
            let obj: Map<String, Value> = fields.into_iter().collect();
            let mut with = obj.clone();
            with.insert("bootstrap_room".into(), json!(client_room));
            with.insert("bootstrap_port".into(), Value::Null);
            let rooms = Rooms::One(3);
            let a = inject(&serde_json::to_vec(&with).unwrap(), "h", Some(2), &rooms, true).unwrap();
            let b = inject(&serde_json::to_vec(&obj).unwrap(), "h", Some(2), &rooms, false).unwrap();
            prop_assert_eq!(parse(&a), parse(&b));
        }
    }
}
