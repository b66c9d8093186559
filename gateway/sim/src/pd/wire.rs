//! The messages between a decode and a prefill worker, carried as transfer-engine
//! notifications (which a peer sees only after the writes sent before them landed).
//! Binary, little endian, versioned:
//!
//! ```text
//! "MGKV" | version u8 (1) | kind u8 | room u64 | body
//! REGISTER (1) decode -> prefill: tokens u32 | page_tokens u32 | page_bytes u32 |
//!              runs u32 | runs × (addr u64, pages u32)       destination pages, in order
//! DONE     (2) prefill -> decode: group u32 | count u32 | count × checksum u32
//!              (one per `group` consecutive pages: the pages' CRC-32s over their used
//!              bytes, folded with rotate-left-5 and xor; a group of one is the CRC itself)
//! FAILED   (3) prefill -> decode: reason (UTF-8, the rest of the message)
//! ABORT    (4) decode -> prefill: (empty) the decode side gave the room up
//! ```
//! The decode's segment is the notification's sender; the room ties the messages to one
//! item of one request.

/// Leading bytes of every message.
pub const MAGIC: &[u8; 4] = b"MGKV";
/// The protocol version.
pub const VERSION: u8 = 1;
/// Largest message sent (under the transfer engine's 64 KiB notification limit).
pub const MAX_MESSAGE: usize = 60 << 10;
const HEAD: usize = 4 + 1 + 1 + 8;

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Decode's destination pages for a room.
    Register {
        /// The room.
        room: u64,
        /// Prompt tokens (the prefill checks it computes as many).
        tokens: u32,
        /// Tokens per page.
        page_tokens: u32,
        /// Bytes per full page.
        page_bytes: u32,
        /// Runs of consecutive pages: `(address of the first, pages)`, in prompt order.
        runs: Vec<(u64, u32)>,
    },
    /// Every page of the room is written.
    Done {
        /// The room.
        room: u64,
        /// Pages per checksum.
        group: u32,
        /// CRC-32 of each group of pages.
        crcs: Vec<u32>,
    },
    /// The prefill side could not deliver the room.
    Failed {
        /// The room.
        room: u64,
        /// Why.
        reason: String,
    },
    /// The decode side gave the room up.
    Abort {
        /// The room.
        room: u64,
    },
}

/// A message that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad KV message: {0}")]
pub struct WireError(pub String);

impl Message {
    /// The room the message is about.
    pub fn room(&self) -> u64 {
        match self {
            Message::Register { room, .. }
            | Message::Done { room, .. }
            | Message::Failed { room, .. }
            | Message::Abort { room } => *room,
        }
    }

    /// The bytes of the message.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, room) = match self {
            Message::Register { room, .. } => (1u8, *room),
            Message::Done { room, .. } => (2, *room),
            Message::Failed { room, .. } => (3, *room),
            Message::Abort { room } => (4, *room),
        };
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(kind);
        out.extend_from_slice(&room.to_le_bytes());
        let u32_le = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
        match self {
            Message::Register {
                tokens,
                page_tokens,
                page_bytes,
                runs,
                ..
            } => {
                u32_le(&mut out, *tokens);
                u32_le(&mut out, *page_tokens);
                u32_le(&mut out, *page_bytes);
                u32_le(&mut out, runs.len() as u32);
                for (addr, pages) in runs {
                    out.extend_from_slice(&addr.to_le_bytes());
                    u32_le(&mut out, *pages);
                }
            }
            Message::Done { group, crcs, .. } => {
                u32_le(&mut out, *group);
                u32_le(&mut out, crcs.len() as u32);
                for c in crcs {
                    u32_le(&mut out, *c);
                }
            }
            Message::Failed { reason, .. } => out.extend_from_slice(reason.as_bytes()),
            Message::Abort { .. } => {}
        }
        out
    }

    /// Reads a message.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        let bad = |m: &str| WireError(m.to_owned());
        if b.len() < HEAD || &b[..4] != MAGIC {
            return Err(bad("not a Moongate KV message"));
        }
        if b[4] != VERSION {
            return Err(WireError(format!("unsupported version {}", b[4])));
        }
        let kind = b[5];
        let room = u64::from_le_bytes(b[6..14].try_into().map_err(|_| bad("short"))?);
        let mut r = Reader(&b[HEAD..]);
        let msg = match kind {
            1 => {
                let (tokens, page_tokens, page_bytes, n) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
                if Some(r.0.len()) != (n as usize).checked_mul(12) {
                    return Err(bad("run list length does not match its count"));
                }
                let mut runs = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    runs.push((r.u64()?, r.u32()?));
                }
                Message::Register {
                    room,
                    tokens,
                    page_tokens,
                    page_bytes,
                    runs,
                }
            }
            2 => {
                let (group, n) = (r.u32()?, r.u32()?);
                if Some(r.0.len()) != (n as usize).checked_mul(4) {
                    return Err(bad("checksum list length does not match its count"));
                }
                let crcs = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
                Message::Done { room, group, crcs }
            }
            3 => Message::Failed {
                room,
                reason: String::from_utf8_lossy(r.0).into_owned(),
            },
            4 if r.0.is_empty() => Message::Abort { room },
            k => return Err(WireError(format!("unknown message kind {k}"))),
        };
        Ok(msg)
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        if self.0.len() < N {
            return Err(WireError("truncated message".into()));
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into()
            .map_err(|_| WireError("truncated message".into()))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

/// Runs of consecutive addresses (`step` bytes apart) in `addrs`, in order.
pub fn runs(addrs: impl IntoIterator<Item = u64>, step: u64) -> Vec<(u64, u32)> {
    let mut out: Vec<(u64, u32)> = Vec::new();
    for a in addrs {
        let next = out.last().and_then(|&(start, n)| {
            u64::from(n)
                .checked_mul(step)
                .and_then(|d| start.checked_add(d))
                .filter(|_| n < u32::MAX)
        });
        match out.last_mut() {
            Some((_, n)) if next == Some(a) => *n += 1,
            _ => out.push((a, 1)),
        }
    }
    out
}

/// The address of every page the runs cover, in order: exactly `expected` pages, each
/// address within `u64` (a peer's registration is checked before anything is sized by it).
pub fn pages_of(runs: &[(u64, u32)], step: u64, expected: usize) -> Result<Vec<u64>, WireError> {
    let total = runs
        .iter()
        .try_fold(0u64, |t, &(_, n)| t.checked_add(u64::from(n)));
    if total != Some(expected as u64) {
        return Err(WireError(format!(
            "{} pages registered where {expected} are needed",
            total.map_or_else(|| "more than 2^64".to_owned(), |t| t.to_string())
        )));
    }
    let mut out = Vec::with_capacity(expected);
    for &(a, n) in runs {
        for i in 0..u64::from(n) {
            let addr = i
                .checked_mul(step)
                .and_then(|d| a.checked_add(d))
                .ok_or_else(|| WireError(format!("a page run at {a:#x} runs past 2^64")))?;
            out.push(addr);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_message_round_trips() {
        for m in [
            Message::Register {
                room: 1 << 62,
                tokens: 4096,
                page_tokens: 16,
                page_bytes: 2 << 20,
                runs: vec![(0x7f00_0000_0000, 200), (0x7f00_4000_0000, 56)],
            },
            Message::Done {
                room: 7,
                group: 1,
                crcs: vec![1, 2, u32::MAX],
            },
            Message::Failed {
                room: 7,
                reason: "decode unreachable: é".into(),
            },
            Message::Abort { room: 0 },
        ] {
            assert_eq!(Message::decode(&m.encode()), Ok(m.clone()));
        }
        assert!(Message::decode(b"MGKV").is_err());
        let mut v2 = Message::Abort { room: 1 }.encode();
        v2[4] = 2;
        assert!(Message::decode(&v2).unwrap_err().0.contains("version"));
    }

    #[test]
    fn runs_coalesce_and_expand() {
        let addrs = [100, 110, 120, 200, 210, 130];
        let r = runs(addrs, 10);
        assert_eq!(r, vec![(100, 3), (200, 2), (130, 1)]);
        assert_eq!(pages_of(&r, 10, 6).unwrap(), addrs.to_vec());
        // Addresses at the top of the space do not wrap into a run.
        assert_eq!(runs([u64::MAX - 5, 4], 10), vec![(u64::MAX - 5, 1), (4, 1)]);
    }

    #[test]
    fn hostile_runs_are_refused_before_anything_is_sized() {
        // Four billion pages claimed: refused by count, nothing allocated for them.
        let huge = vec![(0x1000, u32::MAX); 5000];
        let e = pages_of(&huge, 4096, 8).unwrap_err();
        assert!(e.0.contains("where 8 are needed"), "{e}");
        // A run past the end of the address space.
        let e = pages_of(&[(u64::MAX - 10, 2)], 4096, 2).unwrap_err();
        assert!(e.0.contains("past 2^64"), "{e}");
        assert_eq!(pages_of(&[], 4096, 0).unwrap(), Vec::<u64>::new());
    }

    proptest! {
        /// Any bytes: a message or an error, never a panic.
        #[test]
        fn decoding_never_panics(b in prop::collection::vec(any::<u8>(), 0..64), kind in 0u8..6) {
            let mut m = b"MGKV\x01".to_vec();
            m.push(kind);
            m.extend(b);
            let _ = Message::decode(&m);
        }

        /// Any registration a peer can send: its pages are expanded only when they are as
        /// many as needed, and never by overflowing arithmetic.
        #[test]
        fn any_registered_runs_expand_or_are_refused(
            runs in prop::collection::vec((any::<u64>(), any::<u32>()), 0..8),
            step in 1u64..1 << 40,
            expected in 0usize..64,
        ) {
            match pages_of(&runs, step, expected) {
                Ok(pages) => prop_assert_eq!(pages.len(), expected),
                Err(e) => prop_assert!(e.0.contains("pages registered") || e.0.contains("2^64")),
            }
        }
    }
}
