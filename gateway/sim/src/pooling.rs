//! What SGLang serves besides generation, with deterministic stand-ins for the models:
//! `/v1/rerank` (a bare list of results, best first, as a reranker answers it),
//! `/v1/classify`, `/v1/score`, `/v1/tokenize` and `/v1/detokenize`.
//!
//! Scores come from the overlap of the query's and the document's tokens, so a test can
//! tell which document should win.

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::{SimError, json as json_response};
use super::model;
use super::state::SimState;

/// A handler's answer: JSON, or an error in SGLang's OpenAI shape.
fn answer(r: Result<Value, SimError>) -> Response {
    match r {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.openai(),
    }
}

/// Token ids of a text or of given ids (`None`: neither).
fn ids_of(v: &Value) -> Option<Vec<u32>> {
    match v {
        Value::String(s) => Some(model::tokenize_prompt(s)),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => None,
    }
}

/// How much of `doc` is in `query`, in [0, 1].
fn overlap(query: &[u32], doc: &[u32]) -> f64 {
    let q: HashSet<u32> = query.iter().skip(1).copied().collect();
    let d = &doc[1.min(doc.len())..];
    if d.is_empty() {
        return 0.0;
    }
    d.iter().filter(|t| q.contains(t)).count() as f64 / d.len() as f64
}

#[derive(Deserialize)]
struct RerankIn {
    query: String,
    documents: Vec<String>,
    #[serde(default)]
    top_n: Option<usize>,
    #[serde(default = "yes")]
    return_documents: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/rerank`.
pub async fn rerank(body: Bytes) -> Response {
    answer((|| {
        let r: RerankIn = serde_json::from_slice(&body)?;
        if r.query.trim().is_empty() {
            return Err(SimError::BadRequest("Query cannot be empty".into()));
        }
        if r.documents.is_empty() {
            return Err(SimError::BadRequest("Documents cannot be empty".into()));
        }
        let q = model::tokenize_prompt(&r.query);
        let mut scored: Vec<(f64, usize)> = r
            .documents
            .iter()
            .enumerate()
            .map(|(i, d)| (overlap(&q, &model::tokenize_prompt(d)), i))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.truncate(r.top_n.unwrap_or(usize::MAX).max(1));
        let results: Vec<Value> = scored
            .into_iter()
            .map(|(score, i)| {
                let mut v = json!({"score": score, "index": i,
                    "meta_info": {"prompt_tokens": q.len() + r.documents[i].len() / 4}});
                if r.return_documents {
                    v["document"] = json!(r.documents[i]);
                }
                v
            })
            .collect();
        Ok(Value::Array(results))
    })())
}

/// `POST /v1/classify`: two classes, by the parity of the input's hash.
pub async fn classify(State(st): State<Arc<SimState>>, body: Bytes) -> Response {
    answer((|| {
        let req: Value = serde_json::from_slice(&body)?;
        let inputs: Vec<Vec<u32>> = match &req["input"] {
            Value::Array(a) if a.iter().all(Value::is_string) => {
                a.iter().filter_map(ids_of).collect()
            }
            other => vec![ids_of(other).ok_or_else(|| {
                SimError::BadRequest("input must be a string, strings or token ids".into())
            })?],
        };
        let blank = model::tokenize_prompt("");
        if inputs.is_empty() || inputs.iter().any(|i| i.is_empty() || *i == blank) {
            return Err(SimError::BadRequest("input cannot be empty".into()));
        }
        let mut tokens = 0;
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, ids)| {
                tokens += ids.len();
                let h = ids
                    .iter()
                    .fold(7u64, |h, t| model::hash_bytes(h, &t.to_le_bytes()));
                let p = 0.5 + (h % 400) as f64 / 1000.0;
                let (label, probs) = if h % 2 == 0 {
                    ("LABEL_0", [p, 1.0 - p])
                } else {
                    ("LABEL_1", [1.0 - p, p])
                };
                json!({"index": i, "label": label, "probs": probs, "num_classes": 2})
            })
            .collect();
        Ok(
            json!({"id": format!("classify-{}", st.new_id().replace('-', "")), "object": "list",
            "created": super::state::unix_now(), "model": st.cfg.model, "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}),
        )
    })())
}

/// `POST /v1/score`: per item, a distribution over `label_token_ids`.
pub async fn score(State(st): State<Arc<SimState>>, body: Bytes) -> Response {
    answer((|| {
        let req: Value = serde_json::from_slice(&body)?;
        let query = ids_of(&req["query"])
            .ok_or_else(|| SimError::BadRequest("query is required".into()))?;
        let items: Vec<Vec<u32>> = match &req["items"] {
            Value::Array(a) if a.iter().all(|x| x.is_string() || x.is_array()) => {
                a.iter().filter_map(ids_of).collect()
            }
            other => vec![
                ids_of(other).ok_or_else(|| SimError::BadRequest("items is required".into()))?,
            ],
        };
        let labels: Vec<u32> = serde_json::from_value(req["label_token_ids"].clone())
            .map_err(|_| SimError::BadRequest("label_token_ids must be token ids".into()))?;
        if labels.is_empty() {
            return Err(SimError::BadRequest(
                "label_token_ids cannot be empty".into(),
            ));
        }
        let softmax = req["apply_softmax"].as_bool().unwrap_or(false);
        let scores: Vec<Vec<f64>> = items
            .iter()
            .map(|item| {
                let raw: Vec<f64> = labels
                    .iter()
                    .map(|l| {
                        let h = model::mix(u64::from(*l) ^ model::mix(item.len() as u64));
                        (h % 1000) as f64 / 1000.0 * overlap(&query, item).max(0.01)
                    })
                    .collect();
                match softmax {
                    true => {
                        let sum: f64 = raw.iter().map(|x| x.exp()).sum();
                        raw.iter().map(|x| x.exp() / sum).collect()
                    }
                    false => raw,
                }
            })
            .collect();
        let tokens = query.len() + items.iter().map(Vec::len).sum::<usize>();
        Ok(
            json!({"scores": scores, "model": req["model"].as_str().unwrap_or(&st.cfg.model),
            "object": "scoring", "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
        )
    })())
}

/// `POST /v1/tokenize` (`prompt`, a text or texts).
pub async fn tokenize(State(st): State<Arc<SimState>>, body: Bytes) -> Response {
    answer((|| {
        let req: Value = serde_json::from_slice(&body)?;
        let special = req["add_special_tokens"].as_bool().unwrap_or(true);
        let one = |s: &str| -> Vec<u32> {
            let ids = model::tokenize_prompt(s);
            if special { ids } else { ids[1..].to_vec() }
        };
        let (tokens, count) = match &req["prompt"] {
            Value::String(s) => {
                let ids = one(s);
                (json!(ids), json!(ids.len()))
            }
            Value::Array(a) => {
                let texts: Option<Vec<&str>> = a.iter().map(Value::as_str).collect();
                let texts =
                    texts.ok_or_else(|| SimError::BadRequest("prompt must be text".into()))?;
                let all: Vec<Vec<u32>> = texts.iter().map(|s| one(s)).collect();
                let counts: Vec<usize> = all.iter().map(Vec::len).collect();
                (json!(all), json!(counts))
            }
            _ => return Err(SimError::BadRequest("prompt is required".into())),
        };
        Ok(json!({"tokens": tokens, "count": count, "max_model_len": st.cfg.context_length}))
    })())
}

/// `POST /v1/detokenize` (`tokens`, ids or lists of ids).
pub async fn detokenize(body: Bytes) -> Response {
    answer((|| {
        let req: Value = serde_json::from_slice(&body)?;
        let text = |ids: &[Value]| -> Result<String, SimError> {
            ids.iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .map(model::token_text)
                        .ok_or_else(|| SimError::BadRequest("tokens must be token ids".into()))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|w| w.join(" "))
        };
        let Some(list) = req["tokens"].as_array() else {
            return Err(SimError::BadRequest("tokens is required".into()));
        };
        let out = match list.first() {
            Some(Value::Array(_)) => {
                let texts: Result<Vec<String>, SimError> = list
                    .iter()
                    .map(|l| text(l.as_array().map_or(&[][..], Vec::as_slice)))
                    .collect();
                json!(texts?)
            }
            _ => json!(text(list)?),
        };
        Ok(json!({"text": out}))
    })())
}
