//! The raw transactional produce baseline: the records a plain fire writes (the `Run` to its
//! lane, with its headers, and the `fired` `RunEvent` to `runs`, built by the engine's own
//! `scheduler::lane`), already encoded, produced by one transactional producer with the
//! scheduler's settings and transaction size, to topics of the same partition counts on the
//! same broker. A plain fire writes nothing to `timers` (its progress rides on the offset
//! commit), so neither does the baseline. No scheduling work: this is what the broker and
//! client can do with the engine's records, so fires/s over it is the scheduler's efficiency.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tocsin::config::Config;
use tocsin::kafka::admin::{Admin, Cleanup, TopicSpec};
use tocsin::model::job::JobDefinition;
use tocsin::model::records::FireReason;
use tocsin::scheduler::lane::{self, LaneRecords};

pub struct Baseline {
    /// Fires (record pairs) per second.
    pub per_s: f64,
    pub fires: u64,
    pub secs: f64,
    /// The mean size (key and value) of the records it wrote.
    pub record_bytes: usize,
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
    let admin = Admin::new(config)?;
    rt.block_on(admin.ensure(&[lane.clone(), runs.clone()]))
        .context("could not create the baseline topics")?;

    let now = crate::now_ms();
    let distinct = jobs.clamp(1, 50_000);
    let prepared: Vec<LaneRecords> = (0..distinct)
        .map(|i| prepare(config, &make(i), now))
        .collect();

    let mut pc = tocsin::kafka::producer_config(config);
    // As the scheduler's producer (scheduler/producer.rs `new_producer`).
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

    // Untimed warm-up: one transaction writing to every partition of `runs`, so
    // freshly created partitions (their leaders, their first segments) are not measured. The
    // lane is left out: the audit counts its records.
    // Retried, since on a busy broker the first writes to new partitions can outlast the
    // transaction timeout.
    let mut attempt = 0;
    loop {
        attempt += 1;
        producer.begin_transaction()?;
        let f = &prepared[0];
        for p in 0..runs.partitions as i32 {
            send(
                &producer,
                BaseRecord::to(&runs.name)
                    .partition(p)
                    .key(&f.key[..])
                    .payload(&f.event[..]),
            )?;
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
        }
        // As the scheduler's producer does: rust-rdkafka's own flush in `commit_transaction`
        // polls in whole 100 ms slices while anything is in flight.
        while producer.in_flight_count() > 0 {
            producer.poll(Duration::from_millis(1));
        }
        producer
            .commit_transaction(timeout)
            .context("baseline transaction did not commit")?;
        done += n;
    }
    let secs = started.elapsed().as_secs_f64();
    let bytes: usize = prepared
        .iter()
        .map(|f| f.key.len() + f.run.len() + f.event_key.len() + f.event.len())
        .sum();
    Ok(Baseline {
        per_s: fires as f64 / secs,
        fires,
        secs,
        record_bytes: bytes / (2 * prepared.len()),
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

/// The records of one plain fire of `def`, built by the scheduler's own builder.
fn prepare(config: &Config, def: &JobDefinition, now: i64) -> LaneRecords {
    let instance = lane::Instance {
        scheduled_ms: now / 1000 * 1000,
        attempt: 1,
        reason: FireReason::Schedule,
    };
    let fired = lane::Fired {
        fire_ms: now,
        not_before_ms: instance.scheduled_ms,
        partition: 0,
        assignment_epoch: 1,
        node: "n1",
    };
    lane::lane_records(def, instance, &fired, config.topics.serialization.runs)
}
