//! What a firing transaction writes besides `timers` and its offsets: each fired run into its
//! tenant's lane (or, for a `kafka` job the node delivers itself, into its target topic), the
//! run's events on `runs`, dead letters on `dead`, and rejected input on `jobs.rejected`.
//!
//! It owns what those writes need to know: the lanes (created on first use), the target
//! topics as the broker's metadata last showed them, and the jobs whose target refused a
//! record in the transaction that just failed. It writes through the engine's transactional
//! producer, lent per call, so every record here is in the engine's open transaction.

use foldhash::{HashMap, HashMapExt};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::BaseRecord;
use tracing::warn;

use super::deliver::{self, Target, Targets};
use super::fire;
use super::ingest::{self, Lanes};
use super::lane::{self, h};
use super::producer::TxnProducer;
use super::SchedulerError;
use crate::config::{Config, KafkaDelivery, SerializationConfig};
use crate::history::{self, Known, Reporter};
use crate::model::job::{HandlerKind, JobDefinition};
use crate::model::records::{DeadLetter, Run, RunEvent, RunEventKind, TimerState};

type Result<T, E = SchedulerError> = std::result::Result<T, E>;

/// Where a fired run was fired from: the `fired` header of its lane record.
#[derive(Debug, Clone, Copy)]
pub struct FiredFrom {
    pub partition: i32,
    /// The node's assignment count when it fired.
    pub assignment_epoch: u64,
}

/// What a fired run or skipped instant writes, built before it is sent (`Output::send`), so a
/// chunk of a herd can be fired while the transaction before it commits.
pub enum Out {
    /// A run into its tenant's lane, with its `fired` event.
    Lane {
        lane: String,
        records: lane::LaneRecords,
    },
    /// A run of a `kafka` job the node writes into its target itself (`Output::deliver`).
    Deliver(Box<Run>),
    /// An event on `runs` (key, value).
    Event((Vec<u8>, Vec<u8>)),
}

pub struct Output {
    node_id: String,
    delivery: KafkaDelivery,
    serialization: SerializationConfig,
    runs: String,
    dead: String,
    rejected: String,
    /// The largest record a rejected copy may be (`ingest::rejected_copy`).
    max_record_bytes: usize,
    lanes: Lanes,
    targets: Targets,
    /// Jobs whose target refused a record in the transaction that just failed, with the
    /// reason: their runs go to `dead` when it is retried. Cleared by each commit.
    dead_targets: HashMap<String, String>,
}

impl Output {
    pub fn new(config: &Config, node_id: &str, lanes: Lanes, max_record_bytes: usize) -> Output {
        Output {
            node_id: node_id.to_owned(),
            delivery: config.scheduler.kafka_delivery,
            serialization: config.topics.serialization,
            runs: config.topic("runs"),
            dead: config.topic("dead"),
            rejected: config.topic("jobs.rejected"),
            max_record_bytes,
            lanes,
            targets: Targets::new(&config.topic_prefix),
            dead_targets: HashMap::new(),
        }
    }

    /// Learns the lanes that exist already (at start).
    pub fn seed_lanes(&mut self) {
        self.lanes.seed();
    }

    /// Creates the lanes ingest asked for (`want_lane`), between transactions.
    pub fn create_wanted_lanes(&mut self) {
        self.lanes.create_wanted();
    }

    /// Whether this node writes `def`'s runs into their target itself (`kafka_delivery`).
    pub fn delivers(&self, def: &JobDefinition) -> bool {
        def.handler.kind == HandlerKind::Kafka && self.delivery == KafkaDelivery::Direct
    }

    /// A job `def` was stored: its lane is created ahead of its first run, unless its runs
    /// never go through a lane.
    pub fn want_lane(&mut self, def: &JobDefinition) {
        if !self.delivers(def) {
            self.lanes.want(&def.tenant);
        }
    }

    /// The transaction committed: targets refused in an earlier try are tried again.
    pub fn committed(&mut self) {
        self.dead_targets.clear();
    }

    /// The transaction aborted, and these (topic, job, reason) target records were refused:
    /// every target is looked up again (one deleted since it was cached would hold its
    /// records until they time out, and fail every retry the same way), and the runs of
    /// those jobs go to `dead` on the retry.
    pub fn aborted(&mut self, refused: Vec<(String, String, String)>) {
        self.targets.clear();
        for (topic, job, reason) in refused {
            warn!(job = %job, topic = %topic, reason = %reason,
                "a target refused a run's record; the run goes to dead on the retry");
            self.targets.refused(&topic, reason.clone());
            self.dead_targets.insert(job, reason);
        }
    }

    /// The records of a fired run `d` of `state`'s job: into its lane with its `fired` event,
    /// or delivered (`deliver`). Built before its transaction may be open; `send` writes them.
    pub fn fired(
        &mut self,
        state: &TimerState,
        d: &fire::Due,
        from: FiredFrom,
        now: i64,
    ) -> Result<Out> {
        let def = &state.definition;
        let instance = lane::Instance {
            scheduled_ms: d.scheduled_ms,
            attempt: d.attempt,
            reason: d.reason,
        };
        if self.delivers(def) {
            return Ok(Out::Deliver(Box::new(lane::run(def, instance, now))));
        }
        let lane = self.lanes.ensure(&def.tenant)?;
        let fired = lane::Fired {
            fire_ms: now,
            not_before_ms: d.not_before_ms,
            partition: from.partition,
            assignment_epoch: from.assignment_epoch,
            node: &self.node_id,
        };
        let records = lane::lane_records(def, instance, &fired, self.serialization.runs);
        Ok(Out::Lane { lane, records })
    }

    /// The `skipped` event of an instant of `def` skipped (its overlap policy).
    pub fn skipped(&self, def: &JobDefinition, scheduled_ms: i64, now: i64) -> Out {
        let event = lane::event(
            def,
            scheduled_ms,
            1,
            RunEventKind::Skipped,
            now,
            &self.node_id,
        );
        Out::Event(self.event_record(&event, &Known::default()))
    }

    /// Writes `out` in the open transaction.
    pub fn send(&mut self, producer: &TxnProducer, out: Out) -> Result<()> {
        match out {
            Out::Lane { lane, records } => {
                let record = BaseRecord::to(&lane)
                    .key(&records.key[..])
                    .payload(&records.run[..])
                    .headers(records.run_headers);
                producer.send(record).map_err(|(e, _)| e)?;
                self.send_event(producer, records.event_key, records.event)
            }
            Out::Deliver(run) => self.deliver(producer, &run),
            Out::Event((key, payload)) => self.send_event(producer, key, payload),
        }
    }

    /// One record on `jobs.rejected` (`ingest::rejected_copy`).
    pub fn rejected(
        &mut self,
        producer: &TxnProducer,
        key: &[u8],
        value: Option<&[u8]>,
        reason: &str,
        source: &str,
    ) -> Result<()> {
        let copy = ingest::rejected_copy(key, value, reason, source, self.max_record_bytes);
        let headers = (copy.headers.iter()).fold(OwnedHeaders::new(), |hs, (name, value)| {
            hs.insert(h(name, value))
        });
        let mut record = BaseRecord::<[u8], [u8]>::to(&self.rejected).headers(headers);
        if let Some(k) = copy.key {
            record = record.key(k);
        }
        if let Some(v) = copy.value {
            record = record.payload(v);
        }
        producer.send(record).map_err(|(e, _)| e)?;
        Ok(())
    }

    /// Writes a `kafka` job's run into its target topic, in this transaction, with its
    /// `succeeded` event; or, when the target is missing or refuses it, the run's dead letter
    /// and `dead` event. Either way the run is over when the transaction commits.
    fn deliver(&mut self, producer: &TxnProducer, run: &Run) -> Result<()> {
        let now = run.fire_ms;
        let topic = run.handler.target.as_str();
        let refused = match self.dead_targets.get(&run.job_id) {
            Some(reason) => Some(reason.clone()),
            None => match self.targets.lookup(producer.client(), topic)? {
                Target::Refused(reason) => Some(reason),
                Target::Writable => {
                    let record = BaseRecord::to(topic)
                        .key(run.job_id.as_bytes())
                        .payload(&run.handler.payload)
                        .headers(deliver::headers(run));
                    match producer.send(record) {
                        Ok(()) => None,
                        Err((KafkaError::MessageProduction(code), _))
                            if deliver::refuses_target(code) =>
                        {
                            let reason =
                                format!("target topic {topic:?} refused the record: {code}");
                            self.targets.refused(topic, reason.clone());
                            Some(reason)
                        }
                        Err((e, _)) => return Err(e.into()),
                    }
                }
            },
        };
        let kind = if refused.is_some() {
            RunEventKind::Dead
        } else {
            RunEventKind::Succeeded
        };
        let mut event = lane::event_of(run, kind, now, &self.node_id);
        if let Some(error) = refused {
            warn!(job = %run.job_id, run = %run.run_id, error = %error, "run sent to dead");
            metrics::counter!("tocsin_runs_dead_total", "reason" => "target").increment(1);
            let dead = DeadLetter {
                run: run.clone(),
                error: error.clone(),
                attempts: run.attempt,
                at_ms: now,
            };
            let bytes = history::encode_dead(self.serialization.dead, &dead);
            let record = BaseRecord::to(&self.dead)
                .key(run.run_id.as_bytes())
                .payload(&bytes);
            producer.send(record).map_err(|(e, _)| e)?;
            event.error = Some(error);
        } else {
            metrics::counter!("tocsin_runs_delivered_total").increment(1);
        }
        let known = Known {
            fired_ms: Some(run.fire_ms),
            ..Known::default()
        };
        let (key, payload) = self.event_record(&event, &known);
        self.send_event(producer, key, payload)
    }

    /// The key and value of `event` on `runs`.
    fn event_record(&self, event: &RunEvent, known: &Known) -> (Vec<u8>, Vec<u8>) {
        let bytes =
            history::encode_event(self.serialization.runs, event, Reporter::Scheduler, known);
        (event.run_id.as_bytes().to_vec(), bytes)
    }

    fn send_event(&self, producer: &TxnProducer, key: Vec<u8>, payload: Vec<u8>) -> Result<()> {
        let record = BaseRecord::to(&self.runs)
            .key(&key[..])
            .payload(&payload[..]);
        producer.send(record).map_err(|(e, _)| e)?;
        Ok(())
    }
}
