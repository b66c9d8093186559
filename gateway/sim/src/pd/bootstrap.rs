//! SGLang's bootstrap server (run by a prefill worker) and the decode side's view of it:
//! looking a prefill up, and watching it with heartbeats.
//!
//! Server routes and answers follow SGLang's `CommonKVBootstrapServer` (see
//! [`openapi::sglang::bootstrap`]): `PUT /route`, `GET /route`, `GET /health`, the same
//! status codes and texts. The decode side asks `GET /route` with every rank `-1` (server
//! info: the page size must match its own), then rank 0 (the prefill's transfer segment),
//! caches the answer per bootstrap address, and from then on sends `GET /health` every
//! heartbeat interval; after `max_failures` failed heartbeats in a row the prefill counts as
//! dead: every room waiting on it fails at once, and the next request looks it up again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::Uri;
use openapi::sglang::bootstrap::{PrefillServerInfo, RankInfo, RegisterRank, RouteQuery};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use gateway::client::HttpClient;

/// Ranks by `(dp, cp, tp, pp)`.
type RankKey = (u32, u32, u32, u32);

/// What the bootstrap server knows (the first registration fixes the topology).
#[derive(Debug, Default)]
pub struct Table {
    inner: Mutex<TableInner>,
}

#[derive(Debug, Default)]
struct TableInner {
    first: Option<RegisterRank>,
    ranks: HashMap<RankKey, RankInfo>,
}

/// Most ranks one prefill server may declare (SGLang deployments have a few hundred).
pub const MAX_RANKS: u64 = 1 << 16;

impl Table {
    /// The data-parallel size and rank of a registration (SGLang's reading of the two
    /// kinds of data parallelism).
    fn dp(r: &RegisterRank) -> (u32, u32) {
        if r.system_dp_size == 1 {
            (r.attn_dp_size, r.attn_dp_rank)
        } else {
            (r.system_dp_size, r.system_dp_rank)
        }
    }

    /// Ranks the topology of `r` has: checked, never overflowing, at most [`MAX_RANKS`].
    fn expected(r: &RegisterRank) -> Result<u64, String> {
        let sizes = [Self::dp(r).0, r.attn_cp_size, r.attn_tp_size, r.pp_size];
        if sizes.contains(&0) {
            return Err("every parallel size must be at least 1".into());
        }
        sizes
            .iter()
            .try_fold(1u64, |acc, &s| acc.checked_mul(u64::from(s)))
            .filter(|&n| n <= MAX_RANKS)
            .ok_or_else(|| format!("the topology declares more than {MAX_RANKS} ranks"))
    }

    fn is_ready(t: &TableInner) -> bool {
        t.first
            .as_ref()
            .and_then(|f| Self::expected(f).ok())
            .is_some_and(|n| t.ranks.len() as u64 >= n)
    }

    /// Registers a rank (what `PUT /route` does). Refused, with the reason: a topology that
    /// overflows or declares more than [`MAX_RANKS`] ranks, a topology other than the first
    /// registration's, or a rank outside it (so the table holds at most one entry per rank
    /// of one sane topology, whatever a peer sends).
    pub fn register(&self, r: RegisterRank) -> Result<(), String> {
        Self::expected(&r)?;
        let (dp_size, dp) = Self::dp(&r);
        let ranks = [
            (dp, dp_size),
            (r.attn_cp_rank, r.attn_cp_size),
            (r.attn_tp_rank, r.attn_tp_size),
            (r.pp_rank, r.pp_size),
        ];
        if ranks.iter().any(|&(rank, size)| rank >= size) {
            return Err("a rank is outside its parallel size".into());
        }
        let mut t = self.inner.lock();
        if let Some(f) = &t.first {
            let topology =
                |r: &RegisterRank| (Self::dp(r).0, r.attn_cp_size, r.attn_tp_size, r.pp_size);
            if topology(f) != topology(&r) {
                return Err("the topology differs from the first registration's".into());
            }
        }
        let key = (dp, r.attn_cp_rank, r.attn_tp_rank, r.pp_rank);
        let info = RankInfo {
            rank_ip: r.rank_ip.clone(),
            rank_port: r.rank_port,
        };
        t.ranks.insert(key, info);
        t.first.get_or_insert(r);
        Ok(())
    }
}

/// The bootstrap server's routes.
pub fn router(table: Arc<Table>) -> Router {
    Router::new()
        .route("/route", axum::routing::any(route))
        .route("/health", axum::routing::get(|| async { "OK" }))
        .with_state(table)
}

async fn route(
    State(table): State<Arc<Table>>,
    method: Method,
    query: Result<Query<RouteQuery>, axum::extract::rejection::QueryRejection>,
    body: Bytes,
) -> Response {
    match method {
        Method::PUT => match serde_json::from_slice::<RegisterRank>(&body)
            .map_err(|e| e.to_string())
            .and_then(|r| table.register(r))
        {
            Ok(()) => (StatusCode::OK, "OK").into_response(),
            Err(e) => (StatusCode::BAD_REQUEST, format!("Bad registration: {e}")).into_response(),
        },
        Method::GET => lookup(&table, query.map(|q| q.0).unwrap_or_default()),
        _ => (StatusCode::METHOD_NOT_ALLOWED, "Method not allowed").into_response(),
    }
}

fn lookup(table: &Table, q: RouteQuery) -> Response {
    let parse = |v: &Option<String>| {
        v.as_deref()
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<i64>())
    };
    let (Some(dp), Some(cp), Some(tp), Some(pp)) = (
        parse(&q.prefill_dp_rank),
        parse(&q.prefill_cp_rank),
        parse(&q.target_tp_rank),
        parse(&q.target_pp_rank),
    ) else {
        return (
            StatusCode::BAD_REQUEST,
            "Missing inputs for bootstrap server.",
        )
            .into_response();
    };
    let (Ok(dp), Ok(cp), Ok(tp), Ok(pp)) = (dp, cp, tp, pp) else {
        return (StatusCode::BAD_REQUEST, "Bad inputs for bootstrap server.").into_response();
    };
    let t = table.inner.lock();
    if !Table::is_ready(&t) {
        let msg = format!(
            "Prefill server not fully registered yet ({} workers registered).",
            t.ranks.len()
        );
        return (StatusCode::SERVICE_UNAVAILABLE, msg).into_response();
    }
    if (dp, cp, tp, pp) == (-1, -1, -1, -1) {
        let Some(f) = &t.first else {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        };
        let info = PrefillServerInfo {
            attn_tp_size: f.attn_tp_size,
            attn_cp_size: f.attn_cp_size,
            dp_size: Table::dp(f).0,
            pp_size: f.pp_size,
            page_size: Some(f.page_size),
            kv_cache_dtype: Some(f.kv_cache_dtype.clone()),
            follow_bootstrap_room: f
                .load_balance_method
                .as_deref()
                .is_none_or(|m| m == "follow_bootstrap_room"),
            enable_dsa_cache_layer_split: false,
            prefill_http_port: f.prefill_http_port,
            target_tp_rank: None,
            target_tp_ranks: None,
            target_cp_ranks: None,
            target_pp_ranks: None,
            required_dst_info_num: None,
            required_prefill_response_num: None,
        };
        return axum::Json(info).into_response();
    }
    let key = |v: i64| u32::try_from(v).ok();
    let found = match (key(dp), key(cp), key(tp), key(pp)) {
        (Some(a), Some(b), Some(c), Some(d)) => t.ranks.get(&(a, b, c, d)),
        _ => None,
    };
    match found {
        Some(info) => axum::Json(info.clone()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!(
                "Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}"
            ),
        )
            .into_response(),
    }
}

/// A prefill as the decode side knows it.
#[derive(Debug)]
pub struct PrefillLink {
    /// `host:port` of its bootstrap server.
    pub addr: String,
    /// Its transfer segment (`rank_ip:rank_port`).
    pub segment: String,
    /// Its tokens per page.
    pub page_size: u32,
    /// Cancelled when its heartbeats stopped.
    pub dead: CancellationToken,
}

/// Heartbeat settings.
#[derive(Debug, Clone, Copy)]
pub struct Heartbeat {
    /// Between heartbeats (also each one's timeout).
    pub interval: Duration,
    /// Failed heartbeats in a row that make a prefill dead.
    pub max_failures: u32,
}

/// The decode side's prefills, by bootstrap address.
#[derive(Debug)]
pub struct Links {
    client: HttpClient,
    heartbeat: Heartbeat,
    links: Mutex<HashMap<String, Arc<PrefillLink>>>,
    stop: CancellationToken,
}

/// `host:port` with brackets around an IPv6 host.
pub fn address(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl Links {
    /// No prefill known yet; `stop` ends every heartbeat.
    pub fn new(client: HttpClient, heartbeat: Heartbeat, stop: CancellationToken) -> Self {
        Self {
            client,
            heartbeat,
            links: Mutex::new(HashMap::new()),
            stop,
        }
    }

    /// The prefill whose bootstrap server is at `addr`: cached, or looked up (and watched).
    pub async fn get(self: &Arc<Self>, addr: &str) -> Result<Arc<PrefillLink>, String> {
        if let Some(l) = self.links.lock().get(addr) {
            return Ok(l.clone());
        }
        let timeout = Duration::from_secs(5);
        let get = |q: &str| {
            let uri = format!("http://{addr}/route?{q}");
            async move {
                let uri: Uri = uri
                    .parse()
                    .map_err(|e| format!("bad bootstrap address {addr}: {e}"))?;
                let (status, body) = self.client.get_small(uri, None, timeout).await?;
                if !status.is_success() {
                    return Err(format!(
                        "bootstrap server {addr} answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    ));
                }
                Ok(body)
            }
        };
        let info = get("prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1")
            .await
            .map_err(|e| format!("prefill bootstrap lookup failed: {e}"))?;
        let info: PrefillServerInfo = serde_json::from_slice(&info)
            .map_err(|e| format!("bad server info from {addr}: {e}"))?;
        let rank = get("prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0")
            .await
            .map_err(|e| format!("prefill bootstrap lookup failed: {e}"))?;
        let rank: RankInfo =
            serde_json::from_slice(&rank).map_err(|e| format!("bad rank info from {addr}: {e}"))?;
        let link = Arc::new(PrefillLink {
            addr: addr.to_owned(),
            segment: address(&rank.rank_ip, rank.rank_port),
            page_size: info.page_size.unwrap_or(1),
            dead: CancellationToken::new(),
        });
        let link = {
            let mut links = self.links.lock();
            match links.get(addr) {
                Some(existing) => return Ok(existing.clone()),
                None => {
                    links.insert(addr.to_owned(), link.clone());
                    link
                }
            }
        };
        tokio::spawn(self.clone().watch(link.clone()));
        Ok(link)
    }

    /// Heartbeats `link` until it dies (or the worker stops).
    async fn watch(self: Arc<Self>, link: Arc<PrefillLink>) {
        let hb = self.heartbeat;
        let mut failures = 0;
        let Ok(uri) = format!("http://{}/health", link.addr).parse::<Uri>() else {
            return;
        };
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(hb.interval) => {}
            }
            let ok = matches!(self.client.get_small(uri.clone(), None, hb.interval).await, Ok((s, _)) if s.is_success());
            failures = if ok { 0 } else { failures + 1 };
            if failures >= hb.max_failures {
                tracing::warn!(prefill = %link.addr, failures, "prefill stopped answering heartbeats; failing its rooms");
                let mut links = self.links.lock();
                if links.get(&link.addr).is_some_and(|l| Arc::ptr_eq(l, &link)) {
                    links.remove(&link.addr);
                }
                link.dead.cancel();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    fn rank(tp: u32, tp_size: u32) -> RegisterRank {
        RegisterRank {
            attn_tp_size: tp_size,
            attn_tp_rank: tp,
            ..RegisterRank::single("10.0.0.1".into(), 17000 + tp as u16, 16, "bfloat16")
        }
    }

    async fn call(app: &Router, method: Method, uri: &str, body: &str) -> (StatusCode, String) {
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(axum::body::Body::from(body.to_owned()))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let b = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(b.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn sglangs_answers_and_status_codes() {
        let app = router(Arc::new(Table::default()));
        let all =
            "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1";
        let r0 = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0";
        assert_eq!(
            call(&app, Method::GET, "/health", "").await,
            (StatusCode::OK, "OK".into())
        );
        let (s, t) = call(&app, Method::GET, "/route?prefill_dp_rank=0", "").await;
        assert_eq!(
            (s, t.as_str()),
            (
                StatusCode::BAD_REQUEST,
                "Missing inputs for bootstrap server."
            )
        );
        let (s, t) = call(&app, Method::GET, all, "").await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(t.contains("not fully registered"), "{t}");
        // Two tensor-parallel ranks expected: ready after the second registers.
        let put = |r: RegisterRank| serde_json::to_string(&r).unwrap();
        assert_eq!(
            call(&app, Method::PUT, "/route", &put(rank(0, 2))).await,
            (StatusCode::OK, "OK".into())
        );
        assert_eq!(
            call(&app, Method::GET, r0, "").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        call(&app, Method::PUT, "/route", &put(rank(1, 2))).await;
        let (s, t) = call(&app, Method::GET, all, "").await;
        assert_eq!(s, StatusCode::OK);
        let info: PrefillServerInfo = serde_json::from_str(&t).unwrap();
        assert_eq!(
            (
                info.attn_tp_size,
                info.page_size,
                info.follow_bootstrap_room
            ),
            (2, Some(16), true)
        );
        let (s, t) = call(
            &app,
            Method::GET,
            "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0",
            "",
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(
            serde_json::from_str::<RankInfo>(&t).unwrap().rank_port,
            17001
        );
        let (s, t) = call(
            &app,
            Method::GET,
            "/route?prefill_dp_rank=3&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
            "",
        )
        .await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert!(
            t.starts_with("Bootstrap info not found for dp_rank=3"),
            "{t}"
        );
        assert_eq!(
            call(&app, Method::POST, "/route", "").await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            call(&app, Method::PUT, "/route", "{}").await.0,
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn hostile_registrations_are_refused_with_a_reason() {
        let table = Arc::new(Table::default());
        let app = router(table.clone());
        let put = |r: RegisterRank| serde_json::to_string(&r).unwrap();
        // Sizes whose product overflows u32 (and u64): refused, no panic.
        let overflow = RegisterRank {
            attn_tp_size: u32::MAX,
            attn_cp_size: u32::MAX,
            attn_dp_size: u32::MAX,
            pp_size: u32::MAX,
            ..rank(0, 1)
        };
        let zero = RegisterRank {
            pp_size: 0,
            ..rank(0, 1)
        };
        let outside = rank(5, 2);
        for (r, why) in [
            (overflow, "more than 65536 ranks"),
            (zero, "at least 1"),
            (outside, "outside its parallel size"),
        ] {
            let (s, t) = call(&app, Method::PUT, "/route", &put(r)).await;
            assert_eq!(s, StatusCode::BAD_REQUEST);
            assert!(
                t.starts_with("Bad registration: ") && t.contains(why),
                "{t}"
            );
        }
        // Once a topology is known, another one is refused.
        assert_eq!(
            call(&app, Method::PUT, "/route", &put(rank(0, 2))).await.0,
            StatusCode::OK
        );
        let (s, t) = call(&app, Method::PUT, "/route", &put(rank(0, 4))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(t.contains("differs from the first"), "{t}");
        assert_eq!(table.inner.lock().ranks.len(), 1);
        // Bad query numbers are 400s too.
        let (s, _) = call(
            &app,
            Method::GET,
            "/route?prefill_dp_rank=99999999999999999999&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0",
            "",
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn ipv6_addresses_get_brackets() {
        assert_eq!(address("::1", 8998), "[::1]:8998");
        assert_eq!(address("[::1]", 8998), "[::1]:8998");
        assert_eq!(address("10.0.0.1", 1), "10.0.0.1:1");
    }
}
