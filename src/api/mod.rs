//! The job API, v1, on every scheduler node (`docs/api.md`; the document is
//! `src/api/openapi.json`, served at `/v1/openapi.json`).
//!
//! It owns: reading a job from the owner's state (the engine's store, through
//! `scheduler::view`), redirecting to the owner what another node owns (the owner's address
//! from the fleet's directory, `directory`), and writing what a request changes to `jobs` or
//! `control`, as the CLI does. It must never write to the store or to `timers`, nor touch the
//! engine's transactions: a change reaches the scheduler only through the topics, so the API
//! cannot fire anything the group's fence would not allow. It must never panic on input.

pub mod auth;
pub mod directory;
pub mod runs;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::kafka::client::{NodeConsumer, NodeContext};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::codec::{self, Framing};
use crate::config::Config;
use crate::kafka::partitioner::partition_for;
use crate::model::job::JobDefinition;
use crate::model::records::{ControlRecord, TimerState};
use crate::model::schedule::Schedule;
use crate::model::validate::{validate, Limits};
use crate::node::{NodeStatus, NowFn};
use crate::scheduler::view::Held;
use auth::{Auth, Caller, Refusal};
use directory::Nodes;

/// Reads `consumer` on a thread named `name` until `shutdown`, handing each record to
/// `on_record`; a failed poll is logged (as `what`) and retried after a pause.
fn follow_on_thread(
    name: &str,
    what: &'static str,
    consumer: NodeConsumer,
    shutdown: tokio_util::sync::CancellationToken,
    mut on_record: impl FnMut(&rdkafka::message::BorrowedMessage<'_>) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            while !shutdown.is_cancelled() {
                match consumer.poll(Duration::from_millis(200)) {
                    None => {}
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "{what}: read failed");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Some(Ok(m)) => on_record(&m),
                }
            }
        })?;
    Ok(())
}

/// The largest request body taken; a larger one gets 413. A job's payload is at most
/// `limits.max_payload_bytes` (900 KiB by default), and its definition's JSON a little more.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The API's OpenAPI 3 document.
pub const OPENAPI: &str = include_str!("openapi.json");
/// Most instants `next` returns, and most items a list returns.
const MAX_COUNT: usize = 1000;
/// A partition's due backlog is counted up to this.
const DUE_CAP: usize = 100_000;
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Every route the node's HTTP endpoint answers, with its methods (HEAD goes with GET).
/// `tests` check this against the OpenAPI document, both ways.
pub const ROUTES: &[(&str, &[&str])] = &[
    ("/healthz", &["GET"]),
    ("/readyz", &["GET"]),
    ("/metrics", &["GET"]),
    ("/status", &["GET"]),
    ("/v1/openapi.json", &["GET"]),
    ("/v1/jobs", &["GET"]),
    ("/v1/jobs/{id}", &["GET", "PUT", "DELETE"]),
    ("/v1/jobs/{id}/next", &["GET"]),
    ("/v1/jobs/{id}/trigger", &["POST"]),
    ("/v1/jobs/{id}/pause", &["POST"]),
    ("/v1/jobs/{id}/resume", &["POST"]),
    ("/v1/jobs/{id}/backfill", &["POST"]),
    ("/v1/runs", &["GET"]),
    ("/v1/partitions", &["GET"]),
];

/// A request as the API sees it: the transport (`http`) has read and capped the body.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub authorization: Option<&'a str>,
    pub body: &'a [u8],
}

/// An answer: JSON unless `content_type` says otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub content_type: &'static str,
    /// `Location` of a redirect.
    pub location: Option<String>,
    /// `Allow` of a 405.
    pub allow: Option<String>,
    /// A 401 names the scheme (`WWW-Authenticate: Bearer`).
    pub challenge: bool,
}

impl Reply {
    fn json(status: u16, body: Value) -> Reply {
        let mut body = body.to_string();
        body.push('\n');
        Reply {
            status,
            body,
            content_type: "application/json",
            location: None,
            allow: None,
            challenge: false,
        }
    }

    pub fn error(status: u16, message: impl Into<String>) -> Reply {
        Reply::json(status, json!({ "error": message.into() }))
    }
}

impl From<Refusal> for Reply {
    fn from(r: Refusal) -> Reply {
        match r {
            Refusal::Unauthenticated(why) => Reply {
                challenge: true,
                ..Reply::error(401, why)
            },
            Refusal::Forbidden(why) => Reply::error(403, why),
        }
    }
}

/// What the API of one node works with.
pub struct Api {
    config: Config,
    node_id: String,
    status: Arc<NodeStatus>,
    now: NowFn,
    auth: Auth,
    limits: Limits,
    job_partitions: u32,
    producer: FutureProducer<NodeContext>,
    lag: Arc<NodeConsumer>,
    nodes: Arc<Mutex<Nodes>>,
    recent: Arc<runs::Recent>,
}

/// Which node answers for a job's partition.
enum Place {
    Here,
    Restoring,
    /// The owner's base URL.
    There(String),
    Unknown(String),
}

impl Api {
    /// The API of node `node_id`: the topics must exist (the node ensures them first). Reads
    /// the partition count of `jobs`, so a wrong bootstrap fails here, at start.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: Config,
        node_id: String,
        status: Arc<NodeStatus>,
        now: NowFn,
        auth: Auth,
        nodes: Arc<Mutex<Nodes>>,
        recent: Arc<runs::Recent>,
    ) -> anyhow::Result<Api> {
        let lag = crate::kafka::lag::consumer(&config, &config.scheduler.group_id)?;
        let job_partitions = crate::cli::jobs::partitions(&lag, &config.topic("jobs"))?.len();
        let producer = crate::kafka::producer_config(&config)
            .set("message.timeout.ms", WRITE_TIMEOUT.as_millis().to_string())
            .create_with_context(NodeContext)?;
        Ok(Api {
            limits: Limits::from_config(&config),
            config,
            node_id,
            status,
            now,
            auth,
            job_partitions: job_partitions as u32,
            producer,
            lag: Arc::new(lag),
            nodes,
            recent,
        })
    }

    /// Answers one request under `/v1/`.
    pub async fn handle(&self, r: &Request<'_>) -> Reply {
        let segments: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
        let query = match parse_query(r.query.unwrap_or("")) {
            Ok(q) => q,
            Err(why) => return Reply::error(400, why),
        };
        let method = if r.method == "HEAD" { "GET" } else { r.method };
        let route = match segments.as_slice() {
            ["v1", "openapi.json"] => "/v1/openapi.json",
            ["v1", "jobs"] => "/v1/jobs",
            ["v1", "jobs", _] => "/v1/jobs/{id}",
            ["v1", "jobs", _, action] => match *action {
                "next" => "/v1/jobs/{id}/next",
                "trigger" => "/v1/jobs/{id}/trigger",
                "pause" => "/v1/jobs/{id}/pause",
                "resume" => "/v1/jobs/{id}/resume",
                "backfill" => "/v1/jobs/{id}/backfill",
                _ => return Reply::error(404, format!("no route {}", r.path)),
            },
            ["v1", "runs"] => "/v1/runs",
            ["v1", "partitions"] => "/v1/partitions",
            _ => return Reply::error(404, format!("no route {}", r.path)),
        };
        if let Some(reply) = method_not_allowed(route, method) {
            return reply;
        }
        let id = match segments.get(2).map(|s| percent_decode(s)) {
            Some(Ok(id)) => Some(id),
            Some(Err(why)) => return Reply::error(400, why),
            None => None,
        };
        let mutating = method != "GET";
        let caller = match mutating {
            true => match self.auth.caller(r.authorization) {
                Ok(c) => Some(c),
                Err(refusal) => return refusal.into(),
            },
            false => None,
        };
        let allowed: &[&str] = match route {
            "/v1/jobs" => &["tenant", "label", "paused", "limit", "after"],
            "/v1/jobs/{id}/next" => &["count", "from"],
            "/v1/runs" => &["job", "limit"],
            _ => &[],
        };
        if let Some((k, _)) = query.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            return Reply::error(
                400,
                format!(
                    "unknown query parameter {k:?} for {route} (it takes {})",
                    if allowed.is_empty() {
                        "none".to_owned()
                    } else {
                        allowed.join(", ")
                    }
                ),
            );
        }
        match (route, id) {
            ("/v1/openapi.json", _) => Reply {
                body: OPENAPI.to_owned(),
                ..Reply::json(200, Value::Null)
            },
            ("/v1/jobs", _) => self.list(&query),
            ("/v1/runs", _) => self.runs(&query),
            ("/v1/partitions", _) => self.partitions().await,
            (route, Some(id)) => {
                let p = partition_for(id.as_bytes(), self.job_partitions) as i32;
                match self.place(p) {
                    Place::Here => {}
                    Place::Restoring => {
                        return Reply::error(
                            503,
                            format!("partition {p} of job {id:?} is restoring on this node"),
                        )
                    }
                    Place::There(base) => {
                        let mut location = format!("{base}{}", r.path);
                        if let Some(q) = r.query {
                            location.push('?');
                            location.push_str(q);
                        }
                        return Reply {
                            location: Some(location),
                            ..Reply::json(
                                307,
                                json!({ "redirect": base, "partition": p, "job": id }),
                            )
                        };
                    }
                    Place::Unknown(why) => return Reply::error(503, why),
                }
                let caller = caller.unwrap_or(Caller::Any);
                self.job_route(route, method, &id, p, &caller, &query, r.body)
                    .await
            }
            _ => Reply::error(404, format!("no route {}", r.path)),
        }
    }

    fn place(&self, p: i32) -> Place {
        match self.status.view.held(p) {
            Held::Active => return Place::Here,
            Held::Restoring => return Place::Restoring,
            Held::NotOwned => {}
        }
        let nodes = self.nodes.lock().unwrap();
        match nodes.owner(p, (self.now)()) {
            Some(b) if b.node_id == self.node_id => Place::Unknown(format!(
                "partition {p} is moving (this node no longer owns it); retry shortly"
            )),
            Some(b) => match &b.http {
                Some(base) => Place::There(base.clone()),
                None => Place::Unknown(format!(
                    "partition {p} is owned by node {:?}, which serves no HTTP API",
                    b.node_id
                )),
            },
            None => Place::Unknown(format!(
                "no node has said it owns partition {p} in the last {} s; retry shortly",
                directory::STALE_AFTER_MS / 1000
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn job_route(
        &self,
        route: &str,
        method: &str,
        id: &str,
        p: i32,
        caller: &Caller,
        query: &[(String, String)],
        body: &[u8],
    ) -> Reply {
        let timer = match self.status.view.timer(p, id) {
            Ok(t) => t,
            Err(e) => return Reply::error(500, format!("could not read job {id:?}: {e}")),
        };
        if (route, method) == ("/v1/jobs/{id}", "PUT") {
            return self.put(id, p, caller, timer.as_ref(), body).await;
        }
        let Some(timer) = timer else {
            return Reply::error(404, format!("job {id:?} not found"));
        };
        let tenant = &timer.definition.tenant;
        if method != "GET" && !caller.may(tenant) {
            return Reply::error(403, forbidden(id, tenant, caller));
        }
        let now = (self.now)();
        match (route, method) {
            ("/v1/jobs/{id}", "GET") => Reply::json(200, job_json(p, &timer)),
            ("/v1/jobs/{id}/next", _) => next(&timer.definition, query, now),
            ("/v1/jobs/{id}", "DELETE") => match self.write("jobs", id, None).await {
                Ok(()) => Reply::json(202, json!({ "id": id, "deleted": true })),
                Err(reply) => reply,
            },
            ("/v1/jobs/{id}/pause" | "/v1/jobs/{id}/resume", _) => {
                let mut def = timer.definition.clone();
                def.paused = route.ends_with("pause");
                def.revision += 1;
                let value = codec::encode(&def, &Framing::SingleObject);
                match self.write("jobs", id, Some(value)).await {
                    Ok(()) => Reply::json(
                        202,
                        json!({ "id": id, "paused": def.paused, "revision": def.revision }),
                    ),
                    Err(reply) => reply,
                }
            }
            ("/v1/jobs/{id}/trigger", _) => {
                let record = ControlRecord::Trigger { requested_ms: now };
                self.control(id, &record, json!({ "id": id, "triggered": true }))
                    .await
            }
            ("/v1/jobs/{id}/backfill", _) => {
                let range = match backfill_range(id, body) {
                    Ok(r) => r,
                    Err(reply) => return reply,
                };
                let record = ControlRecord::Backfill {
                    from_ms: range.0,
                    to_ms: range.1,
                };
                let answer = json!({ "id": id, "from_ms": range.0, "to_ms": range.1 });
                self.control(id, &record, answer).await
            }
            _ => Reply::error(404, format!("no route for {method} {route}")),
        }
    }

    async fn put(
        &self,
        id: &str,
        p: i32,
        caller: &Caller,
        existing: Option<&TimerState>,
        body: &[u8],
    ) -> Reply {
        let def = match definition(id, body) {
            Ok(d) => d,
            Err(why) => return Reply::error(400, why),
        };
        if let Err(e) = validate(&def, &self.limits, (self.now)()) {
            return Reply::error(400, e.to_string());
        }
        if !caller.may(&def.tenant) {
            return Reply::error(403, forbidden(id, &def.tenant, caller));
        }
        if let Some(current) = existing {
            if current.definition.tenant != def.tenant {
                return Reply::error(
                    409,
                    crate::scheduler::other_tenants_job(
                        id,
                        &current.definition.tenant,
                        &def.tenant,
                    ),
                );
            }
        }
        let value = codec::encode(&def, &Framing::SingleObject);
        match self.write("jobs", id, Some(value)).await {
            Ok(()) => Reply::json(
                202,
                json!({ "id": id, "partition": p, "created": existing.is_none() }),
            ),
            Err(reply) => reply,
        }
    }

    async fn control(&self, id: &str, record: &ControlRecord, answer: Value) -> Reply {
        let value = codec::encode(record, &Framing::SingleObject);
        match self.write("control", id, Some(value)).await {
            Ok(()) => Reply::json(202, answer),
            Err(reply) => reply,
        }
    }

    /// Writes one record keyed by the job id, as the CLI does; `Err` is the 503 to answer.
    async fn write(&self, topic: &str, key: &str, value: Option<Vec<u8>>) -> Result<(), Reply> {
        let topic = self.config.topic(topic);
        let mut record = FutureRecord::<str, [u8]>::to(&topic).key(key);
        if let Some(v) = &value {
            record = record.payload(v);
        }
        self.producer
            .send(record, WRITE_TIMEOUT)
            .await
            .map(|_| ())
            .map_err(|(e, _)| Reply::error(503, format!("could not write to {topic}: {e}")))
    }

    fn list(&self, query: &[(String, String)]) -> Reply {
        let mut tenant = None;
        let mut labels = BTreeMap::new();
        let mut paused = None;
        let mut limit = 100;
        let mut after = String::new();
        for (k, v) in query {
            match k.as_str() {
                "tenant" => tenant = Some(v.clone()),
                "label" => match v.split_once('=').filter(|(k, _)| !k.is_empty()) {
                    Some((k, v)) => {
                        labels.insert(k.to_owned(), v.to_owned());
                    }
                    None => {
                        return Reply::error(
                            400,
                            format!("invalid label {v:?}: expected KEY=VALUE with a non-empty KEY"),
                        )
                    }
                },
                "paused" => match v.as_str() {
                    "true" => paused = Some(true),
                    "false" => paused = Some(false),
                    _ => {
                        return Reply::error(
                            400,
                            format!("invalid paused {v:?}: expected true or false"),
                        )
                    }
                },
                "limit" => match count_param("limit", v) {
                    Ok(n) => limit = n,
                    Err(reply) => return reply,
                },
                _ => after = v.clone(),
            }
        }
        let keep = |t: &TimerState| {
            let d = &t.definition;
            tenant.as_ref().is_none_or(|x| &d.tenant == x)
                && paused.is_none_or(|x| d.paused == x)
                && labels.iter().all(|(k, v)| d.labels.get(k) == Some(v))
        };
        let found = match self.status.view.timers(&after, limit, keep) {
            Ok(f) => f,
            Err(e) => return Reply::error(500, format!("could not read the jobs: {e}")),
        };
        let next_after = (found.len() == limit)
            .then(|| found.last().map(|(_, t)| t.definition.id.clone()))
            .flatten();
        let held = self.status.view.partitions();
        let jobs: Vec<Value> = found.iter().map(|(p, t)| job_json(*p, t)).collect();
        Reply::json(
            200,
            json!({
                "node": self.node_id,
                "partitions": held.iter().filter(|(_, a)| **a).map(|(p, _)| p).collect::<Vec<_>>(),
                "restoring": held.iter().filter(|(_, a)| !**a).map(|(p, _)| p).collect::<Vec<_>>(),
                "jobs": jobs,
                "next_after": next_after,
            }),
        )
    }

    fn runs(&self, query: &[(String, String)]) -> Reply {
        let mut job = None;
        let mut limit = 100;
        for (k, v) in query {
            match k.as_str() {
                "job" => job = Some(v.as_str()),
                _ => match count_param("limit", v) {
                    Ok(n) => limit = n,
                    Err(reply) => return reply,
                },
            }
        }
        Reply::json(
            200,
            json!({ "node": self.node_id, "kept": runs::KEPT, "runs": self.recent.query(job, limit) }),
        )
    }

    async fn partitions(&self) -> Reply {
        let held = self.status.view.partitions();
        let owned: Vec<i32> = held.keys().copied().collect();
        let (lag, config) = (self.lag.clone(), self.config.clone());
        let lags = tokio::task::spawn_blocking(move || {
            let t = Duration::from_secs(5);
            let jobs = crate::kafka::lag::of(&lag, &config.topic("jobs"), &owned, t)?;
            let control = crate::kafka::lag::of(&lag, &config.topic("control"), &owned, t)?;
            anyhow::Ok((jobs, control))
        })
        .await;
        let (jobs_lag, control_lag, lag_error) = match lags {
            Ok(Ok((j, c))) => (j, c, None),
            Ok(Err(e)) => (BTreeMap::new(), BTreeMap::new(), Some(e.to_string())),
            Err(e) => (BTreeMap::new(), BTreeMap::new(), Some(e.to_string())),
        };
        let now = (self.now)();
        let rows: Vec<Value> = held
            .iter()
            .map(|(p, active)| {
                let due = self
                    .status
                    .view
                    .due_backlog(*p, now, DUE_CAP)
                    .ok()
                    .flatten();
                json!({
                    "partition": p,
                    "state": if *active { "active" } else { "restoring" },
                    "due_backlog": due,
                    "due_capped": due == Some(DUE_CAP),
                    "jobs_lag": jobs_lag.get(p).and_then(|(_, l)| *l),
                    "control_lag": control_lag.get(p).and_then(|(_, l)| *l),
                })
            })
            .collect();
        Reply::json(
            200,
            json!({ "node": self.node_id, "partitions": rows, "lag_error": lag_error }),
        )
    }
}

fn forbidden(id: &str, tenant: &str, caller: &Caller) -> String {
    match caller {
        Caller::Tenant(t) => format!(
            "job {id:?} belongs to tenant {tenant:?}; this token may change only tenant {t:?}'s jobs"
        ),
        Caller::Any => format!("job {id:?} of tenant {tenant:?} may not be changed"),
    }
}

/// A 405 naming the methods of `route`, unless it takes `method`.
fn method_not_allowed(route: &str, method: &str) -> Option<Reply> {
    let (_, methods) = ROUTES.iter().find(|(r, _)| *r == route)?;
    if methods.contains(&method) {
        return None;
    }
    let mut allow: Vec<&str> = methods.to_vec();
    if allow.contains(&"GET") {
        allow.push("HEAD");
    }
    let allow = allow.join(", ");
    Some(Reply {
        allow: Some(allow.clone()),
        ..Reply::error(405, format!("{route} takes {allow}, not {method}"))
    })
}

fn job_json(p: i32, t: &TimerState) -> Value {
    json!({
        "job": t.definition,
        "partition": p,
        "next_fire_ms": t.next_fire_ms,
        "fires": t.fires,
        "last_scheduled_ms": t.last_scheduled_ms,
    })
}

/// The definition in a PUT body: a JSON job definition whose `id`, when given, is the path's.
fn definition(id: &str, body: &[u8]) -> Result<JobDefinition, String> {
    let mut value: Value =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let Some(object) = value.as_object_mut() else {
        return Err("invalid job definition: expected a JSON object".into());
    };
    match object.get("id") {
        None => {
            object.insert("id".into(), Value::String(id.to_owned()));
        }
        Some(Value::String(given)) if given == id => {}
        Some(given) => {
            return Err(format!(
                "the body's id {given} is not the path's job id {id:?}"
            ))
        }
    }
    serde_json::from_value(value).map_err(|e| format!("invalid job definition: {e}"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Backfill {
    from: String,
    to: String,
}

fn backfill_range(id: &str, body: &[u8]) -> Result<(i64, i64), Reply> {
    let b: Backfill = serde_json::from_slice(body).map_err(|e| {
        Reply::error(
            400,
            format!(
                r#"invalid backfill body: {e} (expected {{"from": ISO 8601, "to": ISO 8601}})"#
            ),
        )
    })?;
    let parse =
        |s: &str| crate::cli::jobs::parse_instant(s).map_err(|e| Reply::error(400, e.to_string()));
    let (from, to) = (parse(&b.from)?, parse(&b.to)?);
    if to < from {
        return Err(Reply::error(
            400,
            format!(
                "backfill range of job {id:?} is reversed: to {} is before from {}",
                b.to, b.from
            ),
        ));
    }
    Ok((from, to))
}

fn next(def: &JobDefinition, query: &[(String, String)], now: i64) -> Reply {
    let mut count = 5;
    let mut from = now;
    for (k, v) in query {
        match k.as_str() {
            "count" => match count_param("count", v) {
                Ok(n) => count = n,
                Err(reply) => return reply,
            },
            _ => match crate::cli::jobs::parse_instant(v) {
                Ok(t) => from = t,
                Err(e) => return Reply::error(400, e.to_string()),
            },
        }
    }
    let schedule = match Schedule::from_job(def) {
        Ok(s) => s,
        Err(e) => return Reply::error(500, format!("job {:?}: {e}", def.id)),
    };
    let mut instants = Vec::new();
    let mut t = from - 1;
    while instants.len() < count {
        let Some(at) = schedule.next_after(t) else {
            break;
        };
        let (utc, local) = schedule.describe_instant(at);
        instants.push(json!({ "at_ms": at, "utc": utc, "local": local }));
        t = at;
    }
    Reply::json(
        200,
        json!({ "id": def.id, "paused": def.paused, "next": instants }),
    )
}

fn count_param(name: &str, v: &str) -> Result<usize, Reply> {
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_COUNT).contains(&n) => Ok(n),
        _ => Err(Reply::error(
            400,
            format!("invalid {name} {v:?}: expected a whole number from 1 to {MAX_COUNT}"),
        )),
    }
}

/// `a=1&b=x%20y` as pairs, percent-decoded (`+` is a space).
fn parse_query(q: &str) -> Result<Vec<(String, String)>, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let plus = |s: &str| s.replace('+', " ");
            Ok((percent_decode(&plus(k))?, percent_decode(&plus(v))?))
        })
        .collect()
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => out.push(b),
                None => return Err(format!("invalid percent-encoding in {s:?}")),
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} does not decode to UTF-8"))
}

/// The route of `ROUTES` a path matches (`{id}` matches any segment).
pub fn route_of(path: &str) -> Option<&'static str> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    ROUTES
        .iter()
        .find(|(r, _)| {
            let t: Vec<&str> = r.trim_start_matches('/').split('/').collect();
            t.len() == segments.len()
                && t.iter()
                    .zip(&segments)
                    .all(|(t, s)| t.starts_with('{') || t == s)
        })
        .map(|(r, _)| *r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_in_the_openapi_document_and_nothing_else() {
        let doc: Value = serde_json::from_str(OPENAPI).expect("openapi.json is JSON");
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
        let paths = doc["paths"].as_object().unwrap();
        for (route, methods) in ROUTES {
            let item = paths
                .get(*route)
                .unwrap_or_else(|| panic!("{route} is not in openapi.json"));
            for m in *methods {
                assert!(
                    item.get(m.to_lowercase()).is_some(),
                    "{m} {route} is not in openapi.json"
                );
            }
            let documented: Vec<&String> = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "parameters")
                .collect();
            for m in documented {
                assert!(
                    methods.contains(&m.to_uppercase().as_str()),
                    "openapi.json documents {m} {route}, which the server does not answer"
                );
            }
        }
        for path in paths.keys() {
            assert!(
                ROUTES.iter().any(|(r, _)| r == path),
                "openapi.json documents {path}, which the server does not answer"
            );
        }
    }

    #[test]
    fn queries_and_ids_decode_and_bad_encodings_are_named() {
        assert_eq!(
            parse_query("tenant=acme&label=team%3Dops&x=a+b").unwrap(),
            [
                ("tenant".into(), "acme".into()),
                ("label".into(), "team=ops".into()),
                ("x".into(), "a b".into())
            ]
        );
        assert!(parse_query("a=%zz").unwrap_err().contains("%zz"));
        assert_eq!(percent_decode("billing%2D7").unwrap(), "billing-7");
        assert!(percent_decode("%ff").is_err());
        assert_eq!(route_of("/v1/jobs/x/next"), Some("/v1/jobs/{id}/next"));
        assert_eq!(route_of("/v1/jobs/x/nope"), None);
    }

    #[test]
    fn a_put_body_takes_the_path_id_and_refuses_another() {
        let body = br#"{"tenant":"acme","schedule":{"interval":{"every_ms":60000,"anchor_ms":0}},
            "handler":{"kind":"kafka","target":"out"}}"#;
        assert_eq!(definition("j1", body).unwrap().id, "j1");
        let other = br#"{"id":"j2","tenant":"acme"}"#;
        assert!(definition("j1", other).unwrap_err().contains("\"j2\""));
        assert!(definition("j1", b"[1]").unwrap_err().contains("object"));
        assert!(definition("j1", br#"{"tenant":"a","bogus":1}"#)
            .unwrap_err()
            .contains("bogus"));
        assert_eq!(
            method_not_allowed("/v1/jobs/{id}", "POST").unwrap().allow,
            Some("GET, PUT, DELETE, HEAD".into())
        );
        assert!(method_not_allowed("/v1/jobs/{id}", "DELETE").is_none());
    }
}
