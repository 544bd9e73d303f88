//! Finished runs, so a redelivered run that already finished is acknowledged without running
//! again. RocksDB: each entry is kept under its run id and under the instant it was recorded,
//! so dropping the entries past the retention walks only those (the worker does it every
//! `worker.ledger_prune_interval_ms`) and the ledger stays bounded by the runs of one retention.
//!
//! A write that fails (the disk is full) does not lose the entry: it waits in memory (up to
//! `PENDING_MAX` entries) and still counts for [`Ledger::finished`], the ledger's
//! [`StoreHealth`] reports the failure (the worker is not ready meanwhile), and the worker calls
//! [`Ledger::recover`] every second until the pending entries are written. RocksDB stops
//! writing after such an error until the database is opened again, so `recover` reopens it
//! (read-only while that fails, so the entries already on disk still count). The warnings of a
//! failing ledger are rate-limited to one per `WARN_EVERY_MS`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};

use rocksdb::{Direction, IteratorMode, Options, WriteBatch, DB};
use tracing::{info, warn};

use crate::node::StoreHealth;

/// Key prefixes: by run id (value: the instant, big-endian), and by instant then run id.
const BY_RUN: u8 = 1;
const BY_TIME: u8 = 2;

/// Most entries kept in memory while the ledger cannot write: a day of 1 run a second, and a
/// few MB. Past it, finished runs are not remembered (a redelivery of one would run again).
pub const PENDING_MAX: usize = 100_000;

/// A key no entry has (entries start with `BY_RUN` or `BY_TIME`): deleted to try a write.
const PROBE_KEY: [u8; 1] = [0];

/// At most one warning about a failing ledger this often; the others are counted in it.
pub const WARN_EVERY_MS: i64 = 10_000;

enum Store {
    Writable(DB),
    /// Reopened read-only after a failure, because it could not be opened to write.
    ReadOnly(DB),
    /// Neither could be opened.
    Closed,
}

impl Store {
    fn db(&self) -> Option<&DB> {
        match self {
            Store::Writable(db) | Store::ReadOnly(db) => Some(db),
            Store::Closed => None,
        }
    }
}

/// The warnings of a failing ledger, one per `WARN_EVERY_MS` at most.
#[derive(Default)]
struct Warnings {
    last_ms: Option<i64>,
    suppressed: u64,
}

pub struct Ledger {
    dir: PathBuf,
    retention_ms: i64,
    store: RwLock<Store>,
    /// Entries not yet written (run key → instant), while the store cannot write.
    pending: Mutex<HashMap<String, i64>>,
    /// Entries dropped because `pending` was full, since the last warning.
    dropped: std::sync::atomic::AtomicU64,
    health: Arc<StoreHealth>,
    warnings: Mutex<Warnings>,
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

fn options() -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    // Each open starts a new info log: keep few, so reopening on a small disk does not fill it.
    opts.set_keep_log_file_num(2);
    opts.set_max_log_file_size(1 << 20);
    // Nearly every lookup is of a run the ledger has not seen (its first delivery): bloom
    // filters answer those without walking the memtable or reading the files' blocks.
    opts.set_memtable_prefix_bloom_ratio(0.1);
    opts.set_memtable_whole_key_filtering(true);
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    table.set_whole_key_filtering(true);
    opts.set_block_based_table_factory(&table);
    opts
}

/// The writes of `entries` (run key, instant): each run's old time key goes, its new ones come.
fn batch_of(db: &DB, entries: &[(String, i64)]) -> Result<WriteBatch, rocksdb::Error> {
    let mut batch = WriteBatch::default();
    for (run_id, at_ms) in entries {
        let key = run_key(run_id);
        // A run recorded again (a later attempt) is kept from its latest instant.
        if let Some(at) = db.get(&key)?.as_deref().and_then(instant) {
            batch.delete(time_key(at, run_id.as_bytes()));
        }
        batch.put(&key, at_ms.to_be_bytes());
        batch.put(time_key(*at_ms, run_id.as_bytes()), b"");
    }
    Ok(batch)
}

/// Space a reopen is tried with at least: what it writes (a new WAL, MANIFEST and info log,
/// the old WAL flushed to a table) is about a memtable's worth, so this only says "not full".
const REOPEN_ROOM: usize = 1 << 20;

/// Whether `REOPEN_ROOM` bytes can be written in `dir` (written, synced and removed).
fn room_to_reopen(dir: &Path) -> Result<(), String> {
    use std::io::Write;
    let probe = dir.join("space-probe");
    let tried = std::fs::File::create(&probe).and_then(|mut f| {
        f.write_all(&vec![0u8; REOPEN_ROOM])?;
        f.sync_all()
    });
    let _ = std::fs::remove_file(&probe);
    tried.map_err(|e| format!("no room to reopen in {}: {e}", dir.display()))
}

impl Ledger {
    /// Opens (or creates) the ledger in `dir`. Entries of the earlier layout (keyed by the bare
    /// run id) are moved to this one.
    pub fn open(dir: &Path, retention_ms: i64) -> Result<Ledger, rocksdb::Error> {
        Ledger::open_with(dir, retention_ms, Arc::new(StoreHealth::default()))
    }

    /// As [`Ledger::open`], reporting whether it can write in `health`.
    pub fn open_with(
        dir: &Path,
        retention_ms: i64,
        health: Arc<StoreHealth>,
    ) -> Result<Ledger, rocksdb::Error> {
        let ledger = Ledger {
            dir: dir.to_owned(),
            retention_ms,
            store: RwLock::new(Store::Writable(DB::open(&options(), dir)?)),
            pending: Mutex::new(HashMap::new()),
            dropped: Default::default(),
            health,
            warnings: Mutex::new(Warnings::default()),
        };
        ledger.migrate()?;
        Ok(ledger)
    }

    fn migrate(&self) -> Result<(), rocksdb::Error> {
        let store = self.store.read().unwrap();
        let Some(db) = store.db() else { return Ok(()) };
        let mut batch = WriteBatch::default();
        for (k, v) in db.iterator(IteratorMode::Start).flatten() {
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
            db.write(batch)?;
        }
        Ok(())
    }

    /// Since when, and why, the ledger cannot write; `None` while it can.
    pub fn failing(&self) -> Option<(i64, String)> {
        self.health.failing()
    }

    /// True when `run_id` finished (at any attempt) within the retention.
    pub fn finished(&self, run_id: &str, now_ms: i64) -> bool {
        let within = |at: i64| now_ms - at < self.retention_ms;
        if let Some(at) = self.pending.lock().unwrap().get(run_id) {
            return within(*at);
        }
        let store = self.store.read().unwrap();
        match store.db().map(|db| db.get(run_key(run_id))) {
            Some(Ok(Some(v))) => instant(&v).is_some_and(within),
            _ => false,
        }
    }

    /// Remembers that `run_id` finished at `now_ms`. When the store cannot write, the entry
    /// waits in memory for [`Ledger::recover`].
    pub fn record(&self, run_id: &str, now_ms: i64) {
        let entry = [(run_id.to_owned(), now_ms)];
        if self.health.failing().is_none() {
            let store = self.store.read().unwrap();
            if let Store::Writable(db) = &*store {
                match batch_of(db, &entry).and_then(|b| db.write(b)) {
                    Ok(()) => return,
                    Err(e) => self.failed(e.as_ref(), now_ms),
                }
            }
        }
        self.keep(entry, now_ms);
    }

    fn keep(&self, entries: impl IntoIterator<Item = (String, i64)>, now_ms: i64) {
        let mut pending = self.pending.lock().unwrap();
        for (run_id, at) in entries {
            if pending.len() < PENDING_MAX || pending.contains_key(&run_id) {
                pending.insert(run_id, at);
            } else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(pending);
        self.warn(now_ms);
    }

    /// Marks the store as failing since `now_ms` (unless it already was) with `error`.
    fn failed(&self, error: &str, now_ms: i64) {
        let _ = self.health.failing_since_ms.compare_exchange(
            0,
            now_ms.max(1),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        *self.health.last_error.lock().unwrap() = Some(error.to_owned());
    }

    /// One warning per `WARN_EVERY_MS` at most, counting the failed writes in between.
    fn warn(&self, now_ms: i64) {
        let mut w = self.warnings.lock().unwrap();
        if w.last_ms.is_some_and(|at| now_ms - at < WARN_EVERY_MS) {
            w.suppressed += 1;
            return;
        }
        let error = self.health.last_error.lock().unwrap().clone();
        warn!(
            dir = %self.dir.display(),
            error = error.as_deref().unwrap_or("unknown"),
            pending = self.pending.lock().unwrap().len(),
            dropped = self.dropped.swap(0, Ordering::Relaxed),
            suppressed = w.suppressed,
            "ledger cannot write; finished runs kept in memory until it can"
        );
        w.last_ms = Some(now_ms);
        w.suppressed = 0;
    }

    /// Writes the pending entries, reopening the store first when it will not write; true once
    /// the ledger can write again. Called while [`Ledger::failing`].
    pub fn recover(&self, now_ms: i64) -> bool {
        let entries: Vec<(String, i64)> = self
            .pending
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        // With nothing pending (a prune failed), the probe's delete still goes through the WAL.
        let write = |db: &DB| {
            batch_of(db, &entries).and_then(|mut b| {
                b.delete(PROBE_KEY);
                db.write(b)
            })
        };
        let written = match &*self.store.read().unwrap() {
            Store::Writable(db) => write(db).map_err(|e| e.to_string()),
            _ => Err(String::new()),
        };
        let written = written.or_else(|e| {
            // Reopening on a disk still full fails, and holds off every lookup meanwhile.
            if let Err(full) = room_to_reopen(&self.dir) {
                return Err(if e.is_empty() { full } else { e });
            }
            // RocksDB refuses every write after a failed one until it is opened again.
            let mut store = self.store.write().unwrap();
            *store = Store::Closed;
            match DB::open(&options(), &self.dir) {
                Ok(db) => {
                    let r = write(&db).map_err(|e| e.to_string());
                    *store = Store::Writable(db);
                    r
                }
                Err(e) => {
                    if let Ok(db) = DB::open_for_read_only(&options(), &self.dir, false) {
                        *store = Store::ReadOnly(db);
                    }
                    Err(e.to_string())
                }
            }
        });
        match written {
            Ok(()) => {
                let mut pending = self.pending.lock().unwrap();
                for (run_id, at) in &entries {
                    if pending.get(run_id) == Some(at) {
                        pending.remove(run_id);
                    }
                }
                let since = self.health.failing_since_ms.swap(0, Ordering::Relaxed);
                *self.health.last_error.lock().unwrap() = None;
                // Entries kept while this ran go the normal way from now on.
                let late: Vec<(String, i64)> = pending.drain().collect();
                drop(pending);
                for (run_id, at) in late {
                    self.record(&run_id, at);
                }
                info!(
                    written = entries.len(),
                    failed_for_ms = now_ms - since,
                    "ledger writes again; the runs kept in memory are written"
                );
                *self.warnings.lock().unwrap() = Warnings::default();
                true
            }
            Err(e) => {
                self.failed(&e, now_ms);
                self.warn(now_ms);
                false
            }
        }
    }

    /// Drops the entries past the retention; returns how many. Nothing while it cannot write.
    pub fn prune(&self, now_ms: i64) -> usize {
        if self.health.failing().is_some() {
            return 0;
        }
        let store = self.store.read().unwrap();
        let Store::Writable(db) = &*store else {
            return 0;
        };
        let horizon = now_ms.saturating_sub(self.retention_ms);
        let start = [BY_TIME];
        let end = time_key(horizon.saturating_add(1), b"");
        let mut batch = WriteBatch::default();
        let mut n = 0;
        for (k, _) in db
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
            if let Err(e) = db.write(batch) {
                self.failed(e.as_ref(), now_ms);
                self.warn(now_ms);
                return 0;
            }
        }
        n
    }

    /// Runs remembered (whether or not within the retention), on disk and waiting in memory.
    pub fn len(&self) -> usize {
        let on_disk = self.store.read().unwrap().db().map_or(0, |db| {
            db.prefix_iterator([BY_RUN])
                .flatten()
                .take_while(|(k, _)| k.first() == Some(&BY_RUN))
                .count()
        });
        on_disk + self.pending.lock().unwrap().len()
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
        l.record("r1", 100);
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
                l.record(&format!("run-{tick}-{i}"), now);
            }
            l.prune(now);
            assert!(l.len() <= 1_100, "{} entries at {now}", l.len());
        }
        assert!(l.finished("run-99-0", 9_950), "a recent run was forgotten");
        assert!(!l.finished("run-80-0", 9_950));
        // A run recorded again is kept from its latest instant, once.
        l.record("run-99-0", 10_500);
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
