//! The fast path: each record written to and read from Avro binary directly, without building a
//! [`Value`](apache_avro::types::Value) tree (whose field names, boxes and hash maps cost several
//! microseconds per `TimerState`, and the scheduler handles one per fire).
//!
//! The bytes are exactly those of the `Value` path (`to_avro` + `binary::write_value`), and
//! reading accepts exactly what the `Value` path accepts: the property tests check both, and
//! debug builds compare the two encodings on every `encode`. When a fast read fails, `decode`
//! reads again through the `Value` path, whose error names the field and the rule; so faults
//! raised here need not be precise.

use std::collections::BTreeMap;

use super::binary::{write_bytes, write_long, Fault, Reader};
use super::convert::AvroEnum;
use crate::model::job::{HandlerSpec, JobDefinition, RetryPolicy, ScheduleSpec};
use crate::model::records::{
    ControlRecord, DeadLetter, InFlight, PendingFire, Run, RunEvent, TimerState,
};

/// Implemented for every [`AvroRecord`](super::AvroRecord); not implementable outside the crate.
pub trait Direct: Sized {
    fn write_body(&self, out: &mut Vec<u8>);
    fn read_body(r: &mut Reader<'_>) -> Result<Self, Fault>;
}

// ---- writing ----

fn unsigned(n: u64, out: &mut Vec<u8>) {
    write_long(i64::try_from(n).unwrap_or(i64::MAX), out);
}

fn enumeration<E: AvroEnum + PartialEq>(e: E, out: &mut Vec<u8>) {
    let i = E::VARIANTS.iter().position(|&v| v == e).unwrap_or_default();
    write_long(i as i64, out);
}

fn opt_long(v: Option<i64>, out: &mut Vec<u8>) {
    match v {
        None => out.push(0),
        Some(n) => {
            out.push(2);
            write_long(n, out);
        }
    }
}

fn string_map(m: &BTreeMap<String, String>, out: &mut Vec<u8>) {
    if !m.is_empty() {
        write_long(m.len() as i64, out);
        for (k, v) in m {
            write_bytes(k.as_bytes(), out);
            write_bytes(v.as_bytes(), out);
        }
    }
    out.push(0);
}

fn str(s: &str, out: &mut Vec<u8>) {
    write_bytes(s.as_bytes(), out);
}

fn write_handler(h: &HandlerSpec, out: &mut Vec<u8>) {
    enumeration(h.kind, out);
    str(&h.target, out);
    write_bytes(&h.payload, out);
    string_map(&h.headers, out);
    match &h.method {
        None => out.push(0),
        Some(m) => {
            out.push(2);
            str(m, out);
        }
    }
    if !h.args.is_empty() {
        write_long(h.args.len() as i64, out);
        for a in &h.args {
            str(a, out);
        }
    }
    out.push(0);
}

fn write_retry(p: &RetryPolicy, out: &mut Vec<u8>) {
    write_long(i64::from(p.max_attempts), out);
    unsigned(p.backoff_base_ms, out);
    unsigned(p.backoff_cap_ms, out);
}

// ---- reading ----

fn read_enum<E: AvroEnum>(r: &mut Reader<'_>) -> Result<E, Fault> {
    Ok(E::VARIANTS[r.index(E::VARIANTS.len())?])
}

fn read_string_map(r: &mut Reader<'_>) -> Result<BTreeMap<String, String>, Fault> {
    let mut m = BTreeMap::new();
    r.blocks("map", |r| {
        let k = r.string()?;
        m.insert(k, r.string()?);
        Ok(())
    })?;
    Ok(m)
}

fn read_handler(r: &mut Reader<'_>) -> Result<HandlerSpec, Fault> {
    Ok(HandlerSpec {
        kind: read_enum(r)?,
        target: r.string()?,
        payload: r.bytes()?,
        headers: read_string_map(r)?,
        method: r.optional(Reader::string)?,
        args: {
            let mut args = Vec::new();
            r.blocks("array", |r| {
                args.push(r.string()?);
                Ok(())
            })?;
            args
        },
    })
}

fn read_retry(r: &mut Reader<'_>) -> Result<RetryPolicy, Fault> {
    Ok(RetryPolicy {
        max_attempts: r.ranged()?,
        backoff_base_ms: r.ranged()?,
        backoff_cap_ms: r.ranged()?,
    })
}

// ---- records, fields in schema order ----

impl Direct for JobDefinition {
    fn write_body(&self, out: &mut Vec<u8>) {
        str(&self.id, out);
        str(&self.tenant, out);
        match &self.schedule {
            ScheduleSpec::Cron { expr, zone } => {
                write_long(0, out);
                str(expr, out);
                str(zone, out);
            }
            ScheduleSpec::Interval {
                every_ms,
                anchor_ms,
            } => {
                write_long(1, out);
                unsigned(*every_ms, out);
                write_long(*anchor_ms, out);
            }
            ScheduleSpec::Once { at_ms } => {
                write_long(2, out);
                write_long(*at_ms, out);
            }
        }
        opt_long(self.start_ms, out);
        opt_long(self.end_ms, out);
        match self.max_fires {
            None => out.push(0),
            Some(n) => {
                out.push(2);
                unsigned(n, out);
            }
        }
        unsigned(self.jitter_ms, out);
        enumeration(self.dst_gap, out);
        enumeration(self.dst_repeat, out);
        enumeration(self.misfire, out);
        unsigned(self.catch_up_window_ms, out);
        enumeration(self.overlap, out);
        out.push(u8::from(self.paused));
        write_handler(&self.handler, out);
        unsigned(self.timeout_ms, out);
        write_retry(&self.retry, out);
        string_map(&self.labels, out);
        unsigned(self.revision, out);
    }

    fn read_body(r: &mut Reader<'_>) -> Result<Self, Fault> {
        Ok(JobDefinition {
            id: r.string()?,
            tenant: r.string()?,
            schedule: match r.index(3)? {
                0 => ScheduleSpec::Cron {
                    expr: r.string()?,
                    zone: r.string()?,
                },
                1 => ScheduleSpec::Interval {
                    every_ms: r.ranged()?,
                    anchor_ms: r.long()?,
                },
                _ => ScheduleSpec::Once { at_ms: r.long()? },
            },
            start_ms: r.optional(Reader::long)?,
            end_ms: r.optional(Reader::long)?,
            max_fires: r.optional(Reader::ranged)?,
            jitter_ms: r.ranged()?,
            dst_gap: read_enum(r)?,
            dst_repeat: read_enum(r)?,
            misfire: read_enum(r)?,
            catch_up_window_ms: r.ranged()?,
            overlap: read_enum(r)?,
            paused: r.boolean()?,
            handler: read_handler(r)?,
            timeout_ms: r.ranged()?,
            retry: read_retry(r)?,
            labels: read_string_map(r)?,
            revision: r.ranged()?,
        })
    }
}

impl Direct for TimerState {
    fn write_body(&self, out: &mut Vec<u8>) {
        self.definition.write_body(out);
        opt_long(self.next_fire_ms, out);
        unsigned(self.fires, out);
        opt_long(self.last_scheduled_ms, out);
        match &self.in_flight {
            None => out.push(0),
            Some(f) => {
                out.push(2);
                str(&f.run_id, out);
                write_long(f.scheduled_ms, out);
            }
        }
        opt_long(self.buffered_ms, out);
        if !self.pending.is_empty() {
            write_long(self.pending.len() as i64, out);
            for p in &self.pending {
                write_long(p.scheduled_ms, out);
                write_long(i64::from(p.attempt), out);
                write_long(p.not_before_ms, out);
                enumeration(p.reason, out);
            }
        }
        out.push(0);
    }

    fn read_body(r: &mut Reader<'_>) -> Result<Self, Fault> {
        Ok(TimerState {
            definition: JobDefinition::read_body(r)?,
            next_fire_ms: r.optional(Reader::long)?,
            fires: r.ranged()?,
            last_scheduled_ms: r.optional(Reader::long)?,
            in_flight: r.optional(|r| {
                Ok(InFlight {
                    run_id: r.string()?,
                    scheduled_ms: r.long()?,
                })
            })?,
            buffered_ms: r.optional(Reader::long)?,
            pending: {
                let mut pending = Vec::new();
                r.blocks("array", |r| {
                    pending.push(PendingFire {
                        scheduled_ms: r.long()?,
                        attempt: r.ranged()?,
                        not_before_ms: r.long()?,
                        reason: read_enum(r)?,
                    });
                    Ok(())
                })?;
                pending
            },
        })
    }
}

impl Direct for Run {
    fn write_body(&self, out: &mut Vec<u8>) {
        str(&self.run_id, out);
        str(&self.job_id, out);
        str(&self.tenant, out);
        write_long(self.scheduled_ms, out);
        write_long(self.fire_ms, out);
        write_long(i64::from(self.attempt), out);
        enumeration(self.reason, out);
        write_handler(&self.handler, out);
        unsigned(self.timeout_ms, out);
        write_retry(&self.retry, out);
        string_map(&self.labels, out);
    }

    fn read_body(r: &mut Reader<'_>) -> Result<Self, Fault> {
        Ok(Run {
            run_id: r.string()?,
            job_id: r.string()?,
            tenant: r.string()?,
            scheduled_ms: r.long()?,
            fire_ms: r.long()?,
            attempt: r.ranged()?,
            reason: read_enum(r)?,
            handler: read_handler(r)?,
            timeout_ms: r.ranged()?,
            retry: read_retry(r)?,
            labels: read_string_map(r)?,
        })
    }
}

impl Direct for ControlRecord {
    fn write_body(&self, out: &mut Vec<u8>) {
        match self {
            ControlRecord::Retry {
                run_id,
                scheduled_ms,
                attempt,
                not_before_ms,
                error,
            } => {
                write_long(0, out);
                str(run_id, out);
                write_long(*scheduled_ms, out);
                write_long(i64::from(*attempt), out);
                write_long(*not_before_ms, out);
                str(error, out);
            }
            ControlRecord::Completion {
                run_id,
                scheduled_ms,
                attempt,
                outcome,
            } => {
                write_long(1, out);
                str(run_id, out);
                write_long(*scheduled_ms, out);
                write_long(i64::from(*attempt), out);
                enumeration(*outcome, out);
            }
            ControlRecord::Trigger { requested_ms } => {
                write_long(2, out);
                write_long(*requested_ms, out);
            }
            ControlRecord::Backfill { from_ms, to_ms } => {
                write_long(3, out);
                write_long(*from_ms, out);
                write_long(*to_ms, out);
            }
        }
    }

    fn read_body(r: &mut Reader<'_>) -> Result<Self, Fault> {
        Ok(match r.index(4)? {
            0 => ControlRecord::Retry {
                run_id: r.string()?,
                scheduled_ms: r.long()?,
                attempt: r.ranged()?,
                not_before_ms: r.long()?,
                error: r.string()?,
            },
            1 => ControlRecord::Completion {
                run_id: r.string()?,
                scheduled_ms: r.long()?,
                attempt: r.ranged()?,
                outcome: read_enum(r)?,
            },
            2 => ControlRecord::Trigger {
                requested_ms: r.long()?,
            },
            _ => ControlRecord::Backfill {
                from_ms: r.long()?,
                to_ms: r.long()?,
            },
        })
    }
}

impl Direct for RunEvent {
    fn write_body(&self, out: &mut Vec<u8>) {
        str(&self.run_id, out);
        str(&self.job_id, out);
        str(&self.tenant, out);
        write_long(self.scheduled_ms, out);
        write_long(i64::from(self.attempt), out);
        enumeration(self.kind, out);
        write_long(self.at_ms, out);
        str(&self.node, out);
        match &self.error {
            None => out.push(0),
            Some(e) => {
                out.push(2);
                str(e, out);
            }
        }
        match self.duration_ms {
            None => out.push(0),
            Some(d) => {
                out.push(2);
                unsigned(d, out);
            }
        }
    }

    fn read_body(r: &mut Reader<'_>) -> Result<Self, Fault> {
        Ok(RunEvent {
            run_id: r.string()?,
            job_id: r.string()?,
            tenant: r.string()?,
            scheduled_ms: r.long()?,
            attempt: r.ranged()?,
            kind: read_enum(r)?,
            at_ms: r.long()?,
            node: r.string()?,
            error: r.optional(Reader::string)?,
            duration_ms: r.optional(Reader::ranged)?,
        })
    }
}

impl Direct for DeadLetter {
    fn write_body(&self, out: &mut Vec<u8>) {
        self.run.write_body(out);
        str(&self.error, out);
        write_long(i64::from(self.attempts), out);
        write_long(self.at_ms, out);
    }

    fn read_body(r: &mut Reader<'_>) -> Result<Self, Fault> {
        Ok(DeadLetter {
            run: Run::read_body(r)?,
            error: r.string()?,
            attempts: r.ranged()?,
            at_ms: r.long()?,
        })
    }
}
