//! The records Tocsin writes besides job definitions: timer state (`timers`), runs (lanes and
//! `dead`), control requests (`control`) and run events (`runs`). Plain data, no I/O.
//!
//! Times are milliseconds since the Unix epoch (UTC); durations are milliseconds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_128;

use crate::model::job::{HandlerSpec, JobDefinition, RetryPolicy};

/// The identity of the run of `job_id` scheduled at `scheduled_ms`: lowercase hex (32 digits) of
/// xxh3-128 over the job id's bytes, a 0x00 byte and `scheduled_ms` as 8 big-endian bytes.
///
/// A run fired twice, by any path (a retry of a takeover, a manual trigger at the same instant),
/// gets the same id, so workers and sinks deduplicate by it. The 8-byte suffix has a fixed
/// width, so the input is unambiguous even for ids that contain 0x00.
pub fn run_id(job_id: &str, scheduled_ms: i64) -> String {
    let mut input = Vec::with_capacity(job_id.len() + 9);
    input.extend_from_slice(job_id.as_bytes());
    input.push(0);
    input.extend_from_slice(&scheduled_ms.to_be_bytes());
    format!("{:032x}", xxh3_128(&input))
}

/// Why a run was fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FireReason {
    /// An instant of the job's schedule fell due.
    #[default]
    Schedule,
    /// A worker asked for another attempt after a failure.
    Retry,
    /// A user triggered the job by hand.
    Manual,
    /// An instant of a backfill range.
    Backfill,
    /// An instant missed while no node fired the job (misfire policy).
    CatchUp,
}

/// What the scheduler keeps per job on the compacted `timers` topic, keyed by job id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimerState {
    pub definition: JobDefinition,
    /// The next instant to fire; `None` when the schedule has no more fires.
    pub next_fire_ms: Option<i64>,
    /// Fires so far, counted against `max_fires`.
    pub fires: u64,
    /// The scheduled instant of the latest fire.
    pub last_scheduled_ms: Option<i64>,
    /// The run still in flight, for the overlap policy.
    pub in_flight: Option<InFlight>,
    /// `buffer_one`: the one instant waiting for the run in flight to finish.
    pub buffered_ms: Option<i64>,
    /// Retries, manual triggers and backfill instants waiting to be fired.
    pub pending: Vec<PendingFire>,
}

/// The run the scheduler last fired and has not yet seen complete.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InFlight {
    pub run_id: String,
    pub scheduled_ms: i64,
}

/// A fire waiting in a timer, outside the schedule's own instants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PendingFire {
    pub scheduled_ms: i64,
    /// 1 for a first attempt.
    pub attempt: u32,
    /// Not to be fired before this instant (retry backoff).
    pub not_before_ms: i64,
    pub reason: FireReason,
}

/// One run, as the scheduler produces it to a tenant lane (keyed by job id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub run_id: String,
    pub job_id: String,
    pub tenant: String,
    /// The instant of the schedule this run is for (jitter not included).
    pub scheduled_ms: i64,
    /// When the scheduler fired it.
    pub fire_ms: i64,
    /// 1 for a first attempt.
    pub attempt: u32,
    pub reason: FireReason,
    pub handler: HandlerSpec,
    pub timeout_ms: u64,
    pub retry: RetryPolicy,
    pub labels: BTreeMap<String, String>,
}

/// What workers and the CLI send the scheduler on `control`, keyed by job id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ControlRecord {
    /// A failed run to be fired again, attempt `attempt`, not before `not_before_ms`.
    Retry {
        run_id: String,
        scheduled_ms: i64,
        /// The attempt to run next.
        attempt: u32,
        not_before_ms: i64,
        error: String,
    },
    /// A run finished (for the overlap policy).
    Completion {
        run_id: String,
        scheduled_ms: i64,
        attempt: u32,
        outcome: Outcome,
    },
    /// Fire the job now, outside its schedule.
    Trigger {
        /// The instant used as the run's scheduled instant (and so its run id).
        requested_ms: i64,
    },
    /// Fire every instant of the schedule in `[from_ms, to_ms)`.
    Backfill { from_ms: i64, to_ms: i64 },
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Succeeded,
    Failed,
    /// Failed its last attempt; sent to `dead`.
    Dead,
    /// Not run (overlap policy, or a redelivery of a finished run).
    Skipped,
}

/// One transition of a run, on `runs`, keyed by run id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEvent {
    pub run_id: String,
    pub job_id: String,
    pub tenant: String,
    pub scheduled_ms: i64,
    pub attempt: u32,
    pub kind: RunEventKind,
    /// When the transition happened.
    pub at_ms: i64,
    /// The scheduler node or worker that reports it.
    pub node: String,
    pub error: Option<String>,
    /// For the end of a run: how long it ran.
    pub duration_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunEventKind {
    Fired,
    Started,
    Heartbeat,
    Succeeded,
    Failed,
    Retrying,
    Dead,
    Skipped,
}

/// A run that failed its last attempt, on `dead`, keyed by run id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub run: Run,
    /// The error of the last attempt.
    pub error: String,
    /// Attempts made in all.
    pub attempts: u32,
    pub at_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_id_is_stable_and_distinguishes_inputs() {
        let a = run_id("billing-7", 1_700_000_000_000);
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(a, run_id("billing-7", 1_700_000_000_000));
        assert_ne!(a, run_id("billing-7", 1_700_000_000_001));
        assert_ne!(a, run_id("billing-8", 1_700_000_000_000));
        // The separator keeps "a" + instant apart from "a\0..." + another instant.
        assert_ne!(run_id("a", 0), run_id("a\0", 0));
    }

    #[test]
    fn run_id_matches_an_independent_xxh3_implementation() {
        // Values from Python's `xxhash.xxh3_128_hexdigest(b"billing-7\x00" + pack(">q", ms))`:
        // run ids are persisted and compared across nodes, so they must never change.
        assert_eq!(
            run_id("billing-7", 1_700_000_000_000),
            "dbdc0332386763c72f76abffcdabd0e0"
        );
        assert_eq!(run_id("job", -5), "27524aa3035e1625862980daa0e4fddc");
    }
}
