use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::kafka::admin::{fleet_topics, Admin};
use crate::scheduler::{self, NodeStatus};

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Stable identity of this node (the root of its transactional.id) [default: the host name]
    #[arg(long, env = "TOCSIN_NODE_ID")]
    pub node_id: Option<String>,
    /// RocksDB directory; a cache of Kafka, safe to delete.
    #[arg(long, env = "TOCSIN_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

pub async fn run(mut config: Config, args: &SchedulerArgs) -> anyhow::Result<()> {
    if let Some(id) = &args.node_id {
        config.scheduler.node_id = Some(id.clone());
    }
    if let Some(dir) = &args.data_dir {
        config.scheduler.data_dir = dir.clone();
    }
    let node_id = config.scheduler.node_id.clone().unwrap_or_else(hostname);
    Admin::new(&config)?.ensure(&fleet_topics(&config)).await?;
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received; stopping");
        signals.cancel();
    });
    let status = Arc::new(NodeStatus::default());
    scheduler::run(config, node_id, scheduler::system_clock(), status, shutdown).await?;
    Ok(())
}

pub async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node-1".into())
}
