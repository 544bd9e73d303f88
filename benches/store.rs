//! Reading a firing chunk's timers from the store: one point read per due entry against one
//! batched read of the chunk (`Store::timers`), over a store of 300,000 timers in 1,024
//! partitions (a herd at the defaults), a chunk of 10,000 entries in the order a due scan
//! gives them (partition by partition).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tocsin::model::job::{HandlerKind, HandlerSpec, JobDefinition, ScheduleSpec};
use tocsin::model::records::TimerState;
use tocsin::scheduler::store::{encode_timer, Store};

const TIMERS: usize = 300_000;
const PARTITIONS: usize = 1_024;
const CHUNK: usize = 10_000;

fn timer(i: usize) -> TimerState {
    let handler = HandlerSpec {
        kind: HandlerKind::Custom,
        target: "loadtest".into(),
        payload: vec![b'x'; 100],
        headers: Default::default(),
        method: None,
        args: Vec::new(),
    };
    let at_ms = 1_767_225_600_000;
    let def = JobDefinition::new(
        &format!("lt-{i:07}"),
        &format!("tenant-{}", i % 4),
        ScheduleSpec::Once { at_ms },
        handler,
    );
    TimerState {
        definition: def,
        next_fire_ms: Some(at_ms),
        fires: 0,
        last_scheduled_ms: None,
        in_flight: None,
        buffered_ms: None,
        pending: Vec::new(),
    }
}

fn reads(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Default::default()).unwrap();
    for start in (0..TIMERS).step_by(10_000) {
        let mut b = store.batch();
        for i in start..(start + 10_000).min(TIMERS) {
            let t = timer(i);
            let p = (i % PARTITIONS) as u16;
            b.put_timer(&store, p, &t, &encode_timer(&t), 0, None, store.wake(&t));
        }
        store.write(b).unwrap();
    }
    // A chunk as a due scan yields it: partition by partition.
    let mut chunk: Vec<(u16, String)> = (0..CHUNK)
        .map(|n| n * (TIMERS / CHUNK))
        .map(|i| ((i % PARTITIONS) as u16, timer(i).definition.id))
        .collect();
    chunk.sort();
    let keys: Vec<(u16, &str)> = chunk.iter().map(|(p, j)| (*p, j.as_str())).collect();
    let mut g = c.benchmark_group("store_read_chunk");
    g.throughput(Throughput::Elements(CHUNK as u64));
    g.sample_size(20);
    g.bench_function("point_reads", |b| {
        b.iter(|| {
            for (p, job) in &keys {
                black_box(store.timer(*p, job).unwrap().expect("stored"));
            }
        })
    });
    g.bench_function("batched", |b| {
        b.iter(|| {
            for t in store.timers(&keys) {
                black_box(t.unwrap().expect("stored"));
            }
        })
    });
    g.finish();
}

criterion_group!(benches, reads);
criterion_main!(benches);
