//! The control endpoints of an SGLang server: health, server and model info, the models
//! list, load (`/get_load`, `/v1/loads`), cache flush.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use openapi::openai::{Extra, ModelCard, ModelList};
use openapi::sglang::server::{
    ErrorResponse, LoadAggregate, LoadReport, Loads, ModelInfo, RankLoad, ServerInfo,
};
use serde_json::{Value, json};

use super::error::json;
use super::state::{Rank, SimState, unix_now};

/// KV cache capacity the simulator reports, in tokens.
const KV_CAPACITY_TOKENS: u64 = 1 << 20;
/// Running-request cap the simulator reports (it enforces none).
const MAX_RUNNING_REQUESTS: u64 = 4096;

/// `GET /health`, `GET /health_generate`: 200 with an empty body.
pub async fn health() -> StatusCode {
    StatusCode::OK
}

/// `GET /get_model_info`, `GET /model_info`.
pub async fn model_info(State(st): State<Arc<SimState>>) -> Response {
    let path = st.cfg.model_path().to_owned();
    let info = ModelInfo {
        tokenizer_path: Some(st.cfg.reported_tokenizer_path()),
        model_path: path,
        is_generation: true,
        preferred_sampling_params: None,
        weight_version: Some("default".to_owned()),
        has_image_understanding: false,
        has_audio_understanding: false,
        model_type: Some("llama".to_owned()),
        architectures: Some(vec!["LlamaForCausalLM".to_owned()]),
        extra: Extra::new(),
    };
    json(StatusCode::OK, &info)
}

/// `GET /get_server_info`, `GET /server_info`.
pub async fn server_info(State(st): State<Arc<SimState>>) -> Response {
    let cfg = &st.cfg;
    // SGLang reports its `--kv-events-config` as the JSON string it was given; the
    // simulator reports the endpoints it bound (ports resolved), so routers can find them.
    let kv_events_config = st.events().map(|p| {
        json!({"publisher": "zmq", "endpoint": p.endpoint(),
               "replay_endpoint": p.replay_endpoint(),
               "topic": cfg.kv_events_config.as_ref().map_or("", |c| c.topic.as_str())})
        .to_string()
    });
    let extra = json!({
        "pp_size": 1,
        "page_size": cfg.page_size,
        "disable_radix_cache": cfg.disable_radix_cache,
        "enable_cache_report": cfg.enable_cache_report,
        "kv_events_config": kv_events_config,
        "chunked_prefill_size": 8192,
        "skip_tokenizer_init": false,
        "is_embedding": false,
        "enable_metrics": false,
        "load_balance_method": "round_robin",
        "sim": {"output_tokens": cfg.output_tokens, "ttft": cfg.ttft.as_secs_f64(),
                "tpot": cfg.tpot.as_secs_f64()},
    });
    let info = ServerInfo {
        model_path: Some(cfg.model_path().to_owned()),
        tokenizer_path: Some(cfg.reported_tokenizer_path()),
        served_model_name: Some(cfg.model.clone()),
        host: Some(cfg.host.clone()),
        port: Some(cfg.port),
        tp_size: Some(1),
        dp_size: Some(cfg.dp_size.max(1)),
        context_length: Some(u64::from(cfg.context_length)),
        disaggregation_mode: Some(cfg.mode.disaggregation_mode().to_owned()),
        disaggregation_transfer_backend: Some("mooncake".to_owned()),
        disaggregation_bootstrap_port: Some(cfg.bootstrap_port),
        max_total_num_tokens: Some((cfg.pool_pages() as u64) * u64::from(cfg.page_size)),
        max_req_input_len: Some(u64::from(cfg.context_length) - 1),
        max_running_requests: Some(MAX_RUNNING_REQUESTS),
        version: Some(version()),
        internal_states: Some(vec![
            json!({"last_gen_throughput": 0.0, "load": st.in_flight()}),
        ]),
        extra: match extra {
            Value::Object(m) => m,
            _ => Extra::new(),
        },
    };
    json(StatusCode::OK, &info)
}

fn card(st: &SimState) -> ModelCard {
    ModelCard {
        id: st.cfg.model.clone(),
        object: "model".to_owned(),
        created: unix_now(),
        owned_by: "sglang".to_owned(),
        root: Some(st.cfg.model_path().to_owned()),
        parent: None,
        max_model_len: Some(u64::from(st.cfg.context_length)),
        extra: Extra::new(),
    }
}

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<SimState>>) -> Response {
    json(StatusCode::OK, &ModelList::new(vec![card(&st)]))
}

/// `GET /v1/models/{model}`.
pub async fn model(State(st): State<Arc<SimState>>, Path(model): Path<String>) -> Response {
    if model == st.cfg.model {
        return json(StatusCode::OK, &card(&st));
    }
    let mut err = ErrorResponse::bad_request(format!("The model `{model}` does not exist."));
    err.kind = "NotFoundError".to_owned();
    err.code = 404;
    json(StatusCode::NOT_FOUND, &err)
}

/// `GET|POST /flush_cache`: SGLang's plain-text answer.
pub async fn flush_cache(State(st): State<Arc<SimState>>) -> Response {
    st.flush_prefixes();
    (
        StatusCode::OK,
        "Cache flushed.\nPlease check backend logs for more details. (When there are running or \
         waiting requests, the operation will not be performed.)\n",
    )
        .into_response()
}

/// `POST /start_profile`: SGLang's answer; the options (a JSON object, or none) are kept
/// for `GET /sim/profile`. 400 for a body that is not a JSON object.
pub async fn start_profile(State(st): State<Arc<SimState>>, body: axum::body::Bytes) -> Response {
    let options = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return (StatusCode::BAD_REQUEST, "the body is not a JSON object\n")
                    .into_response();
            }
        }
    };
    *st.profiling.lock() = Some(options);
    (StatusCode::OK, "Start profiling.\n").into_response()
}

/// `POST /stop_profile`: SGLang's answer; ends the run `/start_profile` began.
pub async fn stop_profile(State(st): State<Arc<SimState>>) -> Response {
    st.profiling.lock().take();
    (
        StatusCode::OK,
        "Stop profiling. This will take some time.\n",
    )
        .into_response()
}

/// `GET /sim/profile`: the options of the profiling run in progress (`null`: none).
pub async fn profile_state(State(st): State<Arc<SimState>>) -> Response {
    let state = st.profiling.lock().clone().unwrap_or(Value::Null);
    json(StatusCode::OK, &state)
}

/// Requests in flight and the KV tokens the simulator says they hold: their prompts (when
/// the worker caches prefixes, which tokenizes them) and their outputs.
fn usage(st: &SimState) -> (u64, u64) {
    let n = st.in_flight();
    (
        n,
        st.prompt_tokens_in_flight() + n * u64::from(st.cfg.output_tokens),
    )
}

/// [`usage`] of one rank.
fn rank_usage(st: &SimState, rank: &Rank) -> (u64, u64) {
    let n = rank.in_flight();
    (
        n,
        rank.prompt_tokens_in_flight() + n * u64::from(st.cfg.output_tokens),
    )
}

/// `GET /get_load`: one entry per data-parallel rank.
pub async fn get_load(State(st): State<Arc<SimState>>) -> Response {
    let loads: Vec<LoadReport> = st
        .ranks()
        .iter()
        .map(|r| {
            let (n, tokens) = rank_usage(&st, r);
            LoadReport {
                dp_rank: r.index,
                num_reqs: n,
                num_waiting_reqs: 0,
                num_tokens: tokens,
                extra: Extra::new(),
            }
        })
        .collect();
    json(StatusCode::OK, &loads)
}

/// `GET /metrics`: SGLang's scheduler gauges (`sglang:` names, `model_name` label) in the
/// Prometheus text format, from the simulator's state.
pub async fn metrics(State(st): State<Arc<SimState>>) -> Response {
    let (n, tokens) = usage(&st);
    let model = st.cfg.model.replace('\\', "\\\\").replace('"', "\\\"");
    let gauges = [
        (
            "num_running_reqs",
            "The number of running requests.",
            n as f64,
        ),
        (
            "num_queue_reqs",
            "The number of requests in the waiting queue.",
            0.0,
        ),
        (
            "num_used_tokens",
            "The number of used tokens.",
            tokens as f64,
        ),
        (
            "token_usage",
            "The token usage.",
            tokens as f64 / KV_CAPACITY_TOKENS as f64,
        ),
    ];
    let mut text = String::new();
    for (name, help, v) in gauges {
        text.push_str(&format!(
            "# HELP sglang:{name} {help}\n# TYPE sglang:{name} gauge\nsglang:{name}{{model_name=\"{model}\"}} {v}\n"
        ));
    }
    (
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}

/// `GET /v1/loads`: the detailed load of each rank (with the requests it has taken so
/// far, `sim_served`), and their aggregate.
pub async fn loads(State(st): State<Arc<SimState>>) -> Response {
    let ranks: Vec<RankLoad> = st
        .ranks()
        .iter()
        .map(|r| {
            let (n, tokens) = rank_usage(&st, r);
            let mut extra = Extra::new();
            extra.insert("sim_served".to_owned(), r.served().into());
            RankLoad {
                dp_rank: r.index,
                num_running_reqs: n,
                num_total_reqs: n,
                num_used_tokens: tokens,
                max_total_num_tokens: KV_CAPACITY_TOKENS,
                token_usage: tokens as f64 / KV_CAPACITY_TOKENS as f64,
                utilization: n as f64 / MAX_RUNNING_REQUESTS as f64,
                max_running_requests: MAX_RUNNING_REQUESTS,
                extra,
                ..RankLoad::default()
            }
        })
        .collect();
    let count = ranks.len().max(1) as f64;
    let mean = |f: fn(&RankLoad) -> f64| ranks.iter().map(f).sum::<f64>() / count;
    let total: u64 = ranks.iter().map(|r| r.num_running_reqs).sum();
    let body = Loads {
        timestamp: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        version: Some(version()),
        dp_rank_count: ranks.len() as u32,
        aggregate: Some(LoadAggregate {
            total_running_reqs: total,
            total_reqs: total,
            avg_token_usage: mean(|r| r.token_usage),
            avg_utilization: mean(|r| r.utilization),
            ..LoadAggregate::default()
        }),
        loads: ranks,
        extra: Extra::new(),
    };
    json(StatusCode::OK, &body)
}

/// The version string the simulator reports.
fn version() -> String {
    format!("moongate-sim {}", env!("CARGO_PKG_VERSION"))
}

/// `GET /sim/prefix`: the prefix cache's counters (404 when it is disabled).
pub async fn prefix_stats(State(st): State<Arc<SimState>>) -> Response {
    match st.prefix_stats() {
        Some(s) => json(StatusCode::OK, &s),
        None => {
            let mut err = ErrorResponse::bad_request("this worker has no prefix cache");
            err.kind = "NotFoundError".to_owned();
            err.code = 404;
            json(StatusCode::NOT_FOUND, &err)
        }
    }
}

/// `GET /sim/kv`: a PD worker's KV pool and the moves so far (404 on a regular worker).
pub async fn kv_stats(State(st): State<Arc<SimState>>) -> Response {
    match &st.pd {
        Some(pd) => json(StatusCode::OK, &pd.stats()),
        None => {
            let mut err =
                ErrorResponse::bad_request("this worker is not a prefill or decode worker");
            err.kind = "NotFoundError".to_owned();
            err.code = 404;
            json(StatusCode::NOT_FOUND, &err)
        }
    }
}
