//! `POST /v1/completions` as SGLang answers it.
//!
//! Streamed: one chunk per token per choice (the choice's last chunk carries its
//! `finish_reason`), then the usage chunk (`stream_options.include_usage`), then
//! `data: [DONE]`; with `stream_options.continuous_usage_stats` every chunk carries its
//! choice's running usage. Choices are numbered prompt-major: `index = prompt * n + sample`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use openapi::openai::completions::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
};
use openapi::openai::{Extra, Usage};
use openapi::shapes::Prompt;
use serde_json::json;

use super::engine::{self, Sequence};
use super::error::SimError;
use super::job::{self, Extensions, Job, PromptInfo};
use super::model::{self, Token};
use super::pd::{self, KvItem};
use super::state::{Cached, SimState, unix_now};
use super::stream::{
    Answer, Clock, Steps, advance, continuous_usage, longest, push_done, push_event, respond,
};

/// OpenAI's (and SGLang's) default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: u32 = 16;

/// The handler.
pub async fn completions(State(st): State<Arc<SimState>>, body: Bytes) -> Response {
    respond(&st, |_| prepare(&st, &body), SimError::openai).await
}

/// One prompt of the request, as the model and the echo see it.
struct PromptEntry {
    info: PromptInfo,
    /// Id and text of each prompt token (for echoed logprobs), and the echoed text.
    echo: Option<(Vec<(u32, String)>, String)>,
    /// A text prompt's ids from `--tokenizer-path`.
    ids: Option<Arc<[u32]>>,
}

struct Completion {
    kv: Vec<KvItem>,
    /// The data-parallel rank the request names.
    dp_rank: Option<u32>,
    prompt_logprobs: bool,
    id: String,
    created: u64,
    model: String,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
    top_logprobs: Option<usize>,
    n: usize,
    prompts: Vec<PromptEntry>,
    /// Each prompt's ids (for the prefix cache) and its cached part.
    ids: Vec<Arc<[u32]>>,
    cache_report: bool,
    cached: Vec<u64>,
    seqs: Vec<Sequence>,
    offsets: Vec<usize>,
}

fn text_entry(st: &SimState, text: &str, echo: bool) -> Result<PromptEntry, SimError> {
    if let Some(t) = st.tokenizer() {
        let ids = t.text_ids(text)?;
        let echo = echo.then(|| {
            let pieces = ids.iter().map(|&id| (id, t.token_text(id))).collect();
            (pieces, text.to_owned())
        });
        return Ok(PromptEntry {
            info: PromptInfo::ids(&ids),
            echo,
            ids: Some(Arc::from(ids)),
        });
    }
    let echo = echo.then(|| {
        let pieces = model::pieces(text)
            .map(|r| {
                (
                    model::piece_id(&text.as_bytes()[r.clone()]),
                    text[r].to_owned(),
                )
            })
            .collect();
        (pieces, text.to_owned())
    });
    Ok(PromptEntry {
        info: PromptInfo::text(text),
        echo,
        ids: None,
    })
}

fn ids_entry(ids: &[u32], echo: bool) -> Result<PromptEntry, SimError> {
    job::check_ids(ids, "prompt")?;
    let echo = echo.then(|| {
        let tokens: Vec<(u32, String)> =
            ids.iter().map(|&id| (id, model::token_text(id))).collect();
        let shown = tokens.iter().filter(|(id, _)| *id > model::EOS_TOKEN_ID);
        let text = shown.map(|(_, t)| t.as_str()).collect();
        (tokens, text)
    });
    Ok(PromptEntry {
        info: PromptInfo::ids(ids),
        echo,
        ids: None,
    })
}

fn prepare(st: &SimState, body: &[u8]) -> Result<Completion, SimError> {
    let req: CompletionRequest = serde_json::from_slice(body)?;
    if req.prompt.is_empty() {
        return Err(SimError::BadRequest(
            "prompt must not be an empty list.".to_owned(),
        ));
    }
    let n = job::check_n(req.n)?;
    engine::check_sampling(req.temperature, req.top_p)?;
    let echo = req.echo.unwrap_or(false);
    let prompts: Vec<PromptEntry> = match &req.prompt {
        Prompt::Text(t) => vec![text_entry(st, t, echo)?],
        Prompt::Texts(ts) => ts
            .iter()
            .map(|t| text_entry(st, t, echo))
            .collect::<Result<_, _>>()?,
        Prompt::Tokens(ids) => vec![ids_entry(ids, echo)?],
        Prompt::TokenBatch(b) => b
            .iter()
            .map(|ids| ids_entry(ids, echo))
            .collect::<Result<_, _>>()?,
    };
    let cfg = &st.cfg;
    let ext = Extensions::from_extra(&req.extra)?;
    let stop = req.stop.as_ref().map_or(&[][..], |s| s.as_slice());
    let jobs = prompts
        .iter()
        .map(|p| {
            let max = st.cap_output(engine::resolve_max_tokens(
                p.info.tokens,
                req.max_tokens,
                Some(DEFAULT_MAX_TOKENS),
                cfg.context_length,
            )?);
            Ok(Job {
                prompt: p.info,
                limits: ext.limits(max, stop),
            })
        })
        .collect::<Result<Vec<_>, SimError>>()?;
    let seqs = job::run_all(&jobs, n, req.seed, cfg.output_tokens)?;
    let id = match req.routing.rid.as_ref().and_then(|r| r.get(0)) {
        Some(rid) => rid.clone(),
        None => format!("cmpl-{}", st.new_id()),
    };
    let tokens: Vec<Arc<[u32]>> = if st.pd.is_some() || st.caches_prefixes() {
        let text = |(i, t): (usize, &String)| match &prompts[i].ids {
            Some(ids) => ids.clone(),
            None => Arc::from(model::tokenize_prompt(t)),
        };
        let ids = |i: &Vec<u32>| Arc::from(i.as_slice());
        match &req.prompt {
            Prompt::Text(t) => vec![text((0, t))],
            Prompt::Texts(ts) => ts.iter().enumerate().map(text).collect(),
            Prompt::Tokens(i) => vec![ids(i)],
            Prompt::TokenBatch(b) => b.iter().map(ids).collect(),
        }
    } else {
        Vec::new()
    };
    // PD: each prompt is an item with its own room (its choices share the KV).
    let kv = match st.moves_kv(&req.routing) {
        true => pd::items(&req.routing, &tokens)?,
        false => Vec::new(),
    };
    Ok(Completion {
        kv,
        dp_rank: req.routing.data_parallel_rank,
        prompt_logprobs: st.prompt_logprobs(),
        id,
        created: unix_now(),
        model: req.model.clone().unwrap_or_else(|| cfg.model.clone()),
        stream: req.is_stream(),
        include_usage: req.include_usage(),
        continuous_usage: continuous_usage(req.stream_options.as_ref()),
        top_logprobs: req
            .logprobs
            .map(|k| job::check_top(Some(k), "logprobs"))
            .transpose()?,
        n: n as usize,
        offsets: vec![0; seqs.len()],
        cached: vec![0; prompts.len()],
        ids: if st.caches_prefixes() {
            tokens
        } else {
            Vec::new()
        },
        cache_report: cfg.enable_cache_report,
        prompts,
        seqs,
    })
}

/// Appends one token to OpenAI-style completion logprobs.
fn push_logprob(
    lp: &mut CompletionLogprobs,
    text: &str,
    logprob: Option<f64>,
    top: Option<BTreeMap<String, f64>>,
    offset: usize,
) {
    lp.tokens.push(text.to_owned());
    lp.token_logprobs.push(logprob);
    lp.top_logprobs.push(top);
    lp.text_offset.push(offset as i64);
}

fn top_map(t: &Token, k: usize) -> Option<BTreeMap<String, f64>> {
    (k > 0).then(|| {
        t.top(k)
            .map(|(_, text, lp)| (text.to_owned(), lp))
            .collect()
    })
}

impl Completion {
    fn usage(&self) -> Usage {
        let prompt_tokens = self.prompts.iter().map(|p| p.info.tokens).sum();
        let cached = self.cache_report.then(|| self.cached.iter().sum());
        job::usage(prompt_tokens, job::completion_tokens(&self.seqs), cached)
    }

    /// The echo of choice `i`'s prompt: its text, and its logprob entries when asked for.
    fn echo(&self, i: usize, lp: &mut Option<CompletionLogprobs>) -> &str {
        let Some((pieces, text)) = &self.prompts[i / self.n].echo else {
            return "";
        };
        // A decode worker echoes the text but has no prompt logprobs (the prefill has).
        if let (Some(lp), true) = (lp, self.prompt_logprobs) {
            let mut offset = 0;
            for (pos, (id, piece)) in pieces.iter().enumerate() {
                push_logprob(lp, piece, model::prompt_logprob(*id, pos), None, offset);
                if *id > model::EOS_TOKEN_ID {
                    offset += piece.len();
                }
            }
        }
        text
    }

    /// Logprobs of output tokens `k..end` of choice `i`, whose text starts at `offset`.
    fn output_logprobs(&self, lp: &mut CompletionLogprobs, tokens: &[Token], mut offset: usize) {
        let top = self.top_logprobs.unwrap_or(0);
        for t in tokens {
            push_logprob(lp, t.display(), Some(t.logprob), top_map(t, top), offset);
            offset += t.text().len();
        }
    }

    fn complete(&self) -> CompletionResponse {
        let choices = self
            .seqs
            .iter()
            .enumerate()
            .map(|(i, seq)| {
                let mut lp = self.top_logprobs.map(|_| CompletionLogprobs::default());
                let echo = self.echo(i, &mut lp);
                if let Some(lp) = lp.as_mut() {
                    self.output_logprobs(lp, &seq.tokens, echo.len());
                }
                let (finish_reason, matched_stop) = seq.finish.openai();
                CompletionChoice {
                    index: i as u32,
                    text: format!("{echo}{}", seq.text),
                    logprobs: lp,
                    finish_reason: Some(finish_reason),
                    matched_stop,
                    extra: Extra::new(),
                }
            })
            .collect();
        let mut extra = Extra::new();
        extra.insert("metadata".to_owned(), json!({"weight_version": "default"}));
        self.response(choices, Some(self.usage()), extra)
    }

    fn response(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Usage>,
        extra: Extra,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion".to_owned(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            extra,
        }
    }
}

impl Answer for Completion {
    type Whole = CompletionResponse;

    fn is_stream(&self) -> bool {
        self.stream
    }

    fn whole(self) -> CompletionResponse {
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
        self.cached = cached.iter().map(|c| c.tokens).collect();
    }
}

impl Steps for Completion {
    fn steps(&self) -> usize {
        longest(&self.seqs)
    }

    fn step(&mut self, k: usize, out: &mut Vec<u8>) {
        for i in 0..self.seqs.len() {
            let start = self.offsets[i];
            let Some((token, text)) = advance(&self.seqs[i], k, &mut self.offsets[i]) else {
                continue;
            };
            let seq = &self.seqs[i];
            let mut lp = self.top_logprobs.map(|_| CompletionLogprobs::default());
            let echo = if k == 0 { self.echo(i, &mut lp) } else { "" };
            if let Some(lp) = lp.as_mut() {
                self.output_logprobs(lp, &[token], echo.len() + start);
            }
            let last = k + 1 == seq.len();
            let (reason, matched) = seq.finish.openai();
            let choice = CompletionChoice {
                index: i as u32,
                text: if echo.is_empty() {
                    text
                } else {
                    format!("{echo}{text}")
                },
                logprobs: lp,
                finish_reason: last.then_some(reason),
                matched_stop: if last { matched } else { None },
                extra: Extra::new(),
            };
            let prompt_tokens = self.prompts[i / self.n].info.tokens;
            let cached = self.cache_report.then(|| self.cached[i / self.n]);
            let usage = self
                .continuous_usage
                .then(|| job::usage(prompt_tokens, k as u64 + 1, cached));
            push_event(out, &self.response(vec![choice], usage, Extra::new()));
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        for (i, seq) in self.seqs.iter().enumerate() {
            if seq.is_empty() {
                let (reason, matched) = seq.finish.openai();
                let mut lp = self.top_logprobs.map(|_| CompletionLogprobs::default());
                let choice = CompletionChoice {
                    index: i as u32,
                    text: self.echo(i, &mut lp).to_owned(),
                    logprobs: lp,
                    finish_reason: Some(reason),
                    matched_stop: matched,
                    extra: Extra::new(),
                };
                push_event(out, &self.response(vec![choice], None, Extra::new()));
            }
        }
        if self.include_usage {
            push_event(
                out,
                &self.response(Vec::new(), Some(self.usage()), Extra::new()),
            );
        }
        push_done(out);
    }
}
