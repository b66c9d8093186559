//! Request ids: the client's id when it sends a usable one in one of the
//! `--request-id-headers` (sglang-router's default: `x-request-id`, `x-correlation-id`,
//! `x-trace-id`, `request-id`; the first found wins), else a fresh UUID-shaped id from a
//! per-process random prefix and a counter (no syscall, no lock). Either way it is the
//! request's `x-request-id` from then on: sent to the worker, echoed to the client.
//!
//! The front door's [`RequestIdLayer`] is the one place an id is read or minted: it puts
//! the id on the request (header and [`RequestId`] extension) and echoes it on the answer.
//! tower-http's request-id layer reads one header only, so it cannot follow
//! `--request-id-headers`' order; this is that layer with the order.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};

use crate::proxy::dispatch::X_REQUEST_ID;

/// Longest client-supplied id kept.
const MAX_LEN: usize = 256;

/// The headers a request id is read from, in order.
#[derive(Debug, Clone)]
pub struct RequestIds {
    names: Vec<HeaderName>,
}

impl Default for RequestIds {
    /// `x-request-id` only.
    fn default() -> Self {
        Self {
            names: vec![X_REQUEST_ID.clone()],
        }
    }
}

impl RequestIds {
    /// Reads ids from `names` (case-insensitive; names that are not header names are
    /// skipped, configuration validation reports them).
    pub fn new(names: &[String]) -> Self {
        let names = names
            .iter()
            .filter_map(|n| HeaderName::from_bytes(n.to_ascii_lowercase().as_bytes()).ok())
            .collect();
        Self { names }
    }

    /// Returns the request's id and makes it the request's `x-request-id` header.
    pub fn ensure(&self, headers: &mut HeaderMap) -> HeaderValue {
        for name in &self.names {
            if let Some(v) = headers.get(name)
                && !v.is_empty()
                && v.len() <= MAX_LEN
            {
                let v = v.clone();
                if *name != X_REQUEST_ID {
                    headers.insert(X_REQUEST_ID.clone(), v.clone());
                }
                return v;
            }
        }
        let id = mint();
        headers.insert(X_REQUEST_ID.clone(), id.clone());
        id
    }
}

/// The id of a request, as the front door read or minted it (a request extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub HeaderValue);

/// Gives every request its id ([`RequestIds::ensure`]) and echoes it as the answer's
/// `x-request-id`.
#[derive(Clone, Debug)]
pub struct RequestIdLayer {
    ids: Arc<RequestIds>,
}

impl RequestIdLayer {
    /// Reads ids from `ids`' headers, else mints them.
    pub fn new(ids: Arc<RequestIds>) -> Self {
        Self { ids }
    }
}

impl<S> tower::Layer<S> for RequestIdLayer {
    type Service = SetRequestId<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SetRequestId {
            inner,
            ids: self.ids.clone(),
        }
    }
}

/// The service of [`RequestIdLayer`].
#[derive(Clone, Debug)]
pub struct SetRequestId<S> {
    inner: S,
    ids: Arc<RequestIds>,
}

impl<S, B, R> tower::Service<Request<B>> for SetRequestId<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Unpin,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = EchoId<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let id = self.ids.ensure(req.headers_mut());
        req.extensions_mut().insert(RequestId(id.clone()));
        EchoId {
            inner: self.inner.call(req),
            id: Some(id),
        }
    }
}

/// The answer of [`SetRequestId`], with the request's id as its `x-request-id`.
pub struct EchoId<F> {
    inner: F,
    id: Option<HeaderValue>,
}

impl<F, R, E> Future for EchoId<F>
where
    F: Future<Output = Result<Response<R>, E>> + Unpin,
{
    type Output = Result<Response<R>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut resp = std::task::ready!(Pin::new(&mut self.inner).poll(cx))?;
        if let Some(id) = self.id.take() {
            resp.headers_mut().insert(X_REQUEST_ID.clone(), id);
        }
        Poll::Ready(Ok(resp))
    }
}

/// [`RequestIds::ensure`] with `x-request-id` only.
pub fn ensure(headers: &mut HeaderMap) -> HeaderValue {
    RequestIds::default().ensure(headers)
}

/// A new id, `xxxxxxxx-xxxx-4xxx-8xxx-xxxxxxxxxxxx`.
pub fn mint() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(rand::random::<u64>);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let hi = prefix;
    let lo = n ^ (prefix.rotate_left(17) & 0x0000_ffff_0000_0000);
    let mut buf = [0u8; 36];
    let hex = b"0123456789abcdef";
    let digits = (hi as u128) << 64 | lo as u128;
    let mut j = 0;
    for i in 0..32 {
        if matches!(i, 8 | 12 | 16 | 20) {
            buf[j] = b'-';
            j += 1;
        }
        let nib = match i {
            12 => 4,
            16 => 8 | ((digits >> (124 - 4 * i)) & 0x3) as usize,
            _ => ((digits >> (124 - 4 * i)) & 0xf) as usize,
        };
        buf[j] = hex[nib];
        j += 1;
    }
    HeaderValue::from_bytes(&buf).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_client_ids_and_mints_unique_ones() {
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID.clone(), HeaderValue::from_static("abc"));
        assert_eq!(ensure(&mut h), "abc");
        let mut h = HeaderMap::new();
        let a = ensure(&mut h);
        assert_eq!(h.get(&X_REQUEST_ID), Some(&a));
        let b = mint();
        assert_ne!(a, b);
        let s = a.to_str().unwrap();
        assert_eq!(s.len(), 36);
        assert_eq!(&s[14..15], "4");
        assert!(uuid::Uuid::parse_str(s).is_ok(), "{s}");
        let mut h = HeaderMap::new();
        h.insert(X_REQUEST_ID.clone(), HeaderValue::from_static(""));
        assert_ne!(ensure(&mut h), "");
    }

    #[test]
    fn configured_headers_are_read_in_order() {
        let ids = RequestIds::new(&[
            "X-Trace-Id".into(),
            "x-request-id".into(),
            "bad name".into(),
        ]);
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("req"));
        h.insert("x-trace-id", HeaderValue::from_static("trace"));
        assert_eq!(ids.ensure(&mut h), "trace");
        assert_eq!(h[&X_REQUEST_ID], "trace", "the id becomes the x-request-id");
        let mut h = HeaderMap::new();
        h.insert("x-trace-id", HeaderValue::from_static(""));
        h.insert("x-request-id", HeaderValue::from_static("req"));
        assert_eq!(ids.ensure(&mut h), "req", "an empty one is skipped");
        let mut h = HeaderMap::new();
        h.insert("x-correlation-id", HeaderValue::from_static("c"));
        let minted = ids.ensure(&mut h);
        assert_ne!(minted, "c", "not a configured header");
        assert_eq!(h[&X_REQUEST_ID], minted);
    }
}
