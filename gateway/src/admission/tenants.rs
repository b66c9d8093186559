//! Per-tenant limits (the client keys file's `rate` and `concurrency`, see
//! [`crate::auth::tenants`]): a request of a tenant over either is refused at once with 429
//! (`Retry-After` when the next token is due), before it takes a place in the queue, so
//! one tenant's burst cannot fill the queue for everyone.
//!
//! The gates follow the keys in force: when a reload changes the tenants, the gates are
//! rebuilt on the next request, a tenant whose limits did not change keeping its own (its
//! requests in flight and its tokens), a changed one counting afresh.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::{Refusal, TokenBucket};
use crate::auth::Tenant;

/// The tenant (its index among the keys in force) whose client key a request presented:
/// put on the request by the front door.
#[derive(Debug, Clone, Copy)]
pub struct ClientOwner(pub u32);

/// One tenant's gate.
#[derive(Debug)]
pub struct TenantGate {
    tenant: Tenant,
    in_flight: AtomicUsize,
    bucket: Option<TokenBucket>,
}

/// A tenant's request in flight, counted until dropped.
#[derive(Debug)]
pub struct TenantPermit(Arc<TenantGate>);

impl Drop for TenantPermit {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl TenantGate {
    fn new(tenant: Tenant) -> Self {
        Self {
            bucket: tenant.rate_per_second.map(TokenBucket::new),
            in_flight: AtomicUsize::new(0),
            tenant,
        }
    }

    /// The tenant.
    pub fn tenant(&self) -> &Tenant {
        &self.tenant
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Admits one request of this tenant, or says why not.
    pub fn enter(self: &Arc<Self>) -> Result<TenantPermit, Refusal> {
        let now = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let permit = TenantPermit(self.clone());
        if let Some(max) = self.tenant.max_concurrent
            && now >= max
        {
            return Err(Refusal::TenantBusy { max });
        }
        if let Some(bucket) = &self.bucket {
            let wait = bucket.reserve();
            if !wait.is_zero() {
                bucket.refund();
                return Err(Refusal::TenantRateLimited {
                    per_second: bucket.rate,
                    retry_after: wait,
                });
            }
        }
        Ok(permit)
    }
}

#[derive(Debug, Default)]
struct Built {
    source: Arc<[Tenant]>,
    gates: Vec<Arc<TenantGate>>,
}

/// The gates of the tenants in force.
#[derive(Debug, Default)]
pub struct Tenants {
    built: ArcSwap<Built>,
    rebuild: Mutex<()>,
}

impl Tenants {
    /// The gate of tenant `index` of `tenants` (the keys in force), rebuilding the gates
    /// first when `tenants` is not what they were built from.
    pub fn gate(&self, tenants: &Arc<[Tenant]>, index: u32) -> Option<Arc<TenantGate>> {
        let built = self.built.load();
        if !Arc::ptr_eq(&built.source, tenants) {
            drop(built);
            let _one = self.rebuild.lock();
            let old = self.built.load_full();
            if !Arc::ptr_eq(&old.source, tenants) {
                let gates = tenants
                    .iter()
                    .map(|t| {
                        old.gates
                            .iter()
                            .find(|g| &g.tenant == t)
                            .cloned()
                            .unwrap_or_else(|| Arc::new(TenantGate::new(t.clone())))
                    })
                    .collect();
                self.built.store(Arc::new(Built {
                    source: tenants.clone(),
                    gates,
                }));
            }
            return self.built.load().gates.get(index as usize).cloned();
        }
        built.gates.get(index as usize).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, rate: Option<u64>, conc: Option<usize>) -> Tenant {
        Tenant {
            name: name.into(),
            rate_per_second: rate,
            max_concurrent: conc,
            max_priority: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_and_rate_per_tenant() {
        let ts = Tenants::default();
        let set: Arc<[Tenant]> =
            vec![tenant("a", None, Some(2)), tenant("b", Some(2), None)].into();
        let a = ts.gate(&set, 0).unwrap();
        let (p1, _p2) = (a.enter().unwrap(), a.enter().unwrap());
        assert_eq!(a.enter().unwrap_err(), Refusal::TenantBusy { max: 2 });
        assert_eq!(a.in_flight(), 2, "a refused request is not counted");
        drop(p1);
        let _p3 = a.enter().unwrap();

        let b = ts.gate(&set, 1).unwrap();
        drop((b.enter().unwrap(), b.enter().unwrap()));
        match b.enter().unwrap_err() {
            Refusal::TenantRateLimited {
                per_second: 2,
                retry_after,
            } => {
                assert_eq!(retry_after, std::time::Duration::from_millis(500));
            }
            other => panic!("{other:?}"),
        }
        tokio::time::advance(std::time::Duration::from_millis(500)).await;
        drop(b.enter().unwrap());
        assert!(ts.gate(&set, 2).is_none());
    }

    #[test]
    fn a_reload_keeps_the_gates_of_unchanged_tenants() {
        let ts = Tenants::default();
        let before: Arc<[Tenant]> =
            vec![tenant("a", None, Some(1)), tenant("b", None, Some(1))].into();
        let a = ts.gate(&before, 0).unwrap();
        let _held = a.enter().unwrap();
        let after: Arc<[Tenant]> =
            vec![tenant("b", None, Some(5)), tenant("a", None, Some(1))].into();
        let a2 = ts.gate(&after, 1).unwrap();
        assert!(
            Arc::ptr_eq(&a, &a2),
            "unchanged: the same gate, still counting"
        );
        assert!(a2.enter().is_err());
        let b2 = ts.gate(&after, 0).unwrap();
        assert_eq!(b2.tenant().max_concurrent, Some(5));
    }
}
