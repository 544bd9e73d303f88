//! `tocsin status`: the fleet as Kafka and the nodes show it. The nodes and what they own come
//! from their heartbeats on `nodes`; each partition's consumer lag from the scheduler group's
//! committed offsets; each partition's due backlog from its owner's `/v1/partitions`; each
//! lane's backlog from the worker pool's committed offsets.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rdkafka::consumer::Consumer;
use serde_json::{json, Value};

use crate::api::directory;
use crate::config::Config;
use crate::kafka::lag;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The worker pool whose lane backlog to show.
    #[arg(long, default_value = "default")]
    pub pool: String,
    /// One JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
}

const ASK_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn run(config: &Config, args: &StatusArgs) -> anyhow::Result<()> {
    let now = super::jobs::now_ms();
    let (config2, pool) = (config.clone(), args.pool.clone());
    let (nodes, jobs_lag, control_lag, lanes) = tokio::task::spawn_blocking(move || {
        let config = &config2;
        let nodes = directory::read(config, now)?;
        let consumer = lag::consumer(config, &config.scheduler.group_id)?;
        let jobs = config.topic("jobs");
        let partitions = super::jobs::partitions(&consumer, &jobs)?;
        let jobs_lag = lag::of(&consumer, &jobs, &partitions, ASK_TIMEOUT)?;
        let control_lag = lag::of(
            &consumer,
            &config.topic("control"),
            &partitions,
            ASK_TIMEOUT,
        )?;
        let lanes = lane_backlog(config, &pool)?;
        anyhow::Ok((nodes, jobs_lag, control_lag, lanes))
    })
    .await??;
    let client = reqwest::Client::builder()
        .timeout(ASK_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let mut owned_by: BTreeMap<i32, String> = BTreeMap::new();
    let mut rows = Vec::new();
    for beat in nodes.all() {
        let live = now - beat.at_ms <= directory::STALE_AFTER_MS;
        let (due, ask_error) = match (&beat.http, live) {
            (Some(base), true) => match ask_partitions(&client, base).await {
                Ok(d) => (d, None),
                Err(e) => (BTreeMap::new(), Some(format!("{e:#}"))),
            },
            _ => (BTreeMap::new(), None),
        };
        let partitions: Vec<Value> = beat
            .partitions()
            .map(|p| {
                if live {
                    owned_by.insert(p, beat.node_id.clone());
                }
                json!({
                    "partition": p,
                    "state": if beat.restoring.contains(&p) { "restoring" } else { "active" },
                    "jobs_lag": jobs_lag.get(&p).and_then(|(_, l)| *l),
                    "control_lag": control_lag.get(&p).and_then(|(_, l)| *l),
                    "due_backlog": due.get(&p).cloned().unwrap_or(Value::Null),
                })
            })
            .collect();
        rows.push(json!({
            "node_id": beat.node_id,
            "http": beat.http,
            "version": beat.version,
            "live": live,
            // `now` is taken before the heartbeats are read: one written meanwhile is 0 ms old.
            "heard_ms_ago": (now - beat.at_ms).max(0),
            "ready": beat.ready,
            "fires": beat.fires,
            "last_error": beat.last_error.as_ref().map(|(at, e)| json!({ "at_ms": at, "error": e })),
            "partitions": partitions,
            "ask_error": ask_error,
        }));
    }
    let unowned: Vec<i32> = jobs_lag
        .keys()
        .filter(|p| !owned_by.contains_key(p))
        .copied()
        .collect();
    let lanes: Vec<Value> = lanes
        .into_iter()
        .map(|(tenant, (topic, backlog))| json!({ "tenant": tenant, "topic": topic, "backlog": backlog }))
        .collect();
    let doc = json!({
        "nodes": rows,
        "unowned_partitions": unowned,
        "pool": args.pool,
        "lanes": lanes,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_tables(&doc);
    }
    Ok(())
}

/// Each partition's due backlog as its owner counts it.
async fn ask_partitions(
    client: &reqwest::Client,
    base: &str,
) -> anyhow::Result<BTreeMap<i32, Value>> {
    let url = format!("{base}/v1/partitions");
    let text = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("could not ask {url}"))?
        .text()
        .await?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{url} answered {text:?}"))?;
    Ok(v["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["partition"].as_i64()? as i32, p["due_backlog"].clone())))
        .collect())
}

/// Per tenant, its lane and the records of it that `pool` has not committed past.
fn lane_backlog(
    config: &Config,
    pool: &str,
) -> anyhow::Result<BTreeMap<String, (String, Option<i64>)>> {
    let consumer = lag::consumer(config, &format!("tocsin-worker-{pool}"))?;
    let md = consumer.fetch_metadata(None, ASK_TIMEOUT)?;
    let prefix = config.topic("lane.");
    let mut out = BTreeMap::new();
    for t in md.topics() {
        let Some(part) = t.name().strip_prefix(&prefix) else {
            continue;
        };
        let partitions: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        let lags = lag::of(&consumer, t.name(), &partitions, ASK_TIMEOUT)?;
        // A partition the pool never committed on holds its whole end as backlog.
        let backlog = lags.values().map(|(end, lag)| lag.unwrap_or(*end)).sum();
        out.insert(tenant_of(part), (t.name().to_owned(), Some(backlog)));
    }
    Ok(out)
}

/// The tenant of a lane's name part (`acme_2eeu` is `acme.eu`; see `tenant_topic_part`).
fn tenant_of(part: &str) -> String {
    part.replace("_2e", ".").replace("_5f", "_")
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn print_tables(doc: &Value) {
    let nodes = doc["nodes"].as_array().cloned().unwrap_or_default();
    if nodes.is_empty() {
        println!("no scheduler node has written a heartbeat in the last 30 s");
    }
    for n in &nodes {
        let owned = n["partitions"].as_array().map_or(0, Vec::len);
        println!(
            "node {}  {}  {}  http {}  partitions {}  fires {}  heard {} ms ago",
            cell(&n["node_id"]),
            if n["live"] == true { "live" } else { "gone" },
            if n["ready"] == true {
                "ready"
            } else {
                "not ready"
            },
            cell(&n["http"]),
            owned,
            cell(&n["fires"]),
            cell(&n["heard_ms_ago"]),
        );
        match &n["last_error"] {
            Value::Null => println!("  last error: none"),
            e => println!(
                "  last error: {} (at {} ms)",
                cell(&e["error"]),
                cell(&e["at_ms"])
            ),
        }
        if let Value::String(e) = &n["ask_error"] {
            println!("  due backlog unknown: {e}");
        }
        println!(
            "  {:<9}  {:<9}  {:>8}  {:>11}  {:>11}",
            "PARTITION", "STATE", "JOBS LAG", "CONTROL LAG", "DUE BACKLOG"
        );
        for p in n["partitions"].as_array().into_iter().flatten() {
            println!(
                "  {:<9}  {:<9}  {:>8}  {:>11}  {:>11}",
                cell(&p["partition"]),
                cell(&p["state"]),
                cell(&p["jobs_lag"]),
                cell(&p["control_lag"]),
                cell(&p["due_backlog"]),
            );
        }
    }
    if let Some(unowned) = doc["unowned_partitions"]
        .as_array()
        .filter(|u| !u.is_empty())
    {
        println!(
            "partitions no live node owns: {}",
            Value::Array(unowned.clone())
        );
    }
    println!("lanes of pool {}:", cell(&doc["pool"]));
    println!("  {:<24}  {:>8}  TOPIC", "TENANT", "BACKLOG");
    for l in doc["lanes"].as_array().into_iter().flatten() {
        println!(
            "  {:<24}  {:>8}  {}",
            cell(&l["tenant"]),
            cell(&l["backlog"]),
            cell(&l["topic"])
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lane_names_give_back_their_tenant() {
        for tenant in ["acme", "acme.eu", "a_b", "x._y"] {
            let part = crate::model::job::tenant_topic_part(tenant);
            assert_eq!(super::tenant_of(&part), tenant);
        }
    }
}
