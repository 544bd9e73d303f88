//! Sample records shared by `tests/codec_fixtures.rs` (the values its committed fixtures were
//! written from) and `tests/avro_interop.rs` (the values stock Avro libraries must read and
//! write as Tocsin does). Literals only: a sample never changes once a fixture depends on it.
#![allow(dead_code)]

use std::collections::BTreeMap;

use tocsin::model::job::{
    DstGapPolicy, DstRepeatPolicy, HandlerKind, HandlerSpec, JobDefinition, MisfirePolicy,
    OverlapPolicy, RetryPolicy, ScheduleSpec,
};
use tocsin::model::records::{
    run_id, ControlRecord, DeadLetter, FireReason, InFlight, Outcome, PendingFire, Run, RunEvent,
    RunEventKind, TimerState,
};

pub const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn sample_job() -> JobDefinition {
    JobDefinition {
        id: "billing-7".into(),
        tenant: "acme".into(),
        schedule: ScheduleSpec::Cron {
            expr: "0 30 9 * * MON-FRI".into(),
            zone: "Europe/Paris".into(),
        },
        start_ms: Some(T0),
        end_ms: Some(T0 + 86_400_000 * 365),
        max_fires: Some(1_000),
        jitter_ms: 15_000,
        dst_gap: DstGapPolicy::Skip,
        dst_repeat: DstRepeatPolicy::Twice,
        misfire: MisfirePolicy::FireAll,
        catch_up_window_ms: 7_200_000,
        overlap: OverlapPolicy::BufferOne,
        paused: true,
        handler: HandlerSpec {
            kind: HandlerKind::Http,
            target: "https://billing.internal/run".into(),
            payload: b"{\"invoice\":\"monthly\"}".to_vec(),
            headers: map(&[("content-type", "application/json"), ("x-team", "billing")]),
            method: Some("POST".into()),
            args: vec![],
        },
        timeout_ms: 120_000,
        retry: RetryPolicy {
            max_attempts: 5,
            backoff_base_ms: 2_000,
            backoff_cap_ms: 120_000,
        },
        labels: map(&[("env", "prod"), ("owner", "billing")]),
        revision: 42,
    }
}

pub fn sample_timer() -> TimerState {
    TimerState {
        definition: JobDefinition {
            id: "reports-1".into(),
            tenant: "globex".into(),
            schedule: ScheduleSpec::Interval {
                every_ms: 60_000,
                anchor_ms: -1_000,
            },
            start_ms: None,
            end_ms: None,
            max_fires: None,
            jitter_ms: 0,
            dst_gap: DstGapPolicy::Shift,
            dst_repeat: DstRepeatPolicy::Once,
            misfire: MisfirePolicy::FireOnce,
            catch_up_window_ms: 3_600_000,
            overlap: OverlapPolicy::Allow,
            paused: false,
            handler: HandlerSpec {
                kind: HandlerKind::Exec,
                target: "/usr/bin/report".into(),
                payload: vec![0, 159, 146, 150],
                headers: BTreeMap::new(),
                method: None,
                args: vec!["--daily".into(), "--format=csv".into()],
            },
            timeout_ms: 300_000,
            retry: RetryPolicy::default(),
            labels: BTreeMap::new(),
            revision: 0,
        },
        next_fire_ms: Some(T0 + 60_000),
        fires: 17,
        last_scheduled_ms: Some(T0),
        in_flight: Some(InFlight {
            run_id: run_id("reports-1", T0),
            scheduled_ms: T0,
        }),
        buffered_ms: None,
        pending: vec![
            PendingFire {
                scheduled_ms: T0 - 60_000,
                attempt: 2,
                not_before_ms: T0 + 4_000,
                reason: FireReason::Retry,
            },
            PendingFire {
                scheduled_ms: T0 + 5,
                attempt: 1,
                not_before_ms: T0 + 5,
                reason: FireReason::Manual,
            },
        ],
    }
}

pub fn sample_run() -> Run {
    Run {
        run_id: run_id("billing-7", T0),
        job_id: "billing-7".into(),
        tenant: "acme".into(),
        scheduled_ms: T0,
        fire_ms: T0 + 12,
        attempt: 1,
        reason: FireReason::CatchUp,
        handler: HandlerSpec {
            kind: HandlerKind::Kafka,
            target: "acme.invoices".into(),
            payload: b"hello".to_vec(),
            headers: map(&[("trace", "abc")]),
            method: None,
            args: vec![],
        },
        timeout_ms: 30_000,
        retry: RetryPolicy::default(),
        labels: map(&[("env", "prod")]),
    }
}

pub fn sample_controls() -> [(&'static str, ControlRecord); 4] {
    [
        (
            "control_retry.bin",
            ControlRecord::Retry {
                run_id: run_id("billing-7", T0),
                scheduled_ms: T0,
                attempt: 2,
                not_before_ms: T0 + 2_000,
                error: "http 503 from https://billing.internal/run".into(),
            },
        ),
        (
            "control_completion.bin",
            ControlRecord::Completion {
                run_id: run_id("billing-7", T0),
                scheduled_ms: T0,
                attempt: 3,
                outcome: Outcome::Dead,
            },
        ),
        (
            "control_trigger.bin",
            ControlRecord::Trigger {
                requested_ms: T0 + 777,
            },
        ),
        (
            "control_backfill.bin",
            ControlRecord::Backfill {
                from_ms: T0 - 86_400_000,
                to_ms: T0,
            },
        ),
    ]
}

pub fn sample_event() -> RunEvent {
    RunEvent {
        run_id: run_id("billing-7", T0),
        job_id: "billing-7".into(),
        tenant: "acme".into(),
        scheduled_ms: T0,
        attempt: 2,
        kind: RunEventKind::Failed,
        at_ms: T0 + 3_500,
        node: "worker-3".into(),
        error: Some("exit status 2".into()),
        duration_ms: Some(3_488),
    }
}

pub fn sample_dead() -> DeadLetter {
    DeadLetter {
        run: sample_run(),
        error: "timed out after 30000 ms".into(),
        attempts: 3,
        at_ms: T0 + 90_000,
    }
}

/// A job with the third schedule kind and every optional field empty (those and the policies
/// it does not set are the timer's job's).
pub fn sample_once_job() -> JobDefinition {
    JobDefinition {
        id: "once-1".into(),
        tenant: "initech".into(),
        schedule: ScheduleSpec::Once { at_ms: T0 + 42 },
        misfire: MisfirePolicy::Skip,
        catch_up_window_ms: 0,
        overlap: OverlapPolicy::Skip,
        handler: HandlerSpec {
            kind: HandlerKind::Custom,
            target: "noop".into(),
            payload: vec![],
            headers: BTreeMap::new(),
            method: None,
            args: vec![],
        },
        timeout_ms: 1,
        retry: RetryPolicy {
            max_attempts: 1,
            backoff_base_ms: 0,
            backoff_cap_ms: 0,
        },
        revision: 1,
        ..sample_timer().definition
    }
}

/// A run event with its optional fields empty.
pub fn sample_fired_event() -> RunEvent {
    RunEvent {
        run_id: run_id("once-1", T0 + 42),
        job_id: "once-1".into(),
        tenant: "initech".into(),
        scheduled_ms: T0 + 42,
        attempt: 1,
        kind: RunEventKind::Fired,
        at_ms: T0 + 50,
        node: "node-0".into(),
        error: None,
        duration_ms: None,
    }
}
