//! Kubernetes service discovery settings (the `[discovery]` TOML table), with
//! sglang-router's flags: `--service-discovery`, `--selector k=v ...`,
//! `--prefill-selector`, `--decode-selector`, `--service-discovery-namespace`,
//! `--service-discovery-port`, `--bootstrap-port-annotation`. Always compiled, so a binary
//! built without the `kubernetes` feature still parses them and says which feature it lacks.

use serde::{Deserialize, Serialize};

/// Environment variables, one per setting.
pub mod env {
    /// `--service-discovery`.
    pub const ENABLED: &str = "MOONGATE_SERVICE_DISCOVERY";
    /// `--selector` (comma-separated in the environment).
    pub const SELECTOR: &str = "MOONGATE_SELECTOR";
    /// `--prefill-selector`.
    pub const PREFILL_SELECTOR: &str = "MOONGATE_PREFILL_SELECTOR";
    /// `--decode-selector`.
    pub const DECODE_SELECTOR: &str = "MOONGATE_DECODE_SELECTOR";
    /// `--service-discovery-namespace`.
    pub const NAMESPACE: &str = "MOONGATE_SERVICE_DISCOVERY_NAMESPACE";
    /// `--service-discovery-port`.
    pub const PORT: &str = "MOONGATE_SERVICE_DISCOVERY_PORT";
    /// `--bootstrap-port-annotation`.
    pub const BOOTSTRAP_PORT_ANNOTATION: &str = "MOONGATE_BOOTSTRAP_PORT_ANNOTATION";
    /// `--service-discovery-resync-secs`.
    pub const RESYNC_SECS: &str = "MOONGATE_SERVICE_DISCOVERY_RESYNC_SECS";
}

/// The namespace value that watches every namespace (needs a ClusterRole).
pub const ALL_NAMESPACES: &str = "*";

/// Workers found from pods: the gateway watches pods by label (a server-side selector) and
/// keeps one worker per Ready pod, at `http://<pod IP>:<port>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
#[command(next_help_heading = "Kubernetes service discovery")]
pub struct DiscoveryConfig {
    /// Find workers from Kubernetes pods (in-cluster service account, or `KUBECONFIG` /
    /// `~/.kube/config`). Workers it adds it also removes; workers given by flag or added
    /// through the worker API are left alone. Needs a binary built with the cargo feature
    /// `kubernetes`.
    #[arg(id = "discovery.enabled", long = "service-discovery", env = env::ENABLED,
          action = clap::ArgAction::SetTrue)]
    pub enabled: bool,
    /// Labels of regular worker pods, `key=value` pairs that all must match
    /// (`--selector app=sglang role=worker`).
    #[arg(id = "discovery.selector", long = "selector", env = env::SELECTOR,
          value_name = "KEY=VALUE", num_args = 1.., value_delimiter = ',')]
    pub selector: Vec<String>,
    /// Labels of prefill pods (PD mode).
    #[arg(id = "discovery.prefill_selector", long = "prefill-selector", env = env::PREFILL_SELECTOR,
          value_name = "KEY=VALUE", num_args = 1.., value_delimiter = ',')]
    pub prefill_selector: Vec<String>,
    /// Labels of decode pods (PD mode).
    #[arg(id = "discovery.decode_selector", long = "decode-selector", env = env::DECODE_SELECTOR,
          value_name = "KEY=VALUE", num_args = 1.., value_delimiter = ',')]
    pub decode_selector: Vec<String>,
    /// Namespace to watch. Default: the gateway's own (the service account's, or the
    /// kubeconfig context's), which a namespaced Role allows; `*` watches every namespace
    /// (needs a ClusterRole), as sglang-router does when this is unset. With `*`,
    /// discovered workers get no `--api-key`: labels do not say who made a pod elsewhere.
    #[arg(id = "discovery.namespace", long = "service-discovery-namespace", env = env::NAMESPACE,
          value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The port of the workers in the pods (sglang-router's default).
    #[arg(id = "discovery.port", long = "service-discovery-port", env = env::PORT,
          default_value_t = DiscoveryConfig::default().port)]
    pub port: u16,
    /// Pod annotation giving a prefill pod's bootstrap port (none: the worker's default).
    #[arg(id = "discovery.bootstrap_port_annotation", long = "bootstrap-port-annotation",
          env = env::BOOTSTRAP_PORT_ANNOTATION,
          default_value_t = DiscoveryConfig::default().bootstrap_port_annotation)]
    pub bootstrap_port_annotation: String,
    /// Reconcile the workers with the watched pods this often as well as on every change,
    /// in seconds.
    #[arg(id = "discovery.resync_secs", long = "service-discovery-resync-secs", env = env::RESYNC_SECS,
          value_name = "SECS", default_value_t = DiscoveryConfig::default().resync_secs)]
    pub resync_secs: u64,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            selector: Vec::new(),
            prefill_selector: Vec::new(),
            decode_selector: Vec::new(),
            namespace: None,
            port: 80,
            bootstrap_port_annotation: "sglang.ai/bootstrap-port".to_owned(),
            resync_secs: 60,
        }
    }
}

impl DiscoveryConfig {
    /// What is wrong with these settings in a gateway that is (`pd`) or is not in PD mode.
    /// `feature` says whether the binary has the `kubernetes` feature.
    pub fn problems(&self, pd: bool) -> Vec<String> {
        let mut errs = Vec::new();
        let given = !self.selector.is_empty()
            || !self.prefill_selector.is_empty()
            || !self.decode_selector.is_empty();
        if !self.enabled {
            if given {
                errs.push("selectors need --service-discovery".to_owned());
            }
            return errs;
        }
        if pd {
            if !self.selector.is_empty() {
                errs.push(
                    "--selector is for regular workers; in PD mode give --prefill-selector \
                     and --decode-selector"
                        .to_owned(),
                );
            }
            if self.prefill_selector.is_empty() && self.decode_selector.is_empty() {
                errs.push(
                    "--service-discovery in PD mode needs --prefill-selector or --decode-selector"
                        .to_owned(),
                );
            }
        } else {
            if !self.prefill_selector.is_empty() || !self.decode_selector.is_empty() {
                errs.push(
                    "--prefill-selector and --decode-selector need --pd-disaggregation".into(),
                );
            }
            if self.selector.is_empty() {
                errs.push("--service-discovery needs --selector key=value".to_owned());
            }
        }
        for label in self
            .selector
            .iter()
            .chain(&self.prefill_selector)
            .chain(&self.decode_selector)
        {
            if let Err(e) = parse_label(label) {
                errs.push(e);
            }
        }
        // A pod matching both roles is used by neither: every pod the wider selector picks
        // would also match the narrower one.
        use std::collections::BTreeSet;
        let p: BTreeSet<&String> = self.prefill_selector.iter().collect();
        let d: BTreeSet<&String> = self.decode_selector.iter().collect();
        if !p.is_empty() && !d.is_empty() && (p.is_subset(&d) || d.is_subset(&p)) {
            errs.push(
                "--prefill-selector and --decode-selector overlap: one's labels include all of \
                 the other's, so its pods would match both roles (give each a label of its own)"
                    .to_owned(),
            );
        }
        if let Some(ns) = &self.namespace
            && ns != ALL_NAMESPACES
            && !is_dns_label(ns)
        {
            errs.push(format!(
                "service discovery namespace {ns:?} is not a namespace name (or `*`)"
            ));
        }
        if self.port == 0 {
            errs.push("service_discovery_port must be 1..=65535".to_owned());
        }
        if self.bootstrap_port_annotation.trim().is_empty() {
            errs.push("bootstrap_port_annotation must not be empty".to_owned());
        }
        if self.resync_secs == 0 {
            errs.push("service discovery resync_secs must be at least 1".to_owned());
        }
        errs
    }

    /// The problem with starting discovery in this binary: `None` with the `kubernetes`
    /// feature or when discovery is off. Kept out of [`DiscoveryConfig::problems`] so that
    /// `--print-config` shows a configuration a full build would run.
    pub fn feature_problem(&self) -> Option<String> {
        (self.enabled && !cfg!(feature = "kubernetes")).then(|| {
            "--service-discovery needs a binary built with the cargo feature `kubernetes` \
             (cargo build --release -p gateway --features kubernetes)"
                .to_owned()
        })
    }
}

/// A label selector's `key=value` checked and split. Keys are Kubernetes label keys
/// (`[prefix/]name`), values label values: nothing that could widen a server-side
/// selector (no `,`, `!`, `(`, spaces or set operators) gets through.
pub fn parse_label(label: &str) -> Result<(&str, &str), String> {
    let bad = || format!("selector {label:?} must be key=value (Kubernetes label syntax)");
    let (key, value) = label.split_once('=').ok_or_else(bad)?;
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
    };
    let prefix_ok =
        prefix.is_none_or(|p| !p.is_empty() && p.len() <= 253 && p.split('.').all(is_dns_label));
    let value_ok = value.is_empty() || name_ok(value);
    if name_ok(name) && prefix_ok && value_ok {
        Ok((key, value))
    } else {
        Err(bad())
    }
}

/// A DNS-1123 label: what namespace names are.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(selector: &[&str]) -> DiscoveryConfig {
        DiscoveryConfig {
            enabled: true,
            selector: selector.iter().map(|s| s.to_string()).collect(),
            ..DiscoveryConfig::default()
        }
    }

    #[test]
    fn off_by_default_and_selectors_need_it() {
        assert!(DiscoveryConfig::default().problems(false).is_empty());
        assert!(DiscoveryConfig::default().feature_problem().is_none());
        let stray = DiscoveryConfig {
            selector: vec!["app=x".into()],
            ..DiscoveryConfig::default()
        };
        assert_eq!(stray.problems(false).len(), 1);
    }

    #[test]
    fn regular_mode_needs_a_selector_and_pd_mode_its_own() {
        assert!(
            on(&["app=sglang", "role=worker"])
                .problems(false)
                .is_empty()
        );
        assert!(on(&[]).problems(false)[0].contains("--selector"));
        let p = on(&["app=sglang"]).problems(true).join("; ");
        assert!(
            p.contains("PD mode") && p.contains("--prefill-selector"),
            "{p}"
        );
        let pd = DiscoveryConfig {
            enabled: true,
            prefill_selector: vec!["role=prefill".into()],
            decode_selector: vec!["role=decode".into()],
            ..DiscoveryConfig::default()
        };
        assert!(pd.problems(true).is_empty(), "{:?}", pd.problems(true));
        assert_eq!(pd.problems(false).len(), 2, "{:?}", pd.problems(false));
        let same = DiscoveryConfig {
            decode_selector: vec!["role=prefill".into()],
            ..pd
        };
        assert!(same.problems(true)[0].contains("overlap"));
        let wider = DiscoveryConfig {
            prefill_selector: vec!["app=sglang".into()],
            decode_selector: vec!["role=decode".into(), "app=sglang".into()],
            ..same
        };
        assert!(wider.problems(true)[0].contains("overlap"));
        assert_eq!(
            on(&["app=sglang"]).feature_problem().is_some(),
            !cfg!(feature = "kubernetes")
        );
    }

    #[test]
    fn selectors_cannot_widen_the_server_side_query() {
        for good in [
            "app=sglang",
            "sglang.ai/role=prefill",
            "a=",
            "k8s.io/x_y=v.1-2",
        ] {
            assert!(parse_label(good).is_ok(), "{good}");
        }
        for bad in [
            "app",
            "=x",
            "app!=x",
            "app=x,role=y",
            "app in (a)",
            "a=b c",
            "-a=b",
            "a/=b",
            "/a=b",
            "a=-b",
            "A.B_/c=d",
        ] {
            assert!(parse_label(bad).is_err(), "{bad}");
        }
        let mut cfg = on(&["app=sglang"]);
        cfg.namespace = Some("Prod".into());
        assert!(cfg.problems(false)[0].contains("namespace"));
        cfg.namespace = Some(ALL_NAMESPACES.into());
        assert!(cfg.problems(false).is_empty());
    }
}
