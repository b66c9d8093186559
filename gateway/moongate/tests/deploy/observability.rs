//! Compose's other services (etcd, Prometheus, Grafana) and the checks that tie them to the
//! `moongate` services: Prometheus scrapes every Moongate process that runs with it, on its
//! `/metrics` port; Grafana's data source is that Prometheus, its dashboard provider reads
//! the mounted dashboards, and every panel queries that data source. Plus what the
//! kubectl comparison needs to read kubectl's output like ours.

use std::collections::BTreeMap;

use yaml_rust2::Yaml;
use yaml_rust2::yaml::Hash;

use super::manifests::{Process, deploy_dir, flag_value, strings, yaml_docs};

/// A compose service that is not a `moongate` process.
#[derive(Debug)]
pub struct Other {
    /// Its image.
    pub image: String,
    /// Its command (empty: the image's).
    pub command: Vec<String>,
    /// Its profiles.
    pub profiles: Vec<String>,
    /// Its bind mounts and volumes: (source, target).
    pub volumes: Vec<(String, String)>,
}

impl Other {
    /// Reads a compose service.
    pub fn new(svc: &Yaml, profiles: Vec<String>, origin: &str) -> Other {
        let command = match &svc["command"] {
            Yaml::BadValue => Vec::new(),
            y => strings(y, origin),
        };
        let volumes = (svc["volumes"].as_vec().into_iter().flatten())
            .filter_map(|v| {
                let mut parts = v.as_str()?.split(':');
                Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
            })
            .collect();
        Other {
            image: svc["image"].as_str().unwrap_or_default().to_owned(),
            command,
            profiles,
            volumes,
        }
    }

    /// Whether it is an etcd serving clients on `port`.
    pub fn is_etcd_on(&self, port: u16) -> bool {
        self.image.contains("etcd")
            && flag_value(&self.command, "--listen-client-urls")
                .is_some_and(|u| u.ends_with(&format!(":{port}")))
    }

    /// The source mounted at `target`.
    fn mounted_at(&self, target: &str) -> Option<&str> {
        self.volumes
            .iter()
            .find(|(_, t)| t == target)
            .map(|(s, _)| s.as_str())
    }
}

/// Whether a service with `target` profiles starts whenever one with `source` profiles does.
fn starts_with(target: &[String], source: &[String]) -> bool {
    target.is_empty() || (!source.is_empty() && source.iter().all(|p| target.contains(p)))
}

/// The file in deploy/ that a compose bind mount `./x` names.
fn local(source: &str) -> String {
    source
        .strip_prefix("./")
        .unwrap_or_else(|| panic!("compose bind mounts are ./relative, got {source:?}"))
        .to_owned()
}

/// See the module doc.
pub fn check_compose(
    procs: &BTreeMap<String, (Process, Vec<String>)>,
    others: &BTreeMap<String, Other>,
) {
    let (prom_name, prom) = others
        .iter()
        .find(|(_, o)| o.image.starts_with("prom/prometheus"))
        .expect("deploy/compose.yaml: a Prometheus service");
    let config = prom
        .mounted_at("/etc/prometheus/prometheus.yml")
        .expect("Prometheus: its config mounted at /etc/prometheus/prometheus.yml");
    let config = &yaml_docs(&local(config))[0];
    let mut scraped = Vec::new();
    for job in config["scrape_configs"].as_vec().expect("scrape_configs") {
        let path = job["metrics_path"].as_str().unwrap_or("/metrics");
        assert_eq!(
            path, "/metrics",
            "prometheus.yml: job {:?}",
            job["job_name"]
        );
        for sc in job["static_configs"].as_vec().into_iter().flatten() {
            for t in strings(&sc["targets"], "prometheus.yml targets") {
                let (host, port) = t.rsplit_once(':').expect("host:port");
                let (p, profiles) = procs
                    .get(host)
                    .unwrap_or_else(|| panic!("prometheus.yml: {t} names no moongate service"));
                assert_eq!(
                    port,
                    p.metrics_port().to_string(),
                    "prometheus.yml: {t}: {} serves /metrics on {}",
                    p.origin,
                    p.metrics_port()
                );
                assert!(
                    starts_with(profiles, &prom.profiles),
                    "prometheus.yml: {t} does not run with {prom_name}"
                );
                scraped.push(host.to_owned());
            }
        }
    }
    for (name, (p, profiles)) in procs {
        if matches!(p.sub(), "serve" | "master" | "store") && starts_with(profiles, &prom.profiles)
        {
            assert!(
                scraped.contains(name),
                "prometheus.yml: {name} runs with {prom_name} but is not scraped"
            );
        }
    }

    let (graf_name, graf) = others
        .iter()
        .find(|(_, o)| o.image.starts_with("grafana/grafana"))
        .expect("deploy/compose.yaml: a Grafana service");
    assert!(
        starts_with(&prom.profiles, &graf.profiles),
        "{graf_name} runs without {prom_name}"
    );
    let provisioning = graf
        .mounted_at("/etc/grafana/provisioning")
        .expect("Grafana: provisioning mounted at /etc/grafana/provisioning");
    let provisioning = local(provisioning);
    let mut uids = Vec::new();
    for e in std::fs::read_dir(deploy_dir().join(&provisioning).join("datasources")).unwrap() {
        let file = format!(
            "{provisioning}/datasources/{}",
            e.unwrap().file_name().to_string_lossy()
        );
        for ds in yaml_docs(&file)[0]["datasources"]
            .as_vec()
            .expect("datasources")
        {
            let url = ds["url"].as_str().expect("url");
            assert_eq!(
                url,
                format!("http://{prom_name}:9090"),
                "{file}: the compose Prometheus"
            );
            uids.push(ds["uid"].as_str().expect("uid").to_owned());
        }
    }
    let mut dashboards = 0;
    for e in std::fs::read_dir(deploy_dir().join(&provisioning).join("dashboards")).unwrap() {
        let file = format!(
            "{provisioning}/dashboards/{}",
            e.unwrap().file_name().to_string_lossy()
        );
        for p in yaml_docs(&file)[0]["providers"]
            .as_vec()
            .expect("providers")
        {
            let path = p["options"]["path"].as_str().expect("options.path");
            let source = graf
                .mounted_at(path)
                .unwrap_or_else(|| panic!("{file}: nothing is mounted at {path}"));
            for d in std::fs::read_dir(deploy_dir().join(local(source))).unwrap() {
                let d = d.unwrap().path();
                let v: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&d).unwrap()).unwrap();
                check_dashboard(&v, &uids, &d.display().to_string());
                dashboards += 1;
            }
        }
    }
    assert!(dashboards > 0, "Grafana provisions no dashboard");
}

/// Every panel and query names a provisioned data source, and every query has an expression.
fn check_dashboard(v: &serde_json::Value, uids: &[String], file: &str) {
    let panels = v["panels"].as_array().expect("panels");
    let mut queries = 0;
    for p in panels.iter().chain(
        panels
            .iter()
            .flat_map(|p| p["panels"].as_array().into_iter().flatten()),
    ) {
        if p["type"] == "row" {
            continue;
        }
        let uid = p["datasource"]["uid"].as_str().unwrap_or_default();
        assert!(
            uids.iter().any(|u| u == uid),
            "{file}: panel {:?}: data source {uid:?}",
            p["title"]
        );
        for t in p["targets"].as_array().expect("targets") {
            assert_eq!(
                t["datasource"]["uid"].as_str(),
                Some(uid),
                "{file}: {:?}",
                p["title"]
            );
            assert!(
                t["expr"].as_str().is_some_and(|e| e.contains("moongate_")),
                "{file}: {:?}",
                p["title"]
            );
            queries += 1;
        }
    }
    assert!(queries > 0, "{file}: no query");
}

/// `doc` with `moongate-config-<hash>` (kustomize's generated ConfigMap name) read as
/// `moongate-config`.
pub fn strip_config_map_hash(doc: &mut Yaml) {
    match doc {
        Yaml::String(s) if s.starts_with("moongate-config-") => *s = "moongate-config".to_owned(),
        Yaml::Array(a) => a.iter_mut().for_each(strip_config_map_hash),
        Yaml::Hash(h) => h.iter_mut().for_each(|(_, v)| strip_config_map_hash(v)),
        _ => {}
    }
}

/// `doc` with every map's keys in order, so two renderings compare as text.
pub fn sorted(doc: &Yaml) -> Yaml {
    match doc {
        Yaml::Array(a) => Yaml::Array(a.iter().map(sorted).collect()),
        Yaml::Hash(h) => {
            let mut entries: Vec<(&Yaml, &Yaml)> = h.iter().collect();
            entries.sort_by_key(|(k, _)| k.as_str().unwrap_or_default().to_owned());
            let mut out = Hash::new();
            for (k, v) in entries {
                out.insert(k.clone(), sorted(v));
            }
            Yaml::Hash(out)
        }
        other => other.clone(),
    }
}
