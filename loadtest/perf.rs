//! The physical limit: Apache Kafka's own `org.apache.kafka.tools.ProducerPerformance` (from
//! the broker's jars, through `scripts/kafka classpath`), run transactionally on the same
//! broker with the record count, record size and partition count of a herd's output.
//!
//! A fire writes two records (its `Run` to a lane, its `fired` event to `runs`), so the tool
//! writes twice as many records as there are fires, of their mean size (key and value), to
//! one topic with as many partitions as the lane and `runs` together, in transactions of
//! `TRANSACTION_MS` (the tool sizes transactions by time, not by count; at the rates this
//! broker takes, that is a few 10,000 fires per transaction, as the engine's are).
//! `records_per_s / 2` is then the fires per second Kafka itself can carry: unlike the
//! baseline, it pays none of librdkafka's per-partition costs.

use std::process::Command;

use anyhow::{bail, Context, Result};
use tocsin::config::Config;
use tocsin::kafka::admin::{Admin, Cleanup, TopicSpec};

/// Transaction length given to the tool.
const TRANSACTION_MS: u64 = 1_000;

#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub records_per_s: f64,
    /// Fires per second it stands for (two records a fire).
    pub fires_per_s: f64,
}

pub fn run(
    rt: &tokio::runtime::Runtime,
    config: &Config,
    fires: u64,
    record_bytes: usize,
) -> Result<Limit> {
    let t = &config.topics;
    let topic = TopicSpec {
        name: config.topic("baseline.perf"),
        partitions: t.lane_partitions + t.runs_partitions,
        cleanup: Cleanup::Delete,
    };
    let admin = Admin::new(config)?;
    rt.block_on(admin.ensure(std::slice::from_ref(&topic)))
        .context("could not create the ProducerPerformance topic")?;
    let classpath = crate::scenarios::kafka_script("classpath")?
        .trim()
        .to_owned();
    let records = fires * 2;
    let out = Command::new("java")
        .args(["-Xmx1g", "-cp", &classpath])
        .arg("org.apache.kafka.tools.ProducerPerformance")
        .args(["--topic", &topic.name])
        .args(["--num-records", &records.to_string()])
        .args(["--record-size", &record_bytes.max(1).to_string()])
        .args(["--throughput", "-1"])
        .args([
            "--transactional-id",
            &format!("{}loadtest.perf", config.topic_prefix),
        ])
        .args(["--transaction-duration-ms", &TRANSACTION_MS.to_string()])
        .arg("--producer-props")
        .arg(format!("bootstrap.servers={}", config.bootstrap))
        .arg("acks=all")
        .output()
        .context("could not run java (ProducerPerformance)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "ProducerPerformance failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let records_per_s = summary_rate(&stdout).with_context(|| {
        format!("ProducerPerformance printed no summary of {records} records:\n{stdout}")
    })?;
    Ok(Limit {
        records_per_s,
        fires_per_s: records_per_s / 2.0,
    })
}

/// The records/sec of the tool's last line, `N records sent, R records/sec (…), …`.
fn summary_rate(stdout: &str) -> Option<f64> {
    let last = stdout.lines().rev().find(|l| l.contains("records sent"))?;
    let (_, rest) = last.split_once("records sent,")?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_summary_line_gives_the_rate() {
        let out = "12 records sent, 3.0 records/sec (0.00 MB/sec), 5.0 ms avg latency.\n\
                   600000 records sent, 101900.2 records/sec (19.44 MB/sec), 900.1 ms avg \
                   latency, 2000.0 ms max latency, 800 ms 50th, 1500 ms 95th.\n";
        assert_eq!(super::summary_rate(out), Some(101_900.2));
        assert_eq!(super::summary_rate("nothing"), None);
    }
}
