//! Logprob merging: the prefill worker computed the prompt, so the prompt's logprobs come
//! from its answer; decode's answer carries the output's. When the client asked for
//! prompt logprobs the gateway puts the prefill's into decode's answer, streamed or not.
//!
//! - SGLang `/generate` (`return_logprob`): for each output (by position in a list, by
//!   `index` in a stream), `meta_info.input_token_logprobs` and `input_top_logprobs`
//!   become the prefill's entries followed by decode's own (usually none).
//! - OpenAI `/v1/completions` with `echo` and `logprobs`: each choice's `logprobs`
//!   (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) get the prefill's prompt
//!   entries in front. The prefill's choice ends with the token its prefill forward wrote,
//!   which is decode's first token; when its last entry is decode's first (same token and
//!   logprob) it is dropped, so no token appears twice. In a stream the prompt entries go
//!   into each choice's first chunk.
//!
//! Anything that does not parse as expected is passed through unchanged: a merge never
//! turns a good answer into an error.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value};

use super::fields::MergeKind;

const LOGPROB_KEYS: [&str; 4] = ["tokens", "token_logprobs", "top_logprobs", "text_offset"];
const META_KEYS: [&str; 2] = ["input_token_logprobs", "input_top_logprobs"];

/// The prefill side's prompt logprobs, per output / choice index.
#[derive(Debug, Default)]
pub struct PrefillLogprobs {
    kind: Option<MergeKind>,
    /// index -> the arrays to put in front (META_KEYS or LOGPROB_KEYS order).
    items: HashMap<u64, [Vec<Value>; 4]>,
    /// Choices (completions stream) already given their prompt entries.
    done: HashMap<u64, ()>,
}

impl PrefillLogprobs {
    /// Reads the prefill's answer (`stream`: its SSE body).
    pub fn from_body(kind: MergeKind, body: &[u8], stream: bool) -> Self {
        let mut me = Self {
            kind: Some(kind),
            ..Self::default()
        };
        if kind == MergeKind::None {
            return me;
        }
        if stream {
            for data in sse_data(body) {
                if let Ok(v) = serde_json::from_slice::<Value>(data) {
                    me.absorb(&v, true);
                }
            }
        } else if let Ok(v) = serde_json::from_slice::<Value>(body) {
            me.absorb(&v, false);
        }
        me
    }

    fn absorb(&mut self, v: &Value, stream: bool) {
        match (self.kind, v) {
            (Some(MergeKind::MetaInfo), Value::Array(list)) => {
                for (i, out) in list.iter().enumerate() {
                    self.absorb_meta(i as u64, out);
                }
            }
            (Some(MergeKind::MetaInfo), out @ Value::Object(o)) => {
                let i = o.get("index").and_then(Value::as_u64).unwrap_or(0);
                self.absorb_meta(i, out);
            }
            (Some(MergeKind::CompletionEcho), Value::Object(o)) => {
                let Some(choices) = o.get("choices").and_then(Value::as_array) else {
                    return;
                };
                for c in choices {
                    let (Some(i), Some(lp)) = (
                        c.get("index").and_then(Value::as_u64),
                        c.get("logprobs").and_then(Value::as_object),
                    ) else {
                        continue;
                    };
                    let entry = self.items.entry(i).or_default();
                    for (k, key) in LOGPROB_KEYS.iter().enumerate() {
                        let add = lp
                            .get(*key)
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default();
                        // A stream sends each choice in steps: they add up.
                        if stream {
                            entry[k].extend(add);
                        } else {
                            entry[k] = add;
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn absorb_meta(&mut self, i: u64, out: &Value) {
        let Some(meta) = out.get("meta_info").and_then(Value::as_object) else {
            return;
        };
        let mut arrays: [Vec<Value>; 4] = Default::default();
        for (k, key) in META_KEYS.iter().enumerate() {
            if let Some(a) = meta.get(*key).and_then(Value::as_array) {
                arrays[k] = a.clone();
            }
        }
        self.items.insert(i, arrays);
    }

    /// Whether there is anything to merge.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Decode's whole (non-streamed) answer with the prefill's logprobs merged; `None`
    /// when there is nothing to change (pass it through as it is).
    pub fn merge_whole(&mut self, decode: &[u8]) -> Option<Vec<u8>> {
        if self.items.is_empty() {
            return None;
        }
        let mut v: Value = serde_json::from_slice(decode).ok()?;
        let changed = match (self.kind?, &mut v) {
            (MergeKind::MetaInfo, Value::Array(list)) => {
                let mut any = false;
                for (i, out) in list.iter_mut().enumerate() {
                    any |= self.merge_meta(i as u64, out);
                }
                any
            }
            (MergeKind::MetaInfo, out @ Value::Object(_)) => self.merge_meta(0, out),
            (MergeKind::CompletionEcho, Value::Object(o)) => self.merge_choices(o),
            _ => false,
        };
        if !changed {
            return None;
        }
        serde_json::to_vec(&v).ok()
    }

    /// One streamed event's JSON with the merge applied; `None`: leave it as it is.
    pub fn merge_event(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        if self.items.is_empty() {
            return None;
        }
        let mut v: Value = serde_json::from_slice(data).ok()?;
        let changed = match (self.kind?, &mut v) {
            (MergeKind::MetaInfo, out @ Value::Object(_)) => {
                let i = out.get("index").and_then(Value::as_u64).unwrap_or(0);
                self.merge_meta(i, out)
            }
            (MergeKind::CompletionEcho, Value::Object(o)) => self.merge_choices(o),
            _ => false,
        };
        if !changed {
            return None;
        }
        serde_json::to_vec(&v).ok()
    }

    fn merge_meta(&self, i: u64, out: &mut Value) -> bool {
        let (Some(prefill), Some(meta)) = (
            self.items.get(&i),
            out.get_mut("meta_info").and_then(Value::as_object_mut),
        ) else {
            return false;
        };
        let mut changed = false;
        for (k, key) in META_KEYS.iter().enumerate() {
            if prefill[k].is_empty() && !meta.contains_key(*key) {
                continue;
            }
            let own = match meta.remove(*key) {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            let mut merged = Vec::with_capacity(prefill[k].len() + own.len());
            merged.extend(prefill[k].iter().cloned());
            merged.extend(own);
            meta.insert((*key).to_owned(), Value::Array(merged));
            changed = true;
        }
        changed
    }

    fn merge_choices(&mut self, o: &mut Map<String, Value>) -> bool {
        let Some(choices) = o.get_mut("choices").and_then(Value::as_array_mut) else {
            return false;
        };
        let mut changed = false;
        for c in choices {
            let Some(i) = c.get("index").and_then(Value::as_u64) else {
                continue;
            };
            if self.done.insert(i, ()).is_some() {
                continue;
            }
            let (Some(prefill), Some(lp)) = (
                self.items.get(&i),
                c.get_mut("logprobs").and_then(Value::as_object_mut),
            ) else {
                continue;
            };
            let arr = |lp: &Map<String, Value>, key: &str| {
                lp.get(key)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            };
            let own: Vec<Vec<Value>> = LOGPROB_KEYS.iter().map(|k| arr(lp, k)).collect();
            // The prefill's last entry is decode's first token when token and logprob match.
            let n = prefill[0].len();
            let overlap = n > 0
                && prefill[1].len() == n
                && own[0].first() == prefill[0].last()
                && own[1].first() == prefill[1].last();
            for (k, key) in LOGPROB_KEYS.iter().enumerate() {
                let keep = prefill[k].len().saturating_sub(usize::from(overlap));
                let mut merged = Vec::with_capacity(keep + own[k].len());
                merged.extend(prefill[k][..keep].iter().cloned());
                merged.extend(own[k].iter().cloned());
                lp.insert((*key).to_owned(), Value::Array(merged));
            }
            changed = true;
        }
        changed
    }
}

/// The `data:` payloads of an SSE body (without the `[DONE]` marker).
fn sse_data(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    body.split(|&b| b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let data = line.strip_prefix(b"data:")?;
        let data = data.strip_prefix(b" ").unwrap_or(data);
        (data != b"[DONE]").then_some(data)
    })
}

/// Rewrites a streamed SSE body event by event (events may arrive split across frames).
#[derive(Debug)]
pub struct SseRewriter {
    buf: BytesMut,
    merge: PrefillLogprobs,
}

impl SseRewriter {
    /// A rewriter applying `merge` to each event.
    pub fn new(merge: PrefillLogprobs) -> Self {
        Self {
            buf: BytesMut::new(),
            merge,
        }
    }

    /// Feeds a frame; returns the complete events so far, rewritten.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(self.buf.len() + 256);
        while let Some(end) = find(&self.buf, b"\n\n") {
            let event = self.buf.split_to(end + 2);
            self.rewrite(&event, &mut out);
        }
        Bytes::from(out)
    }

    /// What is left at the end of the body (an event without its blank line).
    pub fn finish(&mut self) -> Bytes {
        let rest = self.buf.split();
        let mut out = Vec::with_capacity(rest.len());
        if !rest.is_empty() {
            self.rewrite(&rest, &mut out);
        }
        Bytes::from(out)
    }

    fn rewrite(&mut self, event: &[u8], out: &mut Vec<u8>) {
        let payload = event
            .strip_prefix(b"data: ")
            .map(|p| p.strip_suffix(b"\n\n").unwrap_or(p))
            .filter(|p| !p.contains(&b'\n'));
        match payload.and_then(|p| self.merge.merge_event(p)) {
            Some(json) => {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&json);
                out.extend_from_slice(b"\n\n");
            }
            None => out.extend_from_slice(event),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Decode's whole answer merged with the prefill's.
    fn merged(kind: MergeKind, prefill: &Value, decode: &Value) -> Value {
        let mut m = PrefillLogprobs::from_body(kind, prefill.to_string().as_bytes(), false);
        let out = m
            .merge_whole(decode.to_string().as_bytes())
            .expect("a merge");
        serde_json::from_slice(&out).expect("JSON")
    }

    fn lp(tokens: &[&str], values: &[f64]) -> Value {
        json!({"tokens": tokens, "token_logprobs": values,
               "top_logprobs": vec![Value::Null; tokens.len()],
               "text_offset": (0..tokens.len()).collect::<Vec<_>>()})
    }

    #[test]
    fn meta_info_single_and_batch() {
        let prefill = json!([
            {"text": " a", "meta_info": {"id": "x", "input_token_logprobs": [[null, 1, null], [-0.5, 7, null]],
              "input_top_logprobs": [null, [[-0.5, 7, null]]], "output_token_logprobs": [[-0.1, 9, null]]}},
            {"text": " b", "meta_info": {"id": "y", "input_token_logprobs": [[null, 1, null]]}}
        ]);
        let decode = json!([
            {"text": " a c", "meta_info": {"id": "x", "input_token_logprobs": [], "input_top_logprobs": [],
              "output_token_logprobs": [[-0.1, 9, null], [-0.2, 3, null]]}},
            {"text": " b d", "meta_info": {"id": "y"}}
        ]);
        let out = merged(MergeKind::MetaInfo, &prefill, &decode);
        assert_eq!(
            out[0]["meta_info"]["input_token_logprobs"],
            json!([[null, 1, null], [-0.5, 7, null]])
        );
        assert_eq!(
            out[0]["meta_info"]["input_top_logprobs"],
            json!([null, [[-0.5, 7, null]]])
        );
        assert_eq!(
            out[0]["meta_info"]["output_token_logprobs"][1],
            json!([-0.2, 3, null])
        );
        assert_eq!(
            out[1]["meta_info"]["input_token_logprobs"],
            json!([[null, 1, null]])
        );
        assert!(out[1]["meta_info"].get("input_top_logprobs").is_none());
        assert_eq!(out[0]["text"], " a c");
    }

    #[test]
    fn meta_info_stream_by_index() {
        let prefill = b"data: {\"index\":1,\"meta_info\":{\"input_token_logprobs\":[[null,5,null]]}}\n\n\
                        data: {\"index\":0,\"meta_info\":{\"input_token_logprobs\":[[null,4,null]]}}\n\ndata: [DONE]\n\n";
        let m = PrefillLogprobs::from_body(MergeKind::MetaInfo, prefill, true);
        let mut rw = SseRewriter::new(m);
        let events = "data: {\"index\":0,\"text\":\"x\",\"meta_info\":{\"input_token_logprobs\":[]}}\n\n\
                      data: {\"index\":1,\"text\":\"y\",\"meta_info\":{}}\n\ndata: [DONE]\n\n";
        // Split at every byte boundary: events are reassembled.
        for cut in 0..events.len() {
            let mut rw2 = SseRewriter::new(PrefillLogprobs::from_body(
                MergeKind::MetaInfo,
                prefill,
                true,
            ));
            let mut out = rw2.push(&events.as_bytes()[..cut]).to_vec();
            out.extend_from_slice(&rw2.push(&events.as_bytes()[cut..]));
            out.extend_from_slice(&rw2.finish());
            let text = String::from_utf8(out).unwrap();
            assert!(
                text.contains("[[null,4,null]]") && text.contains("[[null,5,null]]"),
                "{cut}: {text}"
            );
            assert!(text.ends_with("data: [DONE]\n\n"));
        }
        let out = rw.push(events.as_bytes());
        let first: Value =
            serde_json::from_slice(&out[6..out.iter().position(|&b| b == b'\n').unwrap()]).unwrap();
        assert_eq!(
            first["meta_info"]["input_token_logprobs"],
            json!([[null, 4, null]])
        );
    }

    #[test]
    fn completion_echo_drops_the_shared_first_token() {
        // Prefill: prompt "<s> a b" then its one generated token " x".
        let prefill = json!({"choices": [{"index": 0, "text": "a b x",
            "logprobs": lp(&["<s>", " a", " b", " x"], &[0.0, -1.0, -2.0, -0.5])}]});
        let decode = json!({"choices": [{"index": 0, "text": "a b x y",
            "logprobs": lp(&[" x", " y"], &[-0.5, -0.25])}]});
        let out = merged(MergeKind::CompletionEcho, &prefill, &decode);
        let got = &out["choices"][0]["logprobs"];
        assert_eq!(got["tokens"], json!(["<s>", " a", " b", " x", " y"]));
        assert_eq!(got["token_logprobs"], json!([0.0, -1.0, -2.0, -0.5, -0.25]));
        assert_eq!(got["text_offset"].as_array().unwrap().len(), 5);
        // A prefill that wrote no token: nothing is dropped.
        let prefill =
            json!({"choices": [{"index": 0, "logprobs": lp(&["<s>", " a"], &[0.0, -1.0])}]});
        let out = merged(MergeKind::CompletionEcho, &prefill, &decode);
        assert_eq!(
            out["choices"][0]["logprobs"]["tokens"],
            json!(["<s>", " a", " x", " y"])
        );
    }

    #[test]
    fn completion_echo_stream_goes_into_each_first_chunk() {
        let prefill = "data: {\"choices\":[{\"index\":0,\"logprobs\":{\"tokens\":[\"<s>\",\" a\"],\"token_logprobs\":[null,-1.0],\"top_logprobs\":[null,null],\"text_offset\":[0,0]}}]}\n\n\
                       data: {\"choices\":[{\"index\":0,\"logprobs\":{\"tokens\":[\" x\"],\"token_logprobs\":[-0.5],\"top_logprobs\":[null],\"text_offset\":[2]}}]}\n\ndata: [DONE]\n\n";
        let m = PrefillLogprobs::from_body(MergeKind::CompletionEcho, prefill.as_bytes(), true);
        let mut rw = SseRewriter::new(m);
        let d1 = "data: {\"choices\":[{\"index\":0,\"text\":\"a x\",\"logprobs\":{\"tokens\":[\" x\"],\"token_logprobs\":[-0.5],\"top_logprobs\":[null],\"text_offset\":[2]}}]}\n\n";
        let d2 = "data: {\"choices\":[{\"index\":0,\"text\":\" y\",\"logprobs\":{\"tokens\":[\" y\"],\"token_logprobs\":[-0.25],\"top_logprobs\":[null],\"text_offset\":[4]}}]}\n\n";
        let o1 = String::from_utf8(rw.push(d1.as_bytes()).to_vec()).unwrap();
        let o2 = String::from_utf8(rw.push(d2.as_bytes()).to_vec()).unwrap();
        assert!(o1.contains(r#""tokens":["<s>"," a"," x"]"#), "{o1}");
        assert_eq!(o2, d2, "later chunks pass through byte for byte");
        let v: Value = serde_json::from_str(o2.trim_start_matches("data: ").trim()).unwrap();
        assert_eq!(v["choices"][0]["logprobs"]["tokens"], json!([" y"]));
    }

    #[test]
    fn unexpected_shapes_pass_through() {
        let mut m = PrefillLogprobs::from_body(MergeKind::MetaInfo, b"not json", false);
        assert!(m.is_empty());
        assert!(m.merge_whole(b"[1,2]").is_none());
        assert!(m.merge_whole(b"oops").is_none());
        let mut rw = SseRewriter::new(m);
        let ev = b": comment\n\ndata: [DONE]\n\n";
        assert_eq!(&rw.push(ev)[..], &ev[..]);
    }
}
