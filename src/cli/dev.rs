//! `tocsin dev`: a scheduler and a worker in one process, for trying Tocsin out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http;
use crate::kafka::admin::{fleet_topics, Admin};
use crate::model::job::{HandlerKind, HandlerSpec, JobDefinition, ScheduleSpec};
use crate::node::{system_clock, NodeStatus};
use crate::scheduler;
use crate::worker::{self, WorkerOptions};

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Put a few example jobs first: a cron with seconds, an interval and a one-shot.
    #[arg(long)]
    pub examples: bool,
    #[arg(long, default_value = "./tocsin-dev-data")]
    pub data_dir: std::path::PathBuf,
    /// host:port of the HTTP endpoint (/metrics, /healthz, /readyz, /status); empty disables it.
    #[arg(long, env = "TOCSIN_HTTP_LISTEN")]
    pub http_listen: Option<String>,
}

pub async fn run(mut config: Config, args: &DevArgs) -> anyhow::Result<()> {
    config.scheduler.data_dir = args.data_dir.join("scheduler");
    config.worker.data_dir = args.data_dir.join("worker");
    if let Some(listen) = &args.http_listen {
        config.scheduler.http_listen = listen.clone();
    }
    config.validate()?;
    // One process, one endpoint for both roles: the scheduler's address, else the worker's.
    let listen = [&config.scheduler.http_listen, &config.worker.http_listen]
        .into_iter()
        .find(|l| !l.is_empty())
        .cloned()
        .unwrap_or_default();
    let shutdown = CancellationToken::new();
    let status = Arc::new(NodeStatus::default());
    let worker_ready = Arc::new(AtomicBool::new(false));
    if !listen.is_empty() {
        let reach = crate::kafka::reach::watch(&config, system_clock(), shutdown.clone())?;
        let endpoint = http::Endpoint::new("dev", http::prometheus())
            .with_scheduler(status.clone())
            .with_worker(worker_ready.clone())
            .with_brokers(reach);
        http::start(&listen, endpoint, shutdown.clone()).await?;
    }
    let admin = Admin::new(&config)?;
    admin.ensure(&fleet_topics(&config)).await?;
    if args.examples {
        for job in examples(super::jobs::now_ms()) {
            super::jobs::put(&config, &job).await?;
            println!("put example job {}", job.id);
        }
    }
    let signals = shutdown.clone();
    tokio::spawn(async move {
        super::scheduler::wait_for_signal().await;
        eprintln!("stopping");
        signals.cancel();
    });
    let sched = tokio::spawn(scheduler::run(
        config.clone(),
        "dev".into(),
        system_clock(),
        status,
        shutdown.clone(),
    ));
    let mut opts = WorkerOptions::new("dev");
    opts.on_finished = Some(Arc::new(super::worker::print_finished));
    worker_ready.store(true, Ordering::Relaxed);
    let work = worker::run(config, opts, system_clock(), shutdown.clone());
    let (s, w) = tokio::join!(sched, work);
    s??;
    w?;
    Ok(())
}

fn examples(now: i64) -> Vec<JobDefinition> {
    let exec = |args: &[&str]| HandlerSpec {
        kind: HandlerKind::Exec,
        target: "sh".into(),
        payload: Vec::new(),
        headers: Default::default(),
        method: None,
        args: args.iter().map(|s| s.to_string()).collect(),
    };
    let base = |id: &str, tenant: &str, schedule, handler| JobDefinition {
        timeout_ms: 10_000,
        ..JobDefinition::new(id, tenant, schedule, handler)
    };
    vec![
        base(
            "every-5-seconds",
            "acme",
            ScheduleSpec::Cron {
                expr: "*/5 * * * * *".into(),
                zone: "Europe/Berlin".into(),
            },
            exec(&[
                "-c",
                "echo \"hello from $TOCSIN_JOB_ID, attempt $TOCSIN_ATTEMPT\"",
            ]),
        ),
        base(
            "every-3s-interval",
            "globex",
            ScheduleSpec::Interval {
                every_ms: 3_000,
                anchor_ms: 0,
            },
            exec(&["-c", "date -u +%H:%M:%S.%3N"]),
        ),
        base(
            "one-shot-in-10s",
            "acme",
            ScheduleSpec::Once {
                at_ms: (now / 1000 + 10) * 1000,
            },
            exec(&["-c", "echo once, at $TOCSIN_SCHEDULED_MS"]),
        ),
    ]
}
