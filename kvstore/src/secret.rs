//! [`Secret`]: a setting that must never be printed (API keys).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A secret setting, such as an API key. `Debug` never shows the value, so a logged
/// configuration cannot leak it; (de)serializes as the plain string, so configuration files
/// and the environment carry it unchanged.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself (to send or compare, never to print).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<hidden>)")
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_serde_keeps() {
        let s = Secret::new("k-123");
        assert_eq!(format!("{s:?}"), "Secret(<hidden>)");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"k-123\"");
        assert_eq!(serde_json::from_str::<Secret>("\"k-123\"").unwrap(), s);
        assert_eq!("k-123".parse::<Secret>().unwrap().expose(), "k-123");
    }
}
