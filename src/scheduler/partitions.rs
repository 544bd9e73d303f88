//! The node's partitions: the group's assignment of `jobs` (and of `control`, co-partitioned
//! with it), each partition's lifecycle (`lifecycle`), and the restore that takes an assigned
//! partition to Active: the committed offsets and progress fetched (into the `Ledger`), the
//! replay of `timers` (`restore`), and the fence of an owner that left a transaction open
//! (`takeover`).
//!
//! Rebalance callbacks run inside the group consumer's poll, which only `poll` calls, between
//! transactions: a partition is only ever given back while no transaction is open.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashSet};
use rdkafka::consumer::{
    BaseConsumer, Consumer, ConsumerContext, ConsumerGroupMetadata, Rebalance,
};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use super::ingest::Schedules;
use super::ledger::Ledger;
use super::lifecycle::{Action, Event, Lifecycle};
use super::producer::TXN_TIMEOUT;
use super::restore::{Mark, Replay};
use super::store::{Checkpoint, Store};
use super::takeover::{Fencer, Fetched, Held, OffsetFetch, Trigger};
use super::{SchedulerError, Topics};
use crate::config::Config;
use crate::node::{NodeStatus, NowFn, IDLE_READY_AFTER};
use crate::telemetry;

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
/// How long a static member's new consumer waits for the old one's close (`rejoin`).
const STATIC_CLOSE_WAIT: Duration = Duration::from_secs(5);
/// How soon a committed-offset fetch that failed is tried again.
const FETCH_RETRY_AFTER: Duration = Duration::from_millis(500);

/// One rebalance: assigned (true) or revoked, and the (topic, partition) pairs.
type RebalanceEvent = (bool, Vec<(String, i32)>);

/// What the offset fetch answers: the committed offsets, and the replay marks listed right after
/// them.
type FetchAnswer = (TopicPartitionList, HashMap<i32, Mark>);

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

pub struct Partitions {
    node_id: String,
    now: NowFn,
    topics: Topics,
    store: Arc<Store>,
    /// Shared with the offset fetch's thread.
    group: Arc<BaseConsumer<GroupContext>>,
    /// The group consumer's settings, for a new one (`rejoin`).
    group_config: rdkafka::ClientConfig,
    /// Whether the member is static (`group.instance.id`).
    static_member: bool,
    /// The replay of `timers` for the partitions restoring.
    replay: Replay,
    /// Whom to fence, from the group's membership (described on a thread of its own).
    fencer: Fencer,
    /// The committed-offset fetch of newly assigned partitions: (partition, assignment token).
    fetch: OffsetFetch<Vec<(i32, String)>, FetchAnswer>,
    parts: BTreeMap<i32, Lifecycle<OwnedMessage>>,
    /// The origin of the monotonic milliseconds the lifecycles are told time in.
    started: Instant,
    /// Partitions assigned so far.
    assignments: u64,
    /// Partitions released so far: with `assignments`, what a chunk fired ahead was fired
    /// against (`Prepared::epoch`).
    releases: u64,
    /// When each partition restoring now was assigned.
    restore_started: HashMap<i32, Instant>,
    /// Whether the group has handed this node an assignment yet: before that, owning no
    /// partitions says nothing, and the node is not ready.
    assigned_once: bool,
    /// When the node subscribed: a node the group gives nothing counts as assigned once it has
    /// been in the group `IDLE_READY_AFTER` without.
    subscribed: Option<Instant>,
    /// The (assignments, owned, active) the node's view was last published at.
    published: Option<(u64, usize, usize)>,
}

impl Partitions {
    pub fn new(
        config: &Config,
        node_id: &str,
        now: NowFn,
        topics: Topics,
        store: Arc<Store>,
    ) -> Result<Partitions> {
        let mut gc = crate::kafka::consumer_config(config, &config.scheduler.group_id);
        // The member's client id names its fleet and node, as the transactional id does: the
        // membership (`takeover`) tells this fleet's nodes from another's in a shared group.
        gc.set(
            "client.id",
            super::takeover::member_client_id(config, node_id),
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
        let fencer = Fencer::start(config, node_id, &topics.jobs);
        let replay = Replay::new(config, node_id, &topics.timers)?;
        Ok(Partitions {
            node_id: node_id.to_owned(),
            now,
            topics,
            store,
            group: Arc::new(group),
            group_config: gc,
            static_member: config.scheduler.static_membership,
            replay,
            fencer,
            fetch: OffsetFetch::default(),
            parts: BTreeMap::new(),
            started: Instant::now(),
            assignments: 0,
            releases: 0,
            restore_started: HashMap::default(),
            assigned_once: false,
            subscribed: None,
            published: None,
        })
    }

    /// Joins the group for `jobs` and `control`.
    pub fn subscribe(&mut self) -> Result<()> {
        (self.group).subscribe(&[&self.topics.jobs, &self.topics.control])?;
        self.subscribed = Some(Instant::now());
        Ok(())
    }

    /// Leaves the group, serving the revocation (for up to 2 s) so the group hands the
    /// partitions on at once.
    pub fn leave(&mut self, ledger: &mut Ledger) {
        self.group.unsubscribe();
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            let _ = self.group.poll(Duration::from_millis(50));
            self.events(ledger);
            if self.parts.is_empty() {
                break;
            }
        }
    }

    /// Joins the group again as a new member, with a new consumer: every partition is
    /// released first, as a lost assignment is (nothing was committed for it since the last
    /// transaction, and none is open). For a member the group no longer has while its
    /// consumer never learns it: after a long broker outage, librdkafka 2.12's KIP-848 member
    /// can stay without a coordinator for good, its heartbeats never resuming, while every
    /// transaction's offset commit is refused as an unknown member. The group then assigns
    /// the new member at once; a member it still had keeps its partitions until its session
    /// times out.
    pub fn rejoin(&mut self, ledger: &mut Ledger) -> Result<()> {
        let owned: Vec<i32> = self.parts.keys().copied().collect();
        for p in &owned {
            self.release(*p, ledger);
        }
        telemetry::rebalanced(false, owned.len());
        let group: BaseConsumer<GroupContext> =
            (self.group_config).create_with_context(GroupContext::default())?;
        let old = std::mem::replace(&mut self.group, Arc::new(group));
        // Its close waits for a coordinator it cannot reach: off the firing thread. A static
        // member's close that does reach it leaves with the instance id the new consumer
        // joins with, so the new one waits for it (for a while).
        let (closed, close) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(old);
            let _ = closed.send(());
        });
        if self.static_member {
            let _ = close.recv_timeout(STATIC_CLOSE_WAIT);
        }
        info!(released = ?owned, "rejoining the group with a new consumer");
        self.subscribe()
    }

    /// The lifecycle of every owned partition.
    pub fn parts(&self) -> &BTreeMap<i32, Lifecycle<OwnedMessage>> {
        &self.parts
    }

    pub fn is_active(&self, p: i32) -> bool {
        self.parts.get(&p).is_some_and(|l| l.is_active())
    }

    /// The Active partitions, in order.
    pub fn active(&self) -> Vec<i32> {
        (self.parts.iter())
            .filter(|(_, l)| l.is_active())
            .map(|(p, _)| *p)
            .collect()
    }

    /// Partitions assigned so far.
    pub fn assignments(&self) -> u64 {
        self.assignments
    }

    /// What a chunk fired ahead is valid for: no partition assigned or released since.
    pub fn epoch(&self) -> (u64, u64) {
        (self.assignments, self.releases)
    }

    /// The group's metadata, which a transaction's offset commit carries (the fence).
    pub fn group_metadata(&self) -> Option<ConsumerGroupMetadata> {
        self.group.group_metadata()
    }

    /// Moves the group consumer's position on `p` of `topic` back to `to` (after an abort).
    pub fn seek(&self, topic: &str, p: i32, to: Offset) {
        if let Err(e) = self.group.seek(topic, p, to, Duration::from_secs(5)) {
            debug!(topic = %topic, partition = p, error = %e, "seek after abort failed");
        }
    }

    /// Polls the group for up to `wait`; returns the records of Active partitions, buffers
    /// those of Restoring ones. A partition given up meanwhile is forgotten by `ledger`.
    pub fn poll(&mut self, wait: Duration, ledger: &mut Ledger) -> Vec<OwnedMessage> {
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            // In whole milliseconds, rounded up: the consumer asks librdkafka with the time
            // left truncated to them, and the last fraction of a millisecond would be a busy
            // loop of polls that do not wait.
            let left = deadline.saturating_duration_since(Instant::now());
            let left = Duration::from_millis(left.as_micros().div_ceil(1000) as u64);
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
            let revoked = self.events(ledger);
            if !revoked.is_empty() {
                out.retain(|m| !revoked.contains(&m.partition()));
            }
            if out.len() >= 10_000 || Instant::now() >= deadline {
                return out;
            }
        }
    }

    /// Handles recorded rebalance events; returns the partitions given up.
    fn events(&mut self, ledger: &mut Ledger) -> Vec<i32> {
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
                HashMap::default()
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
                    self.release(p, ledger);
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

    fn release(&mut self, p: i32, ledger: &mut Ledger) {
        self.releases += 1;
        match self.parts.remove(&p) {
            Some(part) if !part.is_active() => {
                let _ = self.replay.unassign(p);
                info!(partition = p, "abandoned restore of partition");
            }
            Some(_) => info!(partition = p, "released partition"),
            None => {}
        }
        ledger.forget(p);
        self.restore_started.remove(&p);
        self.fencer.settled(p);
    }

    /// Whether a partition restores (or a fetch for one is out): only then is there a
    /// restore step to take.
    pub fn restoring(&self) -> bool {
        self.fetch.in_flight().is_some() || self.parts.values().any(|p| !p.is_active())
    }

    /// One step of the restore: fences owners that departed holding a partition restoring
    /// here, fetches the committed offsets of newly assigned partitions into `ledger`, and
    /// replays `timers` into the store. Returns the partitions whose replay caught up with its
    /// mark, with the records consumed for them meanwhile, to activate in this order
    /// (`activated`, then `resume`).
    pub fn restore(
        &mut self,
        ledger: &mut Ledger,
        schedules: &mut Schedules,
    ) -> Result<Vec<(i32, Vec<OwnedMessage>)>> {
        self.fencer.fence_departed_holders();
        self.fetch_offsets(ledger);
        let now = (self.now)();
        let done = (self.replay).step(&self.store, &mut self.parts, schedules, now)?;
        self.fence_stalled_owners();
        Ok(done)
    }

    /// Ends the restore of `p`, whose replay caught up; returns how long it took.
    pub fn activated(&mut self, p: i32) -> Result<Option<Duration>> {
        self.replay.unassign(p)?;
        self.fencer.settled(p);
        Ok(self.restore_started.remove(&p).map(|t| t.elapsed()))
    }

    /// Resumes reading `jobs` and `control` of `p`, once it is activated.
    pub fn resume(&self, p: i32) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.topics.jobs, p);
        tpl.add_partition(&self.topics.control, p);
        self.group.resume(&tpl)?;
        Ok(())
    }

    /// Fetches the committed offsets (and progress) of newly assigned partitions, one fetch at a
    /// time on a thread of its own, and takes in the answer. A fetch the broker holds names a
    /// departed owner's open transaction: that owner is fenced (`fence_held`).
    fn fetch_offsets(&mut self, ledger: &mut Ledger) {
        match self.fetch.poll() {
            Fetched::Idle => {}
            Fetched::Waiting { since } => {
                if since.elapsed() >= FETCH_HELD_AFTER {
                    let held: Vec<i32> = (self.fetch.in_flight().into_iter().flatten())
                        .filter(|(p, token)| Self::restoring_under(&self.parts, *p, token))
                        .map(|(p, _)| *p)
                        .collect();
                    let held = self.held(&held);
                    self.fencer.fence_held(&held, Trigger::OffsetFetchHeld);
                }
                return;
            }
            Fetched::Done { of, took, answer } => match answer {
                Ok(committed) => self.take_committed(&of, &committed, took, ledger),
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
    fn restoring_under(
        parts: &BTreeMap<i32, Lifecycle<OwnedMessage>>,
        p: i32,
        token: &str,
    ) -> bool {
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
        ledger: &mut Ledger,
    ) {
        let (parts, replay) = (&self.parts, &mut self.replay);
        let current: HashSet<i32> = (of.iter())
            .filter(|(p, token)| Self::restoring_under(parts, *p, token))
            .filter(|(p, _)| {
                (marks.get(p)).is_some_and(|(first, high)| replay.mark(*p, *first, *high))
            })
            .map(|(p, _)| *p)
            .collect();
        for e in committed.elements() {
            if !current.contains(&e.partition()) {
                continue;
            }
            let metadata = std::panic::catch_unwind(|| e.metadata().to_owned()).unwrap_or_default();
            let offset = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            ledger.fetched(e.topic(), e.partition(), offset, Some(&metadata));
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

    /// Milliseconds since the partitions were created, on the monotonic clock (the
    /// lifecycles' time: `now` may be a test's clock).
    fn mono_ms(&self) -> i64 {
        self.started.elapsed().as_millis() as i64
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

    /// Publishes the owned and active partitions to the node's status (and its view, when they
    /// changed), and whether the node is ready: assigned, and every partition it owns active.
    pub fn publish(&mut self, status: &NodeStatus) {
        let active = self.parts.values().filter(|p| p.is_active()).count();
        status.owned.store(self.parts.len(), Ordering::Relaxed);
        status.active.store(active, Ordering::Relaxed);
        telemetry::partitions(self.parts.len() - active, active);
        // The owned set changes only by an assignment (`assignments` counts them), a release
        // (`parts` shrinks) or an activation (`active` grows): republish only then.
        let shape = (self.assignments, self.parts.len(), active);
        if self.published != Some(shape) {
            (status.view).publish(self.parts.iter().map(|(p, l)| (*p, l.is_active())));
            self.published = Some(shape);
        }
        let assigned = self.assigned_once
            || self
                .subscribed
                .is_some_and(|t| t.elapsed() >= IDLE_READY_AFTER);
        status
            .ready
            .store(assigned && active == self.parts.len(), Ordering::Relaxed);
    }
}
