//! Workers against the real broker, with a scheduler process: a worker killed mid-run and the
//! ledger that keeps a redelivered run from running twice (and forgets past its retention);
//! HTTP retries and dead letters; exec timeouts; the overlap policy; one tenant's flood beside
//! another tenant's runs; what a worker refuses to run (exec off by default or outside its
//! allow-list, private HTTP hosts, Tocsin's own topics).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fleet::*;
use common::http::{free_addr, get, sample};
use common::topics::{dead_letters, events, read_all, starts};
use tocsin::codec::{self, Framing};
use tocsin::model::job::{
    HandlerKind, HandlerSpec, JobDefinition, OverlapPolicy, RetryPolicy, ScheduleSpec,
};
use tocsin::model::records::{ControlRecord, DeadLetter, FireReason, Run, RunEvent, RunEventKind};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn once_in(id: &str, tenant: &str, secs: i64, handler: HandlerSpec) -> JobDefinition {
    let mut j = job(
        id,
        tenant,
        ScheduleSpec::Once {
            at_ms: (now_ms() / 1000 + secs) * 1000,
        },
    );
    j.handler = handler;
    j
}

fn once_at(j: &JobDefinition) -> i64 {
    match j.schedule {
        ScheduleSpec::Once { at_ms } => at_ms,
        _ => panic!("not a one-shot"),
    }
}

/// `setup`, with exec enabled for `/bin/sh` (exec is off by default).
async fn setup_exec(test: &str) -> (tocsin::config::Config, TestDir) {
    let (mut config, dir) = setup(test).await;
    config.worker.exec.enabled = true;
    config.worker.exec.allow = vec!["/bin/sh".into()];
    (config, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_worker_s_run_completes_elsewhere_and_a_redelivery_is_not_run_again() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup_exec("killworker").await;
    let mut long = once_in("long", "acme", 2, exec("sleep 4"));
    long.timeout_ms = 30_000;
    let _node = Node::start(&config, dir.path(), "s1");
    let w1 = Node::worker(&config, dir.path(), "w1", "p");
    let w2 = Node::worker(&config, dir.path(), "w2", "p");
    std::thread::sleep(Duration::from_secs(3));
    put_jobs(&config, &[long]).await;
    let mut runner = String::new();
    wait_until(Duration::from_secs(30), "the run to start", || {
        let ev = events(&config, Duration::from_millis(500));
        match ev
            .iter()
            .find(|e| e.job_id == "long" && e.kind == RunEventKind::Started)
        {
            Some(e) => {
                runner = e.node.clone();
                true
            }
            None => false,
        }
    });
    let (killed, survivor) = if runner == "w1" { (w1, w2) } else { (w2, w1) };
    killed.kill();
    wait_until(
        Duration::from_secs(90),
        "the run to succeed on the other worker",
        || {
            events(&config, Duration::from_millis(500)).iter().any(|e| {
                e.job_id == "long" && e.kind == RunEventKind::Succeeded && e.node == survivor.id
            })
        },
    );

    // Deliver the same run again: the ledger acknowledges it without running it.
    let lane = read_all(&config, "lane.acme", Duration::from_secs(1));
    let (key, value) = lane.into_iter().next().unwrap();
    let run: Run = codec::decode(&value).unwrap();
    assert_eq!(run.reason, FireReason::Schedule);
    produce_raw(
        &config,
        "lane.acme",
        &[(key, Some(codec::encode(&run, &Framing::SingleObject)))],
    )
    .await;
    std::thread::sleep(Duration::from_secs(4));
    let ev = events(&config, Duration::from_secs(1));
    let started_on_survivor = ev
        .iter()
        .filter(|e| e.job_id == "long" && e.kind == RunEventKind::Started && e.node == survivor.id)
        .count();
    assert_eq!(
        started_on_survivor, 1,
        "the ledger let a finished run execute again"
    );
    assert!(
        survivor.log_text().contains("already finished"),
        "redelivery not acknowledged"
    );
}

/// A local HTTP target: answers each request with the next status of `script` (the last one
/// repeats) and records when each came and its `Idempotency-Key`.
struct Target {
    url: String,
    seen: Arc<Mutex<Vec<(i64, String)>>>,
}

fn http_target(script: Vec<u16>) -> Target {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let seen: Arc<Mutex<Vec<(i64, String)>>> = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut key = String::new();
            let mut length = 0usize;
            let mut line = String::new();
            // Request line and headers, then the body.
            loop {
                line.clear();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("idempotency-key:") {
                    key = v.trim().to_owned();
                }
                if let Some(v) = lower.strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            let n = {
                let mut seen = log.lock().unwrap();
                seen.push((now_ms(), key));
                seen.len()
            };
            let status = script[(n - 1).min(script.len() - 1)];
            let _ = write!(
                stream,
                "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    Target { url, seen }
}

fn kinds(ev: &[RunEvent], job: &str) -> Vec<(u32, RunEventKind)> {
    ev.iter()
        .filter(|e| e.job_id == job)
        .map(|e| (e.attempt, e.kind))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn http_retries_with_backoff_then_succeeds_or_goes_dead() {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup("http").await;
    // The targets are local: loopback is refused unless listed.
    config.worker.http.allow_hosts = vec!["127.0.0.1".into()];
    let flaky = http_target(vec![503, 503, 200]);
    let broken = http_target(vec![500]);
    let missing = http_target(vec![404]);
    let retry = RetryPolicy {
        max_attempts: 3,
        backoff_base_ms: 1_000,
        backoff_cap_ms: 10_000,
    };
    let mut jobs = Vec::new();
    for (id, target) in [
        ("flaky", &flaky),
        ("broken", &broken),
        ("missing", &missing),
    ] {
        let mut j = once_in(id, "acme", 4, http(&target.url));
        j.retry = retry;
        jobs.push(j);
    }
    let _node = Node::start(&config, dir.path(), "s1");
    let _w = Node::worker(&config, dir.path(), "w1", "p");
    put_jobs(&config, &jobs).await;
    wait_until(
        Duration::from_secs(90),
        "flaky to succeed and broken to go dead",
        || {
            let ev = events(&config, Duration::from_millis(300));
            let k = |j| kinds(&ev, j);
            k("flaky").contains(&(3, RunEventKind::Succeeded))
                && k("broken").contains(&(3, RunEventKind::Dead))
                && k("missing").contains(&(1, RunEventKind::Dead))
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    let ev = events(&config, Duration::from_millis(500));

    // Flaky: three attempts with one idempotency key (the run id), each after its backoff.
    let calls = flaky.seen.lock().unwrap().clone();
    assert_eq!(calls.len(), 3, "flaky target calls: {calls:?}");
    let run_id = tocsin::model::records::run_id("flaky", once_at(&jobs[0]));
    assert!(
        calls.iter().all(|(_, k)| *k == run_id),
        "{calls:?} vs {run_id}"
    );
    // Backoff with jitter lies in [half, all] of base * 2^(attempt-1).
    assert!(
        calls[1].0 - calls[0].0 >= 500,
        "first backoff not respected: {calls:?}"
    );
    assert!(
        calls[2].0 - calls[1].0 >= 1_000,
        "second backoff not respected: {calls:?}"
    );
    let count = |job: &str, kind: RunEventKind| {
        let all = kinds(&ev, job);
        (all.iter().filter(|(_, k)| *k == kind).count(), all)
    };
    let (n, all) = count("flaky", RunEventKind::Succeeded);
    assert_eq!(n, 1, "{all:?}");
    let (n, all) = count("flaky", RunEventKind::Retrying);
    assert_eq!(n, 2, "{all:?}");
    assert_eq!(count("flaky", RunEventKind::Dead).0, 0);

    // Broken: dead after three attempts, with its last error; a 404 is not retried.
    assert_eq!(broken.seen.lock().unwrap().len(), 3);
    assert_eq!(missing.seen.lock().unwrap().len(), 1);
    let dead = dead_letters(&config);
    let b = dead
        .iter()
        .find(|d| d.run.job_id == "broken")
        .expect("no dead letter for the broken target");
    assert_eq!(b.attempts, 3);
    assert!(b.error.contains("HTTP 500"), "last error: {}", b.error);
    let m = dead.iter().find(|d| d.run.job_id == "missing").unwrap();
    assert_eq!(m.attempts, 1);
    assert!(m.error.contains("HTTP 404"), "last error: {}", m.error);
    assert!(!dead.iter().any(|d| d.run.job_id == "flaky"));
    let (n, all) = count("broken", RunEventKind::Dead);
    assert_eq!(n, 1, "{all:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_timeout_kills_the_command_and_fails_the_run() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup_exec("exectimeout").await;
    let marker = dir.path().join("finished");
    let mut slow = once_in(
        "slow",
        "acme",
        3,
        exec(&format!("sleep 3; touch {}", marker.display())),
    );
    slow.timeout_ms = 1_000;
    slow.retry.max_attempts = 1;
    let _node = Node::start(&config, dir.path(), "s1");
    let _w = Node::worker(&config, dir.path(), "w1", "p");
    put_jobs(&config, &[slow]).await;
    wait_until(Duration::from_secs(60), "the slow run to go dead", || {
        dead_letters(&config).iter().any(|d| d.run.job_id == "slow")
    });
    let dead = dead_letters(&config);
    let d = dead.iter().find(|d| d.run.job_id == "slow").unwrap();
    assert!(
        d.error.contains("timed out after 1000 ms"),
        "error: {}",
        d.error
    );
    // Had the command not been stopped, it would have touched the marker by now.
    std::thread::sleep(Duration::from_secs(4));
    assert!(!marker.exists(), "the timed-out command kept running");
}

#[tokio::test(flavor = "multi_thread")]
async fn overlap_skip_runs_a_slow_job_once_per_run_and_reports_the_skipped() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup_exec("overlap").await;
    let mut slow = job("slow", "acme", every(1_000));
    slow.handler = exec("sleep 3");
    slow.timeout_ms = 30_000;
    slow.overlap = OverlapPolicy::Skip;
    // Beside it, a job that may overlap: nothing waits for its runs to complete.
    let mut free = job("free", "acme", every(1_000));
    free.handler = exec("true");
    let _node = Node::start(&config, dir.path(), "s1");
    let _w = Node::worker(&config, dir.path(), "w1", "p");
    std::thread::sleep(Duration::from_secs(3));
    put_jobs(&config, &[slow, free]).await;
    std::thread::sleep(Duration::from_secs(20));
    let ev = events(&config, Duration::from_millis(500));
    let of = |kind| -> Vec<&RunEvent> {
        ev.iter()
            .filter(|e| e.job_id == "slow" && e.kind == kind)
            .collect()
    };
    // `runs` has several partitions: events come in no global order.
    let mut started = of(RunEventKind::Started);
    started.sort_by_key(|e| e.scheduled_ms);
    let succeeded = of(RunEventKind::Succeeded);
    let skipped = of(RunEventKind::Skipped);
    println!(
        "overlap skip over ~20 s: {} started, {} succeeded, {} skipped",
        started.len(),
        succeeded.len(),
        skipped.len()
    );
    // A run takes 3 s, so the instant 3 s later is still covered: one run per 4 s or so,
    // never two at once.
    assert!(
        (3..=7).contains(&started.len()),
        "{} runs started",
        started.len()
    );
    for next in started.iter().skip(1) {
        let previous_done = succeeded
            .iter()
            .filter(|s| s.scheduled_ms < next.scheduled_ms)
            .map(|s| s.at_ms)
            .max()
            .expect("a run started before the previous one succeeded");
        assert!(next.at_ms >= previous_done, "overlapping runs");
    }
    // The instants due meanwhile were skipped and reported, and none of them ran.
    assert!(
        skipped.len() >= 2 * (started.len() - 1),
        "{} skipped",
        skipped.len()
    );
    for s in &skipped {
        assert!(
            !started.iter().any(|r| r.scheduled_ms == s.scheduled_ms),
            "a skipped instant ran"
        );
    }
    // The worker reports a completion on `control` for each run of the job its scheduler
    // waits for (overlap `skip`), and none for the job that may overlap, whose runs ran too.
    let control = read_all(&config, "control", Duration::from_millis(500));
    let completed = |job: &str| {
        control
            .iter()
            .filter(|(k, v)| {
                k.as_slice() == job.as_bytes()
                    && matches!(
                        codec::decode::<ControlRecord>(v),
                        Ok(ControlRecord::Completion { .. })
                    )
            })
            .count()
    };
    let free_ran = ev
        .iter()
        .filter(|e| e.job_id == "free" && e.kind == RunEventKind::Succeeded)
        .count();
    assert!(
        free_ran >= 10,
        "{free_ran} runs of the job that may overlap"
    );
    assert!(
        completed("slow") >= succeeded.len().saturating_sub(1),
        "{} completions for {} runs of the skip job",
        completed("slow"),
        succeeded.len()
    );
    assert_eq!(
        completed("free"),
        0,
        "completions of a job nothing waits for"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flooded_tenant_does_not_delay_another_on_the_same_pool() {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup("fair").await;
    // Kafka runs through the lanes and this worker, not delivered by the scheduler itself.
    config.scheduler.kafka_delivery = tocsin::config::KafkaDelivery::Worker;
    let admin = tocsin::kafka::admin::Admin::new(&config).unwrap();
    let sink = tocsin::kafka::admin::TopicSpec {
        name: sink_name(&config),
        partitions: 2,
        cleanup: tocsin::kafka::admin::Cleanup::Delete,
    };
    admin
        .ensure(&[
            sink.clone(),
            tocsin::kafka::admin::lane_topic(&config, "flood"),
            tocsin::kafka::admin::lane_topic(&config, "calm"),
        ])
        .await
        .unwrap();
    let to_sink = |payload: &[u8]| HandlerSpec {
        kind: HandlerKind::Kafka,
        target: sink.name.clone(),
        payload: payload.to_vec(),
        headers: Default::default(),
        method: None,
        args: vec![],
    };

    // 250,000 runs queued in the flood tenant's lane before the worker starts: a backlog that
    // lasts well over ten seconds even at one worker's full speed (about 13,000 runs/s here).
    const FLOOD: usize = 250_000;
    let t_flood = now_ms();
    let template = job("f", "flood", every(1_000));
    for chunk in 0..(FLOOD / 10_000) {
        let records: Vec<_> = (chunk * 10_000..(chunk + 1) * 10_000)
            .map(|i| {
                let id = format!("f-{i}");
                let run = Run {
                    run_id: tocsin::model::records::run_id(&id, t_flood),
                    job_id: id.clone(),
                    tenant: "flood".into(),
                    scheduled_ms: t_flood,
                    fire_ms: t_flood,
                    attempt: 1,
                    reason: FireReason::Schedule,
                    handler: to_sink(b"flood"),
                    timeout_ms: 10_000,
                    retry: template.retry,
                    labels: Default::default(),
                };
                (
                    id.into_bytes(),
                    Some(codec::encode(&run, &Framing::SingleObject)),
                )
            })
            .collect();
        produce_raw(&config, "lane.flood", &records).await;
    }
    let mut calm = job("calm", "calm", every(1_000));
    calm.handler = to_sink(b"calm");

    let worker_http = free_addr();
    config.worker.http_listen = worker_http.to_string();
    let node = Node::start(&config, dir.path(), "s1");
    let parts = config.topics.job_partitions as usize;
    wait_until(Duration::from_secs(60), "the scheduler active", || {
        node.log_text().matches("partition active").count() >= parts
    });
    put_jobs(&config, &[calm]).await;
    let worker = Node::worker(&config, dir.path(), "w1", "p");
    // The worker's `/metrics` while the flood lasts: the flood's lane partitions paused, and
    // its backlog in the lane lag (librdkafka's statistics, every 5 s).
    let (mut most_paused, mut most_lag) = (0.0f64, 0.0f64);
    let watch_until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < watch_until {
        if let Some((_, body)) = get(worker_http, "/metrics") {
            let gauge = |name: &str| sample(&body, name).unwrap_or(0.0);
            most_paused = most_paused.max(gauge("tocsin_worker_lanes_paused"));
            most_lag = most_lag.max(gauge("tocsin_worker_lane_lag_records"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // Each pause counted, however short (the gauge above is only sampled).
    let pauses = get(worker_http, "/metrics")
        .and_then(|(_, body)| sample(&body, "tocsin_worker_lane_pauses_total{tenant=\"flood\"}"))
        .unwrap_or(0.0);
    let t_end = now_ms();
    drop(worker);
    drop(node);

    let ev = events(&config, Duration::from_millis(500));
    let flood_done: Vec<i64> = ev
        .iter()
        .filter(|e| e.tenant == "flood" && e.kind == RunEventKind::Succeeded)
        .map(|e| e.at_ms)
        .collect();
    let first_flood = ev
        .iter()
        .filter(|e| e.tenant == "flood" && e.kind == RunEventKind::Started)
        .map(|e| e.at_ms)
        .min()
        .expect("the worker never started a flood run");
    // While the flood's backlog lasted: from its first run to its last (or the end).
    let backlog_end = if flood_done.len() == FLOOD {
        *flood_done.iter().max().unwrap()
    } else {
        t_end
    };
    let fired: std::collections::HashMap<i64, i64> = ev
        .iter()
        .filter(|e| e.job_id == "calm" && e.kind == RunEventKind::Fired)
        .map(|e| (e.scheduled_ms, e.at_ms))
        .collect();
    let mut delays: Vec<i64> = ev
        .iter()
        .filter(|e| e.job_id == "calm" && e.kind == RunEventKind::Started)
        .filter(|e| e.at_ms > first_flood + 1_000 && e.at_ms < backlog_end)
        .filter_map(|e| Some(e.at_ms - fired.get(&e.scheduled_ms)?))
        .collect();
    delays.sort_unstable();
    println!(
        "fairness: {} flood runs done in {} ms of backlog; calm runs during it: {}, \
         fired→started delay p50 {} ms, max {} ms",
        flood_done.len(),
        backlog_end - first_flood,
        delays.len(),
        delays.get(delays.len() / 2).copied().unwrap_or(-1),
        delays.last().copied().unwrap_or(-1)
    );
    assert!(
        delays.len() >= 5,
        "too few calm runs while the flood lasted to judge: {delays:?}"
    );
    // A pause lasts while 4 × the tenant's concurrency of runs drain (milliseconds when the
    // machine is busy and the worker reads barely faster than it runs), so the sampled gauge
    // may miss every one; the counter does not.
    assert!(
        pauses >= 1.0,
        "the worker never paused the flood's lane (tocsin_worker_lane_pauses_total \
         {pauses}, tocsin_worker_lanes_paused at most {most_paused})"
    );
    assert!(
        most_lag >= 1_000.0,
        "tocsin_worker_lane_lag_records never showed the flood's backlog (most {most_lag})"
    );
    // Starved, the calm run would wait behind the whole backlog (tens of seconds). A quarter
    // of it tells the two apart on two cores that the broker, the scheduler and the worker
    // share (a fixed 2 s failed CI at 2,030 ms, behind a 19.9 s backlog).
    let bound = ((backlog_end - first_flood) / 4).max(2_000);
    assert!(
        *delays.last().unwrap() < bound,
        "the calm tenant waited behind the flood (bound {bound} ms): {delays:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_joining_mid_run_takes_no_run_twice() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup_exec("revoke").await;
    // Several tenants, so several lane topics (two partitions each) to share between workers;
    // created up front so the first worker holds them all before any run fires.
    const TENANTS: usize = 4;
    const WAVES: i64 = 4;
    let tenants: Vec<String> = (0..TENANTS).map(|t| format!("tenant{t}")).collect();
    let admin = tocsin::kafka::admin::Admin::new(&config).unwrap();
    let lanes: Vec<_> = tenants
        .iter()
        .map(|t| tocsin::kafka::admin::lane_topic(&config, t))
        .collect();
    admin.ensure(&lanes).await.unwrap();

    let node = Node::start(&config, dir.path(), "s1");
    let parts = config.topics.job_partitions as usize;
    wait_until(Duration::from_secs(60), "the scheduler active", || {
        node.log_text().matches("partition active").count() >= parts
    });
    let w1 = Node::worker(&config, dir.path(), "w1", "p");
    std::thread::sleep(Duration::from_secs(3));
    // Runs of 3 s, one per tenant every 2 s: runs are in flight on several lanes at any time.
    let mut jobs = Vec::new();
    for wave in 0..WAVES {
        for (t, tenant) in tenants.iter().enumerate() {
            let mut j = once_in(
                &format!("j{t}-{wave}"),
                tenant,
                5 + 2 * wave,
                exec("sleep 3"),
            );
            j.timeout_ms = 30_000;
            j.retry.max_attempts = 1;
            jobs.push(j);
        }
    }
    let expected: Vec<String> = jobs
        .iter()
        .map(|j| tocsin::model::records::run_id(&j.id, once_at(j)))
        .collect();
    put_jobs(&config, &jobs).await;
    wait_watching(
        Duration::from_secs(30),
        "a run to start on w1",
        &[&node, &w1],
        || {
            events(&config, Duration::from_millis(300))
                .iter()
                .any(|e| e.kind == RunEventKind::Started)
        },
    );
    // The second worker joins while runs are going: lane partitions move from w1 to w2.
    let w2 = Node::worker(&config, dir.path(), "w2", "p");
    wait_watching(
        Duration::from_secs(90),
        "every run to succeed",
        &[&node, &w1, &w2],
        || {
            let ev = events(&config, Duration::from_millis(300));
            expected.iter().all(|r| {
                ev.iter()
                    .any(|e| e.run_id == *r && e.kind == RunEventKind::Succeeded)
            })
        },
    );
    // A run taken twice would start again within a second of the move and finish 3 s later.
    std::thread::sleep(Duration::from_secs(6));
    let ev = events(&config, Duration::from_millis(500));
    let count = |run: &str, kind| {
        ev.iter()
            .filter(|e| e.run_id == run && e.kind == kind)
            .map(|e| e.node.as_str())
            .collect::<Vec<_>>()
    };
    let mut twice = Vec::new();
    for (job, run) in jobs.iter().zip(&expected) {
        let started = count(run, RunEventKind::Started);
        let succeeded = count(run, RunEventKind::Succeeded);
        if started.len() != 1 || succeeded.len() != 1 {
            twice.push(format!(
                "{}: started on {started:?}, succeeded on {succeeded:?}",
                job.id
            ));
        }
    }
    let on = |worker: &str| {
        ev.iter()
            .filter(|e| e.kind == RunEventKind::Started && e.node == worker)
            .count()
    };
    println!(
        "revoke: {} runs, {} started on w1, {} on w2",
        expected.len(),
        on("w1"),
        on("w2")
    );
    assert!(
        twice.is_empty(),
        "runs not taken exactly once across the rebalance:\n{}\n--- w1 ---\n{}",
        twice.join("\n"),
        w1.log_text()
    );
    assert!(on("w2") > 0, "no lane moved to the second worker");
}

/// A topic of this test for kafka runs to write into: outside the prefix, whose topics are
/// Tocsin's and refused as targets.
fn sink_name(config: &tocsin::config::Config) -> String {
    format!("{}-sink", config.topic_prefix.trim_end_matches('.'))
}

/// The lanes of `tenants` and a sink topic for kafka runs; returns the sink's name.
async fn ensure_topics(config: &tocsin::config::Config, tenants: &[&str]) -> String {
    let admin = tocsin::kafka::admin::Admin::new(config).unwrap();
    let sink = tocsin::kafka::admin::TopicSpec {
        name: sink_name(config),
        partitions: 1,
        cleanup: tocsin::kafka::admin::Cleanup::Delete,
    };
    let mut specs: Vec<_> = tenants
        .iter()
        .map(|t| tocsin::kafka::admin::lane_topic(config, t))
        .collect();
    specs.push(sink.clone());
    admin.ensure(&specs).await.unwrap();
    sink.name
}

/// A worker of pool `p` on every lane, with extra flags.
fn worker_with(
    config: &tocsin::config::Config,
    dir: &std::path::Path,
    id: &str,
    flags: &[&str],
) -> Node {
    let args: Vec<&str> = ["worker", "--pool", "p", "--lanes", "*", "--worker-id", id]
        .into_iter()
        .chain(flags.iter().copied())
        .collect();
    Node::spawn(config, dir, id, &args)
}

fn program(path: &str, args: &[&str]) -> HandlerSpec {
    HandlerSpec {
        kind: HandlerKind::Exec,
        target: path.into(),
        payload: vec![],
        headers: Default::default(),
        method: None,
        args: args.iter().map(|a| a.to_string()).collect(),
    }
}

fn dead_of<'a>(dead: &'a [DeadLetter], job: &str) -> Option<&'a DeadLetter> {
    dead.iter().find(|d| d.run.job_id == job)
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_is_off_by_default_and_then_limited_to_its_allow_list_and_tenants() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("execpolicy").await;
    ensure_topics(&config, &["acme", "ops"]).await;
    let marker = dir.path().join("ran");

    // Off by default: refused to dead at the first attempt, naming the rule.
    let w = Node::worker(&config, dir.path(), "w1", "p");
    put_runs(
        &config,
        &[lane_run("off", "ops", program("/bin/true", &[]))],
    )
    .await;
    wait_watching(
        Duration::from_secs(60),
        "the exec run to go dead",
        &[&w],
        || dead_of(&dead_letters(&config), "off").is_some(),
    );
    let dead = dead_letters(&config);
    let d = dead_of(&dead, "off").unwrap();
    assert_eq!(d.attempts, 1, "a refused run was retried");
    assert!(
        d.error.contains("worker.exec.enabled = false") && d.error.contains("/bin/true"),
        "reason: {}",
        d.error
    );
    w.stop();

    // Enabled for one program and one tenant by flags: that runs, nothing else does.
    let w = worker_with(
        &config,
        dir.path(),
        "w1",
        &["--allow-exec", "/bin/true", "--exec-tenants", "ops"],
    );
    let touch = format!("touch {}", marker.display());
    put_runs(
        &config,
        &[
            lane_run("allowed", "ops", program("/bin/true", &[])),
            lane_run("shell", "ops", program("/bin/sh", &["-c", &touch])),
            lane_run("tenant", "acme", program("/bin/true", &[])),
        ],
    )
    .await;
    wait_watching(
        Duration::from_secs(60),
        "the allowed run to succeed and the others to go dead",
        &[&w],
        || {
            let dead = dead_letters(&config);
            let ev = events(&config, Duration::from_millis(300));
            dead_of(&dead, "shell").is_some()
                && dead_of(&dead, "tenant").is_some()
                && kinds(&ev, "allowed").contains(&(1, RunEventKind::Succeeded))
        },
    );
    let dead = dead_letters(&config);
    let shell = dead_of(&dead, "shell").unwrap();
    assert!(
        shell.error.contains("\"/bin/sh\"") && shell.error.contains("worker.exec.allow"),
        "reason: {}",
        shell.error
    );
    assert_eq!(shell.attempts, 1);
    let tenant = dead_of(&dead, "tenant").unwrap();
    assert!(
        tenant.error.contains("\"acme\"") && tenant.error.contains("worker.exec.tenants"),
        "reason: {}",
        tenant.error
    );
    assert!(dead_of(&dead, "allowed").is_none());
    assert!(!marker.exists(), "a program outside the allow-list ran");
    let ev = events(&config, Duration::from_millis(300));
    assert!(
        !kinds(&ev, "shell")
            .iter()
            .any(|(_, k)| *k == RunEventKind::Retrying),
        "{:?}",
        kinds(&ev, "shell")
    );
    w.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_runs_into_tocsin_topics_and_http_runs_to_loopback_are_refused() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("targets").await;
    let sink = ensure_topics(&config, &["acme", "othertenant"]).await;
    let local = http_target(vec![200]);
    let to = |topic: &str| HandlerSpec {
        kind: HandlerKind::Kafka,
        target: topic.into(),
        payload: b"forged".to_vec(),
        headers: Default::default(),
        method: None,
        args: vec![],
    };
    let other_lane = config.lane_topic("othertenant");
    let w = Node::worker(&config, dir.path(), "w1", "p");
    put_runs(
        &config,
        &[
            lane_run("into-lane", "acme", to(&other_lane)),
            lane_run("into-control", "acme", to(&config.topic("control"))),
            lane_run("to-sink", "acme", to(&sink)),
            lane_run("to-loopback", "acme", http(&local.url)),
        ],
    )
    .await;
    wait_watching(
        Duration::from_secs(60),
        "the refused runs to go dead and the sink run to succeed",
        &[&w],
        || {
            let dead = dead_letters(&config);
            let ev = events(&config, Duration::from_millis(300));
            ["into-lane", "into-control", "to-loopback"]
                .iter()
                .all(|j| dead_of(&dead, j).is_some())
                && kinds(&ev, "to-sink").contains(&(1, RunEventKind::Succeeded))
        },
    );
    let dead = dead_letters(&config);
    for (job, topic) in [
        ("into-lane", other_lane.clone()),
        ("into-control", config.topic("control")),
    ] {
        let d = dead_of(&dead, job).unwrap();
        assert!(
            d.error.contains(&format!("{topic:?}")) && d.error.contains("Tocsin topic"),
            "reason: {}",
            d.error
        );
        assert_eq!(d.attempts, 1);
    }
    let d = dead_of(&dead, "to-loopback").unwrap();
    assert!(
        d.error.contains("127.0.0.1") && d.error.contains("worker.http.allow_hosts"),
        "reason: {}",
        d.error
    );
    assert!(
        local.seen.lock().unwrap().is_empty(),
        "the loopback target was called"
    );
    let lane = other_lane.strip_prefix(&config.topic_prefix).unwrap();
    assert!(
        read_all(&config, lane, Duration::from_millis(500)).is_empty(),
        "a run wrote into another tenant's lane"
    );
    let sunk = common::drain(&config, &sink, Duration::from_millis(500));
    assert_eq!(sunk.len(), 1);
    w.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_stays_bounded_by_its_retention_and_still_skips_recent_redeliveries() {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup("ledger").await;
    config.worker.ledger_retention_ms = 8_000;
    config.worker.ledger_prune_interval_ms = 500;
    let sink = ensure_topics(&config, &["acme"]).await;
    let to_sink = HandlerSpec {
        kind: HandlerKind::Kafka,
        target: sink,
        payload: b"x".to_vec(),
        headers: Default::default(),
        method: None,
        args: vec![],
    };
    let w = Node::worker(&config, dir.path(), "w1", "p");
    // Ten runs a second for 20 s: two and a half retentions' worth.
    const BATCHES: usize = 20;
    let mut all = Vec::new();
    for b in 0..BATCHES {
        let batch: Vec<Run> = (0..10)
            .map(|i| lane_run(&format!("l-{b}-{i}"), "acme", to_sink.clone()))
            .collect();
        put_runs(&config, &batch).await;
        all.extend(batch);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    wait_watching(
        Duration::from_secs(60),
        "every run to succeed",
        &[&w],
        || {
            let ev = events(&config, Duration::from_millis(300));
            all.iter().all(|r| {
                ev.iter()
                    .any(|e| e.run_id == r.run_id && e.kind == RunEventKind::Succeeded)
            })
        },
    );
    assert!(
        w.log_text()
            .contains("ledger entries past the retention dropped"),
        "the ledger was never pruned"
    );
    // The last run finished within the retention: delivered again, it is not run again.
    let last = all.last().unwrap().clone();
    put_runs(&config, std::slice::from_ref(&last)).await;
    wait_watching(
        Duration::from_secs(20),
        "the redelivery to be acknowledged",
        &[&w],
        || w.log_text().contains("already finished"),
    );
    let ev = events(&config, Duration::from_millis(500));
    assert_eq!(
        starts(&ev, &last.run_id),
        1,
        "a redelivery within the retention ran again"
    );
    w.stop();

    let ledger =
        tocsin::worker::ledger::Ledger::open(&config.worker.data_dir.join("w1"), 8_000).unwrap();
    let kept = ledger.len();
    println!("ledger: {kept} of {} runs kept", all.len());
    // At most the runs of the last retention (80), and some slack for pruning's interval.
    assert!(
        kept > 0 && kept <= 110,
        "{kept} ledger entries kept of {}",
        all.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_delivered_again_while_it_executes_runs_once() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup_exec("twice").await;
    ensure_topics(&config, &["acme"]).await;
    let ran = dir.path().join("ran");
    let w = Node::worker(&config, dir.path(), "w1", "p");
    // The second copy arrives while the first runs, before any ledger entry exists: what a
    // rebalance does when a run's reports wait on an absent broker.
    let run = lane_run(
        "twice",
        "acme",
        exec(&format!("echo run >> '{}'; sleep 3", ran.display())),
    );
    put_runs(&config, &[run.clone(), run.clone()]).await;
    let lines = || std::fs::read_to_string(&ran).unwrap_or_default();
    wait_watching(
        Duration::from_secs(60),
        "the second copy to be acknowledged or run",
        &[&w],
        || w.log_text().contains("already finished") || lines().lines().count() > 1,
    );
    assert_eq!(lines().lines().count(), 1, "the handler ran {:?}", lines());
    assert!(
        w.log_text()
            .contains("delivered again while its first copy"),
        "the second copy did not wait for the first"
    );
    let ev = events(&config, Duration::from_millis(500));
    assert_eq!(starts(&ev, &run.run_id), 1, "started twice");
    w.stop();
}

/// `scheduler.lookahead_ms`: a run a worker executes is fired ahead of its instant, into its
/// lane, and the worker holds it until then. A change read after the run was fired ahead does
/// not stop it (the documented price of the lookahead); a change read before does.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_fired_ahead_waits_in_the_worker_for_its_instant_and_a_pause_before_the_lead_stops_it(
) {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup_exec("lookahead").await;
    config.scheduler.lookahead_ms = 4_000;
    let at = (now_ms() / 1000 + 14) * 1000;
    let one_shot = |id: &str| {
        let mut j = job(id, "acme", ScheduleSpec::Once { at_ms: at });
        j.handler = exec("true");
        j
    };
    let _node = Node::start(&config, dir.path(), "s1");
    let _w = Node::worker(&config, dir.path(), "w1", "p");
    put_jobs(
        &config,
        &[
            one_shot("runs"),
            one_shot("early-pause"),
            one_shot("late-pause"),
        ],
    )
    .await;
    let paused = |id: &str| {
        let mut j = one_shot(id);
        j.paused = true;
        j
    };
    // Before the lead (at − 4 s): the pause holds.
    sleep_until_ms(at - 7_000);
    put_jobs(&config, &[paused("early-pause")]).await;
    // Inside the lead, after the run was fired ahead: it runs anyway.
    sleep_until_ms(at - 1_500);
    put_jobs(&config, &[paused("late-pause")]).await;
    sleep_until_ms(at + 6_000);
    let ev = events(&config, Duration::from_millis(500));
    let at_of = |job: &str, kind| -> Vec<i64> {
        ev.iter()
            .filter(|e| e.job_id == job && e.kind == kind)
            .map(|e| e.at_ms)
            .collect()
    };
    for job in ["runs", "late-pause"] {
        let fired = at_of(job, RunEventKind::Fired);
        let started = at_of(job, RunEventKind::Started);
        println!("{job}: fired {fired:?}, started {started:?}, instant {at}");
        assert_eq!(fired.len(), 1, "{job} fired once");
        assert!(
            fired[0] <= at - 3_000,
            "{job} was fired ahead of its instant: fired at {} ms from it",
            fired[0] - at
        );
        assert_eq!(started.len(), 1, "{job} started once");
        assert!(
            started[0] >= at,
            "{job} started {} ms before its instant",
            at - started[0]
        );
        assert_eq!(
            at_of(job, RunEventKind::Succeeded).len(),
            1,
            "{job} succeeded"
        );
    }
    assert!(
        at_of("early-pause", RunEventKind::Fired).is_empty()
            && at_of("early-pause", RunEventKind::Started).is_empty(),
        "a job paused before its lead does not run"
    );
}

fn sleep_until_ms(at_ms: i64) {
    let wait = at_ms - now_ms();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
}
