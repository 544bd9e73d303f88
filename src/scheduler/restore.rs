//! The replay of `timers` into the store for the partitions a node restores: its own
//! `read_committed` consumer, assigned each restoring partition from its checkpoint, read up to
//! a mark taken once the partition's committed offsets are in (`lifecycle`).
//!
//! **Why the mark is enough.** The mark is the partition's high watermark, listed after the
//! new owner's fetch of the committed `jobs` offset of the partition was answered. Every
//! transaction that writes `timers` p also commits an offset of `jobs` p (its progress), and:
//! - a transaction whose offset commit the coordinator accepted before the fetch and that is
//!   still open holds the fetch (`UNSTABLE_OFFSET_COMMIT`) until it ends, so when the fetch is
//!   answered it has committed or aborted, and its records (all acknowledged before it
//!   commits) lie below the mark;
//! - a transaction that has not sent its offsets yet belongs to a node that no longer owns p:
//!   its member epoch is stale, so its offset commit is refused and it can only abort, and
//!   whatever it still writes, past the mark or not, is never read.
//!
//! So everything that will ever be committed to p by another node is below the mark, and a
//! `read_committed` reader whose position reaches the mark has seen each of those
//! transactions end. A doomed open transaction holds the reader short of the mark until it is
//! aborted: by the fence (`takeover`), or by the broker at the transaction timeout. The mark
//! replaced a barrier record written in a transaction of the new owner's and read back, which
//! proved the same at the cost of a transaction touching every partition restored (0.6–1.3 s
//! for 340 partitions on the dev machine, in the middle of every takeover); barriers written
//! by earlier versions are still read, for the previous owner they name.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use tracing::{error, warn};

use super::ingest::Schedules;
use super::lifecycle::{Action, Event, Lifecycle};
use super::store::{Checkpoint, Store};
use super::SchedulerError;
use crate::codec;
use crate::config::Config;
use crate::kafka::client::{NodeConsumer, NodeContext};
use crate::model::records::TimerState;

/// Keys on `timers` that start with 0x00 are restore barriers (written by earlier versions),
/// never job ids (validation rejects control characters in ids).
pub const BARRIER_PREFIX: &[u8] = b"\0barrier/";
/// The header of a `timers` record that holds its transaction's progress sequence
/// (`progress`); a record without it (written before Tocsin kept progress) counts as 0.
pub const SEQ_HEADER: &str = "tocsin-seq";
/// Most records one replay step applies, and how long it may take.
const STEP_RECORDS: usize = 50_000;
const STEP_TIME: Duration = Duration::from_millis(100);

/// Lists the high watermarks of `timers` that mark the replays' ends: a `read_uncommitted`
/// client, never assigned (a `read_committed` client lists the last stable offset instead,
/// which an open transaction holds back). Shared with the offset fetch's thread, which lists
/// the marks of the partitions it fetched as soon as the fetch is answered.
#[derive(Clone)]
pub struct Marker {
    ends: Arc<NodeConsumer>,
    timers: String,
}

/// A partition's mark: its first offset (if asked for) and its high watermark.
pub type Mark = (Option<i64>, i64);

impl Marker {
    /// The marks of `partitions`, each with whether its first offset is wanted too: one
    /// ListOffsets request for the high watermarks, and one more for the first offsets only if
    /// any is wanted. A partition the broker answered with an error is left out.
    pub fn list(&self, partitions: &[(i32, bool)]) -> Result<HashMap<i32, Mark>, KafkaError> {
        if partitions.is_empty() {
            return Ok(HashMap::new());
        }
        let all: Vec<i32> = partitions.iter().map(|(p, _)| *p).collect();
        let high = list_offsets(&self.ends, &self.timers, &all, Offset::End)?;
        let wanted: Vec<i32> = (partitions.iter())
            .filter(|(p, first)| *first && high.contains_key(p))
            .map(|(p, _)| *p)
            .collect();
        let first = match wanted.is_empty() {
            true => HashMap::new(),
            false => list_offsets(&self.ends, &self.timers, &wanted, Offset::Beginning)?,
        };
        Ok((partitions.iter())
            .filter_map(|(p, want_first)| {
                let first = match want_first {
                    true => Some(*first.get(p)?),
                    false => None,
                };
                Some((*p, (first, *high.get(p)?)))
            })
            .collect())
    }
}

/// The offset `client` lists at `at` (`Offset::Beginning`, `Offset::End`) for each of
/// `partitions` of `topic`, in one request; a partition answered with an error is left out.
fn list_offsets(
    client: &NodeConsumer,
    topic: &str,
    partitions: &[i32],
    at: Offset,
) -> Result<HashMap<i32, i64>, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition_offset(topic, *p, at)?;
    }
    let answer = client.offsets_for_times(tpl, Duration::from_secs(10))?;
    Ok((answer.elements_for_topic(topic).iter())
        .filter(|e| e.error().is_ok())
        .filter_map(|e| Some((e.partition(), e.offset().to_raw().filter(|o| *o >= 0)?)))
        .collect())
}

/// The restore consumer of `timers`.
pub struct Replay {
    consumer: NodeConsumer,
    marker: Marker,
    timers: String,
    /// Each partition replaying: where it started, and its mark once taken.
    replaying: HashMap<i32, Replaying>,
}

struct Replaying {
    /// The first offset to replay (`None`: the partition's first, as listed with the mark).
    from: Option<i64>,
    /// Once marked, (`start`, `end`): the replay began at `start`, and is complete once it
    /// has read up to `end`.
    mark: Option<(i64, i64)>,
}

/// Whether a replay that began at `start` has read up to `end`, its consumer's position
/// being `position` (`None`: nothing delivered yet). The position counts the transaction
/// markers and aborted records the consumer stepped over, not only the records it returned.
fn caught_up(start: i64, end: i64, position: Option<i64>) -> bool {
    end <= start || position.is_some_and(|o| o >= end)
}

impl Replay {
    pub fn new(config: &Config, node_id: &str, timers: &str) -> Result<Replay, SchedulerError> {
        let mut rc = crate::kafka::consumer_config(config, "tocsin-restore-unused");
        rc.set("client.id", format!("tocsin-restore-{node_id}"));
        rc.set("fetch.wait.max.ms", "50");
        let mut ec = crate::kafka::consumer_config(config, "tocsin-restore-unused");
        ec.set("client.id", format!("tocsin-restore-ends-{node_id}"));
        ec.set("isolation.level", "read_uncommitted");
        Ok(Replay {
            consumer: rc.create_with_context(NodeContext)?,
            marker: Marker {
                ends: Arc::new(ec.create_with_context(NodeContext)?),
                timers: timers.to_owned(),
            },
            timers: timers.to_owned(),
            replaying: HashMap::new(),
        })
    }

    /// Starts replaying `p` from `from`.
    pub fn assign(&mut self, p: i32, from: Offset) {
        let from_offset = match from {
            Offset::Offset(o) => Some(o),
            _ => None,
        };
        self.replaying.insert(
            p,
            Replaying {
                from: from_offset,
                mark: None,
            },
        );
        let mut tpl = TopicPartitionList::new();
        if let Err(e) = tpl.add_partition_offset(&self.timers, p, from) {
            error!(partition = p, error = %e, "bad restore offset");
        }
        if let Err(e) = self.consumer.incremental_assign(&tpl) {
            error!(partition = p, error = %e, "could not assign timers partition for restore");
        }
    }

    /// Stops replaying `p`.
    pub fn unassign(&mut self, p: i32) -> Result<(), SchedulerError> {
        self.replaying.remove(&p);
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
        // For a `read_committed` client "latest" is the last stable offset.
        let listed = list_offsets(&self.consumer, &self.timers, partitions, Offset::Beginning)
            .and_then(|low| {
                let high = list_offsets(&self.consumer, &self.timers, partitions, Offset::End)?;
                Ok((low, high))
            });
        match listed {
            Ok((low, high)) => (low.into_iter())
                .filter_map(|(p, l)| Some((p, (l, *high.get(&p)?))))
                .collect(),
            Err(e) => {
                warn!(error = %e, partitions = partitions.len(), "could not list the timers offsets; restoring from the beginning");
                HashMap::new()
            }
        }
    }

    /// What lists the marks, on the offset fetch's thread.
    pub fn marker(&self) -> Marker {
        self.marker.clone()
    }

    /// Whether the replay of `p` starts at the partition's first offset, which its mark must
    /// then list too (`Marker::list`).
    pub fn starts_at_first(&self, p: i32) -> bool {
        self.replaying.get(&p).is_some_and(|r| r.from.is_none())
    }

    /// Marks the end of the replay of `p` with `high`, listed once its committed offsets were
    /// fetched (see the module's doc); `first` is its first offset, if listed. Returns whether
    /// `p` is replaying and could be marked.
    pub fn mark(&mut self, p: i32, first: Option<i64>, high: i64) -> bool {
        let Some(r) = self.replaying.get_mut(&p) else {
            return false;
        };
        let Some(start) = r.from.or(first) else {
            return false;
        };
        r.mark = Some((start, high));
        true
    }

    /// One step of the replay (at most `STEP_RECORDS`, or `STEP_TIME`): applies the `timers`
    /// records of the partitions still restoring in `parts` to the store (forgetting the
    /// parsed schedules of the jobs they change), checkpoints each partition read, tells each
    /// lifecycle the previous owners barriers name, and which partitions caught up with their
    /// mark. Returns those, with the records consumed for them meanwhile, to activate in this
    /// order. `now` stamps the checkpoints.
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
                part.on(Event::BarrierRead { owner: &owner });
                continue;
            }
            let job = String::from_utf8_lossy(key).into_owned();
            schedules.forget(&job);
            let old_wake = match overlay.get(&(p, job.clone())) {
                Some(w) => *w,
                None => store
                    .timer(p as u16, &job)?
                    .as_ref()
                    .and_then(|s| store.wake(s)),
            };
            match m.payload() {
                None => {
                    batch.delete_timer(store, p as u16, &job, old_wake);
                    overlay.insert((p, job), None);
                }
                Some(bytes) => match codec::decode::<TimerState>(bytes) {
                    Ok(state) => {
                        let wake = store.wake(&state);
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
        // Only now, with what was read applied: the partitions whose replay reached its mark.
        let marked: Vec<(i32, (i64, i64))> = (self.replaying.iter())
            .filter_map(|(p, r)| Some((*p, r.mark?)))
            .collect();
        if !marked.is_empty() {
            let positions = self.consumer.position()?;
            for (p, (start, end)) in marked {
                let position = (positions.find_partition(&self.timers, p))
                    .and_then(|e| e.offset().to_raw())
                    .filter(|o| *o >= 0);
                if !caught_up(start, end, position) {
                    continue;
                }
                let Some(part) = parts.get_mut(&p) else {
                    continue;
                };
                if let Some(Action::Activate { buffered }) = part.on(Event::CaughtUp) {
                    done.push((p, buffered));
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::caught_up;

    #[test]
    fn a_replay_is_caught_up_at_its_mark_not_before() {
        // Nothing to read: a checkpoint at the high watermark, or an empty partition.
        assert!(caught_up(120, 120, None));
        assert!(caught_up(0, 0, None));
        // Records to read, nothing delivered yet.
        assert!(!caught_up(100, 120, None));
        // Short of the mark: an open transaction holds the reader at 110.
        assert!(!caught_up(100, 120, Some(110)));
        assert!(!caught_up(100, 120, Some(119)));
        // At the mark (the position past a commit marker counts), or past it.
        assert!(caught_up(100, 120, Some(120)));
        assert!(caught_up(100, 120, Some(135)));
    }
}
