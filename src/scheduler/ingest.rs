//! Ingest: what a `jobs` or `control` record does to a timer, what a rejected record looks
//! like on `jobs.rejected`, the lanes ingested jobs need, and the cache of parsed schedules.
//!
//! The decisions are pure (`on_job`, `on_control`, `rejected_copy`): the engine loads the
//! timer, asks, and applies the answer inside its transaction. The lanes and the schedule
//! cache are parts with their own state; neither knows the engine.

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use tracing::{error, info, warn};

use super::fire;
use crate::codec;
use crate::config::Config;
use crate::kafka::admin::{lane_topic, Admin, AdminError, TopicSpec};
use crate::model::job::JobDefinition;
use crate::model::records::{ControlRecord, TimerState};
use crate::model::schedule::Schedule;
use crate::model::validate::{validate, Limits};
use crate::telemetry::Rejection;

/// Most parsed schedules kept (see `Schedules`).
const SCHEDULE_CACHE: usize = 100_000;
/// What a copy in `jobs.rejected` may take of the largest record: the rest is kept for the
/// reason and the headers. An original too large for it is named, not copied.
pub const REJECT_HEADROOM_BYTES: usize = 16 * 1024;
/// Keys longer than this are not copied into a `jobs.rejected` record that cannot copy the
/// original (job ids are at most 255 bytes; a longer key is not a job's).
const MAX_REJECTED_KEY_BYTES: usize = 1024;
/// A record's timestamp further back than this is not taken as the job's start.
const MAX_WRITTEN_AGE_MS: i64 = 86_400_000;

/// One record of `jobs`, as the engine hands it over.
pub struct JobRecord<'a> {
    pub key: Option<&'a [u8]>,
    pub payload: Option<&'a [u8]>,
    /// The record's timestamp (when it was written), if it has one.
    pub timestamp_ms: Option<i64>,
}

/// What a `jobs` record does.
#[derive(Debug)]
pub enum JobChange {
    /// The record is bad: it goes to `jobs.rejected` with the reason; nothing changes.
    Reject(Rejection, String),
    /// A tombstone of a job that exists: its timer is deleted.
    Delete { job: String },
    /// Nothing to do (a tombstone of an unknown job, the same definition again, an older
    /// revision).
    Nothing,
    /// The job's timer becomes `state`, with its parsed schedule.
    Put {
        job: String,
        state: Box<TimerState>,
        schedule: Arc<Schedule>,
    },
}

/// The key of a `jobs` or `control` record as a job id, or why it is not one.
pub fn job_id(key: Option<&[u8]>) -> Result<&str, String> {
    let key = key.ok_or_else(|| "record has no key (the key must be the job id)".to_owned())?;
    std::str::from_utf8(key).map_err(|_| "key is not UTF-8 (the key must be the job id)".into())
}

/// What the `jobs` record `m` does to the job's timer `existing`, at `now`.
pub fn on_job(
    m: &JobRecord<'_>,
    existing: Option<TimerState>,
    limits: &Limits,
    now: i64,
) -> JobChange {
    let job = match job_id(m.key) {
        Ok(j) => j.to_owned(),
        Err(reason) => return JobChange::Reject(Rejection::Key, reason),
    };
    let Some(bytes) = m.payload else {
        // Tombstone: the job is deleted and never fires again.
        return match existing {
            Some(_) => JobChange::Delete { job },
            None => JobChange::Nothing,
        };
    };
    let def: JobDefinition = match codec::decode(bytes) {
        Ok(d) => d,
        Err(e) => {
            return JobChange::Reject(
                Rejection::Decode,
                format!("not a Tocsin JobDefinition: {e}"),
            )
        }
    };
    if def.id != job {
        return JobChange::Reject(
            Rejection::Key,
            format!("key {job:?} does not match the job id {:?}", def.id),
        );
    }
    let schedule = match validate(&def, limits, now) {
        Ok(s) => Arc::new(s),
        Err(e) => return JobChange::Reject(Rejection::Invalid, e.to_string()),
    };
    // A job's life starts when its record was written, not when this node got to it: a slow
    // ingest makes its first instants late, never skipped. (Clamped, so a skewed producer
    // clock cannot reach into the future or far into the past.)
    let written = (m.timestamp_ms)
        .filter(|t| *t <= now && now - *t < MAX_WRITTEN_AGE_MS)
        .unwrap_or(now);
    let state = match existing {
        None => fire::new_timer(def, &schedule, written),
        Some(mut s) => {
            if s.definition == def {
                return JobChange::Nothing;
            }
            if s.definition.tenant != def.tenant {
                return JobChange::Reject(
                    Rejection::Tenant,
                    other_tenants_job(&job, &s.definition.tenant, &def.tenant),
                );
            }
            if def.revision != 0 && def.revision < s.definition.revision {
                info!(job = %job, revision = def.revision, current = s.definition.revision,
                    "ignored an older revision");
                return JobChange::Nothing;
            }
            fire::update_timer(&mut s, def, &schedule, written);
            s
        }
    };
    JobChange::Put {
        job,
        state: Box::new(state),
        schedule,
    }
}

/// Why a definition from one tenant may not replace another tenant's job. A job id belongs
/// to the tenant that created it until the job is deleted (README, "Schedules: what is
/// accepted", Tenants).
pub fn other_tenants_job(job: &str, owner: &str, writer: &str) -> String {
    format!(
        "job {job:?} belongs to tenant {owner:?}; a definition from tenant {writer:?} cannot \
         replace it (a job id is owned by the tenant that created it until that job is deleted)"
    )
}

/// What a `control` record is.
#[derive(Debug)]
pub enum ControlChange {
    /// Not a control record: to `jobs.rejected`.
    Reject(Rejection, String),
    /// A tombstone: nothing to do.
    Nothing,
    /// A request to apply to the job's timer.
    Apply(ControlRecord),
}

/// Decodes a `control` record's value.
pub fn on_control(payload: Option<&[u8]>) -> ControlChange {
    match payload.map(codec::decode::<ControlRecord>) {
        Some(Ok(r)) => ControlChange::Apply(r),
        Some(Err(e)) => ControlChange::Reject(
            Rejection::Decode,
            format!("not a Tocsin ControlRecord: {e}"),
        ),
        None => ControlChange::Nothing,
    }
}

/// A rejected record's copy on `jobs.rejected`: the headers, and the key and value it keeps.
#[derive(Debug, PartialEq, Eq)]
pub struct RejectedCopy<'a> {
    /// (name, value) in order: `tocsin-reason`, `tocsin-source`, `tocsin-original-bytes`,
    /// `tocsin-copied`.
    pub headers: Vec<(&'static str, Vec<u8>)>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// The copy on `jobs.rejected` of an original (`key`, `value`) from `source`, refused for
/// `reason`, when no record may exceed `max_record_bytes`. An original too large to copy (a
/// 5 MiB record on a `jobs` topic that takes it) is not copied, and the headers say so: the
/// copy must never be what fails.
pub fn rejected_copy<'a>(
    key: &'a [u8],
    value: Option<&'a [u8]>,
    reason: &str,
    source: &str,
    max_record_bytes: usize,
) -> RejectedCopy<'a> {
    let room = max_record_bytes.saturating_sub(REJECT_HEADROOM_BYTES);
    let original = key.len() + value.map_or(0, <[u8]>::len);
    let fits = original <= room;
    let reason = if fits {
        truncate(reason, REJECT_HEADROOM_BYTES / 2)
    } else {
        truncate(
            &format!(
                "{reason} (the original, {original} bytes, is over the {room} bytes a copy \
                 may take and is not copied; it is at {source})"
            ),
            REJECT_HEADROOM_BYTES / 2,
        )
    };
    let headers = vec![
        ("tocsin-reason", reason.into_bytes()),
        ("tocsin-source", source.as_bytes().to_vec()),
        ("tocsin-original-bytes", original.to_string().into_bytes()),
        (
            "tocsin-copied",
            (if fits { "true" } else { "false" }).into(),
        ),
    ];
    let keep_key = !key.is_empty() && (fits || key.len() <= MAX_REJECTED_KEY_BYTES);
    RejectedCopy {
        headers,
        key: keep_key.then_some(key),
        value: value.filter(|_| fits),
    }
}

/// The text's first `max` bytes, cut at a character boundary.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Parsed schedules, a cache: one of every job a node holds would cost hundreds of bytes per
/// timer (gigabytes at 10 M). A full cache starts over; a job fired later parses its schedule
/// again.
#[derive(Default)]
pub struct Schedules {
    parsed: HashMap<String, Arc<Schedule>>,
}

impl Schedules {
    /// The schedule of `def`, parsed now if it is not cached; `None` (logged) when the stored
    /// job's schedule does not parse.
    pub fn of(&mut self, def: &JobDefinition) -> Option<Arc<Schedule>> {
        if let Some(s) = self.parsed.get(&def.id) {
            return Some(s.clone());
        }
        match Schedule::from_job(def) {
            Ok(s) => {
                let s = Arc::new(s);
                self.insert(def.id.clone(), s.clone());
                Some(s)
            }
            Err(e) => {
                error!(job = %def.id, error = %e, "stored job has an invalid schedule");
                None
            }
        }
    }

    pub fn insert(&mut self, job: String, schedule: Arc<Schedule>) {
        if self.parsed.len() >= SCHEDULE_CACHE {
            self.parsed = HashMap::new();
        }
        self.parsed.insert(job, schedule);
    }

    /// Forgets `job`'s schedule (its definition changed or is gone).
    pub fn forget(&mut self, job: &str) {
        self.parsed.remove(job);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.parsed.len()
    }
}

/// The lane topics: those known to exist, and those jobs ingested need that do not exist yet,
/// created between transactions (`create_wanted`), never inside one.
pub struct Lanes {
    config: Config,
    admin: Admin,
    runtime: tokio::runtime::Handle,
    known: HashSet<String>,
    wanted: BTreeMap<String, TopicSpec>,
}

impl Lanes {
    pub fn new(config: &Config, admin: Admin, runtime: tokio::runtime::Handle) -> Lanes {
        Lanes {
            config: config.clone(),
            admin,
            runtime,
            known: HashSet::new(),
            wanted: BTreeMap::new(),
        }
    }

    /// Lists the lanes that exist (one metadata request), so a restarted node does not create
    /// or verify them one by one.
    pub fn seed(&mut self) {
        let prefix = self.config.lane_topic("");
        match self.admin.partition_counts() {
            Ok(counts) => {
                self.known
                    .extend(counts.into_keys().filter(|n| n.starts_with(&prefix)));
                info!(lanes = self.known.len(), "lanes listed");
            }
            Err(e) => {
                warn!(error = %e, "could not list the lanes; each is checked when first needed")
            }
        }
    }

    /// Notes the lane of `tenant`, when it is not known to exist.
    pub fn want(&mut self, tenant: &str) {
        let spec = lane_topic(&self.config, tenant);
        if !self.known.contains(&spec.name) {
            self.wanted.entry(spec.name.clone()).or_insert(spec);
        }
    }

    /// Creates the lanes ingested jobs need, outside any transaction. A failure is retried at
    /// the next call; the job's first fire, if it comes first, creates its lane itself.
    pub fn create_wanted(&mut self) {
        if self.wanted.is_empty() {
            return;
        }
        let specs: Vec<TopicSpec> = self.wanted.values().cloned().collect();
        match self.runtime.block_on(self.admin.ensure(&specs)) {
            Ok(_) => {
                for spec in specs {
                    self.wanted.remove(&spec.name);
                    self.known.insert(spec.name);
                }
            }
            Err(e) => warn!(error = %e, lanes = specs.len(), "could not create lanes; retrying"),
        }
    }

    /// The lane of `tenant`, which should exist by now: lanes are listed at start and created
    /// when a job needing one is ingested, between transactions. Only a lane deleted under a
    /// running node, or one whose creation failed, is created here, inside the transaction,
    /// where the admin calls hold it open (and a warning says so).
    pub fn ensure(&mut self, tenant: &str) -> Result<String, AdminError> {
        let spec = lane_topic(&self.config, tenant);
        if !self.known.contains(&spec.name) {
            warn!(lane = %spec.name, "creating a lane inside a firing transaction");
            self.runtime
                .block_on(self.admin.ensure(std::slice::from_ref(&spec)))?;
            self.wanted.remove(&spec.name);
            self.known.insert(spec.name.clone());
        }
        Ok(spec.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Framing;
    use crate::model::job::ScheduleSpec;

    fn limits() -> Limits {
        Limits::from_config(&Config::default())
    }

    fn def(id: &str, tenant: &str) -> JobDefinition {
        let every = ScheduleSpec::Interval {
            every_ms: 1_000,
            anchor_ms: 0,
        };
        JobDefinition {
            id: id.into(),
            tenant: tenant.into(),
            ..fire::tests::job(every)
        }
    }

    fn record<'a>(key: Option<&'a [u8]>, payload: Option<&'a [u8]>) -> JobRecord<'a> {
        JobRecord {
            key,
            payload,
            timestamp_ms: None,
        }
    }

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn a_record_without_a_usable_key_is_rejected_naming_the_rule() {
        let bytes = codec::encode(&def("a", "acme"), &Framing::SingleObject);
        for (key, says) in [
            (None, "has no key"),
            (Some(&b"\xff\xfe"[..]), "not UTF-8"),
            (Some(&b"b"[..]), "does not match the job id"),
        ] {
            match on_job(&record(key, Some(&bytes)), None, &limits(), NOW) {
                JobChange::Reject(Rejection::Key, reason) => {
                    assert!(reason.contains(says), "{reason}")
                }
                other => panic!("{key:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn undecodable_and_invalid_definitions_are_rejected() {
        let got = on_job(
            &record(Some(b"a"), Some(b"{not json")),
            None,
            &limits(),
            NOW,
        );
        assert!(
            matches!(&got, JobChange::Reject(Rejection::Decode, r) if r.contains("JobDefinition")),
            "{got:?}"
        );
        let mut bad = def("a", "acme");
        bad.schedule = ScheduleSpec::Cron {
            expr: "61 * * * *".into(),
            zone: "UTC".into(),
        };
        let bytes = codec::encode(&bad, &Framing::SingleObject);
        let got = on_job(&record(Some(b"a"), Some(&bytes)), None, &limits(), NOW);
        assert!(
            matches!(&got, JobChange::Reject(Rejection::Invalid, r) if r.contains("61")),
            "{got:?}"
        );
    }

    #[test]
    fn a_tombstone_deletes_only_a_job_that_exists() {
        let existing = fire::new_timer(
            def("a", "acme"),
            &Schedule::from_job(&def("a", "acme")).unwrap(),
            NOW,
        );
        let got = on_job(&record(Some(b"a"), None), Some(existing), &limits(), NOW);
        assert!(
            matches!(&got, JobChange::Delete { job } if job == "a"),
            "{got:?}"
        );
        let got = on_job(&record(Some(b"a"), None), None, &limits(), NOW);
        assert!(matches!(got, JobChange::Nothing), "{got:?}");
    }

    #[test]
    fn another_tenant_cannot_replace_a_job_and_an_older_revision_is_ignored() {
        let mut mine = def("a", "acme");
        mine.revision = 5;
        let existing = fire::new_timer(mine.clone(), &Schedule::from_job(&mine).unwrap(), NOW);
        let theirs = codec::encode(&def("a", "globex"), &Framing::SingleObject);
        let got = on_job(
            &record(Some(b"a"), Some(&theirs)),
            Some(existing.clone()),
            &limits(),
            NOW,
        );
        assert!(
            matches!(&got, JobChange::Reject(Rejection::Tenant, r)
                if r.contains("\"acme\"") && r.contains("\"globex\"")),
            "{got:?}"
        );
        let mut older = mine.clone();
        older.revision = 4;
        older.jitter_ms = 10;
        let bytes = codec::encode(&older, &Framing::SingleObject);
        let got = on_job(
            &record(Some(b"a"), Some(&bytes)),
            Some(existing.clone()),
            &limits(),
            NOW,
        );
        assert!(matches!(got, JobChange::Nothing), "{got:?}");
        let same = codec::encode(&mine, &Framing::SingleObject);
        let got = on_job(
            &record(Some(b"a"), Some(&same)),
            Some(existing),
            &limits(),
            NOW,
        );
        assert!(matches!(got, JobChange::Nothing), "{got:?}");
    }

    #[test]
    fn a_new_job_starts_when_its_record_was_written_within_a_day() {
        let d = def("a", "acme");
        let bytes = codec::encode(&d, &Framing::SingleObject);
        let written = NOW - 5_500;
        let mut m = record(Some(b"a"), Some(&bytes));
        m.timestamp_ms = Some(written);
        let JobChange::Put { state, .. } = on_job(&m, None, &limits(), NOW) else {
            panic!("not a put");
        };
        // Every second from the anchor: the first instant at or after the write.
        assert_eq!(state.next_fire_ms, Some((written / 1_000 + 1) * 1_000));
        // A timestamp from the future, or older than a day, is not believed.
        for t in [NOW + 60_000, NOW - 2 * MAX_WRITTEN_AGE_MS] {
            m.timestamp_ms = Some(t);
            let JobChange::Put { state, .. } = on_job(&m, None, &limits(), NOW) else {
                panic!("not a put");
            };
            assert_eq!(state.next_fire_ms, Some(NOW), "{t}");
        }
    }

    #[test]
    fn a_control_record_that_does_not_decode_is_rejected() {
        assert!(matches!(on_control(None), ControlChange::Nothing));
        assert!(matches!(
            on_control(Some(b"nope")),
            ControlChange::Reject(Rejection::Decode, r) if r.contains("ControlRecord")
        ));
        let trigger = codec::encode(
            &ControlRecord::Trigger { requested_ms: NOW },
            &Framing::SingleObject,
        );
        assert!(matches!(
            on_control(Some(&trigger)),
            ControlChange::Apply(ControlRecord::Trigger { requested_ms: NOW })
        ));
    }

    fn header<'a>(c: &'a RejectedCopy<'_>, name: &str) -> &'a str {
        let (_, v) = c.headers.iter().find(|(n, _)| *n == name).unwrap();
        std::str::from_utf8(v).unwrap()
    }

    #[test]
    fn a_rejected_copy_keeps_the_original_when_it_fits_and_names_it_when_not() {
        let max = 1 << 20;
        let c = rejected_copy(b"k", Some(b"v"), "bad", "jobs/3/7", max);
        assert_eq!((c.key, c.value), (Some(&b"k"[..]), Some(&b"v"[..])));
        assert_eq!(header(&c, "tocsin-reason"), "bad");
        assert_eq!(header(&c, "tocsin-source"), "jobs/3/7");
        assert_eq!(header(&c, "tocsin-original-bytes"), "2");
        assert_eq!(header(&c, "tocsin-copied"), "true");

        let big = vec![b'x'; max];
        let c = rejected_copy(b"k", Some(&big), "too big", "jobs/0/1", max);
        assert_eq!((c.key, c.value), (Some(&b"k"[..]), None));
        assert_eq!(header(&c, "tocsin-copied"), "false");
        assert!(header(&c, "tocsin-reason").contains("is not copied; it is at jobs/0/1"));
        // A key too long to keep without its value is dropped too.
        let long_key = vec![b'k'; MAX_REJECTED_KEY_BYTES + 1];
        let c = rejected_copy(&long_key, Some(&big), "too big", "jobs/0/1", max);
        assert_eq!(c.key, None);
        // An empty key is never written.
        let c = rejected_copy(b"", Some(b"v"), "no key", "jobs/0/2", max);
        assert_eq!(c.key, None);
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        let reason = "é".repeat(REJECT_HEADROOM_BYTES);
        let cut = truncate(&reason, 5);
        assert_eq!(cut, "éé…");
    }

    #[test]
    fn the_schedule_cache_starts_over_when_full() {
        let mut s = Schedules::default();
        let d = def("a", "acme");
        let parsed = s.of(&d).unwrap();
        assert!(Arc::ptr_eq(&parsed, &s.of(&d).unwrap()), "cached");
        s.forget("a");
        assert_eq!(s.len(), 0);
        for i in 0..SCHEDULE_CACHE {
            s.insert(format!("j{i}"), parsed.clone());
        }
        assert_eq!(s.len(), SCHEDULE_CACHE);
        s.insert("one more".into(), parsed.clone());
        assert_eq!(s.len(), 1);
        s.forget("one more");
        assert_eq!(s.len(), 0);
    }
}
