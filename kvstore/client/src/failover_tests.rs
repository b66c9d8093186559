//! A client of several masters against fake ones on loopback: it follows a redirect to a
//! listed master, never to another, and moves past masters that are down or answer 503.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::IntoResponse;

use super::rpc::MasterRpc;
use trust::Secret;
use uuid::Uuid as ClientId;

#[derive(Clone)]
enum Answer {
    Redirect(String),
    Unavailable,
    Pong,
}

/// A fake master answering every request with `answer`; counts what it got.
async fn fake(answer: Answer) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let (answer, h) = (answer.clone(), h.clone());
        async move {
            h.fetch_add(1, Ordering::Relaxed);
            match answer {
                Answer::Redirect(to) => {
                    let mut r = StatusCode::TEMPORARY_REDIRECT.into_response();
                    let loc = format!("{to}{}", uri.path());
                    r.headers_mut()
                        .insert(header::LOCATION, HeaderValue::from_str(&loc).unwrap());
                    r
                }
                Answer::Unavailable => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(serde_json::json!({"error": {"type": "UNAVAILABLE",
                        "message": "unavailable: no leader", "code": -2003}})),
                )
                    .into_response(),
                Answer::Pong => axum::Json(serde_json::json!({"view_version": 7, "status": "ok"}))
                    .into_response(),
            }
        }
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (format!("http://{addr}"), hits)
}

fn rpc(urls: &[&str]) -> MasterRpc {
    MasterRpc::new(
        &urls.join(","),
        Duration::from_secs(2),
        &Secret::new("k".to_owned()),
        None,
        None,
    )
    .unwrap()
}

#[tokio::test]
async fn a_redirect_is_followed_only_to_a_listed_master() {
    let (evil, evil_hits) = fake(Answer::Pong).await;
    let (a, _) = fake(Answer::Redirect(evil.clone())).await;
    let (b, b_hits) = fake(Answer::Pong).await;
    let r = rpc(&[&a, &b]);
    let e = r.ping(ClientId::nil()).await.unwrap_err().to_string();
    assert!(e.contains("not on this client's master list"), "{e}");
    assert_eq!(
        evil_hits.load(Ordering::Relaxed),
        0,
        "the key went nowhere unlisted"
    );
    assert_eq!(b_hits.load(Ordering::Relaxed), 0);

    let (a2, _) = fake(Answer::Redirect(b.clone())).await;
    let r = rpc(&[&a2, &b]);
    assert_eq!(r.ping(ClientId::nil()).await.unwrap().view_version, 7);
    assert_eq!(r.base(), b, "later calls go straight to the leader");
}

#[tokio::test]
async fn masters_that_are_down_or_unavailable_are_passed_over() {
    let (c, c_hits) = fake(Answer::Unavailable).await;
    let (b, _) = fake(Answer::Pong).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let r = rpc(&[&dead, &c, &b]);
    assert_eq!(r.ping(ClientId::nil()).await.unwrap().view_version, 7);
    assert_eq!(c_hits.load(Ordering::Relaxed), 1);
    assert_eq!(r.base(), b);
    // One master only: a 503 is the answer, not a reason to retry.
    let r = rpc(&[&c]);
    let e = r.ping(ClientId::nil()).await.unwrap_err().to_string();
    assert!(e.contains("unavailable"), "{e}");
    assert_eq!(c_hits.load(Ordering::Relaxed), 2);
}
