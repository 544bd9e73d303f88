//! The worker's ledger on a disk that fills up: a real full filesystem (a small tmpfs mounted by
//! the test, which runs as root here and in CI), not an injected error, so what RocksDB does
//! after ENOSPC (it refuses every later write until it is opened again) is what is tested.
//!
//! - The ledger alone, on its clock: a failed write keeps the entry in memory (a redelivery is
//!   still skipped), reports the failure, warns once per `WARN_EVERY_MS` however many writes
//!   fail, and `recover` writes everything once space returns.
//! - A worker process: it goes not-ready (`/readyz` 503 naming the ledger) while the ledger
//!   cannot write, keeps running runs, logs a handful of warnings instead of one per run, and is
//!   ready again with every run in its ledger once space returns.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::fleet::*;
use common::http::get;
use tocsin::node::StoreHealth;
use tocsin::worker::ledger::{Ledger, WARN_EVERY_MS};

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(under: &Path, size: &str) -> Tmpfs {
        let path = under.join("fs");
        std::fs::create_dir_all(&path).unwrap();
        common::run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(&path),
            "mount (this test mounts a tmpfs and needs root)",
        );
        Tmpfs(path)
    }

    /// Fills what is left of it with one file; returns that file.
    fn fill(&self) -> PathBuf {
        let filler = self.0.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.flush();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// What the code under test logs, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn count(&self, what: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .matches(what)
            .count()
    }
}

const CANNOT_WRITE: &str = "ledger cannot write";

#[test]
fn a_full_disk_keeps_entries_in_memory_warns_rarely_and_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(dir.path(), "2m");
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);

    let health = Arc::new(StoreHealth::default());
    let path = fs.0.join("ledger");
    let ledger = Ledger::open_with(&path, 3_600_000, health.clone()).unwrap();
    let t0 = 1_000_000i64;
    ledger.record("before", t0);
    assert!(health.failing().is_none());

    let filler = fs.fill();
    // Writes go on (into the WAL's last page, then not): the first that fails marks it failing.
    let mut recorded = Vec::new();
    for i in 0..20_000 {
        let id = format!("run-{i}");
        ledger.record(&id, t0 + 1);
        recorded.push(id);
        if health.failing().is_some() && recorded.len() >= 1_000 {
            break;
        }
    }
    let (since, error) = health
        .failing()
        .expect("a full disk did not fail the ledger");
    println!(
        "{} runs recorded on the full disk; the ledger's error: {error}",
        recorded.len()
    );
    assert_eq!(since, t0 + 1);
    assert!(error.contains("No space left on device"), "{error}");
    // Every finished run is still known: a redelivery of any would be skipped.
    assert!(recorded.iter().all(|id| ledger.finished(id, t0 + 2)));
    assert!(ledger.finished("before", t0 + 2));
    // Hundreds of failed writes within WARN_EVERY_MS: one warning.
    assert_eq!(logs.count(CANNOT_WRITE), 1);

    // Still full: recovery fails, the entries stay known, one more warning a period later.
    assert!(!ledger.recover(t0 + WARN_EVERY_MS + 2));
    assert!(health.failing().is_some());
    assert!(recorded.iter().all(|id| ledger.finished(id, t0 + 3)));
    assert!(
        ledger.finished("before", t0 + 3),
        "read-only, the disk's entries count"
    );
    assert_eq!(logs.count(CANNOT_WRITE), 2);

    // Space returns: everything kept in memory is written.
    std::fs::remove_file(filler).unwrap();
    assert!(ledger.recover(t0 + WARN_EVERY_MS + 3));
    assert!(health.failing().is_none());
    ledger.record("after", t0 + WARN_EVERY_MS + 4);
    assert!(health.failing().is_none(), "{:?}", health.failing());
    drop(ledger);
    let reopened = Ledger::open(&path, 3_600_000).unwrap();
    for id in recorded
        .iter()
        .chain(["before".into(), "after".into()].iter())
    {
        assert!(
            reopened.finished(id, t0 + 5),
            "{id} lost with the full disk"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_whose_ledger_cannot_write_is_not_ready_until_space_returns() {
    let (mut config, dir) = setup("ledgerfull").await;
    let fs = Tmpfs::mount(dir.path(), "4m");
    let http = common::http::free_addr();
    config.worker.data_dir = fs.0.clone();
    config.worker.http_listen = http.to_string();
    config.worker.exec.enabled = true;
    config.worker.exec.allow = vec!["/bin/sh".into()];
    tocsin::kafka::admin::Admin::new(&config)
        .unwrap()
        .ensure(&[tocsin::kafka::admin::lane_topic(&config, "acme")])
        .await
        .unwrap();
    let ran = dir.path().join("ran");
    let handler = exec(&format!("echo \"$TOCSIN_RUN_ID\" >> '{}'", ran.display()));
    let ran_lines = || {
        std::fs::read_to_string(&ran)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let w = Node::worker(&config, dir.path(), "w1", "p");
    let readyz = || get(http, "/readyz").unwrap_or((0, String::new()));
    wait_watching(Duration::from_secs(30), "the worker ready", &[&w], || {
        readyz().0 == 200
    });
    let mut runs = Vec::new();
    let batch = |from: usize, n: usize| -> Vec<_> {
        (from..from + n)
            .map(|i| lane_run(&format!("r{i}"), "acme", handler.clone()))
            .collect()
    };
    let first = batch(0, 5);
    put_runs(&config, &first).await;
    runs.extend(first);
    wait_watching(Duration::from_secs(30), "the first runs", &[&w], || {
        ran_lines() >= 5
    });

    let filler = fs.fill();
    let warned_before = w.log_text().matches(CANNOT_WRITE).count();
    // 200 runs over about 10 s while the disk is full.
    for b in 0..10 {
        let more = batch(5 + b * 20, 20);
        put_runs(&config, &more).await;
        runs.extend(more);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (status, body) = readyz();
    assert_eq!(status, 503, "ready with a ledger that cannot write: {body}");
    assert!(
        body.contains("worker: the ledger cannot write") && body.contains("No space left"),
        "{body}"
    );
    wait_watching(
        Duration::from_secs(60),
        "every run to run while the disk is full",
        &[&w],
        || ran_lines() >= runs.len(),
    );
    let warned = w.log_text().matches(CANNOT_WRITE).count() - warned_before;
    // One per WARN_EVERY_MS (10 s), for 200 failed writes and a recovery try every second.
    assert!(
        (1..=4).contains(&warned),
        "{warned} warnings for {} runs:\n{}",
        runs.len(),
        w.log_text()
            .lines()
            .filter(|l| l.contains(CANNOT_WRITE))
            .collect::<Vec<_>>()
            .join("\n")
    );

    std::fs::remove_file(filler).unwrap();
    wait_watching(
        Duration::from_secs(15),
        "the worker ready again once space returned",
        &[&w],
        || readyz().0 == 200,
    );
    // A run finished while the disk was full, delivered again, is not run again.
    let again = runs[50].clone();
    put_runs(&config, std::slice::from_ref(&again)).await;
    let extra = batch(1_000, 1);
    put_runs(&config, &extra).await;
    wait_watching(
        Duration::from_secs(30),
        "a run after the redelivery",
        &[&w],
        || ran_lines() > runs.len(),
    );
    let ev = common::topics::events(&config, Duration::from_millis(500));
    assert_eq!(
        common::topics::starts(&ev, &again.run_id),
        1,
        "a run finished during the outage ran again"
    );
    w.stop();
    let ledger = Ledger::open(&fs.0.join("w1"), config.worker.ledger_retention_ms as i64).unwrap();
    let lost: Vec<_> = runs
        .iter()
        .filter(|r| !ledger.finished(&r.run_id, now_ms()))
        .map(|r| r.job_id.clone())
        .collect();
    assert!(
        lost.is_empty(),
        "not in the ledger after recovery: {lost:?}"
    );
}
