//! Kafka clients and administration: how every client is configured, topic management and
//! the Java-compatible partitioner.

pub mod admin;
pub mod client;
pub mod group;
pub mod lag;
pub mod partitioner;
pub mod reach;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;
use rdkafka::ClientConfig;

use crate::config::Config;

/// The settings every client shares: bootstrap plus the `[kafka]` pass-through table.
pub fn base_config(config: &Config) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.bootstrap);
    c.set("client.id", "tocsin");
    // No re-bootstrap when every known broker is down: librdkafka 2.12's re-bootstrap loop can
    // leave a KIP-848 group member that never finds its coordinator again after the cluster
    // returns (its heartbeats never resume, and every transaction's offset commit is refused
    // as an unknown member), while a client that keeps the brokers it learned reconnects to
    // them as soon as they answer. A cluster whose every address changed during an outage is
    // what `/healthz`'s stall limit catches: the node is restarted and bootstraps afresh.
    c.set("metadata.recovery.strategy", "none");
    for (k, v) in &config.kafka {
        c.set(k, v);
    }
    c
}

/// A `[kafka]` setting librdkafka does not take, with librdkafka's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub key: String,
    /// No such setting (a typo, or a Java client's name): a warning, since it is the setting's
    /// author who knows whether it was meant for librdkafka.
    pub unknown: bool,
    pub reason: String,
}

/// The `[kafka]` settings librdkafka would refuse when a client is created, asked of
/// librdkafka itself one at a time, so `config check` names them all before a node meets the
/// first one.
pub fn refused_settings(config: &Config) -> Vec<Refused> {
    config
        .kafka
        .iter()
        .filter_map(|(k, v)| {
            let e = ClientConfig::new().set(k, v).create_native_config().err()?;
            let (unknown, reason) = match e {
                KafkaError::ClientConfig(res, reason, ..) => {
                    (res == RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, reason)
                }
                other => (false, other.to_string()),
            };
            Some(Refused {
                key: k.clone(),
                unknown,
                reason,
            })
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_librdkafka_refuses_are_named_with_its_reason() {
        let mut c = Config::default();
        for (k, v) in [
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "PLAIN"),
            ("sasl.username", "alice"),
            ("sasl.password", "secret"),
            ("sasl.usernme", "alice"),
            ("linger.ms", "soon"),
        ] {
            c.kafka.insert(k.into(), v.into());
        }
        let refused = refused_settings(&c);
        let keys: Vec<(&str, bool)> = refused
            .iter()
            .map(|r| (r.key.as_str(), r.unknown))
            .collect();
        assert_eq!(keys, [("linger.ms", false), ("sasl.usernme", true)]);
        assert!(refused[1].reason.contains("sasl.usernme"), "{refused:?}");
    }
}
