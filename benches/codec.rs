//! Encode and decode throughput of the records on the hot paths: a typical `JobDefinition`
//! (ingest), a `TimerState` (written and read on every fire), and a `Run` (every fire).

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tocsin::codec::{decode, encode, encode_into, AvroRecord, Framing};
use tocsin::model::job::{DstGapPolicy, DstRepeatPolicy};
use tocsin::model::job::{
    HandlerKind, HandlerSpec, JobDefinition, MisfirePolicy, OverlapPolicy, RetryPolicy,
    ScheduleSpec,
};
use tocsin::model::records::{run_id, FireReason, InFlight, Run, TimerState};

const T0: i64 = 1_767_225_600_000;

fn job() -> JobDefinition {
    JobDefinition {
        id: "tenant-17/job-004211".into(),
        tenant: "tenant-17".into(),
        schedule: ScheduleSpec::Cron {
            expr: "0 */5 * * * *".into(),
            zone: "Europe/Paris".into(),
        },
        start_ms: None,
        end_ms: None,
        max_fires: None,
        jitter_ms: 5_000,
        dst_gap: DstGapPolicy::Shift,
        dst_repeat: DstRepeatPolicy::Once,
        misfire: MisfirePolicy::FireOnce,
        catch_up_window_ms: 3_600_000,
        overlap: OverlapPolicy::Skip,
        paused: false,
        handler: HandlerSpec {
            kind: HandlerKind::Kafka,
            target: "tenant-17.events".into(),
            payload: br#"{"type":"reminder","user":"u-88123","template":"weekly-digest"}"#.to_vec(),
            headers: [("content-type", "application/json"), ("source", "tocsin")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            method: None,
            args: vec![],
        },
        timeout_ms: 300_000,
        retry: RetryPolicy::default(),
        labels: [("team", "growth"), ("env", "prod")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        revision: 3,
    }
}

fn timer() -> TimerState {
    TimerState {
        definition: job(),
        next_fire_ms: Some(T0 + 300_000),
        fires: 1_234,
        last_scheduled_ms: Some(T0),
        in_flight: Some(InFlight {
            run_id: run_id("tenant-17/job-004211", T0),
            scheduled_ms: T0,
        }),
        buffered_ms: None,
        pending: vec![],
    }
}

fn run() -> Run {
    let j = job();
    Run {
        run_id: run_id(&j.id, T0),
        job_id: j.id,
        tenant: j.tenant,
        scheduled_ms: T0,
        fire_ms: T0 + 3,
        attempt: 1,
        reason: FireReason::Schedule,
        handler: j.handler,
        timeout_ms: j.timeout_ms,
        retry: j.retry,
        labels: j.labels,
    }
}

fn bench_record<T: AvroRecord>(c: &mut Criterion, name: &str, v: &T) {
    let framing = Framing::SingleObject;
    let bytes = encode(v, &framing);
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(1));
    let mut buf = Vec::with_capacity(1024);
    g.bench_function("encode", |b| {
        b.iter(|| {
            buf.clear();
            encode_into(black_box(v), &framing, &mut buf);
            black_box(buf.len())
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| decode::<T>(black_box(&bytes)).expect("decodes"))
    });
    g.finish();
}

fn codec(c: &mut Criterion) {
    bench_record(c, "job_definition", &job());
    bench_record(c, "timer_state", &timer());
    bench_record(c, "run", &run());
}

criterion_group!(benches, codec);
criterion_main!(benches);
