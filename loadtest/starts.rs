//! `steady --worker`: a worker in this process executes every lane run with a handler that only
//! notes when it started, so the report can say how late handlers start (a run fired ahead by
//! the scheduler's lookahead waits in the worker until its instant).

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use futures::future::BoxFuture;
use tocsin::config::Config;
use tocsin::model::records::Run;
use tocsin::worker::{Handler, HandlerResult, WorkerOptions};
use tokio_util::sync::CancellationToken;

use crate::load::job_index;
use crate::now_ms;

/// One handler start.
#[derive(Debug, Clone, Copy)]
pub struct Start {
    pub job: u32,
    pub scheduled_ms: i64,
    pub attempt: u32,
    pub started_ms: i64,
}

/// The handler the load test's jobs name (`custom`, target `loadtest`).
struct Note(Arc<Mutex<Vec<Start>>>);

impl Handler for Note {
    fn call<'a>(&'a self, run: &'a Run) -> BoxFuture<'a, HandlerResult> {
        let started_ms = now_ms();
        if let Some(job) = job_index(&run.job_id) {
            self.0.lock().unwrap().push(Start {
                job,
                scheduled_ms: run.scheduled_ms,
                attempt: run.attempt,
                started_ms,
            });
        }
        Box::pin(async {
            HandlerResult::Succeeded {
                output: String::new(),
            }
        })
    }
}

pub struct Starts {
    stop: CancellationToken,
    thread: Option<JoinHandle<Result<()>>>,
    seen: Arc<Mutex<Vec<Start>>>,
}

impl Starts {
    /// Starts a worker of every lane of `config`'s fleet, on a runtime of its own.
    pub fn start(config: &Config) -> Result<Starts> {
        let mut config = config.clone();
        config.worker.lanes = vec!["*".into()];
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut opts = WorkerOptions::new("loadtest-w1");
        opts.custom
            .insert("loadtest".into(), Arc::new(Note(seen.clone())));
        let stop = CancellationToken::new();
        let token = stop.clone();
        let thread = std::thread::Builder::new()
            .name("loadtest-worker".into())
            .spawn(move || -> Result<()> {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?;
                rt.block_on(tocsin::worker::run(
                    config,
                    opts,
                    tocsin::node::system_clock(),
                    token,
                ))
                .context("the load test's worker failed")
            })?;
        Ok(Starts {
            stop,
            thread: Some(thread),
            seen,
        })
    }

    /// Stops the worker and returns every handler start it saw.
    pub fn finish(mut self) -> Result<Vec<Start>> {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            t.join()
                .map_err(|_| anyhow::anyhow!("the load test's worker panicked"))??;
        }
        Ok(std::mem::take(&mut *self.seen.lock().unwrap()))
    }
}

impl Drop for Starts {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The first start of each first attempt scheduled in `[from, to)`, as lag from its instant.
pub fn start_lags(starts: &[Start], from: i64, to: i64) -> Vec<i64> {
    let mut first: std::collections::HashMap<(u32, i64), i64> = Default::default();
    for s in starts {
        if s.attempt == 1 && (from..to).contains(&s.scheduled_ms) {
            let e = first.entry((s.job, s.scheduled_ms)).or_insert(s.started_ms);
            *e = (*e).min(s.started_ms);
        }
    }
    first
        .into_iter()
        .map(|((_, scheduled), started)| started - scheduled)
        .collect()
}
