//! Finished runs, so a redelivered run that already finished is acknowledged without running
//! again. RocksDB: each entry is kept under its run id and under the instant it was recorded,
//! so dropping the entries past the retention walks only those (the worker does it every
//! `worker.ledger_prune_interval_ms`) and the ledger stays bounded by the runs of one retention.

use std::path::Path;

use rocksdb::{Direction, IteratorMode, Options, WriteBatch, DB};

/// Key prefixes: by run id (value: the instant, big-endian), and by instant then run id.
const BY_RUN: u8 = 1;
const BY_TIME: u8 = 2;

pub struct Ledger {
    db: DB,
    retention_ms: i64,
}

fn run_key(run_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + run_id.len());
    k.push(BY_RUN);
    k.extend_from_slice(run_id.as_bytes());
    k
}

fn time_key(at_ms: i64, run_id: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + run_id.len());
    k.push(BY_TIME);
    // Offset so that negative instants sort before positive ones.
    k.extend_from_slice(&((at_ms as u64) ^ (1 << 63)).to_be_bytes());
    k.extend_from_slice(run_id);
    k
}

fn instant(v: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(v.try_into().ok()?))
}

impl Ledger {
    /// Opens (or creates) the ledger in `dir`. Entries of the earlier layout (keyed by the bare
    /// run id) are moved to this one.
    pub fn open(dir: &Path, retention_ms: i64) -> Result<Ledger, rocksdb::Error> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        let ledger = Ledger {
            db: DB::open(&opts, dir)?,
            retention_ms,
        };
        ledger.migrate()?;
        Ok(ledger)
    }

    fn migrate(&self) -> Result<(), rocksdb::Error> {
        let mut batch = WriteBatch::default();
        for (k, v) in self.db.iterator(IteratorMode::Start).flatten() {
            if k.first().is_some_and(|b| *b == BY_RUN || *b == BY_TIME) {
                continue;
            }
            if let Some(at) = instant(&v) {
                let mut rk = vec![BY_RUN];
                rk.extend_from_slice(&k);
                batch.put(rk, at.to_be_bytes());
                batch.put(time_key(at, &k), b"");
            }
            batch.delete(k);
        }
        if !batch.is_empty() {
            self.db.write(batch)?;
        }
        Ok(())
    }

    /// True when `run_id` finished (at any attempt) within the retention.
    pub fn finished(&self, run_id: &str, now_ms: i64) -> bool {
        match self.db.get(run_key(run_id)) {
            Ok(Some(v)) => instant(&v).is_some_and(|at| now_ms - at < self.retention_ms),
            _ => false,
        }
    }

    pub fn record(&self, run_id: &str, now_ms: i64) -> Result<(), rocksdb::Error> {
        let key = run_key(run_id);
        let mut batch = WriteBatch::default();
        // A run recorded again (a later attempt) is kept from its latest instant.
        if let Some(at) = self.db.get(&key)?.as_deref().and_then(instant) {
            batch.delete(time_key(at, run_id.as_bytes()));
        }
        batch.put(&key, now_ms.to_be_bytes());
        batch.put(time_key(now_ms, run_id.as_bytes()), b"");
        self.db.write(batch)
    }

    /// Drops the entries past the retention; returns how many.
    pub fn prune(&self, now_ms: i64) -> usize {
        let horizon = now_ms.saturating_sub(self.retention_ms);
        let start = [BY_TIME];
        let end = time_key(horizon.saturating_add(1), b"");
        let mut batch = WriteBatch::default();
        let mut n = 0;
        for (k, _) in self
            .db
            .iterator(IteratorMode::From(&start, Direction::Forward))
            .flatten()
        {
            if *k >= *end {
                break;
            }
            let mut rk = vec![BY_RUN];
            rk.extend_from_slice(&k[9..]);
            batch.delete(&k);
            batch.delete(rk);
            n += 1;
        }
        if n > 0 {
            if let Err(e) = self.db.write(batch) {
                tracing::warn!(error = %e, "ledger prune failed");
                return 0;
            }
        }
        n
    }

    /// Runs remembered (whether or not within the retention).
    pub fn len(&self) -> usize {
        self.db
            .prefix_iterator([BY_RUN])
            .flatten()
            .take_while(|(k, _)| k.first() == Some(&BY_RUN))
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_finished_runs_within_the_retention() {
        let dir = tempfile::tempdir().unwrap();
        let l = Ledger::open(dir.path(), 1_000).unwrap();
        assert!(!l.finished("r1", 0));
        l.record("r1", 100).unwrap();
        assert!(l.finished("r1", 500));
        assert!(!l.finished("r1", 1_100));
        assert_eq!(l.prune(1_099), 0, "still within the retention");
        assert_eq!(l.prune(1_100), 1);
        assert!(!l.finished("r1", 200));
        assert!(l.is_empty());
    }

    #[test]
    fn pruning_keeps_the_ledger_bounded_by_one_retention_of_runs() {
        let dir = tempfile::tempdir().unwrap();
        let l = Ledger::open(dir.path(), 1_000).unwrap();
        // 100 runs every 100 ms for 10 s, pruned every 100 ms.
        for tick in 0..100i64 {
            let now = tick * 100;
            for i in 0..100 {
                l.record(&format!("run-{tick}-{i}"), now).unwrap();
            }
            l.prune(now);
            assert!(l.len() <= 1_100, "{} entries at {now}", l.len());
        }
        assert!(l.finished("run-99-0", 9_950), "a recent run was forgotten");
        assert!(!l.finished("run-80-0", 9_950));
        // A run recorded again is kept from its latest instant, once.
        l.record("run-99-0", 10_500).unwrap();
        l.prune(10_900);
        assert!(l.finished("run-99-0", 10_900));
        assert_eq!(l.len(), 1);
        assert_eq!(l.prune(11_500), 1);
        assert!(l.is_empty());
    }

    #[test]
    fn entries_of_the_earlier_layout_are_kept_and_pruned() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = DB::open_default(dir.path()).unwrap();
            db.put(b"old-run", 100i64.to_be_bytes()).unwrap();
        }
        let l = Ledger::open(dir.path(), 1_000).unwrap();
        assert!(l.finished("old-run", 500));
        assert_eq!(l.prune(1_100), 1);
        assert!(!l.finished("old-run", 500));
    }
}
