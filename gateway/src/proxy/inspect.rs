//! Inspect: read the request body (up to `--max-payload-size`) and pull out only what
//! routing needs (`model`, `stream`), borrowing from the bytes. Nothing else is parsed
//! into values: other fields are skipped by the parser (which still rejects malformed
//! JSON with its message), and the original bytes are forwarded unchanged.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, header};
use http_body_util::BodyExt;
use serde::Deserialize;

use crate::error::GatewayError;

/// The fields routing looks at.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
pub struct RoutingFields<'a> {
    /// `model` (absent or `null`: any model). Borrowed from the body unless it has escapes.
    #[serde(borrow, default, deserialize_with = "borrowed_str")]
    pub model: Option<Cow<'a, str>>,
    /// `stream` (absent or `null`: false).
    #[serde(default)]
    pub stream: Option<bool>,
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

impl RoutingFields<'_> {
    /// The model asked for; an empty string counts as none.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref().filter(|m| !m.is_empty())
    }

    /// Whether the client asked for a stream.
    pub fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
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
