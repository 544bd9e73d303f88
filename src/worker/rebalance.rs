//! Giving lane partitions back on rebalance: on revoke, stop taking records from the
//! partitions, let the runs started from them finish (bounded), hand back those not started,
//! commit synchronously while the partitions are still ours, and forget them.
//!
//! It owns: the worker consumer's rebalance callbacks, the offset tracker and the set of lanes
//! paused for a tenant's backlog. The callbacks run inside the consumer's poll, on the worker
//! loop's thread, while runs execute on other threads of the runtime: they never hold a lock
//! while they wait or commit, and never wait where the runs cannot go on meanwhile.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::runtime::{Handle, RuntimeFlavor};
use tracing::{info, warn};

use super::offsets::{OffsetTracker, Taken};

/// A lane partition paused for its tenant's backlog: (topic, partition, tenant).
pub type PausedLane = (String, i32, String);

/// Past the latest timeout of the runs waited for: time for their outcome to be reported.
const REPORT_GRACE: Duration = Duration::from_secs(2);

pub struct LaneContext {
    tracker: Mutex<OffsetTracker>,
    /// Signalled whenever a record is done with, for a revoke that waits.
    done: Condvar,
    /// Lanes paused for a backlog; a revoked lane leaves it (and is resumed, since librdkafka
    /// keeps an application's pause across a later assignment of the partition).
    pub paused: Mutex<HashSet<PausedLane>>,
    /// Set once the worker stops: the close's revoke then commits what is done without waiting
    /// (the worker already waited for its runs).
    closing: AtomicBool,
    max_wait: Duration,
    /// Set at the first assignment the group hands this worker (`WorkerOptions::assigned`).
    assigned: Arc<AtomicBool>,
}

impl LaneContext {
    /// `max_wait`: the longest a revoke waits for the runs started from its partitions.
    pub fn new(max_wait: Duration) -> LaneContext {
        LaneContext::reporting(max_wait, Arc::default())
    }

    /// As `new`, setting `assigned` at the first assignment.
    pub fn reporting(max_wait: Duration, assigned: Arc<AtomicBool>) -> LaneContext {
        LaneContext {
            tracker: Mutex::new(OffsetTracker::default()),
            done: Condvar::new(),
            paused: Mutex::new(HashSet::new()),
            closing: AtomicBool::new(false),
            max_wait,
            assigned,
        }
    }

    pub fn tracker(&self) -> MutexGuard<'_, OffsetTracker> {
        self.tracker.lock().unwrap()
    }

    /// A record fetched; `None` when its partition is not assigned here (it must not run).
    pub fn taken(&self, topic: &str, partition: i32, offset: i64) -> Option<Taken> {
        self.tracker().taken(topic, partition, offset)
    }

    /// The run of `t` is about to start; false when its partition was revoked meanwhile.
    pub fn start(&self, t: &Taken, deadline: Instant) -> bool {
        self.tracker().start(t, deadline)
    }

    /// The record of `t` is done with: its run finished, or it needed none.
    pub fn finished(&self, t: &Taken) {
        self.tracker().finished(t);
        self.done.notify_all();
    }

    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    fn revoke(&self, consumer: &BaseConsumer<LaneContext>, tpl: &TopicPartitionList) {
        let parts = list(tpl);
        {
            let mut t = self.tracker();
            for (topic, p) in &parts {
                t.revoke(topic, *p);
            }
        }
        // Lost partitions may already belong to another member (a commit would be refused),
        // and at close the worker has already waited for its runs.
        let lost = consumer.assignment_lost();
        let unfinished = if lost || self.closing.load(Ordering::SeqCst) {
            self.tracker().running(&parts)
        } else {
            self.wait_for_runs(&parts)
        };
        let moves = {
            let mut t = self.tracker();
            let moves = t.to_commit_of(&parts);
            for (topic, p) in &parts {
                t.forget(topic, *p);
            }
            moves
        };
        self.unpause(consumer, &parts);
        if unfinished > 0 {
            warn!(
                unfinished,
                lost, "runs still going on revoked lanes; the next owner runs them again"
            );
        }
        if !lost && !moves.is_empty() {
            let mut offsets = TopicPartitionList::new();
            for (topic, p, o) in &moves {
                let _ = offsets.add_partition_offset(topic, *p, Offset::Offset(*o));
            }
            if let Err(e) = consumer.commit(&offsets, CommitMode::Sync) {
                warn!(error = %e, "offset commit of revoked lanes failed");
            }
        }
        info!(
            partitions = parts.len(),
            committed = moves.len(),
            lost,
            "lane partitions revoked"
        );
    }

    /// Waits until no run started from `parts` is going, at most until the latest of their
    /// timeouts (and `REPORT_GRACE`), capped at `max_wait`; returns how many still are.
    fn wait_for_runs(&self, parts: &[(String, i32)]) -> usize {
        let wait = || {
            let mut t = self.tracker();
            let Some(latest) = t.latest_deadline(parts) else {
                return 0;
            };
            let now = Instant::now();
            let until =
                now + (latest.saturating_duration_since(now) + REPORT_GRACE).min(self.max_wait);
            info!(
                running = t.running(parts),
                "lane partitions revoked; finishing their runs"
            );
            loop {
                let running = t.running(parts);
                let left = until.saturating_duration_since(Instant::now());
                if running == 0 || left.is_zero() {
                    return running;
                }
                t = self.done.wait_timeout(t, left).unwrap().0;
            }
        };
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            // The runs go on on the other threads; `block_in_place` hands the tasks queued on
            // this one to another thread for the time of the wait.
            Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            // Not a thread of the runtime: blocking it holds up no run.
            Err(_) => wait(),
            // On a single thread no run could finish while this one waits.
            Ok(_) => self.tracker().running(parts),
        }
    }

    fn unpause(&self, consumer: &BaseConsumer<LaneContext>, parts: &[(String, i32)]) {
        let mut resume = TopicPartitionList::new();
        let mut paused = self.paused.lock().unwrap();
        paused.retain(|(topic, p, _)| {
            let revoked = parts.iter().any(|(t, q)| t == topic && q == p);
            if revoked {
                resume.add_partition(topic, *p);
            }
            !revoked
        });
        let still_paused = paused.len();
        drop(paused);
        if resume.count() > 0 {
            crate::telemetry::lanes_paused(still_paused);
            if let Err(e) = consumer.resume(&resume) {
                warn!(error = %e, "could not resume revoked lanes");
            }
        }
    }
}

impl ClientContext for LaneContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::client::log(level, fac, message);
    }
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::kafka::client::report(&error, reason);
    }
    fn stats(&self, statistics: rdkafka::Statistics) {
        crate::telemetry::lane_consumer_statistics(&statistics);
    }
}

impl ConsumerContext for LaneContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mut t = self.tracker();
                for (topic, p) in list(tpl) {
                    t.assigned(&topic, p);
                }
                info!(partitions = tpl.count(), "lane partitions assigned");
                self.assigned.store(true, Ordering::Relaxed);
            }
            Rebalance::Revoke(tpl) => self.revoke(consumer, tpl),
            Rebalance::Error(e) => warn!(error = %e, "lane rebalance error"),
        }
    }
}

fn list(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding_one_run(max_wait: Duration, timeout: Duration) -> (LaneContext, Taken) {
        let lanes = LaneContext::new(max_wait);
        lanes.tracker().assigned("lane", 0);
        let t = lanes.taken("lane", 0, 7).unwrap();
        assert!(lanes.start(&t, Instant::now() + timeout));
        lanes.tracker().revoke("lane", 0);
        (lanes, t)
    }

    #[test]
    fn a_revoke_waits_until_its_runs_finish() {
        let (lanes, t) = holding_one_run(Duration::from_secs(30), Duration::from_secs(30));
        let parts = [("lane".to_owned(), 0)];
        let started = Instant::now();
        let unfinished = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                lanes.finished(&t);
            });
            lanes.wait_for_runs(&parts)
        });
        assert_eq!(unfinished, 0);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        assert_eq!(
            lanes.tracker().to_commit_of(&parts),
            vec![("lane".into(), 0, 8)]
        );
    }

    #[test]
    fn a_revoke_waits_no_longer_than_the_runs_timeout_and_its_bound() {
        let parts = [("lane".to_owned(), 0)];
        // Bounded by the setting...
        let (lanes, _t) = holding_one_run(Duration::from_millis(200), Duration::from_secs(60));
        let started = Instant::now();
        assert_eq!(lanes.wait_for_runs(&parts), 1);
        assert!(started.elapsed() < Duration::from_secs(2));
        // ...and by the run's own timeout, with time to report its outcome.
        let (lanes, _t) = holding_one_run(Duration::from_secs(60), Duration::ZERO);
        let started = Instant::now();
        assert_eq!(lanes.wait_for_runs(&parts), 1);
        let waited = started.elapsed();
        assert!(
            waited >= REPORT_GRACE && waited < REPORT_GRACE + Duration::from_secs(2),
            "{waited:?}"
        );
        // Committed up to the run still going, not past it: the next owner runs it again.
        assert_eq!(
            lanes.tracker().to_commit_of(&parts),
            vec![("lane".into(), 0, 7)]
        );
    }
}
