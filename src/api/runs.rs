//! The runs a node has seen on `runs` lately, for `GET /v1/runs`: a thread reads every
//! partition of `runs` (`read_committed`, from [`TAIL_PER_PARTITION`] records back at start)
//! and keeps the last [`KEPT`] reports, whatever their job, so memory is bounded by `KEPT`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rdkafka::consumer::Consumer;
use rdkafka::{Message, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::history::{decode_row, RunRow};

/// Reports kept, newest last.
pub const KEPT: usize = 10_000;
/// How far back each partition of `runs` is read at start.
const TAIL_PER_PARTITION: i64 = 1_000;

#[derive(Debug, Default)]
pub struct Recent {
    rows: Mutex<VecDeque<RunRow>>,
}

impl Recent {
    pub fn push(&self, row: RunRow) {
        let mut rows = self.rows.lock().unwrap();
        if rows.len() == KEPT {
            rows.pop_front();
        }
        rows.push_back(row);
    }

    /// Up to `limit` reports, newest first, of `job` (every job when `None`).
    pub fn query(&self, job: Option<&str>, limit: usize) -> Vec<RunRow> {
        let rows = self.rows.lock().unwrap();
        rows.iter()
            .rev()
            .filter(|r| job.is_none_or(|j| r.job_id == j))
            .take(limit)
            .cloned()
            .collect()
    }
}

/// Starts the thread that fills `recent` from `runs`, until `shutdown`.
pub fn follow(
    config: &Config,
    recent: Arc<Recent>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let topic = config.topic("runs");
    let consumer = crate::kafka::consumer_config(config, "tocsin-api-runs")
        .create_with_context(crate::kafka::client::NodeContext)?;
    let mut tpl = TopicPartitionList::new();
    for p in crate::cli::jobs::partitions(&consumer, &topic)? {
        tpl.add_partition_offset(&topic, p, Offset::OffsetTail(TAIL_PER_PARTITION))?;
    }
    consumer.assign(&tpl)?;
    super::follow_on_thread("api-runs", "recent runs", consumer, shutdown, move |m| {
        if let Some(Ok(row)) = m.payload().map(decode_row) {
            recent.push(row);
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(job: &str, n: i64) -> RunRow {
        RunRow {
            run_id: format!("{job}-{n}"),
            job_id: job.into(),
            tenant: "t".into(),
            status: "fired".into(),
            attempt: 1,
            scheduled_ms: n,
            fired_ms: Some(n),
            started_ms: None,
            finished_ms: None,
            node: None,
            worker: None,
            error: None,
            duration_ms: None,
            updated_ms: n,
        }
    }

    #[test]
    fn keeps_the_newest_reports_within_its_bound() {
        let recent = Recent::default();
        for n in 0..(KEPT as i64 + 10) {
            recent.push(row(if n % 2 == 0 { "a" } else { "b" }, n));
        }
        assert_eq!(recent.rows.lock().unwrap().len(), KEPT);
        let a = recent.query(Some("a"), 3);
        assert_eq!(
            a.iter().map(|r| r.scheduled_ms).collect::<Vec<_>>(),
            [KEPT as i64 + 8, KEPT as i64 + 6, KEPT as i64 + 4]
        );
        assert_eq!(recent.query(None, 1)[0].scheduled_ms, KEPT as i64 + 9);
        assert!(recent.query(Some("zzz"), 10).is_empty());
    }
}
