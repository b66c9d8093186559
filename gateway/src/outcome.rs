//! Small outcome types shared by the request path and the metrics (a leaf module: it
//! depends on nothing in the crate, so `metrics` can name them without reaching into
//! `error` or `select`).

/// Which half of a prefill/decode pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdSide {
    /// The prefill worker.
    Prefill,
    /// The decode worker.
    Decode,
}

impl PdSide {
    /// `prefill` or `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            PdSide::Prefill => "prefill",
            PdSide::Decode => "decode",
        }
    }
}

impl std::fmt::Display for PdSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one side of a PD pair failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdFailure {
    /// The connection could not be made.
    Unavailable,
    /// It answered a server error, or broke the connection.
    BadGateway,
    /// No answer within the request timeout (seconds).
    Timeout(u64),
}

/// How a decision was made (the `decision` label of
/// `moongate_gateway_cache_aware_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The best prefix match passed the threshold.
    Hit,
    /// It did not: least loaded.
    Miss,
    /// Load imbalanced: shortest queue.
    Balance,
    /// The request has no key (nothing to match): least loaded.
    NoKey,
}

impl Decision {
    /// Every decision, in label order.
    pub const ALL: [Self; 4] = [Self::Hit, Self::Miss, Self::Balance, Self::NoKey];

    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Miss => "miss",
            Self::Balance => "balance",
            Self::NoKey => "no_key",
        }
    }
}

/// How `kv_aware` chose (the `decision` label of
/// `moongate_gateway_kv_aware_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDecision {
    /// Scored on the workers' KV events (cached prefix against load).
    Events,
    /// Some candidates had no events: their prefix estimated by the `cache_aware` tree.
    Mixed,
    /// No candidate has events, or the prompt has no tokens: `cache_aware` decided.
    Fallback,
}

impl KvDecision {
    /// Every decision, in label order.
    pub const ALL: [Self; 3] = [Self::Events, Self::Mixed, Self::Fallback];

    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Events => "events",
            Self::Mixed => "mixed",
            Self::Fallback => "fallback",
        }
    }
}

/// How `manual` (sticky sessions) chose (the `decision` label of
/// `moongate_gateway_sticky_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StickyDecision {
    /// The key's worker took it.
    Hit,
    /// A new (or expired) key, assigned by `cache_aware`.
    Assign,
    /// The key's worker could not take it: reassigned by `cache_aware`.
    Reassign,
    /// No routing key: `cache_aware` decided.
    NoKey,
}

impl StickyDecision {
    /// Every decision, in label order.
    pub const ALL: [Self; 4] = [Self::Hit, Self::Assign, Self::Reassign, Self::NoKey];

    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::Assign => "assign",
            Self::Reassign => "reassign",
            Self::NoKey => "no_key",
        }
    }
}

/// What the PD router did with a request (the `path` label of
/// `moongate_gateway_pd_paths_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdPath {
    /// Prefill and decode workers (disaggregated).
    Disaggregated,
    /// The decode worker alone: the uncached part was short.
    DecodeOnlyShort,
    /// The decode worker alone: the prefill tier was busy and decode was not.
    DecodeOnlyBusy,
}

impl PdPath {
    /// Every path, in label order.
    pub const ALL: [Self; 3] = [
        Self::Disaggregated,
        Self::DecodeOnlyShort,
        Self::DecodeOnlyBusy,
    ];

    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disaggregated => "disaggregated",
            Self::DecodeOnlyShort => "decode_only_short",
            Self::DecodeOnlyBusy => "decode_only_busy",
        }
    }
}

/// The tokens of a prompt a worker holds cached, by where they lie: its GPU cache, its
/// host memory, the store's memory, the store's disk tiers; and, for a worker without
/// events, what the `cache_aware` tree estimates. Counted per decision
/// (`moongate_gateway_kv_aware_cached_tokens_total{tier}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tiers {
    /// In the worker's GPU cache.
    pub device: u64,
    /// In its host memory (loaded, not computed).
    pub host: u64,
    /// In the store's memory.
    pub store: u64,
    /// Only on a disk tier of the store.
    pub store_disk: u64,
    /// Estimated by the `cache_aware` tree (a worker without events).
    pub estimated: u64,
}

impl Tiers {
    /// Every tier's tokens, with its label.
    pub fn labelled(&self) -> [(&'static str, u64); 5] {
        [
            ("device", self.device),
            ("host", self.host),
            ("store", self.store),
            ("store_disk", self.store_disk),
            ("estimated", self.estimated),
        ]
    }
}
