//! Kubernetes service discovery (cargo feature `kubernetes`): one kube-rs watcher per role
//! (regular, or prefill and decode), each with the role's labels as a **server-side**
//! label selector, feeding a reflector store; every change and every
//! `--service-discovery-resync-secs` the stores are reconciled with the registry
//! ([`super::pods::Reconciler`]).
//!
//! kube's watcher lists, then watches from the list's resource version; a `410 Gone` (the
//! version was compacted away) or a broken stream makes it list again with backoff, and the
//! reflector swaps the whole store only once the new list is complete, so a re-list never
//! shows an empty store in between. Until the first list arrives a store is empty, which
//! removes nothing (discovery only removes what it added).

use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use openapi::workers::WorkerType;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::WorkerManager;
use super::pods::{PodView, Reconciler};
use settings::{ALL_NAMESPACES, DiscoveryConfig};

/// How soon to reconcile again while a pod waits for a draining worker's URL.
const DRAIN_POLL: Duration = Duration::from_millis(500);

/// Connects to the Kubernetes API (in-cluster service account, `KUBECONFIG` or
/// `~/.kube/config`) and starts the watches and the reconcile loop, which stop with
/// `cancel` (or when the manager is gone). Fails when no API can be configured.
pub async fn spawn(
    cfg: &DiscoveryConfig,
    pd: bool,
    manager: Weak<WorkerManager>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    // kube's rustls needs a process-wide provider; the workspace builds aws-lc-rs only.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let client = Client::try_default().await.context(
        "no Kubernetes API configured (in-cluster service account, KUBECONFIG or ~/.kube/config)",
    )?;
    let namespace = cfg
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    if namespace == ALL_NAMESPACES {
        // Labels are no authorization boundary across namespaces: whoever may create a pod
        // with these labels anywhere would receive the gateway's key.
        if let Some(m) = manager.upgrade() {
            m.set_discovered_keyed(false);
        }
        tracing::warn!(
            "service discovery watches every namespace: discovered workers get no --api-key \
             (register keyed workers through the worker API)"
        );
    }
    let roles = if pd {
        vec![
            (WorkerType::Prefill, &cfg.prefill_selector),
            (WorkerType::Decode, &cfg.decode_selector),
        ]
    } else {
        vec![(WorkerType::Regular, &cfg.selector)]
    };
    let changed = Arc::new(Notify::new());
    let mut stores = Vec::new();
    for (role, labels) in roles.into_iter().filter(|(_, l)| !l.is_empty()) {
        let api: Api<Pod> = if namespace == ALL_NAMESPACES {
            Api::all(client.clone())
        } else {
            Api::namespaced(client.clone(), &namespace)
        };
        let selector = labels.join(",");
        let (reader, writer) = reflector::store::<Pod>();
        let events = watcher(api, watcher::Config::default().labels(&selector))
            .default_backoff()
            .reflect(writer);
        tracing::info!(
            role = role.as_str(),
            namespace = %namespace,
            selector = %selector,
            "watching pods for workers"
        );
        tokio::spawn(drive(events, role, changed.clone(), cancel.clone()));
        stores.push((role, reader));
    }
    let reconciler = Reconciler::new(cfg.port, &cfg.bootstrap_port_annotation);
    let every = Duration::from_secs(cfg.resync_secs);
    tokio::spawn(reconcile_loop(
        reconciler, stores, manager, changed, every, cancel,
    ));
    Ok(())
}

/// Runs one role's watch, waking the reconcile loop whenever its store changed.
async fn drive<S>(events: S, role: WorkerType, changed: Arc<Notify>, cancel: CancellationToken)
where
    S: Stream<Item = Result<watcher::Event<Pod>, watcher::Error>> + Send,
{
    let mut events = std::pin::pin!(events);
    loop {
        let next = tokio::select! {
            _ = cancel.cancelled() => return,
            next = events.next() => next,
        };
        match next {
            None => return,
            // The store changes on these; Init and InitApply only fill the next list.
            Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => changed.notify_one(),
            Some(Ok(watcher::Event::InitDone)) => {
                tracing::debug!(role = role.as_str(), "pods listed");
                changed.notify_one();
            }
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
            Some(Err(e)) => tracing::warn!(
                role = role.as_str(),
                error = %e,
                "pod watch failed; retrying (a stale watch lists again)"
            ),
        }
    }
}

/// Reconciles on every change and every `every`, until `cancel`.
async fn reconcile_loop(
    mut reconciler: Reconciler,
    stores: Vec<(WorkerType, Store<Pod>)>,
    manager: Weak<WorkerManager>,
    changed: Arc<Notify>,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_problems = Vec::new();
    // Set while a pod waits for a draining worker to release its URL.
    let mut again: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = changed.notified() => {}
            _ = tick.tick() => {}
            _ = tokio::time::sleep_until(again.unwrap_or_else(tokio::time::Instant::now)), if again.is_some() => {}
        }
        let Some(manager) = manager.upgrade() else {
            return;
        };
        let pods: Vec<_> = stores
            .iter()
            .map(|(role, store)| (*role, store.state().iter().map(|p| view(p)).collect()))
            .collect();
        let done = reconciler.reconcile(&manager, &pods);
        again = (done.waiting > 0).then(|| tokio::time::Instant::now() + DRAIN_POLL);
        for url in &done.added {
            tracing::info!(url = %url, "discovered worker added");
        }
        for url in &done.removed {
            tracing::info!(url = %url, "discovered worker drained and removed");
        }
        // Said once, not at every resync, while the same pods stay unusable.
        if done.problems != last_problems {
            for p in &done.problems {
                tracing::warn!("service discovery: {p}");
            }
            last_problems = done.problems;
        }
    }
}

/// What discovery needs of `pod`.
pub fn view(pod: &Pod) -> PodView {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    PodView {
        uid: meta.uid.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        ip: status
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty()),
        running: status.and_then(|s| s.phase.as_deref()) == Some("Running"),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        terminating: meta.deletion_timestamp.is_some(),
        annotations: meta.annotations.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_in_kubernetes_json_is_seen_as_discovery_needs_it() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "prefill-0", "namespace": "llm", "uid": "u-1",
                "resourceVersion": "7",
                "labels": {"app": "sglang"},
                "annotations": {"sglang.ai/bootstrap-port": "8998"},
                "deletionTimestamp": "2026-12-01T00:00:00Z"
            },
            "status": {
                "phase": "Running", "podIP": "10.1.2.3",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"}
                ]
            }
        }))
        .unwrap();
        let v = view(&pod);
        assert_eq!(
            (v.uid.as_str(), v.namespace.as_str(), v.name.as_str()),
            ("u-1", "llm", "prefill-0")
        );
        assert_eq!(v.ip.as_deref(), Some("10.1.2.3"));
        assert!(v.running && v.ready && v.terminating && !v.serving());
        assert_eq!(v.annotations["sglang.ai/bootstrap-port"], "8998");
        let bare: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u"},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
        }))
        .unwrap();
        let v = view(&bare);
        assert!(!v.running && !v.ready && v.ip.is_none() && !v.serving());
    }
}
