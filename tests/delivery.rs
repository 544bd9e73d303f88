//! Direct delivery of `kafka` jobs, against a real broker: the scheduler writes each run's
//! payload into the job's target topic inside the firing transaction. A `read_committed` reader
//! of the target sees each run once, keyed by the job id, in the partition the Java client's
//! partitioner picks, with the run id and scheduled instant as headers, also across a
//! `kill -9`; a missing or refusing target sends the run to `dead` and holds up no other job.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::fleet::*;
use common::{drain, java_partitions, topics::*};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::Headers;
use rdkafka::Message;
use tocsin::config::Config;
use tocsin::model::job::{HandlerKind, JobDefinition, OverlapPolicy, ScheduleSpec};
use tocsin::model::records::{DeadLetter, RunEventKind};
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

/// One record of a target topic, as a `read_committed` reader sees it.
#[derive(Debug, Clone)]
struct Delivered {
    job: String,
    partition: i32,
    payload: Vec<u8>,
    headers: BTreeMap<String, String>,
    scheduled_ms: i64,
}

fn delivered(config: &Config, topic: &str, quiet: Duration) -> Vec<Delivered> {
    drain(config, topic, quiet)
        .into_iter()
        .map(|m| {
            let headers: BTreeMap<String, String> = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let scheduled_ms = headers
                .get("tocsin-scheduled-ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| {
                    panic!("a target record without tocsin-scheduled-ms: {headers:?}")
                });
            Delivered {
                job: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                partition: m.partition(),
                payload: m.payload().unwrap_or_default().to_vec(),
                headers,
                scheduled_ms,
            }
        })
        .collect()
}

/// Creates `name` with `partitions` and the given topic configs (none of Tocsin's code).
async fn create_topic(config: &Config, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> =
        tocsin::kafka::base_config(config).create().unwrap();
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let result = admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    for r in result {
        r.unwrap_or_else(|(t, e)| panic!("creating {t}: {e}"));
    }
}

/// A target topic name for this test, outside the fleet's prefix.
fn target_name(config: &Config, name: &str) -> String {
    format!("{}-{name}", config.topic_prefix.trim_end_matches('.'))
}

fn kafka_job(id: &str, schedule: ScheduleSpec, target: &str, payload: &[u8]) -> JobDefinition {
    let mut j = job(id, "acme", schedule);
    j.handler.kind = HandlerKind::Kafka;
    j.handler.target = target.into();
    j.handler.payload = payload.to_vec();
    j
}

fn dead_letters(config: &Config) -> Vec<DeadLetter> {
    read_all(config, "dead", Duration::from_millis(500))
        .into_iter()
        .map(|(_, v)| tocsin::codec::decode(&v).expect("a dead record that is not a DeadLetter"))
        .collect()
}

/// Asserts `job` reached the target once for every second of [from, to] and never twice.
fn assert_every_second(seen: &[Delivered], job: &str, from: i64, to: i64) {
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for d in seen.iter().filter(|d| d.job == job) {
        *counts.entry(d.scheduled_ms).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{job}: delivered more than once: {twice:?}"
    );
    let mut t = (from / 1000 + 1) * 1000;
    let mut missing = Vec::new();
    while t <= to {
        if !counts.contains_key(&t) {
            missing.push(t);
        }
        t += 1000;
    }
    assert!(
        missing.is_empty(),
        "{job}: {} seconds of [{from}, {to}] never delivered, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_jobs_land_in_their_target_once_keyed_partitioned_and_with_headers() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("deliver").await;
    let target = target_name(&config, "orders");
    create_topic(&config, &target, 6, &[]).await;

    let due = now_ms() + 6_000;
    let mut jobs: Vec<JobDefinition> = (0..50)
        .map(|i| {
            kafka_job(
                &format!("order-{i}-reminder"),
                ScheduleSpec::Once { at_ms: due },
                &target,
                format!("remind {i}").as_bytes(),
            )
        })
        .collect();
    // Recurring, with overlap `skip`: its runs complete in the transaction that fires them,
    // so none is ever skipped as still in flight.
    let mut tick = kafka_job("tick", every(1000), &target, b"tick");
    tick.overlap = OverlapPolicy::Skip;
    tick.handler.headers.insert("trace".into(), "abc".into());
    jobs.push(tick);

    let node = Node::start_active(&config, dir.path(), "n1");
    let t0 = now_ms();
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_millis(
        (due - now_ms()).max(0) as u64 + 3_000,
    ));
    let t_end = now_ms();
    node.stop();

    let seen = delivered(&config, &target, Duration::from_secs(2));
    // The partition Kafka's Java client picks for each key, on a topic of this size.
    let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
    let java_partition: BTreeMap<String, i32> = ids
        .iter()
        .cloned()
        .zip(java_partitions(&ids, 6).into_iter().map(|p| p as i32))
        .collect();

    for i in 0..50 {
        let id = format!("order-{i}-reminder");
        let runs: Vec<_> = seen.iter().filter(|d| d.job == id).collect();
        assert_eq!(runs.len(), 1, "{id}: {runs:?}");
        let d = runs[0];
        assert_eq!(d.payload, format!("remind {i}").as_bytes());
        assert_eq!(d.scheduled_ms, due);
        assert_eq!(
            d.headers.get("tocsin-run-id").map(String::as_str),
            Some(tocsin::model::records::run_id(&id, due).as_str())
        );
        assert_eq!(d.partition, java_partition[&id], "{id}: partition");
    }
    assert_every_second(&seen, "tick", t0 + 2_000, t_end - 2_000);
    for d in seen.iter().filter(|d| d.job == "tick") {
        assert_eq!(d.headers.get("trace").map(String::as_str), Some("abc"));
        assert_eq!(d.partition, java_partition["tick"]);
    }

    // History: each run succeeded, fired by the node; no lane was needed.
    let ev = events(&config, Duration::from_millis(500));
    let succeeded: BTreeSet<&str> = ev
        .iter()
        .filter(|e| e.kind == RunEventKind::Succeeded)
        .map(|e| e.job_id.as_str())
        .collect();
    assert!(succeeded.contains("order-0-reminder") && succeeded.contains("tick"));
    assert!(
        !ev.iter().any(|e| e.kind == RunEventKind::Skipped),
        "{ev:?}"
    );
    let topics = tocsin::kafka::admin::Admin::new(&config)
        .unwrap()
        .partition_counts()
        .unwrap();
    assert!(
        !topics.contains_key(&config.lane_topic("acme")),
        "a lane was created for jobs the scheduler delivers itself"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_or_refusing_target_sends_the_run_to_dead_and_holds_up_no_other_job() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("deadtarget").await;
    let good = target_name(&config, "good");
    let small = target_name(&config, "small");
    let missing = target_name(&config, "missing");
    create_topic(&config, &good, 2, &[]).await;
    // A target that takes records of 1 KiB at most: the broker refuses the payload of 4 KB
    // (Tocsin's own limit, 900 KiB, lets it through). Noise, so compression cannot shrink it.
    create_topic(&config, &small, 1, &[("max.message.bytes", "1024")]).await;

    let jobs = vec![
        kafka_job("good", every(1000), &good, b"ok"),
        kafka_job("lost", every(1000), &missing, b"nowhere"),
        kafka_job("big", every(2000), &small, &noise(4000)),
    ];
    let node = Node::start_active(&config, dir.path(), "n1");
    let t0 = now_ms();
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_secs(10));
    let t_end = now_ms();
    node.stop();

    let seen = delivered(&config, &good, Duration::from_secs(2));
    assert_every_second(&seen, "good", t0 + 2_000, t_end - 2_000);
    assert!(
        drain(&config, &small, Duration::from_millis(500)).is_empty(),
        "a record the target refused became visible"
    );

    let dead = dead_letters(&config);
    let lost: Vec<_> = dead.iter().filter(|d| d.run.job_id == "lost").collect();
    assert!(lost.len() >= 5, "lost: {} dead letters", lost.len());
    assert!(
        lost[0].error.contains(&missing) && lost[0].error.contains("does not exist"),
        "{}",
        lost[0].error
    );
    // The refused job stays scheduled: each of its runs goes to dead, none removes it.
    let big: Vec<_> = dead.iter().filter(|d| d.run.job_id == "big").collect();
    assert!(big.len() >= 2, "big: {} dead letters", big.len());
    assert!(
        big[0].error.contains(&small) && big[0].error.contains("refused"),
        "{}",
        big[0].error
    );
    let instants: BTreeSet<i64> = big.iter().map(|d| d.run.scheduled_ms).collect();
    assert_eq!(
        instants.len(),
        big.len(),
        "a refused run went to dead twice"
    );
    let ev = events(&config, Duration::from_millis(500));
    assert!(ev
        .iter()
        .any(|e| e.job_id == "big" && e.kind == RunEventKind::Dead && e.error.is_some()));
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_a_delivering_node_loses_and_duplicates_nothing_in_the_target() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("deliverkill").await;
    let target = target_name(&config, "out");
    create_topic(&config, &target, 8, &[]).await;
    let n1 = Node::start(&config, dir.path(), "n1");
    let n2 = Node::start(&config, dir.path(), "n2");
    let parts = config.topics.job_partitions as usize;
    wait_sharing(&[&n1, &n2], parts);
    let jobs: Vec<_> = (0..2_000)
        .map(|i| kafka_job(&format!("k-{i}"), every(1000), &target, b"payload"))
        .collect();
    let t0 = now_ms();
    put_jobs(&config, &jobs).await;
    std::thread::sleep(Duration::from_secs(5));
    n1.kill();
    wait_watching(Duration::from_secs(60), "n2 takes over", &[&n2], || {
        n2.holds() == parts
    });
    std::thread::sleep(Duration::from_secs(5));
    let t_end = now_ms();
    n2.stop();

    let seen = delivered(&config, &target, Duration::from_secs(4));
    for j in &jobs {
        assert_every_second(&seen, &j.id, t0 + 3_000, t_end - 2_000);
    }
}
