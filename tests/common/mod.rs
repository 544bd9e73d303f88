//! Shared by the integration tests: a real broker (started by `scripts/kafka` when
//! `TOCSIN_TEST_BOOTSTRAP` is unset), unique topic prefixes and group ids, and the binary.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use tocsin::config::Config;

/// Runs `command`, which must succeed (`what` names it in the failure, with its stderr).
pub fn run_ok(command: &mut Command, what: &str) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("could not run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `config` with these librdkafka settings added (a login, TLS).
pub fn with_kafka(config: &Config, settings: &[(&str, &str)]) -> Config {
    let mut c = config.clone();
    for (k, v) in settings {
        c.kafka.insert(k.to_string(), v.to_string());
    }
    c
}

/// The password of `user` in `users`, a `name:password` list, comma-separated.
pub fn password_of(users: &'static str, user: &str) -> &'static str {
    users
        .split(',')
        .find_map(|u| u.trim().strip_prefix(&format!("{user}:")))
        .unwrap_or_else(|| panic!("no user {user} in {users}"))
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The bootstrap address of the test broker. Starts one when none is given; a broker that
/// cannot be started fails the test loudly (never a silent skip).
pub fn bootstrap() -> String {
    static ADDR: OnceLock<String> = OnceLock::new();
    ADDR.get_or_init(|| {
        if let Ok(addr) = std::env::var("TOCSIN_TEST_BOOTSTRAP") {
            if !addr.trim().is_empty() {
                let addr = addr.trim();
                // A terminal escape leaked into the address (once: Maven's colour resets
                // ahead of `scripts/kafka start`'s last line) fails every test obscurely.
                assert!(
                    !addr.chars().any(char::is_control),
                    "TOCSIN_TEST_BOOTSTRAP {addr:?} holds a control character: it must be \
                     host:port, as the last line `scripts/kafka start` prints"
                );
                return addr.to_owned();
            }
        }
        let out = run_ok(
            Command::new(repo_root().join("scripts/kafka")).arg("start"),
            "scripts/kafka start",
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .last()
            .expect("scripts/kafka start printed no bootstrap address")
            .trim()
            .to_owned()
    })
    .clone()
}

/// A prefix no other test (or earlier run) uses.
pub fn unique_prefix(test: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "t{}-{}-{}.",
        std::process::id(),
        test,
        nanos % 1_000_000_000
    )
}

/// A configuration for one test: its own prefix, few partitions so a broker that holds many
/// test prefixes does not drown in partitions.
pub fn test_config(test: &str) -> Config {
    test_config_on(&bootstrap(), test)
}

/// As `test_config`, on the broker at `bootstrap` (a test's own, [`broker::OwnBroker`]).
pub fn test_config_on(bootstrap: &str, test: &str) -> Config {
    let mut c = Config {
        bootstrap: bootstrap.to_owned(),
        topic_prefix: unique_prefix(test),
        ..Config::default()
    };
    // A group of its own: the tests running at once on one broker never share one.
    c.scheduler.group_id = format!("{}scheduler", c.topic_prefix);
    c.topics.job_partitions = 8;
    c.topics.lane_partitions = 2;
    c.topics.runs_partitions = 2;
    c.topics.dead_partitions = 1;
    c.topics.rejected_partitions = 1;
    c.topics.replication_factor = 1;
    c
}

pub fn tocsin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tocsin"))
}

/// Runs the binary with the broker and prefix of `config`.
pub fn run_tocsin(config: &Config, args: &[&str]) -> Output {
    tocsin()
        .env_remove("TOCSIN_CONFIG")
        .args([
            "--bootstrap",
            &config.bootstrap,
            "--topic-prefix",
            &config.topic_prefix,
        ])
        .args(args)
        .output()
        .expect("could not run tocsin")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The classpath of Kafka's own jars, for asking Kafka's Java code for reference answers.
pub fn kafka_classpath() -> String {
    let out = Command::new(repo_root().join("scripts/kafka"))
        .arg("classpath")
        .output()
        .expect("could not run scripts/kafka classpath");
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// Deletes, when dropped, every topic of a test: its prefix's and the `<prefix>-…` targets
/// and sinks beside them, so a run of the suite leaves the broker (which holds about 20,000
/// partitions) as it found it. Keep it alive to the end of the test (`let _topics = …`).
pub struct TopicsGuard {
    config: Config,
}

impl TopicsGuard {
    pub fn new(config: &Config) -> TopicsGuard {
        TopicsGuard {
            config: config.clone(),
        }
    }
}

impl Drop for TopicsGuard {
    fn drop(&mut self) {
        let config = self.config.clone();
        // Its own runtime on its own thread: a test's runtime may be the one dropping it.
        let deleted = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let admin = tocsin::kafka::admin::Admin::new(&config).ok()?;
            // The test's own scheduler group (`test_config_on`) goes too.
            let group = &config.scheduler.group_id;
            if group.starts_with(&config.topic_prefix) {
                let _ = rt.block_on(admin.delete_groups(&[group.as_str()]));
            }
            rt.block_on(admin.delete_prefixed(config.topic_prefix.trim_end_matches('.')))
                .ok()
        })
        .join();
        if !matches!(deleted, Ok(Some(_))) {
            eprintln!(
                "warning: could not delete the topics of prefix {}",
                self.config.topic_prefix
            );
        }
    }
}

/// The partition Kafka's Java client's default partitioner picks for each key, asked of the
/// broker's own jars (`tests/java/Murmur2.java`).
pub fn java_partitions(keys: &[String], partitions: u32) -> Vec<u32> {
    let mut java = Command::new("java");
    java.arg("-cp")
        .arg(kafka_classpath())
        .arg(repo_root().join("tests/java/Murmur2.java"))
        .arg(partitions.to_string());
    answer_lines(java, keys)
        .iter()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// Runs `command` with `lines` on its standard input, one a line, and returns the lines of its
/// standard output; fails loudly when it cannot start or exits with an error.
pub fn answer_lines(mut command: Command, lines: &[String]) -> Vec<String> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {command:?}: {e}"));
    {
        let mut stdin = child.stdin.take().unwrap();
        for l in lines {
            writeln!(stdin, "{l}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        text(&out.stderr)
    );
    text(&out.stdout).lines().map(str::to_owned).collect()
}

/// Reads every partition of `topic` from the beginning to the end a `read_committed` consumer
/// can reach (each partition has reported its end), then `settle` longer with nothing new, so a
/// late duplicate would still be seen. Fails loudly after two minutes rather than returning a
/// partial read.
pub fn drain(
    config: &Config,
    topic: &str,
    settle: std::time::Duration,
) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::{Message, Offset, TopicPartitionList};
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    let consumer: BaseConsumer = tocsin::kafka::consumer_config(config, "tocsin-test-read")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in md.topics()[0].partitions() {
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
            .unwrap();
    }
    let partitions = tpl.count();
    assert!(partitions > 0, "topic {topic} has no partitions");
    consumer.assign(&tpl).unwrap();
    let mut at_end: HashSet<i32> = HashSet::new();
    let mut out = Vec::new();
    let started = Instant::now();
    let mut last = Instant::now();
    loop {
        if at_end.len() == partitions && last.elapsed() >= settle {
            return out;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{topic}: read {} records but {} of {partitions} partitions never reached their end \
             in 120 s",
            out.len(),
            partitions - at_end.len(),
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last = Instant::now();
                at_end.remove(&m.partition());
                out.push(m.detach());
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
}

pub mod fleet {
    //! Scheduler processes, bulk job writes and the exactly-once audit of the lanes.

    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::process::{Child, Stdio};
    use std::time::{Duration, Instant};

    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Headers;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::Message;
    use tocsin::codec::{self, Framing};
    use tocsin::config::Config;
    use tocsin::model::job::{HandlerKind, HandlerSpec, JobDefinition, ScheduleSpec};
    use tocsin::model::records::Run;

    /// A test's data directory; dropping it also deletes the test's topics ([`TopicsGuard`]).
    pub struct TestDir {
        dir: tempfile::TempDir,
        _topics: super::TopicsGuard,
    }

    impl TestDir {
        pub fn path(&self) -> &Path {
            self.dir.path()
        }
    }

    /// A config with its own prefix and data directories, and the fleet topics created.
    pub async fn setup(test: &str) -> (Config, TestDir) {
        setup_sized(test, 8).await
    }

    /// As `setup`, with `job_partitions` partitions of `jobs`, `timers` and `control`.
    pub async fn setup_sized(test: &str, job_partitions: u32) -> (Config, TestDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = super::test_config(test);
        config.topics.job_partitions = job_partitions;
        config.scheduler.data_dir = dir.path().join("sched");
        config.worker.data_dir = dir.path().join("work");
        ensure_fleet_topics(&config).await;
        let topics = super::TopicsGuard::new(&config);
        (
            config,
            TestDir {
                dir,
                _topics: topics,
            },
        )
    }

    /// Creates the fleet's topics of `config` (logged in as `config` says).
    pub async fn ensure_fleet_topics(config: &Config) {
        tocsin::kafka::admin::Admin::new(config)
            .unwrap()
            .ensure(&tocsin::kafka::admin::fleet_topics(config))
            .await
            .unwrap();
    }

    pub fn now_ms() -> i64 {
        tocsin::cli::jobs::now_ms()
    }

    /// A job whose runs go to its tenant's lane (a `custom` handler, which the tests' workers
    /// do not register), with defaults everywhere else. A `kafka` job's runs would go to its
    /// target topic instead: the scheduler delivers those itself (`tests/delivery.rs`).
    pub fn job(id: &str, tenant: &str, schedule: ScheduleSpec) -> JobDefinition {
        let handler = HandlerSpec {
            kind: HandlerKind::Custom,
            target: "out".into(),
            payload: b"hello".to_vec(),
            headers: Default::default(),
            method: None,
            args: vec![],
        };
        JobDefinition {
            timeout_ms: 60_000,
            ..JobDefinition::new(id, tenant, schedule, handler)
        }
    }

    /// An http handler POSTing a small JSON body to `url`.
    pub fn http(url: &str) -> HandlerSpec {
        HandlerSpec {
            kind: HandlerKind::Http,
            target: url.into(),
            payload: b"{\"hello\":1}".to_vec(),
            headers: Default::default(),
            method: Some("POST".into()),
            args: vec![],
        }
    }

    /// A job handler that runs `script` with `/bin/sh -c` (exec must be enabled and allow
    /// `/bin/sh`).
    pub fn exec(script: &str) -> HandlerSpec {
        HandlerSpec {
            kind: HandlerKind::Exec,
            target: "/bin/sh".into(),
            payload: vec![],
            headers: Default::default(),
            method: None,
            args: vec!["-c".into(), script.into()],
        }
    }

    /// `len` bytes of noise that compression cannot shrink (so a size the broker checks stays
    /// the size written).
    pub fn noise(len: usize) -> Vec<u8> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    pub fn every(ms: u64) -> ScheduleSpec {
        ScheduleSpec::Interval {
            every_ms: ms,
            anchor_ms: 0,
        }
    }

    pub fn cron(expr: &str, zone: &str) -> ScheduleSpec {
        ScheduleSpec::Cron {
            expr: expr.into(),
            zone: zone.into(),
        }
    }

    /// Writes raw records (key, value or tombstone) to a topic of the config.
    pub async fn produce_raw(config: &Config, topic: &str, records: &[(Vec<u8>, Option<Vec<u8>>)]) {
        let producer: FutureProducer = tocsin::kafka::producer_config(config).create().unwrap();
        let topic = config.topic(topic);
        // Enqueue everything first (send_result does not wait), then await the deliveries.
        let futures: Vec<_> = records
            .iter()
            .map(|(k, v)| {
                let mut r = FutureRecord::<[u8], [u8]>::to(&topic).key(k);
                if let Some(v) = v {
                    r = r.payload(v);
                }
                producer
                    .send_result(r)
                    .map_err(|(e, _)| e)
                    .expect("enqueue")
            })
            .collect();
        for f in futures {
            f.await
                .expect("delivery future")
                .map_err(|(e, _)| e)
                .expect("produce");
        }
    }

    pub async fn put_jobs(config: &Config, jobs: &[JobDefinition]) {
        let records: Vec<_> = jobs
            .iter()
            .map(|j| {
                (
                    j.id.as_bytes().to_vec(),
                    Some(codec::encode(j, &Framing::SingleObject)),
                )
            })
            .collect();
        produce_raw(config, "jobs", &records).await;
    }

    /// A run as the scheduler would fire it now, put straight on its tenant's lane by `put_runs`.
    pub fn lane_run(id: &str, tenant: &str, handler: HandlerSpec) -> Run {
        let at = now_ms();
        Run {
            run_id: tocsin::model::records::run_id(id, at),
            job_id: id.into(),
            tenant: tenant.into(),
            scheduled_ms: at,
            fire_ms: at,
            attempt: 1,
            reason: tocsin::model::records::FireReason::Schedule,
            handler,
            timeout_ms: 10_000,
            retry: tocsin::model::job::RetryPolicy {
                max_attempts: 3,
                backoff_base_ms: 500,
                backoff_cap_ms: 1_000,
            },
            labels: Default::default(),
        }
    }

    /// Puts `runs` on their tenants' lanes, one producer for each lane's records (in order).
    pub async fn put_runs(config: &Config, runs: &[Run]) {
        type Records = Vec<(Vec<u8>, Option<Vec<u8>>)>;
        let mut by_lane: BTreeMap<String, Records> = BTreeMap::new();
        for r in runs {
            let lane = config.lane_topic(&r.tenant);
            let topic = lane.strip_prefix(&config.topic_prefix).unwrap().to_owned();
            let value = codec::encode(r, &Framing::SingleObject);
            by_lane
                .entry(topic)
                .or_default()
                .push((r.job_id.clone().into_bytes(), Some(value)));
        }
        for (topic, records) in by_lane {
            produce_raw(config, &topic, &records).await;
        }
    }

    pub async fn delete_job(config: &Config, id: &str) {
        produce_raw(config, "jobs", &[(id.as_bytes().to_vec(), None)]).await;
    }

    /// A scheduler process of the real binary.
    pub struct Node {
        pub id: String,
        pub child: Child,
        pub log: PathBuf,
    }

    impl Node {
        pub fn start(config: &Config, dir: &Path, id: &str) -> Node {
            Node::spawn(config, dir, id, &["scheduler", "--node-id", id])
        }

        /// A scheduler that owns every partition, once it has activated them all.
        pub fn start_active(config: &Config, dir: &Path, id: &str) -> Node {
            let node = Node::start(config, dir, id);
            let parts = config.topics.job_partitions as usize;
            wait_watching(Duration::from_secs(60), "the node active", &[&node], || {
                node.log_text().matches("partition active").count() >= parts
            });
            node
        }

        /// Partitions the node holds now, from its log (activated minus released).
        pub fn holds(&self) -> usize {
            let log = self.log_text();
            log.matches("partition active")
                .count()
                .saturating_sub(log.matches("released partition").count())
        }

        /// A worker of `pool` on every lane.
        pub fn worker(config: &Config, dir: &Path, id: &str, pool: &str) -> Node {
            Node::spawn(
                config,
                dir,
                id,
                &["worker", "--pool", pool, "--lanes", "*", "--worker-id", id],
            )
        }

        /// As `spawn`, in a directory `dir/ID` of its own (its config file is written there).
        pub fn spawn_in(config: &Config, dir: &Path, id: &str, args: &[&str]) -> Node {
            let dir = dir.join(id);
            std::fs::create_dir_all(&dir).unwrap();
            Node::spawn(config, &dir, id, args)
        }

        /// A worker of pool `tenant` on that tenant's lane alone, allowed to exec `/bin/sh`, in a
        /// directory of its own.
        pub fn tenant_worker(config: &Config, dir: &Path, tenant: &str, id: &str) -> Node {
            let args = [
                "worker",
                "--pool",
                tenant,
                "--lanes",
                tenant,
                "--worker-id",
                id,
                "--allow-exec",
                "/bin/sh",
            ];
            Node::spawn_in(config, dir, id, &args)
        }

        /// Any `tocsin` subcommand, with the config written to `dir` and its log there.
        pub fn spawn(config: &Config, dir: &Path, id: &str, args: &[&str]) -> Node {
            Node::spawn_env(config, dir, id, args, &[])
        }

        /// As `spawn`, with these environment variables set.
        pub fn spawn_env(
            config: &Config,
            dir: &Path,
            id: &str,
            args: &[&str],
            env: &[(&str, &std::ffi::OsStr)],
        ) -> Node {
            let cfg_path = dir.join("tocsin.toml");
            if !cfg_path.exists() {
                std::fs::write(&cfg_path, toml::to_string(config).unwrap()).unwrap();
            }
            let log = dir.join(format!("{id}.log"));
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap();
            // `TOCSIN_TEST_NODE_LOG` sets the nodes' log filter, to diagnose a failing test.
            let filter = std::env::var("TOCSIN_TEST_NODE_LOG")
                .unwrap_or_else(|_| "info,librdkafka=warn".to_owned());
            let child = super::tocsin()
                .env_remove("TOCSIN_BOOTSTRAP")
                .env_remove("TOCSIN_TOPIC_PREFIX")
                .envs(env.iter().copied())
                .args(["--config", cfg_path.to_str().unwrap(), "--log", &filter])
                .args(args)
                .stdout(Stdio::null())
                .stderr(out)
                .spawn()
                .expect("start tocsin");
            Node {
                id: id.into(),
                child,
                log,
            }
        }

        pub fn signal(&self, sig: i32) {
            unsafe {
                libc::kill(self.child.id() as i32, sig);
            }
        }

        /// SIGTERM and wait for a clean exit; returns the node's log.
        pub fn stop(mut self) -> String {
            self.signal(libc::SIGTERM);
            let status = self.child.wait().unwrap();
            let log = self.log_text();
            assert!(
                status.success(),
                "node {} exited with {status}:\n{log}",
                self.id
            );
            log
        }

        pub fn kill(mut self) {
            self.signal(libc::SIGKILL);
            let _ = self.child.wait();
        }

        pub fn log_text(&self) -> String {
            std::fs::read_to_string(&self.log).unwrap_or_default()
        }
    }

    impl Drop for Node {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// One run as a `read_committed` reader of a lane sees it.
    #[derive(Debug, Clone)]
    pub struct Seen {
        pub lane: String,
        pub run: Run,
        pub fire_ms: i64,
        /// The run's `tocsin-not-before-ms` (its instant where the header is absent).
        pub not_before_ms: i64,
    }

    /// Reads every lane of the config's prefix from the beginning, `read_committed`, until
    /// nothing new arrived for `quiet`.
    pub fn audit(config: &Config, quiet: Duration) -> Vec<Seen> {
        let consumer: BaseConsumer = tocsin::kafka::consumer_config(config, "tocsin-test-audit")
            .create()
            .unwrap();
        let md = consumer
            .fetch_metadata(None, Duration::from_secs(10))
            .unwrap();
        let lane_prefix = config.lane_topic("");
        let lanes: Vec<String> = md
            .topics()
            .iter()
            .map(|t| t.name().to_owned())
            .filter(|t| t.starts_with(&lane_prefix))
            .collect();
        // One reader per lane, in parallel: end-of-partition events name no topic.
        let readers: Vec<_> = lanes
            .into_iter()
            .map(|lane| {
                let config = config.clone();
                std::thread::spawn(move || super::drain(&config, &lane, quiet))
            })
            .collect();
        let mut out = Vec::new();
        for r in readers {
            for m in r.join().expect("a lane reader panicked") {
                let run: Run = codec::decode(m.payload().unwrap_or_default())
                    .expect("a lane record that is not a Run");
                let fire_ms = m
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == "tocsin-fire-ms"))
                    .and_then(|h| std::str::from_utf8(h.value.unwrap()).ok()?.parse().ok())
                    .unwrap_or(run.fire_ms);
                let not_before_ms = m
                    .headers()
                    .and_then(|h| {
                        h.iter()
                            .find(|h| h.key == tocsin::history::NOT_BEFORE_HEADER)
                    })
                    .and_then(|h| std::str::from_utf8(h.value.unwrap()).ok()?.parse().ok())
                    .unwrap_or(run.scheduled_ms);
                out.push(Seen {
                    lane: m.topic().to_owned(),
                    run,
                    fire_ms,
                    not_before_ms,
                });
            }
        }
        out
    }

    /// Runs by (job, scheduled instant) with how many times each was seen.
    pub fn counts(seen: &[Seen]) -> BTreeMap<(String, i64), usize> {
        let mut m = BTreeMap::new();
        for s in seen {
            *m.entry((s.run.job_id.clone(), s.run.scheduled_ms))
                .or_insert(0) += 1;
        }
        m
    }

    /// The duplicates (seen more than once).
    pub fn duplicates(seen: &[Seen]) -> Vec<(String, i64, usize)> {
        counts(seen)
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|((j, t), n)| (j, t, n))
            .collect()
    }

    /// Waits until `f` holds, polling; panics with `what` after `limit`.
    pub fn wait_until(limit: Duration, what: &str, f: impl FnMut() -> bool) {
        wait_watching(limit, what, &[], f);
    }

    /// Waits (up to a minute) until each of `nodes` holds partitions and together they hold
    /// all `parts`.
    pub fn wait_sharing(nodes: &[&Node], parts: usize) {
        wait_watching(Duration::from_secs(60), "every node active", nodes, || {
            nodes.iter().all(|n| n.holds() > 0)
                && nodes.iter().map(|n| n.holds()).sum::<usize>() == parts
        });
    }

    /// As `wait_until`, and a timeout prints the end of each node's log, so a failure in CI
    /// says what the nodes were doing.
    pub fn wait_watching(
        limit: Duration,
        what: &str,
        nodes: &[&Node],
        mut f: impl FnMut() -> bool,
    ) {
        let start = Instant::now();
        while !f() {
            if start.elapsed() >= limit {
                let mut logs = String::new();
                for n in nodes {
                    let text = n.log_text();
                    let lines: Vec<&str> = text.lines().collect();
                    logs.push_str(&format!("\n--- last lines of {}'s log ---\n", n.id));
                    logs.push_str(&lines[lines.len().saturating_sub(40)..].join("\n"));
                }
                panic!("timed out after {limit:?} waiting for {what}{logs}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Reading whole topics (events, dead letters) from the beginning.
pub mod topics {
    use std::time::Duration;

    use rdkafka::Message;
    use tocsin::config::Config;

    /// Every committed record of a topic of the config, read to its end and then `quiet` more.
    pub fn read_all(config: &Config, topic: &str, quiet: Duration) -> Vec<(Vec<u8>, Vec<u8>)> {
        super::drain(config, &config.topic(topic), quiet)
            .into_iter()
            .map(|m| {
                (
                    m.key().unwrap_or_default().to_vec(),
                    m.payload().unwrap_or_default().to_vec(),
                )
            })
            .collect()
    }

    /// The run events on `runs`.
    pub fn events(config: &Config, quiet: Duration) -> Vec<tocsin::model::records::RunEvent> {
        read_all(config, "runs", quiet)
            .into_iter()
            .map(|(_, v)| tocsin::codec::decode(&v).expect("a runs record that is not a RunEvent"))
            .collect()
    }

    /// How often run `run_id` was started, in `events`.
    pub fn starts(events: &[tocsin::model::records::RunEvent], run_id: &str) -> usize {
        use tocsin::model::records::RunEventKind;
        events
            .iter()
            .filter(|e| e.run_id == run_id && e.kind == RunEventKind::Started)
            .count()
    }

    /// The records on `dead`.
    pub fn dead_letters(config: &Config) -> Vec<tocsin::model::records::DeadLetter> {
        read_all(config, "dead", Duration::from_millis(500))
            .into_iter()
            .map(|(_, v)| {
                tocsin::codec::decode(&v).expect("a dead record that is not a DeadLetter")
            })
            .collect()
    }
}

/// Asking a node's HTTP endpoint (`/healthz`, `/readyz`, `/status`, `/metrics`).
pub mod http {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    /// The value of a sample in Prometheus text (`name` with its labels, as printed), if
    /// present.
    pub fn sample(metrics: &str, name: &str) -> Option<f64> {
        metrics.lines().find_map(|l| {
            let (n, v) = l.split_once(' ')?;
            (n == name).then(|| v.trim().parse().ok())?
        })
    }

    /// A port nobody listens on right now (bound and released; fine for a test).
    pub fn free_addr() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    /// Sends `request` and returns the status code and body; `None` when nobody answers.
    pub fn ask(addr: SocketAddr, request: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        let status = head.split(' ').nth(1)?.parse().ok()?;
        Some((status, body.to_owned()))
    }

    pub fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
        ask(
            addr,
            &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
        )
    }
}

/// A broker of the test's own (`scripts/kafka` with its own state directory), for tests that
/// stop it or configure it apart from the shared one. Dropping it stops the broker and deletes
/// its data, topics included, also when the test fails.
pub mod broker {
    use std::path::PathBuf;
    use std::process::Command;

    pub struct OwnBroker {
        pub state: PathBuf,
        pub bootstrap: String,
        env: Vec<(String, String)>,
    }

    impl OwnBroker {
        /// Starts a broker in a fresh state directory under the cache (never the shared
        /// broker's), with `env` set for `scripts/kafka` (e.g. `TOCSIN_KAFKA_SASL=1`).
        pub fn start(name: &str, env: &[(&str, &str)]) -> OwnBroker {
            let cache = std::env::var("TOCSIN_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|_| {
                    PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/tocsin")
                });
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos();
            let state = cache.join(format!("broker-{name}-{}-{nanos}", std::process::id()));
            let mut broker = OwnBroker {
                state,
                bootstrap: String::new(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            };
            broker.bootstrap = broker.run(&["start"]);
            broker
        }

        /// `scripts/kafka` for this broker.
        fn script(&self) -> Command {
            let mut c = Command::new(super::repo_root().join("scripts/kafka"));
            c.env("TOCSIN_KAFKA_STATE", &self.state)
                .env("TOCSIN_KAFKA_HEAP", "768m")
                .envs(self.env.iter().map(|(k, v)| (k, v)));
            c
        }

        /// Runs `scripts/kafka ARGS` on this broker; returns the last line it printed.
        pub fn run(&self, args: &[&str]) -> String {
            last_line(self.script().args(args), args)
        }

        pub fn stop(&self) {
            self.run(&["stop"]);
        }

        /// `scripts/acl-recipe` on this broker, as its admin user, for topics under `prefix`:
        /// the principals `User:scheduler` and alice's worker `User:worker-alice`, and those
        /// of `more` (its flags as they are).
        pub fn acl_recipe(&self, prefix: &str, more: &[&str]) {
            super::run_ok(
                Command::new(super::repo_root().join("scripts/acl-recipe"))
                    .env("TOCSIN_KAFKA_STATE", &self.state)
                    .args(["--prefix", prefix, "--scheduler", "User:scheduler"])
                    .args(["--worker", "alice=User:worker-alice"])
                    .args(more),
                "scripts/acl-recipe",
            );
        }

        /// Starts it again after `stop`, on the same address (the script refuses otherwise).
        pub fn start_again(&self) {
            let addr = last_line(
                self.script()
                    .arg("start")
                    .env("TOCSIN_KAFKA_KEEP_PORT", "1"),
                &["start"],
            );
            assert_eq!(
                addr, self.bootstrap,
                "the broker came back on another address"
            );
        }
    }

    fn last_line(command: &mut Command, args: &[&str]) -> String {
        let out = command.output().expect("could not run scripts/kafka");
        assert!(
            out.status.success(),
            "scripts/kafka {args:?} failed:\n{}",
            super::text(&out.stderr)
        );
        super::text(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    impl Drop for OwnBroker {
        fn drop(&mut self) {
            let reset = Command::new(super::repo_root().join("scripts/kafka"))
                .arg("reset")
                .env("TOCSIN_KAFKA_STATE", &self.state)
                .output();
            if !reset.is_ok_and(|o| o.status.success()) {
                eprintln!(
                    "warning: could not stop the broker in {}",
                    self.state.display()
                );
            }
        }
    }
}
