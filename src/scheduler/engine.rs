//! The firing engine of one scheduler node: one thread that runs the loop of its parts, each
//! owning its own state:
//!
//! - `Partitions`: the group's assignment, each partition's lifecycle, and the restore (offset
//!   fetch, replay of `timers`, fences);
//! - `Ledger`: the committed offsets and each partition's firing progress, which every
//!   transaction's offset commit carries;
//! - `Intake`: consumed `jobs` and `control` records applied, bad ones rejected;
//! - `Firing` (with `scan`): due entries fired, fairly, in chunks fired ahead of their
//!   transaction;
//! - `TxnProducer` and `Output`: the transactions and the records they carry.
//!
//! No state is shared and no transaction is ever open while the consumer is polled (rebalance
//! callbacks run inside poll, so a partition is only ever given back between transactions).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::OwnedMessage;
use rdkafka::TopicPartitionList;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::fire::{self, FireLimits};
use super::firing::{guarded, is_record_fault, Fault, Firing, Prepared};
use super::ingest::{Lanes, Schedules};
use super::intake::{Intake, Suspects};
use super::ledger::Ledger;
use super::output::{Out, Output};
use super::partitions::Partitions;
use super::producer::{fenced, refused_member, MemberRefused, Refusals, TxnProducer};
use super::scan::{self, SCAN_LIMIT};
use super::store::{encode_timer, Checkpoint, DueEntry, Store};
use super::txn::Txn;
use super::{SchedulerError, Topics};
use crate::config::Config;
use crate::kafka::admin::Admin;
use crate::model::validate::Limits;
use crate::node::{NodeStatus, NowFn};
use crate::telemetry::{self, AbortReason};

type Result<T, E = SchedulerError> = std::result::Result<T, E>;

/// When the group keeps refusing this node's member in every transaction's offset commit
/// (`refused_member`), with none committed since, the node rejoins the group with a new
/// consumer (`Partitions::rejoin`) and a new producer: at once for a member the group does not
/// know (it holds nothing any more, and the runs due wait), or after this long of
/// refusals of its epoch. A consumer that reaches its coordinator brings its epoch up to date
/// with its next heartbeat (every 5 s at the broker's default).
const EPOCH_REFUSED_FOR: Duration = Duration::from_secs(15);

/// Refusals of the group member since the last commit (see `EPOCH_REFUSED_FOR`).
#[derive(Default)]
struct MemberRefusals {
    since: Option<Instant>,
}

impl MemberRefusals {
    /// Counts `how`; whether the node should now rejoin the group.
    fn refused(&mut self, how: MemberRefused) -> bool {
        let since = *self.since.get_or_insert_with(Instant::now);
        how == MemberRefused::Unknown || since.elapsed() >= EPOCH_REFUSED_FOR
    }

    /// A transaction committed, or the node rejoined: the refusals start over.
    fn clear(&mut self) {
        self.since = None;
    }
}

/// What a transaction carried, for its log line.
struct Shape {
    records: usize,
    due: usize,
    now: i64,
    started: Instant,
    fill_ms: u64,
    /// How long firing the chunk ahead of its transaction took (`Firing::prepare`).
    prepare_ms: u64,
}

pub struct Engine {
    config: Config,
    node_id: String,
    now: NowFn,
    status: Arc<NodeStatus>,
    store: Arc<Store>,
    producer: TxnProducer,
    topics: Topics,
    partitions: Partitions,
    ledger: Ledger,
    schedules: Schedules,
    /// Lanes, `runs`, `dead`, `jobs.rejected` and direct delivery.
    output: Output,
    limits: Limits,
    /// Jobs whose records the broker refused (`intake`).
    suspects: Suspects,
    /// Refusals of the group member since the last commit.
    refusals: MemberRefusals,
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
        let partitions = Partitions::new(
            &config,
            &node_id,
            now.clone(),
            topics.clone(),
            store.clone(),
        )?;
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
            ledger: Ledger::new(topics.clone()),
            topics,
            partitions,
            schedules: Schedules::default(),
            output,
            limits,
            suspects: Suspects::default(),
            refusals: MemberRefusals::default(),
        })
    }

    /// Runs until `shutdown` is cancelled. Never returns with a transaction open.
    pub fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        self.output.seed_lanes();
        self.producer.init(&shutdown)?;
        self.partitions.subscribe()?;
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
                    if let Some(how) = refused_member(&e) {
                        if self.refusals.refused(how) {
                            let since =
                                (self.refusals.since).map(|t| t.elapsed().as_millis() as u64);
                            warn!(refused_for_ms = since, how = ?how,
                                "the group keeps refusing this member and its consumer has not rejoined; rejoining with a new one");
                            self.refusals.clear();
                            if let Err(e) = self.partitions.rejoin(&mut self.ledger) {
                                error!(error = %e, "could not rejoin the group");
                            }
                            if let Err(e) = self.producer.recreate() {
                                error!(error = %e, "could not recreate the producer");
                            }
                        }
                    }
                }
            }
        }
        info!(node = %self.node_id, "scheduler stopping");
        self.partitions.leave(&mut self.ledger);
        Ok(())
    }

    fn step(&mut self, next_tick: &mut i64, tick: i64) -> Result<()> {
        self.producer.ensure_initialised()?;
        let now = (self.now)();
        let wait = (*next_tick - now).clamp(0, 50) as u64;
        let batch = (self.partitions).poll(Duration::from_millis(wait), &mut self.ledger);
        // The restore's steps, only while a partition restores (or a fetch for one is out).
        if self.partitions.restoring() {
            let done = (self.partitions).restore(&mut self.ledger, &mut self.schedules)?;
            for (p, buffered) in done {
                self.activate(p, buffered)?;
            }
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
        self.partitions.publish(&self.status);
        Ok(())
    }

    /// Starts firing `p`, whose replay just completed, after applying what was consumed of
    /// it meanwhile (`buffered`).
    fn activate(&mut self, p: i32, buffered: Vec<OwnedMessage>) -> Result<()> {
        let took = self.partitions.activated(p)?;
        let (timers, max_seq) = self.store.timers_summary(p as u16)?;
        self.ledger.raise_seq(p, max_seq);
        let advanced = self.advance_to_progress(p)?;
        telemetry::partition_active(p, timers, advanced, took);
        if !buffered.is_empty() {
            self.transact(buffered)?;
        }
        self.partitions.resume(p)
    }

    /// Brings the restored timers of `p` that were fired plainly since they were written up to
    /// the partition's committed progress (`progress`). Returns how many it advanced.
    fn advance_to_progress(&mut self, p: i32) -> Result<usize> {
        let progress = self.ledger.progress_of(p);
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
        let active = self.partitions.active();
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
                    Some(p) if p.epoch == self.partitions.epoch() => p,
                    _ => {
                        let (now, epoch) = ((self.now)(), self.partitions.epoch());
                        self.firing().0.prepare(due, now, epoch)?
                    }
                };
                ahead = self.transact_prepared(prepared, chunks.get(i + 1).copied())?;
                // Keep serving the group between chunks of a herd. What it brings may change
                // the jobs of the chunk fired ahead: that is fired again.
                let more = (self.partitions).poll(Duration::ZERO, &mut self.ledger);
                if !more.is_empty() {
                    self.transact(more)?;
                    ahead = None;
                }
            }
            Ok(round
                .truncated
                .into_iter()
                .filter(|p| self.partitions.is_active(*p))
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
        let filled = (self.intake())
            .fill(&mut txn, &records, now)
            .and_then(|()| self.flush(&mut txn, now));
        let fill_ms = started.elapsed().as_millis() as u64;
        let result = filled.and_then(|()| {
            let offsets = self.offsets(&txn)?;
            self.commit(&offsets)
        });
        let shape = Shape {
            records: records.len(),
            due: 0,
            now,
            started,
            fill_ms,
            prepare_ms: 0,
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
            prepare_ms,
            ..
        } = prepared;
        let filled = self
            .emit(&mut txn, out, &jobs, &slow, now)
            .and_then(|()| self.flush(&mut txn, now));
        let fill_ms = started.elapsed().as_millis() as u64;
        let (result, ahead) = match filled.and_then(|()| self.offsets(&txn)) {
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
            prepare_ms,
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
        let group = self.partitions.group_metadata();
        let (now, epoch) = ((self.now)(), self.partitions.epoch());
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
            parts: self.partitions.parts(),
            schedules: &mut self.schedules,
            output: &mut self.output,
            suspects: &self.suspects,
            limits,
            assignments: self.partitions.assignments(),
        };
        (firing, &self.producer)
    }

    /// What applying records (and setting jobs aside) works with.
    fn intake(&mut self) -> Intake<'_> {
        Intake {
            store: &self.store,
            producer: &self.producer,
            output: &mut self.output,
            schedules: &mut self.schedules,
            suspects: &mut self.suspects,
            limits: &self.limits,
            topics: &self.topics,
        }
    }

    /// The offsets a transaction commits, with the progress of its `jobs` partitions
    /// (`Ledger::offsets`).
    fn offsets(&self, txn: &Txn) -> Result<TopicPartitionList> {
        self.ledger.offsets(txn, |p| self.partitions.is_active(p))
    }

    fn commit(&mut self, offsets: &TopicPartitionList) -> Result<()> {
        let group = self.partitions.group_metadata();
        self.producer.commit(offsets, group)
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
                self.intake()
                    .quarantine_timer(txn, *p, job, e.to_string())?;
                refused = Some(at);
            }
        }
        for e in slow {
            let p = e.partition as i32;
            if !self.partitions.is_active(p) {
                continue;
            }
            if let Some(reason) = self.intake().set_aside(&e.job) {
                self.intake().quarantine_timer(txn, p, &e.job, reason)?;
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
                Err(Fault::Record(reason)) => {
                    self.intake().quarantine_timer(txn, p, &e.job, reason)?
                }
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
            prepare_ms,
        } = shape;
        let elapsed = started.elapsed();
        debug!(
            records,
            due,
            runs = txn.runs,
            timers_written = txn.timers_sent,
            fill_ms,
            prepare_ms,
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
                self.ledger.committed(&txn.positions, &txn.progress);
                self.refusals.clear();
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
                    self.partitions
                        .seek(topic, *p, self.ledger.rewind(topic, *p));
                }
                for job in txn.changed_jobs() {
                    self.schedules.forget(job);
                }
                Err(e)
            }
        }
    }

    /// Settles the progress of each partition the transaction changed, then writes the
    /// timers it changed (`Txn::settle`, `Txn::write_timers`).
    fn flush(&mut self, txn: &mut Txn, now: i64) -> Result<()> {
        txn.settle(&self.store, self.ledger.progress(), now)?;
        txn.write_timers(&self.store, &self.producer, &self.topics.timers)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_the_group_does_not_know_rejoins_at_its_first_refusal() {
        let mut r = MemberRefusals::default();
        assert!(r.refused(MemberRefused::Unknown));
    }

    #[test]
    fn a_refused_epoch_rejoins_only_once_refused_for_long() {
        let mut r = MemberRefusals::default();
        for _ in 0..10 {
            assert!(!r.refused(MemberRefused::Epoch));
        }
        r.since = Some(Instant::now() - EPOCH_REFUSED_FOR);
        assert!(r.refused(MemberRefused::Epoch));
    }
}
