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
//! Nothing is parsed into values ([`super::raw`]): the prefill's entries are kept as byte
//! ranges of its answer, and decode's answer is written again with only the merged arrays
//! changed, every other byte copied; the work and the memory are proportional to the two
//! answers. Anything that does not parse as expected is passed through unchanged: a merge
//! never turns a good answer into an error.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use serde_json::Value;
use serde_json::value::RawValue;

use super::fields::MergeKind;
use super::raw::{self, Members};
use crate::proxy::body::Rewrite;

const LOGPROB_KEYS: [&str; 4] = ["tokens", "token_logprobs", "top_logprobs", "text_offset"];
const META_KEYS: [&str; 2] = ["input_token_logprobs", "input_top_logprobs"];

/// A JSON array's elements, as byte ranges of the prefill's answer.
type Entries = Vec<Range<usize>>;

/// The prefill side's prompt logprobs, per output / choice index.
#[derive(Debug)]
pub struct PrefillLogprobs {
    kind: MergeKind,
    /// The prefill's answer, which the entries point into.
    body: Bytes,
    /// index -> the arrays to put in front (META_KEYS or LOGPROB_KEYS order).
    items: HashMap<u64, [Entries; 4]>,
    /// Choices (completions stream) already given their prompt entries.
    done: HashSet<u64>,
}

impl PrefillLogprobs {
    /// Reads the prefill's answer (`stream`: its SSE body).
    pub fn from_body(kind: MergeKind, body: Bytes, stream: bool) -> Self {
        let mut me = Self {
            kind,
            body: Bytes::new(),
            items: HashMap::new(),
            done: HashSet::new(),
        };
        if kind == MergeKind::None {
            return me;
        }
        let base = body.as_ptr() as usize;
        // A range of the body from a value read out of it.
        let at = |v: &RawValue| {
            let start = v.get().as_ptr() as usize - base;
            start..start + v.get().len()
        };
        if stream {
            for data in sse_data(&body) {
                if let Ok(v) = serde_json::from_slice::<&RawValue>(data) {
                    me.absorb(v, true, &at);
                }
            }
        } else if let Ok(v) = serde_json::from_slice::<&RawValue>(&body) {
            me.absorb(v, false, &at);
        }
        me.body = body;
        me
    }

    fn absorb(&mut self, v: &RawValue, stream: bool, at: &impl Fn(&RawValue) -> Range<usize>) {
        match self.kind {
            MergeKind::MetaInfo => {
                if let Some(list) = raw::array(v.get()) {
                    for (i, out) in list.into_iter().enumerate() {
                        self.absorb_meta(i as u64, out, at);
                    }
                } else if let Some(o) = raw::object(v.get()) {
                    let i = raw::get(&o, "index").and_then(raw::as_u64).unwrap_or(0);
                    self.absorb_meta(i, v, at);
                }
            }
            MergeKind::CompletionEcho => {
                let Some(choices) = raw::object(v.get())
                    .and_then(|o| raw::get(&o, "choices"))
                    .and_then(|c| raw::array(c.get()))
                else {
                    return;
                };
                for c in choices {
                    let Some(c) = raw::object(c.get()) else {
                        continue;
                    };
                    let (Some(i), Some(lp)) = (
                        raw::get(&c, "index").and_then(raw::as_u64),
                        raw::get(&c, "logprobs").and_then(|l| raw::object(l.get())),
                    ) else {
                        continue;
                    };
                    let entry = self.items.entry(i).or_default();
                    for (k, key) in LOGPROB_KEYS.iter().enumerate() {
                        let add = elements(&lp, key).into_iter().map(at);
                        // A stream sends each choice in steps: they add up.
                        if !stream {
                            entry[k].clear();
                        }
                        entry[k].extend(add);
                    }
                }
            }
            MergeKind::None => {}
        }
    }

    fn absorb_meta(&mut self, i: u64, out: &RawValue, at: &impl Fn(&RawValue) -> Range<usize>) {
        let Some(meta) = raw::object(out.get())
            .and_then(|o| raw::get(&o, "meta_info"))
            .and_then(|m| raw::object(m.get()))
        else {
            return;
        };
        let mut arrays: [Entries; 4] = Default::default();
        for (k, key) in META_KEYS.iter().enumerate() {
            arrays[k] = elements(&meta, key).into_iter().map(at).collect();
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
        let v = serde_json::from_slice::<&RawValue>(decode).ok()?;
        match self.kind {
            MergeKind::MetaInfo => match raw::array(v.get()) {
                Some(list) => {
                    let new: Vec<Option<Vec<u8>>> = list
                        .iter()
                        .enumerate()
                        .map(|(i, out)| self.merge_meta(i as u64, out))
                        .collect();
                    if new.iter().all(Option::is_none) {
                        return None;
                    }
                    let mut out = Vec::with_capacity(decode.len() + self.body.len());
                    raw::write_array(&mut out, &list, &new);
                    Some(out)
                }
                None => self.merge_meta(0, v),
            },
            MergeKind::CompletionEcho => self.merge_choices(v),
            MergeKind::None => None,
        }
    }

    /// One streamed event's JSON with the merge applied; `None`: leave it as it is.
    pub fn merge_event(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        if self.items.is_empty() {
            return None;
        }
        let v = serde_json::from_slice::<&RawValue>(data).ok()?;
        match self.kind {
            MergeKind::MetaInfo => {
                let o = raw::object(v.get())?;
                let i = raw::get(&o, "index").and_then(raw::as_u64).unwrap_or(0);
                self.merge_meta(i, v)
            }
            MergeKind::CompletionEcho => self.merge_choices(v),
            MergeKind::None => None,
        }
    }

    /// The text of the prefill's entry `r`.
    fn entry(&self, r: &Range<usize>) -> &[u8] {
        self.body.get(r.clone()).unwrap_or_default()
    }

    /// `[prefill entries..., own...]`.
    fn joined(&self, prefill: &[Range<usize>], own: &[&RawValue]) -> Vec<u8> {
        let len: usize = prefill.iter().map(|r| r.len() + 1).sum::<usize>()
            + own.iter().map(|v| v.get().len() + 1).sum::<usize>();
        let mut out = Vec::with_capacity(len + 2);
        out.push(b'[');
        let parts = prefill
            .iter()
            .map(|r| self.entry(r))
            .chain(own.iter().map(|v| v.get().as_bytes()));
        for (i, p) in parts.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(p);
        }
        out.push(b']');
        out
    }

    /// One output with its `meta_info` merged (`None`: unchanged).
    fn merge_meta(&self, i: u64, out: &RawValue) -> Option<Vec<u8>> {
        let prefill = self.items.get(&i)?;
        let o = raw::object(out.get())?;
        let meta = raw::object(raw::get(&o, "meta_info")?.get())?;
        let mut replace = Vec::new();
        for (k, key) in META_KEYS.iter().enumerate() {
            if prefill[k].is_empty() && raw::get(&meta, key).is_none() {
                continue;
            }
            let own = elements(&meta, key);
            replace.push((*key, self.joined(&prefill[k], &own)));
        }
        if replace.is_empty() {
            return None;
        }
        let mut new_meta = Vec::new();
        raw::write_object(&mut new_meta, &meta, &replace);
        let mut new = Vec::with_capacity(out.get().len() + new_meta.len());
        raw::write_object(&mut new, &o, &[("meta_info", new_meta)]);
        Some(new)
    }

    /// An answer (or event) with its choices' logprobs merged (`None`: unchanged).
    fn merge_choices(&mut self, v: &RawValue) -> Option<Vec<u8>> {
        let o = raw::object(v.get())?;
        let choices = raw::array(raw::get(&o, "choices")?.get())?;
        let mut new_choices: Vec<Option<Vec<u8>>> = Vec::with_capacity(choices.len());
        for c in &choices {
            new_choices.push(self.merge_choice(c));
        }
        if new_choices.iter().all(Option::is_none) {
            return None;
        }
        let mut list = Vec::new();
        raw::write_array(&mut list, &choices, &new_choices);
        let mut out = Vec::with_capacity(v.get().len() + list.len());
        raw::write_object(&mut out, &o, &[("choices", list)]);
        Some(out)
    }

    /// One choice with the prompt entries in front of its logprobs, the first time it is
    /// seen (`None`: unchanged).
    fn merge_choice(&mut self, c: &RawValue) -> Option<Vec<u8>> {
        let c = raw::object(c.get())?;
        let i = raw::get(&c, "index").and_then(raw::as_u64)?;
        if !self.done.insert(i) {
            return None;
        }
        let prefill = self.items.get(&i)?;
        let lp = raw::object(raw::get(&c, "logprobs")?.get())?;
        let own: Vec<Vec<&RawValue>> = LOGPROB_KEYS.iter().map(|k| elements(&lp, k)).collect();
        // The prefill's last entry is decode's first token when token and logprob match.
        let n = prefill[0].len();
        let same = |own: Option<&&RawValue>, last: Option<&Range<usize>>| match (own, last) {
            (Some(a), Some(b)) => {
                let a = serde_json::from_str::<Value>(a.get()).ok();
                let b = serde_json::from_slice::<Value>(self.entry(b)).ok();
                a.is_some() && a == b
            }
            _ => false,
        };
        let overlap = n > 0
            && prefill[1].len() == n
            && same(own[0].first(), prefill[0].last())
            && same(own[1].first(), prefill[1].last());
        let replace: Vec<(&str, Vec<u8>)> = LOGPROB_KEYS
            .iter()
            .enumerate()
            .map(|(k, key)| {
                let keep = prefill[k].len().saturating_sub(usize::from(overlap));
                (*key, self.joined(&prefill[k][..keep], &own[k]))
            })
            .collect();
        let mut new_lp = Vec::new();
        raw::write_object(&mut new_lp, &lp, &replace);
        let mut out = Vec::new();
        raw::write_object(&mut out, &c, &[("logprobs", new_lp)]);
        Some(out)
    }
}

/// The elements of `members[key]` when it is an array (else none).
fn elements<'a>(members: &Members<'a>, key: &str) -> Vec<&'a RawValue> {
    raw::get(members, key)
        .and_then(|v| raw::array(v.get()))
        .unwrap_or_default()
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
    /// Bytes of `buf` already searched for an event's end.
    scanned: usize,
    merge: PrefillLogprobs,
}

impl SseRewriter {
    /// A rewriter applying `merge` to each event.
    pub fn new(merge: PrefillLogprobs) -> Self {
        Self {
            buf: BytesMut::new(),
            scanned: 0,
            merge,
        }
    }

    /// Feeds a frame; returns the complete events so far, rewritten.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::with_capacity(self.buf.len() + 256);
        // An event's end may straddle two frames: look again from one byte back.
        while let Some(end) = find(&self.buf[self.scanned.saturating_sub(1)..], b"\n\n")
            .map(|e| e + self.scanned.saturating_sub(1))
        {
            let event = self.buf.split_to(end + 2);
            self.scanned = 0;
            self.rewrite(&event, &mut out);
        }
        self.scanned = self.buf.len();
        Bytes::from(out)
    }

    /// What is left at the end of the body (an event without its blank line).
    pub fn finish(&mut self) -> Bytes {
        let rest = self.buf.split();
        self.scanned = 0;
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

impl Rewrite for SseRewriter {
    fn push(&mut self, chunk: &[u8]) -> Bytes {
        SseRewriter::push(self, chunk)
    }

    fn finish(&mut self) -> Bytes {
        SseRewriter::finish(self)
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
        let mut m = PrefillLogprobs::from_body(kind, Bytes::from(prefill.to_string()), false);
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
        let m = PrefillLogprobs::from_body(MergeKind::MetaInfo, Bytes::from_static(prefill), true);
        let mut rw = SseRewriter::new(m);
        let events = "data: {\"index\":0,\"text\":\"x\",\"meta_info\":{\"input_token_logprobs\":[]}}\n\n\
                      data: {\"index\":1,\"text\":\"y\",\"meta_info\":{}}\n\ndata: [DONE]\n\n";
        // Split at every byte boundary: events are reassembled.
        for cut in 0..events.len() {
            let mut rw2 = SseRewriter::new(PrefillLogprobs::from_body(
                MergeKind::MetaInfo,
                Bytes::from_static(prefill),
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
        let m = PrefillLogprobs::from_body(
            MergeKind::CompletionEcho,
            Bytes::from_static(prefill.as_bytes()),
            true,
        );
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
        let mut m =
            PrefillLogprobs::from_body(MergeKind::MetaInfo, Bytes::from_static(b"not json"), false);
        assert!(m.is_empty());
        assert!(m.merge_whole(b"[1,2]").is_none());
        assert!(m.merge_whole(b"oops").is_none());
        let mut rw = SseRewriter::new(m);
        let ev = b": comment\n\ndata: [DONE]\n\n";
        assert_eq!(&rw.push(ev)[..], &ev[..]);
    }
}
