//! The scenarios: set up a fresh prefix, start nodes, load jobs, measure a window, audit it.
//!
//! Time is wall-clock milliseconds throughout (the nodes schedule on it, and the audit's
//! "visible at" is read from it), so lag is one clock minus itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use tocsin::config::{Config, KafkaDelivery, Serialization};
use tocsin::kafka::admin::{fleet_topics, lane_topic, Admin};
use tocsin::model::job::{HandlerKind, JobDefinition, ScheduleSpec};

use crate::audit::{verdict, Audit, HoldSample, Obs, Verdict};
use crate::chart::{Chart, Series};
use crate::fleet::{wait_all_active, Node};
use crate::load::{job, put_jobs, wait_indexed};
use crate::report::{Event, Lag, Report, Settings};
use crate::sink::Sink;
use crate::target::{self, Expect};
use crate::{now_ms, Align, Args, KillMode, Scenario, Via};

/// Everything a scenario shares.
struct Ctx<'a> {
    args: &'a Args,
    rt: tokio::runtime::Runtime,
    config: Config,
    cfg_path: PathBuf,
    dir: PathBuf,
    bin: PathBuf,
    tenants: Vec<String>,
    skew: f64,
    session_timeout_ms: Option<i64>,
    notes: Vec<String>,
    events: Vec<Event>,
    /// Delay: the target topic, outside the prefix (deleted with the run's topics).
    target: Option<String>,
}

pub fn run(args: &Args) -> Result<(Report, Option<Chart>)> {
    let mut ctx = Ctx::new(args)?;
    let result = match args.scenario {
        Scenario::Steady | Scenario::Failover => steady(&mut ctx),
        Scenario::Herd => herd(&mut ctx),
        Scenario::Capacity => capacity(&mut ctx),
        Scenario::Baseline => baseline_only(&mut ctx),
        Scenario::Delay => delay(&mut ctx),
        Scenario::History => history(&mut ctx),
    };
    match &result {
        Ok((r, _)) if r.audit_passed() && !args.keep && args.work_dir.is_none() => {
            let _ = std::fs::remove_dir_all(&ctx.dir);
        }
        _ => tracing::info!(dir = %ctx.dir.display(), "work directory kept"),
    }
    // The run's topics go (thousands of partitions; a small broker runs out of file handles
    // after a few runs), unless asked to keep them.
    if !args.keep {
        let prefix = &ctx.config.topic_prefix;
        let deleted = Admin::new(&ctx.config).and_then(|admin| {
            // The run's own scheduler group, with its settings.
            let group = ctx.config.scheduler.group_id.as_str();
            let _ = ctx.rt.block_on(admin.delete_groups(&[group]));
            ctx.rt.block_on(admin.delete_prefixed(prefix))
        });
        match deleted {
            Ok(d) => tracing::info!(prefix = %prefix, topics = d.len(), "run's topics deleted"),
            Err(e) => {
                tracing::warn!(prefix = %prefix, error = %e, "could not delete the run's topics")
            }
        }
        if let Some(t) = &ctx.target {
            match ctx.rt.block_on(target::delete(&ctx.config, t)) {
                Ok(()) => tracing::info!(topic = %t, "target topic deleted"),
                Err(e) => tracing::warn!(topic = %t, error = %e, "could not delete the target"),
            }
        }
    }
    result
}

impl<'a> Ctx<'a> {
    fn new(args: &'a Args) -> Result<Ctx<'a>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let bootstrap = match &args.bootstrap {
            Some(b) => b.clone(),
            None => local_broker()?,
        };
        let prefix = args.prefix.clone().unwrap_or_else(|| {
            format!(
                "lt{}-{}-{}.",
                std::process::id(),
                args.scenario.name(),
                now_ms() % 100_000_000
            )
        });
        let dir = match &args.work_dir {
            Some(d) => d.clone(),
            None => std::env::temp_dir()
                .join(format!("tocsin-loadtest-{}", prefix.trim_end_matches('.'))),
        };
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("could not create {}", dir.display()))?;
        let mut config = Config {
            bootstrap,
            topic_prefix: prefix,
            ..Config::default()
        };
        config.topics.job_partitions = args.partitions;
        config.topics.lane_partitions = args.lane_partitions;
        config.topics.runs_partitions = args.lane_partitions;
        config.topics.dead_partitions = 1;
        config.topics.rejected_partitions = 1;
        config.topics.replication_factor = 1;
        // A group of its own, so its settings (`--session-timeout-ms`) touch no other fleet.
        config.scheduler.group_id = format!("{}scheduler", config.topic_prefix);
        config.scheduler.tick_ms = args.tick_ms;
        config.scheduler.lookahead_ms = args.lookahead_ms;
        config.scheduler.transaction_timeout_ms = args.transaction_timeout_ms;
        config.scheduler.max_runs_per_transaction = args.max_runs_per_transaction;
        config.scheduler.data_dir = dir.join("data");
        // Only `delay`, `history` and `steady --target` deliver `kafka` runs (the other lane
        // scenarios' jobs have custom handlers); `history`'s go through a worker, which reports
        // them on `runs`.
        config.scheduler.kafka_delivery = match (args.scenario, args.via) {
            (Scenario::History, _) | (_, Via::Worker) => KafkaDelivery::Worker,
            (_, Via::Direct) => KafkaDelivery::Direct,
        };
        if args.scenario == Scenario::History {
            config.topics.serialization.runs = Serialization::ConnectJson;
        }
        // Only `delay` and `history` start a worker; its consumer group is the run's own.
        config.worker.data_dir = dir.join("worker-data");
        config.worker.pool = config.topic_prefix.trim_end_matches('.').to_owned();
        // A diagnostic: TOCSIN_LOADTEST_KAFKA (`key=value,key=value`) adds librdkafka settings
        // to the nodes' `[kafka]` table, e.g. `debug=eos` with TOCSIN_LOADTEST_NODE_LOG naming
        // `librdkafka=debug`.
        if let Ok(extra) = std::env::var("TOCSIN_LOADTEST_KAFKA") {
            for kv in extra.split(',').filter(|kv| !kv.is_empty()) {
                let (k, v) = kv
                    .split_once('=')
                    .with_context(|| format!("TOCSIN_LOADTEST_KAFKA: {kv:?} is not key=value"))?;
                config
                    .kafka
                    .insert(k.trim().to_owned(), v.trim().to_owned());
            }
        }
        config.validate()?;
        let cfg_path = dir.join("tocsin.toml");
        std::fs::write(&cfg_path, toml::to_string(&config)?)?;

        let bin = match &args.tocsin_bin {
            Some(b) => b.clone(),
            None => std::env::current_exe()?
                .parent()
                .context("this program has no directory")?
                .join("tocsin"),
        };
        if args.scenario != Scenario::Baseline && !bin.exists() {
            bail!(
                "no tocsin binary at {} (build it, or pass --tocsin-bin)",
                bin.display()
            );
        }
        let tenants: Vec<String> = (0..args.tenants.max(1)).map(|i| format!("t{i}")).collect();
        let skew = args.skew.unwrap_or(if args.scenario == Scenario::Herd {
            0.9
        } else {
            0.0
        });
        if !(0.0..=1.0).contains(&skew) {
            bail!("--skew {skew} must be between 0 and 1");
        }

        // Lanes exist before the audit starts, so it reads them from their first record.
        let admin = Admin::new(&config)?;
        let mut topics = fleet_topics(&config);
        topics.extend(tenants.iter().map(|t| lane_topic(&config, t)));
        rt.block_on(admin.ensure(&topics))
            .context("could not create the topics")?;
        let session_timeout_ms = match args.session_timeout_ms {
            Some(ms) => {
                set_group_session_timeout(&config, ms)?;
                Some(ms as i64)
            }
            None => rt
                .block_on(broker_setting(&config, "group.consumer.session.timeout.ms"))
                .and_then(|v| v.parse().ok()),
        };
        tracing::info!(prefix = %config.topic_prefix, dir = %dir.display(), "topics ready");
        Ok(Ctx {
            args,
            rt,
            config,
            cfg_path,
            dir,
            bin,
            tenants,
            skew,
            session_timeout_ms,
            notes: Vec::new(),
            events: Vec::new(),
            target: None,
        })
    }

    /// Creates the target topic of `kafka` runs (deleted with the run's topics); returns its
    /// name.
    fn create_target(&mut self) -> Result<String> {
        let topic = target::name(&self.config);
        self.target = Some(topic.clone());
        let partitions = self.args.target_partitions;
        self.rt
            .block_on(target::create(&self.config, &topic, partitions))?;
        tracing::info!(topic = %topic, partitions, "target topic ready");
        Ok(topic)
    }

    /// Notes in the report when indexing ended less than 500 ms before the due instant `at`.
    fn note_late_index(&mut self, indexed_ms: i64, at: i64) {
        if indexed_ms > at - 500 {
            self.notes.push(format!(
                "indexing ended {} ms before the due instant: the lag includes indexing",
                at - indexed_ms
            ));
        }
    }

    fn tenant_of(&self, i: u64) -> usize {
        let t = self.tenants.len();
        if t == 1 {
            0
        } else if self.skew > 0.0 {
            if ((i % 1000) as f64) < self.skew * 1000.0 {
                0
            } else {
                1 + (i as usize) % (t - 1)
            }
        } else {
            (i as usize) % t
        }
    }

    fn lanes(&self) -> Vec<(String, Option<String>)> {
        self.tenants
            .iter()
            .map(|t| (self.config.lane_topic(t), Some(t.clone())))
            .collect()
    }

    fn start_nodes(&self, n: usize) -> Result<Vec<Node>> {
        let mut nodes = (1..=n)
            .map(|i| Node::start(&self.bin, &self.cfg_path, &self.dir, &format!("n{i}")))
            .collect::<Result<Vec<_>>>()?;
        let limit = Duration::from_secs(120 + u64::from(self.config.topics.job_partitions) / 4);
        let took = wait_all_active(
            &mut nodes.iter_mut().collect::<Vec<_>>(),
            self.config.topics.job_partitions,
            limit,
        )?;
        tracing::info!(
            nodes = n,
            secs = took.as_secs_f64(),
            "every partition active"
        );
        Ok(nodes)
    }

    /// Loads `n` jobs and waits until they are indexed; returns jobs indexed per second.
    fn load(&self, n: u64, make: &dyn Fn(u64) -> JobDefinition) -> Result<(f64, i64)> {
        let loaded = put_jobs(&self.config, 0, n, make)?;
        tracing::info!(
            jobs = n,
            secs = loaded.produce_s,
            "job definitions produced"
        );
        let limit = Duration::from_secs(120 + n / 5_000);
        let indexed = wait_indexed(&self.config, &loaded.ends, limit)?;
        let secs = indexed.duration_since(loaded.started).as_secs_f64();
        tracing::info!(jobs = n, secs, "job definitions indexed");
        Ok((n as f64 / secs, now_ms()))
    }

    fn settings(&self, rate: Option<u64>, period: Option<u64>, duration: Option<u64>) -> Settings {
        let a = self.args;
        let failover = a.scenario == Scenario::Failover;
        Settings {
            bootstrap: self.config.bootstrap.clone(),
            topic_prefix: self.config.topic_prefix.clone(),
            job_partitions: self.config.topics.job_partitions,
            lane_partitions: self.config.topics.lane_partitions,
            tenants: self.tenants.len(),
            skew: self.skew,
            rate_per_s: rate,
            period_ms: period,
            duration_s: duration,
            align: format!("{:?}", a.align).to_lowercase(),
            tick_ms: self.config.scheduler.tick_ms,
            lookahead_ms: self.config.scheduler.lookahead_ms,
            max_runs_per_transaction: self.config.scheduler.max_runs_per_transaction,
            transaction_timeout_ms: self.config.scheduler.transaction_timeout_ms,
            payload_bytes: a.payload_bytes,
            kill_mode: failover.then(|| format!("{:?}", a.kill_mode).to_lowercase()),
            kill_at_s: None,
            settle_s: None,
            session_timeout_ms: self.session_timeout_ms,
            via: None,
            target_topic: None,
            target_partitions: None,
            kill_at_ms: None,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            release_build: !cfg!(debug_assertions),
        }
    }

    /// The baseline of `fires` fires over the jobs `make` makes, unless skipped.
    fn baseline(
        &mut self,
        fires: u64,
        jobs: u64,
        make: &dyn Fn(u64) -> JobDefinition,
    ) -> Result<Option<crate::baseline::Baseline>> {
        let n = self.args.baseline_fires.unwrap_or(fires.min(300_000));
        if n == 0 {
            return Ok(None);
        }
        let b = crate::baseline::run(&self.rt, &self.config, n, jobs, make)?;
        tracing::info!(
            fires = b.fires,
            secs = b.secs,
            per_s = b.per_s,
            "baseline done"
        );
        Ok(Some(b))
    }

    /// Kafka's own ProducerPerformance over `fires` fires' records of `record_bytes` each.
    fn physical(&self, fires: u64, record_bytes: usize) -> Result<crate::perf::Limit> {
        let limit = crate::perf::run(&self.rt, &self.config, fires, record_bytes)?;
        tracing::info!(
            records_per_s = limit.records_per_s,
            fires_per_s = limit.fires_per_s,
            record_bytes,
            "ProducerPerformance done"
        );
        Ok(limit)
    }
}

/// `scripts/kafka start` of this repository; its last line is the bootstrap address.
fn local_broker() -> Result<String> {
    kafka_script("start")?
        .lines()
        .last()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .context("scripts/kafka start printed no bootstrap address")
}

/// What `scripts/kafka <command>` of this repository prints.
pub fn kafka_script(command: &str) -> Result<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka");
    let out = Command::new(&script)
        .arg(command)
        .output()
        .with_context(|| format!("could not run {} {command}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {command} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Sets the scheduler group's session timeout (and a heartbeat a sixth of it) with Kafka's own
/// `ConfigCommand`, from the jars `scripts/kafka` fetched; the broker's
/// `group.consumer.min.session.timeout.ms` bounds it.
fn set_group_session_timeout(config: &Config, ms: u64) -> Result<()> {
    let classpath = kafka_script("classpath")?;
    let settings = format!(
        "consumer.session.timeout.ms={ms},consumer.heartbeat.interval.ms={}",
        (ms / 6).max(100)
    );
    let group = &config.scheduler.group_id;
    let out = Command::new("java")
        .args(["-cp", classpath.trim(), "kafka.admin.ConfigCommand"])
        .args(["--bootstrap-server", &config.bootstrap, "--alter"])
        .args(["--entity-type", "groups", "--entity-name", group])
        .args(["--add-config", &settings])
        .output()
        .context("could not run Kafka's ConfigCommand (java)")?;
    if !out.status.success() {
        bail!(
            "could not set {settings} on group {group}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    tracing::info!(group = %group, settings = %settings, "group session timeout set");
    Ok(())
}

/// A setting of the (first) broker, for the report.
async fn broker_setting(config: &Config, name: &str) -> Option<String> {
    let client: AdminClient<DefaultClientContext> =
        tocsin::kafka::base_config(config).create().ok()?;
    let md = client
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .ok()?;
    let id = md.brokers().first()?.id();
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
    let res = client
        .describe_configs(&[ResourceSpecifier::Broker(id)], &opts)
        .await
        .ok()?;
    let resource = res.into_iter().next()?.ok()?;
    resource.get(name).and_then(|e| e.value.clone())
}

fn ceil_second(ms: i64) -> i64 {
    (ms + 999) / 1000 * 1000
}

/// Sleeps until the wall clock reaches `at_ms`, checking the nodes and the audit meanwhile.
fn sleep_until(at_ms: i64, nodes: &mut [Node], audit: &Audit) -> Result<()> {
    loop {
        for n in nodes.iter_mut() {
            n.check_alive()?;
        }
        audit.check()?;
        let left = at_ms - now_ms();
        if left <= 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(left.min(100) as u64));
    }
}

/// Waits until `earliest`, then until every run seen in the last second was at most
/// `caught_up_ms` late (the nodes have fired what the ingest left due), for at most `limit`;
/// returns when it stopped waiting.
/// How long the nodes must stay caught up before the measured window starts.
const SETTLE_HOLD: Duration = Duration::from_secs(5);

fn settle(
    audit: &Audit,
    nodes: &mut [Node],
    earliest: i64,
    caught_up_ms: i64,
    limit: Duration,
) -> Result<i64> {
    sleep_until(earliest, nodes, audit)?;
    let started = Instant::now();
    // Caught up for SETTLE_HOLD without a break, not at one instant: right after jobs are
    // indexed, their first fires (several instants each, so not plain, so every partition's
    // timer states are written) make a sawtooth of long transactions whose troughs look
    // caught up for a moment.
    let mut since: Option<Instant> = None;
    loop {
        let worst = audit.recent_lag(1_000);
        if worst.is_some_and(|w| w <= caught_up_ms) {
            let held = since.get_or_insert_with(Instant::now);
            if held.elapsed() >= SETTLE_HOLD {
                break;
            }
        } else {
            since = None;
        }
        if started.elapsed() > limit {
            tracing::warn!(worst_lag_ms = ?worst, "the nodes did not catch up before the window; measuring anyway");
            break;
        }
        sleep_until(now_ms() + 200, nodes, audit)?;
    }
    let at = now_ms();
    tracing::info!(waited_s = started.elapsed().as_secs_f64(), "settled");
    Ok(at)
}

/// Waits until `want` runs scheduled in `[from, to)` are visible, or `limit` passes; then
/// `quiet` more, so a late duplicate would still be seen.
fn wait_visible(
    audit: &Audit,
    want: u64,
    from: i64,
    to: i64,
    limit: Duration,
    quiet: Duration,
) -> Result<()> {
    let started = Instant::now();
    loop {
        audit.check()?;
        let in_window = |o: &Obs| o.scheduled_ms >= from && o.scheduled_ms < to;
        let got = audit.count(in_window) as u64;
        // Duplicates count in `got`: every expected run has been seen once the distinct do.
        if got >= want && audit.distinct(in_window) as u64 >= want {
            break;
        }
        if started.elapsed() > limit {
            tracing::warn!(got, want, "not every expected run became visible in time");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(quiet);
    Ok(())
}

fn peak_rss(nodes: &[Node]) -> Option<f64> {
    nodes.iter().filter_map(Node::peak_rss_mb).reduce(f64::max)
}

fn stop_all(nodes: &mut [Node]) -> Result<()> {
    for n in nodes.iter_mut() {
        n.stop(Duration::from_secs(30))?;
    }
    Ok(())
}

/// Lag percentiles overall and p99 per tenant, from first sightings.
/// Each run's lag (`Obs::ready_lag_ms`: from its instant to when it was in the lane and
/// allowed to start), overall and p99 per tenant.
fn lags(v: &Verdict, tenants: &[String]) -> (Option<Lag>, BTreeMap<String, i64>) {
    let mut all: Vec<i64> = v.firsts.iter().map(Obs::ready_lag_ms).collect();
    let mut per: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for o in &v.firsts {
        let name = tenants
            .get(o.tenant as usize)
            .cloned()
            .unwrap_or_else(|| format!("t{}", o.tenant));
        per.entry(name).or_default().push(o.ready_lag_ms());
    }
    let per = per
        .into_iter()
        .filter_map(|(t, mut l)| Lag::of(&mut l).map(|l| (t, l.p99)))
        .collect();
    (Lag::of(&mut all), per)
}

/// Lag over scheduled time per tenant, x in seconds from `origin_ms`.
fn lag_chart(
    title: String,
    v: &Verdict,
    tenants: &[String],
    origin_ms: i64,
    marks: Vec<(f64, String)>,
) -> Chart {
    let mut series: Vec<Series> = tenants
        .iter()
        .map(|t| Series {
            name: t.clone(),
            points: Vec::new(),
        })
        .collect();
    for o in &v.firsts {
        if let Some(s) = series.get_mut(o.tenant as usize) {
            s.points.push((
                (o.scheduled_ms - origin_ms) as f64 / 1000.0,
                o.ready_lag_ms() as f64,
            ));
        }
    }
    series.retain(|s| !s.points.is_empty());
    Chart {
        title,
        x_label: "scheduled instant, s from window start".into(),
        y_label: "lag ms".into(),
        series,
        marks,
    }
}

fn report(
    ctx: &Ctx<'_>,
    jobs: u64,
    nodes: usize,
    v: &Verdict,
    malformed: u64,
    settings: Settings,
) -> Report {
    let (lag, per_tenant) = lags(v, &ctx.tenants);
    Report {
        scenario: ctx.args.scenario.name().into(),
        jobs,
        nodes,
        fires: v.fires,
        fires_per_s: None,
        baseline_per_s: None,
        ratio_to_baseline: None,
        physical_limit_per_s: None,
        ratio_to_physical: None,
        lag_ms: lag,
        visible_ms: Lag::of(&mut v.firsts.iter().map(Obs::visible_ms).collect::<Vec<_>>()),
        start_lag_ms: None,
        append_lag_ms: None,
        per_tenant_lag_p99_ms: per_tenant,
        sink_lag_ms: None,
        sink_landed: None,
        sink_missing: None,
        expected: v.expected,
        lost: v.lost,
        duplicates: v.duplicates,
        unexpected: v.unexpected,
        malformed,
        drain_s: None,
        firing_s: None,
        per_tenant_drain_s: BTreeMap::new(),
        max_lateness_ms: None,
        max_rss_mb: None,
        restore_s: None,
        restore_rss_mb: None,
        ingest_per_s: None,
        events: ctx.events.clone(),
        settings,
        notes: ctx.notes.clone(),
    }
}

/// Interval jobs: `jobs` of period `period_ms`, anchors spread over the period.
fn interval_anchor(i: u64, jobs: u64, period_ms: u64, align: Align) -> i64 {
    let a = (i as u128 * period_ms as u128 / jobs.max(1) as u128) as i64;
    match align {
        Align::Spread => a,
        Align::Second => a / 1000 * 1000,
    }
}

/// The instants `anchor + k × period` in `[from, to)`.
fn instants(anchor: i64, period: i64, from: i64, to: i64, out: &mut Vec<i64>) {
    let mut t = anchor + (from - anchor).div_euclid(period) * period;
    if t < from {
        t += period;
    }
    while t < to {
        out.push(t);
        t += period;
    }
}

/// The instants in `[from, to)` of each of `jobs` interval jobs of `period_ms`, by job index.
fn interval_instants(
    jobs: u64,
    period_ms: u64,
    align: Align,
    from: i64,
    to: i64,
) -> impl Fn(u32, &mut Vec<i64>) {
    move |j, out| {
        instants(
            interval_anchor(u64::from(j), jobs, period_ms, align),
            period_ms as i64,
            from,
            to,
            out,
        )
    }
}

/// `steady` and `failover`.
fn steady(ctx: &mut Ctx<'_>) -> Result<(Report, Option<Chart>)> {
    let a = ctx.args;
    let failover = a.scenario == Scenario::Failover;
    let period = a.period_ms.max(1);
    let jobs = a.jobs.unwrap_or(a.rate * period / 1000).max(1);
    let rate = jobs * 1000 / period;
    let duration = a.duration_s.unwrap_or(30);
    let n_nodes = a.nodes.unwrap_or(if failover { 3 } else { 1 });
    if failover && n_nodes < 2 {
        bail!("failover needs at least 2 nodes");
    }
    let align = a.align;
    let payload = a.payload_bytes;
    if a.target && (failover || a.via != Via::Direct) {
        bail!("--target measures direct delivery in steady: it takes neither failover nor --via worker");
    }
    let target = match a.target {
        true => Some(ctx.create_target()?),
        false => None,
    };
    let tenant_names = ctx.tenants.clone();
    let tenant_of: Vec<usize> = (0..jobs).map(|i| ctx.tenant_of(i)).collect();
    let audit = match &target {
        Some(topic) => {
            let expect = Expect {
                // Every record carries its instant (`tocsin-scheduled-ms`).
                at_ms: 0,
                payload_bytes: payload,
                scheduled_header: true,
                tenant_of: Arc::new(tenant_of.iter().map(|t| *t as u16).collect()),
            };
            target::audit(&ctx.config, topic, a.target_partitions, expect)?
        }
        None => Audit::start(&ctx.config, &ctx.lanes())?,
    };
    let make = move |i: u64| {
        let spec = ScheduleSpec::Interval {
            every_ms: period,
            anchor_ms: interval_anchor(i, jobs, period, align),
        };
        let mut j = job(i, &tenant_names[tenant_of[i as usize]], spec, payload);
        if let Some(topic) = &target {
            j.handler.kind = HandlerKind::Kafka;
            j.handler.target = topic.clone();
        }
        j
    };

    // The baseline writes lane records; a run delivered to a target writes none.
    let baseline = if failover || a.target {
        None
    } else {
        ctx.baseline(rate * duration, jobs, &make)?.map(|b| b.per_s)
    };
    let worker = match a.worker {
        true => Some(crate::starts::Starts::start(&ctx.config)?),
        false => None,
    };
    let mut nodes = ctx.start_nodes(n_nodes)?;
    let (ingest, indexed_ms) = ctx.load(jobs, &make)?;

    // Jobs indexed while others were already firing start with a backlog (their missed
    // instants fire at once); the window measures the steady state after it.
    let settled_ms = settle(
        &audit,
        &mut nodes,
        ceil_second(indexed_ms) + 2_000,
        ctx.config.scheduler.tick_ms as i64 + 1_000,
        Duration::from_secs(a.settle_max_s),
    )?;
    let from = ceil_second(settled_ms);
    let to = from + duration as i64 * 1000;
    let kill_at_s = a.kill_at_s.unwrap_or(duration as f64 / 3.0);
    let mut marks = Vec::new();
    let victim = 0usize;
    let mut down_at = None;
    if failover {
        let kill_ms = from + (kill_at_s * 1000.0) as i64;
        sleep_until(kill_ms, &mut nodes, &audit)?;
        let held = nodes[victim].active_partitions().len();
        let (what, at) = match a.kill_mode {
            KillMode::Kill => {
                nodes[victim].kill();
                ("kill -9", now_ms())
            }
            KillMode::Stop => {
                nodes[victim].signal(libc::SIGSTOP);
                ("sigstop", now_ms())
            }
        };
        down_at = Some(at);
        tracing::info!(node = %nodes[victim].id, partitions = held, what, "node down");
        ctx.events.push(Event {
            what: format!("{what} {} ({held} partitions)", nodes[victim].id),
            at_ms: at - from,
        });
        marks.push((
            (at - from) as f64 / 1000.0,
            format!("{what} {}", nodes[victim].id),
        ));
        if a.kill_mode == KillMode::Stop {
            let cont_ms = at + a.stop_for_s as i64 * 1000;
            // The stopped node is checked as alive too: a stopped process has not exited.
            sleep_until(cont_ms, &mut nodes, &audit)?;
            nodes[victim].signal(libc::SIGCONT);
            let at = now_ms();
            tracing::info!(node = %nodes[victim].id, "node continued");
            ctx.events.push(Event {
                what: format!("sigcont {}", nodes[victim].id),
                at_ms: at - from,
            });
            marks.push(((at - from) as f64 / 1000.0, "sigcont".into()));
        }
    }
    sleep_until(to, &mut nodes, &audit)?;

    let expected = interval_instants(jobs, period, align, from, to);
    let want: u64 = (0..jobs as u32)
        .map(|j| {
            let mut out = Vec::new();
            expected(j, &mut out);
            out.len() as u64
        })
        .sum();
    let mut limit = Duration::from_secs(30);
    if failover && a.kill_mode == KillMode::Stop {
        limit += Duration::from_secs(a.stop_for_s);
    }
    // A zombie resumed late must have had time to try (and fail) to commit.
    let quiet = Duration::from_secs(if failover { 12 } else { 3 });
    wait_visible(&audit, want, from, to, limit, quiet)?;
    let starts = match worker {
        Some(w) => {
            // The last runs are held until their instants, `to` at the latest.
            std::thread::sleep(Duration::from_millis(
                (to + 2_000 - now_ms()).clamp(0, 10_000) as u64,
            ));
            Some(w.finish()?)
        }
        None => None,
    };
    let rss = peak_rss(&nodes);
    stop_all(&mut nodes)?;
    let holds = audit.holds();
    let (obs, malformed) = audit.finish()?;
    let v = verdict(&obs, 0..jobs as u32, &expected, from, to);
    if let Some(down) = down_at {
        note_holds(ctx, &holds, down, from);
    }

    let mut settings = ctx.settings(Some(rate), Some(period), Some(duration));
    settings.settle_s = Some((from - indexed_ms) as f64 / 1000.0);
    if a.target {
        settings.via = Some(Via::Direct.name().into());
        settings.target_topic = ctx.target.clone();
        settings.target_partitions = Some(a.target_partitions);
    }
    if failover {
        settings.kill_at_s = Some(kill_at_s);
    }
    let mut r = report(ctx, jobs, n_nodes, &v, malformed, settings);
    r.fires_per_s = Some(v.fires as f64 / duration as f64);
    r.baseline_per_s = baseline;
    r.ratio_to_baseline = baseline.map(|b| v.fires as f64 / duration as f64 / b);
    r.max_rss_mb = rss;
    r.ingest_per_s = Some(ingest);
    if failover {
        r.max_lateness_ms = r.lag_ms.map(|l| l.max);
    }
    if let Some(starts) = &starts {
        let mut lags = crate::starts::start_lags(starts, from, to);
        if (lags.len() as u64) < want {
            r.notes.push(format!(
                "the worker started {} of the {want} runs of the window",
                lags.len()
            ));
        }
        r.start_lag_ms = Lag::of(&mut lags);
    }
    if a.target {
        let mut appended: Vec<i64> = (v.firsts.iter())
            .map(|o| o.timestamp_ms - o.scheduled_ms)
            .collect();
        r.append_lag_ms = Lag::of(&mut appended);
    }
    let title = if failover {
        format!(
            "failover: lag per tenant, {rate} runs/s on {n_nodes} nodes, {}",
            if a.kill_mode == KillMode::Kill {
                "kill -9"
            } else {
                "sigstop/sigcont"
            }
        )
    } else {
        format!("steady: lag per tenant, {rate} runs/s on {n_nodes} node(s)")
    };
    let mut chart = lag_chart(title, &v, &ctx.tenants, from, marks);
    if failover {
        chart.series.push(Series {
            name: "longest lane LSO hold, ms (at wall time)".into(),
            points: (holds.iter())
                .filter(|h| h.at_ms >= from && h.at_ms <= to)
                .map(|h| ((h.at_ms - from) as f64 / 1000.0, h.longest_ms as f64))
                .collect(),
        });
    }
    Ok((r, Some(chart)))
}

/// The lanes' last stable offsets after a node went down at `down_ms`: how long the longest
/// hold lasted, and when it began and ended, as events (ms from `origin_ms`) and a note.
fn note_holds(ctx: &mut Ctx<'_>, holds: &[HoldSample], down_ms: i64, origin_ms: i64) {
    let after: Vec<&HoldSample> = holds.iter().filter(|h| h.at_ms >= down_ms).collect();
    let Some(peak) = after.iter().max_by_key(|h| h.longest_ms) else {
        ctx.notes
            .push("no statistics of the lanes' last stable offsets after the kill".into());
        return;
    };
    let began = peak.at_ms - peak.longest_ms;
    let ended = (after.iter())
        .find(|h| h.at_ms > peak.at_ms && h.longest_ms < peak.longest_ms)
        .map(|h| h.at_ms);
    ctx.events.push(Event {
        what: format!(
            "lanes held: a last stable offset stood {} ms (longest), {} partitions over 1 s",
            peak.longest_ms, peak.held_over_1s
        ),
        at_ms: began - origin_ms,
    });
    if let Some(end) = ended {
        ctx.events.push(Event {
            what: "lanes free: the longest hold ended".into(),
            at_ms: end - origin_ms,
        });
    }
    ctx.notes.push(format!(
        "lane LSO: longest hold after the node went down {} ms, from {} ms to {} ms after it",
        peak.longest_ms,
        began - down_ms,
        ended.map_or("the end".to_string(), |e| (e - down_ms).to_string()),
    ));
}

/// The herd's (delay's) due instant: far enough ahead that every definition is indexed
/// before it, `--due-in-s` from now.
fn due_instant(a: &Args, jobs: u64) -> i64 {
    let lead_ms = a
        .due_in_s
        .map_or(10_000 + jobs as i64 / 10, |s| s as i64 * 1_000);
    ceil_second(now_ms() + lead_ms)
}

/// `herd`: every job due at the same instant.
fn herd(ctx: &mut Ctx<'_>) -> Result<(Report, Option<Chart>)> {
    let a = ctx.args;
    let jobs = a.jobs.unwrap_or(300_000).max(1);
    let n_nodes = a.nodes.unwrap_or(1);
    let payload = a.payload_bytes;
    let tenant_names = ctx.tenants.clone();
    let tenant_of: Vec<usize> = (0..jobs).map(|i| ctx.tenant_of(i)).collect();

    let baseline = {
        let probe = |i: u64| {
            job(
                i,
                &tenant_names[tenant_of[i as usize]],
                ScheduleSpec::Once { at_ms: 0 },
                payload,
            )
        };
        ctx.baseline(jobs, jobs, &probe)?
    };
    let physical = match &baseline {
        Some(b) => Some(ctx.physical(b.fires, b.record_bytes)?),
        None => None,
    };
    let baseline = baseline.map(|b| b.per_s);
    let audit = Audit::start(&ctx.config, &ctx.lanes())?;
    let mut nodes = ctx.start_nodes(n_nodes)?;
    let at = due_instant(a, jobs);
    let make = |i: u64| {
        job(
            i,
            &tenant_names[tenant_of[i as usize]],
            ScheduleSpec::Once { at_ms: at },
            payload,
        )
    };
    let (ingest, indexed_ms) = ctx.load(jobs, &make)?;
    ctx.note_late_index(indexed_ms, at);
    sleep_until(at, &mut nodes, &audit)?;
    wait_visible(
        &audit,
        jobs,
        at,
        at + 1,
        Duration::from_secs(120),
        Duration::from_secs(3),
    )?;
    let rss = peak_rss(&nodes);
    stop_all(&mut nodes)?;
    let (obs, malformed) = audit.finish()?;
    let expected = |_: u32, out: &mut Vec<i64>| out.push(at);
    let v = verdict(&obs, 0..jobs as u32, &expected, at, at + 1);

    let mut r = report(
        ctx,
        jobs,
        n_nodes,
        &v,
        malformed,
        ctx.settings(None, None, None),
    );
    drains(&mut r, &v, at, &ctx.tenants);
    r.baseline_per_s = baseline;
    r.ratio_to_baseline = r.fires_per_s.zip(baseline).map(|(f, b)| f / b);
    r.physical_limit_per_s = physical.map(|l| l.fires_per_s);
    r.ratio_to_physical = r
        .fires_per_s
        .zip(r.physical_limit_per_s)
        .map(|(f, l)| f / l);
    r.max_rss_mb = rss;
    r.ingest_per_s = Some(ingest);

    // Share of each tenant's runs visible over time: a starved tenant is a late curve.
    let mut per: Vec<Vec<i64>> = vec![Vec::new(); ctx.tenants.len()];
    for o in &v.firsts {
        per[o.tenant as usize].push(o.seen_ms - at);
    }
    let series = per
        .into_iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(t, l)| share_series(format!("{} ({} runs)", ctx.tenants[t], l.len()), l))
        .collect();
    let chart = Chart {
        title: format!(
            "herd: {jobs} runs due at once on {n_nodes} node(s), share visible per tenant"
        ),
        x_label: "s after the herd instant".into(),
        y_label: "% of its runs visible, per tenant".into(),
        series,
        marks: Vec::new(),
    };
    Ok((r, Some(chart)))
}

/// The share of `lags` (ms after an instant; not empty) reached over time, in %.
fn share_series(name: String, mut lags: Vec<i64>) -> Series {
    lags.sort_unstable();
    let n = lags.len() as f64;
    let step = (lags.len() / 400).max(1);
    let mut points: Vec<(f64, f64)> = lags
        .iter()
        .enumerate()
        .step_by(step)
        .map(|(k, ms)| (*ms as f64 / 1000.0, (k + 1) as f64 * 100.0 / n))
        .collect();
    points.push((*lags.last().unwrap() as f64 / 1000.0, 100.0));
    Series { name, points }
}

/// `drain_s` (from `at` to the last first sighting), per tenant, and the fires per second from
/// the first sighting, or `at` if later, to the last: with a lookahead the node starts firing
/// the herd before `at`, and that time counts in the rate.
fn drains(r: &mut Report, v: &Verdict, at: i64, tenants: &[String]) {
    let last = v.firsts.iter().map(|o| o.seen_ms).max();
    let first = v.firsts.iter().map(|o| o.seen_ms).min();
    r.drain_s = last.map(|l| (l - at) as f64 / 1000.0);
    r.firing_s = last
        .zip(first)
        .map(|(l, f)| (l - f.min(at)) as f64 / 1000.0);
    for o in &v.firsts {
        let t = tenants[o.tenant as usize].clone();
        let d = (o.seen_ms - at) as f64 / 1000.0;
        let e = r.per_tenant_drain_s.entry(t).or_insert(d);
        *e = e.max(d);
    }
    r.fires_per_s = r.firing_s.filter(|d| *d > 0.0).map(|d| v.fires as f64 / d);
}

/// `delay`: `--jobs` delayed messages due at the same second, as their consumer sees them.
fn delay(ctx: &mut Ctx<'_>) -> Result<(Report, Option<Chart>)> {
    let a = ctx.args;
    let jobs = a.jobs.unwrap_or(100_000).max(1);
    let n_nodes = a.nodes.unwrap_or(1);
    let payload = a.payload_bytes;
    let via = a.via;
    let topic = ctx.create_target()?;
    let tenant_names = ctx.tenants.clone();
    let tenant_of: Vec<usize> = (0..jobs).map(|i| ctx.tenant_of(i)).collect();

    let mut procs = ctx.start_nodes(n_nodes)?;
    if via == Via::Worker {
        let pool = &ctx.config.worker.pool;
        procs.push(Node::worker(&ctx.bin, &ctx.cfg_path, &ctx.dir, "w1", pool)?);
    }
    let at = due_instant(a, jobs);
    let expect = Expect {
        at_ms: at,
        payload_bytes: payload,
        scheduled_header: via == Via::Direct,
        tenant_of: Arc::new(tenant_of.iter().map(|t| *t as u16).collect()),
    };
    let audit = target::audit(&ctx.config, &topic, a.target_partitions, expect)?;
    let make = |i: u64| {
        let mut j = job(
            i,
            &tenant_names[tenant_of[i as usize]],
            ScheduleSpec::Once { at_ms: at },
            payload,
        );
        j.handler.kind = HandlerKind::Kafka;
        j.handler.target = topic.clone();
        j
    };
    let (ingest, indexed_ms) = ctx.load(jobs, &make)?;
    ctx.note_late_index(indexed_ms, at);

    let mut marks = Vec::new();
    if let Some(k) = a.kill_at_ms {
        sleep_until(at + k, &mut procs, &audit)?;
        // The worker is the last process; the scheduler victim is n1.
        let victim = if via == Via::Worker {
            procs.len() - 1
        } else {
            0
        };
        let v = &mut procs[victim];
        v.kill();
        let killed = now_ms();
        tracing::info!(process = %v.id, "killed");
        ctx.events.push(Event {
            what: format!("kill -9 {}", v.id),
            at_ms: killed - at,
        });
        marks.push(((killed - at) as f64 / 1000.0, format!("kill -9 {}", v.id)));
        // With other nodes, they take over; a lone node or the worker starts again.
        if via == Via::Worker || n_nodes == 1 {
            v.restart()?;
            ctx.events.push(Event {
                what: format!("restarted {}", v.id),
                at_ms: now_ms() - at,
            });
        }
    }
    sleep_until(at, &mut procs, &audit)?;
    // A takeover waits for the dead member's session to end; a late duplicate must be seen.
    let session = Duration::from_millis(ctx.session_timeout_ms.unwrap_or(45_000).max(0) as u64);
    let quiet = Duration::from_secs(if a.kill_at_ms.is_some() { 12 } else { 3 });
    wait_visible(
        &audit,
        jobs,
        at,
        at + 1,
        Duration::from_secs(120) + session,
        quiet,
    )?;
    let rss = peak_rss(&procs[..n_nodes]);
    stop_all(&mut procs)?;
    let (obs, malformed) = audit.finish()?;
    let expected = |_: u32, out: &mut Vec<i64>| out.push(at);
    let v = verdict(&obs, 0..jobs as u32, &expected, at, at + 1);

    let mut settings = ctx.settings(None, None, None);
    settings.via = Some(via.name().into());
    settings.target_topic = Some(topic.clone());
    settings.target_partitions = Some(a.target_partitions);
    settings.kill_at_ms = a.kill_at_ms;
    let mut r = report(ctx, jobs, n_nodes, &v, malformed, settings);
    drains(&mut r, &v, at, &ctx.tenants);
    let mut appended: Vec<i64> = v.firsts.iter().map(|o| o.timestamp_ms - at).collect();
    r.append_lag_ms = Lag::of(&mut appended);
    if a.kill_at_ms.is_some() {
        r.max_lateness_ms = r.lag_ms.map(|l| l.max);
    }
    r.max_rss_mb = rss;
    r.ingest_per_s = Some(ingest);

    let visible: Vec<i64> = v.firsts.iter().map(|o| o.seen_ms - at).collect();
    let series = [("appended", appended), ("visible", visible)]
        .into_iter()
        .filter(|(_, l)| !l.is_empty())
        .map(|(what, l)| share_series(format!("{what} ({} records)", l.len()), l))
        .collect();
    let chart = Chart {
        title: format!(
            "delay: {jobs} messages due at once, delivered via {} on {n_nodes} node(s)",
            via.name()
        ),
        x_label: "s after the due instant".into(),
        y_label: "% of the messages".into(),
        series,
        marks,
    };
    Ok((r, Some(chart)))
}

/// `history`: steady `kafka` runs through the scheduler and a worker, their reports on `runs`
/// as Connect JSON, upserted by the Debezium JDBC sink into PostgreSQL (see `sink.rs` for how
/// a row's arrival is taken). The lanes are audited as in `steady`; the sink lag is over the
/// expected runs of the window whose finished row landed.
fn history(ctx: &mut Ctx<'_>) -> Result<(Report, Option<Chart>)> {
    let a = ctx.args;
    let period = a.period_ms.max(1);
    let jobs = a.jobs.unwrap_or(a.rate * period / 1000).max(1);
    let rate = jobs * 1000 / period;
    let duration = a.duration_s.unwrap_or(60);
    let n_nodes = a.nodes.unwrap_or(1);
    let align = a.align;
    let payload = a.payload_bytes;
    let topic = ctx.create_target()?;
    let tenant_names = ctx.tenants.clone();
    let tenant_of: Vec<usize> = (0..jobs).map(|i| ctx.tenant_of(i)).collect();
    let make = |i: u64| {
        let spec = ScheduleSpec::Interval {
            every_ms: period,
            anchor_ms: interval_anchor(i, jobs, period, align),
        };
        let mut j = job(i, &tenant_names[tenant_of[i as usize]], spec, payload);
        j.handler.kind = HandlerKind::Kafka;
        j.handler.target = topic.clone();
        j
    };

    // Before any run, so the sink reads `runs` from its start; dropped (stopped, its database
    // and group removed) on every way out.
    let sink = Sink::start(&ctx.config)?;
    let audit = Audit::start(&ctx.config, &ctx.lanes())?;
    let mut procs = ctx.start_nodes(n_nodes)?;
    let pool = &ctx.config.worker.pool;
    procs.push(Node::worker(&ctx.bin, &ctx.cfg_path, &ctx.dir, "w1", pool)?);
    let (ingest, indexed_ms) = ctx.load(jobs, &make)?;
    settle(
        &audit,
        &mut procs,
        ceil_second(indexed_ms) + 2_000,
        ctx.config.scheduler.tick_ms as i64 + 1_000,
        Duration::from_secs(a.settle_max_s),
    )?;
    sink.install_landing_stamp(Duration::from_secs(60))?;
    let from = ceil_second(now_ms() + 500);
    let to = from + duration as i64 * 1000;
    sleep_until(to, &mut procs, &audit)?;

    let expected = interval_instants(jobs, period, align, from, to);
    let mut want_runs = std::collections::HashSet::new();
    for j in 0..jobs as u32 {
        let mut out = Vec::new();
        expected(j, &mut out);
        want_runs.extend(
            out.into_iter()
                .map(|t| (crate::load::job_id(u64::from(j)), t)),
        );
    }
    let want = want_runs.len();
    wait_visible(
        &audit,
        want as u64,
        from,
        to,
        Duration::from_secs(30),
        Duration::from_secs(3),
    )?;
    sink.wait_landed(want, from, to, Duration::from_secs(120))?;
    let landed = sink.landed(from, to)?;
    stop_all(&mut procs)?;
    drop(sink);
    let (obs, malformed) = audit.finish()?;
    let v = verdict(&obs, 0..jobs as u32, &expected, from, to);

    let mut lags = Vec::new();
    let mut points = Vec::new();
    let mut not_succeeded = 0;
    for l in &landed {
        if !want_runs.contains(&(l.job_id.clone(), l.scheduled_ms)) {
            continue;
        }
        if l.status != "succeeded" || l.attempt != 1 {
            not_succeeded += 1;
        }
        lags.push(l.landed_ms - l.finished_ms);
        points.push((
            (l.finished_ms - from) as f64 / 1000.0,
            (l.landed_ms - l.finished_ms) as f64,
        ));
    }
    if not_succeeded > 0 {
        ctx.notes.push(format!(
            "{not_succeeded} landed rows are not succeeded at attempt 1"
        ));
    }
    ctx.notes.push(
        "sink lag: finished_at (worker) to the trigger's clock_timestamp() when PostgreSQL \
         wrote the finished row; the sink commits it with the rest of its batch"
            .into(),
    );
    let mut settings = ctx.settings(Some(rate), Some(period), Some(duration));
    settings.via = Some(Via::Worker.name().into());
    settings.target_topic = Some(topic.clone());
    settings.target_partitions = Some(a.target_partitions);
    let mut r = report(ctx, jobs, n_nodes, &v, malformed, settings);
    r.fires_per_s = Some(v.fires as f64 / duration as f64);
    r.ingest_per_s = Some(ingest);
    r.sink_landed = Some(lags.len() as u64);
    r.sink_missing = Some(want.saturating_sub(lags.len()) as u64);
    r.sink_lag_ms = Lag::of(&mut lags);
    let chart = Chart {
        title: format!("history: finish to row in PostgreSQL, {rate} runs/s"),
        x_label: "finished, s from window start".into(),
        y_label: "sink lag ms".into(),
        series: vec![Series {
            name: format!("{} runs", points.len()),
            points,
        }],
        marks: Vec::new(),
    };
    Ok((r, Some(chart)))
}

/// `capacity`: timers held by one node, and the restore of a node with an empty data dir.
fn capacity(ctx: &mut Ctx<'_>) -> Result<(Report, Option<Chart>)> {
    let a = ctx.args;
    let timers = a.jobs.unwrap_or(1_000_000);
    let probes = a.probes.max(1);
    let duration = a.duration_s.unwrap_or(10);
    let payload = a.payload_bytes;
    let tenant_names = ctx.tenants.clone();
    let start = now_ms() + 7_200_000;
    let make = |i: u64| {
        let tenant = &tenant_names[(i as usize) % tenant_names.len()];
        if i < timers {
            // Hourly, from two hours on: held, never fired during the run.
            let mut j = job(
                i,
                tenant,
                ScheduleSpec::Interval {
                    every_ms: 3_600_000,
                    anchor_ms: (i % 3_600) as i64 * 1000,
                },
                payload,
            );
            j.start_ms = Some(start);
            j
        } else {
            job(
                i,
                tenant,
                ScheduleSpec::Interval {
                    every_ms: 1000,
                    anchor_ms: 0,
                },
                payload,
            )
        }
    };
    let audit = Audit::start(&ctx.config, &ctx.lanes())?;
    let mut first = ctx.start_nodes(1)?;
    let (ingest, _) = ctx.load(timers + probes, &make)?;
    std::thread::sleep(Duration::from_secs(2));
    let rss = peak_rss(&first);
    tracing::info!(timers, rss_mb = rss, "timers held; stopping the node");
    stop_all(&mut first)?;
    drop(first);

    let mut second = vec![Node::start(&ctx.bin, &ctx.cfg_path, &ctx.dir, "n2")?];
    let restore = wait_all_active(
        &mut second.iter_mut().collect::<Vec<_>>(),
        ctx.config.topics.job_partitions,
        Duration::from_secs(600),
    )?;
    tracing::info!(
        secs = restore.as_secs_f64(),
        "restored by a node with an empty data dir"
    );

    let from = ceil_second(now_ms()) + 2_000;
    let to = from + duration as i64 * 1000;
    sleep_until(to, &mut second, &audit)?;
    wait_visible(
        &audit,
        probes * duration,
        from,
        to,
        Duration::from_secs(30),
        Duration::from_secs(3),
    )?;
    let restore_rss = peak_rss(&second);
    stop_all(&mut second)?;
    let (obs, malformed) = audit.finish()?;
    let expected = |_: u32, out: &mut Vec<i64>| instants(0, 1000, from, to, out);
    let v = verdict(
        &obs,
        timers as u32..(timers + probes) as u32,
        &expected,
        from,
        to,
    );
    ctx.notes.push(format!(
        "the audit covers the {probes} probe jobs that fire every second after the restore; the {timers} timers are due two hours later"
    ));
    let mut r = report(
        ctx,
        timers,
        1,
        &v,
        malformed,
        ctx.settings(None, None, Some(duration)),
    );
    r.max_rss_mb = rss;
    r.restore_s = Some(restore.as_secs_f64());
    r.restore_rss_mb = restore_rss;
    r.ingest_per_s = Some(ingest);
    let chart = lag_chart(
        format!("capacity: probe lag after {timers} timers were restored"),
        &v,
        &ctx.tenants,
        from,
        Vec::new(),
    );
    Ok((r, Some(chart)))
}

/// `baseline`: the raw produce alone; its audit counts the committed records.
fn baseline_only(ctx: &mut Ctx<'_>) -> Result<(Report, Option<Chart>)> {
    let a = ctx.args;
    let jobs = a.jobs.unwrap_or(a.rate * a.period_ms / 1000).max(1);
    let fires = a.baseline_fires.unwrap_or(300_000).max(1);
    let tenant_names = ctx.tenants.clone();
    let payload = a.payload_bytes;
    let make = |i: u64| {
        let t = &tenant_names[(i as usize) % tenant_names.len()];
        job(
            i,
            t,
            ScheduleSpec::Interval {
                every_ms: 1000,
                anchor_ms: 0,
            },
            payload,
        )
    };
    let b = crate::baseline::run(&ctx.rt, &ctx.config, fires, jobs, &make)?;
    let physical = ctx.physical(fires, b.record_bytes)?;
    let lane = ctx.config.topic("baseline.lane");
    let audit = Audit::start(&ctx.config, &[(lane, None)])?;
    let started = Instant::now();
    while (audit.count(|_| true) as u64) < fires && started.elapsed() < Duration::from_secs(60) {
        audit.check()?;
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let (obs, malformed) = audit.finish()?;
    let seen = obs.len() as u64;
    let v = Verdict {
        expected: fires,
        fires: seen.min(fires),
        lost: fires.saturating_sub(seen),
        duplicates: seen.saturating_sub(fires),
        unexpected: 0,
        firsts: Vec::new(),
    };
    ctx.notes.push(
        "baseline records repeat (job, instant) pairs by design: the audit compares the count of committed records with the count produced".into(),
    );
    let mut r = report(
        ctx,
        jobs.min(50_000),
        0,
        &v,
        malformed,
        ctx.settings(None, None, None),
    );
    r.fires_per_s = Some(b.per_s);
    r.baseline_per_s = Some(b.per_s);
    r.ratio_to_baseline = Some(1.0);
    r.physical_limit_per_s = Some(physical.fires_per_s);
    r.ratio_to_physical = Some(b.per_s / physical.fires_per_s);
    Ok((r, None))
}
