//! `tocsin jobs list`: every job on `jobs` as the scheduler holds it, read from the topic
//! itself (every partition, `read_committed`, from the start to the end it had when asked).
//!
//! Which record of a key counts follows the scheduler's ingest (`scheduler::engine`): a
//! tombstone deletes the job; a record that does not decode, names another id than its key,
//! fails validation, comes from another tenant than the job's owner or carries an older
//! revision is rejected there and leaves the job as it was, so it is skipped here too.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::jobs::{parse_labels, ListArgs};
use crate::codec;
use crate::config::Config;
use crate::model::job::{JobDefinition, ScheduleSpec};
use crate::model::validate::{validate, Limits};

/// The longest `jobs list` reads before it gives up rather than print a partial list.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

pub fn run(config: &Config, args: &ListArgs) -> anyhow::Result<()> {
    let labels = parse_labels(&args.labels)?;
    let jobs = read_jobs(config)?;
    let shown: Vec<&JobDefinition> = jobs
        .values()
        .filter(|d| args.tenant.as_ref().is_none_or(|t| &d.tenant == t))
        .filter(|d| args.paused.is_none_or(|p| d.paused == p))
        .filter(|d| labels.iter().all(|(k, v)| d.labels.get(k) == Some(v)))
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(());
    }
    let rows: Vec<[String; 5]> = shown
        .iter()
        .map(|d| {
            [
                d.id.clone(),
                d.tenant.clone(),
                describe_schedule(&d.schedule),
                if d.paused { "paused" } else { "active" }.to_owned(),
                format!("{} {}", handler_name(d), d.handler.target),
            ]
        })
        .collect();
    let header = ["ID", "TENANT", "SCHEDULE", "STATE", "HANDLER"].map(str::to_owned);
    let mut widths = [0usize; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (w, cell) in widths.iter().zip(row) {
            line.push_str(&format!("{cell:<w$}  "));
        }
        line.push_str(&row[4]);
        println!("{}", line.trim_end());
    }
    Ok(())
}

fn handler_name(d: &JobDefinition) -> String {
    serde_json::to_value(d.handler.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn describe_schedule(s: &ScheduleSpec) -> String {
    let instant = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
            .unwrap_or_else(|| format!("{ms} ms"))
    };
    match s {
        ScheduleSpec::Cron { expr, zone } => format!("cron \"{expr}\" {zone}"),
        ScheduleSpec::Interval {
            every_ms,
            anchor_ms: 0,
        } => format!("every {every_ms}ms"),
        ScheduleSpec::Interval {
            every_ms,
            anchor_ms,
        } => format!("every {every_ms}ms from {}", instant(*anchor_ms)),
        ScheduleSpec::Once { at_ms } => format!("at {}", instant(*at_ms)),
    }
}

/// One record of `jobs` as the list folds it.
pub struct JobRecord<'a> {
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
    /// The record's timestamp: the instant its validation is judged at (the scheduler judges
    /// a record when it ingests it, shortly after it was written).
    pub timestamp_ms: i64,
}

/// Applies one record to the jobs held, as the scheduler's ingest does (see the module doc).
pub fn apply(jobs: &mut BTreeMap<String, JobDefinition>, limits: &Limits, r: JobRecord<'_>) {
    let Ok(id) = std::str::from_utf8(r.key) else {
        return;
    };
    let Some(bytes) = r.value else {
        jobs.remove(id);
        return;
    };
    let Ok(def) = codec::decode::<JobDefinition>(bytes) else {
        return;
    };
    if def.id != id || validate(&def, limits, r.timestamp_ms).is_err() {
        return;
    }
    if let Some(current) = jobs.get(id) {
        if current.tenant != def.tenant || (def.revision != 0 && def.revision < current.revision) {
            return;
        }
    }
    jobs.insert(def.id.clone(), def);
}

/// Every job on the config's `jobs` topic, by id.
pub fn read_jobs(config: &Config) -> anyhow::Result<BTreeMap<String, JobDefinition>> {
    let topic = config.topic("jobs");
    let consumer: BaseConsumer = crate::kafka::consumer_config(config, "tocsin-cli-list")
        .set("enable.partition.eof", "true")
        .create()?;
    let partitions = super::jobs::partitions(&consumer, &topic)?;
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(&topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let limits = Limits::from_config(config);
    let mut jobs = BTreeMap::new();
    // A partition is read once it reports its end (with `read_committed`, the end of what
    // is committed); an empty partition reports it at once.
    let mut pending: HashSet<i32> = partitions.iter().copied().collect();
    let deadline = Instant::now() + READ_TIMEOUT;
    while !pending.is_empty() {
        if Instant::now() > deadline {
            let mut left: Vec<i32> = pending.into_iter().collect();
            left.sort_unstable();
            bail!(
                "could not read {topic} to its end within {} s: partitions {left:?} did not \
                 answer",
                READ_TIMEOUT.as_secs()
            );
        }
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                pending.remove(&p);
            }
            Some(Err(e)) => {
                return Err(anyhow!(e)).with_context(|| format!("could not read {topic}"));
            }
            Some(Ok(m)) => {
                let Some(key) = m.key() else { continue };
                apply(
                    &mut jobs,
                    &limits,
                    JobRecord {
                        key,
                        value: m.payload(),
                        timestamp_ms: m.timestamp().to_millis().unwrap_or(i64::MAX),
                    },
                );
            }
        }
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Framing;

    fn job(id: &str, tenant: &str, revision: u64) -> JobDefinition {
        serde_json::from_value(serde_json::json!({
            "id": id,
            "tenant": tenant,
            "revision": revision,
            "schedule": {"interval": {"every_ms": 60_000, "anchor_ms": 0}},
            "handler": {"kind": "kafka", "target": "out"},
        }))
        .unwrap()
    }

    fn fold(records: &[(&str, Option<Vec<u8>>)]) -> BTreeMap<String, JobDefinition> {
        let limits = Limits::from_config(&Config::default());
        let mut jobs = BTreeMap::new();
        for (key, value) in records {
            apply(
                &mut jobs,
                &limits,
                JobRecord {
                    key: key.as_bytes(),
                    value: value.as_deref(),
                    timestamp_ms: 1_700_000_000_000,
                },
            );
        }
        jobs
    }

    fn enc(def: &JobDefinition) -> Option<Vec<u8>> {
        Some(codec::encode(def, &Framing::SingleObject))
    }

    #[test]
    fn the_list_keeps_what_the_scheduler_keeps() {
        let mut interval = job("a", "acme", 2);
        interval.paused = true;
        let jobs = fold(&[
            ("a", enc(&job("a", "acme", 1))),
            // Replaced by a newer revision of the owner...
            ("a", enc(&interval)),
            // ...not by an older one, another tenant's, garbage, or a record under another key.
            ("a", enc(&job("a", "acme", 1))),
            ("a", enc(&job("a", "mallory", 3))),
            ("a", Some(b"not avro".to_vec())),
            ("b", enc(&job("a", "acme", 4))),
            // Deleted, then created again by anyone.
            ("c", enc(&job("c", "acme", 0))),
            ("c", None),
            ("c", enc(&job("c", "globex", 0))),
            // An invalid definition is rejected, so it never existed.
            ("d", enc(&job("d", "not a tenant!", 0))),
        ]);
        assert_eq!(jobs.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(jobs["a"], interval);
        assert_eq!(jobs["c"].tenant, "globex");
    }
}
