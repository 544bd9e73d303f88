//! Validation of a job definition before it is accepted.
//!
//! Owns every rule a user can break in a definition, each reported with the job, the offending
//! value and the rule. Pure: the clock is the `now_ms` argument. It returns the parsed schedule so
//! callers never parse twice.

use chrono::{DateTime, SecondsFormat};

use crate::codec::{self, Framing};
use crate::model::job::{tenant_topic_part, HandlerKind, JobDefinition, ScheduleSpec};
use crate::model::records::{FireReason, PendingFire, Run, TimerState};
use crate::model::schedule::{Schedule, ScheduleError, ScheduleKind};

/// Job ids are Kafka keys and RocksDB key parts; this bounds both.
pub const MAX_JOB_ID_BYTES: usize = 255;
/// Tenants become part of topic names, whose length Kafka caps at 249.
pub const MAX_TENANT_LEN: usize = 64;
/// Kafka's limit on a topic name's length.
pub const MAX_TOPIC_NAME_LEN: usize = 249;
/// The default payload limit: 900 KiB, so that a job at the limit still fits, with its
/// definition, headers and progress, in librdkafka's default record limit of 1,000,000 bytes.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 900 * 1024;
/// librdkafka's default `message.max.bytes`: the largest record our producers send.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1_000_000;
/// Room kept free in every record a job causes: a run's headers, the last error a `dead`
/// record carries (workers cap a handler's output at 64 KiB), and the retries and backfill
/// instants a timer state may come to hold.
pub const RECORD_HEADROOM_BYTES: usize = 64 * 1024;
/// The longest run of a job: a week.
pub const MAX_TIMEOUT_MS: u64 = 7 * 86_400_000;

/// Operator-set limits on definitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Default 900 KiB (`DEFAULT_MAX_PAYLOAD_BYTES`).
    pub max_payload_bytes: usize,
    /// The largest record any Tocsin topic takes: the smallest of the producers'
    /// `message.max.bytes` and the topics' `max.message.bytes`, as the broker has them.
    pub max_record_bytes: usize,
    /// Tocsin's own topics start with this; no job may write into them, and a tenant's lane
    /// name (`<prefix>lane.<tenant>`) must fit Kafka's limit.
    pub topic_prefix: String,
    /// When set, a `kafka` job may target only topics named `<tenant>.…`.
    pub tenant_prefixed_targets: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            topic_prefix: "tocsin.".into(),
            tenant_prefixed_targets: false,
        }
    }
}

impl Limits {
    /// The limits a configuration sets, with the default largest record (the scheduler reads
    /// the broker's and lowers it).
    pub fn from_config(config: &crate::config::Config) -> Limits {
        Limits {
            max_payload_bytes: config.limits.max_payload_bytes,
            max_record_bytes: DEFAULT_MAX_RECORD_BYTES,
            topic_prefix: config.topic_prefix.clone(),
            tenant_prefixed_targets: config.limits.kafka_targets
                == crate::config::KafkaTargets::TenantPrefix,
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
    #[error(
        "tenant {tenant:?} for job {job:?} makes the lane topic {lane:?}, {len} characters, \
         over Kafka's limit of {MAX_TOPIC_NAME_LEN}"
    )]
    LaneNameTooLong {
        job: String,
        tenant: String,
        lane: String,
        len: usize,
    },
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("interval every {every_ms} ms from anchor {anchor_ms} for job {job:?} never fires after {}", iso(.now_ms))]
    IntervalNeverFires {
        job: String,
        every_ms: u64,
        anchor_ms: i64,
        now_ms: i64,
    },
    #[error(
        "the {record} of job {job:?} would be {len} bytes, over the limit of {limit} bytes \
         (the largest record is {max_record_bytes} bytes, less {RECORD_HEADROOM_BYTES} bytes \
         kept for headers, errors and progress); shrink the payload, labels or headers"
    )]
    RecordTooLarge {
        job: String,
        record: &'static str,
        len: usize,
        limit: usize,
        max_record_bytes: usize,
    },
    #[error(
        "kafka target {topic:?} for job {job:?} is not a valid topic name: \
         it must match [A-Za-z0-9._-]{{1,{MAX_TOPIC_NAME_LEN}}} and not be \".\" or \"..\""
    )]
    InvalidTargetTopic { job: String, topic: String },
    #[error(
        "kafka target {topic:?} for job {job:?} is not a topic of tenant {tenant:?}: this fleet \
         lets a tenant write only into topics named \"{tenant}.…\" (limits.kafka_targets)"
    )]
    OtherTenantsTopic {
        job: String,
        tenant: String,
        topic: String,
    },
    #[error(
        "kafka target {topic:?} for job {job:?} is one of Tocsin's own topics (prefix \
         {prefix:?}); a job may not write into lanes, jobs, control, runs, dead or timers"
    )]
    ReservedTargetTopic {
        job: String,
        topic: String,
        prefix: String,
    },
    #[error(
        "kafka target {topic:?} for job {job:?} is an internal Kafka topic (names starting \
         with `__` are the broker's)"
    )]
    InternalTargetTopic { job: String, topic: String },
    #[error(
        "the {kind} handler of job {job:?} has an empty target: it names the topic (kafka), \
         the URL (http), the program (exec) or the registered handler (custom) a run goes to"
    )]
    EmptyTarget { job: String, kind: &'static str },
    #[error("http target {target:?} for job {job:?} is not an http:// or https:// URL")]
    HttpTargetNotUrl { job: String, target: String },
    #[error("timeout {timeout_ms} ms for job {job:?} is outside 1-{MAX_TIMEOUT_MS} ms")]
    TimeoutOutOfRange { job: String, timeout_ms: u64 },
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

    let lane = format!(
        "{}lane.{}",
        limits.topic_prefix,
        tenant_topic_part(&def.tenant)
    );
    if lane.len() > MAX_TOPIC_NAME_LEN {
        return Err(ValidationError::LaneNameTooLong {
            job: job.into(),
            tenant: def.tenant.clone(),
            len: lane.len(),
            lane,
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
    // The bare schedule, without the job's bounds: `0 0 0 30 FEB *`, a year list all in the
    // past, or an interval whose next instant is past the end of time is a mistake; a job whose
    // end has passed is merely finished.
    let unbounded = schedule.clone().with_bounds(None, None);
    if unbounded.next_after(now_ms).is_none() {
        match (schedule.kind(), &def.schedule) {
            (ScheduleKind::Cron { expr, .. }, _) => {
                return Err(ValidationError::CronNeverFires {
                    job: job.into(),
                    expr: expr.as_str().into(),
                    now_ms,
                })
            }
            (
                _,
                ScheduleSpec::Interval {
                    every_ms,
                    anchor_ms,
                },
            ) => {
                return Err(ValidationError::IntervalNeverFires {
                    job: job.into(),
                    every_ms: *every_ms,
                    anchor_ms: *anchor_ms,
                    now_ms,
                })
            }
            _ => {}
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
    let target = def.handler.target.as_str();
    match def.handler.kind {
        HandlerKind::Kafka => check_target_topic(def, limits)?,
        kind if target.is_empty() => {
            return Err(ValidationError::EmptyTarget {
                job: job.into(),
                kind: kind.name(),
            })
        }
        HandlerKind::Http => {
            let scheme = target
                .split_once("://")
                .map(|(s, _)| s.to_ascii_lowercase());
            if !matches!(scheme.as_deref(), Some("http" | "https")) {
                return Err(ValidationError::HttpTargetNotUrl {
                    job: job.into(),
                    target: target.into(),
                });
            }
        }
        _ => {}
    }
    if !(1..=MAX_TIMEOUT_MS).contains(&def.timeout_ms) {
        return Err(ValidationError::TimeoutOutOfRange {
            job: job.into(),
            timeout_ms: def.timeout_ms,
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
    check_record_sizes(def, limits)?;
    Ok(schedule)
}

fn check_target_topic(def: &JobDefinition, limits: &Limits) -> Result<(), ValidationError> {
    let topic = def.handler.target.as_str();
    let legal = (1..=MAX_TOPIC_NAME_LEN).contains(&topic.len())
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !legal {
        return Err(ValidationError::InvalidTargetTopic {
            job: def.id.clone(),
            topic: topic.into(),
        });
    }
    if crate::config::is_tocsin_topic(&limits.topic_prefix, topic) {
        return Err(ValidationError::ReservedTargetTopic {
            job: def.id.clone(),
            topic: topic.into(),
            prefix: limits.topic_prefix.clone(),
        });
    }
    if topic.starts_with("__") {
        return Err(ValidationError::InternalTargetTopic {
            job: def.id.clone(),
            topic: topic.into(),
        });
    }
    if limits.tenant_prefixed_targets && !topic.starts_with(&format!("{}.", def.tenant)) {
        return Err(ValidationError::OtherTenantsTopic {
            job: def.id.clone(),
            tenant: def.tenant.clone(),
            topic: topic.into(),
        });
    }
    Ok(())
}

/// Every record a job causes must fit the largest record Kafka takes, or the transaction that
/// carries it fails, and with it every other job's runs in that transaction. The sizes are
/// those of the encodings the scheduler writes, with a run and a timer state at their
/// biggest but for what `RECORD_HEADROOM_BYTES` keeps room for.
fn check_record_sizes(def: &JobDefinition, limits: &Limits) -> Result<(), ValidationError> {
    let limit = limits
        .max_record_bytes
        .saturating_sub(RECORD_HEADROOM_BYTES);
    let key = def.id.len();
    let definition = key + codec::encode(def, &Framing::SingleObject).len();
    let timer = TimerState {
        definition: def.clone(),
        next_fire_ms: Some(i64::MAX),
        fires: u64::MAX,
        last_scheduled_ms: Some(i64::MAX),
        in_flight: None,
        buffered_ms: Some(i64::MAX),
        pending: vec![PendingFire {
            scheduled_ms: i64::MAX,
            attempt: u32::MAX,
            reason: FireReason::Retry,
            not_before_ms: i64::MAX,
        }],
    };
    let timer = key + codec::encode(&timer, &Framing::SingleObject).len();
    let run = Run {
        run_id: "0".repeat(32),
        job_id: def.id.clone(),
        tenant: def.tenant.clone(),
        scheduled_ms: i64::MAX,
        fire_ms: i64::MAX,
        attempt: u32::MAX,
        reason: FireReason::CatchUp,
        handler: def.handler.clone(),
        timeout_ms: def.timeout_ms,
        retry: def.retry,
        labels: def.labels.clone(),
    };
    let run = key + codec::encode(&run, &Framing::SingleObject).len();
    for (record, len) in [
        ("definition", definition),
        ("timer state", timer),
        ("run", run),
    ] {
        if len > limit {
            return Err(ValidationError::RecordTooLarge {
                job: def.id.clone(),
                record,
                len,
                limit,
                max_record_bytes: limits.max_record_bytes,
            });
        }
    }
    Ok(())
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
        assert_eq!(Limits::default().max_payload_bytes, 921_600);
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
    fn interval_over_the_longest_a_record_carries() {
        // Found by fuzzing: accepted, this interval was stored as `i64::MAX` ms, so the
        // scheduler would have fired it on other instants than the CLI showed.
        let mut def = job();
        def.schedule = ScheduleSpec::Interval {
            every_ms: i64::MAX as u64 + 1,
            anchor_ms: -NOW,
        };
        assert_eq!(
            check(&def).unwrap_err().to_string(),
            format!(
                "interval {} ms for job \"billing-7\" is over the maximum of {} ms",
                i64::MAX as u64 + 1,
                i64::MAX
            )
        );
        def.schedule = ScheduleSpec::Interval {
            every_ms: i64::MAX as u64,
            anchor_ms: -NOW,
        };
        let schedule = check(&def).unwrap();
        let back: JobDefinition =
            codec::decode(&codec::encode(&def, &Framing::SingleObject)).expect("decodes");
        assert_eq!(back, def);
        assert_eq!(check(&back).unwrap(), schedule);
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
            ..Limits::default()
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

    #[test]
    fn a_payload_at_the_default_limit_fits_every_record() {
        let mut def = job();
        def.id = "i".repeat(MAX_JOB_ID_BYTES);
        def.handler.payload = vec![b'x'; DEFAULT_MAX_PAYLOAD_BYTES];
        assert!(check(&def).is_ok());
    }

    #[test]
    fn records_over_the_brokers_limit_are_refused() {
        // What librdkafka refuses with MessageSizeTooLarge must never reach a transaction.
        let limits = Limits {
            max_payload_bytes: usize::MAX,
            ..Limits::default()
        };
        let mut def = job();
        def.handler.payload = vec![b'x'; 1 << 20];
        let got = validate(&def, &limits, NOW).unwrap_err().to_string();
        assert!(
            got.starts_with("the definition of job \"billing-7\" would be 10"),
            "{got}"
        );
        assert!(got.contains("over the limit of 934464 bytes"), "{got}");
        // Labels count as much as the payload.
        let mut def = job();
        def.labels.insert("big".into(), "v".repeat(950_000));
        assert!(matches!(
            validate(&def, &limits, NOW),
            Err(ValidationError::RecordTooLarge { .. })
        ));
        // A broker whose topics take less lowers the limit.
        let small = Limits {
            max_record_bytes: 200_000,
            ..Limits::default()
        };
        let mut def = job();
        def.handler.payload = vec![b'x'; 150_000];
        assert!(matches!(
            validate(&def, &small, NOW),
            Err(ValidationError::RecordTooLarge { limit: 134_464, .. })
        ));
    }

    #[test]
    fn kafka_targets_must_be_topics_outside_tocsins_own() {
        for reserved in [
            "tocsin.lane.alice",
            "tocsin.jobs",
            "tocsin_lane.alice",
            "tocsin.runs",
        ] {
            assert_eq!(
                message(|d| d.handler.target = reserved.into()),
                format!(
                    "kafka target {reserved:?} for job \"billing-7\" is one of Tocsin's own \
                     topics (prefix \"tocsin.\"); a job may not write into lanes, jobs, \
                     control, runs, dead or timers"
                )
            );
        }
        for internal in ["__consumer_offsets", "__transaction_state"] {
            assert_eq!(
                message(|d| d.handler.target = internal.into()),
                format!(
                    "kafka target {internal:?} for job \"billing-7\" is an internal Kafka topic \
                     (names starting with `__` are the broker's)"
                )
            );
        }
        for bad in ["", ".", "..", "has space", "a/b", &"t".repeat(250)] {
            assert!(
                message(|d| d.handler.target = bad.to_string()).contains("is not a valid topic"),
                "{bad:?}"
            );
        }
        for good in ["billing", "tocsinx", "alice.orders_v2-eu"] {
            let mut def = job();
            def.handler.target = good.into();
            assert!(check(&def).is_ok(), "{good}");
        }
        let tenant_only = Limits {
            tenant_prefixed_targets: true,
            ..Limits::default()
        };
        let mut def = job();
        def.handler.target = "acme.orders".into();
        assert!(validate(&def, &tenant_only, NOW).is_ok());
        def.handler.target = "mallory.orders".into();
        assert_eq!(
            validate(&def, &tenant_only, NOW).unwrap_err().to_string(),
            "kafka target \"mallory.orders\" for job \"billing-7\" is not a topic of tenant \
             \"acme\": this fleet lets a tenant write only into topics named \"acme.…\" \
             (limits.kafka_targets)"
        );
        // Other handlers' targets are URLs and programs, not topics.
        let mut def = job();
        def.handler.kind = HandlerKind::Http;
        def.handler.target = "https://example.com/tocsin.jobs".into();
        assert!(check(&def).is_ok());
    }

    #[test]
    fn every_handler_needs_a_target_and_an_http_one_a_url() {
        for kind in [HandlerKind::Http, HandlerKind::Exec, HandlerKind::Custom] {
            let got = message(|d| {
                d.handler.kind = kind;
                d.handler.target = String::new();
            });
            assert!(got.contains("has an empty target"), "{kind:?}: {got}");
        }
        assert_eq!(
            message(|d| {
                d.handler.kind = HandlerKind::Http;
                d.handler.target = "billing.internal/run".into();
            }),
            "http target \"billing.internal/run\" for job \"billing-7\" is not an http:// or \
             https:// URL"
        );
        let mut def = job();
        def.handler.kind = HandlerKind::Http;
        def.handler.target = "HTTP://127.0.0.1:8080/run".into();
        assert!(check(&def).is_ok());
        def.handler.kind = HandlerKind::Exec;
        def.handler.target = "/bin/true".into();
        assert!(check(&def).is_ok());
    }

    #[test]
    fn lane_names_must_fit_kafka() {
        let mut def = job();
        def.tenant = "_".repeat(MAX_TENANT_LEN);
        let limits = Limits {
            topic_prefix: "p".repeat(60),
            ..Limits::default()
        };
        let got = validate(&def, &limits, NOW).unwrap_err().to_string();
        assert!(
            got.contains("257 characters, over Kafka's limit of 249"),
            "{got}"
        );
        assert!(validate(&def, &Limits::default(), NOW).is_ok());
    }

    #[test]
    fn schedules_that_can_never_fire_are_refused() {
        assert_eq!(
            message(|d| {
                d.schedule = ScheduleSpec::Interval {
                    every_ms: i64::MAX as u64,
                    anchor_ms: NOW,
                }
            }),
            format!(
                "interval every {} ms from anchor {NOW} for job \"billing-7\" never fires after \
                 2025-06-15T15:06:40Z",
                i64::MAX
            )
        );
        // Past the time-zone data's horizon.
        assert!(message(|d| {
            d.schedule = ScheduleSpec::Cron {
                expr: "0 0 12 1 7 * 2150".into(),
                zone: "America/New_York".into(),
            }
        })
        .contains("year 2150 out of range 1970-2099"));
        // Fires only inside a gap that `skip` drops: never, up to the horizon.
        assert!(message(|d| {
            d.schedule = ScheduleSpec::Cron {
                expr: "0 30 2 29 3 * 2026".into(),
                zone: "Europe/Berlin".into(),
            };
            d.dst_gap = DstGapPolicy::Skip;
        })
        .contains("never fires"));
    }

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(
            message(|d| d.timeout_ms = 0),
            "timeout 0 ms for job \"billing-7\" is outside 1-604800000 ms"
        );
        assert!(message(|d| d.timeout_ms = u64::MAX).contains("outside 1-604800000"));
    }
}
