//! Workers: consume the tenant lanes (`read_committed`), execute runs with bounded concurrency
//! overall and per tenant, report every transition on `runs`, ask the scheduler for retries on
//! `control`, and send runs out of attempts (or refused by the worker's [`policy`]) to `dead`.
//!
//! It owns: the execution of runs and the commit of lane offsets. It must never commit an
//! offset at or past a run that has not finished, never run twice a run its ledger has seen
//! finish, and never start a copy of a run it is executing (a record delivered again after a
//! rebalance while the first copy's reports wait on the broker): that copy waits, then finds
//! the ledger entry.

pub mod handler;
pub mod ledger;
pub mod offsets;
pub mod policy;
pub mod rebalance;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::codec::{self, AvroEnum, Framing};
use crate::config::Config;
use crate::history::{self, Known, Reporter, NODE_HEADER, NOT_BEFORE_HEADER, OVERLAP_HEADER};
use crate::model::job::OverlapPolicy;
use crate::model::records::{ControlRecord, DeadLetter, Outcome, Run, RunEvent, RunEventKind};
use crate::node::NowFn;
use crate::telemetry::{self, RunOutcome};
pub use handler::{Handler, HandlerResult, Handlers};
use ledger::Ledger;
use offsets::Taken;
use rebalance::LaneContext;

/// The worker's producer: its statistics feed `tocsin_worker_producer_queue_messages`.
pub(crate) type WorkerProducer = FutureProducer<telemetry::WorkerProducerContext>;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("ledger: {0}")]
    Ledger(#[from] rocksdb::Error),
    #[error(transparent)]
    Handlers(#[from] handler::HandlersError),
    #[error("could not create data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a worker prints or forwards about each finished run (the demo prints them).
#[derive(Debug, Clone)]
pub struct Finished {
    pub run: Run,
    pub result: HandlerResult,
    pub duration_ms: u64,
}

/// Called with every finished attempt.
pub type OnFinished = Arc<dyn Fn(&Finished) + Send + Sync>;

pub struct WorkerOptions {
    pub worker_id: String,
    /// Called with every finished attempt.
    pub on_finished: Option<OnFinished>,
    pub custom: HashMap<String, Arc<dyn Handler>>,
    pub heartbeat: Duration,
    /// The longest a revoked lane partition waits for the runs started from it before it is
    /// given back (they may then run again on the next owner). Default 30 s.
    pub revoke_wait: Duration,
    /// Whether the ledger can write, for the worker's `/readyz` and `/status`.
    pub ledger_health: Arc<crate::node::StoreHealth>,
    /// Set when the group first assigns this worker lane partitions.
    pub assigned: Arc<std::sync::atomic::AtomicBool>,
}

impl WorkerOptions {
    pub fn new(worker_id: impl Into<String>) -> WorkerOptions {
        WorkerOptions {
            worker_id: worker_id.into(),
            on_finished: None,
            custom: HashMap::new(),
            heartbeat: Duration::from_secs(5),
            revoke_wait: Duration::from_secs(30),
            ledger_health: Arc::default(),
            assigned: Arc::default(),
        }
    }
}

struct Shared {
    config: Config,
    opts: WorkerOptions,
    now: NowFn,
    producer: WorkerProducer,
    handlers: Handlers,
    ledger: Ledger,
    lanes: Arc<LaneContext>,
    global: Semaphore,
    tenants: Mutex<HashMap<String, (Arc<Semaphore>, usize)>>,
    /// The attempts this worker is executing now, from the ledger check until their ledger
    /// entry is written; a copy delivered meanwhile waits on the receiver (see [`Claim`]).
    executing: Mutex<HashMap<String, tokio::sync::watch::Receiver<()>>>,
}

/// One attempt's claim on its execution in this worker, held from before its ledger check
/// until its ledger entry is written. A run's reports are delivered before its ledger entry
/// is written, and while the broker is away that takes as long as the outage; a rebalance
/// meanwhile hands the same record to this worker again, and without the claim that copy
/// would find no ledger entry and run a second time. Dropping the claim wakes the copies
/// waiting on it, which then find the ledger entry (or, when the first copy was handed back
/// unstarted, none, and run).
struct Claim<'a> {
    executing: &'a Mutex<HashMap<String, tokio::sync::watch::Receiver<()>>>,
    key: String,
    _done: tokio::sync::watch::Sender<()>,
}

impl Claim<'_> {
    /// Claims `key`, waiting first for any copy of it that holds the claim.
    async fn take(shared: &Shared, key: String) -> Claim<'_> {
        loop {
            let mut held = {
                let mut executing = shared.executing.lock().unwrap();
                match executing.get(&key) {
                    Some(held) => held.clone(),
                    None => {
                        let (done, held) = tokio::sync::watch::channel(());
                        executing.insert(key.clone(), held);
                        return Claim {
                            executing: &shared.executing,
                            key,
                            _done: done,
                        };
                    }
                }
            };
            info!(attempt = %key, "run delivered again while its first copy is executing here; waiting for it");
            // Err once the holder drops its claim: then look again.
            let _ = held.changed().await;
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.executing.lock().unwrap().remove(&self.key);
    }
}

/// Runs a worker of `config.worker.pool` until `shutdown`; then stops taking runs, waits for
/// those in flight (up to 30 s) and commits. A lane partition revoked meanwhile is given back
/// the same way (see [`rebalance`]).
pub async fn run(
    config: Config,
    opts: WorkerOptions,
    now: NowFn,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    let dir = config.worker.data_dir.join(&opts.worker_id);
    std::fs::create_dir_all(&dir).map_err(|source| WorkerError::DataDir {
        path: dir.clone(),
        source,
    })?;
    let ledger = Ledger::open_with(
        &dir,
        config.worker.ledger_retention_ms as i64,
        opts.ledger_health.clone(),
    )?;
    let producer: WorkerProducer = crate::kafka::producer_config(&config)
        .set("statistics.interval.ms", telemetry::STATISTICS_INTERVAL_MS)
        .create_with_context(telemetry::WorkerProducerContext)?;
    let group = format!("tocsin-worker-{}", config.worker.pool);
    let mut cc = crate::kafka::consumer_config(&config, &group);
    cc.set("client.id", format!("tocsin-worker-{}", opts.worker_id));
    cc.set("group.protocol", "consumer");
    cc.set("fetch.wait.max.ms", "50");
    cc.set("topic.metadata.refresh.interval.ms", "5000");
    cc.set("statistics.interval.ms", telemetry::STATISTICS_INTERVAL_MS);
    for (k, v) in &config.kafka {
        cc.set(k, v);
    }
    let consumer: StreamConsumer<LaneContext> = cc.create_with_context(LaneContext::reporting(
        opts.revoke_wait,
        opts.assigned.clone(),
    ))?;
    // Every lane (`*`): the worker finds the lanes in the broker's metadata itself and
    // subscribes to them by name, looking again every `LANE_DISCOVERY`. (A regex subscription
    // is resolved by the broker under KIP-848, which looks for new topics at most every 10 s:
    // a new tenant's first runs would wait that long.) Named lanes are subscribed as they are.
    let lane_prefix = config.topic("lane.");
    let discovery = match config.worker.lanes.iter().any(|l| l == "*") {
        true => Some(Arc::new(
            crate::kafka::base_config(&config)
                .set(
                    "client.id",
                    format!("tocsin-worker-{}-lanes", opts.worker_id),
                )
                .create_with_context::<_, crate::kafka::client::NodeConsumer>(
                    crate::kafka::client::NodeContext,
                )?,
        )),
        false => None,
    };
    let mut subscribed: BTreeSet<String> = match &discovery {
        Some(meta) => lanes_in(meta.clone(), lane_prefix.clone()).await?,
        None => config
            .worker
            .lanes
            .iter()
            .map(|t| config.lane_topic(t))
            .collect(),
    };
    subscribe(&consumer, &subscribed)?;
    info!(pool = %config.worker.pool, lanes = ?subscribed, worker = %opts.worker_id, "worker started");

    let mut opts = opts;
    let handlers = Handlers::new(
        producer.clone(),
        std::mem::take(&mut opts.custom),
        policy::Policy::new(&config),
        config.worker.http.ca_file.as_deref(),
    )?;
    let shared = Arc::new(Shared {
        global: Semaphore::new(config.worker.concurrency),
        config,
        opts,
        now,
        producer,
        handlers,
        ledger,
        lanes: consumer.context().clone(),
        tenants: Mutex::new(HashMap::new()),
        executing: Mutex::new(HashMap::new()),
    });
    let per_tenant = shared.config.worker.per_tenant_concurrency;
    let lanes = shared.lanes.clone();
    let mut commit_tick = tokio::time::interval(Duration::from_millis(500));
    let mut resume_tick = tokio::time::interval(Duration::from_millis(20));
    let mut prune_tick = tokio::time::interval(Duration::from_millis(
        shared.config.worker.ledger_prune_interval_ms,
    ));
    let mut pruning: Option<tokio::task::JoinHandle<()>> = None;
    // While the ledger cannot write, it is tried again every second; a try that overran is
    // not made up for.
    let mut recover_tick = tokio::time::interval(LEDGER_RECOVERY);
    recover_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut recovering: Option<tokio::task::JoinHandle<()>> = None;
    let mut discovery_tick = tokio::time::interval(LANE_DISCOVERY);
    // A look that overran its tick is not made up for: the next one starts a tick later.
    discovery_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = discovery_tick.tick(), if discovery.is_some() => {
                let meta = discovery.clone().expect("discovery is on");
                match lanes_in(meta, lane_prefix.clone()).await {
                    // Only ever more lanes: a lane deleted stays subscribed (a subscription to
                    // a topic that is gone is harmless, and it may come back).
                    Ok(found) if !found.is_subset(&subscribed) => {
                        subscribed.extend(found);
                        if let Err(e) = subscribe(&consumer, &subscribed) {
                            warn!(error = %e, "could not subscribe to the new lanes");
                        } else {
                            info!(lanes = subscribed.len(), "new lanes found; subscribed");
                        }
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "could not look for new lanes"),
                }
            }
            _ = commit_tick.tick() => {
                commit(&consumer, &shared);
                while tasks.try_join_next().is_some() {}
            }
            _ = prune_tick.tick(), if pruning.as_ref().is_none_or(|p| p.is_finished()) => {
                // Off the loop's thread: a prune walks every entry past the retention.
                let shared = shared.clone();
                pruning = Some(tokio::task::spawn_blocking(move || {
                    let pruned = shared.ledger.prune((shared.now)());
                    if pruned > 0 {
                        info!(pruned, "ledger entries past the retention dropped");
                    }
                }));
            }
            _ = recover_tick.tick(), if recovering.as_ref().is_none_or(|r| r.is_finished())
                && shared.ledger.failing().is_some() => {
                let shared = shared.clone();
                recovering = Some(tokio::task::spawn_blocking(move || {
                    shared.ledger.recover((shared.now)());
                }));
            }
            _ = resume_tick.tick(), if !lanes.paused.lock().unwrap().is_empty() => {
                // Resume lanes whose tenant has drained below its bound.
                let tenants = shared.tenants.lock().unwrap();
                let mut paused = lanes.paused.lock().unwrap();
                paused.retain(|(topic, p, tenant)| {
                    let waiting = tenants.get(tenant).map_or(0, |(_, n)| *n);
                    if waiting <= per_tenant * RESUME_BELOW {
                        let mut tpl = TopicPartitionList::new();
                        tpl.add_partition(topic, *p);
                        let _ = consumer.resume(&tpl);
                        false
                    } else {
                        true
                    }
                });
                telemetry::lanes_paused(paused.len());
            }
            msg = consumer.recv() => {
                let m = match msg {
                    Ok(m) => m,
                    Err(e) => { crate::kafka::client::report(&e, "lane consumer"); continue; }
                };
                let (topic, partition, offset) = (m.topic().to_owned(), m.partition(), m.offset());
                // A record fetched before its partition was revoked: the next owner runs it.
                let Some(taken) = lanes.taken(&topic, partition, offset) else { continue };
                let run: Run = match m.payload().map(codec::decode) {
                    Some(Ok(r)) => r,
                    other => {
                        warn!(topic = %topic, partition, offset, error = ?other.map(|r| r.err()),
                            "lane record is not a Tocsin Run; skipped");
                        lanes.finished(&taken);
                        continue;
                    }
                };
                // A run fired ahead of its time is held until then, and counts as waiting
                // only from then on: the lead is bounded by the scheduler's lookahead, and a
                // held run must not pause its lane, which would make the next ones late.
                let not_before = not_before(&m);
                let held = not_before.is_some_and(|t| t > (shared.now)());
                // Fairness: a tenant with a deep backlog has its lane paused, so the other
                // lanes keep flowing through this worker.
                let waiting = {
                    let mut tenants = shared.tenants.lock().unwrap();
                    let e = tenants.entry(run.tenant.clone())
                        .or_insert_with(|| (Arc::new(Semaphore::new(per_tenant)), 0));
                    if !held {
                        e.1 += 1;
                    }
                    e.1
                };
                if waiting > per_tenant * PAUSE_ABOVE {
                    let mut paused = lanes.paused.lock().unwrap();
                    if paused.insert((topic.clone(), partition, run.tenant.clone())) {
                        let mut tpl = TopicPartitionList::new();
                        tpl.add_partition(&topic, partition);
                        let _ = consumer.pause(&tpl);
                        telemetry::lanes_paused(paused.len());
                        telemetry::lane_paused(&run.tenant);
                    }
                }
                let known = Known {
                    fired_ms: Some(run.fire_ms),
                    fired_by: fired_by(&m),
                    started_ms: None,
                };
                let awaited = awaited(&m);
                let shared = shared.clone();
                tasks.spawn(async move {
                    if held {
                        hold(&shared, not_before.unwrap_or(0)).await;
                        if let Some(e) = shared.tenants.lock().unwrap().get_mut(&run.tenant) {
                            e.1 += 1;
                        }
                    }
                    if execute(&shared, run, known, awaited, &taken).await {
                        shared.lanes.finished(&taken);
                    }
                });
            }
        }
    }
    info!(
        in_flight = tasks.len(),
        "worker stopping; finishing runs in flight"
    );
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    // Closing the consumer revokes every partition: committed there too, without waiting again.
    lanes.close();
    commit(&consumer, &shared);
    Ok(())
}

/// A tenant's lane partitions are paused once more than `PAUSE_ABOVE` × its concurrency of its
/// runs wait in this worker, and resumed when `RESUME_BELOW` × remain: enough queued to keep its
/// slots busy across a refetch, never so many that another tenant's run queues behind them.
const PAUSE_ABOVE: usize = 8;
const RESUME_BELOW: usize = 4;

/// The scheduler node that fired a lane record, from its header (absent on records of older
/// nodes or written by hand).
fn fired_by(m: &impl Message) -> Option<String> {
    use rdkafka::message::Headers;
    let headers = m.headers()?;
    let h = headers.iter().find(|h| h.key == NODE_HEADER)?;
    Some(String::from_utf8_lossy(h.value?).into_owned())
}

/// The instant before which a lane record's run must not start, from its header (absent on
/// records of older nodes, or malformed: no hold).
fn not_before(m: &impl Message) -> Option<i64> {
    use rdkafka::message::Headers;
    let headers = m.headers()?;
    let h = headers.iter().find(|h| h.key == NOT_BEFORE_HEADER)?;
    std::str::from_utf8(h.value?).ok()?.parse().ok()
}

/// Whether the run's scheduler waits for its completion on `control`: when the overlap
/// policy the lane record names holds its runs in flight. A record that names none (an older
/// node's) is waited for.
fn awaited(m: &impl Message) -> bool {
    use rdkafka::message::Headers;
    let policy = || {
        let h = m.headers()?.iter().find(|h| h.key == OVERLAP_HEADER)?;
        OverlapPolicy::from_symbol(std::str::from_utf8(h.value?).ok()?)
    };
    policy().is_none_or(OverlapPolicy::holds_in_flight)
}

/// Waits until the worker's clock reaches `not_before_ms`. A hold never outlasts the
/// scheduler's lookahead by much; it is capped at a minute, so a record with a far-off header
/// (written by hand, or a clock gone wrong) costs at most that, and is counted.
async fn hold(shared: &Shared, not_before_ms: i64) {
    const LONGEST_HOLD_MS: i64 = 60_000;
    let wait = not_before_ms - (shared.now)();
    if wait > LONGEST_HOLD_MS {
        warn!(
            not_before_ms,
            wait_ms = wait,
            "run's not-before instant is more than a minute ahead; held for a minute"
        );
    }
    crate::telemetry::run_held(wait.clamp(0, LONGEST_HOLD_MS));
    tokio::time::sleep(Duration::from_millis(wait.clamp(0, LONGEST_HOLD_MS) as u64)).await;
}

/// How often a failing ledger is tried again.
const LEDGER_RECOVERY: Duration = Duration::from_secs(1);

/// How often a worker of every lane looks for new lanes in the broker's metadata.
const LANE_DISCOVERY: Duration = Duration::from_secs(1);

/// The topics named `<prefix>lane.…` in the broker's metadata (asked off the runtime's threads:
/// the call blocks for up to its timeout).
async fn lanes_in(
    meta: Arc<crate::kafka::client::NodeConsumer>,
    lane_prefix: String,
) -> Result<BTreeSet<String>, WorkerError> {
    let md =
        tokio::task::spawn_blocking(move || meta.fetch_metadata(None, Duration::from_secs(10)))
            .await
            .expect("the metadata request does not panic")?;
    Ok(md
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|n| n.starts_with(&lane_prefix))
        .map(str::to_owned)
        .collect())
}

/// Subscribes to `lanes` (with none yet, nothing: an empty subscription is refused).
fn subscribe(
    consumer: &StreamConsumer<LaneContext>,
    lanes: &BTreeSet<String>,
) -> Result<(), WorkerError> {
    if lanes.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = lanes.iter().map(String::as_str).collect();
    consumer.subscribe(&names)?;
    Ok(())
}

fn commit(consumer: &StreamConsumer<LaneContext>, shared: &Shared) {
    let moves = shared.lanes.tracker().to_commit();
    if moves.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    for (t, p, o) in &moves {
        let _ = tpl.add_partition_offset(t, *p, Offset::Offset(*o));
    }
    if let Err(e) = consumer.commit(&tpl, rdkafka::consumer::CommitMode::Async) {
        warn!(error = %e, "offset commit failed");
    }
}

fn attempt_key(run: &Run) -> String {
    format!("{}/{}", run.run_id, run.attempt)
}

/// Runs `run` unless its ledger saw it finish; true when its record is done with, false when
/// it was handed back (its partition revoked before it started).
///
/// A run holds its concurrency slots only while its handler runs. Its reports (events on
/// `runs`, the completion or retry request on `control`, the dead letter) are enqueued on the
/// producer without waiting for each in turn; the run counts as finished (its offset may be
/// committed past, its ledger entry written) only once all of them are acknowledged.
///
/// A copy of an attempt delivered while this worker executes it waits for that execution,
/// and then finds its ledger entry ([`Claim`]).
async fn execute(
    shared: &Shared,
    run: Run,
    mut known: Known,
    awaited: bool,
    taken: &Taken,
) -> bool {
    let tenant_sem = {
        let tenants = shared.tenants.lock().unwrap();
        tenants[&run.tenant].0.clone()
    };
    let done = |shared: &Shared| {
        if let Some(e) = shared.tenants.lock().unwrap().get_mut(&run.tenant) {
            e.1 -= 1;
        }
    };
    let claim = Claim::take(shared, attempt_key(&run)).await;
    let now = (shared.now)();
    if shared.ledger.finished(&run.run_id, now) || shared.ledger.finished(&claim.key, now) {
        info!(run = %run.run_id, job = %run.job_id, attempt = run.attempt, "redelivered run already finished; skipped");
        done(shared);
        return true;
    }
    let tenant_slot = tenant_sem.acquire().await.expect("semaphore open");
    let global_slot = shared.global.acquire().await.expect("semaphore open");
    let started = Instant::now();
    let timeout = Duration::from_millis(run.timeout_ms.max(1));
    if !shared.lanes.start(taken, started + timeout) {
        info!(run = %run.run_id, job = %run.job_id, attempt = run.attempt,
            "lane revoked before the run started; handed back");
        done(shared);
        return false;
    }
    crate::telemetry::run_started(run.scheduled_ms, run.attempt, (shared.now)());
    // The `started` event is enqueued first, so it precedes the others of this run on its
    // partition, and delivered while the handler runs.
    let started_event = event(shared, &run, &known, RunEventKind::Started, None, None).await;
    known.started_ms = Some(started_event.at_ms);
    let mut reports = vec![started_event.out];
    let result = {
        let call = shared.handlers.call(&run);
        tokio::pin!(call);
        let mut beat = tokio::time::interval(shared.opts.heartbeat);
        beat.tick().await;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                r = &mut call => break r,
                _ = &mut deadline => break HandlerResult::Failed {
                    error: format!("timed out after {} ms", run.timeout_ms),
                    retry: true,
                },
                _ = beat.tick() => {
                    reports.push(event(shared, &run, &known, RunEventKind::Heartbeat, None, None).await.out);
                }
            }
        }
    };
    let duration_ms = started.elapsed().as_millis() as u64;
    let finished = finish(
        shared,
        &run,
        &known,
        awaited,
        &result,
        duration_ms,
        &mut reports,
    )
    .await;
    drop((global_slot, tenant_slot));
    if let Some(cb) = &shared.opts.on_finished {
        cb(&Finished {
            run: run.clone(),
            result,
            duration_ms,
        });
    }
    done(shared);
    settle(shared, reports).await;
    let now = (shared.now)();
    // A ledger that cannot write keeps the keys in memory and says so, rate-limited.
    for key in finished {
        shared.ledger.record(&key, now);
    }
    true
}

fn took(duration_ms: u64) -> Duration {
    Duration::from_millis(duration_ms)
}

/// Enqueues the reports of an attempt's outcome on `out` (the completion only when its
/// scheduler waits for it: `awaited`); returns the ledger keys to record once they are
/// delivered: the run id when the run is over, the attempt when it failed.
async fn finish(
    shared: &Shared,
    run: &Run,
    known: &Known,
    awaited: bool,
    result: &HandlerResult,
    duration_ms: u64,
    out: &mut Vec<Outgoing>,
) -> Vec<String> {
    let now = (shared.now)();
    match result {
        HandlerResult::Succeeded { .. } => {
            out.push(
                event(
                    shared,
                    run,
                    known,
                    RunEventKind::Succeeded,
                    None,
                    Some(duration_ms),
                )
                .await
                .out,
            );
            if awaited {
                out.push(completion(shared, run, Outcome::Succeeded).await);
            }
            telemetry::run_finished(RunOutcome::Succeeded, took(duration_ms));
            vec![run.run_id.clone()]
        }
        HandlerResult::Failed { error, retry } => {
            out.push(
                event(
                    shared,
                    run,
                    known,
                    RunEventKind::Failed,
                    Some(error.clone()),
                    Some(duration_ms),
                )
                .await
                .out,
            );
            if *retry && run.attempt < run.retry.max_attempts {
                let delay = backoff_ms(run);
                let record = ControlRecord::Retry {
                    run_id: run.run_id.clone(),
                    scheduled_ms: run.scheduled_ms,
                    attempt: run.attempt + 1,
                    not_before_ms: now + delay as i64,
                    error: error.clone(),
                };
                out.push(
                    enqueue(
                        shared,
                        shared.config.topic("control"),
                        &run.job_id,
                        codec::encode(&record, &Framing::SingleObject),
                    )
                    .await,
                );
                out.push(
                    event(
                        shared,
                        run,
                        known,
                        RunEventKind::Retrying,
                        Some(error.clone()),
                        None,
                    )
                    .await
                    .out,
                );
                telemetry::run_finished(RunOutcome::Retrying, took(duration_ms));
                vec![attempt_key(run)]
            } else {
                let dead = DeadLetter {
                    run: run.clone(),
                    error: error.clone(),
                    attempts: run.attempt,
                    at_ms: now,
                };
                out.push(
                    enqueue(
                        shared,
                        shared.config.topic("dead"),
                        &run.run_id,
                        history::encode_dead(shared.config.topics.serialization.dead, &dead),
                    )
                    .await,
                );
                out.push(
                    event(
                        shared,
                        run,
                        known,
                        RunEventKind::Dead,
                        Some(error.clone()),
                        None,
                    )
                    .await
                    .out,
                );
                if awaited {
                    out.push(completion(shared, run, Outcome::Dead).await);
                }
                telemetry::run_finished(RunOutcome::Dead, took(duration_ms));
                vec![run.run_id.clone(), attempt_key(run)]
            }
        }
    }
}

/// Exponential backoff with deterministic jitter: between half and all of
/// `min(cap, base * 2^(attempt-1))`.
pub fn backoff_ms(run: &Run) -> u64 {
    let exp = run
        .retry
        .backoff_base_ms
        .saturating_mul(1u64 << (run.attempt.saturating_sub(1)).min(30));
    let full = exp.min(run.retry.backoff_cap_ms).max(1);
    let h = xxhash_rust::xxh3::xxh3_64(format!("{}/{}", run.run_id, run.attempt).as_bytes());
    full / 2 + h % (full / 2 + 1)
}

async fn completion(shared: &Shared, run: &Run, outcome: Outcome) -> Outgoing {
    let record = ControlRecord::Completion {
        run_id: run.run_id.clone(),
        scheduled_ms: run.scheduled_ms,
        attempt: run.attempt,
        outcome,
    };
    enqueue(
        shared,
        shared.config.topic("control"),
        &run.job_id,
        codec::encode(&record, &Framing::SingleObject),
    )
    .await
}

/// An event enqueued on `runs`, and when it happened.
struct Reported {
    out: Outgoing,
    at_ms: i64,
}

async fn event(
    shared: &Shared,
    run: &Run,
    known: &Known,
    kind: RunEventKind,
    error: Option<String>,
    duration_ms: Option<u64>,
) -> Reported {
    let e = RunEvent {
        run_id: run.run_id.clone(),
        job_id: run.job_id.clone(),
        tenant: run.tenant.clone(),
        scheduled_ms: run.scheduled_ms,
        attempt: run.attempt,
        kind,
        at_ms: (shared.now)(),
        node: shared.opts.worker_id.clone(),
        error,
        duration_ms,
    };
    let value = history::encode_event(
        shared.config.topics.serialization.runs,
        &e,
        Reporter::Worker,
        known,
    );
    Reported {
        out: enqueue(shared, shared.config.topic("runs"), &run.run_id, value).await,
        at_ms: e.at_ms,
    }
}

/// A record enqueued on the producer, kept with its delivery so that it can be sent again.
struct Outgoing {
    topic: String,
    key: String,
    value: Vec<u8>,
    delivery: DeliveryFuture,
}

/// Enqueues a record without waiting for its delivery. A full producer queue waits here, so
/// the runs holding slots (not an unbounded backlog) absorb the backpressure.
async fn enqueue(shared: &Shared, topic: String, key: &str, value: Vec<u8>) -> Outgoing {
    let mut backoff = Duration::from_millis(5);
    loop {
        let record = FutureRecord::to(&topic).key(key.as_bytes()).payload(&value);
        let error = match shared.producer.send_result(record) {
            Ok(delivery) => {
                return Outgoing {
                    topic,
                    key: key.to_owned(),
                    value,
                    delivery,
                }
            }
            Err((e, _)) => e,
        };
        if !matches!(
            error,
            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
        ) {
            warn!(topic = %topic, error = %error, "enqueue failed; retrying");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Waits until every record of a run is acknowledged. One whose delivery failed is sent again
/// until it is delivered: a lost retry request or completion would lose a run, so the run stays
/// unfinished (its offset uncommitted) until then.
async fn settle(shared: &Shared, reports: Vec<Outgoing>) {
    for o in reports {
        match o.delivery.await {
            Ok(Ok(_)) => continue,
            Ok(Err((e, _))) => {
                warn!(topic = %o.topic, error = %e, "delivery failed; sending again")
            }
            Err(_) => warn!(topic = %o.topic, "delivery abandoned by the producer; sending again"),
        }
        send(shared, &o.topic, &o.key, &o.value).await;
    }
}

/// Sends one record and waits until it is delivered, retrying with backoff.
async fn send(shared: &Shared, topic: &str, key: &str, value: &[u8]) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let record = FutureRecord::to(topic).key(key.as_bytes()).payload(value);
        match shared.producer.send(record, Duration::from_secs(30)).await {
            Ok(_) => return,
            Err((e, _)) => {
                warn!(topic = %topic, error = %e, "send failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
