//! Replica placement: distinct segments, the caller's preferred segments first (in order),
//! then spread over the rest starting at a position derived from the key hash, so keys
//! land evenly without a shared cursor or a random number per put. A segment remounted, or
//! restored by a new HA leader, less than `use_within_ms` ago takes nothing yet (see
//! `reserve` and `restore`).

use std::sync::Arc;

use super::object::{Replica, ReplicateConfig};
use super::segment::Segment;
use super::{Master, MasterError, MasterResult};

impl Master {
    /// Whether any mounted segment takes new values now (is not held).
    pub(crate) fn some_segment_takes_values(&self) -> bool {
        let now = self.clock.now_ms();
        self.segments
            .read()
            .list
            .iter()
            .any(|s| s.is_mounted() && s.takes_values(now))
    }

    /// Allocates up to `cfg.replica_num` replicas of `units` units on distinct segments.
    /// Best effort like Mooncake: succeeds with at least one replica.
    pub(crate) fn place(
        &self,
        hash: u64,
        units: u64,
        cfg: &ReplicateConfig,
    ) -> MasterResult<Vec<Replica>> {
        let table = self.segments.read();
        let want = cfg.replica_num as usize;
        let mut out: Vec<Replica> = Vec::with_capacity(want);
        let now = self.clock.now_ms();
        let mut held = false;
        // Takes a replica on `seg` unless it already holds one of this object.
        let mut try_take = |out: &mut Vec<Replica>, seg: &Arc<Segment>| {
            if out.len() >= want || out.iter().any(|r| Arc::ptr_eq(&r.segment, seg)) {
                return;
            }
            if !seg.takes_values(now) {
                held = true;
                return;
            }
            if let Some(alloc) = seg.try_alloc(units) {
                out.push(Replica {
                    segment: seg.clone(),
                    alloc,
                });
            }
        };
        for name in &cfg.preferred_segments {
            if let Some(seg) = table.get(name) {
                try_take(&mut out, seg);
            }
        }
        let n = table.list.len();
        if n > 0 && out.len() < want {
            let start = (hash % n as u64) as usize;
            for k in 0..n {
                if out.len() == want {
                    break;
                }
                try_take(&mut out, &table.list[(start + k) % n]);
            }
        }
        if out.is_empty() {
            let why = if n == 0 {
                "no segment is mounted".to_string()
            } else if held {
                format!(
                    "no segment has {} free bytes but those remounted or restored (by a new \
                     leader) less than {} ms ago, which take no values yet (clients may still \
                     write into space given out under the mount or the leader before)",
                    units << self.align_shift,
                    self.use_within_ms()
                )
            } else {
                format!(
                    "no segment has {} free bytes; consider mounting more segments",
                    units << self.align_shift
                )
            };
            return Err(MasterError::NoAvailableHandle(why));
        }
        Ok(out)
    }
}
