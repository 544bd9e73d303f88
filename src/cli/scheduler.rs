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
    /// host:port of the HTTP endpoint (/metrics, /healthz, /readyz, /status and the job API
    /// under /v1/); empty disables it.
    #[arg(long, env = "TOCSIN_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// The base URL other nodes redirect job API requests to [default: http://LISTEN, the host
    /// name for 0.0.0.0]
    #[arg(long, env = "TOCSIN_HTTP_ADVERTISE")]
    pub http_advertise: Option<String>,
    /// File of the job API's bearer tokens, one a line: `TOKEN` or `TOKEN TENANT` (a token is
    /// never given on the command line; `TOCSIN_API_TOKEN` holds one for every tenant).
    #[arg(long, env = "TOCSIN_API_TOKENS_FILE")]
    pub api_tokens_file: Option<PathBuf>,
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
    if let Some(url) = &args.http_advertise {
        config.scheduler.http_advertise = Some(url.clone());
    }
    if let Some(file) = &args.api_tokens_file {
        config.scheduler.api_tokens_file = Some(file.clone());
    }
    config.validate()?;
    let node_id = config.scheduler.node_id.clone().unwrap_or_else(hostname);
    let shutdown = CancellationToken::new();
    let status = Arc::new(NodeStatus::default());
    // Bound before anything else, so a taken port fails at once; /readyz says 503 until the
    // node has restored its partitions. The job API answers once the topics exist.
    let mut advertised = None;
    let mut served = None;
    if !config.scheduler.http_listen.is_empty() {
        let server = http::Server::bind(&config.scheduler.http_listen).await?;
        let addr = server.local_addr();
        let auth = crate::api::auth::Auth::load(
            config.scheduler.api_tokens_file.as_deref(),
            std::env::var(crate::api::auth::TOKEN_ENV).ok().as_deref(),
            addr,
        )?;
        if let Some(why) = auth.mutations_disabled() {
            tracing::warn!("{why}");
        }
        advertised = Some(advertise(&config, addr));
        served = Some((server, auth));
    }
    Admin::new(&config)?.ensure(&fleet_topics(&config)).await?;
    if let Some((server, auth)) = served {
        let reach = crate::kafka::reach::watch(&config, system_clock(), shutdown.clone())?;
        let nodes = Arc::new(std::sync::Mutex::new(Default::default()));
        crate::api::directory::follow(
            config.clone(),
            system_clock(),
            nodes.clone(),
            shutdown.clone(),
        )?;
        let recent = Arc::new(crate::api::runs::Recent::default());
        crate::api::runs::follow(&config, recent.clone(), shutdown.clone())?;
        let api = crate::api::Api::new(
            config.clone(),
            node_id.clone(),
            status.clone(),
            system_clock(),
            auth,
            nodes,
            recent,
        )?;
        let endpoint = http::Endpoint::new(&node_id, http::prometheus())
            .with_scheduler(status.clone())
            .with_brokers(reach)
            .with_api(Arc::new(api));
        tracing::info!(addr = %server.local_addr(), "http endpoint listening");
        tokio::spawn(server.run(endpoint, shutdown.clone()));
    }
    tokio::spawn(crate::api::directory::publish(
        config.clone(),
        node_id.clone(),
        advertised,
        status.clone(),
        system_clock(),
        shutdown.clone(),
    ));
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

/// The base URL other nodes send a client to: `scheduler.http_advertise`, or the bound
/// address, with the host name for an unspecified one (`0.0.0.0`, `::`).
fn advertise(config: &Config, bound: std::net::SocketAddr) -> String {
    if let Some(url) = &config.scheduler.http_advertise {
        return url.trim_end_matches('/').to_owned();
    }
    if bound.ip().is_unspecified() {
        format!("http://{}:{}", hostname(), bound.port())
    } else {
        format!("http://{bound}")
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node-1".into())
}
