//! `tocsin-loadtest`: the system benchmark and exactly-once audit of Tocsin.
//!
//! It runs real `tocsin scheduler` processes against a real broker, loads jobs through `jobs`
//! as users do, reads the lanes as a `read_committed` worker would, and reports what it saw:
//! lag from each run's scheduled instant to its visibility, lost and duplicate runs, and
//! throughputs beside a raw transactional produce baseline measured in the same run.
//!
//! Must never: report a number it did not measure, or measure with a client setting that
//! differs from the one it compares against. See `loadtest/README.md` for the commands.

mod audit;
mod baseline;
mod chart;
mod fleet;
mod load;
mod perf;
mod report;
mod scenarios;
mod sink;
mod starts;
mod target;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use tracing_subscriber::EnvFilter;

// As `tocsin` itself: the in-process worker (`steady --worker`) and the baseline then allocate
// as a `tocsin worker` and a node do.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Jobs spread so that `--rate` runs fall due every second, for `--duration-s`.
    Steady,
    /// `--jobs` runs due in the same second across `--tenants` (`--skew` held by the first).
    Herd,
    /// Steady load on `--nodes`; one node is killed (`kill -9`) or stopped (SIGSTOP/SIGCONT).
    Failover,
    /// `--jobs` timers on one node: its peak RSS, then the restore time of a node taking over.
    Capacity,
    /// Raw transactional produce of the records fires write, alone.
    Baseline,
    /// `--jobs` one-shot `kafka` jobs due in the same second, delivered to one target topic:
    /// what a consumer of delayed messages sees.
    Delay,
    /// Steady `kafka` runs executed by a worker and reported on `runs` as Connect JSON, which
    /// Kafka Connect's Debezium JDBC sink upserts into PostgreSQL (`scripts/connect`): the lag
    /// from each run's finish to its finished row in `tocsin_runs`.
    History,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Steady => "steady",
            Scenario::Herd => "herd",
            Scenario::Failover => "failover",
            Scenario::Capacity => "capacity",
            Scenario::Baseline => "baseline",
            Scenario::Delay => "delay",
            Scenario::History => "history",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Align {
    /// Instants spread evenly over the period (millisecond resolution).
    Spread,
    /// Instants on whole seconds (as cron schedules are).
    Second,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KillMode {
    /// SIGKILL: the node dies.
    Kill,
    /// SIGSTOP, then SIGCONT after `--stop-for-s`: a zombie that must be fenced.
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// The scheduler writes the payload to the target in its firing transaction.
    Direct,
    /// The scheduler writes a lane record; a `tocsin worker` delivers it (at-least-once).
    Worker,
}

impl Via {
    pub fn name(self) -> &'static str {
        match self {
            Via::Direct => "direct",
            Via::Worker => "worker",
        }
    }
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "tocsin-loadtest",
    about = "System benchmark and exactly-once audit of Tocsin"
)]
pub struct Args {
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Kafka bootstrap servers; without it, `scripts/kafka start` provides a local broker.
    #[arg(long, env = "TOCSIN_LOADTEST_BOOTSTRAP")]
    pub bootstrap: Option<String>,
    /// The `tocsin` binary; defaults to the one beside this program.
    #[arg(long)]
    pub tocsin_bin: Option<PathBuf>,
    /// Where node configs, logs and data go; a fresh temporary directory by default (removed
    /// after a passing run). A directory given here is always kept.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Keep the work directory (it is kept anyway when the run fails) and the run's topics
    /// (deleted by default: a small broker holds only so many partitions).
    #[arg(long)]
    pub keep: bool,
    /// Topic prefix; a fresh one per run by default.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Draw lag over time per tenant into this PNG.
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Partitions of `jobs`, `timers` and `control`.
    #[arg(long, default_value_t = 1024)]
    pub partitions: u32,
    /// Partitions of each lane topic.
    #[arg(long, default_value_t = 8)]
    pub lane_partitions: u32,
    /// Scheduler nodes [default: 3 for failover, 1 otherwise].
    #[arg(long)]
    pub nodes: Option<usize>,
    /// steady/failover: after indexing, wait up to this long for the nodes to catch up with
    /// what the ingest left due (every run seen in the last second at most tick + 1 s late)
    /// before the measured window starts.
    #[arg(long, default_value_t = 60)]
    pub settle_max_s: u64,
    /// `scheduler.tick_ms` of the nodes.
    #[arg(long, default_value_t = tocsin::config::Config::default().scheduler.tick_ms)]
    pub tick_ms: u64,
    /// `scheduler.lookahead_ms` of the nodes: how far ahead of their instant runs that a
    /// worker executes are fired (0: at their instant).
    #[arg(long, default_value_t = tocsin::config::Config::default().scheduler.lookahead_ms)]
    pub lookahead_ms: u64,
    /// steady: run a worker in this process that executes every run (a handler that only
    /// notes when it started), and report the lag from each run's instant to its handler's
    /// start.
    #[arg(long)]
    pub worker: bool,
    /// steady: give every job a `kafka` handler that the scheduler delivers itself
    /// (`scheduler.kafka_delivery = "direct"`) to a target topic, as `delay` does, and audit
    /// that topic instead of the lanes; the report adds the lag from each run's instant to its
    /// record's append in the target (`append_lag_ms`).
    #[arg(long, conflicts_with = "worker")]
    pub target: bool,
    /// `scheduler.transaction_timeout_ms` of the nodes: also how long a dead node's open
    /// transaction holds back every `read_committed` reader of the partitions it wrote.
    #[arg(long, default_value_t = tocsin::config::Config::default().scheduler.transaction_timeout_ms)]
    pub transaction_timeout_ms: u64,
    /// `scheduler.max_runs_per_transaction` of the nodes (and of the baseline).
    #[arg(long, default_value_t = tocsin::config::Config::default().scheduler.max_runs_per_transaction)]
    pub max_runs_per_transaction: usize,
    /// Steady, failover: runs due per second.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Steady, failover: the interval of every job; jobs = rate × period.
    #[arg(long, default_value_t = 10_000)]
    pub period_ms: u64,
    /// Length of the measured window [default: 30; history 60; capacity 10].
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Job count: herd runs [300000], delay messages [100000], capacity timers [1000000],
    /// steady/failover/baseline override of rate × period.
    #[arg(long)]
    pub jobs: Option<u64>,
    /// herd/delay: seconds from the start of the load to the due instant [default: 10 + one
    /// per 10,000 jobs]. Indexing must end before it (the report notes when it did not: the
    /// lag then includes indexing); a slow ingest needs more.
    #[arg(long)]
    pub due_in_s: Option<u64>,
    /// Tenants (one lane topic each).
    #[arg(long, default_value_t = 4)]
    pub tenants: usize,
    /// Share of the jobs held by tenant t0 [default: 0.9 for herd, even otherwise].
    #[arg(long)]
    pub skew: Option<f64>,
    /// Steady, failover: where instants fall within a second.
    #[arg(long, value_enum, default_value_t = Align::Spread)]
    pub align: Align,
    /// Failover: seconds into the window when the node is killed [default: a third of it].
    #[arg(long)]
    pub kill_at_s: Option<f64>,
    #[arg(long, value_enum, default_value_t = KillMode::Kill)]
    pub kill_mode: KillMode,
    /// The scheduler group's own session timeout (the KIP-848 group setting
    /// `consumer.session.timeout.ms`, with `consumer.heartbeat.interval.ms` a sixth of it), set
    /// with Kafka's `ConfigCommand` before the nodes join [default: the broker's
    /// `group.consumer.session.timeout.ms`].
    #[arg(long)]
    pub session_timeout_ms: Option<u64>,
    /// Failover with `--kill-mode stop`: seconds the node stays stopped.
    #[arg(long, default_value_t = 15)]
    pub stop_for_s: u64,
    /// Bytes of handler payload per job (so per run).
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Fires produced by the baseline [default: the scenario's fires, at most 300000; 0 skips].
    #[arg(long)]
    pub baseline_fires: Option<u64>,
    /// Capacity: jobs that fire every second, to check the restored node fires.
    #[arg(long, default_value_t = 100)]
    pub probes: u64,
    /// Delay: who writes the payload to the target topic (`scheduler.kafka_delivery`).
    #[arg(long, value_enum, default_value_t = Via::Direct)]
    pub via: Via,
    /// Delay, history, steady --target: partitions of the target topic.
    #[arg(long, default_value_t = 16)]
    pub target_partitions: u32,
    /// Delay: `kill -9` at the due instant + this many ms, of scheduler node n1 (direct) or
    /// of the worker (worker); a single node and the worker are restarted at once.
    #[arg(long, allow_hyphen_values = true)]
    pub kill_at_ms: Option<i64>,
}

pub fn now_ms() -> i64 {
    tocsin::cli::jobs::now_ms()
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("TOCSIN_LOADTEST_LOG")
                .unwrap_or_else(|_| EnvFilter::new("info,librdkafka=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let outcome = scenarios::run(&args);
    match outcome {
        Ok((report, chart)) => {
            print!("{}", report.table());
            if let Some(path) = &args.report {
                let json = serde_json::to_string_pretty(&report).expect("report serializes");
                if let Err(e) = std::fs::write(path, json + "\n") {
                    eprintln!("error: could not write {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            }
            if let (Some(path), Some(chart)) = (&args.chart, chart) {
                if let Err(e) = chart::render(&chart, path) {
                    eprintln!("error: {e:#}");
                    return ExitCode::FAILURE;
                }
            }
            if report.audit_passed() {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: the audit failed: lost or duplicate runs (see the report)");
                ExitCode::from(2)
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
