//! Several scheduler processes against the real broker: takeover, kill -9, zombies, and a
//! stopped fleet. Every test ends with the exactly-once audit of the lanes.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::fleet::*;
use common::http::{free_addr, get};
use common::topics::read_all;
use tocsin::model::job::{JobDefinition, MisfirePolicy};
use tocsin::model::records::FireReason;
use tocsin::scheduler::{HOLD_BEFORE_OFFSETS, HOLD_TRANSACTION_ENV};

/// The fleet tests load the machine; one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn active_count(node: &Node) -> usize {
    let log = node.log_text();
    log.matches("partition active").count()
}

fn every_second_jobs(n: usize, tenant: &str, prefix: &str) -> Vec<JobDefinition> {
    (0..n)
        .map(|i| job(&format!("{prefix}-{i}"), tenant, every(1000)))
        .collect()
}

/// Asserts every job fired each second of [from, to] exactly once; returns the worst lateness.
fn assert_exactly_once(seen: &[Seen], jobs: &[JobDefinition], from: i64, to: i64) -> i64 {
    let dups = duplicates(seen);
    assert!(
        dups.is_empty(),
        "{} duplicate runs, e.g. {:?}",
        dups.len(),
        &dups[..dups.len().min(10)]
    );
    let counts = counts(seen);
    let mut missing = Vec::new();
    for j in jobs {
        let mut t = (from / 1000 + 1) * 1000;
        while t <= to {
            if !counts.contains_key(&(j.id.clone(), t)) {
                missing.push((j.id.clone(), t));
            }
            t += 1000;
        }
    }
    assert!(
        missing.is_empty(),
        "{} lost runs, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    seen.iter()
        .filter(|s| s.run.scheduled_ms >= from && s.run.scheduled_ms <= to)
        .map(|s| s.fire_ms - s.run.scheduled_ms)
        .max()
        .unwrap_or(0)
}

/// Lets `last` fire for `settle_s` more, stops it, and audits the lanes (waiting `quiet_s`
/// after the last record): every job fired each second from `from` to 2 s before the stop
/// exactly once. Returns the runs seen and the worst lateness.
fn stop_and_audit(
    last: Node,
    config: &tocsin::config::Config,
    jobs: &[JobDefinition],
    from: i64,
    (settle_s, quiet_s): (u64, u64),
) -> (Vec<Seen>, i64) {
    std::thread::sleep(Duration::from_secs(settle_s));
    let t_end = now_ms();
    last.stop();
    let seen = audit(config, Duration::from_secs(quiet_s));
    let worst = assert_exactly_once(&seen, jobs, from, t_end - 2_000);
    (seen, worst)
}

/// Starts n1 again with the store it had (its second activation of every partition), lets it
/// fire, stops it and audits from `from` (`stop_and_audit`).
fn restart_and_audit(
    config: &tocsin::config::Config,
    dir: &std::path::Path,
    jobs: &[JobDefinition],
    from: i64,
) -> (Vec<Seen>, i64) {
    let parts = config.topics.job_partitions as usize;
    let n1 = Node::start(config, dir, "n1");
    wait_watching(Duration::from_secs(60), "n1 active again", &[&n1], || {
        n1.log_text().matches("partition active").count() >= 2 * parts
    });
    stop_and_audit(n1, config, jobs, from, (4, 3))
}

fn assert_co_partitioned(node: &Node) {
    for line in node
        .log_text()
        .lines()
        .filter(|l| l.contains("assigned partitions"))
    {
        let field = |name: &str| {
            let start = line.find(&format!("{name}=")).unwrap() + name.len() + 1;
            let rest = &line[start..];
            rest[..=rest.find(']').unwrap()].to_owned()
        };
        assert_eq!(
            field("jobs"),
            field("control"),
            "jobs and control split: {line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn graceful_stop_hands_partitions_over_exactly_once() {
    let _g = SERIAL.lock().await;
    // The production partition count: two nodes split 1024 partitions.
    let (config, dir) = setup_sized("handover", 1024).await;
    let n1 = Node::start(&config, dir.path(), "n1");
    let n2 = Node::start(&config, dir.path(), "n2");
    let parts = config.topics.job_partitions as usize;
    wait_sharing(&[&n1, &n2], parts);
    assert_co_partitioned(&n1);
    assert_co_partitioned(&n2);
    let jobs = every_second_jobs(300, "acme", "h");
    let t0 = now_ms();
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_secs(4));
    n1.stop();
    wait_watching(
        Duration::from_secs(60),
        "n2 owns everything",
        &[&n2],
        || n2.holds() == parts,
    );
    let (seen, worst) = stop_and_audit(n2, &config, &jobs, t0 + 2_000, (4, 3));
    println!(
        "graceful handover: {} runs, worst lateness {worst} ms",
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_loses_and_duplicates_nothing() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("kill9").await;
    let n1 = Node::start(&config, dir.path(), "n1");
    let n2 = Node::start(&config, dir.path(), "n2");
    let parts = config.topics.job_partitions as usize;
    wait_sharing(&[&n1, &n2], parts);
    let jobs = every_second_jobs(5_000, "acme", "k");
    let t0 = now_ms();
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_secs(5));
    let t_kill = now_ms();
    n1.kill();
    wait_watching(Duration::from_secs(60), "n2 takes over", &[&n2], || {
        n2.holds() == parts
    });
    let t_takeover = now_ms();
    let (seen, worst) = stop_and_audit(n2, &config, &jobs, t0 + 3_000, (5, 4));
    println!(
        "kill -9: {} runs, takeover after {} ms, worst lateness {worst} ms",
        seen.len(),
        t_takeover - t_kill
    );
}

/// Two nodes, n1 with the test hook that holds a transaction open ([`HOLD_TRANSACTION_ENV`]),
/// n2 with an HTTP listener, both active, firing 1,000 every-second jobs for 4 s.
struct HeldPair {
    n1: Node,
    n2: Node,
    n2_http: std::net::SocketAddr,
    parts: usize,
    hold: std::path::PathBuf,
    jobs: Vec<JobDefinition>,
    t0: i64,
}

impl HeldPair {
    async fn start(config: &tocsin::config::Config, dir: &TestDir) -> HeldPair {
        let hold = dir.path().join("hold");
        let n1 = Node::spawn_env(
            config,
            dir.path(),
            "n1",
            &["scheduler", "--node-id", "n1"],
            &[(HOLD_TRANSACTION_ENV, hold.as_os_str())],
        );
        let n2_http = free_addr();
        let n2 = Node::spawn(
            config,
            dir.path(),
            "n2",
            &[
                "scheduler",
                "--node-id",
                "n2",
                "--http-listen",
                &n2_http.to_string(),
            ],
        );
        let parts = config.topics.job_partitions as usize;
        wait_sharing(&[&n1, &n2], parts);
        let jobs = every_second_jobs(1_000, "acme", "z");
        let t0 = now_ms();
        put_jobs(config, &jobs).await;
        std::thread::sleep(Duration::from_secs(4));
        assert_eq!(
            fences_done(n2_http),
            0,
            "n2 fenced before anything happened"
        );
        HeldPair {
            n1,
            n2,
            n2_http,
            parts,
            hold,
            jobs,
            t0,
        }
    }

    /// Makes n1 hold its next transaction as the hook's file says (`says`), and waits until
    /// it does.
    fn hold(&self, says: &[u8]) {
        std::fs::write(&self.hold, says).unwrap();
        let held = self.hold.with_extension("held");
        wait_watching(
            Duration::from_secs(30),
            "n1 holds a transaction open",
            &[&self.n1],
            || held.exists(),
        );
    }
}

/// A node stopped (SIGSTOP) with a transaction open: the group drops it after its session
/// timeout, and the node taking its partitions, finding their committed offsets held by that
/// transaction, fences it at once instead of waiting for the broker's transaction timeout.
/// The test hook holds one of the zombie's transactions open, its offsets sent, when it stops.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_zombie_is_fenced() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("zombie").await;
    let pair = HeldPair::start(&config, &dir).await;
    // n1's next transaction stops short of its commit, and n1 stops with it open.
    pair.hold(b"");
    let HeldPair {
        n1,
        n2,
        n2_http,
        parts,
        hold,
        jobs,
        t0,
    } = pair;
    n1.signal(libc::SIGSTOP);
    std::fs::remove_file(&hold).unwrap();
    let before = active_count(&n2);
    wait_watching(
        Duration::from_secs(90),
        "n2 takes over from the stopped node",
        &[&n1, &n2],
        || active_count(&n2) > before && n2.holds() == parts,
    );
    // The survivor fenced the zombie itself: the broker's own abort (after the transaction
    // timeout) would have freed the partitions too, but counts no fence.
    let fences = assert_fenced_n1(&n2, n2_http, None);
    std::thread::sleep(Duration::from_secs(2));
    n1.signal(libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(6));
    let t_end = now_ms();
    n2.stop();
    let n1_log = n1.stop();
    let seen = audit(&config, Duration::from_secs(4));
    let worst = assert_exactly_once(&seen, &jobs, t0 + 2_000, t_end - 2_000);
    let fenced = n1_log
        .lines()
        .filter(|l| l.contains("scheduler step failed") || l.contains("released partition"))
        .count();
    println!(
        "zombie: {} runs, worst lateness {worst} ms, n2's fences {fences}, stale-node fence/release events {fenced}",
        seen.len()
    );
}

/// Asserts that the node `n2` (serving `addr`) fenced n1, by `trigger` (any: `None`), as
/// `tocsin_fences_total{outcome="done"}` counts it; returns the count. The fence's
/// `init_transactions` answers a little after the abort it caused freed the partitions, so the
/// count may lag their activation by a moment.
fn assert_fenced_n1(n2: &Node, addr: std::net::SocketAddr, trigger: Option<&str>) -> u64 {
    let counted = Instant::now() + Duration::from_secs(10);
    let mut done = fences(addr, trigger);
    while done == 0 && Instant::now() < counted {
        std::thread::sleep(Duration::from_millis(200));
        done = fences(addr, trigger);
    }
    assert!(
        done >= 1,
        "n2 took over without fencing n1 (tocsin_fences_total{{outcome=\"done\"}}, trigger \
         {trigger:?}: {done}):\n{}",
        n2.log_text()
    );
    assert!(
        n2.log_text().contains("owner=n1"),
        "n2 fenced someone other than n1:\n{}",
        n2.log_text()
    );
    done
}

/// `tocsin_fences_total{outcome="done"}` on the node serving `addr`, summed over triggers.
fn fences_done(addr: std::net::SocketAddr) -> u64 {
    fences(addr, None)
}

/// `tocsin_fences_total{outcome="done"}` of `trigger` (every trigger: `None`).
fn fences(addr: std::net::SocketAddr, trigger: Option<&str>) -> u64 {
    let (code, body) = get(addr, "/metrics").expect("the node's /metrics answers");
    assert_eq!(code, 200, "{body}");
    let wanted = trigger.map(|t| format!("trigger=\"{t}\""));
    body.lines()
        .filter(|l| l.starts_with("tocsin_fences_total{") && l.contains("outcome=\"done\""))
        .filter(|l| wanted.as_ref().is_none_or(|w| l.contains(w.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A node killed while its transaction holds the lanes, before it sent its offsets: nothing
/// of the new owner's restore waits on that transaction (the offset fetch is answered, the
/// barrier comes back: plain fires write no `timers`), yet every lane is held by it, for every
/// tenant and node, until it ends. The new owner fences the node as soon as the group no
/// longer has it (`trigger="departed"`), not after the broker's transaction timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_owner_holding_the_lanes_is_fenced_at_once() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("lanesheld").await;
    let pair = HeldPair::start(&config, &dir).await;
    // n1's next transaction stops with its records acknowledged and its offsets not sent.
    pair.hold(HOLD_BEFORE_OFFSETS.as_bytes());
    let HeldPair {
        n1,
        n2,
        n2_http,
        parts,
        jobs,
        t0,
        ..
    } = pair;
    n1.kill();
    let before = active_count(&n2);
    wait_watching(
        Duration::from_secs(90),
        "n2 takes over from the killed node",
        &[&n2],
        || active_count(&n2) > before && n2.holds() == parts,
    );
    let departed = assert_fenced_n1(&n2, n2_http, Some("departed"));
    let (seen, worst) = stop_and_audit(n2, &config, &jobs, t0 + 2_000, (4, 4));
    println!(
        "lanes held by a killed node: {} runs, worst lateness {worst} ms, n2's fences {departed}",
        seen.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_fleet_applies_each_misfire_policy() {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup("misfire").await;
    config.scheduler.misfire_threshold_ms = 5_000;
    let mut jobs = Vec::new();
    for (name, policy) in [
        ("once", MisfirePolicy::FireOnce),
        ("all", MisfirePolicy::FireAll),
        ("skip", MisfirePolicy::Skip),
    ] {
        let mut j = job(&format!("mf-{name}"), "acme", every(1000));
        j.misfire = policy;
        jobs.push(j);
    }
    let parts = config.topics.job_partitions as usize;
    let n1 = Node::start(&config, dir.path(), "n1");
    wait_until(Duration::from_secs(60), "node active", || {
        n1.holds() == parts
    });
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_secs(4));
    n1.stop();
    let t_stop = now_ms();
    std::thread::sleep(Duration::from_secs(30));
    let t_restart = now_ms();
    let n1 = Node::start(&config, dir.path(), "n1");
    std::thread::sleep(Duration::from_secs(10));
    let t_end = now_ms();
    n1.stop();

    let seen = audit(&config, Duration::from_secs(3));
    assert!(duplicates(&seen).is_empty(), "{:?}", duplicates(&seen));
    let instants = |job: &str, reason: Option<FireReason>| -> BTreeSet<i64> {
        seen.iter()
            .filter(|s| s.run.job_id == job && reason.is_none_or(|r| s.run.reason == r))
            .map(|s| s.run.scheduled_ms)
            .collect()
    };
    // The gap: instants certainly missed while no node ran, short of the last second before
    // the restart (a restarted node's first tick may come within it, and fire_once's one
    // catch-up run is the latest instant then due).
    let gap = |t: &i64| *t > t_stop + 1_000 && *t < t_restart - 1_000;

    let all = instants("mf-all", None);
    let mut t = (t_stop / 1000 + 2) * 1000;
    while t < t_end - 2_000 {
        assert!(all.contains(&t), "fire_all lost {t}");
        t += 1000;
    }
    assert!(instants("mf-all", Some(FireReason::CatchUp)).len() >= 25);

    let once = instants("mf-once", None);
    assert!(
        !once.iter().any(gap),
        "fire_once fired missed instants one by one: stopped at {t_stop}, restarted at \
         {t_restart}, fired {:?}",
        seen.iter()
            .filter(|s| s.run.job_id == "mf-once")
            .map(|s| (s.run.scheduled_ms, s.run.reason, s.fire_ms))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        instants("mf-once", Some(FireReason::CatchUp)).len(),
        1,
        "fire_once: one catch-up run"
    );

    let skip = instants("mf-skip", None);
    assert!(!skip.iter().any(gap), "skip fired a missed instant");
    assert!(instants("mf-skip", Some(FireReason::CatchUp)).is_empty());
    assert!(
        skip.iter().any(|t| *t > t_restart),
        "skip did not resume its schedule"
    );
}

/// A plain fire (one instant, on time, nothing pending) writes nothing to `timers`: the
/// partition's progress in its offset commit records it. A node with no data directory, and
/// then a node back with its old one, restore every timer from `timers` and that progress:
/// no run is lost or fired twice across either.
#[tokio::test(flavor = "multi_thread")]
async fn plain_fires_are_not_written_to_timers_and_restore_exactly() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("progress").await;
    let n1 = Node::start_active(&config, dir.path(), "n1");
    let jobs = every_second_jobs(500, "acme", "p");
    let t0 = now_ms();
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_secs(6));
    n1.stop();
    let job_records = |config| {
        read_all(config, "timers", Duration::from_secs(2))
            .iter()
            .filter(|(k, _)| !k.starts_with(b"\0"))
            .count()
    };
    let written = job_records(&config);
    let fired = audit(&config, Duration::from_secs(2)).len();
    // Each job is written when defined and, with the lookahead, once more by its first pass,
    // which fires the instant due since and the one a lead ahead (two instants: not plain);
    // the plain fires after that are not written.
    assert!(
        fired >= 4 * jobs.len() && written <= 2 * jobs.len(),
        "{fired} runs fired, {written} timer states written: plain fires must not be written"
    );

    // A node with nothing on disk: a full replay, then the progress.
    let n2 = Node::start_active(&config, dir.path(), "n2");
    assert!(
        n2.log_text()
            .contains("advanced timers fired since they were written"),
        "n2 restored without advancing any timer:\n{}",
        n2.log_text()
    );
    std::thread::sleep(Duration::from_secs(4));
    n2.stop();

    // n1 again, with the store it had: its own states, then n2's progress.
    let (seen, worst) = restart_and_audit(&config, dir.path(), &jobs, t0 + 3_000);
    println!(
        "progress: {fired} runs then {} in all, {written} timer states written, worst lateness \
         {worst} ms",
        seen.len()
    );
}

/// With transactions too small for a second's runs, a partition is fired in parts, and its own
/// "fired through" mark waits for the last part. A tenant done in an early part gets a mark of
/// its own in the partition's progress, so its plain fires are not written to `timers` either;
/// a node with no data directory restores from those marks with no run lost or fired twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_fired_before_its_partition_is_done_is_not_written_to_timers() {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup("tenantmark").await;
    config.scheduler.max_runs_per_transaction = 300;
    let n1 = Node::start_active(&config, dir.path(), "n1");
    // The fair order alternates the tenants, so "small" is done in each second's first
    // transaction and "big" takes four or five.
    let small = every_second_jobs(100, "small", "s");
    let big = every_second_jobs(1_200, "big", "b");
    let jobs: Vec<JobDefinition> = small.iter().chain(&big).cloned().collect();
    let t0 = now_ms();
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_secs(8));
    n1.stop();
    let small_fired = audit(&config, Duration::from_secs(2))
        .iter()
        .filter(|s| s.run.tenant == "small")
        .count();
    let small_written = read_all(&config, "timers", Duration::from_secs(2))
        .iter()
        .filter(|(k, _)| k.starts_with(b"s-"))
        .count();
    // Written when defined and by its first pass (the instant due since and the one a lead
    // ahead: not plain); the plain fires after that are recorded by the tenant's marks.
    assert!(
        small_fired >= 5 * small.len() && small_written <= 2 * small.len(),
        "small: {small_fired} runs fired, {small_written} timer states written: its plain \
         fires must not be written"
    );

    let other = tempfile::tempdir().unwrap();
    let mut config2 = config.clone();
    config2.scheduler.data_dir = other.path().join("sched");
    let n2 = Node::start_active(&config2, other.path(), "n2");
    std::thread::sleep(Duration::from_secs(4));
    let (seen, worst) = stop_and_audit(n2, &config, &jobs, t0 + 3_000, (0, 3));
    println!(
        "tenant marks: small fired {small_fired} runs, {small_written} of its states written; \
         {} runs in all, worst lateness {worst} ms",
        seen.len()
    );
}

/// A node without a lookahead takes over from one that fired 3 s ahead: it advances each timer
/// as far as the last owner fired it (the owner's progress names its lookahead) and never
/// records less than that; the first node, back with its own store, goes on from the second's
/// progress. Every instant fires exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn nodes_with_different_lookaheads_hand_over_exactly_once() {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup("lookahead").await;
    config.scheduler.lookahead_ms = 3_000;
    let n1 = Node::start_active(&config, dir.path(), "n1");
    let jobs = every_second_jobs(300, "acme", "l");
    let t0 = now_ms();
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_secs(6));
    let stopped = now_ms();
    n1.stop();
    let ahead = audit(&config, Duration::from_secs(2))
        .iter()
        .filter(|s| s.run.scheduled_ms > stopped + 1_000)
        .count();
    assert!(ahead > 0, "n1 fired nothing ahead of its instant");

    // n2: no lookahead, nothing on disk.
    let other = tempfile::tempdir().unwrap();
    let mut config0 = config.clone();
    config0.scheduler.lookahead_ms = 0;
    config0.scheduler.data_dir = other.path().join("sched");
    let n2 = Node::start_active(&config0, other.path(), "n2");
    std::thread::sleep(Duration::from_secs(5));
    n2.stop();

    let (seen, worst) = restart_and_audit(&config, dir.path(), &jobs, t0 + 3_000);
    println!(
        "lookahead 3 s, then none, then 3 s: {} runs ({ahead} seen ahead at n1's stop), \
         worst lateness {worst} ms",
        seen.len()
    );
}

/// A second larger than a transaction is fired in chunks, each fired while the one before it
/// commits. Jobs deleted or updated while their second is being fired stay deleted and
/// updated: a chunk fired ahead of an input record that changes its jobs is fired again, never
/// written over the change. The jobs left alone fire every second exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn jobs_changed_while_their_second_fires_in_chunks_stay_changed() {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup("chunked").await;
    config.scheduler.max_runs_per_transaction = 50;
    let lead = config.scheduler.lookahead_ms as i64;
    let n1 = Node::start_active(&config, dir.path(), "n1");
    let kept = every_second_jobs(600, "acme", "k");
    let gone = every_second_jobs(600, "acme", "g");
    let slowed = every_second_jobs(600, "acme", "u");
    let all: Vec<JobDefinition> = kept.iter().chain(&gone).chain(&slowed).cloned().collect();
    let t0 = now_ms();
    put_jobs(&config, &all).await;
    std::thread::sleep(Duration::from_secs(5));
    // Deletes and updates, landing while seconds are fired in 36 transactions each.
    let mut changes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
    for (g, u) in gone.iter().zip(&slowed) {
        changes.push((g.id.as_bytes().to_vec(), None));
        let mut u = u.clone();
        u.schedule = every(3000);
        u.revision = 1;
        let bytes = tocsin::codec::encode(&u, &tocsin::codec::Framing::SingleObject);
        changes.push((u.id.as_bytes().to_vec(), Some(bytes)));
    }
    // In small batches over two seconds, so some land between a chunk fired ahead and its
    // transaction.
    for batch in changes.chunks(60) {
        produce_raw(&config, "jobs", batch).await;
        std::thread::sleep(Duration::from_millis(100));
    }
    let changed_at = now_ms();
    std::thread::sleep(Duration::from_secs(5));
    let t_end = now_ms();
    n1.stop();
    let seen = audit(&config, Duration::from_secs(3));
    assert_exactly_once(&seen, &kept, t0 + 3_000, t_end - 2_000);
    // After the change was applied (a tick of slack), beyond the runs fired ahead before it.
    let after = changed_at + 1_000 + lead;
    let resurrected: Vec<(String, i64)> = seen
        .iter()
        .filter(|s| s.run.scheduled_ms > after)
        .filter(|s| {
            s.run.job_id.starts_with("g-")
                || (s.run.job_id.starts_with("u-") && s.run.scheduled_ms % 3000 != 0)
        })
        .map(|s| (s.run.job_id.clone(), s.run.scheduled_ms))
        .collect();
    assert!(
        resurrected.is_empty(),
        "{} runs of deleted or updated jobs fired as before the change (changed at \
         {changed_at}), e.g. {:?}",
        resurrected.len(),
        &resurrected[..resurrected.len().min(10)]
    );
    let updated = seen
        .iter()
        .filter(|s| s.run.job_id.starts_with("u-") && s.run.scheduled_ms > after)
        .count();
    assert!(updated > 0, "the updated jobs stopped firing");
    println!(
        "chunked: {} runs, changed at {changed_at}, {updated} runs of updated jobs after it",
        seen.len()
    );
}
