//! Clearing replicas (Mooncake's `BatchReplicaClear`): a client drops the replicas of its
//! own objects, on one segment or all of them, without touching anything read-leased or
//! unfinished.

use super::journal::{Change, Record};
use super::object::{Replica, Replicas};
use super::{ClientId, Master, MasterError, MasterResult};

impl Master {
    /// Clears the replicas `client`'s objects `keys` have on the segment named `segment`
    /// (every replica when `None`); an object left without one is removed. Skipped, as
    /// Mooncake skips them: keys that are missing, another client's, read-leased or
    /// unfinished, and objects with no replica there. Answers the keys cleared, in order.
    /// On a journaled master an object that keeps replicas is journaled again with the
    /// ones it keeps, and the cleared space is given back once that is committed.
    pub fn replica_clear<K: AsRef<str>>(
        &self,
        client: ClientId,
        keys: &[K],
        segment: Option<&str>,
    ) -> MasterResult<Vec<String>> {
        self.check_batch(keys.len())?;
        if segment.is_some_and(|s| s.len() > self.config.max_name_bytes) {
            return Err(MasterError::InvalidParams(format!(
                "segment name is longer than {} bytes",
                self.config.max_name_bytes
            )));
        }
        let on = |r: &Replica| segment.is_none_or(|s| r.segment.name() == s);
        let now = self.clock.now_ms();
        let mut cleared = Vec::new();
        for k in keys {
            let key = k.as_ref();
            if self.check_key(key).is_err() {
                continue;
            }
            let hash = self.hash(key);
            let mut shard = self.lock_shard(self.shard_of(hash));
            let Some(i) = shard.find(hash, key) else {
                continue;
            };
            let o = shard.get(i);
            let clears = o.client == client
                && o.is_complete()
                && !o.has_lease(now)
                && !o.is_offloading()
                && !o.is_loading()
                && o.replicas.as_slice().iter().any(on);
            if !clears {
                continue;
            }
            if o.replicas.as_slice().iter().all(on) {
                let obj = shard.remove(hash, i);
                self.retire(obj);
            } else {
                let o = shard.get_mut(i);
                let all = std::mem::replace(&mut o.replicas, Replicas::from_vec(Vec::new()));
                let (gone, kept): (Vec<Replica>, Vec<Replica>) =
                    all.into_vec().into_iter().partition(on);
                o.replicas = Replicas::from_vec(kept);
                match &self.journal {
                    Some(journal) if o.is_durable() => {
                        let _ = journal
                            .append(vec![Change::then(Record::Put(o.record()), move |_| {
                                gone.into_iter().for_each(Replica::release)
                            })]);
                    }
                    _ => gone.into_iter().for_each(Replica::release),
                }
            }
            cleared.push(key.to_owned());
        }
        Ok(cleared)
    }
}
