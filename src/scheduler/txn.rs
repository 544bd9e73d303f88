//! The changes of one firing transaction, applied to RocksDB only after it commits: the timers
//! it changed (each written once, at its end), the input positions it consumed, the runs it
//! fired, and each changed partition's progress once it commits (`progress`).

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt, HashSet};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::BaseRecord;

use super::lane::h;
use super::producer::TxnProducer;
use super::progress::{FiredThrough, Progress};
use super::restore::SEQ_HEADER;
use super::store::{encode_timer, Batch, Besides, Store, StoreError};
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
    /// As it stands (`None`: deleted). Boxed: a herd's chunk changes tens of thousands of
    /// timers, and an inline state (about 500 bytes) made each growth of the map copy and
    /// fault in tens of MB.
    state: Option<Box<TimerState>>,
    /// Its wake instant in the store before this transaction.
    stored_wake: Option<i64>,
    /// Changed only by plain fires (`fire::fired_plainly`): not written to `timers` when
    /// the partition's progress records them.
    plain: bool,
}

impl Txn {
    pub fn new(batch: Batch) -> Txn {
        Txn::with_capacity(batch, 0)
    }

    /// A transaction expected to change about `timers` timers (a chunk of due entries).
    pub fn with_capacity(batch: Batch, timers: usize) -> Txn {
        Txn {
            batch,
            changed: HashMap::with_capacity(timers),
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
                c.state = state.map(Box::new);
                c.plain &= plain;
            }
            Entry::Vacant(e) => {
                e.insert(Change {
                    state: state.map(Box::new),
                    stored_wake: old_wake,
                    plain,
                });
            }
        }
    }

    /// A timer as this transaction sees it: as it changed it, or as stored.
    pub fn load(&self, store: &Store, p: i32, job: &str) -> Result<Option<TimerState>, StoreError> {
        match self.changed(p, job) {
            Some(state) => Ok(state),
            None => store.timer(p as u16, job),
        }
    }

    /// A timer as this transaction changed it (`Some(None)`: deleted); `None` when it did not.
    pub fn changed(&self, p: i32, job: &str) -> Option<Option<TimerState>> {
        let c = self.changed.get(&(p, job.to_owned()))?;
        Some(c.state.as_deref().cloned())
    }

    /// The jobs this transaction changed.
    pub fn changed_jobs(&self) -> impl Iterator<Item = &str> {
        self.changed.keys().map(|(_, job)| job.as_str())
    }

    /// Sets the progress of each partition this transaction fired in or changed, as of its
    /// commit at `now`, from `committed` (each partition's progress as of the last commit):
    /// the next sequence, and "fired through `now`" (with the store's lookahead) when every
    /// timer of the partition is indexed later than `now` once this commits (those it changes,
    /// and the others in the index), and that mark fires at least as far as the previous one
    /// (`FiredThrough::covers`). Otherwise, the same mark for each tenant it fired plainly whose
    /// every timer in the partition is indexed later than `now`, as far as the metadata has
    /// room (`Progress::fits`).
    pub fn settle(
        &mut self,
        store: &Store,
        committed: &HashMap<i32, Progress>,
        now: i64,
    ) -> Result<(), StoreError> {
        /// What a transaction changed in one partition.
        #[derive(Default)]
        struct Seen<'a> {
            jobs: HashSet<&'a str>,
            /// Some changed timer is indexed at or before `now`.
            due: bool,
            /// Per tenant of a changed timer: all of its changes indexed later, and whether
            /// one was a plain fire (which a mark saves writing).
            tenants: BTreeMap<&'a str, (bool, bool)>,
        }
        let mut by_partition: BTreeMap<i32, Seen> = (self.fired_partitions.iter())
            .map(|p| (*p, Seen::default()))
            .collect();
        for ((p, job), c) in &self.changed {
            let seen = by_partition.entry(*p).or_default();
            seen.jobs.insert(job.as_str());
            let later = (c.state.as_ref())
                .and_then(|s| store.wake(s))
                .is_none_or(|w| w > now);
            seen.due |= !later;
            if let Some(state) = &c.state {
                let t = (seen.tenants)
                    .entry(state.definition.tenant.as_str())
                    .or_insert((true, false));
                t.0 &= later;
                t.1 |= c.plain;
            }
        }
        for (p, seen) in &by_partition {
            let old = committed.get(p).cloned().unwrap_or_default();
            let seq = old.seq + 1;
            let mark = FiredThrough {
                through_ms: now,
                seq,
                ahead_ms: store.lookahead().ms,
            };
            let mut progress = Progress {
                seq,
                fired: old.fired,
                tenants: old.tenants,
            };
            let wanted: Vec<&str> = (seen.tenants.iter())
                .filter(|(_, (later, plain))| *later && *plain)
                .map(|(t, _)| *t)
                .collect();
            if seen.due && wanted.is_empty() {
                self.progress.insert(*p, progress);
                continue;
            }
            let skip = |job: &str| seen.jobs.contains(job);
            let besides = store.due_besides(*p as u16, now, !wanted.is_empty(), skip)?;
            let covers = progress.fired.is_none_or(|f| mark.covers(&f));
            if !seen.due && covers && besides == Besides::Nothing {
                progress.fired = Some(mark);
                progress.tenants.retain(|(_, f)| !mark.covers(f));
            } else if besides != Besides::Unknown {
                for tenant in wanted {
                    if let Besides::Tenants(due) = &besides {
                        if due.contains(tenant) {
                            continue;
                        }
                    }
                    let room = match progress.tenant(tenant) {
                        Some(f) => mark.covers(f),
                        None => progress.fits(tenant, &mark),
                    };
                    if room {
                        progress.set_tenant(tenant, mark);
                    }
                }
            }
            self.progress.insert(*p, progress);
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
            let progress = &self.progress[p];
            let Some(state) = &c.state else {
                self.batch
                    .delete_timer(store, *p as u16, job, c.stored_wake);
                continue;
            };
            let bytes = encode_timer(state);
            if !recorded(c, progress) {
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
/// records "fired through" as of this very transaction, for the partition or the timer's tenant.
fn recorded(c: &Change, progress: &Progress) -> bool {
    let this = |f: &FiredThrough| f.seq == progress.seq;
    let tenant = (c.state.as_ref()).and_then(|s| progress.tenant(&s.definition.tenant));
    c.plain && (progress.fired.as_ref().is_some_and(this) || tenant.is_some_and(this))
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
        m.insert(
            p,
            Progress {
                seq,
                fired,
                ..Default::default()
            },
        );
        m
    }

    fn change<'a>(txn: &'a Txn, p: i32, job: &str) -> &'a Change {
        &txn.changed[&(p, job.to_owned())]
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
        assert_eq!(
            txn.progress[&3],
            Progress {
                seq: 8,
                fired,
                ..Default::default()
            }
        );
        assert!(recorded(change(&txn, 3, "a"), &txn.progress[&3]));
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
                fired: before[&3].fired,
                ..Default::default()
            }
        );
        assert!(
            !recorded(change(&txn, 3, "a"), &txn.progress[&3]),
            "a must be written to timers"
        );
    }

    #[test]
    fn a_tenant_whose_timers_all_wake_later_gets_its_own_mark_while_another_is_due() {
        let (_dir, store) = testing::store();
        testing::put(&store, 3, [timer("a", "t", 1_000), timer("b", "u", 1_000)]);
        let mut txn = Txn::new(store.batch());
        // "a" (tenant t) fired plainly; "b" (tenant u) is left for the next chunk.
        txn.fired_partitions.insert(3);
        txn.change(3, "a", Some(timer("a", "t", 2_000)), Some(1_000), true);
        let before = committed(3, 7, Some(500));
        txn.settle(&store, &before, 1_000).unwrap();
        let progress = txn.progress[&3].clone();
        assert_eq!((progress.seq, progress.fired), (8, before[&3].fired));
        let mark = FiredThrough {
            through_ms: 1_000,
            seq: 8,
            ahead_ms: 0,
        };
        assert_eq!(progress.tenants, [("t".to_owned(), mark)]);
        assert!(recorded(change(&txn, 3, "a"), &progress));
        // A restore from here advances "a", as stored before, through the tenant's mark.
        let old_a = timer("a", "t", 1_000);
        assert_eq!(progress.advances(7, &old_a), Some(1_000));
        assert_eq!(progress.advances(7, &timer("b", "u", 1_000)), None);

        // Once "b" fires too, the partition's mark is made and covers the tenant's.
        let mut committed = HashMap::new();
        committed.insert(3, progress);
        let mut txn = Txn::new(store.batch());
        txn.fired_partitions.insert(3);
        txn.change(3, "b", Some(timer("b", "u", 2_000)), Some(1_000), true);
        // The first transaction's store batch, as its commit writes it.
        let mut b = store.batch();
        let a = timer("a", "t", 2_000);
        b.put_timer(
            &store,
            3,
            &a,
            &encode_timer(&a),
            8,
            Some(1_000),
            Some(2_000),
        );
        store.write(b).unwrap();
        txn.settle(&store, &committed, 1_200).unwrap();
        let progress = &txn.progress[&3];
        assert_eq!(
            progress.fired.map(|f| (f.through_ms, f.seq)),
            Some((1_200, 9))
        );
        assert!(progress.tenants.is_empty(), "{progress:?}");
        assert!(recorded(change(&txn, 3, "b"), progress));
    }

    #[test]
    fn a_tenant_fired_in_part_gets_no_mark() {
        let (_dir, store) = testing::store();
        let timers = [
            timer("a", "t", 1_000),
            timer("b", "u", 1_000),
            timer("c", "t", 1_000),
        ];
        testing::put(&store, 3, timers);
        let mut txn = Txn::new(store.batch());
        txn.fired_partitions.insert(3);
        txn.change(3, "a", Some(timer("a", "t", 2_000)), Some(1_000), true);
        // "b" is changed by an update, not a fire: no mark spares writing it.
        txn.change(3, "b", Some(timer("b", "u", 2_000)), Some(1_000), false);
        txn.settle(&store, &committed(3, 7, None), 1_000).unwrap();
        let progress = &txn.progress[&3];
        assert_eq!(
            (progress.fired, progress.tenants.len()),
            (None, 0),
            "{progress:?}"
        );
        assert!(!recorded(change(&txn, 3, "a"), progress));
        assert!(!recorded(change(&txn, 3, "b"), progress));
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
                ..Default::default()
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
    fn a_change_is_small_whatever_the_timer_s_size() {
        // A herd's chunk changes tens of thousands of timers: the map's entries hold the
        // state boxed, so its growth copies pointers, not states.
        assert!(std::mem::size_of::<Change>() <= 32);
        assert!(std::mem::size_of::<TimerState>() > 256);
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
