//! [`AvroRecord`] for every record type: field by field, in the order of `schemas/*.avsc`.

use apache_avro::types::Value;

use super::convert::{
    avro_enum, instant, long, optional, record, string, string_map, unsigned, AvroEnum, Fields,
};
use super::schema::{
    CompiledSchema, CONTROL_RECORD, DEAD_LETTER, JOB_DEFINITION, RUN, RUN_EVENT, TIMER_STATE,
};
use super::{AvroRecord, CodecError};
use crate::model::job::{
    DstGapPolicy, DstRepeatPolicy, HandlerKind, HandlerSpec, JobDefinition, MisfirePolicy,
    OverlapPolicy, RetryPolicy, ScheduleSpec,
};
use crate::model::records::{
    ControlRecord, DeadLetter, FireReason, InFlight, Outcome, PendingFire, Run, RunEvent,
    RunEventKind, TimerState,
};

avro_enum!(DstGapPolicy, "io.tocsin.DstGapPolicy", [Shift => "shift", Skip => "skip"]);
avro_enum!(DstRepeatPolicy, "io.tocsin.DstRepeatPolicy", [Once => "once", Twice => "twice"]);
avro_enum!(MisfirePolicy, "io.tocsin.MisfirePolicy", [
    FireOnce => "fire_once", FireAll => "fire_all", Skip => "skip",
]);
avro_enum!(OverlapPolicy, "io.tocsin.OverlapPolicy", [
    Allow => "allow", Skip => "skip", BufferOne => "buffer_one",
]);
avro_enum!(HandlerKind, "io.tocsin.HandlerKind", [
    Kafka => "kafka", Http => "http", Exec => "exec", Custom => "custom",
]);
avro_enum!(FireReason, "io.tocsin.FireReason", [
    Schedule => "schedule", Retry => "retry", Manual => "manual", Backfill => "backfill",
    CatchUp => "catch_up",
]);
avro_enum!(Outcome, "io.tocsin.Outcome", [
    Succeeded => "succeeded", Failed => "failed", Dead => "dead", Skipped => "skipped",
]);
avro_enum!(RunEventKind, "io.tocsin.RunEventKind", [
    Fired => "fired", Started => "started", Heartbeat => "heartbeat", Succeeded => "succeeded",
    Failed => "failed", Retrying => "retrying", Dead => "dead", Skipped => "skipped",
]);

// ---- shared parts ----

fn schedule_to_avro(s: &ScheduleSpec) -> Value {
    match s {
        ScheduleSpec::Cron { expr, zone } => Value::Union(
            0,
            Box::new(record([("expr", string(expr)), ("zone", string(zone))])),
        ),
        ScheduleSpec::Interval {
            every_ms,
            anchor_ms,
        } => Value::Union(
            1,
            Box::new(record([
                ("every_ms", unsigned(*every_ms)),
                ("anchor_ms", instant(*anchor_ms)),
            ])),
        ),
        ScheduleSpec::Once { at_ms } => {
            Value::Union(2, Box::new(record([("at_ms", instant(*at_ms))])))
        }
    }
}

fn schedule_from_avro(f: &mut Fields) -> Result<ScheduleSpec, CodecError> {
    let (branch, v) = f.union("schedule")?;
    Ok(match branch {
        0 => {
            let mut r = Fields::new("io.tocsin.CronSchedule", v)?;
            ScheduleSpec::Cron {
                expr: r.string("expr")?,
                zone: r.string("zone")?,
            }
        }
        1 => {
            let mut r = Fields::new("io.tocsin.IntervalSchedule", v)?;
            ScheduleSpec::Interval {
                every_ms: r.u64("every_ms")?,
                anchor_ms: r.long("anchor_ms")?,
            }
        }
        2 => {
            let mut r = Fields::new("io.tocsin.OnceSchedule", v)?;
            ScheduleSpec::Once {
                at_ms: r.long("at_ms")?,
            }
        }
        other => return Err(f.bad_branch("schedule", other)),
    })
}

fn handler_to_avro(h: &HandlerSpec) -> Value {
    record([
        ("kind", h.kind.to_avro()),
        ("target", string(&h.target)),
        ("payload", Value::Bytes(h.payload.clone())),
        ("headers", string_map(&h.headers)),
        ("method", optional(h.method.as_deref().map(string))),
        (
            "args",
            Value::Array(h.args.iter().map(|a| string(a)).collect()),
        ),
    ])
}

fn handler_from_avro(v: Value) -> Result<HandlerSpec, CodecError> {
    let mut r = Fields::new("io.tocsin.HandlerSpec", v)?;
    Ok(HandlerSpec {
        kind: r.enumeration("kind")?,
        target: r.string("target")?,
        payload: r.bytes("payload")?,
        headers: r.string_map("headers")?,
        method: r.opt_string("method")?,
        args: r.string_array("args")?,
    })
}

fn retry_to_avro(p: &RetryPolicy) -> Value {
    record([
        ("max_attempts", long(i64::from(p.max_attempts))),
        ("backoff_base_ms", unsigned(p.backoff_base_ms)),
        ("backoff_cap_ms", unsigned(p.backoff_cap_ms)),
    ])
}

fn retry_from_avro(v: Value) -> Result<RetryPolicy, CodecError> {
    let mut r = Fields::new("io.tocsin.RetryPolicy", v)?;
    Ok(RetryPolicy {
        max_attempts: r.u32("max_attempts")?,
        backoff_base_ms: r.u64("backoff_base_ms")?,
        backoff_cap_ms: r.u64("backoff_cap_ms")?,
    })
}

// ---- JobDefinition ----

impl AvroRecord for JobDefinition {
    fn compiled() -> &'static CompiledSchema {
        &JOB_DEFINITION
    }

    fn to_avro(&self) -> Value {
        record([
            ("id", string(&self.id)),
            ("tenant", string(&self.tenant)),
            ("schedule", schedule_to_avro(&self.schedule)),
            ("start_ms", optional(self.start_ms.map(instant))),
            ("end_ms", optional(self.end_ms.map(instant))),
            ("max_fires", optional(self.max_fires.map(unsigned))),
            ("jitter_ms", unsigned(self.jitter_ms)),
            ("dst_gap", self.dst_gap.to_avro()),
            ("dst_repeat", self.dst_repeat.to_avro()),
            ("misfire", self.misfire.to_avro()),
            ("catch_up_window_ms", unsigned(self.catch_up_window_ms)),
            ("overlap", self.overlap.to_avro()),
            ("paused", Value::Boolean(self.paused)),
            ("handler", handler_to_avro(&self.handler)),
            ("timeout_ms", unsigned(self.timeout_ms)),
            ("retry", retry_to_avro(&self.retry)),
            ("labels", string_map(&self.labels)),
            ("revision", unsigned(self.revision)),
        ])
    }

    fn from_avro(v: Value) -> Result<Self, CodecError> {
        let mut r = Fields::new(JOB_DEFINITION.name(), v)?;
        Ok(JobDefinition {
            id: r.string("id")?,
            tenant: r.string("tenant")?,
            schedule: schedule_from_avro(&mut r)?,
            start_ms: r.opt_long("start_ms")?,
            end_ms: r.opt_long("end_ms")?,
            max_fires: r.opt_u64("max_fires")?,
            jitter_ms: r.u64("jitter_ms")?,
            dst_gap: r.enumeration("dst_gap")?,
            dst_repeat: r.enumeration("dst_repeat")?,
            misfire: r.enumeration("misfire")?,
            catch_up_window_ms: r.u64("catch_up_window_ms")?,
            overlap: r.enumeration("overlap")?,
            paused: r.boolean("paused")?,
            handler: handler_from_avro(r.take("handler")?)?,
            timeout_ms: r.u64("timeout_ms")?,
            retry: retry_from_avro(r.take("retry")?)?,
            labels: r.string_map("labels")?,
            revision: r.u64("revision")?,
        })
    }
}

// ---- TimerState ----

impl AvroRecord for TimerState {
    fn compiled() -> &'static CompiledSchema {
        &TIMER_STATE
    }

    fn to_avro(&self) -> Value {
        record([
            ("definition", self.definition.to_avro()),
            ("next_fire_ms", optional(self.next_fire_ms.map(instant))),
            ("fires", unsigned(self.fires)),
            (
                "last_scheduled_ms",
                optional(self.last_scheduled_ms.map(instant)),
            ),
            (
                "in_flight",
                optional(self.in_flight.as_ref().map(|f| {
                    record([
                        ("run_id", string(&f.run_id)),
                        ("scheduled_ms", instant(f.scheduled_ms)),
                    ])
                })),
            ),
            ("buffered_ms", optional(self.buffered_ms.map(instant))),
            (
                "pending",
                Value::Array(
                    self.pending
                        .iter()
                        .map(|p| {
                            record([
                                ("scheduled_ms", instant(p.scheduled_ms)),
                                ("attempt", long(i64::from(p.attempt))),
                                ("not_before_ms", instant(p.not_before_ms)),
                                ("reason", p.reason.to_avro()),
                            ])
                        })
                        .collect(),
                ),
            ),
        ])
    }

    fn from_avro(v: Value) -> Result<Self, CodecError> {
        let mut r = Fields::new(TIMER_STATE.name(), v)?;
        Ok(TimerState {
            definition: JobDefinition::from_avro(r.take("definition")?)?,
            next_fire_ms: r.opt_long("next_fire_ms")?,
            fires: r.u64("fires")?,
            last_scheduled_ms: r.opt_long("last_scheduled_ms")?,
            in_flight: match r.optional("in_flight")? {
                None => None,
                Some(v) => {
                    let mut f = Fields::new("io.tocsin.InFlight", v)?;
                    Some(InFlight {
                        run_id: f.string("run_id")?,
                        scheduled_ms: f.long("scheduled_ms")?,
                    })
                }
            },
            buffered_ms: r.opt_long("buffered_ms")?,
            pending: r
                .array("pending")?
                .into_iter()
                .map(|v| {
                    let mut p = Fields::new("io.tocsin.PendingFire", v)?;
                    Ok(PendingFire {
                        scheduled_ms: p.long("scheduled_ms")?,
                        attempt: p.u32("attempt")?,
                        not_before_ms: p.long("not_before_ms")?,
                        reason: p.enumeration("reason")?,
                    })
                })
                .collect::<Result<_, CodecError>>()?,
        })
    }
}

// ---- Run ----

impl AvroRecord for Run {
    fn compiled() -> &'static CompiledSchema {
        &RUN
    }

    fn to_avro(&self) -> Value {
        record([
            ("run_id", string(&self.run_id)),
            ("job_id", string(&self.job_id)),
            ("tenant", string(&self.tenant)),
            ("scheduled_ms", instant(self.scheduled_ms)),
            ("fire_ms", instant(self.fire_ms)),
            ("attempt", long(i64::from(self.attempt))),
            ("reason", self.reason.to_avro()),
            ("handler", handler_to_avro(&self.handler)),
            ("timeout_ms", unsigned(self.timeout_ms)),
            ("retry", retry_to_avro(&self.retry)),
            ("labels", string_map(&self.labels)),
        ])
    }

    fn from_avro(v: Value) -> Result<Self, CodecError> {
        let mut r = Fields::new(RUN.name(), v)?;
        Ok(Run {
            run_id: r.string("run_id")?,
            job_id: r.string("job_id")?,
            tenant: r.string("tenant")?,
            scheduled_ms: r.long("scheduled_ms")?,
            fire_ms: r.long("fire_ms")?,
            attempt: r.u32("attempt")?,
            reason: r.enumeration("reason")?,
            handler: handler_from_avro(r.take("handler")?)?,
            timeout_ms: r.u64("timeout_ms")?,
            retry: retry_from_avro(r.take("retry")?)?,
            labels: r.string_map("labels")?,
        })
    }
}

// ---- ControlRecord: a record whose `body` is a union of one record per kind ----

impl AvroRecord for ControlRecord {
    fn compiled() -> &'static CompiledSchema {
        &CONTROL_RECORD
    }

    fn to_avro(&self) -> Value {
        let (branch, body) = match self {
            ControlRecord::Retry {
                run_id,
                scheduled_ms,
                attempt,
                not_before_ms,
                error,
            } => (
                0,
                record([
                    ("run_id", string(run_id)),
                    ("scheduled_ms", instant(*scheduled_ms)),
                    ("attempt", long(i64::from(*attempt))),
                    ("not_before_ms", instant(*not_before_ms)),
                    ("error", string(error)),
                ]),
            ),
            ControlRecord::Completion {
                run_id,
                scheduled_ms,
                attempt,
                outcome,
            } => (
                1,
                record([
                    ("run_id", string(run_id)),
                    ("scheduled_ms", instant(*scheduled_ms)),
                    ("attempt", long(i64::from(*attempt))),
                    ("outcome", outcome.to_avro()),
                ]),
            ),
            ControlRecord::Trigger { requested_ms } => {
                (2, record([("requested_ms", instant(*requested_ms))]))
            }
            ControlRecord::Backfill { from_ms, to_ms } => (
                3,
                record([("from_ms", instant(*from_ms)), ("to_ms", instant(*to_ms))]),
            ),
        };
        record([("body", Value::Union(branch, Box::new(body)))])
    }

    fn from_avro(v: Value) -> Result<Self, CodecError> {
        let mut r = Fields::new(CONTROL_RECORD.name(), v)?;
        let (branch, body) = r.union("body")?;
        Ok(match branch {
            0 => {
                let mut b = Fields::new("io.tocsin.RetryRequest", body)?;
                ControlRecord::Retry {
                    run_id: b.string("run_id")?,
                    scheduled_ms: b.long("scheduled_ms")?,
                    attempt: b.u32("attempt")?,
                    not_before_ms: b.long("not_before_ms")?,
                    error: b.string("error")?,
                }
            }
            1 => {
                let mut b = Fields::new("io.tocsin.Completion", body)?;
                ControlRecord::Completion {
                    run_id: b.string("run_id")?,
                    scheduled_ms: b.long("scheduled_ms")?,
                    attempt: b.u32("attempt")?,
                    outcome: b.enumeration("outcome")?,
                }
            }
            2 => {
                let mut b = Fields::new("io.tocsin.Trigger", body)?;
                ControlRecord::Trigger {
                    requested_ms: b.long("requested_ms")?,
                }
            }
            3 => {
                let mut b = Fields::new("io.tocsin.Backfill", body)?;
                ControlRecord::Backfill {
                    from_ms: b.long("from_ms")?,
                    to_ms: b.long("to_ms")?,
                }
            }
            other => return Err(r.bad_branch("body", other)),
        })
    }
}

// ---- RunEvent ----

impl AvroRecord for RunEvent {
    fn compiled() -> &'static CompiledSchema {
        &RUN_EVENT
    }

    fn to_avro(&self) -> Value {
        record([
            ("run_id", string(&self.run_id)),
            ("job_id", string(&self.job_id)),
            ("tenant", string(&self.tenant)),
            ("scheduled_ms", instant(self.scheduled_ms)),
            ("attempt", long(i64::from(self.attempt))),
            ("kind", self.kind.to_avro()),
            ("at_ms", instant(self.at_ms)),
            ("node", string(&self.node)),
            ("error", optional(self.error.as_deref().map(string))),
            ("duration_ms", optional(self.duration_ms.map(unsigned))),
        ])
    }

    fn from_avro(v: Value) -> Result<Self, CodecError> {
        let mut r = Fields::new(RUN_EVENT.name(), v)?;
        Ok(RunEvent {
            run_id: r.string("run_id")?,
            job_id: r.string("job_id")?,
            tenant: r.string("tenant")?,
            scheduled_ms: r.long("scheduled_ms")?,
            attempt: r.u32("attempt")?,
            kind: r.enumeration("kind")?,
            at_ms: r.long("at_ms")?,
            node: r.string("node")?,
            error: r.opt_string("error")?,
            duration_ms: r.opt_u64("duration_ms")?,
        })
    }
}

// ---- DeadLetter ----

impl AvroRecord for DeadLetter {
    fn compiled() -> &'static CompiledSchema {
        &DEAD_LETTER
    }

    fn to_avro(&self) -> Value {
        record([
            ("run", self.run.to_avro()),
            ("error", string(&self.error)),
            ("attempts", long(i64::from(self.attempts))),
            ("at_ms", instant(self.at_ms)),
        ])
    }

    fn from_avro(v: Value) -> Result<Self, CodecError> {
        let mut r = Fields::new(DEAD_LETTER.name(), v)?;
        Ok(DeadLetter {
            run: Run::from_avro(r.take("run")?)?,
            error: r.string("error")?,
            attempts: r.u32("attempts")?,
            at_ms: r.long("at_ms")?,
        })
    }
}
