//! Applying consumed `jobs` and `control` records to a transaction (`Txn`): a definition put
//! or deleted, a pause, resume or trigger applied (the decisions are `ingest`'s), a bad record
//! sent to `jobs.rejected`, and the quarantine of a job whose records the broker keeps
//! refusing, so one record never stops a partition.

use foldhash::HashMap;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::BaseRecord;
use tracing::{error, info, warn};

use super::fire;
use super::firing::{guarded, Fault};
use super::ingest::{self, ControlChange, JobChange, Schedules};
use super::output::Output;
use super::producer::TxnProducer;
use super::store::Store;
use super::txn::Txn;
use super::{SchedulerError, Topics};
use crate::codec::{self, Framing};
use crate::model::records::TimerState;
use crate::model::validate::Limits;
use crate::telemetry::{self, Rejection};

type Result<T, E = SchedulerError> = std::result::Result<T, E>;

/// Transactions a job's records may fail, refused by the broker for what they are, before the
/// job is set aside in `jobs.rejected`. Two, so one odd refusal is retried.
pub const QUARANTINE_AFTER: u32 = 2;

/// Jobs (by key) whose records the broker refused, with the reason and how often: at
/// `QUARANTINE_AFTER` the job is set aside (`Intake::quarantine_record`,
/// `Intake::quarantine_timer`).
pub type Suspects = HashMap<String, (u32, String)>;

/// What applying records works with, borrowed from the engine for one transaction.
pub struct Intake<'a> {
    pub store: &'a Store,
    pub producer: &'a TxnProducer,
    pub output: &'a mut Output,
    pub schedules: &'a mut Schedules,
    pub suspects: &'a mut Suspects,
    pub limits: &'a Limits,
    pub topics: &'a Topics,
}

impl Intake<'_> {
    /// Applies consumed records to `txn`, and the position after each to its positions. A
    /// record that fails for what it is goes to `jobs.rejected`; an error of the node or the
    /// broker fails the transaction.
    pub fn fill(&mut self, txn: &mut Txn, records: &[OwnedMessage], now: i64) -> Result<()> {
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
    pub fn set_aside(&mut self, job: &str) -> Option<String> {
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
    pub fn quarantine_timer(
        &mut self,
        txn: &mut Txn,
        p: i32,
        job: &str,
        reason: String,
    ) -> Result<()> {
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
            self.producer,
            job.as_bytes(),
            definition.as_deref(),
            &reason,
            &source,
        )?;
        self.delete_timer(txn, p, job, old_wake)
    }

    /// Deletes a job's timer in `txn`: its tombstone in `timers`, its state and index entry.
    fn delete_timer(
        &mut self,
        txn: &mut Txn,
        p: i32,
        job: &str,
        old_wake: Option<i64>,
    ) -> Result<()> {
        let record = BaseRecord::<[u8], [u8]>::to(&self.topics.timers)
            .partition(p)
            .key(job.as_bytes());
        self.producer.send(record).map_err(|(e, _)| e)?;
        txn.change(p, job, None, old_wake, false);
        self.schedules.forget(job);
        Ok(())
    }

    fn load(&self, txn: &Txn, p: i32, job: &str) -> Result<Option<TimerState>> {
        Ok(txn.load(self.store, p, job)?)
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
        match ingest::on_job(&record, existing, self.limits, now) {
            JobChange::Reject(kind, reason) => return self.reject(m, kind, reason),
            JobChange::Nothing => {}
            JobChange::Delete { job } => self.delete_timer(txn, p, &job, old_wake)?,
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
            self.producer,
            m.key().unwrap_or_default(),
            m.payload(),
            &reason,
            &source,
        )
    }
}
