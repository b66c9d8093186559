//! The wire format of SGLang's KV events (`disaggregation/kv_events.py`), apart from what
//! they mean. A ZMQ PUB message is three frames: the topic, the batch's sequence number
//! (u64 big-endian) and the msgpack payload, an `EventBatch`: msgspec `array_like` structs,
//! so msgpack arrays, `[ts, events, attn_dp_rank]`, each event a tagged array:
//! `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
//! `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`. Decoding accepts the
//! older forms too (no `medium`, no `attn_dp_rank`) and ignores fields added after them.
//!
//! The replay socket (ROUTER) takes `[empty, start_seq (u64 BE)]` from a DEALER and answers
//! `[empty, seq, payload]` per buffered batch from `start_seq` on, then `[empty, -1 (i64
//! BE), empty]`.

use std::fmt;

use serde::de::{self, IgnoredAny, SeqAccess, Visitor};
use serde::ser::SerializeTuple;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::hash::BlockHash;

/// Most events one decoded batch may hold.
pub const MAX_EVENTS_PER_BATCH: usize = 1 << 16;
/// Most block hashes or token ids one decoded event may hold.
pub const MAX_ITEMS_PER_EVENT: usize = 1 << 20;
/// The replay stream's end marker (`-1` as 8 bytes big-endian).
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Where a block lives (`medium`; absent means GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Medium {
    /// Device memory (`"GPU"`, or no medium given).
    #[default]
    Gpu,
    /// Host memory or a storage tier (`"CPU"`, `"L3"`, anything else).
    Other,
}

impl Medium {
    fn from_wire(s: Option<&str>) -> Self {
        match s {
            None => Medium::Gpu,
            Some(m) if m.eq_ignore_ascii_case("gpu") => Medium::Gpu,
            Some(_) => Medium::Other,
        }
    }
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Pages were stored: `block_hashes` in order, the first one's parent being
    /// `parent_block_hash` (none: a root page).
    BlockStored {
        /// The new pages.
        block_hashes: Vec<BlockHash>,
        /// The page before the first one.
        parent_block_hash: Option<BlockHash>,
        /// The pages' token ids.
        token_ids: Vec<u32>,
        /// Tokens per page.
        block_size: u32,
        /// LoRA adapter id.
        lora_id: Option<i64>,
        /// Where they are stored.
        medium: Option<String>,
    },
    /// Pages were evicted.
    BlockRemoved {
        /// The pages.
        block_hashes: Vec<BlockHash>,
        /// Where they were.
        medium: Option<String>,
    },
    /// The whole cache was flushed.
    AllBlocksCleared,
}

impl KvEvent {
    /// The event's medium.
    pub fn medium(&self) -> Medium {
        match self {
            KvEvent::BlockStored { medium, .. } | KvEvent::BlockRemoved { medium, .. } => {
                Medium::from_wire(medium.as_deref())
            }
            KvEvent::AllBlocksCleared => Medium::Gpu,
        }
    }
}

/// A batch of events, as published under one sequence number.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// Seconds since the Unix epoch when the batch was made.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<KvEvent>,
    /// The attention data-parallel rank that published it.
    pub attn_dp_rank: Option<i64>,
}

/// Errors decoding a payload.
#[derive(Debug, thiserror::Error)]
#[error("bad KV event batch: {0}")]
pub struct DecodeError(String);

impl EventBatch {
    /// The msgpack payload.
    pub fn encode(&self) -> Vec<u8> {
        // Plain data into a Vec: rmp-serde cannot fail here.
        rmp_serde::to_vec(self).unwrap_or_default()
    }

    /// Reads a msgpack payload (sizes checked against [`MAX_EVENTS_PER_BATCH`] and
    /// [`MAX_ITEMS_PER_EVENT`]; never panics).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        rmp_serde::from_slice(bytes).map_err(|e| DecodeError(e.to_string()))
    }
}

fn ser_hash<S: SerializeTuple>(t: &mut S, h: &BlockHash) -> Result<(), S::Error> {
    // msgspec writes non-negative ints in unsigned forms.
    match u64::try_from(*h) {
        Ok(u) => t.serialize_element(&u),
        Err(_) => t.serialize_element(h),
    }
}

struct Hashes<'a>(&'a [BlockHash]);

impl Serialize for Hashes<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(self.0.len())?;
        for h in self.0 {
            ser_hash(&mut t, h)?;
        }
        t.end()
    }
}

struct OptHash(Option<BlockHash>);

impl Serialize for OptHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            None => s.serialize_none(),
            Some(h) => match u64::try_from(h) {
                Ok(u) => s.serialize_u64(u),
                Err(_) => s.serialize_i64(h),
            },
        }
    }
}

impl Serialize for KvEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
            } => {
                let mut t = s.serialize_tuple(7)?;
                t.serialize_element("BlockStored")?;
                t.serialize_element(&Hashes(block_hashes))?;
                t.serialize_element(&OptHash(*parent_block_hash))?;
                t.serialize_element(token_ids)?;
                t.serialize_element(block_size)?;
                t.serialize_element(lora_id)?;
                t.serialize_element(medium)?;
                t.end()
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => {
                let mut t = s.serialize_tuple(3)?;
                t.serialize_element("BlockRemoved")?;
                t.serialize_element(&Hashes(block_hashes))?;
                t.serialize_element(medium)?;
                t.end()
            }
            KvEvent::AllBlocksCleared => {
                let mut t = s.serialize_tuple(1)?;
                t.serialize_element("AllBlocksCleared")?;
                t.end()
            }
        }
    }
}

impl Serialize for EventBatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&self.ts)?;
        t.serialize_element(&self.events)?;
        t.serialize_element(&self.attn_dp_rank)?;
        t.end()
    }
}

/// A list read with a cap on its length (the cap is checked before anything is reserved).
struct Capped<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Capped<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Capped<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Capped<T>, A::Error> {
                let hint = seq.size_hint().unwrap_or(0);
                if hint > MAX_ITEMS_PER_EVENT {
                    return Err(de::Error::custom(format!(
                        "a list of {hint} items (at most {MAX_ITEMS_PER_EVENT})"
                    )));
                }
                let mut out = Vec::with_capacity(hint.min(4096));
                while let Some(x) = seq.next_element()? {
                    if out.len() == MAX_ITEMS_PER_EVENT {
                        return Err(de::Error::custom("list too long"));
                    }
                    out.push(x);
                }
                Ok(Capped(out))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

fn need<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(
    seq: &mut A,
    what: &str,
) -> Result<T, A::Error> {
    seq.next_element()?
        .ok_or_else(|| de::Error::custom(format!("missing {what}")))
}

fn drain<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

/// A msgspec `array_like` struct read from a msgpack array; elements after the ones it
/// knows are skipped.
trait FromArray: Sized {
    /// What the array is, for errors.
    const WHAT: &'static str;
    /// Reads the known elements.
    fn from_array<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<Self, A::Error>;
}

struct ArrayVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: FromArray> Visitor<'de> for ArrayVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::WHAT)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let v = T::from_array(&mut seq)?;
        drain(&mut seq)?;
        Ok(v)
    }
}

impl FromArray for KvEvent {
    const WHAT: &'static str = "a tagged KV event array";
    fn from_array<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<Self, A::Error> {
        let tag: String = need(seq, "event tag")?;
        Ok(match tag.as_str() {
            "BlockStored" => {
                let Capped(block_hashes) = need(seq, "block_hashes")?;
                let parent_block_hash = need(seq, "parent_block_hash")?;
                let Capped(token_ids) = need(seq, "token_ids")?;
                let block_size = need(seq, "block_size")?;
                let lora_id = seq.next_element()?.flatten();
                let medium = seq.next_element()?.flatten();
                KvEvent::BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_id,
                    medium,
                }
            }
            "BlockRemoved" => {
                let Capped(block_hashes) = need(seq, "block_hashes")?;
                let medium = seq.next_element()?.flatten();
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                }
            }
            "AllBlocksCleared" => KvEvent::AllBlocksCleared,
            other => return Err(de::Error::custom(format!("unknown event {other:?}"))),
        })
    }
}

impl FromArray for EventBatch {
    const WHAT: &'static str = "an EventBatch array";
    fn from_array<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<Self, A::Error> {
        let ts = need(seq, "ts")?;
        let Capped(events) = need::<Capped<KvEvent>, _>(seq, "events")?;
        if events.len() > MAX_EVENTS_PER_BATCH {
            return Err(de::Error::custom("too many events in one batch"));
        }
        Ok(EventBatch {
            ts,
            events,
            attn_dp_rank: seq.next_element()?.flatten(),
        })
    }
}

impl<'de> Deserialize<'de> for KvEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(ArrayVisitor(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for EventBatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(ArrayVisitor(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H0: i64 = -3488128144981237669;
    const H1: i64 = 5674439469042975057;

    /// Payloads made by msgspec with SGLang's struct definitions (`medium` and
    /// `attn_dp_rank` given, and both `None`).
    const WITH_MEDIUM: &str = "93cb40000000000000009297ab426c6f636b53746f72656491cf4ebfa8a1f3c34151d3cf97adeedb59e05b940506070804c0a343505593ac426c6f636b52656d6f76656491d3cf97adeedb59e05ba347505501";
    const NONES: &str = "93cb3ff80000000000009397ab426c6f636b53746f72656492d3cf97adeedb59e05bcf4ebfa8a1f3c34151c098010203040506070804c0c093ac426c6f636b52656d6f76656491cf4ebfa8a1f3c34151c091b0416c6c426c6f636b73436c6561726564c0";

    fn with_medium() -> EventBatch {
        EventBatch {
            ts: 2.0,
            events: vec![
                KvEvent::BlockStored {
                    block_hashes: vec![H1],
                    parent_block_hash: Some(H0),
                    token_ids: vec![5, 6, 7, 8],
                    block_size: 4,
                    lora_id: None,
                    medium: Some("CPU".into()),
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![H0],
                    medium: Some("GPU".into()),
                },
            ],
            attn_dp_rank: Some(1),
        }
    }

    #[test]
    fn bytes_match_msgspec() {
        assert_eq!(hex::encode(with_medium().encode()), WITH_MEDIUM);
        let nones = EventBatch {
            ts: 1.5,
            events: vec![
                KvEvent::BlockStored {
                    block_hashes: vec![H0, H1],
                    parent_block_hash: None,
                    token_ids: (1..=8).collect(),
                    block_size: 4,
                    lora_id: None,
                    medium: None,
                },
                KvEvent::BlockRemoved {
                    block_hashes: vec![H1],
                    medium: None,
                },
                KvEvent::AllBlocksCleared,
            ],
            attn_dp_rank: None,
        };
        assert_eq!(hex::encode(nones.encode()), NONES);
        for (hex_str, want) in [(WITH_MEDIUM, with_medium()), (NONES, nones)] {
            let got = EventBatch::decode(&hex::decode(hex_str).unwrap()).unwrap();
            assert_eq!(got, want);
        }
        assert_eq!(with_medium().events[0].medium(), Medium::Other);
        assert_eq!(with_medium().events[1].medium(), Medium::Gpu);
    }

    #[test]
    fn older_and_newer_forms_decode() {
        // SGLang before `medium`: [ts, events], BlockStored with 6 elements.
        let old = rmp_serde::to_vec(&(
            1.0f64,
            vec![(
                "BlockStored",
                vec![7i64],
                Option::<i64>::None,
                vec![1u32, 2],
                2u32,
                Option::<i64>::None,
            )],
        ))
        .unwrap();
        let b = EventBatch::decode(&old).unwrap();
        assert_eq!(b.attn_dp_rank, None);
        assert!(
            matches!(&b.events[0], KvEvent::BlockStored { block_hashes, medium: None, .. } if block_hashes == &[7])
        );
        // A field added later is ignored.
        let newer =
            rmp_serde::to_vec(&(1.0f64, vec![("BlockRemoved", vec![7i64], "GPU", 9)], 0, "x"))
                .unwrap();
        assert!(matches!(
            EventBatch::decode(&newer).unwrap().events[0],
            KvEvent::BlockRemoved { .. }
        ));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bad in [
            &b""[..],
            b"\x93",
            b"\xc1",
            b"\x92\xcb\0\0\0\0\0\0\0\0\x91\x91\xa4Nope",
            // An array header claiming 2^32-1 hashes, with nothing behind it.
            b"\x92\xcb\0\0\0\0\0\0\0\0\x91\x92\xacBlockRemoved\xdd\xff\xff\xff\xff",
        ] {
            assert!(EventBatch::decode(bad).is_err(), "{bad:?}");
        }
        proptest::proptest!(|(bytes: Vec<u8>)| {
            let _ = EventBatch::decode(&bytes);
        });
    }
}
