//! The `tocsin` binary: one clap command whose subcommands are the service roles and the
//! operator's tools.

mod dev;
pub mod jobs;
mod jobs_list;
mod runs;
mod scheduler;
mod status;
mod topics;
mod worker;

use std::path::PathBuf;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(
    name = "tocsin",
    version,
    about = "A Kafka-native distributed job scheduler"
)]
pub struct Cli {
    /// TOML configuration file; environment variables override it, flags override both.
    #[arg(long, global = true, env = "TOCSIN_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kafka bootstrap servers.
    #[arg(long, global = true, env = "TOCSIN_BOOTSTRAP")]
    pub bootstrap: Option<String>,
    /// Prefix of every topic name [default: tocsin.]
    #[arg(long, global = true, env = "TOCSIN_TOPIC_PREFIX")]
    pub topic_prefix: Option<String>,
    /// Log filter (tracing's env-filter syntax).
    #[arg(long, global = true, env = "TOCSIN_LOG", default_value = "info")]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create and inspect Tocsin's topics.
    Topics {
        #[command(subcommand)]
        command: topics::TopicsCommand,
    },
    /// Put, inspect and control jobs.
    Jobs {
        #[command(subcommand)]
        command: jobs::JobsCommand,
    },
    /// Read the run history on `runs`.
    Runs {
        #[command(subcommand)]
        command: runs::RunsCommand,
    },
    /// The fleet: its nodes, the partitions each owns (state, consumer lag, due backlog), the
    /// lanes' backlog per tenant and each node's last error.
    Status(status::StatusArgs),
    /// Run a scheduler node.
    Scheduler(scheduler::SchedulerArgs),
    /// Run a worker of a pool on the tenant lanes.
    Worker(worker::WorkerArgs),
    /// A scheduler and a worker in one process, for trying Tocsin out.
    Dev(dev::DevArgs),
    /// Check configuration files.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print a shell completion script: `source <(tocsin completions bash)`, or save it where
    /// the shell loads completions from (zsh: a directory on `$fpath`, as `_tocsin`; fish:
    /// `~/.config/fish/completions/tocsin.fish`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a configuration file and explain what is wrong with it.
    Check { file: PathBuf },
}

impl Cli {
    /// The effective configuration: file, then environment and flags (clap resolves those two).
    pub fn load_config(&self) -> anyhow::Result<Config> {
        let mut config = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(b) = &self.bootstrap {
            config.bootstrap = b.clone();
        }
        if let Some(p) = &self.topic_prefix {
            config.topic_prefix = p.clone();
        }
        config.validate()?;
        Ok(config)
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Completions { shell } => {
            // Written whole, so a closed pipe is an error to report, not a panic inside clap.
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "tocsin", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script)
                .context("could not write the completion script")
        }
        Command::Config {
            command: ConfigCommand::Check { file },
        } => {
            let config = Config::from_file(file)?;
            config
                .validate()
                .with_context(|| format!("invalid config file {}", file.display()))?;
            let refused = crate::kafka::refused_settings(&config);
            for r in refused.iter().filter(|r| r.unknown) {
                eprintln!(
                    "warning: {}: [kafka] {:?} is not a librdkafka setting, and every client \
                     would refuse it: {}",
                    file.display(),
                    r.key,
                    r.reason
                );
            }
            if let Some(r) = refused.iter().find(|r| !r.unknown) {
                anyhow::bail!(
                    "invalid config file {}: [kafka] {:?}: {}",
                    file.display(),
                    r.key,
                    r.reason
                );
            }
            println!("{}: ok", file.display());
            Ok(())
        }
        Command::Topics { command } => topics::run(&reachable(cli.load_config()?)?, command).await,
        // A dry run is pure schedule math: it needs no broker.
        Command::Jobs {
            command: command @ jobs::JobsCommand::Put(jobs::PutArgs { dry_run: true, .. }),
        } => jobs::run(&cli.load_config()?, command).await,
        Command::Jobs { command } => jobs::run(&reachable(cli.load_config()?)?, command).await,
        Command::Runs { command } => runs::run(&reachable(cli.load_config()?)?, command).await,
        Command::Status(args) => status::run(&reachable(cli.load_config()?)?, args).await,
        Command::Scheduler(args) => scheduler::run(reachable(cli.load_config()?)?, args).await,
        Command::Worker(args) => worker::run(reachable(cli.load_config()?)?, args).await,
        Command::Dev(args) => dev::run(reachable(cli.load_config()?)?, args).await,
    }
}

/// A quiet client for the CLI's questions to the brokers (librdkafka's own log would repeat
/// the cause of a failure on every retry).
pub(crate) fn probe(config: &Config) -> anyhow::Result<rdkafka::consumer::BaseConsumer> {
    crate::kafka::base_config(config)
        .set("client.id", "tocsin-cli-probe")
        .set("log_level", "0")
        .create()
        .with_context(|| format!("invalid Kafka client settings for {}", config.bootstrap))
}

/// How long a command waits for the brokers to answer before it gives up.
const REACH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Fails within `REACH_TIMEOUT`, with one line naming the bootstrap address and the cause,
/// when no broker answers; librdkafka would otherwise retry for the length of each request's
/// own timeout (up to 300 s for a produce).
///
/// The cause is librdkafka's error, typed (`kafka::client`), when it said more than the
/// request's own failure: `authentication: … Authentication failed …` for refused credentials,
/// `tls: … certificate verify failed …` for a broker certificate it does not trust.
fn reachable(config: Config) -> anyhow::Result<Config> {
    use crate::kafka::client::{ClientErrorKind, Recording};
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer<Recording> = crate::kafka::base_config(&config)
        .set("client.id", "tocsin-cli-probe")
        .set("log_level", "0")
        .create_with_context(Recording::default())
        .with_context(|| format!("invalid Kafka client settings for {}", config.bootstrap))?;
    let Err(e) = consumer.fetch_metadata(None, REACH_TIMEOUT) else {
        return Ok(config);
    };
    // librdkafka's own errors come out of the client's queue.
    for _ in 0..10 {
        if let Some(Err(e)) = consumer.poll(std::time::Duration::from_millis(100)) {
            consumer.context().record(&e, "");
        }
    }
    let cause = match consumer.context().latest() {
        Some(f) if f.kind != ClientErrorKind::Transient => {
            format!("{}: {}", f.kind.name(), f.error)
        }
        _ => e.to_string(),
    };
    anyhow::bail!(
        "cannot reach Kafka at {} within {} s: {cause}",
        config.bootstrap,
        REACH_TIMEOUT.as_secs()
    )
}
