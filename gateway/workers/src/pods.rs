//! Kubernetes service discovery's reconcile step: from the pods the watch holds to the
//! discovered workers in the registry. Pure bookkeeping over [`PodView`]s, so it is tested
//! without kube; `super::k8s` (feature `kubernetes`) turns real pods into views and calls
//! [`Reconciler::reconcile`] on every change and on an interval.
//!
//! The rules (learnt from sglang-router's bugs):
//! - a pod is a worker while it is `Running`, `Ready` and not terminating, and has an IP;
//!   a pod that stops being one is drained and removed (a force-deleted pod leaves the
//!   watch's store at once, and with it the worker);
//! - a pod is identified by its UID: the same UID with another IP, role or bootstrap port
//!   is a new worker (the old one is drained);
//! - only workers discovery added are removed by it; a URL that a worker of the worker
//!   API or of the flags holds is reported and left to it;
//! - a pod matched by two roles' selectors is refused (it cannot be prefill and decode).

use std::collections::{BTreeMap, HashMap, HashSet};

use openapi::workers::WorkerType;

use super::WorkerManager;
use super::manager::AddError;

/// What discovery needs of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodView {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// `status.phase == "Running"`.
    pub running: bool,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

impl PodView {
    /// Whether the pod should take traffic now.
    pub fn serving(&self) -> bool {
        self.running && self.ready && !self.terminating && self.ip.is_some() && !self.uid.is_empty()
    }
}

/// The worker a serving pod stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Wanted {
    url: String,
    worker_type: WorkerType,
    bootstrap_port: Option<u16>,
    pod: String,
}

/// What one reconcile changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// URLs registered.
    pub added: Vec<String>,
    /// URLs drained and removed.
    pub removed: Vec<String>,
    /// Pods that could not be made workers, and why.
    pub problems: Vec<String>,
    /// Pods whose URL a draining worker still holds (a pod that was not Ready and is again,
    /// or moved roles, while requests were in flight): they are added once it is gone, so
    /// reconcile again soon.
    pub waiting: usize,
}

/// The discovered workers, by pod UID. See the module doc.
#[derive(Debug)]
pub struct Reconciler {
    port: u16,
    bootstrap_annotation: String,
    known: HashMap<String, (Wanted, String)>,
}

impl Reconciler {
    /// Workers at `http://<pod IP>:<port>`, prefill bootstrap ports read from the
    /// annotation `bootstrap_annotation`.
    pub fn new(port: u16, bootstrap_annotation: &str) -> Self {
        Self {
            port,
            bootstrap_annotation: bootstrap_annotation.to_owned(),
            known: HashMap::new(),
        }
    }

    /// How many workers discovery holds now.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// Whether discovery holds no worker.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// Makes the discovered workers in `manager` exactly the serving pods of `pods` (each
    /// role with the pods its selector's watch holds).
    pub fn reconcile(
        &mut self,
        manager: &WorkerManager,
        pods: &[(WorkerType, Vec<PodView>)],
    ) -> Reconciled {
        let mut out = Reconciled::default();
        let wanted = self.wanted(pods, &mut out.problems);
        // Gone, changed, or removed by hand through the worker API: forget or drain it.
        self.known.retain(|uid, (was, id)| {
            let alive = manager.registry().get(id).is_some();
            if alive && wanted.get(uid) == Some(was) {
                return true;
            }
            if alive {
                manager.remove(id);
                out.removed.push(was.url.clone());
            }
            false
        });
        let mut uids: Vec<_> = wanted.keys().collect();
        uids.sort();
        for uid in uids {
            if self.known.contains_key(uid) {
                continue;
            }
            let w = &wanted[uid];
            let labels = BTreeMap::from([("pod".to_owned(), w.pod.clone())]);
            match manager.add_discovered(&w.url, w.worker_type, w.bootstrap_port, labels) {
                Ok(worker) => {
                    out.added.push(w.url.clone());
                    self.known
                        .insert(uid.clone(), (w.clone(), worker.id().to_owned()));
                }
                Err(AddError::Duplicate(_)) => {
                    let draining = manager
                        .registry()
                        .list()
                        .iter()
                        .any(|h| h.url().as_str() == w.url && h.is_draining());
                    if draining {
                        out.waiting += 1;
                    } else {
                        out.problems.push(format!(
                            "pod {}: {} is already registered by hand; left to that entry",
                            w.pod, w.url
                        ));
                    }
                }
                Err(e) => out.problems.push(format!("pod {}: {e}", w.pod)),
            }
        }
        out
    }

    /// The worker each serving pod stands for, by UID.
    fn wanted(
        &self,
        pods: &[(WorkerType, Vec<PodView>)],
        problems: &mut Vec<String>,
    ) -> HashMap<String, Wanted> {
        let mut wanted = HashMap::new();
        let mut twice = HashSet::new();
        for (role, views) in pods {
            for pod in views.iter().filter(|p| p.serving()) {
                let name = format!("{}/{}", pod.namespace, pod.name);
                let Some(w) = self.worker_for(pod, *role, &name, problems) else {
                    continue;
                };
                if wanted.insert(pod.uid.clone(), w).is_some() {
                    twice.insert(pod.uid.clone());
                    problems.push(format!(
                        "pod {name} matches more than one role's selector; not used"
                    ));
                }
            }
        }
        wanted.retain(|uid, _| !twice.contains(uid));
        wanted
    }

    fn worker_for(
        &self,
        pod: &PodView,
        role: WorkerType,
        name: &str,
        problems: &mut Vec<String>,
    ) -> Option<Wanted> {
        let ip = pod.ip.as_deref()?;
        let Ok(addr) = ip.parse::<std::net::IpAddr>() else {
            problems.push(format!("pod {name}: podIP {ip:?} is not an IP address"));
            return None;
        };
        let url = match addr {
            std::net::IpAddr::V4(a) => format!("http://{a}:{}", self.port),
            std::net::IpAddr::V6(a) => format!("http://[{a}]:{}", self.port),
        };
        let bootstrap_port = match (role, pod.annotations.get(&self.bootstrap_annotation)) {
            (WorkerType::Prefill, Some(v)) => match v.trim().parse::<u16>() {
                Ok(p) if p > 0 => Some(p),
                _ => {
                    problems.push(format!(
                        "pod {name}: annotation {} = {v:?} is not a port; the worker's default is used",
                        self.bootstrap_annotation
                    ));
                    None
                }
            },
            _ => None,
        };
        Some(Wanted {
            url,
            worker_type: role,
            bootstrap_port,
            pod: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use openapi::workers::CreateWorkerRequest;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::client::HttpClient;
    use crate::{Origin, Registry};
    use settings::ServeConfig;

    fn manager() -> WorkerManager {
        let cfg = ServeConfig {
            disable_health_check: true,
            api_key: Some("gk".into()),
            ..ServeConfig::default()
        };
        let client = HttpClient::with_roots(rustls::RootCertStore::empty());
        WorkerManager::new(
            Arc::new(Registry::new()),
            client,
            &cfg,
            CancellationToken::new(),
        )
    }

    fn pod(uid: &str, ip: &str) -> PodView {
        PodView {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("pod-{uid}"),
            ip: Some(ip.into()),
            running: true,
            ready: true,
            terminating: false,
            annotations: BTreeMap::new(),
        }
    }

    fn listed(m: &WorkerManager) -> Vec<(String, WorkerType, Option<u16>, Origin)> {
        let mut v: Vec<_> = m
            .registry()
            .list()
            .iter()
            .map(|w| {
                let url = w.url().as_str().to_owned();
                (url, w.worker_type(), w.bootstrap_port(), w.origin())
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    #[tokio::test]
    async fn serving_pods_become_workers_and_leave_when_they_stop_serving() {
        let m = manager();
        let mut r = Reconciler::new(8000, "sglang.ai/bootstrap-port");
        let mut unready = pod("c", "10.0.0.3");
        unready.ready = false;
        let mut pending = pod("d", "10.0.0.4");
        pending.running = false;
        let mut no_ip = pod("e", "10.0.0.5");
        no_ip.ip = None;
        let pods = vec![
            pod("a", "10.0.0.1"),
            pod("b", "fd00::2"),
            unready,
            pending,
            no_ip,
        ];
        let done = r.reconcile(&m, &[(WorkerType::Regular, pods.clone())]);
        assert_eq!(
            done.added,
            ["http://10.0.0.1:8000", "http://[fd00::2]:8000"]
        );
        assert!(
            done.removed.is_empty() && done.problems.is_empty(),
            "{done:?}"
        );
        let w = m.registry().list();
        assert!(w.iter().all(|w| w.origin() == Origin::Discovered));
        assert!(
            w.iter()
                .all(|w| w.bearer().is_some_and(|b| b.as_bytes() == b"Bearer gk")),
            "discovered workers send the gateway's --api-key"
        );
        // The same pods again: nothing changes.
        assert_eq!(
            r.reconcile(&m, &[(WorkerType::Regular, pods.clone())]),
            Reconciled::default()
        );
        // b terminates, a is gone (deleted), c turns Ready.
        let mut b = pods[1].clone();
        b.terminating = true;
        let mut c = pods[2].clone();
        c.ready = true;
        let done = r.reconcile(&m, &[(WorkerType::Regular, vec![b, c])]);
        assert_eq!(done.added, ["http://10.0.0.3:8000"]);
        let mut removed = done.removed.clone();
        removed.sort();
        assert_eq!(removed, ["http://10.0.0.1:8000", "http://[fd00::2]:8000"]);
        assert_eq!(listed(&m).len(), 1);
        assert_eq!(r.len(), 1);
    }

    #[tokio::test]
    async fn a_pod_is_its_uid_and_hand_added_workers_are_left_alone() {
        let m = manager();
        let hand = m
            .add(CreateWorkerRequest {
                url: "http://10.0.0.9:8000".into(),
                worker_type: WorkerType::Regular,
                bootstrap_port: None,
                model_id: None,
                api_key: None,
                labels: Default::default(),
                priority: None,
            })
            .unwrap();
        let mut r = Reconciler::new(8000, "sglang.ai/bootstrap-port");
        let done = r.reconcile(
            &m,
            &[(
                WorkerType::Regular,
                vec![pod("a", "10.0.0.1"), pod("z", "10.0.0.9")],
            )],
        );
        assert_eq!(done.added, ["http://10.0.0.1:8000"]);
        assert!(done.problems[0].contains("by hand"), "{done:?}");
        let first = m
            .registry()
            .list()
            .iter()
            .find(|w| w.origin() == Origin::Discovered)
            .unwrap()
            .id()
            .to_owned();
        // a keeps its UID but moves to another IP: a new worker, the old one drained.
        let done = r.reconcile(&m, &[(WorkerType::Regular, vec![pod("a", "10.0.0.7")])]);
        assert_eq!(done.added, ["http://10.0.0.7:8000"]);
        assert_eq!(done.removed, ["http://10.0.0.1:8000"]);
        assert!(m.registry().get(&first).is_none());
        // Every pod gone: the hand-added worker stays.
        let done = r.reconcile(&m, &[(WorkerType::Regular, vec![])]);
        assert_eq!(done.removed, ["http://10.0.0.7:8000"]);
        assert_eq!(
            listed(&m),
            [(
                "http://10.0.0.9:8000".into(),
                WorkerType::Regular,
                None,
                Origin::Api
            )]
        );
        assert!(m.registry().get(hand.id()).is_some());
    }

    #[tokio::test]
    async fn prefill_pods_carry_their_bootstrap_port_and_roles_do_not_overlap() {
        let m = manager();
        let mut r = Reconciler::new(30000, "sglang.ai/bootstrap-port");
        let mut p = pod("p", "10.0.1.1");
        p.annotations
            .insert("sglang.ai/bootstrap-port".into(), "8998".into());
        let mut bad = pod("q", "10.0.1.2");
        bad.annotations
            .insert("sglang.ai/bootstrap-port".into(), "x".into());
        let both = pod("x", "10.0.1.3");
        let mut d = pod("d", "10.0.2.1");
        // The annotation means nothing on a decode pod.
        d.annotations
            .insert("sglang.ai/bootstrap-port".into(), "8998".into());
        let done = r.reconcile(
            &m,
            &[
                (WorkerType::Prefill, vec![p, bad, both.clone()]),
                (WorkerType::Decode, vec![d, both]),
            ],
        );
        let problems = done.problems.join("; ");
        assert!(
            problems.contains("not a port") && problems.contains("more than one role"),
            "{problems}"
        );
        assert_eq!(
            listed(&m)
                .into_iter()
                .map(|(u, t, p, _)| (u, t, p))
                .collect::<Vec<_>>(),
            [
                (
                    "http://10.0.1.1:30000".into(),
                    WorkerType::Prefill,
                    Some(8998)
                ),
                ("http://10.0.1.2:30000".into(), WorkerType::Prefill, None),
                ("http://10.0.2.1:30000".into(), WorkerType::Decode, None),
            ]
        );
        // A label change moves p from prefill to decode: a new worker.
        let p = {
            let mut p = pod("p", "10.0.1.1");
            p.annotations
                .insert("sglang.ai/bootstrap-port".into(), "8998".into());
            p
        };
        let done = r.reconcile(
            &m,
            &[(WorkerType::Prefill, vec![]), (WorkerType::Decode, vec![p])],
        );
        assert!(
            done.added.contains(&"http://10.0.1.1:30000".to_owned()),
            "{done:?}"
        );
        let now = listed(&m);
        assert_eq!(
            now,
            [(
                "http://10.0.1.1:30000".into(),
                WorkerType::Decode,
                None,
                Origin::Discovered
            )]
        );
    }

    #[tokio::test]
    async fn a_worker_removed_by_hand_comes_back_at_the_next_reconcile() {
        let m = manager();
        let mut r = Reconciler::new(8000, "a");
        let pods = [(WorkerType::Regular, vec![pod("a", "10.0.0.1")])];
        r.reconcile(&m, &pods);
        let id = m.registry().list()[0].id().to_owned();
        m.remove(&id);
        let done = r.reconcile(&m, &pods);
        assert_eq!(done.added, ["http://10.0.0.1:8000"]);
        assert!(done.removed.is_empty());
        assert_eq!(m.registry().list().len(), 1);
    }

    #[tokio::test]
    async fn a_pod_ready_again_while_its_old_worker_drains_waits_then_comes_back() {
        let m = manager();
        let mut r = Reconciler::new(8000, "a");
        let ready = [(WorkerType::Regular, vec![pod("a", "10.0.0.1")])];
        r.reconcile(&m, &ready);
        let old = m.registry().list()[0].clone();
        let in_flight = crate::LoadGuard::new(old.clone());
        let mut flap = pod("a", "10.0.0.1");
        flap.ready = false;
        let done = r.reconcile(&m, &[(WorkerType::Regular, vec![flap])]);
        assert_eq!(done.removed, ["http://10.0.0.1:8000"]);
        assert!(old.is_draining() && m.registry().get(old.id()).is_some());
        // Ready again while a request still runs on the draining worker: it waits.
        let done = r.reconcile(&m, &ready);
        assert_eq!(
            (done.waiting, done.added.len(), done.problems.len()),
            (1, 0, 0),
            "{done:?}"
        );
        drop(in_flight);
        for _ in 0..1000 {
            if m.registry().get(old.id()).is_none() {
                break;
            }
            tokio::task::yield_now().await;
        }
        let done = r.reconcile(&m, &ready);
        assert_eq!((done.waiting, done.added.len()), (0, 1), "{done:?}");
        assert!(m.registry().list()[0].id() != old.id());
    }

    #[tokio::test]
    async fn workers_found_in_every_namespace_get_no_gateway_key() {
        let m = manager();
        m.set_discovered_keyed(false);
        let mut r = Reconciler::new(8000, "a");
        r.reconcile(&m, &[(WorkerType::Regular, vec![pod("a", "10.0.0.1")])]);
        assert!(m.registry().list()[0].bearer().is_none());
        m.set_default_key(Some("gk2".into()));
        assert!(
            m.registry().list()[0].bearer().is_none(),
            "a reload does not give it one"
        );
    }
}
