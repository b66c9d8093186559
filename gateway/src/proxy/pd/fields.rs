//! What PD routing reads from a request body: the same one-pass, copy-free fields as
//! regular routing ([`RoutingFields`]), seen the PD way: how many items the request carries
//! (each needs its own bootstrap room), whether the prefill side's input logprobs must be
//! merged, and whether the client already sent bootstrap fields (then the body is rewritten
//! instead of spliced, so no key appears twice).

use crate::error::GatewayError;
use crate::proxy::Endpoint;
use crate::proxy::inspect::{RoutingFields, Shape, routing_fields_as};

/// The fields a PD request is routed by.
pub type PdFields<'a> = RoutingFields<'a>;

/// Which logprobs the gateway merges from the prefill side into decode's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeKind {
    /// Nothing to merge.
    None,
    /// SGLang's `meta_info.input_token_logprobs` / `input_top_logprobs` (`/generate`).
    MetaInfo,
    /// OpenAI completions' `logprobs` of the echoed prompt (`echo` with `logprobs`).
    CompletionEcho,
}

impl PdFields<'_> {
    /// `None` for a single request; `Some(n)` for a batch of `n` items, each of which gets
    /// its own bootstrap room: `/generate` with a list of texts or of token-id lists,
    /// `/v1/completions` with a list of prompts, chat with `n > 1`. Bounded by
    /// [`RoutingFields::check`].
    pub fn batch(&self, endpoint: Endpoint) -> Option<usize> {
        match endpoint {
            Endpoint::ChatCompletions => match self.n.count() {
                Some(n) if n > 1 => usize::try_from(n).ok(),
                _ => None,
            },
            // One query, however many documents: one room (as sglang-router sends it).
            Endpoint::Rerank | Endpoint::V1Rerank => None,
            _ => self.prompts(endpoint).1,
        }
    }

    /// What logprobs must be merged for this endpoint.
    pub fn merge(&self, endpoint: Endpoint) -> MergeKind {
        match endpoint {
            Endpoint::Generate if self.return_logprob.any_true() => MergeKind::MetaInfo,
            Endpoint::Completions if self.echo.any_true() && self.logprobs.is_given() => {
                MergeKind::CompletionEcho
            }
            _ => MergeKind::None,
        }
    }

    /// Whether the client sent any bootstrap field itself.
    pub fn has_bootstrap(&self) -> bool {
        [
            &self.bootstrap_host,
            &self.bootstrap_port,
            &self.bootstrap_room,
        ]
        .iter()
        .any(|s| Shape::is_present(s))
    }
}

/// Parses the PD fields of a JSON object body (errors as [`routing_fields_as`] reports them).
pub fn pd_fields(body: &[u8]) -> Result<PdFields<'_>, GatewayError> {
    routing_fields_as(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(body: &str) -> PdFields<'_> {
        pd_fields(body.as_bytes()).unwrap()
    }

    #[test]
    fn batches_by_endpoint() {
        use Endpoint::*;
        for (body, ep, batch) in [
            (r#"{"text":"a"}"#, Generate, None),
            (r#"{"text":["a","b","c"]}"#, Generate, Some(3)),
            (r#"{"text":[]}"#, Generate, Some(0)),
            (r#"{"input_ids":[1,2,3]}"#, Generate, None),
            (r#"{"input_ids":[[1],[2,3]]}"#, Generate, Some(2)),
            (r#"{"text":null,"input_ids":[[1],[2]]}"#, Generate, Some(2)),
            (r#"{"text":"a","input_ids":[[1],[2]]}"#, Generate, None),
            (r#"{"prompt":"x"}"#, Completions, None),
            (r#"{"prompt":[1,2]}"#, Completions, None),
            (r#"{"prompt":["x","y"]}"#, Completions, Some(2)),
            (r#"{"prompt":[[1],[2],[3]],"n":2}"#, Completions, Some(3)),
            (r#"{"messages":[],"n":1}"#, ChatCompletions, None),
            (r#"{"messages":[],"n":4}"#, ChatCompletions, Some(4)),
            (r#"{"messages":[],"n":"x"}"#, ChatCompletions, None),
            // Counts as SGLang's models read them (lax ints).
            (r#"{"messages":[],"n":"3"}"#, ChatCompletions, Some(3)),
            (r#"{"messages":[],"n":2.0}"#, ChatCompletions, Some(2)),
            (r#"{"messages":[],"n":2.5}"#, ChatCompletions, None),
        ] {
            assert_eq!(f(body).batch(ep), batch, "{body}");
        }
    }

    #[test]
    fn merges_and_bootstrap_presence() {
        use Endpoint::*;
        for (body, ep, merge) in [
            (r#"{"return_logprob":true}"#, Generate, MergeKind::MetaInfo),
            (
                r#"{"return_logprob":[false,true]}"#,
                Generate,
                MergeKind::MetaInfo,
            ),
            (r#"{"return_logprob":[false]}"#, Generate, MergeKind::None),
            (
                r#"{"logprobs":0,"echo":true}"#,
                Completions,
                MergeKind::CompletionEcho,
            ),
            (r#"{"logprobs":2}"#, Completions, MergeKind::None),
            (
                r#"{"logprobs":null,"echo":true}"#,
                Completions,
                MergeKind::None,
            ),
            (
                r#"{"logprobs":true,"echo":true}"#,
                ChatCompletions,
                MergeKind::None,
            ),
        ] {
            assert_eq!(f(body).merge(ep), merge, "{body}");
        }
        assert!(!f(r#"{"text":"a"}"#).has_bootstrap());
        assert!(f(r#"{"bootstrap_room":null}"#).has_bootstrap());
        assert!(f(r#"{"bootstrap_room":[1,2]}"#).has_bootstrap());
        let m = f(r#"{"model":"m\u0031","stream":true}"#);
        assert_eq!((m.model(), m.is_stream()), (Some("m1"), true));
    }

    #[test]
    fn bad_json_is_still_refused() {
        assert_eq!(
            pd_fields(b"{\"text\": [1,").unwrap_err().kind_and_code().1,
            "invalid_json"
        );
        assert_eq!(
            pd_fields(br#"{"stream":"yes"}"#)
                .unwrap_err()
                .kind_and_code()
                .1,
            "invalid_request"
        );
    }
}
