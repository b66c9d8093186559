//! Mooncake-format traces (`{"timestamp" ms, "input_length", "output_length", "hash_ids"}`
//! per line, 512-token blocks) and the token ids synthesized from them: block `h` is
//! [`BLOCK_TOKENS`] ids drawn deterministically from `h`, so equal hash ids mean equal
//! prefixes; the last block is cut to what `input_length` leaves.

use std::io::BufRead;
use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;

use crate::model::{FIRST_HASHED_ID, VOCAB_SIZE, mix};

/// Tokens per block of a Mooncake trace.
pub const BLOCK_TOKENS: usize = 512;
/// Longest prompt accepted from a trace (its blocks are synthesized in memory).
pub const MAX_INPUT_TOKENS: u64 = 1 << 20;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceRequest {
    /// Arrival, in milliseconds since the trace's start.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Output tokens.
    pub output_length: u64,
    /// The prompt's 512-token blocks.
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// The conversation the request belongs to: its first two blocks (the system prompt
    /// every conversation shares, then the conversation's own first turn, which each later
    /// turn repeats), `None` for a prompt of fewer blocks.
    pub fn session(&self) -> Option<String> {
        match self.hash_ids.as_slice() {
            [a, b, ..] => Some(format!("{a}-{b}")),
            _ => None,
        }
    }

    /// The prompt's token ids: each block's ids come from its hash id alone.
    pub fn tokens(&self) -> Vec<u32> {
        let n = self.input_length as usize;
        let mut out = Vec::with_capacity(n);
        for &h in &self.hash_ids {
            let room = n - out.len();
            if room == 0 {
                break;
            }
            let span = (FIRST_HASHED_ID..VOCAB_SIZE).len() as u64;
            out.extend((0..BLOCK_TOKENS.min(room) as u64).map(|i| {
                FIRST_HASHED_ID + (mix(h.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i) % span) as u32
            }));
        }
        // A trace line with fewer blocks than its length: pad from a block of its own.
        let pad = mix(u64::MAX ^ self.timestamp);
        let mut i = 0u64;
        while out.len() < n {
            out.push(
                FIRST_HASHED_ID + (mix(pad ^ i) % u64::from(VOCAB_SIZE - FIRST_HASHED_ID)) as u32,
            );
            i += 1;
        }
        out
    }
}

/// Reads at most `limit` requests of the trace at `path`.
pub fn read(path: &Path, limit: Option<usize>) -> anyhow::Result<Vec<TraceRequest>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let r: TraceRequest = serde_json::from_str(&line)
            .with_context(|| format!("{}:{}: not a trace request", path.display(), i + 1))?;
        if r.input_length == 0 || r.input_length > MAX_INPUT_TOKENS {
            anyhow::bail!(
                "{}:{}: input_length {} is outside 1..={MAX_INPUT_TOKENS}",
                path.display(),
                i + 1,
                r.input_length
            );
        }
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_hash_ids_mean_equal_prefixes() {
        let a = TraceRequest {
            timestamp: 0,
            input_length: 1000,
            output_length: 1,
            hash_ids: vec![0, 1],
        };
        let b = TraceRequest {
            input_length: 700,
            hash_ids: vec![0, 2],
            ..a.clone()
        };
        let (ta, tb) = (a.tokens(), b.tokens());
        assert_eq!((ta.len(), tb.len()), (1000, 700));
        assert_eq!(ta[..512], tb[..512]);
        assert_ne!(ta[512..700], tb[512..700]);
        assert!(
            ta.iter()
                .all(|&t| (FIRST_HASHED_ID..VOCAB_SIZE).contains(&t))
        );
        assert_eq!(a.tokens(), ta, "deterministic");
    }
}
