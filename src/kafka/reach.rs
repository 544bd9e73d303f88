//! The broker probe every node runs for its readiness: a metadata request each second on a
//! client of its own, so what the node reports does not wait on its work (a scheduler's step
//! can block for a transaction's timeout while the brokers are away).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::config::Config;
use crate::kafka::client::{NodeConsumer, NodeContext};
use crate::node::{NowFn, Reach};

/// How often the probe asks.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one question waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the probe goes unanswered before it asks on a new client, and again each time this
/// long passes without an answer. After a broker outage, a librdkafka 2.12 client can stay
/// without a connection for good while the node's other clients, and new ones, reach the
/// brokers again: its node then said it was not ready for as long as it ran.
const RENEW_AFTER: Duration = Duration::from_secs(10);

/// Starts the probe on a thread of its own, until `shutdown`; returns what it finds.
///
/// It asks for the metadata of `runs`, which every node writes (so an ACL that lets the node
/// work lets it describe the topic); any answer counts, an error for the topic included: it
/// comes from a broker.
pub fn watch(
    config: &Config,
    now: NowFn,
    shutdown: CancellationToken,
) -> Result<Arc<Reach>, KafkaError> {
    let new_client = {
        let config = config.clone();
        move || -> Result<NodeConsumer, KafkaError> {
            crate::kafka::base_config(&config)
                .set("client.id", "tocsin-broker-probe")
                .set("log_level", "0")
                .create_with_context(NodeContext)
        }
    };
    let mut client = new_client()?;
    let topic = config.topic("runs");
    let reach = Arc::new(Reach::default());
    let found = reach.clone();
    std::thread::Builder::new()
        .name("tocsin-broker-probe".into())
        .spawn(move || {
            // Since when the probe has had no answer, on this client.
            let mut unanswered = Instant::now();
            while !shutdown.is_cancelled() {
                match client.fetch_metadata(Some(&topic), PROBE_TIMEOUT) {
                    Ok(_) => {
                        found.answered_ms.store(now(), Ordering::Relaxed);
                        found.last_error.lock().unwrap().take();
                        unanswered = Instant::now();
                    }
                    Err(e) => {
                        *found.last_error.lock().unwrap() = Some(e.to_string());
                        if unanswered.elapsed() >= RENEW_AFTER {
                            debug!("broker probe unanswered; asking on a new client");
                            match new_client() {
                                Ok(c) => client = c,
                                Err(e) => {
                                    warn!(error = %e, "could not renew the broker probe's client")
                                }
                            }
                            unanswered = Instant::now();
                        }
                    }
                }
                // What librdkafka reported meanwhile (a refused login, a failed TLS handshake)
                // comes out of the client's queue: typed for `/readyz` and `/status`.
                while let Some(r) = client.poll(Duration::ZERO) {
                    if let Err(e) = r {
                        crate::kafka::client::report(&e, "broker probe");
                    }
                }
                std::thread::sleep(PROBE_EVERY);
            }
        })
        .expect("spawn the broker probe thread");
    Ok(reach)
}
