//! The records one fire of a job writes: its `Run`, the headers its lane record carries (read
//! by workers and audits without decoding the value), and its run events. One builder, used by
//! the engine and by the load test's raw-produce baseline, so the baseline writes the bytes the
//! engine writes and the throughput ratio between them cannot drift.

use rdkafka::message::{Header, OwnedHeaders};

use crate::codec::{self, AvroEnum, Framing};
use crate::config::Serialization;
use crate::history::{self, Known, Reporter, NODE_HEADER, NOT_BEFORE_HEADER, OVERLAP_HEADER};
use crate::model::job::{JobDefinition, OverlapPolicy};
use crate::model::records::{run_id, FireReason, Run, RunEvent, RunEventKind};

/// One instant of a job to run.
#[derive(Debug, Clone, Copy)]
pub struct Instance {
    pub scheduled_ms: i64,
    pub attempt: u32,
    pub reason: FireReason,
}

/// Where and when a run was fired, and when it may start.
#[derive(Debug, Clone, Copy)]
pub struct Fired<'a> {
    pub fire_ms: i64,
    /// The instant before which the run must not start (`fire::Due::not_before_ms`).
    pub not_before_ms: i64,
    /// The `jobs` partition the job lives in.
    pub partition: i32,
    /// The firing node's assignment epoch (how many assignments it has seen).
    pub assignment_epoch: u64,
    pub node: &'a str,
}

/// The `Run` of `instance` of `def`, fired at `fire_ms`.
pub fn run(def: &JobDefinition, instance: Instance, fire_ms: i64) -> Run {
    Run {
        run_id: run_id(&def.id, instance.scheduled_ms),
        job_id: def.id.clone(),
        tenant: def.tenant.clone(),
        scheduled_ms: instance.scheduled_ms,
        fire_ms,
        attempt: instance.attempt,
        reason: instance.reason,
        handler: def.handler.clone(),
        timeout_ms: def.timeout_ms,
        retry: def.retry,
        labels: def.labels.clone(),
    }
}

/// The headers of a run's lane record, of a job whose overlap policy is `overlap`.
pub fn headers(run: &Run, overlap: OverlapPolicy, fired: &Fired<'_>) -> OwnedHeaders {
    OwnedHeaders::new_with_capacity(9)
        .insert(h("tocsin-run-id", run.run_id.as_bytes()))
        .insert(h(
            "tocsin-scheduled-ms",
            run.scheduled_ms.to_string().as_bytes(),
        ))
        .insert(h("tocsin-fire-ms", fired.fire_ms.to_string().as_bytes()))
        .insert(h("tocsin-attempt", run.attempt.to_string().as_bytes()))
        .insert(h(
            "tocsin-partition",
            fired.partition.to_string().as_bytes(),
        ))
        .insert(h(
            "tocsin-assignment-epoch",
            fired.assignment_epoch.to_string().as_bytes(),
        ))
        .insert(h(NODE_HEADER, fired.node.as_bytes()))
        .insert(h(
            NOT_BEFORE_HEADER,
            fired.not_before_ms.to_string().as_bytes(),
        ))
        .insert(h(OVERLAP_HEADER, overlap.symbol().as_bytes()))
}

/// The two records of a run fired into its lane: the `Run` itself (keyed by its job, with its
/// `headers`) and its `fired` event on `runs` (keyed by the run), encoded as `runs` is
/// (`events`).
pub struct LaneRecords {
    pub key: Vec<u8>,
    pub run: Vec<u8>,
    pub run_headers: OwnedHeaders,
    pub event_key: Vec<u8>,
    pub event: Vec<u8>,
}

/// The records of `instance` of `def`, fired as `fired` says.
pub fn lane_records(
    def: &JobDefinition,
    instance: Instance,
    fired: &Fired<'_>,
    events: Serialization,
) -> LaneRecords {
    let run = run(def, instance, fired.fire_ms);
    let event = event(
        def,
        instance.scheduled_ms,
        instance.attempt,
        RunEventKind::Fired,
        fired.fire_ms,
        fired.node,
    );
    LaneRecords {
        key: def.id.as_bytes().to_vec(),
        run: codec::encode(&run, &Framing::SingleObject),
        run_headers: headers(&run, def.overlap, fired),
        event: history::encode_event(events, &event, Reporter::Scheduler, &Known::default()),
        event_key: event.run_id.into_bytes(),
    }
}

/// An event of the run of `def` scheduled at `scheduled_ms`, happening at `at_ms` on `node`.
pub fn event(
    def: &JobDefinition,
    scheduled_ms: i64,
    attempt: u32,
    kind: RunEventKind,
    at_ms: i64,
    node: &str,
) -> RunEvent {
    RunEvent {
        run_id: run_id(&def.id, scheduled_ms),
        job_id: def.id.clone(),
        tenant: def.tenant.clone(),
        scheduled_ms,
        attempt,
        kind,
        at_ms,
        node: node.to_owned(),
        error: None,
        duration_ms: None,
    }
}

/// An event of `run`, happening at `at_ms` on `node`.
pub fn event_of(run: &Run, kind: RunEventKind, at_ms: i64, node: &str) -> RunEvent {
    RunEvent {
        run_id: run.run_id.clone(),
        job_id: run.job_id.clone(),
        tenant: run.tenant.clone(),
        scheduled_ms: run.scheduled_ms,
        attempt: run.attempt,
        kind,
        at_ms,
        node: node.to_owned(),
        error: None,
        duration_ms: None,
    }
}

pub(crate) fn h<'a>(key: &'a str, value: &'a [u8]) -> Header<'a, &'a [u8]> {
    Header {
        key,
        value: Some(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::ScheduleSpec;
    use rdkafka::message::Headers;

    #[test]
    fn a_lane_record_s_headers_name_its_run_and_where_it_was_fired() {
        let def = super::super::fire::tests::job(ScheduleSpec::Once { at_ms: 60_000 });
        let instance = Instance {
            scheduled_ms: 60_000,
            attempt: 2,
            reason: FireReason::Retry,
        };
        let run = run(&def, instance, 60_250);
        assert_eq!(run.run_id, run_id(&def.id, 60_000));
        assert_eq!((run.fire_ms, run.attempt), (60_250, 2));
        let fired = Fired {
            fire_ms: 60_250,
            not_before_ms: 61_000,
            partition: 7,
            assignment_epoch: 3,
            node: "n1",
        };
        let headers = headers(&run, OverlapPolicy::BufferOne, &fired);
        let got: Vec<(String, String)> = headers
            .iter()
            .map(|h| {
                let v = String::from_utf8(h.value.unwrap().to_vec()).unwrap();
                (h.key.to_owned(), v)
            })
            .collect();
        let want = [
            ("tocsin-run-id", run.run_id.as_str()),
            ("tocsin-scheduled-ms", "60000"),
            ("tocsin-fire-ms", "60250"),
            ("tocsin-attempt", "2"),
            ("tocsin-partition", "7"),
            ("tocsin-assignment-epoch", "3"),
            (NODE_HEADER, "n1"),
            (NOT_BEFORE_HEADER, "61000"),
            (OVERLAP_HEADER, "buffer_one"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
        let e = event(&def, 60_000, 2, RunEventKind::Fired, 60_250, "n1");
        assert_eq!((e.run_id.as_str(), e.at_ms), (run.run_id.as_str(), 60_250));
    }
}
