//! What the node has committed of its partitions: the next offset to read of each owned `jobs`
//! and `control` partition, and each `jobs` partition's firing progress (`progress`), as of the
//! last committed transaction (or the committed offsets fetched when it was assigned).
//!
//! Every transaction commits offsets through the ledger (`offsets`), so each carries the
//! group's fence, and no commit of a `jobs` partition ever drops its progress: an offset
//! committed without metadata would erase it.

use std::collections::BTreeMap;

use foldhash::HashMap;
use rdkafka::{Offset, TopicPartitionList};

use super::progress::Progress;
use super::txn::Txn;
use super::{SchedulerError, Topics};

type Result<T, E = SchedulerError> = std::result::Result<T, E>;

pub struct Ledger {
    topics: Topics,
    /// Next offset to commit per (topic, partition).
    committed: HashMap<(String, i32), i64>,
    /// Per owned `jobs` partition, its firing progress.
    progress: HashMap<i32, Progress>,
}

impl Ledger {
    pub fn new(topics: Topics) -> Ledger {
        Ledger {
            topics,
            committed: HashMap::default(),
            progress: HashMap::default(),
        }
    }

    /// Forgets a partition given up.
    pub fn forget(&mut self, p: i32) {
        self.committed.remove(&(self.topics.jobs.clone(), p));
        self.committed.remove(&(self.topics.control.clone(), p));
        self.progress.remove(&p);
    }

    /// Takes in a committed offset fetched for a newly assigned partition, and for a `jobs`
    /// partition its progress (from the offset's metadata).
    pub fn fetched(&mut self, topic: &str, p: i32, offset: Option<i64>, metadata: Option<&str>) {
        if topic == self.topics.jobs {
            let progress = Progress::decode(metadata.unwrap_or_default());
            tracing::debug!(partition = p, progress = ?progress, "committed progress");
            self.progress.insert(p, progress);
        }
        if let Some(o) = offset {
            self.committed.insert((topic.to_owned(), p), o);
        }
    }

    /// Every owned partition's progress.
    pub fn progress(&self) -> &HashMap<i32, Progress> {
        &self.progress
    }

    /// A partition's progress (the default when none was ever committed).
    pub fn progress_of(&self, p: i32) -> Progress {
        self.progress.get(&p).cloned().unwrap_or_default()
    }

    /// Raises a partition's progress sequence to at least `seq`: a sequence never goes back,
    /// even when the committed progress was lost (offsets reset or expired), so a state written
    /// later never looks older than a mark.
    pub fn raise_seq(&mut self, p: i32, seq: u64) {
        let progress = self.progress.entry(p).or_default();
        progress.seq = progress.seq.max(seq);
    }

    /// The positions a transaction commits. Every transaction carries at least one, so the
    /// group coordinator checks our member epoch: a node that lost its partitions is fenced
    /// (`active` names the partitions one may be taken from when the transaction read and
    /// fired nothing).
    ///
    /// Every `jobs` partition the transaction changed is among them, with its new progress;
    /// one whose offset was never committed (nothing read from it yet) commits offset 0,
    /// which is where its reading starts anyway.
    pub fn offsets(&self, txn: &Txn, active: impl Fn(i32) -> bool) -> Result<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, p), o) in &txn.positions {
            self.add(&mut tpl, topic, *p, *o, txn.progress.get(p))?;
        }
        // Every partition fired or changed has a progress (`Txn::settle`).
        for (p, progress) in &txn.progress {
            let key = (self.topics.jobs.clone(), *p);
            if !txn.positions.contains_key(&key) {
                let o = self.committed.get(&key).copied().unwrap_or(0);
                self.add(&mut tpl, &key.0, *p, o, Some(progress))?;
            }
        }
        if tpl.count() == 0 {
            if let Some(((topic, p), o)) = self.committed.iter().find(|((_, p), _)| active(*p)) {
                self.add(&mut tpl, topic, *p, *o, None)?;
            }
        }
        Ok(tpl)
    }

    /// Adds an offset to commit; one of a `jobs` partition carries the partition's progress
    /// (`progress`, or as of the last commit).
    fn add(
        &self,
        tpl: &mut TopicPartitionList,
        topic: &str,
        p: i32,
        offset: i64,
        progress: Option<&Progress>,
    ) -> Result<()> {
        let mut e = tpl.add_partition(topic, p);
        e.set_offset(Offset::Offset(offset))?;
        if topic == self.topics.jobs {
            let progress = progress.or_else(|| self.progress.get(&p));
            e.set_metadata(progress.map_or_else(|| Progress::default().encode(), Progress::encode));
        }
        Ok(())
    }

    /// Moves on to what a committed transaction committed: its positions and progress
    /// (`Txn::positions`, `Txn::progress`; apart, as the transaction's batch is consumed by the
    /// store's write first).
    pub fn committed(
        &mut self,
        positions: &BTreeMap<(String, i32), i64>,
        progress: &BTreeMap<i32, Progress>,
    ) {
        for (tp, o) in positions {
            self.committed.insert(tp.clone(), *o);
        }
        for (p, progress) in progress {
            self.progress.insert(*p, progress.clone());
            self.committed
                .entry((self.topics.jobs.clone(), *p))
                .or_insert(0);
        }
    }

    /// Where to read a partition again from after an aborted transaction.
    pub fn rewind(&self, topic: &str, p: i32) -> Offset {
        self.committed
            .get(&(topic.to_owned(), p))
            .map_or(Offset::Beginning, |o| Offset::Offset(*o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::store::Store;

    fn topics() -> Topics {
        Topics {
            jobs: "t.jobs".into(),
            timers: "t.timers".into(),
            control: "t.control".into(),
            runs: "t.runs".into(),
        }
    }

    fn txn() -> (tempfile::TempDir, Txn) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), crate::scheduler::fire::Lookahead::new(0)).unwrap();
        let txn = Txn::new(store.batch());
        (dir, txn)
    }

    fn metadata(tpl: &TopicPartitionList, topic: &str, p: i32) -> Option<(Offset, String)> {
        let e = tpl.find_partition(topic, p)?;
        Some((e.offset(), e.metadata().to_owned()))
    }

    #[test]
    fn a_jobs_offset_always_carries_the_partition_progress() {
        let mut ledger = Ledger::new(topics());
        let fetched = Progress {
            seq: 7,
            ..Progress::default()
        };
        ledger.fetched("t.jobs", 3, Some(40), Some(&fetched.encode()));
        ledger.fetched("t.control", 3, Some(5), None);
        let (_dir, mut txn) = txn();
        // Read a control record only: the jobs partition's progress is not in the
        // transaction, but an offset of `jobs` it commits must still carry it.
        txn.positions.insert(("t.control".into(), 3), 6);
        txn.positions.insert(("t.jobs".into(), 3), 41);
        let tpl = ledger.offsets(&txn, |_| true).unwrap();
        assert_eq!(tpl.count(), 2);
        let (o, m) = metadata(&tpl, "t.jobs", 3).unwrap();
        assert_eq!(o, Offset::Offset(41));
        assert_eq!(Progress::decode(&m).seq, 7);
        let (o, m) = metadata(&tpl, "t.control", 3).unwrap();
        assert_eq!((o, m.as_str()), (Offset::Offset(6), ""));
    }

    #[test]
    fn a_fired_partition_commits_its_new_progress_at_its_committed_offset() {
        let mut ledger = Ledger::new(topics());
        ledger.fetched("t.jobs", 1, Some(12), Some(""));
        let (_dir, mut txn) = txn();
        let progress = Progress {
            seq: 9,
            ..Progress::default()
        };
        txn.progress.insert(1, progress.clone());
        // Never read from: offset 0.
        txn.progress.insert(2, progress);
        let tpl = ledger.offsets(&txn, |_| true).unwrap();
        let (o, m) = metadata(&tpl, "t.jobs", 1).unwrap();
        assert_eq!((o, Progress::decode(&m).seq), (Offset::Offset(12), 9));
        let (o, _) = metadata(&tpl, "t.jobs", 2).unwrap();
        assert_eq!(o, Offset::Offset(0));

        ledger.committed(&txn.positions, &txn.progress);
        assert_eq!(ledger.progress_of(2).seq, 9);
        assert_eq!(ledger.rewind("t.jobs", 2), Offset::Offset(0));
        ledger.forget(2);
        assert_eq!(ledger.rewind("t.jobs", 2), Offset::Beginning);
        assert_eq!(ledger.progress_of(2), Progress::default());
    }

    #[test]
    fn an_empty_transaction_still_commits_an_active_partition_as_its_fence() {
        let mut ledger = Ledger::new(topics());
        ledger.fetched("t.jobs", 4, Some(3), Some(""));
        ledger.fetched("t.jobs", 5, Some(8), Some(""));
        let (_dir, txn) = txn();
        let tpl = ledger.offsets(&txn, |p| p == 5).unwrap();
        assert_eq!(tpl.count(), 1);
        assert_eq!(metadata(&tpl, "t.jobs", 5).unwrap().0, Offset::Offset(8));
        // Nothing active: nothing to commit (the engine then commits nothing).
        assert_eq!(ledger.offsets(&txn, |_| false).unwrap().count(), 0);
    }

    #[test]
    fn a_raised_sequence_never_goes_back() {
        let mut ledger = Ledger::new(topics());
        ledger.raise_seq(1, 10);
        ledger.raise_seq(1, 4);
        assert_eq!(ledger.progress_of(1).seq, 10);
    }
}
