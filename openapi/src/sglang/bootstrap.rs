//! The bootstrap server a prefill worker runs for PD disaggregation (SGLang's
//! `CommonKVBootstrapServer`, default port 8998), and the KV statistics of Moongate's
//! simulated PD workers.
//!
//! - `PUT /route` with [`RegisterRank`]: a prefill rank registers its KV endpoint; `200 OK`.
//! - `GET /route?prefill_dp_rank=&prefill_cp_rank=&target_tp_rank=&target_pp_rank=` ([`RouteQuery`]):
//!   all four `-1` answers [`PrefillServerInfo`]; otherwise the rank's [`RankInfo`]. `400`
//!   when a parameter is missing ("Missing inputs for bootstrap server."), `503` until every
//!   expected rank registered, `404` for an unknown rank.
//! - `GET /health`: `200 OK`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `PUT /route`: one prefill rank and the topology it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RegisterRank {
    /// Attention tensor-parallel size.
    pub attn_tp_size: u32,
    /// This rank's attention tensor-parallel rank.
    pub attn_tp_rank: u32,
    /// Attention context-parallel size.
    pub attn_cp_size: u32,
    /// This rank's attention context-parallel rank.
    pub attn_cp_rank: u32,
    /// Attention data-parallel size.
    pub attn_dp_size: u32,
    /// This rank's attention data-parallel rank.
    pub attn_dp_rank: u32,
    /// Pipeline-parallel size.
    pub pp_size: u32,
    /// This rank's pipeline rank.
    pub pp_rank: u32,
    /// System data-parallel size (1 with DP attention).
    pub system_dp_size: u32,
    /// This rank's system data-parallel rank.
    pub system_dp_rank: u32,
    /// Where the rank's KV endpoint listens.
    pub rank_ip: String,
    /// Its port.
    pub rank_port: u16,
    /// Tokens per KV page.
    pub page_size: u32,
    /// KV cache element type.
    pub kv_cache_dtype: String,
    /// The prefill worker's HTTP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_http_port: Option<u16>,
    /// How requests pick a data-parallel rank (`follow_bootstrap_room` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balance_method: Option<String>,
}

impl RegisterRank {
    /// The registration of a worker that is its own only rank (no tensor, context, data or
    /// pipeline parallelism).
    pub fn single(rank_ip: String, rank_port: u16, page_size: u32, kv_cache_dtype: &str) -> Self {
        Self {
            attn_tp_size: 1,
            attn_tp_rank: 0,
            attn_cp_size: 1,
            attn_cp_rank: 0,
            attn_dp_size: 1,
            attn_dp_rank: 0,
            pp_size: 1,
            pp_rank: 0,
            system_dp_size: 1,
            system_dp_rank: 0,
            rank_ip,
            rank_port,
            page_size,
            kv_cache_dtype: kv_cache_dtype.to_owned(),
            prefill_http_port: None,
            load_balance_method: None,
        }
    }
}

/// `GET /route` parameters (all four, as text: `-1` asks for the server info).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RouteQuery {
    /// Prefill data-parallel rank.
    pub prefill_dp_rank: Option<String>,
    /// Prefill context-parallel rank.
    pub prefill_cp_rank: Option<String>,
    /// Target tensor-parallel rank.
    pub target_tp_rank: Option<String>,
    /// Target pipeline rank.
    pub target_pp_rank: Option<String>,
}

/// `GET /route` with every rank `-1`: the prefill server's topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PrefillServerInfo {
    /// Attention tensor-parallel size.
    pub attn_tp_size: u32,
    /// Attention context-parallel size.
    pub attn_cp_size: u32,
    /// Data-parallel size.
    pub dp_size: u32,
    /// Pipeline-parallel size.
    pub pp_size: u32,
    /// Tokens per KV page.
    pub page_size: Option<u32>,
    /// KV cache element type.
    pub kv_cache_dtype: Option<String>,
    /// Requests pick their data-parallel rank from the bootstrap room.
    pub follow_bootstrap_room: bool,
    /// DSA cache layer split (DeepSeek sparse attention).
    #[serde(default)]
    pub enable_dsa_cache_layer_split: bool,
    /// The prefill worker's HTTP port.
    #[serde(default)]
    pub prefill_http_port: Option<u16>,
    /// Filled in by the decode side (always `null` from the server).
    #[serde(default)]
    pub target_tp_rank: Option<u32>,
    /// Filled in by the decode side.
    #[serde(default)]
    pub target_tp_ranks: Option<Vec<u32>>,
    /// Filled in by the decode side.
    #[serde(default)]
    pub target_cp_ranks: Option<Vec<u32>>,
    /// Filled in by the decode side.
    #[serde(default)]
    pub target_pp_ranks: Option<Vec<u32>>,
    /// Filled in by the decode side.
    #[serde(default)]
    pub required_dst_info_num: Option<u32>,
    /// Filled in by the decode side.
    #[serde(default)]
    pub required_prefill_response_num: Option<u32>,
}

/// `GET /route` for one rank: where its KV endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RankInfo {
    /// IP address.
    pub rank_ip: String,
    /// Port.
    pub rank_port: u16,
}

/// `GET /sim/kv` of a simulated prefill or decode worker: its KV pool and the moves so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct KvStats {
    /// `prefill` or `decode`.
    pub mode: String,
    /// The model-shape preset.
    pub model_shape: String,
    /// KV bytes per token.
    pub bytes_per_token: u64,
    /// Tokens per page.
    pub page_tokens: u64,
    /// Pages in the pool.
    pub pool_pages: u64,
    /// Pages free now (equal to `pool_pages` when nothing is in flight).
    pub free_pages: u64,
    /// Rooms in progress.
    pub rooms_open: u64,
    /// Rooms moved (prefill: written; decode: received and verified).
    pub moves: u64,
    /// KV bytes moved.
    pub bytes: u64,
    /// Seconds spent moving them (prefill: first write to last acknowledgement).
    pub seconds: f64,
    /// Rooms that failed.
    pub failures: u64,
    /// The last move: `[tokens, bytes, seconds]`.
    #[serde(default)]
    pub last: Option<(u64, u64, f64)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_payloads_round_trip() {
        let put = json!({"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0,
            "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1,
            "system_dp_rank": 0, "rank_ip": "10.0.0.1", "rank_port": 17000, "page_size": 16,
            "kv_cache_dtype": "bfloat16", "prefill_http_port": 30000});
        let r: RegisterRank = serde_json::from_value(put.clone()).unwrap();
        assert_eq!(serde_json::to_value(&r).unwrap(), put);
        let info = json!({"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1,
            "page_size": 16, "kv_cache_dtype": "bfloat16", "follow_bootstrap_room": true,
            "enable_dsa_cache_layer_split": false, "prefill_http_port": null,
            "target_tp_rank": null, "target_tp_ranks": null, "target_cp_ranks": null,
            "target_pp_ranks": null, "required_dst_info_num": null,
            "required_prefill_response_num": null});
        let i: PrefillServerInfo = serde_json::from_value(info.clone()).unwrap();
        assert_eq!(serde_json::to_value(&i).unwrap(), info);
    }
}
