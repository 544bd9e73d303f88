//! Job definitions and schedules from arbitrary bytes: the cron parser, time zone names,
//! `validate`, and the schedule math of every definition it accepts.
//!
//! The first byte picks the input's form:
//! - 0: text, `expr\nzone\nafter_ms` (the lines after the first may be missing): the cron
//!   parser, then the schedule in that zone;
//! - 1: a JSON job definition, as `tocsin jobs put --file` reads it, then `validate`;
//! - otherwise: a definition built by `arbitrary` from the rest (its cron expression from a
//!   grammar of cron items), then `validate` under limits that are also built from the bytes.
//!
//! Nothing may panic, and the answers must agree with each other: a parsed cron expression
//! parses again from its own text to the same expression, `next_local` returns a matching time
//! no earlier than asked, and `next_after` is the successor function of one set of instants
//! (strictly increasing, inside the bounds, and the same answer from anywhere before it).

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use chrono::{DateTime, NaiveDateTime};
use libfuzzer_sys::fuzz_target;
use tocsin::codec::{decode, encode, Framing};
use tocsin::model::job::{
    DstGapPolicy, DstRepeatPolicy, HandlerKind, HandlerSpec, JobDefinition, MisfirePolicy,
    OverlapPolicy, RetryPolicy, ScheduleSpec,
};
use tocsin::model::schedule::{resolve_misfire, CronExpr, Schedule, Tz};
use tocsin::model::validate::{validate, Limits, RECORD_HEADROOM_BYTES};

/// 2026-01-01T00:00:00Z: instants are mostly near it, where the zones' rules are interesting.
const BASE_MS: i64 = 1_767_225_600_000;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => cron_text(rest),
        1 => json_definition(rest),
        _ => structured(rest),
    }
});

fn cron_text(rest: &[u8]) {
    let text = String::from_utf8_lossy(rest);
    let mut lines = text.split('\n');
    let expr = lines.next().unwrap_or("");
    let zone = lines.next().unwrap_or("UTC");
    let after = lines
        .next()
        .and_then(|l| l.trim().parse::<i64>().ok())
        .unwrap_or(BASE_MS);
    let _ = zone.parse::<Tz>();
    if let Ok(cron) = CronExpr::parse(expr) {
        check_cron(&cron, after);
    }
    let spec = ScheduleSpec::Cron {
        expr: expr.into(),
        zone: zone.into(),
    };
    if let Ok(schedule) = Schedule::from_spec("fuzz", &spec) {
        for (gap, repeat) in [
            (DstGapPolicy::Shift, DstRepeatPolicy::Once),
            (DstGapPolicy::Skip, DstRepeatPolicy::Twice),
        ] {
            check_schedule(&schedule.clone().with_dst(gap, repeat), after);
        }
    }
}

fn json_definition(rest: &[u8]) {
    if let Ok(def) = serde_json::from_slice::<JobDefinition>(rest) {
        check_definition(&def, &Limits::default(), BASE_MS);
    }
}

fn structured(rest: &[u8]) {
    let mut u = Unstructured::new(rest);
    let Ok(input) = Input::arbitrary(&mut u) else {
        return;
    };
    let (def, limits, now) = input.build();
    check_definition(&def, &limits, now);
}

fn check_cron(cron: &CronExpr, after_ms: i64) {
    let again = CronExpr::parse(cron.as_str())
        .unwrap_or_else(|e| panic!("{:?} parsed, its text does not: {e}", cron.as_str()));
    assert_eq!(&again, cron, "reparse of {:?}", cron.as_str());
    let Some(from) = DateTime::from_timestamp_millis(after_ms).map(|t| t.naive_utc()) else {
        return;
    };
    let mut from: NaiveDateTime = from;
    for _ in 0..3 {
        let Some(next) = cron.next_local(from) else {
            break;
        };
        assert!(next >= from, "{cron}: next_local({from}) = {next}");
        assert!(
            cron.matches(&next),
            "{cron}: next_local({from}) = {next} does not match"
        );
        let Some(later) = next.checked_add_signed(chrono::Duration::seconds(1)) else {
            break;
        };
        from = later;
    }
}

fn check_definition(def: &JobDefinition, limits: &Limits, now: i64) {
    let Ok(schedule) = validate(def, limits, now) else {
        return;
    };
    // The scheduler reads the definition back from Avro and validates it again: it must be
    // accepted with the same schedule. (Avro writes a `u64` above `i64::MAX` as `i64::MAX`, so
    // the definitions themselves may differ there; the bytes must not, once read back.)
    let bytes = encode(def, &Framing::SingleObject);
    let back: JobDefinition =
        decode(&bytes).unwrap_or_else(|e| panic!("accepted {} does not decode: {e}", short(def)));
    assert_eq!(
        encode(&back, &Framing::SingleObject),
        bytes,
        "Avro of {}",
        short(def)
    );
    match validate(&back, limits, now) {
        Ok(again) => assert_eq!(
            again,
            schedule,
            "schedule read back from Avro, {}",
            short(def)
        ),
        Err(e) => panic!("accepted {}, read back from Avro refused: {e}", short(def)),
    }
    // `jobs get` prints JSON, which `jobs put --file` reads.
    let json = serde_json::to_string(def).expect("a definition serializes");
    let back: JobDefinition = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("JSON of accepted {} does not read back: {e}", short(def)));
    assert_eq!(&back, def, "JSON round trip");

    check_schedule(&schedule, now);
    let due = now.saturating_sub(600_000);
    let m = resolve_misfire(&schedule, def.misfire, def.catch_up_window_ms, due, now, 8);
    assert!(m.fire.len() <= 8, "{m:?}");
    assert!(m.fire.windows(2).all(|w| w[0] < w[1]), "{m:?}");
    assert!(m.fire.iter().all(|t| (due..=now).contains(t)), "{m:?}");
    assert!(m.next_ms.is_none_or(|t| t > now), "{m:?}");
    let _ = schedule.describe_instant(now);
    let _ = Schedule::jitter_ms(&def.id, now, def.jitter_ms);
}

/// The definition for a message, its payload only counted.
fn short(def: &JobDefinition) -> String {
    let mut d = def.clone();
    d.handler.payload = format!("<{} bytes>", def.handler.payload.len()).into_bytes();
    format!("{d:?}")
}

/// `next_after` is the successor function of one set of instants, inside the bounds.
fn check_schedule(s: &Schedule, after_ms: i64) {
    let mut a = after_ms;
    for _ in 0..4 {
        let Some(t) = s.next_after(a) else {
            break;
        };
        assert!(t > a, "next_after({a}) = {t} of {s:?}");
        assert!(s.start_ms().is_none_or(|start| t >= start), "{t} of {s:?}");
        assert!(s.end_ms().is_none_or(|end| t < end), "{t} of {s:?}");
        if s.zone().is_some() {
            assert_eq!(t.rem_euclid(1000), 0, "cron instant {t} of {s:?}");
        }
        let mid = (i128::from(a) + (i128::from(t) - i128::from(a)) / 2) as i64;
        for x in [t - 1, mid] {
            assert_eq!(
                s.next_after(x),
                Some(t),
                "next_after({x}) after {a} of {s:?}"
            );
        }
        a = t;
    }
    let from = after_ms.saturating_sub(3_600_000);
    if let Some(last) = s.last_in(from, after_ms) {
        assert!(
            (from..=after_ms).contains(&last),
            "last_in = {last} of {s:?}"
        );
        assert_eq!(
            s.next_after(last - 1),
            Some(last),
            "last_in = {last} of {s:?}"
        );
        assert!(
            s.next_after(last).is_none_or(|t| t > after_ms),
            "last_in = {last} is not the last of {s:?}"
        );
    }
    if let Some(before) = from.checked_sub(1) {
        let n = s.count_in(from, after_ms, 64);
        let listed = s.fires_in(before, after_ms, 64).len() as u64;
        assert_eq!(n, listed, "count_in against fires_in of {s:?}");
    }
}

// ---- definitions from arbitrary bytes ----

#[derive(Arbitrary, Debug)]
struct Input {
    id: Text,
    tenant: Text,
    schedule: Sched,
    start: Option<Instant>,
    end: Option<Instant>,
    max_fires: Option<u64>,
    jitter_ms: u64,
    gap_skip: bool,
    repeat_twice: bool,
    misfire: u8,
    catch_up_window_ms: Option<u64>,
    overlap: u8,
    paused: bool,
    kind: u8,
    target: Text,
    payload: Payload,
    headers: Vec<(String, String)>,
    method: Option<String>,
    args: Vec<String>,
    timeout_ms: Option<u64>,
    retry: Option<(u32, u64, u64)>,
    labels: Vec<(String, String)>,
    revision: u64,
    limits: Option<LimitsIn>,
    now: Instant,
}

/// Mostly names of the shapes validation expects, sometimes anything.
#[derive(Arbitrary, Debug)]
enum Text {
    Word(u8),
    Dotted(u8, u8),
    Long(u16),
    Any(String),
}

impl Text {
    fn build(&self, word: &str) -> String {
        match self {
            Text::Word(n) => format!("{word}-{n}"),
            Text::Dotted(a, b) => format!("{word}{a}.{b}_x"),
            Text::Long(n) => "a".repeat(usize::from(*n) % 300),
            Text::Any(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Instant {
    /// Seconds from BASE_MS: about 68 years either way.
    Near(i32),
    Exact(i64),
}

impl Instant {
    fn ms(&self) -> i64 {
        match self {
            Instant::Near(s) => BASE_MS + i64::from(*s) * 1000,
            Instant::Exact(ms) => *ms,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Sched {
    Cron { expr: Box<CronGen>, zone: Zone },
    CronText { expr: String, zone: Zone },
    Interval { every_ms: u64, anchor: Instant },
    Once { at: Instant },
}

#[derive(Arbitrary, Debug)]
enum Zone {
    Known(u16),
    Any(String),
}

impl Zone {
    fn build(&self) -> String {
        match self {
            Zone::Known(i) => {
                let zones = &chrono_tz::TZ_VARIANTS;
                zones[usize::from(*i) % zones.len()].name().to_string()
            }
            Zone::Any(s) => s.clone(),
        }
    }
}

/// A cron expression from its grammar: 5 fields, or 6 with seconds, or 7 with a year.
#[derive(Arbitrary, Debug)]
struct CronGen {
    second: Option<FieldGen>,
    minute: FieldGen,
    hour: FieldGen,
    dom: FieldGen,
    month: FieldGen,
    dow: FieldGen,
    year: Option<FieldGen>,
}

impl CronGen {
    fn build(&self) -> String {
        let year = |f: &FieldGen| f.build(1960);
        let mut fields = Vec::new();
        if self.second.is_some() || self.year.is_some() {
            fields.push(self.second.as_ref().map_or("0".into(), |f| f.build(0)));
        }
        fields.push(self.minute.build(0));
        fields.push(self.hour.build(0));
        fields.push(self.dom.build(0));
        fields.push(self.month.build(0));
        fields.push(self.dow.build(0));
        if let Some(y) = &self.year {
            fields.push(year(y));
        }
        fields.join(" ")
    }
}

#[derive(Arbitrary, Debug)]
struct FieldGen(Item, Vec<Item>);

impl FieldGen {
    fn build(&self, base: u32) -> String {
        std::iter::once(&self.0)
            .chain(self.1.iter().take(3))
            .map(|i| i.build(base))
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[derive(Arbitrary, Debug)]
enum Item {
    Star,
    Question,
    Value(u8),
    Range(u8, u8),
    StarStep(u8),
    ValueStep(u8, u8),
    RangeStep(u8, u8, u8),
    Month(u8),
    Day(u8),
    DayRange(u8, u8),
    Last,
    LastMinus(u8),
    LastWeekday,
    Nearest(u8),
    LastOf(u8),
    LastOfName(u8),
    Nth(u8, u8),
    NthName(u8, u8),
    Any(String),
}

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "sat"];

impl Item {
    /// Plain numbers are 0-63, or from `base` on for years (1960-2215), so that they land in
    /// the field's range and just outside it.
    fn build(&self, base: u32) -> String {
        let n = |v: &u8| {
            if base > 0 {
                base + u32::from(*v)
            } else {
                u32::from(*v) % 64
            }
        };
        let step = |v: &u8| u32::from(*v) % 70;
        let month = |v: &u8| MONTHS[usize::from(*v) % 12];
        let day = |v: &u8| DAYS[usize::from(*v) % 7];
        match self {
            Item::Star => "*".into(),
            Item::Question => "?".into(),
            Item::Value(v) => n(v).to_string(),
            Item::Range(a, b) => format!("{}-{}", n(a), n(b)),
            Item::StarStep(s) => format!("*/{}", step(s)),
            Item::ValueStep(v, s) => format!("{}/{}", n(v), step(s)),
            Item::RangeStep(a, b, s) => format!("{}-{}/{}", n(a), n(b), step(s)),
            Item::Month(v) => month(v).into(),
            Item::Day(v) => day(v).into(),
            Item::DayRange(a, b) => format!("{}-{}", day(a), day(b)),
            Item::Last => "L".into(),
            Item::LastMinus(v) => format!("L-{}", v % 40),
            Item::LastWeekday => "LW".into(),
            Item::Nearest(v) => format!("{}W", v % 40),
            Item::LastOf(v) => format!("{}L", v % 9),
            Item::LastOfName(v) => format!("{}L", day(v)),
            Item::Nth(v, k) => format!("{}#{}", v % 9, k % 7),
            Item::NthName(v, k) => format!("{}#{}", day(v), k % 7),
            Item::Any(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Payload {
    Bytes(Vec<u8>),
    /// Up to 8 KiB: around the limits `LimitsIn` makes. (Reaching the default ones takes a
    /// megabyte per input, and every byte costs: encoding, JSON and the fuzzer's tracing.)
    Sized(u16),
}

/// Limits scaled down, so that small inputs reach them: up to 8 KiB of payload, and records up
/// to 8 KiB over the headroom kept in each.
#[derive(Arbitrary, Debug)]
struct LimitsIn {
    max_payload_bytes: u16,
    record_bytes_over_headroom: u16,
    topic_prefix: Option<String>,
    tenant_prefixed_targets: bool,
}

impl Input {
    fn build(&self) -> (JobDefinition, Limits, i64) {
        let schedule = match &self.schedule {
            Sched::Cron { expr, zone } => ScheduleSpec::Cron {
                expr: expr.build(),
                zone: zone.build(),
            },
            Sched::CronText { expr, zone } => ScheduleSpec::Cron {
                expr: expr.clone(),
                zone: zone.build(),
            },
            Sched::Interval { every_ms, anchor } => ScheduleSpec::Interval {
                every_ms: *every_ms,
                anchor_ms: anchor.ms(),
            },
            Sched::Once { at } => ScheduleSpec::Once { at_ms: at.ms() },
        };
        let kind = match self.kind % 4 {
            0 => HandlerKind::Kafka,
            1 => HandlerKind::Http,
            2 => HandlerKind::Exec,
            _ => HandlerKind::Custom,
        };
        let payload = match &self.payload {
            Payload::Bytes(b) => b.clone(),
            Payload::Sized(n) => vec![b'x'; usize::from(*n) % 8192],
        };
        let handler = HandlerSpec {
            kind,
            target: self.target.build("topic"),
            payload,
            headers: self.headers.iter().cloned().collect(),
            method: self.method.clone(),
            args: self.args.clone(),
        };
        let mut def = JobDefinition::new(
            &self.id.build("job"),
            &self.tenant.build("acme"),
            schedule,
            handler,
        );
        def.start_ms = self.start.as_ref().map(Instant::ms);
        def.end_ms = self.end.as_ref().map(Instant::ms);
        def.max_fires = self.max_fires;
        def.jitter_ms = self.jitter_ms;
        if self.gap_skip {
            def.dst_gap = DstGapPolicy::Skip;
        }
        if self.repeat_twice {
            def.dst_repeat = DstRepeatPolicy::Twice;
        }
        def.misfire = match self.misfire % 3 {
            0 => MisfirePolicy::FireOnce,
            1 => MisfirePolicy::FireAll,
            _ => MisfirePolicy::Skip,
        };
        if let Some(w) = self.catch_up_window_ms {
            def.catch_up_window_ms = w;
        }
        def.overlap = match self.overlap % 3 {
            0 => OverlapPolicy::Allow,
            1 => OverlapPolicy::Skip,
            _ => OverlapPolicy::BufferOne,
        };
        def.paused = self.paused;
        if let Some(t) = self.timeout_ms {
            def.timeout_ms = t;
        }
        if let Some((max_attempts, backoff_base_ms, backoff_cap_ms)) = self.retry {
            def.retry = RetryPolicy {
                max_attempts,
                backoff_base_ms,
                backoff_cap_ms,
            };
        }
        def.labels = self.labels.iter().cloned().collect();
        def.revision = self.revision;
        let limits = match &self.limits {
            None => Limits::default(),
            Some(l) => Limits {
                max_payload_bytes: usize::from(l.max_payload_bytes) % 8192,
                max_record_bytes: RECORD_HEADROOM_BYTES
                    + usize::from(l.record_bytes_over_headroom) % 8192,
                topic_prefix: l.topic_prefix.clone().unwrap_or_else(|| "tocsin.".into()),
                tenant_prefixed_targets: l.tenant_prefixed_targets,
            },
        };
        (def, limits, self.now.ms())
    }
}
