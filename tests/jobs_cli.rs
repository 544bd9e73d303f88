//! `tocsin jobs` against the real broker: put, get, pause, resume, delete, dry run, and where
//! the record lands.

mod common;

use std::time::Duration;

use common::fleet::setup_sized;
use common::*;
use rdkafka::Message;
use tocsin::config::Config;
use tocsin::kafka::partitioner::partition_for;

fn jobs(config: &Config, args: &[&str]) -> std::process::Output {
    tocsin()
        .env_remove("TOCSIN_BOOTSTRAP")
        .env_remove("TOCSIN_TOPIC_PREFIX")
        .args(["--bootstrap", &config.bootstrap])
        .args(["--topic-prefix", &config.topic_prefix])
        .arg("jobs")
        .args(args)
        .output()
        .expect("run tocsin jobs")
}

fn ok(out: std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tocsin jobs failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn get(config: &Config, id: &str) -> serde_json::Value {
    serde_json::from_str(&ok(jobs(config, &["get", id]))).expect("get prints JSON")
}

#[tokio::test(flavor = "multi_thread")]
async fn put_get_pause_resume_delete_through_the_cli() {
    let (config, _dir) = setup_sized("jobscli", 1024).await;
    let put = [
        "put",
        "--id",
        "billing-7",
        "--tenant",
        "acme",
        "--cron",
        "0 */5 * * * *",
        "--zone",
        "Europe/Berlin",
        "--handler",
        "http",
        "--target",
        "http://127.0.0.1:9/run",
    ];

    // A dry run writes nothing and prints the next five instants, UTC and local.
    let dry = ok(jobs(&config, &[&put[..], &["--dry-run"]].concat()));
    let lines: Vec<&str> = dry.lines().filter(|l| l.contains("T")).collect();
    assert_eq!(lines.len(), 5, "{dry}");
    for l in &lines {
        let parts: Vec<&str> = l.split_whitespace().collect();
        assert!(parts.len() >= 2 && parts[0].ends_with('Z'), "{dry}");
    }
    assert!(!jobs(&config, &["get", "billing-7"]).status.success());

    ok(jobs(&config, &put));
    let job = get(&config, "billing-7");
    assert_eq!(job["id"], "billing-7");
    assert_eq!(job["tenant"], "acme");
    assert_eq!(job["paused"], false);
    assert!(job.to_string().contains("Europe/Berlin"), "{job}");

    ok(jobs(&config, &["pause", "billing-7"]));
    let paused = get(&config, "billing-7");
    assert_eq!(paused["paused"], true);
    assert!(paused["revision"].as_u64() > job["revision"].as_u64());
    ok(jobs(&config, &["resume", "billing-7"]));
    assert_eq!(get(&config, "billing-7")["paused"], false);

    ok(jobs(&config, &["delete", "billing-7"]));
    let gone = jobs(&config, &["get", "billing-7"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("billing-7"),
        "the error names the job"
    );

    // Every record of the job (put, pause, resume, tombstone) sits on murmur2(id) mod 1024.
    let want = partition_for(b"billing-7", 1024);
    let records: Vec<_> = drain(&config, &config.topic("jobs"), Duration::from_millis(200))
        .into_iter()
        .filter(|m| m.key() == Some(b"billing-7".as_slice()))
        .collect();
    assert_eq!(records.len(), 4);
    assert!(records.iter().all(|m| m.partition() as u32 == want));
    assert!(
        records.last().unwrap().payload().is_none(),
        "the delete is a tombstone"
    );

    // Bad input names the value and the rule, and writes nothing.
    let bad = jobs(&config, &["put", "--id", "x", "--cron", "61 * * * * *"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("61"), "{err}");
    let unknown = jobs(
        &config,
        &[
            "put",
            "--id",
            "x",
            "--cron",
            "* * * * * *",
            "--zone",
            "Mars/Olympus",
        ],
    );
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("Mars/Olympus"));
}
