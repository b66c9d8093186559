//! Mooncake's master HTTP service for the hosted master ([`kvmaster::rest::mooncake`]) on
//! its own listener (`--mooncake-http-port`, what `mooncake_master` serves on its
//! `--metrics_port`), behind the admin plane: the admin key, or loopback callers when
//! there is none (`--insecure-open-admin` opens it as it opens the other admin routes). It
//! lists keys, segments and where each value lies, so it is not left open as Mooncake
//! leaves its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::Request;
use hyper::body::Incoming;
use kvmaster::Master;
use kvmaster::rest::mooncake::{self, Role};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use utoipa_axum::router::OpenApiRouter;

use super::{HostedMaster, master_rejection};
use crate::auth::{Auth, Plane};
use crate::listen::{ClientLimits, DeadlineBody};

impl mooncake::Service for HostedMaster {
    fn serving(&self) -> Option<Arc<Master>> {
        self.current()
    }

    fn role(&self) -> Role {
        #[cfg(feature = "etcd")]
        if let Some(node) = self.ha() {
            let status = node.status();
            let term = (status.term > 0).then_some(status.term);
            return match status.role {
                kvmaster::ha::Role::Leader => Role {
                    role: "leader",
                    state: match self.current() {
                        Some(_) => "serving",
                        None => "recovering",
                    },
                    leader: None,
                    view_version: term,
                },
                kvmaster::ha::Role::Follower => Role {
                    role: "standby",
                    state: "standby",
                    leader: status.leader_url,
                    view_version: term,
                },
                kvmaster::ha::Role::Candidate => Role {
                    role: "standby",
                    state: "candidate",
                    leader: None,
                    view_version: None,
                },
            };
        }
        Role::ALONE
    }

    fn exposition(&self) -> String {
        if let Some(master) = self.current() {
            kvmaster::publish_gauges(&master);
        }
        crate::metrics::install().render()
    }
}

/// Mooncake's HTTP service over `hosted`, behind `auth`'s admin plane.
pub fn app(hosted: &HostedMaster, auth: &Auth) -> axum::Router {
    let routes = OpenApiRouter::from(mooncake::router(Arc::new(hosted.clone())));
    auth.guard(Plane::Admin, routes, master_rejection()).into()
}

/// Binds `host:port` and serves [`app`] there until `stop`, with `limits`, letting
/// requests in flight finish for up to `grace`. Answers the bound address.
pub async fn spawn(
    hosted: &HostedMaster,
    auth: &Auth,
    (host, port): (&str, u16),
    stop: CancellationToken,
    grace: Duration,
    limits: ClientLimits,
) -> anyhow::Result<(SocketAddr, JoinHandle<std::io::Result<()>>)> {
    let listener = TcpListener::bind((host, port))
        .await
        .with_context(|| format!("binding Mooncake's HTTP service on {host}:{port}"))?;
    let addr = listener.local_addr()?;
    let svc = ServiceExt::<Request<DeadlineBody<Incoming>>>::boxed_clone(app(hosted, auth));
    let task = tokio::spawn(crate::listen::accept_loop(
        listener, None, svc, stop, grace, limits,
    ));
    tracing::info!(%addr, "Mooncake's master HTTP service listening");
    Ok((addr, task))
}
