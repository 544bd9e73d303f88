//! The scheduler's transactional producer: begin, send, commit, abort and recreate, and the
//! one place that decides what a producer error means for the producer.
//!
//! A transaction is begun, filled with sends, and either committed with the consumed offsets
//! (the group fence) or aborted. What can go wrong, and what it leaves behind:
//!
//! - an abortable error: the transaction is aborted and the step retried on this producer;
//! - an abort that cannot finish, or a fatal error: the producer is recreated with the same
//!   `transactional.id`, which fences the old one and aborts its transaction at the
//!   coordinator. Its `init_transactions` may time out (a broker that is down); it is then
//!   resumed before the next transaction begins, for as long as it takes.
//!
//! The delivery reports of a transaction's records are gathered here: the highest `timers`
//! offset per partition (the store's checkpoints) and the records the broker refused for what
//! they are (the job behind them is set aside, or the run sent to `dead`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::deliver;
use super::takeover::Trigger;
use super::SchedulerError;
use crate::config::Config;

type Result<T, E = SchedulerError> = std::result::Result<T, E>;

/// How long one call into a transaction may wait for the coordinator.
pub(super) const TXN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a commit awaiting delivery reports sleeps when a poll found none.
const DELIVERY_NAP: Duration = Duration::from_micros(200);
/// A hook for tests of takeover, not a setting: while the file this variable names exists, a
/// transaction about to commit (its records acknowledged, its offsets sent) waits, after
/// creating `FILE.held`. A test then stops or kills the node with a transaction open. A file
/// that says [`HOLD_BEFORE_OFFSETS`] holds the transaction before its offsets are sent: it
/// then holds the lanes and `runs`, not the offsets a new owner fetches.
pub const HOLD_TRANSACTION_ENV: &str = "TOCSIN_TEST_HOLD_TRANSACTION";
/// What the hook's file says to hold a transaction before its offsets are sent.
pub const HOLD_BEFORE_OFFSETS: &str = "before-offsets";

/// Where the test hook holds a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldAt {
    RecordsAcknowledged,
    OffsetsSent,
}

impl HoldAt {
    fn of(file: &str) -> HoldAt {
        if file.trim() == HOLD_BEFORE_OFFSETS {
            HoldAt::RecordsAcknowledged
        } else {
            HoldAt::OffsetsSent
        }
    }
}

/// What a producer error means for the producer that returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorClass {
    /// The producer cannot go on (fenced, or an unrecoverable state): recreate it.
    Fatal,
    /// Calling the same operation again may succeed (a timeout, a coordinator moving).
    Retriable,
    /// Anything else: the transaction is aborted and the step retried.
    Abortable,
}

/// The one error classifier.
pub(super) fn classify(e: &KafkaError) -> ErrorClass {
    match e {
        KafkaError::Transaction(t) if t.is_fatal() => ErrorClass::Fatal,
        KafkaError::Transaction(t) if t.is_retriable() => ErrorClass::Retriable,
        _ => ErrorClass::Abortable,
    }
}

/// What the broker refused in a transaction, for what the records are.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    /// (job, reason) of Tocsin records (`timers`, lanes, `runs`, `dead`).
    pub records: Vec<(String, String)>,
    /// (topic, job, reason) of `kafka` jobs' target records.
    pub targets: Vec<(String, String, String)>,
}

impl Refusals {
    fn append(&mut self, mut other: Refusals) {
        self.records.append(&mut other.records);
        self.targets.append(&mut other.targets);
    }
}

/// Offsets of `timers` records as the broker acknowledged them, for checkpoints; and the keys
/// of records the broker refused for what they are, so the job behind them can be set aside.
#[derive(Default)]
pub(super) struct DeliveryContext {
    timers_topic: String,
    /// The fleet's topic prefix: a failed record outside it is a `kafka` job's target record.
    prefix: String,
    delivered: Mutex<HashMap<i32, i64>>,
    failed: Mutex<Option<String>>,
    refused: Mutex<Refusals>,
}

impl ClientContext for DeliveryContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::client::log(level, fac, message);
    }
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::client::report(&error, reason);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        use rdkafka::message::Message;
        match result {
            Ok(m) if m.topic() == self.timers_topic => {
                let mut d = self.delivered.lock().unwrap();
                let e = d.entry(m.partition()).or_insert(-1);
                *e = (*e).max(m.offset());
            }
            Ok(_) => {}
            Err((e, m)) => {
                let reason = format!("delivery to {} failed: {e}", m.topic());
                let target = !crate::config::is_tocsin_topic(&self.prefix, m.topic());
                if target {
                    if let (KafkaError::MessageProduction(code), Some(key)) = (e, m.key()) {
                        if deliver::refuses_target(*code) {
                            self.refused.lock().unwrap().targets.push((
                                m.topic().to_owned(),
                                String::from_utf8_lossy(key).into_owned(),
                                format!("target topic {:?} refused the record: {e}", m.topic()),
                            ));
                        }
                    }
                } else if refuses_record(e) {
                    if let Some(key) = m.key() {
                        let key = String::from_utf8_lossy(key).into_owned();
                        self.refused
                            .lock()
                            .unwrap()
                            .records
                            .push((key, reason.clone()));
                    }
                }
                *self.failed.lock().unwrap() = Some(reason);
            }
        }
    }
}

/// A delivery the broker refused for what the record is (its size or its topic).
fn refuses_record(e: &KafkaError) -> bool {
    matches!(e, KafkaError::MessageProduction(code) if refuses_code(*code))
}

pub(super) fn refuses_code(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::TopicAuthorizationFailed
    )
}

/// A node's transactional producer (see the module doc).
pub(super) struct TxnProducer {
    config: Config,
    node_id: String,
    timers_topic: String,
    inner: BaseProducer<DeliveryContext>,
    /// The producer was recreated and its `init_transactions` has not succeeded yet.
    uninitialised: bool,
    /// The test hook's file ([`HOLD_TRANSACTION_ENV`]).
    hold: Option<PathBuf>,
}

impl TxnProducer {
    pub fn new(config: &Config, node_id: &str, timers_topic: &str) -> Result<TxnProducer> {
        Ok(TxnProducer {
            inner: new_producer(config, node_id, timers_topic)?,
            config: config.clone(),
            node_id: node_id.to_owned(),
            timers_topic: timers_topic.to_owned(),
            uninitialised: true,
            hold: std::env::var_os(HOLD_TRANSACTION_ENV).map(PathBuf::from),
        })
    }

    /// Initialises transactions, retrying until it succeeds or `shutdown` is cancelled; a
    /// fatal error recreates the producer first.
    pub fn init(&mut self, shutdown: &CancellationToken) -> Result<()> {
        let mut backoff = Duration::from_millis(200);
        loop {
            match self.inner.init_transactions(TXN_TIMEOUT) {
                Ok(()) => {
                    self.uninitialised = false;
                    return Ok(());
                }
                Err(e) if !shutdown.is_cancelled() => {
                    warn!(error = %e, "init_transactions failed; retrying");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    if classify(&e) == ErrorClass::Fatal {
                        self.recreate()?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Resumes the `init_transactions` of a recreated producer, until it succeeds. A step
    /// begins with it, so nothing is consumed while no transaction could carry it.
    pub fn ensure_initialised(&mut self) -> Result<()> {
        if self.uninitialised {
            self.inner.init_transactions(TXN_TIMEOUT)?;
            self.uninitialised = false;
            info!("producer initialised");
        }
        Ok(())
    }

    /// Begins a transaction (on an initialised producer).
    pub fn begin(&mut self) -> Result<()> {
        self.ensure_initialised()?;
        self.inner.begin_transaction()?;
        debug!("transaction begun");
        Ok(())
    }

    /// Sends one record of the open transaction (librdkafka queues it).
    // The record comes back with its error, as librdkafka's own `send` returns it.
    #[allow(clippy::type_complexity, clippy::result_large_err)]
    pub fn send<'a, K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
        &self,
        record: BaseRecord<'a, K, P>,
    ) -> std::result::Result<(), (KafkaError, BaseRecord<'a, K, P>)> {
        self.inner.send(record)
    }

    /// Sends `offsets` to the transaction (the group fence) and commits it; a record whose
    /// delivery failed fails the commit.
    pub fn commit(
        &self,
        offsets: &TopicPartitionList,
        group: Option<ConsumerGroupMetadata>,
    ) -> Result<()> {
        let started = Instant::now();
        if offsets.count() > 0 && self.hold.is_some() {
            self.await_deliveries();
            self.hold_for_test(HoldAt::RecordsAcknowledged);
        }
        if offsets.count() > 0 {
            let meta = group.ok_or(SchedulerError::NoGroupMetadata)?;
            self.inner
                .send_offsets_to_transaction(offsets, &meta, TXN_TIMEOUT)?;
        }
        let offsets_sent = started.elapsed();
        self.await_deliveries();
        if offsets.count() > 0 {
            self.hold_for_test(HoldAt::OffsetsSent);
        }
        self.inner.commit_transaction(TXN_TIMEOUT)?;
        debug!(
            offsets = offsets.count(),
            offsets_ms = offsets_sent.as_millis() as u64,
            commit_ms = (started.elapsed() - offsets_sent).as_millis() as u64,
            "transaction committed"
        );
        if let Some(e) = self.inner.context().failed.lock().unwrap().take() {
            return Err(SchedulerError::Delivery(e));
        }
        Ok(())
    }

    /// The test hook ([`HOLD_TRANSACTION_ENV`]): waits while its file exists and says `at`.
    fn hold_for_test(&self, at: HoldAt) {
        let Some(path) = self.hold.as_ref().filter(|p| p.exists()) else {
            return;
        };
        let says = std::fs::read_to_string(path).unwrap_or_default();
        if HoldAt::of(&says) != at {
            return;
        }
        let held = path.with_extension("held");
        if let Err(e) = std::fs::write(&held, b"") {
            warn!(path = %held.display(), error = %e, "test hook: could not say the transaction is held");
        }
        warn!(path = %path.display(), "test hook: holding a transaction open while this file exists");
        while path.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Serves delivery reports until every record sent is acknowledged (or the transaction's
    /// time is up; the commit then reports it). rust-rdkafka's `commit_transaction` flushes
    /// first, but its flush polls in whole 100 ms slices while anything is in flight, so a
    /// commit called with records outstanding cost 100, 200, 300 ms: it waited here instead.
    ///
    /// It polls without waiting and naps when a poll changed nothing. rust-rdkafka's
    /// `poll(d)` serves events until `d` is up, asking librdkafka for each with the time left
    /// in whole milliseconds, so under a millisecond it asks with 0: a `poll` of 1 ms is a
    /// busy loop of 1 ms. Awaiting a herd's acknowledgements that way held a core for the
    /// whole wait, on two cores shared with the broker that sends them and the thread firing
    /// the next chunk.
    fn await_deliveries(&self) {
        let deadline = Instant::now() + TXN_TIMEOUT;
        let mut in_flight = self.inner.in_flight_count();
        while in_flight > 0 && Instant::now() < deadline {
            self.inner.poll(Duration::ZERO);
            let before = std::mem::replace(&mut in_flight, self.inner.in_flight_count());
            if in_flight == before {
                std::thread::sleep(DELIVERY_NAP);
            }
        }
    }

    /// Aborts the open transaction and returns what the broker refused in it. An abort that
    /// times out is resumed by calling it again (serving delivery reports in between, which
    /// the abort waits for); one that cannot finish, or fails fatally, leaves a producer that
    /// would refuse every later transaction ("conflicting abort_transaction call in
    /// progress"), so the producer is recreated, which fences the old one and aborts its
    /// transaction at the coordinator.
    pub fn abort(&mut self) -> Refusals {
        // Refusals reported so far, and those the abort serves while it waits for the
        // outstanding deliveries (it may also replace the producer, and its context).
        let mut refused = self.take_refusals();
        let deadline = Instant::now() + TXN_TIMEOUT;
        let result = loop {
            match self.inner.abort_transaction(Duration::from_secs(2)) {
                Ok(()) => break Ok(()),
                Err(e) if classify(&e) == ErrorClass::Retriable && Instant::now() < deadline => {
                    self.inner.poll(Duration::from_millis(50));
                }
                Err(e) => break Err(e),
            }
        };
        refused.append(self.take_refusals());
        if result.is_ok() {
            debug!("transaction aborted");
        }
        if let Err(e) = result {
            warn!(error = %e, "abort_transaction failed; recreating the producer");
            match self.recreate() {
                Ok(()) => {
                    if let Err(e) = self.inner.init_transactions(TXN_TIMEOUT) {
                        // Resumed by `begin` until it succeeds (a broker still down makes it
                        // time out; calling it again resumes it).
                        warn!(error = %e, "could not initialise the new producer; retrying");
                    } else {
                        self.uninitialised = false;
                    }
                }
                Err(e) => error!(error = %e, "could not recreate the producer"),
            }
        }
        self.inner.context().delivered.lock().unwrap().clear();
        self.inner.context().failed.lock().unwrap().take();
        refused
    }

    /// After a failed step: a fatal producer error means a new producer.
    pub fn recover(&mut self, e: &SchedulerError) -> Result<()> {
        if let SchedulerError::Kafka(k) = e {
            if classify(k) == ErrorClass::Fatal {
                warn!("producer in a fatal state; recreating it");
                self.recreate()?;
            }
        }
        Ok(())
    }

    /// The highest acknowledged `timers` offset per partition since the last call.
    pub fn take_delivered(&self) -> HashMap<i32, i64> {
        std::mem::take(&mut *self.inner.context().delivered.lock().unwrap())
    }

    fn take_refusals(&self) -> Refusals {
        std::mem::take(&mut *self.inner.context().refused.lock().unwrap())
    }

    /// The client, for metadata lookups.
    pub fn client(&self) -> &rdkafka::client::Client<DeliveryContext> {
        self.inner.client()
    }

    /// A new producer with the same transactional id, initialised before the next transaction
    /// begins (`ensure_initialised`). Also when the node rejoins the group, so its first
    /// transaction after does not inherit the sequence state of the refused ones (it failed
    /// with `OUT_OF_ORDER_SEQUENCE_NUMBER`).
    pub fn recreate(&mut self) -> Result<()> {
        self.inner = new_producer(&self.config, &self.node_id, &self.timers_topic)?;
        self.uninitialised = true;
        Ok(())
    }
}

/// Stable per node: a restarted node fences its previous incarnation.
pub(super) fn transactional_id(config: &Config, node_id: &str) -> String {
    format!("{}scheduler.{}", config.topic_prefix, node_id)
}

/// Aborts the open transaction of `owner` by initialising a producer with its transactional
/// id (which bumps its epoch and fences it).
pub(super) fn fence_owner(config: &Config, me: &str, owner: &str, trigger: Trigger) {
    let started = Instant::now();
    let c = transactional_config(
        config,
        owner,
        &format!("tocsin-scheduler-{me}-fencing-{owner}"),
    );
    let producer: Result<BaseProducer<crate::kafka::client::NodeContext>, _> =
        c.create_with_context(crate::kafka::client::NodeContext);
    let result = (producer.as_ref())
        .map_err(|e| e.to_string())
        .and_then(|p| p.init_transactions(TXN_TIMEOUT).map_err(|e| e.to_string()));
    // Counted as soon as `init_transactions` answers: the producer is dropped (librdkafka's
    // destroy, which can take a while) only after.
    crate::telemetry::fenced(owner, trigger.label(), started.elapsed(), result);
}

/// Whether `e` says this node was fenced: its producer by a newer one with its transactional
/// id, or its group member by a newer epoch (it lost its partitions).
pub(super) fn fenced(e: &SchedulerError) -> bool {
    let SchedulerError::Kafka(k) = e else {
        return false;
    };
    matches!(
        k.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::FencedInstanceId
                | RDKafkaErrorCode::InvalidProducerEpoch
        )
    ) || refused_member(e).is_some()
}

/// How the group refused this node's member in a transaction's offset commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MemberRefused {
    /// It does not know the member: the member holds nothing any more.
    Unknown,
    /// The member's epoch is not the group's: a heartbeat brings the member up to date.
    Epoch,
}

/// Whether `e` is the group refusing this node's member in a transaction's offset commit, and
/// how. The group consumer learns either from its own heartbeats and rejoins or catches up; one
/// that cannot reach its coordinator never does (`Engine::run` then rejoins with a new
/// consumer).
pub(super) fn refused_member(e: &SchedulerError) -> Option<MemberRefused> {
    let SchedulerError::Kafka(k) = e else {
        return None;
    };
    match k.rdkafka_error_code()? {
        RDKafkaErrorCode::UnknownMemberId => Some(MemberRefused::Unknown),
        RDKafkaErrorCode::IllegalGeneration
        | RDKafkaErrorCode::FencedMemberEpoch
        | RDKafkaErrorCode::StaleMemberEpoch => Some(MemberRefused::Epoch),
        _ => None,
    }
}

/// The settings of a producer with `node_id`'s transactional id: the node's own, or one that
/// fences it.
fn transactional_config(config: &Config, node_id: &str, client_id: &str) -> ClientConfig {
    let mut c = crate::kafka::producer_config(config);
    c.set("client.id", client_id);
    c.set("transactional.id", transactional_id(config, node_id));
    c.set(
        "transaction.timeout.ms",
        config.scheduler.transaction_timeout_ms.to_string(),
    );
    // Back-to-back transactions meet CONCURRENT_TRANSACTIONS while the previous one's markers
    // are written, and a fence's `InitProducerId` meets it while the coordinator aborts the
    // fenced transaction; librdkafka's default backoff (100 ms, growing to 1 s) would cost
    // more than either. Unless the `[kafka]` table says otherwise.
    for (key, value) in [("retry.backoff.ms", "5"), ("retry.backoff.max.ms", "50")] {
        if !config.kafka.contains_key(key) {
            c.set(key, value);
        }
    }
    c
}

fn new_producer(
    config: &Config,
    node_id: &str,
    timers_topic: &str,
) -> Result<BaseProducer<DeliveryContext>> {
    let mut c = transactional_config(config, node_id, &format!("tocsin-scheduler-{node_id}"));
    c.set("queue.buffering.max.messages", "2000000");
    c.set("queue.buffering.max.kbytes", "2097151");
    // A `kafka` job's missing target must not be created by a produce to it (the broker's
    // `auto.create.topics.enable` is on by default): it sends the run to `dead`.
    c.set("allow.auto.create.topics", "false");
    let ctx = DeliveryContext {
        timers_topic: timers_topic.to_owned(),
        prefix: config.topic_prefix.clone(),
        ..DeliveryContext::default()
    };
    Ok(c.create_with_context(ctx)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::error::RDKafkaErrorCode;

    #[test]
    fn an_error_outside_a_transaction_call_aborts_the_transaction() {
        let e = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(classify(&e), ErrorClass::Abortable);
        assert_eq!(classify(&KafkaError::Canceled), ErrorClass::Abortable);
    }
}
