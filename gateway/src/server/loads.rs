//! The load poll behind `least_load`: every `--load-poll-interval-secs` each available
//! worker's `/v1/loads` is read ([`super::fanout`]'s bounded fan-out, within
//! `--health-check-timeout-secs`) and kept on the worker ([`Worker::set_reported`]): its
//! ranks' used tokens, waiting requests and generation throughput summed, its KV usage the
//! fullest rank's. With `--dp-aware` each rank's entry keeps its own rank's line, and a
//! worker is asked once for all of its ranks. A worker that does not answer keeps its last report, which goes stale
//! (see [`crate::select::least_load`]). Runs only while some policy is `least_load`
//! (`AppState::spawn_load_poll`).

use bytes::Bytes;
use futures::StreamExt;
use http::Method;
use openapi::sglang::server::Loads;
use tokio::time::Instant;

use super::AppState;
use super::fanout::{LOAD_LIMIT, asking};
use crate::workers::{ReportedLoad, Worker};

/// A worker's `/v1/loads` answer as the policy reads it: every rank's lines, or only
/// `rank`'s (an entry of `--dp-aware`).
pub fn reported(loads: &Loads, rank: Option<u32>, at: Instant) -> ReportedLoad {
    let ranks: Vec<_> = loads
        .loads
        .iter()
        .filter(|l| rank.is_none_or(|r| l.dp_rank == r))
        .collect();
    ReportedLoad {
        at,
        used_tokens: ranks.iter().map(|r| r.num_used_tokens).sum(),
        waiting_reqs: ranks.iter().map(|r| r.num_waiting_reqs).sum(),
        gen_throughput: ranks.iter().map(|r| r.gen_throughput).sum(),
        token_usage: ranks.iter().map(|r| r.token_usage).fold(0.0, f64::max),
    }
}

/// One poll of every available worker.
pub async fn poll_once(st: &AppState) {
    let snapshot = st.registry().list();
    let workers = st.registry().one_per_url_where(Worker::is_available);
    let mut answers = asking(
        st,
        &workers,
        Method::GET,
        "/v1/loads",
        Bytes::new(),
        LOAD_LIMIT,
    )
    .enumerate();
    while let Some((i, answer)) = answers.next().await {
        let parsed = match answer {
            Ok((s, body)) if s.is_success() => serde_json::from_slice::<Loads>(&body).ok(),
            _ => None,
        };
        match parsed {
            Some(l) => {
                let at = Instant::now();
                for w in snapshot.iter().filter(|w| w.url() == workers[i].url()) {
                    w.set_reported(reported(&l, w.dp_rank().map(|d| d.rank), at));
                }
            }
            None => tracing::debug!(worker = workers[i].url().as_str(), "no /v1/loads answer"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openapi::sglang::server::RankLoad;

    #[test]
    fn a_rank_entry_reads_its_own_line() {
        let line = |dp_rank, used, waiting, usage| RankLoad {
            dp_rank,
            num_used_tokens: used,
            num_waiting_reqs: waiting,
            token_usage: usage,
            gen_throughput: 10.0,
            ..RankLoad::default()
        };
        let loads = Loads {
            loads: vec![line(0, 100, 1, 0.1), line(1, 700, 5, 0.7)],
            ..Loads::default()
        };
        let at = Instant::now();
        let all = reported(&loads, None, at);
        assert_eq!((all.used_tokens, all.waiting_reqs), (800, 6));
        assert_eq!((all.token_usage, all.gen_throughput), (0.7, 20.0));
        let one = reported(&loads, Some(0), at);
        assert_eq!((one.used_tokens, one.waiting_reqs), (100, 1));
        assert_eq!((one.token_usage, one.gen_throughput), (0.1, 10.0));
        let none = reported(&loads, Some(5), at);
        assert_eq!(none.used_tokens, 0);
    }
}
