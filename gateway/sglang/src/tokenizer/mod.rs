//! Prompt token ids as the worker computes them, for routing by what is cached: a Hugging
//! Face tokenizer (`tokenizer.json`, through the `tokenizers` crate SGLang's own Python
//! package wraps) and the model's chat template (`tokenizer_config.json` or
//! `chat_template.jinja`, rendered with minijinja the way `transformers` renders it).
//!
//! - **Text** (`/generate` `text`, `/v1/completions` string prompts): `encode(text)` with
//!   the special tokens the tokenizer's post-processor adds (a BOS), as SGLang's tokenizer
//!   manager calls it.
//! - **Chat** (`/v1/chat/completions`): SGLang's preparation of the messages (see
//!   [`chat`]), the template rendered with `add_generation_prompt`, then encoded without
//!   special tokens (the template writes its own), as `apply_chat_template(tokenize=True)`.
//!
//! The gateway (`--tokenizer-path`) routes `kv_aware` by these ids; the simulated worker
//! (`sim-worker --tokenizer-path`) caches and reports by them, so both sides agree the way
//! a gateway and a real SGLang worker with the same model do. A render that differs from
//! the worker's costs a routing estimate, never an answer: the worker tokenizes for itself.
//!
//! The gateway keeps the ids of the pieces of text between special tokens it has encoded
//! (`pieces`, `--tokenizer-cache-size`): a conversation's earlier turns and a shared
//! system prompt are not encoded again on every request. It also keeps the ids of whole
//! chat prompts by their fields' bytes ([`Tokenizer::chat_text`]): a prompt sent again
//! whole is not rendered again either.
//!
//! Layout: this file loads the files and encodes; [`chat`] prepares messages and renders
//! templates; [`pyjson`] is `transformers`' `tojson` filter (Python's `json.dumps`);
//! `pieces` encodes piece by piece through the cache.

pub mod chat;
mod pieces;
pub mod pyjson;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

pub use chat::{ChatPrompt, ChatTemplate, RawChat};

use crate::memo::{Generations, KeyedHash};

/// The files a tokenizer directory holds.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The tokenizer's settings (special tokens, chat template).
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// Special tokens saved apart from the settings (older `transformers`); the settings win.
pub const SPECIAL_TOKENS_MAP_FILE: &str = "special_tokens_map.json";
/// A chat template saved apart from the settings (`transformers` ≥ 4.43).
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `tokenizer.json` is not a tokenizer.
    #[error("loading the tokenizer {path}: {reason}")]
    Load {
        /// The file.
        path: PathBuf,
        /// What the `tokenizers` crate said.
        reason: String,
    },
    /// `tokenizer_config.json` is not valid JSON of the expected shape.
    #[error("reading the tokenizer settings {path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The chat template does not compile.
    #[error("compiling the chat template: {0}")]
    Template(String),
    /// The tokenizer has no chat template, so chat prompts cannot be tokenized.
    #[error("the tokenizer has no chat template (give one with --chat-template)")]
    NoChatTemplate,
    /// A request's messages could not be rendered (e.g. the template raised an error).
    #[error("rendering the chat template: {0}")]
    Render(String),
    /// A request's chat fields are not what the template expects.
    #[error("invalid chat request: {0}")]
    Request(String),
    /// Encoding failed.
    #[error("encoding: {0}")]
    Encode(String),
    /// [`Tokenizer::encode_cached`] found a piece of the text that was never encoded.
    #[error("a piece of the prompt is not in the tokenizer's cache")]
    NotCached,
}

impl TokenizerError {
    /// The error's kind, for logs that must not quote a request.
    pub fn kind(&self) -> &'static str {
        match self {
            TokenizerError::Read { .. } => "read",
            TokenizerError::Load { .. } => "load",
            TokenizerError::Config { .. } => "config",
            TokenizerError::Template(_) => "template",
            TokenizerError::NoChatTemplate => "no_chat_template",
            TokenizerError::Render(_) => "render",
            TokenizerError::Request(_) => "request",
            TokenizerError::Encode(_) => "encode",
            TokenizerError::NotCached => "not_cached",
        }
    }
}

/// What is wrong with a `--tokenizer-path` / `--chat-template` pair (both configs check it).
pub fn flags_problem(
    tokenizer_path: Option<&Path>,
    chat_template: Option<&Path>,
) -> Option<String> {
    (chat_template.is_some() && tokenizer_path.is_none())
        .then(|| "chat_template needs tokenizer_path".to_owned())
}

/// A loaded tokenizer and, when the model has one, its chat template.
#[derive(Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
    source: PathBuf,
    /// The pieces cache, when on and this tokenizer allows it.
    pieces: Option<pieces::Pieces>,
    /// The memo of chat prompts' ids, when on and the template allows it.
    chats: Option<ChatMemo>,
}

/// The ids of chat prompts met before, by their [`RawChat::hash`]: a prompt sent again
/// whole (a rollout group's samples, `n` requests for one prompt, a retried request) is
/// neither rendered nor encoded again. Bounded in bytes (see [`Tokenizer::with_cache`]).
#[derive(Debug)]
struct ChatMemo {
    hash: KeyedHash,
    ids: Mutex<Generations<Arc<[u32]>>>,
}

/// Bytes a [`ChatMemo`] entry costs beyond its ids (its slot, the allocation's header).
const CHAT_ENTRY_OVERHEAD: usize = 64;

/// What a chat body's ids come from ([`Tokenizer::chat_text`]).
#[derive(Debug)]
pub enum ChatText {
    /// Its ids: given by the request (`input_ids`), or kept from an earlier render.
    Ids(Arc<[u32]>),
    /// The template's render, to encode; keep the ids under `memo` once encoded
    /// ([`Tokenizer::remember_chat_ids`]).
    Render {
        /// The rendered prompt.
        text: String,
        /// Its memo key (none: this tokenizer keeps no memo).
        memo: Option<u128>,
    },
}

impl Tokenizer {
    /// Loads `path`: a directory holding `tokenizer.json` (and `tokenizer_config.json`,
    /// `special_tokens_map.json`, `chat_template.jinja` when present) or a `tokenizer.json` file (its directory is
    /// searched for the others). `chat_template`, when given, is a template file that
    /// replaces the model's.
    pub fn load(path: &Path, chat_template: Option<&Path>) -> Result<Self, TokenizerError> {
        let (dir, file) = if path.is_dir() {
            (path.to_path_buf(), path.join(TOKENIZER_FILE))
        } else {
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            (dir, path.to_path_buf())
        };
        let json = read(&file)?;
        let mut inner = tokenizers::Tokenizer::from_bytes(json.as_bytes()).map_err(|e| {
            TokenizerError::Load {
                path: file.clone(),
                reason: e.to_string(),
            }
        })?;
        // `transformers` turns truncation and padding off unless a call asks for them.
        inner
            .with_truncation(None)
            .map_err(|e| TokenizerError::Load {
                path: file.clone(),
                reason: e.to_string(),
            })?;
        inner.with_padding(None);
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = if config_path.is_file() {
            let text = read(&config_path)?;
            Some(
                serde_json::from_str::<serde_json::Value>(&text).map_err(|e| {
                    TokenizerError::Config {
                        path: config_path.clone(),
                        reason: e.to_string(),
                    }
                })?,
            )
        } else {
            None
        };
        let config = merge_special_tokens(config, &dir.join(SPECIAL_TOKENS_MAP_FILE))?;
        let separate = dir.join(CHAT_TEMPLATE_FILE);
        let explicit = match chat_template {
            Some(p) => Some(read(p)?),
            None if separate.is_file() => Some(read(&separate)?),
            None => None,
        };
        let chat = ChatTemplate::from_config(config.as_ref(), explicit)?;
        Ok(Tokenizer {
            inner,
            chat,
            source: path.to_path_buf(),
            pieces: None,
            chats: None,
        })
    }

    /// This tokenizer keeping, in about `cache_bytes` (0: none), the ids of the pieces of
    /// text it encodes (7/8 of it; see the `pieces` module) and of whole chat prompts
    /// (1/8, in two generations: [`Tokenizer::chat_text`]). A tokenizer whose ids are not
    /// those of its pieces keeps no pieces, and says why in the log; one whose template
    /// reads the clock keeps no chat prompts.
    pub fn with_cache(mut self, cache_bytes: usize) -> Self {
        self.pieces = None;
        self.chats = None;
        if cache_bytes == 0 {
            return self;
        }
        match pieces::Pieces::new(&self.inner, cache_bytes - cache_bytes / 8) {
            Ok(p) => self.pieces = Some(p),
            Err(why) => tracing::info!(
                path = %self.source.display(),
                why = %why,
                "the tokenizer encodes every prompt whole (no pieces cache)"
            ),
        }
        if self.chat.as_ref().is_some_and(|c| !c.reads_clock()) {
            self.chats = Some(ChatMemo {
                hash: KeyedHash::default(),
                ids: Mutex::new(Generations::new(cache_bytes / 16, |ids: &Arc<[u32]>| {
                    4 * ids.len() + CHAT_ENTRY_OVERHEAD
                })),
            });
        }
        self
    }

    /// Whether chat prompts met before are kept ([`Tokenizer::with_cache`]).
    pub fn remembers_chats(&self) -> bool {
        self.chats.is_some()
    }

    /// A chat body's ids when known without encoding (given, or kept from an earlier
    /// render of the same fields), else its template's render to encode.
    pub fn chat_text(&self, body: &[u8]) -> Result<ChatText, TokenizerError> {
        let raw = RawChat::from_body(body)?;
        // SGLang skips the template for a chat request that brings its ids.
        if let Some(ids) = raw.given_ids()? {
            return Ok(ChatText::Ids(ids.into()));
        }
        let memo = self.chats.as_ref().map(|m| raw.hash(&m.hash));
        if let (Some(m), Some(key)) = (&self.chats, memo)
            && let Some(ids) = m.ids.lock().get(key)
        {
            return Ok(ChatText::Ids(ids));
        }
        let text = self.render_chat(&raw.prompt()?)?;
        Ok(ChatText::Render { text, memo })
    }

    /// Keeps `ids`, the encoding of a [`ChatText::Render`], under its `memo` key.
    pub fn remember_chat_ids(&self, memo: u128, ids: &[u32]) {
        if let Some(m) = &self.chats {
            m.ids.lock().insert(memo, ids.into());
        }
    }

    /// Token ids of a chat body, as SGLang's chat route computes them
    /// ([`Tokenizer::chat_ids`]), kept for the next time the same prompt comes.
    pub fn chat_body_ids(&self, body: &[u8]) -> Result<Vec<u32>, TokenizerError> {
        match self.chat_text(body)? {
            ChatText::Ids(ids) => Ok(ids.to_vec()),
            ChatText::Render { text, memo } => {
                let ids = self.encode(&text, false)?;
                if let Some(key) = memo {
                    self.remember_chat_ids(key, &ids);
                }
                Ok(ids)
            }
        }
    }

    /// Whether encodings go piece by piece through a cache ([`Tokenizer::with_cache`]).
    pub fn caches_pieces(&self) -> bool {
        self.pieces.is_some()
    }

    /// `--tokenizer-path` with `--chat-template`, loaded with a pieces cache of
    /// `cache_bytes` and logged (none when not given).
    pub fn from_flags(
        tokenizer_path: Option<&Path>,
        chat_template: Option<&Path>,
        cache_bytes: usize,
    ) -> Result<Option<std::sync::Arc<Self>>, TokenizerError> {
        let Some(path) = tokenizer_path else {
            return Ok(None);
        };
        let t = Tokenizer::load(path, chat_template)?.with_cache(cache_bytes);
        if t.has_chat_template() {
            tracing::info!(path = %path.display(), "tokenizer loaded (text and chat prompts)");
        } else {
            tracing::warn!(path = %path.display(), "tokenizer loaded without a chat template: \
                chat prompts are not tokenized (give one with --chat-template)");
        }
        Ok(Some(std::sync::Arc::new(t)))
    }

    /// Where it was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Whether chat prompts can be tokenized.
    pub fn has_chat_template(&self) -> bool {
        self.chat.is_some()
    }

    /// Token ids of `text`; `add_special_tokens` runs the post-processor (a BOS, say).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        if let Some(p) = &self.pieces
            && let Some(ids) = p.encode(&self.inner, text, add_special_tokens, false)?
        {
            return Ok(ids);
        }
        self.encode_whole(text, add_special_tokens)
    }

    /// [`Tokenizer::encode`] from the pieces cache alone, without running the tokenizer:
    /// [`TokenizerError::NotCached`] when a piece of `text` was not encoded before (or
    /// there is no cache). Cheap enough for a runtime thread.
    pub fn encode_cached(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        match &self.pieces {
            Some(p) => p
                .encode(&self.inner, text, add_special_tokens, true)?
                .ok_or(TokenizerError::NotCached),
            None => Err(TokenizerError::NotCached),
        }
    }

    /// Token ids of `text`, encoded whole (no cache).
    fn encode_whole(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        pieces::whole(&self.inner, text, add_special_tokens).map_err(TokenizerError::Encode)
    }

    /// The text of one token (for echoes and logprobs): its decoded piece.
    pub fn token_text(&self, id: u32) -> String {
        self.inner.decode(&[id], false).unwrap_or_default()
    }

    /// Token ids of a text prompt, as SGLang's tokenizer manager computes them.
    pub fn text_ids(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode(text, true)
    }

    /// The chat template rendered for `prompt`.
    pub fn render_chat(&self, prompt: &ChatPrompt) -> Result<String, TokenizerError> {
        self.chat
            .as_ref()
            .ok_or(TokenizerError::NoChatTemplate)?
            .render(prompt)
    }

    /// Token ids of a chat prompt, as SGLang's chat route computes them: the request's own
    /// `input_ids` when it brings them (no template then), else the rendered template.
    pub fn chat_ids(&self, prompt: &ChatPrompt) -> Result<Vec<u32>, TokenizerError> {
        match prompt.given_ids() {
            Some(ids) => Ok(ids.to_vec()),
            None => self.encode(&self.render_chat(prompt)?, false),
        }
    }
}

/// `config` with the special tokens of `map_path` (when it exists) that it does not set.
fn merge_special_tokens(
    config: Option<serde_json::Value>,
    map_path: &Path,
) -> Result<Option<serde_json::Value>, TokenizerError> {
    if !map_path.is_file() {
        return Ok(config);
    }
    let bad = |reason: String| TokenizerError::Config {
        path: map_path.to_path_buf(),
        reason,
    };
    let map: serde_json::Value =
        serde_json::from_str(&read(map_path)?).map_err(|e| bad(e.to_string()))?;
    let serde_json::Value::Object(map) = map else {
        return Err(bad("not a JSON object".to_owned()));
    };
    let mut config = match config {
        Some(serde_json::Value::Object(c)) => c,
        _ => serde_json::Map::new(),
    };
    for (k, v) in map {
        let unset = config.get(&k).is_none_or(serde_json::Value::is_null);
        if unset {
            config.insert(k, v);
        }
    }
    Ok(Some(serde_json::Value::Object(config)))
}

fn read(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests;
