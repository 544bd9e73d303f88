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

fn failed(out: std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "tocsin jobs succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_for_jobs_that_do_not_exist_fail_with_a_reason() {
    let (config, _dir) = setup_sized("jobscli-missing", 8).await;
    for args in [
        &["trigger", "nope"][..],
        &["delete", "nope"],
        &["pause", "nope"],
        &["resume", "nope"],
        &[
            "backfill",
            "nope",
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "2026-01-02T00:00:00Z",
        ],
    ] {
        let err = failed(jobs(&config, args));
        assert!(err.contains("job \"nope\" not found"), "{args:?}: {err}");
    }
    ok(jobs(
        &config,
        &[
            "put", "--id", "real", "--tenant", "acme", "--every", "1h", "--target", "out",
        ],
    ));
    let err = failed(jobs(
        &config,
        &[
            "backfill",
            "real",
            "--from",
            "2026-01-02T00:00:00Z",
            "--to",
            "2026-01-01T00:00:00Z",
        ],
    ));
    assert!(
        err.contains("backfill range of job \"real\" is reversed"),
        "{err}"
    );
    ok(jobs(&config, &["trigger", "real"]));

    // Another tenant can neither replace the job nor act on it under its name.
    let err = failed(jobs(
        &config,
        &[
            "put", "--id", "real", "--tenant", "mallory", "--every", "1h", "--target", "out",
        ],
    ));
    assert!(
        err.contains(
            "job \"real\" belongs to tenant \"acme\"; a definition from tenant \"mallory\""
        ),
        "{err}"
    );
    for args in [
        &["trigger", "real", "--tenant", "mallory"][..],
        &["delete", "real", "--tenant", "mallory"],
    ] {
        let err = failed(jobs(&config, args));
        assert!(
            err.contains("job \"real\" belongs to tenant \"acme\", not \"mallory\""),
            "{err}"
        );
    }
    assert_eq!(get(&config, "real")["tenant"], "acme");
    ok(jobs(&config, &["trigger", "real", "--tenant", "acme"]));
}

/// With no broker at the address, every command ends within 15 s with one line naming the
/// address. (A behaviour users rely on, not a benchmark: librdkafka's own timeouts are 30 to
/// 300 s.)
#[test]
fn commands_fail_fast_when_no_broker_answers() {
    // A port nothing listens on.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let put = [
        "jobs", "put", "--id", "j", "--tenant", "acme", "--every", "1h", "--target", "out",
    ];
    for args in [
        &put[..],
        &["jobs", "get", "j"],
        &["jobs", "trigger", "j"],
        &["topics", "ensure"],
        &["scheduler", "--node-id", "n1"],
        &["worker", "--pool", "p", "--lanes", "*"],
    ] {
        let started = std::time::Instant::now();
        let out = tocsin()
            .env_remove("TOCSIN_BOOTSTRAP")
            .env_remove("TOCSIN_CONFIG")
            .args(["--bootstrap", &addr])
            .args(args)
            .output()
            .unwrap();
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(took < Duration::from_secs(15), "{args:?} took {took:?}");
        assert!(
            err.contains(&format!("cannot reach Kafka at {addr}")),
            "{args:?}: {err}"
        );
    }
}

/// `--from` shows the fires after any instant; a dry run needs no broker.
#[test]
fn dry_run_from_any_instant() {
    let out = tocsin()
        .env_remove("TOCSIN_BOOTSTRAP")
        .env_remove("TOCSIN_CONFIG")
        .args(["--bootstrap", "127.0.0.1:1"])
        .args([
            "jobs",
            "put",
            "--id",
            "summer",
            "--tenant",
            "acme",
            "--cron",
            "0 0 12 1 7 *",
            "--zone",
            "America/New_York",
            "--target",
            "out",
            "--dry-run",
            "--from",
            "2030-01-01T00:00:00Z",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: Vec<&str> = stdout
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    // 12:00 EDT is 16:00Z.
    assert_eq!(
        first,
        [
            "2030-07-01T16:00:00Z",
            "2031-07-01T16:00:00Z",
            "2032-07-01T16:00:00Z",
            "2033-07-01T16:00:00Z",
            "2034-07-01T16:00:00Z"
        ],
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn putting_a_kafka_job_whose_target_is_missing_warns_and_puts_it() {
    let (config, _dir) = setup_sized("jobsmissing", 4).await;
    let missing = format!("{}-nowhere", config.topic_prefix.trim_end_matches('.'));
    let out = jobs(
        &config,
        &[
            "put",
            "--id",
            "later",
            "--every",
            "1m",
            "--handler",
            "kafka",
            "--target",
            &missing,
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(ok(out).contains("put later"));
    assert!(
        stderr.contains(&format!("target topic {missing:?}"))
            && stderr.contains("does not exist")
            && stderr.contains("dead"),
        "{stderr}"
    );
    assert_eq!(get(&config, "later")["handler"]["target"], missing.as_str());

    // A target that exists: no warning.
    let exists = format!("{}-there", config.topic_prefix.trim_end_matches('.'));
    tocsin::kafka::admin::Admin::new(&config)
        .unwrap()
        .ensure(&[tocsin::kafka::admin::TopicSpec {
            name: exists.clone(),
            partitions: 1,
            cleanup: tocsin::kafka::admin::Cleanup::Delete,
        }])
        .await
        .unwrap();
    let out = jobs(
        &config,
        &[
            "put",
            "--id",
            "now",
            "--every",
            "1m",
            "--handler",
            "kafka",
            "--target",
            &exists,
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(ok(out).contains("put now"));
    assert!(!stderr.contains("warning"), "{stderr}");
}

/// `config check` warns on a `[kafka]` key librdkafka does not know (exit 0) and refuses a
/// value librdkafka would refuse (the nodes could not create a client with it).
#[test]
fn config_check_warns_on_unknown_kafka_keys() {
    let dir = tempfile::tempdir().unwrap();
    let check = |body: &str| {
        let path = dir.path().join("tocsin.toml");
        std::fs::write(&path, body).unwrap();
        tocsin()
            .args(["config", "check"])
            .arg(&path)
            .output()
            .expect("run tocsin config check")
    };
    let out = check(
        "[kafka]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"PLAIN\"\n\
         \"sasl.username\" = \"alice\"\n\"sasl.password\" = \"secret\"\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    let out = check("[kafka]\n\"sasl.usernme\" = \"alice\"\n");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("warning: ")
            && stderr.contains("\"sasl.usernme\" is not a librdkafka setting"),
        "{stderr}"
    );
    let out = check("[kafka]\n\"linger.ms\" = \"soon\"\n");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("\"linger.ms\""),
        "{}",
        text(&out.stderr)
    );
}
