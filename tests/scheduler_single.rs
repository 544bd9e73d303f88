//! One scheduler node against the real broker: mixed schedules fire once each, changes take
//! effect, bad input is set aside without blocking its partition.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::fleet::*;
use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::{Message, Offset, TopicPartitionList};
use tocsin::codec::{self, Framing};
use tocsin::kafka::partitioner::partition_for;
use tocsin::model::job::{MisfirePolicy, ScheduleSpec};

/// Each test times its runs against the wall clock, and one loads the broker with 1024
/// partitions: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn wait_active(node: &Node, partitions: usize) {
    wait_until(Duration::from_secs(60), "all partitions active", || {
        node.log_text().matches("partition active").count() >= partitions
    });
}

fn sleep_until(ms: i64) {
    let now = now_ms();
    if ms > now {
        std::thread::sleep(Duration::from_millis((ms - now) as u64));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_node_fires_mixed_schedules_exactly_once_and_applies_changes() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("single").await;
    let node = Node::start(&config, dir.path(), "n1");
    wait_active(&node, config.topics.job_partitions as usize);

    let zones = [
        "UTC",
        "Europe/Berlin",
        "Asia/Kolkata",
        "America/New_York",
        "Australia/Lord_Howe",
    ];
    let t0 = now_ms();
    let mut jobs = Vec::new();
    for i in 0..250 {
        let zone = zones[i % zones.len()];
        jobs.push(job(
            &format!("cron1-{i}"),
            "acme",
            cron("* * * * * *", zone),
        ));
        jobs.push(job(
            &format!("cron2-{i}"),
            "globex",
            cron("*/2 * * * * *", zone),
        ));
        jobs.push(job(
            &format!("int-{i}"),
            "initech",
            every(1000 * (1 + (i as u64 % 3))),
        ));
        let at = (t0 / 1000 + 4 + (i as i64 % 6)) * 1000;
        jobs.push(job(
            &format!("once-{i}"),
            "acme",
            ScheduleSpec::Once { at_ms: at },
        ));
    }
    let mut paused = job("ctl-pause", "acme", every(1000));
    paused.misfire = MisfirePolicy::Skip;
    let special = [
        job("ctl-update", "acme", every(1000)),
        job("ctl-delete", "acme", every(1000)),
        paused.clone(),
    ];
    jobs.extend(special.iter().cloned());
    assert_eq!(jobs.len(), 1003);
    put_jobs(&config, &jobs).await;

    // Changes: update to a 3 s interval, delete, pause; later resume.
    sleep_until(t0 + 5_000);
    let mut updated = job("ctl-update", "acme", every(3000));
    updated.revision = 1;
    let mut p = paused.clone();
    p.paused = true;
    p.revision = 1;
    let encoded =
        |j: &tocsin::model::job::JobDefinition| Some(codec::encode(j, &Framing::SingleObject));
    produce_raw(
        &config,
        "jobs",
        &[
            (b"ctl-update".to_vec(), encoded(&updated)),
            (b"ctl-delete".to_vec(), None),
            (b"ctl-pause".to_vec(), encoded(&p)),
        ],
    )
    .await;
    // Written no later than this.
    let t1 = now_ms();
    sleep_until(t0 + 9_000);
    let t2 = now_ms();
    p.paused = false;
    p.revision = 2;
    put_jobs(&config, &[p]).await;
    sleep_until(t0 + 14_000);
    let t_stop = now_ms();
    let log = node.stop();

    let seen = audit(&config, Duration::from_secs(3));
    let dups = duplicates(&seen);
    assert!(
        dups.is_empty(),
        "duplicate runs: {:?}",
        &dups[..dups.len().min(10)]
    );
    let counts = counts(&seen);
    let fired = |job: &str| -> BTreeSet<i64> {
        counts
            .keys()
            .filter(|(j, _)| j == job)
            .map(|(_, t)| *t)
            .collect()
    };

    // Never startable early (a run fired ahead, at most the lookahead before its instant,
    // carries its instant as its not-before); report the worst lateness.
    let lead = config.scheduler.lookahead_ms as i64;
    let mut worst = 0;
    for s in &seen {
        assert!(
            s.not_before_ms >= s.run.scheduled_ms && s.fire_ms >= s.run.scheduled_ms - lead,
            "fired early: {:?}, not before {}",
            s.run,
            s.not_before_ms
        );
        worst = worst.max(s.fire_ms - s.run.scheduled_ms);
    }
    println!("runs seen: {}, worst lateness: {worst} ms", seen.len());

    // Every instant of every recurring job in the steady window fired, and nothing else.
    let from = (t0 / 1000 + 2) * 1000;
    let to = t_stop - 2_000;
    let mut missing = Vec::new();
    for j in &jobs {
        if j.id.starts_with("ctl-") {
            continue;
        }
        let got = fired(&j.id);
        match &j.schedule {
            ScheduleSpec::Once { at_ms } => {
                assert_eq!(got, BTreeSet::from([*at_ms]), "one-shot {}", j.id);
            }
            ScheduleSpec::Cron { expr, .. } => {
                let step = if expr.starts_with("*/2") {
                    2_000
                } else {
                    1_000
                };
                for t in got.iter() {
                    assert_eq!(t % step, 0, "{} fired off-schedule at {t}", j.id);
                }
                let mut t = from.div_euclid(step) * step + step;
                while t <= to {
                    if !got.contains(&t) {
                        missing.push((j.id.clone(), t));
                    }
                    t += step;
                }
            }
            ScheduleSpec::Interval { every_ms, .. } => {
                let step = *every_ms as i64;
                for t in got.iter() {
                    assert_eq!(t % step, 0, "{} fired off-schedule at {t}", j.id);
                }
                let mut t = from.div_euclid(step) * step + step;
                while t <= to {
                    if !got.contains(&t) {
                        missing.push((j.id.clone(), t));
                    }
                    t += step;
                }
            }
        }
    }
    if let Some((job, _)) = missing.first() {
        panic!(
            "{} missing instants, e.g. {:?}; t0 {t0}, window {from}..={to}; {job} fired {:?}\nnode log:\n{}",
            missing.len(),
            &missing[..missing.len().min(10)],
            fired(job),
            log.lines().filter(|l| !l.contains("partition")).take(60).collect::<Vec<_>>().join("\n")
        );
    }

    // Delete: nothing after the tombstone was applied (one tick of slack), beyond the runs
    // fired ahead before it (the lookahead).
    let deleted = fired("ctl-delete");
    assert!(
        !deleted.is_empty(),
        "the deleted job never fired before its deletion"
    );
    assert!(
        deleted.iter().all(|t| *t <= t1 + 1_000 + lead),
        "fired after delete: {deleted:?} (deleted at {t1})"
    );

    // Update: every second before, multiples of 3 s after.
    let upd = fired("ctl-update");
    assert!(upd.iter().any(|t| *t < t1 && t % 3000 != 0), "{upd:?}");
    let after: Vec<i64> = (upd.iter().copied())
        .filter(|t| *t > t1 + 1_000 + lead)
        .collect();
    assert!(!after.is_empty(), "the updated job stopped firing: {upd:?}");
    assert!(
        after.iter().all(|t| t % 3000 == 0),
        "old schedule still used after update: {after:?}"
    );

    // Pause and resume (misfire skip): nothing while paused, firing again after resume.
    let pz = fired("ctl-pause");
    let during: Vec<i64> = pz
        .iter()
        .copied()
        .filter(|t| *t > t1 + 1_000 + lead && *t < t2)
        .collect();
    assert!(
        during.is_empty(),
        "fired while paused: {during:?} (paused {t1}..{t2})"
    );
    assert!(
        pz.iter().any(|t| *t > t2 + 1_000 + lead),
        "did not fire after resume: {pz:?}"
    );

    // The three tenants' lanes were new: each was created when its first job was ingested,
    // between transactions, not by a firing transaction (whose admin calls would hold it open).
    assert!(
        !log.contains("creating a lane inside a firing transaction"),
        "a lane was created inside a transaction:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_rejected_and_its_partition_keeps_firing() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("rejected").await;
    let node = Node::start(&config, dir.path(), "n1");
    wait_active(&node, config.topics.job_partitions as usize);

    // Everything on the same partition as the garbage record.
    let n = config.topics.job_partitions;
    let target = partition_for(b"garbage", n);
    let same = |prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|k| partition_for(k.as_bytes(), n) == target)
            .unwrap()
    };
    let bad_cron_id = same("badcron");
    let good_id = same("good");
    let mut bad_cron = job(&bad_cron_id, "acme", cron("61 * * * * *", "UTC"));
    bad_cron.revision = 1;
    let bad_zone = job(
        &same("badzone"),
        "acme",
        cron("* * * * * *", "Mars/Olympus"),
    );
    produce_raw(
        &config,
        "jobs",
        &[(
            b"garbage".to_vec(),
            Some(b"\x00\x01not avro at all".to_vec()),
        )],
    )
    .await;
    let encoded = |j| Some(codec::encode(j, &Framing::SingleObject));
    produce_raw(
        &config,
        "jobs",
        &[
            (bad_cron_id.clone().into_bytes(), encoded(&bad_cron)),
            (bad_zone.id.clone().into_bytes(), encoded(&bad_zone)),
        ],
    )
    .await;
    put_jobs(&config, &[job(&good_id, "acme", every(1000))]).await;
    std::thread::sleep(Duration::from_secs(4));
    let log = node.stop();

    let seen = audit(&config, Duration::from_secs(2));
    assert!(
        seen.iter().filter(|s| s.run.job_id == good_id).count() >= 2,
        "the good job did not fire twice: {:?}\n{log}",
        seen.iter()
            .filter(|s| s.run.job_id == good_id)
            .map(|s| (s.run.scheduled_ms, s.fire_ms))
            .collect::<Vec<_>>()
    );
    assert!(
        !seen.iter().any(|s| s.run.job_id != good_id),
        "a rejected job fired"
    );

    // jobs.rejected holds the original bytes and a readable reason for each.
    let consumer: BaseConsumer = tocsin::kafka::consumer_config(&config, "audit-rejected")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&config.topic("jobs.rejected"), 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut reasons = std::collections::BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while reasons.len() < 3 && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let key = text(m.key().unwrap());
            let reason = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "tocsin-reason"))
                .map(|h| text(h.value.unwrap()))
                .unwrap();
            if key == "garbage" {
                assert_eq!(m.payload().unwrap(), b"\x00\x01not avro at all");
            }
            reasons.insert(key, reason);
        }
    }
    let garbage = reasons.get("garbage").expect("garbage not rejected");
    assert!(garbage.contains("not a Tocsin JobDefinition"), "{garbage}");
    let cron_reason = reasons
        .get(&bad_cron_id)
        .expect("invalid cron not rejected");
    assert!(
        cron_reason.contains("61") && cron_reason.contains(&bad_cron_id),
        "{cron_reason}"
    );
    let zone_reason = reasons
        .get(&bad_zone.id)
        .expect("unknown zone not rejected");
    assert!(zone_reason.contains("Mars/Olympus"), "{zone_reason}");
}

/// A partition with more due than its share of one scan (1,000 entries at 1024 partitions)
/// fires all of it in the same tick, not one slice per tick.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_with_more_due_than_its_scan_share_fires_in_one_tick() {
    let _g = SERIAL.lock().await;
    let (mut config, dir) = setup_sized("scanshare", 1024).await;
    let tick = 20_000;
    config.scheduler.tick_ms = tick as u64;
    let node = Node::start_active(&config, dir.path(), "n1");
    let ids: Vec<String> = (0..)
        .map(|i| format!("crowd-{i}"))
        .filter(|k| partition_for(k.as_bytes(), 1024) == 0)
        .take(2_500)
        .collect();
    // The first tick instant at least 8 s away, so every definition is in before it.
    let at = (now_ms() + 8_000) / tick * tick + tick;
    let jobs: Vec<_> = ids
        .iter()
        .map(|id| job(id, "acme", ScheduleSpec::Once { at_ms: at }))
        .collect();
    put_jobs(&config, &jobs).await;
    sleep_until(at + 5_000);
    node.stop();
    let seen = audit(&config, Duration::from_secs(2));
    assert!(duplicates(&seen).is_empty(), "duplicate runs");
    let fired: BTreeSet<&str> = seen.iter().map(|s| s.run.job_id.as_str()).collect();
    assert_eq!(fired.len(), ids.len(), "runs missing");
    let late: Vec<_> = seen.iter().filter(|s| s.fire_ms >= at + tick).collect();
    assert!(
        late.is_empty(),
        "{} of {} runs due at {at} fired in a later tick, e.g. {:?}",
        late.len(),
        seen.len(),
        late.first().map(|s| s.fire_ms)
    );
}
