//! The raw transactional produce baseline: the records a fire writes (the `Run` to its lane, the
//! `fired` `RunEvent` to `runs`, the new `TimerState` to `timers`), already encoded, produced
//! by one transactional producer with the scheduler's settings and transaction size, to topics
//! of the same partition counts and cleanup policies on the same broker. No scheduling work:
//! this is what the broker and client can do, so fires/s over it is the scheduler's efficiency.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tocsin::codec::{self, Framing};
use tocsin::config::Config;
use tocsin::kafka::admin::{Admin, Cleanup, TopicSpec};
use tocsin::model::job::JobDefinition;
use tocsin::model::records::{run_id, FireReason, Run, RunEvent, RunEventKind, TimerState};

pub struct Baseline {
    /// Fires (record triples) per second.
    pub per_s: f64,
    pub fires: u64,
    pub secs: f64,
}

struct Fire {
    key: Vec<u8>,
    run: Vec<u8>,
    run_headers: OwnedHeaders,
    event_key: Vec<u8>,
    event: Vec<u8>,
    timer: Vec<u8>,
}

/// Produces `fires` fires of jobs made by `make(i)` (cycling over at most 50,000 distinct jobs
/// of `0..jobs`) in transactions of `config.scheduler.max_runs_per_transaction` fires.
pub fn run(
    rt: &tokio::runtime::Runtime,
    config: &Config,
    fires: u64,
    jobs: u64,
    make: &dyn Fn(u64) -> JobDefinition,
) -> Result<Baseline> {
    let t = &config.topics;
    let spec = |name: &str, partitions, cleanup| TopicSpec {
        name: config.topic(name),
        partitions,
        cleanup,
    };
    let lane = spec("baseline.lane", t.lane_partitions, Cleanup::Delete);
    let runs = spec("baseline.runs", t.runs_partitions, Cleanup::Delete);
    let timers = spec("baseline.timers", t.job_partitions, Cleanup::Compact);
    let admin = Admin::new(config)?;
    rt.block_on(admin.ensure(&[lane.clone(), runs.clone(), timers.clone()]))
        .context("could not create the baseline topics")?;

    let now = crate::now_ms();
    let distinct = jobs.clamp(1, 50_000);
    let prepared: Vec<Fire> = (0..distinct).map(|i| prepare(&make(i), now)).collect();

    let mut pc = tocsin::kafka::producer_config(config);
    // As the scheduler's producer (engine.rs `new_producer`).
    pc.set("client.id", "tocsin-loadtest-baseline");
    pc.set(
        "transactional.id",
        format!("{}loadtest.baseline", config.topic_prefix),
    );
    // Not the scheduler's transaction timeout (which also bounds how long librdkafka waits
    // for a record): a broker busy creating this run's thousands of partitions can hold a
    // produce for longer, and the baseline measures that wait instead of failing on it.
    pc.set("transaction.timeout.ms", "60000");
    pc.set("queue.buffering.max.messages", "2000000");
    pc.set("queue.buffering.max.kbytes", "2097151");
    let producer: BaseProducer = pc
        .create()
        .context("could not create the baseline producer")?;
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout)?;

    // Untimed warm-up: one transaction writing to every partition of `runs` and `timers`, so
    // freshly created partitions (their leaders, their first segments) are not measured. The
    // lane is left out: the audit counts its records.
    // Retried, since on a busy broker the first writes to new partitions can outlast the
    // transaction timeout.
    let mut attempt = 0;
    loop {
        attempt += 1;
        producer.begin_transaction()?;
        let f = &prepared[0];
        for (topic, payload) in [(&runs, &f.event), (&timers, &f.timer)] {
            for p in 0..topic.partitions as i32 {
                send(
                    &producer,
                    BaseRecord::to(&topic.name)
                        .partition(p)
                        .key(&f.key[..])
                        .payload(&payload[..]),
                )?;
            }
        }
        match producer.commit_transaction(timeout) {
            Ok(()) => break,
            Err(e) if attempt < 5 => {
                tracing::warn!(error = %e, attempt, "baseline warm-up did not commit; again");
                let abortable = matches!(&e, KafkaError::Transaction(t) if t.txn_requires_abort());
                if abortable {
                    producer.abort_transaction(timeout)?;
                }
            }
            Err(e) => return Err(e).context("the baseline warm-up never committed"),
        }
    }

    let per_txn = config.scheduler.max_runs_per_transaction as u64;
    let started = Instant::now();
    let mut done = 0u64;
    while done < fires {
        producer.begin_transaction()?;
        let n = per_txn.min(fires - done);
        for i in done..done + n {
            let f = &prepared[(i % distinct) as usize];
            send(
                &producer,
                BaseRecord::to(&lane.name)
                    .key(&f.key[..])
                    .payload(&f.run[..])
                    .headers(f.run_headers.clone()),
            )?;
            send(
                &producer,
                BaseRecord::to(&runs.name)
                    .key(&f.event_key[..])
                    .payload(&f.event[..]),
            )?;
            send(
                &producer,
                BaseRecord::to(&timers.name)
                    .key(&f.key[..])
                    .payload(&f.timer[..]),
            )?;
        }
        producer
            .commit_transaction(timeout)
            .context("baseline transaction did not commit")?;
        done += n;
    }
    let secs = started.elapsed().as_secs_f64();
    Ok(Baseline {
        per_s: fires as f64 / secs,
        fires,
        secs,
    })
}

fn send(producer: &BaseProducer, mut record: BaseRecord<'_, [u8], [u8]>) -> Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(1));
            }
            Err((e, _)) => bail!("baseline produce failed: {e}"),
        }
    }
}

/// The three records of one fire of `def`, as the scheduler builds them.
fn prepare(def: &JobDefinition, now: i64) -> Fire {
    let scheduled_ms = now / 1000 * 1000;
    let id = run_id(&def.id, scheduled_ms);
    let run = Run {
        run_id: id.clone(),
        job_id: def.id.clone(),
        tenant: def.tenant.clone(),
        scheduled_ms,
        fire_ms: now,
        attempt: 1,
        reason: FireReason::Schedule,
        handler: def.handler.clone(),
        timeout_ms: def.timeout_ms,
        retry: def.retry,
        labels: def.labels.clone(),
    };
    let event = RunEvent {
        run_id: id.clone(),
        job_id: def.id.clone(),
        tenant: def.tenant.clone(),
        scheduled_ms,
        attempt: 1,
        kind: RunEventKind::Fired,
        at_ms: now,
        node: "n1".into(),
        error: None,
        duration_ms: None,
    };
    let timer = TimerState {
        definition: def.clone(),
        next_fire_ms: Some(scheduled_ms + 10_000),
        fires: 1,
        last_scheduled_ms: Some(scheduled_ms),
        in_flight: None,
        buffered_ms: None,
        pending: Vec::new(),
    };
    let values = [
        ("tocsin-run-id", id.clone()),
        ("tocsin-scheduled-ms", scheduled_ms.to_string()),
        ("tocsin-fire-ms", now.to_string()),
        ("tocsin-attempt", "1".to_owned()),
        ("tocsin-partition", "0".to_owned()),
        ("tocsin-assignment-epoch", "1".to_owned()),
    ];
    let run_headers = values
        .iter()
        .fold(OwnedHeaders::new_with_capacity(6), |hs, (key, value)| {
            hs.insert(Header {
                key,
                value: Some(value.as_bytes()),
            })
        });
    Fire {
        key: def.id.clone().into_bytes(),
        run: codec::encode(&run, &Framing::SingleObject),
        run_headers,
        event_key: id.into_bytes(),
        event: codec::encode(&event, &Framing::SingleObject),
        timer: codec::encode(&timer, &Framing::SingleObject),
    }
}
