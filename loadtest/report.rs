//! The report of one run: the JSON written by `--report` and the summary table on stdout.
//! Fields that do not apply to a scenario are `null`, never left out.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Lag {
    pub p50: i64,
    pub p99: i64,
    pub p999: i64,
    pub max: i64,
}

impl Lag {
    /// Percentiles (nearest rank) of lags in ms; `None` when there are none.
    pub fn of(lags: &mut [i64]) -> Option<Lag> {
        if lags.is_empty() {
            return None;
        }
        lags.sort_unstable();
        Some(Lag {
            p50: percentile(lags, 0.50),
            p99: percentile(lags, 0.99),
            p999: percentile(lags, 0.999),
            max: *lags.last().unwrap(),
        })
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[i64], q: f64) -> i64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The settings a run used, so a number can be reproduced.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub bootstrap: String,
    pub topic_prefix: String,
    pub job_partitions: u32,
    pub lane_partitions: u32,
    pub tenants: usize,
    pub skew: f64,
    pub rate_per_s: Option<u64>,
    pub period_ms: Option<u64>,
    pub duration_s: Option<u64>,
    pub align: String,
    pub tick_ms: u64,
    pub lookahead_ms: u64,
    pub max_runs_per_transaction: usize,
    pub transaction_timeout_ms: u64,
    pub payload_bytes: usize,
    pub kill_mode: Option<String>,
    pub kill_at_s: Option<f64>,
    /// steady/failover: from every job indexed to the window's start (the nodes catching up
    /// with what the ingest left due).
    pub settle_s: Option<f64>,
    /// The broker's `group.consumer.session.timeout.ms` (the bound of a takeover).
    pub session_timeout_ms: Option<i64>,
    /// Delay: who wrote the payloads to the target (`direct`: the scheduler, `worker`).
    pub via: Option<String>,
    /// Delay: the target topic and its partitions.
    pub target_topic: Option<String>,
    pub target_partitions: Option<u32>,
    /// Delay: `kill -9` at the due instant + this many ms.
    pub kill_at_ms: Option<i64>,
    pub cpus: usize,
    pub release_build: bool,
}

/// A moment of the run worth marking (a kill, a SIGCONT), in ms from the window start.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    pub what: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub jobs: u64,
    pub nodes: usize,
    /// Expected runs seen (each counted once).
    pub fires: u64,
    pub fires_per_s: Option<f64>,
    /// Raw transactional produce of the same records, fires per second.
    pub baseline_per_s: Option<f64>,
    pub ratio_to_baseline: Option<f64>,
    /// Kafka's own ProducerPerformance, transactional, over the same records (two a fire),
    /// in fires per second (`perf`): herd and baseline.
    pub physical_limit_per_s: Option<f64>,
    pub ratio_to_physical: Option<f64>,
    /// From the scheduled instant to visibility at a `read_committed` consumer (delay: of
    /// the target's records), or to the run's not-before instant if later (a run fired ahead
    /// by the scheduler's lookahead is not late when it is visible before its instant).
    pub lag_ms: Option<Lag>,
    /// Lane scenarios: from the scheduled instant to visibility in the lane, negative when the
    /// run was there ahead of its instant.
    pub visible_ms: Option<Lag>,
    /// steady `--worker`: from the scheduled instant to the handler's start in a worker.
    pub start_lag_ms: Option<Lag>,
    /// Delay: from the due instant to each record's append time on the target (its broker
    /// `LogAppendTime` timestamp).
    pub append_lag_ms: Option<Lag>,
    pub per_tenant_lag_p99_ms: BTreeMap<String, i64>,
    /// History: from a run's finish (`finished_at` in `runs`, the worker's clock) to
    /// PostgreSQL writing its finished row in `tocsin_runs` (`clock_timestamp()` in a trigger).
    pub sink_lag_ms: Option<Lag>,
    /// History: expected runs whose finished row landed, and those whose did not in time.
    pub sink_landed: Option<u64>,
    pub sink_missing: Option<u64>,
    pub expected: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// Runs of a loadtest job at an instant its schedule does not have.
    pub unexpected: u64,
    /// Lane records that are not well-formed runs.
    pub malformed: u64,
    /// Herd, delay: from the due instant to the last run (record) visible.
    pub drain_s: Option<f64>,
    /// Herd, delay: from the first run visible, or the due instant if later, to the last: the
    /// time `fires_per_s` is over.
    pub firing_s: Option<f64>,
    /// Herd, delay: per tenant, from the due instant to its last run visible.
    pub per_tenant_drain_s: BTreeMap<String, f64>,
    /// Failover, delay with a kill: the worst lag of a run (the takeover included).
    pub max_lateness_ms: Option<i64>,
    /// The highest peak RSS (VmHWM) of a scheduler node.
    pub max_rss_mb: Option<f64>,
    /// Capacity: time for a node with an empty data dir to activate every partition.
    pub restore_s: Option<f64>,
    /// Capacity: peak RSS of the node that restored.
    pub restore_rss_mb: Option<f64>,
    /// Job definitions indexed per second (load start to all committed by the fleet).
    pub ingest_per_s: Option<f64>,
    pub events: Vec<Event>,
    pub settings: Settings,
    pub notes: Vec<String>,
}

impl Report {
    pub fn audit_passed(&self) -> bool {
        self.lost == 0
            && self.duplicates == 0
            && self.unexpected == 0
            && self.malformed == 0
            && self.sink_missing.unwrap_or(0) == 0
    }

    /// The summary table.
    pub fn table(&self) -> String {
        fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
            v.map_or("-".into(), |v| v.to_string())
        }
        let f1 = |v: Option<f64>| v.map(|v| format!("{v:.1}"));
        let f2 = |v: Option<f64>| v.map(|v| format!("{v:.2}"));
        let mut rows: Vec<(&str, String)> = vec![
            ("scenario", self.scenario.clone()),
            ("jobs", self.jobs.to_string()),
            ("nodes", self.nodes.to_string()),
            (
                "delivered via",
                match (&self.settings.via, &self.settings.target_topic) {
                    (Some(via), Some(t)) => format!(
                        "{via} to {t} ({} partitions)",
                        opt(self.settings.target_partitions)
                    ),
                    _ => "-".into(),
                },
            ),
            (
                "fires (expected)",
                format!("{} ({})", self.fires, self.expected),
            ),
            ("fires/s", opt(f1(self.fires_per_s))),
            ("baseline fires/s", opt(f1(self.baseline_per_s))),
            ("ratio to baseline", opt(f2(self.ratio_to_baseline))),
            (
                "ProducerPerformance fires/s",
                opt(f1(self.physical_limit_per_s)),
            ),
            ("ratio to it", opt(f2(self.ratio_to_physical))),
        ];
        let lag = |l: Option<Lag>| {
            l.map_or("-".into(), |l| {
                format!("{} / {} / {} / {}", l.p50, l.p99, l.p999, l.max)
            })
        };
        rows.push(("lag ms p50/p99/p99.9/max", lag(self.lag_ms)));
        rows.push((
            "lane visible ms p50/p99/p99.9/max (negative: ahead)",
            lag(self.visible_ms),
        ));
        rows.push((
            "handler start lag ms p50/p99/p99.9/max",
            lag(self.start_lag_ms),
        ));
        rows.push(("append lag ms p50/p99/p99.9/max", lag(self.append_lag_ms)));
        rows.push(("sink lag ms p50/p99/p99.9/max", lag(self.sink_lag_ms)));
        rows.push((
            "sink rows landed (missing)",
            match (self.sink_landed, self.sink_missing) {
                (Some(l), Some(m)) => format!("{l} ({m})"),
                _ => "-".into(),
            },
        ));
        for (t, p99) in &self.per_tenant_lag_p99_ms {
            let drain = self
                .per_tenant_drain_s
                .get(t)
                .map_or(String::new(), |d| format!(", drained in {d:.2} s"));
            rows.push(("  tenant lag p99 ms", format!("{t}: {p99}{drain}")));
        }
        rows.extend([
            ("lost", self.lost.to_string()),
            ("duplicates", self.duplicates.to_string()),
            (
                "unexpected / malformed",
                format!("{} / {}", self.unexpected, self.malformed),
            ),
            ("drain s", opt(f2(self.drain_s))),
            ("max lateness ms", opt(self.max_lateness_ms)),
            ("max rss MB", opt(f1(self.max_rss_mb))),
            ("restore s", opt(f2(self.restore_s))),
            ("ingest defs/s", opt(f1(self.ingest_per_s))),
            (
                "audit",
                if self.audit_passed() {
                    "passed"
                } else {
                    "FAILED"
                }
                .into(),
            ),
        ]);
        for e in &self.events {
            rows.push(("event", format!("{} at +{} ms", e.what, e.at_ms)));
        }
        for n in &self.notes {
            rows.push(("note", n.clone()));
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            let _ = writeln!(out, "{k:<width$}  {v}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<i64> = (1..=1000).rev().collect();
        let l = Lag::of(&mut v).unwrap();
        assert_eq!((l.p50, l.p99, l.p999, l.max), (500, 990, 999, 1000));
        assert_eq!(
            Lag::of(&mut [7]).unwrap(),
            Lag {
                p50: 7,
                p99: 7,
                p999: 7,
                max: 7
            }
        );
        assert!(Lag::of(&mut []).is_none());
    }
}
