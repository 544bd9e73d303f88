//! Validation of a job definition before it is accepted.
//!
//! Owns every rule a user can break in a definition, each reported with the job, the offending
//! value and the rule. Pure: the clock is the `now_ms` argument. It returns the parsed schedule so
//! callers never parse twice.

use chrono::{DateTime, SecondsFormat};

use crate::model::job::{JobDefinition, ScheduleSpec};
use crate::model::schedule::{Schedule, ScheduleError, ScheduleKind};

/// Job ids are Kafka keys and RocksDB key parts; this bounds both.
pub const MAX_JOB_ID_BYTES: usize = 255;
/// Tenants become part of topic names, whose length Kafka caps at 249.
pub const MAX_TENANT_LEN: usize = 64;

/// Operator-set limits on definitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Default 1 MiB, Kafka's default maximum message size.
    pub max_payload_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload_bytes: 1 << 20,
        }
    }
}

/// Why a job definition was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("job id is empty")]
    EmptyJobId,
    #[error("job id {id:?} is {len} bytes, over the limit of {MAX_JOB_ID_BYTES}")]
    JobIdTooLong { id: String, len: usize },
    #[error("job id {id:?} contains a control character")]
    JobIdControlChar { id: String },
    #[error(
        "tenant {tenant:?} for job {job:?} must match [A-Za-z0-9._-]{{1,{MAX_TENANT_LEN}}}, \
         because it becomes part of a topic name"
    )]
    InvalidTenant { job: String, tenant: String },
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("end {} for job {job:?} is not after start {}", iso(.end_ms), iso(.start_ms))]
    EndNotAfterStart {
        job: String,
        start_ms: i64,
        end_ms: i64,
    },
    #[error("payload of {len} bytes for job {job:?} is over the limit of {limit} bytes")]
    PayloadTooLarge {
        job: String,
        len: usize,
        limit: usize,
    },
    #[error(
        "one-shot at {} for job {job:?} is older than the catch-up window of {window_ms} ms \
         before now ({})",
        iso(.at_ms),
        iso(.now_ms)
    )]
    OneShotTooOld {
        job: String,
        at_ms: i64,
        now_ms: i64,
        window_ms: u64,
    },
    #[error("cron {expr:?} for job {job:?} never fires after {}", iso(.now_ms))]
    CronNeverFires {
        job: String,
        expr: String,
        now_ms: i64,
    },
    #[error("max_attempts 0 for job {job:?}: a job needs at least 1 attempt")]
    ZeroAttempts { job: String },
    #[error("backoff cap {cap_ms} ms for job {job:?} is below the backoff base {base_ms} ms")]
    BackoffCapBelowBase {
        job: String,
        base_ms: u64,
        cap_ms: u64,
    },
}

fn iso(ms: &i64) -> String {
    DateTime::from_timestamp_millis(*ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// Checks every rule and returns the parsed schedule. The id is checked first because every
/// other message names it.
pub fn validate(
    def: &JobDefinition,
    limits: &Limits,
    now_ms: i64,
) -> Result<Schedule, ValidationError> {
    let job = def.id.as_str();
    if job.is_empty() {
        return Err(ValidationError::EmptyJobId);
    }
    if job.len() > MAX_JOB_ID_BYTES {
        return Err(ValidationError::JobIdTooLong {
            id: job.into(),
            len: job.len(),
        });
    }
    if job.chars().any(char::is_control) {
        return Err(ValidationError::JobIdControlChar { id: job.into() });
    }
    let tenant_ok = (1..=MAX_TENANT_LEN).contains(&def.tenant.len())
        && def
            .tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !tenant_ok {
        return Err(ValidationError::InvalidTenant {
            job: job.into(),
            tenant: def.tenant.clone(),
        });
    }

    let schedule = Schedule::from_job(def)?;
    if let (Some(start_ms), Some(end_ms)) = (def.start_ms, def.end_ms) {
        if end_ms <= start_ms {
            return Err(ValidationError::EndNotAfterStart {
                job: job.into(),
                start_ms,
                end_ms,
            });
        }
    }
    let window = i64::try_from(def.catch_up_window_ms).unwrap_or(i64::MAX);
    if let ScheduleSpec::Once { at_ms } = def.schedule {
        if at_ms < now_ms.saturating_sub(window) {
            return Err(ValidationError::OneShotTooOld {
                job: job.into(),
                at_ms,
                now_ms,
                window_ms: def.catch_up_window_ms,
            });
        }
    }
    if let ScheduleKind::Cron { expr, .. } = schedule.kind() {
        // The bare expression, without the job's bounds: `0 0 0 30 FEB *`, or a year list all in
        // the past, is a mistake; a job whose end has passed is merely finished.
        let unbounded = schedule.clone().with_bounds(None, None);
        if unbounded.next_after(now_ms).is_none() {
            return Err(ValidationError::CronNeverFires {
                job: job.into(),
                expr: expr.as_str().into(),
                now_ms,
            });
        }
    }

    let len = def.handler.payload.len();
    if len > limits.max_payload_bytes {
        return Err(ValidationError::PayloadTooLarge {
            job: job.into(),
            len,
            limit: limits.max_payload_bytes,
        });
    }
    if def.retry.max_attempts == 0 {
        return Err(ValidationError::ZeroAttempts { job: job.into() });
    }
    if def.retry.backoff_cap_ms < def.retry.backoff_base_ms {
        return Err(ValidationError::BackoffCapBelowBase {
            job: job.into(),
            base_ms: def.retry.backoff_base_ms,
            cap_ms: def.retry.backoff_cap_ms,
        });
    }
    Ok(schedule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::*;

    const NOW: i64 = 1_750_000_000_000; // 2025-06-15T15:06:40Z

    fn job() -> JobDefinition {
        JobDefinition {
            id: "billing-7".into(),
            tenant: "acme".into(),
            schedule: ScheduleSpec::Cron {
                expr: "0 */5 * * * *".into(),
                zone: "Europe/Berlin".into(),
            },
            start_ms: None,
            end_ms: None,
            max_fires: None,
            jitter_ms: 0,
            dst_gap: DstGapPolicy::Shift,
            dst_repeat: DstRepeatPolicy::Once,
            misfire: MisfirePolicy::FireOnce,
            catch_up_window_ms: default_catch_up_window_ms(),
            overlap: OverlapPolicy::Allow,
            paused: false,
            handler: HandlerSpec {
                kind: HandlerKind::Kafka,
                target: "billing".into(),
                payload: b"{}".to_vec(),
                headers: Default::default(),
                method: None,
                args: Vec::new(),
            },
            timeout_ms: default_timeout_ms(),
            retry: RetryPolicy::default(),
            labels: Default::default(),
            revision: 1,
        }
    }

    fn check(def: &JobDefinition) -> Result<Schedule, ValidationError> {
        validate(def, &Limits::default(), NOW)
    }

    fn message(edit: impl FnOnce(&mut JobDefinition)) -> String {
        let mut def = job();
        edit(&mut def);
        check(&def).unwrap_err().to_string()
    }

    #[test]
    fn a_valid_job_returns_its_schedule() {
        let schedule = check(&job()).unwrap();
        assert_eq!(schedule, Schedule::from_job(&job()).unwrap());
        assert_eq!(
            schedule.next_after(NOW),
            Some(NOW - NOW % 300_000 + 300_000)
        );
        assert_eq!(Limits::default().max_payload_bytes, 1_048_576);
    }

    #[test]
    fn invalid_cron_names_job_value_and_rule() {
        assert_eq!(
            message(|d| {
                d.schedule = ScheduleSpec::Cron {
                    expr: "61 * * * * *".into(),
                    zone: "UTC".into(),
                }
            }),
            "invalid cron \"61 * * * * *\" for job \"billing-7\": second 61 out of range 0-59"
        );
    }

    #[test]
    fn unknown_zone() {
        assert_eq!(
            message(|d| {
                d.schedule = ScheduleSpec::Cron {
                    expr: "* * * * *".into(),
                    zone: "Europe/Atlantis".into(),
                }
            }),
            "unknown time zone \"Europe/Atlantis\" for job \"billing-7\": \
             expected an IANA name such as \"Europe/Berlin\""
        );
    }

    #[test]
    fn interval_under_one_second() {
        assert_eq!(
            message(|d| {
                d.schedule = ScheduleSpec::Interval {
                    every_ms: 500,
                    anchor_ms: 0,
                }
            }),
            "interval 500 ms for job \"billing-7\" is under the minimum of 1000 ms"
        );
        let mut def = job();
        def.schedule = ScheduleSpec::Interval {
            every_ms: 1_000,
            anchor_ms: 0,
        };
        assert!(check(&def).is_ok());
    }

    #[test]
    fn end_must_be_after_start() {
        assert_eq!(
            message(|d| {
                d.start_ms = Some(NOW);
                d.end_ms = Some(NOW);
            }),
            "end 2025-06-15T15:06:40Z for job \"billing-7\" is not after start 2025-06-15T15:06:40Z"
        );
        let mut def = job();
        def.start_ms = Some(NOW);
        def.end_ms = Some(NOW + 1);
        assert!(check(&def).is_ok());
    }

    #[test]
    fn job_id_rules() {
        assert_eq!(message(|d| d.id.clear()), "job id is empty");
        let long = "x".repeat(256);
        assert_eq!(
            message(|d| d.id = long.clone()),
            format!("job id {long:?} is 256 bytes, over the limit of 255")
        );
        let mut def = job();
        def.id = "é".repeat(127); // 254 bytes
        assert!(check(&def).is_ok());
        assert_eq!(
            message(|d| d.id = "bad\nid".into()),
            "job id \"bad\\nid\" contains a control character"
        );
        assert!(message(|d| d.id = "a\u{7f}".into()).contains("control character"));
    }

    #[test]
    fn tenant_rules() {
        for bad in ["", "has space", "slash/y", "ünï", &"t".repeat(65)] {
            let got = message(|d| d.tenant = bad.to_string());
            assert_eq!(
                got,
                format!(
                    "tenant {bad:?} for job \"billing-7\" must match [A-Za-z0-9._-]{{1,64}}, \
                     because it becomes part of a topic name"
                )
            );
        }
        for good in ["a", "Acme.EU_2-prod", &"t".repeat(64)] {
            let mut def = job();
            def.tenant = good.to_string();
            assert!(check(&def).is_ok(), "{good}");
        }
    }

    #[test]
    fn payload_limit() {
        let limits = Limits {
            max_payload_bytes: 4,
        };
        let mut def = job();
        def.handler.payload = b"1234".to_vec();
        assert!(validate(&def, &limits, NOW).is_ok());
        def.handler.payload = b"12345".to_vec();
        assert_eq!(
            validate(&def, &limits, NOW).unwrap_err().to_string(),
            "payload of 5 bytes for job \"billing-7\" is over the limit of 4 bytes"
        );
    }

    #[test]
    fn one_shot_older_than_catch_up_window() {
        let mut def = job();
        def.catch_up_window_ms = 60_000;
        def.schedule = ScheduleSpec::Once {
            at_ms: NOW - 60_000,
        };
        assert!(check(&def).is_ok());
        def.schedule = ScheduleSpec::Once {
            at_ms: NOW - 60_001,
        };
        assert_eq!(
            check(&def).unwrap_err().to_string(),
            "one-shot at 2025-06-15T15:05:39.999Z for job \"billing-7\" is older than the \
             catch-up window of 60000 ms before now (2025-06-15T15:06:40Z)"
        );
        def.schedule = ScheduleSpec::Once { at_ms: 0 };
        def.catch_up_window_ms = u64::MAX;
        assert!(check(&def).is_ok());
    }

    #[test]
    fn cron_that_never_fires() {
        assert_eq!(
            message(|d| {
                d.schedule = ScheduleSpec::Cron {
                    expr: "0 0 0 30 FEB *".into(),
                    zone: "UTC".into(),
                }
            }),
            "cron \"0 0 0 30 FEB *\" for job \"billing-7\" never fires after 2025-06-15T15:06:40Z"
        );
        assert!(message(|d| {
            d.schedule = ScheduleSpec::Cron {
                expr: "0 0 0 1 1 * 2020-2024".into(),
                zone: "UTC".into(),
            }
        })
        .contains("never fires"));
        // A finished job (end passed) is not a mistake in the expression.
        let mut def = job();
        def.start_ms = Some(0);
        def.end_ms = Some(1);
        assert!(check(&def).is_ok());
    }

    #[test]
    fn retry_rules() {
        assert_eq!(
            message(|d| d.retry.max_attempts = 0),
            "max_attempts 0 for job \"billing-7\": a job needs at least 1 attempt"
        );
        assert_eq!(
            message(|d| {
                d.retry.backoff_base_ms = 5_000;
                d.retry.backoff_cap_ms = 4_999;
            }),
            "backoff cap 4999 ms for job \"billing-7\" is below the backoff base 5000 ms"
        );
        let mut def = job();
        def.retry.backoff_base_ms = 5_000;
        def.retry.backoff_cap_ms = 5_000;
        def.retry.max_attempts = 1;
        assert!(check(&def).is_ok());
    }
}
