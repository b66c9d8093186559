//! The simulated worker answers every input with the status SGLang's request models would
//! give it: valid requests with one field replaced by arbitrary JSON, and arbitrary bytes,
//! on every generation route, each checked against the status an oracle works out for that
//! input from the field's declared type and the simulator's documented limits (never "200
//! or 400"). No panic, no 5xx. Bounded number of cases; in-process, no sockets.
//!
//! The oracle ([`expected`]) knows, per route and field, which JSON values the request
//! types accept (`Option<u32>`, a string or a list of strings, ...) and the simulator's
//! limits on them (`n` within its sequence budget, alternatives within its vocabulary of
//! words, `max_tokens` within the context). A value it cannot decide (a `max_tokens`
//! between "surely fits" and "surely does not") is skipped; such values are rare.

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use proptest::prelude::*;
use serde_json::{Value, json};
use sim::job::{MAX_SEQUENCES, MAX_TOP_LOGPROBS, ROLES};
use sim::model::VOCAB_SIZE;
use sim::{self, SimConfig};
use tower::ServiceExt;

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
const GENERATE: &str = "/generate";
const ROUTES: [&str; 3] = [CHAT, COMPLETIONS, GENERATE];

/// The context length the simulator runs with here.
const CONTEXT: u64 = 4096;

/// Prompts of each route's base request (the generate base has a list of two, and a
/// `rid` list of two, so every per-item list must have two entries).
fn items(route: &str) -> u64 {
    match route {
        CHAT => 1,
        _ => 2,
    }
}

fn base(route: &str) -> Value {
    match route {
        CHAT => {
            json!({"model": "m", "messages": [{"role": "user", "content": "hi there"}],
            "max_tokens": 4, "n": 2, "stop": ["x"], "logprobs": true, "top_logprobs": 2, "stream": false,
            "stream_options": {"include_usage": true}, "rid": "r"})
        }
        COMPLETIONS => json!({"model": "m", "prompt": ["a b", "c"], "max_tokens": 4, "n": 1,
            "echo": true, "logprobs": 1, "stop": "q", "stream": false}),
        _ => {
            json!({"text": ["a", "b"], "sampling_params": {"max_new_tokens": 3, "stop": ["z"], "n": 1},
            "return_logprob": true, "logprob_start_len": 0, "top_logprobs_num": 1, "rid": ["x", "y"],
            "stream": false})
        }
    }
}

fn is_u32(v: &Value) -> bool {
    v.as_u64().is_some_and(|x| x <= u64::from(u32::MAX))
}

fn u32_in(v: &Value, lo: u64, hi: u64) -> bool {
    is_u32(v) && v.as_u64().is_some_and(|x| (lo..=hi).contains(&x))
}

fn is_str_or_strs(v: &Value) -> bool {
    v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
}

fn is_ids(v: &Value) -> bool {
    v.as_array().is_some_and(|a| a.iter().all(is_u32))
}

/// A per-item field of `/generate`: one value, or a list of one per prompt.
fn per_item(v: &Value, ok: impl Fn(&Value) -> bool) -> bool {
    match v.as_array() {
        Some(a) => a.len() as u64 == items(GENERATE) && a.iter().all(ok),
        None => ok(v),
    }
}

/// `null` or absent-equivalent.
fn or_null(v: &Value, ok: bool) -> bool {
    v.is_null() || ok
}

/// A token budget: surely within the context (true), surely beyond it (false), or between.
fn max_tokens(v: &Value) -> Option<bool> {
    if v.is_null() {
        return Some(true);
    }
    if !is_u32(v) {
        return Some(false);
    }
    match v.as_u64()? {
        0..=64 => Some(true),
        m if m >= CONTEXT => Some(false),
        _ => None,
    }
}

/// A chat message: an object with a known role (any case), and a content that is absent,
/// `null`, a string or a list of typed parts.
fn is_message(m: &Value) -> bool {
    let Some(o) = m.as_object() else {
        return false;
    };
    let role_ok = o
        .get("role")
        .and_then(Value::as_str)
        .is_some_and(|r| ROLES.iter().any(|k| k.eq_ignore_ascii_case(r)));
    let opt_str = |k: &str| o.get(k).is_none_or(|v| v.is_null() || v.is_string());
    let part_ok = |p: &Value| {
        p.as_object().is_some_and(|p| {
            p.get("type").is_some_and(Value::is_string)
                && p.get("text").is_none_or(|t| t.is_null() || t.is_string())
        })
    };
    let content_ok = o.get("content").is_none_or(|c| {
        c.is_null() || c.is_string() || c.as_array().is_some_and(|a| a.iter().all(part_ok))
    });
    role_ok && content_ok && opt_str("name") && opt_str("tool_call_id")
}

/// A completions prompt: a string, or a non-empty list of only strings, only token ids or
/// only non-empty token-id lists, every id in the vocabulary.
fn is_prompt(v: &Value) -> bool {
    let in_vocab = |x: &Value| is_u32(x) && x.as_u64().is_some_and(|x| x < u64::from(VOCAB_SIZE));
    match v {
        Value::String(_) => true,
        Value::Array(a) if a.is_empty() => false,
        Value::Array(a) if a[0].is_string() => a.iter().all(Value::is_string),
        Value::Array(a) if a[0].is_array() => a.iter().all(|l| {
            l.as_array()
                .is_some_and(|l| !l.is_empty() && l.iter().all(in_vocab))
        }),
        Value::Array(a) => a.iter().all(in_vocab),
        _ => false,
    }
}

/// `stream_options`: an object whose two flags, when given, are flags.
fn is_stream_options(v: &Value) -> bool {
    v.as_object().is_some_and(|o| {
        ["include_usage", "continuous_usage_stats"]
            .iter()
            .all(|k| o.get(*k).is_none_or(|f| f.is_null() || f.is_boolean()))
    })
}

/// Sampling parameters the oracle decides: an object with only keys it knows the meaning
/// of (unknown keys are passed over, as SGLang does).
fn sampling(v: &Value) -> Option<bool> {
    let Some(o) = v.as_object() else {
        return Some(false);
    };
    let mut ok = true;
    for (k, x) in o {
        ok &= match k.as_str() {
            "max_new_tokens" => max_tokens(x)?,
            "min_new_tokens" => or_null(x, u32_in(x, 0, 64)),
            "n" => or_null(x, u32_in(x, 1, MAX_SEQUENCES as u64 / items(GENERATE))),
            "stop" => or_null(x, is_str_or_strs(x)),
            "stop_token_ids" => or_null(x, is_ids(x)),
            "temperature" => or_null(x, x.as_f64().is_some_and(|t| t >= 0.0)),
            "top_p" => or_null(x, x.as_f64().is_some_and(|p| p > 0.0 && p <= 1.0)),
            "top_k" => or_null(x, x.is_i64()),
            "ignore_eos" | "no_stop_trim" => or_null(x, x.is_boolean()),
            _ => true,
        };
    }
    Some(ok)
}

/// The status the simulator must answer `route`'s base request with `field` set to `v`
/// (`None`: the oracle cannot tell).
fn expected(route: &str, field: &str, v: &Value) -> Option<u16> {
    let openai = route != GENERATE;
    let ok = match (route, field) {
        (_, "stream") => or_null(v, v.is_boolean()),
        (CHAT, "messages") => v
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(is_message)),
        (COMPLETIONS, "prompt") => is_prompt(v),
        (GENERATE, "text") => v
            .as_array()
            .is_some_and(|a| a.len() as u64 == items(GENERATE) && a.iter().all(Value::is_string)),
        (GENERATE, "input_ids") => {
            // `text` wins; the ids must still be ids.
            or_null(
                v,
                v.as_array()
                    .is_some_and(|a| a.iter().all(is_u32) || a.iter().all(is_ids)),
            )
        }
        (GENERATE, "sampling_params") => match v {
            Value::Null => true,
            Value::Array(a) if a.len() as u64 == items(GENERATE) => {
                let mut all = true;
                for s in a {
                    all &= sampling(s)?;
                }
                let ns: Vec<Option<u64>> = a
                    .iter()
                    .map(|s| s.get("n").and_then(Value::as_u64))
                    .collect();
                all && ns.iter().all(|n| n.unwrap_or(1) == ns[0].unwrap_or(1))
            }
            Value::Array(_) => false,
            s => sampling(s)?,
        },
        (GENERATE, "return_logprob") => or_null(v, per_item(v, Value::is_boolean)),
        (GENERATE, "top_logprobs_num") => or_null(
            v,
            per_item(v, |x| u32_in(x, 0, u64::from(MAX_TOP_LOGPROBS))),
        ),
        (GENERATE, "logprob_start_len") => {
            // -1 (the last position) and 0 are inside any prompt; far positions are not.
            let one = |x: &Value| match x.as_i64() {
                Some(-1 | 0) => Some(true),
                Some(s) if !(-1..64).contains(&s) => Some(false),
                Some(_) => None,
                None => Some(false),
            };
            match v {
                Value::Null => true,
                Value::Array(a) if a.len() as u64 == items(GENERATE) => {
                    let mut all = true;
                    for x in a {
                        all &= one(x)?;
                    }
                    all
                }
                Value::Array(_) => false,
                x => one(x)?,
            }
        }
        (GENERATE, "rid" | "bootstrap_room") => {
            let elem = |x: &Value| match field {
                "rid" => x.is_string(),
                _ => x.is_u64(),
            };
            or_null(v, per_item(v, elem))
        }
        (_, "rid") => or_null(v, is_str_or_strs(v)),
        (_, "bootstrap_room") => or_null(
            v,
            v.is_u64() || v.as_array().is_some_and(|a| a.iter().all(Value::is_u64)),
        ),
        (_, "n") if openai => or_null(v, u32_in(v, 1, MAX_SEQUENCES as u64 / items(route))),
        (_, "max_tokens") if openai => max_tokens(v)?,
        (CHAT, "max_completion_tokens") => max_tokens(v)?,
        (_, "stop") if openai => or_null(v, is_str_or_strs(v)),
        (CHAT, "logprobs") | (COMPLETIONS, "echo") => or_null(v, v.is_boolean()),
        (CHAT, "top_logprobs") | (COMPLETIONS, "logprobs") => {
            or_null(v, u32_in(v, 0, u64::from(MAX_TOP_LOGPROBS)))
        }
        (_, "stream_options") if openai => or_null(v, is_stream_options(v)),
        (_, "temperature") if openai => or_null(v, v.as_f64().is_some_and(|t| t >= 0.0)),
        (_, "top_p") if openai => or_null(v, v.as_f64().is_some_and(|p| p > 0.0 && p <= 1.0)),
        (_, "seed") if openai => or_null(v, v.is_i64()),
        (_, "min_tokens") if openai => or_null(v, is_u32(v)),
        (_, "stop_token_ids") if openai => or_null(v, is_ids(v)),
        (_, "ignore_eos") if openai => or_null(v, v.is_boolean()),
        // Every other field is one this route does not read: passed over.
        _ => true,
    };
    Some(if ok { 200 } else { 400 })
}

/// The status for a whole body of arbitrary bytes (`None`: the oracle cannot tell).
fn expected_for_bytes(route: &str, bytes: &[u8]) -> Option<u16> {
    let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(bytes) else {
        return Some(400);
    };
    // Without the prompt the route needs, nothing else matters.
    let needs: &[&str] = match route {
        CHAT => &["messages"],
        COMPLETIONS => &["prompt"],
        _ => &["text", "input_ids"],
    };
    if needs.iter().all(|k| o.get(*k).is_none_or(Value::is_null)) {
        return Some(400);
    }
    None
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u32>().prop_map(|n| json!(n)),
        (0u32..80).prop_map(|n| json!(n)),
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

/// Values that are valid for some field (so both answers are exercised), mixed with
/// arbitrary JSON.
fn value() -> impl Strategy<Value = Value> {
    let plausible = prop_oneof![
        Just(json!([{"role": "user", "content": "hello"}])),
        Just(
            json!([{"role": "SYSTEM", "content": [{"type": "text", "text": "be brief"}]},
                    {"role": "user", "content": "x"}])
        ),
        Just(json!([{"role": "robot", "content": "x"}])),
        Just(json!(["one", "two"])),
        Just(json!([[5, 6, 7], [8]])),
        Just(json!([1, 2, 99999])),
        Just(json!({"max_new_tokens": 2, "n": 2})),
        Just(json!([{"n": 2}, {"n": 2}])),
        Just(json!([{"n": 1}, {"n": 3}])),
        Just(json!({"include_usage": false})),
        Just(json!([true, false])),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(MAX_TOP_LOGPROBS)),
        Just(json!(MAX_TOP_LOGPROBS + 1)),
        Just(json!(MAX_SEQUENCES)),
        Just(json!(CONTEXT)),
    ];
    prop_oneof![plausible, any_json()]
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
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn one_replaced_field_gets_the_status_its_value_calls_for(
        route in prop::sample::select(ROUTES.to_vec()),
        field in field_names(),
        value in value(),
        stream in any::<bool>(),
    ) {
        let want = expected(route, field, &value);
        prop_assume!(want.is_some(), "undecidable");
        let app = sim::router(SimConfig { context_length: CONTEXT as u32, ..SimConfig::default() }).unwrap();
        let mut body = base(route);
        body["stream"] = json!(stream);
        body[field] = value;
        let status = runtime().block_on(status_of(&app, route, body.to_string().into_bytes()));
        prop_assert_eq!(Some(status), want, "{} {}", route, body);
    }

    #[test]
    fn arbitrary_bytes_get_a_400(
        route in prop::sample::select(ROUTES.to_vec()),
        bytes in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let want = expected_for_bytes(route, &bytes);
        prop_assume!(want.is_some(), "undecidable");
        let app = sim::router(SimConfig::default()).unwrap();
        let status = runtime().block_on(status_of(&app, route, bytes.clone()));
        prop_assert_eq!(Some(status), want, "{} {:?}", route, bytes);
    }
}

#[test]
fn the_oracle_decides_the_known_cases() {
    // A few values whose answer is known from SGLang's behaviour, checked against the
    // oracle itself so its rules are pinned down.
    for (route, field, v, want) in [
        (CHAT, "n", json!(0), 400),
        (CHAT, "n", json!(2), 200),
        (CHAT, "n", json!(2.0), 400),
        (COMPLETIONS, "n", json!(MAX_SEQUENCES), 400),
        (CHAT, "top_logprobs", json!(MAX_TOP_LOGPROBS + 1), 400),
        (CHAT, "messages", json!([]), 400),
        (COMPLETIONS, "prompt", json!([1, "a"]), 400),
        (GENERATE, "text", json!("one"), 400),
        (GENERATE, "rid", json!("one"), 200),
        (GENERATE, "n", json!("anything"), 200),
        (CHAT, "seed", json!(u64::MAX), 400),
    ] {
        assert_eq!(
            expected(route, field, &v),
            Some(want),
            "{route} {field} {v}"
        );
    }
}
