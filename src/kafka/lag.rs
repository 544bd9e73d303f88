//! How far a consumer group is behind: per partition, the end a `read_committed` reader sees
//! (the last stable offset) less the group's committed offset. One request for the ends and
//! one for the commits, however many partitions.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::config::Config;
use crate::kafka::client::{NodeConsumer, NodeContext};

/// A consumer to ask about `group`'s offsets; it never joins the group.
pub fn consumer(config: &Config, group: &str) -> anyhow::Result<NodeConsumer> {
    Ok(crate::kafka::consumer_config(config, group)
        .set("client.id", "tocsin-lag")
        .create_with_context(NodeContext)?)
}

/// Per partition of `topic` in `partitions`: (end, lag). The lag is `None` when the group has
/// no committed offset there (it has not read the partition yet).
pub fn of(
    consumer: &BaseConsumer<impl ConsumerContext>,
    topic: &str,
    partitions: &[i32],
    timeout: Duration,
) -> anyhow::Result<BTreeMap<i32, (i64, Option<i64>)>> {
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        // A timestamp of -1 asks for the end (ListOffsets "latest"): for a `read_committed`
        // client, the last stable offset.
        tpl.add_partition_offset(topic, *p, Offset::End)?;
    }
    if partitions.is_empty() {
        return Ok(BTreeMap::new());
    }
    let ends = consumer.offsets_for_times(tpl.clone(), timeout)?;
    let committed = consumer.committed_offsets(tpl, timeout)?;
    let mut out = BTreeMap::new();
    for e in ends.elements_for_topic(topic) {
        let end = e.offset().to_raw().unwrap_or(0).max(0);
        let lag = committed
            .find_partition(topic, e.partition())
            .and_then(|c| match c.offset() {
                Offset::Offset(o) => Some((end - o).max(0)),
                _ => None,
            });
        out.insert(e.partition(), (end, lag));
    }
    Ok(out)
}
