//! What the nodes tell their operators: each event that has a metric is one function here, with
//! its log line and its metric together (in the manner of Vector's `internal_events`), so the
//! names, units, labels and buckets live in one place and `/metrics` is documented by this file.
//!
//! Units are seconds for durations (Prometheus' convention), counts otherwise. Histograms carry
//! buckets (not summaries), so they aggregate across nodes. Labels are bounded: `reason` and
//! `kind` take the fixed values named below, and `tenant` (`tenant_label`) at most
//! `MAX_TENANT_LABELS` values plus `other`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tracing::{debug, info};

/// Fire lag: from a run's scheduled instant to its firing transaction's commit.
pub const FIRE_LAG: &str = "tocsin_fire_lag_seconds";
/// A firing transaction from begin to commit.
pub const TRANSACTION_DURATION: &str = "tocsin_transaction_duration_seconds";
/// A partition's restore, from its assignment to its activation.
pub const RESTORE_DURATION: &str = "tocsin_restore_duration_seconds";
pub const RUNS_FIRED: &str = "tocsin_runs_fired_total";
pub const TENANT_RUNS_FIRED: &str = "tocsin_tenant_runs_fired_total";
pub const ABORTS: &str = "tocsin_transactions_aborted_total";
pub const FENCES: &str = "tocsin_fences_total";
pub const REBALANCES: &str = "tocsin_rebalances_total";
pub const REJECTED: &str = "tocsin_records_rejected_total";
pub const PARTITIONS: &str = "tocsin_scheduler_partitions";
/// Runs due and not yet fired, found by the latest scan.
pub const DUE: &str = "tocsin_scheduler_due_runs";
/// Worker lag: from a run's scheduled instant to its handler's start (first attempts).
pub const WORKER_LAG: &str = "tocsin_worker_lag_seconds";
/// How long a worker held a run fired ahead of its time (`scheduler.lookahead_ms`).
pub const WORKER_HELD: &str = "tocsin_worker_held_seconds";
/// A handler's run, start to result.
pub const HANDLER_DURATION: &str = "tocsin_handler_duration_seconds";
pub const WORKER_RUNS: &str = "tocsin_worker_runs_total";
pub const RUNS_IN_FLIGHT: &str = "tocsin_worker_runs_in_flight";
/// Lane partitions a worker paused because their tenant has too many runs waiting.
pub const LANES_PAUSED: &str = "tocsin_worker_lanes_paused";
/// Times a worker paused a lane partition for its tenant's backlog (a pause may last only
/// milliseconds, shorter than a scrape: this counts each one).
pub const LANE_PAUSES: &str = "tocsin_worker_lane_pauses_total";
/// Records in the worker's assigned lane partitions it has not read yet (librdkafka's
/// statistics).
pub const LANE_LAG: &str = "tocsin_worker_lane_lag_records";
/// Records the worker's producer holds, not yet acknowledged (librdkafka's statistics).
pub const PRODUCER_QUEUE: &str = "tocsin_worker_producer_queue_messages";
/// Errors librdkafka reported outside any one request, by kind (`kafka::client`).
pub const CLIENT_ERRORS: &str = "tocsin_kafka_client_errors_total";
/// How often librdkafka reports the statistics behind [`LANE_LAG`] and [`PRODUCER_QUEUE`].
pub const STATISTICS_INTERVAL_MS: &str = "5000";

/// Bucket bounds (seconds) of the lag and duration histograms: 5 ms to 2 minutes.
const BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 90.0, 120.0,
];

/// Tenants with a label of their own; the rest count as `other`.
pub const MAX_TENANT_LABELS: usize = 32;

/// The recorder's builder, with the histograms' buckets set.
pub fn builder() -> PrometheusBuilder {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
        .expect("the bucket list is not empty")
}

/// Help texts, and counters that exist from the start (so a scrape before the first event
/// shows 0 and `rate()` has a first sample).
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_histogram!(
        FIRE_LAG,
        Unit::Seconds,
        "From a run's scheduled instant to the commit of the transaction that fired it."
    );
    describe_histogram!(
        TRANSACTION_DURATION,
        Unit::Seconds,
        "A firing transaction, from begin to commit."
    );
    describe_histogram!(
        RESTORE_DURATION,
        Unit::Seconds,
        "A partition's restore, from its assignment to its activation."
    );
    describe_counter!(
        RUNS_FIRED,
        "Runs committed to the tenant lanes or their targets."
    );
    describe_counter!(
        TENANT_RUNS_FIRED,
        "Runs fired, by tenant (label capped; the rest are `other`)."
    );
    describe_counter!(
        ABORTS,
        "Firing transactions aborted, by reason: refused (the broker refused a record), fenced, broker (any other error)."
    );
    describe_counter!(
        FENCES,
        "Previous owners' transactional ids this node initialised to end their open transactions, by outcome (done, failed) and trigger (departed: the group no longer has the partition's previous holder; offset_fetch_held; replay_late: the replay held short of its mark)."
    );
    describe_counter!(
        REBALANCES,
        "Partition assignments and revocations handled, by kind: assign, revoke."
    );
    describe_counter!(
        REJECTED,
        "Input records set aside in jobs.rejected, by reason: key, decode, invalid, tenant, failed."
    );
    describe_histogram!(
        WORKER_LAG,
        Unit::Seconds,
        "From a run's scheduled instant to its handler's start, first attempts (the worker's clock)."
    );
    describe_histogram!(
        WORKER_HELD,
        Unit::Seconds,
        "How long a worker held a run that the scheduler fired ahead of its not-before instant."
    );
    describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "A handler's run, from its start to its result (a timeout included)."
    );
    describe_counter!(
        WORKER_RUNS,
        "Attempts a worker finished, by outcome: succeeded, retrying (a retry was requested), dead (sent to dead)."
    );
    describe_gauge!(
        RUNS_IN_FLIGHT,
        "Runs whose handler is running on this worker."
    );
    describe_gauge!(
        DUE,
        "Runs due and not yet fired in this node's active partitions, as the latest tick's first scan found them (a scan stops near 1,000,000, so a larger backlog shows as that; 0 when the tick found nothing due)."
    );
    describe_gauge!(
        LANE_LAG,
        "Records in the worker's assigned lane partitions not read yet (librdkafka's consumer_lag, summed; every 5 s)."
    );
    describe_gauge!(
        PRODUCER_QUEUE,
        "Records the worker's producer holds and the broker has not acknowledged yet (librdkafka's msg_cnt; every 5 s)."
    );
    describe_gauge!(
        LANES_PAUSED,
        "Lane partitions this worker paused because their tenant has too many runs waiting here."
    );
    describe_counter!(
        LANE_PAUSES,
        "Times this worker paused a lane partition because its tenant had too many runs waiting here, by tenant."
    );
    describe_counter!(
        CLIENT_ERRORS,
        "Errors the node's Kafka clients reported outside any one request, by kind: authentication, authorization, tls, all_brokers_down, fatal, transient."
    );
    for kind in crate::kafka::client::ClientErrorKind::ALL {
        counter!(CLIENT_ERRORS, "kind" => kind.name()).increment(0);
    }
    describe_gauge!(
        PARTITIONS,
        "Partitions of jobs this node owns, by state: restoring, active."
    );
}

/// A Kafka client of this node reported an error outside any one request (`kafka::client`):
/// counted, and logged with its words at `error` when it takes the node out of service, `warn`
/// when waiting cures it; without words when librdkafka's own log line said it.
pub fn kafka_client_error(kind: crate::kafka::client::ClientErrorKind, error: Option<&str>) {
    match error {
        Some(error) if kind.blocks_readiness() => {
            tracing::error!(
                kind = kind.name(),
                error,
                "kafka client error; the node is not ready"
            )
        }
        Some(error) => tracing::warn!(kind = kind.name(), error, "kafka client error"),
        None => {}
    }
    counter!(CLIENT_ERRORS, "kind" => kind.name()).increment(1);
}

/// A scheduler's counters exist from its start, so a scrape before the first event shows 0
/// and `rate()` has a first sample.
pub fn scheduler_started() {
    counter!(RUNS_FIRED).increment(0);
    counter!("tocsin_instants_missed_total").increment(0);
    gauge!(DUE).set(0.0);
    for reason in ["refused", "fenced", "broker"] {
        counter!(ABORTS, "reason" => reason).increment(0);
    }
    for outcome in ["done", "failed"] {
        for trigger in crate::scheduler::takeover::Trigger::ALL {
            counter!(FENCES, "outcome" => outcome, "trigger" => trigger.label()).increment(0);
        }
    }
}

/// Lags of one transaction's runs, in milliseconds, counted before they are recorded.
#[derive(Debug, Default)]
pub struct LagTally {
    by_ms: BTreeMap<i64, usize>,
    by_tenant: BTreeMap<String, u64>,
}

impl LagTally {
    /// A run scheduled `lag_ms` before the transaction's start.
    pub fn add(&mut self, lag_ms: i64, tenant: &str) {
        *self.by_ms.entry(lag_ms.max(0)).or_default() += 1;
        match self.by_tenant.get_mut(tenant) {
            Some(n) => *n += 1,
            None => {
                self.by_tenant.insert(tenant.to_owned(), 1);
            }
        }
    }
}

/// A firing transaction committed, `elapsed` after it began.
/// (The engine's own debug line `transaction` says more: records, fill and commit times.)
pub fn transaction_committed(runs: u64, lags: LagTally, elapsed: Duration) {
    histogram!(TRANSACTION_DURATION).record(elapsed.as_secs_f64());
    counter!(RUNS_FIRED).increment(runs);
    let lag = histogram!(FIRE_LAG);
    let shift = elapsed.as_millis() as i64;
    for (ms, n) in lags.by_ms {
        lag.record_many((ms + shift) as f64 / 1000.0, n);
    }
    for (tenant, n) in lags.by_tenant {
        counter!(TENANT_RUNS_FIRED, "tenant" => tenant_label(&tenant)).increment(n);
    }
}

/// Why a firing transaction was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    /// The broker refused one of its records (too large, a target's policy).
    Refused,
    /// A newer owner or epoch fenced this producer or its group member.
    Fenced,
    /// Anything else: a broker unreachable, a timeout, a coordinator error.
    Broker,
}

pub fn transaction_aborted(reason: AbortReason) {
    let reason = match reason {
        AbortReason::Refused => "refused",
        AbortReason::Fenced => "fenced",
        AbortReason::Broker => "broker",
    };
    counter!(ABORTS, "reason" => reason).increment(1);
}

/// A partition restored and firing, `took` after its assignment.
pub fn partition_active(partition: i32, timers: usize, advanced: usize, took: Option<Duration>) {
    info!(
        partition,
        timers,
        advanced,
        restore_ms = took.map(|t| t.as_millis() as u64),
        "partition active"
    );
    if let Some(t) = took {
        histogram!(RESTORE_DURATION).record(t.as_secs_f64());
    }
}

/// A fence of `owner`'s transactional id finished (`Ok`: its open transaction is over).
pub fn fenced(owner: &str, trigger: &'static str, took: Duration, result: Result<(), String>) {
    match result {
        Ok(()) => {
            info!(
                previous_owner = owner,
                trigger,
                elapsed_ms = took.as_millis() as u64,
                "fenced the previous owner's open transaction"
            );
            counter!(FENCES, "outcome" => "done", "trigger" => trigger).increment(1);
        }
        Err(e) => {
            tracing::warn!(previous_owner = owner, trigger, error = %e, "could not fence the previous owner");
            counter!(FENCES, "outcome" => "failed", "trigger" => trigger).increment(1);
        }
    }
}

/// A rebalance event handled: `partitions` of `jobs` assigned or revoked.
pub fn rebalanced(assigned: bool, partitions: usize) {
    let kind = if assigned { "assign" } else { "revoke" };
    debug!(kind, partitions, "rebalance handled");
    counter!(REBALANCES, "kind" => kind).increment(1);
}

/// Why an input record was set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No key, or one that is not the job id.
    Key,
    /// Not a Tocsin record.
    Decode,
    /// A definition that fails validation.
    Invalid,
    /// A job id another tenant owns.
    Tenant,
    /// Processing it failed (the last line of defence).
    Failed,
}

impl Rejection {
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Key => "key",
            Rejection::Decode => "decode",
            Rejection::Invalid => "invalid",
            Rejection::Tenant => "tenant",
            Rejection::Failed => "failed",
        }
    }
}

pub fn record_rejected(kind: Rejection) {
    counter!(REJECTED, "reason" => kind.as_str()).increment(1);
}

/// The node's partitions of `jobs` by state.
pub fn partitions(restoring: usize, active: usize) {
    gauge!(PARTITIONS, "state" => "restoring").set(restoring as f64);
    gauge!(PARTITIONS, "state" => "active").set(active as f64);
}

/// A tick's first scan found `runs` due (a scan is bounded, so the backlog may be larger).
pub fn due_scanned(runs: usize) {
    gauge!(DUE).set(runs as f64);
}

/// A worker starts `attempt` of a run scheduled at `scheduled_ms`, at `now_ms`.
/// A run fired ahead is held `ms` before it may start.
pub fn run_held(ms: i64) {
    histogram!(WORKER_HELD).record(ms as f64 / 1000.0);
}

pub fn run_started(scheduled_ms: i64, attempt: u32, now_ms: i64) {
    if attempt == 1 {
        histogram!(WORKER_LAG).record((now_ms - scheduled_ms).max(0) as f64 / 1000.0);
    }
    gauge!(RUNS_IN_FLIGHT).increment(1.0);
}

/// What became of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    Succeeded,
    Retrying,
    Dead,
}

/// A worker's attempt ended after `took` with `outcome` (its run events say the rest).
pub fn run_finished(outcome: RunOutcome, took: Duration) {
    let outcome = match outcome {
        RunOutcome::Succeeded => "succeeded",
        RunOutcome::Retrying => "retrying",
        RunOutcome::Dead => "dead",
    };
    histogram!(HANDLER_DURATION).record(took.as_secs_f64());
    counter!(WORKER_RUNS, "outcome" => outcome).increment(1);
    gauge!(RUNS_IN_FLIGHT).decrement(1.0);
}

/// A worker's counters exist from its start.
pub fn worker_started() {
    for outcome in ["succeeded", "retrying", "dead"] {
        counter!(WORKER_RUNS, "outcome" => outcome).increment(0);
    }
    gauge!(RUNS_IN_FLIGHT).set(0.0);
    gauge!(LANES_PAUSED).set(0.0);
    gauge!(LANE_LAG).set(0.0);
    gauge!(PRODUCER_QUEUE).set(0.0);
}

/// librdkafka's statistics of a worker's lane consumer: the lag summed over the partitions it
/// is assigned (a partition it is not assigned reports -1 and counts nothing).
pub fn lane_consumer_statistics(stats: &rdkafka::Statistics) {
    let lag: i64 = (stats.topics.values())
        .flat_map(|t| t.partitions.values())
        .filter(|p| p.partition >= 0 && p.consumer_lag > 0)
        .map(|p| p.consumer_lag)
        .sum();
    gauge!(LANE_LAG).set(lag as f64);
}

/// A worker's producer, whose context reports its statistics: the records it holds, as
/// [`PRODUCER_QUEUE`].
pub struct WorkerProducerContext;

impl rdkafka::ClientContext for WorkerProducerContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::client::log(level, fac, message);
    }
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::client::report(&error, reason);
    }
    fn stats(&self, statistics: rdkafka::Statistics) {
        gauge!(PRODUCER_QUEUE).set(statistics.msg_cnt as f64);
    }
}

/// A worker has `lanes` lane partitions paused for their tenants' backlogs.
pub fn lanes_paused(lanes: usize) {
    gauge!(LANES_PAUSED).set(lanes as f64);
}

/// A worker paused one of `tenant`'s lane partitions for its backlog.
pub fn lane_paused(tenant: &str) {
    counter!(LANE_PAUSES, "tenant" => tenant_label(tenant)).increment(1);
}

/// The label of `tenant`: its own for the first `MAX_TENANT_LABELS` tenants this process
/// labels, `other` for the rest, so a fleet of many tenants cannot blow up the series count.
pub fn tenant_label(tenant: &str) -> String {
    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap();
    if seen.iter().any(|t| t == tenant) {
        return tenant.to_owned();
    }
    if seen.len() < MAX_TENANT_LABELS {
        seen.push(tenant.to_owned());
        return tenant.to_owned();
    }
    "other".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_labels_are_capped() {
        let labels: Vec<String> = (0..MAX_TENANT_LABELS + 5)
            .map(|i| tenant_label(&format!("cap-test-{i}")))
            .collect();
        // Other tests may have labelled tenants first; the cap holds whatever came first.
        assert!(labels.iter().filter(|l| *l != "other").count() <= MAX_TENANT_LABELS);
        assert_eq!(labels.last().unwrap(), "other");
        assert_eq!(
            tenant_label("cap-test-0"),
            labels[0],
            "a label, once given, stays"
        );
    }
}
