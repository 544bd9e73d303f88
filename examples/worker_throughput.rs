//! How many runs per second one worker executes with a handler that answers at once: `kafka`
//! (into a sink topic), `http` (a local server answering 200 at once, over kept-alive
//! connections) or `exec` (`/bin/true`). Against a real broker, with the worker's defaults.
//!
//! ```sh
//! cargo run --release --example worker_throughput -- --bootstrap 127.0.0.1:9092 --kind kafka --runs 50000
//! ```
//!
//! The lanes of a few tenants are filled with runs before the worker starts; the rate is taken
//! from the first finished run to the last (so the group join is left out), and again to the
//! moment the worker committed every lane offset (every report acknowledged). The topics are
//! deleted at the end.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::TopicPartitionList;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use tocsin::codec::{self, Framing};
use tocsin::config::Config;
use tocsin::kafka::admin::{fleet_topics, lane_topic, Admin, Cleanup, TopicSpec};
use tocsin::model::job::{HandlerKind, HandlerSpec, RetryPolicy};
use tocsin::model::records::{run_id, FireReason, Run};
use tocsin::worker::{self, Finished, HandlerResult, WorkerOptions};

#[derive(Parser)]
struct Args {
    #[arg(long, env = "TOCSIN_TEST_BOOTSTRAP", default_value = "127.0.0.1:9092")]
    bootstrap: String,
    /// kafka, http or exec.
    #[arg(long, default_value = "kafka")]
    kind: String,
    #[arg(long, default_value_t = 20_000)]
    runs: usize,
    #[arg(long, default_value_t = 4)]
    tenants: usize,
    /// Overrides worker.concurrency (default: the worker's default).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Overrides worker.per_tenant_concurrency (default: the worker's default).
    #[arg(long)]
    per_tenant_concurrency: Option<usize>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Answers every request with 200 at once, keeping connections open.
async fn http_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                loop {
                    // Answer each complete request in the buffer.
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() < end + 4 + length {
                            break;
                        }
                        buf.drain(..end + 4 + length);
                        if stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    url
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let mut config = Config {
        bootstrap: args.bootstrap.clone(),
        topic_prefix: format!("bench{}-{}.", std::process::id(), nanos % 1_000_000_000),
        ..Config::default()
    };
    config.topics.job_partitions = 8;
    config.topics.lane_partitions = 4;
    config.topics.runs_partitions = 4;
    config.topics.dead_partitions = 1;
    config.topics.rejected_partitions = 1;
    config.topics.replication_factor = 1;
    let data = tempfile::tempdir().unwrap();
    config.worker.data_dir = data.path().to_owned();
    if let Some(c) = args.concurrency {
        config.worker.concurrency = c;
    }
    if let Some(c) = args.per_tenant_concurrency {
        config.worker.per_tenant_concurrency = c;
    }

    // Outside the prefix: every topic under it is Tocsin's, and a kafka run may not write there.
    let sink = format!("{}-sink", config.topic_prefix.trim_end_matches('.'));
    let handler = match args.kind.as_str() {
        "kafka" => HandlerSpec {
            kind: HandlerKind::Kafka,
            target: sink.clone(),
            payload: b"bench".to_vec(),
            headers: Default::default(),
            method: None,
            args: vec![],
        },
        "http" => {
            let url = http_server().await;
            config.worker.http.allow_hosts = vec!["127.0.0.1".into()];
            HandlerSpec {
                kind: HandlerKind::Http,
                target: url,
                payload: b"{}".to_vec(),
                headers: Default::default(),
                method: Some("POST".into()),
                args: vec![],
            }
        }
        "exec" => {
            config.worker.exec.enabled = true;
            config.worker.exec.allow = vec!["/bin/true".into()];
            HandlerSpec {
                kind: HandlerKind::Exec,
                target: "/bin/true".into(),
                payload: vec![],
                headers: Default::default(),
                method: None,
                args: vec![],
            }
        }
        other => panic!("unknown handler kind {other:?}: kafka, http or exec"),
    };
    config.validate().unwrap();

    let tenants: Vec<String> = (0..args.tenants).map(|t| format!("tenant{t}")).collect();
    let admin = Admin::new(&config).unwrap();
    let mut topics = fleet_topics(&config);
    topics.extend(tenants.iter().map(|t| lane_topic(&config, t)));
    topics.push(TopicSpec {
        name: sink.clone(),
        partitions: 4,
        cleanup: Cleanup::Delete,
    });
    admin.ensure(&topics).await.unwrap();

    // Fill the lanes.
    let producer: FutureProducer = tocsin::kafka::producer_config(&config).create().unwrap();
    let at = now_ms();
    let mut deliveries = Vec::with_capacity(args.runs);
    for i in 0..args.runs {
        let tenant = &tenants[i % tenants.len()];
        let id = format!("b-{i}");
        let run = Run {
            run_id: run_id(&id, at),
            job_id: id.clone(),
            tenant: tenant.clone(),
            scheduled_ms: at,
            fire_ms: at,
            attempt: 1,
            reason: FireReason::Schedule,
            handler: handler.clone(),
            timeout_ms: 30_000,
            retry: RetryPolicy::default(),
            labels: Default::default(),
        };
        let value = codec::encode(&run, &Framing::SingleObject);
        let lane = config.lane_topic(tenant);
        loop {
            match producer.send_result(FutureRecord::to(&lane).key(&id).payload(&value)) {
                Ok(d) => {
                    deliveries.push(d);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
    for d in deliveries {
        d.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    eprintln!(
        "{} runs queued on {} lanes; handler {}; concurrency {}, per tenant {}",
        args.runs,
        tenants.len(),
        args.kind,
        config.worker.concurrency,
        config.worker.per_tenant_concurrency
    );

    // The worker, counting finished runs.
    let count = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let first: Arc<Mutex<Option<Instant>>> = Arc::default();
    let last: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut opts = WorkerOptions::new("bench");
    let runs = args.runs;
    {
        let (count, failed, first, last) =
            (count.clone(), failed.clone(), first.clone(), last.clone());
        opts.on_finished = Some(Arc::new(move |f: &Finished| {
            if let HandlerResult::Failed { error, .. } = &f.result {
                if failed.fetch_add(1, Ordering::Relaxed) < 3 {
                    eprintln!("run failed: {error}");
                }
            }
            let n = count.fetch_add(1, Ordering::Relaxed) + 1;
            if n == 1 {
                *first.lock().unwrap() = Some(Instant::now());
            }
            if n == runs {
                *last.lock().unwrap() = Some(Instant::now());
            }
        }));
    }
    let shutdown = CancellationToken::new();
    let work = tokio::spawn(worker::run(
        config.clone(),
        opts,
        Arc::new(now_ms),
        shutdown.clone(),
    ));

    let deadline = Instant::now() + Duration::from_secs(600);
    while count.load(Ordering::Relaxed) < runs {
        assert!(
            Instant::now() < deadline,
            "only {} runs finished",
            count.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t0 = first.lock().unwrap().unwrap();
    let finished_in = last.lock().unwrap().unwrap() - t0;

    // Until the worker's group committed the end of every lane partition.
    let group = format!("tocsin-worker-{}", config.worker.pool);
    let reader: BaseConsumer = tocsin::kafka::consumer_config(&config, &group)
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for t in &tenants {
        for p in 0..config.topics.lane_partitions as i32 {
            tpl.add_partition(&config.lane_topic(t), p);
        }
    }
    let committed_in = loop {
        let c = tokio::task::block_in_place(|| {
            reader.committed_offsets(tpl.clone(), Duration::from_secs(5))
        });
        let total: i64 = c
            .map(|c| {
                c.elements()
                    .iter()
                    .filter_map(|e| e.offset().to_raw())
                    .filter(|o| *o > 0)
                    .sum()
            })
            .unwrap_or(0);
        if total as usize >= runs {
            break Some(t0.elapsed());
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    shutdown.cancel();
    work.await.unwrap().unwrap();

    let rate = |d: Duration| (runs - 1) as f64 / d.as_secs_f64();
    println!(
        "{}: {} runs ({} failed), finished in {:.2} s = {:.0} runs/s; all lane offsets committed \
         after {} = {}",
        args.kind,
        runs,
        failed.load(Ordering::Relaxed),
        finished_in.as_secs_f64(),
        rate(finished_in),
        committed_in.map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64())),
        committed_in.map_or("-".into(), |d| format!("{:.0} runs/s", rate(d))),
    );
    // The prefix's topics and the sink beside them.
    let _ = admin
        .delete_prefixed(config.topic_prefix.trim_end_matches('.'))
        .await;
}
