//! Topic administration: create what is missing, verify what exists, never alter or delete.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("kafka admin request failed: {0}")]
    Kafka(#[from] KafkaError),
    #[error("could not create topic {topic}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("{}", .0.join("; "))]
    Mismatch(Vec<String>),
    #[error("topic {topic} did not show up in broker metadata with {partitions} partitions within {waited:?}")]
    NotVisible {
        topic: String,
        partitions: u32,
        waited: Duration,
    },
}

pub type Result<T, E = AdminError> = std::result::Result<T, E>;

/// How long metadata requests answered with a leadership error are asked again before the
/// error is returned. A broker creating or deleting many partitions (another fleet's topics,
/// a test's cleanup) can move leaders for several seconds; a node starting meanwhile waits
/// rather than exits.
const METADATA_RETRY_FOR: Duration = Duration::from_secs(30);

/// The longest wait between two such requests (the waits double from 100 ms).
const METADATA_RETRY_STEP_MAX: Duration = Duration::from_secs(1);

/// Whether `code` says partition leadership is moving on the broker, which passes.
fn leadership_moving(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::NotLeaderForPartition
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::NotCoordinator
    )
}

/// Cleanup policy of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    Compact,
    Delete,
}

impl Cleanup {
    pub fn as_str(self) -> &'static str {
        match self {
            Cleanup::Compact => "compact",
            Cleanup::Delete => "delete",
        }
    }
}

/// A topic as Tocsin needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: u32,
    pub cleanup: Cleanup,
}

/// What `ensure` did for one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    Created,
    Existed,
}

/// The fleet's topics that are not per tenant (docs/architecture.md, "Topics").
pub fn fleet_topics(config: &Config) -> Vec<TopicSpec> {
    let t = &config.topics;
    let spec = |name: &str, partitions, cleanup| TopicSpec {
        name: config.topic(name),
        partitions,
        cleanup,
    };
    vec![
        spec("jobs", t.job_partitions, Cleanup::Compact),
        spec("timers", t.job_partitions, Cleanup::Compact),
        spec("control", t.job_partitions, Cleanup::Delete),
        spec("runs", t.runs_partitions, Cleanup::Delete),
        spec("dead", t.dead_partitions, Cleanup::Delete),
        spec("jobs.rejected", t.rejected_partitions, Cleanup::Delete),
        // Heartbeats of the scheduler nodes (`api::directory`); readers read the last 30 s.
        spec("nodes", 1, Cleanup::Delete),
    ]
}

/// The lane topic of one tenant.
pub fn lane_topic(config: &Config, tenant: &str) -> TopicSpec {
    TopicSpec {
        name: config.lane_topic(tenant),
        partitions: config.topics.lane_partitions,
        cleanup: Cleanup::Delete,
    }
}

/// A topic as the broker has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub partitions: u32,
    pub cleanup_policy: String,
}

pub struct Admin {
    client: AdminClient<crate::kafka::client::NodeContext>,
    replication: i32,
    timeout: Duration,
}

impl Admin {
    pub fn new(config: &Config) -> Result<Admin> {
        let client = crate::kafka::base_config(config)
            .create_with_context(crate::kafka::client::NodeContext)?;
        Ok(Admin {
            client,
            replication: config.topics.replication_factor,
            timeout: Duration::from_secs(30),
        })
    }

    /// Deletes every topic whose name starts with `prefix` (the load test's own, after a run:
    /// a broker holds only so many partitions). Returns the names deleted.
    pub async fn delete_prefixed(&self, prefix: &str) -> Result<Vec<String>> {
        if prefix.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<String> = self
            .partition_counts()?
            .into_keys()
            .filter(|t| t.starts_with(prefix))
            .collect();
        if names.is_empty() {
            return Ok(names);
        }
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let opts = AdminOptions::new().operation_timeout(Some(self.timeout));
        for r in self.client.delete_topics(&refs, &opts).await? {
            if let Err((topic, code)) = r {
                tracing::warn!(topic = %topic, error = %code, "could not delete topic");
            }
        }
        Ok(names)
    }

    /// Deletes the consumer groups `groups` (a test's or a benchmark's, when it is done); a
    /// group that does not exist is not an error.
    pub async fn delete_groups(&self, groups: &[&str]) -> Result<()> {
        let opts = AdminOptions::new().operation_timeout(Some(self.timeout));
        for r in self.client.delete_groups(groups, &opts).await? {
            if let Err((group, code)) = r {
                if code != RDKafkaErrorCode::GroupIdNotFound {
                    tracing::warn!(group = %group, error = %code, "could not delete group");
                }
            }
        }
        Ok(())
    }

    /// Partition counts of every topic the broker has, by name.
    pub fn partition_counts(&self) -> Result<BTreeMap<String, u32>> {
        // A blocking call: fine for the CLI, and the scheduler calls it from its own thread.
        // A broker moving partition leaders (topics being created or deleted) may answer a
        // whole metadata request with a leadership error for a while: asked again, the waits
        // doubling, for up to METADATA_RETRY_FOR.
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        let md = loop {
            match self.client.inner().fetch_metadata(None, self.timeout) {
                Err(KafkaError::MetadataFetch(code))
                    if started.elapsed() < METADATA_RETRY_FOR && leadership_moving(code) =>
                {
                    if backoff < METADATA_RETRY_STEP_MAX {
                        tracing::debug!(error = %code, "metadata answered with a leadership error; asking again");
                    } else {
                        tracing::warn!(error = %code, waited = ?started.elapsed(), "broker metadata still answers with a leadership error; asking again");
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(METADATA_RETRY_STEP_MAX);
                }
                other => break other?,
            }
        };
        Ok(md
            .topics()
            .iter()
            .filter(|t| t.error().is_none())
            .map(|t| (t.name().to_owned(), t.partitions().len() as u32))
            .collect())
    }

    /// The `cleanup.policy` of each named topic.
    pub async fn cleanup_policies(&self, topics: &[&str]) -> Result<BTreeMap<String, String>> {
        self.topic_setting(topics, "cleanup.policy").await
    }

    /// The largest record every named topic accepts: the least of their `max.message.bytes`
    /// (`None` when no topic is named or none reports it).
    pub async fn max_message_bytes(&self, topics: &[&str]) -> Result<Option<usize>> {
        Ok(self
            .topic_setting(topics, "max.message.bytes")
            .await?
            .values()
            .filter_map(|v| v.parse::<usize>().ok())
            .min())
    }

    /// One setting of each named topic, as the broker has it (empty when unset).
    async fn topic_setting(&self, topics: &[&str], key: &str) -> Result<BTreeMap<String, String>> {
        if topics.is_empty() {
            return Ok(BTreeMap::new());
        }
        let specifiers: Vec<ResourceSpecifier> =
            topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let opts = AdminOptions::new().request_timeout(Some(self.timeout));
        let results = self.client.describe_configs(&specifiers, &opts).await?;
        let mut out = BTreeMap::new();
        for (topic, result) in topics.iter().zip(results) {
            let resource = result.map_err(|code| AdminError::Create {
                topic: topic.to_string(),
                code,
            })?;
            let value = resource
                .get(key)
                .and_then(|e| e.value.clone())
                .unwrap_or_default();
            out.insert(topic.to_string(), value);
        }
        Ok(out)
    }

    /// Describes the topics that exist under a prefix.
    pub async fn describe(&self, prefix: &str) -> Result<Vec<TopicInfo>> {
        let counts = self.partition_counts()?;
        let names: Vec<&str> = counts
            .keys()
            .filter(|n| n.starts_with(prefix))
            .map(String::as_str)
            .collect();
        let policies = self.cleanup_policies(&names).await?;
        Ok(names
            .iter()
            .map(|n| TopicInfo {
                name: n.to_string(),
                partitions: counts[*n],
                cleanup_policy: policies.get(*n).cloned().unwrap_or_default(),
            })
            .collect())
    }

    /// Creates every topic that is missing and verifies the others. A topic that exists with
    /// another partition count or cleanup policy is an error naming what was found and what is
    /// needed; nothing is altered. Returns once broker metadata shows every topic as asked.
    pub async fn ensure(&self, specs: &[TopicSpec]) -> Result<Vec<(TopicSpec, Ensured)>> {
        let counts = self.partition_counts()?;
        let existing: Vec<&TopicSpec> = specs
            .iter()
            .filter(|s| counts.contains_key(&s.name))
            .collect();
        let names: Vec<&str> = existing.iter().map(|s| s.name.as_str()).collect();
        let policies = self.cleanup_policies(&names).await?;
        let mut problems = Vec::new();
        for spec in &existing {
            let found = counts[&spec.name];
            if found != spec.partitions {
                problems.push(format!(
                    "topic {} has {} partitions but needs {}",
                    spec.name, found, spec.partitions
                ));
            }
            let policy = policies.get(&spec.name).map(String::as_str).unwrap_or("");
            if !policy_matches(policy, spec.cleanup) {
                problems.push(format!(
                    "topic {} has cleanup.policy={} but needs cleanup.policy={}",
                    spec.name,
                    policy,
                    spec.cleanup.as_str()
                ));
            }
        }
        if !problems.is_empty() {
            return Err(AdminError::Mismatch(problems));
        }

        let missing: Vec<&TopicSpec> = specs
            .iter()
            .filter(|s| !counts.contains_key(&s.name))
            .collect();
        let mut created = Vec::new();
        if !missing.is_empty() {
            let new_topics: Vec<NewTopic> = missing
                .iter()
                .map(|s| {
                    NewTopic::new(
                        &s.name,
                        s.partitions as i32,
                        TopicReplication::Fixed(self.replication),
                    )
                    .set("cleanup.policy", s.cleanup.as_str())
                })
                .collect();
            let opts = AdminOptions::new().operation_timeout(Some(self.timeout));
            for result in self.client.create_topics(&new_topics, &opts).await? {
                match result {
                    Ok(name) => created.push(name),
                    // Another node created it between our look and our create: verify below.
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((topic, code)) => return Err(AdminError::Create { topic, code }),
                }
            }
        }
        // Only what this call created: a topic another creator made first may differ from
        // the spec, and the check below says how, where waiting for it to match would time out.
        let made: Vec<TopicSpec> = missing
            .iter()
            .filter(|s| created.contains(&s.name))
            .map(|s| (*s).clone())
            .collect();
        self.wait_visible(&made).await?;
        if created.len() < missing.len() {
            // Raced with another creator: check what it made, as for any existing topic.
            let raced: Vec<TopicSpec> = missing
                .iter()
                .filter(|s| !created.contains(&s.name))
                .map(|s| (*s).clone())
                .collect();
            Box::pin(self.ensure(&raced)).await?;
        }
        Ok(specs
            .iter()
            .map(|s| {
                let how = if created.contains(&s.name) {
                    Ensured::Created
                } else {
                    Ensured::Existed
                };
                (s.clone(), how)
            })
            .collect())
    }

    async fn wait_visible(&self, specs: &[TopicSpec]) -> Result<()> {
        let started = Instant::now();
        let limit = Duration::from_secs(60);
        loop {
            let counts = self.partition_counts()?;
            let pending = specs
                .iter()
                .find(|s| counts.get(&s.name).copied() != Some(s.partitions));
            match pending {
                None => return Ok(()),
                Some(s) if started.elapsed() > limit => {
                    return Err(AdminError::NotVisible {
                        topic: s.name.clone(),
                        partitions: s.partitions,
                        waited: started.elapsed(),
                    })
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// `cleanup.policy` is a list; a compacted topic may also be `compact,delete`.
fn policy_matches(found: &str, want: Cleanup) -> bool {
    let mut parts: Vec<&str> = found.split(',').map(str::trim).collect();
    parts.sort_unstable();
    match want {
        Cleanup::Compact => parts == ["compact"],
        Cleanup::Delete => parts == ["delete"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_policy_lists_compare_exactly() {
        assert!(policy_matches("compact", Cleanup::Compact));
        assert!(policy_matches("delete", Cleanup::Delete));
        assert!(!policy_matches("compact,delete", Cleanup::Compact));
        assert!(!policy_matches("delete", Cleanup::Compact));
    }

    #[test]
    fn fleet_topics_follow_the_architecture() {
        let specs = fleet_topics(&Config::default());
        let jobs = specs.iter().find(|s| s.name == "tocsin.jobs").unwrap();
        assert_eq!((jobs.partitions, jobs.cleanup), (1024, Cleanup::Compact));
        let timers = specs.iter().find(|s| s.name == "tocsin.timers").unwrap();
        assert_eq!(
            (timers.partitions, timers.cleanup),
            (1024, Cleanup::Compact)
        );
        let control = specs.iter().find(|s| s.name == "tocsin.control").unwrap();
        assert_eq!(
            (control.partitions, control.cleanup),
            (1024, Cleanup::Delete)
        );
    }
}
