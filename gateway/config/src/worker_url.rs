//! A worker's base URL as the settings, the worker API and discovery give it: checked
//! (`http://` or `https://`, a host, no query) and normalized once.

use http::uri::{Authority, PathAndQuery, Scheme, Uri};

/// A worker base URL: `http://` or `https://host[:port][/prefix]`, normalized (no trailing
/// slash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerUrl {
    text: String,
    scheme: Scheme,
    authority: Authority,
    prefix: String,
}

/// Why a worker URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not a URL at all.
    #[error("not a valid URL: {0}")]
    Syntax(String),
    /// `host:port` without `http://`.
    #[error("missing scheme (expected http://host:port or https://host:port)")]
    NoScheme,
    /// `grpc://`, `ftp://` ...
    #[error("unsupported scheme {0:?} (workers are reached over http:// or https://)")]
    Scheme(String),
    /// `http://` with nothing after it, or `http://:80`.
    #[error("missing host")]
    NoHost,
    /// `?a=b` or `#x`.
    #[error("a worker URL cannot carry a query")]
    Query,
}

impl WorkerUrl {
    /// Parses and normalizes a worker URL; `http` and `https` are accepted.
    pub fn parse(raw: &str) -> Result<Self, UrlError> {
        let raw = raw.trim();
        let uri: Uri = raw
            .parse()
            .map_err(|e: http::uri::InvalidUri| UrlError::Syntax(e.to_string()))?;
        let scheme = match uri.scheme_str() {
            None => return Err(UrlError::NoScheme),
            Some(s) if s.eq_ignore_ascii_case("http") => Scheme::HTTP,
            Some(s) if s.eq_ignore_ascii_case("https") => Scheme::HTTPS,
            Some(s) => return Err(UrlError::Scheme(s.to_string())),
        };
        let authority = uri.authority().cloned().ok_or(UrlError::NoHost)?;
        if authority.host().is_empty() || authority.as_str().contains('@') {
            return Err(UrlError::NoHost);
        }
        if uri.query().is_some() || raw.contains('#') {
            return Err(UrlError::Query);
        }
        let prefix = uri.path().trim_end_matches('/').to_string();
        let text = format!(
            "{}://{}{}",
            scheme.as_str(),
            authority.as_str().to_ascii_lowercase(),
            prefix
        );
        Ok(Self {
            text,
            scheme,
            authority,
            prefix,
        })
    }

    /// The normalized URL.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// `host:port`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The URI of `path_and_query` (which starts with `/`) on this worker.
    pub fn join(&self, path_and_query: &str) -> Result<Uri, http::Error> {
        self.join_pq(PathAndQuery::try_from(path_and_query)?)
    }

    /// [`WorkerUrl::join`] for an already parsed path (no copy when the URL has no prefix).
    pub fn join_pq(&self, pq: PathAndQuery) -> Result<Uri, http::Error> {
        let pq = if self.prefix.is_empty() {
            pq
        } else {
            PathAndQuery::try_from(format!("{}{}", self.prefix, pq.as_str()))?
        };
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(pq)
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_normalized() {
        let u = WorkerUrl::parse("http://LocalHost:8000/").unwrap();
        assert_eq!(u.as_str(), "http://localhost:8000");
        assert_eq!(
            u.join("/v1/models?x=1").unwrap().to_string(),
            "http://LocalHost:8000/v1/models?x=1"
        );
        let p = WorkerUrl::parse("http://h:1/sgl/").unwrap();
        assert_eq!(
            p.join("/generate").unwrap().to_string(),
            "http://h:1/sgl/generate"
        );
        assert_eq!(
            WorkerUrl::parse("localhost:8000").unwrap_err(),
            UrlError::NoScheme
        );
        assert_eq!(
            WorkerUrl::parse("/just/a/path").unwrap_err(),
            UrlError::NoScheme
        );
        let tls = WorkerUrl::parse("HTTPS://H:1/sgl").unwrap();
        assert_eq!(tls.as_str(), "https://h:1/sgl");
        assert_eq!(
            tls.join("/health").unwrap().to_string(),
            "https://H:1/sgl/health"
        );
        assert!(matches!(
            WorkerUrl::parse("grpc://h:1"),
            Err(UrlError::Scheme(_))
        ));
        assert!(matches!(
            WorkerUrl::parse("http://"),
            Err(UrlError::Syntax(_) | UrlError::NoHost)
        ));
        assert!(matches!(WorkerUrl::parse(""), Err(UrlError::Syntax(_))));
        assert_eq!(
            WorkerUrl::parse("http://h:1/?a=b").unwrap_err(),
            UrlError::Query
        );
        assert!(WorkerUrl::parse("http://[::1]:8000").is_ok());
    }
}
