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

/// Partition counts and replication of the fleet's topics.
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
    /// How the records of `runs` and `dead` are written, per topic.
    pub serialization: SerializationConfig,
}

/// `[topics.serialization]`: the value format of each history topic. Readers inside Tocsin
/// (`tocsin runs`) take either, so a topic may change format while it holds both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SerializationConfig {
    /// `runs`, keyed by run id.
    pub runs: Serialization,
    /// `dead`, keyed by run id.
    pub dead: Serialization,
}

/// The value format of a history topic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Serialization {
    /// Avro single-object encoding of the record (`schemas/`): the default.
    #[default]
    Avro,
    /// Kafka Connect's JSON with schemas (`JsonConverter`, `schemas.enable=true`), one flat
    /// struct per record, for Connect sinks without a schema registry.
    ConnectJson,
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
            serialization: SerializationConfig::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest handler payload a job may carry.
    pub max_payload_bytes: usize,
    /// Which topics a `kafka` job may write into. Tocsin's own topics (under the prefix) are
    /// refused whatever this says.
    pub kafka_targets: KafkaTargets,
}

/// The topics a tenant's `kafka` jobs may target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaTargets {
    /// Any topic outside Tocsin's own (the default: one trusted team).
    #[default]
    Any,
    /// Only topics named `<tenant>.…`: tenants cannot write into each other's topics.
    TenantPrefix,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_payload_bytes: crate::model::validate::DEFAULT_MAX_PAYLOAD_BYTES,
            kafka_targets: KafkaTargets::default(),
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
    /// Firing resolution; ticks align to multiples of it on the wall clock. Default 100 ms: a
    /// run is visible about a tick plus a transaction after its instant.
    pub tick_ms: u64,
    /// How far ahead of their time runs that a worker executes are fired (not `kafka` jobs, nor
    /// jobs whose overlap policy is `skip` or `buffer_one`):
    /// into the lane, with a not-before instant that the worker holds them until, so the
    /// commit's time costs no lateness. A change to a job (an update, a pause, a delete) takes
    /// effect for the instants more than this after it is read; a run already fired ahead runs.
    /// 0 fires every run at its time. Default 1000 ms.
    pub lookahead_ms: u64,
    /// Runs per firing transaction; a larger herd is cut into several. A transaction's fixed
    /// cost grows with the partitions it touches (a commit marker on each). A transaction that
    /// leaves timers of a partition due (a herd cut into several) writes the timers it fires
    /// there, up to every `timers` partition, so with 1024 partitions small herd transactions
    /// are slow: on the 2-core reference machine, a 300,000-run herd at 1024 partitions went
    /// from 28,800 to 35,600 fires/s from 20,000 to 60,000 (the default). A node holds a
    /// transaction's records in memory until it commits (about 2–3 records a run).
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
    /// Who writes a `kafka` job's payload into its target topic.
    pub kafka_delivery: KafkaDelivery,
    /// The job API's tokens, one a line: `TOKEN` (every tenant) or `TOKEN TENANT`. Empty: none
    /// (then mutations are served on a loopback address only); `TOCSIN_API_TOKEN` adds one.
    pub api_tokens_file: Option<PathBuf>,
    /// The base URL other nodes redirect API requests to (`http://host:port`); default: the
    /// listen address, with the host name for an unspecified address (`0.0.0.0`).
    pub http_advertise: Option<String>,
}

/// Who writes a `kafka` job's payload into its target topic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaDelivery {
    /// The scheduler, inside the firing transaction: exactly once for `read_committed`
    /// readers, at firing speed, with no lane record and no worker (the default).
    #[default]
    Direct,
    /// A worker, from the tenant's lane: at least once (a worker that dies between the
    /// target write and its lane commit delivers again), one more hop.
    Worker,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            node_id: None,
            data_dir: PathBuf::from("./tocsin-data"),
            tick_ms: 100,
            lookahead_ms: 1_000,
            max_runs_per_transaction: 60_000,
            transaction_timeout_ms: 10_000,
            misfire_threshold_ms: 60_000,
            max_runs_per_job_per_tick: 1_000,
            group_id: "tocsin-scheduler".into(),
            static_membership: false,
            http_listen: String::new(),
            kafka_delivery: KafkaDelivery::default(),
            api_tokens_file: None,
            http_advertise: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    pub pool: String,
    /// Lane topics: tenant names, or `*` for every lane (found in the broker's metadata every
    /// second).
    pub lanes: Vec<String>,
    /// Runs executing at once on this worker (default 1024). A run holds its slot while its
    /// handler runs; the reports of a finished run are delivered after it gave the slot back.
    pub concurrency: usize,
    /// Runs of one tenant executing at once (default 256), so one tenant cannot take every slot.
    pub per_tenant_concurrency: usize,
    pub data_dir: PathBuf,
    /// `host:port` of the worker's HTTP endpoint (/metrics, /healthz, /readyz); empty disables it.
    pub http_listen: String,
    /// How long the ledger remembers a finished run (default 7 days): a redelivery within it is
    /// acknowledged without running again; one later runs again.
    pub ledger_retention_ms: u64,
    /// How often ledger entries past the retention are dropped (default 60 s).
    pub ledger_prune_interval_ms: u64,
    pub exec: ExecConfig,
    pub http: HttpTargetConfig,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            pool: "default".into(),
            lanes: vec!["*".into()],
            concurrency: 1024,
            per_tenant_concurrency: 256,
            data_dir: PathBuf::from("./tocsin-worker-data"),
            http_listen: String::new(),
            ledger_retention_ms: 7 * 86_400_000,
            ledger_prune_interval_ms: 60_000,
            exec: ExecConfig::default(),
            http: HttpTargetConfig::default(),
        }
    }
}

/// `[worker.exec]`: who may run which program. An `exec` run runs as the worker's user, so it
/// is off unless enabled, and then only for the programs listed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecConfig {
    /// Off by default: every `exec` run goes to `dead`.
    pub enabled: bool,
    /// Absolute paths of the programs an `exec` run may start, compared as written (a target
    /// without `/` is looked up in the worker's `PATH` first). Allowing a shell allows any
    /// command.
    pub allow: Vec<PathBuf>,
    /// Tenants whose runs may use `exec`; empty: every tenant.
    pub tenants: Vec<String>,
}

/// `[worker.http]`: which hosts an `http` run may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpTargetConfig {
    /// Whether hosts whose every address is public may be called (default true).
    pub allow_public: bool,
    /// Hosts that may be called besides: names (`billing.internal`, `*.internal` for its
    /// subdomains), addresses or CIDRs (`10.1.0.0/16`, `::1`). Loopback, private, link-local and
    /// other non-public addresses are refused unless listed here.
    pub allow_hosts: Vec<String>,
    /// A PEM file of CA certificates that `https` targets may be signed by, besides the
    /// platform's trust store (`/etc/ssl/certs`, from `ca-certificates`). Default: none.
    pub ca_file: Option<PathBuf>,
}

impl Default for HttpTargetConfig {
    fn default() -> Self {
        HttpTargetConfig {
            allow_public: true,
            allow_hosts: Vec::new(),
            ca_file: None,
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
        for key in self.kafka.keys() {
            if let Some(rule) = forbidden_kafka_setting(key) {
                return Err(ConfigError::Invalid {
                    setting: "kafka",
                    value: format!("{key:?}"),
                    rule,
                });
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
        if s.lookahead_ms > 60_000 || s.lookahead_ms >= s.misfire_threshold_ms {
            return Err(invalid(
                "scheduler.lookahead_ms",
                s.lookahead_ms,
                "must be at most 60000 and less than scheduler.misfire_threshold_ms",
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
        let w = &self.worker;
        if w.ledger_retention_ms == 0 {
            return Err(invalid(
                "worker.ledger_retention_ms",
                0,
                "must be at least 1",
            ));
        }
        if w.ledger_prune_interval_ms < 100 {
            return Err(invalid(
                "worker.ledger_prune_interval_ms",
                w.ledger_prune_interval_ms,
                "must be at least 100",
            ));
        }
        if let Some(p) = w.exec.allow.iter().find(|p| !p.is_absolute()) {
            return Err(invalid(
                "worker.exec.allow",
                format!("{:?}", p.display().to_string()),
                "must hold absolute program paths",
            ));
        }
        if w.exec.enabled && w.exec.allow.is_empty() {
            return Err(invalid(
                "worker.exec.allow",
                "[]",
                "must list at least one program when worker.exec.enabled = true",
            ));
        }
        if let Some(h) = w
            .http
            .allow_hosts
            .iter()
            .find(|h| crate::worker::policy::HostRule::parse(h).is_err())
        {
            return Err(invalid(
                "worker.http.allow_hosts",
                format!("{h:?}"),
                "must hold host names, `*.domain`, IP addresses or CIDRs (10.0.0.0/8)",
            ));
        }
        Ok(())
    }

    /// Topic names under this configuration's prefix.
    pub fn topic(&self, name: &str) -> String {
        format!("{}{}", self.topic_prefix, name)
    }

    /// The lane of `tenant`; see `tenant_topic_part` for why `.` and `_` are escaped.
    pub fn lane_topic(&self, tenant: &str) -> String {
        format!(
            "{}lane.{}",
            self.topic_prefix,
            crate::model::job::tenant_topic_part(tenant)
        )
    }
}

/// The names of Tocsin's own topics, apart from the prefix.
pub const OWN_TOPICS: [&str; 7] = [
    "jobs",
    "jobs.rejected",
    "timers",
    "control",
    "runs",
    "dead",
    "nodes",
];

/// Whether `topic` is one of the topics of a fleet with topic prefix `prefix`: under the
/// prefix, compared as Kafka compares names for collisions (`.` and `_` alike, so
/// `tocsin_lane.x` counts too); with an empty prefix, the names of [`OWN_TOPICS`] and the
/// lanes (`lane.…`). No job may write into these.
pub fn is_tocsin_topic(prefix: &str, topic: &str) -> bool {
    let kafka_form = |t: &str| t.replace('.', "_");
    if prefix.is_empty() {
        OWN_TOPICS.contains(&topic) || kafka_form(topic).starts_with("lane_")
    } else {
        kafka_form(topic).starts_with(&kafka_form(prefix))
    }
}

/// `[kafka]` pass-through settings that would break a guarantee, with the rule they break.
/// Everything else passes through to librdkafka (SASL, TLS, timeouts, sizes).
fn forbidden_kafka_setting(key: &str) -> Option<&'static str> {
    Some(match key {
        "isolation.level" => {
            "is Tocsin's to set: lanes and timers are read read_committed, or aborted runs would \
             be seen"
        }
        "enable.auto.commit" | "enable.auto.offset.store" => {
            "is Tocsin's to set: offsets are committed with the transactions (scheduler) or below \
             the lowest unfinished run (worker)"
        }
        "transactional.id" => {
            "is Tocsin's to set: it is derived from the node id, and a shared one would fence \
             every other node"
        }
        "partitioner" | "partitioner.class" => {
            "is Tocsin's to set: keys are placed as Kafka's Java client places them (murmur2), \
             or jobs and timers would not be co-partitioned"
        }
        "bootstrap.servers" | "metadata.broker.list" => {
            "would shadow --bootstrap (the `bootstrap` setting); set that instead"
        }
        "group.id" => "is Tocsin's to set: the scheduler group and each worker pool have their own",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_topics_are_told_as_kafka_compares_names() {
        for own in [
            "tocsin.jobs",
            "tocsin.lane.acme",
            "tocsin_lane.acme",
            "tocsin.dead",
        ] {
            assert!(is_tocsin_topic("tocsin.", own), "{own}");
        }
        for other in ["orders", "tocsin", "tocsinx.jobs", "other.lane.x"] {
            assert!(!is_tocsin_topic("tocsin.", other), "{other}");
        }
        // Without a prefix: the fixed names and the lanes.
        for own in ["jobs", "jobs.rejected", "timers", "lane.acme", "lane_acme"] {
            assert!(is_tocsin_topic("", own), "{own}");
        }
        for other in ["orders", "jobsx", "my.lane.x"] {
            assert!(!is_tocsin_topic("", other), "{other}");
        }
    }

    #[test]
    fn kafka_settings_that_break_guarantees_are_refused() {
        for key in [
            "isolation.level",
            "enable.auto.commit",
            "transactional.id",
            "partitioner",
            "bootstrap.servers",
        ] {
            let mut c = Config::default();
            c.kafka.insert(key.into(), "x".into());
            let msg = c.validate().unwrap_err().to_string();
            assert!(msg.contains(&format!("{key:?}")), "{msg}");
        }
        let mut c = Config::default();
        c.kafka
            .insert("security.protocol".into(), "SASL_SSL".into());
        c.kafka.insert("message.max.bytes".into(), "2000000".into());
        c.validate().unwrap();
    }

    #[test]
    fn defaults_are_valid_and_match_the_architecture() {
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
    fn serialization_is_per_topic_and_a_bad_one_names_the_choices() {
        let c = Config::default();
        assert_eq!(c.topics.serialization.runs, Serialization::Avro);
        let c = Config::from_toml("[topics.serialization]\nruns = \"connect_json\"\n").unwrap();
        assert_eq!(c.topics.serialization.runs, Serialization::ConnectJson);
        assert_eq!(c.topics.serialization.dead, Serialization::Avro);
        let err = Config::from_toml("[topics.serialization]\nruns = \"json\"\n").unwrap_err();
        assert!(
            err.contains("json") && err.contains("avro") && err.contains("connect_json"),
            "{err}"
        );
        let err = Config::from_toml("[topics.serialization]\ntimers = \"avro\"\n").unwrap_err();
        assert!(err.contains("timers"), "{err}");
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
        let mut c = Config::default();
        c.scheduler.lookahead_ms = 90_000;
        let msg = c.validate().unwrap_err().to_string();
        assert!(
            msg.contains("scheduler.lookahead_ms") && msg.contains("90000"),
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

    #[test]
    fn worker_defaults_leave_exec_off_and_private_hosts_refused() {
        let w = Config::default().worker;
        assert_eq!((w.concurrency, w.per_tenant_concurrency), (1024, 256));
        assert!(!w.exec.enabled && w.exec.allow.is_empty() && w.exec.tenants.is_empty());
        assert!(w.http.allow_public && w.http.allow_hosts.is_empty());
        let c = Config::from_toml(
            "[worker.exec]\nenabled = true\nallow = [\"/bin/true\"]\ntenants = [\"acme\"]\n\
             [worker.http]\nallow_hosts = [\"127.0.0.1\", \"10.0.0.0/8\", \"*.internal\"]\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.worker.exec.allow, vec![PathBuf::from("/bin/true")]);
        let err = Config::from_toml("[worker.exec]\nallowed = []\n").unwrap_err();
        assert!(err.contains("allowed"), "{err}");
    }

    #[test]
    fn invalid_worker_policies_name_the_setting() {
        let mut c = Config::default();
        c.worker.exec.enabled = true;
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("worker.exec.allow"), "{msg}");
        c.worker.exec.allow = vec!["true".into()];
        let msg = c.validate().unwrap_err().to_string();
        assert!(
            msg.contains("worker.exec.allow") && msg.contains("absolute"),
            "{msg}"
        );
        let mut c = Config::default();
        c.worker.http.allow_hosts = vec!["10.0.0.0/33".into()];
        let msg = c.validate().unwrap_err().to_string();
        assert!(
            msg.contains("worker.http.allow_hosts") && msg.contains("/33"),
            "{msg}"
        );
        let mut c = Config::default();
        c.worker.ledger_retention_ms = 0;
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("worker.ledger_retention_ms"), "{msg}");
    }
}
