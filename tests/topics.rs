//! `tocsin topics ensure|describe` and key placement, against the real broker.

mod common;

use std::time::Duration;

use common::*;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use tocsin::config::Config;

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap()
}

/// (partitions, cleanup.policy) as the broker reports them, independent of our own code.
async fn broker_view(admin: &AdminClient<DefaultClientContext>, topic: &str) -> (usize, String) {
    let md = admin
        .inner()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let partitions = md.topics()[0].partitions().len();
    let configs = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .unwrap();
    let resource = configs.into_iter().next().unwrap().unwrap();
    let policy = resource
        .get("cleanup.policy")
        .unwrap()
        .value
        .clone()
        .unwrap();
    (partitions, policy)
}

#[tokio::test(flavor = "multi_thread")]
async fn ensure_creates_the_default_topics_once() {
    // The product's defaults: 1024 partitions for jobs, timers and control; 7 topics with
    // `nodes`.
    let config = Config {
        bootstrap: bootstrap(),
        topic_prefix: unique_prefix("ensure"),
        ..Config::default()
    };
    let _topics = TopicsGuard::new(&config);
    let out = run_tocsin(&config, &["topics", "ensure"]);
    assert!(
        out.status.success(),
        "first ensure failed: {}",
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stdout).matches("created").count(),
        7,
        "{}",
        text(&out.stdout)
    );

    let admin = admin(&config.bootstrap);
    assert_eq!(
        broker_view(&admin, &config.topic("jobs")).await,
        (1024, "compact".to_owned())
    );
    assert_eq!(
        broker_view(&admin, &config.topic("timers")).await,
        (1024, "compact".to_owned())
    );
    assert_eq!(
        broker_view(&admin, &config.topic("control")).await,
        (1024, "delete".to_owned())
    );

    let again = run_tocsin(&config, &["topics", "ensure"]);
    assert!(
        again.status.success(),
        "second ensure failed: {}",
        text(&again.stderr)
    );
    let stdout = text(&again.stdout);
    assert_eq!(stdout.matches("exists").count(), 7, "{stdout}");
    assert!(!stdout.contains("created"), "{stdout}");
    assert_eq!(
        broker_view(&admin, &config.topic("jobs")).await,
        (1024, "compact".to_owned())
    );

    let described = run_tocsin(&config, &["topics", "describe"]);
    assert!(described.status.success());
    assert!(text(&described.stdout).contains(&format!(
        "{} partitions=1024 cleanup.policy=compact",
        config.topic("jobs")
    )));
}

#[tokio::test(flavor = "multi_thread")]
async fn ensure_refuses_a_jobs_topic_with_other_settings() {
    let config = test_config("mismatch");
    let _topics = TopicsGuard::new(&config);
    let admin = admin(&config.bootstrap);
    let jobs = config.topic("jobs");
    let topic = NewTopic::new(&jobs, 8, TopicReplication::Fixed(1)).set("cleanup.policy", "delete");
    let created = admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(created[0].is_ok());
    // A topic that already exists: seen in the broker's metadata (a create returns once the
    // controller has it, a moment before every broker's metadata shows it).
    // After a fleet's 3 × 1024 partitions were made and deleted, that can take a while.
    common::fleet::wait_until(
        Duration::from_secs(180),
        "the jobs topic in metadata",
        || {
            admin
                .inner()
                .fetch_metadata(Some(&jobs), Duration::from_secs(5))
                .is_ok_and(|md| md.topics().iter().any(|t| t.partitions().len() == 8))
        },
    );

    let mut config = config;
    config.topics.job_partitions = 1024;
    let out = run_tocsin(&config, &["topics", "ensure"]);
    assert!(!out.status.success(), "ensure accepted a wrong jobs topic");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("topic {jobs} has 8 partitions but needs 1024")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "topic {jobs} has cleanup.policy=delete but needs cleanup.policy=compact"
        )),
        "{stderr}"
    );
    // Nothing was altered or created.
    assert_eq!(broker_view(&admin, &jobs).await, (8, "delete".to_owned()));
    let md = admin
        .inner()
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    assert!(!md
        .topics()
        .iter()
        .any(|t| t.name() == config.topic("timers")));
}

#[tokio::test(flavor = "multi_thread")]
async fn producer_places_keys_where_kafkas_java_client_does() {
    let mut config = test_config("partitioner");
    let _topics = TopicsGuard::new(&config);
    config.topics.job_partitions = 1024;
    let partitions = 1024u32;
    let topic = config.topic("jobs");
    let admin = admin(&config.bootstrap);
    tocsin::kafka::admin::Admin::new(&config)
        .unwrap()
        .ensure(&tocsin::kafka::admin::fleet_topics(&config)[..1])
        .await
        .unwrap();
    let _ = admin;

    let keys: Vec<String> = (0..1000)
        .map(|i| match i % 4 {
            0 => format!("job-{i}"),
            1 => format!("tenant-{}/billing-{}", i % 7, i * 7919),
            2 => format!("ünïcödé-{i}-✓"),
            _ => "x".repeat(1 + i % 97),
        })
        .collect();

    // Kafka's own answer, from the broker's jars.
    let java_partitions = java_partitions(&keys, partitions);
    assert_eq!(java_partitions.len(), keys.len());

    // Where Tocsin's producer actually puts them.
    let producer: FutureProducer = tocsin::kafka::producer_config(&config).create().unwrap();
    let mut mismatches = Vec::new();
    for (key, want) in keys.iter().zip(&java_partitions) {
        let partition = producer
            .send(
                FutureRecord::<String, [u8]>::to(&topic)
                    .key(key)
                    .payload(b"x"),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap()
            .partition;
        let computed = tocsin::kafka::partitioner::partition_for(key.as_bytes(), partitions);
        if partition as u32 != *want || computed != *want {
            mismatches.push((key.clone(), *want, partition, computed));
        }
    }
    assert!(
        mismatches.is_empty(),
        "(key, java, produced, computed): {mismatches:?}"
    );
}
