//! An owner stops its disk tier (Mooncake's `unmount_local_disk_segment`): the segment
//! keeps serving its memory, and the master forgets the disk below it.

use std::sync::Arc;

use super::super::journal::{Change, Record, SegmentRecord};
use super::super::object::TierState;
use super::super::{ClientId, Master, MasterResult};

impl Master {
    /// The owner of `segment` stopped its disk tier: the segment takes no more offloads or
    /// write-through copies; values that lived only on that disk are gone (reads miss);
    /// memory copies of values on it are plain memory again. Tasks already handed out
    /// end as tasks that time out do (an offload leaves its value in memory, a load is a
    /// miss), so memory they may still touch is reused only after the task timeout. On a
    /// journaled master the segment's mount record is written again without its disk, so
    /// a new leader does not attach it again. Answers the objects dropped; a segment
    /// without a disk answers 0.
    pub fn detach_disk(&self, client: ClientId, segment: &str) -> MasterResult<u64> {
        let seg = self.owned_segment(client, segment)?;
        if seg.disk_bytes() == 0 {
            return Ok(0);
        }
        seg.detach_disk();
        self.tiers.queues.lock().remove(seg.name());
        self.tiers.room_wanted.lock().remove(seg.name());
        let mut dropped = 0u64;
        for s in 0..self.shards.len() {
            let mut shard = self.lock_shard(s);
            let here: Vec<u32> = shard
                .indices()
                .filter(|&i| {
                    let o = shard.get(i);
                    (o.is_on_disk() || o.has_disk_copy())
                        && o.replicas
                            .as_slice()
                            .iter()
                            .any(|r| Arc::ptr_eq(&r.segment, &seg))
                })
                .collect();
            for i in here {
                let o = shard.get(i);
                if o.is_on_disk() {
                    let hash = self.hash_bytes(o.key.as_bytes());
                    shard.remove(hash, i);
                    dropped += 1;
                } else if Self::disk_replica(o).is_none() {
                    // Its record was on this disk (not on another replica's).
                    shard.get_mut(i).set_tier(TierState::Memory);
                }
            }
        }
        if self.journal.is_some() {
            let record = Record::Mount(SegmentRecord {
                client,
                mount: seg.mount_id(),
                spec: seg.spec(),
            });
            self.journal_append(vec![Change::record(record)]);
        }
        tracing::info!(segment, dropped, "the owner detached its disk tier");
        Ok(dropped)
    }
}
