//! `tocsin jobs ...`: put, get, delete, pause, resume, trigger and backfill jobs.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

use crate::codec::{self, Framing};
use crate::config::Config;
use crate::kafka::partitioner::partition_for;
use crate::model::job::{
    DstGapPolicy, DstRepeatPolicy, HandlerKind, HandlerSpec, JobDefinition, MisfirePolicy,
    OverlapPolicy, RetryPolicy, ScheduleSpec,
};
use crate::model::records::ControlRecord;
use crate::model::validate::{validate, Limits};

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Create or replace a job (from flags, or from a JSON or TOML file with --file).
    Put(PutArgs),
    /// Print a job's definition as JSON (its latest record the scheduler would accept).
    Get { id: String },
    /// List the jobs on `jobs` (every partition's latest definition per job), filtered.
    List(ListArgs),
    /// Print the next fire instants of a job (UTC, then the job's local time).
    Next {
        id: String,
        /// How many instants.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=MAX_NEXT as i64))]
        count: u32,
        /// The instants after this one (ISO 8601) instead of after now.
        #[arg(long)]
        from: Option<String>,
    },
    /// Delete a job (a tombstone on `jobs`): it never fires again.
    Delete {
        id: String,
        /// Refuse unless the job belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Stop firing a job until it is resumed.
    Pause {
        id: String,
        /// Refuse unless the job belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Resume a paused job; missed instants follow its misfire policy.
    Resume {
        id: String,
        /// Refuse unless the job belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Fire a job now, outside its schedule.
    Trigger {
        id: String,
        /// Refuse unless the job belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Fire every instant of a job's schedule in [--from, --to).
    Backfill {
        id: String,
        /// Refuse unless the job belongs to this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// ISO 8601 instant, e.g. 2026-01-01T00:00:00Z.
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
    },
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only the jobs of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only the jobs with this label, KEY=VALUE (repeat the flag: every one must match).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Only paused jobs; `--paused=false`: only those not paused.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub paused: Option<bool>,
    /// A JSON array of the definitions, ordered by id.
    #[arg(long)]
    pub json: bool,
    /// Read the `jobs` topic itself rather than ask the fleet's nodes.
    #[arg(long)]
    pub from_topic: bool,
}

#[derive(Debug, Args)]
pub struct PutArgs {
    /// A JSON (.json) or TOML (.toml) file holding one job definition.
    #[arg(long, conflicts_with_all = ["id", "cron", "every", "at", "start", "end", "labels", "command"])]
    pub file: Option<PathBuf>,
    #[arg(long)]
    pub id: Option<String>,
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// Cron expression with 5, 6 or 7 fields, e.g. "*/5 * * * * *".
    #[arg(long, conflicts_with_all = ["every", "at"])]
    pub cron: Option<String>,
    /// IANA time zone of the cron expression.
    #[arg(long, default_value = "UTC")]
    pub zone: String,
    /// Fixed interval, e.g. 500ms, 10s, 5m, 1h.
    #[arg(long, conflicts_with = "at")]
    pub every: Option<String>,
    /// Phase anchor of --every (ISO 8601); instants are anchor + k * interval.
    #[arg(long)]
    pub anchor: Option<String>,
    /// One-shot instant (ISO 8601).
    #[arg(long)]
    pub at: Option<String>,
    /// No fire before this instant (ISO 8601).
    #[arg(long)]
    pub start: Option<String>,
    /// No fire at or after this instant (ISO 8601).
    #[arg(long)]
    pub end: Option<String>,
    /// What runs the job [default: kafka; exec with a trailing `-- PROGRAM ARGS…`].
    #[arg(long, value_enum)]
    pub handler: Option<HandlerKind>,
    /// Topic, URL, program or registered handler name.
    #[arg(long, conflicts_with = "command")]
    pub target: Option<String>,
    #[arg(long, default_value = "")]
    pub payload: String,
    /// An argument of an exec handler (repeat the flag; `--arg -c` works).
    #[arg(
        long = "arg",
        value_name = "ARG",
        allow_hyphen_values = true,
        conflicts_with = "command"
    )]
    pub args: Vec<String>,
    /// A label, KEY=VALUE (repeat the flag); `jobs list --label` filters on them.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    #[arg(long, default_value_t = 0)]
    pub jitter_ms: u64,
    #[arg(long)]
    pub max_fires: Option<u64>,
    /// What to do with instants missed while no node fired the job.
    #[arg(long, value_enum, default_value_t = MisfirePolicy::FireOnce)]
    pub misfire: MisfirePolicy,
    /// What to do when an instant falls due while the previous run is in flight.
    #[arg(long, value_enum, default_value_t = OverlapPolicy::Allow)]
    pub overlap: OverlapPolicy,
    /// A local time inside a spring-forward gap.
    #[arg(long, value_enum, default_value_t = DstGapPolicy::Shift)]
    pub dst_gap: DstGapPolicy,
    /// A local time that occurs twice when clocks fall back.
    #[arg(long, value_enum, default_value_t = DstRepeatPolicy::Once)]
    pub dst_repeat: DstRepeatPolicy,
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    #[arg(long, default_value_t = 300_000)]
    pub timeout_ms: u64,
    /// Validate and print the next 5 fire instants; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: the fires after this instant (ISO 8601) instead of after now.
    #[arg(long, requires = "dry_run")]
    pub from: Option<String>,
    /// An exec job's program and its arguments, after `--`:
    /// `jobs put --id j --every 1m -- sh -c 'echo hi'`.
    #[arg(last = true, value_name = "PROGRAM ARGS")]
    pub command: Vec<String>,
}

/// The most instants `jobs next` prints.
const MAX_NEXT: u32 = 1000;

pub async fn run(config: &Config, command: &JobsCommand) -> anyhow::Result<()> {
    let now = now_ms();
    match command {
        JobsCommand::Put(args) => {
            let def = definition_from_args(args)?;
            let limits = Limits::from_config(config);
            let schedule = validate(&def, &limits, now)?;
            if args.dry_run {
                let from = args.from.as_deref().map(parse_instant).transpose()?;
                print_next(&schedule, from.unwrap_or(now), 5);
                return Ok(());
            }
            if let Some(existing) = get(config, &def.id)? {
                if existing.tenant != def.tenant {
                    bail!(
                        "{}",
                        crate::scheduler::other_tenants_job(&def.id, &existing.tenant, &def.tenant)
                    );
                }
            }
            if let Some(warning) = target_warning(config, &def) {
                eprintln!("warning: {warning}");
            }
            put(config, &def).await?;
            println!("put {}", def.id);
        }
        JobsCommand::Get { id } => {
            let def = get(config, id)?.ok_or_else(|| anyhow!("job {id:?} not found"))?;
            println!("{}", serde_json::to_string_pretty(&def)?);
        }
        JobsCommand::List(args) => super::jobs_list::run(config, args).await?,
        JobsCommand::Next { id, count, from } => {
            let from = from.as_deref().map(parse_instant).transpose()?;
            let def = owned(config, id, None)?;
            let schedule = crate::model::schedule::Schedule::from_job(&def)?;
            if def.paused {
                eprintln!("note: job {id:?} is paused; it fires at these instants once resumed");
            }
            if print_next(&schedule, from.unwrap_or(now), *count) == 0 {
                eprintln!("job {id:?} has no fire instant left");
            }
        }
        JobsCommand::Delete { id, tenant } => {
            owned(config, id, tenant.as_deref())?;
            send(config, "jobs", id, None).await?;
            println!("deleted {id}");
        }
        JobsCommand::Pause { id, tenant } | JobsCommand::Resume { id, tenant } => {
            let paused = matches!(command, JobsCommand::Pause { .. });
            let mut def = owned(config, id, tenant.as_deref())?;
            def.paused = paused;
            def.revision += 1;
            put(config, &def).await?;
            println!("{} {id}", if paused { "paused" } else { "resumed" });
        }
        JobsCommand::Trigger { id, tenant } => {
            owned(config, id, tenant.as_deref())?;
            let record = ControlRecord::Trigger { requested_ms: now };
            send(
                config,
                "control",
                id,
                Some(codec::encode(&record, &Framing::SingleObject)),
            )
            .await?;
            println!("triggered {id}");
        }
        JobsCommand::Backfill {
            id,
            tenant,
            from,
            to,
        } => {
            let (from_ms, to_ms) = (parse_instant(from)?, parse_instant(to)?);
            if to_ms < from_ms {
                bail!(
                    "backfill range of job {id:?} is reversed: --to {to} is before --from {from}"
                );
            }
            owned(config, id, tenant.as_deref())?;
            let record = ControlRecord::Backfill { from_ms, to_ms };
            send(
                config,
                "control",
                id,
                Some(codec::encode(&record, &Framing::SingleObject)),
            )
            .await?;
            println!("backfill requested for {id}");
        }
    }
    Ok(())
}

/// Prints the first `count` instants of `schedule` at or after `from_ms`, one a line (UTC, then
/// local); returns how many there were.
fn print_next(schedule: &crate::model::schedule::Schedule, from_ms: i64, count: u32) -> u32 {
    let mut t = from_ms - 1;
    for printed in 0..count {
        let Some(next) = schedule.next_after(t) else {
            return printed;
        };
        let (utc, local) = schedule.describe_instant(next);
        println!("{utc} {local}");
        t = next;
    }
    count
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Writes a job definition to `jobs`, keyed by its id.
pub async fn put(config: &Config, def: &JobDefinition) -> anyhow::Result<()> {
    put_all(config, std::slice::from_ref(def)).await
}

/// The job's definition, or an error when it has none on `jobs` (a request for a job that does
/// not exist would be written, ignored by the scheduler, and reported as done) or belongs to
/// another tenant than `tenant`.
fn owned(config: &Config, id: &str, tenant: Option<&str>) -> anyhow::Result<JobDefinition> {
    let Some(def) = get(config, id)? else {
        bail!("job {id:?} not found on {}", config.topic("jobs"));
    };
    match tenant {
        Some(t) if t != def.tenant => {
            bail!("job {id:?} belongs to tenant {:?}, not {t:?}", def.tenant)
        }
        _ => Ok(def),
    }
}

/// How long a CLI write may wait for the broker before it fails.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes job definitions to `jobs` through one producer, in order.
pub async fn put_all(config: &Config, defs: &[JobDefinition]) -> anyhow::Result<()> {
    let producer = cli_producer(config)?;
    for def in defs {
        let value = codec::encode(def, &Framing::SingleObject);
        deliver(&producer, config, "jobs", &def.id, Some(value)).await?;
    }
    Ok(())
}

fn cli_producer(config: &Config) -> anyhow::Result<FutureProducer> {
    Ok(crate::kafka::producer_config(config)
        .set("message.timeout.ms", SEND_TIMEOUT.as_millis().to_string())
        .create()?)
}

async fn send(
    config: &Config,
    topic: &str,
    key: &str,
    value: Option<Vec<u8>>,
) -> anyhow::Result<()> {
    deliver(&cli_producer(config)?, config, topic, key, value).await
}

async fn deliver(
    producer: &FutureProducer,
    config: &Config,
    topic: &str,
    key: &str,
    value: Option<Vec<u8>>,
) -> anyhow::Result<()> {
    let topic = config.topic(topic);
    let mut record = FutureRecord::<str, [u8]>::to(&topic).key(key);
    if let Some(v) = &value {
        record = record.payload(v);
    }
    producer
        .send(record, SEND_TIMEOUT)
        .await
        .map_err(|(e, _)| anyhow!("could not write to {topic} at {}: {e}", config.bootstrap))?;
    Ok(())
}

/// The definition of a job as the scheduler holds it: its records, read from the one partition
/// its id maps to, folded as the scheduler's ingest folds them (a rejected record, garbage or
/// another tenant's, leaves the job as it was; see `jobs_list::apply`).
pub fn get(config: &Config, id: &str) -> anyhow::Result<Option<JobDefinition>> {
    let limits = Limits::from_config(config);
    let mut jobs = std::collections::BTreeMap::new();
    for (value, timestamp_ms) in key_messages(config, "jobs", id)? {
        super::jobs_list::apply(
            &mut jobs,
            &limits,
            super::jobs_list::JobRecord {
                key: id.as_bytes(),
                value: value.as_deref(),
                timestamp_ms,
            },
        );
    }
    Ok(jobs.remove(id))
}

/// Every value (`None` for a tombstone) of `key` on `topic` of the config, in order: its
/// partition (placed as Kafka's Java client places it), read `read_committed` from the start to
/// the end it had when asked.
pub fn key_records(
    config: &Config,
    topic: &str,
    key: &str,
) -> anyhow::Result<Vec<Option<Vec<u8>>>> {
    Ok(key_messages(config, topic, key)?
        .into_iter()
        .map(|(value, _)| value)
        .collect())
}

/// [`key_records`] with each record's timestamp (epoch ms).
fn key_messages(
    config: &Config,
    topic: &str,
    key: &str,
) -> anyhow::Result<Vec<(Option<Vec<u8>>, i64)>> {
    let topic = config.topic(topic);
    let consumer: BaseConsumer =
        crate::kafka::consumer_config(config, "tocsin-cli-get").create()?;
    let partitions = partitions(&consumer, &topic)?.len() as u32;
    let p = partition_for(key.as_bytes(), partitions) as i32;
    // A partition just created may have no leader for a moment (a new 1024-partition topic
    // takes seconds): retry that, within the command's time bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (low, high) = loop {
        match consumer.fetch_watermarks(&topic, p, Duration::from_secs(10)) {
            Ok(w) => break w,
            Err(e)
                if std::time::Instant::now() < deadline
                    && matches!(
                        e.rdkafka_error_code(),
                        Some(
                            RDKafkaErrorCode::NotLeaderForPartition
                                | RDKafkaErrorCode::LeaderNotAvailable
                                | RDKafkaErrorCode::UnknownTopicOrPartition
                        )
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => {
                return Err(e).with_context(|| format!("could not read the offsets of {topic}/{p}"))
            }
        }
    };
    let mut found = Vec::new();
    if high <= low {
        return Ok(found);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, p, Offset::Offset(low))?;
    consumer.assign(&tpl)?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            let pos = consumer.position()?;
            let done = pos
                .elements()
                .first()
                .and_then(|e| e.offset().to_raw())
                .is_some_and(|o| o >= high);
            if done || std::time::Instant::now() > deadline {
                break;
            }
            continue;
        };
        let m = m?;
        if m.key() == Some(key.as_bytes()) {
            let timestamp = m.timestamp().to_millis().unwrap_or(i64::MAX);
            found.push((m.payload().map(<[u8]>::to_vec), timestamp));
        }
        if m.offset() + 1 >= high {
            break;
        }
    }
    Ok(found)
}

/// The partition ids of `topic`, or an error saying how to create it when it does not exist.
pub fn partitions<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> anyhow::Result<Vec<i32>> {
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = md
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if partitions.is_empty() {
        bail!("topic {topic} does not exist; run `tocsin topics ensure`");
    }
    Ok(partitions)
}

pub fn parse_instant(s: &str) -> anyhow::Result<i64> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            anyhow!("invalid instant {s:?}: {e} (expected ISO 8601, e.g. 2026-01-01T00:00:00Z)")
        })
}

/// Parses `500ms`, `10s`, `5m`, `1h`, `1d` (or a plain number of milliseconds).
pub fn parse_duration_ms(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        anyhow!("invalid duration {s:?}: expected a number and a unit (ms, s, m, h, d)")
    })?;
    let factor = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => bail!("invalid duration {s:?}: unknown unit {unit:?} (use ms, s, m, h or d)"),
    };
    n.checked_mul(factor)
        .ok_or_else(|| anyhow!("invalid duration {s:?}: over the limit of {} ms", u64::MAX))
}

/// Why a `kafka` job's runs would go to `dead` as things stand, as the scheduler looks its
/// target up (`scheduler::look_up_target`): the topic does not exist or refuses writes.
/// `None` when it takes them, when a worker delivers, or when the broker cannot tell.
fn target_warning(config: &Config, def: &JobDefinition) -> Option<String> {
    if def.handler.kind != HandlerKind::Kafka
        || config.scheduler.kafka_delivery != crate::config::KafkaDelivery::Direct
    {
        return None;
    }
    let consumer = super::probe(config).ok()?;
    match crate::scheduler::look_up_target(
        consumer.client(),
        &config.topic_prefix,
        &def.handler.target,
    )
    .ok()?
    {
        crate::scheduler::Target::Writable => None,
        crate::scheduler::Target::Refused(reason) => Some(format!(
            "{reason}; until it takes writes, each run of job {:?} goes to dead \
             (runbooks/target-dead.md)",
            def.id
        )),
    }
}

fn definition_from_args(a: &PutArgs) -> anyhow::Result<JobDefinition> {
    if let Some(path) = &a.file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("could not read {}", path.display()))?;
        let def: JobDefinition = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => toml::from_str(&text)
                .map_err(|e| anyhow!("invalid job file {}: {e}", path.display()))?,
            _ => serde_json::from_str(&text)
                .map_err(|e| anyhow!("invalid job file {}: {e}", path.display()))?,
        };
        return Ok(def);
    }
    let id =
        a.id.clone()
            .ok_or_else(|| anyhow!("--id is required (or --file)"))?;
    let schedule = match (&a.cron, &a.every, &a.at) {
        (Some(expr), None, None) => ScheduleSpec::Cron {
            expr: expr.clone(),
            zone: a.zone.clone(),
        },
        (None, Some(every), None) => ScheduleSpec::Interval {
            every_ms: parse_duration_ms(every)?,
            anchor_ms: a
                .anchor
                .as_deref()
                .map(parse_instant)
                .transpose()?
                .unwrap_or(0),
        },
        (None, None, Some(at)) => ScheduleSpec::Once {
            at_ms: parse_instant(at)?,
        },
        _ => bail!("give exactly one of --cron, --every or --at"),
    };
    let (kind, target, args) = handler_from_args(a)?;
    Ok(JobDefinition {
        id,
        tenant: a.tenant.clone(),
        schedule,
        start_ms: a.start.as_deref().map(parse_instant).transpose()?,
        end_ms: a.end.as_deref().map(parse_instant).transpose()?,
        max_fires: a.max_fires,
        jitter_ms: a.jitter_ms,
        dst_gap: a.dst_gap,
        dst_repeat: a.dst_repeat,
        misfire: a.misfire,
        catch_up_window_ms: crate::model::job::default_catch_up_window_ms(),
        overlap: a.overlap,
        paused: false,
        handler: HandlerSpec {
            kind,
            target,
            payload: a.payload.clone().into_bytes(),
            headers: Default::default(),
            method: None,
            args,
        },
        timeout_ms: a.timeout_ms,
        retry: RetryPolicy {
            max_attempts: a.max_attempts,
            ..RetryPolicy::default()
        },
        labels: parse_labels(&a.labels)?,
        revision: 0,
    })
}

/// The handler's kind, target and arguments: from `--handler`, `--target` and `--arg`, or from
/// a trailing `-- PROGRAM ARGS…`, which makes an exec job.
fn handler_from_args(a: &PutArgs) -> anyhow::Result<(HandlerKind, String, Vec<String>)> {
    let Some((program, args)) = a.command.split_first() else {
        let kind = a.handler.unwrap_or(HandlerKind::Kafka);
        return Ok((kind, a.target.clone().unwrap_or_default(), a.args.clone()));
    };
    match a.handler {
        None | Some(HandlerKind::Exec) => Ok((HandlerKind::Exec, program.clone(), args.to_vec())),
        Some(other) => bail!(
            "a trailing `-- {program} …` is the program of an exec job, but --handler is {}; \
             give the {} handler's target with --target",
            handler_name(other),
            handler_name(other)
        ),
    }
}

fn handler_name(kind: HandlerKind) -> String {
    use clap::ValueEnum;
    kind.to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// `KEY=VALUE` flags as a map; an empty key, a missing `=` or a key given twice is an error
/// naming the flag's value.
pub fn parse_labels(
    flags: &[String],
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut labels = std::collections::BTreeMap::new();
    for flag in flags {
        let Some((k, v)) = flag.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            bail!("invalid --label {flag:?}: expected KEY=VALUE with a non-empty KEY");
        };
        if labels.insert(k.to_owned(), v.to_owned()).is_some() {
            bail!("invalid --label {flag:?}: label {k:?} is given twice");
        }
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_name_bad_values() {
        assert_eq!(parse_duration_ms("500ms").unwrap(), 500);
        assert_eq!(parse_duration_ms("10s").unwrap(), 10_000);
        assert_eq!(parse_duration_ms("2m").unwrap(), 120_000);
        let e = parse_duration_ms("5 parsecs").unwrap_err().to_string();
        assert!(e.contains("5 parsecs"), "{e}");
    }

    #[test]
    fn instants_parse_as_iso_8601() {
        assert_eq!(parse_instant("1970-01-01T00:00:01Z").unwrap(), 1_000);
        assert!(parse_instant("yesterday")
            .unwrap_err()
            .to_string()
            .contains("yesterday"));
    }
}
