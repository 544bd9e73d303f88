//! The scheduler node: partition leases through the consumer group, restore from `timers`,
//! the RocksDB bucket index, and fenced transactional firing into the tenant lanes.
//!
//! It owns: which partitions this node fires (exactly its assignment of `jobs`), the timers of
//! those partitions, and every write to `timers` and the lanes. It must never fire a partition
//! it was not assigned, never apply RocksDB changes of a transaction that did not commit, and
//! never commit a transaction without the group's fresh metadata (the fence).

mod deliver;
mod engine;
mod firing;
mod ingest;
mod intake;
mod ledger;
mod output;
mod partitions;
mod producer;
mod restore;
mod scan;
mod txn;

pub use deliver::{look_up as look_up_target, Target};
pub use ingest::other_tenants_job;
pub use producer::{HOLD_BEFORE_OFFSETS, HOLD_TRANSACTION_ENV};
pub mod fair;
pub mod fire;
pub mod lane;
pub mod lifecycle;
pub mod progress;
pub mod store;
pub mod takeover;
pub mod view;

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::node::{NodeStatus, NowFn};

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

/// The names of the topics a node reads and writes.
#[derive(Debug, Clone)]
pub struct Topics {
    pub jobs: String,
    pub timers: String,
    pub control: String,
    pub runs: String,
}

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
