//! SGLang's page hashes (`mem_cache/utils.py`): page `i` of a prompt is identified by
//! `SHA-256(digest of page i-1 || token ids of page i as u32 little-endian)` (the first page
//! has no prefix), and its KV-event block hash is the digest's first 16 hex digits read as
//! a signed 64-bit integer (`hash_str_to_int64`): the first 8 bytes, big-endian,
//! two's complement. Equal hashes mean equal prefixes, so an index keyed by them is a
//! radix tree over pages. Only full pages are hashed (a partial last page is never cached).

use kvstore::hicache::{PageHash, page_hash};

/// A page's KV-event block hash.
pub type BlockHash = i64;

/// A page's full SHA-256 digest (the chain's link; SGLang's HiCache key is its hex form).
pub type PageDigest = [u8; 32];

/// The digest of one page of `tokens` following the page whose digest is `prior`: the
/// store's HiCache page hash ([`kvstore::hicache::page_hash`]), which is the same chain.
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
}
