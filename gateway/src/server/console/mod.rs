//! The cluster at a glance: `GET /cluster` (admin plane) answers the gateway, its workers,
//! how its policies routed and the KV master it hosts in one JSON body
//! ([`openapi::console::ClusterView`]); `GET /console` serves the page that draws it and
//! asks again every two seconds.
//!
//! The page is one HTML document with its style and script inline (no build step, nothing
//! fetched from elsewhere), compiled into the binary from `page.html`, `page.css` and
//! `page.js`. It is open, like the API docs: it holds no data. Its one request is
//! `/cluster`, which takes the admin key like every admin read: a server without an
//! admin key answers loopback callers, and a page loaded from elsewhere asks for the key
//! and keeps it in the tab's `sessionStorage` (gone when the tab closes; never in a URL
//! or a cookie), as Consul's and Nomad's UIs keep their tokens. The page's
//! Content-Security-Policy allows exactly its own script and style (by SHA-256) and
//! requests to this origin, so nothing a worker's URL or a segment's name holds can run
//! as script (the script writes text, never markup, as well).

use std::sync::LazyLock;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use http::{HeaderValue, header};
use openapi::console::{
    ClusterView, GatewayView, MasterView, ReportedLoad, StoreViewSummary, WorkerRow,
};
use sha2::{Digest, Sha256};

use super::AppState;
use crate::workers::Worker;

/// The page, its style and script placed inline, and the policy that lets exactly those
/// run.
struct Page {
    html: String,
    csp: HeaderValue,
}

static PAGE: LazyLock<Page> = LazyLock::new(|| {
    let css = include_str!("page.css");
    let js = include_str!("page.js");
    let html = include_str!("page.html")
        .replace("/*STYLE*/", css)
        .replace("/*SCRIPT*/", js);
    let digest = |s: &str| base64::engine::general_purpose::STANDARD.encode(Sha256::digest(s));
    let csp = format!(
        "default-src 'none'; script-src 'sha256-{}'; style-src 'sha256-{}'; \
         connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'",
        digest(js),
        digest(css)
    );
    Page {
        html,
        csp: HeaderValue::try_from(csp).expect("base64 digests are header-safe"),
    }
});

/// The console page.
#[utoipa::path(get, operation_id = openapi::routes::gateway::Console::OPERATION_ID,
    path = openapi::routes::gateway::Console::PATH, tag = "ops",
    responses((status = 200, description = "The console (HTML); it reads `/cluster`",
        content_type = "text/html")))]
pub async fn page() -> Response {
    let page = &*PAGE;
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CONTENT_SECURITY_POLICY, page.csp.clone()),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        page.html.as_str(),
    )
        .into_response()
}

/// The cluster at a glance.
#[utoipa::path(get, operation_id = openapi::routes::gateway::Cluster::OPERATION_ID,
    path = openapi::routes::gateway::Cluster::PATH, tag = "workers",
    responses((status = 200, description = "The gateway, its workers, its routing, its KV master",
        body = ClusterView)))]
pub async fn cluster(State(st): State<AppState>) -> Response {
    let view = view(&st);
    (
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        Json(view),
    )
        .into_response()
}

/// What `/cluster` answers now.
pub fn view(st: &AppState) -> ClusterView {
    let set = st.registry().snapshot();
    let workers: Vec<WorkerRow> = set.iter().map(|w| row(w)).collect();
    let router = st.router();
    let pd = st.pd_router();
    let policies: Vec<String> = match &pd {
        Some(pd) => pd.policies().iter().map(|p| p.kind().to_string()).collect(),
        None => vec![router.policy().kind().to_string()],
    };
    let mut routing = crate::metrics::tallies();
    for t in &mut routing {
        t.in_use = match t.policy.as_str() {
            "pd" => pd.is_some(),
            name => policies.iter().any(|p| p == name),
        };
    }
    ClusterView {
        gateway: GatewayView {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_secs: st.uptime().as_secs(),
            mode: if pd.is_some() { "pd" } else { "regular" }.to_string(),
            policies,
            in_flight: set.iter().map(|w| w.load() as u64).sum(),
            admission_waiting: st.admission().waiting() as u64,
        },
        workers,
        routing,
        master: st.store().map(|source| {
            let (role, leader_url) = source.role();
            let master = source.master();
            let view = source.view().filter(|_| master.is_none()).map(|v| {
                let (events, snapshots) = v.counts();
                StoreViewSummary {
                    pages: v.len() as u64,
                    events,
                    snapshots,
                }
            });
            MasterView {
                role: role.to_string(),
                leader_url,
                view,
                stats: master.as_ref().map(|m| m.stats()),
                segments: master
                    .map(|m| m.segments().into_iter().map(Into::into).collect())
                    .unwrap_or_default(),
            }
        }),
    }
}

/// One worker's row.
fn row(w: &Worker) -> WorkerRow {
    WorkerRow {
        info: w.info(),
        prefill_backlog_tokens: w.prefill_backlog(),
        reported_load: w.reported().map(|r| ReportedLoad {
            age_ms: r.at.elapsed().as_millis() as u64,
            used_tokens: r.used_tokens,
            waiting_reqs: r.waiting_reqs,
            token_usage: r.token_usage,
            gen_throughput: r.gen_throughput,
        }),
    }
}
