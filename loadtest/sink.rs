//! The run-history sink of `history` (and of `tests/history.rs`, which includes this file):
//! Kafka Connect standalone with the Debezium JDBC sink and PostgreSQL, started by
//! `scripts/connect` for a topic prefix into a database of its own, and what the table says
//! about when each run's finished row arrived.
//!
//! When a row arrived is taken inside PostgreSQL: a trigger on `tocsin_runs` (installed once the
//! sink has created the table, before the measured window) stamps a row with
//! `clock_timestamp()` whenever its `finished_at` is first set or changes, in a column of its
//! own (`bench_landed_at`) that the sink does not know. That is the instant PostgreSQL writes
//! the finished version of the row; the sink's transaction commits it a batch later, so a
//! reader sees it at most that much after (the report notes it). It is the database's clock
//! and the worker's, one machine's clock.
//!
//! Must never: leave its Connect worker, database or consumer group behind (`Drop`).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tocsin::config::Config;

pub struct Sink {
    prefix: String,
    database: String,
    bootstrap: String,
    /// `postgresql://…/<database>`, as `scripts/connect start` printed it.
    url: String,
}

/// A row of `tocsin_runs` whose finished version the trigger stamped.
#[derive(Debug, Clone)]
pub struct Landed {
    pub job_id: String,
    pub scheduled_ms: i64,
    pub status: String,
    pub attempt: i64,
    pub finished_ms: i64,
    pub landed_ms: i64,
}

impl Sink {
    /// Starts PostgreSQL (or reuses it) and a Connect worker for `config`'s prefix.
    pub fn start(config: &Config) -> Result<Sink> {
        let slug: String = config
            .topic_prefix
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect::<String>()
            .to_lowercase();
        let mut sink = Sink {
            prefix: config.topic_prefix.clone(),
            database: format!("h_{}", slug.trim_matches('_')),
            bootstrap: config.bootstrap.clone(),
            url: String::new(),
        };
        let out = sink.script("start")?;
        sink.url = out
            .lines()
            .find_map(|l| l.strip_prefix("postgres="))
            .context("scripts/connect start printed no postgres= line")?
            .to_owned();
        tracing::info!(database = %sink.database, "history sink running");
        Ok(sink)
    }

    /// Runs `scripts/connect CMD` for this sink's prefix and database; returns what it printed.
    pub fn script(&self, cmd: &str) -> Result<String> {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/connect");
        let out = Command::new(&script)
            .args([
                cmd,
                "--bootstrap",
                &self.bootstrap,
                "--prefix",
                &self.prefix,
            ])
            .args(["--database", &self.database])
            .output()
            .with_context(|| format!("could not run {}", script.display()))?;
        if !out.status.success() {
            bail!(
                "scripts/connect {cmd} failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The rows `sql` returns in the sink's database, one a line, columns separated by `|`.
    pub fn query(&self, sql: &str) -> Result<String> {
        Self::psql(&self.url, sql)
    }

    fn psql(url: &str, sql: &str) -> Result<String> {
        let out = Command::new("psql")
            .args([url, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .context("could not run psql")?;
        if !out.status.success() {
            bail!(
                "psql failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until the sink has created `tocsin_runs`, then adds the landing column and its
    /// trigger.
    pub fn install_landing_stamp(&self, limit: Duration) -> Result<()> {
        let started = Instant::now();
        while self
            .query("select to_regclass('tocsin_runs') is not null")?
            .trim()
            != "t"
        {
            if started.elapsed() > limit {
                bail!("the sink created no tocsin_runs within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.query(
            "alter table tocsin_runs add column bench_landed_at timestamptz;
             create function bench_landed() returns trigger language plpgsql as $$
             begin
               if tg_op = 'UPDATE' then
                 new.bench_landed_at := old.bench_landed_at;
               end if;
               if new.finished_at is not null
                  and (tg_op = 'INSERT' or old.finished_at is distinct from new.finished_at) then
                 new.bench_landed_at := clock_timestamp();
               end if;
               return new;
             end $$;
             create trigger bench_landed before insert or update on tocsin_runs
               for each row execute function bench_landed();",
        )?;
        tracing::info!("landing stamp installed on tocsin_runs");
        Ok(())
    }

    /// Rows scheduled in `[from, to)` whose finished version landed.
    pub fn landed(&self, from: i64, to: i64) -> Result<Vec<Landed>> {
        let ms = |c: &str| format!("(extract(epoch from {c}) * 1000)::bigint");
        let sql = format!(
            "set time zone 'UTC'; select job_id, {}, status, attempt, {}, {} from tocsin_runs
             where bench_landed_at is not null and {}",
            ms("scheduled_at"),
            ms("finished_at"),
            ms("bench_landed_at"),
            in_window(from, to),
        );
        let out = self.query(&sql)?;
        out.lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let f: Vec<&str> = l.split('|').collect();
                let [job_id, scheduled, status, attempt, finished, landed] = f[..] else {
                    bail!("unexpected row from psql: {l:?}");
                };
                let n = |s: &str| {
                    s.parse::<i64>()
                        .with_context(|| format!("not a number in row {l:?}"))
                };
                Ok(Landed {
                    job_id: job_id.to_owned(),
                    scheduled_ms: n(scheduled)?,
                    status: status.to_owned(),
                    attempt: n(attempt)?,
                    finished_ms: n(finished)?,
                    landed_ms: n(landed)?,
                })
            })
            .collect()
    }

    /// Waits until `want` rows scheduled in `[from, to)` have landed, or `limit` passes.
    pub fn wait_landed(&self, want: usize, from: i64, to: i64, limit: Duration) -> Result<()> {
        let sql = format!(
            "set time zone 'UTC'; select count(*) from tocsin_runs where bench_landed_at is not null
               and {}",
            in_window(from, to)
        );
        let started = Instant::now();
        loop {
            let out = self.query(&sql)?;
            let got: usize = out
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .next()
                .with_context(|| format!("no count in {out:?}"))?;
            if got >= want {
                return Ok(());
            }
            if started.elapsed() > limit {
                tracing::warn!(got, want, "not every finished run landed in time");
                return Ok(());
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// Rows scheduled in `[from, to)` (epoch ms); `scheduled_at` is a timestamp without time zone in
/// UTC (the sink's `use.time.zone`), so the session's zone must be UTC.
fn in_window(from: i64, to: i64) -> String {
    format!(
        "scheduled_at >= to_timestamp({from} / 1000.0) and scheduled_at < to_timestamp({to} / 1000.0)"
    )
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Err(e) = self.script("stop") {
            tracing::warn!(error = %e, "could not stop the history sink");
        }
        if let Some((server, _)) = self.url.rsplit_once('/') {
            let drop = format!("drop database if exists {} with (force)", self.database);
            if let Err(e) = Self::psql(&format!("{server}/postgres"), &drop) {
                tracing::warn!(database = %self.database, error = %e, "could not drop the database");
            }
        }
        // The sink's consumer group, so the broker keeps no trace.
        let group = tocsin::history::sink_group(&self.prefix);
        let config = Config {
            bootstrap: self.bootstrap.clone(),
            ..Config::default()
        };
        let deleted = std::thread::spawn(move || -> Result<()> {
            let admin = tocsin::kafka::admin::Admin::new(&config)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(admin.delete_groups(&[group.as_str()]))?;
            Ok(())
        })
        .join();
        if !matches!(deleted, Ok(Ok(()))) {
            tracing::warn!("could not delete the sink's consumer group");
        }
    }
}
