//! Tenants: who a client key belongs to, and what that tenant may use. A line of the client
//! keys file is a key, then optionally `name=value` options:
//!
//! ```text
//! # key                      options
//! sk-team-a-1                tenant=team-a rate=20 concurrency=8 max_priority=interactive
//! sk-team-a-2                tenant=team-a
//! sk-batch                   tenant=batch concurrency=64 max_priority=bulk
//! sk-anyone
//! ```
//!
//! - `tenant`: the tenant's name (what metrics and logs show; never the key). Keys with
//!   the same name share the tenant's limits. A key without it belongs to no tenant: no
//!   limits of its own, counted with nobody.
//! - `rate`: requests admitted per second (a token bucket with one second of burst).
//! - `concurrency`: requests in flight at once.
//! - `max_priority`: the highest priority class its requests may claim (a higher class
//!   asked for is lowered to it).
//!
//! An option given twice for one tenant must have one value.

use std::fmt;

/// Longest tenant name, in bytes.
pub const MAX_TENANT_NAME: usize = 64;

/// A priority class, lowest first (smg's names, so its clients keep their header values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Batch work: moves when nobody else waits (or by aging).
    Bulk,
    /// What a request without a priority gets.
    #[default]
    Default,
    /// Latency-sensitive traffic.
    Interactive,
    /// The operator's own traffic.
    System,
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 4] = [Self::Bulk, Self::Default, Self::Interactive, Self::System];

    /// Its rank, 0 (lowest) to 3.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name (a metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bulk => "bulk",
            Self::Default => "default",
            Self::Interactive => "interactive",
            Self::System => "system",
        }
    }

    /// A class from its name (any case) or its rank (`0` to `3`); `None` for anything else.
    pub fn parse(v: &str) -> Option<Self> {
        let v = v.trim();
        Self::ALL
            .into_iter()
            .find(|p| v.eq_ignore_ascii_case(p.as_str()))
            .or_else(|| {
                v.parse::<usize>()
                    .ok()
                    .and_then(|i| Self::ALL.get(i).copied())
            })
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tenant and its limits (`None`: no limit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// Requests admitted per second.
    pub rate_per_second: Option<u64>,
    /// Requests in flight at once.
    pub max_concurrent: Option<usize>,
    /// The highest class its requests may claim.
    pub max_priority: Option<Priority>,
}

/// The options of one keys-file line, checked.
#[derive(Debug, Default)]
pub(crate) struct LineOptions {
    pub(crate) tenant: Option<String>,
    rate: Option<u64>,
    concurrency: Option<usize>,
    max_priority: Option<Priority>,
}

/// Parses a line's `name=value` options (after its key).
pub(crate) fn parse_options<'a>(
    words: impl Iterator<Item = &'a str>,
) -> Result<LineOptions, String> {
    let mut o = LineOptions::default();
    for w in words {
        let Some((name, value)) = w.split_once('=') else {
            // Never quoted: a key with a space in it would show its second half.
            return Err("a word after the key is not name=value".into());
        };
        let positive = |v: &str| v.parse::<u64>().ok().filter(|&n| n > 0);
        match name {
            "tenant"
                if (1..=MAX_TENANT_NAME).contains(&value.len())
                    && value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) =>
            {
                o.tenant = Some(value.to_owned());
            }
            "tenant" => {
                return Err(format!(
                    "tenant names are 1 to {MAX_TENANT_NAME} letters, digits, '-', '_' or '.'"
                ));
            }
            "rate" => o.rate = Some(positive(value).ok_or("rate must be a positive integer")?),
            "concurrency" => {
                let n = positive(value).ok_or("concurrency must be a positive integer")?;
                o.concurrency = Some(usize::try_from(n).map_err(|_| "concurrency too large")?);
            }
            "max_priority" => {
                o.max_priority =
                    Some(Priority::parse(value).ok_or(
                        "max_priority is bulk, default, interactive or system (or 0 to 3)",
                    )?);
            }
            _ => return Err("unknown option (tenant, rate, concurrency, max_priority)".into()),
        }
    }
    if o.tenant.is_none()
        && (o.rate.is_some() || o.concurrency.is_some() || o.max_priority.is_some())
    {
        return Err("limits need a tenant=<name>".into());
    }
    Ok(o)
}

/// Adds a line's options to the tenants (index of its tenant, if it names one).
pub(crate) fn merge(tenants: &mut Vec<Tenant>, o: LineOptions) -> Result<Option<u32>, String> {
    let Some(name) = o.tenant else {
        return Ok(None);
    };
    let i = match tenants.iter().position(|t| t.name == name) {
        Some(i) => i,
        None => {
            tenants.push(Tenant {
                name: name.clone(),
                ..Tenant::default()
            });
            tenants.len() - 1
        }
    };
    let t = &mut tenants[i];
    fn set<T: PartialEq + Copy>(
        slot: &mut Option<T>,
        v: Option<T>,
        what: &str,
        name: &str,
    ) -> Result<(), String> {
        match (*slot, v) {
            (Some(a), Some(b)) if a != b => Err(format!(
                "tenant {name}: {what} given twice with different values"
            )),
            (_, Some(b)) => {
                *slot = Some(b);
                Ok(())
            }
            _ => Ok(()),
        }
    }
    set(&mut t.rate_per_second, o.rate, "rate", &name)?;
    set(&mut t.max_concurrent, o.concurrency, "concurrency", &name)?;
    set(&mut t.max_priority, o.max_priority, "max_priority", &name)?;
    u32::try_from(i)
        .map(Some)
        .map_err(|_| "too many tenants".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_parse_by_name_or_rank() {
        assert_eq!(
            Priority::parse(" Interactive "),
            Some(Priority::Interactive)
        );
        assert_eq!(Priority::parse("0"), Some(Priority::Bulk));
        assert_eq!(Priority::parse("3"), Some(Priority::System));
        for bad in ["4", "-1", "", "urgent"] {
            assert_eq!(Priority::parse(bad), None, "{bad}");
        }
        assert!(Priority::Bulk < Priority::System);
    }

    #[test]
    fn options_are_checked_and_tenants_merge() {
        let mut ts = Vec::new();
        let line = |s: &'static str| parse_options(s.split_whitespace());
        let a = line("tenant=a rate=5 max_priority=bulk").unwrap();
        assert_eq!(merge(&mut ts, a).unwrap(), Some(0));
        assert_eq!(
            merge(&mut ts, line("tenant=a concurrency=2").unwrap()).unwrap(),
            Some(0)
        );
        assert_eq!(merge(&mut ts, line("").unwrap()).unwrap(), None);
        assert_eq!(
            ts[0],
            Tenant {
                name: "a".into(),
                rate_per_second: Some(5),
                max_concurrent: Some(2),
                max_priority: Some(Priority::Bulk),
            }
        );
        let e = merge(&mut ts, line("tenant=a rate=6").unwrap()).unwrap_err();
        assert!(e.contains("rate given twice"), "{e}");
        for bad in [
            "rate=5",
            "tenant=",
            "tenant=a/b",
            "rate=0",
            "concurrency=x",
            "max_priority=9",
            "colour=red",
            "#",
        ] {
            assert!(line(bad).is_err(), "{bad}");
        }
    }
}
