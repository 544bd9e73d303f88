//! Run history: what Tocsin writes on `runs` and `dead` for the sinks that keep it, in the
//! format each topic's `topics.serialization` names, and the reading of either format back
//! (`tocsin runs`).
//!
//! With `connect_json`, each `runs` record is a whole row of the run as its reporter knows it
//! (a [`RunRow`]: every instant so far, status, attempt, scheduler node and worker), so a sink
//! that upserts by run id (`docker/connect/`) holds the latest state of each run in one row.
//! With `avro`, each record is the transition itself ([`RunEvent`], `schemas/RunEvent.avsc`).
//!
//! Pure: no I/O. Must never: write a row whose fields another reporter must fill in later (an
//! upsert replaces every column, so each row carries all its reporter knows).

use serde::{Deserialize, Serialize};

use crate::codec::connect::{self, ConnectError, Field, FieldType};
use crate::codec::{self, CodecError, Framing};
use crate::config::Serialization;
use crate::model::records::{DeadLetter, RunEvent, RunEventKind};

/// The lane record's header naming the scheduler node that fired the run, so the worker's
/// rows can say it too.
pub const NODE_HEADER: &str = "tocsin-node";

/// The lane record's header with the instant before which a worker must not start the run
/// (milliseconds since the epoch): the run's fire time, later than the record's commit when
/// the scheduler fired it ahead (`scheduler.lookahead_ms`). Absent on records of older nodes:
/// they may start at once.
pub const NOT_BEFORE_HEADER: &str = "tocsin-not-before-ms";

/// The lane record's header with the job's overlap policy when it fired (`allow`, `skip`,
/// `buffer_one`). Only a run fired under `skip` or `buffer_one` is waited for by its
/// scheduler, so a worker reports the completion on `control` for those alone; a record
/// without it (an older node's) is reported as before.
pub const OVERLAP_HEADER: &str = "tocsin-overlap";

/// The consumer group of the history sink that `scripts/connect` runs for `topic_prefix`:
/// Connect names a sink's group `connect-<connector name>`, and the script names the connector
/// `tocsin-runs-<prefix>`, each character outside `[A-Za-z0-9_-]` written `_` (an empty prefix
/// as the default one, `tocsin.`).
pub fn sink_group(topic_prefix: &str) -> String {
    let prefix = if topic_prefix.is_empty() {
        "tocsin."
    } else {
        topic_prefix
    };
    let slug: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("connect-tocsin-runs-{slug}")
}

/// Who reports an event: the scheduler node that fired the run, or the worker running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporter {
    Scheduler,
    Worker,
}

/// What the reporter of an event knows of the run besides the event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// When the scheduler fired this attempt.
    pub fired_ms: Option<i64>,
    /// The scheduler node that fired it (a worker reads it from the lane record).
    pub fired_by: Option<String>,
    /// When the worker started this attempt.
    pub started_ms: Option<i64>,
}

/// A run as the history table holds it: one row per run id, the latest report winning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRow {
    pub run_id: String,
    pub job_id: String,
    pub tenant: String,
    /// `fired`, `running`, `succeeded`, `failed`, `retrying`, `dead` or `skipped`.
    pub status: String,
    pub attempt: u32,
    pub scheduled_ms: i64,
    pub fired_ms: Option<i64>,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    /// The scheduler node that fired the attempt.
    pub node: Option<String>,
    /// The worker that ran it.
    pub worker: Option<String>,
    /// The error of the attempt, when it failed.
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    /// When this report was made.
    pub updated_ms: i64,
}

/// The status a row shows after an event of `kind`.
pub fn status(kind: RunEventKind) -> &'static str {
    match kind {
        RunEventKind::Fired => "fired",
        RunEventKind::Started | RunEventKind::Heartbeat => "running",
        RunEventKind::Succeeded => "succeeded",
        RunEventKind::Failed => "failed",
        RunEventKind::Retrying => "retrying",
        RunEventKind::Dead => "dead",
        RunEventKind::Skipped => "skipped",
    }
}

fn ends_attempt(kind: RunEventKind) -> bool {
    matches!(
        kind,
        RunEventKind::Succeeded
            | RunEventKind::Failed
            | RunEventKind::Retrying
            | RunEventKind::Dead
            | RunEventKind::Skipped
    )
}

/// The row of the run after `event`, reported by `by`, which knows `known`.
pub fn row(event: &RunEvent, by: Reporter, known: &Known) -> RunRow {
    let (node, worker) = match by {
        Reporter::Scheduler => (Some(event.node.clone()), None),
        Reporter::Worker => (known.fired_by.clone(), Some(event.node.clone())),
    };
    let fired_ms = match event.kind {
        RunEventKind::Fired => Some(event.at_ms),
        _ => known.fired_ms,
    };
    let started_ms = match event.kind {
        RunEventKind::Started => Some(event.at_ms),
        _ => known.started_ms,
    };
    RunRow {
        run_id: event.run_id.clone(),
        job_id: event.job_id.clone(),
        tenant: event.tenant.clone(),
        status: status(event.kind).to_owned(),
        attempt: event.attempt,
        scheduled_ms: event.scheduled_ms,
        fired_ms,
        started_ms,
        finished_ms: ends_attempt(event.kind).then_some(event.at_ms),
        node,
        worker,
        error: event.error.clone(),
        duration_ms: event.duration_ms.map(clamp),
        updated_ms: event.at_ms,
    }
}

/// Connect's `int64` holds what a `u64` of ours can reach only up to `i64::MAX`.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The Connect schema name of a run row.
pub const RUN_ROW: &str = "io.tocsin.RunRow";

/// The columns of `tocsin_runs`, in order.
pub const RUN_ROW_FIELDS: [Field; 14] = [
    Field::required("run_id", FieldType::String),
    Field::required("job_id", FieldType::String),
    Field::required("tenant", FieldType::String),
    Field::required("status", FieldType::String),
    Field::required("attempt", FieldType::Int32),
    Field::required("scheduled_at", FieldType::Timestamp),
    Field::optional("fired_at", FieldType::Timestamp),
    Field::optional("started_at", FieldType::Timestamp),
    Field::optional("finished_at", FieldType::Timestamp),
    Field::optional("node", FieldType::String),
    Field::optional("worker", FieldType::String),
    Field::optional("error", FieldType::String),
    Field::optional("duration_ms", FieldType::Int64),
    Field::required("updated_at", FieldType::Timestamp),
];

/// Connect JSON of a run row.
pub fn row_envelope(r: &RunRow) -> Vec<u8> {
    connect::envelope(
        RUN_ROW,
        &RUN_ROW_FIELDS,
        vec![
            r.run_id.as_str().into(),
            r.job_id.as_str().into(),
            r.tenant.as_str().into(),
            r.status.as_str().into(),
            i64::from(r.attempt).into(),
            r.scheduled_ms.into(),
            r.fired_ms.into(),
            r.started_ms.into(),
            r.finished_ms.into(),
            r.node.as_deref().into(),
            r.worker.as_deref().into(),
            r.error.as_deref().into(),
            r.duration_ms.into(),
            r.updated_ms.into(),
        ],
    )
}

/// The value of the `runs` record for `event`, in `format`.
pub fn encode_event(
    format: Serialization,
    event: &RunEvent,
    by: Reporter,
    known: &Known,
) -> Vec<u8> {
    match format {
        Serialization::Avro => codec::encode(event, &Framing::SingleObject),
        Serialization::ConnectJson => row_envelope(&row(event, by, known)),
    }
}

/// Why a history record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Avro(#[from] CodecError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
}

/// A `runs` record of either format, as a row. An Avro event says who reported it only by its
/// kind: `fired` and `skipped` come from a scheduler node, the others from a worker.
pub fn decode_row(bytes: &[u8]) -> Result<RunRow, HistoryError> {
    if bytes.first() == Some(&b'{') {
        return Ok(row_from_payload(&connect::payload(
            RUN_ROW,
            &RUN_ROW_FIELDS,
            bytes,
        )?));
    }
    let event: RunEvent = codec::decode(bytes)?;
    let by = match event.kind {
        RunEventKind::Fired | RunEventKind::Skipped => Reporter::Scheduler,
        _ => Reporter::Worker,
    };
    Ok(row(&event, by, &Known::default()))
}

/// A payload checked by [`connect::payload`] against [`RUN_ROW_FIELDS`].
fn row_from_payload(p: &serde_json::Map<String, serde_json::Value>) -> RunRow {
    let s = |k: &str| p.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let n = |k: &str| p.get(k).and_then(|v| v.as_i64());
    RunRow {
        run_id: s("run_id").unwrap_or_default(),
        job_id: s("job_id").unwrap_or_default(),
        tenant: s("tenant").unwrap_or_default(),
        status: s("status").unwrap_or_default(),
        attempt: n("attempt")
            .and_then(|a| u32::try_from(a).ok())
            .unwrap_or(0),
        scheduled_ms: n("scheduled_at").unwrap_or(0),
        fired_ms: n("fired_at"),
        started_ms: n("started_at"),
        finished_ms: n("finished_at"),
        node: s("node"),
        worker: s("worker"),
        error: s("error"),
        duration_ms: n("duration_ms"),
        updated_ms: n("updated_at").unwrap_or(0),
    }
}

/// The Connect schema name of a dead letter.
pub const DEAD_ROW: &str = "io.tocsin.DeadRow";

/// The fields of a dead letter as Connect JSON.
pub const DEAD_ROW_FIELDS: [Field; 10] = [
    Field::required("run_id", FieldType::String),
    Field::required("job_id", FieldType::String),
    Field::required("tenant", FieldType::String),
    Field::required("attempts", FieldType::Int32),
    Field::required("scheduled_at", FieldType::Timestamp),
    Field::required("fired_at", FieldType::Timestamp),
    Field::required("dead_at", FieldType::Timestamp),
    Field::required("handler", FieldType::String),
    Field::required("target", FieldType::String),
    Field::required("error", FieldType::String),
];

/// The value of the `dead` record for `dead`, in `format`. Connect JSON keeps what an operator
/// looks a dead run up by; the whole run (payload, headers, retry policy) is in the Avro form.
pub fn encode_dead(format: Serialization, dead: &DeadLetter) -> Vec<u8> {
    match format {
        Serialization::Avro => codec::encode(dead, &Framing::SingleObject),
        Serialization::ConnectJson => connect::envelope(
            DEAD_ROW,
            &DEAD_ROW_FIELDS,
            vec![
                dead.run.run_id.as_str().into(),
                dead.run.job_id.as_str().into(),
                dead.run.tenant.as_str().into(),
                i64::from(dead.attempts).into(),
                dead.run.scheduled_ms.into(),
                dead.run.fire_ms.into(),
                dead.at_ms.into(),
                dead.run.handler.kind.name().into(),
                dead.run.handler.target.as_str().into(),
                dead.error.as_str().into(),
            ],
        ),
    }
}

#[cfg(test)]
mod tests;
