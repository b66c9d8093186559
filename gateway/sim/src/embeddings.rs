//! `POST /v1/embeddings` as SGLang answers it for an embedding model: one unit vector per
//! input, a deterministic function of the input (so equal inputs embed equally), and the
//! inputs' token counts as usage.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use openapi::openai::embeddings::{Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage};
use openapi::shapes::Prompt;

use super::error::{SimError, json};
use super::model;
use super::state::SimState;

/// The dimension of the simulated embeddings (`dimensions` may ask for fewer).
pub const DIMENSIONS: usize = 16;

/// The handler.
pub async fn embeddings(State(st): State<Arc<SimState>>, body: Bytes) -> Response {
    match answer(&st, &body) {
        Ok(r) => json(StatusCode::OK, &r),
        Err(e) => e.openai(),
    }
}

fn answer(st: &SimState, body: &[u8]) -> Result<EmbeddingResponse, SimError> {
    let req: EmbeddingRequest = serde_json::from_slice(body)?;
    let dims = match req.dimensions {
        Some(0) => return Err(SimError::BadRequest("dimensions must be at least 1".into())),
        Some(d) => (d as usize).min(DIMENSIONS),
        None => DIMENSIONS,
    };
    // Each input as the token ids the model sees.
    let inputs: Vec<Vec<u32>> = match req.input {
        Prompt::Text(t) => vec![model::tokenize_prompt(&t)],
        Prompt::Texts(ts) => ts.iter().map(|t| model::tokenize_prompt(t)).collect(),
        Prompt::Tokens(ids) => vec![ids],
        Prompt::TokenBatch(b) => b,
    };
    if inputs.is_empty() || inputs.iter().any(Vec::is_empty) {
        return Err(SimError::BadRequest("input must not be empty".into()));
    }
    let mut tokens = 0u64;
    let data = inputs
        .iter()
        .enumerate()
        .map(|(i, ids)| {
            tokens += ids.len() as u64;
            Embedding {
                object: "embedding".into(),
                embedding: vector(ids, dims),
                index: i as u32,
            }
        })
        .collect();
    Ok(EmbeddingResponse {
        object: "list".into(),
        data,
        model: st.cfg.model.clone(),
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    })
}

/// A unit vector of `dims` components drawn from the ids' hash.
fn vector(ids: &[u32], dims: usize) -> Vec<f32> {
    let seed = ids
        .iter()
        .fold(0x5eed_u64, |h, id| model::hash_bytes(h, &id.to_le_bytes()));
    let mut rng = model::Rng::new(seed);
    let raw: Vec<f32> = (0..dims)
        .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
        .collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::EPSILON);
    raw.into_iter().map(|x| x / norm).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_inputs_embed_equally_as_unit_vectors() {
        let a = vector(&[1, 2, 3], DIMENSIONS);
        assert_eq!(a, vector(&[1, 2, 3], DIMENSIONS));
        assert_ne!(a, vector(&[1, 2, 4], DIMENSIONS));
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
        assert_eq!(vector(&[7], 4).len(), 4);
    }
}
