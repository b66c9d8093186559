//! Nothing a client sends makes the gateway's body inspector, the PD rewriter or the PD
//! logprob merge panic or allocate beyond a bound proportional to the body: properties over
//! arbitrary bytes, arbitrary JSON-ish bodies and bodies whose counts (`n`, batch lists,
//! logprob alternatives) take any value a client can write, including huge ones. A counting
//! global allocator measures the bytes each call allocates; its counters are the whole
//! process's, so everything runs in one test, one case after the other.

use std::alloc::System;

use bytes::Bytes;
use gateway::proxy::Endpoint;
use gateway::proxy::inspect::routing_fields;
use gateway::proxy::pd::fields::{MergeKind, pd_fields};
use gateway::proxy::pd::merge::PrefillLogprobs;
use gateway::proxy::pd::rewrite::{Rooms, inject};
use proptest::prelude::*;
use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// The limit the properties run with (small, so bodies around it stay small).
const LIMIT: usize = 8;

const ENDPOINTS: [Endpoint; 3] = [
    Endpoint::ChatCompletions,
    Endpoint::Completions,
    Endpoint::Generate,
];

/// Runs `f`, returning its result and the bytes it allocated.
fn measured<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let region = Region::new(GLOBAL);
    let out = f();
    (out, region.change().bytes_allocated as u64)
}

/// Inspection as the inference handler runs it: parse, then check the counts.
fn inspect(ep: Endpoint, body: &[u8], limit: usize) -> Result<(), u16> {
    routing_fields(body)
        .and_then(|f| f.check(ep, limit))
        .map_err(|e| e.status().as_u16())
}

/// The PD path up to the rewritten body: parse, check, mint the rooms, splice.
fn pd_rewrite(ep: Endpoint, body: &[u8], limit: usize) -> Result<Bytes, u16> {
    let f = pd_fields(body).map_err(|e| e.status().as_u16())?;
    f.check(ep, limit).map_err(|e| e.status().as_u16())?;
    let rooms = Rooms::mint(f.batch(ep), limit).map_err(|e| e.status().as_u16())?;
    inject(
        body,
        "prefill-0.cluster.local",
        Some(8998),
        &rooms,
        f.has_bootstrap(),
    )
    .map_err(|e| e.status().as_u16())
}

/// Arbitrary JSON values.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinities", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,10}".prop_map(Value::String),
        "[0-9 .e+-]{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "n",
                        "text",
                        "prompt",
                        "input_ids",
                        "sampling_params",
                        "logprobs",
                        "top_logprobs",
                        "top_logprobs_num",
                        "return_logprob",
                        "echo",
                        "stream",
                        "model",
                        "bootstrap_room",
                        "bootstrap_host",
                        "messages",
                        "x",
                    ])
                    .prop_map(str::to_owned),
                    inner
                ),
                0..8
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// JSON-ish bytes: a JSON text, maybe cut short or with bytes spliced in.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    (
        json_value(),
        any::<bool>(),
        prop::option::of((
            any::<prop::sample::Index>(),
            prop::collection::vec(any::<u8>(), 0..4),
        )),
        prop::option::of(any::<prop::sample::Index>()),
    )
        .prop_map(|(v, pretty, splice, cut)| {
            let mut b = if pretty {
                serde_json::to_vec_pretty(&v).unwrap()
            } else {
                serde_json::to_vec(&v).unwrap()
            };
            if let Some((at, bytes)) = splice {
                let at = at.index(b.len() + 1);
                b.splice(at..at, bytes);
            }
            if let Some(at) = cut {
                b.truncate(at.index(b.len() + 1));
            }
            b
        })
}

/// A count as a client may write it, and what SGLang's models read from it (`None`: not a
/// count).
fn count() -> impl Strategy<Value = (Value, Option<u64>)> {
    let near = (LIMIT as u64).saturating_sub(1)..=LIMIT as u64 + 1;
    prop_oneof![
        (0u64..4).prop_map(|k| (json!(k), Some(k))),
        near.clone().prop_map(|k| (json!(k), Some(k))),
        Just((json!(100_000_000_000u64), Some(100_000_000_000))),
        Just((json!(u64::MAX), Some(u64::MAX))),
        near.clone().prop_map(|k| (json!(k as f64), Some(k))),
        Just((json!(1e11), Some(100_000_000_000))),
        Just((json!(1e300), Some(u64::MAX))),
        Just((json!(2.5), None)),
        Just((json!(-3), None)),
        near.prop_map(|k| (json!(format!(" {k} ")), Some(k))),
        Just((json!("100000000000"), Some(100_000_000_000))),
        Just((json!("1e11"), Some(100_000_000_000))),
        Just((json!("123456789012345678901234567890"), Some(u64::MAX))),
        Just((json!("many"), None)),
        Just((Value::Null, None)),
        any::<bool>().prop_map(|b| (json!(b), None)),
    ]
}

/// A prompt field and the batch items it makes (`None`: one prompt).
fn prompt() -> impl Strategy<Value = (Value, Option<u64>)> {
    let len = 0..=LIMIT + 2;
    prop_oneof![
        Just((json!("one prompt"), None)),
        prop::collection::vec(0u32..50_000, 1..6).prop_map(|ids| (json!(ids), None)),
        len.clone()
            .prop_map(|n| (json!(vec!["p"; n]), Some(n as u64))),
        len.prop_map(|n| (json!(vec![vec![1, 2]; n]), Some(n as u64))),
    ]
}

/// A body with every count field possibly set, and whether a count is over [`LIMIT`] on
/// `ep` (worked out from what was generated, not from the gateway's reading of it).
#[derive(Debug, Clone)]
struct Counted {
    ep: Endpoint,
    body: Vec<u8>,
    over: bool,
}

fn counted() -> impl Strategy<Value = Counted> {
    (
        prop::sample::select(ENDPOINTS.to_vec()),
        prompt(),
        prop::option::of(count()),
        prop::option::of(prop_oneof![
            count().prop_map(|(v, c)| (json!({"n": v, "temperature": 0}), None, c)),
            prop::collection::vec(count(), 0..=LIMIT + 2).prop_map(|cs| {
                let n = cs.iter().filter_map(|c| c.1).max();
                let items = cs.len() as u64;
                let list: Vec<Value> = cs.into_iter().map(|(v, _)| json!({"n": v})).collect();
                (json!(list), Some(items), n)
            }),
        ]),
        prop::option::of(count()),
        prop::option::of(count()),
        prop::option::of(prop_oneof![
            count().prop_map(|(v, c)| (v, c)),
            prop::collection::vec(count(), 0..4).prop_map(|cs| {
                let max = cs.iter().filter_map(|c| c.1).max();
                (json!(cs.into_iter().map(|c| c.0).collect::<Vec<_>>()), max)
            }),
        ]),
        any::<bool>(),
    )
        .prop_map(
            |(ep, (prompt, items), n, sampling, top, logprobs, top_num, bootstrap)| {
                let mut body =
                    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
                let field = match ep {
                    Endpoint::Generate => "text",
                    _ => "prompt",
                };
                body[field] = prompt;
                let mut counts: Vec<u64> = Vec::new();
                let items = match ep {
                    Endpoint::ChatCompletions => 1,
                    _ => items.unwrap_or(1),
                };
                counts.push(items);
                let mut samples = 1;
                if let Some((v, c)) = n {
                    body["n"] = v;
                    if ep != Endpoint::Generate {
                        samples = c.unwrap_or(1);
                    }
                }
                if let Some((v, list, c)) = sampling {
                    body["sampling_params"] = v;
                    counts.extend(list);
                    if ep == Endpoint::Generate {
                        samples = c.unwrap_or(1);
                    }
                }
                counts.extend([samples, items.saturating_mul(samples)]);
                for (k, v) in [
                    ("top_logprobs", top),
                    ("logprobs", logprobs),
                    ("top_logprobs_num", top_num),
                ] {
                    if let Some((v, c)) = v {
                        body[k] = v;
                        counts.extend(c);
                    }
                }
                if bootstrap {
                    body["bootstrap_room"] = json!([1, 2]);
                    body["bootstrap_host"] = Value::Null;
                }
                Counted {
                    ep,
                    over: counts.iter().any(|&c| c > LIMIT as u64),
                    body: serde_json::to_vec(&body).unwrap(),
                }
            },
        )
}

/// Allocation bound for work on `len` body bytes: proportional to the body, plus the rooms
/// and spliced fields of at most [`LIMIT`] items, plus a constant.
fn bound(len: usize, per_byte: u64) -> u64 {
    per_byte * len as u64 + LIMIT as u64 * 128 + 16 * 1024
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any bytes, JSON or not: an answer (fields or a 400), never a panic, and inspection
    /// allocates at most about the body's size (escaped strings, an error message).
    fn inspection_of_anything_is_bounded(
        body in prop_oneof![prop::collection::vec(any::<u8>(), 0..512), jsonish()],
        ep in prop::sample::select(ENDPOINTS.to_vec()),
    ) {
        let (r, bytes) = measured(|| inspect(ep, &body, LIMIT));
        if let Err(status) = r {
            prop_assert_eq!(status, 400);
        }
        prop_assert!(bytes <= bound(body.len(), 2), "{} bytes for a {}-byte body", bytes, body.len());
    }

    /// Every count, however written, is checked: a body with one over the limit is 400
    /// (in both modes), one without passes, and the PD path mints rooms only within it.
    fn every_count_is_held_to_the_limit(c in counted()) {
        let (regular, bytes) = measured(|| inspect(c.ep, &c.body, LIMIT));
        prop_assert!(bytes <= bound(c.body.len(), 2), "inspection: {} bytes", bytes);
        let (pd, bytes) = measured(|| pd_rewrite(c.ep, &c.body, LIMIT));
        prop_assert!(bytes <= bound(c.body.len(), 4), "PD rewrite: {} bytes for {}", bytes, c.body.len());
        if c.over {
            prop_assert_eq!(regular, Err(400), "{}", String::from_utf8_lossy(&c.body));
            prop_assert_eq!(pd.err(), Some(400));
        } else {
            prop_assert_eq!(regular, Ok(()), "{}", String::from_utf8_lossy(&c.body));
            let out = pd.map_err(|s| TestCaseError::fail(format!("PD refused with {s}")))?;
            let v: Value = serde_json::from_slice(&out).expect("the rewritten body is JSON");
            prop_assert_eq!(v["bootstrap_host"].is_string(), !v["bootstrap_room"].is_array());
        }
    }

    /// The PD rewrite of any JSON-ish body: valid JSON in, valid JSON out with the fields;
    /// anything else refused; never a panic, never more than a few times the body.
    fn the_pd_rewrite_of_anything_is_bounded(
        body in jsonish(),
        ep in prop::sample::select(ENDPOINTS.to_vec()),
    ) {
        let (r, bytes) = measured(|| pd_rewrite(ep, &body, LIMIT));
        prop_assert!(bytes <= bound(body.len(), 4), "{} bytes for a {}-byte body", bytes, body.len());
        match r {
            // The client's bytes go through as they are: a body strict JSON parsers refuse
            // but the skipping inspection reads (a lone surrogate escape, which Python's
            // json accepts) stays so; a strict one stays strict.
            Ok(out) if serde_json::from_slice::<Value>(&body).is_ok() => {
                let v: Value = serde_json::from_slice(&out).expect("JSON after the rewrite");
                prop_assert!(v.get("bootstrap_room").is_some());
            }
            Ok(out) => prop_assert!(out.len() > body.len()),
            Err(status) => prop_assert_eq!(status, 400),
        }
    }
}

/// A `/generate` answer (or a completions answer) with prompt logprobs, possibly mangled.
fn answer(kind: MergeKind) -> impl Strategy<Value = Vec<u8>> {
    let entries = || prop::collection::vec(json_value(), 0..12);
    let whole = match kind {
        MergeKind::CompletionEcho => prop::collection::vec((0u64..4, entries(), entries()), 0..4)
            .prop_map(|cs| {
                let choices: Vec<Value> = cs
                    .into_iter()
                    .map(|(i, t, l)| {
                        json!({"index": i, "text": "x", "logprobs": {
                    "tokens": t, "token_logprobs": l, "top_logprobs": [], "text_offset": [0]}})
                    })
                    .collect();
                json!({"choices": choices})
            })
            .boxed(),
        _ => prop::collection::vec((entries(), entries()), 1..4)
            .prop_map(|outs| {
                let list: Vec<Value> = outs
                    .into_iter()
                    .map(|(a, b)| {
                        json!({"text": "t", "meta_info": {
                        "input_token_logprobs": a, "input_top_logprobs": b, "id": "x"}})
                    })
                    .collect();
                if list.len() == 1 {
                    list[0].clone()
                } else {
                    json!(list)
                }
            })
            .boxed(),
    };
    (whole, prop_oneof![Just(None), jsonish().prop_map(Some)])
        .prop_map(|(v, junk)| junk.unwrap_or_else(|| serde_json::to_vec(&v).unwrap()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The logprob merge of any prefill and decode answers: valid JSON out when it changes
    /// anything, never a panic, memory a small multiple of the two answers.
    fn the_logprob_merge_is_bounded(
        (kind, prefill, decode) in prop::sample::select(vec![MergeKind::MetaInfo, MergeKind::CompletionEcho])
            .prop_flat_map(|k| (Just(k), answer(k), answer(k))),
        stream in any::<bool>(),
    ) {
        let len = prefill.len() + decode.len();
        let (merged, bytes) = measured(|| {
            let body = if stream {
                let mut s = b"data: ".to_vec();
                s.extend_from_slice(&prefill);
                s.extend_from_slice(b"\n\ndata: [DONE]\n\n");
                Bytes::from(s)
            } else {
                Bytes::from(prefill.clone())
            };
            let mut m = PrefillLogprobs::from_body(kind, body, stream);
            if stream { m.merge_event(&decode) } else { m.merge_whole(&decode) }
        });
        prop_assert!(bytes <= bound(len, 16), "{} bytes for {} bytes of answers", bytes, len);
        let strict = |b: &[u8]| serde_json::from_slice::<Value>(b).is_ok();
        if let Some(out) = merged.filter(|_| strict(&prefill) && strict(&decode)) {
            prop_assert!(serde_json::from_slice::<Value>(&out).is_ok(), "{}", String::from_utf8_lossy(&out));
        }
    }
}

/// Every property, one after the other (see the crate doc).
#[test]
fn nothing_a_client_sends_allocates_beyond_a_bound() {
    huge_counts_at_the_default_limit_allocate_nothing_for_them();
    inspection_of_anything_is_bounded();
    every_count_is_held_to_the_limit();
    the_pd_rewrite_of_anything_is_bounded();
    the_logprob_merge_is_bounded();
}

/// The reported crash, and batches of a million items, at the default limit: refused
/// before anything is sized by them.
fn huge_counts_at_the_default_limit_allocate_nothing_for_them() {
    let limit = gateway::config::ServeConfig::default().max_batch_size;
    let million = serde_json::to_vec(&json!({"text": vec![""; 1_000_000]})).unwrap();
    let ids = serde_json::to_vec(&json!({"input_ids": vec![[1]; 1_000_000]})).unwrap();
    let cases: [(Endpoint, &[u8]); 5] = [
        (
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"n":100000000000}"#,
        ),
        (
            Endpoint::Completions,
            br#"{"prompt":"x","n":1e11,"logprobs":5}"#,
        ),
        (
            Endpoint::Generate,
            br#"{"text":"x","sampling_params":{"n":"100000000000"}}"#,
        ),
        (Endpoint::Generate, &million),
        (Endpoint::Generate, &ids),
    ];
    for (ep, body) in cases {
        for pd in [false, true] {
            let (r, bytes) = measured(|| match pd {
                true => pd_rewrite(ep, body, limit).map(|_| ()),
                false => inspect(ep, body, limit),
            });
            assert_eq!(r, Err(400), "{ep:?} pd={pd}");
            assert!(bytes < 4096, "{ep:?} pd={pd}: {bytes} bytes allocated");
        }
    }
}
