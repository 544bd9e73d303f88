//! Finished runs, so a redelivered run that already finished is acknowledged without running
//! again. RocksDB, keyed by run id; entries older than the retention are dropped.

use std::path::Path;

use rocksdb::{Options, DB};

pub struct Ledger {
    db: DB,
    retention_ms: i64,
}

impl Ledger {
    pub fn open(dir: &Path, retention_ms: i64) -> Result<Ledger, rocksdb::Error> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        Ok(Ledger {
            db: DB::open(&opts, dir)?,
            retention_ms,
        })
    }

    /// True when `run_id` finished (at any attempt) within the retention.
    pub fn finished(&self, run_id: &str, now_ms: i64) -> bool {
        match self.db.get(run_id.as_bytes()) {
            Ok(Some(v)) if v.len() == 8 => {
                let at = i64::from_be_bytes(v[..8].try_into().unwrap());
                now_ms - at < self.retention_ms
            }
            _ => false,
        }
    }

    pub fn record(&self, run_id: &str, now_ms: i64) -> Result<(), rocksdb::Error> {
        self.db.put(run_id.as_bytes(), now_ms.to_be_bytes())
    }

    /// Drops entries past the retention.
    pub fn prune(&self, now_ms: i64) -> usize {
        let mut batch = rocksdb::WriteBatch::default();
        let mut n = 0;
        for (k, v) in self.db.iterator(rocksdb::IteratorMode::Start).flatten() {
            if v.len() == 8
                && now_ms - i64::from_be_bytes(v[..8].try_into().unwrap()) >= self.retention_ms
            {
                batch.delete(k);
                n += 1;
            }
        }
        let _ = self.db.write(batch);
        n
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
        assert_eq!(l.prune(1_100), 1);
        assert!(!l.finished("r1", 200));
    }
}
