//! Shared harness of the REST tests: the real router on a real socket, a real HTTP client.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use kvmaster::{Master, MasterConfig};
use serde_json::{Value, json};

pub const CLIENT: &str = "00000000-0000-0000-0000-000000000001";
pub const WRITER: &str = "00000000-0000-0000-0000-000000000007";

pub struct Server {
    pub addr: SocketAddr,
    pub master: Arc<Master>,
    pub http: reqwest::Client,
}

impl Server {
    pub async fn start() -> Self {
        Self::with_config(MasterConfig::default()).await
    }

    pub async fn with_config(config: MasterConfig) -> Self {
        let master = Arc::new(Master::new(config).unwrap());
        let app: axum::Router = kvmaster::router(master.clone()).into();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            addr,
            master,
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends a request; returns status and body parsed as JSON (Null when empty).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = self.http.request(method, self.url(path));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, value)
    }

    /// Sends raw bytes with a JSON content type.
    pub async fn raw(&self, method: &str, path: &str, body: &'static str) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let resp = self
            .http
            .request(method, self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Mounts segment `name` (1 MiB) for `CLIENT`.
    pub async fn mount(&self, name: &str, base: u64) {
        let (s, b) = self
            .call(
                "POST",
                &format!("/api/v1/clients/{CLIENT}/segments"),
                Some(json!({"name": name, "base": base, "size": 1 << 20, "endpoint": format!("te-{name}")})),
            )
            .await;
        assert_eq!(s, 200, "{b}");
    }

    /// put-start + put-end of `key` by `WRITER`.
    pub async fn put(&self, key: &str, length: u64) {
        let (s, b) = self
            .call(
                "POST",
                &format!("/api/v1/objects/{key}/put-start"),
                Some(json!({"client_id": WRITER, "length": length})),
            )
            .await;
        assert_eq!(s, 200, "{b}");
        let (s, b) = self
            .call(
                "POST",
                &format!("/api/v1/objects/{key}/put-end"),
                Some(json!({"client_id": WRITER})),
            )
            .await;
        assert_eq!(s, 204, "{b}");
    }

    /// Everything observable about the master's state, to prove a refused request
    /// changed nothing.
    pub async fn snapshot(&self) -> Value {
        let (_, mut stats) = self.call("GET", "/api/v1/stats", None).await;
        // Read counters count requests (a refused one too), not state.
        for counter in ["reads_from_memory", "reads_from_disk", "read_misses"] {
            stats.as_object_mut().unwrap().remove(counter);
        }
        let (_, keys) = self.call("GET", "/api/v1/objects", None).await;
        let (_, segs) = self.call("GET", "/api/v1/segments", None).await;
        let (_, clients) = self.call("GET", "/api/v1/clients", None).await;
        let clients: Vec<Value> = clients["clients"]
            .as_array()
            .unwrap()
            .iter()
            .map(
                |c| json!({"id": c["client_id"], "status": c["status"], "segments": c["segments"]}),
            )
            .collect();
        json!({"stats": stats, "keys": keys, "segments": segs, "clients": clients})
    }
}

/// Asserts a typed error body with this HTTP status, Mooncake name and code.
pub fn assert_error(got: &(u16, Value), status: u16, name: &str, code: i64) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"]["type"], name, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
    assert!(
        got.1["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
}
