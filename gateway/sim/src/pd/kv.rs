//! The simulated KV cache: what a token's KV bytes are (their size is the model shape's,
//! [`crate::config::ModelShape`]), derived from the token ids alone so both sides can check them.
//!
//! Each token has a slot of `bytes_per_token` bytes. Its first 16 bytes are a header:
//! the token id (u32 LE), its position (u32 LE) and the prefix chain (u64 LE), where
//! `chain(i) = mix(chain(i-1) ^ id(i) ^ position(i) << 32)` (so, like real KV, a slot
//! depends on every token before it). The rest of the slot is a stream of u64 words
//! derived from the chain. Pages hold `page_size` consecutive slots; a page's checksum is
//! CRC-32 over its used bytes.

use crate::model::mix;

/// Bytes of a slot's header (id, position, chain).
pub const HEADER_BYTES: usize = 16;

/// The chain value before the first token.
const CHAIN_SEED: u64 = 0x6b76_5f63_6861_696e;

/// The chain value of every prefix of `tokens` (`out[i]` covers tokens `0..=i`).
pub fn chains(tokens: &[u32]) -> Vec<u64> {
    let mut c = CHAIN_SEED;
    tokens
        .iter()
        .enumerate()
        .map(|(pos, &id)| {
            c = mix(c ^ u64::from(id) ^ (pos as u64) << 32);
            c
        })
        .collect()
}

/// Writes the slot of token `id` at `pos` with prefix chain `chain` into `slot`.
pub fn fill_slot(slot: &mut [u8], id: u32, pos: usize, chain: u64) {
    let (head, body) = slot.split_at_mut(HEADER_BYTES.min(slot.len()));
    let mut h = [0u8; HEADER_BYTES];
    h[..4].copy_from_slice(&id.to_le_bytes());
    h[4..8].copy_from_slice(&(pos as u32).to_le_bytes());
    h[8..].copy_from_slice(&chain.to_le_bytes());
    head.copy_from_slice(&h[..head.len()]);
    let mut words = body.chunks_exact_mut(8);
    let mut x = chain;
    for w in &mut words {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        w.copy_from_slice(
            &(x ^ (x >> 29))
                .wrapping_mul(0xbf58_476d_1ce4_e5b9)
                .to_le_bytes(),
        );
    }
    let rest = words.into_remainder();
    let tail = mix(x).to_le_bytes();
    rest.copy_from_slice(&tail[..rest.len()]);
}

/// Whether `slot` starts with the header of token `id` at `pos` with chain `chain`.
pub fn header_matches(slot: &[u8], id: u32, pos: usize, chain: u64) -> bool {
    let mut h = [0u8; HEADER_BYTES];
    h[..4].copy_from_slice(&id.to_le_bytes());
    h[4..8].copy_from_slice(&(pos as u32).to_le_bytes());
    h[8..].copy_from_slice(&chain.to_le_bytes());
    let n = HEADER_BYTES.min(slot.len());
    slot[..n] == h[..n]
}

/// How a prompt's KV is laid out in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per token slot.
    pub bytes_per_token: usize,
    /// Tokens per page.
    pub page_tokens: usize,
}

impl Layout {
    /// Bytes of a full page.
    pub fn page_bytes(&self) -> usize {
        self.bytes_per_token * self.page_tokens
    }

    /// Pages `tokens` tokens occupy.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_tokens)
    }

    /// Used bytes of page `page` (the last page of a prompt may be partial).
    pub fn used_bytes(&self, page: usize, tokens: usize) -> usize {
        let first = page * self.page_tokens;
        tokens.saturating_sub(first).min(self.page_tokens) * self.bytes_per_token
    }

    /// Fills `buf` (the used bytes of page `page`) with the KV of `tokens`.
    pub fn fill_page(&self, buf: &mut [u8], page: usize, tokens: &[u32], chains: &[u64]) {
        let first = page * self.page_tokens;
        for (k, slot) in buf.chunks_mut(self.bytes_per_token).enumerate() {
            let pos = first + k;
            fill_slot(slot, tokens[pos], pos, chains[pos]);
        }
    }

    /// Whether `buf` (page `page`'s used bytes) holds the headers of `tokens`.
    pub fn page_matches(&self, buf: &[u8], page: usize, tokens: &[u32], chains: &[u64]) -> bool {
        let first = page * self.page_tokens;
        buf.chunks(self.bytes_per_token)
            .enumerate()
            .all(|(k, slot)| {
                let pos = first + k;
                pos < tokens.len() && header_matches(slot, tokens[pos], pos, chains[pos])
            })
    }
}

/// Pages per checksum so that `pages` checksums fit in `max` entries.
pub fn checksum_group(pages: usize, max: usize) -> usize {
    pages.div_ceil(max.max(1)).max(1)
}

/// One checksum per `group` consecutive pages: their CRC-32s folded (rotate left by 5,
/// xor). A group of one is the page's CRC-32 itself.
pub fn group_checksums(page_crcs: &[u32], group: usize) -> Vec<u32> {
    page_crcs
        .chunks(group.max(1))
        .map(|c| c.iter().fold(0u32, |acc, x| acc.rotate_left(5) ^ x))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelShape;

    #[test]
    fn presets_have_the_documented_sizes() {
        assert_eq!(ModelShape::Llama3_8b.bytes_per_token(), 128 * 1024);
        assert_eq!(ModelShape::Llama3_70b.bytes_per_token(), 320 * 1024);
        assert_eq!(ModelShape::Qwen25_7b.bytes_per_token(), 56 * 1024);
        assert_eq!(ModelShape::Tiny.bytes_per_token(), 128);
    }

    #[test]
    fn slots_depend_on_the_whole_prefix_and_verify() {
        let l = Layout {
            bytes_per_token: 128,
            page_tokens: 4,
        };
        let a = [5, 6, 7, 8, 9, 10];
        let b = [5, 6, 7, 8, 9, 11];
        let (ca, cb) = (chains(&a), chains(&b));
        assert_eq!(ca[..5], cb[..5]);
        assert_ne!(ca[5], cb[5]);
        assert_eq!(
            (l.pages_for(6), l.used_bytes(0, 6), l.used_bytes(1, 6)),
            (2, 512, 256)
        );
        let mut p1 = vec![0u8; l.used_bytes(1, 6)];
        l.fill_page(&mut p1, 1, &a, &ca);
        assert!(l.page_matches(&p1, 1, &a, &ca));
        assert!(
            !l.page_matches(&p1, 1, &b, &cb),
            "a different prompt does not match"
        );
        assert!(!l.page_matches(&p1, 0, &a, &ca), "nor does another page");
        let mut again = vec![0u8; p1.len()];
        l.fill_page(&mut again, 1, &a, &ca);
        assert_eq!(p1, again, "deterministic");
        assert_ne!(p1[16..24], p1[24..32], "the body is not constant");
        assert_eq!(checksum_group(10, 3), 4);
        assert_eq!(checksum_group(0, 3), 1);
        assert_eq!(group_checksums(&[7, 9, 11], 1), vec![7, 9, 11]);
        assert_eq!(
            group_checksums(&[7, 9, 11], 2),
            vec![(7u32.rotate_left(5)) ^ 9, 11]
        );
    }
}
