//! The scheduler node: partition leases through the consumer group, restore from `timers`,
//! the RocksDB bucket index, and fenced transactional firing into the tenant lanes.
//!
//! It owns: which partitions this node fires (exactly its assignment of `jobs`), the timers of
//! those partitions, and every write to `timers` and the lanes. It must never fire a partition
//! it was not assigned, never apply RocksDB changes of a transaction that did not commit, and
//! never commit a transaction without the group's fresh metadata (the fence).

mod deliver;
mod engine;

pub use deliver::{look_up as look_up_target, Target};
pub use engine::other_tenants_job;
pub mod fair;
pub mod fire;
pub mod progress;
pub mod store;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::config::Config;

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

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("state store: {0}")]
    Store(#[from] store::StoreError),
    #[error("topic administration: {0}")]
    Admin(#[from] crate::kafka::admin::AdminError),
    #[error("could not create data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the consumer has no group metadata yet")]
    NoGroupMetadata,
    #[error("{0}")]
    Delivery(String),
    #[error("scheduler thread panicked")]
    Panicked,
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
}

/// A node whose every step has failed for this long cannot make progress on its own (a
/// producer wedged after a broker outage, a store that cannot write): `/healthz` fails so an
/// orchestrator restarts it. Longer than a broker restart takes, so a restart alone does not
/// cost the node its state.
pub const STALL_LIMIT_MS: i64 = 120_000;

/// Runs a scheduler node until `shutdown` is cancelled.
pub async fn run(
    config: Config,
    node_id: String,
    now: NowFn,
    status: Arc<NodeStatus>,
    shutdown: CancellationToken,
) -> Result<(), SchedulerError> {
    let runtime = tokio::runtime::Handle::current();
    let handle = std::thread::Builder::new()
        .name(format!("scheduler-{node_id}"))
        .spawn(move || {
            let engine = engine::Engine::new(config, node_id, now, status, runtime)?;
            engine.run(shutdown)
        })
        .map_err(|e| SchedulerError::DataDir {
            path: PathBuf::from("<thread>"),
            source: e,
        })?;
    tokio::task::spawn_blocking(move || handle.join())
        .await
        .map_err(|_| SchedulerError::Panicked)?
        .map_err(|_| SchedulerError::Panicked)?
}
