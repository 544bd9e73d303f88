//! Next-fire computations per second: the scheduler's hot path when it re-arms jobs.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tocsin::model::job::{DstGapPolicy, DstRepeatPolicy, ScheduleSpec};
use tocsin::model::schedule::{resolve_misfire, Schedule};

/// 2025-10-25T22:00:00Z: the day of Berlin's fall-back (01:00Z on the 26th).
const BEFORE_FALL_BACK_MS: i64 = 1_761_429_600_000;
/// 2025-03-29T22:00:00Z: the day of Berlin's spring-forward (01:00Z on the 30th).
const BEFORE_SPRING_FORWARD_MS: i64 = 1_743_285_600_000;
/// Fires per iteration: one day of a 5-minute schedule.
const STEPS: u64 = 288;

fn berlin(expr: &str, repeat: DstRepeatPolicy) -> Schedule {
    Schedule::from_spec(
        "bench",
        &ScheduleSpec::Cron {
            expr: expr.into(),
            zone: "Europe/Berlin".into(),
        },
    )
    .expect("valid cron")
    .with_dst(DstGapPolicy::Shift, repeat)
}

fn walk(schedule: &Schedule, from_ms: i64) -> i64 {
    let mut t = from_ms;
    for _ in 0..STEPS {
        t = schedule.next_after(black_box(t)).expect("a next fire");
    }
    t
}

fn next_after(c: &mut Criterion) {
    let mut group = c.benchmark_group("next_after");
    group.throughput(Throughput::Elements(STEPS));

    let every_5_min = berlin("0 */5 * * * *", DstRepeatPolicy::Once);
    group.bench_function("cron_berlin_fall_back_once", |b| {
        b.iter(|| walk(&every_5_min, BEFORE_FALL_BACK_MS))
    });
    let twice = berlin("0 */5 * * * *", DstRepeatPolicy::Twice);
    group.bench_function("cron_berlin_fall_back_twice", |b| {
        b.iter(|| walk(&twice, BEFORE_FALL_BACK_MS))
    });
    group.bench_function("cron_berlin_spring_forward", |b| {
        b.iter(|| walk(&every_5_min, BEFORE_SPRING_FORWARD_MS))
    });
    let weekdays = berlin("0 30 9 ? * MON-FRI", DstRepeatPolicy::Once);
    group.bench_function("cron_berlin_weekdays_0930", |b| {
        b.iter(|| walk(&weekdays, BEFORE_FALL_BACK_MS))
    });

    let interval = Schedule::from_spec(
        "bench",
        &ScheduleSpec::Interval {
            every_ms: 300_000,
            anchor_ms: 7_000,
        },
    )
    .expect("valid interval");
    group.bench_function("interval_5_min", |b| {
        b.iter(|| walk(&interval, BEFORE_FALL_BACK_MS))
    });
    group.finish();
}

fn misfire(c: &mut Criterion) {
    let every_5_min = berlin("0 */5 * * * *", DstRepeatPolicy::Once);
    // A day of downtime: find the latest missed instant and count the rest.
    c.bench_function("resolve_misfire_fire_once_cron_1_day", |b| {
        b.iter(|| {
            resolve_misfire(
                &every_5_min,
                tocsin::model::job::MisfirePolicy::FireOnce,
                3_600_000,
                black_box(BEFORE_FALL_BACK_MS),
                BEFORE_FALL_BACK_MS + 86_400_000,
                100,
            )
        })
    });
}

criterion_group!(benches, next_after, misfire);
criterion_main!(benches);
