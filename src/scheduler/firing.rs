//! Firing due entries: each entry's runs, skipped instants and new timer state, built into a
//! transaction's changes (`Txn`) and a list of records (`Out`) before the transaction that
//! carries them is open. So the engine fires a herd's next chunk while the chunk before it
//! commits (`Engine::transact_prepared`): the scan, the state loads, the schedule arithmetic
//! and the records' encoding overlap the broker's round trips, and only the sends wait for
//! the new transaction.
//!
//! A chunk fired ahead reads the stored timers of its own jobs only. The chunks of one scan
//! round are disjoint jobs, so the commit it overlaps changes none of them; anything else
//! that changes timers or partitions in between (an input record, an assignment, a release)
//! makes the engine discard it and fire the chunk again (`Prepared::epoch`).

use std::collections::BTreeMap;

use foldhash::HashMap;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;

use super::fire::{self, FireLimits};
use super::ingest::Schedules;
use super::lifecycle::Lifecycle;
use super::output::{FiredFrom, Out, Output};
use super::producer::refuses_code;
use super::store::{DueEntry, Store};
use super::txn::Txn;
use super::SchedulerError;
use crate::kafka::admin::AdminError;
use crate::model::records::TimerState;

type Result<T, E = SchedulerError> = std::result::Result<T, E>;

/// What firing reads and writes of the engine: the parts of it the commit running beside it
/// does not touch.
pub struct Firing<'a> {
    pub store: &'a Store,
    pub parts: &'a BTreeMap<i32, Lifecycle<OwnedMessage>>,
    pub schedules: &'a mut Schedules,
    pub output: &'a mut Output,
    /// Jobs whose records the broker refused (`Engine::suspects`): fired in the transaction.
    pub suspects: &'a HashMap<String, (u32, String)>,
    pub limits: FireLimits,
    /// The node's assignment count, for the `fired` header.
    pub assignments: u64,
}

/// A chunk of due entries fired ahead of its transaction.
pub struct Prepared {
    pub txn: Txn,
    /// The instant it was fired at: the transaction's `now`.
    pub now: i64,
    /// The records, each with its job's index in `jobs`.
    pub out: Vec<(u32, Out)>,
    /// (partition, job) of each entry fired ahead.
    pub jobs: Vec<(i32, String)>,
    /// Entries left to fire in the transaction itself, as before: those of suspect jobs and
    /// those whose firing failed for what the job is (the transaction quarantines them).
    pub slow: Vec<DueEntry>,
    /// The entries of the chunk.
    pub due: usize,
    /// The engine's (assignments, releases) when it was fired: it is stale if they changed.
    pub epoch: (u64, u64),
    /// How long firing it took.
    pub prepare_ms: u64,
}

impl Firing<'_> {
    /// Fires `due` as of `now`, into a new transaction's changes (`store.batch()`).
    pub fn prepare(&mut self, due: &[DueEntry], now: i64, epoch: (u64, u64)) -> Result<Prepared> {
        let started = std::time::Instant::now();
        let mut prepared = Prepared {
            txn: Txn::with_capacity(self.store.batch(), due.len()),
            now,
            out: Vec::with_capacity(due.len()),
            jobs: Vec::with_capacity(due.len()),
            slow: Vec::new(),
            due: due.len(),
            epoch,
            prepare_ms: 0,
        };
        let mut firable = Vec::with_capacity(due.len());
        for e in due {
            if !self
                .parts
                .get(&(e.partition as i32))
                .is_some_and(|l| l.is_active())
            {
                continue;
            }
            if self.suspects.contains_key(&e.job) {
                prepared.slow.push(e.clone());
                continue;
            }
            firable.push(e);
        }
        // Their stored timers in one batched read: a chunk's thousands of point reads share
        // their index and filter lookups.
        let keys: Vec<(u16, &str)> = firable
            .iter()
            .map(|e| (e.partition, e.job.as_str()))
            .collect();
        let stored = self.store.timers(&keys);
        let mut out = Vec::new();
        for (e, read) in firable.into_iter().zip(stored) {
            let p = e.partition as i32;
            out.clear();
            let fire = || {
                // A job the chunk changed already (a second index entry of it) is read as
                // the transaction has it.
                let state = match prepared.txn.changed(p, &e.job) {
                    Some(state) => state,
                    None => read?,
                };
                self.fire_loaded(&mut prepared.txn, e, state, now, &mut out)
            };
            match guarded(fire) {
                Ok(()) if out.is_empty() => {}
                Ok(()) => {
                    let at = prepared.jobs.len() as u32;
                    prepared.jobs.push((p, e.job.clone()));
                    prepared.out.extend(out.drain(..).map(|o| (at, o)));
                }
                // Its state is unchanged (`fire_entry` changes it last): the transaction
                // fires it again and sets it aside.
                Err(Fault::Record(_)) => prepared.slow.push(e.clone()),
                Err(Fault::Step(e)) => return Err(e),
            }
        }
        prepared.prepare_ms = started.elapsed().as_millis() as u64;
        Ok(prepared)
    }

    /// Fires one due entry: its records into `out`, its new timer state into `txn` (last,
    /// so an entry that fails leaves `txn` as it was).
    pub fn fire_entry(
        &mut self,
        txn: &mut Txn,
        e: &DueEntry,
        now: i64,
        out: &mut Vec<Out>,
    ) -> Result<()> {
        let state = txn.load(self.store, e.partition as i32, &e.job)?;
        self.fire_loaded(txn, e, state, now, out)
    }

    /// As [`Firing::fire_entry`], with the entry's timer as the transaction has it: `state`.
    fn fire_loaded(
        &mut self,
        txn: &mut Txn,
        e: &DueEntry,
        state: Option<TimerState>,
        now: i64,
        out: &mut Vec<Out>,
    ) -> Result<()> {
        let p = e.partition as i32;
        let Some(mut state) = state else {
            // A stale index entry (the job was deleted): drop it.
            txn.batch
                .delete_timer(self.store, e.partition, &e.job, Some(e.wake_ms));
            return Ok(());
        };
        let old_wake = self.store.wake(&state);
        if old_wake != Some(e.wake_ms) {
            return Ok(()); // changed earlier in this transaction; the index follows the state
        }
        let Some(schedule) = self.schedules.of(&state.definition) else {
            return Ok(());
        };
        // A job fired ahead is fired through its horizon; its lateness is still measured from
        // the clock.
        let lead = self.store.lookahead().of(&state.definition);
        let horizon = now.saturating_add(lead);
        let limits = FireLimits {
            completes_at_fire: self.output.delivers(&state.definition),
            misfire_threshold_ms: self.limits.misfire_threshold_ms.saturating_add(lead),
            ..self.limits
        };
        let before = fire::Plain::of(&state);
        #[cfg(debug_assertions)]
        let replayed = {
            let mut s = state.clone();
            fire::advance(&mut s, &schedule, horizon);
            s
        };
        let fired = fire::fire_due(&mut state, &schedule, horizon, limits);
        let plain = fire::fired_plainly(before, &state, &fired, horizon);
        #[cfg(debug_assertions)]
        if plain {
            assert_eq!(replayed, state, "a plain fire must be what advance replays");
        }
        let from = FiredFrom {
            partition: p,
            assignment_epoch: self.assignments,
        };
        for d in &fired.runs {
            out.push(self.output.fired(&state, d, from, now)?);
        }
        for s in &fired.skipped {
            out.push(self.output.skipped(&state.definition, *s, now));
        }
        for d in &fired.runs {
            // Fired ahead: not late (the lane's lead is measured by the load test).
            txn.lags
                .add((now - d.scheduled_ms).max(0), &state.definition.tenant);
        }
        if fired.missed > 0 {
            metrics::counter!("tocsin_instants_missed_total").increment(fired.missed);
        }
        txn.runs += fired.runs.len() as u64;
        txn.fired_partitions.insert(p);
        txn.change(p, &e.job, Some(state), old_wake, plain);
        Ok(())
    }
}

/// How one item of a transaction (an input record, a due entry) failed.
pub enum Fault {
    /// Because of what the item is: it is set aside and the transaction goes on.
    Record(String),
    /// For a reason of the node or the broker: the whole step is retried.
    Step(SchedulerError),
}

/// Runs one item's processing, telling the errors that belong to the item (a record the
/// broker or librdkafka refuses for its size or topic, a lane that cannot be created, a
/// panic in schedule code) from those that belong to the node.
pub fn guarded(f: impl FnOnce() -> Result<()>) -> std::result::Result<(), Fault> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if is_record_fault(&e) => Err(Fault::Record(e.to_string())),
        Ok(Err(e)) => Err(Fault::Step(e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Fault::Record(format!("internal error (panic): {what}")))
        }
    }
}

/// Errors caused by the record itself: retrying cannot help, and every other job in the
/// transaction would fail with it.
pub fn is_record_fault(e: &SchedulerError) -> bool {
    match e {
        SchedulerError::Kafka(KafkaError::MessageProduction(code)) => refuses_code(*code),
        SchedulerError::Admin(AdminError::Create { code, .. }) => matches!(
            code,
            RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::PolicyViolation
                | RDKafkaErrorCode::InvalidConfig
                | RDKafkaErrorCode::TopicAuthorizationFailed
        ),
        _ => false,
    }
}
