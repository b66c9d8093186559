//! deploy/ reads the binary instead of restating it. The example configs are exactly what
//! `--print-config` prints; every `moongate` command line in compose.yaml and the Kubernetes
//! manifests is accepted by the binary (run with `--print-config`, which parses and
//! validates it with its environment); the ports, probes and URLs written beside those
//! command lines are the ones their settings give; the image's port and health check are
//! `serve`'s; and compose and Kubernetes wait longer than the gateway's graceful shutdown.
//! Docker and Kubernetes themselves are not run here.

#[path = "deploy/k8s.rs"]
mod k8s;
#[path = "deploy/kustomize.rs"]
mod kustomize;
#[path = "deploy/manifests.rs"]
mod manifests;
#[path = "deploy/observability.rs"]
mod observability;

use std::collections::BTreeMap;

use manifests::{Process, Wants, deploy_dir, read, string_map, strings, yaml_docs};
use yaml_rust2::Yaml;

/// What to run when a generated file is stale.
const REGENERATE: &str = "deploy/regenerate.sh";

/// `moongate <sub> --print-config` with nothing else given.
fn defaults(sub: &str) -> String {
    manifests::print_config(&[sub.to_owned()], &[]).expect("--print-config with defaults")
}

/// Splits a generated file into its comment header and its body.
fn header_and_body(text: &str) -> (&str, &str) {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if !(line.starts_with('#') || line.trim().is_empty()) {
            break;
        }
        at += line.len();
    }
    text.split_at(at)
}

#[test]
fn example_configs_are_exactly_the_defaults() {
    for (file, sub) in [
        ("k8s/base/moongate.toml", "serve"),
        ("master.toml", "master"),
    ] {
        let text = read(file);
        let (header, body) = header_and_body(&text);
        assert!(
            header.contains(REGENERATE),
            "deploy/{file}: its header must say how to regenerate it ({REGENERATE})"
        );
        let printed = defaults(sub);
        assert!(
            body == printed,
            "deploy/{file} is not what `moongate {sub} --print-config` prints now: run \
             {REGENERATE}\n--- deploy/{file} (body)\n{body}\n--- moongate {sub} --print-config\n{printed}"
        );
        // Loaded as a config file, it changes nothing.
        let path = deploy_dir().join(file).to_string_lossy().into_owned();
        let loaded = manifests::print_config(&[sub.to_owned(), "--config".into(), path], &[])
            .unwrap_or_else(|e| panic!("deploy/{file} is not a valid --config file: {e}"));
        assert_eq!(loaded, printed, "deploy/{file} loaded with --config");
    }
}

#[test]
fn the_image_exposes_and_checks_the_serve_default_port() {
    let dockerfile = read("Dockerfile");
    let port: toml::Table = toml::from_str(&defaults("serve")).unwrap();
    let port = port["port"].as_integer().unwrap();
    let line = |word: &str| {
        let lines: Vec<&str> = dockerfile
            .lines()
            // Instructions start a line; continuation lines are indented.
            .filter(|l| l.split_whitespace().next() == Some(word) && !l.starts_with(' '))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "deploy/Dockerfile: one {word} line, got {lines:?}"
        );
        lines[0].trim().to_owned()
    };
    assert_eq!(
        line("EXPOSE"),
        format!("EXPOSE {port}"),
        "deploy/Dockerfile"
    );
    assert_eq!(line("ENTRYPOINT"), r#"ENTRYPOINT ["moongate"]"#);
    assert_eq!(line("CMD"), r#"CMD ["serve"]"#);
    // The health check is the gateway's liveness route on MOONGATE_PORT, else the default.
    let probe = format!(
        "127.0.0.1:${{{}:-{port}}}/liveness",
        gateway::config::env::PORT
    );
    assert!(
        dockerfile.contains(&probe),
        "deploy/Dockerfile: the HEALTHCHECK must probe {probe}"
    );
}

/// A compose duration such as `200s` or `3m`, in seconds.
fn compose_secs(s: &str, origin: &str) -> i64 {
    let unit =
        |suffix: &str, mul: i64| s.strip_suffix(suffix)?.parse::<i64>().ok().map(|n| n * mul);
    unit("s", 1)
        .or_else(|| unit("m", 60))
        .unwrap_or_else(|| panic!("{origin}: write the duration {s:?} as Ns or Nm"))
}

/// A compose `environment`, as a map or a `K=V` list.
fn compose_env(y: &Yaml, origin: &str) -> Vec<(String, String)> {
    if y.is_badvalue() {
        return Vec::new();
    }
    if y.is_hash() {
        return string_map(y);
    }
    strings(y, origin)
        .into_iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .unwrap_or_else(|| panic!("{origin}: {kv} is not K=V"));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

#[test]
fn compose_command_lines_are_accepted_and_agree() {
    let doc = &yaml_docs("compose.yaml")[0];
    let services = doc["services"].as_hash().expect("compose.yaml: services");
    // Service name -> its process and its profiles.
    let mut procs: BTreeMap<String, (Process, Vec<String>)> = BTreeMap::new();
    // The other services (etcd, Prometheus, Grafana).
    let mut others: BTreeMap<String, observability::Other> = BTreeMap::new();
    for (name, svc) in services {
        let name = name.as_str().expect("service name");
        let origin = format!("deploy/compose.yaml service `{name}`");
        let image = svc["image"].as_str().unwrap_or_default();
        let profiles = match &svc["profiles"] {
            Yaml::BadValue => Vec::new(),
            y => strings(y, &origin),
        };
        if !image.starts_with("moongate") {
            others.insert(
                name.to_owned(),
                observability::Other::new(svc, profiles, &origin),
            );
            continue;
        }
        assert!(
            svc["entrypoint"].is_badvalue(),
            "{origin}: the image's entrypoint is `moongate`; give its arguments as `command`"
        );
        let args = strings(&svc["command"], &origin);
        assert!(
            !args.iter().any(|a| a.starts_with("--config")),
            "{origin}: --config is not checked for compose services; use flags"
        );
        let p = Process::new(
            origin.clone(),
            args,
            &compose_env(&svc["environment"], &origin),
        );
        let mounts: Vec<String> = (svc["volumes"].as_vec().into_iter().flatten())
            .filter_map(|v| v.as_str()?.split(':').nth(1).map(str::to_owned))
            .collect();
        p.check_secret(&mounts);
        let port = p.http_port();
        for mapping in svc["ports"].as_vec().into_iter().flatten() {
            let mapping = mapping
                .as_str()
                .expect("ports as \"HOST:CONTAINER\" strings");
            let container = mapping.rsplit(':').next().unwrap();
            assert_eq!(container, port.to_string(), "{origin}: ports {mapping}");
        }
        let check = &svc["healthcheck"]["test"];
        if check.is_badvalue() {
            // The image's own check: the gateway's liveness route on the default port.
            let serve_port: toml::Table = toml::from_str(&defaults("serve")).unwrap();
            assert!(
                p.sub() == "serve" && i64::from(port) == serve_port["port"].as_integer().unwrap(),
                "{origin}: the image's health check probes `serve` on its default port; give \
                 this service its own healthcheck"
            );
        } else {
            let check = strings(check, &origin).join(" ");
            assert!(
                check.contains(&format!("//127.0.0.1:{port}/")),
                "{origin}: healthcheck {check:?} must probe port {port}"
            );
        }
        if let Some(grace) = p.shutdown_grace_secs() {
            let stop = svc["stop_grace_period"].as_str().unwrap_or("10s");
            assert!(
                compose_secs(stop, &origin) > grace,
                "{origin}: stop_grace_period {stop} must exceed shutdown_grace_period_secs \
                 ({grace}), or Docker kills the gateway while it drains"
            );
        }
        procs.insert(name.to_owned(), (p, profiles));
    }
    // A target starts whenever its source does: it has no profile, or every one of its
    // source's.
    let starts_with = |target: &[String], source: &[String]| {
        target.is_empty() || (!source.is_empty() && source.iter().all(|p| target.contains(p)))
    };
    for (p, profiles) in procs.values() {
        for link in p.links() {
            if link.wants == Wants::Etcd {
                let etcd = others
                    .get(&link.host)
                    .unwrap_or_else(|| panic!("{}: {} names no service", p.origin, link.url));
                assert!(
                    etcd.is_etcd_on(link.port),
                    "{}: {} wants etcd's client port, but {} is {etcd:?}",
                    p.origin,
                    link.url,
                    link.host
                );
                assert!(
                    starts_with(&etcd.profiles, profiles),
                    "{}: {} is not started with it",
                    p.origin,
                    link.host
                );
                continue;
            }
            let (target, target_profiles) = procs
                .get(&link.host)
                .unwrap_or_else(|| panic!("{}: {} names no moongate service", p.origin, link.url));
            assert!(
                target.is(&link.wants) && target.http_port() == link.port,
                "{}: {} wants {:?} on port {}, but {} serves port {} with\n{:#?}",
                p.origin,
                link.url,
                link.wants,
                link.port,
                target.origin,
                target.http_port(),
                target.settings
            );
            assert!(
                starts_with(target_profiles, profiles),
                "{}: {} is in profiles {target_profiles:?}, which do not start with {profiles:?}",
                p.origin,
                link.host
            );
        }
    }
    let subs: Vec<&str> = procs.values().map(|(p, _)| p.sub()).collect();
    for sub in ["serve", "sim-worker", "store", "master"] {
        assert!(
            subs.contains(&sub),
            "deploy/compose.yaml runs no `moongate {sub}`"
        );
    }
    observability::check_compose(&procs, &others);
    assert!(
        procs.values().any(|(p, profiles)| {
            p.settings.get("pd_disaggregation") == Some(&toml::Value::Boolean(true))
                && profiles == &["pd"]
        }),
        "deploy/compose.yaml: the `pd` profile runs a PD gateway"
    );
}

/// The kustomize entry points: the single node, and the overlays built on it.
const OVERLAYS: [&str; 3] = ["k8s/base", "k8s/ha", "k8s/pd"];

#[test]
fn every_kubernetes_manifest_is_in_its_kustomization() {
    for dir in OVERLAYS {
        let k = &yaml_docs(&format!("{dir}/kustomization.yaml"))[0];
        let mut listed: Vec<String> = strings(&k["resources"], dir)
            .into_iter()
            .filter(|r| r.ends_with(".yaml"))
            .collect();
        listed.sort();
        let mut on_disk: Vec<String> = std::fs::read_dir(deploy_dir().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
            .collect();
        on_disk.sort();
        assert_eq!(
            listed, on_disk,
            "deploy/{dir}/kustomization.yaml must list every manifest beside it"
        );
    }
}

#[test]
fn kubernetes_command_lines_are_accepted_and_agree() {
    for dir in OVERLAYS {
        let overlay = k8s::read(dir, kustomize::render(&deploy_dir().join(dir)));
        overlay.check_links();
        overlay.check_etcd();
        let discovering = overlay.check_discovery();
        let subs = overlay.subs();
        let want: &[&str] = match dir {
            "k8s/base" => &["serve", "sim-worker", "store"],
            "k8s/ha" => &["serve", "sim-worker", "store", "master"],
            _ => &["serve", "store"],
        };
        for sub in want {
            assert!(subs.contains(sub), "deploy/{dir} runs no `moongate {sub}`");
        }
        match dir {
            "k8s/ha" => {
                let masters = overlay
                    .containers
                    .iter()
                    .filter(|c| c.process().is_some_and(|p| p.sub() == "master"));
                assert!(
                    masters.map(|c| c.replicas).sum::<i64>() >= 3,
                    "deploy/{dir}: three HA masters"
                );
                assert!(
                    overlay
                        .containers
                        .iter()
                        .any(|c| c.flag("--initial-cluster").is_some()),
                    "deploy/{dir}: an etcd StatefulSet"
                );
            }
            "k8s/pd" => assert_eq!(
                discovering, 1,
                "deploy/{dir}: one gateway discovering SGLang pods"
            ),
            _ => {}
        }
    }
}

/// kubectl's own kustomize renders each overlay to the resources and command lines that
/// gateway/moongate/tests/deploy/kustomize.rs reads (run by .ci/run where kubectl is installed:
/// `cargo test -p gateway --test deploy -- --ignored kubectl`).
#[test]
#[ignore = "needs kubectl"]
fn kubectl_renders_the_overlays_as_the_tests_read_them() {
    for dir in OVERLAYS {
        let out = std::process::Command::new("kubectl")
            .args(["kustomize"])
            .arg(deploy_dir().join(dir))
            .output()
            .expect("kubectl (install it, or leave this ignored test alone)");
        assert!(
            out.status.success(),
            "kubectl kustomize {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs =
            yaml_rust2::YamlLoader::load_from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
        let ours = kustomize::render(&deploy_dir().join(dir)).docs;
        let summary = |docs: &[Yaml]| {
            let mut v: Vec<String> = docs
                .iter()
                .map(|d| {
                    let mut d = d.clone();
                    // kustomize appends a content hash to generated ConfigMaps' names and
                    // the references to them.
                    observability::strip_config_map_hash(&mut d);
                    let mut text = String::new();
                    yaml_rust2::YamlEmitter::new(&mut text)
                        .dump(&observability::sorted(&d))
                        .unwrap();
                    text
                })
                .collect();
            v.sort();
            v
        };
        let (theirs, ours) = (summary(&theirs), summary(&ours));
        // The ConfigMap itself is generated by kubectl only.
        let theirs: Vec<&String> = theirs
            .iter()
            .filter(|t| !t.contains("kind: ConfigMap"))
            .collect();
        assert_eq!(
            theirs,
            ours.iter().collect::<Vec<_>>(),
            "deploy/{dir}: kubectl and the test read it differently"
        );
    }
}

#[test]
fn every_yaml_and_json_file_in_deploy_parses() {
    let mut seen = 0;
    let mut dirs = vec![deploy_dir()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let name = path.to_string_lossy().into_owned();
            if path.is_dir() {
                dirs.push(path);
            } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                let text = std::fs::read_to_string(&path).unwrap();
                let docs = yaml_rust2::YamlLoader::load_from_str(&text)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(!docs.is_empty(), "{name}: no document");
                seen += 1;
            } else if name.ends_with(".json") {
                let text = std::fs::read_to_string(&path).unwrap();
                serde_json::from_str::<serde_json::Value>(&text)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                seen += 1;
            }
        }
    }
    assert!(seen >= 15, "only {seen} YAML/JSON files under deploy/");
}
