//! Scheduler (and worker) processes of the real `tocsin` binary: start, signal, stop, restart,
//! and what they say about themselves (the partitions they activated, from their log; their peak RSS, from /proc).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One `tocsin scheduler` (or `tocsin worker`) process.
pub struct Node {
    pub id: String,
    child: Child,
    log: PathBuf,
    exited: bool,
    /// How it was started, to start it again the same way.
    bin: PathBuf,
    cfg: PathBuf,
    dir: PathBuf,
    args: Vec<String>,
    starts: u32,
}

impl Node {
    /// Starts `bin --config cfg scheduler --node-id id`, its stderr to `dir/<id>.log`.
    pub fn start(bin: &Path, cfg: &Path, dir: &Path, id: &str) -> Result<Node> {
        Node::spawn(bin, cfg, dir, id, &["scheduler", "--node-id", id])
    }

    /// Starts `bin --config cfg worker` of `pool` on every lane, identity (and ledger) `id`.
    pub fn worker(bin: &Path, cfg: &Path, dir: &Path, id: &str, pool: &str) -> Result<Node> {
        let args = ["worker", "--pool", pool, "--lanes", "*", "--worker-id", id];
        Node::spawn(bin, cfg, dir, id, &args)
    }

    fn spawn(bin: &Path, cfg: &Path, dir: &Path, id: &str, args: &[&str]) -> Result<Node> {
        let log = dir.join(format!("{id}.log"));
        let child = launch(bin, cfg, &log, args)?;
        Ok(Node {
            id: id.to_owned(),
            child,
            log,
            exited: false,
            bin: bin.to_owned(),
            cfg: cfg.to_owned(),
            dir: dir.to_owned(),
            args: args.iter().map(|a| a.to_string()).collect(),
            starts: 1,
        })
    }

    /// Starts the process again with the same id, config and data dir (after it died or was
    /// killed: kills it first otherwise); its log goes to `dir/<id>.<n>.log`, n = 2, 3, …, so
    /// the partitions it activates are read from its own log.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.starts += 1;
        let log = self.dir.join(format!("{}.{}.log", self.id, self.starts));
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.child = launch(&self.bin, &self.cfg, &log, &args)?;
        self.log = log;
        self.exited = false;
        Ok(())
    }

    pub fn signal(&self, sig: i32) {
        if !self.exited {
            // SAFETY: kill(2) on the pid of a child we have not reaped yet.
            unsafe {
                libc::kill(self.child.id() as i32, sig);
            }
        }
    }

    /// The partitions this node holds now: activated and not released since, by its log.
    pub fn active_partitions(&self) -> BTreeSet<i32> {
        active_partitions(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Peak resident set (VmHWM) in MiB, while the process lives.
    pub fn peak_rss_mb(&self) -> Option<f64> {
        proc_status_kb(self.child.id(), "VmHWM").map(|kb| kb as f64 / 1024.0)
    }

    /// Fails when the process has exited (a node that dies during a run invalidates it).
    pub fn check_alive(&mut self) -> Result<()> {
        if self.exited {
            return Ok(());
        }
        if let Some(status) = self.child.try_wait()? {
            self.exited = true;
            bail!(
                "{} {} exited unexpectedly with {status}; its log is {}",
                self.args[0],
                self.id,
                self.log.display()
            );
        }
        Ok(())
    }

    /// SIGTERM, then waits for the exit (SIGKILL after `limit`).
    pub fn stop(&mut self, limit: Duration) -> Result<()> {
        if self.exited {
            return Ok(());
        }
        self.signal(libc::SIGCONT);
        self.signal(libc::SIGTERM);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.exited = true;
                if !status.success() {
                    tracing::warn!(node = %self.id, %status, log = %self.log.display(), "node exited uncleanly");
                }
                return Ok(());
            }
            if started.elapsed() > limit {
                tracing::warn!(node = %self.id, "node did not stop in time; killing it");
                self.kill();
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.exited = true;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `bin --config cfg --log <filter> <args>`, its stderr appended to `log`.
fn launch(bin: &Path, cfg: &Path, log: &Path, args: &[&str]) -> Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("could not open node log {}", log.display()))?;
    // TOCSIN_LOADTEST_NODE_LOG overrides the nodes' log filter (e.g. `info,tocsin=debug`
    // to see each transaction's size and duration); the partition events are info lines.
    let filter = std::env::var("TOCSIN_LOADTEST_NODE_LOG")
        .unwrap_or_else(|_| "info,librdkafka=warn".to_owned());
    Command::new(bin)
        .env_remove("TOCSIN_CONFIG")
        .env_remove("TOCSIN_BOOTSTRAP")
        .env_remove("TOCSIN_TOPIC_PREFIX")
        .env_remove("TOCSIN_LOG")
        // Plain log lines: the partition events are parsed below.
        .env("NO_COLOR", "1")
        .arg("--config")
        .arg(cfg)
        .args(["--log", filter.as_str()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .with_context(|| format!("could not start {}", bin.display()))
}

/// A field of /proc/PID/status in kB.
pub fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Replays the `partition active` / `released partition` lines of a node's log.
pub fn active_partitions(log: &str) -> BTreeSet<i32> {
    let mut held = BTreeSet::new();
    for line in log.lines() {
        let line = strip_ansi(line);
        let activated = line.contains("partition active");
        let released = line.contains("released partition");
        if !activated && !released {
            continue;
        }
        let Some(p) = field(&line, "partition").and_then(|v| v.parse().ok()) else {
            continue;
        };
        if activated {
            held.insert(p);
        } else {
            held.remove(&p);
        }
    }
    held
}

/// The value of `name=value` in a tracing line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=");
    let start = line.find(&key)? + key.len();
    let rest = &line[start..];
    Some(rest.split_whitespace().next().unwrap_or(""))
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            for d in chars.by_ref() {
                if ('@'..='~').contains(&d) && d != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Waits until the nodes together hold every partition in `0..partitions`, each exactly once.
/// Returns how long that took.
pub fn wait_all_active(
    nodes: &mut [&mut Node],
    partitions: u32,
    limit: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        for n in nodes.iter_mut() {
            n.check_alive()?;
        }
        let mut total = 0usize;
        let mut union = BTreeSet::new();
        for n in nodes.iter() {
            let held = n.active_partitions();
            total += held.len();
            union.extend(held);
        }
        if union.len() == partitions as usize && total == partitions as usize {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            bail!(
                "the nodes hold {} of {partitions} partitions ({} activations) after {limit:?}",
                union.len(),
                total
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_follow_activations_and_releases() {
        let log = "\
2025-01-01T00:00:00Z  INFO tocsin::scheduler::engine: restoring partition partition=1 from=None
2025-01-01T00:00:00Z  INFO tocsin::scheduler::engine: partition active partition=1 timers=0
2025-01-01T00:00:00Z  INFO tocsin::scheduler::engine: partition active partition=2 timers=5
2025-01-01T00:00:01Z  INFO tocsin::scheduler::engine: released partition partition=1
\u{1b}[2m2025\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m partition active \u{1b}[3mpartition\u{1b}[0m\u{1b}[2m=\u{1b}[0m7 \u{1b}[3mtimers\u{1b}[0m\u{1b}[2m=\u{1b}[0m0
";
        assert_eq!(active_partitions(log), BTreeSet::from([2, 7]));
    }
}
