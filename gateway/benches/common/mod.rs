//! What the gateway's benches share: ready workers to select among.

use std::collections::BTreeMap;
use std::sync::Arc;

use gateway::workers::{DEFAULT_PRIORITY, Worker, WorkerSpec, WorkerUrl};
use openapi::workers::{WorkerStatus, WorkerType};
use tokio_util::sync::CancellationToken;

/// `n` ready regular workers serving model `m` (`http://10.0.<i / 250>.<i % 250>:30000`).
pub fn workers(n: usize) -> Vec<Arc<Worker>> {
    (0..n)
        .map(|i| {
            let spec = WorkerSpec {
                url: WorkerUrl::parse(&format!("http://10.0.{}.{}:30000", i / 250, i % 250))
                    .expect("url"),
                worker_type: WorkerType::Regular,
                bootstrap_port: None,
                model_id: Some("m".into()),
                api_key: None,
                labels: BTreeMap::new(),
                priority: DEFAULT_PRIORITY,
            };
            let w = Worker::new(spec, None, CancellationToken::new());
            w.set_status(WorkerStatus::Ready);
            Arc::new(w)
        })
        .collect()
}
