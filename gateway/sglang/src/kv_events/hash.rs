//! SGLang's page hashes (`mem_cache/utils.py`): page `i` of a prompt is identified by
//! `SHA-256(digest of page i-1 || token ids of page i as u32 little-endian)` (the first page
//! has no prefix), and its KV-event block hash is the digest's first 16 hex digits read as
//! a signed 64-bit integer (`hash_str_to_int64`): the first 8 bytes, big-endian,
//! two's complement. Equal hashes mean equal prefixes, so an index keyed by them is a
//! radix tree over pages. Only full pages are hashed (a partial last page is never cached).

use crate::hicache::{PageHash, page_hash};
use parking_lot::Mutex;

use crate::memo::{Generations, KeyedHash};

/// A page's KV-event block hash.
pub type BlockHash = i64;

/// A page's full SHA-256 digest (the chain's link; SGLang's HiCache key is its hex form).
pub type PageDigest = [u8; 32];

/// The digest of one page of `tokens` following the page whose digest is `prior`: the
/// store's HiCache page hash ([`crate::hicache::page_hash`]), which is the same chain.
pub fn page_digest(prior: Option<&PageDigest>, tokens: &[u32]) -> PageDigest {
    page_hash(tokens, prior.map(|p| PageHash(*p)).as_ref()).0
}

/// `hash_str_to_int64(digest.hex())`.
pub fn block_hash(digest: &PageDigest) -> BlockHash {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// Digests of every full page of `tokens` (`page_size` tokens each; 0 yields none).
pub fn page_digests(tokens: &[u32], page_size: usize) -> Vec<PageDigest> {
    if page_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / page_size);
    for page in tokens.chunks_exact(page_size) {
        let d = page_digest(out.last(), page);
        out.push(d);
    }
    out
}

/// Block hashes of every full page of `tokens`.
pub fn block_hashes(tokens: &[u32], page_size: usize) -> Vec<BlockHash> {
    page_digests(tokens, page_size)
        .iter()
        .map(block_hash)
        .collect()
}

/// Entries a [`DigestMemo`] generation holds at most: 7/8 of a 32 Ki-slot table, so a full
/// generation is one table of about 1.6 MiB (32 Ki slots of 48 bytes and a control byte),
/// and the memo at most two.
pub const MEMO_PAGES: usize = 28 * 1024;

/// Digests of the pages met before, so that a prompt sharing a prefix with an earlier one
/// (a system prompt, a conversation's earlier turns, a document asked about again) is not
/// hashed again: SHA-256 costs 100-200 ns a page of 16 to 64 tokens, a lookup here about a
/// quarter of that (`cargo bench -p gateway --bench kv_index -- match/`).
///
/// A page is found by a [`KeyedHash`] of its tokens chained through its prefix's, so a hit
/// means the same tokens from the prompt's first page to this one (see [`crate::memo`]);
/// the pages are held in two [`Generations`] of at most [`MEMO_PAGES`] each.
pub struct DigestMemo {
    hash: KeyedHash,
    maps: Mutex<Generations<PageDigest>>,
}

impl Default for DigestMemo {
    fn default() -> Self {
        DigestMemo {
            hash: KeyedHash::default(),
            maps: Mutex::new(Generations::new(MEMO_PAGES, |_| 1)),
        }
    }
}

impl std::fmt::Debug for DigestMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DigestMemo")
            .field("pages", &self.len())
            .finish()
    }
}

impl DigestMemo {
    /// [`page_digests`], each page found here when met before and hashed (and kept) when not.
    pub fn page_digests(&self, tokens: &[u32], page_size: usize) -> Vec<PageDigest> {
        if page_size == 0 {
            return Vec::new();
        }
        let links = self.links(tokens, page_size);
        let found: Vec<Option<PageDigest>> = {
            let mut maps = self.maps.lock();
            links.iter().map(|&l| maps.get(l)).collect()
        };
        let mut out: Vec<PageDigest> = Vec::with_capacity(links.len());
        let mut fresh = Vec::new();
        for ((page, found), &l) in tokens.chunks_exact(page_size).zip(found).zip(&links) {
            let d = found.unwrap_or_else(|| {
                let d = page_digest(out.last(), page);
                fresh.push((l, d));
                d
            });
            out.push(d);
        }
        if !fresh.is_empty() {
            let mut maps = self.maps.lock();
            for (l, d) in fresh {
                maps.insert(l, d);
            }
        }
        out
    }

    /// The keyed chain of `tokens`' full pages (`page_size` > 0).
    fn links(&self, tokens: &[u32], page_size: usize) -> Vec<u128> {
        let mut link = 0u128;
        tokens
            .chunks_exact(page_size)
            .map(|page| {
                link = self.hash.key(&(link, page));
                link
            })
            .collect()
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.maps.lock().len()
    }

    /// Whether no page is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed with SGLang's own `get_hash_str` / `hash_str_to_int64` (Python, hashlib).
    #[test]
    fn golden_hashes_from_sglangs_algorithm() {
        let toks: Vec<u32> = (1..=8).collect();
        let d = page_digests(&toks, 4);
        assert_eq!(
            hex::encode(d[0]),
            "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72"
        );
        assert_eq!(
            hex::encode(d[1]),
            "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6"
        );
        assert_eq!(
            block_hashes(&toks, 4),
            [-3488128144981237669, 5674439469042975057]
        );
        let big: Vec<u32> = (0..32).map(|i| 100_000 + 7 * i).collect();
        assert_eq!(
            block_hashes(&big, 16),
            [7713085936572191551, 3875609871697640129]
        );
        // The partial last page is not hashed.
        assert_eq!(block_hashes(&big[..31], 16).len(), 1);
        assert!(block_hashes(&big, 0).is_empty());
    }

    #[test]
    fn the_memo_gives_the_digests_it_would_compute() {
        let memo = DigestMemo::default();
        let a: Vec<u32> = (0..64).collect();
        assert_eq!(memo.page_digests(&a, 16), page_digests(&a, 16));
        assert_eq!(memo.len(), 4);
        // A prompt sharing the first two pages: those are found, the rest hashed.
        let mut b = a[..32].to_vec();
        b.extend(1000..1040);
        assert_eq!(memo.page_digests(&b, 16), page_digests(&b, 16));
        assert_eq!(
            memo.len(),
            6,
            "two new pages (the partial last one is not hashed)"
        );
        // The same tokens in another page size, or after another prefix, are other pages.
        assert_eq!(memo.page_digests(&a, 8), page_digests(&a, 8));
        assert_eq!(memo.page_digests(&a[16..], 16), page_digests(&a[16..], 16));
        assert_eq!(memo.len(), 6 + 8 + 3);
        assert!(memo.page_digests(&a, 0).is_empty());
        assert!(memo.page_digests(&a[..15], 16).is_empty());
    }

    #[test]
    fn the_memo_stays_within_two_generations_and_keeps_what_is_used() {
        let memo = DigestMemo::default();
        let hot: Vec<u32> = (0..4).collect();
        let want = page_digests(&hot, 4);
        let mut cold = 0u32;
        for round in 0..3 * MEMO_PAGES / 1024 {
            assert_eq!(memo.page_digests(&hot, 4), want);
            // 1024 one-page prompts never seen again.
            for _ in 0..1024 {
                cold += 1;
                memo.page_digests(&[cold, cold, cold, u32::MAX], 4);
            }
            assert!(
                memo.len() <= 2 * MEMO_PAGES,
                "round {round}: {}",
                memo.len()
            );
        }
        assert!(memo.len() > MEMO_PAGES);
        // The page used every round is still held; the first cold ones are gone.
        let held = |t: &[u32]| {
            let l = memo.links(t, 4)[0];
            memo.maps.lock().contains(l)
        };
        assert!(held(&hot));
        assert!(!held(&[1, 1, 1, u32::MAX]));
        assert!(held(&[cold, cold, cold, u32::MAX]));
    }
}
