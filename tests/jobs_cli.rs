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

fn ids(list: &str) -> Vec<String> {
    let jobs: Vec<serde_json::Value> = serde_json::from_str(list).expect("list --json is JSON");
    jobs.iter()
        .map(|j| j["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Lines of `jobs next` or a dry run: the UTC instant first.
fn instants(out: &str) -> Vec<&str> {
    out.lines().map(|l| l.split(' ').next().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn list_next_bounds_labels_and_exec_commands_through_the_cli() {
    let (config, _dir) = setup_sized("jobscli-list", 8).await;
    // Hourly, bounded to [00:00, 02:30) of 2030-01-01: three instants in all.
    ok(jobs(
        &config,
        &[
            "put",
            "--id",
            "a1",
            "--tenant",
            "acme",
            "--cron",
            "0 0 * * * *",
            "--start",
            "2030-01-01T00:00:00Z",
            "--end",
            "2030-01-01T02:30:00Z",
            "--label",
            "team=billing",
            "--label",
            "tier=gold",
            "--target",
            "out",
        ],
    ));
    ok(jobs(
        &config,
        &[
            "put", "--id", "a2", "--tenant", "acme", "--every", "1h", "--label", "team=ops",
            "--target", "out",
        ],
    ));
    ok(jobs(&config, &["pause", "a2"]));
    // An exec job typed as people type a command: after `--`, hyphens and all.
    ok(jobs(
        &config,
        &[
            "put", "--id", "g1", "--tenant", "globex", "--every", "1h", "--", "sh", "-c", "echo hi",
        ],
    ));
    // The same with flags: `--arg -c` is a value, not an unknown flag.
    ok(jobs(
        &config,
        &[
            "put",
            "--id",
            "g2",
            "--tenant",
            "globex",
            "--every",
            "1h",
            "--handler",
            "exec",
            "--target",
            "sh",
            "--arg",
            "-c",
            "--arg",
            "echo $X",
        ],
    ));
    ok(jobs(
        &config,
        &[
            "put", "--id", "gone", "--tenant", "globex", "--every", "1h", "--target", "out",
        ],
    ));
    ok(jobs(&config, &["delete", "gone"]));
    let a1 = get(&config, "a1");
    assert_eq!(a1["start_ms"], 1_893_456_000_000i64, "{a1}");
    assert_eq!(a1["end_ms"], 1_893_465_000_000i64, "{a1}");
    assert_eq!(a1["labels"]["tier"], "gold", "{a1}");
    // Records the scheduler rejects leave the job as it was, for `list`, `get` and `next`:
    // another tenant's definition of a1, and bytes that are no definition at all.
    let mut theirs = fleet::job("a1", "mallory", fleet::every(60_000));
    theirs.labels.insert("team".into(), "billing".into());
    fleet::put_jobs(&config, &[theirs]).await;
    fleet::produce_raw(
        &config,
        "jobs",
        &[(b"a1".to_vec(), Some(b"garbage".to_vec()))],
    )
    .await;

    assert_eq!(get(&config, "a1"), a1);
    let g1 = get(&config, "g1");
    assert_eq!(g1["handler"]["kind"], "exec");
    assert_eq!(g1["handler"]["target"], "sh");
    assert_eq!(g1["handler"]["args"], serde_json::json!(["-c", "echo hi"]));
    let g2 = get(&config, "g2");
    assert_eq!(g2["handler"]["args"], serde_json::json!(["-c", "echo $X"]));

    let list = |extra: &[&str]| ids(&ok(jobs(&config, &[&["list", "--json"], extra].concat())));
    assert_eq!(list(&[]), ["a1", "a2", "g1", "g2"]);
    assert_eq!(list(&["--tenant", "acme"]), ["a1", "a2"]);
    assert_eq!(list(&["--tenant", "mallory"]), Vec::<String>::new());
    assert_eq!(list(&["--label", "team=billing"]), ["a1"]);
    assert_eq!(
        list(&["--label", "team=billing", "--label", "tier=silver"]),
        Vec::<String>::new()
    );
    assert_eq!(list(&["--paused"]), ["a2"]);
    assert_eq!(list(&["--paused=false"]), ["a1", "g1", "g2"]);
    assert_eq!(
        list(&["--paused", "--tenant", "globex"]),
        Vec::<String>::new()
    );
    let full: Vec<serde_json::Value> =
        serde_json::from_str(&ok(jobs(&config, &["list", "--json", "--tenant", "acme"]))).unwrap();
    assert_eq!(
        full[0]["tenant"], "acme",
        "the owner's definition, not mallory's"
    );
    assert_eq!(full[0]["labels"]["tier"], "gold");
    assert_eq!(full[1]["paused"], true);

    // The table: a header, then one row per job, in id order.
    let table = ok(jobs(&config, &["list", "--tenant", "globex"]));
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert_eq!(rows[0][..3], ["ID", "TENANT", "SCHEDULE"], "{table}");
    assert_eq!(rows[1][..2], ["g1", "globex"], "{table}");
    assert!(table.contains("exec sh"), "{table}");

    let bad = failed(jobs(&config, &["list", "--label", "team"]));
    assert!(
        bad.contains("\"team\"") && bad.contains("KEY=VALUE"),
        "{bad}"
    );

    // The next instants follow the job's bounds.
    let next = ok(jobs(&config, &["next", "a1", "--count", "5"]));
    assert_eq!(
        instants(&next),
        [
            "2030-01-01T00:00:00Z",
            "2030-01-01T01:00:00Z",
            "2030-01-01T02:00:00Z"
        ],
        "{next}"
    );
    let out = jobs(
        &config,
        &[
            "next",
            "a2",
            "--count",
            "2",
            "--from",
            "2030-01-01T00:30:00Z",
        ],
    );
    let note = text(&out.stderr);
    assert_eq!(
        instants(&ok(out)),
        ["2030-01-01T01:00:00Z", "2030-01-01T02:00:00Z"]
    );
    assert!(note.contains("paused"), "{note}");
    let err = failed(jobs(&config, &["next", "a1", "--count", "0"]));
    assert!(err.contains("'0'") && err.contains("1..=1000"), "{err}");
    let err = failed(jobs(&config, &["next", "nope"]));
    assert!(err.contains("job \"nope\" not found"), "{err}");
}

/// Bounds, enum flags and a trailing command, checked before anything is written (dry runs
/// need no broker).
#[test]
fn put_flags_are_checked_with_the_values_they_allow() {
    let put = |args: &[&str]| {
        tocsin()
            .env_remove("TOCSIN_BOOTSTRAP")
            .env_remove("TOCSIN_CONFIG")
            .args(["--bootstrap", "127.0.0.1:1", "jobs", "put", "--id", "j"])
            .args(args)
            .output()
            .unwrap()
    };
    let bounded = ok(put(&[
        "--every",
        "1m",
        "--target",
        "out",
        "--start",
        "2030-01-01T00:00:30Z",
        "--end",
        "2030-01-01T00:03:00Z",
        "--dry-run",
    ]));
    assert_eq!(
        instants(&bounded),
        ["2030-01-01T00:01:00Z", "2030-01-01T00:02:00Z"],
        "{bounded}"
    );
    // Each refusal names the value and the rule.
    let end = [
        "--start",
        "2030-01-01T00:00:00Z",
        "--end",
        "2029-01-01T00:00:00Z",
    ];
    let refusals: [(&[&str], &[&str]); 4] = [
        (&end, &["2029-01-01T00:00:00Z", "not after start"]),
        (&["--start", "soon"], &["\"soon\"", "ISO 8601"]),
        (
            &["--misfire", "sometimes"],
            &["'sometimes'", "fire_once", "fire_all"],
        ),
        (
            &["--handler", "http", "--", "sh", "-c", "true"],
            &["exec", "--handler is http"],
        ),
    ];
    for (args, fragments) in refusals {
        let base = ["--every", "1m", "--dry-run"];
        let err = failed(put(&[&base[..], args].concat()));
        for f in fragments {
            assert!(err.contains(f), "{args:?}: {f} not in {err}");
        }
    }

    // --help lists every enum flag's values.
    let help = ok(put(&["--help"]));
    for value in [
        "fire_once",
        "fire_all",
        "buffer_one",
        "shift",
        "twice",
        "kafka",
        "http",
        "exec",
        "custom",
    ] {
        assert!(help.contains(value), "--help does not list {value}: {help}");
    }
}

/// `tocsin completions SHELL` prints a script the shell takes; bash's completes subcommands.
#[test]
fn shell_completions() {
    let script = |shell: &str| {
        ok(tocsin()
            .env_remove("TOCSIN_CONFIG")
            .args(["completions", shell])
            .output()
            .unwrap())
    };
    let bash = script("bash");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tocsin.bash");
    std::fs::write(&file, &bash).unwrap();
    // What bash offers after `tocsin jobs ` and `tocsin jobs put --mis`.
    let complete = |words: &str| {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
                 COMP_LINE=\"{words}\"; COMP_POINT=${{#COMP_LINE}}; _tocsin tocsin \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
                 printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                file.display()
            ))
            .output()
            .unwrap();
        ok(out)
    };
    let subcommands = complete("tocsin jobs ''");
    for sub in ["put", "get", "list", "next", "pause", "trigger"] {
        assert!(
            subcommands.lines().any(|l| l == sub),
            "{sub} missing: {subcommands}"
        );
    }
    let values = complete("tocsin jobs put --misfire ''");
    assert_eq!(
        values.split_whitespace().collect::<Vec<_>>(),
        ["fire_once", "fire_all", "skip"],
        "{values}"
    );
    assert!(script("zsh").starts_with("#compdef tocsin"));
    assert!(script("fish").contains("complete -c tocsin"));
    let err = failed(tocsin().args(["completions", "tcsh"]).output().unwrap());
    assert!(err.contains("'tcsh'") && err.contains("bash"), "{err}");
}
