//! The values store-bench writes and how it checks what it reads: a shared pseudo-random
//! body, each value stamped with its index at both ends, compared byte for byte or
//! spot-checked.

/// Bytes of a value's index stamp at its head and tail.
pub(crate) fn stamp_spans(len: usize) -> (usize, usize) {
    (len.min(8), if len >= 16 { 8 } else { 0 })
}

/// The value with index `i`: the shared body with `i` in its first 8 bytes and `!i` in its
/// last 8.
pub(crate) fn stamp(v: &mut [u8], i: u64) {
    let (h, t) = stamp_spans(v.len());
    v[..h].copy_from_slice(&i.to_le_bytes()[..h]);
    let l = v.len();
    v[l - t..].copy_from_slice(&(!i).to_le_bytes()[..t]);
}

pub(crate) fn body(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Byte `k` of the value with index `i` (see [`stamp`]).
fn value_byte(body: &[u8], i: u64, k: usize) -> u8 {
    let l = body.len();
    let (h, t) = stamp_spans(l);
    if k < h {
        i.to_le_bytes()[k]
    } else if k >= l - t {
        (!i).to_le_bytes()[k - (l - t)]
    } else {
        body[k]
    }
}

/// The ranges a spot check of the value with index `i` (of `len` bytes) reads: both
/// stamped ends and one 4 KiB page chosen by `i`.
fn spot_ranges(len: usize, i: u64) -> [std::ops::Range<usize>; 3] {
    let page = len.min(4096);
    let p = (i as usize).wrapping_mul(0x9e37_79b9) % (len / page.max(1)).max(1);
    [
        0..len.min(16),
        len.saturating_sub(16)..len,
        p * page..p * page + page,
    ]
}

/// Whether the bytes `read` gives for the ranges of [`spot_ranges`] are those of the value
/// with index `i`.
pub(crate) fn spot_check(
    body: &[u8],
    i: u64,
    mut read: impl FnMut(usize, &mut [u8]) -> bool,
) -> bool {
    let mut buf = [0u8; 4096];
    spot_ranges(body.len(), i).into_iter().all(|r| {
        let got = &mut buf[..r.len()];
        read(r.start, got) && got.iter().zip(r).all(|(&b, k)| b == value_byte(body, i, k))
    })
}

/// Whether `got` is exactly the value with index `i`.
pub(crate) fn is_value(got: &[u8], body: &[u8], i: u64) -> bool {
    let l = body.len();
    let (h, t) = stamp_spans(l);
    got.len() == l
        && got[..h] == i.to_le_bytes()[..h]
        && got[l - t..] == (!i).to_le_bytes()[..t]
        && got[h..l - t] == body[h..l - t]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spot_check_reads_the_stamps_and_one_page_of_a_value() {
        let size = 1 << 20;
        let body = body(size);
        let mut v = body.clone();
        stamp(&mut v, 7);
        let check = |v: &[u8], i: u64| {
            spot_check(&body, i, |at, out: &mut [u8]| {
                v.get(at..at + out.len())
                    .map(|b| out.copy_from_slice(b))
                    .is_some()
            })
        };
        assert!(check(&v, 7) && is_value(&v, &body, 7));
        // Another value's stamps, or the unstamped body: caught.
        assert!(!check(&v, 8));
        assert!(!check(&body, 7));
        // A byte wrong in the page the check samples: caught; elsewhere only a full
        // compare sees it.
        let page = spot_ranges(size, 7)[2].clone();
        let mut bad = v.clone();
        bad[page.start + 100] ^= 1;
        assert!(!check(&bad, 7));
        let mut elsewhere = v.clone();
        let off = if page.start == 4096 { 8192 } else { 4096 };
        elsewhere[off + 5] ^= 1;
        assert!(check(&elsewhere, 7) && !is_value(&elsewhere, &body, 7));
        // A short value: the read past its end fails.
        assert!(!check(&v[..size / 2], 7));
    }
}
