//! The job definition as users write it: plain data, no I/O.
//!
//! Times are milliseconds since the Unix epoch (UTC); durations are milliseconds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a user puts on the `jobs` topic, keyed by `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobDefinition {
    pub id: String,
    pub tenant: String,
    pub schedule: ScheduleSpec,
    /// No fire before this instant.
    #[serde(default)]
    pub start_ms: Option<i64>,
    /// No fire at or after this instant.
    #[serde(default)]
    pub end_ms: Option<i64>,
    /// Stop after this many fires.
    #[serde(default)]
    pub max_fires: Option<u64>,
    /// Deterministic jitter: each run is delayed by hash(job, instant) mod this window.
    #[serde(default)]
    pub jitter_ms: u64,
    #[serde(default)]
    pub dst_gap: DstGapPolicy,
    #[serde(default)]
    pub dst_repeat: DstRepeatPolicy,
    #[serde(default)]
    pub misfire: MisfirePolicy,
    /// How far back `fire_all` (and a one-shot) may reach after downtime.
    #[serde(default = "default_catch_up_window_ms")]
    pub catch_up_window_ms: u64,
    #[serde(default)]
    pub overlap: OverlapPolicy,
    #[serde(default)]
    pub paused: bool,
    pub handler: HandlerSpec,
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub retry: RetryPolicy,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Set by the writer; a newer revision replaces an older one.
    #[serde(default)]
    pub revision: u64,
}

impl JobDefinition {
    /// A job with every optional setting at its documented default.
    pub fn new(
        id: &str,
        tenant: &str,
        schedule: ScheduleSpec,
        handler: HandlerSpec,
    ) -> JobDefinition {
        JobDefinition {
            id: id.into(),
            tenant: tenant.into(),
            schedule,
            start_ms: None,
            end_ms: None,
            max_fires: None,
            jitter_ms: 0,
            dst_gap: DstGapPolicy::default(),
            dst_repeat: DstRepeatPolicy::default(),
            misfire: MisfirePolicy::default(),
            catch_up_window_ms: default_catch_up_window_ms(),
            overlap: OverlapPolicy::default(),
            paused: false,
            handler,
            timeout_ms: default_timeout_ms(),
            retry: RetryPolicy::default(),
            labels: BTreeMap::new(),
            revision: 0,
        }
    }
}

/// A tenant's part of its lane topic's name: letters, digits and `-` as they are, `.` as `_2e`
/// and `_` as `_5f`. Kafka treats two topic names that differ only in `.` against `_` as
/// colliding (their metric names would be equal), so `acme.eu` and `acme_eu` must not map to
/// `lane.acme.eu` and `lane.acme_eu`. The encoding is injective, and its output holds no `.`,
/// so no two tenants' lanes ever collide. Tenants of letters, digits and `-` keep the name
/// they always had.
pub fn tenant_topic_part(tenant: &str) -> String {
    let mut out = String::with_capacity(tenant.len());
    for c in tenant.chars() {
        match c {
            '.' => out.push_str("_2e"),
            '_' => out.push_str("_5f"),
            c => out.push(c),
        }
    }
    out
}

pub fn default_catch_up_window_ms() -> u64 {
    3_600_000
}

pub fn default_timeout_ms() -> u64 {
    300_000
}

/// When a job fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ScheduleSpec {
    /// A cron expression (5, 6 or 7 fields) evaluated in an IANA time zone.
    Cron { expr: String, zone: String },
    /// Every `every_ms`, at instants `anchor_ms + k * every_ms`.
    Interval {
        every_ms: u64,
        #[serde(default)]
        anchor_ms: i64,
    },
    /// Once, at `at_ms`.
    Once { at_ms: i64 },
}

/// A local time that falls inside a spring-forward gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DstGapPolicy {
    /// Fire at the first instant after the gap.
    #[default]
    Shift,
    /// Do not fire for that local time.
    Skip,
}

/// A local time that occurs twice when clocks fall back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DstRepeatPolicy {
    /// Fire at the first occurrence only.
    #[default]
    Once,
    /// Fire at both occurrences.
    Twice,
}

/// What to do with instants missed while no node fired the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum MisfirePolicy {
    /// One catch-up run for all missed instants (the latest one).
    #[default]
    FireOnce,
    /// Every missed instant within the catch-up window.
    FireAll,
    /// None; continue with the next instant in the future.
    Skip,
}

/// What to do when an instant falls due while the previous run is still in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum OverlapPolicy {
    /// Fire anyway: runs of the job may overlap.
    #[default]
    Allow,
    /// Do not fire that instant.
    Skip,
    /// Hold one run back until the running one ends; further instants meanwhile are skipped.
    BufferOne,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum HandlerKind {
    /// Write the payload into the topic named by `target`.
    Kafka,
    /// Call the URL named by `target`.
    Http,
    /// Run the program named by `target` with `args`, the payload on its stdin.
    Exec,
    /// Executed by a handler that an embedding program registers under `target`.
    Custom,
}

impl OverlapPolicy {
    /// Whether a fired run of the job is held in flight until its completion comes back on
    /// `control`: the policy then judges the next instants by it.
    pub fn holds_in_flight(self) -> bool {
        self != OverlapPolicy::Allow
    }
}

impl HandlerKind {
    /// The name a job definition spells it with (`kind = "http"`).
    pub fn name(self) -> &'static str {
        match self {
            HandlerKind::Kafka => "kafka",
            HandlerKind::Http => "http",
            HandlerKind::Exec => "exec",
            HandlerKind::Custom => "custom",
        }
    }
}

/// What a worker does with a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerSpec {
    pub kind: HandlerKind,
    /// Topic (kafka), URL (http), program (exec) or registered name (custom).
    pub target: String,
    /// Bytes handed to the target: message value, request body, or stdin.
    #[serde(default, with = "payload_serde")]
    pub payload: Vec<u8>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// HTTP method; exec arguments are `args`.
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
}

/// Retries after a failed run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 means no retry.
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            backoff_base_ms: 1_000,
            backoff_cap_ms: 60_000,
        }
    }
}

/// JSON and TOML carry the payload as UTF-8 text (or an array of bytes when it is not UTF-8);
/// Avro carries bytes.
mod payload_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(v) {
            Ok(text) => s.serialize_str(text),
            Err(_) => s.serialize_bytes(v),
        }
    }

    /// Text, or (what `serialize` writes for bytes that are not UTF-8) an array of bytes.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Payload {
            Text(String),
            Bytes(Vec<u8>),
        }
        Ok(match Payload::deserialize(d)? {
            Payload::Text(t) => t.into_bytes(),
            Payload::Bytes(b) => b,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_names_never_collide() {
        // Kafka's collision rule: equal once every `.` is read as `_`.
        let kafka_form = |t: &str| tenant_topic_part(t).replace('.', "_");
        let tenants = [
            "acme.eu",
            "acme_eu",
            "acme-eu",
            "acme_2eeu",
            "acme_5feu",
            "a._",
            "a_.",
        ];
        for (i, a) in tenants.iter().enumerate() {
            for b in &tenants[i + 1..] {
                assert_ne!(kafka_form(a), kafka_form(b), "{a} and {b}");
            }
        }
        assert_eq!(tenant_topic_part("Acme-2"), "Acme-2");
        assert_eq!(tenant_topic_part("acme.eu"), "acme_2eeu");
        assert_eq!(tenant_topic_part("acme_eu"), "acme_5feu");
    }

    #[test]
    fn binary_payloads_survive_json() {
        let spec = HandlerSpec {
            kind: HandlerKind::Kafka,
            target: "t".into(),
            payload: vec![0xff, 0x00, 0xc3],
            headers: BTreeMap::new(),
            method: None,
            args: vec![],
        };
        let json = serde_json::to_string(&spec).unwrap();
        let back: HandlerSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(back, spec);
    }
}
