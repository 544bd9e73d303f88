//! Schedule and DST tests. Every DST expectation is backed by an offset check against the tz
//! data, computed independently of the code under test, and by the published rules (EU: last
//! Sunday of March/October at 01:00 UTC; US: second Sunday of March and first Sunday of November
//! at 02:00 local; Lord Howe: first Sunday of October/April at 02:00 local, 30 minutes).

use chrono::{DateTime, LocalResult, TimeZone};
use proptest::prelude::*;

use super::zone::{local_at, offset_at};
use super::*;
use crate::model::job::{DstGapPolicy as Gap, DstRepeatPolicy as Repeat};

fn ms(iso: &str) -> i64 {
    DateTime::parse_from_rfc3339(iso)
        .unwrap_or_else(|e| panic!("bad test instant {iso}: {e}"))
        .timestamp_millis()
}

fn iso(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

fn cron(expr: &str, zone: &str, gap: Gap, repeat: Repeat) -> Schedule {
    Schedule::from_spec(
        "test",
        &ScheduleSpec::Cron {
            expr: expr.into(),
            zone: zone.into(),
        },
    )
    .unwrap()
    .with_dst(gap, repeat)
}

fn interval(every_ms: u64, anchor_ms: i64) -> Schedule {
    Schedule::from_spec(
        "test",
        &ScheduleSpec::Interval {
            every_ms,
            anchor_ms,
        },
    )
    .unwrap()
}

fn once(at_ms: i64) -> Schedule {
    Schedule::from_spec("test", &ScheduleSpec::Once { at_ms }).unwrap()
}

/// The fires in (from, to] as UTC ISO strings.
fn fires(s: &Schedule, from: &str, to: &str) -> Vec<String> {
    s.fires_in(ms(from), ms(to), 1000)
        .into_iter()
        .map(iso)
        .collect()
}

fn tz(name: &str) -> Tz {
    name.parse().unwrap()
}

/// Offset in hours at an instant, straight from the tz data.
fn offset_h(zone: &str, at: &str) -> f64 {
    offset_at(tz(zone), ms(at) / 1000).unwrap() as f64 / 3600.0
}

// --- The tz data says what we assume ---------------------------------------------------------

#[test]
fn tz_data_matches_published_rules() {
    // Berlin: CET+1 / CEST+2, switching at 01:00 UTC.
    assert_eq!(offset_h("Europe/Berlin", "2025-03-30T00:59:59Z"), 1.0);
    assert_eq!(offset_h("Europe/Berlin", "2025-03-30T01:00:00Z"), 2.0);
    assert_eq!(offset_h("Europe/Berlin", "2025-10-26T00:59:59Z"), 2.0);
    assert_eq!(offset_h("Europe/Berlin", "2025-10-26T01:00:00Z"), 1.0);
    // New York: 02:00 EST = 07:00Z; 02:00 EDT = 06:00Z.
    assert_eq!(offset_h("America/New_York", "2025-03-09T06:59:59Z"), -5.0);
    assert_eq!(offset_h("America/New_York", "2025-03-09T07:00:00Z"), -4.0);
    assert_eq!(offset_h("America/New_York", "2025-11-02T05:59:59Z"), -4.0);
    assert_eq!(offset_h("America/New_York", "2025-11-02T06:00:00Z"), -5.0);
    // Lord Howe: +10:30 / +11. 02:00 at +10:30 = 15:30Z; 02:00 at +11 = 15:00Z.
    assert_eq!(
        offset_h("Australia/Lord_Howe", "2025-10-04T15:29:59Z"),
        10.5
    );
    assert_eq!(
        offset_h("Australia/Lord_Howe", "2025-10-04T15:30:00Z"),
        11.0
    );
    assert_eq!(
        offset_h("Australia/Lord_Howe", "2025-04-05T14:59:59Z"),
        11.0
    );
    assert_eq!(
        offset_h("Australia/Lord_Howe", "2025-04-05T15:00:00Z"),
        10.5
    );
    // Kolkata: +5:30 all year.
    assert_eq!(offset_h("Asia/Kolkata", "2025-01-15T00:00:00Z"), 5.5);
    assert_eq!(offset_h("Asia/Kolkata", "2025-07-15T00:00:00Z"), 5.5);
    // Apia skipped 2011-12-30: 29 Dec 24:00 at -10 = 30 Dec 10:00Z = 31 Dec 00:00 at +14.
    assert_eq!(offset_h("Pacific/Apia", "2011-12-30T09:59:59Z"), -10.0);
    assert_eq!(offset_h("Pacific/Apia", "2011-12-30T10:00:00Z"), 14.0);
    let apia = tz("Pacific/Apia");
    let day = chrono::NaiveDate::from_ymd_opt(2011, 12, 30).unwrap();
    for h in 0..24 {
        let local = day.and_hms_opt(h, 0, 0).unwrap();
        assert_eq!(apia.from_local_datetime(&local), LocalResult::None);
    }
}

// --- Europe/Berlin ---------------------------------------------------------------------------

#[test]
fn berlin_gap_shift_fires_at_gap_end() {
    let s = cron("0 30 2 * * *", "Europe/Berlin", Gap::Shift, Repeat::Once);
    assert_eq!(
        fires(&s, "2025-03-28T12:00:00Z", "2025-03-31T12:00:00Z"),
        [
            "2025-03-29T01:30:00Z", // 02:30 CET
            "2025-03-30T01:00:00Z", // 02:30 does not exist: 03:00 CEST
            "2025-03-31T00:30:00Z", // 02:30 CEST
        ]
    );
}

#[test]
fn berlin_gap_skip_drops_the_day() {
    let s = cron("0 30 2 * * *", "Europe/Berlin", Gap::Skip, Repeat::Once);
    assert_eq!(
        fires(&s, "2025-03-28T12:00:00Z", "2025-03-31T12:00:00Z"),
        ["2025-03-29T01:30:00Z", "2025-03-31T00:30:00Z"]
    );
}

#[test]
fn berlin_gap_times_collapse_onto_one_instant() {
    // 02:00, 02:15, 02:30, 02:45 do not exist and 03:00 is the gap end: one fire at 01:00Z.
    let s = cron("0 */15 * * * *", "Europe/Berlin", Gap::Shift, Repeat::Once);
    assert_eq!(
        fires(&s, "2025-03-30T00:30:00Z", "2025-03-30T01:30:00Z"),
        [
            "2025-03-30T00:45:00Z",
            "2025-03-30T01:00:00Z",
            "2025-03-30T01:15:00Z",
            "2025-03-30T01:30:00Z"
        ]
    );
    // Skip loses the gap times but keeps 03:00, which exists.
    let s = cron("0 */15 * * * *", "Europe/Berlin", Gap::Skip, Repeat::Once);
    assert_eq!(
        fires(&s, "2025-03-30T00:30:00Z", "2025-03-30T01:30:00Z"),
        [
            "2025-03-30T00:45:00Z",
            "2025-03-30T01:00:00Z",
            "2025-03-30T01:15:00Z",
            "2025-03-30T01:30:00Z"
        ]
    );
    // Only gap times: Shift fires once at the gap end, Skip never.
    let only_gap = "0 0,20,40 2 * * *";
    let s = cron(only_gap, "Europe/Berlin", Gap::Shift, Repeat::Once);
    assert_eq!(
        fires(&s, "2025-03-29T12:00:00Z", "2025-03-30T12:00:00Z"),
        ["2025-03-30T01:00:00Z"]
    );
    // Asking from exactly one ms before the gap end still sees it.
    assert_eq!(
        s.next_after(ms("2025-03-30T01:00:00Z") - 1),
        Some(ms("2025-03-30T01:00:00Z"))
    );
    assert_eq!(
        s.next_after(ms("2025-03-30T01:00:00Z")),
        Some(ms("2025-03-31T00:00:00Z"))
    );
    let s = cron(only_gap, "Europe/Berlin", Gap::Skip, Repeat::Once);
    assert_eq!(
        fires(&s, "2025-03-29T12:00:00Z", "2025-03-30T12:00:00Z"),
        Vec::<String>::new()
    );
}

#[test]
fn berlin_repeat_once_fires_first_occurrence() {
    let s = cron("0 30 2 * * *", "Europe/Berlin", Gap::Shift, Repeat::Once);
    assert_eq!(
        fires(&s, "2025-10-25T12:00:00Z", "2025-10-27T12:00:00Z"),
        [
            "2025-10-26T00:30:00Z", // 02:30 CEST
            "2025-10-27T01:30:00Z", // 02:30 CET
        ]
    );
}

#[test]
fn berlin_repeat_twice_fires_both() {
    let s = cron("0 30 2 * * *", "Europe/Berlin", Gap::Shift, Repeat::Twice);
    assert_eq!(
        fires(&s, "2025-10-25T12:00:00Z", "2025-10-27T12:00:00Z"),
        [
            "2025-10-26T00:30:00Z", // 02:30 CEST
            "2025-10-26T01:30:00Z", // 02:30 CET
            "2025-10-27T01:30:00Z",
        ]
    );
}

#[test]
fn berlin_repeat_every_quarter_hour() {
    let twice = cron("0 */15 * * * *", "Europe/Berlin", Gap::Shift, Repeat::Twice);
    let all: Vec<String> = (0..=8)
        .map(|i| iso(ms("2025-10-26T00:00:00Z") + i * 900_000))
        .collect();
    assert_eq!(
        fires(&twice, "2025-10-25T23:59:59Z", "2025-10-26T02:00:00Z"),
        all
    );
    // Once: the second pass (01:00Z-01:45Z, local 02:00-02:45 CET) does not fire.
    let once = cron("0 */15 * * * *", "Europe/Berlin", Gap::Shift, Repeat::Once);
    assert_eq!(
        fires(&once, "2025-10-25T23:59:59Z", "2025-10-26T02:00:00Z"),
        [
            "2025-10-26T00:00:00Z",
            "2025-10-26T00:15:00Z",
            "2025-10-26T00:30:00Z",
            "2025-10-26T00:45:00Z",
            "2025-10-26T02:00:00Z"
        ]
    );
    // Starting inside the second pass: Once resumes after the fold, Twice continues.
    assert_eq!(
        once.next_after(ms("2025-10-26T01:10:00Z")),
        Some(ms("2025-10-26T02:00:00Z"))
    );
    assert_eq!(
        twice.next_after(ms("2025-10-26T01:10:00Z")),
        Some(ms("2025-10-26T01:15:00Z"))
    );
    // Starting inside the first pass: Twice's next is the next first-pass time.
    assert_eq!(
        twice.next_after(ms("2025-10-26T00:30:00Z")),
        Some(ms("2025-10-26T00:45:00Z"))
    );
    assert_eq!(
        twice.next_after(ms("2025-10-26T00:45:00Z")),
        Some(ms("2025-10-26T01:00:00Z"))
    );
}

// --- America/New_York ------------------------------------------------------------------------

#[test]
fn new_york_gap_and_repeat() {
    let at = |gap, repeat| cron("0 30 2 * * *", "America/New_York", gap, repeat);
    // 2025-03-09 02:30 does not exist; the gap ends at 03:00 EDT = 07:00Z.
    assert_eq!(
        fires(
            &at(Gap::Shift, Repeat::Once),
            "2025-03-08T00:00:00Z",
            "2025-03-10T12:00:00Z"
        ),
        [
            "2025-03-08T07:30:00Z",
            "2025-03-09T07:00:00Z",
            "2025-03-10T06:30:00Z"
        ]
    );
    assert_eq!(
        fires(
            &at(Gap::Skip, Repeat::Once),
            "2025-03-08T00:00:00Z",
            "2025-03-10T12:00:00Z"
        ),
        ["2025-03-08T07:30:00Z", "2025-03-10T06:30:00Z"]
    );
    // 2025-11-02 01:30 happens at 05:30Z (EDT) and 06:30Z (EST).
    let at = |repeat| cron("0 30 1 * * *", "America/New_York", Gap::Shift, repeat);
    assert_eq!(
        fires(
            &at(Repeat::Once),
            "2025-11-01T12:00:00Z",
            "2025-11-03T12:00:00Z"
        ),
        ["2025-11-02T05:30:00Z", "2025-11-03T06:30:00Z"]
    );
    assert_eq!(
        fires(
            &at(Repeat::Twice),
            "2025-11-01T12:00:00Z",
            "2025-11-03T12:00:00Z"
        ),
        [
            "2025-11-02T05:30:00Z",
            "2025-11-02T06:30:00Z",
            "2025-11-03T06:30:00Z"
        ]
    );
}

// --- Australia/Lord_Howe: a 30-minute shift --------------------------------------------------

#[test]
fn lord_howe_half_hour_gap() {
    // 2025-10-05 local 02:00-02:30 does not exist; it ends at 02:30 +11 = 15:30Z on the 4th.
    let every_10 = |gap| cron("0 */10 1-3 * * *", "Australia/Lord_Howe", gap, Repeat::Once);
    assert_eq!(
        fires(
            &every_10(Gap::Shift),
            "2025-10-04T15:15:00Z",
            "2025-10-04T15:50:00Z"
        ),
        [
            "2025-10-04T15:20:00Z", // 01:50 +10:30
            "2025-10-04T15:30:00Z", // 02:00, 02:10, 02:20 and 02:30 itself: once
            "2025-10-04T15:40:00Z", // 02:40 +11
            "2025-10-04T15:50:00Z"
        ]
    );
    assert_eq!(
        fires(
            &every_10(Gap::Skip),
            "2025-10-04T15:15:00Z",
            "2025-10-04T15:50:00Z"
        ),
        [
            "2025-10-04T15:20:00Z",
            "2025-10-04T15:30:00Z", // 02:30 exists
            "2025-10-04T15:40:00Z",
            "2025-10-04T15:50:00Z"
        ]
    );
    // 02:15 on 4 Oct (+10:30), shifted on 5 Oct, at +11 on 6 Oct.
    let at_0215 = |gap| cron("0 15 2 * * *", "Australia/Lord_Howe", gap, Repeat::Once);
    assert_eq!(
        fires(
            &at_0215(Gap::Shift),
            "2025-10-03T00:00:00Z",
            "2025-10-05T23:00:00Z"
        ),
        [
            "2025-10-03T15:45:00Z",
            "2025-10-04T15:30:00Z",
            "2025-10-05T15:15:00Z"
        ]
    );
    assert_eq!(
        fires(
            &at_0215(Gap::Skip),
            "2025-10-03T00:00:00Z",
            "2025-10-05T23:00:00Z"
        ),
        ["2025-10-03T15:45:00Z", "2025-10-05T15:15:00Z"]
    );
}

#[test]
fn lord_howe_half_hour_repeat() {
    // 2025-04-06 local 01:30-02:00 happens twice: at +11 (14:30Z-15:00Z on the 5th), then at
    // +10:30 (15:00Z-15:30Z).
    let at = |repeat| cron("0 45 1 * * *", "Australia/Lord_Howe", Gap::Shift, repeat);
    assert_eq!(
        fires(
            &at(Repeat::Once),
            "2025-04-05T00:00:00Z",
            "2025-04-06T23:00:00Z"
        ),
        ["2025-04-05T14:45:00Z", "2025-04-06T15:15:00Z"]
    );
    assert_eq!(
        fires(
            &at(Repeat::Twice),
            "2025-04-05T00:00:00Z",
            "2025-04-06T23:00:00Z"
        ),
        [
            "2025-04-05T14:45:00Z",
            "2025-04-05T15:15:00Z",
            "2025-04-06T15:15:00Z"
        ]
    );
    // 01:15 is before the fold and 02:00 after it: once each under either policy.
    for repeat in [Repeat::Once, Repeat::Twice] {
        let s = cron("0 15 1,2 * * *", "Australia/Lord_Howe", Gap::Shift, repeat);
        assert_eq!(
            fires(&s, "2025-04-05T12:00:00Z", "2025-04-05T17:00:00Z"),
            ["2025-04-05T14:15:00Z", "2025-04-05T15:45:00Z"]
        );
    }
}

// --- Asia/Kolkata: no DST --------------------------------------------------------------------

#[test]
fn kolkata_has_no_dst_effects() {
    for (gap, repeat) in policies() {
        let s = cron("0 0 9 * * *", "Asia/Kolkata", gap, repeat);
        let got = s.fires_in(ms("2025-01-01T00:00:00Z"), ms("2026-01-01T00:00:00Z"), 1000);
        assert_eq!(got.len(), 365);
        for (i, t) in got.iter().enumerate() {
            assert_eq!(*t, ms("2025-01-01T03:30:00Z") + i as i64 * 86_400_000);
        }
    }
}

// --- Pacific/Apia: a whole day that does not exist -------------------------------------------

#[test]
fn apia_skipped_day_skip() {
    let s = cron("0 0 12 * * *", "Pacific/Apia", Gap::Skip, Repeat::Once);
    let got = s.fires_in(ms("2011-12-28T12:00:00Z"), ms("2011-12-31T12:00:00Z"), 10);
    let local: Vec<String> = got.iter().map(|t| s.describe_instant(*t).1).collect();
    assert_eq!(
        local,
        [
            "2011-12-28T12:00:00-10:00",
            "2011-12-29T12:00:00-10:00",
            "2011-12-31T12:00:00+14:00"
        ]
    );
}

#[test]
fn apia_skipped_day_shift_fires_once_at_gap_end() {
    let s = cron("0 0 12 * * *", "Pacific/Apia", Gap::Shift, Repeat::Once);
    assert_eq!(
        fires(&s, "2011-12-29T12:00:00Z", "2011-12-31T12:00:00Z"),
        [
            "2011-12-29T22:00:00Z", // 29 Dec 12:00 -10
            "2011-12-30T10:00:00Z", // 30 Dec 12:00 does not exist: 31 Dec 00:00 +14
            "2011-12-30T22:00:00Z", // 31 Dec 12:00 +14
        ]
    );
    // Every hour of 30 Dec collapses onto the gap end: one fire, not 24.
    let hourly = cron("0 0 * * * *", "Pacific/Apia", Gap::Shift, Repeat::Once);
    assert_eq!(
        fires(&hourly, "2011-12-30T08:30:00Z", "2011-12-30T11:30:00Z"),
        [
            "2011-12-30T09:00:00Z", // 29 Dec 23:00 -10
            "2011-12-30T10:00:00Z", // gap end, 31 Dec 00:00 +14
            "2011-12-30T11:00:00Z", // 31 Dec 01:00 +14
        ]
    );
    let hourly_skip = cron("0 0 * * * *", "Pacific/Apia", Gap::Skip, Repeat::Once);
    assert_eq!(
        fires(&hourly_skip, "2011-12-30T08:30:00Z", "2011-12-30T11:30:00Z"),
        [
            "2011-12-30T09:00:00Z",
            "2011-12-30T10:00:00Z", // 31 Dec 00:00 exists
            "2011-12-30T11:00:00Z"
        ]
    );
    // A job only on 30 December, at any hour.
    let only_30th = cron(
        "0 0 * 30 12 * 2011",
        "Pacific/Apia",
        Gap::Shift,
        Repeat::Once,
    );
    assert_eq!(
        fires(&only_30th, "2011-01-01T00:00:00Z", "2012-12-31T00:00:00Z"),
        ["2011-12-30T10:00:00Z"]
    );
    let only_30th = cron(
        "0 0 * 30 12 * 2011",
        "Pacific/Apia",
        Gap::Skip,
        Repeat::Once,
    );
    assert_eq!(only_30th.next_after(ms("2011-01-01T00:00:00Z")), None);
}

// --- Brute-force oracle ----------------------------------------------------------------------

fn policies() -> [(Gap, Repeat); 4] {
    [
        (Gap::Shift, Repeat::Once),
        (Gap::Shift, Repeat::Twice),
        (Gap::Skip, Repeat::Once),
        (Gap::Skip, Repeat::Twice),
    ]
}

/// Whether instant `t` (seconds) is a fire instant, straight from the definition: it does not
/// search, it asks the tz data about this one instant and its second before.
fn oracle_fires_at(expr: &CronExpr, zone: Tz, gap: Gap, repeat: Repeat, t: i64) -> bool {
    let local = local_at(zone, t).unwrap();
    let by_local = expr.matches(&local)
        && match zone.from_local_datetime(&local) {
            LocalResult::Single(_) => true,
            LocalResult::Ambiguous(a, b) => {
                repeat == Repeat::Twice || t == a.timestamp().min(b.timestamp())
            }
            LocalResult::None => unreachable!("the local time of an instant exists"),
        };
    if by_local {
        return true;
    }
    // A gap ends at t when the offset jumps forward between t-1 and t.
    let (before, after) = (offset_at(zone, t - 1).unwrap(), offset_at(zone, t).unwrap());
    if gap == Gap::Shift && after > before {
        // The gap is local [t + before, t + after).
        let begin = local_at(zone, t - 1).unwrap() + chrono::Duration::seconds(1);
        return (0..after - before).any(|s| expr.matches(&(begin + chrono::Duration::seconds(s))));
    }
    false
}

/// Compares `fires_in` with the oracle at every `step` seconds of the window (the expressions
/// tested fire only on multiples of `step`, and transitions fall on whole minutes).
fn check_against_oracle(expr: &str, zone: &str, from: &str, to: &str, step: i64) {
    for (gap, repeat) in policies() {
        let s = cron(expr, zone, gap, repeat);
        let ScheduleKind::Cron {
            expr: parsed,
            zone: z,
        } = s.kind().clone()
        else {
            unreachable!()
        };
        let (from_s, to_s) = (ms(from) / 1000, ms(to) / 1000);
        let want: Vec<i64> = (from_s + 1..=to_s)
            .filter(|t| t % step == 0 && oracle_fires_at(&parsed, z, gap, repeat, *t))
            .map(|t| t * 1000)
            .collect();
        let got = s.fires_in(ms(from), ms(to), 100_000);
        assert_eq!(
            got.iter().map(|t| iso(*t)).collect::<Vec<_>>(),
            want.iter().map(|t| iso(*t)).collect::<Vec<_>>(),
            "{expr} in {zone} with {gap:?}/{repeat:?}"
        );
    }
}

#[test]
fn oracle_agrees_around_transitions() {
    let windows = [
        (
            "Europe/Berlin",
            "2025-03-29T22:00:00Z",
            "2025-03-30T04:00:00Z",
        ),
        (
            "Europe/Berlin",
            "2025-10-25T22:00:00Z",
            "2025-10-26T04:00:00Z",
        ),
        (
            "America/New_York",
            "2025-03-09T04:00:00Z",
            "2025-03-09T10:00:00Z",
        ),
        (
            "America/New_York",
            "2025-11-02T03:00:00Z",
            "2025-11-02T09:00:00Z",
        ),
        (
            "Australia/Lord_Howe",
            "2025-10-04T12:00:00Z",
            "2025-10-04T18:00:00Z",
        ),
        (
            "Australia/Lord_Howe",
            "2025-04-05T12:00:00Z",
            "2025-04-05T18:00:00Z",
        ),
        (
            "Asia/Kolkata",
            "2025-03-29T22:00:00Z",
            "2025-03-30T04:00:00Z",
        ),
    ];
    let exprs = [
        "0 */15 * * * *",
        "0,30 */7 * * * *",
        "0 0,30 1,2 * * *",
        "0 40 1 * * *",
        "0 5 3 * * *",
    ];
    for (zone, from, to) in windows {
        for expr in exprs {
            check_against_oracle(expr, zone, from, to, 30);
        }
    }
    for expr in ["0 0 */3 * * *", "0 0 12 * * *", "0 30 23 * * *"] {
        check_against_oracle(
            expr,
            "Pacific/Apia",
            "2011-12-29T00:00:00Z",
            "2011-12-31T12:00:00Z",
            60,
        );
    }
}

// --- Calendar features through a zone --------------------------------------------------------

#[test]
fn feb_29_in_utc_only_leap_years() {
    let s = cron("0 0 0 29 2 *", "UTC", Gap::Shift, Repeat::Once);
    assert_eq!(
        fires(&s, "2023-01-01T00:00:00Z", "2033-01-01T00:00:00Z"),
        [
            "2024-02-29T00:00:00Z",
            "2028-02-29T00:00:00Z",
            "2032-02-29T00:00:00Z"
        ]
    );
    let never = cron("0 0 0 30 FEB *", "UTC", Gap::Shift, Repeat::Once);
    assert_eq!(never.next_after(0), None);
}

#[test]
fn five_six_seven_fields_agree() {
    let five = cron("30 9 * * MON", "Europe/Berlin", Gap::Shift, Repeat::Once);
    let six = cron("0 30 9 * * MON", "Europe/Berlin", Gap::Shift, Repeat::Once);
    let seven = cron(
        "0 30 9 ? * MON *",
        "Europe/Berlin",
        Gap::Shift,
        Repeat::Once,
    );
    let from = ms("2025-01-01T00:00:00Z");
    let to = ms("2026-01-01T00:00:00Z");
    let want = five.fires_in(from, to, 100);
    assert_eq!(want.len(), 52);
    assert_eq!(six.fires_in(from, to, 100), want);
    assert_eq!(seven.fires_in(from, to, 100), want);
    // 2025-01-06 is a Monday; 09:30 CET = 08:30Z.
    assert_eq!(iso(want[0]), "2025-01-06T08:30:00Z");
}

#[test]
fn cron_after_negative_and_huge_instants() {
    let s = cron("0 0 0 1 1 *", "UTC", Gap::Shift, Repeat::Once);
    assert_eq!(s.next_after(-1_000_000_000_000), Some(0));
    assert_eq!(s.next_after(i64::MAX), None);
    assert_eq!(s.next_after(i64::MIN), Some(0));
    assert_eq!(s.next_after(ms("2099-01-01T00:00:00Z")), None);
}

// --- Interval, one-shot, bounds --------------------------------------------------------------

#[test]
fn interval_phase_anchor_past_and_future() {
    let s = interval(60_000, ms("2030-01-01T00:00:07Z"));
    assert_eq!(
        s.next_after(ms("2025-06-01T12:00:00Z")),
        Some(ms("2025-06-01T12:00:07Z"))
    );
    assert_eq!(
        s.next_after(ms("2025-06-01T12:00:07Z")),
        Some(ms("2025-06-01T12:01:07Z"))
    );
    let s = interval(1_500, -250);
    assert_eq!(s.fires_in(-3_000, 3_000, 10), [-1_750, -250, 1_250, 2_750]);
}

#[test]
fn interval_near_the_ends_of_time() {
    let s = interval(1_000, 0);
    assert_eq!(s.next_after(i64::MAX - 10), None);
    assert_eq!(s.next_after(i64::MIN), Some(-9_223_372_036_854_775_000));
    let s = interval(MAX_INTERVAL_MS, 5);
    assert_eq!(s.next_after(0), Some(5));
    assert_eq!(s.next_after(5), None);
    let longer = ScheduleSpec::Interval {
        every_ms: MAX_INTERVAL_MS + 1,
        anchor_ms: 5,
    };
    assert!(matches!(
        Schedule::from_spec("test", &longer),
        Err(ScheduleError::IntervalTooLong { .. })
    ));
}

#[test]
fn once_fires_once() {
    let s = once(5_000);
    assert_eq!(s.next_after(4_999), Some(5_000));
    assert_eq!(s.next_after(5_000), None);
    assert_eq!(s.fires_in(0, 10_000, 10), [5_000]);
}

#[test]
fn start_and_end_bound_every_kind() {
    let bound = |s: Schedule| s.with_bounds(Some(10_000), Some(20_000));
    let i = bound(interval(1_000, 0));
    assert_eq!(i.next_after(0), Some(10_000));
    assert_eq!(i.next_after(18_500), Some(19_000));
    assert_eq!(i.next_after(19_000), None);
    assert_eq!(i.fires_in(0, 100_000, 100).len(), 10);
    let o = bound(once(20_000));
    assert_eq!(o.next_after(0), None);
    let o = bound(once(9_999));
    assert_eq!(o.next_after(0), None);
    let c = cron("* * * * * *", "UTC", Gap::Shift, Repeat::Once)
        .with_bounds(Some(10_500), Some(13_000));
    assert_eq!(c.fires_in(0, 100_000, 100), [11_000, 12_000]);
}

#[test]
fn from_job_reads_bounds_and_policies_and_reports_errors() {
    let mut def = sample_job();
    def.schedule = ScheduleSpec::Cron {
        expr: "0 30 2 * * *".into(),
        zone: "Europe/Berlin".into(),
    };
    def.dst_gap = Gap::Skip;
    def.end_ms = Some(ms("2025-03-31T00:00:00Z"));
    let s = Schedule::from_job(&def).unwrap();
    assert_eq!(s.next_after(ms("2025-03-29T12:00:00Z")), None);

    def.schedule = ScheduleSpec::Cron {
        expr: "61 * * * * *".into(),
        zone: "UTC".into(),
    };
    assert_eq!(
        Schedule::from_job(&def).unwrap_err().to_string(),
        "invalid cron \"61 * * * * *\" for job \"billing-7\": second 61 out of range 0-59"
    );
    def.schedule = ScheduleSpec::Cron {
        expr: "* * * * *".into(),
        zone: "Mars/Olympus".into(),
    };
    assert_eq!(
        Schedule::from_job(&def).unwrap_err(),
        ScheduleError::UnknownZone {
            job: "billing-7".into(),
            zone: "Mars/Olympus".into()
        }
    );
    def.schedule = ScheduleSpec::Interval {
        every_ms: 999,
        anchor_ms: 0,
    };
    assert_eq!(
        Schedule::from_job(&def).unwrap_err().to_string(),
        "interval 999 ms for job \"billing-7\" is under the minimum of 1000 ms"
    );
}

fn sample_job() -> JobDefinition {
    use crate::model::job::*;
    JobDefinition {
        id: "billing-7".into(),
        tenant: "acme".into(),
        schedule: ScheduleSpec::Interval {
            every_ms: 60_000,
            anchor_ms: 0,
        },
        start_ms: None,
        end_ms: None,
        max_fires: None,
        jitter_ms: 0,
        dst_gap: DstGapPolicy::Shift,
        dst_repeat: DstRepeatPolicy::Once,
        misfire: MisfirePolicy::FireOnce,
        catch_up_window_ms: default_catch_up_window_ms(),
        overlap: OverlapPolicy::Allow,
        paused: false,
        handler: HandlerSpec {
            kind: HandlerKind::Kafka,
            target: "billing".into(),
            payload: b"{}".to_vec(),
            headers: Default::default(),
            method: None,
            args: Vec::new(),
        },
        timeout_ms: default_timeout_ms(),
        retry: RetryPolicy::default(),
        labels: Default::default(),
        revision: 1,
    }
}

// --- describe, jitter ------------------------------------------------------------------------

#[test]
fn describe_instant_in_zone_and_utc() {
    let s = cron("0 30 2 * * *", "Europe/Berlin", Gap::Shift, Repeat::Once);
    assert_eq!(
        s.describe_instant(ms("2025-10-26T00:30:00Z")),
        (
            "2025-10-26T00:30:00Z".to_string(),
            "2025-10-26T02:30:00+02:00".to_string()
        )
    );
    assert_eq!(
        s.describe_instant(ms("2025-10-26T01:30:00Z")).1,
        "2025-10-26T02:30:00+01:00"
    );
    let s = cron("0 0 9 * * *", "Asia/Kolkata", Gap::Shift, Repeat::Once);
    assert_eq!(
        s.describe_instant(ms("2025-01-01T03:30:00Z")).1,
        "2025-01-01T09:00:00+05:30"
    );
    let i = interval(1_000, 0);
    assert_eq!(
        i.describe_instant(1_500),
        (
            "1970-01-01T00:00:01.500Z".to_string(),
            "1970-01-01T00:00:01.500Z".to_string()
        )
    );
    assert_eq!(i.describe_instant(i64::MAX).0, format!("{} ms", i64::MAX));
}

#[test]
fn jitter_is_stable_and_bounded() {
    assert_eq!(jitter_ms("job", 1_000, 0), 0);
    assert_eq!(jitter_ms("job", 1_000, 1), 0);
    let a = jitter_ms("job", 1_000, 60_000);
    assert_eq!(a, Schedule::jitter_ms("job", 1_000, 60_000));
    // Pinned: nodes of different versions must agree on a run's delay.
    let mut bytes = b"job".to_vec();
    bytes.extend_from_slice(&1_000i64.to_le_bytes());
    assert_eq!(a, xxhash_rust::xxh3::xxh3_64(&bytes) % 60_000);
    // Spread: different instants do not all land on the same delay.
    let distinct: std::collections::BTreeSet<u64> = (0..100)
        .map(|i| jitter_ms("job", i * 60_000, 60_000))
        .collect();
    assert!(distinct.len() > 90);
}

// --- Misfire ---------------------------------------------------------------------------------

#[test]
fn misfire_fire_once_takes_latest() {
    let s = interval(60_000, 0);
    let m = resolve_misfire(
        &s,
        MisfirePolicy::FireOnce,
        3_600_000,
        60_000,
        10 * 60_000 + 5,
        100,
    );
    assert_eq!(
        m,
        Misfire {
            fire: vec![600_000],
            next_ms: Some(660_000),
            missed: 9
        }
    );
}

#[test]
fn misfire_fire_once_ignores_window_for_recurring() {
    let s = interval(60_000, 0);
    let day = 86_400_000;
    let m = resolve_misfire(&s, MisfirePolicy::FireOnce, 60_000, 0, day, 100);
    assert_eq!(m.fire, [day]);
    assert_eq!(m.missed, 1440);
}

#[test]
fn misfire_fire_all_bounded_by_window_and_limit() {
    let s = interval(60_000, 0);
    // Due at 0, now 10 min: the window of 3 min reaches back to 7 min.
    let m = resolve_misfire(&s, MisfirePolicy::FireAll, 180_000, 0, 600_000, 100);
    assert_eq!(m.fire, [420_000, 480_000, 540_000, 600_000]);
    assert_eq!(m.missed, 7);
    assert_eq!(m.next_ms, Some(660_000));
    // A limit of 2 keeps the most recent two.
    let m = resolve_misfire(&s, MisfirePolicy::FireAll, 180_000, 0, 600_000, 2);
    assert_eq!(m.fire, [540_000, 600_000]);
    assert_eq!(m.missed, 9);
}

#[test]
fn misfire_skip_fires_nothing() {
    let s = interval(60_000, 0);
    let m = resolve_misfire(&s, MisfirePolicy::Skip, 3_600_000, 60_000, 600_000, 100);
    assert_eq!(
        m,
        Misfire {
            fire: vec![],
            next_ms: Some(660_000),
            missed: 10
        }
    );
}

#[test]
fn misfire_cron_across_dst() {
    // Hourly in Berlin, down from 23:00Z to 03:30Z across the fall-back (Twice): local 01:00,
    // 02:00 (CEST), 02:00 again (CET), 03:00 and 04:00 are one hour apart in UTC.
    let s = cron("0 0 * * * *", "Europe/Berlin", Gap::Shift, Repeat::Twice);
    let due = ms("2025-10-25T23:00:00Z");
    let now = ms("2025-10-26T03:30:00Z");
    let all = resolve_misfire(&s, MisfirePolicy::FireAll, 86_400_000, due, now, 100);
    assert_eq!(
        all.fire.iter().map(|t| iso(*t)).collect::<Vec<_>>(),
        [
            "2025-10-25T23:00:00Z",
            "2025-10-26T00:00:00Z",
            "2025-10-26T01:00:00Z",
            "2025-10-26T02:00:00Z",
            "2025-10-26T03:00:00Z"
        ]
    );
    assert_eq!(all.missed, 0);
    assert_eq!(all.next_ms, Some(ms("2025-10-26T04:00:00Z")));
    let one = resolve_misfire(&s, MisfirePolicy::FireOnce, 86_400_000, due, now, 100);
    assert_eq!(one.fire, [ms("2025-10-26T03:00:00Z")]);
    assert_eq!(one.missed, 4);
}

#[test]
fn misfire_one_shot() {
    let hour = 3_600_000;
    let s = once(10 * hour);
    // Within the window: fires under FireOnce and FireAll, dropped under Skip.
    for (policy, fired) in [
        (MisfirePolicy::FireOnce, true),
        (MisfirePolicy::FireAll, true),
        (MisfirePolicy::Skip, false),
    ] {
        let m = resolve_misfire(&s, policy, hour as u64, 10 * hour, 10 * hour + 1_000, 10);
        assert_eq!(m.fire.is_empty(), !fired, "{policy:?}");
        assert_eq!(m.missed, u64::from(!fired));
        assert_eq!(m.next_ms, None);
    }
    // Older than the window: dropped always.
    for policy in [
        MisfirePolicy::FireOnce,
        MisfirePolicy::FireAll,
        MisfirePolicy::Skip,
    ] {
        let m = resolve_misfire(&s, policy, hour as u64, 10 * hour, 11 * hour + 1, 10);
        assert_eq!(m.fire, Vec::<i64>::new(), "{policy:?}");
        assert_eq!(m.missed, 1);
    }
}

#[test]
fn misfire_due_in_future_is_nothing() {
    let s = interval(60_000, 0);
    let m = resolve_misfire(&s, MisfirePolicy::FireAll, 1_000_000, 120_000, 60_000, 10);
    assert_eq!(m.fire, Vec::<i64>::new());
    assert_eq!(m.missed, 0);
    assert_eq!(m.next_ms, Some(120_000));
}

#[test]
fn misfire_missed_count_is_capped_for_dense_cron() {
    let s = cron("* * * * * *", "UTC", Gap::Shift, Repeat::Once);
    let m = resolve_misfire(&s, MisfirePolicy::Skip, 0, 0, 30 * 86_400_000, 10);
    assert_eq!(m.missed, MISSED_COUNT_CAP);
}

#[test]
fn last_in_finds_latest() {
    let s = cron("0 0 12 * * *", "Europe/Berlin", Gap::Shift, Repeat::Once);
    assert_eq!(
        s.last_in(ms("2025-01-01T00:00:00Z"), ms("2025-06-15T09:59:59Z")),
        Some(ms("2025-06-14T10:00:00Z"))
    );
    assert_eq!(
        s.last_in(ms("2025-06-14T10:00:01Z"), ms("2025-06-15T09:59:59Z")),
        None
    );
    assert_eq!(
        s.last_in(ms("2025-06-14T10:00:00Z"), ms("2025-06-14T10:00:00Z")),
        Some(ms("2025-06-14T10:00:00Z"))
    );
}

// --- Properties ------------------------------------------------------------------------------

const ZONES: [&str; 6] = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Apia",
    "UTC",
];

const EXPRS: [&str; 10] = [
    "0 */5 * * * *",
    "*/7 * * * * *",
    "0 30 1,2 * * *",
    "0 0 2 * * *",
    "0 15 0-3 ? * MON-FRI",
    "0 0 12 L * *",
    "0 0 9 15W * *",
    "0 0 0 ? * FRI#2",
    "0 45 1 * * 0",
    "0 0 0 29 2 *",
];

fn any_policy() -> impl Strategy<Value = (Gap, Repeat)> {
    (any::<bool>(), any::<bool>()).prop_map(|(g, r)| {
        (
            if g { Gap::Shift } else { Gap::Skip },
            if r { Repeat::Once } else { Repeat::Twice },
        )
    })
}

fn any_cron() -> impl Strategy<Value = Schedule> {
    (0..EXPRS.len(), 0..ZONES.len(), any_policy())
        .prop_map(|(e, z, (gap, repeat))| cron(EXPRS[e], ZONES[z], gap, repeat))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn next_after_is_strictly_later(
        s in any_cron(),
        t in ms("1990-01-01T00:00:00Z")..ms("2060-01-01T00:00:00Z"),
    ) {
        if let Some(n) = s.next_after(t) {
            prop_assert!(n > t);
            prop_assert_eq!(n % 1000, 0);
        }
    }

    #[test]
    fn successive_fires_increase_and_match_fires_in(
        s in any_cron(),
        t in ms("1990-01-01T00:00:00Z")..ms("2060-01-01T00:00:00Z"),
        span in 1i64..(40 * 86_400_000),
    ) {
        let mut iterated = Vec::new();
        let mut cursor = t;
        while iterated.len() < 200 {
            match s.next_after(cursor) {
                Some(n) if n <= t + span => {
                    prop_assert!(n > cursor);
                    iterated.push(n);
                    cursor = n;
                }
                _ => break,
            }
        }
        prop_assert_eq!(s.fires_in(t, t + span, 200), iterated);
    }

    #[test]
    fn around_transitions_fires_increase(
        s in any_cron(),
        offset in -3 * 3_600_000i64..3 * 3_600_000,
        which in 0usize..4,
    ) {
        let centre = [
            "2025-03-30T01:00:00Z",
            "2025-10-26T01:00:00Z",
            "2025-10-04T15:30:00Z",
            "2011-12-30T10:00:00Z",
        ][which];
        let t = ms(centre) + offset;
        let got = s.fires_in(t, t + 6 * 3_600_000, 10_000);
        for pair in got.windows(2) {
            prop_assert!(pair[0] < pair[1]);
        }
        if let Some(first) = got.first() {
            prop_assert!(*first > t);
        }
    }

    #[test]
    fn interval_instants_are_on_the_anchor_grid(
        every in 1_000u64..10_000_000_000,
        anchor in -(1i64 << 45)..(1i64 << 45),
        t in -(1i64 << 45)..(1i64 << 45),
    ) {
        let s = interval(every, anchor);
        let n = s.next_after(t).unwrap();
        prop_assert!(n > t);
        prop_assert!(n - (every as i64) <= t);
        prop_assert_eq!((i128::from(n) - i128::from(anchor)) % i128::from(every), 0);
        prop_assert_eq!(s.fires_in(t, t + 10 * every as i64, 100).len(), 10);
        prop_assert_eq!(s.count_in(t + 1, t + 10 * every as i64, u64::MAX), 10);
    }

    #[test]
    fn jitter_is_below_window_and_deterministic(
        id in "[a-z0-9-]{0,40}",
        at in any::<i64>(),
        window in 0u64..1_000_000_000,
    ) {
        let j = jitter_ms(&id, at, window);
        prop_assert_eq!(j, jitter_ms(&id, at, window));
        prop_assert!(j < window.max(1));
    }

    #[test]
    fn misfire_fires_are_missed_instants(
        every in 1_000u64..3_600_000,
        due_k in 0i64..50,
        down in 0i64..100_000_000,
        window in 0u64..100_000_000,
        limit in 0usize..20,
        policy in prop_oneof![
            Just(MisfirePolicy::FireOnce),
            Just(MisfirePolicy::FireAll),
            Just(MisfirePolicy::Skip)
        ],
    ) {
        let s = interval(every, 0);
        let due = due_k * every as i64;
        let now = due + down;
        let m = resolve_misfire(&s, policy, window, due, now, limit);
        let missed = s.fires_in(due - 1, now, usize::MAX);
        prop_assert!(m.fire.len() <= limit);
        for pair in m.fire.windows(2) {
            prop_assert!(pair[0] < pair[1]);
        }
        for t in &m.fire {
            prop_assert!(missed.contains(t));
        }
        prop_assert_eq!(m.fire.len() as u64 + m.missed, missed.len() as u64);
        prop_assert_eq!(m.next_ms, s.next_after(now));
        if policy == MisfirePolicy::FireAll {
            let in_window = missed.iter().filter(|t| **t >= now - window as i64).count();
            prop_assert_eq!(m.fire.len(), in_window.min(limit));
        }
    }
}

/// The first instant after `t` (seconds) at which the offset changes, within a year.
fn next_transition(zone: Tz, t: i64) -> Option<i64> {
    let at_t = offset_at(zone, t)?;
    let mut hi = t;
    while offset_at(zone, hi)? == at_t {
        hi += 3_600;
        if hi - t > 400 * 86_400 {
            return None;
        }
    }
    let mut lo = hi - 3_600;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset_at(zone, mid)? == offset_at(zone, lo)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

const ORACLE_ZONES: [&str; 12] = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "America/Sao_Paulo", // transitions at midnight
    "America/Havana",    // transitions at midnight
    "Africa/Casablanca", // negative DST around Ramadan
    "Europe/Dublin",     // negative DST in the tz data
    "Antarctica/Troll",  // a two-hour shift
    "America/Santiago",
    "Asia/Tehran",
    "Australia/Adelaide",
];

const ORACLE_EXPRS: [&str; 7] = [
    "0 */15 * * * *",
    "0 0 * * * *",
    "0 30 0-3 * * *",
    "0 0 0 * * *",
    "0 59 23 * * *",
    "0 0,30 1,2 * * *",
    "0 10 * * * 0,6",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Around a transition found at random in 1975..2045, `fires_in` equals the oracle.
    #[test]
    fn oracle_agrees_around_random_transitions(
        z in 0..ORACLE_ZONES.len(),
        e in 0..ORACLE_EXPRS.len(),
        t in ms("1975-01-01T00:00:00Z") / 1000..ms("2045-01-01T00:00:00Z") / 1000,
    ) {
        let zone = tz(ORACLE_ZONES[z]);
        let Some(transition) = next_transition(zone, t) else {
            return Ok(());
        };
        let (from, to) = (transition - 3 * 3_600, transition + 3 * 3_600);
        check_against_oracle(ORACLE_EXPRS[e], ORACLE_ZONES[z], &iso(from * 1000), &iso(to * 1000), 60);
    }
}
