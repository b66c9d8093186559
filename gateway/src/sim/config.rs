//! [`SimConfig`]: everything a simulated worker can be told, with every default defined
//! here once (the CLI, `Default` and serde all read these constants).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default bind host.
pub const DEFAULT_HOST: &str = "127.0.0.1";
/// Default bind port (SGLang's own default, 30000, is left to the gateway).
pub const DEFAULT_PORT: u16 = 30001;
/// Default served model name.
pub const DEFAULT_MODEL: &str = "moongate-sim";
/// Default tokens the simulated model writes before its end-of-sequence token.
pub const DEFAULT_OUTPUT_TOKENS: u32 = 16;
/// Default context length (prompt + output tokens).
pub const DEFAULT_CONTEXT_LENGTH: u32 = 32768;
/// Default time to first token.
pub const DEFAULT_TTFT: &str = "0s";
/// Default time per output token after the first.
pub const DEFAULT_TPOT: &str = "0s";
/// Default largest accepted request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Default bootstrap port reported by `/get_server_info` (SGLang's default).
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// Role of a simulated worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SimMode {
    /// A regular worker: prefill and decode in one.
    #[default]
    Regular,
}

impl SimMode {
    /// The `disaggregation_mode` value SGLang reports for this role.
    pub fn disaggregation_mode(self) -> &'static str {
        match self {
            SimMode::Regular => "null",
        }
    }
}

/// Configuration of a simulated SGLang worker (`moongate sim-worker`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Address to bind.
    #[arg(long, default_value = DEFAULT_HOST)]
    pub host: String,
    /// Port to bind.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Worker role.
    #[arg(long, value_enum, default_value_t = SimMode::Regular)]
    pub mode: SimMode,
    /// Model name served on the OpenAI routes (`/v1/models`).
    #[arg(long, alias = "served-model-name", default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Model path reported by `/get_model_info` (default: the model name). Routers load a
    /// tokenizer from here, so point it at a local tokenizer directory when they need one.
    #[arg(long)]
    pub model_path: Option<String>,
    /// Tokens the simulated model writes before it emits end-of-sequence (finish reason
    /// `stop`); a smaller `max_tokens` ends it earlier with `length`.
    #[arg(long, default_value_t = DEFAULT_OUTPUT_TOKENS)]
    pub output_tokens: u32,
    /// Context length: prompt plus output tokens may not exceed it.
    #[arg(long, default_value_t = DEFAULT_CONTEXT_LENGTH)]
    pub context_length: u32,
    /// Time to first token (e.g. `200ms`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_TTFT)]
    #[serde(with = "human_duration")]
    pub ttft: Duration,
    /// Time per output token after the first (e.g. `20ms`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_TPOT)]
    #[serde(with = "human_duration")]
    pub tpot: Duration,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Bootstrap port reported in `/get_server_info` (`disaggregation_bootstrap_port`).
    #[arg(long, default_value_t = DEFAULT_BOOTSTRAP_PORT)]
    pub bootstrap_port: u16,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            host: DEFAULT_HOST.to_owned(),
            port: DEFAULT_PORT,
            mode: SimMode::Regular,
            model: DEFAULT_MODEL.to_owned(),
            model_path: None,
            output_tokens: DEFAULT_OUTPUT_TOKENS,
            context_length: DEFAULT_CONTEXT_LENGTH,
            ttft: parse_default(DEFAULT_TTFT),
            tpot: parse_default(DEFAULT_TPOT),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            bootstrap_port: DEFAULT_BOOTSTRAP_PORT,
        }
    }
}

impl SimConfig {
    /// The model path reported to routers: `model_path`, else the model name.
    pub fn model_path(&self) -> &str {
        self.model_path.as_deref().unwrap_or(&self.model)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self) -> Result<(), String> {
        if self.model.is_empty() {
            return Err("model name must not be empty".to_owned());
        }
        if self.context_length < 2 {
            return Err("context_length must be at least 2".to_owned());
        }
        Ok(())
    }
}

/// The default duration constants are literals that always parse; a typo would be caught
/// by the `defaults_agree` test before it could ship.
fn parse_default(s: &str) -> Duration {
    humantime::parse_duration(s).unwrap_or_default()
}

/// Durations as human-readable strings (`"200ms"`, `"1s 500ms"`) in config files.
mod human_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimConfig,
    }

    #[test]
    fn defaults_agree() {
        let from_cli = Cli::try_parse_from(["sim"]).unwrap().sim;
        assert_eq!(from_cli, SimConfig::default());
        let from_serde: SimConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(from_serde, SimConfig::default());
        assert_eq!(
            humantime::parse_duration(DEFAULT_TTFT).unwrap(),
            Duration::ZERO
        );
        SimConfig::default().validate().unwrap();
    }

    #[test]
    fn flags_and_config_files() {
        let c = Cli::try_parse_from([
            "sim",
            "--port",
            "4",
            "--ttft",
            "250ms",
            "--tpot",
            "5ms",
            "--served-model-name",
            "m",
            "--model-path",
            "/tok",
        ])
        .unwrap()
        .sim;
        assert_eq!(c.ttft, Duration::from_millis(250));
        assert_eq!(c.model, "m");
        assert_eq!(c.model_path(), "/tok");
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["ttft"], "250ms");
        assert_eq!(serde_json::from_value::<SimConfig>(json).unwrap(), c);
        assert!(serde_json::from_str::<SimConfig>(r#"{"ttft":"soon"}"#).is_err());
        assert!(serde_json::from_str::<SimConfig>(r#"{"bogus":1}"#).is_err());
        assert!(Cli::try_parse_from(["sim", "--mode", "prefill"]).is_err());
    }
}
