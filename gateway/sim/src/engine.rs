//! Running one sequence: the simulated model writes words until a limit, a stop string,
//! a stop token or its end-of-sequence token ends it. Pure: no I/O, no clock.

use openapi::openai::{FinishReason, MatchedStop};
use openapi::sglang::GenerateFinishReason;

use super::error::SimError;
use super::model::{self, Generator, Token};

/// What may end a sequence, resolved from a request.
#[derive(Debug, Clone, Default)]
pub struct Limits<'a> {
    /// Token limit.
    pub max_new_tokens: u32,
    /// Tokens to write before a stop or end-of-sequence may end the sequence.
    pub min_new_tokens: u32,
    /// Stop strings.
    pub stop: &'a [String],
    /// Stop token ids.
    pub stop_token_ids: &'a [u32],
    /// Write past the model's end-of-sequence token.
    pub ignore_eos: bool,
    /// Keep a matched stop string (or stop token's text) in the output.
    pub no_stop_trim: bool,
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Finish {
    /// The token limit was reached.
    Length(u32),
    /// The model wrote its end-of-sequence token.
    Eos,
    /// A stop token id was written.
    StopToken(u32),
    /// A stop string was written.
    StopText(String),
}

impl Finish {
    /// OpenAI's `finish_reason` and SGLang's `matched_stop`.
    pub fn openai(&self) -> (FinishReason, Option<MatchedStop>) {
        match self {
            Finish::Length(_) => (FinishReason::Length, None),
            Finish::Eos => (
                FinishReason::Stop,
                Some(MatchedStop::Token(model::EOS_TOKEN_ID)),
            ),
            Finish::StopToken(id) => (FinishReason::Stop, Some(MatchedStop::Token(*id))),
            Finish::StopText(s) => (FinishReason::Stop, Some(MatchedStop::Text(s.clone()))),
        }
    }

    /// SGLang's `meta_info.finish_reason`.
    pub fn sglang(&self) -> GenerateFinishReason {
        match self {
            Finish::Length(n) => GenerateFinishReason::Length {
                length: u64::from(*n),
            },
            _ => GenerateFinishReason::Stop {
                matched: self.openai().1,
            },
        }
    }
}

/// A finished sequence.
#[derive(Debug, Clone)]
pub struct Sequence {
    /// Every token written, including a final end-of-sequence or stop token.
    pub tokens: Vec<Token>,
    /// The visible output: the tokens' text, cut before a matched stop.
    pub text: String,
    /// Why it ended.
    pub finish: Finish,
}

impl Sequence {
    /// Tokens written (what `completion_tokens` counts).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when nothing was written (`max_new_tokens: 0`).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Runs the model for one sequence. `natural_len` is how many words the model writes
/// before its end-of-sequence token.
pub fn run(mut words: Generator, natural_len: u32, limits: &Limits<'_>) -> Sequence {
    let cap = limits.max_new_tokens.min(natural_len.saturating_add(1)) as usize;
    let mut tokens = Vec::with_capacity(cap);
    let mut text = String::with_capacity(cap * 8);
    let finish = loop {
        let k = tokens.len() as u32;
        if k >= limits.max_new_tokens {
            break Finish::Length(limits.max_new_tokens);
        }
        let may_stop = k >= limits.min_new_tokens;
        if k >= natural_len && may_stop && !limits.ignore_eos {
            tokens.push(words.eos());
            break Finish::Eos;
        }
        let t = words.next_word();
        tokens.push(t);
        let before = text.len();
        text.push_str(t.text());
        if tokens.len() as u32 <= limits.min_new_tokens {
            continue;
        }
        if limits.stop_token_ids.contains(&t.id) {
            if !limits.no_stop_trim {
                text.truncate(before);
            }
            break Finish::StopToken(t.id);
        }
        if let Some((pos, stop)) = find_stop(&text, before, limits.stop) {
            let end = if limits.no_stop_trim {
                pos + stop.len()
            } else {
                pos
            };
            text.truncate(end);
            break Finish::StopText(stop.clone());
        }
    };
    Sequence {
        tokens,
        text,
        finish,
    }
}

/// The earliest stop string that ends in `text[new_from..]`: its byte position and itself.
fn find_stop<'s>(text: &str, new_from: usize, stops: &'s [String]) -> Option<(usize, &'s String)> {
    let mut best: Option<(usize, &String)> = None;
    for stop in stops.iter().filter(|s| !s.is_empty()) {
        let mut start = new_from.saturating_sub(stop.len() - 1);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        if let Some(i) = text[start..].find(stop.as_str()) {
            let pos = start + i;
            if best.is_none_or(|(b, _)| pos < b) {
                best = Some((pos, stop));
            }
        }
    }
    best
}

/// The token limit of a request: what it asked for (or `default`, else what fits), checked
/// against the context length.
pub fn resolve_max_tokens(
    prompt_tokens: u64,
    requested: Option<u32>,
    default: Option<u32>,
    context_length: u32,
) -> Result<u32, SimError> {
    let ctx = u64::from(context_length);
    if prompt_tokens >= ctx {
        return Err(SimError::BadRequest(format!(
            "The input ({prompt_tokens} tokens) is longer than the model's context length \
             ({ctx} tokens)."
        )));
    }
    let room = (ctx - prompt_tokens) as u32;
    match requested {
        Some(m) if u64::from(m) + prompt_tokens > ctx => Err(SimError::BadRequest(format!(
            "Requested token count exceeds the model's maximum context length of {ctx} tokens. \
             You requested a total of {} tokens: {prompt_tokens} tokens from the input and {m} \
             tokens for the completion. Please reduce the input or the completion length.",
            u64::from(m) + prompt_tokens
        ))),
        Some(m) => Ok(m),
        None => Ok(default.map_or(room, |d| d.min(room))),
    }
}

/// SGLang's checks on temperature and top_p.
pub fn check_sampling(temperature: Option<f64>, top_p: Option<f64>) -> Result<(), SimError> {
    if let Some(t) = temperature.filter(|t| t.is_nan() || *t < 0.0) {
        return Err(SimError::BadRequest(format!(
            "temperature must be non-negative, got {t}."
        )));
    }
    if let Some(p) = top_p.filter(|p| p.is_nan() || *p <= 0.0 || *p > 1.0) {
        return Err(SimError::BadRequest(format!(
            "top_p must be in (0, 1], got {p}."
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(natural: u32, limits: &Limits<'_>) -> Sequence {
        run(Generator::new(42, None, 0), natural, limits)
    }

    #[test]
    fn eos_after_the_natural_length() {
        let s = seq(
            5,
            &Limits {
                max_new_tokens: 100,
                ..Limits::default()
            },
        );
        assert_eq!(s.len(), 6);
        assert_eq!(s.finish, Finish::Eos);
        assert_eq!(s.tokens[5].id, model::EOS_TOKEN_ID);
        assert_eq!(model::count_pieces(&s.text), 5);
        assert_eq!(
            s.finish.openai(),
            (FinishReason::Stop, Some(MatchedStop::Token(2)))
        );
    }

    #[test]
    fn length_wins_over_eos_at_the_same_step() {
        let s = seq(
            5,
            &Limits {
                max_new_tokens: 5,
                ..Limits::default()
            },
        );
        assert_eq!((s.len(), s.finish.clone()), (5, Finish::Length(5)));
        let s = seq(
            5,
            &Limits {
                max_new_tokens: 0,
                ..Limits::default()
            },
        );
        assert!(s.is_empty() && s.text.is_empty());
        let s = seq(
            2,
            &Limits {
                max_new_tokens: 9,
                ignore_eos: true,
                ..Limits::default()
            },
        );
        assert_eq!((s.len(), s.finish), (9, Finish::Length(9)));
        let s = seq(
            2,
            &Limits {
                max_new_tokens: 9,
                min_new_tokens: 4,
                ..Limits::default()
            },
        );
        assert_eq!((s.len(), s.finish), (5, Finish::Eos));
    }

    #[test]
    fn stop_strings_cut_the_text() {
        let full = seq(
            30,
            &Limits {
                max_new_tokens: 30,
                ..Limits::default()
            },
        );
        // Stop at the 4th word (a stop string that spans two tokens).
        let w3 = full.tokens[2].text();
        let w4 = full.tokens[3].text();
        let stop = format!("{}{}", &w3[w3.len() - 1..], &w4[..2]);
        let stops = [stop.clone(), "never-produced".to_owned()];
        let s = seq(
            30,
            &Limits {
                max_new_tokens: 30,
                stop: &stops,
                ..Limits::default()
            },
        );
        assert!(s.len() <= 4, "{}", s.len());
        assert_eq!(s.finish, Finish::StopText(stop.clone()));
        assert!(!s.text.contains(&stop));
        assert!(full.text.starts_with(&s.text));
        let kept = seq(
            30,
            &Limits {
                max_new_tokens: 30,
                stop: &stops,
                no_stop_trim: true,
                ..Limits::default()
            },
        );
        assert!(kept.text.ends_with(&stop));
    }

    #[test]
    fn stop_tokens_end_without_their_text() {
        let full = seq(
            30,
            &Limits {
                max_new_tokens: 30,
                ..Limits::default()
            },
        );
        let id = full.tokens[3].id;
        let ids = [id];
        let s = seq(
            30,
            &Limits {
                max_new_tokens: 30,
                stop_token_ids: &ids,
                ..Limits::default()
            },
        );
        let first = full.tokens.iter().position(|t| t.id == id).unwrap();
        assert_eq!(s.len(), first + 1);
        assert_eq!(s.finish, Finish::StopToken(id));
        let visible: String = full.tokens[..first].iter().map(|t| t.text()).collect();
        assert_eq!(s.text, visible);
    }

    #[test]
    fn context_and_sampling_checks() {
        assert_eq!(resolve_max_tokens(10, Some(5), None, 100).unwrap(), 5);
        assert_eq!(resolve_max_tokens(10, None, Some(128), 100).unwrap(), 90);
        assert_eq!(resolve_max_tokens(10, None, Some(16), 100).unwrap(), 16);
        assert!(resolve_max_tokens(10, Some(91), None, 100).is_err());
        assert!(resolve_max_tokens(100, None, None, 100).is_err());
        check_sampling(Some(0.0), Some(1.0)).unwrap();
        assert!(check_sampling(Some(-1.0), None).is_err());
        assert!(check_sampling(None, Some(0.0)).is_err());
        assert!(check_sampling(Some(f64::NAN), None).is_err());
    }
}
