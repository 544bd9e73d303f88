//! From matching local date-times to instants, under the job's explicit DST policies.
//!
//! Works in whole seconds: cron has 1-second resolution and every tz transition falls on a whole
//! second, so every fire instant (gap ends included) is a whole second.
//!
//! The set of fire instants is defined per local match L:
//! - L maps to one instant: that instant;
//! - L is in a spring-forward gap: `Shift` gives the instant the gap ends (several gap times
//!   collapse to that one instant, so it fires once), `Skip` gives nothing;
//! - L occurs twice (fall back): `Once` gives the earlier instant, `Twice` both.
//!
//! Walking local times in order yields instants in order except inside a fold, where the second
//! pass comes after first-pass instants of later local times; `next_fire` handles that.

use chrono::{DateTime, Datelike, Duration, LocalResult, NaiveDateTime, Offset, TimeZone};
use chrono_tz::{GapInfo, Tz};

use super::cron::{CronExpr, MAX_YEAR};
use crate::model::job::{DstGapPolicy, DstRepeatPolicy};

/// The local wall-clock time at instant `t` (seconds).
pub(crate) fn local_at(tz: Tz, t: i64) -> Option<NaiveDateTime> {
    Some(
        DateTime::from_timestamp(t, 0)?
            .with_timezone(&tz)
            .naive_local(),
    )
}

/// The UTC offset in seconds at instant `t`.
pub(crate) fn offset_at(tz: Tz, t: i64) -> Option<i64> {
    let utc = DateTime::from_timestamp(t, 0)?.naive_utc();
    Some(i64::from(
        tz.offset_from_utc_datetime(&utc).fix().local_minus_utc(),
    ))
}

/// The first fire instant (seconds) at or after `t0` (seconds), if any up to MAX_YEAR.
pub(crate) fn next_fire(
    cron: &CronExpr,
    tz: Tz,
    gap: DstGapPolicy,
    repeat: DstRepeatPolicy,
    t0: i64,
) -> Option<i64> {
    let one = Duration::seconds(1);
    // Nothing fires before 1970-01-01 local, which is after 1969-12-30 UTC in every zone; this
    // also keeps far-past instants inside chrono's range.
    let t0 = t0.max(-2 * 86_400);
    let l0 = local_at(tz, t0)?;
    if l0.year() > MAX_YEAR {
        return None;
    }

    // Local times before l0 can still yield instants >= t0 in two cases; start the walk early
    // enough to see them.
    let mut start = l0;
    if repeat == DstRepeatPolicy::Twice {
        // t0 is in the first pass of a fold: the second passes of the fold's earlier local times
        // are still ahead of t0.
        if let LocalResult::Ambiguous(x, y) = tz.from_local_datetime(&l0) {
            let (a, b) = ordered(x.timestamp(), y.timestamp());
            if a == t0 {
                start = l0 - Duration::seconds(b - a);
            }
        }
    }
    if gap == DstGapPolicy::Shift {
        // t0 is exactly the end of a gap: the gap's local times (all before l0) shift onto t0.
        let before = l0 - one;
        if let LocalResult::None = tz.from_local_datetime(&before) {
            if let Some((begin, _)) = GapInfo::new(&before, &tz).and_then(|g| g.begin) {
                start = start.min(begin);
            }
        }
    }

    // The smallest instant >= t0 seen so far from a second pass (Twice) whose first-pass
    // successors might still come earlier.
    let mut best: Option<i64> = None;
    let mut cursor = start;
    loop {
        let Some(l) = cron.next_local(cursor) else {
            return best;
        };
        match tz.from_local_datetime(&l) {
            LocalResult::Single(dt) => {
                let t = dt.timestamp();
                if t >= t0 {
                    return Some(min_with(best, t));
                }
                cursor = l + one;
            }
            LocalResult::Ambiguous(x, y) => {
                let (a, b) = ordered(x.timestamp(), y.timestamp());
                // Later local times' first passes and every second pass are all after `a`.
                if a >= t0 {
                    return Some(min_with(best, a));
                }
                match repeat {
                    DstRepeatPolicy::Twice if b >= t0 => {
                        // From l0 on, first passes are all before t0 (t0 is in the second pass)
                        // and second passes grow with l: b is the answer.
                        if l >= l0 {
                            return Some(min_with(best, b));
                        }
                        // Before l0, later local times have larger second passes and first
                        // passes before t0: only local times from l0 on can beat b.
                        best = Some(min_with(best, b));
                        cursor = (l + one).max(l0);
                    }
                    DstRepeatPolicy::Twice => cursor = l + one,
                    DstRepeatPolicy::Once => {
                        // t0 is in the fold's second pass, which Once never fires: resume at the
                        // local time where the fold ends, i.e. the transition seen with the
                        // earlier (pre-transition) offset.
                        let transition = first_change(tz, a, b)?;
                        cursor = (l + one).max(l + Duration::seconds(transition - a));
                    }
                }
            }
            LocalResult::None => {
                let end = GapInfo::new(&l, &tz).and_then(|g| g.end);
                let Some(end) = end else {
                    return best;
                };
                if gap == DstGapPolicy::Shift && end.timestamp() >= t0 {
                    return Some(min_with(best, end.timestamp()));
                }
                // Skip (or a gap already behind t0): nothing in the gap fires.
                cursor = end.naive_local();
            }
        }
    }
}

/// The first instant in (a, b] whose offset differs from the offset at `a`, given that the
/// offsets at `a` and `b` differ and one transition lies between them (a fold's two passes).
fn first_change(tz: Tz, a: i64, b: i64) -> Option<i64> {
    let at_a = offset_at(tz, a)?;
    let (mut lo, mut hi) = (a, b);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset_at(tz, mid)? == at_a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

fn ordered(x: i64, y: i64) -> (i64, i64) {
    (x.min(y), x.max(y))
}

fn min_with(best: Option<i64>, t: i64) -> i64 {
    best.map_or(t, |b| b.min(t))
}
