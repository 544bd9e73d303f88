//! The ACL recipe (`scripts/acl-recipe`, docs/security.md) on a broker of the test's own with a
//! SASL/PLAIN listener and Kafka's StandardAuthorizer: the scheduler principal fires through its
//! ACLs, tenant A's worker principal runs A's jobs, tenant B's worker principal is refused a
//! read of A's lane, and B's producer principal a write into it.

mod common;

use std::process::Command;
use std::time::Duration;

use common::broker::OwnBroker;
use common::fleet::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tocsin::config::Config;
use tocsin::model::job::JobDefinition;

const USERS: &str = "scheduler:sched-pw,worker-alice:wa-pw,worker-bob:wb-pw,\
                     producer-alice:pa-pw,producer-bob:pb-pw";

/// `config` logged in as `user`.
fn as_user(config: &Config, user: &str, password: &str) -> Config {
    common::with_kafka(
        config,
        &[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", user),
            ("sasl.password", password),
        ],
    )
}

fn password(user: &str) -> &'static str {
    common::password_of(USERS, user)
}

fn user(config: &Config, name: &str) -> Config {
    as_user(config, name, password(name))
}

/// What a consumer logged in per `config` gets when it reads every partition of `topic` from
/// the beginning: the number of records before their ends, or the first error.
fn read_lane(config: &Config, group: &str, topic: &str) -> Result<usize, KafkaError> {
    let consumer: BaseConsumer = tocsin::kafka::consumer_config(config, group)
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let partitions = config.topics.lane_partitions as i32;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let (mut n, mut ended) = (0, std::collections::HashSet::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(_)) => n += 1,
            Some(Err(KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
                if ended.len() == partitions as usize {
                    return Ok(n);
                }
            }
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    panic!("reading {topic}: neither the ends nor an error in 30 s");
}

fn authorization_failed(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::TopicAuthorizationFailed)
    )
}

fn group_authorization_failed(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::GroupAuthorizationFailed)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_principals_reach_only_their_lanes() {
    let broker = OwnBroker::start(
        "acl",
        &[
            ("TOCSIN_KAFKA_SASL", "1"),
            ("TOCSIN_KAFKA_SASL_USERS", USERS),
        ],
    );
    let admin_password = std::fs::read_to_string(broker.state.join("sasl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut base = common::test_config_on(&broker.bootstrap, "acl");
    // The recipe grants the default scheduler group, as a fleet's operator would run it; the
    // broker is the test's own, so no other test shares that group.
    base.scheduler.group_id = tocsin::config::Config::default().scheduler.group_id;
    base.scheduler.data_dir = dir.path().join("sched");
    base.worker.data_dir = dir.path().join("work");
    let admin = as_user(&base, "admin", admin_password.trim());

    // Without an ACL nothing is allowed, even to a user the broker knows.
    let refused = tocsin::kafka::admin::Admin::new(&user(&base, "scheduler"))
        .unwrap()
        .ensure(&tocsin::kafka::admin::fleet_topics(&base))
        .await;
    assert!(refused.is_err(), "topics created without any ACL");

    ensure_fleet_topics(&admin).await;
    broker.acl_recipe(
        &base.topic_prefix,
        &[
            "--worker",
            "bob=User:worker-bob",
            "--producer",
            "alice=User:producer-alice",
            "--producer",
            "bob=User:producer-bob",
        ],
    );

    let scheduler = Node::spawn_in(
        &user(&base, "scheduler"),
        dir.path(),
        "s1",
        &["scheduler", "--node-id", "s1"],
    );
    let alice_worker =
        Node::tenant_worker(&user(&base, "worker-alice"), dir.path(), "alice", "w-alice");

    // Alice's producer writes her job straight to `jobs`.
    let ran = dir.path().join("ran");
    let handler = exec(&format!(
        "echo \"$TOCSIN_TENANT $TOCSIN_RUN_ID\" >> '{}'",
        ran.display()
    ));
    let job = JobDefinition::new("report", "alice", every(1000), handler);
    put_jobs(&user(&base, "producer-alice"), &[job]).await;

    // The scheduler fires through its ACLs, and Alice's worker runs her runs from her lane.
    let runs = || std::fs::read_to_string(&ran).unwrap_or_default();
    wait_watching(
        Duration::from_secs(90),
        "three runs of alice's job executed by alice's worker",
        &[&scheduler, &alice_worker],
        || runs().lines().filter(|l| l.starts_with("alice ")).count() >= 3,
    );

    let alice_lane = base.lane_topic("alice");
    let read = read_lane(
        &user(&base, "worker-alice"),
        "tocsin-worker-alice",
        &alice_lane,
    );
    assert!(
        read.as_ref().is_ok_and(|n| *n > 0),
        "alice's worker principal could not read her lane: {read:?}"
    );
    // Bob's worker principal is refused her lane in its own group, and refused her group.
    let read = read_lane(&user(&base, "worker-bob"), "tocsin-worker-bob", &alice_lane);
    assert!(
        read.as_ref().is_err_and(authorization_failed),
        "bob's worker principal read alice's lane: {read:?}"
    );
    let read = read_lane(
        &user(&base, "worker-bob"),
        "tocsin-worker-alice",
        &alice_lane,
    );
    assert!(
        read.as_ref()
            .is_err_and(|e| authorization_failed(e) || group_authorization_failed(e)),
        "bob's worker principal read alice's lane in her group: {read:?}"
    );
    // Bob's producer principal cannot forge a run into Alice's lane.
    let producer: FutureProducer = tocsin::kafka::producer_config(&user(&base, "producer-bob"))
        .set("message.timeout.ms", "10000")
        .create()
        .unwrap();
    let forged = producer
        .send(
            FutureRecord::<str, [u8]>::to(&alice_lane)
                .key("report")
                .payload(b"forged"),
            Duration::from_secs(10),
        )
        .await;
    assert!(
        forged.as_ref().is_err_and(|(e, _)| authorization_failed(e)),
        "bob's producer principal wrote into alice's lane: {:?}",
        forged.map_err(|(e, _)| e)
    );

    alice_worker.stop();
    scheduler.stop();
    assert!(
        runs().lines().all(|l| l.starts_with("alice ")),
        "{}",
        runs()
    );
    drop(broker);
}

/// The recipe names a tenant's lane as Tocsin does, escapes included.
#[test]
fn the_recipe_names_lanes_as_tocsin_does() {
    let config = Config {
        topic_prefix: "fleet.".into(),
        ..Config::default()
    };
    let tenant = "acme.eu_2e-x";
    let out = Command::new(common::repo_root().join("scripts/acl-recipe"))
        .args(["--prefix", "fleet.", "--scheduler", "User:s", "--print"])
        .args(["--worker", &format!("{tenant}=User:w")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let printed = common::text(&out.stdout);
    let lane = config.lane_topic(tenant);
    assert_eq!(lane, "fleet.lane.acme_2eeu_5f2e-x");
    assert!(
        printed.contains(&format!(
            "--allow-principal User:w --operation Read --operation Describe --topic {lane}\n"
        )),
        "{printed}"
    );
}
