//! The node's RocksDB: per owned partition, the timers, the bucket index and a checkpoint of
//! the `timers` offsets applied. A cache of Kafka: deleting the directory loses nothing.
//!
//! Column families:
//! - `timers`: `(partition u16 BE, job id)` → the progress sequence the state is current as
//!   of (u64 BE, see `progress`) followed by the `TimerState` as encoded on `timers`;
//! - `due`: `(partition u16 BE, wake instant u64 BE, job id)` → tenant, so "everything due in
//!   partition p up to now" is one range scan that also says whose it is, without decoding;
//! - `meta`: `ckpt/(partition u16 BE)` → next `timers` offset to read + when it was written;
//!   `format` → the layout version (`FORMAT`) and the lookahead the index is keyed with: a
//!   store of another layout or lookahead is emptied at open (it is a cache: its partitions
//!   are replayed from `timers`).
//!
//! A timer is indexed at its wake instant less its job's lead (`fire::Lookahead`, `wake`), so
//! "due up to now" is what a tick at `now` may fire.

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::path::Path;
use std::sync::Mutex;

use rocksdb::{
    ColumnFamilyDescriptor, Direction, IteratorMode, Options, ReadOptions, WriteBatch, DB,
};

use super::fire::Lookahead;
use crate::codec::{self, Framing};
use crate::model::records::TimerState;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("corrupt timer state for job {job:?} in partition {partition}: {source}")]
    Corrupt {
        partition: u16,
        job: String,
        #[source]
        source: codec::CodecError,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

const CF_TIMERS: &str = "timers";
const CF_DUE: &str = "due";
const CF_META: &str = "meta";
/// Version 2 put the progress sequence in front of each timer state.
const FORMAT: &str = "2";
const FORMAT_KEY: &[u8] = b"format";
/// Index entries `due_besides` walks past (the entries a transaction itself moved) before it
/// gives up and answers "unknown".
const FIRST_WAKE_WALK: usize = 200_000;
/// Due entries of other jobs `due_besides` walks to learn their tenants before it gives up.
const TENANT_WALK: usize = 20_000;

/// What else is due in a partition (`Store::due_besides`).
#[derive(Debug, PartialEq, Eq)]
pub enum Besides {
    Nothing,
    /// The tenants with timers due.
    Tenants(HashSet<String>),
    Unknown,
}

/// Where a partition's replay of `timers` can resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    pub offset: i64,
    pub written_ms: i64,
}

/// One entry of the bucket index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueEntry {
    pub partition: u16,
    pub wake_ms: i64,
    pub job: String,
    pub tenant: String,
}

pub struct Store {
    db: DB,
    lookahead: Lookahead,
    /// Per partition, a wake instant no live `due` entry is below. A scan starts there instead
    /// of at the partition's first key, so it does not walk the tombstones every fire leaves
    /// behind (until compaction drops them, they cost a scan as much as live keys).
    floors: Mutex<HashMap<u16, i64>>,
}

/// Sortable encoding of an instant: i64 with the sign bit flipped, big-endian.
fn instant_key(ms: i64) -> [u8; 8] {
    ((ms as u64) ^ (1 << 63)).to_be_bytes()
}

fn instant_from_key(b: &[u8]) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    (u64::from_be_bytes(a) ^ (1 << 63)) as i64
}

fn timer_key(partition: u16, job: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + job.len());
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(job.as_bytes());
    k
}

fn due_key(partition: u16, wake_ms: i64, job: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(10 + job.len());
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(&instant_key(wake_ms));
    k.extend_from_slice(job.as_bytes());
    k
}

/// A stored timer value: its progress sequence and the encoded state after it.
fn split_seq(value: &[u8]) -> Option<(u64, &[u8])> {
    let (seq, encoded) = value.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*seq), encoded))
}

/// A stored timer value decoded: the state and its progress sequence.
fn decode_stored(partition: u16, job: &str, bytes: &[u8]) -> Result<(TimerState, u64)> {
    let corrupt = |source| StoreError::Corrupt {
        partition,
        job: job.to_owned(),
        source,
    };
    let Some((seq, encoded)) = split_seq(bytes) else {
        return Err(corrupt(codec::CodecError::TruncatedHeader {
            record: "stored TimerState",
            framing: "progress sequence",
            len: bytes.len(),
            need: 8,
        }));
    };
    codec::decode(encoded)
        .map(|state| (state, seq))
        .map_err(corrupt)
}

fn checkpoint_key(partition: u16) -> Vec<u8> {
    let mut k = b"ckpt/".to_vec();
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

impl Store {
    pub fn open(dir: &Path, lookahead: Lookahead) -> Result<Store> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.increase_parallelism(2);
        let cfs = [CF_TIMERS, CF_DUE, CF_META]
            .into_iter()
            .map(|name| ColumnFamilyDescriptor::new(name, opts.clone()));
        let db = DB::open_cf_descriptors(&opts, dir, cfs)?;
        let store = Store {
            db,
            lookahead,
            floors: Mutex::new(HashMap::new()),
        };
        let cf_meta = store.cf(CF_META);
        let format = format!("{} lookahead={}", FORMAT, lookahead.ms);
        let format = format.as_bytes();
        if store.db.get_cf(cf_meta, FORMAT_KEY)?.as_deref() != Some(format) {
            // Another layout (or a new store): start empty; every partition replays.
            let mut batch = WriteBatch::default();
            for cf in [CF_TIMERS, CF_DUE, CF_META] {
                for item in store.db.iterator_cf(store.cf(cf), IteratorMode::Start) {
                    batch.delete_cf(store.cf(cf), item?.0);
                }
            }
            batch.put_cf(cf_meta, FORMAT_KEY, format);
            store.db.write(batch)?;
        }
        Ok(store)
    }

    /// The lookahead this store's index is keyed with.
    pub fn lookahead(&self) -> Lookahead {
        self.lookahead
    }

    /// The instant the index keys `state` at (`None`: not indexed).
    pub fn wake(&self, state: &TimerState) -> Option<i64> {
        self.lookahead.wake(state)
    }

    fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(name)
            .expect("column family created at open")
    }

    pub fn timer(&self, partition: u16, job: &str) -> Result<Option<TimerState>> {
        Ok(self.timer_seq(partition, job)?.map(|(state, _)| state))
    }

    /// A timer and the progress sequence it is current as of.
    pub fn timer_seq(&self, partition: u16, job: &str) -> Result<Option<(TimerState, u64)>> {
        match self
            .db
            .get_pinned_cf(self.cf(CF_TIMERS), timer_key(partition, job))?
        {
            Some(bytes) => decode_stored(partition, job, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// The timers of `jobs` (partition, job), each as [`Store::timer`] reads it, in one
    /// batched read: a firing chunk's thousands of point reads share their index and filter
    /// block lookups.
    pub fn timers(&self, jobs: &[(u16, &str)]) -> Vec<Result<Option<TimerState>>> {
        let keys: Vec<Vec<u8>> = jobs.iter().map(|(p, job)| timer_key(*p, job)).collect();
        self.db
            .batched_multi_get_cf(self.cf(CF_TIMERS), &keys, false)
            .into_iter()
            .zip(jobs)
            .map(|(got, (p, job))| match got? {
                Some(bytes) => decode_stored(*p, job, &bytes).map(|(state, _)| Some(state)),
                None => Ok(None),
            })
            .collect()
    }

    /// What else is indexed at or before `now` in `partition`, not counting the jobs `skip`
    /// names (those a transaction is moving): `Besides::Nothing`, or which tenants have such
    /// timers. `Besides::Unknown` when more than `FIRST_WAKE_WALK` entries would have to be
    /// skipped to know, or more than `TENANT_WALK` due entries walked.
    /// With `all` false, it stops at the first such timer and names only its tenant.
    pub fn due_besides(
        &self,
        partition: u16,
        now: i64,
        all: bool,
        skip: impl Fn(&str) -> bool,
    ) -> Result<Besides> {
        let start = due_key(partition, self.floor(partition), "");
        let iter = self.partition_iter(CF_DUE, partition, &start);
        let mut tenants: HashSet<String> = HashSet::new();
        let mut due = 0;
        for (walked, item) in iter.enumerate() {
            let (k, v) = item?;
            if k.len() < 10 || k[..2] != partition.to_be_bytes() {
                break;
            }
            if walked >= FIRST_WAKE_WALK || due >= TENANT_WALK {
                return Ok(Besides::Unknown);
            }
            if instant_from_key(&k[2..10]) > now {
                break;
            }
            let job = std::str::from_utf8(&k[10..]).unwrap_or_default();
            if skip(job) {
                continue;
            }
            due += 1;
            let tenant = String::from_utf8_lossy(&v);
            if !tenants.contains(tenant.as_ref()) {
                tenants.insert(tenant.into_owned());
            }
            if !all {
                break;
            }
        }
        Ok(match tenants.is_empty() {
            true => Besides::Nothing,
            false => Besides::Tenants(tenants),
        })
    }

    /// The keys of `cf` from `start` on, bounded to `partition`: past its last key the
    /// iterator would otherwise skip every deleted key of the partitions after it before it
    /// reaches a live one. After a herd (each fired one-shot leaves a deleted index key) that
    /// made each partition's due scan cost all partitions' deletions: 19.5 s for a
    /// 300,000-run herd at 1024 partitions.
    fn partition_iter(
        &self,
        cf: &str,
        partition: u16,
        start: &[u8],
    ) -> rocksdb::DBIteratorWithThreadMode<'_, DB> {
        let mut options = ReadOptions::default();
        if partition < u16::MAX {
            options.set_iterate_upper_bound((partition + 1).to_be_bytes().to_vec());
        }
        self.db.iterator_cf_opt(
            self.cf(cf),
            options,
            IteratorMode::From(start, Direction::Forward),
        )
    }

    /// Index entries of `partition` with a wake instant at or before `upto_ms`, earliest first.
    pub fn due(
        &self,
        partition: u16,
        upto_ms: i64,
        limit: usize,
        out: &mut Vec<DueEntry>,
    ) -> Result<()> {
        let floor = self.floor(partition);
        let iter = self.partition_iter(CF_DUE, partition, &due_key(partition, floor, ""));
        let mut first_live = None;
        for (taken, item) in iter.enumerate() {
            let (k, v) = item?;
            if k.len() < 10 || k[..2] != partition.to_be_bytes() {
                break;
            }
            let wake_ms = instant_from_key(&k[2..10]);
            first_live.get_or_insert(wake_ms);
            if wake_ms > upto_ms || taken >= limit {
                break;
            }
            out.push(DueEntry {
                partition,
                wake_ms,
                job: String::from_utf8_lossy(&k[10..]).into_owned(),
                tenant: String::from_utf8_lossy(&v).into_owned(),
            });
        }
        // Nothing below the first live key; nothing at all when the partition had none. Only
        // `write` adds keys, and it lowers the floor to what it adds.
        self.floors
            .lock()
            .unwrap()
            .insert(partition, first_live.unwrap_or(i64::MAX));
        Ok(())
    }

    fn floor(&self, partition: u16) -> i64 {
        self.floors
            .lock()
            .unwrap()
            .get(&partition)
            .copied()
            .unwrap_or(i64::MIN)
    }

    pub fn checkpoint(&self, partition: u16) -> Result<Option<Checkpoint>> {
        let Some(v) = self
            .db
            .get_cf(self.cf(CF_META), checkpoint_key(partition))?
        else {
            return Ok(None);
        };
        if v.len() != 16 {
            return Ok(None);
        }
        let offset = i64::from_be_bytes(v[..8].try_into().unwrap());
        let written_ms = i64::from_be_bytes(v[8..].try_into().unwrap());
        Ok(Some(Checkpoint { offset, written_ms }))
    }

    /// Number of timers of a partition, and the highest progress sequence any is current as
    /// of.
    pub fn timers_summary(&self, partition: u16) -> Result<(usize, u64)> {
        let prefix = partition.to_be_bytes();
        let iter = self.partition_iter(CF_TIMERS, partition, &prefix);
        let (mut count, mut max_seq) = (0, 0);
        for item in iter {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            count += 1;
            if let Some((seq, _)) = split_seq(&v) {
                max_seq = max_seq.max(seq);
            }
        }
        Ok((count, max_seq))
    }

    /// Calls `f` with each timer of `partition` whose job id sorts after `after`, in id order,
    /// until it returns false. Read-only (the API's view reads from another thread than the
    /// engine's): it never touches the scan floors.
    pub fn timers_after(
        &self,
        partition: u16,
        after: &str,
        mut f: impl FnMut(TimerState) -> bool,
    ) -> Result<()> {
        let prefix = partition.to_be_bytes();
        let start = timer_key(partition, after);
        for item in self.partition_iter(CF_TIMERS, partition, &start) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            if &k[2..] == after.as_bytes() {
                continue;
            }
            let job = String::from_utf8_lossy(&k[2..]).into_owned();
            let state = split_seq(&v)
                .map(|(_, encoded)| codec::decode::<TimerState>(encoded))
                .transpose()
                .map_err(|source| StoreError::Corrupt {
                    partition,
                    job,
                    source,
                })?;
            if let Some(state) = state {
                if !f(state) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// How many index entries of `partition` wake at or before `upto_ms`, counting to `cap` at
    /// most. Read-only, unlike [`Store::due`]: setting a floor from a thread other than the
    /// engine's could raise it past an entry the engine just wrote, which would never fire.
    pub fn count_due(&self, partition: u16, upto_ms: i64, cap: usize) -> Result<usize> {
        let start = due_key(partition, self.floor(partition), "");
        let mut n = 0;
        for item in self.partition_iter(CF_DUE, partition, &start) {
            let (k, _) = item?;
            if n >= cap
                || k.len() < 10
                || k[..2] != partition.to_be_bytes()
                || instant_from_key(&k[2..10]) > upto_ms
            {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    pub fn write(&self, batch: Batch) -> Result<()> {
        self.db.write(batch.inner)?;
        let mut floors = self.floors.lock().unwrap();
        for (p, wake) in batch.lowest_wake {
            floors.entry(p).and_modify(|f| *f = (*f).min(wake));
        }
        Ok(())
    }

    pub fn batch(&self) -> Batch {
        Batch {
            inner: WriteBatch::default(),
            lowest_wake: HashMap::new(),
        }
    }

    /// Removes every trace of a partition: before a replay from the start.
    pub fn clear_partition(&self, partition: u16) -> Result<()> {
        let from = partition.to_be_bytes().to_vec();
        let to = (u32::from(partition) + 1).to_be_bytes()[2..].to_vec();
        let mut batch = WriteBatch::default();
        for cf in [CF_TIMERS, CF_DUE] {
            if partition == u16::MAX {
                let iter = self
                    .db
                    .iterator_cf(self.cf(cf), IteratorMode::From(&from, Direction::Forward));
                for item in iter {
                    batch.delete_cf(self.cf(cf), item?.0);
                }
            } else {
                batch.delete_range_cf(self.cf(cf), &from, &to);
            }
        }
        batch.delete_cf(self.cf(CF_META), checkpoint_key(partition));
        self.db.write(batch)?;
        self.floors.lock().unwrap().remove(&partition);
        Ok(())
    }
}

/// Changes applied together, after the Kafka transaction that carries them commits.
pub struct Batch {
    inner: WriteBatch,
    /// Per partition, the earliest wake instant this batch indexes.
    lowest_wake: HashMap<u16, i64>,
}

impl Batch {
    /// Stores a timer, current as of progress sequence `seq`, and moves its index entry from
    /// `old_wake` to `new_wake`.
    #[allow(clippy::too_many_arguments)]
    pub fn put_timer(
        &mut self,
        store: &Store,
        partition: u16,
        state: &TimerState,
        encoded: &[u8],
        seq: u64,
        old_wake: Option<i64>,
        new_wake: Option<i64>,
    ) {
        let job = &state.definition.id;
        let mut value = Vec::with_capacity(8 + encoded.len());
        value.extend_from_slice(&seq.to_be_bytes());
        value.extend_from_slice(encoded);
        self.inner
            .put_cf(store.cf(CF_TIMERS), timer_key(partition, job), value);
        if old_wake != new_wake {
            if let Some(w) = old_wake {
                self.inner
                    .delete_cf(store.cf(CF_DUE), due_key(partition, w, job));
            }
        }
        if let Some(w) = new_wake {
            self.lowest_wake
                .entry(partition)
                .and_modify(|f| *f = (*f).min(w))
                .or_insert(w);
            self.inner.put_cf(
                store.cf(CF_DUE),
                due_key(partition, w, job),
                state.definition.tenant.as_bytes(),
            );
        }
    }

    pub fn delete_timer(
        &mut self,
        store: &Store,
        partition: u16,
        job: &str,
        old_wake: Option<i64>,
    ) {
        self.inner
            .delete_cf(store.cf(CF_TIMERS), timer_key(partition, job));
        if let Some(w) = old_wake {
            self.inner
                .delete_cf(store.cf(CF_DUE), due_key(partition, w, job));
        }
    }

    pub fn set_checkpoint(&mut self, store: &Store, partition: u16, cp: Checkpoint) {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&cp.offset.to_be_bytes());
        v.extend_from_slice(&cp.written_ms.to_be_bytes());
        self.inner
            .put_cf(store.cf(CF_META), checkpoint_key(partition), v);
    }

    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
}

/// Encodes a timer as it is stored here and on `timers`.
pub fn encode_timer(state: &TimerState) -> Vec<u8> {
    codec::encode(state, &Framing::SingleObject)
}

/// Stores and timers for the tests of the store and of what reads it.
#[cfg(test)]
pub(crate) mod testing {
    use super::{encode_timer, Store};
    use crate::model::records::TimerState;

    /// A fresh store in a directory of its own (kept while the `TempDir` lives).
    pub fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        (dir, store)
    }

    /// Stores `timers` in partition `p` (none stored before), in one batch.
    pub fn put(store: &Store, p: u16, timers: impl IntoIterator<Item = TimerState>) {
        let mut b = store.batch();
        for t in timers {
            b.put_timer(store, p, &t, &encode_timer(&t), 0, None, store.wake(&t));
        }
        store.write(b).unwrap();
    }

    /// A timer of `tenant`'s job `job` (every second) whose next fire is `wake`.
    pub fn timer(job: &str, tenant: &str, wake: i64) -> TimerState {
        use crate::model::job::{HandlerKind, HandlerSpec, JobDefinition, ScheduleSpec};
        let handler = HandlerSpec {
            kind: HandlerKind::Kafka,
            target: "out".into(),
            payload: Vec::new(),
            headers: Default::default(),
            method: None,
            args: Vec::new(),
        };
        let every = ScheduleSpec::Interval {
            every_ms: 1_000,
            anchor_ms: 0,
        };
        TimerState {
            definition: JobDefinition::new(job, tenant, every, handler),
            next_fire_ms: Some(wake),
            fires: 0,
            last_scheduled_ms: None,
            in_flight: None,
            buffered_ms: None,
            pending: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::timer;
    use super::*;

    #[test]
    fn instant_keys_sort_like_instants() {
        let xs = [i64::MIN, -5_000, -1, 0, 1, 999, 1_700_000_000_000, i64::MAX];
        for w in xs.windows(2) {
            assert!(instant_key(w[0]) < instant_key(w[1]), "{} < {}", w[0], w[1]);
            assert_eq!(instant_from_key(&instant_key(w[0])), w[0]);
        }
    }

    fn move_timer(store: &Store, job: &str, from: Option<i64>, to: i64) {
        let mut b = store.batch();
        let t = timer(job, "t", to);
        b.put_timer(store, 3, &t, &encode_timer(&t), 0, from, Some(to));
        store.write(b).unwrap();
    }

    fn due(store: &Store, upto: i64) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        store.due(3, upto, 1_000, &mut out).unwrap();
        out.into_iter().map(|e| (e.job, e.wake_ms)).collect()
    }

    /// The batched read answers each job as its point read does: its state, nothing for a job
    /// not stored (or stored in another partition), the error for a corrupt value.
    #[test]
    fn a_batched_read_answers_each_job_as_a_point_read_does() {
        let (_dir, store) = testing::store();
        testing::put(&store, 1, [timer("a", "t", 1_000), timer("b", "u", 2_000)]);
        testing::put(&store, 2, [timer("a", "t", 3_000)]);
        store
            .db
            .put_cf(store.cf(CF_TIMERS), timer_key(2, "bad"), b"short")
            .unwrap();
        let jobs = [
            (2, "a"),
            (1, "missing"),
            (1, "a"),
            (2, "bad"),
            (2, "b"),
            (1, "b"),
        ];
        let batched = store.timers(&jobs);
        assert_eq!(batched.len(), jobs.len());
        for ((p, job), got) in jobs.iter().zip(batched) {
            match (store.timer(*p, job), got) {
                (Ok(point), Ok(got)) => assert_eq!(point, got, "{p}/{job}"),
                (Err(point), Err(got)) => assert_eq!(point.to_string(), got.to_string()),
                (point, got) => panic!("{p}/{job}: point read {point:?}, batched {got:?}"),
            }
        }
        let found: Vec<Option<i64>> = store
            .timers(&jobs[..3])
            .into_iter()
            .map(|t| t.unwrap().and_then(|t| t.next_fire_ms))
            .collect();
        assert_eq!(found, vec![Some(3_000), None, Some(1_000)]);
    }

    /// Scans start at the partition's floor; an entry written below it later is still found.
    #[test]
    fn due_scan_sees_entries_written_below_its_floor() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        move_timer(&store, "a", None, 1_000);
        move_timer(&store, "b", None, 5_000);
        assert_eq!(due(&store, 2_000), vec![("a".into(), 1_000)]);
        // "a" fires and moves on: its old key is a tombstone below the floor now.
        move_timer(&store, "a", Some(1_000), 6_000);
        assert_eq!(due(&store, 2_000), vec![]);
        assert_eq!(store.floor(3), 5_000);
        // A retry or a new job due earlier than anything indexed.
        move_timer(&store, "c", None, 1_500);
        assert_eq!(due(&store, 2_000), vec![("c".into(), 1_500)]);
        assert_eq!(
            due(&store, 10_000),
            vec![
                ("c".into(), 1_500),
                ("b".into(), 5_000),
                ("a".into(), 6_000)
            ]
        );
        // Emptied, then refilled.
        store.clear_partition(3).unwrap();
        assert_eq!(due(&store, 10_000), vec![]);
        move_timer(&store, "d", None, 700);
        assert_eq!(due(&store, 10_000), vec![("d".into(), 700)]);
    }

    /// A partition emptied by a herd (all its one-shots fired and deleted) reads as empty, and
    /// the partitions around it keep theirs: the scan stays within its partition.
    #[test]
    fn due_scan_of_an_emptied_partition_stays_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        let mut b = store.batch();
        for p in 0..4u16 {
            for i in 0..100 {
                let t = timer(&format!("j{p}-{i}"), "t", 1_000);
                b.put_timer(&store, p, &t, &encode_timer(&t), 0, None, Some(1_000));
            }
        }
        store.write(b).unwrap();
        let scan = |p: u16| {
            let mut out = Vec::new();
            store.due(p, 2_000, 1_000, &mut out).unwrap();
            out.len()
        };
        assert_eq!((scan(1), scan(2)), (100, 100));
        let mut b = store.batch();
        for p in 1..3u16 {
            for i in 0..100 {
                b.delete_timer(&store, p, &format!("j{p}-{i}"), Some(1_000));
            }
        }
        store.write(b).unwrap();
        assert_eq!([scan(0), scan(1), scan(2), scan(3)], [100, 0, 0, 100]);
        assert_eq!(store.floor(1), i64::MAX);
        let mut out = Vec::new();
        store.due(u16::MAX, 2_000, 1_000, &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn timers_keep_their_sequence_and_due_besides_skips_the_moved() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        let mut b = store.batch();
        for (job, wake, seq) in [("a", 1_000, 4), ("b", 2_000, 9), ("c", 3_000, 2)] {
            let t = timer(job, "t", wake);
            b.put_timer(&store, 3, &t, &encode_timer(&t), seq, None, Some(wake));
        }
        store.write(b).unwrap();
        let (state, seq) = store.timer_seq(3, "b").unwrap().unwrap();
        assert_eq!((state.next_fire_ms, seq), (Some(2_000), 9));
        assert_eq!(
            store.timer(3, "a").unwrap().unwrap().next_fire_ms,
            Some(1_000)
        );
        assert_eq!(store.timers_summary(3).unwrap(), (3, 9));
        assert_eq!(store.timers_summary(4).unwrap(), (0, 0));
        let tenants =
            |names: &[&str]| Besides::Tenants(names.iter().map(|n| n.to_string()).collect());
        assert_eq!(
            store.due_besides(3, 2_000, true, |_| false).unwrap(),
            tenants(&["t"])
        );
        assert_eq!(
            store.due_besides(3, 2_000, true, |j| j != "c").unwrap(),
            Besides::Nothing
        );
        assert_eq!(
            store.due_besides(3, 999, true, |_| false).unwrap(),
            Besides::Nothing
        );
        assert_eq!(
            store.due_besides(3, 5_000, true, |_| true).unwrap(),
            Besides::Nothing
        );
        assert_eq!(
            store.due_besides(2, 5_000, true, |_| false).unwrap(),
            Besides::Nothing
        );
        let mut b = store.batch();
        let t = timer("d", "u", 1_500);
        b.put_timer(&store, 3, &t, &encode_timer(&t), 1, None, Some(1_500));
        store.write(b).unwrap();
        assert_eq!(
            store.due_besides(3, 2_000, true, |j| j == "b").unwrap(),
            tenants(&["t", "u"])
        );
        assert_eq!(
            store.due_besides(3, 2_000, true, |j| j != "d").unwrap(),
            tenants(&["u"])
        );
        // Only the first: "a" (1 s) is before "d" (1.5 s).
        assert_eq!(
            store.due_besides(3, 2_000, false, |_| false).unwrap(),
            tenants(&["t"])
        );
    }

    /// A store of the layout before progress sequences is emptied at open (it is replayed).
    #[test]
    fn a_store_of_another_layout_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path(), Default::default()).unwrap();
            move_timer(&store, "a", None, 1_000);
            store.db.delete_cf(store.cf(CF_META), FORMAT_KEY).unwrap();
        }
        let store = Store::open(dir.path(), Default::default()).unwrap();
        assert_eq!(store.timers_summary(3).unwrap(), (0, 0));
        assert_eq!(due(&store, 10_000), vec![]);
        move_timer(&store, "b", None, 1_000);
        drop(store);
        let store = Store::open(dir.path(), Default::default()).unwrap();
        assert_eq!(due(&store, 10_000), vec![("b".into(), 1_000)]);
    }

    /// The index is keyed with the lookahead: a store opened with another one is emptied (and
    /// replayed), never read with keys that no longer say what is due.
    #[test]
    fn a_store_opened_with_another_lookahead_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let led = Lookahead::new(1_000);
        {
            let store = Store::open(dir.path(), led).unwrap();
            move_timer(&store, "a", None, 1_000);
        }
        let store = Store::open(dir.path(), led).unwrap();
        assert_eq!(
            due(&store, 10_000),
            vec![("a".into(), 1_000)],
            "same lookahead: kept"
        );
        drop(store);
        let store = Store::open(dir.path(), Lookahead::new(500)).unwrap();
        assert_eq!(store.timers_summary(3).unwrap(), (0, 0));
        assert_eq!(due(&store, 10_000), vec![]);
    }

    #[test]
    fn a_timer_is_indexed_at_its_wake_less_its_job_s_lead() {
        use crate::model::job::HandlerKind;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Lookahead::new(1_000)).unwrap();
        let mut led = testing::timer("a", "t", 5_000);
        led.definition.handler.kind = HandlerKind::Exec;
        let kafka = testing::timer("b", "t", 5_000);
        assert_eq!(store.wake(&led), Some(4_000));
        assert_eq!(store.wake(&kafka), Some(5_000));
        testing::put(&store, 3, [led, kafka]);
        assert_eq!(due(&store, 4_999), vec![("a".into(), 4_000)]);
    }

    #[test]
    fn the_read_only_views_list_timers_and_count_what_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        for (job, wake) in [("b", 1_000), ("a", 2_000), ("c", 9_000)] {
            move_timer(&store, job, None, wake);
        }
        move_timer(&store, "other", None, 1_000);
        let mut seen = Vec::new();
        store
            .timers_after(3, "a", |t| {
                seen.push(t.definition.id);
                true
            })
            .unwrap();
        assert_eq!(seen, ["b", "c", "other"]);
        let mut first = Vec::new();
        store
            .timers_after(3, "", |t| {
                first.push(t.definition.id);
                false
            })
            .unwrap();
        assert_eq!(first, ["a"]);
        assert_eq!(store.count_due(3, 2_000, 100).unwrap(), 3);
        assert_eq!(store.count_due(3, 2_000, 2).unwrap(), 2);
        assert_eq!(store.count_due(3, 500, 100).unwrap(), 0);
        assert_eq!(store.count_due(4, 10_000, 100).unwrap(), 0);
    }

    #[test]
    fn due_keys_group_by_partition_then_time() {
        assert!(due_key(1, 5, "zzz") < due_key(1, 6, "a"));
        assert!(due_key(1, i64::MAX, "z") < due_key(2, i64::MIN, "a"));
    }
}
