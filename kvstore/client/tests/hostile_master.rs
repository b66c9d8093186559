//! A store client behind a master that lies about lengths: a proxy in front of a real
//! master answers every batch lookup of a `lie-*` key with a length of a pebibyte. The
//! client must answer those keys with errors (not abort on an allocation of that size) and
//! serve the honest keys of the same batch.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use kvclient::{ClientConfig, StoreClient};
use kvmaster::{MasterConfig, MasterServer};

const MIB: u64 = 1 << 20;
const LIE: u64 = 1 << 50;

/// Forwards everything to `master`, rewriting the length of `lie-*` items in batch lookups.
async fn lying_proxy(master: String) -> String {
    let http = reqwest::Client::new();
    let app = axum::Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (http, master) = (http.clone(), master.clone());
            async move {
                let mut req = http.request(method, format!("{master}{uri}")).body(body);
                for (name, value) in &headers {
                    if name != "host" && name != "content-length" {
                        req = req.header(name, value);
                    }
                }
                let resp = req.send().await.unwrap();
                let status = StatusCode::from_u16(resp.status().as_u16()).unwrap();
                let mut body = resp.bytes().await.unwrap().to_vec();
                if uri.path() == "/api/v1/batch/replicas" && status.is_success() {
                    let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    for item in v["results"].as_array_mut().unwrap() {
                        if item["key"].as_str().unwrap().starts_with("lie-") {
                            item["length"] = LIE.into();
                        }
                    }
                    body = serde_json::to_vec(&v).unwrap();
                }
                (status, [("content-type", "application/json")], body).into_response()
            }
        },
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lengths_a_master_lies_about_size_no_allocation_and_fail_alone() {
    let m = MasterServer::start(MasterConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let node = StoreClient::connect(ClientConfig::local(&m.url(), 32 * MIB))
        .await
        .unwrap();
    for (k, v) in [("lie-a", vec![1u8; 4096]), ("lie-b", vec![2; 4096])] {
        node.put(k, &v).await.unwrap();
    }
    let honest = vec![7u8; 5 * MIB as usize];
    node.put("honest", &honest).await.unwrap();
    let proxied = StoreClient::connect(ClientConfig {
        local_buffer_size: 8 * MIB,
        ..ClientConfig::local(&lying_proxy(m.url()).await, 0)
    })
    .await
    .unwrap();
    // Before the lengths were bounded, this batch asked the allocator for two pebibytes.
    let got = proxied.batch_get(&["lie-a", "honest", "lie-b"]).await;
    assert_eq!(got.len(), 3);
    // (The read of a lie fails where its slot would be allocated: bigger than the copy
    // buffer, the client asks for a buffer of its own, which the kernel refuses.)
    assert!(got[0].is_err() && got[2].is_err(), "{got:?}");
    assert_eq!(got[1].as_ref().unwrap().as_ref(), honest.as_slice());
    assert_eq!(proxied.copy_buffer_in_use(), 0);
}
