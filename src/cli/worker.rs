use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http;
use crate::kafka::admin::{fleet_topics, Admin};
use crate::worker::{self, Finished, HandlerResult, WorkerOptions};

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Worker pool: one consumer group per pool.
    #[arg(long, env = "TOCSIN_POOL")]
    pub pool: Option<String>,
    /// Tenants whose lanes this pool serves, comma-separated, or `*` for every lane.
    #[arg(long, env = "TOCSIN_LANES", value_delimiter = ',')]
    pub lanes: Option<Vec<String>>,
    /// Stable identity of this worker (its ledger directory) [default: the host name and pid]
    #[arg(long, env = "TOCSIN_WORKER_ID")]
    pub worker_id: Option<String>,
    #[arg(long, env = "TOCSIN_WORKER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Runs executing at once [default: 1024]
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Runs of one tenant executing at once [default: 256]
    #[arg(long)]
    pub per_tenant_concurrency: Option<usize>,
    /// Enables `exec` runs of this program (an absolute path); repeat for several. Adds to
    /// `worker.exec.allow` and sets `worker.exec.enabled`.
    #[arg(long = "allow-exec", value_name = "PATH")]
    pub allow_exec: Vec<PathBuf>,
    /// Tenants that may use `exec`, comma-separated (default: every tenant, once exec is
    /// enabled). Replaces `worker.exec.tenants`.
    #[arg(long, value_delimiter = ',', value_name = "TENANT")]
    pub exec_tenants: Option<Vec<String>>,
    /// A host name, `*.domain`, address or CIDR that `http` runs may call besides public
    /// addresses (loopback, private and link-local ones are refused unless listed); repeat for
    /// several. Adds to `worker.http.allow_hosts`.
    #[arg(long = "allow-http-host", value_name = "HOST")]
    pub allow_http_host: Vec<String>,
    /// How long the ledger remembers a finished run, in ms [default: 7 days]
    #[arg(long)]
    pub ledger_retention_ms: Option<u64>,
    /// host:port of the HTTP endpoint (/metrics, /healthz, /readyz, /status); empty disables it.
    #[arg(long, env = "TOCSIN_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// Print every finished run on stdout.
    #[arg(long)]
    pub print_runs: bool,
}

impl WorkerArgs {
    pub fn apply(&self, config: &mut Config) {
        if let Some(p) = &self.pool {
            config.worker.pool = p.clone();
        }
        if let Some(l) = &self.lanes {
            config.worker.lanes = l.clone();
        }
        if let Some(d) = &self.data_dir {
            config.worker.data_dir = d.clone();
        }
        if let Some(c) = self.concurrency {
            config.worker.concurrency = c;
        }
        if let Some(c) = self.per_tenant_concurrency {
            config.worker.per_tenant_concurrency = c;
        }
        if let Some(l) = &self.http_listen {
            config.worker.http_listen = l.clone();
        }
        if !self.allow_exec.is_empty() {
            config.worker.exec.enabled = true;
            config
                .worker
                .exec
                .allow
                .extend(self.allow_exec.iter().cloned());
        }
        if let Some(t) = &self.exec_tenants {
            config.worker.exec.tenants = t.clone();
        }
        config
            .worker
            .http
            .allow_hosts
            .extend(self.allow_http_host.iter().cloned());
        if let Some(r) = self.ledger_retention_ms {
            config.worker.ledger_retention_ms = r;
        }
    }
}

/// One line per finished attempt.
pub fn print_finished(f: &Finished) {
    let scheduled = chrono::DateTime::from_timestamp_millis(f.run.scheduled_ms)
        .map(|t| t.format("%H:%M:%S%.3f").to_string())
        .unwrap_or_default();
    let (outcome, detail) = match &f.result {
        HandlerResult::Succeeded { output } => ("ok", output.trim_end().to_owned()),
        HandlerResult::Failed { error, .. } => ("failed", error.clone()),
    };
    println!(
        "run {scheduled} {:<16} tenant={} attempt={} {outcome} in {} ms: {detail}",
        f.run.job_id, f.run.tenant, f.run.attempt, f.duration_ms
    );
}

pub async fn run(mut config: Config, args: &WorkerArgs) -> anyhow::Result<()> {
    args.apply(&mut config);
    config.validate()?;
    // Checked before anything connects, so a bad file stops the worker at once.
    if let Some(ca) = &config.worker.http.ca_file {
        worker::handler::ca_certificates(ca)?;
    }
    let id = args
        .worker_id
        .clone()
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let shutdown = CancellationToken::new();
    let ready = Arc::new(AtomicBool::new(false));
    let mut opts = WorkerOptions::new(id.clone());
    if !config.worker.http_listen.is_empty() {
        let reach =
            crate::kafka::reach::watch(&config, crate::node::system_clock(), shutdown.clone())?;
        let endpoint = http::Endpoint::new(&id, http::prometheus())
            .with_worker(ready.clone())
            .with_ledger(opts.ledger_health.clone())
            .with_brokers(reach);
        http::start(&config.worker.http_listen, endpoint, shutdown.clone()).await?;
    }
    Admin::new(&config)?.ensure(&fleet_topics(&config)).await?;
    if args.print_runs {
        opts.on_finished = Some(Arc::new(print_finished));
    }
    let signals = shutdown.clone();
    tokio::spawn(async move {
        super::scheduler::wait_for_signal().await;
        signals.cancel();
    });
    // Ready once the group assigns the worker lanes; one given none (no lanes yet, or more
    // workers than lane partitions) counts as assigned after IDLE_READY_AFTER in the group.
    let assigned = opts.assigned.clone();
    let watching = shutdown.clone();
    tokio::spawn(async move {
        let since = std::time::Instant::now();
        while !watching.is_cancelled() {
            if assigned.load(Ordering::Relaxed) || since.elapsed() >= crate::node::IDLE_READY_AFTER
            {
                ready.store(true, Ordering::Relaxed);
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    });
    worker::run(config, opts, crate::node::system_clock(), shutdown).await?;
    Ok(())
}
