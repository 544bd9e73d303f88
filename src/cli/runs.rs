//! `tocsin runs`: the run history on `runs`, in either serialization (`topics.serialization`).

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Subcommand, ValueEnum};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::jobs::{key_records, now_ms, parse_duration_ms, parse_instant};
use crate::config::Config;
use crate::history::{decode_row, RunRow};

#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// Print run reports as they arrive on `runs` (from `--since`, then following).
    Tail(TailArgs),
    /// Print every report of one run, in order: its whole story.
    Get {
        /// The run id (32 lowercase hex digits, as `tocsin-run-id` and the history table show it).
        run_id: String,
        /// One JSON object per report.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct TailArgs {
    /// Only the runs of this job.
    #[arg(long)]
    pub job: Option<String>,
    /// Only the runs of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only reports of this status.
    #[arg(long, value_enum)]
    pub status: Option<Status>,
    /// Start this long ago (`10m`, `2h`, `1d`) or at this instant (`2026-01-01T00:00:00Z`);
    /// without it, only what arrives from now on.
    #[arg(long)]
    pub since: Option<String>,
    /// One JSON object per report.
    #[arg(long)]
    pub json: bool,
    /// Stop at the end of the topic instead of following it.
    #[arg(long)]
    pub no_follow: bool,
}

/// The statuses of a run report (`src/history`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Status {
    Fired,
    Running,
    Succeeded,
    Failed,
    Retrying,
    Dead,
    Skipped,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Fired => "fired",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Retrying => "retrying",
            Status::Dead => "dead",
            Status::Skipped => "skipped",
        }
    }
}

pub async fn run(config: &Config, command: &RunsCommand) -> anyhow::Result<()> {
    match command {
        RunsCommand::Get { run_id, json } => get(config, run_id, *json),
        RunsCommand::Tail(args) => tail(config, args),
    }
}

fn get(config: &Config, run_id: &str, json: bool) -> anyhow::Result<()> {
    if run_id.len() != 32
        || !run_id
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        bail!("invalid run id {run_id:?}: a run id is 32 lowercase hex digits");
    }
    let records = key_records(config, "runs", run_id)?;
    if records.is_empty() {
        bail!(
            "run {run_id} not found on {} (it may be older than the topic's retention)",
            config.topic("runs")
        );
    }
    for (i, bytes) in records.into_iter().flatten().enumerate() {
        let row =
            decode_row(&bytes).with_context(|| format!("report {} of run {run_id}", i + 1))?;
        print(&row, json)?;
    }
    Ok(())
}

/// The instant `--since` names: an RFC 3339 instant, or a duration before `now`.
fn since_ms(since: &str, now: i64) -> anyhow::Result<i64> {
    if since.contains('T') {
        return parse_instant(since);
    }
    let ago = parse_duration_ms(since).map_err(|e| {
        anyhow!("invalid --since {since:?}: {e}; or give an instant (2026-01-01T00:00:00Z)")
    })?;
    Ok(now.saturating_sub(i64::try_from(ago).unwrap_or(i64::MAX)))
}

fn tail(config: &Config, a: &TailArgs) -> anyhow::Result<()> {
    let start = a
        .since
        .as_deref()
        .map(|s| since_ms(s, now_ms()))
        .transpose()?;
    let topic = config.topic("runs");
    let consumer: BaseConsumer =
        crate::kafka::consumer_config(config, "tocsin-cli-runs-tail").create()?;
    let partitions = super::jobs::partitions(&consumer, &topic)?;
    // Where each partition ends now: the start without --since (or past its last record),
    // and where --no-follow stops.
    let mut ends = std::collections::HashMap::new();
    for p in &partitions {
        ends.insert(
            *p,
            consumer
                .fetch_watermarks(&topic, *p, Duration::from_secs(10))?
                .1,
        );
    }
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(&topic, *p, start.map_or(Offset::End, Offset::Offset))?;
    }
    if start.is_some() {
        tpl = consumer.offsets_for_times(tpl, Duration::from_secs(10))?;
    }
    let mut from = TopicPartitionList::new();
    for e in tpl.elements() {
        let at = match e.offset() {
            Offset::Offset(o) => Offset::Offset(o),
            _ => Offset::Offset(ends[&e.partition()]),
        };
        from.add_partition_offset(&topic, e.partition(), at)?;
    }
    let tpl = from;
    // The next offset to read per partition: where it starts, then past each record read.
    let mut next: std::collections::HashMap<i32, i64> = tpl
        .elements()
        .iter()
        .map(|e| (e.partition(), e.offset().to_raw().unwrap_or(0)))
        .collect();
    consumer.assign(&tpl)?;
    loop {
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            if a.no_follow && reached(&consumer, &next, &ends)? {
                return Ok(());
            }
            continue;
        };
        let m = m?;
        next.insert(m.partition(), m.offset() + 1);
        let Some(bytes) = m.payload() else { continue };
        let row = match decode_row(bytes) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped {topic}/{}/{}: {e}", m.partition(), m.offset());
                continue;
            }
        };
        let keep = a.job.as_ref().is_none_or(|j| *j == row.job_id)
            && a.tenant.as_ref().is_none_or(|t| *t == row.tenant)
            && a.status.is_none_or(|s| s.as_str() == row.status);
        if keep {
            print(&row, a.json)?;
        }
    }
}

/// Whether every partition is read to `ends`: by the records read, or by the consumer's
/// position, which also steps over the transaction markers that end a partition.
fn reached(
    consumer: &BaseConsumer,
    next: &std::collections::HashMap<i32, i64>,
    ends: &std::collections::HashMap<i32, i64>,
) -> anyhow::Result<bool> {
    let pos = consumer.position()?;
    Ok(ends.iter().all(|(p, end)| {
        next.get(p).is_some_and(|n| n >= end)
            || pos.elements().iter().any(|e| {
                e.partition() == *p && matches!(e.offset(), Offset::Offset(o) if o >= *end)
            })
    }))
}

fn print(r: &RunRow, json: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let line = if json {
        serde_json::to_string(r)?
    } else {
        text(r)
    };
    // A closed pipe (`| head`) ends the command quietly.
    if writeln!(out, "{line}").is_err() {
        std::process::exit(0);
    }
    Ok(())
}

fn instant(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| ms.to_string())
}

/// One line: when, status, attempt, job, tenant, run, then what is known of node, worker,
/// duration and error.
fn text(r: &RunRow) -> String {
    let mut line = format!(
        "{} {:9} attempt {} job {} tenant {} run {} scheduled {}",
        instant(r.updated_ms),
        r.status,
        r.attempt,
        r.job_id,
        r.tenant,
        r.run_id,
        instant(r.scheduled_ms)
    );
    for (k, v) in [("node", &r.node), ("worker", &r.worker)] {
        if let Some(v) = v {
            line.push_str(&format!(" {k} {v}"));
        }
    }
    if let Some(d) = r.duration_ms {
        line.push_str(&format!(" took {d}ms"));
    }
    if let Some(e) = &r.error {
        line.push_str(&format!(" error {e:?}"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_duration_ago_or_an_instant_and_names_a_bad_value() {
        let now = 1_700_000_000_000;
        assert_eq!(since_ms("10m", now).unwrap(), now - 600_000);
        assert_eq!(
            since_ms("2023-11-14T22:13:20Z", now).unwrap(),
            1_700_000_000_000
        );
        let err = since_ms("10 parsecs", now).unwrap_err().to_string();
        assert!(err.contains("10 parsecs") && err.contains("unit"), "{err}");
        let err = since_ms("2023-13-14T22:13:20Z", now)
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid instant"), "{err}");
    }
}
