use clap::Subcommand;

use crate::config::Config;
use crate::kafka::admin::{fleet_topics, Admin, Ensured};

#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// Create every fleet topic that is missing; fail on one that exists with other settings.
    Ensure,
    /// Print the topics under the prefix with their partitions and cleanup policy.
    Describe,
}

pub async fn run(config: &Config, command: &TopicsCommand) -> anyhow::Result<()> {
    let admin = Admin::new(config)?;
    match command {
        TopicsCommand::Ensure => {
            for (spec, how) in admin.ensure(&fleet_topics(config)).await? {
                let how = match how {
                    Ensured::Created => "created",
                    Ensured::Existed => "exists",
                };
                println!(
                    "{how:8} {} partitions={} cleanup.policy={}",
                    spec.name,
                    spec.partitions,
                    spec.cleanup.as_str()
                );
            }
        }
        TopicsCommand::Describe => {
            let topics = admin.describe(&config.topic_prefix).await?;
            if topics.is_empty() {
                println!("no topics under prefix {:?}", config.topic_prefix);
            }
            for t in topics {
                println!(
                    "{} partitions={} cleanup.policy={}",
                    t.name, t.partitions, t.cleanup_policy
                );
            }
        }
    }
    Ok(())
}
