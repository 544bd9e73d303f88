//! Run history into PostgreSQL through the real parts: the broker, a scheduler and a worker of
//! the binary, Kafka Connect standalone with the Debezium JDBC sink and PostgreSQL, the last two
//! started by `scripts/connect` (a failure to start them fails the test). `runs` is written as
//! Connect JSON (`topics.serialization.runs = "connect_json"`).

mod common;
// The history sink of one test, shared with the benchmark: its own Connect worker (named by the
// topic prefix) and its own database, both removed when dropped.
#[allow(dead_code)]
#[path = "../loadtest/sink.rs"]
mod sink;

use std::collections::BTreeMap;
use std::time::Duration;

use common::fleet::*;
use common::text;
use common::topics::read_all;
use sink::Sink;
use tocsin::config::{Config, Serialization};
use tocsin::history::{decode_row, RunRow};
use tocsin::model::job::{RetryPolicy, ScheduleSpec};

/// Every row of `tocsin_runs` by run id; empty until the sink created the table.
fn table_rows(sink: &Sink) -> BTreeMap<String, RunRow> {
    let ms = |c: &str| format!("(extract(epoch from {c}_at) * 1000)::bigint as {c}_ms");
    let sql = format!(
        "select row_to_json(t) from (select run_id, job_id, tenant, status, attempt, {}, {}, \
         {}, {}, node, worker, error, duration_ms, {} from tocsin_runs) t",
        ms("scheduled"),
        ms("fired"),
        ms("started"),
        ms("finished"),
        ms("updated"),
    );
    match sink.query(&sql) {
        Ok(out) => out
            .lines()
            .map(|l| {
                let r: RunRow = serde_json::from_str(l).expect("a row of tocsin_runs");
                (r.run_id.clone(), r)
            })
            .collect(),
        Err(e) if e.to_string().contains("does not exist") => BTreeMap::new(),
        Err(e) => panic!("query of tocsin_runs failed: {e:#}"),
    }
}

fn once_in(secs: i64) -> ScheduleSpec {
    ScheduleSpec::Once {
        at_ms: (now_ms() / 1000 + secs) * 1000,
    }
}

/// The last `runs` record of each run, as a row: what the table must hold.
fn last_reports(config: &Config) -> BTreeMap<String, RunRow> {
    let mut last = BTreeMap::new();
    for (key, value) in read_all(config, "runs", Duration::from_millis(500)) {
        if key == b"poison" {
            continue;
        }
        let row = decode_row(&value).expect("a runs record that is not a run row");
        assert_eq!(row.run_id.as_bytes(), &key[..], "key is not the run id");
        last.insert(row.run_id.clone(), row);
    }
    last
}

fn of_job<'a>(rows: &'a BTreeMap<String, RunRow>, job: &str) -> Vec<&'a RunRow> {
    rows.values().filter(|r| r.job_id == job).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_land_in_postgres_one_row_per_run_through_a_connect_restart() {
    let (mut config, dir) = setup("history").await;
    config.topics.serialization.runs = Serialization::ConnectJson;
    config.topics.serialization.dead = Serialization::ConnectJson;
    config.worker.exec.enabled = true;
    config.worker.exec.allow = vec!["/bin/sh".into()];
    let sink = Sink::start(&config).expect("the history sink");

    let counter = dir.path().join("flaky-attempts");
    let retry = RetryPolicy {
        max_attempts: 3,
        backoff_base_ms: 500,
        backoff_cap_ms: 2_000,
    };
    let mut tick = job("tick", "acme", every(1_000));
    tick.handler = exec("exit 0");
    let mut flaky = job("flaky", "acme", once_in(4));
    flaky.handler = exec(&format!(
        "n=$(cat {c} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {c}; [ $n -ge 3 ] || {{ echo attempt $n failed >&2; exit 1; }}",
        c = counter.display()
    ));
    flaky.retry = retry;
    let mut broken = job("broken", "globex", once_in(4));
    broken.handler = exec("echo boom >&2; exit 7");
    broken.retry = RetryPolicy {
        max_attempts: 2,
        ..retry
    };

    let node = Node::start(&config, dir.path(), "s1");
    let worker = Node::worker(&config, dir.path(), "w1", "p");
    put_jobs(&config, &[tick, flaky, broken]).await;
    // A record the sink cannot read: it goes to the dead-letter topic, and the sink goes on.
    produce_raw(
        &config,
        "runs",
        &[(b"poison".to_vec(), Some(b"not json".to_vec()))],
    )
    .await;

    wait_watching(
        Duration::from_secs(120),
        "flaky to succeed, broken to be dead and three ticks in tocsin_runs",
        &[&node, &worker],
        || {
            let rows = table_rows(&sink);
            let done =
                |job: &str, status: &str| of_job(&rows, job).iter().any(|r| r.status == status);
            done("flaky", "succeeded")
                && done("broken", "dead")
                && of_job(&rows, "tick")
                    .iter()
                    .filter(|r| r.status == "succeeded")
                    .count()
                    >= 3
        },
    );

    // Connect stops mid-way while runs go on, and starts again from its committed offsets.
    let before = of_job(&table_rows(&sink), "tick").len();
    sink.script("stop").unwrap();
    std::thread::sleep(Duration::from_secs(4));
    sink.script("start").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    delete_job(&config, "tick").await;
    std::thread::sleep(Duration::from_secs(3));

    // Every run on `runs` has exactly its latest report as its row: none lost, none twice.
    let want = last_reports(&config);
    let mut rows = BTreeMap::new();
    wait_watching(
        Duration::from_secs(90),
        "tocsin_runs to hold the last report of every run",
        &[&node, &worker],
        || {
            rows = table_rows(&sink);
            rows == want
        },
    );
    let ticks = of_job(&rows, "tick");
    assert!(
        ticks.len() >= before + 3,
        "ticks fired while Connect was down are missing: {} before, {} after",
        before,
        ticks.len()
    );
    println!(
        "history: {} runs on `runs`, {} rows; {} ticks, {} before the Connect restart",
        want.len(),
        rows.len(),
        ticks.len(),
        before
    );
    let count = sink
        .query("select count(*), count(distinct run_id) from tocsin_runs")
        .unwrap();
    assert_eq!(count.trim(), format!("{0}|{0}", want.len()));

    // Every field, for every run that ran.
    for r in rows.values().filter(|r| r.status == "succeeded") {
        assert_eq!(r.node.as_deref(), Some("s1"), "{r:?}");
        assert_eq!(r.worker.as_deref(), Some("w1"), "{r:?}");
        let (fired, started, finished) = (
            r.fired_ms.expect("fired_at"),
            r.started_ms.expect("started_at"),
            r.finished_ms.expect("finished_at"),
        );
        assert!(
            r.scheduled_ms <= fired + 1_000 && fired <= started && started <= finished,
            "instants out of order: {r:?}"
        );
        assert!(r.duration_ms.is_some() && r.error.is_none(), "{r:?}");
        assert_eq!(
            r.run_id,
            tocsin::model::records::run_id(&r.job_id, r.scheduled_ms)
        );
        assert!(r.tenant == "acme", "{r:?}");
    }
    let flaky = of_job(&rows, "flaky");
    assert_eq!(flaky.len(), 1, "{flaky:?}");
    assert_eq!(
        (flaky[0].status.as_str(), flaky[0].attempt),
        ("succeeded", 3)
    );
    let broken = of_job(&rows, "broken");
    assert_eq!(broken.len(), 1, "{broken:?}");
    let b = broken[0];
    assert_eq!(
        (b.status.as_str(), b.attempt, b.tenant.as_str()),
        ("dead", 2, "globex")
    );
    let error = b.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("exit status: 7") && error.contains("boom"),
        "dead run's error: {error:?}"
    );
    assert!(
        b.finished_ms.is_some() && b.worker.as_deref() == Some("w1"),
        "{b:?}"
    );

    // `tocsin runs get` tells the flaky run's whole story; `runs tail` filters.
    let story = common::run_tocsin(&config, &["runs", "get", &flaky[0].run_id, "--json"]);
    assert!(story.status.success(), "{}", text(&story.stderr));
    let story: Vec<(String, u32)> = text(&story.stdout)
        .lines()
        .map(|l| {
            let r: RunRow = serde_json::from_str(l).unwrap();
            (r.status, r.attempt)
        })
        .collect();
    for attempt in 1..=3 {
        assert!(story.contains(&("fired".into(), attempt)), "{story:?}");
        assert!(story.contains(&("running".into(), attempt)), "{story:?}");
    }
    assert_eq!(story.last(), Some(&("succeeded".into(), 3)), "{story:?}");
    let tail = |filters: &[&str]| {
        let mut args = vec!["runs", "tail", "--since", "10m", "--no-follow"];
        args.extend_from_slice(filters);
        let out = common::run_tocsin(&config, &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let globex = tail(&["--tenant", "globex"]);
    assert!(
        !globex.is_empty() && globex.lines().all(|l| l.contains("job broken")),
        "{globex}"
    );
    let dead = tail(&["--status", "dead", "--json"]);
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(dead.contains("\"job_id\":\"broken\""), "{dead}");
    let bad = common::run_tocsin(&config, &["runs", "get", "nope"]);
    assert!(
        !bad.status.success() && text(&bad.stderr).contains("invalid run id \"nope\""),
        "{}",
        text(&bad.stderr)
    );

    // The instants are timestamps, the key the primary key.
    let types = sink
        .query(
            "select column_name || ':' || data_type from information_schema.columns \
             where table_name = 'tocsin_runs' and column_name like '%_at' order by 1",
        )
        .unwrap();
    let types: Vec<&str> = types.lines().collect();
    assert_eq!(types.len(), 5, "{types:?}");
    assert!(
        types
            .iter()
            .all(|t| t.ends_with(":timestamp without time zone")),
        "{types:?}"
    );
    let key = sink
        .query(
            "select a.attname from pg_index i join pg_attribute a on a.attrelid = i.indrelid \
             and a.attnum = any(i.indkey) where i.indrelid = 'tocsin_runs'::regclass and i.indisprimary",
        )
        .unwrap();
    assert_eq!(key.trim(), "run_id");

    // The poison record is in the dead-letter topic with Connect's reason.
    let dlq = common::drain(
        &config,
        &config.topic("runs.dlq"),
        Duration::from_millis(500),
    );
    assert_eq!(dlq.len(), 1, "dead-letter topic: {dlq:?}");
    use rdkafka::message::{Headers, Message};
    let reason = dlq[0]
        .headers()
        .and_then(|h| {
            h.iter()
                .find(|h| h.key == "__connect.errors.exception.class.name")
                .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
        })
        .unwrap_or_default();
    assert!(
        reason.contains("DataException"),
        "dead-letter reason: {reason:?}"
    );
    assert_eq!(dlq[0].key(), Some(&b"poison"[..]));

    // The dead letter on `dead` is Connect JSON too, with the error.
    let dead = read_all(&config, "dead", Duration::from_millis(500));
    assert_eq!(dead.len(), 1);
    let doc: serde_json::Value = serde_json::from_slice(&dead[0].1).unwrap();
    assert_eq!(doc["payload"]["job_id"], "broken");
    assert_eq!(doc["payload"]["attempts"], 2);
    assert!(doc["payload"]["error"].as_str().unwrap().contains("boom"));
}
