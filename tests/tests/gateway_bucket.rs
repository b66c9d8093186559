//! `bucket` against two recording workers: once the gateway has seen the traffic, short
//! prompts go to one worker and long ones to the other.

use gateway::config::PolicyKind;
use moongate_tests::{Backend, start_regular_gateway};
use serde_json::json;

#[tokio::test]
async fn short_and_long_prompts_go_to_different_workers() {
    let a = Backend::start("a", "m").await;
    let b = Backend::start("b", "m").await;
    let gw = start_regular_gateway(&[&a, &b], |c| c.policy = PolicyKind::Bucket).await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/completions", gw.url());
    let send = |len: usize| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let prompt = "x".repeat(len);
            let r = c
                .post(url)
                .json(&json!({"model": "m", "prompt": prompt}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    };
    // Traffic of every length from 100 to 10,000 bytes, one at a time (no imbalance).
    for i in 0..300usize {
        send(100 + (i * 7919) % 9_900).await;
    }
    let (a0, b0) = (a.hits(), b.hits());
    for _ in 0..20 {
        send(150).await;
    }
    let (a1, b1) = (a.hits(), b.hits());
    for _ in 0..20 {
        send(9_800).await;
    }
    let (a2, b2) = (a.hits(), b.hits());
    let shorts = (a1 - a0, b1 - b0);
    let longs = (a2 - a1, b2 - b1);
    assert!(
        (shorts == (20, 0) && longs == (0, 20)) || (shorts == (0, 20) && longs == (20, 0)),
        "shorts {shorts:?}, longs {longs:?}"
    );
    gw.shutdown().await;
}
