use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http;
use crate::kafka::admin::{fleet_topics, Admin};
use crate::node::{system_clock, NodeStatus};
use crate::scheduler;

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// Stable identity of this node (the root of its transactional.id) [default: the host name]
    #[arg(long, env = "TOCSIN_NODE_ID")]
    pub node_id: Option<String>,
    /// RocksDB directory; a cache of Kafka, safe to delete.
    #[arg(long, env = "TOCSIN_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// host:port of the HTTP endpoint (/metrics, /healthz, /readyz, /status); empty disables it.
    #[arg(long, env = "TOCSIN_HTTP_LISTEN")]
    pub http_listen: Option<String>,
}

pub async fn run(mut config: Config, args: &SchedulerArgs) -> anyhow::Result<()> {
    if let Some(id) = &args.node_id {
        config.scheduler.node_id = Some(id.clone());
    }
    if let Some(dir) = &args.data_dir {
        config.scheduler.data_dir = dir.clone();
    }
    if let Some(listen) = &args.http_listen {
        config.scheduler.http_listen = listen.clone();
    }
    config.validate()?;
    let node_id = config.scheduler.node_id.clone().unwrap_or_else(hostname);
    let shutdown = CancellationToken::new();
    let status = Arc::new(NodeStatus::default());
    // Bound before anything else, so a taken port fails at once; /readyz says 503 until the
    // node has restored its partitions.
    if !config.scheduler.http_listen.is_empty() {
        let reach = crate::kafka::reach::watch(&config, system_clock(), shutdown.clone())?;
        let endpoint = http::Endpoint::new(&node_id, http::prometheus())
            .with_scheduler(status.clone())
            .with_brokers(reach);
        http::start(&config.scheduler.http_listen, endpoint, shutdown.clone()).await?;
    }
    Admin::new(&config)?.ensure(&fleet_topics(&config)).await?;
    let signals = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received; stopping");
        signals.cancel();
    });
    scheduler::run(config, node_id, system_clock(), status, shutdown).await?;
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
