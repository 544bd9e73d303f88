//! The audit consumer: reads every lane from the beginning as a worker would (`read_committed`)
//! while the scenario runs, and notes for each run the instant it became visible. Then checks
//! each expected (job, scheduled instant) was seen exactly once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tocsin::codec;
use tocsin::config::Config;
use tocsin::model::records::{run_id, Run};

use crate::load::job_index;
use crate::now_ms;

/// One run as the audit consumer saw it.
#[derive(Debug, Clone, Copy)]
pub struct Obs {
    pub job: u32,
    pub tenant: u16,
    pub scheduled_ms: i64,
    /// Wall clock when the record came out of `poll`.
    pub seen_ms: i64,
    /// The record's timestamp: its broker append time on a `LogAppendTime` topic (the delay
    /// target), the producer's create time on a lane.
    pub timestamp_ms: i64,
    /// The instant before which the run may not start (a lane record's
    /// `tocsin-not-before-ms`; its scheduled instant where the record has none).
    pub not_before_ms: i64,
}

impl Obs {
    /// From the run's instant to when it was both visible and allowed to start: a run fired
    /// ahead (the scheduler's lookahead) and seen before its not-before instant is not late.
    pub fn ready_lag_ms(&self) -> i64 {
        self.seen_ms.max(self.not_before_ms) - self.scheduled_ms
    }

    /// From the run's instant to its visibility: negative when it was in the lane ahead.
    pub fn visible_ms(&self) -> i64 {
        self.seen_ms - self.scheduled_ms
    }
}

/// Turns a record read at `seen_ms` into the run it holds, or `None` when it is malformed.
pub type Check = Box<dyn Fn(&BorrowedMessage<'_>, i64) -> Option<Obs> + Send>;

/// How often the audit consumer's librdkafka statistics (and so the lanes' last stable
/// offsets) are sampled.
const STATS_EVERY_MS: u64 = 250;

/// One sample of the lanes' last stable offsets: a `read_committed` reader sees nothing of a
/// partition past it, so one that stays behind the partition's high watermark is held by an
/// open transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldSample {
    pub at_ms: i64,
    /// The longest any partition's last stable offset has stood still behind its high watermark.
    pub longest_ms: i64,
    /// Partitions held so for over a second.
    pub held_over_1s: usize,
}

/// Per lane partition held, its last stable offset and since when it stands there.
#[derive(Default)]
struct Holds {
    since: HashMap<(String, i32), (i64, i64)>,
    samples: Vec<HoldSample>,
}

impl Holds {
    fn sample(&mut self, at_ms: i64, partitions: impl Iterator<Item = ((String, i32), i64, i64)>) {
        let mut seen = HashSet::new();
        for (key, lso, high) in partitions {
            if lso < 0 || high <= lso {
                self.since.remove(&key);
                continue;
            }
            seen.insert(key.clone());
            match self.since.get_mut(&key) {
                Some((at, _)) if *at == lso => {}
                _ => {
                    self.since.insert(key, (lso, at_ms));
                }
            }
        }
        self.since.retain(|k, _| seen.contains(k));
        let ages = self.since.values().map(|(_, from)| at_ms - from);
        let (longest_ms, held_over_1s) =
            ages.fold((0, 0), |(l, n), a| (l.max(a), n + usize::from(a > 1_000)));
        self.samples.push(HoldSample {
            at_ms,
            longest_ms,
            held_over_1s,
        });
    }
}

/// The audit consumer's context: takes the lanes' last stable offsets out of its statistics.
struct AuditContext {
    holds: Arc<Mutex<Holds>>,
}

impl ClientContext for AuditContext {
    fn stats(&self, stats: Statistics) {
        let parts = stats.topics.into_iter().flat_map(|(topic, t)| {
            t.partitions
                .into_iter()
                .filter(|(p, _)| *p >= 0)
                .map(move |(p, part)| ((topic.clone(), p), part.ls_offset, part.hi_offset))
        });
        self.holds.lock().unwrap().sample(now_ms(), parts);
    }
}

impl ConsumerContext for AuditContext {}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    obs: Mutex<Vec<Obs>>,
    /// Records that are not a well-formed run of a loadtest job (bad value, key, headers, id).
    malformed: AtomicU64,
    error: Mutex<Option<String>>,
}

pub struct Audit {
    shared: Arc<Shared>,
    holds: Arc<Mutex<Holds>>,
    thread: Option<JoinHandle<()>>,
}

impl Audit {
    /// Starts reading `lanes` (topics that must exist, each with the one tenant whose runs it
    /// may hold, or `None` for any) from their beginning.
    pub fn start(config: &Config, lanes: &[(String, Option<String>)]) -> Result<Audit> {
        let topics: Vec<(String, u32)> = lanes
            .iter()
            .map(|(t, _)| (t.clone(), config.topics.lane_partitions))
            .collect();
        let lanes: HashMap<String, Option<String>> = lanes.iter().cloned().collect();
        let check: Check = Box::new(move |m, seen_ms| check(m, &lanes, seen_ms));
        Audit::reading(config, "tocsin-loadtest-audit", &topics, check)
    }

    /// Starts reading every partition of `topics` (that must exist, with the partition count
    /// given) from its beginning, as `client_id`, turning each record into a run by `check`.
    pub fn reading(
        config: &Config,
        client_id: &str,
        topics: &[(String, u32)],
        check: Check,
    ) -> Result<Audit> {
        let mut cc = tocsin::kafka::consumer_config(config, "tocsin-loadtest-audit");
        cc.set("client.id", client_id);
        // Low fetch wait: the lag we measure must be the scheduler's, not ours.
        cc.set("fetch.wait.max.ms", "10");
        cc.set("statistics.interval.ms", STATS_EVERY_MS.to_string());
        let holds = Arc::new(Mutex::new(Holds::default()));
        let context = AuditContext {
            holds: holds.clone(),
        };
        let consumer: BaseConsumer<AuditContext> = cc
            .create_with_context(context)
            .with_context(|| format!("could not create the consumer {client_id}"))?;
        let mut tpl = TopicPartitionList::new();
        for (topic, partitions) in topics {
            for p in 0..*partitions as i32 {
                tpl.add_partition_offset(topic, p, Offset::Beginning)?;
            }
        }
        consumer
            .assign(&tpl)
            .with_context(|| format!("could not assign {client_id} its topics"))?;
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(client_id.into())
            .spawn(move || read(consumer, check, s))?;
        Ok(Audit {
            shared,
            holds,
            thread: Some(thread),
        })
    }

    /// The lanes' last-stable-offset samples so far (one per `STATS_EVERY_MS`).
    pub fn holds(&self) -> Vec<HoldSample> {
        self.holds.lock().unwrap().samples.clone()
    }

    /// How many runs seen so far satisfy `f`.
    pub fn count(&self, f: impl Fn(&Obs) -> bool) -> usize {
        self.shared
            .obs
            .lock()
            .unwrap()
            .iter()
            .filter(|o| f(o))
            .count()
    }

    /// How many distinct (job, scheduled instant) of the runs seen so far satisfy `f`.
    pub fn distinct(&self, f: impl Fn(&Obs) -> bool) -> usize {
        let obs = self.shared.obs.lock().unwrap();
        let runs: HashSet<(u32, i64)> = obs
            .iter()
            .filter(|o| f(o))
            .map(|o| (o.job, o.scheduled_ms))
            .collect();
        runs.len()
    }

    /// The worst lag (`Obs::ready_lag_ms`) of the runs that came out of `poll` in the last
    /// `within_ms`; `None` when there were none.
    pub fn recent_lag(&self, within_ms: i64) -> Option<i64> {
        let since = now_ms() - within_ms;
        let obs = self.shared.obs.lock().unwrap();
        obs.iter()
            .rev()
            .take_while(|o| o.seen_ms >= since)
            .map(Obs::ready_lag_ms)
            .max()
    }

    /// Fails if the consumer failed.
    pub fn check(&self) -> Result<()> {
        if let Some(e) = self.shared.error.lock().unwrap().clone() {
            anyhow::bail!("audit consumer failed: {e}");
        }
        Ok(())
    }

    /// Stops reading; returns every run seen and the count of malformed records.
    pub fn finish(mut self) -> Result<(Vec<Obs>, u64)> {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.check()?;
        let obs = std::mem::take(&mut *self.shared.obs.lock().unwrap());
        Ok((obs, self.shared.malformed.load(Ordering::Relaxed)))
    }
}

impl Drop for Audit {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

fn read(consumer: BaseConsumer<AuditContext>, check: Check, shared: Arc<Shared>) {
    let mut batch = Vec::with_capacity(4096);
    while !shared.stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(m)) => {
                let seen_ms = now_ms();
                match check(&m, seen_ms) {
                    Some(o) => batch.push(o),
                    None => {
                        shared.malformed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if batch.len() < 4096 {
                    continue;
                }
            }
            Some(Err(e)) => {
                *shared.error.lock().unwrap() = Some(e.to_string());
                return;
            }
            None => {}
        }
        if !batch.is_empty() {
            shared.obs.lock().unwrap().append(&mut batch);
        }
    }
    shared.obs.lock().unwrap().append(&mut batch);
}

/// The run a lane record holds, if it is a well-formed run of a loadtest job: the value decodes,
/// the key is the job id, the headers and the run id agree with the value, and the lane is the
/// job's tenant's. Tenants are named `t<index>`.
fn check(
    m: &BorrowedMessage<'_>,
    lanes: &HashMap<String, Option<String>>,
    seen_ms: i64,
) -> Option<Obs> {
    let lane_tenant = lanes.get(m.topic())?;
    let run: Run = codec::decode(m.payload()?).ok()?;
    let ok = m.key() == Some(run.job_id.as_bytes())
        && header(m, "tocsin-scheduled-ms").and_then(|v| v.parse().ok()) == Some(run.scheduled_ms)
        && run.run_id == run_id(&run.job_id, run.scheduled_ms)
        && lane_tenant.as_ref().is_none_or(|t| *t == run.tenant);
    if !ok {
        return None;
    }
    Some(Obs {
        job: job_index(&run.job_id)?,
        tenant: run.tenant.strip_prefix('t')?.parse().ok()?,
        scheduled_ms: run.scheduled_ms,
        seen_ms,
        timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
        not_before_ms: header(m, tocsin::history::NOT_BEFORE_HEADER)
            .and_then(|v| v.parse().ok())
            .unwrap_or(run.scheduled_ms),
    })
}

/// The value of header `name` of `m`, as text.
pub fn header<'m>(m: &'m BorrowedMessage<'_>, name: &str) -> Option<&'m str> {
    let h = m.headers()?.iter().find(|h| h.key == name)?;
    std::str::from_utf8(h.value?).ok()
}

/// The verdict of the audit over a window of scheduled instants.
#[derive(Debug, Default)]
pub struct Verdict {
    pub expected: u64,
    /// Expected runs seen (at least once).
    pub fires: u64,
    pub lost: u64,
    /// Sightings beyond the first of an expected run.
    pub duplicates: u64,
    /// Runs in the window that no schedule asked for.
    pub unexpected: u64,
    /// First sightings of expected runs.
    pub firsts: Vec<Obs>,
}

/// Checks every expected `(job, instant)` given by `expected` (instants of job `j` in the
/// window `[from_ms, to_ms)`) against the runs seen with a scheduled instant in the window.
pub fn verdict(
    obs: &[Obs],
    jobs: impl Iterator<Item = u32>,
    expected: &dyn Fn(u32, &mut Vec<i64>),
    from_ms: i64,
    to_ms: i64,
) -> Verdict {
    let mut seen: HashMap<(u32, i64), (u32, usize)> = HashMap::new();
    for (i, o) in obs.iter().enumerate() {
        if o.scheduled_ms < from_ms || o.scheduled_ms >= to_ms {
            continue;
        }
        seen.entry((o.job, o.scheduled_ms))
            .and_modify(|(n, first)| {
                *n += 1;
                if obs[*first].seen_ms > o.seen_ms {
                    *first = i;
                }
            })
            .or_insert((1, i));
    }
    let mut v = Verdict::default();
    let mut instants = Vec::new();
    let mut matched = 0usize;
    for j in jobs {
        instants.clear();
        expected(j, &mut instants);
        for t in &instants {
            v.expected += 1;
            match seen.get(&(j, *t)) {
                Some((n, first)) => {
                    matched += 1;
                    v.fires += 1;
                    v.duplicates += u64::from(n - 1);
                    v.firsts.push(obs[*first]);
                }
                None => v.lost += 1,
            }
        }
    }
    v.unexpected = (seen.len() - matched) as u64;
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_stable_offset_standing_behind_the_high_watermark_is_a_hold() {
        let mut h = Holds::default();
        let key = |p: i32| ("lane".to_string(), p);
        // p0 held at 10 from t=1000, p1 caught up, p2 moving.
        h.sample(
            1_000,
            [(key(0), 10, 15), (key(1), 20, 20), (key(2), 5, 9)].into_iter(),
        );
        h.sample(
            2_500,
            [(key(0), 10, 16), (key(1), 20, 20), (key(2), 7, 9)].into_iter(),
        );
        assert_eq!(
            h.samples[1],
            HoldSample {
                at_ms: 2_500,
                longest_ms: 1_500,
                held_over_1s: 1
            }
        );
        // p0's transaction ended: its last stable offset caught up.
        h.sample(3_000, [(key(0), 16, 16), (key(2), 7, 9)].into_iter());
        assert_eq!(h.samples[2].longest_ms, 500);
        assert_eq!(h.samples[2].held_over_1s, 0);
    }

    fn o(job: u32, scheduled_ms: i64, seen_ms: i64) -> Obs {
        Obs {
            job,
            tenant: 0,
            scheduled_ms,
            seen_ms,
            timestamp_ms: 0,
            not_before_ms: scheduled_ms,
        }
    }

    #[test]
    fn verdict_counts_lost_duplicate_and_unexpected_runs() {
        let obs = [
            o(0, 1000, 1010),
            o(0, 2000, 2050),
            o(0, 2000, 2020), // a duplicate, seen earlier than the other copy
            o(1, 1000, 1100),
            o(1, 1500, 1600), // not an instant of job 1
            o(1, 9000, 9000), // outside the window
        ];
        let every_second = |_: u32, out: &mut Vec<i64>| out.extend([1000, 2000]);
        let v = verdict(&obs, 0..2u32, &every_second, 1000, 3000);
        assert_eq!(v.expected, 4);
        assert_eq!(v.fires, 3);
        assert_eq!(v.lost, 1); // job 1 at 2000
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.unexpected, 1);
        let dup = v
            .firsts
            .iter()
            .find(|f| f.job == 0 && f.scheduled_ms == 2000)
            .unwrap();
        assert_eq!(dup.seen_ms, 2020);
    }
}
