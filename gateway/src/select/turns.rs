//! `round_robin`'s turns without a pass over the fleet: the candidates' positions in the
//! worker set, kept between requests.
//!
//! A turn takes the `turn`-th kept position, after checking that its worker still takes
//! the request. The list is made again:
//! - when the set or what is asked (role, model) is not the one it was made for;
//! - when any worker's state changed ([`crate::workers::state_epoch`]: status, model,
//!   draining, breaker), so a worker that came back takes its turns at once;
//! - when the worker at the turn no longer takes requests (then the turn is taken from the
//!   new list);
//! - once a cycle (as many turns as candidates, at least [`REFRESH_EVERY`]): a breaker
//!   whose open period ran out changes no epoch, and a worker waits a cycle for its turn
//!   anyway.
//!
//! The candidates are cycled in order, each once a cycle, as a count of them would (the
//! exact path in `super::Policy::pick`). At 10,000 workers a turn costs a list lookup,
//! not a pass over every worker's state; the pass comes once a cycle.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use openapi::workers::WorkerType;

use super::Want;
use crate::workers::{Worker, registry::WorkerSet};

/// The fewest turns between two refreshes of the list that no state change asked for.
pub const REFRESH_EVERY: usize = 64;

/// The candidates of one set for one role and model.
#[derive(Debug)]
struct List {
    /// The set's address and length (a set is replaced whole when a worker comes or goes).
    set: (usize, usize),
    worker_type: WorkerType,
    model: Option<String>,
    /// The workers' state epoch it was made at.
    epoch: u64,
    /// The turn it was made at.
    turn: usize,
    /// Positions in the set of the workers that took requests when it was made.
    at: Vec<u32>,
}

impl List {
    fn make(set: &WorkerSet, want: &Want<'_>, turn: usize) -> Self {
        Self {
            set: (set.as_ptr() as usize, set.len()),
            worker_type: want.worker_type,
            model: want.model.map(str::to_owned),
            // Read before the workers: a change while they are read makes the next one.
            epoch: crate::workers::state_epoch(),
            turn,
            at: (0..set.len())
                .filter(|&i| want.admits(&set[i]))
                .map(|i| i as u32)
                .collect(),
        }
    }

    fn fits(&self, set: &WorkerSet, want: &Want<'_>, turn: usize) -> bool {
        self.set == (set.as_ptr() as usize, set.len())
            && self.worker_type == want.worker_type
            && self.model.as_deref() == want.model
            && self.epoch == crate::workers::state_epoch()
            && turn.wrapping_sub(self.turn) < self.at.len().max(REFRESH_EVERY)
    }
}

/// The kept list of one policy.
#[derive(Debug, Default)]
pub struct Turns {
    list: ArcSwapOption<List>,
}

impl Turns {
    /// The worker whose turn `turn` is, if the list has candidates; `None` also for a
    /// request that excludes workers (a retry: the exact path counts without them).
    pub fn pick<'s>(
        &self,
        set: &'s WorkerSet,
        want: &Want<'_>,
        turn: usize,
    ) -> Option<&'s Arc<Worker>> {
        if !want.exclude.is_empty() || set.is_empty() {
            return None;
        }
        let kept = self.list.load_full();
        let list = match kept {
            Some(l) if l.fits(set, want, turn) => l,
            _ => self.refresh(set, want, turn),
        };
        let at = |l: &List| {
            l.at.get(turn % l.at.len().max(1))
                .map(|&i| &set[i as usize])
        };
        match at(&list) {
            Some(w) if want.admits(w) => Some(w),
            Some(_) => at(&self.refresh(set, want, turn)),
            None => None,
        }
    }

    fn refresh(&self, set: &WorkerSet, want: &Want<'_>, turn: usize) -> Arc<List> {
        let list = Arc::new(List::make(set, want, turn));
        self.list.store(Some(list.clone()));
        list
    }
}

#[cfg(test)]
mod tests {
    use openapi::workers::WorkerStatus;

    use super::*;
    use crate::select::affinity::Affinity;
    use crate::workers::testing::ready_workers;

    fn want() -> Want<'static> {
        Want {
            worker_type: WorkerType::Regular,
            model: Some("m"),
            exclude: &[],
            key: None,
            affinity: Affinity::default(),
        }
    }

    /// Set positions of the workers `turns` picks for turns `from..to`.
    fn picks(turns: &Turns, set: &WorkerSet, from: usize, to: usize) -> Vec<usize> {
        (from..to)
            .map(|t| {
                let w = turns.pick(set, &want(), t).expect("a candidate");
                set.iter().position(|x| Arc::ptr_eq(x, w)).unwrap()
            })
            .collect()
    }

    #[test]
    fn turns_cycle_in_order_and_skip_a_worker_that_went_down_at_once() {
        let set = ready_workers(4);
        let turns = Turns::default();
        assert_eq!(picks(&turns, &set, 0, 8), [0, 1, 2, 3, 0, 1, 2, 3]);
        set[2].set_status(WorkerStatus::NotReady);
        // The next turn sees the changed epoch: the turn counts over the three left
        // (8 % 3 = 2), as a count of the candidates would.
        assert_eq!(picks(&turns, &set, 8, 14), [3, 0, 1, 3, 0, 1]);
    }

    #[test]
    fn a_worker_back_takes_turns_at_once_and_a_new_set_is_used_at_once() {
        let set = ready_workers(3);
        set[1].set_status(WorkerStatus::NotReady);
        let turns = Turns::default();
        assert_eq!(picks(&turns, &set, 0, 4), [0, 2, 0, 2]);
        set[1].set_status(WorkerStatus::Ready);
        // Turn 4 sees the changed epoch: all three, 4 % 3 = 1 first.
        assert_eq!(picks(&turns, &set, 4, 10), [1, 2, 0, 1, 2, 0]);
        // A registration replaces the set: its list is made for it.
        let bigger = ready_workers(5);
        assert_eq!(picks(&turns, &bigger, 100, 105), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_retry_that_excludes_workers_takes_the_exact_path() {
        let set = ready_workers(2);
        let failed = [set[0].clone()];
        let retry = Want {
            exclude: &failed,
            ..want()
        };
        assert!(Turns::default().pick(&set, &retry, 0).is_none());
    }
}
