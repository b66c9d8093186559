//! Prompt keys: the bytes a prefix-aware policy (`cache_aware`) routes by, read from the
//! request body in one pass, only when such a policy is in use.
//!
//! - chat (`/v1/chat/completions`): the `messages`, flattened in order: every string in
//!   them (roles, contents, content parts' text) followed by a `0x1f` separator, so the
//!   key grows the way the rendered conversation does;
//! - completions: `prompt`; embeddings: `input`; `/generate`: `text`, or `input_ids` when
//!   there is no text;
//! - a string is its UTF-8 bytes; a token id is four little-endian bytes (numbers appear
//!   only in token-id prompts); a list (a batch) is its items in order.
//!
//! The key starts with a tag byte (`c` chat, `t` text prompt, `i` token ids) so the three
//! kinds never share a prefix, and is cut at [`MAX_KEY_BYTES`] (the prefix is what
//! matters; matching stays cheap). A body this pass cannot read yields no key (the policy
//! then balances by load); the proxy's own parse already rejected malformed JSON.
//!
//! A request that names a cache namespace (LoRA adapter, `cache_salt`, `extra_key`) gets
//! its key scoped to it ([`crate::select::namespace`]): no two namespaces share a prefix.
//!
//! With a tokenizer (`--tokenizer-path`, for `kv_aware`), [`routing_key`] gives text and
//! chat prompts an `i` key too: the token ids the worker computes for them
//! ([`sglang::tokenizer`]), from at most [`MAX_KEY_BYTES`] of the text (or the rendered
//! chat; when cut, its last id is dropped), or a chat request's own `input_ids`. A batch
//! of text prompts is keyed by its first. A prompt the tokenizer cannot take (a template
//! that refuses its roles, a body over [`MAX_TOKENIZE_BODY_BYTES`]) keeps the key above.

use std::fmt;
use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::Endpoint;
use super::inspect::KeyName;
use crate::select::namespace;
use sglang::tokenizer::{ChatText, Tokenizer};

/// Longest key kept, in bytes.
pub const MAX_KEY_BYTES: usize = 64 * 1024;

const SEPARATOR: u8 = 0x1f;

/// The prompt key of a request body (see the module doc), if it has one.
pub fn prompt_key(endpoint: Endpoint, body: &[u8]) -> Option<Vec<u8>> {
    if matches!(endpoint, Endpoint::Tokenize | Endpoint::Detokenize) {
        return None; // nothing is computed, nothing cached: no key to route by
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Top { endpoint }.deserialize(&mut de).ok()?;
    let (tag, flat) = match (endpoint, found) {
        (Endpoint::ChatCompletions, Found { main, .. }) => (b'c', main),
        (_, Found { main, fallback }) => {
            let flat = if main.bytes.is_empty() && !main.numeric {
                fallback
            } else {
                main
            };
            (if flat.numeric { b'i' } else { b't' }, flat)
        }
    };
    if flat.bytes.is_empty() {
        return None;
    }
    let mut key = Vec::with_capacity(flat.bytes.len() + 1);
    key.push(tag);
    key.extend_from_slice(&flat.bytes);
    key.truncate(MAX_KEY_BYTES);
    Some(key)
}

/// Bodies above this size are not tokenized (their text key routes them): what a request
/// may make the gateway parse, render and encode stays bounded.
pub const MAX_TOKENIZE_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Bodies up to this size are first keyed on the runtime thread from the tokenizer's
/// pieces cache alone. Parsing and rendering them costs microseconds for a real chat; the
/// bound keeps what a hostile body (hundreds of empty messages) can make the runtime
/// thread render small, and longer prompts go to the blocking pool whole.
pub const MAX_INLINE_BODY_BYTES: usize = 16 * 1024;

/// [`routing_key`], tokenizing on the blocking pool (encoding runs at a few MB/s: a long
/// prompt must not hold up the runtime's other connections), at most one tokenization per
/// CPU at a time. A prompt given as token ids, or a request without a tokenizer, is keyed
/// inline by [`prompt_key`] alone.
pub async fn routing_key_off_thread(
    endpoint: Endpoint,
    body: &bytes::Bytes,
    tokenizer: Option<&Arc<Tokenizer>>,
) -> Option<Vec<u8>> {
    let key = unscoped_key_off_thread(endpoint, body, tokenizer).await?;
    Some(namespace::scoped(key, namespace::of(body)))
}

/// [`routing_key_off_thread`] before its namespace ([`namespace`]) is put in front.
async fn unscoped_key_off_thread(
    endpoint: Endpoint,
    body: &bytes::Bytes,
    tokenizer: Option<&Arc<Tokenizer>>,
) -> Option<Vec<u8>> {
    static PERMITS: std::sync::LazyLock<tokio::sync::Semaphore> = std::sync::LazyLock::new(|| {
        tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))
    });
    let key = TextKey::new(endpoint, body, tokenizer.is_some());
    let Some(t) = tokenizer.filter(|_| key.wants_tokens(body)) else {
        return key.read();
    };
    // A prompt whose every piece the tokenizer has encoded before is keyed here, without
    // the hop to the blocking pool; any other goes there to be encoded (what was parsed
    // and rendered here goes with it).
    let mut prepared = None;
    if body.len() <= MAX_INLINE_BODY_BYTES && (t.caches_pieces() || t.remembers_chats()) {
        let p = match prepare(endpoint, body, t) {
            Ok(p) => p,
            Err(e) => return or_text_key(Err(e), key),
        };
        match encode_prepared(&p, t, Tokenizer::encode_cached) {
            Err(sglang::tokenizer::TokenizerError::NotCached) => prepared = Some(p),
            tokens => return or_text_key(tokens, key),
        }
    }
    let Ok(_permit) = PERMITS.acquire().await else {
        return key.read();
    };
    let (t, b) = (t.clone(), body.clone());
    let encode = move || match prepared {
        Some(p) => encode_prepared(&p, &t, Tokenizer::encode),
        None => token_key(endpoint, &b, &t),
    };
    match tokio::task::spawn_blocking(encode).await {
        Ok(tokens) => or_text_key(tokens, key),
        Err(e) => {
            tracing::warn!(error = %e, "tokenizing a prompt failed; routed by its text");
            key.read()
        }
    }
}

/// The key a prefix-aware policy routes by: the token ids `tokenizer` gives the prompt
/// when there is one and it can, else [`prompt_key`].
pub fn routing_key(
    endpoint: Endpoint,
    body: &[u8],
    tokenizer: Option<&Tokenizer>,
) -> Option<Vec<u8>> {
    let key = TextKey::new(endpoint, body, tokenizer.is_some());
    let key = match tokenizer.filter(|_| key.wants_tokens(body)) {
        Some(t) => or_text_key(token_key(endpoint, body, t), key),
        None => key.read(),
    }?;
    Some(namespace::scoped(key, namespace::of(body)))
}

/// A body's [`prompt_key`], read when needed: a chat prompt's own token ids are found by
/// the tokenizer's path, so with a tokenizer its text key is read only if that path fails.
enum TextKey<'a> {
    Read(Option<Vec<u8>>),
    /// A chat body's.
    Unread(&'a [u8]),
}

impl<'a> TextKey<'a> {
    fn new(endpoint: Endpoint, body: &'a [u8], tokenizer: bool) -> Self {
        if tokenizer && endpoint == Endpoint::ChatCompletions {
            TextKey::Unread(body)
        } else {
            TextKey::Read(prompt_key(endpoint, body))
        }
    }

    /// Whether the request goes through the tokenizer: not one given as token ids (its
    /// key already is them), nor one over [`MAX_TOKENIZE_BODY_BYTES`].
    fn wants_tokens(&self, body: &[u8]) -> bool {
        let ids = match self {
            TextKey::Read(key) => key.as_deref().and_then(<[u8]>::first) == Some(&b'i'),
            TextKey::Unread(..) => false,
        };
        !ids && body.len() <= MAX_TOKENIZE_BODY_BYTES
    }

    fn read(self) -> Option<Vec<u8>> {
        match self {
            TextKey::Read(key) => key,
            TextKey::Unread(body) => prompt_key(Endpoint::ChatCompletions, body),
        }
    }
}

/// The token key when there is one, else the text `key`. The first prompt the tokenizer
/// cannot take is logged as a warning (by kind only: the error may quote the prompt);
/// later ones at debug.
fn or_text_key(
    tokens: Result<Option<Vec<u8>>, sglang::tokenizer::TokenizerError>,
    key: TextKey<'_>,
) -> Option<Vec<u8>> {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    match tokens {
        Ok(Some(k)) => Some(k),
        Ok(None) => key.read(),
        Err(e) => {
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    kind = e.kind(),
                    "a prompt could not be tokenized; such \
                    prompts are routed by their text (details at debug level)"
                );
            }
            tracing::debug!(error = %e, "prompt not tokenized; routed by its text");
            key.read()
        }
    }
}

/// The `i` key of a text or chat prompt through `tokenizer`; `None` for a prompt given as
/// token ids (its [`prompt_key`] is already one) or without text.
pub fn token_key(
    endpoint: Endpoint,
    body: &[u8],
    tokenizer: &Tokenizer,
) -> Result<Option<Vec<u8>>, sglang::tokenizer::TokenizerError> {
    encode_prepared(
        &prepare(endpoint, body, tokenizer)?,
        tokenizer,
        Tokenizer::encode,
    )
}

/// A prompt read from its body, ready to encode.
#[derive(Debug)]
enum Prepared {
    /// Its key already (a chat request's own token ids, or those kept from an earlier
    /// render of the same prompt).
    Key(Vec<u8>),
    /// Its text (a text prompt, or the rendered chat), whether the tokenizer's
    /// post-processor adds its ids (text prompts), and the key to keep a chat's ids
    /// under ([`Tokenizer::remember_chat_ids`]).
    Text {
        text: String,
        special: bool,
        memo: Option<u128>,
    },
    /// No text to key.
    Nothing,
}

/// Reads (and, for chat, renders) the prompt of `body`.
fn prepare(
    endpoint: Endpoint,
    body: &[u8],
    tokenizer: &Tokenizer,
) -> Result<Prepared, sglang::tokenizer::TokenizerError> {
    match endpoint {
        // Embedding, reranker and reward models keep no KV cache to route to: their text
        // key is enough. Tokenize computes nothing; a response's input is keyed by text.
        Endpoint::Embeddings
        | Endpoint::Rerank
        | Endpoint::V1Rerank
        | Endpoint::Classify
        | Endpoint::Score
        | Endpoint::Tokenize
        | Endpoint::Detokenize
        | Endpoint::Responses => Ok(Prepared::Nothing),
        Endpoint::ChatCompletions => Ok(match tokenizer.chat_text(body)? {
            ChatText::Ids(ids) => Prepared::Key(id_key(ids.iter().copied())),
            ChatText::Render { text, memo } => Prepared::Text {
                text,
                special: false,
                memo,
            },
        }),
        Endpoint::Completions | Endpoint::Generate => {
            #[derive(serde::Deserialize)]
            struct Text {
                #[serde(default)]
                prompt: Option<FirstText>,
                #[serde(default)]
                text: Option<FirstText>,
            }
            let fields: Text = serde_json::from_slice(body)
                .map_err(|e| sglang::tokenizer::TokenizerError::Request(e.to_string()))?;
            let field = match endpoint {
                Endpoint::Completions => fields.prompt,
                _ => fields.text,
            };
            let Some(FirstText(Some(text))) = field else {
                return Ok(Prepared::Nothing);
            };
            // SGLang's tokenizer manager: the post-processor's ids too (`text_ids`).
            Ok(Prepared::Text {
                text,
                special: true,
                memo: None,
            })
        }
    }
}

/// The key of a prepared prompt, encoded by `encode` (a chat's ids kept for the next
/// time when encoded whole).
fn encode_prepared(
    prepared: &Prepared,
    tokenizer: &Tokenizer,
    encode: fn(&Tokenizer, &str, bool) -> Result<Vec<u32>, sglang::tokenizer::TokenizerError>,
) -> Result<Option<Vec<u8>>, sglang::tokenizer::TokenizerError> {
    let (text, special, memo) = match prepared {
        Prepared::Key(k) => return Ok(Some(k.clone())),
        Prepared::Nothing => return Ok(None),
        Prepared::Text {
            text,
            special,
            memo,
        } => (text, *special, *memo),
    };
    let ids = encode_cut(text, |t| encode(tokenizer, t, special))?;
    // A cut text's ids are not the prompt's.
    if let Some(key) = memo.filter(|_| text.len() <= MAX_KEY_BYTES) {
        tokenizer.remember_chat_ids(key, &ids);
    }
    if ids.is_empty() {
        return Ok(None);
    }
    Ok(Some(id_key(ids.into_iter())))
}

/// An `i` key of `ids`, at most [`MAX_KEY_BYTES`] long.
fn id_key(ids: impl ExactSizeIterator<Item = u32>) -> Vec<u8> {
    let n = ids.len().min((MAX_KEY_BYTES - 1) / 4);
    let mut key = Vec::with_capacity(1 + 4 * n);
    key.push(b'i');
    for id in ids.take(n) {
        key.extend_from_slice(&id.to_le_bytes());
    }
    key
}

/// `encode` of at most [`MAX_KEY_BYTES`] of `text` (cut at a character boundary); when
/// cut, the last id is dropped (the cut may split what the whole text encodes as one).
fn encode_cut(
    text: &str,
    encode: impl FnOnce(&str) -> Result<Vec<u32>, sglang::tokenizer::TokenizerError>,
) -> Result<Vec<u32>, sglang::tokenizer::TokenizerError> {
    if text.len() <= MAX_KEY_BYTES {
        return encode(text);
    }
    let mut end = MAX_KEY_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut ids = encode(&text[..end])?;
    ids.pop();
    Ok(ids)
}

/// The first string of a prompt field (a string, or a list whose first item is one);
/// `None` for token ids or anything else. The rest of a list is skipped, not kept.
struct FirstText(Option<String>);

impl<'de> serde::Deserialize<'de> for FirstText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FirstText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a prompt")
            }
            fn visit_str<E>(self, v: &str) -> Result<FirstText, E> {
                Ok(FirstText(Some(v.to_owned())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstText, A::Error> {
                let first = seq.next_element::<serde_json::Value>()?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(FirstText(match first {
                    Some(serde_json::Value::String(s)) => Some(s),
                    _ => None,
                }))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FirstText, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(FirstText(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<FirstText, E> {
                Ok(FirstText(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<FirstText, E> {
                Ok(FirstText(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<FirstText, E> {
                Ok(FirstText(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<FirstText, E> {
                Ok(FirstText(None))
            }
            fn visit_unit<E>(self) -> Result<FirstText, E> {
                Ok(FirstText(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A flattened value.
#[derive(Debug, Default)]
struct Flat {
    bytes: Vec<u8>,
    /// Its first leaf was a number (token ids).
    numeric: bool,
    leaves: usize,
}

impl Flat {
    fn full(&self) -> bool {
        self.bytes.len() >= MAX_KEY_BYTES
    }

    fn text(&mut self, s: &str) {
        if !self.full() {
            self.bytes.extend_from_slice(s.as_bytes());
            self.bytes.push(SEPARATOR);
        }
        self.leaves += 1;
    }

    fn number(&mut self, n: u64) {
        if self.leaves == 0 {
            self.numeric = true;
        }
        if !self.full() {
            self.bytes
                .extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
        }
        self.leaves += 1;
    }
}

/// What the top-level pass found: the endpoint's main field and its fallback
/// (`/generate`'s `input_ids`).
#[derive(Debug, Default)]
struct Found {
    main: Flat,
    fallback: Flat,
}

struct Top {
    endpoint: Endpoint,
}

impl<'de> DeserializeSeed<'de> for Top {
    type Value = Found;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Top {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let (main, fallback) = match self.endpoint {
            Endpoint::ChatCompletions => ("messages", None),
            Endpoint::Completions => ("prompt", None),
            Endpoint::Generate => ("text", Some("input_ids")),
            Endpoint::Embeddings | Endpoint::Classify | Endpoint::Responses => ("input", None),
            Endpoint::Rerank | Endpoint::V1Rerank | Endpoint::Score => ("query", None),
            Endpoint::Tokenize => ("prompt", None),
            Endpoint::Detokenize => ("tokens", None),
        };
        let mut found = Found::default();
        while let Some(k) = map.next_key::<KeyName<'de>>()? {
            if k.0 == main {
                map.next_value_seed(Flatten(&mut found.main))?;
            } else if Some(k.0.as_ref()) == fallback {
                map.next_value_seed(Flatten(&mut found.fallback))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Appends every leaf of a value, depth first, to a [`Flat`].
struct Flatten<'f>(&'f mut Flat);

impl<'de> DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flatten<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.0.text(v);
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.0.number(v);
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.0.number(u64::try_from(v).unwrap_or(0));
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Flatten(&mut *self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(Flatten(&mut *self.0))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sglang::tokenizer::ChatPrompt;

    fn key(ep: Endpoint, body: &str) -> Option<Vec<u8>> {
        prompt_key(ep, body.as_bytes())
    }

    #[test]
    fn chat_keys_follow_the_conversation() {
        let one = r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"stream":true}"#;
        let two = r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"}],"model":"m"}"#;
        let k1 = key(Endpoint::ChatCompletions, one).unwrap();
        let k2 = key(Endpoint::ChatCompletions, two).unwrap();
        assert_eq!(k1, b"csystem\x1fBe brief.\x1fuser\x1fHi\x1f");
        assert!(k2.starts_with(&k1), "a longer conversation extends the key");
        // Content parts and escapes.
        let parts =
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9\n"}]}]}"#;
        assert_eq!(
            key(Endpoint::ChatCompletions, parts).unwrap(),
            "cuser\x1ftext\x1fa\u{e9}\n\x1f".as_bytes()
        );
        assert_eq!(key(Endpoint::ChatCompletions, r#"{"model":"m"}"#), None);
    }

    #[test]
    fn prompts_text_and_token_ids() {
        assert_eq!(
            key(Endpoint::Completions, r#"{"prompt":"Once upon"}"#).unwrap(),
            b"tOnce upon\x1f"
        );
        assert_eq!(
            key(Endpoint::Completions, r#"{"prompt":["a","b"]}"#).unwrap(),
            b"ta\x1fb\x1f"
        );
        assert_eq!(
            key(Endpoint::Completions, r#"{"prompt":[1,2]}"#).unwrap(),
            b"i\x01\x00\x00\x00\x02\x00\x00\x00"
        );
        assert_eq!(
            key(
                Endpoint::Generate,
                r#"{"input_ids":[[7],[8]],"sampling_params":{"max_new_tokens":3}}"#
            )
            .unwrap(),
            b"i\x07\x00\x00\x00\x08\x00\x00\x00"
        );
        assert_eq!(
            key(Endpoint::Generate, r#"{"input_ids":[9],"text":"wins"}"#).unwrap(),
            b"twins\x1f"
        );
        assert_eq!(key(Endpoint::Generate, r#"{"text":null}"#), None);
        assert_eq!(key(Endpoint::Generate, "not json"), None);
        assert_eq!(key(Endpoint::Generate, "[1]"), None);
    }

    #[test]
    fn long_prompts_are_cut() {
        let long = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(3 * MAX_KEY_BYTES));
        assert_eq!(
            key(Endpoint::Completions, &long).unwrap().len(),
            MAX_KEY_BYTES
        );
    }

    fn tokenizer() -> Tokenizer {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer");
        Tokenizer::load(&dir, None).unwrap()
    }

    fn ids_of(key: &[u8]) -> Vec<u32> {
        assert_eq!(key[0], b'i');
        key[1..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_tokenizer_turns_text_and_chat_prompts_into_token_keys() {
        let tok = tokenizer();
        let rk = |ep, body: &str| routing_key(ep, body.as_bytes(), Some(&tok)).unwrap();
        let text = tok.text_ids("Once upon a time").unwrap();
        assert_eq!(
            ids_of(&rk(
                Endpoint::Completions,
                r#"{"prompt":"Once upon a time"}"#
            )),
            text
        );
        assert_eq!(
            ids_of(&rk(
                Endpoint::Completions,
                r#"{"prompt":["Once upon a time","x"]}"#
            )),
            text
        );
        assert_eq!(
            ids_of(&rk(Endpoint::Generate, r#"{"text":"Once upon a time"}"#)),
            text
        );
        let chat = r#"{"messages":[{"role":"user","content":"Hi there"}]}"#;
        let want = tok
            .chat_ids(&ChatPrompt::from_body(chat.as_bytes()).unwrap())
            .unwrap();
        assert_eq!(ids_of(&rk(Endpoint::ChatCompletions, chat)), want);
        // Token ids stay as they are; what the tokenizer refuses keeps its text key.
        let ids = r#"{"input_ids":[5,6,7]}"#;
        assert_eq!(
            rk(Endpoint::Generate, ids),
            key(Endpoint::Generate, ids).unwrap()
        );
        let robot = r#"{"messages":[{"role":"robot","content":"Hi"}]}"#;
        assert_eq!(
            rk(Endpoint::ChatCompletions, robot),
            key(Endpoint::ChatCompletions, robot).unwrap()
        );
        assert_eq!(routing_key(Endpoint::Completions, b"{}", Some(&tok)), None);
        // A chat request with its own ids is keyed by them, as SGLang skips the template.
        let with_ids = r#"{"messages":[{"role":"user","content":"Hi"}],"input_ids":[9,8,7]}"#;
        assert_eq!(
            ids_of(&rk(Endpoint::ChatCompletions, with_ids)),
            vec![9, 8, 7]
        );
        // A body over the cap keeps its text key.
        let huge = format!(r#"{{"prompt":"{}"}}"#, "a".repeat(MAX_TOKENIZE_BODY_BYTES));
        assert_eq!(rk(Endpoint::Completions, &huge)[0], b't');
    }

    #[tokio::test(flavor = "current_thread")]
    async fn long_bodies_are_tokenized_off_the_runtime_to_the_same_key() {
        let tok = Arc::new(tokenizer());
        for n in [10, 64 * 1024] {
            let body = bytes::Bytes::from(format!(r#"{{"prompt":"{}"}}"#, "tree ".repeat(n / 5)));
            let off = routing_key_off_thread(Endpoint::Completions, &body, Some(&tok)).await;
            assert_eq!(off, routing_key(Endpoint::Completions, &body, Some(&tok)));
            assert_eq!(off.unwrap()[0], b'i');
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn prompts_met_before_are_keyed_from_the_pieces_cache_to_the_same_key() {
        let plain = tokenizer();
        let cached = Arc::new(tokenizer().with_cache(1 << 20));
        let bodies = [
            (
                Endpoint::ChatCompletions,
                r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}]}"#,
            ),
            (Endpoint::Completions, r#"{"prompt":"Once upon a time"}"#),
            (
                Endpoint::Generate,
                r#"{"text":"<|im_start|>user\nHi<|im_end|>"}"#,
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"messages":[{"role":"robot","content":"Hi"}]}"#,
            ),
        ];
        for (ep, body) in bodies {
            let b = bytes::Bytes::from(body);
            let want = routing_key(ep, &b, Some(&plain));
            let from_cache = || {
                prepare(ep, &b, &cached)
                    .and_then(|p| encode_prepared(&p, &cached, Tokenizer::encode_cached))
            };
            // First off the runtime (pieces encoded and kept), then from the cache inline.
            assert!(matches!(
                from_cache(),
                Err(sglang::tokenizer::TokenizerError::NotCached)
                    | Err(sglang::tokenizer::TokenizerError::Render(_))
            ));
            assert_eq!(
                routing_key_off_thread(ep, &b, Some(&cached)).await,
                want,
                "{body}"
            );
            if want.as_deref().is_some_and(|k| k[0] == b'i') {
                assert!(from_cache().is_ok());
                if ep == Endpoint::ChatCompletions {
                    // The chat's ids were kept: the same prompt is neither rendered nor
                    // encoded again.
                    match prepare(ep, &b, &cached) {
                        Ok(Prepared::Key(k)) => assert_eq!(Some(k), want),
                        other => panic!("{other:?}"),
                    }
                }
            }
            assert_eq!(
                routing_key_off_thread(ep, &b, Some(&cached)).await,
                want,
                "{body}"
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_chat_cut_to_the_key_cap_is_not_kept_as_the_prompts_ids() {
        let tok = Arc::new(tokenizer().with_cache(16 << 20));
        let long = "tree ".repeat(MAX_KEY_BYTES / 5 + 10);
        let body = bytes::Bytes::from(format!(
            r#"{{"messages":[{{"role":"user","content":"{long}"}}]}}"#
        ));
        let key = routing_key_off_thread(Endpoint::ChatCompletions, &body, Some(&tok)).await;
        assert!(key.is_some_and(|k| k[0] == b'i' && k.len() <= MAX_KEY_BYTES));
        assert!(matches!(
            tok.chat_text(&body),
            Ok(ChatText::Render { memo: Some(_), .. })
        ));
    }

    #[test]
    fn long_prompts_are_cut_before_they_are_tokenized() {
        let tok = tokenizer();
        let long = format!(r#"{{"prompt":"{}"}}"#, "é".repeat(MAX_KEY_BYTES));
        let k = routing_key(Endpoint::Completions, long.as_bytes(), Some(&tok)).unwrap();
        assert!(
            k.len() <= MAX_KEY_BYTES && k.len() > 1 && (k.len() - 1).is_multiple_of(4),
            "{}",
            k.len()
        );
        // The cut's last id is dropped: what remains is a prefix of the whole text's ids.
        let whole = tok.text_ids(&"é".repeat(MAX_KEY_BYTES)).unwrap();
        assert!(whole.starts_with(&ids_of(&k)));
    }

    proptest::proptest! {
        /// Any bytes: a key or none, never a panic.
        #[test]
        fn never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            for ep in [Endpoint::ChatCompletions, Endpoint::Completions, Endpoint::Generate] {
                let _ = prompt_key(ep, &body);
            }
        }
    }
}
