//! Traces made by code (`moongate gen-trace`), in Mooncake's format, for traffic shapes
//! the public traces do not cover; seeded, so a shape and a seed always give the same
//! trace.
//!
//! Prompts are built the way Mooncake hashes its traces: a conversation's token stream
//! grows turn by turn, and a 512-token block keeps its hash id once it is full, so a later
//! turn shares every full block of the earlier ones; the last, partial block of a prompt
//! is its own. A system prompt's full blocks are shared by every conversation that uses
//! it; the block where it meets the conversation's own text is the conversation's.
//!
//! Shapes ([`Shape`]):
//! - `agent`: tool-using agents: eight long system prompts (tool schemas, 6 to 12 k
//!   tokens, a few much more used than the rest), sessions of 4 to 16 steps, each step
//!   adding a tool result and the model's call (0.3 to 2 k tokens) a few seconds after the
//!   previous one ended; short outputs.
//! - `chat`: many short conversations under two short system prompts: 1 to 4 turns of 50
//!   to 400 tokens, outputs of 100 to 500.
//! - `bursty`: `chat`'s conversations arriving in bursts (10 s at 4x the mean rate, then
//!   20 s at half of it).
//! - `mixed`: long and short together: a third are questions over one of forty long
//!   documents (8 to 48 k tokens, popularity falling with rank), with 1 to 3 follow-ups;
//!   the rest are `chat`'s.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::trace::{BLOCK_TOKENS, TraceRequest};
use crate::model::mix;

/// A generated traffic shape (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Tool-using agent sessions over long shared system prompts.
    Agent,
    /// Many short conversations.
    Chat,
    /// Short conversations arriving in bursts.
    Bursty,
    /// Long document questions among short chats.
    Mixed,
}

/// `moongate gen-trace` settings.
#[derive(Debug, Clone, clap::Args)]
pub struct GenConfig {
    /// The traffic shape.
    #[arg(long, value_enum)]
    pub shape: Shape,
    /// Requests to write.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Seed of the draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write the trace (JSON lines).
    #[arg(long)]
    pub out: std::path::PathBuf,
}

/// One conversation's token stream, as block hash ids.
struct Stream {
    /// Its own id (its blocks' ids derive from it).
    id: u64,
    /// The shared system prompt's id and length (tokens), if any.
    system: Option<(u64, u64)>,
    /// Tokens so far.
    len: u64,
}

impl Stream {
    fn new(id: u64, system: Option<(u64, u64)>) -> Self {
        let len = system.map_or(0, |(_, n)| n);
        Stream { id, system, len }
    }

    /// The prompt once `add` more tokens are in: its block ids (see the module doc).
    fn prompt(&mut self, add: u64, partial: &mut u64) -> (u64, Vec<u64>) {
        self.len += add;
        let block = BLOCK_TOKENS as u64;
        let full = self.len / block;
        let mut ids: Vec<u64> = (0..full)
            .map(|j| match self.system {
                // Wholly inside the system prompt: shared by its conversations.
                Some((s, n)) if (j + 1) * block <= n => mix(s ^ mix(j + 1)),
                _ => mix(self.id ^ mix(j + 1).rotate_left(17)),
            })
            .collect();
        if !self.len.is_multiple_of(block) {
            *partial += 1;
            ids.push(mix(u64::MAX - *partial));
        }
        (self.len, ids)
    }
}

/// Draws from weights falling with rank (`1 / rank`).
fn by_rank(rng: &mut StdRng, n: usize) -> usize {
    let total: f64 = (1..=n).map(|r| 1.0 / r as f64).sum();
    let mut x = rng.random_range(0.0..total);
    for r in 1..=n {
        x -= 1.0 / r as f64;
        if x <= 0.0 {
            return r - 1;
        }
    }
    n - 1
}

/// An exponential draw of mean `mean`.
fn exp(rng: &mut StdRng, mean: f64) -> f64 {
    -mean * (1.0 - rng.random_range(0.0..1.0f64)).ln()
}

/// A turn waiting to be sent: when, which conversation, how many tokens it adds, its
/// output, and the turns after it.
struct Pending {
    at_ms: f64,
    conv: usize,
    add: u64,
    output: u64,
    left: u32,
}

/// The requests of `shape` (see the module doc), `n` of them, drawn from `seed`.
pub fn generate(shape: Shape, n: usize, seed: u64) -> Vec<TraceRequest> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut streams: Vec<Stream> = Vec::new();
    let mut pending: Vec<Pending> = Vec::new();
    let mut out = Vec::with_capacity(n);
    let mut partial = 0u64;
    let mut clock = 0.0f64;
    let sessions_per_sec = match shape {
        Shape::Agent => 0.25,
        Shape::Chat | Shape::Bursty => 1.5,
        Shape::Mixed => 1.0,
    };
    let systems: HashMap<&str, Vec<(u64, u64)>> = HashMap::from([
        (
            "agent",
            (0..8)
                .map(|i| (mix(0xa6e7 + i), rng.random_range(6_000..12_000)))
                .collect(),
        ),
        (
            "chat",
            (0..2)
                .map(|i| (mix(0xc4a7 + i), rng.random_range(300..900)))
                .collect(),
        ),
    ]);
    let documents: Vec<(u64, u64)> = (0..40)
        .map(|i| (mix(0xd0c + i), rng.random_range(8_000..48_000)))
        .collect();
    while out.len() < n {
        // Next new session, unless a pending turn comes first.
        let rate = match shape {
            Shape::Bursty if (clock / 1000.0) % 30.0 < 10.0 => sessions_per_sec * 4.0,
            Shape::Bursty => sessions_per_sec * 0.5,
            _ => sessions_per_sec,
        };
        let next_session = clock + exp(&mut rng, 1000.0 / rate);
        let first = pending
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.at_ms.total_cmp(&b.1.at_ms))
            .map(|(i, p)| (i, p.at_ms));
        match first {
            Some((i, at)) if at <= next_session => {
                let p = pending.swap_remove(i);
                clock = p.at_ms;
                let (len, ids) = streams[p.conv].prompt(p.add, &mut partial);
                out.push(TraceRequest {
                    timestamp: clock as u64,
                    input_length: len,
                    output_length: p.output,
                    hash_ids: ids,
                });
                if p.left > 0 {
                    // The next step: after the answer (~20 ms a token) and the tool or the
                    // user, it adds the answer and what comes back.
                    let think = match shape {
                        Shape::Agent => exp(&mut rng, 3_000.0) + 500.0,
                        _ => exp(&mut rng, 20_000.0) + 2_000.0,
                    };
                    let (add, output) = turn(shape, false, &mut rng);
                    pending.push(Pending {
                        at_ms: clock + p.output as f64 * 20.0 + think,
                        conv: p.conv,
                        add: add + p.output,
                        output,
                        left: p.left - 1,
                    });
                }
            }
            _ => {
                clock = next_session;
                let id = mix(seed ^ mix(streams.len() as u64 + 1));
                let long = shape == Shape::Mixed && rng.random_range(0..3) == 0;
                let (system, turns) = match shape {
                    Shape::Agent => {
                        let s = systems["agent"][by_rank(&mut rng, 8)];
                        (Some(s), rng.random_range(4..=16))
                    }
                    _ if long => (
                        Some(documents[by_rank(&mut rng, documents.len())]),
                        rng.random_range(1..=3),
                    ),
                    _ => {
                        let s = systems["chat"][rng.random_range(0..2)];
                        (Some(s), rng.random_range(1..=4))
                    }
                };
                streams.push(Stream::new(id, system));
                let (add, output) = turn(shape, long, &mut rng);
                pending.push(Pending {
                    at_ms: clock,
                    conv: streams.len() - 1,
                    add,
                    output,
                    left: turns - 1,
                });
            }
        }
    }
    out
}

/// Tokens one turn adds to its conversation (before the answer), and its output.
fn turn(shape: Shape, long: bool, rng: &mut StdRng) -> (u64, u64) {
    match shape {
        Shape::Agent => (rng.random_range(300..2_000), rng.random_range(50..300)),
        _ if long => (rng.random_range(50..200), rng.random_range(200..600)),
        _ => (rng.random_range(50..400), rng.random_range(100..500)),
    }
}

/// Writes `reqs` to `path` as JSON lines.
pub fn write(path: &Path, reqs: &[TraceRequest]) -> anyhow::Result<()> {
    let mut text = String::with_capacity(reqs.len() * 128);
    for r in reqs {
        text.push_str(&serde_json::to_string(r)?);
        text.push('\n');
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `moongate gen-trace`: writes the trace and says what it holds.
pub fn run(cfg: &GenConfig) -> anyhow::Result<()> {
    anyhow::ensure!(cfg.requests > 0, "--requests must be at least 1");
    let reqs = generate(cfg.shape, cfg.requests, cfg.seed);
    write(&cfg.out, &reqs)?;
    let s = super::trace::stats(&reqs);
    println!(
        "{} requests over {:.0} s to {}: mean input {:.0} tokens, mean output {:.0}, \
         an infinite shared cache would hit {:.1}% of the prompt tokens",
        reqs.len(),
        s.seconds,
        cfg.out.display(),
        s.mean_input,
        s.mean_output,
        100.0 * s.ideal_hit
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_deterministic_ordered_and_share_what_they_should() {
        for shape in [Shape::Agent, Shape::Chat, Shape::Bursty, Shape::Mixed] {
            let a = generate(shape, 400, 7);
            assert_eq!(
                a,
                generate(shape, 400, 7),
                "{shape:?}: same seed, same trace"
            );
            assert_ne!(a, generate(shape, 400, 8), "{shape:?}");
            assert_eq!(a.len(), 400);
            assert!(a.windows(2).all(|w| w[0].timestamp <= w[1].timestamp));
            for r in &a {
                let blocks = r.input_length.div_ceil(BLOCK_TOKENS as u64) as usize;
                assert_eq!(r.hash_ids.len(), blocks, "{shape:?}: one id per block");
            }
            let s = super::super::trace::stats(&a);
            assert!(
                s.ideal_hit > 0.2 && s.ideal_hit < 0.99,
                "{shape:?}: {}",
                s.ideal_hit
            );
        }
        // Agents: long prompts sharing system prompts; chats: short ones.
        let agent = super::super::trace::stats(&generate(Shape::Agent, 400, 1));
        let chat = super::super::trace::stats(&generate(Shape::Chat, 400, 1));
        assert!(agent.mean_input > 5.0 * chat.mean_input);
        assert!(agent.ideal_hit > chat.ideal_hit);
    }

    #[test]
    fn a_later_turn_repeats_the_full_blocks_of_the_earlier_one() {
        let mut partial = 0;
        let mut s = Stream::new(9, Some((1, 1100)));
        let (n1, a) = s.prompt(200, &mut partial);
        let (n2, b) = s.prompt(600, &mut partial);
        assert_eq!((n1, n2), (1300, 1900));
        assert_eq!(a.len(), 3);
        assert_eq!(b.len(), 4);
        assert_eq!(a[..2], b[..2], "full blocks stay");
        assert_ne!(a[2], b[2], "a partial block is its own");
        let mut other = Stream::new(10, Some((1, 1100)));
        let (_, c) = other.prompt(200, &mut partial);
        assert_eq!(c[..2], a[..2], "the system prompt's full blocks are shared");
        assert_ne!(c[2], a[2]);
    }
}
