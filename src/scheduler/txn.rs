//! The changes of one firing transaction, applied to RocksDB only after it commits: the timers
//! it changed (each written once, at its end), the input positions it consumed, the runs it
//! fired, and each changed partition's progress once it commits (`progress`).

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::BaseRecord;

use super::lane::h;
use super::producer::TxnProducer;
use super::progress::{FiredThrough, Progress};
use super::restore::SEQ_HEADER;
use super::store::{encode_timer, Batch, Store, StoreError};
use super::SchedulerError;
use crate::model::records::TimerState;
use crate::telemetry::LagTally;

pub struct Txn {
    pub batch: Batch,
    /// Timers this transaction changed, by (partition, job). Written to `timers` and the
    /// store once each, by `write_timers`, at the end of the transaction.
    changed: HashMap<(i32, String), Change>,
    /// Next offset to commit per (topic, partition) consumed.
    pub positions: BTreeMap<(String, i32), i64>,
    /// Partitions this transaction fired in.
    pub fired_partitions: BTreeSet<i32>,
    /// Per partition changed, its progress once this transaction commits (set by `settle`).
    pub progress: BTreeMap<i32, Progress>,
    pub runs: u64,
    /// The fired runs' lags at the transaction's start, for the fire-lag histogram.
    pub lags: LagTally,
    /// Timer states written to `timers` (the rest of `changed` the progress records).
    pub timers_sent: usize,
}

/// One timer a transaction changed.
struct Change {
    /// As it stands (`None`: deleted).
    state: Option<TimerState>,
    /// Its wake instant in the store before this transaction.
    stored_wake: Option<i64>,
    /// Changed only by plain fires (`fire::fired_plainly`): not written to `timers` when
    /// the partition's progress records them.
    plain: bool,
}

impl Txn {
    pub fn new(batch: Batch) -> Txn {
        Txn {
            batch,
            changed: HashMap::new(),
            positions: BTreeMap::new(),
            fired_partitions: BTreeSet::new(),
            progress: BTreeMap::new(),
            runs: 0,
            lags: LagTally::default(),
            timers_sent: 0,
        }
    }

    /// Records the new state of a timer (`None`: deleted) that stood at `old_wake`.
    pub fn change(
        &mut self,
        p: i32,
        job: &str,
        state: Option<TimerState>,
        old_wake: Option<i64>,
        plain: bool,
    ) {
        use std::collections::hash_map::Entry;
        match self.changed.entry((p, job.to_owned())) {
            Entry::Occupied(mut e) => {
                let c = e.get_mut();
                c.state = state;
                c.plain &= plain;
            }
            Entry::Vacant(e) => {
                e.insert(Change {
                    state,
                    stored_wake: old_wake,
                    plain,
                });
            }
        }
    }

    /// A timer as this transaction sees it: as it changed it, or as stored.
    pub fn load(&self, store: &Store, p: i32, job: &str) -> Result<Option<TimerState>, StoreError> {
        if let Some(c) = self.changed.get(&(p, job.to_owned())) {
            return Ok(c.state.clone());
        }
        store.timer(p as u16, job)
    }

    /// The jobs this transaction changed.
    pub fn changed_jobs(&self) -> impl Iterator<Item = &str> {
        self.changed.keys().map(|(_, job)| job.as_str())
    }

    /// Sets the progress of each partition this transaction fired in or changed, as of its
    /// commit at `now`, from `committed` (each partition's progress as of the last commit):
    /// the next sequence, and "fired through `now`" (with the store's lookahead) when every
    /// timer of the partition is indexed later than `now` once this commits (those it changes,
    /// and the first of the others in the index), and that mark fires at least as far as the
    /// previous one (`FiredThrough::covers`).
    pub fn settle(
        &mut self,
        store: &Store,
        committed: &HashMap<i32, Progress>,
        now: i64,
    ) -> Result<(), StoreError> {
        // Per partition: the jobs changed, and whether all of them wake later than `now`.
        let mut by_partition: BTreeMap<i32, (HashSet<&str>, bool)> = (self.fired_partitions)
            .iter()
            .map(|p| (*p, (HashSet::new(), true)))
            .collect();
        for ((p, job), c) in &self.changed {
            let (jobs, later) = by_partition.entry(*p).or_insert((HashSet::new(), true));
            jobs.insert(job.as_str());
            *later &= (c.state.as_ref())
                .and_then(|s| store.wake(s))
                .is_none_or(|w| w > now);
        }
        for (p, (jobs, changed_later)) in &by_partition {
            let old = committed.get(p).copied().unwrap_or_default();
            let seq = old.seq + 1;
            let mark = FiredThrough {
                through_ms: now,
                seq,
                ahead_ms: store.lookahead().ms,
            };
            let fired = *changed_later
                && old.fired.is_none_or(|f| mark.covers(&f))
                && (store.first_wake(*p as u16, |job| jobs.contains(job))?).is_none_or(|w| w > now);
            let fired = match fired {
                true => Some(mark),
                false => old.fired,
            };
            self.progress.insert(*p, Progress { seq, fired });
        }
        Ok(())
    }

    /// Writes the timers this transaction changed, once each, to its store batch and, unless
    /// they were only fired plainly in a partition whose progress (`settle`, called first)
    /// now records the fire, to `timers` through `producer`.
    pub fn write_timers(
        &mut self,
        store: &Store,
        producer: &TxnProducer,
        timers: &str,
    ) -> Result<(), SchedulerError> {
        // In key order: RocksDB inserts a batch into its memtables in the batch's order, and a
        // skip-list insert next to the previous one is cheap, where a random one searches the
        // whole list (the fair order scatters a herd over every partition).
        let mut changed: Vec<_> = self.changed.iter().collect();
        changed.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for ((p, job), c) in changed {
            let progress = self.progress[p];
            let Some(state) = &c.state else {
                self.batch
                    .delete_timer(store, *p as u16, job, c.stored_wake);
                continue;
            };
            let bytes = encode_timer(state);
            if !recorded(c.plain, progress) {
                let seq = progress.seq.to_string();
                let record = BaseRecord::to(timers)
                    .partition(*p)
                    .key(job.as_bytes())
                    .payload(&bytes)
                    .headers(OwnedHeaders::new().insert(h(SEQ_HEADER, seq.as_bytes())));
                producer.send(record).map_err(|(e, _)| e)?;
                self.timers_sent += 1;
            }
            let wake = store.wake(state);
            (self.batch).put_timer(
                store,
                *p as u16,
                state,
                &bytes,
                progress.seq,
                c.stored_wake,
                wake,
            );
        }
        Ok(())
    }
}

/// Whether a changed timer's new state is recorded by its partition's `progress` alone, so it
/// need not be written to `timers`: it was changed only by plain fires, and the progress
/// records "fired through" as of this very transaction.
fn recorded(plain: bool, progress: Progress) -> bool {
    plain && progress.fired.is_some_and(|f| f.seq == progress.seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::store::testing::{self, timer};

    fn stored(store: &Store, p: u16, job: &str, wake: i64) {
        testing::put(store, p, [timer(job, "t", wake)]);
    }

    fn committed(p: i32, seq: u64, through: Option<i64>) -> HashMap<i32, Progress> {
        let mut m = HashMap::new();
        let fired = through.map(|through_ms| FiredThrough {
            through_ms,
            seq,
            ahead_ms: 0,
        });
        m.insert(p, Progress { seq, fired });
        m
    }

    #[test]
    fn a_partition_whose_timers_all_wake_later_records_fired_through_now() {
        let (_dir, store) = testing::store();
        stored(&store, 3, "a", 1_000);
        stored(&store, 3, "b", 9_000);
        let mut txn = Txn::new(store.batch());
        // "a" fired plainly and moved on to 2,000; "b" is not due.
        txn.fired_partitions.insert(3);
        txn.change(3, "a", Some(timer("a", "t", 2_000)), Some(1_000), true);
        txn.settle(&store, &committed(3, 7, Some(500)), 1_000)
            .unwrap();
        let fired = Some(FiredThrough {
            through_ms: 1_000,
            seq: 8,
            ahead_ms: 0,
        });
        assert_eq!(txn.progress[&3], Progress { seq: 8, fired });
        assert!(recorded(true, txn.progress[&3]));
    }

    #[test]
    fn a_timer_still_due_keeps_the_old_progress_and_every_change_is_written() {
        let (_dir, store) = testing::store();
        stored(&store, 3, "a", 1_000);
        stored(&store, 3, "b", 1_000);
        let mut txn = Txn::new(store.batch());
        // "a" fired, "b" (due too) is left for the next chunk.
        txn.fired_partitions.insert(3);
        txn.change(3, "a", Some(timer("a", "t", 2_000)), Some(1_000), true);
        let before = committed(3, 7, Some(500));
        txn.settle(&store, &before, 1_000).unwrap();
        assert_eq!(
            txn.progress[&3],
            Progress {
                seq: 8,
                fired: before[&3].fired
            }
        );
        assert!(
            !recorded(true, txn.progress[&3]),
            "a must be written to timers"
        );
    }

    #[test]
    fn a_changed_timer_due_again_keeps_the_old_progress() {
        let (_dir, store) = testing::store();
        stored(&store, 3, "a", 1_000);
        let mut txn = Txn::new(store.batch());
        // A retry of "a" is due at once: the partition is not fired through.
        txn.change(3, "a", Some(timer("a", "t", 1_000)), Some(1_000), false);
        txn.settle(&store, &HashMap::new(), 1_000).unwrap();
        assert_eq!(
            txn.progress[&3],
            Progress {
                seq: 1,
                fired: None
            }
        );
    }

    #[test]
    fn a_mark_that_would_fire_less_far_than_the_last_one_is_not_made() {
        // The last owner fired with a lookahead of 5 s; this node, without one, fires
        // at 3 s: its mark would say "through 3 s" for jobs fired through 7 s.
        let (_dir, store) = testing::store();
        stored(&store, 3, "a", 9_000);
        let mut txn = Txn::new(store.batch());
        txn.fired_partitions.insert(3);
        txn.change(3, "a", Some(timer("a", "t", 9_000)), Some(9_000), false);
        let mut before = committed(3, 7, Some(2_000));
        before.get_mut(&3).unwrap().fired.as_mut().unwrap().ahead_ms = 5_000;
        txn.settle(&store, &before, 3_000).unwrap();
        assert_eq!(txn.progress[&3].fired, before[&3].fired);
        assert_eq!(txn.progress[&3].seq, 8);
        // Once its own mark fires as far, it is made.
        let mut txn = Txn::new(store.batch());
        txn.fired_partitions.insert(3);
        txn.settle(&store, &before, 7_000).unwrap();
        let fired = txn.progress[&3].fired.unwrap();
        assert_eq!((fired.through_ms, fired.seq, fired.ahead_ms), (7_000, 8, 0));
    }

    #[test]
    fn a_timer_changed_twice_is_one_change_and_plain_only_if_both_were() {
        let (_dir, store) = testing::store();
        stored(&store, 3, "a", 1_000);
        let mut txn = Txn::new(store.batch());
        txn.change(3, "a", Some(timer("a", "t", 2_000)), Some(1_000), true);
        txn.change(3, "a", Some(timer("a", "t", 3_000)), Some(2_000), false);
        assert_eq!(txn.changed_jobs().collect::<Vec<_>>(), ["a"]);
        let c = &txn.changed[&(3, "a".to_owned())];
        assert_eq!((c.stored_wake, c.plain), (Some(1_000), false));
        let seen = txn.load(&store, 3, "a").unwrap().unwrap();
        assert_eq!(seen.next_fire_ms, Some(3_000));
    }
}
