//! The replay of `timers` into the store for the partitions a node restores: its own
//! `read_committed` consumer, assigned each restoring partition from its checkpoint, and the
//! barriers it reads back, which hand a partition to its lifecycle (`lifecycle`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt};
use rdkafka::consumer::Consumer;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, warn};

use super::fire;
use super::ingest::Schedules;
use super::lifecycle::{Action, Event, Lifecycle};
use super::store::{Checkpoint, Store};
use super::SchedulerError;
use crate::codec;
use crate::config::Config;
use crate::kafka::client::{NodeConsumer, NodeContext};
use crate::model::records::TimerState;

/// Keys on `timers` that start with 0x00 are restore barriers, never job ids (validation
/// rejects control characters in ids).
pub const BARRIER_PREFIX: &[u8] = b"\0barrier/";
/// The header of a `timers` record that holds its transaction's progress sequence
/// (`progress`); a record without it (written before Tocsin kept progress) counts as 0.
pub const SEQ_HEADER: &str = "tocsin-seq";
/// Most records one replay step applies, and how long it may take.
const STEP_RECORDS: usize = 50_000;
const STEP_TIME: Duration = Duration::from_millis(100);

/// The restore consumer of `timers`.
pub struct Replay {
    consumer: NodeConsumer,
    timers: String,
}

impl Replay {
    pub fn new(config: &Config, node_id: &str, timers: &str) -> Result<Replay, SchedulerError> {
        let mut rc = crate::kafka::consumer_config(config, "tocsin-restore-unused");
        rc.set("client.id", format!("tocsin-restore-{node_id}"));
        rc.set("fetch.wait.max.ms", "50");
        Ok(Replay {
            consumer: rc.create_with_context(NodeContext)?,
            timers: timers.to_owned(),
        })
    }

    /// Starts replaying `p` from `from`.
    pub fn assign(&self, p: i32, from: Offset) {
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl.add_partition_offset(&self.timers, p, from) {
            error!(partition = p, error = %e, "bad restore offset");
        }
        if let Err(e) = self.consumer.incremental_assign(&tpl) {
            error!(partition = p, error = %e, "could not assign timers partition for restore");
        }
    }

    /// Stops replaying `p`.
    pub fn unassign(&self, p: i32) -> Result<(), SchedulerError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&self.timers, p);
        self.consumer.incremental_unassign(&tpl)?;
        Ok(())
    }

    /// The first and the last stable offset of `timers` in each of `partitions`, in one
    /// request for each end, not one round trip per partition: a node given back hundreds of
    /// partitions (a zombie's return, a restart) would otherwise spend seconds on them before
    /// restoring any. A partition whose offsets could not be had is left out.
    pub fn bounds(&self, partitions: &[i32]) -> HashMap<i32, (i64, i64)> {
        if partitions.is_empty() {
            return HashMap::new();
        }
        let ask = |at: Offset| -> Option<TopicPartitionList> {
            let mut tpl = TopicPartitionList::new();
            for p in partitions {
                tpl.add_partition_offset(&self.timers, *p, at).ok()?;
            }
            // For a `read_committed` client "latest" is the last stable offset.
            match self
                .consumer
                .offsets_for_times(tpl, Duration::from_secs(10))
            {
                Ok(answer) => Some(answer),
                Err(e) => {
                    warn!(error = %e, partitions = partitions.len(), "could not list the timers offsets; restoring from the beginning");
                    None
                }
            }
        };
        let (Some(low), Some(high)) = (ask(Offset::Beginning), ask(Offset::End)) else {
            return HashMap::new();
        };
        (low.elements_for_topic(&self.timers).iter())
            .filter_map(|e| {
                let l = e
                    .offset()
                    .to_raw()
                    .filter(|o| *o >= 0 && e.error().is_ok())?;
                let h = (high.find_partition(&self.timers, e.partition()))
                    .filter(|h| h.error().is_ok())?
                    .offset()
                    .to_raw()
                    .filter(|o| *o >= 0)?;
                Some((e.partition(), (l, h)))
            })
            .collect()
    }

    /// One step of the replay (at most `STEP_RECORDS`, or `STEP_TIME`): applies the `timers`
    /// records of the partitions still restoring in `parts` to the store (forgetting the
    /// parsed schedules of the jobs they change), checkpoints each partition read, and tells
    /// each lifecycle the barriers read back. Returns the partitions whose barrier came back,
    /// with the records consumed for them meanwhile, to activate in this order. `now` stamps
    /// the checkpoints.
    pub fn step(
        &self,
        store: &Store,
        parts: &mut BTreeMap<i32, Lifecycle<OwnedMessage>>,
        schedules: &mut Schedules,
        now: i64,
    ) -> Result<Vec<(i32, Vec<OwnedMessage>)>, SchedulerError> {
        let mut done = Vec::new();
        let mut batch = store.batch();
        let mut overlay: HashMap<(i32, String), Option<i64>> = HashMap::new();
        let mut checkpoints: HashMap<i32, i64> = HashMap::new();
        let started = Instant::now();
        let mut n = 0;
        while n < STEP_RECORDS && started.elapsed() < STEP_TIME {
            let wait = Duration::from_millis(if n == 0 { 20 } else { 0 });
            let Some(m) = self.consumer.poll(wait) else {
                break;
            };
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    crate::kafka::client::report(&e, "restore consumer");
                    break;
                }
            };
            n += 1;
            let p = m.partition();
            checkpoints.insert(p, m.offset() + 1);
            let Some(part) = parts.get_mut(&p).filter(|part| !part.is_active()) else {
                continue;
            };
            let key = m.key().unwrap_or_default();
            if let Some(owner) = key.strip_prefix(BARRIER_PREFIX) {
                let owner = String::from_utf8_lossy(owner);
                let read = Event::BarrierRead {
                    owner: &owner,
                    token: m.payload().unwrap_or_default(),
                };
                if let Some(Action::Activate { buffered }) = part.on(read) {
                    done.push((p, buffered));
                }
                continue;
            }
            let job = String::from_utf8_lossy(key).into_owned();
            schedules.forget(&job);
            let old_wake = match overlay.get(&(p, job.clone())) {
                Some(w) => *w,
                None => store
                    .timer(p as u16, &job)?
                    .as_ref()
                    .and_then(fire::wake_at),
            };
            match m.payload() {
                None => {
                    batch.delete_timer(store, p as u16, &job, old_wake);
                    overlay.insert((p, job), None);
                }
                Some(bytes) => match codec::decode::<TimerState>(bytes) {
                    Ok(state) => {
                        let wake = fire::wake_at(&state);
                        let seq = record_seq(&m);
                        batch.put_timer(store, p as u16, &state, bytes, seq, old_wake, wake);
                        overlay.insert((p, job), wake);
                    }
                    Err(e) => error!(partition = p, offset = m.offset(), job = %job, error = %e,
                        "undecodable timer state on the changelog; skipped"),
                },
            }
        }
        for (p, offset) in checkpoints {
            let checkpoint = Checkpoint {
                offset,
                written_ms: now,
            };
            batch.set_checkpoint(store, p as u16, checkpoint);
        }
        store.write(batch)?;
        Ok(done)
    }
}

/// The progress sequence a `timers` record was written with (`SEQ_HEADER`; 0 without it).
fn record_seq(m: &impl Message) -> u64 {
    use rdkafka::message::Headers;
    m.headers()
        .and_then(|hs| {
            hs.iter()
                .find(|h| h.key == SEQ_HEADER)
                .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse().ok())
        })
        .unwrap_or(0)
}
