//! SGLang HiCache page keys and the object names its Mooncake backend stores them under.
//!
//! SGLang's hierarchical cache names a page of `page_size` tokens by a **chained SHA-256**:
//! the digest of the previous page's hash (its 32 raw bytes; nothing for the first page)
//! followed by the page's token ids, each as a `u32` in little-endian order, written as 64
//! lowercase hex characters (`get_hash_str` in `hicache_storage.py`). A page's key therefore
//! names its whole prefix, and "how many leading pages exist" answers "how long a prefix is
//! cached". Only full pages are hashed: a short last page would hash differently depending
//! on where the sequence was cut. EAGLE bigram pages (`(draft, target)` pairs) hash exactly as
//! their flattened ids, so [`page_hash`] covers them too.
//!
//! The Mooncake backend (`mooncake_store.py`) stores each page as one or two objects:
//! MHA models `{key}_{tp_rank}_k` and `{key}_{tp_rank}_v`, MLA models one `{key}__k` (the
//! rank part is empty: every rank holds the same latent cache). With pipeline parallelism
//! the suffix gains the PP rank (`{key}_{tp}_{pp}_k`, MLA `{key}_{pp}_k`), and a deployment
//! prefix (backend tag and model name, `/` replaced by `-`, joined by `_`) may precede the
//! key. [`KeyLayout`] builds these names.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// A page's chained SHA-256 (32 bytes); `Display` is SGLang's 64-character lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageHash(pub [u8; 32]);

impl PageHash {
    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The lowercase hex form SGLang uses as the page key.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for PageHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 64];
        hex::encode_to_slice(self.0, &mut buf).map_err(|_| fmt::Error)?;
        f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for PageHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageHash({self})")
    }
}

/// A page key that is not 64 hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("page hash must be 64 hex characters: {0:?}")]
pub struct BadPageHash(pub String);

impl FromStr for PageHash {
    type Err = BadPageHash;

    /// Parses the hex form (either case).
    fn from_str(s: &str) -> Result<Self, BadPageHash> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| BadPageHash(s.to_owned()))?;
        Ok(Self(out))
    }
}

/// The key of one page of `tokens`, chained onto the previous page's hash (`None` for the
/// first page of a sequence). SGLang's `get_hash_str(token_ids, prior_hash)`.
pub fn page_hash(tokens: &[u32], prior: Option<&PageHash>) -> PageHash {
    let mut h = Sha256::new();
    if let Some(p) = prior {
        h.update(p.0);
    }
    // Feed the ids in small stack blocks: one `update` per block, not per token.
    let mut block = [0u8; 256];
    for chunk in tokens.chunks(block.len() / 4) {
        for (dst, t) in block.chunks_exact_mut(4).zip(chunk) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&block[..chunk.len() * 4]);
    }
    PageHash(h.finalize().into())
}

/// The keys of every full page of `tokens` (`page_size` tokens each), chained from `prior`
/// (the hash of the page before `tokens[0]`, if any). A trailing partial page gets no key.
///
/// # Panics
/// If `page_size` is 0.
pub fn page_hashes(tokens: &[u32], page_size: usize, prior: Option<&PageHash>) -> Vec<PageHash> {
    assert!(page_size > 0, "page_size must be positive");
    let mut out = Vec::with_capacity(tokens.len() / page_size);
    let mut last = prior.copied();
    for page in tokens.chunks_exact(page_size) {
        let h = page_hash(page, last.as_ref());
        out.push(h);
        last = Some(h);
    }
    out
}

/// How a deployment names the store objects of a page (Mooncake backend of SGLang HiCache).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyLayout {
    /// Prepended as `{prefix}_` to every key (see [`KeyLayout::deployment_prefix`]).
    pub prefix: Option<String>,
    /// Tensor-parallel rank of this worker.
    pub tp_rank: u32,
    /// Pipeline-parallel rank, when the deployment uses PP (`pp_size > 1`).
    pub pp_rank: Option<u32>,
    /// MLA model: one latent object per page instead of separate K and V.
    pub mla: bool,
}

impl KeyLayout {
    /// MHA layout of tensor-parallel rank `tp_rank`.
    pub fn mha(tp_rank: u32) -> Self {
        Self {
            tp_rank,
            ..Self::default()
        }
    }

    /// MLA layout (the same object for every TP rank).
    pub fn mla() -> Self {
        Self {
            mla: true,
            ..Self::default()
        }
    }

    /// SGLang's deployment prefix: the backend tag and the model name (`/` replaced by `-`),
    /// whichever are given, joined by `_`; `None` when neither is.
    pub fn deployment_prefix(
        backend_tag: Option<&str>,
        model_name: Option<&str>,
    ) -> Option<String> {
        let model = model_name
            .filter(|m| !m.is_empty())
            .map(|m| m.replace('/', "-"));
        let parts: Vec<String> = backend_tag
            .map(str::to_owned)
            .into_iter()
            .chain(model)
            .collect();
        (!parts.is_empty()).then(|| parts.join("_"))
    }

    /// Objects per page: 1 for MLA, 2 (K and V) otherwise.
    pub fn objects_per_page(&self) -> usize {
        if self.mla { 1 } else { 2 }
    }

    /// The object names of one page, in SGLang's order (K before V).
    pub fn object_keys(&self, page: &PageHash) -> Vec<String> {
        let mut out = Vec::with_capacity(self.objects_per_page());
        self.push_object_keys(page, &mut out);
        out
    }

    /// Appends the object names of `page` to `out` (K before V).
    pub fn push_object_keys(&self, page: &PageHash, out: &mut Vec<String>) {
        let prefix = self
            .prefix
            .as_deref()
            .map(|p| format!("{p}_"))
            .unwrap_or_default();
        let suffix = match (self.mla, self.pp_rank) {
            (true, None) => String::new(),
            (true, Some(pp)) => pp.to_string(),
            (false, None) => self.tp_rank.to_string(),
            (false, Some(pp)) => format!("{}_{pp}", self.tp_rank),
        };
        out.push(format!("{prefix}{page}_{suffix}_k"));
        if !self.mla {
            out.push(format!("{prefix}{page}_{suffix}_v"));
        }
    }

    /// The object names of every page, page by page.
    pub fn keys_of(&self, pages: &[PageHash]) -> Vec<String> {
        let mut out = Vec::with_capacity(pages.len() * self.objects_per_page());
        for p in pages {
            self.push_object_keys(p, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    //! Golden values computed independently of this module, with Python's hashlib, by this
    //! script (SGLang's `get_hash_str` semantics), run once:
    //!
    //! ```python
    //! import hashlib
    //! def h(tokens, prior=None):
    //!     s = hashlib.sha256()
    //!     if prior:
    //!         s.update(bytes.fromhex(prior))
    //!     for t in tokens:
    //!         if isinstance(t, tuple):
    //!             for e in t:
    //!                 s.update(e.to_bytes(4, "little", signed=False))
    //!         else:
    //!             s.update(t.to_bytes(4, "little", signed=False))
    //!     return s.hexdigest()
    //! print("one_page", h([1, 2, 3, 4]))
    //! print("empty", h([]))
    //! print("extremes", h([0, 4294967295, 151643, 128000]))
    //! prior = None
    //! for i in range(4):
    //!     prior = h(list(range(i * 4, i * 4 + 4)), prior)
    //!     print("chain", i, prior)
    //! print("bigram", h([(1, 2), (3, 4)]))
    //! ```

    use super::*;

    const ONE_PAGE: &str = "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72";
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const EXTREMES: &str = "10da4481460c3f92e5387f0c5f81e99a0c9a214eb54e4022cfa9df645df0b6e2";
    const CHAIN: [&str; 4] = [
        "baed642339816affb3fe8719792d0e4ce82f12db72b7373d244eaa65445800fe",
        "01414b052706d93bd0f1f1646c0e8ca2fa8ef5efd7bcc99f7a1cee8eb11ad052",
        "fd5bd05ab69776768cb177e87c5ef6f8f8dec410a03a3c238a58a89c01ba803c",
        "c7c6af3c1b790b9ea1b276972632ee4eb3c540f8cfe405d75ef562dbb4f23cd5",
    ];
    /// `h([(1, 2), (3, 4)])`: an EAGLE bigram page equals its flattened ids.
    const BIGRAM: &str = ONE_PAGE;

    #[test]
    fn single_pages_match_sglang() {
        assert_eq!(page_hash(&[1, 2, 3, 4], None).to_hex(), ONE_PAGE);
        assert_eq!(page_hash(&[], None).to_hex(), EMPTY);
        assert_eq!(
            page_hash(&[0, u32::MAX, 151_643, 128_000], None).to_hex(),
            EXTREMES
        );
        assert_eq!(page_hash(&[1, 2, 3, 4], None).to_string(), BIGRAM);
    }

    #[test]
    fn chained_pages_match_sglang() {
        let tokens: Vec<u32> = (0..16).collect();
        let got: Vec<String> = page_hashes(&tokens, 4, None)
            .iter()
            .map(PageHash::to_hex)
            .collect();
        assert_eq!(got, CHAIN);
        // Continuing from a known prior gives the same tail; a partial page gets no key.
        let prior: PageHash = CHAIN[1].parse().unwrap();
        let tail = page_hashes(&tokens[8..15], 4, Some(&prior));
        assert_eq!(tail.len(), 1);
        assert_eq!(tail[0].to_hex(), CHAIN[2]);
        // Pages longer than one hashing block chain the same way as short ones.
        let long: Vec<u32> = (0..1000).collect();
        let two = page_hashes(&long, 500, None);
        assert_eq!(two[1], page_hash(&long[500..], Some(&two[0])));
    }

    #[test]
    fn hex_round_trips_and_bad_hex_is_refused() {
        let h: PageHash = ONE_PAGE.parse().unwrap();
        assert_eq!(h.to_string(), ONE_PAGE);
        assert_eq!(ONE_PAGE.to_uppercase().parse::<PageHash>().unwrap(), h);
        assert!("abc".parse::<PageHash>().is_err());
        assert!(ONE_PAGE.replace('c', "g").parse::<PageHash>().is_err());
    }

    #[test]
    fn object_names_follow_the_mooncake_backend() {
        let h: PageHash = ONE_PAGE.parse().unwrap();
        assert_eq!(
            KeyLayout::mha(3).object_keys(&h),
            [format!("{ONE_PAGE}_3_k"), format!("{ONE_PAGE}_3_v")]
        );
        assert_eq!(KeyLayout::mla().object_keys(&h), [format!("{ONE_PAGE}__k")]);
        let pp = KeyLayout {
            pp_rank: Some(1),
            ..KeyLayout::mha(2)
        };
        assert_eq!(pp.object_keys(&h)[1], format!("{ONE_PAGE}_2_1_v"));
        let mla_pp = KeyLayout {
            pp_rank: Some(1),
            ..KeyLayout::mla()
        };
        assert_eq!(mla_pp.object_keys(&h), [format!("{ONE_PAGE}_1_k")]);
        let prefix = KeyLayout::deployment_prefix(Some("prod"), Some("deepseek-ai/DeepSeek-V3"));
        assert_eq!(prefix.as_deref(), Some("prod_deepseek-ai-DeepSeek-V3"));
        assert_eq!(
            KeyLayout::deployment_prefix(None, Some("m")).as_deref(),
            Some("m")
        );
        assert_eq!(KeyLayout::deployment_prefix(None, None), None);
        let tagged = KeyLayout {
            prefix,
            ..KeyLayout::mha(0)
        };
        assert_eq!(
            tagged.object_keys(&h)[0],
            format!("prod_deepseek-ai-DeepSeek-V3_{ONE_PAGE}_0_k")
        );
        let pages = page_hashes(&(0..8).collect::<Vec<u32>>(), 4, None);
        assert_eq!(KeyLayout::mha(0).keys_of(&pages).len(), 4);
        assert_eq!(KeyLayout::mla().keys_of(&pages).len(), 2);
    }
}
