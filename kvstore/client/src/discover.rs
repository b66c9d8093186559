//! How a client given `etcd://h1:2379,h2:2379[/cluster]` instead of master URLs finds the
//! masters of an HA cluster: every running master announces its URL in etcd under
//! [`openapi::master::etcd`]'s keys; the client reads them once, when it connects, and then
//! follows the leader among them.

use openapi::master::etcd::{DEFAULT_CLUSTER_ID, cluster_prefix};

/// Whether a master URL names etcd (`etcd://h1:2379,h2:2379[/cluster]`) rather than masters.
pub fn is_etcd_url(url: &str) -> bool {
    url.trim_start().starts_with("etcd://")
}

/// Every master registered in etcd for the cluster `url` names
/// (`etcd://h1:2379,h2:2379[/cluster]`, cluster `default` when none is given), as the
/// comma-separated list a client takes. Read once, when the client connects.
pub async fn discover_masters(url: &str) -> Result<String, String> {
    let rest = url.trim().trim_start_matches("etcd://");
    let (hosts, cluster) = rest.split_once('/').unwrap_or((rest, DEFAULT_CLUSTER_ID));
    let cluster = cluster.trim_end_matches('/');
    let cluster = if cluster.is_empty() {
        DEFAULT_CLUSTER_ID
    } else {
        cluster
    };
    let endpoints: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("http://{h}"))
        .collect();
    if endpoints.is_empty() || cluster.contains('/') {
        return Err(format!(
            "{url:?} is not etcd://host:port[,host:port...][/cluster]"
        ));
    }
    discover(&endpoints, &cluster_prefix(cluster)).await
}

#[cfg(feature = "etcd")]
async fn discover(endpoints: &[String], prefix: &str) -> Result<String, String> {
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(std::time::Duration::from_secs(2))
        .with_timeout(std::time::Duration::from_secs(5));
    let mut client = etcd_client::Client::connect(endpoints, Some(opts))
        .await
        .map_err(|e| format!("etcd {endpoints:?}: {e}"))?;
    let key = format!("{prefix}{}", openapi::master::etcd::MASTERS_DIR);
    let resp = client
        .get(
            key.clone(),
            Some(etcd_client::GetOptions::new().with_prefix().with_limit(64)),
        )
        .await
        .map_err(|e| format!("etcd {endpoints:?}: {e}"))?;
    let urls: Vec<String> = resp
        .kvs()
        .iter()
        .filter_map(|kv| kv.value_str().ok().map(str::to_owned))
        .collect();
    if urls.is_empty() {
        return Err(format!(
            "no master is registered under {key} in etcd {endpoints:?}"
        ));
    }
    Ok(urls.join(","))
}

#[cfg(not(feature = "etcd"))]
async fn discover(_: &[String], _: &str) -> Result<String, String> {
    Err(
        "etcd:// master URLs need a build with the cargo feature `etcd`; list the masters' \
         URLs instead"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn etcd_urls_are_recognised_and_checked() {
        assert!(super::is_etcd_url(" etcd://h:2379/c"));
        assert!(!super::is_etcd_url("http://h:1"));
        for bad in ["etcd://", "etcd:///c", "etcd://h:1/a/b"] {
            assert!(super::discover_masters(bad).await.is_err(), "{bad}");
        }
    }
}
