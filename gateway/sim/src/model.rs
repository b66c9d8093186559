//! The simulated model: a deterministic tokenizer and word generator.
//!
//! **Tokenizer.** Text splits into pieces: each piece is a run of non-whitespace characters
//! together with the whitespace before it (`"Hi  there\n"` is `"Hi"`, `"  there"`, `"\n"`;
//! trailing whitespace is a piece of its own). A piece's token id is the FNV-1a hash of its
//! UTF-8 bytes folded into `[FIRST_HASHED_ID, VOCAB_SIZE)`. A text prompt starts with
//! [`BOS_TOKEN_ID`], so its token count is pieces + 1. A chat prompt counts as
//! BOS + Σ over messages (`MESSAGE_OVERHEAD` + pieces of the message's text) plus
//! `REPLY_PRIMER` (role markers and the assistant header of a chat template). As ids
//! ([`role_header`]), each message opens with [`ROLE_OPEN`], the id of its role (lower
//! case) and [`ROLE_CLOSE`], and the reply primer is the header of role `assistant`.
//!
//! **Generator.** Output token `k` of choice `j` is `WORDS[i]` (a space, then a word), where
//! `i` comes from a SplitMix64 stream seeded by the prompt (text bytes or token ids), the
//! request's `seed` and `j`; the token id is the tokenizer's id of that piece, so
//! re-tokenizing the output gives the same ids. After the configured number of words the model emits
//! [`EOS_TOKEN_ID`] (no text). Log probabilities are derived from the same stream: the
//! chosen word is always the most likely one, its alternatives are the next words of the
//! list, each 0.75 nats less likely than the one before.

/// Vocabulary size: token ids are below this.
pub const VOCAB_SIZE: u32 = 32000;
/// Beginning-of-sequence token id (prepended to text prompts).
pub const BOS_TOKEN_ID: u32 = 1;
/// End-of-sequence token id.
pub const EOS_TOKEN_ID: u32 = 2;
/// Text shown for the end-of-sequence token in logprobs (it adds nothing to output text).
pub const EOS_TEXT: &str = "</s>";
/// Text shown for the beginning-of-sequence token in logprobs and echoes of token prompts.
pub const BOS_TEXT: &str = "<s>";
/// Ids below this are reserved for special tokens; hashed pieces land at or above it.
pub const FIRST_HASHED_ID: u32 = 256;
/// Tokens a chat template adds per message.
pub const MESSAGE_OVERHEAD: u64 = 3;
/// Opens a chat message's role header.
pub const ROLE_OPEN: u32 = 3;
/// Closes a chat message's role header.
pub const ROLE_CLOSE: u32 = 4;
/// Tokens a chat template adds to open the assistant's reply.
pub const REPLY_PRIMER: u64 = 3;
/// How much less likely each alternative in `top_logprobs` is than the previous one.
const ALTERNATIVE_STEP: f64 = 0.75;

/// The words the model writes, each with the space before it.
pub const WORDS: [&str; 64] = [
    " the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", " and", " then",
    " runs", " into", " a", " quiet", " forest", " where", " tall", " trees", " grow", " near",
    " river", " that", " flows", " past", " old", " stone", " bridge", " under", " bright",
    " moon", " while", " small", " birds", " sing", " soft", " songs", " about", " distant",
    " hills", " green", " fields", " warm", " summer", " rain", " falling", " on", " roofs", " of",
    " sleepy", " towns", " far", " away", " from", " busy", " roads", " every", " story",
    " begins", " with", " one", " simple", " word", " spoken", " aloud",
];

/// FNV-1a, 64-bit, continuing from `h`.
pub const fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// FNV-1a's offset basis: the hash of nothing.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// Token id of one piece of text.
pub const fn piece_id(piece: &[u8]) -> u32 {
    let span = (VOCAB_SIZE - FIRST_HASHED_ID) as u64;
    FIRST_HASHED_ID + (fnv1a(FNV_OFFSET, piece) % span) as u32
}

const fn word_ids() -> [u32; WORDS.len()] {
    let mut ids = [0; WORDS.len()];
    let mut i = 0;
    while i < WORDS.len() {
        ids[i] = piece_id(WORDS[i].as_bytes());
        i += 1;
    }
    ids
}

/// Token id of each word of [`WORDS`].
pub const WORD_IDS: [u32; WORDS.len()] = word_ids();

/// The pieces of `text`, as byte ranges, in order (see the module docs).
pub fn pieces(text: &str) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let bytes = text.as_bytes();
    let mut pos = 0;
    std::iter::from_fn(move || {
        if pos >= bytes.len() {
            return None;
        }
        let start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
            pos += 1;
        }
        while pos < bytes.len() && !bytes[pos].is_ascii_whitespace() {
            pos += 1;
        }
        Some(start..pos)
    })
}

/// Number of pieces of `text` (no BOS): every word start (a non-whitespace byte at the
/// start or after whitespace), plus one for trailing whitespace. Long prompts are counted
/// on every request, so this is written for the vectorizer: branch-free, in blocks of 128
/// byte pairs with a byte-sized counter (at most 64 word starts fit in a block).
pub fn count_pieces(text: &str) -> u64 {
    let b = text.as_bytes();
    let (Some(&first), Some(&last)) = (b.first(), b.last()) else {
        return 0;
    };
    let (before, after) = (&b[..b.len() - 1], &b[1..]);
    let mut starts = 0u64;
    for (x, y) in before.chunks(128).zip(after.chunks(128)) {
        let mut n = 0u8;
        for (&p, &c) in x.iter().zip(y) {
            n += u8::from(is_space(p) & !is_space(c));
        }
        starts += u64::from(n);
    }
    starts + u64::from(!is_space(first)) + u64::from(is_space(last))
}

/// `u8::is_ascii_whitespace` without branches.
#[inline]
fn is_space(b: u8) -> bool {
    (b == b' ') | (b == b'\t') | (b == b'\n') | (b == 0x0c) | (b == b'\r')
}

/// Continues hash `h` over `bytes`, eight bytes at a time (the seed of a prompt's words;
/// not FNV-1a, which is byte-serial and too slow for long prompts).
pub fn hash_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w) ^ (rest.len() as u64) << 59).wrapping_mul(K);
    }
    h
}

/// Token ids of a text prompt: BOS, then one id per piece.
pub fn tokenize_prompt(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len() / 4 + 1);
    ids.push(BOS_TOKEN_ID);
    ids.extend(pieces(text).map(|r| piece_id(&text.as_bytes()[r])));
    ids
}

/// The `MESSAGE_OVERHEAD` ids opening a chat message of `role` (also the reply primer, for
/// role `assistant`).
pub fn role_header(role: &str) -> [u32; 3] {
    [
        ROLE_OPEN,
        piece_id(role.to_ascii_lowercase().as_bytes()),
        ROLE_CLOSE,
    ]
}

/// Text of token `id` for logprobs and echoes: a word it generates, a special token, or
/// `<id>` for an id it cannot spell (hashed pieces are not reversible).
pub fn token_text(id: u32) -> String {
    match static_text(id) {
        "<unk>" => format!("<{id}>"),
        known => known.to_owned(),
    }
}

/// SplitMix64: a small, fast, well-mixed deterministic stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
}

/// SplitMix64's finalizer.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One generated token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Token {
    /// Token id.
    pub id: u32,
    /// Index into [`WORDS`], or `None` for end-of-sequence.
    pub word: Option<u8>,
    /// Log probability of the token.
    pub logprob: f64,
}

impl Token {
    /// The end-of-sequence token, with log probability `logprob`.
    pub fn eos(logprob: f64) -> Self {
        Token {
            id: EOS_TOKEN_ID,
            word: None,
            logprob,
        }
    }

    /// The text the token adds to the output (`" word"`, or nothing for EOS).
    pub fn text(&self) -> &'static str {
        match self.word {
            Some(i) => WORDS[i as usize],
            None => "",
        }
    }

    /// Text shown for this token in logprobs.
    pub fn display(&self) -> &'static str {
        match self.word {
            Some(i) => WORDS[i as usize],
            None => EOS_TEXT,
        }
    }

    /// The `k` most likely tokens at this position, most likely first (the token itself
    /// first): `(id, text, logprob)`.
    pub fn top(&self, k: usize) -> impl Iterator<Item = (u32, &'static str, f64)> + '_ {
        top_alternatives(self.id, self.logprob, k).map(|(id, lp)| (id, static_text(id), lp))
    }
}

/// The `k` most likely tokens at a position where `id` was chosen with `logprob`: `id`
/// first, then the words of [`WORDS`] after `id`'s word (after word `id % 64` for other
/// tokens), each `ALTERNATIVE_STEP` less likely than the one before.
pub fn top_alternatives(id: u32, logprob: f64, k: usize) -> impl Iterator<Item = (u32, f64)> {
    let first = WORD_IDS
        .iter()
        .position(|&w| w == id)
        .unwrap_or(id as usize % WORDS.len());
    (0..k).map(move |i| {
        if i == 0 {
            return (id, logprob);
        }
        // Rounded to milli-nats, like the chosen token's own value.
        let lp = ((logprob - ALTERNATIVE_STEP * i as f64) * 1000.0).round() / 1000.0;
        (WORD_IDS[(first + i) % WORDS.len()], lp)
    })
}

/// Text of a token the model can spell without allocating: a word or a special token
/// (`<unk>` for hashed prompt pieces; [`token_text`] names those by id).
pub fn static_text(id: u32) -> &'static str {
    match id {
        BOS_TOKEN_ID => BOS_TEXT,
        EOS_TOKEN_ID => EOS_TEXT,
        _ => WORD_IDS
            .iter()
            .position(|&w| w == id)
            .map_or("<unk>", |i| WORDS[i]),
    }
}

/// Log probability in `[-2, 0)` derived from a random value.
fn logprob_of(r: u64) -> f64 {
    -(((r >> 11) % 1999) as f64 + 1.0) / 1000.0
}

/// The word stream of one choice.
#[derive(Debug, Clone)]
pub struct Generator {
    rng: Rng,
}

impl Generator {
    /// The stream for choice `choice` of a prompt whose hash is `prompt_hash`, with the
    /// request's `seed` (if any).
    pub fn new(prompt_hash: u64, seed: Option<i64>, choice: u32) -> Self {
        let seed = seed.map_or(0, |s| mix(s as u64 ^ 0x5eed));
        Generator {
            rng: Rng::new(prompt_hash ^ seed ^ mix(u64::from(choice) + 1)),
        }
    }

    /// The next word token.
    pub fn next_word(&mut self) -> Token {
        let r = self.rng.next_u64();
        let w = (r % WORDS.len() as u64) as usize;
        Token {
            id: WORD_IDS[w],
            word: Some(w as u8),
            logprob: logprob_of(r),
        }
    }

    /// The end-of-sequence token at the current position.
    pub fn eos(&mut self) -> Token {
        Token::eos(logprob_of(self.rng.next_u64()))
    }
}

/// Log probability of prompt token `id` at position `pos` (the first has none).
pub fn prompt_logprob(id: u32, pos: usize) -> Option<f64> {
    (pos > 0).then(|| logprob_of(mix(u64::from(id) << 32 | pos as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_keep_leading_whitespace() {
        let t = "Hi  there\nyou ";
        let p: Vec<&str> = pieces(t).map(|r| &t[r]).collect();
        assert_eq!(p, ["Hi", "  there", "\nyou", " "]);
        assert_eq!(count_pieces(t), 4);
        assert_eq!(count_pieces(""), 0);
        assert_eq!(count_pieces("   "), 1);
        assert_eq!(count_pieces("héllo wörld"), 2);
        for s in [
            "a b c",
            " a",
            "a\n\nb  ",
            "x",
            "\t",
            "a\x0bb",
            "\r\n x\x0c",
            "ü ü",
            "  a  b  ",
        ] {
            assert_eq!(count_pieces(s), pieces(s).count() as u64, "{s:?}");
        }
        // Every short string over a small alphabet, including multi-byte characters.
        let alphabet = ["a", " ", "\n", "é", "\t"];
        for n in 0..6u32 {
            for mut code in 0..alphabet.len().pow(n) {
                let mut s = String::new();
                for _ in 0..n {
                    s.push_str(alphabet[code % alphabet.len()]);
                    code /= alphabet.len();
                }
                assert_eq!(count_pieces(&s), pieces(&s).count() as u64, "{s:?}");
            }
        }
    }

    #[test]
    fn hash_bytes_sees_every_byte() {
        let a = hash_bytes(0, b"0123456789abcdef-x");
        assert_ne!(a, hash_bytes(0, b"0123456789abcdef-y"));
        assert_ne!(hash_bytes(0, b"ab"), hash_bytes(0, b"ab\0"));
        assert_eq!(a, hash_bytes(0, b"0123456789abcdef-x"));
    }

    #[test]
    fn output_retokenizes_to_the_same_ids() {
        let mut g = Generator::new(fnv1a(FNV_OFFSET, b"prompt"), None, 0);
        let toks: Vec<Token> = (0..20).map(|_| g.next_word()).collect();
        let text: String = toks.iter().map(|t| t.text()).collect();
        let ids = tokenize_prompt(&text);
        assert_eq!(ids[0], BOS_TOKEN_ID);
        assert_eq!(&ids[1..], toks.iter().map(|t| t.id).collect::<Vec<_>>());
        for t in &toks {
            assert_eq!(token_text(t.id), t.text());
            assert!(t.logprob < 0.0 && t.logprob >= -2.0);
        }
        assert!(
            WORDS
                .iter()
                .all(|w| w.starts_with(' ') && count_pieces(w) == 1)
        );
    }

    #[test]
    fn generation_is_deterministic_and_seeded() {
        let words = |h, seed, c| {
            let mut g = Generator::new(h, seed, c);
            (0..8).map(|_| g.next_word().id).collect::<Vec<_>>()
        };
        assert_eq!(words(1, None, 0), words(1, None, 0));
        assert_ne!(words(1, None, 0), words(2, None, 0));
        assert_ne!(words(1, None, 0), words(1, None, 1));
        assert_ne!(words(1, None, 0), words(1, Some(7), 0));
    }

    #[test]
    fn top_alternatives_descend() {
        let t = Generator::new(3, None, 0).next_word();
        let top: Vec<_> = t.top(3).collect();
        assert_eq!(top[0].0, t.id);
        assert!(top[0].2 > top[1].2 && top[1].2 > top[2].2);
        assert_ne!(top[1].0, t.id);
        assert_eq!(prompt_logprob(5, 0), None);
        assert!(prompt_logprob(5, 1).unwrap() < 0.0);
    }
}
