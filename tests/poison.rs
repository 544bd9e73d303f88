//! Poison pills against the real broker: records that once stopped a node's firing. Each test
//! keeps a good job firing every second on the same partition as the bad record, and checks
//! that the bad record is in `jobs.rejected` with its reason and that no good second is missing
//! or duplicated.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::fleet::*;
use common::*;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use tocsin::codec::{self, Framing};
use tocsin::config::Config;
use tocsin::kafka::partitioner::partition_for;
use tocsin::model::job::JobDefinition;

/// A job id of `prefix` that lands on `partition`.
fn id_on(config: &Config, prefix: &str, partition: u32) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| partition_for(k.as_bytes(), config.topics.job_partitions) == partition)
        .unwrap()
}

/// `jobs.rejected` by key: (reason, whether the original was copied, the copied bytes).
fn rejected(config: &Config, want: usize) -> BTreeMap<String, (String, bool, Vec<u8>)> {
    let consumer: BaseConsumer = tocsin::kafka::consumer_config(config, "audit-rejected")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&config.topic("jobs.rejected"), 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let header = |m: &rdkafka::message::BorrowedMessage<'_>, key: &str| {
        m.headers()
            .and_then(|h| h.iter().find(|h| h.key == key))
            .and_then(|h| h.value)
            .map(text)
            .unwrap_or_default()
    };
    let mut out = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < want && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let key = text(m.key().unwrap_or_default());
            let copied = header(&m, "tocsin-copied") != "false";
            out.insert(
                key,
                (
                    header(&m, "tocsin-reason"),
                    copied,
                    m.payload().unwrap_or_default().to_vec(),
                ),
            );
        }
    }
    out
}

/// Every second of `good` from its first run to `until` was fired exactly once.
fn assert_every_second(config: &Config, good: &str, until_ms: i64) {
    let seen = audit(config, Duration::from_secs(2));
    let counts = counts(&seen);
    let instants: Vec<(i64, usize)> = counts
        .iter()
        .filter(|((job, _), _)| job == good)
        .map(|((_, t), n)| (*t, *n))
        .collect();
    assert!(
        instants.len() >= 3,
        "the good job fired {} times",
        instants.len()
    );
    let dups: Vec<_> = instants.iter().filter(|(_, n)| *n > 1).collect();
    assert!(dups.is_empty(), "good seconds fired twice: {dups:?}");
    let (first, last) = (instants[0].0, instants[instants.len() - 1].0);
    let expected = ((last - first) / 1000 + 1) as usize;
    assert_eq!(
        instants.len(),
        expected,
        "good seconds missing between {first} and {last}"
    );
    assert!(
        last >= until_ms - 3_000,
        "the good job stopped firing at {last}, {} ms before the end",
        until_ms - last
    );
}

/// Starts a node with a good job firing every second on partition 0, runs `bad` (which writes
/// the bad records), lets the node go on for a few seconds, and checks the good job's seconds.
async fn with_good_job_firing<F, Fut>(test: &str, bad: F) -> (Config, TestDir)
where
    F: FnOnce(Config) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (config, dir, log) = good_job_beside(test, bad).await;
    // A fence by a rebalance (a busy shared broker) is not the bad record's doing.
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("scheduler step failed"))
        .filter(|l| !l.contains("generation") && !l.contains("member"))
        .collect();
    assert!(
        failed.is_empty(),
        "a step failed: the bad record reached a transaction\n{log}"
    );
    (config, dir)
}

/// As `with_good_job_firing`, without requiring that no step failed; returns the node's log.
async fn good_job_beside<F, Fut>(test: &str, bad: F) -> (Config, TestDir, String)
where
    F: FnOnce(Config) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (config, dir) = setup(test).await;
    let good = id_on(&config, "good", 0);
    put_jobs(&config, &[job(&good, "acme", every(1000))]).await;
    let node = Node::start(&config, dir.path(), "n1");
    wait_watching(
        Duration::from_secs(60),
        "the good job firing",
        &[&node],
        || {
            node.log_text().matches("partition active").count()
                >= config.topics.job_partitions as usize
        },
    );
    std::thread::sleep(Duration::from_secs(2));
    bad(config.clone()).await;
    std::thread::sleep(Duration::from_secs(5));
    let until = now_ms();
    let log = node.stop();
    assert_every_second(&config, &good, until);
    (config, dir, log)
}

/// Writes job definitions with a producer that sends records up to 7 MB (what a Java client
/// with a raised `max.request.size` could write).
async fn put_big(config: &Config, jobs: &[JobDefinition]) {
    let producer: FutureProducer = tocsin::kafka::producer_config(config)
        .set("message.max.bytes", "7000000")
        .create()
        .unwrap();
    let topic = config.topic("jobs");
    for def in jobs {
        let bytes = codec::encode(def, &Framing::SingleObject);
        producer
            .send(
                FutureRecord::to(&topic)
                    .key(def.id.as_bytes())
                    .payload(&bytes),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
}

fn with_payload(mut def: JobDefinition, len: usize) -> JobDefinition {
    def.handler.payload = vec![b'x'; len];
    def
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_at_the_payload_limit_fires_and_one_over_it_is_rejected() {
    let limit = tocsin::model::validate::DEFAULT_MAX_PAYLOAD_BYTES;
    let (mut at, mut over, mut old_limit) = (String::new(), String::new(), String::new());
    let (config, _dir) = with_good_job_firing("poison-limit", |config| {
        at = id_on(&config, "at-limit", 0);
        over = id_on(&config, "over-limit", 0);
        old_limit = id_on(&config, "old-limit", 0);
        let jobs = [
            with_payload(job(&at, "acme", every(1000)), limit),
            with_payload(job(&over, "acme", every(1000)), limit + 1),
            // The limit this replaced: it passed validation, then no timer could be written.
            with_payload(job(&old_limit, "acme", every(1000)), 1 << 20),
        ];
        async move { put_big(&config, &jobs).await }
    })
    .await;
    let seen = audit(&config, Duration::from_secs(2));
    let at_runs: Vec<_> = seen.iter().filter(|s| s.run.job_id == at).collect();
    assert!(at_runs.len() >= 2, "the job at the limit did not fire");
    assert_eq!(at_runs[0].run.handler.payload.len(), limit);
    assert!(seen
        .iter()
        .all(|s| s.run.job_id != over && s.run.job_id != old_limit));

    let reasons = rejected(&config, 2);
    // Limit + 1 is copied; 1 MiB is more than a copy may take (the largest record, less room
    // for the reason), so it is named, not copied, and the copy cannot fail.
    for (id, len, copy) in [(&over, limit + 1, true), (&old_limit, 1 << 20, false)] {
        let (reason, copied, bytes) = reasons
            .get(id)
            .unwrap_or_else(|| panic!("{id} not rejected"));
        assert!(
            reason.starts_with(&format!(
                "payload of {len} bytes for job {id:?} is over the limit of {limit} bytes"
            )),
            "{reason}"
        );
        assert_eq!((*copied, !bytes.is_empty()), (copy, copy), "copy of {id}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_too_large_to_copy_is_rejected_without_its_bytes() {
    let mut big = String::new();
    let (config, _dir) = with_good_job_firing("poison-huge", |config| {
        big = id_on(&config, "huge", 0);
        let def = with_payload(job(&big, "acme", every(1000)), 5 << 20);
        async move {
            // A `jobs` topic configured to take records of 6 MiB, and a producer that sends one.
            let admin: AdminClient<DefaultClientContext> =
                tocsin::kafka::base_config(&config).create().unwrap();
            let topic = config.topic("jobs");
            let alter = AlterConfig::new(ResourceSpecifier::Topic(&topic))
                .set("max.message.bytes", "6291456");
            admin
                .alter_configs(&[alter], &AdminOptions::new())
                .await
                .unwrap()
                .into_iter()
                .for_each(|r| {
                    r.unwrap();
                });
            put_big(&config, &[def]).await
        }
    })
    .await;
    let reasons = rejected(&config, 1);
    let (reason, copied, bytes) = reasons
        .get(&big)
        .expect("the 5 MiB record was not rejected");
    assert!(!copied && bytes.is_empty(), "a 5 MiB copy was attempted");
    assert!(
        reason.contains(&format!(
            "payload of {} bytes for job {big:?} is over the limit",
            5 << 20
        )),
        "{reason}"
    );
    assert!(reason.contains("is not copied; it is at"), "{reason}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_whose_lane_names_kafka_would_confuse_each_get_their_own_lane() {
    let (mut dot, mut underscore) = (String::new(), String::new());
    let (config, _dir) = with_good_job_firing("poison-lanes", |config| {
        dot = id_on(&config, "dot", 0);
        underscore = id_on(&config, "underscore", 0);
        let jobs = [
            job(&dot, "acme.eu", every(1000)),
            job(&underscore, "acme_eu", every(1000)),
        ];
        async move { put_jobs(&config, &jobs).await }
    })
    .await;
    let seen = audit(&config, Duration::from_secs(2));
    let lane_of = |id: &str| {
        let lanes: std::collections::BTreeSet<_> = seen
            .iter()
            .filter(|s| s.run.job_id == id)
            .map(|s| s.lane.clone())
            .collect();
        assert_eq!(lanes.len(), 1, "{id} fired into {lanes:?}");
        lanes.into_iter().next().unwrap()
    };
    assert_eq!(lane_of(&dot), config.lane_topic("acme.eu"));
    assert_eq!(lane_of(&underscore), config.lane_topic("acme_eu"));
    assert_ne!(lane_of(&dot), lane_of(&underscore));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cron_step_that_once_panicked_the_parser_is_rejected() {
    let mut bad = String::new();
    let (config, _dir) = with_good_job_firing("poison-cron", |config| {
        bad = id_on(&config, "cron", 0);
        let def = job(
            &bad,
            "acme",
            cron("0 0 0 1 1 * 2000/18446744073709551615", "UTC"),
        );
        async move { put_jobs(&config, &[def]).await }
    })
    .await;
    let reasons = rejected(&config, 1);
    let (reason, _, _) = reasons.get(&bad).expect("the cron job was not rejected");
    assert_eq!(
        reason,
        &format!(
            "invalid cron \"0 0 0 1 1 * 2000/18446744073709551615\" for job {bad:?}: year step \
             18446744073709551615 out of range 1-130: a step may not exceed the field's width"
        )
    );
}

/// The last line of defence: a job that passes validation but whose lane the broker will not
/// create is set aside with the broker's error, and the partition fires on.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_whose_lane_cannot_be_created_is_set_aside() {
    let mut blocked = String::new();
    let (config, _dir) = with_good_job_firing("poison-collide", |config| {
        blocked = id_on(&config, "blocked", 0);
        let def = job(&blocked, "blocked_t", every(1000));
        async move {
            // A topic that Kafka considers the same name as the tenant's lane.
            let lane = config.lane_topic("blocked_t");
            let squatter = lane.replace('_', ".");
            assert_ne!(lane, squatter);
            let admin: AdminClient<DefaultClientContext> =
                tocsin::kafka::base_config(&config).create().unwrap();
            admin
                .create_topics(
                    &[NewTopic::new(&squatter, 1, TopicReplication::Fixed(1))],
                    &AdminOptions::new(),
                )
                .await
                .unwrap()
                .into_iter()
                .for_each(|r| {
                    r.unwrap();
                });
            put_jobs(&config, &[def]).await
        }
    })
    .await;
    let reasons = rejected(&config, 1);
    let (reason, copied, bytes) = reasons.get(&blocked).expect("the job was not set aside");
    assert!(
        reason.starts_with("job removed from the schedule: firing failed:"),
        "{reason}"
    );
    assert!(
        reason.contains("InvalidTopic") || reason.contains("nvalid topic"),
        "{reason}"
    );
    // The copy is the definition, decodable, so an operator can fix and put it back.
    assert!(*copied);
    let def: JobDefinition = codec::decode(bytes).unwrap();
    assert_eq!(def.id, blocked);
}

/// The last line of defence for what only the broker refuses: the `timers` topic is set to take
/// records of at most 2,000 bytes after the node read its limits, so a job's timer state passes
/// validation and is refused at commit. The node retries the transaction once, then sets the
/// record aside, and the good job keeps every second.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_the_broker_keeps_refusing_is_set_aside() {
    let mut refused = String::new();
    let (config, _dir, _log) = good_job_beside("poison-refused", |config| {
        refused = id_on(&config, "refused", 0);
        // Bytes lz4 cannot shrink, so the batch the broker checks stays over its limit.
        let mut def = job(&refused, "acme", every(1000));
        def.handler.payload = noise(20_000);
        async move {
            let admin: AdminClient<DefaultClientContext> =
                tocsin::kafka::base_config(&config).create().unwrap();
            let timers = config.topic("timers");
            let alter = AlterConfig::new(ResourceSpecifier::Topic(&timers))
                .set("max.message.bytes", "2000");
            for r in admin
                .alter_configs(&[alter], &AdminOptions::new())
                .await
                .unwrap()
            {
                r.unwrap();
            }
            // The broker applies a topic's new settings within a moment.
            tokio::time::sleep(Duration::from_secs(2)).await;
            put_jobs(&config, &[def]).await
        }
    })
    .await;
    let reasons = rejected(&config, 1);
    let (reason, copied, _) = reasons
        .get(&refused)
        .expect("the refused job was not set aside");
    assert!(
        reason.starts_with("processing failed: delivery to"),
        "{reason}"
    );
    assert!(reason.contains(&config.topic("timers")), "{reason}");
    assert!(*copied);
    let seen = audit(&config, Duration::from_secs(2));
    assert!(seen.iter().all(|s| s.run.job_id != refused));
}

/// Tenant B cannot replace tenant A's job, even with a raw record: the definition is rejected
/// with the reason, and A's job keeps every second in A's lane.
#[tokio::test(flavor = "multi_thread")]
async fn another_tenant_cannot_replace_a_job() {
    let (config, _dir) = with_good_job_firing("poison-tenant", |config| {
        let good = id_on(&config, "good", 0);
        let mut forged = job(&good, "mallory", every(1000));
        forged.revision = 99;
        async move { put_jobs(&config, &[forged]).await }
    })
    .await;
    let good = id_on(&config, "good", 0);
    let seen = audit(&config, Duration::from_secs(2));
    assert!(seen
        .iter()
        .filter(|s| s.run.job_id == good)
        .all(|s| s.run.tenant == "acme" && s.lane == config.lane_topic("acme")));
    let reasons = rejected(&config, 1);
    let (reason, _, _) = reasons
        .get(&good)
        .expect("the forged definition was not rejected");
    assert_eq!(
        reason,
        &format!(
            "job {good:?} belongs to tenant \"acme\"; a definition from tenant \"mallory\" \
             cannot replace it (a job id is owned by the tenant that created it until that job \
             is deleted)"
        )
    );
}
