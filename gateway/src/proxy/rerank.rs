//! The rerank envelope: a worker answers `/v1/rerank` with a bare list of results (best
//! first); the gateway answers `/rerank` and `/v1/rerank` as sglang-router does, with
//! `{results, model, object: "rerank", id, created}`, keeping the best `top_k` results and
//! dropping each result's document when `return_documents` is false.
//!
//! Only the answer is rewritten; the request reaches the worker unchanged. An answer that
//! is not a list of results (a worker already answering in this envelope, or an error) is
//! relayed as it came.

use openapi::openai::rerank::RerankResult;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::body::{Overflow, Rewrite, Whole};

/// What the envelope takes from the request.
#[derive(Debug, Default, Deserialize)]
struct Asked {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    top_k: Option<serde_json::Value>,
    #[serde(default)]
    return_documents: Option<serde_json::Value>,
    #[serde(default)]
    rid: Option<serde_json::Value>,
}

/// The envelope settings read from a request body.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    model: Option<String>,
    top_k: Option<usize>,
    documents: bool,
    rid: Option<serde_json::Value>,
}

impl Envelope {
    /// Reads `model`, `top_k`, `return_documents` and `rid` from `body` (a value of another
    /// type counts as not sent: the worker judges the request).
    pub fn of(body: &[u8]) -> Self {
        let a: Asked = serde_json::from_slice(body).unwrap_or_default();
        Self {
            model: a.model.filter(|m| !m.is_empty()),
            top_k: a
                .top_k
                .and_then(|k| k.as_u64())
                .and_then(|k| usize::try_from(k).ok()),
            documents: a.return_documents.and_then(|d| d.as_bool()).unwrap_or(true),
            rid: a.rid.filter(|r| !r.is_null()),
        }
    }

    /// The envelope around `answer` (a worker's list of results), or `None` when `answer`
    /// is not one. `served` names the model when the request did not. Results are copied
    /// as the worker wrote them unless their documents are dropped.
    pub fn wrap(
        &self,
        answer: &[u8],
        served: impl FnOnce() -> String,
        created: u64,
    ) -> Option<Vec<u8>> {
        /// What makes an element a result.
        #[derive(Deserialize)]
        struct Head {
            #[allow(dead_code)]
            score: f64,
            #[allow(dead_code)]
            index: u64,
        }
        let mut raw: Vec<&RawValue> = serde_json::from_slice(answer).ok()?;
        for r in &raw {
            serde_json::from_str::<Head>(r.get()).ok()?;
        }
        if let Some(k) = self.top_k {
            raw.truncate(k);
        }
        let model = match &self.model {
            Some(m) => m.clone(),
            None => served(),
        };
        let mut out = Vec::with_capacity(answer.len() + 128);
        out.extend_from_slice(b"{\"results\":[");
        for (i, r) in raw.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            if self.documents {
                out.extend_from_slice(r.get().as_bytes());
            } else {
                let mut full: RerankResult = serde_json::from_str(r.get()).ok()?;
                full.document = None;
                serde_json::to_writer(&mut out, &full).ok()?;
            }
        }
        out.extend_from_slice(b"],\"model\":");
        serde_json::to_writer(&mut out, &model).ok()?;
        out.extend_from_slice(b",\"object\":\"rerank\",\"id\":");
        serde_json::to_writer(&mut out, &self.rid).ok()?;
        out.extend_from_slice(format!(",\"created\":{created}}}").as_bytes());
        Some(out)
    }

    /// A rewrite of a whole answer (held up to `limit` bytes; a larger one passes
    /// unchanged) into the envelope.
    pub fn rewrite<S>(self, served: S, limit: usize) -> Box<dyn Rewrite>
    where
        S: FnOnce() -> String + Send + 'static,
    {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Box::new(Whole::new(
            limit,
            Overflow::PassThrough,
            move |b: &[u8]| self.wrap(b, served, created),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = r#"[{"score":0.9,"document":"b","index":1,"meta_info":{"n":3}},
        {"score":0.2,"document":"a","index":0}]"#;

    fn wrap(req: &str) -> serde_json::Value {
        let out = Envelope::of(req.as_bytes())
            .wrap(ANSWER.as_bytes(), || "served".into(), 7)
            .unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn wraps_cuts_and_drops_documents() {
        let v = wrap(r#"{"query":"q","documents":["a","b"],"model":"m","rid":"r1"}"#);
        assert_eq!(v["object"], "rerank");
        assert_eq!(v["model"], "m");
        assert_eq!(v["id"], "r1");
        assert_eq!(v["created"], 7);
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
        assert_eq!(v["results"][0]["index"], 1);
        assert_eq!(v["results"][0]["meta_info"]["n"], 3);
        assert_eq!(v["results"][0]["document"], "b");
        // The envelope is the wire type's.
        let typed: openapi::openai::rerank::RerankResponse = serde_json::from_value(v).unwrap();
        assert_eq!(typed.results[1].index, 0);

        let v = wrap(r#"{"query":"q","top_k":1,"return_documents":false}"#);
        assert_eq!(v["model"], "served");
        assert_eq!(v["id"], serde_json::Value::Null);
        assert_eq!(v["results"].as_array().unwrap().len(), 1);
        assert!(v["results"][0].get("document").is_none());
    }

    #[test]
    fn odd_requests_and_answers() {
        // Values of the wrong type count as not sent.
        let v = wrap(r#"{"top_k":"x","return_documents":3,"model":""}"#);
        assert_eq!(v["results"].as_array().unwrap().len(), 2);
        assert_eq!(v["model"], "served");
        assert_eq!(wrap("not json")["results"][1]["document"], "a");
        // Not a list of results: relayed unchanged.
        let e = Envelope::of(b"{}");
        let s = || "s".to_string();
        assert_eq!(e.wrap(br#"{"results":[]}"#, s, 0), None);
        assert_eq!(e.wrap(b"[{\"score\":1}]", s, 0), None);
    }
}
