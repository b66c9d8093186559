//! Mooncake's master HTTP service: the routes `mooncake_master` serves on its metrics port
//! (`--metrics_port`, 9003), answered in Mooncake's shapes, so the tools written against
//! it work on Moongate's master unchanged. SGLang's `MOONCAKE_CHECK_SERVER=true` polls
//! `GET /get_all_segments` until the body is not empty (a segment is mounted) before it
//! sets its store up; operators read keys and segments with the others.
//!
//! | route | answer |
//! |---|---|
//! | `GET /health` | `{"status":"ok","role","ha_state","service_ready","leader_address","view_version"}` |
//! | `GET /metrics` | Mooncake's gauge names (`master_allocated_bytes`, `master_key_count`, ...), then the process's own exposition |
//! | `GET /metrics/summary` | one line: role, state, storage, keys, clients |
//! | `GET /get_all_segments` | mounted segment names, one per line (empty: none) |
//! | `GET /get_all_keys` | every key, one per line |
//! | `GET /get_segments_detail` | `{"total_segments","segments":[...]}` with usage |
//! | `GET /query_segment?segment=` | name, used and capacity bytes as text (500 when unknown, as Mooncake) |
//! | `GET /query_key?key=` | `{"success":true,"data":[descriptor...]}`, or 404 with Mooncake's error code |
//! | `GET /batch_query_keys?keys=a,b` | `{"success":true,"data":{key:{"ok",...}}}` (400 without keys) |
//!
//! Reads take no lease (an admin read). Where Moongate has no such notion the answer says
//! what it has: a segment's id is its name (unique at a master), its protocol `auto` (Moongate's transfer
//! engine picks shared memory, RDMA or TCP per peer), `disk_values` and the other tiers are
//! `null` (the store holds memory replicas only). A master that is not serving (an HA
//! follower or candidate) answers the service routes 503 with Mooncake's
//! `UNAVAILABLE_IN_CURRENT_MODE`, as a Mooncake standby does. This crate checks no key: the
//! host puts the router behind its admin plane.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use serde_json::{Value, json};

use crate::master::{Master, MasterError, ReplicaLocation, SegmentView};

/// Mooncake's `UNAVAILABLE_IN_CURRENT_MODE`: the service plane is not active here.
pub const UNAVAILABLE_IN_CURRENT_MODE: i32 = -1011;

/// What the service reports of the master's role, in Mooncake's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Role {
    /// `leader` or `standby`.
    pub role: &'static str,
    /// `serving`, `standby`, `candidate`, ...
    pub state: &'static str,
    /// The leader's address when this master follows one.
    pub leader: Option<String>,
    /// The leader's term (Mooncake's view version), when one is known.
    pub view_version: Option<i64>,
}

impl Role {
    /// A master alone: it leads and serves.
    pub const ALONE: Role = Role {
        role: "leader",
        state: "serving",
        leader: None,
        view_version: None,
    };
}

/// The host's view of its master, for the service.
pub trait Service: Send + Sync + 'static {
    /// The master serving now; `None` while this one stands by.
    fn serving(&self) -> Option<Arc<Master>>;
    /// Its role and state.
    fn role(&self) -> Role;
    /// The process's own Prometheus exposition, appended to `/metrics`.
    fn exposition(&self) -> String;
}

type Svc = Arc<dyn Service>;

/// The service's routes over `svc`; unknown routes answer 404 `404 Not Found` as text.
pub fn router(svc: Svc) -> axum::Router {
    axum::Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/metrics/summary", get(summary))
        .route("/get_all_segments", get(all_segments))
        .route("/get_all_keys", get(all_keys))
        .route("/get_segments_detail", get(segments_detail))
        .route("/query_segment", get(query_segment))
        .route("/query_key", get(query_key))
        .route("/batch_query_keys", get(batch_query_keys))
        .fallback(|| async { (StatusCode::NOT_FOUND, "404 Not Found") })
        .with_state(svc)
}

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(PROMETHEUS_TEXT),
        )],
        body,
    )
        .into_response()
}

fn json_at(status: StatusCode, body: &impl Serialize) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        )],
        bytes,
    )
        .into_response()
}

/// Mooncake's `{"error_code","error_message"}` with `status`.
fn error(status: StatusCode, code: i32, message: &str) -> Response {
    json_at(
        status,
        &json!({"error_code": code, "error_message": message}),
    )
}

fn not_serving() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        UNAVAILABLE_IN_CURRENT_MODE,
        "service plane is not active",
    )
}

/// Runs `f` on the serving master, or answers 503.
fn serving(svc: &Svc, f: impl FnOnce(&Arc<Master>) -> Response) -> Response {
    match svc.serving() {
        Some(m) => f(&m),
        None => not_serving(),
    }
}

/// Runs a scan of every shard off the async workers.
async fn scan(svc: &Svc, f: impl FnOnce(&Master) -> Response + Send + 'static) -> Response {
    let Some(m) = svc.serving() else {
        return not_serving();
    };
    match super::blocking(&m, f).await {
        Ok(r) => r,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.code(), &e.to_string()),
    }
}

async fn health(State(svc): State<Svc>) -> Response {
    let role = svc.role();
    json_at(
        StatusCode::OK,
        &json!({
            "status": "ok",
            "role": role.role,
            "ha_state": role.state,
            "service_ready": svc.serving().is_some(),
            "leader_address": role.leader,
            "view_version": role.view_version,
        }),
    )
}

/// One gauge or counter in the exposition format, with its help and type lines.
fn series(out: &mut String, name: &str, kind: &str, help: &str, rows: &[(Option<&str>, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (label, v) in rows {
        match label {
            Some(seg) => {
                let seg = seg.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(out, "{name}{{segment=\"{seg}\"}} {v}");
            }
            None => {
                let _ = writeln!(out, "{name} {v}");
            }
        }
    }
}

async fn metrics(State(svc): State<Svc>) -> Response {
    let mut out = String::new();
    if let Some(m) = svc.serving() {
        let s = m.stats();
        let segs = m.segments();
        let used: Vec<_> = segs
            .iter()
            .map(|v| (Some(v.name.as_str()), v.allocated_bytes))
            .collect();
        let cap: Vec<_> = segs
            .iter()
            .map(|v| (Some(v.name.as_str()), v.capacity_bytes))
            .collect();
        let g = "gauge";
        series(
            &mut out,
            "master_allocated_bytes",
            g,
            "Total memory bytes currently allocated across all segments",
            &[(None, s.allocated_bytes)],
        );
        series(
            &mut out,
            "master_total_capacity_bytes",
            g,
            "Total memory capacity across all mounted segments",
            &[(None, s.capacity_bytes)],
        );
        series(
            &mut out,
            "segment_allocated_bytes",
            g,
            "Total memory bytes currently allocated of the segment",
            &used,
        );
        series(
            &mut out,
            "segment_total_capacity_bytes",
            g,
            "Total memory capacity of the mounted segment",
            &cap,
        );
        series(
            &mut out,
            "master_key_count",
            g,
            "Total number of keys managed by the master",
            &[(None, s.keys)],
        );
        series(
            &mut out,
            "master_active_clients",
            g,
            "Total number of active clients",
            &[(None, s.clients_ok)],
        );
        series(
            &mut out,
            "master_evicted_key_count",
            "counter",
            "Total number of keys evicted",
            &[(None, s.evicted_objects)],
        );
        series(
            &mut out,
            "master_evicted_size_bytes",
            "counter",
            "Total bytes of evicted objects",
            &[(None, s.evicted_bytes)],
        );
    }
    out.push_str(&svc.exposition());
    text(StatusCode::OK, out)
}

async fn summary(State(svc): State<Svc>) -> Response {
    let role = svc.role();
    let master = match svc.serving() {
        Some(m) => {
            let s = m.stats();
            format!(
                "Mem Storage: {} / {} | Keys: {} | Clients: {} | Segments: {}",
                bytes(s.allocated_bytes),
                bytes(s.capacity_bytes),
                s.keys,
                s.clients_ok,
                s.segments
            )
        }
        None => String::new(),
    };
    let mut line = format!(
        "role={}, state={}, service_ready={}, master={{{master}}}",
        role.role,
        role.state,
        svc.serving().is_some()
    );
    if let Some(leader) = role.leader {
        let _ = write!(line, ", leader={leader}");
    }
    text(StatusCode::OK, line)
}

/// `bytes` in the largest binary unit that keeps it at or above 1, two decimals.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{n} B"),
        _ => format!("{v:.2} {}", UNITS[u]),
    }
}

/// Lines of `items`, each ended by a newline (empty for none), as Mooncake lists.
fn lines<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::new();
    for it in items {
        out.push_str(it);
        out.push('\n');
    }
    out
}

async fn all_segments(State(svc): State<Svc>) -> Response {
    serving(&svc, |m| {
        let segs = m.segments();
        text(StatusCode::OK, lines(segs.iter().map(|s| s.name.as_str())))
    })
}

async fn all_keys(State(svc): State<Svc>) -> Response {
    scan(&svc, |m| {
        let keys = m.all_keys();
        text(StatusCode::OK, lines(keys.iter().map(String::as_str)))
    })
    .await
}

/// `v` in GiB as C++'s default stream formatting prints a double (six significant digits).
fn gib(size: u64) -> String {
    let v = size as f64 / (1u64 << 30) as f64;
    if v == 0.0 {
        return "0 GiB".into();
    }
    let digits = (5 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    let s = match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => s,
    };
    format!("{s} GiB")
}

fn segment_detail(s: &SegmentView) -> Value {
    let percent = match s.capacity_bytes {
        0 => 0.0,
        c => s.allocated_bytes as f64 / c as f64 * 100.0,
    };
    json!({
        "segment_name": s.name,
        "segment_id": s.name,
        "client_id": s.client_id.to_string(),
        "base_address": format!("{:#x}", s.base),
        "size_bytes": s.size,
        "size_human": gib(s.size),
        "te_endpoint": s.endpoint,
        "protocol": PROTOCOL,
        "status": "OK",
        "allocator_used_bytes": s.allocated_bytes,
        "allocator_capacity_bytes": s.capacity_bytes,
        "allocator_usage_percent": percent,
    })
}

/// What a descriptor says of the transport: Moongate's engine picks one per peer.
const PROTOCOL: &str = "auto";

async fn segments_detail(State(svc): State<Svc>) -> Response {
    serving(&svc, |m| {
        let segs = m.segments();
        let items: Vec<Value> = segs.iter().map(segment_detail).collect();
        json_at(
            StatusCode::OK,
            &json!({"total_segments": items.len(), "segments": items}),
        )
    })
}

async fn query_segment(
    State(svc): State<Svc>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    serving(&svc, |m| {
        let name = q.get("segment").map(String::as_str).unwrap_or("");
        match m.segment(name) {
            Ok(s) => text(
                StatusCode::OK,
                format!(
                    "{name}\nUsed(bytes): {}\nCapacity(bytes) : {}\n",
                    s.allocated_bytes, s.capacity_bytes
                ),
            ),
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Failed to query segment".into(),
            ),
        }
    })
}

/// Mooncake's buffer descriptor of one memory replica.
fn descriptor(r: &ReplicaLocation) -> Value {
    json!({
        "size_": r.length,
        "buffer_address_": r.address,
        "protocol_": PROTOCOL,
        "transport_endpoint_": r.segment.endpoint(),
    })
}

/// The readable replicas of `key`, as Mooncake's `GetReplicaList` finds them (without a
/// lease).
fn replicas(m: &Master, key: &str) -> Result<Vec<Value>, MasterError> {
    let o = m.object(key)?;
    if o.status != crate::master::ObjectStatus::Complete {
        return Err(MasterError::ReplicaIsNotReady(key.to_string()));
    }
    Ok(o.replicas.iter().map(descriptor).collect())
}

async fn query_key(State(svc): State<Svc>, Query(q): Query<HashMap<String, String>>) -> Response {
    serving(&svc, |m| {
        let key = q.get("key").map(String::as_str).unwrap_or("");
        // Mooncake answers every failure of this route 404, with the error's code.
        let e = match replicas(m, key) {
            Ok(data) => return json_at(StatusCode::OK, &json!({"success": true, "data": data})),
            Err(MasterError::InvalidKey(_)) if key.is_empty() => {
                MasterError::ObjectNotFound(String::new())
            }
            Err(e) => e,
        };
        json_at(
            StatusCode::NOT_FOUND,
            &json!({"success": false, "error_code": e.code(), "error_message": e.name()}),
        )
    })
}

async fn batch_query_keys(
    State(svc): State<Svc>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    serving(&svc, |m| {
        let raw = q.get("keys").map(String::as_str).unwrap_or("");
        if raw.is_empty() {
            return json_at(
                StatusCode::BAD_REQUEST,
                &json!({"success": false, "error": "No keys provided. Use ?keys=key1,key2,..."}),
            );
        }
        let max = m.config().max_batch_items;
        // Counted before anything is collected: the list is as long as the query allows.
        if raw.split(',').nth(max).is_some() {
            return json_at(
                StatusCode::BAD_REQUEST,
                &json!({"success": false, "error": format!("More than {max} keys")}),
            );
        }
        let mut data = BTreeMap::new();
        for key in raw.split(',') {
            let item = match replicas(m, key) {
                Ok(values) => json!({"ok": true, "error": null, "values": values,
                    "disk_values": null, "local_disk_values": null, "nof_values": null}),
                Err(e) => json!({"ok": false, "error": e.name(), "values": null,
                    "disk_values": null, "local_disk_values": null, "nof_values": null}),
            };
            data.insert(key, item);
        }
        json_at(StatusCode::OK, &json!({"success": true, "data": data}))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_mooncake_prints_them() {
        assert_eq!(gib(64 << 20), "0.0625 GiB");
        assert_eq!(gib(4 << 30), "4 GiB");
        assert_eq!(gib(0), "0 GiB");
        assert_eq!(gib(1 << 30 | 1 << 29), "1.5 GiB");
        assert_eq!(gib((1 << 30) / 3), "0.333333 GiB");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.00 MB");
    }
}
