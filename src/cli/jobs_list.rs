//! `tocsin jobs list`: every job on `jobs` as the scheduler holds it. The fleet answers: each
//! live node (from the heartbeats on `nodes`) lists the jobs of the partitions it has restored
//! (`GET /v1/jobs`, page by page), and the answers are merged, one node per partition (the owner
//! the heartbeats name when two claim one during a rebalance). A partition no node answers for
//! (unowned, restoring, its owner unreachable, or no fleet at all, as under `tocsin dev`) is read
//! from the topic itself (`read_committed`, from the start to the end it had when asked), and
//! `--from-topic` reads every partition that way.
//!
//! Which record of a key counts follows the scheduler's ingest (`scheduler::engine`): a
//! tombstone deletes the job; a record that does not decode, names another id than its key,
//! fails validation, comes from another tenant than the job's owner or carries an older
//! revision is rejected there and leaves the job as it was, so it is skipped here too.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::jobs::{parse_labels, ListArgs};
use crate::api::directory;
use crate::codec;
use crate::config::Config;
use crate::model::job::{JobDefinition, ScheduleSpec};
use crate::model::validate::{validate, Limits};

/// The longest `jobs list` reads before it gives up rather than print a partial list.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn run(config: &Config, args: &ListArgs) -> anyhow::Result<()> {
    let labels = parse_labels(&args.labels)?;
    let jobs = gather(config, args).await?;
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

/// The jobs of every partition: the fleet's answers, and the topic for what they leave out.
async fn gather(
    config: &Config,
    args: &ListArgs,
) -> anyhow::Result<BTreeMap<String, JobDefinition>> {
    let now = super::jobs::now_ms();
    let config2 = config.clone();
    let from_topic = args.from_topic;
    let (partitions, nodes) = tokio::task::spawn_blocking(move || {
        let probe = super::probe(&config2)?;
        let partitions = super::jobs::partitions(&probe, &config2.topic("jobs"))?;
        let nodes = match from_topic {
            true => directory::Nodes::default(),
            // Without a readable `nodes` topic there is no fleet to ask: the topic answers.
            false => directory::read(&config2, now).unwrap_or_else(|e| {
                eprintln!("note: could not read the fleet's heartbeats ({e:#}); reading the topic");
                directory::Nodes::default()
            }),
        };
        anyhow::Ok((partitions, nodes))
    })
    .await??;
    let mut jobs = BTreeMap::new();
    let mut answered: BTreeSet<i32> = BTreeSet::new();
    let client = reqwest::Client::builder()
        .timeout(ASK_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    for beat in nodes.live(now) {
        let Some(base) = &beat.http else { continue };
        let answer = match ask_node(&client, base, args).await {
            Ok(a) => a,
            Err(e) => {
                eprintln!(
                    "note: node {} did not answer ({e:#}); its partitions are read from the topic",
                    beat.node_id
                );
                continue;
            }
        };
        // One answer per partition: the node the heartbeats name its owner, else the first.
        let theirs: BTreeSet<i32> = answer
            .partitions
            .into_iter()
            .filter(|p| !answered.contains(p))
            .filter(|p| {
                nodes
                    .owner(*p, now)
                    .is_none_or(|o| o.node_id == beat.node_id)
            })
            .collect();
        for (p, def) in answer.jobs {
            if theirs.contains(&p) {
                jobs.insert(def.id.clone(), def);
            }
        }
        answered.extend(theirs);
    }
    let left: Vec<i32> = partitions
        .iter()
        .filter(|p| !answered.contains(p))
        .copied()
        .collect();
    if !left.is_empty() {
        if !answered.is_empty() {
            eprintln!(
                "note: no node answered for partitions {left:?} of jobs; read from the topic"
            );
        }
        let config = config.clone();
        let from_topic =
            tokio::task::spawn_blocking(move || read_jobs(&config, Some(&left))).await??;
        jobs.extend(from_topic);
    }
    Ok(jobs)
}

/// What one node answered: the partitions it answers for, and their jobs (with the filters
/// applied by the node).
struct NodeAnswer {
    partitions: Vec<i32>,
    jobs: Vec<(i32, JobDefinition)>,
}

/// How long one question to a node waits for its answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// Jobs asked for per page.
const PAGE: usize = 1000;

/// Every page of a node's `GET /v1/jobs`, with `args`' filters.
async fn ask_node(
    client: &reqwest::Client,
    base: &str,
    args: &ListArgs,
) -> anyhow::Result<NodeAnswer> {
    let mut query: Vec<(&str, String)> = vec![("limit", PAGE.to_string())];
    if let Some(t) = &args.tenant {
        query.push(("tenant", t.clone()));
    }
    for l in &args.labels {
        query.push(("label", l.clone()));
    }
    if let Some(p) = args.paused {
        query.push(("paused", p.to_string()));
    }
    let url = format!("{base}/v1/jobs");
    let mut out = NodeAnswer {
        partitions: Vec::new(),
        jobs: Vec::new(),
    };
    let mut after: Option<String> = None;
    loop {
        let mut q = query.clone();
        if let Some(a) = &after {
            q.push(("after", a.clone()));
        }
        let reply = client
            .get(&url)
            .query(&q)
            .send()
            .await
            .with_context(|| format!("could not ask {url}"))?;
        let code = reply.status();
        let text = reply.text().await?;
        if !code.is_success() {
            bail!("{url} answered {code}: {}", text.trim());
        }
        let page: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{url} answered {text:?}"))?;
        let ints = |v: &serde_json::Value| -> Vec<i32> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p.as_i64().map(|p| p as i32))
                .collect()
        };
        // The partitions of the first page: a later page's list may differ after a rebalance,
        // and the jobs of a partition gained meanwhile were not all listed.
        if after.is_none() {
            out.partitions = ints(&page["partitions"]);
        }
        for item in page["jobs"].as_array().into_iter().flatten() {
            let p = item["partition"].as_i64().unwrap_or(-1) as i32;
            let def: JobDefinition = serde_json::from_value(item["job"].clone())
                .with_context(|| format!("{url} answered a job that does not read: {item}"))?;
            out.jobs.push((p, def));
        }
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return Ok(out),
        }
    }
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

/// Every job on the config's `jobs` topic (or on `only` of its partitions), by id.
pub fn read_jobs(
    config: &Config,
    only: Option<&[i32]>,
) -> anyhow::Result<BTreeMap<String, JobDefinition>> {
    let topic = config.topic("jobs");
    let consumer: BaseConsumer = crate::kafka::consumer_config(config, "tocsin-cli-list")
        .set("enable.partition.eof", "true")
        .create()?;
    let partitions = match only {
        Some(only) => only.to_vec(),
        None => super::jobs::partitions(&consumer, &topic)?,
    };
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
