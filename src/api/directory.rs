//! The fleet's directory: every scheduler node writes a heartbeat to the `nodes` topic (key:
//! its node id) every [`HEARTBEAT_EVERY`], saying which partitions it owns, where its HTTP API
//! answers and its last error; a clean stop writes a tombstone. Nodes read it to redirect a
//! request to a partition's owner, and `tocsin status` to show the fleet.
//!
//! Kafka stays the only coordination service: the directory is advisory. Ownership is the
//! group's assignment, fenced by the member epoch; a heartbeat only says where to ask, and may
//! be up to a heartbeat behind a rebalance. Readers read the last [`READ_WINDOW_MS`] of the
//! topic, not its whole history, so its retention does not slow them.
//!
//! Values are JSON, not Avro: operators and the CLI read them, no other client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::config::Config;
use crate::kafka::client::{NodeConsumer, NodeContext};
use crate::node::{NodeStatus, NowFn};

/// How often a node writes its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// A heartbeat older than this is a node that is gone (stopped without its tombstone).
pub const STALE_AFTER_MS: i64 = 10_000;
/// How far back readers read: several heartbeats of every live node.
pub const READ_WINDOW_MS: i64 = 30_000;

/// One node's heartbeat, as written on `nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub node_id: String,
    pub version: String,
    /// When it was written (ms since the epoch, the node's clock).
    pub at_ms: i64,
    /// The base URL of the node's HTTP API (`http://host:port`), when it serves one.
    pub http: Option<String>,
    pub ready: bool,
    /// Owned partitions of `jobs`, as inclusive ranges.
    pub owned: Vec<(i32, i32)>,
    /// The owned partitions still restoring (the others are active).
    pub restoring: Vec<i32>,
    pub fires: u64,
    /// The last step's error, when the node has had one: when, and what.
    pub last_error: Option<(i64, String)>,
}

impl Heartbeat {
    pub fn owns(&self, partition: i32) -> bool {
        self.owned
            .iter()
            .any(|(from, to)| (*from..=*to).contains(&partition))
    }

    pub fn partitions(&self) -> impl Iterator<Item = i32> + '_ {
        self.owned.iter().flat_map(|(from, to)| *from..=*to)
    }
}

/// Sorted partitions as inclusive ranges: `[0, 1, 2, 5]` is `[(0, 2), (5, 5)]`.
pub fn ranges(partitions: impl IntoIterator<Item = i32>) -> Vec<(i32, i32)> {
    let mut out: Vec<(i32, i32)> = Vec::new();
    for p in partitions {
        match out.last_mut() {
            Some((_, to)) if *to + 1 == p => *to = p,
            _ => out.push((p, p)),
        }
    }
    out
}

fn heartbeat(node_id: &str, http: Option<&str>, status: &NodeStatus, now_ms: i64) -> Heartbeat {
    use std::sync::atomic::Ordering;
    let partitions = status.view.partitions();
    Heartbeat {
        node_id: node_id.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        at_ms: now_ms,
        http: http.map(str::to_owned),
        ready: status.ready.load(Ordering::Relaxed),
        owned: ranges(partitions.keys().copied()),
        restoring: partitions
            .iter()
            .filter(|(_, active)| !**active)
            .map(|(p, _)| *p)
            .collect(),
        fires: status.fires.load(Ordering::Relaxed),
        last_error: status.last_error.lock().unwrap().clone(),
    }
}

/// Writes the node's heartbeat every [`HEARTBEAT_EVERY`] until `shutdown`, then its tombstone.
pub async fn publish(
    config: Config,
    node_id: String,
    http: Option<String>,
    status: Arc<NodeStatus>,
    now: NowFn,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let topic = config.topic("nodes");
    let producer: FutureProducer<NodeContext> = crate::kafka::producer_config(&config)
        .set("message.timeout.ms", "5000")
        .create_with_context(NodeContext)?;
    let mut every = tokio::time::interval(HEARTBEAT_EVERY);
    // After a stall, one heartbeat, not a burst of them.
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = every.tick() => {}
        }
        let beat = heartbeat(&node_id, http.as_deref(), &status, now());
        let value = serde_json::to_vec(&beat)?;
        let record = FutureRecord::to(&topic).key(&node_id).payload(&value);
        if let Err((e, _)) = producer.send(record, Duration::from_secs(5)).await {
            debug!(error = %e, topic = %topic, "heartbeat not written");
        }
    }
    let tombstone = FutureRecord::<str, [u8]>::to(&topic).key(&node_id);
    if let Err((e, _)) = producer.send(tombstone, Duration::from_secs(2)).await {
        warn!(error = %e, topic = %topic, "could not write the node's tombstone on stop");
    }
    Ok(())
}

/// The latest heartbeat per node, as read from `nodes`; tombstones remove a node.
#[derive(Debug, Default, Clone)]
pub struct Nodes {
    by_id: HashMap<String, Heartbeat>,
}

impl Nodes {
    pub fn apply(&mut self, key: &[u8], value: Option<&[u8]>) {
        let Ok(id) = std::str::from_utf8(key) else {
            return;
        };
        match value.map(serde_json::from_slice::<Heartbeat>) {
            None => {
                self.by_id.remove(id);
            }
            Some(Ok(beat)) if beat.node_id == id => {
                let newer = self.by_id.get(id).is_none_or(|b| b.at_ms <= beat.at_ms);
                if newer {
                    self.by_id.insert(id.to_owned(), beat);
                }
            }
            Some(_) => {}
        }
    }

    /// The nodes heard from within [`STALE_AFTER_MS`] of `now_ms`, by id.
    pub fn live(&self, now_ms: i64) -> Vec<&Heartbeat> {
        let mut live: Vec<&Heartbeat> = self
            .by_id
            .values()
            .filter(|b| now_ms - b.at_ms <= STALE_AFTER_MS)
            .collect();
        live.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        live
    }

    /// Every node with a heartbeat in the window read, live or not, by id.
    pub fn all(&self) -> Vec<&Heartbeat> {
        let mut all: Vec<&Heartbeat> = self.by_id.values().collect();
        all.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        all
    }

    /// The live node that most recently said it owns `partition`.
    pub fn owner(&self, partition: i32, now_ms: i64) -> Option<&Heartbeat> {
        self.live(now_ms)
            .into_iter()
            .filter(|b| b.owns(partition))
            .max_by_key(|b| b.at_ms)
    }
}

/// A consumer of `nodes` positioned [`READ_WINDOW_MS`] back from `now_ms` on every partition;
/// with `eof`, it reports reaching the end of each (which a follower must not ask for:
/// librdkafka also logs every end reached as an error).
fn recent_consumer(config: &Config, now_ms: i64, eof: bool) -> anyhow::Result<NodeConsumer> {
    let topic = config.topic("nodes");
    let consumer: NodeConsumer = crate::kafka::consumer_config(config, "tocsin-nodes-reader")
        .set("enable.partition.eof", eof.to_string())
        .create_with_context(NodeContext)?;
    let partitions = crate::cli::jobs::partitions(&consumer, &topic)?;
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition_offset(&topic, *p, Offset::Offset(now_ms - READ_WINDOW_MS))?;
    }
    let mut at = consumer.offsets_for_times(tpl, Duration::from_secs(10))?;
    // A partition with nothing that recent answers "end": read nothing of it.
    let empty: Vec<i32> = at
        .elements_for_topic(&topic)
        .iter()
        .filter(|e| !matches!(e.offset(), Offset::Offset(_)))
        .map(|e| e.partition())
        .collect();
    for p in empty {
        at.set_partition_offset(&topic, p, Offset::End)?;
    }
    consumer.assign(&at)?;
    Ok(consumer)
}

/// The fleet as `nodes` shows it now: a one-off read of its recent window, to its end.
pub fn read(config: &Config, now_ms: i64) -> anyhow::Result<Nodes> {
    let consumer = recent_consumer(config, now_ms, true)?;
    let mut pending = consumer.assignment()?.count();
    let mut nodes = Nodes::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pending > 0 {
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "could not read {} to its end within 30 s",
                config.topic("nodes")
            );
        }
        match consumer.poll(Duration::from_millis(500)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => pending -= 1,
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) => {
                if let Some(key) = m.key() {
                    nodes.apply(key, m.payload());
                }
            }
        }
    }
    Ok(nodes)
}

/// Follows `nodes` on a thread of its own until `shutdown`, keeping `into` current.
pub fn follow(
    config: Config,
    now: NowFn,
    into: Arc<Mutex<Nodes>>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let consumer = recent_consumer(&config, now(), false)?;
    super::follow_on_thread(
        "nodes-directory",
        "nodes directory",
        consumer,
        shutdown,
        move |m| {
            if let Some(key) = m.key() {
                into.lock().unwrap().apply(key, m.payload());
            }
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(id: &str, at_ms: i64, owned: &[i32]) -> Vec<u8> {
        serde_json::to_vec(&Heartbeat {
            node_id: id.into(),
            version: "0".into(),
            at_ms,
            http: Some(format!("http://{id}:9090")),
            ready: true,
            owned: ranges(owned.iter().copied()),
            restoring: vec![],
            fires: 0,
            last_error: None,
        })
        .unwrap()
    }

    #[test]
    fn ranges_fold_runs_of_partitions() {
        assert_eq!(ranges([0, 1, 2, 5, 7, 8]), [(0, 2), (5, 5), (7, 8)]);
        assert_eq!(ranges([]), []);
    }

    #[test]
    fn the_owner_is_the_latest_live_claim_and_tombstones_remove_nodes() {
        let mut nodes = Nodes::default();
        nodes.apply(b"a", Some(&beat("a", 1_000, &[0, 1, 2, 3])));
        nodes.apply(b"b", Some(&beat("b", 2_000, &[4, 5])));
        assert_eq!(nodes.owner(2, 3_000).unwrap().node_id, "a");
        assert_eq!(nodes.owner(5, 3_000).unwrap().node_id, "b");
        assert!(nodes.owner(6, 3_000).is_none());
        // A rebalance moved 3 to b: b's later heartbeat wins.
        nodes.apply(b"b", Some(&beat("b", 4_000, &[3, 4, 5])));
        assert_eq!(nodes.owner(3, 4_500).unwrap().node_id, "b");
        // An older heartbeat arriving late, a mismatched key and garbage change nothing.
        nodes.apply(b"b", Some(&beat("b", 1_500, &[9])));
        nodes.apply(b"c", Some(&beat("b", 9_000, &[9])));
        nodes.apply(b"b", Some(b"{not json"));
        assert!(nodes.owner(9, 4_500).is_none());
        // a goes stale; b stops cleanly.
        assert!(nodes.owner(0, 1_000 + STALE_AFTER_MS + 1).is_none());
        nodes.apply(b"b", None);
        assert!(nodes.owner(4, 4_500).is_none());
        assert_eq!(nodes.all().len(), 1);
    }
}
