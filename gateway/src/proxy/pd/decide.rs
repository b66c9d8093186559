//! Disaggregate or not (Dynamo's `isl_bounding` / `prefill_load`, llm-d's prefix-based
//! decider): per request, whether the prefill tier is worth it. The decode worker alone
//! serves it (computing the prompt itself) when the part of the prompt it has not cached
//! is short (`--pd-min-uncached-tokens`, or a share below `--pd-min-uncached-ratio`), or
//! when every prefill worker is busy (`--pd-prefill-busy-load` requests or more) and the
//! decode worker is not. All off (0) by default: always disaggregate. Pure.

use crate::config::ServeConfig;
use crate::outcome::PdPath;

/// The thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Decider {
    /// Fewer uncached tokens than this: decode alone.
    pub min_uncached_tokens: u64,
    /// An uncached share below this: decode alone.
    pub min_uncached_ratio: f64,
    /// Every prefill worker with this many requests in flight or more (and the decode
    /// worker with fewer): decode alone.
    pub prefill_busy_load: usize,
}

impl From<&ServeConfig> for Decider {
    fn from(c: &ServeConfig) -> Self {
        Decider {
            min_uncached_tokens: c.pd_min_uncached_tokens,
            min_uncached_ratio: c.pd_min_uncached_ratio,
            prefill_busy_load: c.pd_prefill_busy_load,
        }
    }
}

/// What the decision is made on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Facts {
    /// Prompt tokens, when the gateway knows them (token-id prompts).
    pub prompt_tokens: Option<u64>,
    /// Of which cached on the chosen decode worker (known with `kv_aware` on decode).
    pub cached_on_decode: Option<f64>,
    /// The least loaded prefill worker's requests in flight.
    pub prefill_load: usize,
    /// The chosen decode worker's requests in flight.
    pub decode_load: usize,
}

impl Decider {
    /// Whether any threshold is set.
    pub fn enabled(&self) -> bool {
        self.min_uncached_tokens > 0 || self.min_uncached_ratio > 0.0 || self.prefill_busy_load > 0
    }

    /// The path for a request with `facts`.
    pub fn decide(&self, f: &Facts) -> PdPath {
        if let (Some(n), Some(c)) = (f.prompt_tokens, f.cached_on_decode) {
            let uncached = (n as f64 - c).max(0.0);
            let short = self.min_uncached_tokens > 0 && uncached < self.min_uncached_tokens as f64;
            let small = self.min_uncached_ratio > 0.0
                && n > 0
                && uncached / (n as f64) < self.min_uncached_ratio;
            if short || small {
                return PdPath::DecodeOnlyShort;
            }
        }
        if self.prefill_busy_load > 0
            && f.prefill_load >= self.prefill_busy_load
            && f.decode_load < f.prefill_load
        {
            return PdPath::DecodeOnlyBusy;
        }
        PdPath::Disaggregated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds() {
        let facts = |n, c, p, d| Facts {
            prompt_tokens: n,
            cached_on_decode: c,
            prefill_load: p,
            decode_load: d,
        };
        let off = Decider::default();
        assert!(!off.enabled());
        assert_eq!(
            off.decide(&facts(Some(10), Some(10.0), 9, 0)),
            PdPath::Disaggregated
        );
        let d = Decider {
            min_uncached_tokens: 512,
            ..Decider::default()
        };
        assert_eq!(
            d.decide(&facts(Some(4096), Some(3800.0), 0, 0)),
            PdPath::DecodeOnlyShort
        );
        assert_eq!(
            d.decide(&facts(Some(4096), Some(1000.0), 0, 0)),
            PdPath::Disaggregated
        );
        assert_eq!(
            d.decide(&facts(None, None, 0, 0)),
            PdPath::Disaggregated,
            "unknown prompt"
        );
        let r = Decider {
            min_uncached_ratio: 0.1,
            ..Decider::default()
        };
        assert_eq!(
            r.decide(&facts(Some(100_000), Some(95_000.0), 0, 0)),
            PdPath::DecodeOnlyShort
        );
        let b = Decider {
            prefill_busy_load: 4,
            ..Decider::default()
        };
        assert_eq!(b.decide(&facts(None, None, 4, 1)), PdPath::DecodeOnlyBusy);
        assert_eq!(b.decide(&facts(None, None, 4, 5)), PdPath::Disaggregated);
    }
}
