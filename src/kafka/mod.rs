//! Kafka clients and administration: how every client is configured, topic management and
//! the Java-compatible partitioner.

pub mod admin;
pub mod partitioner;

use rdkafka::ClientConfig;

use crate::config::Config;

/// The settings every client shares: bootstrap plus the `[kafka]` pass-through table.
pub fn base_config(config: &Config) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap);
    c.set("client.id", "tocsin");
    for (k, v) in &config.kafka {
        c.set(k, v);
    }
    c
}

/// A producer's settings: idempotent, and partitioning keys as Kafka's Java client does.
pub fn producer_config(config: &Config) -> ClientConfig {
    let mut c = base_config(config);
    c.set("partitioner", "murmur2_random");
    c.set("enable.idempotence", "true");
    c.set("linger.ms", "5");
    c.set("batch.num.messages", "10000");
    c.set("compression.type", "lz4");
    // The pass-through table wins, except over the partitioner: placement must agree with
    // Java clients or `jobs get` and co-partitioning break.
    for (k, v) in &config.kafka {
        if k != "partitioner" {
            c.set(k, v);
        }
    }
    c
}

/// A consumer that sees only committed transactional data.
pub fn consumer_config(config: &Config, group_id: &str) -> ClientConfig {
    let mut c = base_config(config);
    c.set("group.id", group_id);
    c.set("isolation.level", "read_committed");
    c.set("enable.auto.commit", "false");
    c.set("enable.auto.offset.store", "false");
    c.set("auto.offset.reset", "earliest");
    for (k, v) in &config.kafka {
        c.set(k, v);
    }
    c
}
