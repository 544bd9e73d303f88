//! `tocsin dev`: a scheduler and a worker in one process, for trying Tocsin out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http;
use crate::kafka::admin::{fleet_topics, lane_topic, Admin};
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
    /// Partitions of `jobs`, `timers` and `control` (every other topic gets 1): a few, so a
    /// new broker creates them in a moment (1024 of each take it tens of seconds).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: u32,
}

/// The topic prefix of `tocsin dev` when none other than the default is configured: a trial
/// never shares, or has to match the partition counts of, the topics of a fleet on the same
/// brokers (nor its consumer groups: `tocsin-dev-scheduler` and the pool `dev`).
pub const DEV_PREFIX: &str = "tocsin-dev.";

pub async fn run(mut config: Config, args: &DevArgs) -> anyhow::Result<()> {
    config.scheduler.data_dir = args.data_dir.join("scheduler");
    config.worker.data_dir = args.data_dir.join("worker");
    if let Some(listen) = &args.http_listen {
        config.scheduler.http_listen = listen.clone();
    }
    // Off the default fleet's topics and groups, unless told otherwise.
    let defaults = Config::default();
    if config.topic_prefix == defaults.topic_prefix {
        config.topic_prefix = DEV_PREFIX.into();
    }
    if config.scheduler.group_id == defaults.scheduler.group_id {
        config.scheduler.group_id = "tocsin-dev-scheduler".into();
    }
    if config.worker.pool == defaults.worker.pool {
        config.worker.pool = "dev".into();
    }
    let t = &mut config.topics;
    t.job_partitions = args.partitions;
    t.lane_partitions = 1;
    t.runs_partitions = 1;
    t.dead_partitions = 1;
    t.rejected_partitions = 1;
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
    let mut opts = WorkerOptions::new("dev");
    opts.on_finished = Some(Arc::new(super::worker::print_finished));
    if !listen.is_empty() {
        let reach = crate::kafka::reach::watch(&config, system_clock(), shutdown.clone())?;
        let endpoint = http::Endpoint::new("dev", http::prometheus())
            .with_scheduler(status.clone())
            .with_worker(worker_ready.clone())
            .with_ledger(opts.ledger_health.clone())
            .with_brokers(reach);
        http::start(&listen, endpoint, shutdown.clone()).await?;
    }
    let examples = match args.examples {
        true => examples(super::jobs::now_ms()),
        false => Vec::new(),
    };
    // The examples' lanes with the other topics, in one request, rather than at their first
    // fire: the worker then subscribes to them as it starts and takes the first runs at once.
    let tenants: std::collections::BTreeSet<&str> =
        examples.iter().map(|j| j.tenant.as_str()).collect();
    let mut topics = fleet_topics(&config);
    topics.extend(tenants.into_iter().map(|t| lane_topic(&config, t)));
    Admin::new(&config)?.ensure(&topics).await?;
    println!(
        "topics {}* ready ({} partitions of jobs)",
        config.topic_prefix, config.topics.job_partitions
    );
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
    worker_ready.store(true, Ordering::Relaxed);
    let work = tokio::spawn(worker::run(
        config.clone(),
        opts,
        system_clock(),
        shutdown.clone(),
    ));
    // While the scheduler joins its group and restores: it reads `jobs` from the start.
    let put = super::jobs::put_all(&config, &examples).await;
    match &put {
        Ok(()) => examples
            .iter()
            .for_each(|job| println!("put example job {}", job.id)),
        Err(_) => shutdown.cancel(),
    }
    let (s, w) = tokio::join!(sched, work);
    put?;
    s??;
    w??;
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
