//! Putting many job definitions on `jobs` fast (one idempotent producer, many in flight), and
//! waiting until the scheduler fleet has indexed them (its committed `jobs` offsets reach the
//! ends the producer was acknowledged).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tocsin::codec::{self, Framing};
use tocsin::config::Config;
use tocsin::model::job::{HandlerKind, HandlerSpec, JobDefinition, RetryPolicy, ScheduleSpec};

/// Job ids are `lt-<index>`: the audit maps a run back to its job by the index.
pub fn job_id(index: u64) -> String {
    format!("lt-{index}")
}

pub fn job_index(id: &str) -> Option<u32> {
    id.strip_prefix("lt-")?.parse().ok()
}

/// A job with a `kafka` handler whose payload has `payload_bytes` bytes.
pub fn job(
    index: u64,
    tenant: &str,
    schedule: ScheduleSpec,
    payload_bytes: usize,
) -> JobDefinition {
    JobDefinition {
        id: job_id(index),
        tenant: tenant.to_owned(),
        schedule,
        start_ms: None,
        end_ms: None,
        max_fires: None,
        jitter_ms: 0,
        dst_gap: Default::default(),
        dst_repeat: Default::default(),
        misfire: Default::default(),
        catch_up_window_ms: 3_600_000,
        overlap: Default::default(),
        paused: false,
        // A handler whose runs go to the tenant's lane, which the audit reads (a `kafka` job
        // would be delivered to its target by the scheduler itself: `delay` measures that).
        handler: HandlerSpec {
            kind: HandlerKind::Custom,
            target: "loadtest".into(),
            payload: vec![b'x'; payload_bytes],
            headers: Default::default(),
            method: None,
            args: vec![],
        },
        timeout_ms: 60_000,
        retry: RetryPolicy::default(),
        labels: Default::default(),
        revision: 0,
    }
}

#[derive(Default)]
struct Acks {
    /// Highest acknowledged offset per partition.
    last: Mutex<HashMap<i32, i64>>,
    failed: Mutex<Option<String>>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                let mut last = self.last.lock().unwrap();
                let e = last.entry(m.partition()).or_insert(-1);
                *e = (*e).max(m.offset());
            }
            Err((e, _)) => {
                self.failed
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// What a bulk load did.
pub struct Loaded {
    pub started: Instant,
    pub produce_s: f64,
    /// The end offset of each partition of `jobs` the load wrote to.
    pub ends: BTreeMap<i32, i64>,
}

/// Produces `n` definitions made by `make(i)` for i in `from..from + n`.
pub fn put_jobs(
    config: &Config,
    from: u64,
    n: u64,
    make: &dyn Fn(u64) -> JobDefinition,
) -> Result<Loaded> {
    let mut pc = tocsin::kafka::producer_config(config);
    pc.set("client.id", "tocsin-loadtest-jobs");
    pc.set("linger.ms", "20");
    pc.set("queue.buffering.max.messages", "1000000");
    pc.set("queue.buffering.max.kbytes", "1048576");
    let producer: ThreadedProducer<Acks> = pc
        .create_with_context(Acks::default())
        .context("could not create the jobs producer")?;
    let topic = config.topic("jobs");
    let started = Instant::now();
    let mut buf = Vec::with_capacity(512);
    for i in from..from + n {
        let def = make(i);
        buf.clear();
        codec::encode_into(&def, &Framing::SingleObject, &mut buf);
        let mut record = BaseRecord::to(&topic)
            .key(def.id.as_bytes())
            .payload(&buf[..]);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => bail!("could not produce job {}: {e}", def.id),
            }
        }
        if let Some(e) = producer.context().failed.lock().unwrap().take() {
            bail!("a job definition was not delivered: {e}");
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("job definitions were not all delivered within 120 s")?;
    if let Some(e) = producer.context().failed.lock().unwrap().take() {
        bail!("a job definition was not delivered: {e}");
    }
    let produce_s = started.elapsed().as_secs_f64();
    let ends = producer
        .context()
        .last
        .lock()
        .unwrap()
        .iter()
        .map(|(p, o)| (*p, o + 1))
        .collect();
    Ok(Loaded {
        started,
        produce_s,
        ends,
    })
}

/// Waits until the scheduler group's committed `jobs` offsets reach `ends`: every definition
/// loaded is in a timer. Returns the instant that was first seen true.
pub fn wait_indexed(
    config: &Config,
    ends: &BTreeMap<i32, i64>,
    limit: Duration,
) -> Result<Instant> {
    let mut cc = tocsin::kafka::consumer_config(config, &config.scheduler.group_id);
    cc.set("client.id", "tocsin-loadtest-offsets");
    // The committed offsets as they stand, without waiting out the transactional offset
    // commit the scheduler has pending at almost every instant (read_committed would ask
    // for stable offsets and retry while one is pending).
    cc.set("isolation.level", "read_uncommitted");
    let consumer: BaseConsumer = cc.create().context("could not create the offsets reader")?;
    let topic = config.topic("jobs");
    let started = Instant::now();
    let mut pending: BTreeMap<i32, i64> = ends.clone();
    let mut last_error = None;
    while !pending.is_empty() {
        let mut tpl = TopicPartitionList::new();
        for p in pending.keys() {
            tpl.add_partition(&topic, *p);
        }
        match consumer.committed_offsets(tpl, Duration::from_secs(10)) {
            Ok(committed) => {
                for e in committed.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        if pending.get(&e.partition()).is_some_and(|end| o >= *end) {
                            pending.remove(&e.partition());
                        }
                    }
                }
            }
            Err(e) => last_error = Some(e.to_string()),
        }
        if pending.is_empty() {
            break;
        }
        if started.elapsed() > limit {
            bail!(
                "{} partitions of {topic} not indexed after {limit:?} (last error: {})",
                pending.len(),
                last_error.as_deref().unwrap_or("none")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Instant::now())
}
