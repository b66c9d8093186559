//! The response-id tap: reads the id of a Responses API answer on its way to the client
//! (passing every byte through unchanged) and remembers which worker holds it
//! ([`crate::select::responses::ResponseHomes`]).
//!
//! A JSON answer's id is its top-level `id`, read when the body ends (its frames are kept,
//! not copied, up to [`HOLD_LIMIT`]; SGLang writes `id` first, which is read without
//! parsing the rest); a streamed answer's is the `response.id` of its first event
//! (`response.created`), read as soon as that event is complete, so a follow-up sent while
//! the stream is still running already reaches the right worker.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;

use super::body::Rewrite;
use crate::select::responses::ResponseHomes;

/// The most bytes of an answer scanned for its id.
pub const HOLD_LIMIT: usize = 4 * 1024 * 1024;

#[derive(Deserialize)]
struct WithId {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    response: Option<Box<WithId>>,
}

/// The rewrite (see the module doc).
pub struct IdTap {
    homes: Arc<ResponseHomes>,
    worker: String,
    stream: bool,
    /// A stream's bytes until its first event is complete.
    held: BytesMut,
    /// A JSON answer's frames.
    frames: Vec<Bytes>,
    /// Bytes kept so far.
    kept: usize,
    /// Found, or given up (over the bound).
    done: bool,
}

impl IdTap {
    /// A tap binding what it reads to `worker` (a URL) in `homes`.
    pub fn new(homes: Arc<ResponseHomes>, worker: String, stream: bool) -> Self {
        Self {
            homes,
            worker,
            stream,
            held: BytesMut::new(),
            frames: Vec::new(),
            kept: 0,
            done: false,
        }
    }

    fn bind(&mut self, json: &[u8]) -> bool {
        if let Some(id) = leading_id(json) {
            self.homes.bind(id, &self.worker);
            return true;
        }
        let Ok(v) = serde_json::from_slice::<WithId>(json) else {
            return false;
        };
        let id = match v.response {
            Some(r) => r.id,
            None => v.id,
        };
        match id {
            Some(id) => {
                self.homes.bind(&id, &self.worker);
                true
            }
            None => false,
        }
    }

    /// Looks for the first complete `data:` line of an event stream.
    fn scan_events(&mut self) {
        while let Some(end) = self.held.iter().position(|&b| b == b'\n') {
            let line = self.held.split_to(end + 1);
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(data) = line.strip_prefix(b"data:") {
                let data = data.trim_ascii();
                if self.bind(data) {
                    self.done = true;
                    self.held = BytesMut::new();
                    return;
                }
            }
        }
    }
}

/// The id of an object whose first member is a plain `"id"` string (no escapes), as
/// SGLang writes a response: `{"id":"resp_...",...`.
fn leading_id(json: &[u8]) -> Option<&str> {
    let rest = json
        .trim_ascii_start()
        .strip_prefix(b"{")?
        .trim_ascii_start();
    let rest = rest.strip_prefix(b"\"id\"")?.trim_ascii_start();
    let rest = rest
        .strip_prefix(b":")?
        .trim_ascii_start()
        .strip_prefix(b"\"")?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    (rest[end] == b'"')
        .then(|| std::str::from_utf8(&rest[..end]).ok())
        .flatten()
}

impl Rewrite for IdTap {
    fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.push_bytes(Bytes::copy_from_slice(chunk))
    }

    fn push_bytes(&mut self, chunk: Bytes) -> Bytes {
        if self.done {
            return chunk;
        }
        self.kept += chunk.len();
        if self.kept > HOLD_LIMIT {
            self.done = true;
            self.held = BytesMut::new();
            self.frames = Vec::new();
        } else if self.stream {
            self.held.extend_from_slice(&chunk);
            self.scan_events();
        } else {
            self.frames.push(chunk.clone());
        }
        chunk
    }

    fn finish(&mut self) -> Bytes {
        if !self.done {
            self.done = true;
            if self.stream {
                self.held.extend_from_slice(b"\n");
                self.scan_events();
            } else {
                let frames = std::mem::take(&mut self.frames);
                match frames.as_slice() {
                    [one] => self.bind(one),
                    many => self.bind(&many.concat()),
                };
            }
        }
        Bytes::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stream: bool, chunks: &[&str]) -> (Arc<ResponseHomes>, Vec<u8>) {
        let homes = Arc::new(ResponseHomes::new(8));
        let mut tap = IdTap::new(homes.clone(), "http://w".into(), stream);
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&tap.push(c.as_bytes()));
        }
        out.extend_from_slice(&tap.finish());
        (homes, out)
    }

    #[test]
    fn json_answers_bind_their_top_level_id() {
        let (homes, out) = run(
            false,
            &[
                r#"{"output":[{"id":"msg_1"}],"#,
                r#""id":"resp_a","status":"completed"}"#,
            ],
        );
        assert_eq!(homes.home("resp_a").as_deref(), Some("http://w"));
        assert_eq!(homes.home("msg_1"), None);
        assert!(out.ends_with(b"\"completed\"}"));
        let (homes, _) = run(false, &["not json"]);
        assert!(homes.is_empty());
    }

    #[test]
    fn streams_bind_at_their_first_event() {
        let homes = Arc::new(ResponseHomes::new(8));
        let mut tap = IdTap::new(homes.clone(), "http://w".into(), true);
        let first = "event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_s\",\"output\":[]}}\r\n\r\n";
        let (a, b) = first.split_at(40);
        assert_eq!(&tap.push(a.as_bytes())[..], a.as_bytes());
        assert!(homes.is_empty());
        tap.push(b.as_bytes());
        // Bound before the stream ends.
        assert_eq!(homes.home("resp_s").as_deref(), Some("http://w"));
        tap.push(b"data: {\"response\":{\"id\":\"resp_other\"}}\n\n");
        tap.finish();
        assert_eq!(homes.home("resp_other"), None);
    }

    #[test]
    fn a_leading_id_is_read_without_a_parse() {
        assert_eq!(leading_id(br#" { "id" : "resp_1","x":[}"#), Some("resp_1"));
        assert_eq!(leading_id(br#"{"id":"a\"b"}"#), None);
        assert_eq!(leading_id(br#"{"object":"response","id":"r"}"#), None);
        assert_eq!(leading_id(br#"{"id":"unterminated"#), None);
        let (homes, _) = run(false, &[r#"{"id":"resp_f","#, r#""status":"done"}"#]);
        assert_eq!(homes.home("resp_f").as_deref(), Some("http://w"));
    }

    #[test]
    fn gives_up_past_its_bound() {
        let big = format!(r#"{{"pad":"{}","id":"resp_b"}}"#, "x".repeat(HOLD_LIMIT));
        let (homes, out) = run(false, &[&big]);
        assert!(homes.is_empty());
        assert_eq!(out.len(), big.len());
    }
}
