//! Encoding a prompt piece by piece, with each piece's ids cached.
//!
//! Hugging Face's tokenizer first cuts a text at the added tokens that match unnormalized
//! (the special tokens a chat template writes: `<|im_start|>`, `<|eot_id|>`), leftmost
//! longest first, then normalizes, pre-tokenizes and encodes every piece between them on
//! its own. So the ids of a text are its pieces' ids and the special tokens' ids, in order,
//! and a piece seen before need not be encoded again. A conversation sent again with one
//! more turn, or a system prompt many requests share, is then encoded once per new piece
//! instead of whole on every request: the tokenizer runs at a few MB/s, and a chat's
//! rendered text grows with every turn.
//!
//! That holds unless the tokenizer looks past a piece: added tokens that strip the
//! whitespace around them or must stand as a single word, a Metaspace pre-tokenizer that
//! puts its `▁` before the text's first piece only (`prepend_scheme: first`), or special
//! tokens left unsplit (`encode_special_tokens`). Such a tokenizer is encoded whole, and so
//! is one whose ids for a few probe texts (checked at load) differ piece by piece from the
//! whole. With `add_special_tokens`, the post-processor's own ids (a BOS) are found from a
//! probe the same way; where they cannot be, text prompts are encoded whole.

use std::fmt;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use moka::sync::Cache;

use super::TokenizerError;

/// Bytes an entry costs beyond its text and ids (the map's slot, the allocations' headers,
/// the cache's own bookkeeping).
const ENTRY_OVERHEAD: usize = 128;

/// Special tokens the load-time probes put between pieces (the first ones by id).
const PROBED_SPECIALS: usize = 8;

/// A tokenizer's pieces cache (see the module doc).
pub(super) struct Pieces {
    /// The unnormalized added tokens, leftmost longest (none: the text is one piece).
    splitter: Option<AhoCorasick>,
    /// The id of each of the splitter's patterns.
    special_ids: Vec<u32>,
    /// The ids the post-processor puts before and after a text's own, when known.
    wrap: Option<(Vec<u32>, Vec<u32>)>,
    cache: Cache<Arc<str>, Arc<[u32]>, foldhash::fast::RandomState>,
    /// Longer pieces are encoded but not kept (one must not push out everything else).
    max_piece: usize,
}

impl fmt::Debug for Pieces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pieces")
            .field("special_tokens", &self.special_ids.len())
            .field("wraps_text", &self.wrap.is_some())
            .field("entries", &self.cache.entry_count())
            .finish()
    }
}

impl Pieces {
    /// The pieces cache of `inner`, holding about `cache_bytes`; `Err` says why this
    /// tokenizer must be encoded whole.
    pub(super) fn new(inner: &tokenizers::Tokenizer, cache_bytes: usize) -> Result<Self, String> {
        if inner.get_encode_special_tokens() {
            return Err("special tokens are encoded as text".to_owned());
        }
        if let Some(pre) = inner.get_pre_tokenizer() {
            let json = serde_json::to_value(pre).map_err(|e| e.to_string())?;
            if prepends_first_only(&json) {
                return Err("the Metaspace pre-tokenizer prepends to the first piece only".into());
            }
        }
        let mut added: Vec<(u32, tokenizers::AddedToken)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| !t.normalized)
            .collect();
        added.sort_by_key(|(id, _)| *id);
        if added
            .iter()
            .any(|(_, t)| t.lstrip || t.rstrip || t.single_word)
        {
            return Err("an added token strips whitespace or must be a single word".to_owned());
        }
        let splitter = if added.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(added.iter().map(|(_, t)| t.content.as_str()))
                    .map_err(|e| e.to_string())?,
            )
        };
        let cache = Cache::builder()
            .max_capacity(cache_bytes as u64)
            .weigher(|k: &Arc<str>, v: &Arc<[u32]>| {
                u32::try_from(k.len() + 4 * v.len() + ENTRY_OVERHEAD).unwrap_or(u32::MAX)
            })
            .build_with_hasher(foldhash::fast::RandomState::default());
        let mut pieces = Pieces {
            splitter,
            special_ids: added.iter().map(|(id, _)| *id).collect(),
            wrap: None,
            cache,
            max_piece: cache_bytes / 16,
        };
        pieces.wrap = find_wrap(inner);
        let probes = probes(added.iter().map(|(_, t)| t.content.as_str()));
        for text in &probes {
            if pieces.join_uncached(inner, text, false)? != whole(inner, text, false)? {
                return Err("its ids differ piece by piece from the whole on a probe".to_owned());
            }
        }
        if pieces.wrap.is_some() {
            for text in &probes {
                if pieces.join_uncached(inner, text, true)? != whole(inner, text, true)? {
                    tracing::debug!(
                        "the post-processor's ids differ on a probe: text prompts \
                        are encoded whole"
                    );
                    pieces.wrap = None;
                    break;
                }
            }
        }
        Ok(pieces)
    }

    /// The ids of `text` from its pieces, each from the cache or encoded and kept; with
    /// `only_cached`, `None` as soon as one piece is not in the cache. `None` as well when
    /// `add_special_tokens` asks for a post-processor whose ids are not known.
    pub(super) fn encode(
        &self,
        inner: &tokenizers::Tokenizer,
        text: &str,
        add_special_tokens: bool,
        only_cached: bool,
    ) -> Result<Option<Vec<u32>>, TokenizerError> {
        if add_special_tokens && self.wrap.is_none() {
            return Ok(None);
        }
        let piece = |p: &str| -> Result<Option<Arc<[u32]>>, TokenizerError> {
            if let Some(ids) = self.cache.get(p) {
                return Ok(Some(ids));
            }
            if only_cached {
                return Ok(None);
            }
            let ids: Arc<[u32]> = whole(inner, p, false)
                .map_err(TokenizerError::Encode)?
                .into();
            if p.len() <= self.max_piece {
                self.cache.insert(p.into(), ids.clone());
            }
            Ok(Some(ids))
        };
        self.join(text, add_special_tokens, piece)
    }

    /// Entries held (tests).
    #[cfg(test)]
    pub(super) fn entries(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.entry_count()
    }

    /// Whether text prompts (with the post-processor's ids) go piece by piece (tests).
    #[cfg(test)]
    pub(super) fn wraps_text(&self) -> bool {
        self.wrap.is_some()
    }

    /// [`Pieces::encode`] without the cache (the load-time probes).
    fn join_uncached(
        &self,
        inner: &tokenizers::Tokenizer,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, String> {
        let ids = self
            .join(text, add_special_tokens, |p| {
                Ok(Some(
                    whole(inner, p, false)
                        .map_err(TokenizerError::Encode)?
                        .into(),
                ))
            })
            .map_err(|e| e.to_string())?;
        Ok(ids.unwrap_or_default())
    }

    /// The ids of `text`: the post-processor's before, each piece's from `piece` and each
    /// special token's own, the post-processor's after; `None` when `piece` gives none.
    fn join(
        &self,
        text: &str,
        add_special_tokens: bool,
        mut piece: impl FnMut(&str) -> Result<Option<Arc<[u32]>>, TokenizerError>,
    ) -> Result<Option<Vec<u32>>, TokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 4);
        let wrap = self.wrap.as_ref().filter(|_| add_special_tokens);
        if let Some((before, _)) = wrap {
            ids.extend_from_slice(before);
        }
        let mut at = 0;
        let mut push = |p: &str, ids: &mut Vec<u32>| -> Result<bool, TokenizerError> {
            if p.is_empty() {
                return Ok(true);
            }
            Ok(piece(p)?.map(|got| ids.extend_from_slice(&got)).is_some())
        };
        if let Some(splitter) = &self.splitter {
            for m in splitter.find_iter(text) {
                if !push(&text[at..m.start()], &mut ids)? {
                    return Ok(None);
                }
                ids.push(self.special_ids[m.pattern().as_usize()]);
                at = m.end();
            }
        }
        if !push(&text[at..], &mut ids)? {
            return Ok(None);
        }
        if let Some((_, after)) = wrap {
            ids.extend_from_slice(after);
        }
        Ok(Some(ids))
    }
}

/// `inner`'s ids of `text`, encoded whole.
pub(super) fn whole(
    inner: &tokenizers::Tokenizer,
    text: &str,
    add_special_tokens: bool,
) -> Result<Vec<u32>, String> {
    inner
        .encode_fast(text, add_special_tokens)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| e.to_string())
}

/// What the post-processor puts before and after a text's ids, read off a probe: the
/// probe's ids with the special tokens, around its ids without them.
fn find_wrap(inner: &tokenizers::Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
    let bare = whole(inner, "a", false).ok()?;
    let full = whole(inner, "a", true).ok()?;
    if bare.is_empty() || full.len() < bare.len() {
        return None;
    }
    let at = (0..=full.len() - bare.len()).find(|&i| full[i..i + bare.len()] == bare[..])?;
    Some((full[..at].to_vec(), full[at + bare.len()..].to_vec()))
}

/// Texts whose ids must come out the same piece by piece as whole: text, spaces and
/// newlines right before and after special tokens, special tokens back to back.
fn probes<'a>(specials: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut texts = vec![
        String::new(),
        "Hello world, again!".to_owned(),
        " leading space\n\nand lines ".to_owned(),
    ];
    for s in specials.take(PROBED_SPECIALS) {
        texts.push(format!("Hello world{s}again, friend!{s} x\n\ny {s}\nend"));
        texts.push(format!("{s}{s}user\nHi there{s}"));
        texts.push(format!(" {s} "));
    }
    texts
}

/// Whether a pre-tokenizer (as JSON) holds a Metaspace that prepends to the first piece
/// of a text only: a piece encoded alone would get the `▁` its place in the text does not.
fn prepends_first_only(json: &serde_json::Value) -> bool {
    match json {
        serde_json::Value::Object(map) => {
            let first = map.get("type").and_then(serde_json::Value::as_str) == Some("Metaspace")
                && map
                    .get("prepend_scheme")
                    .and_then(serde_json::Value::as_str)
                    == Some("first");
            first || map.values().any(prepends_first_only)
        }
        serde_json::Value::Array(items) => items.iter().any(prepends_first_only),
        _ => false,
    }
}
