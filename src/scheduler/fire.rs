//! What a timer does when it falls due, and how definitions and control requests change it.
//! Pure: the clock is an argument, the caller persists the result.

use crate::model::job::{HandlerKind, JobDefinition, OverlapPolicy, ScheduleSpec};
use crate::model::records::{run_id, ControlRecord, FireReason, InFlight, PendingFire, TimerState};
use crate::model::schedule::{jitter_ms, resolve_misfire, Schedule};

/// Limits of one firing pass over one timer.
#[derive(Debug, Clone, Copy)]
pub struct FireLimits {
    /// An instant later than this past its time is a misfire, handled by the job's policy;
    /// anything less late is simply fired late.
    pub misfire_threshold_ms: i64,
    /// Runs one timer may emit in one pass (a bound on catch-up work per tick).
    pub max_runs: usize,
    /// The runs complete in the transaction that fires them (a `kafka` job delivered by the
    /// scheduler), so none is ever in flight for the overlap policy.
    pub completes_at_fire: bool,
}

/// A run to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    pub scheduled_ms: i64,
    pub attempt: u32,
    pub reason: FireReason,
    /// The instant before which the run must not start: its fire time (the instant plus
    /// jitter), or a retry's backoff. Later than the fire's `now` when it was fired ahead
    /// (`Lookahead`); a worker holds it until then.
    pub not_before_ms: i64,
}

/// What one pass produced besides the new state.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fired {
    pub runs: Vec<Due>,
    /// Instants not run because the previous run was still in flight (overlap `skip`).
    pub skipped: Vec<i64>,
    /// Instants dropped by the misfire policy.
    pub missed: u64,
}

/// The instant a timer's scheduled fire happens: its scheduled instant plus its jitter.
pub fn fire_at(def: &JobDefinition, scheduled_ms: i64) -> i64 {
    scheduled_ms.saturating_add(jitter_ms(&def.id, scheduled_ms, def.jitter_ms) as i64)
}

/// How far ahead of their time a node fires runs (`scheduler.lookahead_ms`). A run that a
/// worker executes is fired up to this much early, into its lane, with its not-before
/// instant; the worker holds it until then, so a slow commit costs no lateness. A `kafka` job's
/// run is never fired ahead: delivered by the node, it is in its target as soon as it commits,
/// and even delivered by a worker a `kafka` job keeps no lead, so that which runs lead depends
/// on the definition alone, never on `scheduler.kafka_delivery`.
///
/// The bucket index keys a timer at its wake instant less its lead, so a tick scans what it
/// may fire and nothing else; a partition's progress records the lookahead it was fired with
/// (`progress`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lookahead {
    pub ms: i64,
}

impl Lookahead {
    pub const fn new(ms: i64) -> Lookahead {
        Lookahead { ms }
    }

    /// The lead of a job's runs: none for a `kafka` job, nor for one whose overlap policy
    /// decides by the runs in flight (fired ahead, an instant would be judged by what runs a
    /// lead before it, and a job every second would skip every other instant).
    pub fn of(&self, def: &JobDefinition) -> i64 {
        match (def.handler.kind, def.overlap) {
            (HandlerKind::Kafka, _) => 0,
            (_, OverlapPolicy::Allow) => self.ms,
            _ => 0,
        }
    }

    /// The instant a timer is indexed at: its wake instant less its lead.
    pub fn wake(&self, state: &TimerState) -> Option<i64> {
        wake_at(state).map(|w| w.saturating_sub(self.of(&state.definition)))
    }

    /// The latest instant a pass at `now_ms` fires of a job.
    pub fn horizon(&self, def: &JobDefinition, now_ms: i64) -> i64 {
        now_ms.saturating_add(self.of(def))
    }
}

/// When the timer has something to do next (its next fire time, or a pending run's
/// not-before instant); `None` when it has nothing left to do. The bucket index keys it at
/// that less its lead (`Lookahead::wake`).
pub fn wake_at(state: &TimerState) -> Option<i64> {
    if state.definition.paused {
        return None;
    }
    let scheduled = state.next_fire_ms.map(|t| fire_at(&state.definition, t));
    let pending = state.pending.iter().map(|p| p.not_before_ms).min();
    match (scheduled, pending) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The state of a job seen for the first time at `now_ms`.
pub fn new_timer(def: JobDefinition, schedule: &Schedule, now_ms: i64) -> TimerState {
    let next_fire_ms = first_fire(&def, schedule, now_ms);
    TimerState {
        definition: def,
        next_fire_ms,
        fires: 0,
        last_scheduled_ms: None,
        in_flight: None,
        buffered_ms: None,
        pending: Vec::new(),
    }
}

fn first_fire(def: &JobDefinition, schedule: &Schedule, now_ms: i64) -> Option<i64> {
    match def.schedule {
        // A one-shot put shortly after its instant still fires (validation rejected those
        // older than the catch-up window).
        ScheduleSpec::Once { at_ms } if at_ms <= now_ms => Some(at_ms),
        _ => schedule.next_after(now_ms - 1),
    }
}

/// Applies a new definition of an existing job. A changed schedule takes effect from its next
/// instant after both now and the last fire; pausing keeps the next instant, so resuming
/// applies the misfire policy to what was missed.
pub fn update_timer(state: &mut TimerState, def: JobDefinition, schedule: &Schedule, now_ms: i64) {
    let old = &state.definition;
    let timing_changed = old.schedule != def.schedule
        || old.start_ms != def.start_ms
        || old.end_ms != def.end_ms
        || old.max_fires != def.max_fires;
    if timing_changed {
        let after = state
            .last_scheduled_ms
            .map_or(now_ms - 1, |l| l.max(now_ms - 1));
        state.next_fire_ms = match def.schedule {
            ScheduleSpec::Once { at_ms } if state.fires == 0 && at_ms <= now_ms => Some(at_ms),
            _ => schedule.next_after(after),
        };
    }
    let resumed = old.paused && !def.paused;
    state.definition = def;
    if resumed && !timing_changed {
        // Instants missed while paused follow the misfire policy, whatever their age.
        if let Some(next) = state.next_fire_ms.filter(|n| *n <= now_ms) {
            let m = resolve_misfire(
                schedule,
                state.definition.misfire,
                state.definition.catch_up_window_ms,
                next,
                now_ms,
                1_000,
            );
            state
                .pending
                .extend(m.fire.into_iter().map(|scheduled_ms| PendingFire {
                    scheduled_ms,
                    attempt: 1,
                    not_before_ms: now_ms,
                    reason: FireReason::CatchUp,
                }));
            state.next_fire_ms = m.next_ms;
        }
    }
    if let Some(max) = state.definition.max_fires {
        if state.fires >= max {
            state.next_fire_ms = None;
        }
    }
}

/// Applies a control request. Returns false when it changed nothing.
pub fn apply_control(
    state: &mut TimerState,
    record: ControlRecord,
    schedule: &Schedule,
    now_ms: i64,
    max_backfill: usize,
) -> bool {
    match record {
        ControlRecord::Retry {
            scheduled_ms,
            attempt,
            not_before_ms,
            ..
        } => {
            if state
                .pending
                .iter()
                .any(|p| p.scheduled_ms == scheduled_ms && p.attempt >= attempt)
            {
                return false; // a redelivered request
            }
            state.pending.push(PendingFire {
                scheduled_ms,
                attempt,
                not_before_ms,
                reason: FireReason::Retry,
            });
            true
        }
        ControlRecord::Completion { run_id: id, .. } => {
            if state.in_flight.as_ref().map(|f| &f.run_id) != Some(&id) {
                return false;
            }
            state.in_flight = None;
            if let Some(buffered) = state.buffered_ms.take() {
                state.pending.push(PendingFire {
                    scheduled_ms: buffered,
                    attempt: 1,
                    not_before_ms: now_ms,
                    reason: FireReason::Schedule,
                });
            }
            true
        }
        ControlRecord::Trigger { requested_ms } => {
            state.pending.push(PendingFire {
                scheduled_ms: requested_ms,
                attempt: 1,
                not_before_ms: now_ms,
                reason: FireReason::Manual,
            });
            true
        }
        ControlRecord::Backfill { from_ms, to_ms } => {
            let instants = schedule.fires_in(from_ms - 1, to_ms - 1, max_backfill);
            let added = !instants.is_empty();
            state
                .pending
                .extend(instants.into_iter().map(|scheduled_ms| PendingFire {
                    scheduled_ms,
                    attempt: 1,
                    not_before_ms: now_ms,
                    reason: FireReason::Backfill,
                }));
            added
        }
    }
}

/// Steps `advance` takes one by one before it jumps (see there).
const ADVANCE_STEPS: u64 = 10_000;

/// Replays the plain schedule fires of `state` through `through_ms`: every instant whose fire
/// time is at or before it is taken as fired, as `fire_due` fires an instant that is on time
/// when no retry, trigger, overlap or catch-up is involved. Restore uses it to bring a timer
/// recorded on `timers` before such fires (which are not written there, see `progress`) up to
/// its partition's progress. Returns the instants taken.
///
/// After `ADVANCE_STEPS` instants it jumps to the first instant whose fire time can be later
/// than `through_ms` (a fire time is at most the jitter window past its instant), so a timer
/// recorded long ago costs a few schedule computations, not one per instant; `fires` and
/// `last_scheduled_ms` are then not exact, which matters to nothing: a job with `max_fires`
/// never jumps, and `last_scheduled_ms` is only compared with instants later than it.
pub fn advance(state: &mut TimerState, schedule: &Schedule, through_ms: i64) -> u64 {
    if state.definition.paused {
        return 0;
    }
    let mut taken = 0;
    while let Some(next) = state.next_fire_ms {
        if fire_at(&state.definition, next) > through_ms {
            break;
        }
        if let Some(max) = state.definition.max_fires {
            if state.fires >= max {
                state.next_fire_ms = None;
                break;
            }
        }
        state.fires += 1;
        state.last_scheduled_ms = Some(next);
        state.next_fire_ms = schedule.next_after(next);
        taken += 1;
        if let Some(max) = state.definition.max_fires {
            if state.fires >= max {
                state.next_fire_ms = None;
            }
        } else if taken >= ADVANCE_STEPS {
            let window = state.definition.jitter_ms.min(i64::MAX as u64) as i64;
            let surely_fired = through_ms.saturating_sub(window);
            if state.next_fire_ms.is_some_and(|n| n <= surely_fired) {
                state.next_fire_ms = schedule.next_after(surely_fired);
            }
        }
    }
    taken
}

/// Whether a pass of `fire_due` that turned `before` (the state's shape before it, see
/// `Plain`) into `after` with `fired` was a plain fire: one instant on time, nothing pending,
/// nothing in flight, no fire count to keep. `advance(before, now)` gives back exactly
/// `after` then, so the new state need not be written to `timers` when the partition's
/// progress records `now`.
pub fn fired_plainly(before: Plain, after: &TimerState, fired: &Fired, now_ms: i64) -> bool {
    before.0
        && fired.skipped.is_empty()
        && fired.missed == 0
        && matches!(fired.runs.as_slice(), [d] if d.reason == FireReason::Schedule && d.attempt == 1)
        && after.pending.is_empty()
        && after.in_flight.is_none()
        && after.buffered_ms.is_none()
        && after.definition.max_fires.is_none()
        && wake_at(after).is_none_or(|w| w > now_ms)
}

/// What `fired_plainly` needs of a state before its pass: that it had nothing pending, in
/// flight or buffered.
#[derive(Debug, Clone, Copy)]
pub struct Plain(bool);

impl Plain {
    pub fn of(state: &TimerState) -> Plain {
        Plain(
            state.pending.is_empty()
                && state.in_flight.is_none()
                && state.buffered_ms.is_none()
                && !state.definition.paused,
        )
    }
}

/// Fires whatever of `state` is due at `now_ms`: the pass's horizon, which for a job fired
/// ahead is the clock plus its lead (`Lookahead::horizon`; the caller then adds the lead to the
/// misfire threshold too, so that lateness is measured from the clock).
pub fn fire_due(
    state: &mut TimerState,
    schedule: &Schedule,
    now_ms: i64,
    limits: FireLimits,
) -> Fired {
    let mut out = Fired::default();
    if state.definition.paused {
        return out;
    }

    // Retries, manual triggers and backfill instants are requests, not schedule instants, so
    // neither the overlap policy nor max_fires applies to them.
    let mut waiting = Vec::new();
    for p in std::mem::take(&mut state.pending) {
        if p.not_before_ms <= now_ms && out.runs.len() < limits.max_runs {
            match p.reason {
                // Schedule instants waiting here (a `buffer_one` instant released by its
                // predecessor's completion, catch-up instants queued by a resume) are fired as
                // schedule instants: counted against max_fires, held by the overlap policy.
                FireReason::Schedule | FireReason::CatchUp if p.attempt == 1 => {
                    let not_before = p
                        .not_before_ms
                        .max(fire_at(&state.definition, p.scheduled_ms));
                    schedule_fire(
                        state,
                        (p.scheduled_ms, not_before),
                        p.reason,
                        limits.completes_at_fire,
                        &mut out,
                    )
                }
                _ => out.runs.push(Due {
                    scheduled_ms: p.scheduled_ms,
                    attempt: p.attempt,
                    reason: p.reason,
                    not_before_ms: p.not_before_ms,
                }),
            }
        } else {
            waiting.push(p);
        }
    }
    state.pending = waiting;

    while out.runs.len() < limits.max_runs {
        let Some(next) = state.next_fire_ms else {
            break;
        };
        let at = fire_at(&state.definition, next);
        if at > now_ms {
            break;
        }
        if now_ms - at > limits.misfire_threshold_ms {
            let m = resolve_misfire(
                schedule,
                state.definition.misfire,
                state.definition.catch_up_window_ms,
                next,
                now_ms,
                limits.max_runs - out.runs.len(),
            );
            out.missed += m.missed;
            for instant in m.fire {
                let at = fire_at(&state.definition, instant);
                schedule_fire(
                    state,
                    (instant, at),
                    FireReason::CatchUp,
                    limits.completes_at_fire,
                    &mut out,
                );
            }
            state.next_fire_ms = m.next_ms;
        } else {
            schedule_fire(
                state,
                (next, at),
                FireReason::Schedule,
                limits.completes_at_fire,
                &mut out,
            );
            state.next_fire_ms = schedule.next_after(next);
        }
        if let Some(max) = state.definition.max_fires {
            if state.fires >= max {
                state.next_fire_ms = None;
            }
        }
    }
    out
}

/// Fires (or skips, or buffers) the schedule instant `scheduled_ms`, not to start before
/// `not_before_ms`.
fn schedule_fire(
    state: &mut TimerState,
    (scheduled_ms, not_before_ms): (i64, i64),
    reason: FireReason,
    completes_at_fire: bool,
    out: &mut Fired,
) {
    if let Some(max) = state.definition.max_fires {
        if state.fires >= max {
            return;
        }
    }
    let policy = state.definition.overlap;
    if policy.holds_in_flight() && state.in_flight.is_some() {
        match policy {
            OverlapPolicy::BufferOne if state.buffered_ms.is_none() => {
                state.buffered_ms = Some(scheduled_ms)
            }
            _ => out.skipped.push(scheduled_ms),
        }
        return;
    }
    out.runs.push(Due {
        scheduled_ms,
        attempt: 1,
        reason,
        not_before_ms,
    });
    state.fires += 1;
    state.last_scheduled_ms = Some(scheduled_ms);
    if policy.holds_in_flight() && !completes_at_fire {
        state.in_flight = Some(InFlight {
            run_id: run_id(&state.definition.id, scheduled_ms),
            scheduled_ms,
        });
    }
}

#[cfg(test)]
#[path = "fire_tests.rs"]
pub(crate) mod tests;
