//! A small run of each `tocsin-loadtest` scenario against the test broker: the audit passes
//! (nothing lost, nothing duplicated) and the report has every field the issue promises, with a
//! value wherever the scenario measures it. How fast anything is, is not checked here.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// The scenarios start scheduler processes and load the machine; one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const FIELDS: &[&str] = &[
    "scenario",
    "jobs",
    "nodes",
    "fires",
    "fires_per_s",
    "baseline_per_s",
    "ratio_to_baseline",
    "physical_limit_per_s",
    "ratio_to_physical",
    "lag_ms",
    "append_lag_ms",
    "per_tenant_lag_p99_ms",
    "lost",
    "duplicates",
    "drain_s",
    "per_tenant_drain_s",
    "max_lateness_ms",
    "max_rss_mb",
    "restore_s",
];

/// Runs a scenario with few partitions; returns its report.
fn run(scenario: &str, extra: &[&str], measured: &[&str]) -> Value {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let chart = dir.path().join("chart.png");
    let out = Command::new(env!("CARGO_BIN_EXE_tocsin-loadtest"))
        .env_remove("TOCSIN_LOADTEST_BOOTSTRAP")
        .arg(scenario)
        .args(["--bootstrap", &common::bootstrap()])
        .args(["--tocsin-bin", env!("CARGO_BIN_EXE_tocsin")])
        .args([
            "--prefix",
            &common::unique_prefix(&format!("lt-{scenario}")),
        ])
        .args([
            "--partitions",
            "4",
            "--lane-partitions",
            "2",
            "--tenants",
            "3",
        ])
        .arg("--work-dir")
        .arg(dir.path().join("work"))
        .arg("--report")
        .arg(&report)
        .arg("--chart")
        .arg(&chart)
        .args(extra)
        .output()
        .expect("could not run tocsin-loadtest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tocsin-loadtest {scenario} failed ({}):\n{stdout}\n{stderr}\n{}",
        out.status,
        node_logs(&dir.path().join("work"))
    );
    assert!(
        stdout.contains("audit") && stdout.contains("passed"),
        "{stdout}"
    );
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    for f in FIELDS {
        assert!(
            json.get(*f).is_some(),
            "report of {scenario} lacks {f}: {json:#}"
        );
    }
    for f in ["via", "target_topic", "target_partitions", "kill_at_ms"] {
        assert!(
            json["settings"].get(f).is_some(),
            "report of {scenario} lacks settings.{f}: {json:#}"
        );
    }
    for f in measured {
        assert!(
            !json[*f].is_null(),
            "report of {scenario} has no value for {f}: {json:#}"
        );
    }
    assert_eq!(json["scenario"], scenario);
    assert_eq!(json["lost"], 0, "{json:#}");
    assert_eq!(json["duplicates"], 0, "{json:#}");
    assert_eq!(json["malformed"], 0, "{json:#}");
    assert!(json["fires"].as_u64().unwrap() > 0, "{json:#}");
    assert_eq!(json["fires"], json["expected"], "{json:#}");
    if scenario != "baseline" {
        let png = std::fs::read(&chart).expect("no chart written");
        assert_eq!(&png[1..4], b"PNG");
        for k in ["p50", "p99", "p999", "max"] {
            assert!(json["lag_ms"][k].is_i64(), "lag_ms.{k} missing: {json:#}");
        }
    }
    json
}

fn node_logs(work: &Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(work).into_iter().flatten().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            out += &format!("--- {} (last lines)\n", p.display());
            for l in tail.into_iter().rev() {
                out += l;
                out.push('\n');
            }
        }
    }
    out
}

#[test]
fn steady_smoke() {
    let r = run(
        "steady",
        &[
            "--rate",
            "100",
            "--period-ms",
            "1000",
            "--duration-s",
            "4",
            "--tick-ms",
            "100",
        ],
        &[
            "fires_per_s",
            "baseline_per_s",
            "ratio_to_baseline",
            "lag_ms",
            "max_rss_mb",
        ],
    );
    assert_eq!(r["expected"], 400);
    assert_eq!(r["per_tenant_lag_p99_ms"].as_object().unwrap().len(), 3);
}

#[test]
fn herd_smoke() {
    let r = run(
        "herd",
        &["--jobs", "2000"],
        &[
            "fires_per_s",
            "baseline_per_s",
            "ratio_to_baseline",
            "physical_limit_per_s",
            "ratio_to_physical",
            "drain_s",
            "max_rss_mb",
        ],
    );
    assert_eq!(r["expected"], 2000);
    assert_eq!(r["per_tenant_drain_s"].as_object().unwrap().len(), 3);
}

/// Two nodes, 50 runs/s for 14 s: 700 expected runs around the kill or the stop.
const FAILOVER: &[&str] = &[
    "--nodes",
    "2",
    "--rate",
    "50",
    "--period-ms",
    "1000",
    "--duration-s",
    "14",
];

#[test]
fn failover_smoke() {
    let r = run(
        "failover",
        &[FAILOVER, &["--kill-at-s", "3"]].concat(),
        &["max_lateness_ms", "lag_ms", "fires_per_s"],
    );
    assert_eq!(r["expected"], 700);
    assert_eq!(node_events(&r), ["kill -9 n1"]);
}

/// The report's events of the node it stopped (its lane-hold events left out), each without
/// its partition count.
fn node_events(r: &serde_json::Value) -> Vec<String> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["what"].as_str().unwrap())
        .filter(|w| !w.starts_with("lanes "))
        .map(|w| w.split(" (").next().unwrap().to_owned())
        .collect()
}

#[test]
fn failover_zombie_smoke() {
    let r = run(
        "failover",
        &[
            FAILOVER,
            &[
                "--kill-at-s",
                "2",
                "--kill-mode",
                "stop",
                "--stop-for-s",
                "9",
            ],
        ]
        .concat(),
        &["max_lateness_ms", "lag_ms"],
    );
    assert_eq!(node_events(&r), ["sigstop n1", "sigcont n1"]);
}

#[test]
fn capacity_smoke() {
    run(
        "capacity",
        &["--jobs", "3000", "--probes", "10", "--duration-s", "3"],
        &["max_rss_mb", "restore_s"],
    );
}

#[test]
fn baseline_smoke() {
    run(
        "baseline",
        &["--baseline-fires", "3000", "--jobs", "500"],
        &[
            "baseline_per_s",
            "fires_per_s",
            "physical_limit_per_s",
            "ratio_to_physical",
        ],
    );
}

/// 2,000 delayed messages due at once, delivered by the scheduler itself (needs direct delivery).
#[test]
fn delay_smoke() {
    delay(&["--via", "direct"]);
}

/// The same, delivered by a worker from the lanes (the old path).
#[test]
fn delay_worker_smoke() {
    delay(&["--via", "worker"]);
}

fn delay(via: &[&str]) {
    let r = run(
        "delay",
        &[&["--jobs", "2000", "--target-partitions", "4"], via].concat(),
        &[
            "fires_per_s",
            "lag_ms",
            "append_lag_ms",
            "drain_s",
            "max_rss_mb",
            "ingest_per_s",
        ],
    );
    assert_eq!(r["expected"], 2000);
    assert_eq!(r["unexpected"], 0, "{r:#}");
    assert_eq!(r["settings"]["via"], via[1]);
    assert_eq!(r["settings"]["target_partitions"], 4);
    assert!(r["settings"]["target_topic"]
        .as_str()
        .unwrap()
        .ends_with("-target"));
    for k in ["p50", "p99", "max"] {
        assert!(
            r["append_lag_ms"][k].is_i64(),
            "append_lag_ms.{k} missing: {r:#}"
        );
    }
    assert_eq!(r["per_tenant_drain_s"].as_object().unwrap().len(), 3);
}
