//! Rewriting an answer on its way to the client: a [`Rewrite`] sees the worker's body frame
//! by frame and says what to send instead (PD's logprob merge of a stream, event by event);
//! [`Whole`] holds a whole body up to a bound and rewrites it at the end (the merge of a
//! whole answer, the error envelope); [`Rewritten`] applies a rewrite to a response the
//! router already made (the rerank envelope, the response-id tap).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body::Frame;

/// Changes an answer's bytes on their way to the client.
pub trait Rewrite: Send {
    /// One frame of the worker's body: what to send now (empty: nothing yet).
    fn push(&mut self, chunk: &[u8]) -> Bytes;
    /// [`Rewrite::push`] of an owned frame (a rewrite that sends frames on unchanged
    /// returns it without a copy).
    fn push_bytes(&mut self, chunk: Bytes) -> Bytes {
        self.push(&chunk)
    }
    /// The end of the worker's body: what is left to send.
    fn finish(&mut self) -> Bytes;
}

/// What a [`Whole`] rewrite does with a body over its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Send it unchanged (what was held first, then the rest as it comes).
    PassThrough,
    /// Rewrite what was held and drop the rest.
    Truncate,
}

/// A rewrite of the whole body: holds it (up to `limit` bytes) and sends what `f` makes of
/// it at the end (`f` returning `None`: the body unchanged).
pub struct Whole<F> {
    held: BytesMut,
    limit: usize,
    overflow: Overflow,
    /// Over the bound: passing through, or dropping.
    over: bool,
    f: Option<F>,
}

impl<F> Whole<F> {
    /// A rewrite with `f`, holding at most `limit` bytes.
    pub fn new(limit: usize, overflow: Overflow, f: F) -> Self {
        Self {
            held: BytesMut::new(),
            limit,
            overflow,
            over: false,
            f: Some(f),
        }
    }
}

impl<F> Rewrite for Whole<F>
where
    F: FnOnce(&[u8]) -> Option<Vec<u8>> + Send,
{
    fn push(&mut self, chunk: &[u8]) -> Bytes {
        match (self.over, self.overflow) {
            (true, Overflow::PassThrough) => return Bytes::copy_from_slice(chunk),
            (true, Overflow::Truncate) => return Bytes::new(),
            (false, _) => {}
        }
        if self.held.len() + chunk.len() <= self.limit {
            self.held.extend_from_slice(chunk);
            return Bytes::new();
        }
        self.over = true;
        match self.overflow {
            Overflow::PassThrough => {
                self.f = None;
                self.held.extend_from_slice(chunk);
                self.held.split().freeze()
            }
            Overflow::Truncate => {
                let room = self.limit - self.held.len();
                self.held.extend_from_slice(&chunk[..room]);
                Bytes::new()
            }
        }
    }

    fn finish(&mut self) -> Bytes {
        let held = self.held.split().freeze();
        match self.f.take() {
            Some(f) => f(&held).map(Bytes::from).unwrap_or(held),
            None => held,
        }
    }
}

/// A response body seen through a [`Rewrite`].
pub struct Rewritten {
    inner: Body,
    rewrite: Box<dyn Rewrite>,
    done: bool,
}

impl Rewritten {
    /// `inner`'s bytes as `rewrite` makes them.
    pub fn new(inner: Body, rewrite: Box<dyn Rewrite>) -> Self {
        Self {
            inner,
            rewrite,
            done: false,
        }
    }
}

impl http_body::Body for Rewritten {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        while !this.done {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.rewrite.push_bytes(data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(other) => return Poll::Ready(Some(Ok(other))),
                },
                Some(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    this.done = true;
                    let rest = this.rewrite.finish();
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                }
            }
        }
        Poll::Ready(None)
    }
}

/// `resp` with its body through `rewrite`; its length, if it had one, is kept only when
/// `same_length` (a rewrite that sends the bytes on unchanged).
pub fn rewrite_response(
    resp: axum::response::Response,
    rewrite: Box<dyn Rewrite>,
    same_length: bool,
) -> axum::response::Response {
    let (mut parts, body) = resp.into_parts();
    if !same_length {
        parts.headers.remove(http::header::CONTENT_LENGTH);
    }
    axum::response::Response::from_parts(parts, Body::new(Rewritten::new(body, rewrite)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F: FnOnce(&[u8]) -> Option<Vec<u8>> + Send>(
        mut w: Whole<F>,
        chunks: &[&[u8]],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&w.push(c));
        }
        out.extend_from_slice(&w.finish());
        out
    }

    #[test]
    fn whole_rewrites_hold_at_most_their_bound() {
        let upper = |b: &[u8]| Some(b.to_ascii_uppercase());
        assert_eq!(
            run(Whole::new(8, Overflow::PassThrough, upper), &[b"ab", b"cd"]),
            b"ABCD"
        );
        // Over the bound: what was held, then the rest, unchanged.
        let w = Whole::new(3, Overflow::PassThrough, upper);
        assert_eq!(run(w, &[b"ab", b"cd", b"ef"]), b"abcdef");
        // Truncated: the rewrite sees the first `limit` bytes only.
        let w = Whole::new(3, Overflow::Truncate, upper);
        assert_eq!(run(w, &[b"ab", b"cd", b"ef"]), b"ABC");
        // No rewrite: the bytes as they came.
        let w = Whole::new(8, Overflow::Truncate, |_: &[u8]| None);
        assert_eq!(run(w, &[b"ab", b"cd"]), b"abcd");
    }
}
