//! The firing engine of one scheduler node: one thread that owns the group consumer, the
//! transactional producer and the RocksDB store, so no state is shared and no transaction is
//! ever open while the consumer is polled (rebalance callbacks run inside poll, so a partition
//! is only ever given back between transactions).

use std::collections::BTreeMap;

// Seeded per process, so a tenant cannot choose job ids that collide (unlike FxHash), and
// several times cheaper than SipHash on the firing path's lookups.
use foldhash::{HashMap, HashMapExt, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::BaseRecord;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::fire::{self, FireLimits};
use super::firing::{guarded, is_record_fault, Fault, Firing, Prepared};
use super::ingest::{self, ControlChange, JobChange, Lanes, Schedules};
use super::lifecycle::{Action, Event, Lifecycle};
use super::output::{Out, Output};
use super::producer::{fenced, Refusals, TxnProducer, TXN_TIMEOUT};
use super::progress::Progress;
use super::restore::{Mark, Replay};
use super::scan::{self, SCAN_LIMIT};
use super::store::{encode_timer, Checkpoint, DueEntry, Store};
use super::takeover::{Fencer, Fetched, Held, OffsetFetch, Trigger};
use super::txn::Txn;
use super::SchedulerError;
use crate::codec::{self, Framing};
use crate::config::Config;
use crate::kafka::admin::Admin;
use crate::model::records::TimerState;
use crate::model::validate::Limits;
use crate::node::{NodeStatus, NowFn, IDLE_READY_AFTER};
use crate::telemetry::{self, AbortReason, Rejection};

type Result<T, E = SchedulerError> = std::result::Result<T, E>;

/// A checkpoint older than this is not trusted: compaction may since have removed tombstones
/// (the topic default `delete.retention.ms` is 24 h), so replay starts from the beginning.
const CHECKPOINT_MAX_AGE_MS: i64 = 12 * 3_600_000;
/// How long a newly assigned partition's committed-offset fetch may go unanswered before the
/// broker is taken to be holding it for a departed owner's open transaction
/// (`UNSTABLE_OFFSET_COMMIT`), whose owner is then fenced if the group no longer has it. An
/// answer takes milliseconds otherwise; a fence of a node that had nothing open costs one
/// `InitProducerId`.
const FETCH_HELD_AFTER: Duration = Duration::from_millis(300);
/// How soon a committed-offset fetch that failed is tried again.
const FETCH_RETRY_AFTER: Duration = Duration::from_millis(500);
/// Transactions a job's records may fail, refused by the broker for what they are, before the
/// job is set aside in `jobs.rejected`. Two, so one odd refusal is retried.
const QUARANTINE_AFTER: u32 = 2;

/// One rebalance: assigned (true) or revoked, and the (topic, partition) pairs.
type RebalanceEvent = (bool, Vec<(String, i32)>);

/// Rebalance events, recorded inside poll and handled right after it returns.
#[derive(Default)]
struct GroupContext {
    events: Mutex<Vec<RebalanceEvent>>,
}

impl ClientContext for GroupContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::client::log(level, fac, message);
    }
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::client::report(&error, reason);
    }
}

impl ConsumerContext for GroupContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                // Nothing of a new partition is processed before its timers are restored.
                if let Err(e) = consumer.pause(tpl) {
                    warn!(error = %e, "could not pause newly assigned partitions");
                }
                self.events.lock().unwrap().push((true, list(tpl)));
            }
            Rebalance::Revoke(tpl) => self.events.lock().unwrap().push((false, list(tpl))),
            Rebalance::Error(e) => warn!(error = %e, "rebalance error"),
        }
    }
}

fn list(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

struct Topics {
    jobs: String,
    timers: String,
    control: String,
    runs: String,
}

/// What the offset fetch answers: the committed offsets, and the replay marks listed right after
/// them.
type FetchAnswer = (TopicPartitionList, HashMap<i32, Mark>);

/// What a transaction carried, for its log line.
struct Shape {
    records: usize,
    due: usize,
    now: i64,
    started: Instant,
    fill_ms: u64,
}

pub struct Engine {
    config: Config,
    node_id: String,
    now: NowFn,
    status: Arc<NodeStatus>,
    store: Arc<Store>,
    producer: TxnProducer,
    /// Shared with the offset fetch's thread.
    group: Arc<BaseConsumer<GroupContext>>,
    /// The replay of `timers` for the partitions restoring.
    replay: Replay,
    /// Whom to fence, from the group's membership (described on a thread of its own).
    fencer: Fencer,
    /// The committed-offset fetch of newly assigned partitions: (partition, assignment token).
    fetch: OffsetFetch<Vec<(i32, String)>, FetchAnswer>,
    topics: Topics,
    parts: BTreeMap<i32, Lifecycle<OwnedMessage>>,
    /// The origin of the monotonic milliseconds the lifecycles are told time in.
    started: Instant,
    /// Next offset to commit per (topic, partition), as of the last committed transaction.
    committed: HashMap<(String, i32), i64>,
    schedules: Schedules,
    /// Lanes, `runs`, `dead`, `jobs.rejected` and direct delivery.
    output: Output,
    assignments: u64,
    /// Partitions released so far: with `assignments`, what a chunk fired ahead was fired
    /// against (`Prepared::epoch`).
    releases: u64,
    /// The (assignments, owned, active) the node's view was last published at.
    published: Option<(u64, usize, usize)>,
    /// When each partition restoring now was assigned.
    restore_started: HashMap<i32, Instant>,
    /// Whether the group has handed this node an assignment yet: before that, owning no
    /// partitions says nothing, and the node is not ready.
    assigned_once: bool,
    /// When the node subscribed: a node the group gives nothing counts as assigned once it has
    /// been in the group `IDLE_READY_AFTER` without.
    subscribed: Option<Instant>,
    limits: Limits,
    /// Jobs (by key) whose records the broker refused, with the reason and how often: at
    /// `QUARANTINE_AFTER` the job is set aside (`quarantine_record`, `quarantine_timer`).
    suspects: HashMap<String, (u32, String)>,
    /// Per owned `jobs` partition, its firing progress as of the last committed transaction
    /// (`progress`); committed with every offset of the partition.
    progress: HashMap<i32, Progress>,
}

impl Engine {
    pub fn new(
        config: Config,
        node_id: String,
        now: NowFn,
        status: Arc<NodeStatus>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Engine> {
        // One store per (topic prefix, node): two fleets sharing a data directory never mix.
        let dir = config
            .scheduler
            .data_dir
            .join(config.topic_prefix.trim_end_matches('.'))
            .join(&node_id);
        std::fs::create_dir_all(&dir).map_err(|e| SchedulerError::DataDir {
            path: dir.clone(),
            source: e,
        })?;
        let lookahead = fire::Lookahead::new(config.scheduler.lookahead_ms as i64);
        let store = Arc::new(Store::open(&dir, lookahead)?);
        status.view.attach(store.clone());
        let topics = Topics {
            jobs: config.topic("jobs"),
            timers: config.topic("timers"),
            control: config.topic("control"),
            runs: config.topic("runs"),
        };
        let producer = TxnProducer::new(&config, &node_id, &topics.timers)?;

        let mut gc = crate::kafka::consumer_config(&config, &config.scheduler.group_id);
        // The member's client id names its fleet and node, as the transactional id does: the
        // membership (`takeover`) tells this fleet's nodes from another's in a shared group.
        gc.set(
            "client.id",
            super::takeover::member_client_id(&config, &node_id),
        );
        gc.set("group.protocol", "consumer");
        // The broker's range assignor gives partition p of `jobs` and of `control` to the
        // same member: the two topics are co-partitioned.
        gc.set("group.remote.assignor", "range");
        gc.set("fetch.wait.max.ms", "50");
        if config.scheduler.static_membership {
            gc.set("group.instance.id", format!("tocsin-scheduler-{node_id}"));
        }
        for (k, v) in &config.kafka {
            gc.set(k, v);
        }
        let group: BaseConsumer<GroupContext> = gc.create_with_context(GroupContext::default())?;
        let group = Arc::new(group);
        let fencer = Fencer::start(&config, &node_id, &topics.jobs);

        let replay = Replay::new(&config, &node_id, &topics.timers)?;

        let admin = Admin::new(&config)?;
        let limits = record_limits(&config, &admin, &runtime, &topics);
        let lanes = Lanes::new(&config, admin, runtime);
        let output = Output::new(&config, &node_id, lanes, limits.max_record_bytes);
        Ok(Engine {
            config,
            node_id,
            now,
            status,
            store,
            producer,
            group,
            replay,
            fencer,
            fetch: OffsetFetch::default(),
            output,
            topics,
            parts: BTreeMap::new(),
            started: Instant::now(),
            committed: HashMap::new(),
            schedules: Schedules::default(),
            assignments: 0,
            releases: 0,
            restore_started: HashMap::new(),
            published: None,
            assigned_once: false,
            subscribed: None,
            limits,
            suspects: HashMap::new(),
            progress: HashMap::new(),
        })
    }

    /// Runs until `shutdown` is cancelled. Never returns with a transaction open.
    pub fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        self.output.seed_lanes();
        self.producer.init(&shutdown)?;
        self.group
            .subscribe(&[&self.topics.jobs, &self.topics.control])?;
        self.subscribed = Some(Instant::now());
        info!(node = %self.node_id, kafka_delivery = ?self.config.scheduler.kafka_delivery, "scheduler joined the group");
        let tick = self.config.scheduler.tick_ms as i64;
        let mut next_tick = ((self.now)() / tick + 1) * tick;
        let mut backoff = Duration::from_millis(100);
        while !shutdown.is_cancelled() {
            let step = self.step(&mut next_tick, tick);
            match step {
                Ok(()) => {
                    backoff = Duration::from_millis(100);
                    self.status.failing_since_ms.store(0, Ordering::Relaxed);
                }
                Err(e) => {
                    self.status.ready.store(false, Ordering::Relaxed);
                    let now = (self.now)();
                    let _ = self.status.failing_since_ms.compare_exchange(
                        0,
                        now,
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                    *self.status.last_error.lock().unwrap() = Some((now, e.to_string()));
                    warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "scheduler step failed; retrying");
                    std::thread::sleep(backoff);
                    // Fenced (a zombie's return: a newer producer epoch, or a group member
                    // that lost its partitions) is not the broker struggling: the producer is
                    // recreated and the group rejoined at once, so waiting longer each time
                    // would only delay the restore of what the group hands back.
                    if !fenced(&e) {
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                    if let Err(e) = self.producer.recover(&e) {
                        error!(error = %e, "could not recover the producer");
                    }
                }
            }
        }
        info!(node = %self.node_id, "scheduler stopping");
        self.group.unsubscribe();
        // Serve the revocation so the group hands our partitions on at once.
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let _ = self.group.poll(Duration::from_millis(50));
            self.events();
            if self.parts.is_empty() {
                break;
            }
        }
        Ok(())
    }

    fn step(&mut self, next_tick: &mut i64, tick: i64) -> Result<()> {
        self.producer.ensure_initialised()?;
        let now = (self.now)();
        let wait = (*next_tick - now).clamp(0, 50) as u64;
        let batch = self.poll_group(Duration::from_millis(wait))?;
        // The restore's steps, only while a partition restores (or a fetch for one is out).
        if self.fetch.in_flight().is_some() || self.parts.values().any(|p| !p.is_active()) {
            self.fencer.fence_departed_holders();
            self.fetch_offsets();
            self.poll_restore()?;
        }
        if !batch.is_empty() {
            self.transact(batch)?;
        }
        self.output.create_wanted_lanes();
        let now = (self.now)();
        if now >= *next_tick {
            self.fire_tick(now)?;
            *next_tick = ((self.now)() / tick + 1) * tick;
        }
        let active = self.parts.values().filter(|p| p.is_active()).count();
        self.status.owned.store(self.parts.len(), Ordering::Relaxed);
        self.status.active.store(active, Ordering::Relaxed);
        telemetry::partitions(self.parts.len() - active, active);
        // The owned set changes only by an assignment (`assignments` counts them), a release
        // (`parts` shrinks) or an activation (`active` grows): republish only then.
        let shape = (self.assignments, self.parts.len(), active);
        if self.published != Some(shape) {
            (self.status.view).publish(self.parts.iter().map(|(p, l)| (*p, l.is_active())));
            self.published = Some(shape);
        }
        let assigned = self.assigned_once
            || self
                .subscribed
                .is_some_and(|t| t.elapsed() >= IDLE_READY_AFTER);
        self.status
            .ready
            .store(assigned && active == self.parts.len(), Ordering::Relaxed);
        Ok(())
    }

    /// Polls the group for up to `wait`; returns the records of Active partitions, buffers
    /// those of Restoring ones.
    fn poll_group(&mut self, wait: Duration) -> Result<Vec<OwnedMessage>> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.group.poll(left) {
                Some(Ok(m)) => {
                    let m = m.detach();
                    if let Some(part) = self.parts.get_mut(&m.partition()) {
                        if let Some(Action::Apply(m)) = part.on(Event::Record(m)) {
                            out.push(m);
                        }
                    }
                }
                Some(Err(e)) => {
                    crate::kafka::client::report(&e, "group consumer");
                }
                None => {}
            }
            let revoked = self.events();
            if !revoked.is_empty() {
                out.retain(|m| !revoked.contains(&m.partition()));
            }
            if out.len() >= 10_000 || Instant::now() >= deadline {
                return Ok(out);
            }
        }
    }

    /// Handles recorded rebalance events; returns the partitions given up.
    fn events(&mut self) -> Vec<i32> {
        let events = std::mem::take(&mut *self.group.context().events.lock().unwrap());
        let mut revoked = Vec::new();
        for (assigned, parts) in events {
            let of = |topic: &str| -> Vec<i32> {
                parts
                    .iter()
                    .filter(|(t, _)| t == topic)
                    .map(|(_, p)| *p)
                    .collect()
            };
            let (jobs, control) = (of(&self.topics.jobs), of(&self.topics.control));
            telemetry::rebalanced(assigned, jobs.len());
            if assigned {
                self.assigned_once = true;
                info!(jobs = ?jobs, control = ?control, "assigned partitions");
                if jobs != control {
                    // Range assignment co-partitions the two topics; a split means a control
                    // partition whose timers live elsewhere: it stays paused here.
                    warn!(jobs = ?jobs, control = ?control, "jobs and control are not co-partitioned");
                }
            } else {
                info!(jobs = ?jobs, control = ?control, "revoked partitions");
            }
            // The checkpoints of the assigned partitions, read once, and the `timers` offsets
            // of those partitions, asked at once.
            let checkpoints: HashMap<i32, Checkpoint> = if assigned {
                (jobs.iter())
                    .filter_map(|p| Some((*p, self.store.checkpoint(*p as u16).ok()??)))
                    .collect()
            } else {
                HashMap::new()
            };
            let checked: Vec<i32> = checkpoints.keys().copied().collect();
            let bounds = self.replay.bounds(&checked);
            let restores_began = Instant::now();
            for (topic, p) in parts {
                if topic != self.topics.jobs {
                    continue; // `control` p follows `jobs` p
                }
                if assigned {
                    let checkpoint = checkpoints.get(&p).copied();
                    self.start_restore(p, checkpoint, bounds.get(&p).copied());
                } else {
                    self.release(p);
                    revoked.push(p);
                }
            }
            if assigned {
                // A takeover may need to know who left the group: a description asked after
                // every restore above began. One asked before them is older than the restores
                // it is for, and a held restore then waited for the next, `DESCRIBE_EVERY`
                // (2 s) later, before it could fence.
                self.fencer.assigned(&jobs, restores_began);
            }
        }
        revoked
    }

    /// `checkpoint`: the partition's, if the store has one; `bounds`: its first and last
    /// stable `timers` offsets, when known.
    fn start_restore(
        &mut self,
        p: i32,
        checkpoint: Option<Checkpoint>,
        bounds: Option<(i64, i64)>,
    ) {
        self.assignments += 1;
        self.restore_started.insert(p, Instant::now());
        let now = (self.now)();
        // A checkpoint outside the partition's current offsets belongs to another topic of
        // the same name (a recreated topic): trust it only when it fits the offsets
        // `Replay::bounds` listed for the whole assignment (only for partitions with a
        // checkpoint: a takeover of a dead node's partitions has none, and asks nothing).
        let fits = |offset: i64| bounds.is_some_and(|(low, high)| offset >= low && offset <= high);
        let from = match checkpoint {
            Some(Checkpoint { offset, written_ms })
                if now - written_ms < CHECKPOINT_MAX_AGE_MS && fits(offset) =>
            {
                Offset::Offset(offset)
            }
            _ => {
                if let Err(e) = self.store.clear_partition(p as u16) {
                    error!(partition = p, error = %e, "could not clear partition state");
                }
                Offset::Beginning
            }
        };
        let token = format!("{}/{}/{}/{}", self.node_id, self.assignments, p, now);
        self.replay.assign(p, from);
        info!(partition = p, from = ?from, "restoring partition");
        self.parts
            .insert(p, Lifecycle::assigned(&self.node_id, token));
    }

    fn release(&mut self, p: i32) {
        self.releases += 1;
        match self.parts.remove(&p) {
            Some(part) if !part.is_active() => {
                let _ = self.replay.unassign(p);
                info!(partition = p, "abandoned restore of partition");
            }
            Some(_) => info!(partition = p, "released partition"),
            None => {}
        }
        self.committed.remove(&(self.topics.jobs.clone(), p));
        self.committed.remove(&(self.topics.control.clone(), p));
        self.progress.remove(&p);
        self.restore_started.remove(&p);
        self.fencer.settled(p);
    }

    /// Fetches the committed offsets (and progress) of newly assigned partitions, one fetch at a
    /// time on a thread of its own, and takes in the answer. A fetch the broker holds names a
    /// departed owner's open transaction: that owner is fenced (`fence_departed`).
    fn fetch_offsets(&mut self) {
        match self.fetch.poll() {
            Fetched::Idle => {}
            Fetched::Waiting { since } => {
                if since.elapsed() >= FETCH_HELD_AFTER {
                    let held: Vec<i32> = (self.fetch.in_flight().into_iter().flatten())
                        .filter(|(p, token)| Self::restoring(&self.parts, *p, token))
                        .map(|(p, _)| *p)
                        .collect();
                    let held = self.held(&held);
                    self.fencer.fence_held(&held, Trigger::OffsetFetchHeld);
                }
                return;
            }
            Fetched::Done { of, took, answer } => match answer {
                Ok(committed) => self.take_committed(&of, &committed, took),
                Err(e) => {
                    warn!(error = %e, partitions = of.len(), took_ms = took.as_millis() as u64,
                        "could not fetch committed offsets; retrying");
                    self.fetch.retry_after(FETCH_RETRY_AFTER);
                }
            },
        }
        if !self.fetch.can_start() {
            return;
        }
        let want: Vec<(i32, String)> = (self.parts.iter())
            .filter_map(|(p, part)| Some((*p, part.offsets_to_fetch()?.to_owned())))
            .collect();
        if want.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (p, _) in &want {
            tpl.add_partition(&self.topics.jobs, *p);
            tpl.add_partition(&self.topics.control, *p);
        }
        let marks: Vec<(i32, bool)> = (want.iter())
            .map(|(p, _)| (*p, self.replay.starts_at_first(*p)))
            .collect();
        debug!(partitions = want.len(), "fetching committed offsets");
        let (group, marker) = (self.group.clone(), self.replay.marker());
        // The marks are listed only once the fetch is answered (`restore`'s doc says why).
        let fetch = move || {
            Ok((
                group.committed_offsets(tpl, TXN_TIMEOUT)?,
                marker.list(&marks)?,
            ))
        };
        self.fetch.start(fetch, want);
    }

    /// Whether `p` is restoring under the assignment `token` still, in `parts`.
    fn restoring(parts: &BTreeMap<i32, Lifecycle<OwnedMessage>>, p: i32, token: &str) -> bool {
        (parts.get(&p)).is_some_and(|part| part.restoring_token() == Some(token))
    }

    /// Applies fetched committed offsets, and the replay marks listed right after them, to the
    /// partitions still restoring under the assignment they were fetched for. One the listing
    /// left out is fetched again.
    fn take_committed(
        &mut self,
        of: &[(i32, String)],
        (committed, marks): &FetchAnswer,
        took: Duration,
    ) {
        let (parts, replay) = (&self.parts, &mut self.replay);
        let current: HashSet<i32> = (of.iter())
            .filter(|(p, token)| Self::restoring(parts, *p, token))
            .filter(|(p, _)| {
                (marks.get(p)).is_some_and(|(first, high)| replay.mark(*p, *first, *high))
            })
            .map(|(p, _)| *p)
            .collect();
        for e in committed.elements() {
            if !current.contains(&e.partition()) {
                continue;
            }
            if e.topic() == self.topics.jobs {
                let metadata =
                    std::panic::catch_unwind(|| e.metadata().to_owned()).unwrap_or_default();
                let progress = Progress::decode(&metadata);
                debug!(partition = e.partition(), progress = ?progress, "committed progress");
                self.progress.insert(e.partition(), progress);
            }
            if let Offset::Offset(o) = e.offset() {
                self.committed
                    .insert((e.topic().to_owned(), e.partition()), o);
            }
        }
        let at_ms = self.mono_ms();
        for p in &current {
            if let Some(part) = self.parts.get_mut(p) {
                part.on(Event::OffsetsFetched);
                part.on(Event::Marked { at_ms });
            }
        }
        if current.len() < of.len() {
            warn!(
                partitions = of.len() - current.len(),
                "could not list the timers high watermarks of some partitions; fetching them again"
            );
        }
        info!(
            partitions = current.len(),
            took_ms = took.as_millis() as u64,
            "committed offsets fetched, replay ends marked"
        );
    }

    /// Adds an offset to commit; one of a `jobs` partition carries the partition's progress
    /// (`progress`, or as of the last commit), so no commit ever drops it.
    fn add_offset(
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

    fn commit(&mut self, offsets: &TopicPartitionList) -> Result<()> {
        let group = self.group.group_metadata();
        self.producer.commit(offsets, group)
    }

    /// Milliseconds since the engine started, on the monotonic clock (the lifecycles' time:
    /// `now` may be a test's clock).
    fn mono_ms(&self) -> i64 {
        self.started.elapsed().as_millis() as i64
    }

    /// Replays `timers` for Restoring partitions; promotes those caught up with their mark.
    fn poll_restore(&mut self) -> Result<()> {
        let now = (self.now)();
        let done = (self.replay).step(&self.store, &mut self.parts, &mut self.schedules, now)?;
        for (p, buffered) in done {
            self.activate(p, buffered)?;
        }
        self.fence_stalled_owners();
        Ok(())
    }

    /// A replay that does not reach its mark means an open transaction holds the partition:
    /// the previous owner died or stalled mid-transaction. Rather than wait for the broker to
    /// abort it (`transaction.timeout.ms`, plus its abort sweep), fence that owner's
    /// transactional id, which aborts the transaction at once (`Fencer`, which fences only a
    /// node the group no longer has, on a thread of its own, so firing of the partitions
    /// already active goes on).
    fn fence_stalled_owners(&mut self) {
        let now_ms = self.mono_ms();
        let late: Vec<i32> = (self.parts.iter_mut())
            .filter_map(|(p, part)| match part.on(Event::Tick { now_ms }) {
                Some(Action::Fence) => Some(*p),
                _ => None,
            })
            .collect();
        if !late.is_empty() {
            let held = self.held(&late);
            self.fencer.fence_held(&held, Trigger::ReplayLate);
        }
    }

    /// What the fencer needs of the restoring partitions `ps`.
    fn held(&self, ps: &[i32]) -> Vec<Held> {
        (ps.iter())
            .filter_map(|p| {
                Some(Held {
                    partition: *p,
                    since: self.restore_started.get(p).copied()?,
                    barrier_owner: self.parts.get(p)?.previous_owner().map(str::to_owned),
                })
            })
            .collect()
    }

    /// Starts firing `p`, whose replay just completed, after applying what was consumed of
    /// it meanwhile (`buffered`).
    fn activate(&mut self, p: i32, buffered: Vec<OwnedMessage>) -> Result<()> {
        self.replay.unassign(p)?;
        // A sequence never goes back, even when the committed progress was lost (offsets
        // reset or expired): a state written later must never look older than a mark.
        let (timers, max_seq) = self.store.timers_summary(p as u16)?;
        let progress = self.progress.entry(p).or_default();
        progress.seq = progress.seq.max(max_seq);
        let advanced = self.advance_to_progress(p)?;
        let took = self.restore_started.remove(&p).map(|t| t.elapsed());
        self.fencer.settled(p);
        telemetry::partition_active(p, timers, advanced, took);
        if !buffered.is_empty() {
            self.transact(buffered)?;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topics.jobs, p);
        tpl.add_partition(&self.topics.control, p);
        self.group.resume(&tpl)?;
        Ok(())
    }

    /// Brings the restored timers of `p` that were fired plainly since they were written up to
    /// the partition's committed progress (`progress`). Returns how many it advanced.
    fn advance_to_progress(&mut self, p: i32) -> Result<usize> {
        let progress = self.progress.get(&p).cloned().unwrap_or_default();
        let Some(upto) = progress.reach() else {
            return Ok(0);
        };
        let started = Instant::now();
        let mut due = Vec::new();
        // The index is keyed with this node's lookahead, a mark with its maker's: every timer
        // a mark (the partition's or a tenant's) may advance is indexed at or before the
        // farthest through plus that mark's lead.
        self.store.due(p as u16, upto, usize::MAX, &mut due)?;
        let mut batch = self.store.batch();
        let mut advanced = 0;
        for e in due {
            let Some((mut state, seq)) = self.store.timer_seq(p as u16, &e.job)? else {
                continue;
            };
            let wake = self.store.wake(&state);
            let Some(through) = progress.advances(seq, &state) else {
                continue;
            };
            let Some(schedule) = self.schedules.of(&state.definition) else {
                continue;
            };
            if fire::advance(&mut state, &schedule, through) > 0 {
                let new_wake = self.store.wake(&state);
                let bytes = encode_timer(&state);
                batch.put_timer(&self.store, p as u16, &state, &bytes, seq, wake, new_wake);
                advanced += 1;
            }
        }
        self.store.write(batch)?;
        if advanced > 0 {
            info!(
                partition = p,
                advanced,
                reach_ms = upto,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "advanced timers fired since they were written"
            );
        }
        Ok(advanced)
    }

    /// Fires everything due at `now` in Active partitions, fairly across tenants, in bounded
    /// transactions.
    fn fire_tick(&mut self, now: i64) -> Result<()> {
        let active: Vec<i32> = self
            .parts
            .iter()
            .filter(|(_, ph)| ph.is_active())
            .map(|(p, _)| *p)
            .collect();
        let store = self.store.clone();
        let chunk = self.config.scheduler.max_runs_per_transaction;
        let first = scan::tick::<SchedulerError>(&store, active, now, SCAN_LIMIT, |round| {
            debug!(
                round = round.number,
                due = round.due.len(),
                truncated = round.truncated.len(),
                scan_ms = round.took.as_millis() as u64,
                "due scanned"
            );
            // Each chunk's transaction fires the next one while it commits (`firing`).
            let chunks: Vec<&[DueEntry]> = round.due.chunks(chunk).collect();
            let mut ahead: Option<Prepared> = None;
            for (i, due) in chunks.iter().enumerate() {
                let prepared = match ahead.take() {
                    Some(p) if p.epoch == self.epoch() => p,
                    _ => {
                        let (now, epoch) = ((self.now)(), self.epoch());
                        self.firing().0.prepare(due, now, epoch)?
                    }
                };
                ahead = self.transact_prepared(prepared, chunks.get(i + 1).copied())?;
                // Keep serving the group between chunks of a herd. What it brings may change
                // the jobs of the chunk fired ahead: that is fired again.
                let more = self.poll_group(Duration::ZERO)?;
                if !more.is_empty() {
                    self.transact(more)?;
                    ahead = None;
                }
            }
            Ok(round
                .truncated
                .into_iter()
                .filter(|p| self.parts.get(p).is_some_and(|l| l.is_active()))
                .collect())
        })?;
        telemetry::due_scanned(first);
        Ok(())
    }

    /// One transaction of consumed `jobs`/`control` records: apply them, commit the consumed
    /// positions with them (the fence), then apply the RocksDB batch.
    fn transact(&mut self, records: Vec<OwnedMessage>) -> Result<()> {
        let now = (self.now)();
        let started = Instant::now();
        self.producer.begin()?;
        let mut txn = Txn::new(self.store.batch());
        let filled = self
            .fill(&mut txn, &records, now)
            .and_then(|()| self.flush(&mut txn, now));
        let fill_ms = started.elapsed().as_millis() as u64;
        let result = filled.and_then(|()| {
            let offsets = self.fence_offsets(&txn)?;
            self.commit(&offsets)
        });
        let shape = Shape {
            records: records.len(),
            due: 0,
            now,
            started,
            fill_ms,
        };
        self.conclude(txn, result, shape)
    }

    /// The transaction of a chunk of due entries fired ahead (`firing`): its records sent, the
    /// entries left to fire in it fired, its positions committed, then its RocksDB batch
    /// applied. While it commits, the `next` chunk is fired, and returned.
    fn transact_prepared(
        &mut self,
        prepared: Prepared,
        next: Option<&[DueEntry]>,
    ) -> Result<Option<Prepared>> {
        let started = Instant::now();
        self.producer.begin()?;
        let Prepared {
            mut txn,
            now,
            out,
            jobs,
            slow,
            due,
            ..
        } = prepared;
        let filled = self
            .emit(&mut txn, out, &jobs, &slow, now)
            .and_then(|()| self.flush(&mut txn, now));
        let fill_ms = started.elapsed().as_millis() as u64;
        let (result, ahead) = match filled.and_then(|()| self.fence_offsets(&txn)) {
            Err(e) => (Err(e), None),
            Ok(offsets) => match next {
                None => (self.commit(&offsets), None),
                Some(next) => self.commit_and_prepare(&offsets, next),
            },
        };
        let shape = Shape {
            records: 0,
            due,
            now,
            started,
            fill_ms,
        };
        self.conclude(txn, result, shape)?;
        ahead.transpose()
    }

    /// Commits the open transaction on a thread of its own while this one fires `next`.
    fn commit_and_prepare(
        &mut self,
        offsets: &TopicPartitionList,
        next: &[DueEntry],
    ) -> (Result<()>, Option<Result<Prepared>>) {
        let group = self.group.group_metadata();
        let (now, epoch) = ((self.now)(), self.epoch());
        let (mut firing, producer) = self.firing();
        std::thread::scope(|s| {
            let commit = s.spawn(|| producer.commit(offsets, group));
            let ahead = firing.prepare(next, now, epoch);
            let committed = commit
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (committed, Some(ahead))
        })
    }

    /// What firing works with, and the producer beside it (borrowed apart, so a commit can run
    /// while the next chunk fires).
    fn firing(&mut self) -> (Firing<'_>, &TxnProducer) {
        let limits = FireLimits {
            misfire_threshold_ms: self.config.scheduler.misfire_threshold_ms as i64,
            max_runs: self.config.scheduler.max_runs_per_job_per_tick,
            completes_at_fire: false,
        };
        let firing = Firing {
            store: &self.store,
            parts: &self.parts,
            schedules: &mut self.schedules,
            output: &mut self.output,
            suspects: &self.suspects,
            limits,
            assignments: self.assignments,
        };
        (firing, &self.producer)
    }

    /// What a chunk fired ahead is valid for: no partition assigned or released since.
    fn epoch(&self) -> (u64, u64) {
        (self.assignments, self.releases)
    }

    /// Sends the records of the entries fired ahead (a job whose record is refused for what it
    /// is is set aside), then fires the entries left to fire in the transaction.
    fn emit(
        &mut self,
        txn: &mut Txn,
        out: Vec<(u32, Out)>,
        jobs: &[(i32, String)],
        slow: &[DueEntry],
        now: i64,
    ) -> Result<()> {
        let mut refused = None;
        for (at, o) in out {
            if refused == Some(at) {
                continue;
            }
            if let Err(e) = self.output.send(&self.producer, o) {
                if !is_record_fault(&e) {
                    return Err(e);
                }
                let (p, job) = &jobs[at as usize];
                self.quarantine_timer(txn, *p, job, e.to_string())?;
                refused = Some(at);
            }
        }
        for e in slow {
            let p = e.partition as i32;
            if !self.parts.get(&p).is_some_and(|l| l.is_active()) {
                continue;
            }
            if let Some(reason) = self.set_aside(&e.job) {
                self.quarantine_timer(txn, p, &e.job, reason)?;
                continue;
            }
            let fired = guarded(|| {
                let mut out = Vec::new();
                self.firing().0.fire_entry(txn, e, now, &mut out)?;
                out.into_iter()
                    .try_for_each(|o| self.output.send(&self.producer, o))
            });
            match fired {
                Ok(()) => {}
                Err(Fault::Record(reason)) => self.quarantine_timer(txn, p, &e.job, reason)?,
                Err(Fault::Step(e)) => return Err(e),
            }
        }
        Ok(())
    }

    /// Ends a transaction by `result`: on commit, its RocksDB batch applied and the node's view
    /// of what is committed moved on; on failure, aborted and its input read again.
    fn conclude(&mut self, mut txn: Txn, result: Result<()>, shape: Shape) -> Result<()> {
        let Shape {
            records,
            due,
            now,
            started,
            fill_ms,
        } = shape;
        let elapsed = started.elapsed();
        debug!(
            records,
            due,
            runs = txn.runs,
            timers_written = txn.timers_sent,
            fill_ms,
            elapsed_ms = elapsed.as_millis() as u64,
            ok = result.is_ok(),
            "transaction"
        );
        match result {
            Ok(()) => {
                let delivered = self.producer.take_delivered();
                for (p, offset) in delivered {
                    txn.batch.set_checkpoint(
                        &self.store,
                        p as u16,
                        Checkpoint {
                            offset: offset + 1,
                            written_ms: now,
                        },
                    );
                }
                let stored = Instant::now();
                self.store.write(txn.batch)?;
                debug!(
                    store_ms = stored.elapsed().as_millis() as u64,
                    "transaction stored"
                );
                for (tp, o) in txn.positions {
                    self.committed.insert(tp, o);
                }
                for (p, progress) in &txn.progress {
                    self.progress.insert(*p, progress.clone());
                    self.committed
                        .entry((self.topics.jobs.clone(), *p))
                        .or_insert(0);
                }
                self.output.committed();
                self.status.fires.fetch_add(txn.runs, Ordering::Relaxed);
                telemetry::transaction_committed(txn.runs, txn.lags, elapsed);
                Ok(())
            }
            Err(e) => {
                let Refusals {
                    records: refused,
                    targets,
                } = self.producer.abort();
                telemetry::transaction_aborted(if !refused.is_empty() || !targets.is_empty() {
                    AbortReason::Refused
                } else if fenced(&e) {
                    AbortReason::Fenced
                } else {
                    AbortReason::Broker
                });
                self.output.aborted(targets);
                for (job, reason) in refused {
                    let entry = self
                        .suspects
                        .entry(job.clone())
                        .or_insert((0, String::new()));
                    entry.0 += 1;
                    entry.1 = reason;
                    warn!(job = %job, failures = entry.0, reason = %entry.1,
                        "the broker refused a record of this job");
                }
                // The consumed records will be read again.
                for (topic, p) in txn.positions.keys() {
                    let to = self
                        .committed
                        .get(&(topic.clone(), *p))
                        .map_or(Offset::Beginning, |o| Offset::Offset(*o));
                    if let Err(e) = self.group.seek(topic, *p, to, Duration::from_secs(5)) {
                        debug!(topic = %topic, partition = p, error = %e, "seek after abort failed");
                    }
                }
                for job in txn.changed_jobs() {
                    self.schedules.forget(job);
                }
                Err(e)
            }
        }
    }

    /// The positions this transaction commits. Every transaction carries at least one, so the
    /// group coordinator checks our member epoch: a node that lost its partitions is fenced.
    ///
    /// Every `jobs` partition the transaction changed is among them, with its new progress
    /// (`progress`); one whose offset was never committed (nothing read from it yet) commits
    /// offset 0, which is where its reading starts anyway.
    fn fence_offsets(&self, txn: &Txn) -> Result<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        for ((topic, p), o) in &txn.positions {
            self.add_offset(&mut tpl, topic, *p, *o, txn.progress.get(p))?;
        }
        // Every partition fired or changed has a progress (`flush`).
        for (p, progress) in &txn.progress {
            let key = (self.topics.jobs.clone(), *p);
            if !txn.positions.contains_key(&key) {
                let o = self.committed.get(&key).copied().unwrap_or(0);
                self.add_offset(&mut tpl, &key.0, *p, o, Some(progress))?;
            }
        }
        if tpl.count() == 0 {
            if let Some(((topic, p), o)) = self
                .committed
                .iter()
                .find(|((_, p), _)| self.parts.get(p).is_some_and(|l| l.is_active()))
            {
                self.add_offset(&mut tpl, topic, *p, *o, None)?;
            }
        }
        Ok(tpl)
    }

    /// Settles the progress of each partition the transaction changed, then writes the
    /// timers it changed (`Txn::settle`, `Txn::write_timers`).
    fn flush(&mut self, txn: &mut Txn, now: i64) -> Result<()> {
        txn.settle(&self.store, &self.progress, now)?;
        txn.write_timers(&self.store, &self.producer, &self.topics.timers)
    }

    fn fill(&mut self, txn: &mut Txn, records: &[OwnedMessage], now: i64) -> Result<()> {
        for m in records {
            txn.positions
                .insert((m.topic().to_owned(), m.partition()), m.offset() + 1);
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            if let Some(reason) = self.set_aside(&key) {
                self.quarantine_record(m, reason)?;
                continue;
            }
            let result = guarded(|| {
                if m.topic() == self.topics.jobs {
                    self.ingest(txn, m, now)
                } else {
                    self.control(txn, m, now)
                }
            });
            match result {
                Ok(()) => {}
                Err(Fault::Record(reason)) => self.quarantine_record(m, reason)?,
                Err(Fault::Step(e)) => return Err(e),
            }
        }
        Ok(())
    }

    /// The reason to set a job aside, once the broker refused its records `QUARANTINE_AFTER`
    /// times.
    fn set_aside(&mut self, job: &str) -> Option<String> {
        match self.suspects.get(job) {
            Some((n, _)) if *n >= QUARANTINE_AFTER => self.suspects.remove(job).map(|(_, r)| r),
            _ => None,
        }
    }

    /// The last line of defence for an input record whose processing failed for what it is:
    /// it goes to `jobs.rejected` with the error, and the partition goes on without it.
    fn quarantine_record(&mut self, m: &OwnedMessage, reason: String) -> Result<()> {
        let job = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        self.schedules.forget(&job);
        metrics::counter!("tocsin_records_quarantined_total").increment(1);
        self.reject(m, Rejection::Failed, format!("processing failed: {reason}"))
    }

    /// The last line of defence for a stored job that cannot be fired (its lane cannot be
    /// created, or its records are refused): its definition goes to `jobs.rejected` with the
    /// error, and its timer is deleted, so the partition fires on without it. Runs of it that
    /// this transaction already holds still commit; none is fired twice.
    fn quarantine_timer(&mut self, txn: &mut Txn, p: i32, job: &str, reason: String) -> Result<()> {
        let state = self.load(txn, p, job)?;
        let old_wake = state.as_ref().and_then(|s| self.store.wake(s));
        error!(job = %job, partition = p, reason = %reason,
            "job cannot be fired; its timer is deleted and its definition is in jobs.rejected");
        metrics::counter!("tocsin_records_quarantined_total").increment(1);
        let reason = format!("job removed from the schedule: firing failed: {reason}");
        let source = format!("{}/{}", self.topics.timers, p);
        let definition = state
            .as_ref()
            .map(|s| codec::encode(&s.definition, &Framing::SingleObject));
        self.output.rejected(
            &self.producer,
            job.as_bytes(),
            definition.as_deref(),
            &reason,
            &source,
        )?;
        let record = BaseRecord::<[u8], [u8]>::to(&self.topics.timers)
            .partition(p)
            .key(job.as_bytes());
        self.producer.send(record).map_err(|(e, _)| e)?;
        txn.change(p, job, None, old_wake, false);
        self.schedules.forget(job);
        Ok(())
    }

    fn load(&self, txn: &Txn, p: i32, job: &str) -> Result<Option<TimerState>> {
        Ok(txn.load(&self.store, p, job)?)
    }

    fn ingest(&mut self, txn: &mut Txn, m: &OwnedMessage, now: i64) -> Result<()> {
        let p = m.partition();
        let existing = match ingest::job_id(m.key()) {
            Ok(job) => self.load(txn, p, job)?,
            Err(_) => None,
        };
        let old_wake = existing.as_ref().and_then(|s| self.store.wake(s));
        let record = ingest::JobRecord {
            key: m.key(),
            payload: m.payload(),
            timestamp_ms: m.timestamp().to_millis(),
        };
        match ingest::on_job(&record, existing, &self.limits, now) {
            JobChange::Reject(kind, reason) => return self.reject(m, kind, reason),
            JobChange::Nothing => {}
            JobChange::Delete { job } => {
                let record = BaseRecord::<[u8], [u8]>::to(&self.topics.timers)
                    .partition(p)
                    .key(job.as_bytes());
                self.producer.send(record).map_err(|(e, _)| e)?;
                txn.change(p, &job, None, old_wake, false);
                self.schedules.forget(&job);
            }
            JobChange::Put {
                job,
                state,
                schedule,
            } => {
                self.output.want_lane(&state.definition);
                txn.change(p, &job, Some(*state), old_wake, false);
                self.schedules.insert(job, schedule);
            }
        }
        Ok(())
    }

    fn control(&mut self, txn: &mut Txn, m: &OwnedMessage, now: i64) -> Result<()> {
        let p = m.partition();
        let record = match ingest::on_control(m.payload()) {
            ControlChange::Apply(r) => r,
            ControlChange::Reject(kind, reason) => return self.reject(m, kind, reason),
            ControlChange::Nothing => return Ok(()),
        };
        let job = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
        let Some(mut state) = self.load(txn, p, &job)? else {
            info!(job = %job, "control request for an unknown job; ignored");
            return Ok(());
        };
        let Some(schedule) = self.schedules.of(&state.definition) else {
            return Ok(());
        };
        let old_wake = self.store.wake(&state);
        if fire::apply_control(&mut state, record, &schedule, now, 10_000) {
            txn.change(p, &job, Some(state), old_wake, false);
        }
        Ok(())
    }

    /// Sends a bad input record to `jobs.rejected` with the reason; the partition flows on.
    fn reject(&mut self, m: &OwnedMessage, kind: Rejection, reason: String) -> Result<()> {
        telemetry::record_rejected(kind);
        warn!(topic = m.topic(), partition = m.partition(), offset = m.offset(), reason = %reason,
            "rejected input record");
        let source = format!("{}/{}/{}", m.topic(), m.partition(), m.offset());
        self.output.rejected(
            &self.producer,
            m.key().unwrap_or_default(),
            m.payload(),
            &reason,
            &source,
        )
    }
}

/// The limits validation holds jobs to. The largest record is the least of what our producers
/// send (librdkafka's `message.max.bytes`, unless the `[kafka]` table sets it) and what the
/// topics a job's records go to accept, read from the broker: a job whose timer state or run
/// would not fit is rejected at ingest instead of failing every transaction that carries it.
/// Lanes are created later with the broker's default, which `runs` (created with it too)
/// stands in for.
fn record_limits(
    config: &Config,
    admin: &Admin,
    runtime: &tokio::runtime::Handle,
    topics: &Topics,
) -> Limits {
    let producer_max = config
        .kafka
        .get("message.max.bytes")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(crate::model::validate::DEFAULT_MAX_RECORD_BYTES);
    let names = [
        topics.jobs.as_str(),
        topics.timers.as_str(),
        topics.runs.as_str(),
    ];
    let topic_max = match runtime.block_on(admin.max_message_bytes(&names)) {
        Ok(max) => max,
        Err(e) => {
            warn!(error = %e, "could not read the topics' max.message.bytes; using the producer's limit");
            None
        }
    };
    Limits {
        max_record_bytes: topic_max.map_or(producer_max, |t| t.min(producer_max)),
        ..Limits::from_config(config)
    }
}
