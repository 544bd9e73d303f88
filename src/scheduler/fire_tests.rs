//! Tests of `fire`: what a timer does when it falls due, under each policy, and properties over
//! random schedules, jitter, policies and clocks.

use std::collections::HashSet;

use proptest::prelude::*;

use super::{
    advance, apply_control, fire_at, fire_due, fired_plainly, new_timer, update_timer, wake_at,
    Due, FireLimits, Fired, Lookahead, Plain,
};
use crate::model::job::{
    HandlerKind, HandlerSpec, JobDefinition, MisfirePolicy, OverlapPolicy, ScheduleSpec,
};
use crate::model::records::{
    run_id, ControlRecord, FireReason, InFlight, Outcome, PendingFire, TimerState,
};
use crate::model::schedule::Schedule;

/// 2025-06-15T15:06:40Z, a multiple of `STEP`.
const T0: i64 = 1_750_000_000_000;
/// The period of `every_10s`.
const STEP: i64 = 10_000;
pub(crate) const ID: &str = "billing-7";

/// The engine's defaults.
const LIMITS: FireLimits = FireLimits {
    misfire_threshold_ms: 60_000,
    max_runs: 1_000,
    completes_at_fire: false,
};

/// A job of tenant `acme` with id `ID` and a custom handler (shared by the scheduler's tests).
pub(crate) fn job(schedule: ScheduleSpec) -> JobDefinition {
    let handler = HandlerSpec {
        kind: HandlerKind::Custom,
        target: "out".into(),
        payload: b"{}".to_vec(),
        headers: Default::default(),
        method: None,
        args: vec![],
    };
    JobDefinition::new(ID, "acme", schedule, handler)
}

fn every(every_ms: u64) -> ScheduleSpec {
    ScheduleSpec::Interval {
        every_ms,
        anchor_ms: 0,
    }
}

/// Every 10 s, at the multiples of 10 s (so at T0), every setting at its default.
fn every_10s() -> JobDefinition {
    job(every(STEP as u64))
}

/// `every_10s` under the overlap policy `overlap`.
fn overlapping(overlap: OverlapPolicy) -> JobDefinition {
    JobDefinition {
        overlap,
        ..every_10s()
    }
}

fn run(scheduled_ms: i64, reason: FireReason) -> Due {
    Due {
        scheduled_ms,
        attempt: 1,
        reason,
        not_before_ms: scheduled_ms,
    }
}

/// A run not to start before `not_before_ms` (a request's or a release's instant, or a
/// jittered fire time).
fn run_at(scheduled_ms: i64, reason: FireReason, not_before_ms: i64) -> Due {
    Due {
        not_before_ms,
        ..run(scheduled_ms, reason)
    }
}

fn completion(scheduled_ms: i64) -> ControlRecord {
    ControlRecord::Completion {
        run_id: run_id(ID, scheduled_ms),
        scheduled_ms,
        attempt: 1,
        outcome: Outcome::Succeeded,
    }
}

/// A timer with its parsed schedule, driven as the engine drives it.
struct Timer {
    state: TimerState,
    schedule: Schedule,
}

impl Timer {
    fn new(def: JobDefinition, now: i64) -> Timer {
        let schedule = Schedule::from_job(&def).expect("a valid schedule");
        Timer {
            state: new_timer(def, &schedule, now),
            schedule,
        }
    }

    fn fire(&mut self, now: i64) -> Fired {
        self.fire_with(now, LIMITS)
    }

    fn fire_with(&mut self, now: i64, limits: FireLimits) -> Fired {
        fire_due(&mut self.state, &self.schedule, now, limits)
    }

    fn control(&mut self, record: ControlRecord, now: i64) -> bool {
        apply_control(&mut self.state, record, &self.schedule, now, 10_000)
    }

    fn update(&mut self, def: JobDefinition, now: i64) {
        self.schedule = Schedule::from_job(&def).expect("a valid schedule");
        update_timer(&mut self.state, def, &self.schedule, now);
    }

    fn wake(&self) -> Option<i64> {
        wake_at(&self.state)
    }

    /// The run in flight completes at `now`.
    fn complete(&mut self, now: i64) -> bool {
        let f = self.state.in_flight.clone().expect("a run in flight");
        self.control(completion(f.scheduled_ms), now)
    }
}

fn instants(runs: &[Due]) -> Vec<i64> {
    runs.iter().map(|d| d.scheduled_ms).collect()
}

/// Schedule and catch-up runs: the ones max_fires counts.
fn counted(runs: &[Due]) -> usize {
    runs.iter()
        .filter(|d| matches!(d.reason, FireReason::Schedule | FireReason::CatchUp))
        .count()
}

// ---------------------------------------------------------------------------------------------
// max_fires

#[test]
fn max_fires_fires_exactly_that_many_then_nothing() {
    let mut t = Timer::new(
        JobDefinition {
            max_fires: Some(3),
            ..every_10s()
        },
        T0,
    );
    assert_eq!(t.state.next_fire_ms, Some(T0));
    let mut runs = Vec::new();
    for k in 0..8 {
        runs.extend(t.fire(T0 + k * STEP).runs);
    }
    assert_eq!(
        runs,
        vec![
            run(T0, FireReason::Schedule),
            run(T0 + STEP, FireReason::Schedule),
            run(T0 + 2 * STEP, FireReason::Schedule),
        ]
    );
    assert_eq!(t.state.fires, 3);
    assert_eq!(t.state.next_fire_ms, None);
    assert_eq!(t.wake(), None);

    // An update that keeps max_fires does not revive it: a new revision, nor a new schedule.
    t.update(
        JobDefinition {
            max_fires: Some(3),
            revision: 1,
            ..every_10s()
        },
        T0 + 8 * STEP,
    );
    assert_eq!(t.state.next_fire_ms, None);
    assert_eq!(t.wake(), None);
    t.update(
        JobDefinition {
            max_fires: Some(3),
            revision: 2,
            ..job(every(5_000))
        },
        T0 + 9 * STEP,
    );
    assert_eq!(t.state.next_fire_ms, None);
    assert_eq!(t.wake(), None);
    assert_eq!(t.fire(T0 + 20 * STEP), Fired::default());

    // Raising it does, from the next instant at or after now.
    t.update(
        JobDefinition {
            max_fires: Some(4),
            revision: 3,
            ..job(every(5_000))
        },
        T0 + 20 * STEP,
    );
    assert_eq!(t.state.next_fire_ms, Some(T0 + 20 * STEP));
    let f = t.fire(T0 + 20 * STEP + 5_000);
    assert_eq!(f.runs, vec![run(T0 + 20 * STEP, FireReason::Schedule)]);
    assert_eq!(t.state.fires, 4);
    assert_eq!(t.state.next_fire_ms, None);
}

#[test]
fn max_fires_caps_one_pass_and_a_catch_up() {
    // Six instants due in one pass, each less late than the threshold.
    let mut t = Timer::new(
        JobDefinition {
            max_fires: Some(3),
            ..every_10s()
        },
        T0,
    );
    let f = t.fire(T0 + 5 * STEP);
    assert_eq!(instants(&f.runs), vec![T0, T0 + STEP, T0 + 2 * STEP]);
    assert_eq!(t.state.next_fire_ms, None);

    // Sixty-one missed instants under fire_all.
    let mut t = Timer::new(
        JobDefinition {
            max_fires: Some(3),
            misfire: MisfirePolicy::FireAll,
            ..every_10s()
        },
        T0,
    );
    let f = t.fire(T0 + 60 * STEP);
    assert_eq!(f.runs.len(), 3);
    assert!(f.runs.iter().all(|d| d.reason == FireReason::CatchUp));
    assert_eq!(t.state.fires, 3);
    assert_eq!(t.state.next_fire_ms, None);
    assert_eq!(t.wake(), None);
}

// ---------------------------------------------------------------------------------------------
// Overlap

#[test]
fn overlap_skip_skips_while_in_flight_and_fires_after_completion() {
    let mut t = Timer::new(overlapping(OverlapPolicy::Skip), T0);
    assert_eq!(t.fire(T0).runs, vec![run(T0, FireReason::Schedule)]);
    assert_eq!(
        t.state.in_flight,
        Some(InFlight {
            run_id: run_id(ID, T0),
            scheduled_ms: T0,
        })
    );

    let f = t.fire(T0 + STEP);
    assert_eq!(f.runs, vec![]);
    assert_eq!(f.skipped, vec![T0 + STEP]);
    let f = t.fire(T0 + 3 * STEP);
    assert_eq!(f.runs, vec![]);
    assert_eq!(f.skipped, vec![T0 + 2 * STEP, T0 + 3 * STEP]);
    assert_eq!(t.state.fires, 1, "skipped instants are not fires");

    // The completion of another run (a skipped one) changes nothing.
    assert!(!t.control(completion(T0 + STEP), T0 + 3 * STEP + 1));
    assert!(t.state.in_flight.is_some());

    assert!(t.control(completion(T0), T0 + 3 * STEP + 1));
    assert_eq!(t.state.in_flight, None);
    assert_eq!(t.state.pending, vec![], "skip keeps nothing for later");
    let f = t.fire(T0 + 4 * STEP);
    assert_eq!(f.runs, vec![run(T0 + 4 * STEP, FireReason::Schedule)]);
    assert_eq!(f.skipped, Vec::<i64>::new());
    assert_eq!(
        t.state.in_flight.as_ref().map(|f| f.scheduled_ms),
        Some(T0 + 4 * STEP)
    );
    // A redelivered completion of the earlier run does not end this one.
    assert!(!t.control(completion(T0), T0 + 4 * STEP + 1));
    assert!(t.state.in_flight.is_some());
}

#[test]
fn overlap_allow_never_holds_a_run() {
    let mut t = Timer::new(every_10s(), T0);
    let f = t.fire(T0 + 3 * STEP);
    assert_eq!(
        instants(&f.runs),
        vec![T0, T0 + STEP, T0 + 2 * STEP, T0 + 3 * STEP]
    );
    assert_eq!(f.skipped, Vec::<i64>::new());
    assert_eq!(t.state.in_flight, None);
}

#[test]
fn overlap_buffer_one_keeps_one_instant_for_after_the_run() {
    let mut t = Timer::new(overlapping(OverlapPolicy::BufferOne), T0);
    assert_eq!(t.fire(T0).runs, vec![run(T0, FireReason::Schedule)]);
    let f = t.fire(T0 + STEP);
    assert_eq!(f, Fired::default(), "buffered: neither run nor skipped");
    assert_eq!(t.state.buffered_ms, Some(T0 + STEP));
    let f = t.fire(T0 + 3 * STEP);
    assert_eq!(f.runs, vec![]);
    assert_eq!(f.skipped, vec![T0 + 2 * STEP, T0 + 3 * STEP], "one only");
    assert_eq!(t.state.buffered_ms, Some(T0 + STEP));

    let done = T0 + 3 * STEP + 500;
    assert!(t.complete(done));
    assert_eq!(t.state.in_flight, None);
    assert_eq!(t.state.buffered_ms, None);
    assert_eq!(
        t.state.pending,
        vec![PendingFire {
            scheduled_ms: T0 + STEP,
            attempt: 1,
            not_before_ms: done,
            reason: FireReason::Schedule,
        }]
    );
    assert_eq!(t.wake(), Some(done));
    let f = t.fire(done);
    assert_eq!(f.runs, vec![run_at(T0 + STEP, FireReason::Schedule, done)]);
    assert_eq!(t.state.pending, vec![]);
    assert_eq!(t.wake(), Some(T0 + 4 * STEP));
}

#[test]
fn overlap_buffer_one_released_run_is_in_flight() {
    let mut t = Timer::new(overlapping(OverlapPolicy::BufferOne), T0);
    t.fire(T0);
    t.fire(T0 + STEP); // buffered
    assert!(t.complete(T0 + STEP + 1));
    assert_eq!(
        t.fire(T0 + STEP + 1).runs,
        vec![run_at(T0 + STEP, FireReason::Schedule, T0 + STEP + 1)]
    );
    // The released run is running now: the next instant must wait for it.
    assert_eq!(
        t.state.in_flight.as_ref().map(|f| f.scheduled_ms),
        Some(T0 + STEP)
    );
    let f = t.fire(T0 + 2 * STEP);
    assert_eq!(f.runs, vec![]);
    assert_eq!(t.state.buffered_ms, Some(T0 + 2 * STEP));
}

#[test]
fn overlap_buffer_one_released_runs_count_toward_max_fires() {
    let mut t = Timer::new(
        JobDefinition {
            overlap: OverlapPolicy::BufferOne,
            max_fires: Some(2),
            ..every_10s()
        },
        T0,
    );
    // The run of T0 takes 15 s, so T0+10s waits in the buffer; later runs take 5 s.
    let mut runs = t.fire(T0).runs; // T0, fire 1
    assert_eq!(t.fire(T0 + STEP).runs, vec![]); // T0+10s buffered
    assert!(t.complete(T0 + STEP + 5_000));
    runs.extend(t.fire(T0 + STEP + 5_000).runs); // T0+10s: fire 2
    for k in 2..10 {
        let now = T0 + k * STEP;
        runs.extend(t.fire(now).runs);
        if t.state.in_flight.is_some() {
            t.complete(now + 5_000);
        }
        runs.extend(t.fire(now + 5_000).runs);
    }
    // Today: T0, T0+10s released from the buffer (not counted), then T0+20s: 3 runs.
    assert_eq!(counted(&runs), 2, "{runs:?}");
}

#[test]
fn completes_at_fire_never_sets_in_flight() {
    let limits = FireLimits {
        completes_at_fire: true,
        ..LIMITS
    };
    for overlap in [OverlapPolicy::Skip, OverlapPolicy::BufferOne] {
        let mut t = Timer::new(
            JobDefinition {
                overlap,
                ..every_10s()
            },
            T0,
        );
        let mut runs = Vec::new();
        for now in [T0, T0 + STEP, T0 + 3 * STEP] {
            let f = t.fire_with(now, limits);
            assert_eq!(f.skipped, Vec::<i64>::new(), "{overlap:?}");
            assert_eq!(t.state.in_flight, None, "{overlap:?}");
            assert_eq!(t.state.buffered_ms, None, "{overlap:?}");
            runs.extend(f.runs);
        }
        assert_eq!(
            instants(&runs),
            vec![T0, T0 + STEP, T0 + 2 * STEP, T0 + 3 * STEP],
            "{overlap:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Control requests

#[test]
fn trigger_fires_at_once_and_does_not_count_toward_max_fires() {
    let mut t = Timer::new(
        JobDefinition {
            max_fires: Some(1),
            ..every_10s()
        },
        T0 + 1,
    );
    assert_eq!(t.state.next_fire_ms, Some(T0 + STEP));
    let asked = T0 + 2_000;
    assert!(t.control(
        ControlRecord::Trigger {
            requested_ms: asked
        },
        asked
    ));
    assert_eq!(
        t.state.pending,
        vec![PendingFire {
            scheduled_ms: asked,
            attempt: 1,
            not_before_ms: asked,
            reason: FireReason::Manual,
        }]
    );
    assert_eq!(t.wake(), Some(asked));
    assert_eq!(t.fire(asked).runs, vec![run(asked, FireReason::Manual)]);
    assert_eq!(t.state.fires, 0);
    assert_eq!(t.state.pending, vec![]);

    // The one scheduled fire is still there.
    assert_eq!(
        t.fire(T0 + STEP).runs,
        vec![run(T0 + STEP, FireReason::Schedule)]
    );
    assert_eq!(t.state.next_fire_ms, None);

    // And a job past its max_fires still runs when triggered.
    let asked = T0 + 5 * STEP;
    assert!(t.control(
        ControlRecord::Trigger {
            requested_ms: asked
        },
        asked
    ));
    assert_eq!(t.wake(), Some(asked));
    assert_eq!(t.fire(asked).runs, vec![run(asked, FireReason::Manual)]);
    assert_eq!(t.wake(), None);
}

#[test]
fn trigger_ignores_the_overlap_policy() {
    let mut t = Timer::new(overlapping(OverlapPolicy::Skip), T0);
    t.fire(T0);
    assert!(t.state.in_flight.is_some());
    t.control(
        ControlRecord::Trigger {
            requested_ms: T0 + 1,
        },
        T0 + 1,
    );
    assert_eq!(t.fire(T0 + 1).runs, vec![run(T0 + 1, FireReason::Manual)]);
    assert_eq!(
        t.state.in_flight.as_ref().map(|f| f.scheduled_ms),
        Some(T0),
        "a manual run does not replace the run in flight"
    );
}

#[test]
fn backfill_adds_the_instants_in_from_inclusive_to_exclusive() {
    let pending =
        |t: &Timer| -> Vec<i64> { t.state.pending.iter().map(|p| p.scheduled_ms).collect() };

    // Bounds on instants: `from` is included, `to` is not.
    let mut t = Timer::new(every_10s(), T0);
    assert!(t.control(
        ControlRecord::Backfill {
            from_ms: T0 - 5 * STEP,
            to_ms: T0 - STEP,
        },
        T0
    ));
    assert_eq!(
        pending(&t),
        vec![T0 - 5 * STEP, T0 - 4 * STEP, T0 - 3 * STEP, T0 - 2 * STEP]
    );
    assert!(t
        .state
        .pending
        .iter()
        .all(|p| p.attempt == 1 && p.not_before_ms == T0 && p.reason == FireReason::Backfill));

    // Bounds one past an instant.
    let mut t = Timer::new(every_10s(), T0);
    assert!(t.control(
        ControlRecord::Backfill {
            from_ms: T0 - 5 * STEP + 1,
            to_ms: T0 - STEP + 1,
        },
        T0
    ));
    assert_eq!(
        pending(&t),
        vec![T0 - 4 * STEP, T0 - 3 * STEP, T0 - 2 * STEP, T0 - STEP]
    );

    // No instant in the range: nothing changes.
    let mut t = Timer::new(every_10s(), T0);
    for (from_ms, to_ms) in [
        (T0 - 5 * STEP + 1, T0 - 4 * STEP),
        (T0 - STEP, T0 - STEP),
        (T0, T0 - 5 * STEP),
    ] {
        assert!(!t.control(ControlRecord::Backfill { from_ms, to_ms }, T0));
    }
    assert_eq!(t.state.pending, vec![]);

    // They fire at once, beside the schedule, and do not count as fires.
    let mut t = Timer::new(every_10s(), T0);
    t.control(
        ControlRecord::Backfill {
            from_ms: T0 - 2 * STEP,
            to_ms: T0,
        },
        T0,
    );
    let f = t.fire(T0);
    assert_eq!(
        f.runs,
        vec![
            run_at(T0 - 2 * STEP, FireReason::Backfill, T0),
            run_at(T0 - STEP, FireReason::Backfill, T0),
            run(T0, FireReason::Schedule),
        ]
    );
    assert_eq!(t.state.fires, 1);
}

#[test]
fn backfill_is_capped_by_max_backfill() {
    let mut t = Timer::new(every_10s(), T0);
    let record = ControlRecord::Backfill {
        from_ms: T0 - 100 * STEP,
        to_ms: T0,
    };
    assert!(apply_control(&mut t.state, record, &t.schedule, T0, 3));
    let got: Vec<i64> = t.state.pending.iter().map(|p| p.scheduled_ms).collect();
    assert_eq!(got, vec![T0 - 100 * STEP, T0 - 99 * STEP, T0 - 98 * STEP]);
}

#[test]
fn backfill_keeps_to_the_schedules_bounds() {
    let mut t = Timer::new(
        JobDefinition {
            start_ms: Some(T0 - 3 * STEP),
            end_ms: Some(T0 - STEP),
            ..every_10s()
        },
        T0,
    );
    t.control(
        ControlRecord::Backfill {
            from_ms: T0 - 10 * STEP,
            to_ms: T0,
        },
        T0,
    );
    let got: Vec<i64> = t.state.pending.iter().map(|p| p.scheduled_ms).collect();
    assert_eq!(got, vec![T0 - 3 * STEP, T0 - 2 * STEP]);
}

#[test]
fn a_redelivered_retry_adds_one_pending_fire() {
    let retry = |scheduled_ms: i64, attempt: u32| ControlRecord::Retry {
        run_id: run_id(ID, scheduled_ms),
        scheduled_ms,
        attempt,
        not_before_ms: T0 + 5_000,
        error: "boom".into(),
    };
    let mut t = Timer::new(every_10s(), T0 + 1);
    assert!(t.control(retry(T0, 2), T0 + 1));
    assert!(!t.control(retry(T0, 2), T0 + 2), "the same retry again");
    assert!(!t.control(retry(T0, 1), T0 + 3), "an older attempt");
    assert_eq!(
        t.state.pending,
        vec![PendingFire {
            scheduled_ms: T0,
            attempt: 2,
            not_before_ms: T0 + 5_000,
            reason: FireReason::Retry,
        }]
    );
    assert_eq!(
        t.wake(),
        Some(T0 + 5_000),
        "the backoff, before the next instant"
    );
    assert_eq!(t.fire(T0 + 4_999), Fired::default());
    assert_eq!(
        t.fire(T0 + 5_000).runs,
        vec![Due {
            scheduled_ms: T0,
            attempt: 2,
            reason: FireReason::Retry,
            not_before_ms: T0 + 5_000,
        }]
    );
    assert_eq!(t.state.fires, 0, "a retry is not a fire");

    // A later attempt, or another instant's retry, is a new request.
    let mut t = Timer::new(every_10s(), T0 + 1);
    assert!(t.control(retry(T0, 2), T0 + 1));
    assert!(t.control(retry(T0, 3), T0 + 2));
    assert!(t.control(retry(T0 - STEP, 2), T0 + 3));
    assert_eq!(t.state.pending.len(), 3);
}

// ---------------------------------------------------------------------------------------------
// Pause and resume

fn paused(def: JobDefinition, paused: bool) -> JobDefinition {
    JobDefinition { paused, ..def }
}

#[test]
fn pausing_keeps_the_next_instant_and_sleeps() {
    let mut t = Timer::new(every_10s(), T0);
    t.fire(T0);
    t.update(paused(every_10s(), true), T0 + 1);
    assert_eq!(t.state.next_fire_ms, Some(T0 + STEP));
    assert_eq!(t.wake(), None);
    // Nothing fires while paused: not the schedule, not a trigger.
    t.control(
        ControlRecord::Trigger {
            requested_ms: T0 + 2,
        },
        T0 + 2,
    );
    assert_eq!(t.wake(), None);
    assert_eq!(t.fire(T0 + 5 * STEP), Fired::default());
    assert_eq!(t.state.next_fire_ms, Some(T0 + STEP));
    assert_eq!(t.state.pending.len(), 1);
}

/// A job every 10 s with `misfire`, fired at T0, paused just after and resumed at `T0 + 55.5 s`
/// (five instants missed, the latest only 500 ms ago).
fn resumed(misfire: MisfirePolicy, catch_up_window_ms: u64) -> (Timer, i64) {
    let def = JobDefinition {
        misfire,
        catch_up_window_ms,
        ..every_10s()
    };
    let mut t = Timer::new(def.clone(), T0);
    assert_eq!(t.fire(T0).runs.len(), 1);
    t.update(paused(def.clone(), true), T0 + 1);
    let now = T0 + 5 * STEP + 500;
    t.update(def, now);
    (t, now)
}

#[test]
fn resuming_under_fire_once_runs_the_latest_missed_instant() {
    let (mut t, now) = resumed(MisfirePolicy::FireOnce, 3_600_000);
    // Whatever the age: even the instant 500 ms late goes by the policy.
    assert_eq!(
        t.state.pending,
        vec![PendingFire {
            scheduled_ms: T0 + 5 * STEP,
            attempt: 1,
            not_before_ms: now,
            reason: FireReason::CatchUp,
        }]
    );
    assert_eq!(t.state.next_fire_ms, Some(T0 + 6 * STEP));
    assert_eq!(t.wake(), Some(now));
    assert_eq!(
        t.fire(now).runs,
        vec![run_at(T0 + 5 * STEP, FireReason::CatchUp, now)]
    );
    assert_eq!(
        t.fire(T0 + 6 * STEP).runs,
        vec![run(T0 + 6 * STEP, FireReason::Schedule)]
    );
}

#[test]
fn resuming_under_fire_all_runs_the_missed_instants_in_the_window() {
    let (mut t, now) = resumed(MisfirePolicy::FireAll, 30_000);
    // The window reaches back to T0 + 25.5 s.
    let f = t.fire(now);
    assert_eq!(
        f.runs,
        vec![
            run_at(T0 + 3 * STEP, FireReason::CatchUp, now),
            run_at(T0 + 4 * STEP, FireReason::CatchUp, now),
            run_at(T0 + 5 * STEP, FireReason::CatchUp, now),
        ]
    );
    assert_eq!(t.state.next_fire_ms, Some(T0 + 6 * STEP));
}

#[test]
fn resuming_under_skip_drops_every_missed_instant() {
    let (mut t, now) = resumed(MisfirePolicy::Skip, 3_600_000);
    assert_eq!(t.state.pending, vec![]);
    assert_eq!(t.state.next_fire_ms, Some(T0 + 6 * STEP));
    assert_eq!(t.fire(now), Fired::default());
    assert_eq!(
        t.fire(T0 + 6 * STEP).runs,
        vec![run(T0 + 6 * STEP, FireReason::Schedule)]
    );
}

#[test]
fn resuming_before_the_next_instant_changes_nothing() {
    let def = every_10s();
    let mut t = Timer::new(def.clone(), T0);
    t.fire(T0);
    t.update(paused(def.clone(), true), T0 + 1);
    t.update(def, T0 + 2);
    assert_eq!(t.state.pending, vec![]);
    assert_eq!(t.state.next_fire_ms, Some(T0 + STEP));
    assert_eq!(t.wake(), Some(T0 + STEP));
}

#[test]
fn resuming_respects_max_fires() {
    for misfire in [MisfirePolicy::FireOnce, MisfirePolicy::FireAll] {
        let def = JobDefinition {
            max_fires: Some(2),
            misfire,
            ..every_10s()
        };
        let mut t = Timer::new(def.clone(), T0);
        let mut runs = t.fire(T0).runs;
        t.update(paused(def.clone(), true), T0 + 1);
        t.update(def, T0 + 5 * STEP + 500);
        for k in 5..10 {
            runs.extend(t.fire(T0 + k * STEP + 500).runs);
        }
        // Today fire_once gives 3 (T0, the catch-up of T0+50s, T0+60s), fire_all 7.
        assert_eq!(counted(&runs), 2, "{misfire:?}: {runs:?}");
    }
}

#[test]
fn resuming_respects_overlap_skip() {
    let def = JobDefinition {
        overlap: OverlapPolicy::Skip,
        ..every_10s()
    };
    let mut t = Timer::new(def.clone(), T0);
    t.fire(T0);
    assert!(t.state.in_flight.is_some());
    t.update(paused(def.clone(), true), T0 + 1);
    let now = T0 + 5 * STEP + 500;
    t.update(def, now);
    // The run of T0 is still in flight: the catch-up must not run beside it.
    let f = t.fire(now);
    assert_eq!(f.runs, vec![], "{f:?}");
}

// ---------------------------------------------------------------------------------------------
// Misfires, limits, one-shots, jitter

#[test]
fn an_instant_late_by_up_to_the_threshold_fires_as_scheduled() {
    let limits = FireLimits {
        misfire_threshold_ms: 25_000,
        ..LIMITS
    };
    for misfire in [
        MisfirePolicy::FireOnce,
        MisfirePolicy::FireAll,
        MisfirePolicy::Skip,
    ] {
        let mut t = Timer::new(
            JobDefinition {
                misfire,
                ..every_10s()
            },
            T0,
        );
        let f = t.fire_with(T0 + 25_000, limits);
        assert_eq!(
            f.runs,
            vec![
                run(T0, FireReason::Schedule),
                run(T0 + STEP, FireReason::Schedule),
                run(T0 + 2 * STEP, FireReason::Schedule),
            ],
            "{misfire:?}"
        );
        assert_eq!(f.missed, 0);
        assert_eq!(t.state.next_fire_ms, Some(T0 + 3 * STEP));
    }
}

#[test]
fn an_instant_later_than_the_threshold_follows_the_misfire_policy() {
    let limits = FireLimits {
        misfire_threshold_ms: 25_000,
        ..LIMITS
    };
    let now = T0 + 25_001;
    let cases = [
        (MisfirePolicy::FireOnce, vec![T0 + 2 * STEP], 2),
        (
            MisfirePolicy::FireAll,
            vec![T0, T0 + STEP, T0 + 2 * STEP],
            0,
        ),
        (MisfirePolicy::Skip, vec![], 3),
    ];
    for (misfire, fired, missed) in cases {
        let mut t = Timer::new(
            JobDefinition {
                misfire,
                ..every_10s()
            },
            T0,
        );
        let f = t.fire_with(now, limits);
        assert_eq!(instants(&f.runs), fired, "{misfire:?}");
        assert!(f.runs.iter().all(|d| d.reason == FireReason::CatchUp));
        assert_eq!(f.missed, missed, "{misfire:?}");
        assert_eq!(t.state.next_fire_ms, Some(T0 + 3 * STEP), "{misfire:?}");
        assert_eq!(t.state.fires, fired.len() as u64, "{misfire:?}");
    }
}

#[test]
fn fire_all_keeps_to_the_catch_up_window() {
    let mut t = Timer::new(
        JobDefinition {
            misfire: MisfirePolicy::FireAll,
            catch_up_window_ms: 35_000,
            ..every_10s()
        },
        T0,
    );
    let now = T0 + 10 * STEP;
    let f = t.fire(now);
    assert_eq!(
        instants(&f.runs),
        vec![T0 + 7 * STEP, T0 + 8 * STEP, T0 + 9 * STEP, T0 + 10 * STEP]
    );
    assert_eq!(f.missed, 7);
}

#[test]
fn max_runs_bounds_the_runs_of_one_pass() {
    let limits = FireLimits {
        max_runs: 4,
        ..LIMITS
    };
    // Six instants due, each less late than the threshold: four now, two next pass.
    let mut t = Timer::new(every_10s(), T0);
    let now = T0 + 5 * STEP;
    let f = t.fire_with(now, limits);
    assert_eq!(
        instants(&f.runs),
        vec![T0, T0 + STEP, T0 + 2 * STEP, T0 + 3 * STEP]
    );
    assert_eq!(t.wake(), Some(T0 + 4 * STEP), "still due");
    let f = t.fire_with(now, limits);
    assert_eq!(instants(&f.runs), vec![T0 + 4 * STEP, T0 + 5 * STEP]);

    // A fire_all catch-up: the latest four.
    let mut t = Timer::new(
        JobDefinition {
            misfire: MisfirePolicy::FireAll,
            ..every_10s()
        },
        T0,
    );
    let f = t.fire_with(T0 + 60 * STEP, limits);
    assert_eq!(
        instants(&f.runs),
        vec![
            T0 + 57 * STEP,
            T0 + 58 * STEP,
            T0 + 59 * STEP,
            T0 + 60 * STEP
        ]
    );
    assert_eq!(f.missed, 57);
    assert_eq!(t.state.next_fire_ms, Some(T0 + 61 * STEP));

    // Pending requests count too, and go first.
    let mut t = Timer::new(every_10s(), T0);
    for k in 1..=5 {
        t.control(
            ControlRecord::Trigger {
                requested_ms: T0 - k,
            },
            T0,
        );
    }
    let f = t.fire_with(T0, limits);
    assert_eq!(instants(&f.runs), vec![T0 - 1, T0 - 2, T0 - 3, T0 - 4]);
    assert_eq!(t.state.pending.len(), 1);
    assert_eq!(t.state.next_fire_ms, Some(T0));
    let f = t.fire_with(T0, limits);
    assert_eq!(
        f.runs,
        vec![
            run_at(T0 - 5, FireReason::Manual, T0),
            run(T0, FireReason::Schedule)
        ]
    );
}

#[test]
fn a_one_shot_fires_once_then_is_done() {
    let at = T0 + 5_000;
    let mut t = Timer::new(job(ScheduleSpec::Once { at_ms: at }), T0);
    assert_eq!(t.state.next_fire_ms, Some(at));
    assert_eq!(t.wake(), Some(at));
    assert_eq!(t.fire(at - 1), Fired::default());
    assert_eq!(t.fire(at).runs, vec![run(at, FireReason::Schedule)]);
    assert_eq!(t.state.next_fire_ms, None);
    assert_eq!(t.wake(), None);
    assert_eq!(t.fire(at + 100 * STEP), Fired::default());
    // A new revision of the same one-shot does not fire it again.
    t.update(
        JobDefinition {
            revision: 1,
            ..job(ScheduleSpec::Once { at_ms: at })
        },
        at + 100 * STEP,
    );
    assert_eq!(t.wake(), None);
}

#[test]
fn a_one_shot_put_just_after_its_instant_still_fires() {
    let mut t = Timer::new(job(ScheduleSpec::Once { at_ms: T0 }), T0 + 2_000);
    assert_eq!(t.state.next_fire_ms, Some(T0));
    assert_eq!(t.fire(T0 + 2_000).runs, vec![run(T0, FireReason::Schedule)]);
    assert_eq!(t.wake(), None);
}

#[test]
fn jitter_delays_the_fire_not_the_instant() {
    let def = JobDefinition {
        jitter_ms: 9_000,
        ..every_10s()
    };
    // Find an instant with a jitter of at least 1 ms (almost every one).
    let instant = (0..100)
        .map(|k| T0 + k * STEP)
        .find(|&i| fire_at(&def, i) > i)
        .expect("some instant is jittered");
    let at = fire_at(&def, instant);
    assert!(at < instant + 9_000);
    let mut t = Timer::new(def, instant);
    assert_eq!(t.wake(), Some(at));
    assert_eq!(t.fire(at - 1), Fired::default());
    assert_eq!(
        t.fire(at).runs,
        vec![run_at(instant, FireReason::Schedule, at)],
        "the run may not start before its jittered time"
    );
}

#[test]
#[ignore = "bug: a misfire fires (fire_once, fire_all) or drops (skip) instants whose jittered fire time is still ahead"]
fn a_misfire_leaves_instants_whose_jittered_time_has_not_come() {
    // Every second, jitter up to 30 s: the instants' fire times interleave.
    let def = JobDefinition {
        schedule: every(1_000),
        jitter_ms: 30_000,
        ..every_10s()
    };
    let limits = FireLimits {
        misfire_threshold_ms: 1_000,
        ..LIMITS
    };
    // An instant due well past the threshold while the instant right after it is jittered
    // beyond now.
    let (due, now) = (0..10_000)
        .map(|k| T0 + k * 1_000)
        .find_map(|i| {
            let now = fire_at(&def, i) + 5_000;
            (fire_at(&def, i + 1_000) > now && i + 1_000 < now).then_some((i, now))
        })
        .expect("such an instant");
    let mut wrong = Vec::new();
    for misfire in [MisfirePolicy::FireOnce, MisfirePolicy::Skip] {
        let mut t = Timer::new(
            JobDefinition {
                misfire,
                ..def.clone()
            },
            due,
        );
        let f = t.fire_with(now, limits);
        for d in &f.runs {
            if fire_at(&def, d.scheduled_ms) > now {
                wrong.push(format!("{misfire:?}: {d:?} fired before its time"));
            }
        }
        // The instant after `due` is not late at all: it must still fire, at its time.
        if t.state.next_fire_ms.is_none_or(|n| n > due + 1_000) {
            wrong.push(format!(
                "{misfire:?}: next {:?}, past {} whose time has not come",
                t.state.next_fire_ms,
                due + 1_000
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

// ---------------------------------------------------------------------------------------------
// Properties

const CRONS: [&str; 5] = [
    "*/7 * * * * *",
    "0 */5 * * * *",
    "0 0 * * * *",
    "0 30 1,2 * * *",
    "0 15 0-3 ? * MON-FRI",
];
const ZONES: [&str; 3] = ["UTC", "Europe/Berlin", "America/New_York"];

fn any_spec() -> impl Strategy<Value = ScheduleSpec> {
    prop_oneof![
        3 => (1_000u64..=3_600_000, -10_000_000i64..=10_000_000)
            .prop_map(|(every_ms, anchor_ms)| ScheduleSpec::Interval { every_ms, anchor_ms }),
        1 => (0..CRONS.len(), 0..ZONES.len()).prop_map(|(e, z)| ScheduleSpec::Cron {
            expr: CRONS[e].into(),
            zone: ZONES[z].into(),
        }),
    ]
}

fn any_def() -> impl Strategy<Value = JobDefinition> {
    let jitter = prop_oneof![Just(0u64), 1u64..=10_000, 1u64..=7_200_000];
    let misfire = prop_oneof![
        Just(MisfirePolicy::FireOnce),
        Just(MisfirePolicy::FireAll),
        Just(MisfirePolicy::Skip),
    ];
    let overlap = prop_oneof![
        Just(OverlapPolicy::Allow),
        Just(OverlapPolicy::Skip),
        Just(OverlapPolicy::BufferOne),
    ];
    (
        any_spec(),
        jitter,
        misfire,
        overlap,
        prop::option::of(1u64..=30),
        0u64..=7_200_000,
    )
        .prop_map(
            |(schedule, jitter_ms, misfire, overlap, max_fires, catch_up_window_ms)| {
                JobDefinition {
                    jitter_ms,
                    misfire,
                    overlap,
                    max_fires,
                    catch_up_window_ms,
                    ..job(schedule)
                }
            },
        )
}

fn any_limits() -> impl Strategy<Value = FireLimits> {
    (0i64..=300_000, 1usize..=64, any::<bool>()).prop_map(
        |(misfire_threshold_ms, max_runs, completes_at_fire)| FireLimits {
            misfire_threshold_ms,
            max_runs,
            completes_at_fire,
        },
    )
}

/// The time between two passes: mostly a tick or a few, sometimes an outage.
fn any_delta() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => 1i64..=5_000,
        3 => 1i64..=120_000,
        1 => 1i64..=6 * 3_600_000,
    ]
}

/// What happens just before a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Nothing,
    /// The run in flight, if any, completes.
    Complete,
}

fn any_event() -> impl Strategy<Value = Event> {
    prop_oneof![2 => Just(Event::Nothing), 1 => Just(Event::Complete)]
}

#[derive(Debug, Clone)]
struct Case {
    def: JobDefinition,
    limits: FireLimits,
    created_ms: i64,
    passes: Vec<(i64, Event)>,
}

fn any_case() -> impl Strategy<Value = Case> {
    (
        any_def(),
        any_limits(),
        T0..T0 + 7 * 86_400_000,
        prop::collection::vec((any_delta(), any_event()), 1..40),
    )
        .prop_map(|(def, limits, created_ms, passes)| Case {
            def,
            limits,
            created_ms,
            passes,
        })
}

/// One pass of a simulation.
#[derive(Debug)]
struct Pass {
    now: i64,
    /// A control request changed the timer since the previous pass.
    controlled: bool,
    /// The `buffer_one` instant that request released.
    released: Option<i64>,
    wake_before: Option<i64>,
    next_before: Option<i64>,
    fired: Fired,
    wake_after: Option<i64>,
    next_after: Option<i64>,
    in_flight_after: bool,
}

fn simulate(case: &Case) -> Vec<Pass> {
    let mut t = Timer::new(case.def.clone(), case.created_ms);
    let mut now = case.created_ms;
    let mut out = Vec::new();
    for &(delta, event) in &case.passes {
        now += delta;
        let buffered = t.state.buffered_ms;
        let controlled = event == Event::Complete && t.state.in_flight.is_some() && t.complete(now);
        let released = buffered.filter(|_| controlled);
        let (wake_before, next_before) = (t.wake(), t.state.next_fire_ms);
        let fired = t.fire_with(now, case.limits);
        out.push(Pass {
            now,
            controlled,
            released,
            wake_before,
            next_before,
            fired,
            wake_after: t.wake(),
            next_after: t.state.next_fire_ms,
            in_flight_after: t.state.in_flight.is_some(),
        });
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// No schedule instant runs twice, nor is both run and skipped, nor skipped twice.
    #[test]
    fn no_instant_fires_twice(case in any_case()) {
        let mut fired = HashSet::new();
        let mut skipped = HashSet::new();
        for p in simulate(&case) {
            for d in &p.fired.runs {
                if matches!(d.reason, FireReason::Schedule | FireReason::CatchUp) {
                    prop_assert!(fired.insert((d.scheduled_ms, d.attempt)), "{d:?} twice at {}", p.now);
                    prop_assert!(!skipped.contains(&d.scheduled_ms), "{d:?} was skipped before");
                }
            }
            for s in &p.fired.skipped {
                prop_assert!(!fired.contains(&(*s, 1)), "{s} skipped after it ran");
                prop_assert!(skipped.insert(*s), "{s} skipped twice");
            }
        }
    }

    /// A job with max_fires runs at most that many scheduled and catch-up runs.
    ///
    /// Runs released from a `buffer_one` buffer are not counted today (see
    /// `overlap_buffer_one_released_runs_count_toward_max_fires`), so those cases never
    /// complete a run.
    #[test]
    fn fires_never_exceed_max_fires(mut case in any_case(), max in 1u64..=30) {
        case.def.max_fires = Some(max);
        if case.def.overlap == OverlapPolicy::BufferOne {
            for pass in &mut case.passes {
                pass.1 = Event::Nothing;
            }
        }
        let passes = simulate(&case);
        let total: usize = passes.iter().map(|p| counted(&p.fired.runs)).sum();
        prop_assert!(total as u64 <= max, "{total} fires, max_fires {max}");
        if total as u64 == max {
            let last = passes.last().unwrap();
            prop_assert_eq!(last.next_after, None);
        }
    }

    /// A pass that fired something leaves the timer waking strictly later than the instant it
    /// was woken for (and so, with no control request in between, later than after the previous
    /// pass), unless the timer is finished. A pass cut short by max_runs may leave it due at once
    /// (jitter wider than the period may even put that before the previous wake), but never moves
    /// the schedule back.
    #[test]
    fn wake_moves_on_after_a_pass_that_fired(case in any_case()) {
        let mut previous_wake: Option<i64> = wake_at(&Timer::new(case.def.clone(), case.created_ms).state);
        for p in simulate(&case) {
            if !p.fired.runs.is_empty() {
                prop_assert!(p.wake_before.is_some_and(|w| w <= p.now), "fired but not due: {p:?}");
                if let Some(after) = p.wake_after {
                    if p.fired.runs.len() < case.limits.max_runs {
                        prop_assert!(after > p.now, "{p:?}");
                        prop_assert!(after > p.wake_before.unwrap(), "{p:?}");
                        if !p.controlled {
                            prop_assert!(previous_wake.is_none_or(|w| after > w), "{p:?}");
                        }
                    } else if let (Some(a), Some(b)) = (p.next_after, p.next_before) {
                        prop_assert!(a >= b, "{p:?}");
                    }
                }
            }
            if case.limits.completes_at_fire || case.def.overlap == OverlapPolicy::Allow {
                prop_assert!(!p.in_flight_after, "{p:?}");
                prop_assert!(p.fired.skipped.is_empty(), "{p:?}");
            }
            previous_wake = p.wake_after;
        }
    }

    /// No run fires before its time: its scheduled instant, jitter included, is at or before the
    /// now of the pass that fires it.
    ///
    /// Catch-up runs, and a `buffer_one` instant released by a completion (which may be a
    /// buffered catch-up), are held only to their scheduled instant: a misfire resolves every
    /// instant up to now, jittered past now or not (see
    /// `a_misfire_leaves_instants_whose_jittered_time_has_not_come`).
    #[test]
    fn nothing_fires_before_its_time(case in any_case()) {
        let mut released = HashSet::new();
        for p in simulate(&case) {
            released.extend(p.released);
            for d in &p.fired.runs {
                prop_assert!(d.scheduled_ms <= p.now, "{d:?} at {}", p.now);
                if d.reason != FireReason::CatchUp && !released.contains(&d.scheduled_ms) {
                    let at = fire_at(&case.def, d.scheduled_ms);
                    prop_assert!(at <= p.now, "{d:?} at {}: fire_at {at}", p.now);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// advance: what a restore replays of plain fires that were not written to `timers`

#[test]
fn advance_replays_the_instants_up_to_its_mark_and_no_further() {
    let mut t = Timer::new(every_10s(), T0 - 1);
    let state = t.state.clone();
    assert_eq!(advance(&mut t.state, &t.schedule, T0 + 3 * STEP + 1), 4);
    assert_eq!(t.state.next_fire_ms, Some(T0 + 4 * STEP));
    assert_eq!(t.state.last_scheduled_ms, Some(T0 + 3 * STEP));
    assert_eq!(t.state.fires, 4);
    // Idempotent at the same mark, and nothing before the first instant.
    assert_eq!(advance(&mut t.state, &t.schedule, T0 + 3 * STEP + 1), 0);
    let mut early = state.clone();
    assert_eq!(advance(&mut early, &t.schedule, T0 - 1), 0);
    assert_eq!(early, state);
}

#[test]
fn advance_keeps_max_fires_and_leaves_paused_timers_alone() {
    let mut def = every_10s();
    def.max_fires = Some(2);
    let mut t = Timer::new(def, T0 - 1);
    assert_eq!(advance(&mut t.state, &t.schedule, T0 + 10 * STEP), 2);
    assert_eq!((t.state.next_fire_ms, t.state.fires), (None, 2));
    let mut t = Timer::new(paused(every_10s(), true), T0 - 1);
    let before = t.state.clone();
    assert_eq!(advance(&mut t.state, &t.schedule, T0 + 10 * STEP), 0);
    assert_eq!(t.state, before);
}

/// A timer written long ago is brought up to date without a step per instant, to the same next
/// instant as stepping.
#[test]
fn advance_jumps_over_a_long_gap_to_the_same_next_instant() {
    let mut def = job(every(1_000));
    def.jitter_ms = 700;
    let mut t = Timer::new(def, T0 - 1);
    let through = T0 + 30 * 86_400_000 + 123;
    advance(&mut t.state, &t.schedule, through);
    let next = t.state.next_fire_ms.unwrap();
    assert!(fire_at(&t.state.definition, next) > through);
    // Stepping from a state just before the mark gives the same next instant.
    let mut near = Timer::new(t.state.definition.clone(), through - 5_000);
    advance(&mut near.state, &near.schedule, through);
    assert_eq!(near.state.next_fire_ms, Some(next));
}

#[test]
fn only_a_plain_fire_is_plain() {
    let limits = FireLimits {
        completes_at_fire: true,
        ..LIMITS
    };
    // On time, nothing pending: plain.
    let mut t = Timer::new(every_10s(), T0 - 1);
    let before = Plain::of(&t.state);
    let fired = t.fire_with(T0 + 5, limits);
    assert!(fired_plainly(before, &t.state, &fired, T0 + 5));
    // A catch-up after a misfire is not.
    let mut t = Timer::new(every_10s(), T0 - 1);
    let before = Plain::of(&t.state);
    let fired = t.fire_with(T0 + 10 * STEP + 5, limits);
    assert!(!fired_plainly(before, &t.state, &fired, T0 + 10 * STEP + 5));
    // A run left in flight (overlap skip, delivered by a worker) is not.
    let mut def = every_10s();
    def.overlap = OverlapPolicy::Skip;
    let mut t = Timer::new(def, T0 - 1);
    let before = Plain::of(&t.state);
    let fired = t.fire(T0 + 5);
    assert!(!fired_plainly(before, &t.state, &fired, T0 + 5));
    // A fire count to keep is not.
    let mut def = every_10s();
    def.max_fires = Some(5);
    let mut t = Timer::new(def, T0 - 1);
    let before = Plain::of(&t.state);
    let fired = t.fire(T0 + 5);
    assert!(!fired_plainly(before, &t.state, &fired, T0 + 5));
    // A manual trigger is not.
    let mut t = Timer::new(every_10s(), T0 - 1);
    t.control(
        ControlRecord::Trigger {
            requested_ms: T0 + 1,
        },
        T0 + 1,
    );
    let before = Plain::of(&t.state);
    let fired = t.fire(T0 + 5);
    assert!(!fired_plainly(before, &t.state, &fired, T0 + 5));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    /// Whatever sequence of plain fires a timer went through, `advance` from the state before
    /// them, through the last fire's instant (or any later one before its next wake), gives the
    /// state they left.
    #[test]
    fn advance_replays_any_run_of_plain_fires(
        period in 1_000u64..120_000,
        jitter in prop_oneof![Just(0u64), 1u64..5_000],
        gaps in proptest::collection::vec(1i64..200_000, 1..40),
        slack in 0i64..1_000_000,
    ) {
        let mut def = job(every(period));
        def.jitter_ms = jitter;
        let mut t = Timer::new(def, T0 - 1);
        let written = t.state.clone();
        let limits = FireLimits { completes_at_fire: true, misfire_threshold_ms: i64::MAX, ..LIMITS };
        let mut now = T0;
        let mut last: Option<(i64, TimerState)> = None;
        for gap in gaps {
            now += gap;
            let before = Plain::of(&t.state);
            let fired = t.fire_with(now, limits);
            if fired.runs.is_empty() {
                continue;
            }
            if !fired_plainly(before, &t.state, &fired, now) {
                break;
            }
            let mut replayed = written.clone();
            advance(&mut replayed, &t.schedule, now);
            prop_assert_eq!(&replayed, &t.state);
            last = Some((now, t.state.clone()));
        }
        if let Some((at, state)) = last {
            if let Some(wake) = wake_at(&state) {
                // Any mark from the last plain fire to just before the next wake replays the
                // same.
                let mark = (at + slack).min(wake - 1);
                let mut replayed = written.clone();
                advance(&mut replayed, &t.schedule, mark);
                prop_assert_eq!(replayed.next_fire_ms, state.next_fire_ms);
            }
        }
    }
}

// Lookahead

#[test]
fn a_job_run_by_workers_fires_ahead_and_a_kafka_job_at_its_time() {
    let ahead = Lookahead::new(1_000);
    let mut t = Timer::new(every_10s(), T0 - 5_000);
    assert_eq!(t.wake(), Some(T0));
    assert_eq!(
        ahead.wake(&t.state),
        Some(T0 - 1_000),
        "indexed a lead early"
    );
    let horizon = ahead.horizon(&t.state.definition, T0 - 1_000);
    assert_eq!(horizon, T0);
    let before = Plain::of(&t.state);
    let mut replayed = t.state.clone();
    let f = t.fire(horizon);
    // Fired a second before its instant, not to start before it.
    assert_eq!(f.runs, vec![run_at(T0, FireReason::Schedule, T0)]);
    assert!(fired_plainly(before, &t.state, &f, horizon));
    advance(&mut replayed, &t.schedule, horizon);
    assert_eq!(
        replayed, t.state,
        "a restore replays a fire ahead through the horizon"
    );
    assert_eq!(ahead.wake(&t.state), Some(T0 + STEP - 1_000));

    let mut def = every_10s();
    def.handler.kind = HandlerKind::Kafka;
    let k = Timer::new(def, T0 - 5_000);
    assert_eq!(ahead.wake(&k.state), Some(T0), "a kafka job is never led");
    assert_eq!(ahead.horizon(&k.state.definition, T0 - 1_000), T0 - 1_000);
    assert_eq!(Lookahead::default().wake(&t.state), t.wake());
    // Nor is a job whose overlap policy looks at the runs in flight.
    for overlap in [OverlapPolicy::Skip, OverlapPolicy::BufferOne] {
        assert_eq!(ahead.of(&overlapping(overlap)), 0, "{overlap:?}");
    }
}

#[test]
fn a_retry_fired_ahead_keeps_its_backoff_as_not_before() {
    let ahead = Lookahead::new(1_000);
    let mut t = Timer::new(every_10s(), T0);
    t.fire(T0);
    assert!(t.control(
        ControlRecord::Retry {
            run_id: run_id(ID, T0),
            scheduled_ms: T0,
            attempt: 2,
            not_before_ms: T0 + 5_000,
            error: "boom".into(),
        },
        T0 + 100,
    ));
    assert_eq!(ahead.wake(&t.state), Some(T0 + 4_000));
    let f = t.fire(ahead.horizon(&t.state.definition, T0 + 4_000));
    assert_eq!(
        f.runs,
        vec![Due {
            scheduled_ms: T0,
            attempt: 2,
            reason: FireReason::Retry,
            not_before_ms: T0 + 5_000,
        }]
    );
}
