//! `POST /v1/chat/completions` as SGLang answers it.
//!
//! Streamed: per choice, a first chunk with `role: "assistant"` and empty content (with its
//! first token), one chunk per token that adds text, then, after every choice is done, one
//! chunk per choice with an empty delta and its `finish_reason`, then the usage chunk
//! (`stream_options.include_usage`), then `data: [DONE]`. With SGLang's
//! `stream_options.continuous_usage_stats`, content chunks carry the choice's running usage.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use openapi::openai::chat::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
    ChatCompletionResponse, ChatDelta, ChatLogprobs, ChatResponseMessage, ChatTokenLogprob,
    TopLogprob,
};
use openapi::openai::{Extra, Usage};
use serde_json::json;

use super::engine::{self, Sequence};
use super::error::SimError;
use super::job::{self, Extensions, Job, PromptInfo};
use super::model::Token;
use super::pd::{self, KvItem};
use super::state::{Cached, SimState, unix_now};
use super::stream::{
    Answer, Clock, Steps, advance, continuous_usage, longest, push_done, push_event, respond,
};

/// The handler.
pub async fn chat_completions(State(st): State<Arc<SimState>>, body: Bytes) -> Response {
    respond(&st, |_| prepare(&st, &body), SimError::openai).await
}

/// A request turned into finished sequences, ready to render.
struct Chat {
    kv: Vec<KvItem>,
    /// The data-parallel rank the request names.
    dp_rank: Option<u32>,
    id: String,
    created: u64,
    model: String,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
    top_logprobs: Option<usize>,
    prompt_tokens: u64,
    /// The prompt's ids (for the prefix cache), and the cached part when reported.
    ids: Vec<Arc<[u32]>>,
    cache_report: bool,
    cached: Option<u64>,
    seqs: Vec<Sequence>,
    offsets: Vec<usize>,
}

fn prepare(st: &SimState, body: &[u8]) -> Result<Chat, SimError> {
    let req: ChatCompletionRequest = serde_json::from_slice(body)?;
    // Checks the messages either way; with a tokenizer, its ids are the prompt.
    let mut prompt = PromptInfo::chat(&req.messages)?;
    let tokenized: Option<Arc<[u32]>> = match st.tokenizer() {
        Some(t) => {
            let ids = t.chat_body_ids(body)?;
            prompt = PromptInfo::ids(&ids);
            Some(Arc::from(ids))
        }
        None => None,
    };
    let n = job::check_n(req.n)?;
    engine::check_sampling(req.temperature, req.top_p)?;
    let cfg = &st.cfg;
    let max = st.cap_output(engine::resolve_max_tokens(
        prompt.tokens,
        req.max_output_tokens(),
        None,
        cfg.context_length,
    )?);
    let ext = Extensions::from_extra(&req.extra)?;
    let stop = req.stop.as_ref().map_or(&[][..], |s| s.as_slice());
    let jobs = [Job {
        prompt,
        limits: ext.limits(max, stop),
    }];
    let seqs = job::run_all(&jobs, n, req.seed, cfg.output_tokens)?;
    let id = match req.routing.rid.as_ref().and_then(|r| r.get(0)) {
        Some(rid) => rid.clone(),
        None => format!("chatcmpl-{}", st.new_id()),
    };
    let ids: Option<Arc<[u32]>> = tokenized.or_else(|| {
        (st.pd.is_some() || st.caches_prefixes()).then(|| Arc::from(job::chat_ids(&req.messages)))
    });
    // PD: each choice is an item with its own room; they share the prompt's KV.
    let kv = match (st.moves_kv(&req.routing), &ids) {
        (true, Some(ids)) => pd::items(&req.routing, &vec![ids.clone(); n as usize])?,
        _ => Vec::new(),
    };
    Ok(Chat {
        kv,
        dp_rank: req.routing.data_parallel_rank,
        id,
        created: unix_now(),
        stream: req.is_stream(),
        include_usage: req.include_usage(),
        continuous_usage: continuous_usage(req.stream_options.as_ref()),
        top_logprobs: match req.logprobs {
            Some(true) => Some(job::check_top(req.top_logprobs, "top_logprobs")?),
            _ => None,
        },
        model: req.model.unwrap_or_else(|| cfg.model.clone()),
        prompt_tokens: prompt.tokens,
        ids: if st.caches_prefixes() {
            ids.into_iter().collect()
        } else {
            Vec::new()
        },
        cache_report: cfg.enable_cache_report,
        cached: None,
        offsets: vec![0; seqs.len()],
        seqs,
    })
}

/// OpenAI-style logprobs of `tokens`, with `top` alternatives each.
fn logprobs(tokens: &[Token], top: usize) -> ChatLogprobs {
    let entry = |token: &str, logprob| (token.to_owned(), Some(token.as_bytes().to_vec()), logprob);
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|t| {
                let (token, bytes, logprob) = entry(t.display(), t.logprob);
                ChatTokenLogprob {
                    token,
                    bytes,
                    logprob,
                    top_logprobs: t
                        .top(top)
                        .map(|(_, text, lp)| {
                            let (token, bytes, logprob) = entry(text, lp);
                            TopLogprob {
                                token,
                                bytes,
                                logprob,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

impl Chat {
    /// Cached prompt tokens, when the worker reports them.
    fn reported_cache(&self) -> Option<u64> {
        self.cache_report.then_some(self.cached.unwrap_or(0))
    }

    fn usage(&self) -> Usage {
        job::usage(
            self.prompt_tokens,
            job::completion_tokens(&self.seqs),
            self.reported_cache(),
        )
    }

    /// The non-streamed response.
    fn complete(self) -> ChatCompletionResponse {
        let usage = self.usage();
        let top = self.top_logprobs;
        let choices = self
            .seqs
            .into_iter()
            .enumerate()
            .map(|(i, seq)| {
                let (finish_reason, matched_stop) = seq.finish.openai();
                ChatChoice {
                    index: i as u32,
                    logprobs: top.map(|k| logprobs(&seq.tokens, k)),
                    message: ChatResponseMessage {
                        role: "assistant".to_owned(),
                        content: Some(seq.text),
                        reasoning_content: None,
                        tool_calls: None,
                        extra: Extra::new(),
                    },
                    finish_reason: Some(finish_reason),
                    matched_stop,
                    extra: Extra::new(),
                }
            })
            .collect();
        let mut extra = Extra::new();
        extra.insert("metadata".to_owned(), json!({"weight_version": "default"}));
        ChatCompletionResponse {
            id: self.id,
            object: "chat.completion".to_owned(),
            created: self.created,
            model: self.model,
            choices,
            usage: Some(usage),
            extra,
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            extra: Extra::new(),
        }
    }

    fn push_choice(&self, out: &mut Vec<u8>, choice: ChatChunkChoice) {
        push_event(out, &self.chunk(vec![choice], None));
    }

    fn role_chunk(&self, out: &mut Vec<u8>, index: usize) {
        let delta = ChatDelta {
            role: Some("assistant".to_owned()),
            content: Some(String::new()),
            ..ChatDelta::default()
        };
        self.push_choice(out, choice(index, delta));
    }
}

fn choice(index: usize, delta: ChatDelta) -> ChatChunkChoice {
    ChatChunkChoice {
        index: index as u32,
        delta,
        logprobs: None,
        finish_reason: None,
        matched_stop: None,
        extra: Extra::new(),
    }
}

impl Answer for Chat {
    type Whole = ChatCompletionResponse;

    fn is_stream(&self) -> bool {
        self.stream
    }

    fn whole(self) -> ChatCompletionResponse {
        self.complete()
    }

    fn dp_rank(&self) -> Option<u32> {
        self.dp_rank
    }

    fn take_kv(&mut self) -> Vec<KvItem> {
        std::mem::take(&mut self.kv)
    }

    fn prompt_ids(&self) -> &[Arc<[u32]>] {
        &self.ids
    }

    fn prefilled(&mut self, cached: Vec<Cached>, _clock: Clock) {
        self.cached = Some(cached.iter().map(|c| c.tokens).sum());
    }
}

impl Steps for Chat {
    fn steps(&self) -> usize {
        longest(&self.seqs)
    }

    fn step(&mut self, k: usize, out: &mut Vec<u8>) {
        for i in 0..self.seqs.len() {
            let Some((token, text)) = advance(&self.seqs[i], k, &mut self.offsets[i]) else {
                continue;
            };
            if k == 0 {
                self.role_chunk(out, i);
            }
            if text.is_empty() {
                continue;
            }
            let mut c = choice(
                i,
                ChatDelta {
                    content: Some(text),
                    ..ChatDelta::default()
                },
            );
            c.logprobs = self.top_logprobs.map(|top| logprobs(&[token], top));
            let usage = self
                .continuous_usage
                .then(|| job::usage(self.prompt_tokens, k as u64 + 1, self.reported_cache()));
            push_event(out, &self.chunk(vec![c], usage));
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        for (i, seq) in self.seqs.iter().enumerate() {
            if seq.is_empty() {
                self.role_chunk(out, i);
            }
            let (reason, matched) = seq.finish.openai();
            let mut c = choice(i, ChatDelta::default());
            c.finish_reason = Some(reason);
            c.matched_stop = matched;
            self.push_choice(out, c);
        }
        if self.include_usage {
            push_event(out, &self.chunk(Vec::new(), Some(self.usage())));
        }
        push_done(out);
    }
}
