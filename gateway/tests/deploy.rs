//! deploy/ reads the binary instead of restating it. The example configs are exactly what
//! `--print-config` prints; every `moongate` command line in compose.yaml and the Kubernetes
//! manifests is accepted by the binary (run with `--print-config`, which parses and
//! validates it with its environment); the ports, probes and URLs written beside those
//! command lines are the ones their settings give; the image's port and health check are
//! `serve`'s; and compose and Kubernetes wait longer than the gateway's graceful shutdown.
//! Docker and Kubernetes themselves are not run here.

#[path = "deploy/manifests.rs"]
mod manifests;

use std::collections::BTreeMap;
use std::path::Path;

use manifests::{Process, SECRET_PLACEHOLDER, deploy_dir, read, string_map, strings, yaml_docs};
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
    for (file, sub) in [("moongate.toml", "serve"), ("master.toml", "master")] {
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
    for (name, svc) in services {
        let name = name.as_str().expect("service name");
        let origin = format!("deploy/compose.yaml service `{name}`");
        let image = svc["image"].as_str().unwrap_or_default();
        if !image.starts_with("moongate") {
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
        let profiles = match &svc["profiles"] {
            Yaml::BadValue => Vec::new(),
            y => strings(y, &origin),
        };
        procs.insert(name.to_owned(), (p, profiles));
    }
    for (p, profiles) in procs.values() {
        for link in p.links() {
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
                target_profiles.is_empty() || target_profiles == profiles,
                "{}: {} is in profiles {target_profiles:?}, which do not start with {profiles:?}",
                p.origin,
                link.host
            );
        }
    }
    let subs: Vec<&str> = procs.values().map(|(p, _)| p.sub()).collect();
    for sub in ["serve", "sim-worker", "store"] {
        assert!(
            subs.contains(&sub),
            "deploy/compose.yaml runs no `moongate {sub}`"
        );
    }
    assert!(
        procs.values().any(|(p, profiles)| {
            p.settings.get("pd_disaggregation") == Some(&toml::Value::Boolean(true))
                && profiles == &["pd"]
        }),
        "deploy/compose.yaml: the `pd` profile runs a PD gateway"
    );
}

/// A workload's `moongate` container, as read from its manifest.
struct Container {
    process: Process,
    /// The pod's labels.
    labels: Vec<(String, String)>,
    /// Named container ports.
    ports: Vec<(String, i64)>,
}

/// A Kubernetes Service: name, selector, and `(port, targetPort)` pairs.
struct Service {
    name: String,
    selector: Vec<(String, String)>,
    ports: Vec<(i64, Yaml)>,
}

/// The `--config` file a container reads, mapped from its mount path to the file in deploy/
/// that kustomization.yaml turns into the mounted ConfigMap.
fn local_config(
    args: &mut [String],
    pod: &Yaml,
    container: &Yaml,
    generated: &BTreeMap<String, BTreeMap<String, String>>,
    origin: &str,
) {
    let Some(i) = args.iter().position(|a| a == "--config") else {
        assert!(
            !args.iter().any(|a| a.starts_with("--config=")),
            "{origin}: write `--config PATH`"
        );
        return;
    };
    let path = Path::new(&args[i + 1]);
    let (dir, file) = (path.parent().unwrap(), path.file_name().unwrap());
    let mount = container["volumeMounts"]
        .as_vec()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"].as_str().map(Path::new) == Some(dir))
        .unwrap_or_else(|| panic!("{origin}: nothing is mounted at {}", dir.display()));
    let volume = pod["volumes"]
        .as_vec()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("{origin}: no volume {:?}", mount["name"]));
    let map = volume["configMap"]["name"]
        .as_str()
        .expect("a configMap volume");
    let local = generated
        .get(map)
        .and_then(|files| files.get(file.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{origin}: kustomization.yaml generates no {map}/{file:?}"));
    args[i + 1] = deploy_dir().join(local).to_string_lossy().into_owned();
}

/// The volume behind a process's secret file is the Secret `moongate-transfer`, readable by
/// the pod's group only (mode 0440), with the pod's `fsGroup` set so the image's user can
/// read it (Moongate accepts a root-owned secret file readable by its group, never more).
fn secret_volume(pod: &Yaml, container: &Yaml, p: &Process, origin: &str) {
    let file = p.secret_file.as_deref().expect("checked");
    let dir = Path::new(file).parent().unwrap();
    let mount = (container["volumeMounts"].as_vec().into_iter().flatten())
        .find(|m| m["mountPath"].as_str().map(Path::new) == Some(dir))
        .expect("checked");
    let volume = (pod["volumes"].as_vec().into_iter().flatten())
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("{origin}: no volume {:?}", mount["name"]));
    assert_eq!(
        volume["secret"]["secretName"].as_str(),
        Some("moongate-transfer"),
        "{origin}: the secret file comes from the Secret moongate-transfer"
    );
    assert_eq!(
        volume["secret"]["defaultMode"].as_i64(),
        Some(0o440),
        "{origin}: the secret file's mode is 0440 (write 288)"
    );
    assert!(
        pod["securityContext"]["fsGroup"].as_i64().is_some(),
        "{origin}: set the pod's fsGroup, or the image's user cannot read the secret file"
    );
}

/// kustomization.yaml's `configMapGenerator`: ConfigMap name -> key -> file in deploy/.
fn generated_config_maps(kustomization: &Yaml) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut maps = BTreeMap::new();
    for g in kustomization["configMapGenerator"]
        .as_vec()
        .into_iter()
        .flatten()
    {
        let files = strings(&g["files"], "kustomization.yaml configMapGenerator files");
        let files = files.into_iter().map(|f| match f.split_once('=') {
            Some((key, file)) => (key.to_owned(), file.to_owned()),
            None => (f.rsplit('/').next().unwrap().to_owned(), f),
        });
        maps.insert(g["name"].as_str().unwrap().to_owned(), files.collect());
    }
    maps
}

/// Seconds a container's preStop hook waits (`sleep N`), before the process gets SIGTERM.
fn pre_stop_secs(container: &Yaml, origin: &str) -> i64 {
    let hook = &container["lifecycle"]["preStop"];
    if hook.is_badvalue() {
        return 0;
    }
    if let Some(n) = hook["sleep"]["seconds"].as_i64() {
        return n;
    }
    match strings(&hook["exec"]["command"], origin).as_slice() {
        [sleep, n] if sleep == "sleep" => n.parse().expect("seconds"),
        other => panic!("{origin}: preStop {other:?}: only `sleep N` is understood here"),
    }
}

#[test]
fn kubernetes_command_lines_are_accepted_and_agree() {
    let kustomization = &yaml_docs("kustomization.yaml")[0];
    let generated = generated_config_maps(kustomization);
    let resources = strings(&kustomization["resources"], "kustomization.yaml resources");
    let mut on_disk: Vec<String> = std::fs::read_dir(deploy_dir().join("k8s"))
        .unwrap()
        .map(|e| format!("k8s/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let mut listed = resources.clone();
    listed.sort();
    assert_eq!(
        listed, on_disk,
        "deploy/kustomization.yaml must list every k8s/ manifest"
    );

    let mut containers = Vec::new();
    let mut services = Vec::new();
    for file in &resources {
        for doc in yaml_docs(file) {
            let kind = doc["kind"].as_str().unwrap_or_default();
            let name = doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if kind == "Service" {
                services.push(Service {
                    name,
                    selector: string_map(&doc["spec"]["selector"]),
                    ports: (doc["spec"]["ports"].as_vec().into_iter().flatten())
                        .map(|p| (p["port"].as_i64().expect("port"), p["targetPort"].clone()))
                        .collect(),
                });
                continue;
            }
            if !matches!(kind, "Deployment" | "StatefulSet" | "DaemonSet") {
                continue;
            }
            let template = &doc["spec"]["template"];
            let pod = &template["spec"];
            for c in pod["containers"].as_vec().into_iter().flatten() {
                if !c["image"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("moongate")
                {
                    continue;
                }
                let cname = c["name"].as_str().unwrap_or_default();
                let origin = format!("deploy/{file} {kind} `{name}` container `{cname}`");
                assert!(
                    c["command"].is_badvalue(),
                    "{origin}: the image's entrypoint is `moongate`; give its arguments as `args`"
                );
                let mut args = strings(&c["args"], &origin);
                local_config(&mut args, pod, c, &generated, &origin);
                let env: Vec<(String, String)> = (c["env"].as_vec().into_iter().flatten())
                    .map(|e| {
                        let value = match e["value"].as_str() {
                            Some(v) => v.to_owned(),
                            None if !e["valueFrom"]["secretKeyRef"].is_badvalue() => {
                                SECRET_PLACEHOLDER.to_owned()
                            }
                            None => panic!("{origin}: env {e:?}: a string value or a Secret"),
                        };
                        (e["name"].as_str().expect("env name").to_owned(), value)
                    })
                    .collect();
                let process = Process::new(origin.clone(), args, &env);
                let mounts: Vec<String> = (c["volumeMounts"].as_vec().into_iter().flatten())
                    .filter_map(|m| m["mountPath"].as_str().map(str::to_owned))
                    .collect();
                process.check_secret(&mounts);
                if process.needs_secret() {
                    secret_volume(pod, c, &process, &origin);
                }
                let port = i64::from(process.http_port());
                let ports: Vec<(String, i64)> = (c["ports"].as_vec().into_iter().flatten())
                    .map(|p| {
                        let name = p["name"].as_str().unwrap_or_default().to_owned();
                        (name, p["containerPort"].as_i64().expect("containerPort"))
                    })
                    .collect();
                assert!(
                    ports.contains(&("http".to_owned(), port)),
                    "{origin}: needs the container port `http` = {port} (its settings), got {ports:?}"
                );
                for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                    for how in ["httpGet", "tcpSocket"] {
                        let p = &c[probe][how]["port"];
                        assert!(
                            p.is_badvalue()
                                || p.as_str() == Some("http")
                                || p.as_i64() == Some(port),
                            "{origin}: {probe} port {p:?} is not `http` ({port})"
                        );
                    }
                }
                let annotations = string_map(&template["metadata"]["annotations"]);
                if let Some((_, p)) = annotations.iter().find(|(k, _)| k == "prometheus.io/port") {
                    assert_eq!(
                        p,
                        &process.metrics_port().to_string(),
                        "{origin}: prometheus.io/port"
                    );
                }
                if let Some(grace) = process.shutdown_grace_secs() {
                    // Kubernetes' default when the field is absent is 30 seconds.
                    let budget = pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
                    let pause = pre_stop_secs(c, &origin);
                    assert!(
                        budget > grace + pause,
                        "{origin}: terminationGracePeriodSeconds {budget} must exceed the \
                         preStop pause ({pause} s) plus shutdown_grace_period_secs ({grace} s)"
                    );
                }
                let labels = string_map(&template["metadata"]["labels"]);
                containers.push(Container {
                    process,
                    labels,
                    ports,
                });
            }
        }
    }
    for c in &containers {
        for link in c.process.links() {
            let svc = services
                .iter()
                .find(|s| s.name == link.host.split('.').next().unwrap())
                .unwrap_or_else(|| panic!("{}: {} names no Service", c.process.origin, link.url));
            let (_, target) = svc
                .ports
                .iter()
                .find(|(p, _)| *p == i64::from(link.port))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: Service {} has no port {}",
                        c.process.origin, svc.name, link.port
                    )
                });
            let backends: Vec<&Container> = containers
                .iter()
                .filter(|t| svc.selector.iter().all(|l| t.labels.contains(l)))
                .collect();
            assert!(
                !backends.is_empty(),
                "Service {} selects no moongate pod",
                svc.name
            );
            for t in backends {
                let target_port = match target {
                    Yaml::Integer(n) => *n,
                    Yaml::String(name) => {
                        t.ports.iter().find(|(n, _)| n == name).map_or(-1, |p| p.1)
                    }
                    _ => i64::from(link.port),
                };
                assert!(
                    t.process.is(&link.wants) && target_port == i64::from(t.process.http_port()),
                    "{}: {} (Service {} -> port {target_port}) wants {:?}, but reaches {}, serving \
                     port {} with\n{:#?}",
                    c.process.origin,
                    link.url,
                    svc.name,
                    link.wants,
                    t.process.origin,
                    t.process.http_port(),
                    t.process.settings
                );
            }
        }
    }
    let subs: Vec<&str> = containers.iter().map(|c| c.process.sub()).collect();
    for sub in ["serve", "sim-worker", "store"] {
        assert!(subs.contains(&sub), "deploy/k8s runs no `moongate {sub}`");
    }
}
