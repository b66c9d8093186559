//! One master of an HA cluster: follows, campaigns, leads, steps down; and what it answers
//! meanwhile.
//!
//! A cycle: load the cluster's state from etcd and keep it current with a watch (a
//! *follower* stands by with the state loaded) -> campaign: a transaction creates the
//! leader key on this master's lease if it does not exist -> on a loss, follow the leader
//! named there until its key goes -> on a win (the key's create revision is the *term*),
//! wait until the watched copy has caught up to the term (every write of earlier leaders is
//! in it, and none can follow: their fence names an older term), restore a master from it,
//! start the journal and the background tick, and only then serve -> keep the lease alive;
//! when it is lost, expires locally, or a write is refused, stop serving at once, step
//! down (revoking the lease, so a successor need not wait for it to expire; when etcd
//! cannot be reached then, the next campaign that finds the leader key still on that lease
//! revokes it), and start a new cycle.
//!
//! A leader serves only while its lease is live by its own clock (the deadline is counted
//! from when a keep-alive was *sent*, so it ends before etcd's): a master frozen past its
//! lease (SIGSTOP, a long pause) refuses everything when it wakes, before it even learns of
//! its successor.

use backon::BackoffBuilder;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::config::HaConfig;
use super::journal::{EtcdJournal, Exit};
use super::layout::{Layout, Replica};
use crate::master::{Change, Journal, Master, MasterConfig, MasterError, Record, TokioClock};

/// A master's role in its cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serving: reads from memory, writes committed to etcd first.
    Leader,
    /// Standing by with the state loaded; redirects to the leader.
    Follower,
    /// Between leaders (or not connected to etcd): answers 503.
    Candidate,
}

impl Role {
    /// The name on the wire (`leader`, `follower`, `candidate`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Follower => "follower",
            Self::Candidate => "candidate",
        }
    }
}

/// What a master says about its role (`GET /api/v1/ha`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaStatus {
    /// This master's role.
    pub role: Role,
    /// The leader's advertise URL, when one is known.
    pub leader_url: Option<String>,
    /// The leader's term (its leader key's create revision; 0: none known).
    pub term: i64,
}

#[derive(Clone)]
enum State {
    Candidate,
    Follower {
        leader_url: String,
        term: i64,
    },
    Leader {
        term: i64,
        master: Arc<Master>,
        app: axum::Router,
    },
}

/// Where a master request goes.
pub(crate) enum Route {
    /// To this leader's master.
    Serve(axum::Router),
    /// To the leader at this URL.
    Redirect(String),
    /// Nowhere yet.
    Unavailable(String),
}

struct Inner {
    cfg: HaConfig,
    master_cfg: MasterConfig,
    layout: Layout,
    state: RwLock<State>,
    /// Local lease deadline, in ms since `epoch`, while leading.
    deadline_ms: AtomicU64,
    epoch: Instant,
    changed: Notify,
    /// TLS to etcd (`https://` endpoints), read from the PEM files at start.
    tls: Option<etcd_client::TlsOptions>,
}

/// One master of an HA cluster (cheap to clone); see the module doc.
#[derive(Clone)]
pub struct HaNode {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HaNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaNode")
            .field("cluster", &self.inner.cfg.cluster_id)
            .field("status", &self.status())
            .finish()
    }
}

impl HaNode {
    /// A master of the cluster `cfg` names, not yet taking part (a candidate: it answers
    /// 503 until [`HaNode::spawn`] has it follow or lead).
    pub fn new(cfg: HaConfig, master_cfg: MasterConfig) -> Result<Self, MasterError> {
        let problems = cfg.problems();
        if !problems.is_empty() {
            return Err(MasterError::InvalidParams(problems.join("; ")));
        }
        master_cfg.validate()?;
        let tls = tls_options(&cfg).map_err(MasterError::InvalidParams)?;
        Ok(Self {
            inner: Arc::new(Inner {
                tls,
                layout: Layout::new(cfg.prefix()),
                cfg,
                master_cfg,
                state: RwLock::new(State::Candidate),
                deadline_ms: AtomicU64::new(0),
                epoch: Instant::now(),
                changed: Notify::new(),
            }),
        })
    }

    /// Takes part in the cluster until `stop`; the task ends once this master stepped down
    /// (its lease revoked, so a successor takes over at once).
    pub fn spawn(&self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(run(self.inner.clone(), stop))
    }

    /// This master's role, the leader it knows, and the term.
    pub fn status(&self) -> HaStatus {
        match &*self.inner.state.read() {
            State::Candidate => HaStatus {
                role: Role::Candidate,
                leader_url: None,
                term: 0,
            },
            State::Follower { leader_url, term } => HaStatus {
                role: Role::Follower,
                leader_url: Some(leader_url.clone()),
                term: *term,
            },
            State::Leader { term, .. } => HaStatus {
                role: Role::Leader,
                leader_url: Some(self.inner.cfg.advertise_url.clone()),
                term: *term,
            },
        }
    }

    /// The master this node serves while it leads (and its lease is live).
    pub fn leader_master(&self) -> Option<Arc<Master>> {
        match &*self.inner.state.read() {
            State::Leader { master, .. } if self.inner.lease_live() => Some(master.clone()),
            _ => None,
        }
    }

    /// Waits until the role changes (or a moment passes); for tools and tests that watch it.
    pub async fn changed(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.inner.changed.notified()).await;
    }

    pub(crate) fn route(&self) -> Route {
        match &*self.inner.state.read() {
            State::Leader { app, .. } if self.inner.lease_live() => Route::Serve(app.clone()),
            State::Leader { .. } => {
                Route::Unavailable("this master's leader lease ran out; electing anew".into())
            }
            State::Follower { leader_url, .. } => Route::Redirect(leader_url.clone()),
            State::Candidate => Route::Unavailable("no leader is elected right now".into()),
        }
    }
}

impl Inner {
    fn set(&self, state: State) {
        let (leader, term) = match &state {
            State::Candidate => (false, 0),
            State::Follower { term, .. } => (false, *term),
            State::Leader { term, .. } => (true, *term),
        };
        *self.state.write() = state;
        crate::metrics::record_ha_role(leader, term);
        self.changed.notify_waiters();
    }

    fn lease_live(&self) -> bool {
        (self.epoch.elapsed().as_millis() as u64) < self.deadline_ms.load(Ordering::Acquire)
    }

    fn extend_lease(&self, sent: Instant, ttl: Duration) {
        let until = (sent + ttl)
            .saturating_duration_since(self.epoch)
            .as_millis() as u64;
        self.deadline_ms.store(until, Ordering::Release);
    }
}

/// A cycle failed on etcd (or restoring); logged, retried.
type CycleResult = Result<(), String>;

/// The TLS settings `cfg`'s files give (`None` for `http://` endpoints): the CA that
/// verifies etcd, and the client certificate this master presents, if any.
fn tls_options(cfg: &HaConfig) -> Result<Option<etcd_client::TlsOptions>, String> {
    if !cfg.etcd_tls() {
        return Ok(None);
    }
    let read =
        |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display()));
    let ca = cfg
        .etcd_ca_cert
        .as_deref()
        .ok_or("https:// etcd endpoints need --etcd-ca-cert")?;
    let mut tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
    if let (Some(cert), Some(key)) = (&cfg.etcd_cert_file, &cfg.etcd_key_file) {
        tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(Some(tls))
}

async fn run(inner: Arc<Inner>, stop: CancellationToken) {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_millis(inner.cfg.commit_timeout_ms))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1));
    let opts = match &inner.tls {
        Some(tls) => opts.with_tls(tls.clone()),
        None => opts,
    };
    let mut delays = backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .without_max_times()
        .build();
    let mut client = loop {
        match Client::connect(&inner.cfg.etcd_endpoints, Some(opts.clone())).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reach etcd; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(2))) => {}
                }
            }
        }
    };
    tokio::spawn(register(inner.clone(), client.clone(), stop.clone()));
    // The lease of a term this master led, if revoking it failed when it stepped down.
    let mut old_lease = None;
    while !stop.is_cancelled() {
        if let Err(e) = cycle(&inner, &mut client, &stop, &mut old_lease).await {
            inner.set(State::Candidate);
            tracing::warn!(error = %e, "HA cycle failed; starting over");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}

async fn cycle(
    inner: &Arc<Inner>,
    client: &mut Client,
    stop: &CancellationToken,
    old_lease: &mut Option<i64>,
) -> CycleResult {
    let layout = &inner.layout;
    let fail = |what: &str, e: etcd_client::Error| format!("{what}: {e}");
    // 1. Stand by with the state loaded.
    let replica = Arc::new(Mutex::new(
        Replica::load(client, layout)
            .await
            .map_err(|e| fail("loading the state", e))?,
    ));
    let caught_up = Arc::new(Notify::new());
    let follow_stop = stop.child_token();
    let _follow_guard = follow_stop.clone().drop_guard();
    tokio::spawn(follow(
        client.clone(),
        layout.clone(),
        replica.clone(),
        caught_up.clone(),
        follow_stop.clone(),
    ));
    // 2. Campaign until this master wins (or stops).
    let ttl = inner.cfg.lease_ttl_secs;
    let leader_key = layout.leader();
    let (lease, granted, term) = loop {
        if stop.is_cancelled() {
            return Ok(());
        }
        let granted = Instant::now();
        let lease = client
            .lease_grant(ttl as i64, None)
            .await
            .map_err(|e| fail("granting a lease", e))?
            .id();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                leader_key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(
                leader_key.clone(),
                inner.cfg.advertise_url.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else(vec![TxnOp::get(leader_key.clone(), None)]);
        let resp = client.txn(txn).await.map_err(|e| fail("campaigning", e))?;
        if resp.succeeded() {
            let term = resp.header().map_or(0, |h| h.revision());
            break (lease, granted, term);
        }
        let _ = client.lease_revoke(lease).await;
        let current = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        });
        let Some(kv) = current else { continue };
        if old_lease.is_some_and(|l| l == kv.lease()) {
            // This master's own key from a term it no longer leads (etcd was unreachable
            // when it stepped down): no one to follow; end it now, not at its TTL.
            if revoke(client, kv.lease()).await {
                *old_lease = None;
                tracing::info!(term = kv.create_revision(), "ended this master's old term");
                continue;
            }
        }
        let leader_url = String::from_utf8_lossy(kv.value()).into_owned();
        if leader_url == inner.cfg.advertise_url {
            // A term of this master's that it could not end: it leads no more, and a
            // redirect to itself would send clients round in circles.
            tracing::info!(
                term = kv.create_revision(),
                "waiting for this master's old term to expire"
            );
            inner.set(State::Candidate);
        } else {
            tracing::info!(leader = %leader_url, term = kv.create_revision(), "following");
            inner.set(State::Follower {
                leader_url,
                term: kv.create_revision(),
            });
        }
        wait_deleted(client, &leader_key, kv.mod_revision(), stop).await?;
    };
    // 3. Catch up to the term, then restore.
    let started = Instant::now();
    loop {
        if replica.lock().revision >= term {
            break;
        }
        let waited = tokio::time::timeout(Duration::from_secs(1), caught_up.notified()).await;
        if waited.is_err() && replica.lock().revision < term {
            let fresh = Replica::load(client, layout)
                .await
                .map_err(|e| fail("reloading the state", e))?;
            *replica.lock() = fresh;
        }
    }
    follow_stop.cancel();
    // The copy and the snapshot are dropped once restored: a leader holds its state once.
    let snapshot = std::mem::take(&mut *replica.lock()).into_snapshot();
    drop(replica);
    let (objects, segments) = (snapshot.objects.len(), snapshot.segments.len());
    let journal = Arc::new(EtcdJournal::new(Duration::from_millis(
        inner.cfg.commit_timeout_ms,
    )));
    let restored = Master::restore(
        inner.master_cfg.clone(),
        Arc::new(TokioClock::new()),
        Some(journal.clone() as Arc<dyn Journal>),
        &snapshot,
    )
    .map_err(|e| format!("restoring the master: {e}"))?;
    drop(snapshot);
    let master = Arc::new(restored.master);
    // Records that describe nothing any more go (no one waits on it).
    let stale: Vec<Change> = restored
        .stale_objects
        .into_iter()
        .map(|key| Change::record(Record::Remove { key }))
        .chain(
            restored
                .stale_mounts
                .into_iter()
                .map(|(name, mount)| Change::record(Record::Unmount { name, mount })),
        )
        .collect();
    let stale_records = stale.len();
    journal.append(stale);
    // 4. Serve.
    let lead = stop.child_token();
    let pipeline = tokio::spawn(journal.clone().run(
        master.clone(),
        client.clone(),
        layout.clone(),
        term,
        (inner.cfg.max_txn_ops, inner.cfg.txns_in_flight),
        lead.clone(),
    ));
    tokio::spawn(crate::run_background(
        master.clone(),
        lead.clone().cancelled_owned(),
    ));
    let ttl = Duration::from_secs(ttl);
    inner.extend_lease(granted, ttl);
    let app: axum::Router = crate::router(master.clone()).into();
    inner.set(State::Leader { term, master, app });
    tracing::info!(
        term,
        objects,
        segments,
        stale_records,
        load_ms = started.elapsed().as_millis() as u64,
        "leading"
    );
    // 5. Lead until the lease is lost, a write is refused, or asked to stop.
    let why = keep_leading(inner, client, lease, ttl, term, &lead, pipeline).await;
    // 6. Step down.
    inner.deadline_ms.store(0, Ordering::Release);
    inner.set(State::Candidate);
    lead.cancel();
    journal.close();
    tracing::warn!(term, reason = why, "stepped down");
    // The successor need not wait for the lease to expire; and no write of this term can
    // commit any more (their fence names a key that is gone).
    *old_lease = (!revoke(client, lease).await).then_some(lease);
    Ok(())
}

/// Revokes `lease` (and so deletes the keys on it); whether it is gone now. A lease etcd
/// no longer knows is gone.
async fn revoke(client: &mut Client, lease: i64) -> bool {
    let answer = tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(lease)).await;
    match answer {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => e.to_string().contains("lease not found"),
        Err(_) => false,
    }
}

/// Keeps the lease alive while leading; returns why leading ended.
async fn keep_leading(
    inner: &Inner,
    client: &mut Client,
    lease: i64,
    ttl: Duration,
    term: i64,
    lead: &CancellationToken,
    mut pipeline: tokio::task::JoinHandle<Exit>,
) -> &'static str {
    let period = (ttl / 3).max(Duration::from_millis(200));
    let mut keeper = client.lease_keep_alive(lease).await.ok();
    // Someone deleting or replacing the leader key deposes this master too.
    let mut watch = client
        .watch(
            inner.layout.leader(),
            Some(WatchOptions::new().with_start_revision(term + 1)),
        )
        .await
        .ok();
    loop {
        let key_event = async {
            match watch.as_mut() {
                Some(w) => w.message().await.ok().flatten(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = lead.cancelled() => return "stopping",
            exit = &mut pipeline => {
                return match exit {
                    Ok(Exit::Deposed) => "a write was refused: another master leads",
                    _ => "the journal stopped",
                };
            }
            ev = key_event => {
                match ev {
                    Some(resp) if resp.events().iter().any(|e| e.event_type() == EventType::Delete
                        || e.kv().is_some_and(|kv| kv.create_revision() != term)) => {
                        return "the leader key was deleted or replaced";
                    }
                    Some(_) => continue,
                    None => watch = None,
                }
            }
            _ = tokio::time::sleep(period) => {}
        }
        if !inner.lease_live() {
            return "the lease ran out before it was renewed";
        }
        let sent = Instant::now();
        let renewed = match keeper.as_mut() {
            Some((k, s)) => tokio::time::timeout(period, async {
                k.keep_alive().await?;
                s.message().await
            })
            .await
            .ok()
            .and_then(Result::ok)
            .flatten()
            .map(|r| r.ttl()),
            None => None,
        };
        match renewed {
            Some(t) if t > 0 => inner.extend_lease(sent, ttl.min(Duration::from_secs(t as u64))),
            Some(_) => return "the lease expired at etcd",
            None => keeper = client.lease_keep_alive(lease).await.ok(),
        }
        if !inner.lease_live() {
            return "the lease ran out before it was renewed";
        }
    }
}

/// Keeps this master listed under `masters/` (on a lease of its own) until `stop`, so
/// clients given `etcd://` find every master, not only the leader.
async fn register(inner: Arc<Inner>, mut client: Client, stop: CancellationToken) {
    let url = inner.cfg.advertise_url.clone();
    let mut key = inner.layout.masters();
    key.extend_from_slice(url.as_bytes());
    let ttl = inner.cfg.lease_ttl_secs.max(2) as i64;
    let period = Duration::from_secs(ttl as u64) / 3;
    while !stop.is_cancelled() {
        let listed = async {
            let lease = client.lease_grant(ttl, None).await?.id();
            let opts = PutOptions::new().with_lease(lease);
            client.put(key.clone(), url.clone(), Some(opts)).await?;
            Ok::<_, etcd_client::Error>(lease)
        };
        let lease = match listed.await {
            Ok(lease) => lease,
            Err(e) => {
                tracing::warn!(error = %e, "listing this master in etcd failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(period) => continue,
                }
            }
        };
        if let Ok((mut keeper, mut stream)) = client.lease_keep_alive(lease).await {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(period) => {}
                }
                let alive = async {
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                match tokio::time::timeout(period, alive).await {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => {}
                    _ => break,
                }
            }
        }
        if stop.is_cancelled() {
            let _ = client.lease_revoke(lease).await;
        }
    }
}

/// Keeps `replica` current from a watch of the prefix; reloads it on a gap.
async fn follow(
    mut client: Client,
    layout: Layout,
    replica: Arc<Mutex<Replica>>,
    caught_up: Arc<Notify>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let from = replica.lock().revision + 1;
        let opts = WatchOptions::new().with_prefix().with_start_revision(from);
        let mut stream = match client.watch(layout.prefix(), Some(opts)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "watching the cluster state failed; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
                continue;
            }
        };
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                m = stream.message() => m,
            };
            match msg {
                Ok(Some(resp)) if resp.compact_revision() > 0 || resp.canceled() => {
                    // History this copy needs is gone: start again from a full load.
                    match Replica::load(&mut client, &layout).await {
                        Ok(fresh) => *replica.lock() = fresh,
                        Err(e) => tracing::warn!(error = %e, "reloading the cluster state failed"),
                    }
                    break;
                }
                Ok(Some(resp)) => {
                    replica.lock().apply(&layout, resp.events());
                    caught_up.notify_waiters();
                }
                Ok(None) | Err(_) => break,
            }
        }
    }
}

/// Returns once `key` is deleted (watched from after `mod_revision`).
async fn wait_deleted(
    client: &mut Client,
    key: &[u8],
    mod_revision: i64,
    stop: &CancellationToken,
) -> CycleResult {
    let opts = WatchOptions::new().with_start_revision(mod_revision + 1);
    let mut stream = client
        .watch(key.to_vec(), Some(opts))
        .await
        .map_err(|e| format!("watching the leader: {e}"))?;
    loop {
        let msg = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            m = stream.message() => m,
        };
        match msg {
            Ok(Some(resp)) => {
                if resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(());
                }
            }
            Ok(None) => return Err("the watch of the leader ended".into()),
            Err(e) => return Err(format!("watching the leader: {e}")),
        }
    }
}
