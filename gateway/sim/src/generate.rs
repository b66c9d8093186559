//! `POST /generate` (SGLang's native API) as SGLang answers it.
//!
//! A single prompt answers one object; a batch (a list of texts or of token-id lists) or
//! `sampling_params.n > 1` answers a list, prompt-major. Streamed, every token of every
//! output is one event whose `text`, `output_ids` and logprobs cover everything generated
//! so far; batch events carry `index`. The stream ends with `data: [DONE]`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use openapi::openai::Extra;
use openapi::sglang::{
    CachedTokensDetails, GenerateRequest, GenerateResponse, MetaInfo, SamplingParams, TokenLogprob,
};
use openapi::shapes::{InputIds, OneOrMany};

use super::engine::{self, Sequence};
use super::error::SimError;
use super::job::{self, Job, PromptInfo};
use super::model;
use super::pd::{self, KvItem};
use super::state::{Cached, SimState};
use super::stream::{Answer, Clock, Steps, longest, push_done, push_event, respond};
use sglang::tokenizer::Tokenizer;

/// SGLang's default `max_new_tokens`.
const DEFAULT_MAX_NEW_TOKENS: u32 = 128;

/// The handler.
pub async fn generate(State(st): State<Arc<SimState>>, body: Bytes) -> Response {
    respond(&st, |clock| prepare(&st, &body, clock), SimError::generate).await
}

/// What one prompt asks for in logprobs.
#[derive(Debug, Clone, Default)]
struct LogprobAsk {
    /// First prompt position with input logprobs.
    start: usize,
    /// Alternatives per position.
    top: usize,
}

/// One prompt: accounting, its token ids (only when input logprobs need them), logprobs.
struct PromptEntry {
    info: PromptInfo,
    ids: Vec<u32>,
    logprobs: Option<LogprobAsk>,
}

struct Generation {
    kv: Vec<KvItem>,
    /// The data-parallel rank the request names.
    dp_rank: Option<u32>,
    prompt_logprobs: bool,
    stream: bool,
    listed: bool,
    n: usize,
    text_in_logprobs: bool,
    clock: Clock,
    prompts: Vec<PromptEntry>,
    /// Each prompt's ids (for the prefix cache) and its cached part.
    ids: Vec<Arc<[u32]>>,
    cached: Vec<Cached>,
    rids: Vec<String>,
    seqs: Vec<Sequence>,
}

/// Checks that a per-item field has one entry per prompt when it is a list.
fn per_item<T>(field: &Option<OneOrMany<T>>, name: &str, count: usize) -> Result<(), SimError> {
    match field.as_ref().and_then(OneOrMany::list_len) {
        Some(len) if len != count => Err(SimError::BadRequest(format!(
            "{name} has {len} entries but the request has {count} prompts."
        ))),
        _ => Ok(()),
    }
}

fn item<T>(field: &Option<OneOrMany<T>>, i: usize) -> Option<&T> {
    field.as_ref().and_then(|f| f.get(i))
}

fn prompts(
    req: &GenerateRequest,
    tokenizer: Option<&Tokenizer>,
) -> Result<(Vec<PromptEntry>, bool), SimError> {
    let entry = |info, ids| PromptEntry {
        info,
        ids,
        logprobs: None,
    };
    // With a tokenizer a text prompt is its ids; else they are made only when needed.
    let text_entry = |t: &String| -> Result<PromptEntry, SimError> {
        Ok(match tokenizer {
            Some(tok) => {
                let ids = tok.text_ids(t)?;
                entry(PromptInfo::ids(&ids), ids)
            }
            None => entry(PromptInfo::text(t), Vec::new()),
        })
    };
    let ids_entry = |ids: &Vec<u32>| -> Result<PromptEntry, SimError> {
        job::check_ids(ids, "input_ids")?;
        Ok(entry(PromptInfo::ids(ids), ids.clone()))
    };
    let (entries, batch) = match (&req.text, &req.input_ids) {
        (Some(OneOrMany::One(t)), _) => (vec![text_entry(t)?], false),
        (Some(OneOrMany::Many(ts)), _) => {
            (ts.iter().map(text_entry).collect::<Result<_, _>>()?, true)
        }
        (None, Some(InputIds::Single(ids))) => (vec![ids_entry(ids)?], false),
        (None, Some(InputIds::Batch(b))) => {
            (b.iter().map(ids_entry).collect::<Result<_, _>>()?, true)
        }
        (None, None) => {
            return Err(SimError::BadRequest(
                "Either text, input_ids or input_embeds should be provided.".to_owned(),
            ));
        }
    };
    if entries.is_empty() {
        return Err(SimError::BadRequest("the batch has no prompts.".to_owned()));
    }
    Ok((entries, batch))
}

fn prepare(st: &SimState, body: &[u8], clock: Clock) -> Result<Generation, SimError> {
    let req: GenerateRequest = serde_json::from_slice(body)?;
    let (mut prompts, batch) = prompts(&req, st.tokenizer())?;
    let count = prompts.len();
    per_item(&req.sampling_params, "sampling_params", count)?;
    per_item(&req.routing.rid, "rid", count)?;
    per_item(&req.return_logprob, "return_logprob", count)?;
    per_item(&req.logprob_start_len, "logprob_start_len", count)?;
    per_item(&req.top_logprobs_num, "top_logprobs_num", count)?;
    per_item(&req.routing.bootstrap_host, "bootstrap_host", count)?;
    per_item(&req.routing.bootstrap_port, "bootstrap_port", count)?;
    per_item(&req.routing.bootstrap_room, "bootstrap_room", count)?;

    let default_sp = SamplingParams::default();
    let sp = |i| item(&req.sampling_params, i).unwrap_or(&default_sp);
    let n = job::check_n(sp(0).n)?;
    if (1..count).any(|i| sp(i).n.unwrap_or(1) != n) {
        return Err(SimError::BadRequest(
            "The parallel_sample_num should be the same for all samples in sample params."
                .to_owned(),
        ));
    }
    let cfg = &st.cfg;
    let mut jobs = Vec::with_capacity(count);
    for (i, p) in prompts.iter_mut().enumerate() {
        let sp = sp(i);
        engine::check_sampling(sp.temperature, sp.top_p)?;
        let max = st.cap_output(engine::resolve_max_tokens(
            p.info.tokens,
            sp.max_new_tokens,
            Some(DEFAULT_MAX_NEW_TOKENS),
            cfg.context_length,
        )?);
        if item(&req.return_logprob, i).copied().unwrap_or(false) {
            p.logprobs = Some(logprob_ask(&req, i, p)?);
        }
        jobs.push(Job {
            prompt: p.info,
            limits: engine::Limits {
                max_new_tokens: max,
                min_new_tokens: sp.min_new_tokens.unwrap_or(0),
                stop: sp.stop.as_ref().map_or(&[][..], |s| s.as_slice()),
                stop_token_ids: sp.stop_token_ids.as_deref().unwrap_or(&[]),
                ignore_eos: sp.ignore_eos.unwrap_or(false),
                no_stop_trim: sp.no_stop_trim.unwrap_or(false),
            },
        });
    }
    let tokens: Vec<Arc<[u32]>> = if st.pd.is_some() || st.caches_prefixes() {
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| match (p.ids.is_empty(), item(&req.text, i)) {
                (true, Some(t)) => Arc::from(model::tokenize_prompt(t)),
                _ => Arc::from(p.ids.as_slice()),
            })
            .collect()
    } else {
        Vec::new()
    };
    let kv = match st.moves_kv(&req.routing) {
        true => pd::items(&req.routing, &tokens)?,
        false => Vec::new(),
    };
    let seqs = job::run_all(&jobs, n, None, cfg.output_tokens)?;
    let listed = batch || n > 1;
    let rids = (0..seqs.len())
        .map(|o| {
            let (p, j) = (o / n as usize, o % n as usize);
            match &req.routing.rid {
                None => st.new_rid(),
                Some(OneOrMany::One(r)) if !listed => r.clone(),
                Some(OneOrMany::One(r)) => format!("{r}_{o}"),
                Some(OneOrMany::Many(rs)) if n > 1 => format!("{}_{j}", rs[p]),
                Some(OneOrMany::Many(rs)) => rs[p].clone(),
            }
        })
        .collect();
    Ok(Generation {
        kv,
        dp_rank: req.routing.data_parallel_rank,
        prompt_logprobs: st.prompt_logprobs(),
        stream: req.is_stream(),
        listed,
        n: n as usize,
        text_in_logprobs: req.return_text_in_logprobs.unwrap_or(false),
        clock,
        cached: vec![Cached::default(); prompts.len()],
        ids: if st.caches_prefixes() {
            tokens
        } else {
            Vec::new()
        },
        prompts,
        rids,
        seqs,
    })
}

/// Reads prompt `i`'s logprob options; tokenizes a text prompt (input logprobs need ids).
fn logprob_ask(
    req: &GenerateRequest,
    i: usize,
    p: &mut PromptEntry,
) -> Result<LogprobAsk, SimError> {
    if let (true, Some(t)) = (p.ids.is_empty(), item(&req.text, i)) {
        p.ids = model::tokenize_prompt(t);
    }
    let len = p.ids.len();
    let start = match item(&req.logprob_start_len, i).copied().unwrap_or(-1) {
        -1 => len.saturating_sub(1),
        s if s >= 0 && (s as usize) < len => s as usize,
        s => {
            return Err(SimError::BadRequest(format!(
                "logprob_start_len ({s}) must be -1 or a position in the input (length {len})."
            )));
        }
    };
    let top = job::check_top(item(&req.top_logprobs_num, i).copied(), "top_logprobs_num")?;
    Ok(LogprobAsk { start, top })
}

impl Generation {
    fn entry(&self, logprob: Option<f64>, id: u32) -> TokenLogprob {
        let text = self.text_in_logprobs.then(|| model::token_text(id));
        TokenLogprob(logprob, id, text)
    }

    fn top(&self, id: u32, logprob: f64, k: usize) -> Vec<TokenLogprob> {
        model::top_alternatives(id, logprob, k)
            .map(|(id, lp)| self.entry(Some(lp), id))
            .collect()
    }

    /// Output `o` after `upto` tokens (`None`: finished).
    fn output(&self, o: usize, upto: Option<usize>) -> GenerateResponse {
        let seq = &self.seqs[o];
        let prompt = &self.prompts[o / self.n];
        let k = upto.unwrap_or(seq.len()).min(seq.len());
        let done = k == seq.len();
        let visible: usize = seq.tokens[..k].iter().map(|t| t.text().len()).sum();
        let text = seq.text[..visible.min(seq.text.len())].to_owned();
        let mut meta = MetaInfo {
            id: self.rids[o].clone(),
            finish_reason: done.then(|| seq.finish.sglang()),
            prompt_tokens: prompt.info.tokens,
            completion_tokens: k as u64,
            cached_tokens: self.cached[o / self.n].tokens,
            cached_tokens_details: details(self.cached[o / self.n]),
            weight_version: Some("default".to_owned()),
            e2e_latency: done
                .then(|| (self.clock.done_at(seq.len()) - self.clock.start).as_secs_f64()),
            input_token_logprobs: None,
            output_token_logprobs: None,
            input_top_logprobs: None,
            output_top_logprobs: None,
            extra: Extra::new(),
        };
        if let Some(ask) = &prompt.logprobs {
            // A decode worker has no prompt logprobs (the prefill computed the prompt).
            let skip = if self.prompt_logprobs {
                ask.start
            } else {
                prompt.ids.len()
            };
            let positions = prompt.ids.iter().enumerate().skip(skip);
            let lp = |id: u32, pos: usize| {
                (pos > ask.start)
                    .then(|| model::prompt_logprob(id, pos))
                    .flatten()
            };
            meta.input_token_logprobs = Some(
                positions
                    .clone()
                    .map(|(pos, &id)| self.entry(lp(id, pos), id))
                    .collect(),
            );
            let out = &seq.tokens[..k];
            meta.output_token_logprobs = Some(
                out.iter()
                    .map(|t| self.entry(Some(t.logprob), t.id))
                    .collect(),
            );
            if ask.top > 0 {
                meta.input_top_logprobs = Some(
                    positions
                        .map(|(pos, &id)| lp(id, pos).map(|l| self.top(id, l, ask.top)))
                        .collect(),
                );
                meta.output_top_logprobs = Some(
                    out.iter()
                        .map(|t| Some(self.top(t.id, t.logprob, ask.top)))
                        .collect(),
                );
            }
        }
        GenerateResponse {
            text: Some(text),
            output_ids: seq.tokens[..k].iter().map(|t| t.id).collect(),
            meta_info: meta,
            index: (self.listed && self.stream).then_some(o as u32),
            extra: Extra::new(),
        }
    }
}

impl Answer for Generation {
    type Whole = OneOrMany<GenerateResponse>;

    fn is_stream(&self) -> bool {
        self.stream
    }

    /// One object for a single prompt, a list for a batch or `n > 1`.
    fn dp_rank(&self) -> Option<u32> {
        self.dp_rank
    }

    fn take_kv(&mut self) -> Vec<KvItem> {
        std::mem::take(&mut self.kv)
    }

    fn prompt_ids(&self) -> &[Arc<[u32]>] {
        &self.ids
    }

    fn prefilled(&mut self, cached: Vec<Cached>, clock: Clock) {
        self.cached = cached;
        self.clock = clock;
    }

    fn whole(self) -> OneOrMany<GenerateResponse> {
        if self.listed {
            OneOrMany::Many((0..self.seqs.len()).map(|o| self.output(o, None)).collect())
        } else {
            OneOrMany::One(self.output(0, None))
        }
    }
}

impl Steps for Generation {
    fn steps(&self) -> usize {
        longest(&self.seqs)
    }

    fn step(&mut self, k: usize, out: &mut Vec<u8>) {
        for o in 0..self.seqs.len() {
            if k < self.seqs[o].len() {
                push_event(out, &self.output(o, Some(k + 1)));
            }
        }
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        for o in 0..self.seqs.len() {
            if self.seqs[o].is_empty() {
                push_event(out, &self.output(o, None));
            }
        }
        push_done(out);
    }
}

/// SGLang's `cached_tokens_details` for a prompt: with the store on (HiCache with an L3
/// backend) and anything cached, the tokens found on the GPU and those loaded from the
/// store (this worker has no host tier); `None` otherwise, as SGLang answers.
fn details(c: Cached) -> Option<CachedTokensDetails> {
    let storage = c.from_store.filter(|_| c.tokens > 0)?;
    Some(CachedTokensDetails {
        device: c.tokens - storage,
        host: 0,
        storage: Some(storage),
        storage_backend: Some("MooncakeStore".to_owned()),
    })
}
