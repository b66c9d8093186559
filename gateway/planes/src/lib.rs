//! Who may call what: three keys for three planes, checked in one place. The gateway
//! (which re-exports this crate as `gateway::auth`) guards its routes and the KV master's
//! with it.
//!
//! | plane | routes | key |
//! |---|---|---|
//! | client | `POST /v1/chat/completions`, `POST /v1/completions`, `POST /generate`, `GET /v1/models`, `GET /get_server_info`, `GET /get_model_info` | a key from `--client-api-keys-file` (or the admin key), when the file is set; open without it |
//! | store | the KV master's store plane (mount, remount, ping, unmount, leave; put/get/exists/remove of objects, single and batch; `/metadata`), see `kvmaster::rest` | the store key (`--store-api-key`, else derived from the cluster's transfer secret) or the admin key; always |
//! | admin | the worker API (`/workers...`) and the master's admin plane (cluster-wide reads, bulk removal) | the admin key (`--admin-api-key`); without one, loopback callers only (403 for any other peer) unless `--insecure-open-admin` |
//! | open | `GET /health`, `/liveness`, `/readiness`, `/metrics`, the API docs (`/api-docs/openapi.json`, `/openapi.json`, `/docs...`) | none |
//!
//! Why the open routes are open: probes (kubelet, load balancers) and Prometheus scrapers
//! rarely send credentials, and these answers hold counts and states, never keys or values;
//! the docs describe the API and hold no data.
//!
//! Rules:
//! - A key is sent as `Authorization: Bearer <key>`; a missing or wrong one is 401 with
//!   `WWW-Authenticate: Bearer`, in the envelope of the route's owner (the OpenAI envelope
//!   for the gateway's routes, the master's for the master's).
//! - The admin key opens every plane. The store key opens the store plane only; client keys
//!   the client plane only.
//! - A key the gateway checked is consumed there: the request's `Authorization` header is
//!   removed before anything is forwarded, so a client key never reaches a worker (workers
//!   get their own key, see `workers`). Without client keys the client's header is left as
//!   it came (a worker without a key of its own gets it, as before).
//! - Without an admin key the admin plane answers loopback peers only (127.0.0.0/8, `::1`,
//!   and IPv4-mapped loopback); any other peer gets 403 naming `--admin-api-key` and
//!   `--insecure-open-admin`. A reverse proxy on the same host makes every caller loopback:
//!   behind one, set an admin key. `--insecure-open-admin` opens the plane to every peer and
//!   [`warn_while_open`] says so in the log every minute.
//! - Keys are kept as SHA-256 digests and compared in constant time ([`keys`]); they are
//!   never logged, and `Debug` shows only how many there are.
//!
//! The keys can change while the process runs (`SIGHUP` reloads the client keys file and
//! the admin key, see `reload`): [`Auth`] holds the current [`AuthSettings`] behind an
//! atomic pointer, and the served OpenAPI document follows them ([`openapi`]).
//!
//! # Layout
//! - [`keys`]: key sets (digests, constant-time membership and owner), the client keys
//!   file.
//! - [`tenants`]: who a client key belongs to and what that tenant may use (rate,
//!   concurrency, highest priority class); the priority classes.
//! - [`openapi`]: how the document states each operation's plane and security.

pub mod keys;
pub mod openapi;
pub mod tenants;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use http::{HeaderMap, HeaderValue, header};
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;

pub use keys::{ClientKeys, KeySet, KeysFileError, NO_OWNER, Presented};
pub use tenants::{Priority, Tenant};

/// Which key a route takes (see the module doc): the route declarations' plane.
pub use ::openapi::routes::Plane;

/// The key `plane` takes, in words (error messages).
pub fn key_name(plane: Plane) -> &'static str {
    match plane {
        Plane::Open => "no key",
        Plane::Client => "client API key",
        Plane::Store => "store API key",
        Plane::Admin => "admin API key",
    }
}

/// The keys in force. `Debug` shows which planes are keyed, never a key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AuthSettings {
    /// Client keys (`None`: the client plane is open).
    pub client: Option<KeySet>,
    /// The tenants the client keys belong to ([`KeySet::owner_of`] indexes them).
    pub tenants: Arc<[Tenant]>,
    /// The store key (`None`: this process serves no store plane; only the admin key
    /// opens it).
    pub store: Option<KeySet>,
    /// The admin key (`None`: the admin plane answers loopback callers, or everyone with
    /// `open_admin`).
    pub admin: Option<KeySet>,
    /// `--insecure-open-admin`: without an admin key, the admin plane answers every peer.
    pub open_admin: bool,
}

impl AuthSettings {
    /// Whether the admin plane answers any peer without a key (open and no admin key).
    pub fn admin_is_open(&self) -> bool {
        self.admin.is_none() && self.open_admin
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The plane's key is missing or wrong (401).
    Unauthorized(Plane),
    /// The admin plane of a process without an admin key, and the peer is not loopback
    /// (403).
    NotLoopback,
}

impl Refusal {
    /// What the client is told (never a key).
    pub fn message(self) -> String {
        match self {
            Self::Unauthorized(plane) => {
                format!(
                    "missing or wrong {} (Authorization: Bearer <key>)",
                    key_name(plane)
                )
            }
            Self::NotLoopback => NOT_LOOPBACK.to_string(),
        }
    }
}

/// The 403 message of the admin plane to a non-loopback peer.
pub const NOT_LOOPBACK: &str = "the admin API answers loopback callers only because this \
    server has no admin key: start it with --admin-api-key and send Authorization: Bearer \
    <key>, or open it to the network with --insecure-open-admin";

/// How a guarded route answers a refused request: the error envelope of the component that
/// owns the route, and the schema the document names for it.
#[derive(Clone, Copy, Debug)]
pub struct Rejection {
    /// Builds the response (status and body; `WWW-Authenticate` is added to 401s).
    pub respond: fn(Refusal) -> Response,
    /// Name of the body's schema under `components/schemas`.
    pub schema: &'static str,
}

/// The keys in force, shared by every guard of a process and swapped whole on reload.
/// Cheap to clone.
#[derive(Clone)]
pub struct Auth(Arc<Inner>);

struct Inner {
    settings: ArcSwap<AuthSettings>,
    generation: AtomicU64,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Auth").field(&**self.settings()).finish()
    }
}

impl Auth {
    /// Guards that enforce `settings`.
    pub fn new(settings: AuthSettings) -> Self {
        Self(Arc::new(Inner {
            settings: ArcSwap::from_pointee(settings),
            generation: AtomicU64::new(0),
        }))
    }

    /// The settings in force.
    pub fn settings(&self) -> arc_swap::Guard<Arc<AuthSettings>> {
        self.0.settings.load()
    }

    /// Puts `settings` in force for every request from now on (requests already admitted
    /// are not asked again).
    pub fn replace(&self, settings: AuthSettings) {
        self.0.settings.store(Arc::new(settings));
        self.0.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Changes the settings in force with `f`.
    pub fn update(&self, f: impl FnOnce(&mut AuthSettings)) {
        let mut s = AuthSettings::clone(&self.settings());
        f(&mut s);
        self.replace(s);
    }

    /// Bumped by every [`Auth::replace`] (the document is re-rendered when it moves).
    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    /// Admits a request to `plane` or says why not. `peer` is the caller's address (`None`
    /// when unknown: never loopback). After a key was checked, the `Authorization` header is
    /// removed, so it is not forwarded anywhere.
    pub fn admit(
        &self,
        plane: Plane,
        headers: &mut HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Result<(), Refusal> {
        self.admit_owner(plane, headers, peer).map(drop)
    }

    /// [`Auth::admit`], and whose key it was: the owner ([`KeySet::owner_of`]) of the
    /// plane's key the request presented; `None` when the plane took no key (open, or a
    /// loopback admin caller) or the admin key opened it.
    pub fn admit_owner(
        &self,
        plane: Plane,
        headers: &mut HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Result<Option<u32>, Refusal> {
        let s = self.settings();
        let (own, admin): (Option<&KeySet>, Option<&KeySet>) = match plane {
            Plane::Open => return Ok(None),
            Plane::Client => match &s.client {
                None => return Ok(None),
                Some(keys) => (Some(keys), s.admin.as_ref()),
            },
            Plane::Store => (s.store.as_ref(), s.admin.as_ref()),
            Plane::Admin => match &s.admin {
                Some(key) => (None, Some(key)),
                None if s.open_admin || peer.is_some_and(|p| is_loopback(p.ip())) => {
                    return Ok(None);
                }
                None => return Err(Refusal::NotLoopback),
            },
        };
        let Some(token) = Presented::of(headers) else {
            return Err(Refusal::Unauthorized(plane));
        };
        // Both sets are always compared in full, whichever matches.
        let owner = own.and_then(|k| k.owner_of(&token));
        let by_admin = admin.is_some_and(|k| k.admits(&token));
        if owner.is_none() && !by_admin {
            return Err(Refusal::Unauthorized(plane));
        }
        headers.remove(header::AUTHORIZATION);
        Ok(owner.filter(|&o| o != NO_OWNER))
    }

    /// Requires `plane`'s key on every route of `routes` (answering refusals with
    /// `reject`), and marks every operation of its document with the plane and the
    /// refusals that may happen there (see [`openapi`]).
    pub fn guard<S>(
        &self,
        plane: Plane,
        mut routes: OpenApiRouter<S>,
        reject: Rejection,
    ) -> OpenApiRouter<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        openapi::mark(routes.get_openapi_mut(), plane, reject.schema);
        let gate = Gate {
            auth: self.clone(),
            plane,
            reject,
        };
        routes.route_layer(middleware::from_fn_with_state(gate, check))
    }
}

/// Whether `ip` is a loopback address (IPv4-mapped IPv6 included).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    }
}

/// The caller's address a server recorded in the request (`ConnectInfo`), if any.
pub fn peer_of(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| *a)
}

/// `reject`'s answer to `refusal`, with `WWW-Authenticate: Bearer` on a 401; counted in
/// `moongate_auth_refusals_total{plane,reason}`.
pub fn refuse(reject: &Rejection, plane: Plane, refusal: Refusal) -> Response {
    let reason = match refusal {
        Refusal::Unauthorized(_) => "unauthorized",
        Refusal::NotLoopback => "not_loopback",
    };
    metrics::counter!("moongate_auth_refusals_total", "plane" => plane.as_str(), "reason" => reason)
        .increment(1);
    let mut resp = (reject.respond)(refusal);
    if matches!(refusal, Refusal::Unauthorized(_)) {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

#[derive(Clone)]
struct Gate {
    auth: Auth,
    plane: Plane,
    reject: Rejection,
}

async fn check(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let peer = peer_of(req.extensions());
    match gate.auth.admit(gate.plane, req.headers_mut(), peer) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            // Never the header's value: it may be a real key meant for something else.
            tracing::debug!(method = %req.method(), path = req.uri().path(),
                plane = gate.plane.as_str(), ?refusal, peer = ?peer, "refused");
            refuse(&gate.reject, gate.plane, refusal)
        }
    }
}

/// While the admin plane is open to every peer without a key (`--insecure-open-admin`, no
/// admin key), calls `warn` now and every `every` after, until `stop`; checks the settings
/// in force each time (a reload may close or open it).
pub async fn warn_while_open(
    auth: Auth,
    every: Duration,
    stop: CancellationToken,
    mut warn: impl FnMut(),
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if auth.settings().admin_is_open() {
            warn();
        }
    }
}

/// [`warn_while_open`] with the log line `moongate serve` and `moongate master` use, every
/// minute, spawned.
pub fn spawn_open_admin_warning(auth: &Auth, stop: CancellationToken) {
    tokio::spawn(warn_while_open(
        auth.clone(),
        Duration::from_secs(60),
        stop,
        || {
            tracing::warn!(
                "the admin API (worker API, KV master admin routes) is open to every peer \
                 without a key (--insecure-open-admin); set --admin-api-key"
            )
        },
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    fn peer(ip: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(ip.parse().unwrap(), 4000))
    }

    fn admit(auth: &Auth, plane: Plane, key: Option<&str>, from: Option<SocketAddr>) -> bool {
        auth.admit(plane, &mut headers(key), from).is_ok()
    }

    #[test]
    fn each_plane_takes_its_key_and_the_admin_key_opens_all() {
        let auth = Auth::new(AuthSettings {
            tenants: Default::default(),
            client: Some(KeySet::from_keys(["c1", "c2"])),
            store: Some(KeySet::single("st")),
            admin: Some(KeySet::single("ad")),
            open_admin: false,
        });
        let lo = peer("127.0.0.1");
        for (plane, good, bad) in [
            (
                Plane::Client,
                &["Bearer c1", "Bearer c2", "Bearer ad"][..],
                &["Bearer st"][..],
            ),
            (Plane::Store, &["Bearer st", "Bearer ad"], &["Bearer c1"]),
            (Plane::Admin, &["Bearer ad"], &["Bearer c1", "Bearer st"]),
        ] {
            for k in good {
                assert!(admit(&auth, plane, Some(k), lo), "{plane} {k}");
            }
            for k in bad
                .iter()
                .copied()
                .chain([None, Some("Bearer nope")].into_iter().flatten())
            {
                assert_eq!(
                    auth.admit(plane, &mut headers(Some(k)), lo),
                    Err(Refusal::Unauthorized(plane)),
                    "{plane} {k}"
                );
            }
            assert!(!admit(&auth, plane, None, lo), "{plane} without a key");
        }
    }

    #[test]
    fn a_checked_key_is_removed_and_an_unchecked_header_kept() {
        let keyed = Auth::new(AuthSettings {
            tenants: Default::default(),
            client: Some(KeySet::single("c1")),
            ..AuthSettings::default()
        });
        let mut h = headers(Some("Bearer c1"));
        keyed.admit(Plane::Client, &mut h, None).unwrap();
        assert!(h.get(header::AUTHORIZATION).is_none());
        let open = Auth::new(AuthSettings::default());
        let mut h = headers(Some("Bearer for-the-worker"));
        open.admit(Plane::Client, &mut h, None).unwrap();
        assert_eq!(h[header::AUTHORIZATION], "Bearer for-the-worker");
    }

    #[test]
    fn without_an_admin_key_the_admin_plane_is_loopback_only_unless_opened() {
        let auth = Auth::new(AuthSettings::default());
        for lo in ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"] {
            assert!(admit(&auth, Plane::Admin, None, peer(lo)), "{lo}");
        }
        for far in [
            "192.0.2.7",
            "10.0.0.1",
            "::ffff:10.0.0.1",
            "fd00::2",
            "0.0.0.0",
        ] {
            assert_eq!(
                auth.admit(Plane::Admin, &mut headers(None), peer(far)),
                Err(Refusal::NotLoopback),
                "{far}"
            );
        }
        assert_eq!(
            auth.admit(Plane::Admin, &mut headers(None), None),
            Err(Refusal::NotLoopback),
            "an unknown peer is not loopback"
        );
        // The store plane is never opened by loopback.
        assert!(!admit(&auth, Plane::Store, None, peer("127.0.0.1")));
        auth.update(|s| s.open_admin = true);
        assert!(admit(&auth, Plane::Admin, None, peer("192.0.2.7")));
        // A key closes it again, for loopback callers too.
        auth.update(|s| s.admin = Some(KeySet::single("ad")));
        assert!(!admit(&auth, Plane::Admin, None, peer("127.0.0.1")));
        assert!(admit(
            &auth,
            Plane::Admin,
            Some("Bearer ad"),
            peer("192.0.2.7")
        ));
    }

    #[test]
    fn replacing_the_settings_applies_to_the_next_request_and_moves_the_generation() {
        let auth = Auth::new(AuthSettings::default());
        let g = auth.generation();
        assert!(admit(&auth, Plane::Client, None, None));
        auth.update(|s| s.client = Some(KeySet::single("new")));
        assert!(auth.generation() > g);
        assert!(!admit(&auth, Plane::Client, None, None));
        assert!(admit(&auth, Plane::Client, Some("Bearer new"), None));
        assert!(!format!("{auth:?}").contains("new"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_open_admin_warning_repeats_every_period_while_open() {
        let auth = Auth::new(AuthSettings {
            open_admin: true,
            ..AuthSettings::default()
        });
        let count = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let c = count.clone();
        let task = tokio::spawn(warn_while_open(
            auth.clone(),
            Duration::from_secs(60),
            stop.clone(),
            move || {
                c.fetch_add(1, Ordering::Relaxed);
            },
        ));
        let seen = || count.load(Ordering::Relaxed);
        tokio::task::yield_now().await;
        assert_eq!(seen(), 1, "at once");
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(seen(), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(seen(), 2, "a minute later");
        // An admin key closes the plane: no more warnings.
        auth.update(|s| s.admin = Some(KeySet::single("k")));
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(seen(), 2);
        stop.cancel();
        task.await.unwrap();
    }
}
