//! Inspect: read the request body (up to `--max-payload-size`) and pull out only what
//! routing needs, borrowing from the bytes: `model`, `stream`, and the shape of the fields
//! that say how big the request is ([`shape`]: how many items a batch holds, `n`, logprob
//! alternatives), which are checked against `--max-batch-size` ([`RoutingFields::check`])
//! before anything is sized by them. Nothing else is parsed into values: other fields are
//! skipped by the parser (which still rejects malformed JSON with its message), inspection
//! allocates nothing whatever the body holds, and the original bytes are forwarded
//! unchanged.

pub mod shape;

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, header};
use http_body_util::BodyExt;
use serde::Deserialize;

use super::Endpoint;
use crate::error::GatewayError;
pub use shape::Shape;

/// The fields routing looks at (the PD router reads the same ones, see
/// [`crate::proxy::pd::fields`]). Every field besides `model` and `stream` is read leniently:
/// a value of an unexpected shape counts as "not asked" rather than failing the request (the
/// workers judge the request; the gateway only routes it and bounds it).
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
pub struct RoutingFields<'a> {
    /// `model` (absent or `null`: any model). Borrowed from the body unless it has escapes.
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    pub model: Option<Cow<'a, str>>,
    /// `stream` (absent or `null`: false).
    #[serde(default)]
    pub stream: Option<bool>,
    /// `/generate`'s `text` (a prompt, or a batch of them).
    #[serde(default)]
    pub text: Shape,
    /// `/generate`'s `input_ids` (token ids, or a batch of token-id lists).
    #[serde(default)]
    pub input_ids: Shape,
    /// `/v1/completions`' `prompt`.
    #[serde(default)]
    pub prompt: Shape,
    /// `/v1/embeddings`' and `/v1/classify`'s `input`.
    #[serde(default)]
    pub input: Shape,
    /// Rerank's `documents`.
    #[serde(default)]
    pub documents: Shape,
    /// `/v1/score`'s `items`.
    #[serde(default)]
    pub items: Shape,
    /// `/v1/responses`' `previous_response_id` (the response whose worker holds the state
    /// this request continues).
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    pub previous_response_id: Option<Cow<'a, str>>,
    /// Choices per prompt (chat, completions; for chat in PD mode each is an item).
    #[serde(default)]
    pub n: Shape,
    /// `/generate`'s `sampling_params` (its `n`: samples per item; a list: one per item).
    #[serde(default)]
    pub sampling_params: Shape,
    /// Chat's alternatives per token.
    #[serde(default)]
    pub top_logprobs: Shape,
    /// `logprobs` (completions: alternatives per token; chat: a flag).
    #[serde(default)]
    pub logprobs: Shape,
    /// `/generate`'s alternatives per token (one count, or one per item).
    #[serde(default)]
    pub top_logprobs_num: Shape,
    /// `/generate`'s `return_logprob` (a flag, or one per item).
    #[serde(default)]
    pub return_logprob: Shape,
    /// `echo` (completions: the prompt, and with `logprobs` its logprobs, come back).
    #[serde(default)]
    pub echo: Shape,
    /// A bootstrap field the client sent itself (any value, `null` included).
    #[serde(default)]
    pub bootstrap_host: Shape,
    /// A bootstrap field the client sent itself.
    #[serde(default)]
    pub bootstrap_port: Shape,
    /// A bootstrap field the client sent itself.
    #[serde(default)]
    pub bootstrap_room: Shape,
}

/// `Option<Cow<str>>` that borrows when it can (serde's own `Cow` impl always copies).
pub(crate) fn borrowed_str<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Cow<'de, str>>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string or null")
        }
        fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Borrowed(v)))
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v.to_owned())))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_str(self)
        }
    }
    d.deserialize_option(V)
}

/// An object key, borrowed from the body when it has no escapes (for the passes that
/// look keys up without building values: prompt keys, the PD rewrites).
pub(crate) struct KeyName<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for KeyName<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = KeyName<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<KeyName<'de>, E> {
                Ok(KeyName(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyName<'de>, E> {
                Ok(KeyName(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

impl RoutingFields<'_> {
    /// The model asked for; an empty string counts as none.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref().filter(|m| !m.is_empty())
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// The field holding the prompts and, for a batch, how many it holds (`None`: one
    /// prompt). `text` wins over `input_ids` when both are sent (as SGLang reads them).
    pub fn prompts(&self, endpoint: Endpoint) -> (&'static str, Option<usize>) {
        match endpoint {
            Endpoint::Generate => match self.text {
                Shape::Absent | Shape::Null => ("input_ids", self.input_ids.batch()),
                _ => ("text", self.text.batch()),
            },
            Endpoint::Completions => ("prompt", self.prompt.batch()),
            Endpoint::Embeddings | Endpoint::Classify => ("input", self.input.batch()),
            Endpoint::Tokenize => ("prompt", self.prompt.batch()),
            Endpoint::Rerank | Endpoint::V1Rerank => ("documents", self.documents.batch()),
            Endpoint::Score => ("items", self.items.batch()),
            Endpoint::Detokenize => ("tokens", None),
            Endpoint::Responses => ("input", None),
            Endpoint::ChatCompletions => ("messages", None),
        }
    }

    /// Checks every count of the request against `limit` (`--max-batch-size`): the items
    /// of a batch, samples per item (`n`, `sampling_params.n`), their product, one
    /// `sampling_params` per item, and logprob alternatives. 400 naming the first count over
    /// it.
    pub fn check(&self, endpoint: Endpoint, limit: usize) -> Result<(), GatewayError> {
        let (prompts, items) = self.prompts(endpoint);
        let items = items.map_or(1, |n| n as u64);
        let (samples, n) = match endpoint {
            Endpoint::Generate => ("sampling_params.n", self.sampling_params.max_count()),
            _ => ("n", self.n.count()),
        };
        let n = n.unwrap_or(1);
        let counts = [
            (prompts, Some(items)),
            (samples, Some(n)),
            ("items × n", Some(items.saturating_mul(n))),
            (
                "sampling_params",
                self.sampling_params.list_len().map(|l| l as u64),
            ),
            ("top_logprobs", self.top_logprobs.max_count()),
            ("logprobs", self.logprobs.count()),
            ("top_logprobs_num", self.top_logprobs_num.max_count()),
        ];
        match counts
            .into_iter()
            .find_map(|(field, c)| c.filter(|&c| c > limit as u64).map(|c| (field, c)))
        {
            Some((field, count)) => Err(GatewayError::TooMany {
                field,
                count,
                limit,
            }),
            None => Ok(()),
        }
    }
}

/// Reads the whole body, refusing more than `limit` bytes (413), by `Content-Length`
/// up front when the client sends one.
pub async fn read_body<B>(body: B, headers: &HeaderMap, limit: usize) -> Result<Bytes, GatewayError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    // Most bodies arrive in one frame: keep it as is (no copy); join several only if needed.
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = body.as_mut().frame().await {
        let frame =
            frame.map_err(|e| GatewayError::ClientBody(crate::client::describe(&*e.into())))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        len += data.len();
        if len > limit {
            return Err(GatewayError::PayloadTooLarge { limit });
        }
        match (&mut first, &mut more) {
            (None, _) => first = Some(data),
            (Some(f), None) => {
                let mut joined =
                    BytesMut::with_capacity(declared.map_or(len, |n| n as usize).max(len));
                joined.extend_from_slice(f);
                joined.extend_from_slice(&data);
                more = Some(joined);
            }
            (Some(_), Some(m)) => m.extend_from_slice(&data),
        }
    }
    Ok(match (more, first) {
        (Some(m), _) => m.freeze(),
        (None, Some(f)) => f,
        (None, None) => Bytes::new(),
    })
}

/// Parses the routing fields of a JSON object body.
pub fn routing_fields(body: &[u8]) -> Result<RoutingFields<'_>, GatewayError> {
    routing_fields_as(body)
}

/// Parses the fields `T` names from a JSON object body: 400 with the parser's message
/// when it is not JSON, 400 `invalid_request` when it is not an object or a named field
/// has the wrong type.
pub fn routing_fields_as<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, GatewayError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        Some(_) => {
            // Let the parser name the problem if it is not JSON at all.
            serde_json::from_slice::<serde::de::IgnoredAny>(body)
                .map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
            return Err(GatewayError::InvalidRequest(
                "the request body must be a JSON object".into(),
            ));
        }
        None => {
            return Err(GatewayError::InvalidJson(
                "empty body (expected a JSON object)".into(),
            ));
        }
    }
    serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            GatewayError::InvalidRequest(format!("invalid request: {e}"))
        } else {
            GatewayError::InvalidJson(e.to_string())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    #[test]
    fn reads_only_model_and_stream() {
        let body = br#"{"messages":[{"role":"user","content":"hi \"there\""}],"model":"m\u0031","stream":true,"regex":"[a-z]+","n":{"deep":[1,2,{"x":null}]}}"#;
        let f = routing_fields(body).unwrap();
        assert_eq!(f.model(), Some("m1"));
        assert!(f.is_stream());
        let f = routing_fields(br#"{"text":"x","model":null}"#).unwrap();
        assert_eq!((f.model(), f.is_stream()), (None, false));
        assert_eq!(routing_fields(br#" {"model":""}"#).unwrap().model(), None);
        // No copy unless the string has escapes.
        let plain = routing_fields(br#"{"model":"abc"}"#).unwrap();
        assert!(matches!(plain.model, Some(Cow::Borrowed("abc"))));
    }

    #[test]
    fn malformed_json_gets_the_parsers_message() {
        for (body, code) in [
            (&br#"{"model":"m","#[..], "invalid_json"),
            (b"{\"model\": tru}", "invalid_json"),
            (b"", "invalid_json"),
            (b"not json", "invalid_json"),
            (b"[1,2]", "invalid_request"),
            (br#"{"model":5}"#, "invalid_request"),
            (br#"{"stream":"yes"}"#, "invalid_request"),
        ] {
            let e = routing_fields(body).unwrap_err();
            assert_eq!(
                e.kind_and_code().1,
                code,
                "{}",
                String::from_utf8_lossy(body)
            );
            assert_eq!(e.status().as_u16(), 400);
        }
        let msg = routing_fields(b"{\"model\": tru}").unwrap_err().to_string();
        assert!(msg.contains("line 1 column"), "{msg}");
    }

    proptest::proptest! {
        /// Any bytes at all: an answer (fields or a 400), never a panic.
        #[test]
        fn never_panics_on_arbitrary_bytes(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            if let Err(e) = routing_fields(&body) {
                proptest::prop_assert_eq!(e.status().as_u16(), 400);
            }
        }

        /// Any JSON object with a string model: the model is found, whatever else is there.
        #[test]
        fn finds_the_model_among_arbitrary_fields(
            model in "[a-zA-Z0-9/._\\-]{1,40}",
            extra in proptest::collection::btree_map("[a-z_]{1,8}", "[ -~]{0,20}", 0..6),
        ) {
            let mut v = serde_json::Map::new();
            for (k, x) in &extra {
                v.insert(k.clone(), serde_json::Value::String(x.clone()));
            }
            v.insert("model".into(), serde_json::Value::String(model.clone()));
            let body = serde_json::to_vec(&v).unwrap();
            let f = routing_fields(&body).unwrap();
            proptest::prop_assert_eq!(f.model(), Some(model.as_str()));
        }
    }

    #[tokio::test]
    async fn bodies_in_many_frames_are_joined_and_limited() {
        let chunks = || {
            futures::stream::iter(
                ["{\"mo", "del\":", "\"m\"}"].map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
            )
        };
        let h = HeaderMap::new();
        let b = read_body(Body::from_stream(chunks()), &h, 100)
            .await
            .unwrap();
        assert_eq!(b, Bytes::from(r#"{"model":"m"}"#));
        let e = read_body(Body::from_stream(chunks()), &h, 10)
            .await
            .unwrap_err();
        assert_eq!(e.status().as_u16(), 413);
    }

    #[tokio::test]
    async fn body_limit() {
        let mut h = HeaderMap::new();
        assert_eq!(
            read_body(Body::from("12345"), &h, 5).await.unwrap(),
            Bytes::from("12345")
        );
        let e = read_body(Body::from("123456"), &h, 5).await.unwrap_err();
        assert_eq!(e.status().as_u16(), 413);
        h.insert(header::CONTENT_LENGTH, "999".parse().unwrap());
        assert_eq!(
            read_body(Body::from("1"), &h, 5)
                .await
                .unwrap_err()
                .status()
                .as_u16(),
            413
        );
    }
}
