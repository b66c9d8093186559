//! Reading deploy/: the `moongate` processes that compose.yaml and the Kubernetes manifests
//! start, each run once with `--print-config` (which parses and validates its command line
//! and environment, and prints the settings it would run with), and the links between them
//! (worker URLs, the master URL) to check against those settings.

use std::path::{Path, PathBuf};
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

/// The value given for environment variables a manifest takes from a Kubernetes Secret.
pub const SECRET_PLACEHOLDER: &str = "k8s-secret-placeholder";

/// A real cluster secret file standing in for the path a manifest gives in
/// `MOONGATE_TRANSFER_SECRET_FILE` (a mount that exists only in the container).
pub fn test_secret_file() -> &'static Path {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory").keep();
        let path = dir.join("transfer-secret");
        trust::ClusterSecret::load_or_create(&path).expect("a test secret file");
        path
    })
}

/// The repository's deploy/ directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The text of `deploy/<name>`.
pub fn read(name: &str) -> String {
    let path = deploy_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every YAML document in `deploy/<name>`.
pub fn yaml_docs(name: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(name)).unwrap_or_else(|e| panic!("deploy/{name}: {e}"))
}

/// `moongate` with no `MOONGATE_*` or `RUST_LOG` from the test's own environment.
pub fn moongate() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moongate"));
    for (k, _) in std::env::vars() {
        if k.starts_with("MOONGATE_") || k == "RUST_LOG" {
            c.env_remove(k);
        }
    }
    c
}

/// `moongate args... --print-config` with `env`: its standard output, or why it failed.
pub fn print_config(args: &[String], env: &[(String, String)]) -> Result<String, String> {
    let out = moongate()
        .args(args)
        .arg("--print-config")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run moongate");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("utf-8 settings"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The items of a YAML list of strings (`what` names it in the panic when it is not one).
pub fn strings(y: &Yaml, what: &str) -> Vec<String> {
    let items = y
        .as_vec()
        .unwrap_or_else(|| panic!("{what}: expected a list of strings, got {y:?}"));
    items
        .iter()
        .map(|i| match i.as_str() {
            Some(s) => s.to_owned(),
            None => panic!(
                "{what}: {i:?} is not a string (quote it: compose and Kubernetes take strings)"
            ),
        })
        .collect()
}

/// A string-to-scalar YAML map (labels, selectors) as pairs.
pub fn string_map(y: &Yaml) -> Vec<(String, String)> {
    let Some(h) = y.as_hash() else {
        return Vec::new();
    };
    h.iter()
        .map(|(k, v)| {
            let s = |y: &Yaml| match y {
                Yaml::String(s) | Yaml::Real(s) => s.clone(),
                Yaml::Integer(n) => n.to_string(),
                Yaml::Boolean(b) => b.to_string(),
                other => panic!("{other:?} is not a scalar"),
            };
            (s(k), s(v))
        })
        .collect()
}

/// What a link from one process to another expects to find at the other end.
#[derive(Debug, Clone, PartialEq)]
pub enum Wants {
    /// A simulated worker in this mode (`regular`, `prefill`, `decode`), with this bootstrap
    /// port when one is named.
    Sim(&'static str, Option<u16>),
    /// A KV master: `moongate master`, or `moongate serve` hosting it.
    Master,
    /// An etcd member's client port.
    Etcd,
}

/// A URL one process is given to reach another.
#[derive(Debug, Clone)]
pub struct Link {
    /// As written.
    pub url: String,
    /// Host name (a compose service or a Kubernetes Service).
    pub host: String,
    /// Port.
    pub port: u16,
    /// What must be there.
    pub wants: Wants,
}

impl Link {
    /// The links of a `--master` value: a comma-separated list of master URLs, or
    /// `etcd://h1:2379,h2:2379/CLUSTER` (etcd members that list the masters).
    fn masters(value: &str) -> Vec<Link> {
        if let Some(rest) = value.strip_prefix("etcd://") {
            let hosts = rest.split('/').next().unwrap_or_default();
            return hosts
                .split(',')
                .map(|h| Link::new(&format!("http://{h}"), Wants::Etcd))
                .collect();
        }
        value
            .split(',')
            .map(|u| Link::new(u, Wants::Master))
            .collect()
    }

    fn new(url: &str, wants: Wants) -> Link {
        let u = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        Link {
            url: url.to_owned(),
            host: u.host_str().expect("a host").to_owned(),
            port: u.port_or_known_default().expect("a port"),
            wants,
        }
    }
}

/// One `moongate` process a manifest starts, with the settings it runs with.
#[derive(Debug)]
pub struct Process {
    /// Where it is written (file, service or workload, container), for messages.
    pub origin: String,
    /// The arguments after `moongate`, subcommand first, as run here.
    pub args: Vec<String>,
    /// What `--print-config` printed for it.
    pub settings: toml::Table,
    /// The cluster secret file its environment names (the container's path).
    pub secret_file: Option<String>,
}

impl Process {
    /// Runs `args` with `env` through `--print-config`; panics naming `origin` when the
    /// binary rejects them.
    pub fn new(origin: String, args: Vec<String>, env: &[(String, String)]) -> Process {
        for s in args.iter().chain(env.iter().map(|(_, v)| v)) {
            assert!(
                !s.contains('$'),
                "{origin}: {s:?} needs interpolation, which this test does not do; write the value"
            );
        }
        assert!(
            !env.iter().any(|(k, _)| k == gateway::config::env::CONFIG),
            "{origin}: give the config file with --config (the test maps its path)"
        );
        let secret_file = env
            .iter()
            .find(|(k, _)| k == trust::SECRET_FILE_ENV)
            .map(|(_, v)| v.clone());
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| match k.as_str() {
                trust::SECRET_FILE_ENV => {
                    (k.clone(), test_secret_file().to_string_lossy().into_owned())
                }
                _ => (k.clone(), v.clone()),
            })
            .collect();
        let text = print_config(&args, &env).unwrap_or_else(|err| {
            panic!(
                "{origin}: `moongate {}` is rejected by the binary:\n{err}",
                args.join(" ")
            )
        });
        let settings = toml::from_str(&text)
            .unwrap_or_else(|e| panic!("{origin}: --print-config printed bad TOML ({e}):\n{text}"));
        Process {
            origin,
            args,
            settings,
            secret_file,
        }
    }

    /// Whether it holds a transfer engine or a master, and so needs the cluster's transfer
    /// secret (one file for every process of the deployment: a per-user default would differ
    /// per container, and cannot be created on a read-only root file system).
    pub fn needs_secret(&self) -> bool {
        match self.sub() {
            "serve" | "master" | "store" => true,
            "sim-worker" => self
                .settings
                .get("mode")
                .and_then(toml::Value::as_str)
                .is_some_and(|m| m != "regular"),
            _ => false,
        }
    }

    /// Panics unless a process that needs the secret names a file in one of `mounts` (the
    /// directories mounted into its container).
    pub fn check_secret(&self, mounts: &[String]) {
        if !self.needs_secret() {
            return;
        }
        let file = self.secret_file.as_deref().unwrap_or_else(|| {
            panic!(
                "{}: set {} to the cluster's shared transfer secret",
                self.origin,
                trust::SECRET_FILE_ENV
            )
        });
        let dir = Path::new(file).parent().expect("a file in a directory");
        assert!(
            mounts.iter().any(|m| Path::new(m) == dir),
            "{}: nothing is mounted at {} (for {file}); mounted: {mounts:?}",
            self.origin,
            dir.display()
        );
    }

    /// The subcommand.
    pub fn sub(&self) -> &str {
        self.args.first().map_or("", String::as_str)
    }

    fn int(&self, key: &str) -> i64 {
        self.settings
            .get(key)
            .and_then(toml::Value::as_integer)
            .unwrap_or_else(|| panic!("{}: no integer `{key}` in its settings", self.origin))
    }

    fn str(&self, key: &str) -> &str {
        self.settings
            .get(key)
            .and_then(toml::Value::as_str)
            .unwrap_or_else(|| panic!("{}: no string `{key}` in its settings", self.origin))
    }

    /// The port its HTTP server listens on.
    pub fn http_port(&self) -> u16 {
        let port = match self.sub() {
            "serve" | "master" | "sim-worker" => self.int("port"),
            "store" => {
                let addr: std::net::SocketAddr = self.str("http_listen").parse().expect("address");
                i64::from(addr.port())
            }
            other => panic!("{}: unknown subcommand {other:?}", self.origin),
        };
        u16::try_from(port).expect("a port")
    }

    /// Where `/metrics` is served (`serve`'s extra listener when it has one).
    pub fn metrics_port(&self) -> u16 {
        match self
            .settings
            .get("prometheus_port")
            .and_then(toml::Value::as_integer)
        {
            Some(p) => u16::try_from(p).expect("a port"),
            None => self.http_port(),
        }
    }

    /// Seconds it lets in-flight requests finish after SIGTERM (servers of requests only).
    pub fn shutdown_grace_secs(&self) -> Option<i64> {
        matches!(self.sub(), "serve" | "master").then(|| self.int("shutdown_grace_period_secs"))
    }

    /// What this process is (for a link's check): a master, a simulated worker, or neither.
    pub fn is(&self, wants: &Wants) -> bool {
        match wants {
            Wants::Master => {
                self.sub() == "master"
                    || (self.sub() == "serve"
                        && self.settings.get("disable_master") != Some(&toml::Value::Boolean(true)))
            }
            Wants::Etcd => false,
            Wants::Sim(mode, bootstrap) => {
                self.sub() == "sim-worker"
                    && self.str("mode") == *mode
                    && bootstrap.is_none_or(|b| i64::from(b) == self.int("bootstrap_port"))
            }
        }
    }

    /// The URLs it is given of other processes: a gateway's workers, a store's master.
    pub fn links(&self) -> Vec<Link> {
        let list = |key: &str| -> Vec<toml::Value> {
            self.settings
                .get(key)
                .and_then(toml::Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let mut links = Vec::new();
        match self.sub() {
            "serve" => {
                for url in list("worker_urls") {
                    links.push(Link::new(
                        url.as_str().expect("url"),
                        Wants::Sim("regular", None),
                    ));
                }
                for url in list("decode") {
                    links.push(Link::new(
                        url.as_str().expect("url"),
                        Wants::Sim("decode", None),
                    ));
                }
                for spec in list("prefill") {
                    let spec = spec.as_array().expect("[url, port]");
                    let port = spec.get(1).and_then(toml::Value::as_str);
                    let bootstrap = port.filter(|p| !p.eq_ignore_ascii_case("none"));
                    let bootstrap = bootstrap.map(|p| p.parse().expect("bootstrap port"));
                    let url = spec[0].as_str().expect("url");
                    links.push(Link::new(url, Wants::Sim("prefill", bootstrap)));
                }
            }
            "store" => {
                let client = self.settings["client"].as_table().expect("[client]");
                let master = client["master"].as_str().expect("master url");
                links.extend(Link::masters(master));
            }
            _ => {}
        }
        // An HA master (alone or hosted by `serve`): its etcd, and the URL it advertises,
        // which must reach itself.
        let ha = self.settings.get("ha").and_then(toml::Value::as_table);
        if let Some(ha) = ha.filter(|h| h.get("enabled") == Some(&toml::Value::Boolean(true))) {
            for url in ha["etcd_endpoints"].as_array().expect("etcd_endpoints") {
                links.push(Link::new(url.as_str().expect("url"), Wants::Etcd));
            }
            let own = ha["advertise_url"].as_str().expect("advertise_url");
            links.push(Link::new(own, Wants::Master));
        }
        links
    }
}

/// The value of `--flag VALUE` or `--flag=VALUE` in a command line.
pub fn flag_value(argv: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&eq)
            .map(str::to_owned)
            .or_else(|| (a == flag).then(|| argv.get(i + 1).cloned()).flatten())
    })
}
