//! Configuration: a TOML file, then environment variables, then flags (each overrides the one
//! before). Validated once at start-up; every error names the setting.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("could not read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting {setting} = {value}: {rule}")]
    Invalid {
        setting: &'static str,
        value: String,
        rule: &'static str,
    },
}

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// The whole configuration of a Tocsin node or CLI invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Kafka bootstrap servers (`host:port,...`).
    pub bootstrap: String,
    /// Prefix of every topic name.
    pub topic_prefix: String,
    pub topics: TopicsConfig,
    /// Passed through to librdkafka as is (SASL, TLS, ...), for every client.
    pub kafka: BTreeMap<String, String>,
    pub limits: LimitsConfig,
    pub scheduler: SchedulerConfig,
    pub worker: WorkerConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bootstrap: "127.0.0.1:9092".into(),
            topic_prefix: "tocsin.".into(),
            topics: TopicsConfig::default(),
            kafka: BTreeMap::new(),
            limits: LimitsConfig::default(),
            scheduler: SchedulerConfig::default(),
            worker: WorkerConfig::default(),
        }
    }
}

/// Partition counts and replication of the topics of DESIGN §1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicsConfig {
    /// Partitions of `jobs`, `timers` and `control` (co-partitioned: one count for all three).
    pub job_partitions: u32,
    /// Partitions of each `lane.<tenant>` topic, created on demand.
    pub lane_partitions: u32,
    pub runs_partitions: u32,
    pub dead_partitions: u32,
    pub rejected_partitions: u32,
    /// Replication factor of topics Tocsin creates; -1 takes the broker's default.
    pub replication_factor: i32,
}

impl Default for TopicsConfig {
    fn default() -> Self {
        TopicsConfig {
            job_partitions: 1024,
            lane_partitions: 8,
            runs_partitions: 8,
            dead_partitions: 8,
            rejected_partitions: 8,
            replication_factor: -1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest handler payload a job may carry.
    pub max_payload_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_payload_bytes: 1024 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Stable node identity; also the root of the node's `transactional.id`.
    pub node_id: Option<String>,
    /// RocksDB directory (a cache of Kafka: deleting it loses nothing).
    pub data_dir: PathBuf,
    /// Firing resolution; ticks align to multiples of it on the wall clock.
    pub tick_ms: u64,
    /// Runs per firing transaction; a larger herd is cut into several. A transaction's fixed
    /// cost grows with the partitions it touches (a commit marker on each, up to every `timers`
    /// partition), so with 1024 partitions small transactions are slow: on the 2-core reference
    /// machine, raw transactional produce went from 3,400 to 24,600 fires/s from 5,000 to
    /// 20,000 per transaction.
    pub max_runs_per_transaction: usize,
    /// Kept short: an open transaction of a stalled node holds back readers until it aborts.
    pub transaction_timeout_ms: u64,
    /// An instant fired later than this past its time is a misfire and handled by the job's
    /// misfire policy; anything less late (a failover, a slow tick) is fired, late.
    pub misfire_threshold_ms: u64,
    /// Catch-up runs one job may emit in one tick.
    pub max_runs_per_job_per_tick: usize,
    /// Consumer group of the scheduler fleet.
    pub group_id: String,
    /// Static membership (`group.instance.id`), off by default.
    pub static_membership: bool,
    /// `host:port` of the HTTP endpoint (/metrics, /healthz, /readyz); empty disables it.
    pub http_listen: String,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            node_id: None,
            data_dir: PathBuf::from("./tocsin-data"),
            tick_ms: 1000,
            max_runs_per_transaction: 20_000,
            transaction_timeout_ms: 10_000,
            misfire_threshold_ms: 60_000,
            max_runs_per_job_per_tick: 1_000,
            group_id: "tocsin-scheduler".into(),
            static_membership: false,
            http_listen: String::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    pub pool: String,
    /// Lane topics: tenant names, or `*` for every lane (a pattern).
    pub lanes: Vec<String>,
    pub concurrency: usize,
    pub per_tenant_concurrency: usize,
    pub data_dir: PathBuf,
    /// `host:port` of the worker's HTTP endpoint (/metrics, /healthz, /readyz); empty disables it.
    pub http_listen: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            pool: "default".into(),
            lanes: vec!["*".into()],
            concurrency: 64,
            per_tenant_concurrency: 16,
            data_dir: PathBuf::from("./tocsin-worker-data"),
            http_listen: String::new(),
        }
    }
}

impl Config {
    /// Reads a TOML file; unknown keys are errors.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    pub fn from_toml(text: &str) -> std::result::Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())
    }

    /// Checks every rule that serde cannot express.
    pub fn validate(&self) -> Result<()> {
        fn invalid(setting: &'static str, value: impl ToString, rule: &'static str) -> ConfigError {
            ConfigError::Invalid {
                setting,
                value: value.to_string(),
                rule,
            }
        }
        if self.bootstrap.trim().is_empty() {
            return Err(invalid(
                "bootstrap",
                "\"\"",
                "must name at least one host:port",
            ));
        }
        if !self
            .topic_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            || self.topic_prefix.len() > 100
        {
            return Err(invalid(
                "topic_prefix",
                format!("{:?}", self.topic_prefix),
                "may hold only [A-Za-z0-9._-], at most 100 characters",
            ));
        }
        let t = &self.topics;
        for (setting, n) in [
            ("topics.job_partitions", t.job_partitions),
            ("topics.lane_partitions", t.lane_partitions),
            ("topics.runs_partitions", t.runs_partitions),
            ("topics.dead_partitions", t.dead_partitions),
            ("topics.rejected_partitions", t.rejected_partitions),
        ] {
            if n == 0 || n > 65_535 {
                return Err(invalid(setting, n, "must be between 1 and 65535"));
            }
        }
        if t.replication_factor == 0 || t.replication_factor < -1 {
            return Err(invalid(
                "topics.replication_factor",
                t.replication_factor,
                "must be -1 (broker default) or at least 1",
            ));
        }
        let s = &self.scheduler;
        let tick_ok = (10..1000).contains(&s.tick_ms) && 1000 % s.tick_ms == 0
            || (1000..=60_000).contains(&s.tick_ms);
        if !tick_ok {
            return Err(invalid(
                "scheduler.tick_ms",
                s.tick_ms,
                "must divide 1000 (10, 20, 50, 100, 200, 250, 500) or be 1000..=60000",
            ));
        }
        if s.max_runs_per_transaction == 0 {
            return Err(invalid(
                "scheduler.max_runs_per_transaction",
                0,
                "must be at least 1",
            ));
        }
        if !(1_000..=900_000).contains(&s.transaction_timeout_ms) {
            return Err(invalid(
                "scheduler.transaction_timeout_ms",
                s.transaction_timeout_ms,
                "must be between 1000 and 900000",
            ));
        }
        if self.limits.max_payload_bytes == 0 {
            return Err(invalid("limits.max_payload_bytes", 0, "must be at least 1"));
        }
        for (setting, listen) in [
            ("scheduler.http_listen", &s.http_listen),
            ("worker.http_listen", &self.worker.http_listen),
        ] {
            let valid = listen.is_empty()
                || listen
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid {
                return Err(invalid(
                    setting,
                    format!("{listen:?}"),
                    "must be host:port, or empty to disable the endpoint",
                ));
            }
        }
        if self.worker.concurrency == 0 {
            return Err(invalid("worker.concurrency", 0, "must be at least 1"));
        }
        if self.worker.per_tenant_concurrency == 0 {
            return Err(invalid(
                "worker.per_tenant_concurrency",
                0,
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// Topic names under this configuration's prefix.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{}", self.topic_prefix, name)
    }

    pub fn lane_topic(&self, tenant: &str) -> String {
        format!("{}lane.{}", self.topic_prefix, tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_design() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.topics.job_partitions, 1024);
        assert_eq!(c.topics.lane_partitions, 8);
        assert_eq!(c.topic("jobs"), "tocsin.jobs");
    }

    #[test]
    fn unknown_keys_are_rejected_with_their_name() {
        let err = Config::from_toml("bootstrap = \"a:1\"\nbootstarp = \"x\"\n").unwrap_err();
        assert!(err.contains("bootstarp"), "{err}");
        let err = Config::from_toml("[scheduler]\ntick = 5\n").unwrap_err();
        assert!(err.contains("tick"), "{err}");
    }

    #[test]
    fn kafka_table_passes_through() {
        let c = Config::from_toml(
            "[kafka]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanism\" = \"PLAIN\"\n",
        )
        .unwrap();
        assert_eq!(c.kafka["security.protocol"], "SASL_SSL");
    }

    #[test]
    fn invalid_values_name_the_setting() {
        let mut c = Config::default();
        c.scheduler.tick_ms = 300;
        let msg = c.validate().unwrap_err().to_string();
        assert!(
            msg.contains("scheduler.tick_ms") && msg.contains("300"),
            "{msg}"
        );
        let c = Config {
            topic_prefix: "bad prefix/".into(),
            ..Config::default()
        };
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("topic_prefix"), "{msg}");
        let mut c = Config::default();
        c.worker.http_listen = "9090".into();
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("worker.http_listen"), "{msg}");
        let mut c = Config::default();
        c.topics.job_partitions = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("topics.job_partitions"));
    }
}
