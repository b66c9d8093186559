//! Traces through the store: with traces on, a store client's master calls are client
//! spans carrying their `traceparent`, the hosted master answers each in a server span of
//! the same trace (named by the route, not the key), and the transfer engine's batch is a
//! span with its bytes, peer and transport. Read back from the OTLP export (protobuf)
//! as one tree under the caller's span. Its own process: the tracing subscriber is global.

use std::collections::HashMap;

use gateway::config::{LogLevel, ServeConfig};
use kvclient::{ClientConfig, Protocol, StoreClient};
use moongate_tests::otlp::{Span, attr, spans};
use moongate_tests::{fast_config, otlp_collector, start_gateway};
use tracing::Instrument;

#[test]
fn a_store_clients_calls_the_masters_answers_and_the_batch_form_one_trace() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (url, bodies) = rt.block_on(otlp_collector());
    let traces = gateway::logging::init_with_traces(LogLevel::Warn, Some(&url))
        .unwrap()
        .expect("traces on");
    rt.block_on(async {
        // Short read leases: the value read is evicted to disk soon after.
        let base = fast_config();
        let gw = start_gateway(ServeConfig {
            otlp_traces_endpoint: Some(url.clone()),
            master: kvmaster::MasterConfig {
                lease_ttl_ms: 200,
                ..base.master.clone()
            },
            ..base
        })
        .await;
        // A node holding the values, and a client without memory of its own writing them,
        // over TCP (the engine's batches; same-host shared memory is a plain copy).
        let tcp = |size| ClientConfig {
            protocol: Protocol::Tcp,
            ..ClientConfig::local(&gw.url(), size)
        };
        // The node has a disk tier: a value evicted there is loaded back for a reader.
        let disk = tempfile::tempdir().unwrap();
        let node = StoreClient::connect(ClientConfig {
            disk_path: Some(disk.path().to_owned()),
            ..tcp(1 << 20)
        })
        .await
        .unwrap();
        let writer = StoreClient::connect(tcp(0)).await.unwrap();
        let caller = tracing::trace_span!(target: "kvclient::caller", "caller");
        let master = gw.master().expect("the gateway hosts the master").clone();
        async {
            writer.put("traced/key", &[7u8; 4096]).await.unwrap();
            assert_eq!(writer.get("traced/key").await.unwrap().len(), 4096);
            // Evicted to the node's disk (written there, its memory freed) ...
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while master.held("traced/key") != Some(kvmaster::master::Held::Disk) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "never evicted to disk"
                );
                master.evict(1 << 20, 1 << 20);
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            // ... and read again: the node loads it, in this trace.
            assert_eq!(writer.get("traced/key").await.unwrap().len(), 4096);
        }
        .instrument(caller)
        .await;
        writer.close().await.unwrap();
        node.close().await.unwrap();
        gw.shutdown().await;
    });
    traces.flush();
    let spans: Vec<Span> = spans(&bodies.lock()).into_iter().map(|e| e.span).collect();
    let caller = spans
        .iter()
        .find(|s| s.name == "caller")
        .expect("the caller's span");
    let tree: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == caller.trace_id)
        .collect();
    let by_id: HashMap<&[u8], &Span> = tree.iter().map(|s| (s.span_id.as_slice(), *s)).collect();
    // Every span of the trace leads up to the caller.
    for s in &tree {
        let mut at = *s;
        while at.span_id != caller.span_id {
            at = by_id
                .get(at.parent_span_id.as_slice())
                .unwrap_or_else(|| panic!("{} has a parent outside the trace", at.name));
        }
    }
    let named = |name: &str| tree.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    // Each master call: the client's span, and the master's answer under it.
    for op in ["master_put_start", "master_put_end", "master_get_replicas"] {
        let sent = named(op);
        assert!(sent.len() >= 2, "{op}: {sent:?}");
        let server = sent
            .iter()
            .find(|s| s.kind == 2)
            .unwrap_or_else(|| panic!("{op}: no server span in {sent:?}"));
        let parent = by_id[server.parent_span_id.as_slice()];
        assert_eq!(
            (parent.name.as_str(), parent.kind),
            (op, 3),
            "{op} answered under its call"
        );
        assert_eq!(attr(server, "url.path"), None, "no key in a master span");
    }
    // The node's disk load is in the reader's trace, under the read's call of the master.
    let load = named("disk load");
    let load = load
        .first()
        .expect("the node's disk load in the reader's trace");
    assert_eq!(attr(load, "bytes").as_deref(), Some("4096"));
    assert_eq!(attr(load, "ok").as_deref(), Some("true"));
    let read = by_id[load.parent_span_id.as_slice()];
    assert!(
        read.name.ends_with("get_replicas") && read.kind == 3,
        "{read:?}"
    );
    // The write and the read each moved the value in one batch to or from the node.
    let batches = named("transfer batch");
    assert!(batches.len() >= 2, "{batches:?}");
    for b in batches {
        assert_eq!(attr(b, "bytes").as_deref(), Some("4096"));
        assert!(attr(b, "transport").is_some(), "{b:?}");
        assert!(attr(b, "peer").is_some_and(|p| !p.is_empty()), "{b:?}");
    }
    traces.shutdown();
}
