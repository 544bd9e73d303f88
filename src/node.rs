//! What every node, scheduler or worker, has of its own: its clock and the status it reports
//! (`/healthz`, `/readyz`, `/status`). The two roles meet only through topics; this module is
//! what they share in code instead of one importing the other.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

/// The clock, injectable for tests: milliseconds since the Unix epoch.
pub type NowFn = Arc<dyn Fn() -> i64 + Send + Sync>;

pub fn system_clock() -> NowFn {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    })
}

/// What a node reports about itself (health, readiness, metrics).
#[derive(Debug, Default)]
pub struct NodeStatus {
    /// True when every owned partition is Active and the last step succeeded.
    pub ready: AtomicBool,
    pub owned: AtomicUsize,
    pub active: AtomicUsize,
    pub fires: AtomicU64,
    /// When the steps started failing without a success since (ms since the epoch), or 0 while
    /// the last step succeeded. `/healthz` fails once this is older than `STALL_LIMIT_MS`.
    pub failing_since_ms: AtomicI64,
    /// The last step's error and when it happened, for `/status` and `/readyz`.
    pub last_error: Mutex<Option<(i64, String)>>,
    /// What the scheduler's engine holds, read by the job API and the heartbeat.
    #[cfg(feature = "runtime")]
    pub view: crate::scheduler::view::View,
}

/// Whether the node reaches a broker, as its probe (`kafka::reach`) last found: a step blocked
/// in a call that waits for a broker (a commit waits up to 30 s) reports nothing meanwhile, and
/// a worker has no steps to fail.
#[derive(Debug, Default)]
pub struct Reach {
    /// When a broker last answered the probe (ms since the epoch); 0 before the first answer.
    pub answered_ms: AtomicI64,
    /// Why the last probe got no answer, while none comes.
    pub last_error: Mutex<Option<String>>,
}

/// Whether a node's local store (a worker's ledger) can write, as its last write found. While it
/// cannot, the node is not ready.
#[derive(Debug, Default)]
pub struct StoreHealth {
    /// When writes started failing (ms since the epoch), or 0 while they succeed.
    pub failing_since_ms: AtomicI64,
    /// The error of the last failed write, while they fail.
    pub last_error: Mutex<Option<String>>,
}

impl StoreHealth {
    /// Since when, and why, the store cannot write; `None` while it can.
    pub fn failing(&self) -> Option<(i64, String)> {
        match self
            .failing_since_ms
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => None,
            since => Some((
                since,
                self.last_error.lock().unwrap().clone().unwrap_or_default(),
            )),
        }
    }
}

/// How long a node in its group with no assignment waits before it counts as assigned nothing
/// (and so may be ready): librdkafka reports no empty assignment under KIP-848 (an empty target
/// equal to the empty current one changes nothing), and by then the coordinator has had several
/// heartbeats (500 ms on the dev broker, 5 s by default) to compute its target.
pub const IDLE_READY_AFTER: std::time::Duration = std::time::Duration::from_secs(15);

/// No broker answered the probe for this long: the node is not ready. Longer than a probe's
/// own timeout, so one slow answer does not take the node out of service.
pub const UNREACHABLE_AFTER_MS: i64 = 5_000;

impl Reach {
    /// How long no broker has answered, when that is longer than `UNREACHABLE_AFTER_MS`
    /// (`Some(None)`: none has answered yet).
    pub fn unreachable_for(&self, now_ms: i64) -> Option<Option<i64>> {
        match self.answered_ms.load(std::sync::atomic::Ordering::Relaxed) {
            0 => Some(None),
            at if now_ms - at > UNREACHABLE_AFTER_MS => Some(Some(now_ms - at)),
            _ => None,
        }
    }
}

/// A node whose every step has failed for this long cannot make progress on its own (a
/// producer wedged after a broker outage, a store that cannot write): `/healthz` fails so an
/// orchestrator restarts it. Longer than a broker restart takes, so a restart alone does not
/// cost the node its state. The same holds for a node that reaches no broker for this long.
pub const STALL_LIMIT_MS: i64 = 120_000;
