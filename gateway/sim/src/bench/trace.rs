//! Mooncake-format traces (`{"timestamp" ms, "input_length", "output_length", "hash_ids"}`
//! per line, 512-token blocks) and the token ids synthesized from them: block `h` is
//! [`BLOCK_TOKENS`] ids drawn deterministically from `h`, so equal hash ids mean equal
//! prefixes; the last block is cut to what `input_length` leaves.

use std::io::BufRead;
use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::model::{FIRST_HASHED_ID, VOCAB_SIZE, mix};

/// Tokens per block of a Mooncake trace.
pub const BLOCK_TOKENS: usize = 512;
/// Longest prompt accepted from a trace (its blocks are synthesized in memory).
pub const MAX_INPUT_TOKENS: u64 = 1 << 20;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

/// What a trace holds, in the terms its load is measured in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    /// From the first arrival to the last, in seconds.
    pub seconds: f64,
    /// Mean prompt tokens.
    pub mean_input: f64,
    /// Mean output tokens.
    pub mean_output: f64,
    /// Prompt tokens an infinite cache shared by every worker would not have to compute:
    /// each request's leading blocks met before, over all prompt tokens.
    pub ideal_hit: f64,
    /// The prompt tokens left to compute with that cache.
    pub ideal_uncached_tokens: u64,
}

/// [`Stats`] of `reqs` (in arrival order).
pub fn stats(reqs: &[TraceRequest]) -> Stats {
    let mut seen = std::collections::HashSet::new();
    let (mut input, mut output, mut uncached) = (0u64, 0u64, 0u64);
    for r in reqs {
        let hits = r.hash_ids.iter().take_while(|h| seen.contains(*h)).count() as u64;
        let cached = (hits * BLOCK_TOKENS as u64).min(r.input_length);
        uncached += r.input_length - cached;
        input += r.input_length;
        output += r.output_length;
        seen.extend(r.hash_ids.iter().copied());
    }
    let n = reqs.len().max(1) as f64;
    let span = match (reqs.first(), reqs.last()) {
        (Some(a), Some(b)) => b.timestamp.saturating_sub(a.timestamp) as f64 / 1000.0,
        _ => 0.0,
    };
    Stats {
        seconds: span,
        mean_input: input as f64 / n,
        mean_output: output as f64 / n,
        ideal_hit: if input == 0 {
            0.0
        } else {
            1.0 - uncached as f64 / input as f64
        },
        ideal_uncached_tokens: uncached,
    }
}

/// The offered load of `reqs` on a cluster that prefills `capacity` tokens a second: the
/// tokens left to compute with an ideal shared cache, per second of the trace, over the
/// capacity (1: the cluster is busy all the time even when it never recomputes a block).
pub fn offered_load(reqs: &[TraceRequest], capacity: f64) -> f64 {
    let s = stats(reqs);
    if s.seconds <= 0.0 || capacity <= 0.0 {
        return f64::INFINITY;
    }
    s.ideal_uncached_tokens as f64 / s.seconds / capacity
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
