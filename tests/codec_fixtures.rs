//! Bytes written by an earlier build must stay readable: each fixture in `tests/fixtures/` was
//! encoded once and committed, and is decoded here with the current code and checked field by
//! field against literals. A schema change that cannot read old data fails here.
//!
//! To write the fixtures again (only when adding one; never to make a failing test pass):
//! `TOCSIN_WRITE_FIXTURES=1 cargo test --test codec_fixtures write_fixtures`.

mod samples;

use std::path::PathBuf;

use samples::*;
use tocsin::codec::{decode, encode, AvroRecord, Framing};
use tocsin::model::job::{
    DstGapPolicy, DstRepeatPolicy, HandlerKind, JobDefinition, MisfirePolicy, OverlapPolicy,
    ScheduleSpec,
};
use tocsin::model::records::{
    ControlRecord, DeadLetter, FireReason, Outcome, Run, RunEvent, RunEventKind, TimerState,
};

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read(name: &str) -> Vec<u8> {
    let path = fixture_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read fixture {}: {e}", path.display()))
}

// The values the fixtures were written from are in `samples/`.

const CONFLUENT_ID: u32 = 1234;

fn fixtures() -> Vec<(&'static str, Vec<u8>)> {
    let so = Framing::SingleObject;
    let mut out = vec![
        ("job_definition.bin", encode(&sample_job(), &so)),
        ("timer_state.bin", encode(&sample_timer(), &so)),
        ("run.bin", encode(&sample_run(), &so)),
        ("run_event.bin", encode(&sample_event(), &so)),
        (
            "run_event_confluent.bin",
            encode(
                &sample_event(),
                &Framing::Confluent {
                    schema_id: CONFLUENT_ID,
                },
            ),
        ),
        ("dead_letter.bin", encode(&sample_dead(), &so)),
    ];
    for (name, c) in sample_controls() {
        out.push((name, encode(&c, &so)));
    }
    out
}

#[test]
fn write_fixtures() {
    if std::env::var("TOCSIN_WRITE_FIXTURES").as_deref() != Ok("1") {
        return;
    }
    std::fs::create_dir_all(fixture_path("")).unwrap();
    for (name, bytes) in fixtures() {
        std::fs::write(fixture_path(name), bytes).unwrap();
    }
}

/// The fixture is single-object framed. Its fingerprint is not compared with the current
/// schema's: after a schema change, `decode` must still read it through the schema history.
fn assert_single_object(bytes: &[u8]) {
    assert_eq!(&bytes[..2], &[0xC3, 0x01]);
}

fn fingerprint_of(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[2..10].try_into().unwrap())
}

/// The fixtures were written before Tocsin computed the specification's fingerprints, with
/// apache_avro 0.22's (see `CompiledSchema::legacy_fingerprint`), and no schema has changed since:
/// so this checks that data of those builds is still read. (When a schema changes, its fixture's
/// fingerprint becomes a past version's: drop that record from this list.)
#[test]
fn the_fixtures_carry_the_legacy_fingerprint_the_current_code_no_longer_writes() {
    fn check<T: AvroRecord>(name: &str) {
        let bytes = read(name);
        let compiled = T::compiled();
        assert_eq!(
            fingerprint_of(&bytes),
            compiled.legacy_fingerprint(),
            "{name}"
        );
        assert_ne!(fingerprint_of(&bytes), compiled.fingerprint(), "{name}");
    }
    check::<JobDefinition>("job_definition.bin");
    check::<TimerState>("timer_state.bin");
    check::<Run>("run.bin");
    check::<RunEvent>("run_event.bin");
    check::<DeadLetter>("dead_letter.bin");
    for (name, _) in sample_controls() {
        check::<ControlRecord>(name);
    }
}

// ---------- the checks, field by field ----------

fn check_job(j: &JobDefinition) {
    assert_eq!(j.id, "billing-7");
    assert_eq!(j.tenant, "acme");
    assert_eq!(
        j.schedule,
        ScheduleSpec::Cron {
            expr: "0 30 9 * * MON-FRI".into(),
            zone: "Europe/Paris".into()
        }
    );
    assert_eq!(j.start_ms, Some(1_767_225_600_000));
    assert_eq!(j.end_ms, Some(1_798_761_600_000));
    assert_eq!(j.max_fires, Some(1_000));
    assert_eq!(j.jitter_ms, 15_000);
    assert_eq!(j.dst_gap, DstGapPolicy::Skip);
    assert_eq!(j.dst_repeat, DstRepeatPolicy::Twice);
    assert_eq!(j.misfire, MisfirePolicy::FireAll);
    assert_eq!(j.catch_up_window_ms, 7_200_000);
    assert_eq!(j.overlap, OverlapPolicy::BufferOne);
    assert!(j.paused);
    assert_eq!(j.handler.kind, HandlerKind::Http);
    assert_eq!(j.handler.target, "https://billing.internal/run");
    assert_eq!(j.handler.payload, b"{\"invoice\":\"monthly\"}");
    assert_eq!(
        j.handler.headers,
        map(&[("content-type", "application/json"), ("x-team", "billing")])
    );
    assert_eq!(j.handler.method.as_deref(), Some("POST"));
    assert!(j.handler.args.is_empty());
    assert_eq!(j.timeout_ms, 120_000);
    assert_eq!(j.retry.max_attempts, 5);
    assert_eq!(j.retry.backoff_base_ms, 2_000);
    assert_eq!(j.retry.backoff_cap_ms, 120_000);
    assert_eq!(j.labels, map(&[("env", "prod"), ("owner", "billing")]));
    assert_eq!(j.revision, 42);
}

fn check_run(r: &Run) {
    assert_eq!(r.run_id, "3a0658e19adb7ecc02be475aca68de59");
    assert_eq!(r.job_id, "billing-7");
    assert_eq!(r.tenant, "acme");
    assert_eq!(r.scheduled_ms, 1_767_225_600_000);
    assert_eq!(r.fire_ms, 1_767_225_600_012);
    assert_eq!(r.attempt, 1);
    assert_eq!(r.reason, FireReason::CatchUp);
    assert_eq!(r.handler.kind, HandlerKind::Kafka);
    assert_eq!(r.handler.target, "acme.invoices");
    assert_eq!(r.handler.payload, b"hello");
    assert_eq!(r.handler.headers, map(&[("trace", "abc")]));
    assert_eq!(r.handler.method, None);
    assert!(r.handler.args.is_empty());
    assert_eq!(r.timeout_ms, 30_000);
    assert_eq!(r.retry.max_attempts, 3);
    assert_eq!(r.retry.backoff_base_ms, 1_000);
    assert_eq!(r.retry.backoff_cap_ms, 60_000);
    assert_eq!(r.labels, map(&[("env", "prod")]));
}

fn check_event(e: &RunEvent) {
    assert_eq!(e.run_id, "3a0658e19adb7ecc02be475aca68de59");
    assert_eq!(e.job_id, "billing-7");
    assert_eq!(e.tenant, "acme");
    assert_eq!(e.scheduled_ms, 1_767_225_600_000);
    assert_eq!(e.attempt, 2);
    assert_eq!(e.kind, RunEventKind::Failed);
    assert_eq!(e.at_ms, 1_767_225_603_500);
    assert_eq!(e.node, "worker-3");
    assert_eq!(e.error.as_deref(), Some("exit status 2"));
    assert_eq!(e.duration_ms, Some(3_488));
}

#[test]
fn job_definition_fixture() {
    let bytes = read("job_definition.bin");
    assert_single_object(&bytes);
    check_job(&decode::<JobDefinition>(&bytes).unwrap());
}

#[test]
fn timer_state_fixture() {
    let bytes = read("timer_state.bin");
    assert_single_object(&bytes);
    let t: TimerState = decode(&bytes).unwrap();
    let j = &t.definition;
    assert_eq!(j.id, "reports-1");
    assert_eq!(j.tenant, "globex");
    assert_eq!(
        j.schedule,
        ScheduleSpec::Interval {
            every_ms: 60_000,
            anchor_ms: -1_000
        }
    );
    assert_eq!((j.start_ms, j.end_ms, j.max_fires), (None, None, None));
    assert_eq!(j.jitter_ms, 0);
    assert_eq!(j.dst_gap, DstGapPolicy::Shift);
    assert_eq!(j.dst_repeat, DstRepeatPolicy::Once);
    assert_eq!(j.misfire, MisfirePolicy::FireOnce);
    assert_eq!(j.catch_up_window_ms, 3_600_000);
    assert_eq!(j.overlap, OverlapPolicy::Allow);
    assert!(!j.paused);
    assert_eq!(j.handler.kind, HandlerKind::Exec);
    assert_eq!(j.handler.target, "/usr/bin/report");
    assert_eq!(j.handler.payload, vec![0, 159, 146, 150]);
    assert!(j.handler.headers.is_empty());
    assert_eq!(j.handler.method, None);
    assert_eq!(j.handler.args, vec!["--daily", "--format=csv"]);
    assert_eq!(j.timeout_ms, 300_000);
    assert_eq!(
        (
            j.retry.max_attempts,
            j.retry.backoff_base_ms,
            j.retry.backoff_cap_ms
        ),
        (3, 1_000, 60_000)
    );
    assert!(j.labels.is_empty());
    assert_eq!(j.revision, 0);

    assert_eq!(t.next_fire_ms, Some(1_767_225_660_000));
    assert_eq!(t.fires, 17);
    assert_eq!(t.last_scheduled_ms, Some(1_767_225_600_000));
    let f = t.in_flight.as_ref().unwrap();
    assert_eq!(f.run_id, "39c026e0756d912d0afb5cc00b69302c");
    assert_eq!(f.scheduled_ms, 1_767_225_600_000);
    assert_eq!(t.buffered_ms, None);
    assert_eq!(t.pending.len(), 2);
    assert_eq!(t.pending[0].scheduled_ms, 1_767_225_540_000);
    assert_eq!(t.pending[0].attempt, 2);
    assert_eq!(t.pending[0].not_before_ms, 1_767_225_604_000);
    assert_eq!(t.pending[0].reason, FireReason::Retry);
    assert_eq!(t.pending[1].scheduled_ms, 1_767_225_600_005);
    assert_eq!(t.pending[1].attempt, 1);
    assert_eq!(t.pending[1].not_before_ms, 1_767_225_600_005);
    assert_eq!(t.pending[1].reason, FireReason::Manual);
}

#[test]
fn run_fixture() {
    let bytes = read("run.bin");
    assert_single_object(&bytes);
    check_run(&decode::<Run>(&bytes).unwrap());
}

#[test]
fn control_record_fixtures() {
    let retry = read("control_retry.bin");
    assert_single_object(&retry);
    match decode::<ControlRecord>(&retry).unwrap() {
        ControlRecord::Retry {
            run_id,
            scheduled_ms,
            attempt,
            not_before_ms,
            error,
        } => {
            assert_eq!(run_id, "3a0658e19adb7ecc02be475aca68de59");
            assert_eq!(scheduled_ms, 1_767_225_600_000);
            assert_eq!(attempt, 2);
            assert_eq!(not_before_ms, 1_767_225_602_000);
            assert_eq!(error, "http 503 from https://billing.internal/run");
        }
        other => panic!("expected a retry, got {other:?}"),
    }
    match decode::<ControlRecord>(&read("control_completion.bin")).unwrap() {
        ControlRecord::Completion {
            run_id,
            scheduled_ms,
            attempt,
            outcome,
        } => {
            assert_eq!(run_id, "3a0658e19adb7ecc02be475aca68de59");
            assert_eq!(scheduled_ms, 1_767_225_600_000);
            assert_eq!(attempt, 3);
            assert_eq!(outcome, Outcome::Dead);
        }
        other => panic!("expected a completion, got {other:?}"),
    }
    assert_eq!(
        decode::<ControlRecord>(&read("control_trigger.bin")).unwrap(),
        ControlRecord::Trigger {
            requested_ms: 1_767_225_600_777
        }
    );
    assert_eq!(
        decode::<ControlRecord>(&read("control_backfill.bin")).unwrap(),
        ControlRecord::Backfill {
            from_ms: 1_767_139_200_000,
            to_ms: 1_767_225_600_000
        }
    );
}

#[test]
fn run_event_fixtures() {
    let bytes = read("run_event.bin");
    assert_single_object(&bytes);
    check_event(&decode::<RunEvent>(&bytes).unwrap());

    let confluent = read("run_event_confluent.bin");
    assert_eq!(confluent[0], 0);
    assert_eq!(
        u32::from_be_bytes(confluent[1..5].try_into().unwrap()),
        CONFLUENT_ID
    );
    check_event(&decode::<RunEvent>(&confluent).unwrap());
}

#[test]
fn dead_letter_fixture() {
    let bytes = read("dead_letter.bin");
    assert_single_object(&bytes);
    let d: DeadLetter = decode(&bytes).unwrap();
    check_run(&d.run);
    assert_eq!(d.error, "timed out after 30000 ms");
    assert_eq!(d.attempts, 3);
    assert_eq!(d.at_ms, 1_767_225_690_000);
}
