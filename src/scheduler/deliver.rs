//! Direct delivery of `kafka` jobs: the scheduler writes a run's payload into the job's target
//! topic inside the transaction that fires it, so a `read_committed` reader of the target sees
//! each run exactly once, as soon as it fires, with no lane record and no worker in between.
//!
//! What this module owns: the headers of a delivered record, and the cache of target topics
//! that tells a writable target from a missing or refused one before anything is produced. A
//! target that is missing or refuses the record sends the run to `dead`; it never holds up the
//! transaction, which carries other jobs' runs too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::client::Client;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::ClientContext;

use crate::model::records::Run;

/// How long a target is trusted to exist (a deleted one is noticed by the refusal).
const PRESENT_TTL: Duration = Duration::from_secs(60);
/// How long a target is taken as missing or refused before it is looked up again: runs due
/// meanwhile go to `dead`, so this is short.
const MISSING_TTL: Duration = Duration::from_secs(5);
/// The longest a metadata lookup of one target may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The headers of a delivered record: the job's own, then `tocsin-run-id` and
/// `tocsin-scheduled-ms` (the scheduled instant, epoch milliseconds), by which a consumer can
/// deduplicate what reaches the topic from outside Tocsin.
pub fn headers(run: &Run) -> OwnedHeaders {
    let scheduled = run.scheduled_ms.to_string();
    let mut headers = OwnedHeaders::new_with_capacity(run.handler.headers.len() + 2);
    for (k, v) in &run.handler.headers {
        headers = headers.insert(Header {
            key: k,
            value: Some(v.as_bytes()),
        });
    }
    headers
        .insert(Header {
            key: "tocsin-run-id",
            value: Some(run.run_id.as_bytes()),
        })
        .insert(Header {
            key: "tocsin-scheduled-ms",
            value: Some(scheduled.as_bytes()),
        })
}

/// A delivery the target refused for what it is (missing, not ours to write, the record too
/// large or malformed for it): retrying cannot help, so the run goes to `dead`. A timeout or a
/// leader election is not one of these; the transaction is retried. The refusals of any record
/// (`refuses_code`), and those of a topic that is not there or takes no writes.
pub fn refuses_target(code: RDKafkaErrorCode) -> bool {
    super::producer::refuses_code(code)
        || matches!(
            code,
            RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::PolicyViolation
        )
}

/// What a target topic is, as the cache last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// It exists. The producer's partitioner (murmur2, as Kafka's Java client) places each
    /// record by its key, the job id.
    Writable,
    /// Runs to it go to `dead` with this reason.
    Refused(String),
}

/// What `topic` is as a target of the fleet with topic prefix `prefix`, from one metadata
/// request to the broker (never creating it: the scheduler's producer has
/// `allow.auto.create.topics` off). Errors are those of the broker or the connection, not of
/// the topic.
pub fn look_up<C: ClientContext>(
    client: &Client<C>,
    prefix: &str,
    topic: &str,
) -> Result<Target, KafkaError> {
    // Validation refuses these; a job stored before it did is refused here.
    if crate::config::is_tocsin_topic(prefix, topic) || topic.starts_with("__") {
        return Ok(Target::Refused(format!(
            "target topic {topic:?} is one of Tocsin's own or an internal topic"
        )));
    }
    let metadata = client.fetch_metadata(Some(topic), LOOKUP_TIMEOUT)?;
    let found = metadata.topics().iter().find(|t| t.name() == topic);
    Ok(match found {
        None => Target::Refused(format!("target topic {topic:?} does not exist")),
        Some(t) => match t.error().map(RDKafkaErrorCode::from) {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
                Target::Refused(format!("target topic {topic:?} does not exist"))
            }
            Some(code) if refuses_target(code) => {
                Target::Refused(format!("target topic {topic:?} refused: {code}"))
            }
            Some(code) => return Err(KafkaError::MetadataFetch(code)),
            None if t.partitions().is_empty() => {
                Target::Refused(format!("target topic {topic:?} has no partitions"))
            }
            None => Target::Writable,
        },
    })
}

/// Target topics looked up in the broker's metadata (`look_up`), with when.
pub struct Targets {
    prefix: String,
    known: HashMap<String, (Target, Instant)>,
}

impl Targets {
    pub fn new(prefix: &str) -> Targets {
        Targets {
            prefix: prefix.to_owned(),
            known: HashMap::new(),
        }
    }

    /// What `topic` is: from the cache, or looked up in the broker's metadata.
    pub fn lookup<C: ClientContext>(
        &mut self,
        client: &Client<C>,
        topic: &str,
    ) -> Result<Target, KafkaError> {
        if let Some((t, at)) = self.known.get(topic) {
            let ttl = match t {
                Target::Writable => PRESENT_TTL,
                Target::Refused(_) => MISSING_TTL,
            };
            if at.elapsed() < ttl {
                return Ok(t.clone());
            }
        }
        let target = look_up(client, &self.prefix, topic)?;
        self.known
            .insert(topic.to_owned(), (target.clone(), Instant::now()));
        Ok(target)
    }

    /// Forgets every target, so each is looked up again.
    pub fn clear(&mut self) {
        self.known.clear();
    }

    /// Marks `topic` refused for `MISSING_TTL`, after the broker refused a record of it.
    pub fn refused(&mut self, topic: &str, reason: String) {
        self.known
            .insert(topic.to_owned(), (Target::Refused(reason), Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_errors_are_not_refusals() {
        for code in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::BrokerNotAvailable,
            RDKafkaErrorCode::QueueFull,
        ] {
            assert!(!refuses_target(code), "{code}");
        }
        assert!(refuses_target(RDKafkaErrorCode::MessageSizeTooLarge));
    }
}
