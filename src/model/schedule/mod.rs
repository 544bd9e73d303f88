//! Schedule math: when a job fires.
//!
//! Owns cron parsing and matching over local wall-clock time (`cron`), the mapping of local times
//! to instants under the job's DST policies (`zone`), intervals with a phase anchor, one-shots,
//! start/end bounds, deterministic jitter and misfire resolution.
//!
//! Must never read the clock, do I/O or log: the current time is always an argument, so every
//! rule here is tested exhaustively without a broker. All instants at this API are i64
//! milliseconds since the Unix epoch, UTC.
//!
//! Not here: `max_fires`, pause and overlap, which depend on run state the scheduler keeps.

mod cron;
mod zone;

#[cfg(test)]
mod tests;

use chrono::{DateTime, SecondsFormat};
use xxhash_rust::xxh3::Xxh3;

pub use self::cron::{CronError, CronExpr, Field, MAX_YEAR, MIN_YEAR};
pub use chrono_tz::Tz;

use crate::model::job::{
    DstGapPolicy, DstRepeatPolicy, JobDefinition, MisfirePolicy, ScheduleSpec,
};

/// The shortest interval a job may have.
pub const MIN_INTERVAL_MS: u64 = 1_000;

/// The longest interval a job may have: the largest that its records carry (an Avro `long`,
/// which writes a longer one as this, so that it would fire on other instants when read back).
pub const MAX_INTERVAL_MS: u64 = i64::MAX as u64;

/// Counting missed cron instants walks them one by one; past this many `Misfire::missed` stops
/// counting, so a long outage of a per-second cron job costs milliseconds, not seconds.
/// Intervals are counted exactly.
pub const MISSED_COUNT_CAP: u64 = 100_000;

/// Why a schedule could not be built from a job definition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    // The cron error is part of the message, not a `source`, so a printed chain does not
    // repeat it.
    #[error("invalid cron {expr:?} for job {job:?}: {reason}")]
    InvalidCron {
        job: String,
        expr: String,
        reason: CronError,
    },
    #[error("unknown time zone {zone:?} for job {job:?}: expected an IANA name such as \"Europe/Berlin\"")]
    UnknownZone { job: String, zone: String },
    #[error("interval {every_ms} ms for job {job:?} is under the minimum of {MIN_INTERVAL_MS} ms")]
    IntervalTooShort { job: String, every_ms: u64 },
    #[error("interval {every_ms} ms for job {job:?} is over the maximum of {MAX_INTERVAL_MS} ms")]
    IntervalTooLong { job: String, every_ms: u64 },
}

/// What a schedule is, parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum ScheduleKind {
    Cron {
        expr: CronExpr,
        zone: Tz,
    },
    /// Fires at `anchor_ms + k * every_ms` for every integer k, negative ones included.
    Interval {
        every_ms: u64,
        anchor_ms: i64,
    },
    Once {
        at_ms: i64,
    },
}

/// A job's parsed schedule: the set of instants at which it fires.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    kind: ScheduleKind,
    start_ms: Option<i64>,
    end_ms: Option<i64>,
    dst_gap: DstGapPolicy,
    dst_repeat: DstRepeatPolicy,
}

impl Schedule {
    /// Parses the job's schedule, bounds and DST policies.
    pub fn from_job(def: &JobDefinition) -> Result<Schedule, ScheduleError> {
        Ok(Schedule::from_spec(&def.id, &def.schedule)?
            .with_bounds(def.start_ms, def.end_ms)
            .with_dst(def.dst_gap, def.dst_repeat))
    }

    /// Parses a bare schedule spec (unbounded, default DST policies); `job_id` only names the job
    /// in errors.
    pub fn from_spec(job_id: &str, spec: &ScheduleSpec) -> Result<Schedule, ScheduleError> {
        let kind = match spec {
            ScheduleSpec::Cron { expr, zone } => {
                let parsed =
                    CronExpr::parse(expr).map_err(|reason| ScheduleError::InvalidCron {
                        job: job_id.into(),
                        expr: expr.clone(),
                        reason,
                    })?;
                let tz = zone.parse::<Tz>().map_err(|_| ScheduleError::UnknownZone {
                    job: job_id.into(),
                    zone: zone.clone(),
                })?;
                ScheduleKind::Cron {
                    expr: parsed,
                    zone: tz,
                }
            }
            ScheduleSpec::Interval {
                every_ms,
                anchor_ms,
            } => {
                if *every_ms < MIN_INTERVAL_MS {
                    return Err(ScheduleError::IntervalTooShort {
                        job: job_id.into(),
                        every_ms: *every_ms,
                    });
                }
                if *every_ms > MAX_INTERVAL_MS {
                    return Err(ScheduleError::IntervalTooLong {
                        job: job_id.into(),
                        every_ms: *every_ms,
                    });
                }
                ScheduleKind::Interval {
                    every_ms: *every_ms,
                    anchor_ms: *anchor_ms,
                }
            }
            ScheduleSpec::Once { at_ms } => ScheduleKind::Once { at_ms: *at_ms },
        };
        Ok(Schedule {
            kind,
            start_ms: None,
            end_ms: None,
            dst_gap: DstGapPolicy::default(),
            dst_repeat: DstRepeatPolicy::default(),
        })
    }

    /// No fire before `start_ms`; no fire at or after `end_ms`.
    pub fn with_bounds(mut self, start_ms: Option<i64>, end_ms: Option<i64>) -> Schedule {
        self.start_ms = start_ms;
        self.end_ms = end_ms;
        self
    }

    pub fn with_dst(mut self, gap: DstGapPolicy, repeat: DstRepeatPolicy) -> Schedule {
        self.dst_gap = gap;
        self.dst_repeat = repeat;
        self
    }

    pub fn kind(&self) -> &ScheduleKind {
        &self.kind
    }

    pub fn start_ms(&self) -> Option<i64> {
        self.start_ms
    }

    pub fn end_ms(&self) -> Option<i64> {
        self.end_ms
    }

    /// The job's time zone; None for intervals and one-shots, which are zone-free.
    pub fn zone(&self) -> Option<Tz> {
        match &self.kind {
            ScheduleKind::Cron { zone, .. } => Some(*zone),
            _ => None,
        }
    }

    /// The first scheduled instant strictly after `after_ms`, or None when there is none (past
    /// `end_ms`, a one-shot already passed, or no cron match up to MAX_YEAR).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let after = match self.start_ms {
            Some(start) => after_ms.max(start.saturating_sub(1)),
            None => after_ms,
        };
        let next = match &self.kind {
            ScheduleKind::Cron { expr, zone } => {
                let t0 = after.div_euclid(1000) + 1;
                zone::next_fire(expr, *zone, self.dst_gap, self.dst_repeat, t0)?
                    .checked_mul(1000)?
            }
            ScheduleKind::Interval {
                every_ms,
                anchor_ms,
            } => {
                let (every, anchor) = (i128::from(*every_ms), i128::from(*anchor_ms));
                let k = (i128::from(after) - anchor).div_euclid(every) + 1;
                i64::try_from(anchor + k * every).ok()?
            }
            ScheduleKind::Once { at_ms } => (*at_ms > after).then_some(*at_ms)?,
        };
        self.end_ms.is_none_or(|end| next < end).then_some(next)
    }

    /// Every scheduled instant in (from_exclusive, to_inclusive], ascending, at most `limit`.
    pub fn fires_in(&self, from_exclusive: i64, to_inclusive: i64, limit: usize) -> Vec<i64> {
        let mut out = Vec::new();
        let mut cursor = from_exclusive;
        while out.len() < limit {
            match self.next_after(cursor) {
                Some(t) if t <= to_inclusive => {
                    out.push(t);
                    cursor = t;
                }
                _ => break,
            }
        }
        out
    }

    /// The latest scheduled instant in [from_inclusive, to_inclusive].
    ///
    /// A binary search over `next_after`, which is monotone, so it needs no backwards cron walk
    /// and is exactly as correct as `next_after`: at most ~64 calls.
    pub fn last_in(&self, from_inclusive: i64, to_inclusive: i64) -> Option<i64> {
        if from_inclusive > to_inclusive {
            return None;
        }
        let first = self.next_after(from_inclusive.checked_sub(1)?)?;
        if first > to_inclusive {
            return None;
        }
        // `good` is an instant <= to; no instant lies in [bad, to].
        let (mut good, mut bad) = (i128::from(first), i128::from(to_inclusive) + 1);
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            match self.next_after(mid as i64 - 1) {
                Some(t) if t <= to_inclusive => good = i128::from(t),
                _ => bad = mid,
            }
        }
        Some(good as i64)
    }

    /// The number of scheduled instants in [from_inclusive, to_inclusive], counting no further
    /// than `cap`.
    pub fn count_in(&self, from_inclusive: i64, to_inclusive: i64, cap: u64) -> u64 {
        if let ScheduleKind::Interval {
            every_ms,
            anchor_ms,
        } = self.kind
        {
            // Closed form: an outage of a per-second interval must not cost a walk.
            let lo = i128::from(from_inclusive.max(self.start_ms.unwrap_or(i64::MIN)));
            let hi = match self.end_ms {
                Some(end) => i128::from(to_inclusive).min(i128::from(end) - 1),
                None => i128::from(to_inclusive),
            };
            if lo > hi {
                return 0;
            }
            let (every, anchor) = (i128::from(every_ms), i128::from(anchor_ms));
            let first_k = -((anchor - lo).div_euclid(every));
            let last_k = (hi - anchor).div_euclid(every);
            let n = (last_k - first_k + 1).max(0);
            return u64::try_from(n).unwrap_or(u64::MAX).min(cap);
        }
        let mut n = 0;
        let mut cursor = match from_inclusive.checked_sub(1) {
            Some(c) => c,
            None => return 0,
        };
        while n < cap {
            match self.next_after(cursor) {
                Some(t) if t <= to_inclusive => {
                    n += 1;
                    cursor = t;
                }
                _ => break,
            }
        }
        n
    }

    /// Deterministic jitter for a run: `xxh3(job_id, scheduled_ms) % window_ms`, 0 when the
    /// window is 0. Every node computes the same delay for the same run.
    pub fn jitter_ms(job_id: &str, scheduled_ms: i64, window_ms: u64) -> u64 {
        jitter_ms(job_id, scheduled_ms, window_ms)
    }

    /// `ms` as ISO 8601 in UTC, and in the job's zone with its offset (UTC again for intervals
    /// and one-shots), for the CLI's dry run.
    pub fn describe_instant(&self, ms: i64) -> (String, String) {
        let Some(utc) = DateTime::from_timestamp_millis(ms) else {
            // Beyond chrono's range (hundreds of thousands of years): still say something.
            return (format!("{ms} ms"), format!("{ms} ms"));
        };
        let utc_text = utc.to_rfc3339_opts(SecondsFormat::AutoSi, true);
        let local_text = match self.zone() {
            Some(tz) => utc
                .with_timezone(&tz)
                .to_rfc3339_opts(SecondsFormat::AutoSi, false),
            None => utc_text.clone(),
        };
        (utc_text, local_text)
    }
}

/// See [`Schedule::jitter_ms`].
pub fn jitter_ms(job_id: &str, scheduled_ms: i64, window_ms: u64) -> u64 {
    if window_ms == 0 {
        return 0;
    }
    let mut hasher = Xxh3::new();
    hasher.update(job_id.as_bytes());
    // Fixed width after a variable-length id keeps (id, instant) pairs from colliding by
    // concatenation.
    hasher.update(&scheduled_ms.to_le_bytes());
    hasher.digest() % window_ms
}

/// What to do about instants missed while no node fired the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misfire {
    /// Scheduled instants to fire now, ascending; each is the identity of its run.
    pub fire: Vec<i64>,
    /// The next instant to wait for, strictly after now.
    pub next_ms: Option<i64>,
    /// Missed instants that will never fire (for cron, counted up to MISSED_COUNT_CAP).
    pub missed: u64,
}

/// Resolves the instants in [due_ms, now_ms], all of which are missed (the caller only asks once
/// `due_ms` is older than its own tolerance).
///
/// - `FireOnce`: one run, for the latest missed instant, however old.
/// - `FireAll`: every missed instant not older than `now_ms - catch_up_window_ms`; past `limit`
///   of them the most recent `limit` fire, since after a long outage recent runs matter most.
/// - `Skip`: none.
///
/// A one-shot fires under `FireOnce` and `FireAll` only while its instant is within the catch-up
/// window; older, or under `Skip`, it is dropped. No policy fires more than `limit` runs.
pub fn resolve_misfire(
    schedule: &Schedule,
    policy: MisfirePolicy,
    catch_up_window_ms: u64,
    due_ms: i64,
    now_ms: i64,
    limit: usize,
) -> Misfire {
    let next_ms = schedule.next_after(now_ms);
    if due_ms > now_ms {
        return Misfire {
            fire: Vec::new(),
            next_ms,
            missed: 0,
        };
    }
    let window = i64::try_from(catch_up_window_ms).unwrap_or(i64::MAX);
    let window_start = now_ms.saturating_sub(window).max(due_ms);
    let mut fire: Vec<i64> = match (policy, &schedule.kind) {
        (MisfirePolicy::Skip, _) => Vec::new(),
        (_, ScheduleKind::Once { .. }) => {
            schedule.last_in(window_start, now_ms).into_iter().collect()
        }
        (MisfirePolicy::FireOnce, _) => schedule.last_in(due_ms, now_ms).into_iter().collect(),
        (MisfirePolicy::FireAll, _) => {
            let mut latest = Vec::new();
            let mut to = now_ms;
            while latest.len() < limit {
                let Some(t) = schedule.last_in(window_start, to) else {
                    break;
                };
                latest.push(t);
                match t.checked_sub(1) {
                    Some(before) => to = before,
                    None => break,
                }
            }
            latest.reverse();
            latest
        }
    };
    fire.truncate(limit);
    let cap = match schedule.kind {
        // Counted in closed form: exact at no cost.
        ScheduleKind::Interval { .. } => u64::MAX,
        _ => MISSED_COUNT_CAP,
    };
    let total = schedule.count_in(due_ms, now_ms, cap);
    Misfire {
        missed: total.saturating_sub(fire.len() as u64),
        fire,
        next_ms,
    }
}
