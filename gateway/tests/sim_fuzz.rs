//! No input from the network makes the simulated worker panic or answer 5xx: valid
//! requests with one field replaced by arbitrary JSON, and arbitrary bytes, on every
//! generation route (bounded number of cases; in-process, no sockets).

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use gateway::sim::{self, SimConfig};
use proptest::prelude::*;
use serde_json::{Value, json};
use tower::ServiceExt;

const ROUTES: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/generate"];

fn base(route: &str) -> Value {
    match route {
        "/v1/chat/completions" => {
            json!({"model": "m", "messages": [{"role": "user", "content": "hi there"}],
            "max_tokens": 4, "n": 2, "stop": ["x"], "logprobs": true, "top_logprobs": 2, "stream": false,
            "stream_options": {"include_usage": true}, "rid": "r"})
        }
        "/v1/completions" => json!({"model": "m", "prompt": ["a b", "c"], "max_tokens": 4, "n": 1,
            "echo": true, "logprobs": 1, "stop": "q", "stream": false}),
        _ => {
            json!({"text": ["a", "b"], "sampling_params": {"max_new_tokens": 3, "stop": ["z"], "n": 1},
            "return_logprob": true, "logprob_start_len": 0, "top_logprobs_num": 1, "rid": ["x", "y"],
            "stream": false})
        }
    }
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u32>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn field_names() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "messages",
        "prompt",
        "text",
        "input_ids",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "stop",
        "logprobs",
        "top_logprobs",
        "stream",
        "stream_options",
        "rid",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "temperature",
        "top_p",
        "echo",
        "seed",
        "min_tokens",
        "stop_token_ids",
        "ignore_eos",
        "bootstrap_room",
    ])
}

async fn status_of(app: &Router, route: &str, body: Vec<u8>) -> u16 {
    let req = Request::post(route)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    // Drain the body too: streams are rendered while it is read.
    axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    status
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn one_replaced_field_never_breaks_the_worker(
        route in prop::sample::select(ROUTES.to_vec()),
        field in field_names(),
        value in any_json(),
        stream in any::<bool>(),
    ) {
        let app = sim::router(SimConfig { context_length: 4096, ..SimConfig::default() });
        let mut body = base(route);
        body["stream"] = json!(stream);
        body[field] = value;
        let status = runtime().block_on(status_of(&app, route, body.to_string().into_bytes()));
        prop_assert!(status == 200 || status == 400, "{route} {body}: {status}");
    }

    #[test]
    fn arbitrary_bytes_get_a_400(
        route in prop::sample::select(ROUTES.to_vec()),
        bytes in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let app = sim::router(SimConfig::default());
        let status = runtime().block_on(status_of(&app, route, bytes.clone()));
        prop_assert!(status == 400 || status == 200, "{route} {bytes:?}: {status}");
    }
}
