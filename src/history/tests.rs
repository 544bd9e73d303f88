use serde_json::Value;

use super::*;
use crate::codec::connect::TIMESTAMP;
use crate::model::job::{HandlerKind, HandlerSpec, RetryPolicy};
use crate::model::records::{FireReason, Run};

fn event(kind: RunEventKind, at_ms: i64, node: &str, error: Option<&str>) -> RunEvent {
    RunEvent {
        run_id: "0af3".into(),
        job_id: "billing-7".into(),
        tenant: "acme".into(),
        scheduled_ms: 1_700_000_000_000,
        attempt: 2,
        kind,
        at_ms,
        node: node.into(),
        error: error.map(str::to_owned),
        duration_ms: Some(250),
    }
}

fn worker_knows() -> Known {
    Known {
        fired_ms: Some(1_700_000_000_010),
        fired_by: Some("node-1".into()),
        started_ms: Some(1_700_000_000_020),
    }
}

#[test]
fn a_worker_s_row_carries_what_the_scheduler_reported_too() {
    let e = event(RunEventKind::Succeeded, 1_700_000_000_300, "w1", None);
    let r = row(&e, Reporter::Worker, &worker_knows());
    assert_eq!(r.status, "succeeded");
    assert_eq!(r.attempt, 2);
    assert_eq!(r.fired_ms, Some(1_700_000_000_010));
    assert_eq!(r.started_ms, Some(1_700_000_000_020));
    assert_eq!(r.finished_ms, Some(1_700_000_000_300));
    assert_eq!(r.node.as_deref(), Some("node-1"));
    assert_eq!(r.worker.as_deref(), Some("w1"));
    assert_eq!(r.duration_ms, Some(250));
    assert_eq!(r.updated_ms, 1_700_000_000_300);

    let started = row(
        &event(RunEventKind::Started, 1_700_000_000_020, "w1", None),
        Reporter::Worker,
        &Known {
            started_ms: None,
            ..worker_knows()
        },
    );
    assert_eq!(
        (
            started.status.as_str(),
            started.started_ms,
            started.finished_ms
        ),
        ("running", Some(1_700_000_000_020), None)
    );
}

#[test]
fn a_scheduler_s_fired_row_names_the_node_and_no_worker() {
    let e = event(RunEventKind::Fired, 1_700_000_000_010, "node-1", None);
    let r = row(&e, Reporter::Scheduler, &Known::default());
    assert_eq!(r.status, "fired");
    assert_eq!(r.fired_ms, Some(1_700_000_000_010));
    assert_eq!((r.started_ms, r.finished_ms), (None, None));
    assert_eq!((r.node.as_deref(), r.worker), (Some("node-1"), None));
}

#[test]
fn the_runs_envelope_is_a_flat_connect_struct_with_timestamps() {
    let e = event(
        RunEventKind::Dead,
        1_700_000_000_300,
        "w1",
        Some("HTTP 500"),
    );
    let bytes = encode_event(
        Serialization::ConnectJson,
        &e,
        Reporter::Worker,
        &worker_knows(),
    );
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    let schema = &doc["schema"];
    assert_eq!(schema["type"], "struct");
    assert_eq!(schema["name"], RUN_ROW);
    let fields = schema["fields"].as_array().unwrap();
    let names: Vec<&str> = fields
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "run_id",
            "job_id",
            "tenant",
            "status",
            "attempt",
            "scheduled_at",
            "fired_at",
            "started_at",
            "finished_at",
            "node",
            "worker",
            "error",
            "duration_ms",
            "updated_at"
        ]
    );
    for f in fields {
        assert_ne!(f["type"], "struct", "nested field {f}");
        let name = f["field"].as_str().unwrap();
        if name.ends_with("_at") {
            assert_eq!(f["type"], "int64", "{f}");
            assert_eq!(f["name"], TIMESTAMP, "{f}");
            assert_eq!(f["version"], 1, "{f}");
        }
        let optional = !matches!(
            name,
            "run_id" | "job_id" | "tenant" | "status" | "attempt" | "scheduled_at" | "updated_at"
        );
        assert_eq!(f["optional"], optional, "{f}");
    }
    let p = &doc["payload"];
    assert_eq!(p["run_id"], "0af3");
    assert_eq!(p["status"], "dead");
    assert_eq!(p["attempt"], 2);
    assert_eq!(p["scheduled_at"], 1_700_000_000_000i64);
    assert_eq!(p["fired_at"], 1_700_000_000_010i64);
    assert_eq!(p["error"], "HTTP 500");
    assert_eq!(p["node"], "node-1");
    assert_eq!(p["worker"], "w1");
}

#[test]
fn both_formats_read_back_as_rows() {
    let e = event(
        RunEventKind::Failed,
        1_700_000_000_300,
        "w1",
        Some("exit 3"),
    );
    let json = encode_event(
        Serialization::ConnectJson,
        &e,
        Reporter::Worker,
        &worker_knows(),
    );
    assert_eq!(
        decode_row(&json).unwrap(),
        row(&e, Reporter::Worker, &worker_knows())
    );
    let avro = encode_event(Serialization::Avro, &e, Reporter::Worker, &worker_knows());
    assert_eq!(avro, codec::encode(&e, &Framing::SingleObject));
    let r = decode_row(&avro).unwrap();
    assert_eq!(
        (r.status.as_str(), r.worker.as_deref()),
        ("failed", Some("w1"))
    );
    assert_eq!(r.error.as_deref(), Some("exit 3"));
    // What a reporter does not know, Avro does not carry.
    assert_eq!((r.fired_ms, r.node), (None, None));
}

#[test]
fn a_foreign_runs_record_is_refused_with_the_reason() {
    let err = decode_row(br#"{"schema": {}, "payload": {"run_id": "x"}}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("field job_id: missing"), "{err}");
    let err = decode_row(b"\x01\x02").unwrap_err().to_string();
    assert!(err.contains("unknown framing"), "{err}");
}

#[test]
fn a_dead_letter_envelope_keeps_its_error_and_instants() {
    let dead = DeadLetter {
        run: Run {
            run_id: "0af3".into(),
            job_id: "billing-7".into(),
            tenant: "acme".into(),
            scheduled_ms: 1_700_000_000_000,
            fire_ms: 1_700_000_000_010,
            attempt: 3,
            reason: FireReason::Retry,
            handler: HandlerSpec {
                kind: HandlerKind::Http,
                target: "https://billing.internal/run".into(),
                payload: vec![],
                headers: Default::default(),
                method: None,
                args: vec![],
            },
            timeout_ms: 1_000,
            retry: RetryPolicy::default(),
            labels: Default::default(),
        },
        error: "HTTP 500".into(),
        attempts: 3,
        at_ms: 1_700_000_000_900,
    };
    let bytes = encode_dead(Serialization::ConnectJson, &dead);
    let p = connect::payload(DEAD_ROW, &DEAD_ROW_FIELDS, &bytes).unwrap();
    assert_eq!(p["error"], "HTTP 500");
    assert_eq!(p["attempts"], 3);
    assert_eq!(p["handler"], "http");
    assert_eq!(p["dead_at"], 1_700_000_000_900i64);
    assert_eq!(
        encode_dead(Serialization::Avro, &dead),
        codec::encode(&dead, &Framing::SingleObject)
    );
}

#[test]
fn the_sink_group_is_the_one_scripts_connect_names() {
    assert_eq!(
        sink_group("t123-history-42."),
        "connect-tocsin-runs-t123-history-42_"
    );
    assert_eq!(sink_group("a.b/c"), "connect-tocsin-runs-a_b_c");
    assert_eq!(sink_group(""), "connect-tocsin-runs-tocsin_");
}
