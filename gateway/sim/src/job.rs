//! From a parsed request to finished sequences, shared by the three generation APIs:
//! prompt accounting, SGLang's extension fields of the OpenAI routes, and running every
//! (prompt, sample) pair within the simulator's budget.

use openapi::openai::chat::ChatMessage;
use openapi::openai::{Extra, PromptTokensDetails, Usage};
use serde::de::DeserializeOwned;

use super::engine::{self, Limits, Sequence};
use super::error::SimError;
use super::model::{self, FNV_OFFSET, Generator, hash_bytes};

/// Most sequences (prompts × samples) one request may ask for.
pub const MAX_SEQUENCES: usize = 1024;
/// Most tokens one request may make the simulator write (over all its sequences).
pub const MAX_TOTAL_TOKENS: u64 = 1 << 22;
/// Roles a chat message may have (compared without case, as SGLang does).
pub const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// A prompt as the model sees it: its length and the seed it gives the generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptInfo {
    /// Prompt tokens.
    pub tokens: u64,
    /// Hash of the prompt's content.
    pub hash: u64,
}

impl PromptInfo {
    /// A text prompt: BOS plus its pieces.
    pub fn text(text: &str) -> Self {
        PromptInfo {
            tokens: 1 + model::count_pieces(text),
            hash: hash_bytes(FNV_OFFSET, text.as_bytes()),
        }
    }

    /// A prompt given as token ids.
    pub fn ids(ids: &[u32]) -> Self {
        let hash = ids
            .iter()
            .fold(FNV_OFFSET, |h, id| hash_bytes(h, &id.to_le_bytes()));
        PromptInfo {
            tokens: ids.len() as u64,
            hash,
        }
    }

    /// A chat prompt (see the model's docs for how it is counted); checks the messages.
    pub fn chat(messages: &[ChatMessage]) -> Result<Self, SimError> {
        if messages.is_empty() {
            return Err(SimError::BadRequest(
                "messages must not be empty.".to_owned(),
            ));
        }
        let mut tokens = 1 + model::REPLY_PRIMER;
        let mut hash = FNV_OFFSET;
        for m in messages {
            if !ROLES.iter().any(|r| r.eq_ignore_ascii_case(&m.role)) {
                return Err(SimError::BadRequest(format!(
                    "'role' must be one of {} (got '{}').",
                    ROLES.join(", "),
                    m.role
                )));
            }
            tokens += model::MESSAGE_OVERHEAD;
            hash = hash_bytes(hash, m.role.as_bytes());
            if let Some(content) = &m.content {
                content.for_each_text(|t| {
                    tokens += model::count_pieces(t);
                    hash = hash_bytes(hash, t.as_bytes());
                });
            }
        }
        Ok(PromptInfo { tokens, hash })
    }
}

/// The token ids of a chat prompt (as [`PromptInfo::chat`] counts them; see the model's docs).
pub fn chat_ids(messages: &[ChatMessage]) -> Vec<u32> {
    let mut ids = vec![model::BOS_TOKEN_ID];
    for m in messages {
        ids.extend(model::role_header(&m.role));
        if let Some(content) = &m.content {
            content.for_each_text(|t| {
                ids.extend(model::pieces(t).map(|r| model::piece_id(&t.as_bytes()[r])));
            });
        }
    }
    ids.extend(model::role_header("assistant"));
    ids
}

/// SGLang's extension fields of the OpenAI routes that shape the output.
#[derive(Debug, Clone, Default)]
pub struct Extensions {
    /// `min_tokens`.
    pub min_tokens: u32,
    /// `stop_token_ids`.
    pub stop_token_ids: Vec<u32>,
    /// `ignore_eos`.
    pub ignore_eos: bool,
    /// `no_stop_trim`.
    pub no_stop_trim: bool,
}

impl Extensions {
    /// Reads the fields from a request's unknown fields.
    pub fn from_extra(extra: &Extra) -> Result<Self, SimError> {
        if extra.is_empty() {
            return Ok(Extensions::default());
        }
        Ok(Extensions {
            min_tokens: field(extra, "min_tokens")?.unwrap_or(0),
            stop_token_ids: field(extra, "stop_token_ids")?.unwrap_or_default(),
            ignore_eos: field(extra, "ignore_eos")?.unwrap_or(false),
            no_stop_trim: field(extra, "no_stop_trim")?.unwrap_or(false),
        })
    }

    /// The limits for a sequence of at most `max_new_tokens`, stopping at `stop`.
    pub fn limits<'a>(&'a self, max_new_tokens: u32, stop: &'a [String]) -> Limits<'a> {
        Limits {
            max_new_tokens,
            min_new_tokens: self.min_tokens,
            stop,
            stop_token_ids: &self.stop_token_ids,
            ignore_eos: self.ignore_eos,
            no_stop_trim: self.no_stop_trim,
        }
    }
}

/// Reads an optional field of `extra` as `T` (`null` counts as absent).
fn field<T: DeserializeOwned>(extra: &Extra, key: &str) -> Result<Option<T>, SimError> {
    match extra.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| SimError::BadRequest(format!("invalid {key}: {e}"))),
    }
}

/// Most alternatives per position a request may ask for (`top_logprobs`, `logprobs`,
/// `top_logprobs_num`): the simulator's vocabulary of words.
pub const MAX_TOP_LOGPROBS: u32 = model::WORDS.len() as u32;

/// Checks how many alternatives per position were asked for (`name` is the field).
pub fn check_top(k: Option<u32>, name: &str) -> Result<usize, SimError> {
    match k.unwrap_or(0) {
        k if k > MAX_TOP_LOGPROBS => Err(SimError::BadRequest(format!(
            "{name} must be at most {MAX_TOP_LOGPROBS} on the simulator (got {k})."
        ))),
        k => Ok(k as usize),
    }
}

/// Checks prompt token ids: not empty, inside the vocabulary.
pub fn check_ids(ids: &[u32], name: &str) -> Result<(), SimError> {
    if ids.is_empty() {
        return Err(SimError::BadRequest(format!("{name} cannot be empty.")));
    }
    match ids.iter().find(|&&id| id >= model::VOCAB_SIZE) {
        Some(id) => Err(SimError::BadRequest(format!(
            "token id {id} in {name} is out of vocabulary (size {}).",
            model::VOCAB_SIZE
        ))),
        None => Ok(()),
    }
}

/// Checks the number of samples per prompt.
pub fn check_n(n: Option<u32>) -> Result<u32, SimError> {
    match n.unwrap_or(1) {
        0 => Err(SimError::BadRequest("n must be at least 1.".to_owned())),
        n if n as usize > MAX_SEQUENCES => Err(SimError::BadRequest(format!(
            "n must be at most {MAX_SEQUENCES} on the simulator."
        ))),
        n => Ok(n),
    }
}

/// One prompt to run: its accounting and the limits of its sequences.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    /// The prompt.
    pub prompt: PromptInfo,
    /// What may end its sequences.
    pub limits: Limits<'a>,
}

/// Runs `n` samples of every job, prompt-major (sequence `p * n + j` is sample `j` of
/// prompt `p`), after checking the request fits the simulator's budget.
pub fn run_all(
    jobs: &[Job<'_>],
    n: u32,
    seed: Option<i64>,
    natural_len: u32,
) -> Result<Vec<Sequence>, SimError> {
    let count = jobs.len().saturating_mul(n as usize);
    if count > MAX_SEQUENCES {
        return Err(SimError::BadRequest(format!(
            "the request asks for {count} sequences; the simulator runs at most {MAX_SEQUENCES}."
        )));
    }
    let budget: u64 = jobs
        .iter()
        .map(|j| {
            let l = &j.limits;
            let len = if l.ignore_eos {
                l.max_new_tokens
            } else {
                l.max_new_tokens
                    .min(natural_len.max(l.min_new_tokens).saturating_add(1))
            };
            u64::from(len) * u64::from(n)
        })
        .sum();
    if budget > MAX_TOTAL_TOKENS {
        return Err(SimError::BadRequest(format!(
            "the request asks for up to {budget} output tokens; the simulator writes at most \
             {MAX_TOTAL_TOKENS} per request."
        )));
    }
    let mut out = Vec::with_capacity(count);
    for job in jobs {
        for j in 0..n {
            let words = Generator::new(job.prompt.hash, seed, j);
            out.push(engine::run(words, natural_len, &job.limits));
        }
    }
    Ok(out)
}

/// OpenAI usage, with `prompt_tokens_details.cached_tokens` when `cached` is given
/// (`--enable-cache-report`).
pub fn usage(prompt_tokens: u64, completion_tokens: u64, cached: Option<u64>) -> Usage {
    let mut u = Usage::new(prompt_tokens, completion_tokens);
    u.prompt_tokens_details = cached.map(|cached_tokens| PromptTokensDetails {
        cached_tokens,
        ..PromptTokensDetails::default()
    });
    u
}

/// Completion tokens over all sequences.
pub fn completion_tokens(seqs: &[Sequence]) -> u64 {
    seqs.iter().map(|s| s.len() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use openapi::openai::chat::{ContentPart, MessageContent};

    fn msg(role: &str, content: Option<MessageContent>) -> ChatMessage {
        ChatMessage {
            role: role.to_owned(),
            content,
            ..ChatMessage::default()
        }
    }

    #[test]
    fn chat_prompts_count_every_text_part() {
        let parts = MessageContent::Parts(vec![
            ContentPart {
                kind: "text".into(),
                text: Some("a b".into()),
                ..ContentPart::default()
            },
            ContentPart {
                kind: "image_url".into(),
                ..ContentPart::default()
            },
        ]);
        let p = PromptInfo::chat(&[
            msg("System", Some(MessageContent::Text("be brief".into()))),
            msg("user", Some(parts)),
            msg("assistant", None),
        ])
        .unwrap();
        assert_eq!(p.tokens, 1 + 3 + (3 + 2) + (3 + 2) + 3);
        let msgs = [
            msg("System", Some(MessageContent::Text("be brief".into()))),
            msg("user", Some(MessageContent::Text("hi there".into()))),
        ];
        let ids = chat_ids(&msgs);
        assert_eq!(ids.len() as u64, PromptInfo::chat(&msgs).unwrap().tokens);
        assert_eq!(ids[1..4], model::role_header("system"));
        assert!(PromptInfo::chat(&[]).is_err());
        let err = PromptInfo::chat(&[msg("robot", None)]).unwrap_err();
        assert!(err.to_string().contains("'role' must be one of"), "{err}");
    }

    #[test]
    fn text_and_id_prompts() {
        assert_eq!(PromptInfo::text("hello world").tokens, 3);
        assert_eq!(PromptInfo::ids(&[1, 2, 3]).tokens, 3);
        assert_ne!(PromptInfo::ids(&[1, 2]).hash, PromptInfo::ids(&[2, 1]).hash);
    }

    #[test]
    fn extensions_and_budget() {
        let extra: Extra = serde_json::from_str(
            r#"{"min_tokens":2,"stop_token_ids":[7],"ignore_eos":true,"regex":"x"}"#,
        )
        .unwrap();
        let x = Extensions::from_extra(&extra).unwrap();
        assert_eq!(
            (x.min_tokens, x.stop_token_ids.as_slice(), x.ignore_eos),
            (2, &[7][..], true)
        );
        let bad: Extra = serde_json::from_str(r#"{"ignore_eos":"yes"}"#).unwrap();
        assert!(
            Extensions::from_extra(&bad)
                .unwrap_err()
                .to_string()
                .contains("ignore_eos")
        );
        assert!(check_n(Some(0)).is_err());
        assert_eq!(check_n(None).unwrap(), 1);

        let job = Job {
            prompt: PromptInfo::text("x"),
            limits: x.limits(10, &[]),
        };
        let seqs = run_all(&[job.clone(), job.clone()], 3, None, 4).unwrap();
        assert_eq!(seqs.len(), 6);
        assert_eq!(completion_tokens(&seqs), 60);
        assert_eq!(
            seqs[0].text, seqs[3].text,
            "sample j of equal prompts match"
        );
        assert_ne!(seqs[0].text, seqs[1].text);
        let huge = Job {
            prompt: PromptInfo::text("x"),
            limits: x.limits(u32::MAX, &[]),
        };
        assert!(run_all(&[huge], 1, None, 4).is_err());
        assert!(run_all(&[job], MAX_SEQUENCES as u32 + 1, None, 4).is_err());
    }
}
