//! The target topic of `delay`: where the jobs' payloads land, as a user's consumer of delayed
//! messages reads them. It lies outside the run's topic prefix (the scheduler and the worker
//! refuse targets under it) and stamps each record with its broker append time
//! (`message.timestamp.type=LogAppendTime`), so a record's timestamp is when it was written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{BorrowedMessage, Message, Timestamp};
use tocsin::config::Config;
use tocsin::model::records::run_id;

use crate::audit::{header, Audit, Check, Obs};
use crate::load::{job_id, job_index};

/// The run's prefix without its trailing dot, plus `-target`.
pub fn name(config: &Config) -> String {
    format!("{}-target", config.topic_prefix.trim_end_matches('.'))
}

fn admin(config: &Config) -> Result<AdminClient<DefaultClientContext>> {
    tocsin::kafka::base_config(config)
        .create()
        .context("could not create an admin client")
}

/// Creates `topic` with `partitions` partitions and append-time timestamps, and waits until
/// broker metadata shows all of them (the consumer is assigned every one from the start).
pub async fn create(config: &Config, topic: &str, partitions: u32) -> Result<()> {
    let client = admin(config)?;
    let new = NewTopic::new(
        topic,
        partitions as i32,
        TopicReplication::Fixed(config.topics.replication_factor),
    )
    .set("message.timestamp.type", "LogAppendTime")
    .set("cleanup.policy", "delete");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in client.create_topics(&[new], &opts).await? {
        match r {
            Ok(_) => {}
            Err((t, RDKafkaErrorCode::TopicAlreadyExists)) => {
                bail!("target topic {t} exists already (from another run?)")
            }
            Err((t, code)) => bail!("could not create target topic {t}: {code}"),
        }
    }
    let started = Instant::now();
    loop {
        let md = client
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let ready = md.topics().iter().any(|t| {
            t.name() == topic
                && t.error().is_none()
                && t.partitions().len() == partitions as usize
                && t.partitions().iter().all(|p| p.leader() >= 0)
        });
        if ready {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("target topic {topic} has no leader for every partition after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes `topic`.
pub async fn delete(config: &Config, topic: &str) -> Result<()> {
    let client = admin(config)?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in client.delete_topics(&[topic], &opts).await? {
        if let Err((t, code)) = r {
            bail!("could not delete topic {t}: {code}");
        }
    }
    Ok(())
}

/// What every record of the target must be.
pub struct Expect {
    /// The instant every job is due at.
    pub at_ms: i64,
    pub payload_bytes: usize,
    /// Whether the record must carry `tocsin-scheduled-ms` (direct delivery writes it; a
    /// worker writes only `tocsin-run-id`, so without it the instant is `at_ms`).
    pub scheduled_header: bool,
    /// The tenant of each job index.
    pub tenant_of: Arc<Vec<u16>>,
}

/// Reads the whole target topic from its beginning, `read_committed`, for the whole run.
pub fn audit(config: &Config, topic: &str, partitions: u32, expect: Expect) -> Result<Audit> {
    let check: Check = Box::new(move |m, seen_ms| check(m, &expect, seen_ms));
    Audit::reading(
        config,
        "tocsin-loadtest-target",
        &[(topic.to_owned(), partitions)],
        check,
    )
}

/// The delivery a target record is, if it is a well-formed one of a loadtest job: the key is a
/// job id, the payload is the job's, the timestamp is an append time, `tocsin-run-id` is the
/// run id of (job, scheduled instant) and `tocsin-scheduled-ms`, where present, that instant.
fn check(m: &BorrowedMessage<'_>, expect: &Expect, seen_ms: i64) -> Option<Obs> {
    let job = job_index(std::str::from_utf8(m.key()?).ok()?)?;
    let payload = m.payload().unwrap_or_default();
    if payload.len() != expect.payload_bytes || payload.iter().any(|b| *b != b'x') {
        return None;
    }
    let Timestamp::LogAppendTime(appended) = m.timestamp() else {
        return None;
    };
    let scheduled_ms = match header(m, "tocsin-scheduled-ms") {
        Some(v) => v.parse().ok()?,
        None if !expect.scheduled_header => expect.at_ms,
        None => return None,
    };
    if header(m, "tocsin-run-id")? != run_id(&job_id(u64::from(job)), scheduled_ms) {
        return None;
    }
    Some(Obs {
        job,
        tenant: *expect.tenant_of.get(job as usize).unwrap_or(&u16::MAX),
        scheduled_ms,
        seen_ms,
        timestamp_ms: appended,
        not_before_ms: scheduled_ms,
    })
}
