//! Reading one rendered kustomize overlay of deploy/k8s: its workloads' containers (each
//! `moongate` command line run through the binary, `$(VAR)` expanded as the kubelet
//! expands it), its Services, and the checks that tie them together: every URL a process is
//! given reaches a process of the right kind on the right port (through a Service, or a
//! StatefulSet pod's stable name under its headless Service), etcd members agree on their
//! cluster, probes, secrets and shutdown budgets match the settings, and a gateway that
//! discovers workers has the RBAC to watch pods and selectors that pick the SGLang pods.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use yaml_rust2::Yaml;

use super::kustomize::Rendered;
use super::manifests::{Link, Process, SECRET_PLACEHOLDER, Wants, flag_value, string_map, strings};

/// What a container runs.
pub enum Runs {
    /// `moongate ...`, with the settings it runs with.
    Moongate(Process),
    /// Another image (etcd, SGLang): its command and arguments, expanded.
    Other {
        /// The image.
        image: String,
        /// `command` then `args`.
        argv: Vec<String>,
    },
}

/// One container of a workload.
pub struct Container {
    /// Where it is written, for messages.
    pub origin: String,
    /// What it runs.
    pub runs: Runs,
    /// The workload's kind (`Deployment`, `StatefulSet`).
    pub kind: String,
    /// The workload's name.
    pub workload: String,
    /// Replicas (1 when absent).
    pub replicas: i64,
    /// A StatefulSet's `serviceName`.
    pub service_name: Option<String>,
    /// The pod template's labels.
    pub labels: Vec<(String, String)>,
    /// The pod template's annotations.
    pub annotations: Vec<(String, String)>,
    /// Named container ports.
    pub ports: Vec<(String, i64)>,
    /// The pod's service account.
    pub service_account: Option<String>,
}

impl Container {
    /// The `moongate` process, if it runs one.
    pub fn process(&self) -> Option<&Process> {
        match &self.runs {
            Runs::Moongate(p) => Some(p),
            Runs::Other { .. } => None,
        }
    }

    /// The value after `--flag` (or in `--flag=value`) of another image's command line.
    pub fn flag(&self, flag: &str) -> Option<String> {
        let Runs::Other { argv, .. } = &self.runs else {
            return None;
        };
        flag_value(argv, flag)
    }

    fn is_etcd(&self) -> bool {
        matches!(&self.runs, Runs::Other { image, .. } if image.contains("etcd"))
    }

    /// The port a Service's `targetPort` names on this container.
    fn target_port(&self, target: &Yaml, port: i64) -> i64 {
        match target {
            Yaml::Integer(n) => *n,
            Yaml::String(name) => self
                .ports
                .iter()
                .find(|(n, _)| n == name)
                .map_or(-1, |p| p.1),
            _ => port,
        }
    }
}

/// A Service: name, selector, `(port, targetPort)` pairs, whether it is headless.
pub struct Service {
    /// Its name.
    pub name: String,
    /// Its selector.
    pub selector: Vec<(String, String)>,
    /// `(port, targetPort)`.
    pub ports: Vec<(i64, Yaml)>,
    /// `clusterIP: None`.
    pub headless: bool,
}

/// A rendered overlay, read.
pub struct Overlay {
    /// Every container of every workload.
    pub containers: Vec<Container>,
    /// Every Service.
    pub services: Vec<Service>,
    /// Every document, as rendered.
    pub docs: Vec<Yaml>,
}

/// The pod name the kubelet would give a workload's first pod (what `metadata.name`
/// expands to).
fn pod_name(kind: &str, name: &str) -> String {
    match kind {
        "StatefulSet" => format!("{name}-0"),
        _ => format!("{name}-7d9f8b6c5-x2x4q"),
    }
}

/// `$(VAR)` in `s` replaced by the container's `env` (as the kubelet does for `command`,
/// `args` and later `env` values); an unknown variable fails the test.
fn expand(s: &str, env: &BTreeMap<String, String>, origin: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("$(") {
        out.push_str(&rest[..at]);
        let end = rest[at..]
            .find(')')
            .unwrap_or_else(|| panic!("{origin}: {s:?}"));
        let var = &rest[at + 2..at + end];
        let value = env
            .get(var)
            .unwrap_or_else(|| panic!("{origin}: $({var}) in {s:?} is not in the container's env"));
        out.push_str(value);
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The container's environment, with fieldRefs as the kubelet fills them and Secrets as
/// [`SECRET_PLACEHOLDER`].
fn container_env(c: &Yaml, pod: &str, origin: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in c["env"].as_vec().into_iter().flatten() {
        let name = e["name"].as_str().expect("env name").to_owned();
        let value = match (e["value"].as_str(), &e["valueFrom"]) {
            (Some(v), _) => expand(v, &env, origin),
            (None, from) if !from["secretKeyRef"].is_badvalue() => SECRET_PLACEHOLDER.to_owned(),
            (None, from) => match from["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => pod.to_owned(),
                Some("metadata.namespace") => "default".to_owned(),
                other => panic!("{origin}: env {name}: fieldRef {other:?} not understood here"),
            },
        };
        env.insert(name, value);
    }
    env
}

/// The `--config` file a container reads, mapped from its mount path to the file the
/// overlay's ConfigMap generator holds.
fn local_config(args: &mut [String], pod: &Yaml, c: &Yaml, maps: &Rendered, origin: &str) {
    let Some(i) = args.iter().position(|a| a == "--config") else {
        assert!(
            !args.iter().any(|a| a.starts_with("--config=")),
            "{origin}: write `--config PATH`"
        );
        return;
    };
    let path = Path::new(&args[i + 1]);
    let (dir, file) = (path.parent().unwrap(), path.file_name().unwrap());
    let mount = (c["volumeMounts"].as_vec().into_iter().flatten())
        .find(|m| m["mountPath"].as_str().map(Path::new) == Some(dir))
        .unwrap_or_else(|| panic!("{origin}: nothing is mounted at {}", dir.display()));
    let volume = (pod["volumes"].as_vec().into_iter().flatten())
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("{origin}: no volume {:?}", mount["name"]));
    let map = volume["configMap"]["name"]
        .as_str()
        .expect("a configMap volume");
    let local: &PathBuf = maps
        .config_maps
        .get(map)
        .and_then(|files| files.get(file.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{origin}: the overlay generates no {map}/{file:?}"));
    args[i + 1] = local.to_string_lossy().into_owned();
}

/// The volume behind a process's secret file is the Secret `moongate-transfer`, readable by
/// the pod's group only (mode 0440), with the pod's `fsGroup` set so the image's user can
/// read it (Moongate accepts a root-owned secret file readable by its group, never more).
fn secret_volume(pod: &Yaml, c: &Yaml, p: &Process, origin: &str) {
    let file = p.secret_file.as_deref().expect("checked");
    let dir = Path::new(file).parent().unwrap();
    let mount = (c["volumeMounts"].as_vec().into_iter().flatten())
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

/// Seconds a container's preStop hook waits (`sleep N`), before the process gets SIGTERM.
fn pre_stop_secs(c: &Yaml, origin: &str) -> i64 {
    let hook = &c["lifecycle"]["preStop"];
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

/// The checks on a `moongate` container that need only its own manifest.
fn check_moongate(p: &Process, pod: &Yaml, c: &Yaml, template: &Yaml, origin: &str) {
    let mounts: Vec<String> = (c["volumeMounts"].as_vec().into_iter().flatten())
        .filter_map(|m| m["mountPath"].as_str().map(str::to_owned))
        .collect();
    p.check_secret(&mounts);
    if p.needs_secret() {
        secret_volume(pod, c, p, origin);
    }
    let port = i64::from(p.http_port());
    let ports: Vec<(String, i64)> = named_ports(c);
    assert!(
        ports.contains(&("http".to_owned(), port)),
        "{origin}: needs the container port `http` = {port} (its settings), got {ports:?}"
    );
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        for how in ["httpGet", "tcpSocket"] {
            let at = &c[probe][how]["port"];
            assert!(
                at.is_badvalue() || at.as_str() == Some("http") || at.as_i64() == Some(port),
                "{origin}: {probe} port {at:?} is not `http` ({port})"
            );
        }
    }
    if matches!(p.sub(), "serve" | "master") {
        for (probe, path) in [
            ("readinessProbe", "/readiness"),
            ("livenessProbe", "/liveness"),
        ] {
            assert_eq!(
                c[probe]["httpGet"]["path"].as_str(),
                Some(path),
                "{origin}: {probe} is the process's {path} route"
            );
        }
    }
    let annotations = string_map(&template["metadata"]["annotations"]);
    if let Some((_, at)) = annotations.iter().find(|(k, _)| k == "prometheus.io/port") {
        assert_eq!(
            at,
            &p.metrics_port().to_string(),
            "{origin}: prometheus.io/port"
        );
    }
    if let Some(grace) = p.shutdown_grace_secs() {
        // Kubernetes' default when the field is absent is 30 seconds.
        let budget = pod["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
        let pause = pre_stop_secs(c, origin);
        assert!(
            budget > grace + pause,
            "{origin}: terminationGracePeriodSeconds {budget} must exceed the preStop pause \
             ({pause} s) plus shutdown_grace_period_secs ({grace} s)"
        );
    }
}

fn named_ports(c: &Yaml) -> Vec<(String, i64)> {
    (c["ports"].as_vec().into_iter().flatten())
        .map(|p| {
            let name = p["name"].as_str().unwrap_or_default().to_owned();
            (name, p["containerPort"].as_i64().expect("containerPort"))
        })
        .collect()
}

/// Reads the rendered overlay in deploy/`dir`, running every `moongate` command line.
pub fn read(dir: &str, rendered: Rendered) -> Overlay {
    let mut containers = Vec::new();
    let mut services = Vec::new();
    for doc in &rendered.docs {
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
                headless: doc["spec"]["clusterIP"].as_str() == Some("None"),
            });
            continue;
        }
        if !matches!(kind, "Deployment" | "StatefulSet" | "DaemonSet") {
            continue;
        }
        let template = &doc["spec"]["template"];
        let pod = &template["spec"];
        let pod_name = pod_name(kind, &name);
        for c in pod["containers"].as_vec().into_iter().flatten() {
            let cname = c["name"].as_str().unwrap_or_default();
            let origin = format!("deploy/{dir} {kind} `{name}` container `{cname}`");
            let env = container_env(c, &pod_name, &origin);
            let image = c["image"].as_str().unwrap_or_default().to_owned();
            let list = |y: &Yaml| match y {
                Yaml::BadValue => Vec::new(),
                y => strings(y, &origin),
            };
            let args: Vec<String> = list(&c["args"])
                .iter()
                .map(|a| expand(a, &env, &origin))
                .collect();
            let runs = if image.starts_with("moongate") {
                assert!(
                    c["command"].is_badvalue(),
                    "{origin}: the image's entrypoint is `moongate`; give its arguments as `args`"
                );
                let mut args = args;
                local_config(&mut args, pod, c, &rendered, &origin);
                // What the process sees: fieldRefs filled, Secrets as placeholders.
                let env: Vec<(String, String)> = env.clone().into_iter().collect();
                let p = Process::new(origin.clone(), args, &env);
                check_moongate(&p, pod, c, template, &origin);
                Runs::Moongate(p)
            } else {
                let mut argv: Vec<String> = list(&c["command"])
                    .iter()
                    .map(|a| expand(a, &env, &origin))
                    .collect();
                argv.extend(args);
                Runs::Other { image, argv }
            };
            containers.push(Container {
                origin,
                runs,
                kind: kind.to_owned(),
                workload: name.clone(),
                replicas: doc["spec"]["replicas"].as_i64().unwrap_or(1),
                service_name: doc["spec"]["serviceName"].as_str().map(str::to_owned),
                labels: string_map(&template["metadata"]["labels"]),
                annotations: string_map(&template["metadata"]["annotations"]),
                ports: named_ports(c),
                service_account: pod["serviceAccountName"].as_str().map(str::to_owned),
            });
        }
    }
    Overlay {
        containers,
        services,
        docs: rendered.docs,
    }
}

impl Overlay {
    /// Where a URL's host leads: a Service, and for `pod.headless-service` the one pod.
    fn resolve(&self, link: &Link, origin: &str) -> (&Service, Vec<&Container>) {
        let labels: Vec<&str> = link.host.split('.').collect();
        let by_pod = labels.len() >= 2
            && self
                .services
                .iter()
                .any(|s| s.name == labels[1] && s.headless);
        let svc_name = if by_pod { labels[1] } else { labels[0] };
        let svc = self
            .services
            .iter()
            .find(|s| s.name == svc_name)
            .unwrap_or_else(|| panic!("{origin}: {} names no Service", link.url));
        let mut backends: Vec<&Container> = self
            .containers
            .iter()
            .filter(|t| svc.selector.iter().all(|l| t.labels.contains(l)))
            .collect();
        if by_pod {
            backends.retain(|t| {
                t.kind == "StatefulSet"
                    && t.service_name.as_deref() == Some(svc_name)
                    && (0..t.replicas).any(|i| format!("{}-{i}", t.workload) == labels[0])
            });
            assert!(
                !backends.is_empty(),
                "{origin}: {} is no pod of a StatefulSet governed by Service {svc_name}",
                link.url
            );
        }
        assert!(
            !backends.is_empty(),
            "{origin}: Service {} selects no pod",
            svc.name
        );
        (svc, backends)
    }

    /// Every link of every `moongate` process reaches what it wants, on its port.
    pub fn check_links(&self) {
        for c in &self.containers {
            let Some(p) = c.process() else { continue };
            for link in p.links() {
                let (svc, backends) = self.resolve(&link, &c.origin);
                let (_, target) = svc
                    .ports
                    .iter()
                    .find(|(port, _)| *port == i64::from(link.port))
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: Service {} has no port {}",
                            c.origin, svc.name, link.port
                        )
                    });
                for t in backends {
                    let port = t.target_port(target, i64::from(link.port));
                    match (&link.wants, t.process()) {
                        (Wants::Etcd, _) => {
                            let listen = t.flag("--listen-client-urls").unwrap_or_default();
                            assert!(
                                t.is_etcd() && listen.ends_with(&format!(":{port}")),
                                "{}: {} (Service {} -> port {port}) wants etcd's client port, \
                                 but reaches {} (listening on {listen:?})",
                                c.origin,
                                link.url,
                                svc.name,
                                t.origin
                            );
                        }
                        (wants, Some(tp)) => assert!(
                            tp.is(wants) && port == i64::from(tp.http_port()),
                            "{}: {} (Service {} -> port {port}) wants {wants:?}, but reaches {}, \
                             serving port {} with\n{:#?}",
                            c.origin,
                            link.url,
                            svc.name,
                            t.origin,
                            tp.http_port(),
                            tp.settings
                        ),
                        (wants, None) => panic!(
                            "{}: {} wants {wants:?} but reaches {}",
                            c.origin, link.url, t.origin
                        ),
                    }
                }
            }
        }
    }

    /// An etcd StatefulSet's members name exactly its pods in `--initial-cluster`, at their
    /// stable names under its headless Service.
    pub fn check_etcd(&self) {
        for c in self.containers.iter().filter(|c| c.is_etcd()) {
            assert_eq!(
                c.kind, "StatefulSet",
                "{}: etcd members need stable names",
                c.origin
            );
            let svc = c.service_name.as_deref().expect("serviceName");
            let peer = c
                .ports
                .iter()
                .find(|(n, _)| n == "peer")
                .expect("a `peer` port")
                .1;
            let want: Vec<String> = (0..c.replicas)
                .map(|i| format!("{0}-{i}=http://{0}-{i}.{svc}:{peer}", c.workload))
                .collect();
            let got = c.flag("--initial-cluster").unwrap_or_default();
            assert_eq!(got, want.join(","), "{}: --initial-cluster", c.origin);
            assert!(
                self.services.iter().any(|s| s.name == svc && s.headless),
                "{}: its serviceName {svc} must be a headless Service",
                c.origin
            );
        }
    }

    /// A gateway that discovers workers: its service account may get, list and watch pods
    /// (a namespaced Role bound to it), and each role's selector picks SGLang pods of that
    /// disaggregation mode, serving on the discovery port, prefill pods with their
    /// bootstrap port in the annotation.
    pub fn check_discovery(&self) -> usize {
        let mut gateways = 0;
        for c in &self.containers {
            let Some(p) = c.process() else { continue };
            let Some(d) = p.settings.get("discovery").and_then(toml::Value::as_table) else {
                continue;
            };
            if d.get("enabled") != Some(&toml::Value::Boolean(true)) {
                continue;
            }
            gateways += 1;
            assert!(
                d.get("namespace").is_none(),
                "{}: a namespaced Role covers its own namespace only",
                c.origin
            );
            let sa = c
                .service_account
                .as_deref()
                .unwrap_or_else(|| panic!("{}: discovery needs a serviceAccountName", c.origin));
            self.check_pod_reader(sa, &c.origin);
            let port = d["port"].as_integer().expect("port");
            let annotation = d["bootstrap_port_annotation"].as_str().expect("annotation");
            let roles = [
                ("selector", "regular"),
                ("prefill_selector", "prefill"),
                ("decode_selector", "decode"),
            ];
            for (key, mode) in roles {
                let labels: Vec<(String, String)> = (d[key].as_array().expect("selector").iter())
                    .map(|kv| {
                        let (k, v) = kv.as_str().unwrap().split_once('=').unwrap();
                        (k.to_owned(), v.to_owned())
                    })
                    .collect();
                if labels.is_empty() {
                    continue;
                }
                let picked: Vec<&Container> = self
                    .containers
                    .iter()
                    .filter(|t| labels.iter().all(|l| t.labels.contains(l)))
                    .collect();
                assert!(
                    !picked.is_empty(),
                    "{}: {key} {labels:?} picks no pod",
                    c.origin
                );
                for t in picked {
                    let what = format!("{}: {key} picks {}", c.origin, t.origin);
                    assert!(t.process().is_none(), "{what}, a moongate process");
                    assert_eq!(
                        t.flag("--port").and_then(|v| v.parse().ok()),
                        Some(port),
                        "{what}: --port"
                    );
                    assert!(
                        t.ports.iter().any(|(_, p)| *p == port),
                        "{what}: no container port {port}"
                    );
                    if mode != "regular" {
                        assert_eq!(
                            t.flag("--disaggregation-mode").as_deref(),
                            Some(mode),
                            "{what}"
                        );
                    }
                    if mode == "prefill" {
                        let given = t
                            .annotations
                            .iter()
                            .find(|(k, _)| k == annotation)
                            .map(|a| a.1.clone());
                        // SGLang's default bootstrap port.
                        let serves = t
                            .flag("--disaggregation-bootstrap-port")
                            .unwrap_or("8998".into());
                        assert_eq!(given, Some(serves), "{what}: annotation {annotation}");
                    }
                }
            }
        }
        gateways
    }

    fn check_pod_reader(&self, sa: &str, origin: &str) {
        let bound_roles: Vec<&str> = self
            .docs
            .iter()
            .filter(|d| d["kind"].as_str() == Some("RoleBinding"))
            .filter(|d| {
                (d["subjects"].as_vec().into_iter().flatten()).any(|s| {
                    s["kind"].as_str() == Some("ServiceAccount") && s["name"].as_str() == Some(sa)
                })
            })
            .filter(|d| d["roleRef"]["kind"].as_str() == Some("Role"))
            .filter_map(|d| d["roleRef"]["name"].as_str())
            .collect();
        assert!(
            self.docs
                .iter()
                .any(|d| d["kind"].as_str() == Some("ServiceAccount")
                    && d["metadata"]["name"].as_str() == Some(sa)),
            "{origin}: no ServiceAccount {sa}"
        );
        let reads_pods = self.docs.iter().any(|d| {
            d["kind"].as_str() == Some("Role")
                && bound_roles.contains(&d["metadata"]["name"].as_str().unwrap_or_default())
                && (d["rules"].as_vec().into_iter().flatten()).any(|r| {
                    let has = |field: &str, v: &str| {
                        r[field]
                            .as_vec()
                            .into_iter()
                            .flatten()
                            .any(|x| x.as_str() == Some(v))
                    };
                    has("apiGroups", "")
                        && has("resources", "pods")
                        && ["get", "list", "watch"].iter().all(|v| has("verbs", v))
                })
        });
        assert!(
            reads_pods,
            "{origin}: no Role bound to {sa} allows get, list and watch on pods"
        );
    }

    /// The subcommands its `moongate` containers run.
    pub fn subs(&self) -> Vec<&str> {
        self.containers
            .iter()
            .filter_map(|c| c.process())
            .map(Process::sub)
            .collect()
    }
}
