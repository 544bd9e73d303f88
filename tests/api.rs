//! The job API of a real scheduler node against the real broker: put, get, list, next, pause,
//! resume, trigger, backfill and delete, the error codes (400, 401, 403, 404, 405, 409, 413),
//! tenant-scoped tokens, the loopback rule, a redirect to the owner, and `tocsin status`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::fleet::*;
use common::http::*;
use common::*;
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-0123456789";
const ACME: &str = "acme-token-0123456789";
const GLOBEX: &str = "globex-token-0123456789";

struct Answer {
    status: u16,
    head: String,
    body: Value,
}

fn call(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Answer {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return Answer {
            status: 0,
            head: "nobody listens".into(),
            body: Value::Null,
        };
    };
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before it read the whole body.
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Answer {
        status,
        head: head.to_owned(),
        body: serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())),
    }
}

fn expect(a: &Answer, status: u16, what: &str) {
    assert_eq!(a.status, status, "{what}: {} {}", a.head, a.body);
}

fn job(tenant: &str, target: &str) -> Vec<u8> {
    json!({
        "tenant": tenant,
        "schedule": {"interval": {"every_ms": 3_600_000, "anchor_ms": 0}},
        "handler": {"kind": "kafka", "target": target, "payload": "hi"},
        "labels": {"team": "billing"},
    })
    .to_string()
    .into_bytes()
}

fn tokens_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("tokens");
    std::fs::write(&path, format!("{ADMIN}\n{ACME} acme\n{GLOBEX} globex\n")).unwrap();
    path
}

/// Ready, and owning every partition with each active (a node with none yet is ready too).
fn wait_ready(addr: SocketAddr, node: &Node) {
    wait_watching(
        Duration::from_secs(60),
        "/readyz 200, 8 partitions active",
        &[node],
        || {
            get(addr, "/readyz").is_some_and(|(c, _)| c == 200)
                && call(addr, "GET", "/v1/partitions", None, b"").body["partitions"]
                    .as_array()
                    .is_some_and(|p| p.len() == 8 && p.iter().all(|p| p["state"] == "active"))
        },
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_job_api_puts_reads_controls_and_deletes_jobs_with_scoped_tokens() {
    let (mut config, dir) = setup("api").await;
    let addr = free_addr();
    config.scheduler.http_listen = addr.to_string();
    config.scheduler.api_tokens_file = Some(tokens_file(dir.path()));
    let target = format!("{}-out", config.topic_prefix.trim_end_matches('.'));
    tocsin::kafka::admin::Admin::new(&config)
        .unwrap()
        .ensure(&[tocsin::kafka::admin::TopicSpec {
            name: target.clone(),
            partitions: 1,
            cleanup: tocsin::kafka::admin::Cleanup::Delete,
        }])
        .await
        .unwrap();
    let node = Node::start(&config, dir.path(), "n1");
    wait_ready(addr, &node);

    let doc = call(addr, "GET", "/v1/openapi.json", None, b"");
    expect(&doc, 200, "the OpenAPI document");
    assert!(doc.body["paths"]["/v1/jobs/{id}"]["put"].is_object());

    // Authentication and validation come before anything is written.
    let put = |token, body: &[u8]| call(addr, "PUT", "/v1/jobs/bill-1", token, body);
    let none = put(None, &job("acme", &target));
    expect(&none, 401, "a put without a token");
    assert!(
        none.head.contains("WWW-Authenticate: Bearer")
            || none.head.contains("www-authenticate: Bearer"),
        "{}",
        none.head
    );
    expect(
        &put(Some("wrong-token-0123456789"), &job("acme", &target)),
        401,
        "an unknown token",
    );
    let other = put(Some(GLOBEX), &job("acme", &target));
    expect(&other, 403, "globex's token putting acme's job");
    assert!(
        other.body["error"].as_str().unwrap().contains("\"globex\""),
        "{}",
        other.body
    );
    let bad = serde_json::to_vec(&json!({
        "tenant": "acme",
        "schedule": {"cron": {"expr": "61 * * * * *", "zone": "UTC"}},
        "handler": {"kind": "kafka", "target": target},
    }))
    .unwrap();
    let invalid = put(Some(ACME), &bad);
    expect(&invalid, 400, "an invalid cron");
    let why = invalid.body["error"].as_str().unwrap();
    assert!(
        why.contains("61 * * * * *") && why.contains("bill-1"),
        "{why}"
    );
    expect(
        &put(Some(ACME), b"{not json"),
        400,
        "a body that is not JSON",
    );
    let huge = vec![b' '; 2 * 1024 * 1024];
    expect(&put(Some(ACME), &huge), 413, "a 2 MiB body");
    expect(
        &call(addr, "POST", "/v1/jobs/bill-1", Some(ACME), b""),
        405,
        "POST on a job",
    );
    expect(
        &call(addr, "GET", "/v1/jobs/bill-1", None, b""),
        404,
        "a job not put yet",
    );

    let created = put(Some(ACME), &job("acme", &target));
    expect(&created, 202, "acme's put");
    wait_watching(
        Duration::from_secs(30),
        "the job readable",
        &[&node],
        || call(addr, "GET", "/v1/jobs/bill-1", None, b"").status == 200,
    );
    let got = call(addr, "GET", "/v1/jobs/bill-1", None, b"");
    assert_eq!(got.body["job"]["tenant"], "acme");
    assert_eq!(got.body["job"]["handler"]["target"], target.as_str());
    let next_fire = got.body["next_fire_ms"].as_i64().unwrap();
    assert_eq!(next_fire % 3_600_000, 0);
    // Another tenant may not take the id over: the owner's state says whose it is.
    let takeover = put(Some(ADMIN), &job("globex", &target));
    expect(&takeover, 409, "globex putting acme's id");

    // The list of the node's partitions, filtered.
    let ids = |query: &str| -> Vec<String> {
        let a = call(addr, "GET", &format!("/v1/jobs{query}"), None, b"");
        expect(&a, 200, query);
        a.body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["job"]["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids("?tenant=acme"), ["bill-1"]);
    assert!(ids("?tenant=globex").is_empty());
    assert_eq!(ids("?label=team%3Dbilling&paused=false"), ["bill-1"]);
    assert!(ids("?label=team%3Dops").is_empty());
    expect(
        &call(addr, "GET", "/v1/jobs?paused=maybe", None, b""),
        400,
        "paused=maybe",
    );
    expect(
        &call(addr, "GET", "/v1/jobs?colour=red", None, b""),
        400,
        "an unknown parameter",
    );

    let next = call(addr, "GET", "/v1/jobs/bill-1/next?count=3", None, b"");
    expect(&next, 200, "next");
    let at: Vec<i64> = next.body["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["at_ms"].as_i64().unwrap())
        .collect();
    assert_eq!(
        at,
        [next_fire, next_fire + 3_600_000, next_fire + 7_200_000]
    );
    expect(
        &call(addr, "GET", "/v1/jobs/bill-1/next?count=0", None, b""),
        400,
        "count=0",
    );

    // Pause and resume, by the owner's token; not by another tenant's.
    expect(
        &call(addr, "POST", "/v1/jobs/bill-1/pause", Some(GLOBEX), b""),
        403,
        "globex pausing acme's job",
    );
    expect(
        &call(addr, "POST", "/v1/jobs/bill-1/pause", Some(ACME), b""),
        202,
        "pause",
    );
    wait_watching(Duration::from_secs(30), "the job paused", &[&node], || {
        call(addr, "GET", "/v1/jobs/bill-1", None, b"").body["job"]["paused"] == true
    });
    assert_eq!(ids("?paused=true"), ["bill-1"]);
    expect(
        &call(addr, "POST", "/v1/jobs/bill-1/resume", Some(ACME), b""),
        202,
        "resume",
    );
    wait_watching(Duration::from_secs(30), "the job resumed", &[&node], || {
        call(addr, "GET", "/v1/jobs/bill-1", None, b"").body["job"]["paused"] == false
    });

    // A trigger fires it now: the node sees the run on `runs`.
    expect(
        &call(addr, "POST", "/v1/jobs/bill-1/trigger", Some(ACME), b""),
        202,
        "trigger",
    );
    wait_watching(
        Duration::from_secs(30),
        "the triggered run in /v1/runs",
        &[&node],
        || {
            let runs = call(addr, "GET", "/v1/runs?job=bill-1", None, b"");
            runs.body["runs"].as_array().is_some_and(|r| !r.is_empty())
        },
    );
    let reversed = br#"{"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"}"#;
    let r = call(
        addr,
        "POST",
        "/v1/jobs/bill-1/backfill",
        Some(ACME),
        reversed,
    );
    expect(&r, 400, "a reversed backfill");
    assert!(
        r.body["error"].as_str().unwrap().contains("reversed"),
        "{}",
        r.body
    );
    let range = br#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T03:00:00Z"}"#;
    expect(
        &call(addr, "POST", "/v1/jobs/bill-1/backfill", Some(ACME), range),
        202,
        "backfill",
    );
    wait_watching(
        Duration::from_secs(30),
        "the backfilled runs in /v1/runs",
        &[&node],
        || {
            let runs = call(addr, "GET", "/v1/runs?job=bill-1&limit=100", None, b"");
            let scheduled: std::collections::BTreeSet<i64> = runs.body["runs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["scheduled_ms"].as_i64())
                .collect();
            [0, 1, 2]
                .iter()
                .all(|h| scheduled.contains(&(1_767_225_600_000 + h * 3_600_000)))
        },
    );

    let parts = call(addr, "GET", "/v1/partitions", None, b"");
    expect(&parts, 200, "partitions");
    let rows = parts.body["partitions"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "{}", parts.body);
    // A partition the group has committed on (the job's) has a lag; one never read, none.
    assert!(
        rows.iter().all(|p| p["state"] == "active"),
        "{}",
        parts.body
    );
    assert!(rows.iter().any(|p| p["jobs_lag"] == 0), "{}", parts.body);

    // `tocsin status` shows the node, its partitions and the lane backlog, as of the node's
    // latest heartbeat (every 2 s: the first one, written at start, has no partitions yet).
    let status_json = || {
        let out = run_tocsin(&config, &["status", "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    wait_watching(
        Duration::from_secs(10),
        "a heartbeat with the node's partitions",
        &[&node],
        || {
            status_json()["nodes"][0]["partitions"]
                .as_array()
                .map(Vec::len)
                == Some(8)
        },
    );
    let status = status_json();
    let n1 = &status["nodes"][0];
    assert_eq!(n1["node_id"], "n1");
    assert_eq!(n1["live"], true);
    assert_eq!(n1["http"], format!("http://{addr}").as_str());
    assert_eq!(n1["partitions"].as_array().unwrap().len(), 8, "{status}");
    assert!(n1["partitions"][0]["due_backlog"].is_i64(), "{status}");
    assert_eq!(status["unowned_partitions"], json!([]));
    let table = run_tocsin(&config, &["status"]);
    assert!(
        text(&table.stdout).contains("node n1  live  ready"),
        "{}",
        text(&table.stdout)
    );

    expect(
        &call(addr, "DELETE", "/v1/jobs/nope", Some(ADMIN), b""),
        404,
        "deleting an unknown job",
    );
    expect(
        &call(addr, "DELETE", "/v1/jobs/bill-1", Some(GLOBEX), b""),
        403,
        "globex deleting acme's job",
    );
    expect(
        &call(addr, "DELETE", "/v1/jobs/bill-1", Some(ADMIN), b""),
        202,
        "delete",
    );
    wait_watching(Duration::from_secs(30), "the job gone", &[&node], || {
        call(addr, "GET", "/v1/jobs/bill-1", None, b"").status == 404
    });
    node.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_without_a_token_serves_mutations_only_on_loopback() {
    let (mut config, dir) = setup("api-open").await;
    let port = free_addr().port();
    config.scheduler.http_listen = format!("0.0.0.0:{port}");
    let node = Node::start(&config, dir.path(), "open");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_ready(addr, &node);
    let put = call(addr, "PUT", "/v1/jobs/j", None, &job("acme", "out"));
    expect(&put, 403, "a put on 0.0.0.0 without a token");
    let why = put.body["error"].as_str().unwrap();
    assert!(
        why.contains(&format!("0.0.0.0:{port}")) && why.contains("TOCSIN_API_TOKEN"),
        "{why}"
    );
    // Reads stay open.
    expect(&call(addr, "GET", "/v1/jobs", None, b""), 200, "a list");
    node.stop();

    // On loopback, no token is needed.
    let local = free_addr();
    config.scheduler.http_listen = local.to_string();
    std::fs::remove_file(dir.path().join("tocsin.toml")).unwrap();
    let node = Node::start(&config, dir.path(), "local");
    wait_ready(local, &node);
    let target = format!("{}-out", config.topic_prefix.trim_end_matches('.'));
    expect(
        &call(local, "PUT", "/v1/jobs/j", None, &job("acme", &target)),
        202,
        "a put on loopback",
    );
    node.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_redirects_a_job_it_does_not_own_to_its_owner() {
    let (mut config, dir) = setup("api-fleet").await;
    let (a, b) = (free_addr(), free_addr());
    let mut config_b = config.clone();
    config.scheduler.http_listen = a.to_string();
    config_b.scheduler.http_listen = b.to_string();
    let dir_b = tempfile::tempdir().unwrap();
    config_b.scheduler.data_dir = dir_b.path().join("sched");
    let na = Node::start(&config, dir.path(), "a");
    let nb = Node::start(&config_b, dir_b.path(), "b");
    // Both own some partitions, and each has heard the other's heartbeat.
    wait_watching(
        Duration::from_secs(90),
        "two nodes sharing the partitions",
        &[&na, &nb],
        || {
            let pa = call(a, "GET", "/v1/partitions", None, b"");
            let pb = call(b, "GET", "/v1/partitions", None, b"");
            let count = |p: &Answer| p.body["partitions"].as_array().map_or(0, Vec::len);
            count(&pa) > 0
                && count(&pb) > 0
                && count(&pa) + count(&pb) == 8
                && get(a, "/readyz").is_some_and(|(c, _)| c == 200)
                && get(b, "/readyz").is_some_and(|(c, _)| c == 200)
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    let owned_by_b: Vec<i64> = call(b, "GET", "/v1/partitions", None, b"").body["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["partition"].as_i64().unwrap())
        .collect();
    let id = (0..1000)
        .map(|i| format!("job-{i}"))
        .find(|id| {
            owned_by_b
                .contains(&(tocsin::kafka::partitioner::partition_for(id.as_bytes(), 8) as i64))
        })
        .unwrap();
    let asked = call(a, "GET", &format!("/v1/jobs/{id}/next?count=2"), None, b"");
    expect(&asked, 307, "a job of b's partitions asked of a");
    let location = asked
        .head
        .lines()
        .find_map(|l| {
            l.strip_prefix("location: ")
                .or_else(|| l.strip_prefix("Location: "))
        })
        .unwrap_or_else(|| panic!("no Location: {}", asked.head));
    assert_eq!(location, format!("http://{b}/v1/jobs/{id}/next?count=2"));
    // `tocsin status` shows both nodes and every partition owned.
    let out = run_tocsin(&config, &["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["nodes"].as_array().unwrap().len(), 2, "{status}");
    assert_eq!(status["unowned_partitions"], json!([]), "{status}");

    // `tocsin jobs list` merges both nodes' answers: every job, and no partition left to the
    // topic; with b stopped, b's partitions come from the topic, and the list is as whole.
    let ids: Vec<String> = (0..24).map(|i| format!("listed-{i}")).collect();
    let defs: Vec<_> = ids
        .iter()
        .map(|id| tocsin::model::job::JobDefinition {
            paused: id.ends_with('7'),
            ..tocsin::model::job::JobDefinition::new(id, "acme", every(60_000), exec("true"))
        })
        .collect();
    put_jobs(&config, &defs).await;
    let list = |args: &[&str]| {
        let out = run_tocsin(&config, &[&["jobs", "list", "--json"], args].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let ids: Vec<String> = listed
            .iter()
            .map(|d| d["id"].as_str().unwrap().to_owned())
            .collect();
        (ids, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let mut want: Vec<String> = ids.clone();
    want.sort();
    let mut merged = (Vec::new(), String::new());
    wait_watching(
        Duration::from_secs(30),
        "both nodes to list every job",
        &[&na, &nb],
        || {
            merged = list(&[]);
            merged.0 == want
        },
    );
    assert!(
        !merged.1.contains("from the topic") && !merged.1.contains("did not answer"),
        "a partition was read from the topic: {}",
        merged.1
    );
    let paused = list(&["--paused"]).0;
    assert_eq!(paused, ["listed-17", "listed-7"], "the nodes filter");
    assert_eq!(list(&["--from-topic"]).0, want);
    let b_pid = nb.child.id().to_string();
    let stop = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &b_pid])
            .status()
            .unwrap()
            .success());
    };
    stop("-STOP");
    let (listed, said) = list(&[]);
    stop("-CONT");
    assert_eq!(listed, want, "with b stopped");
    assert!(said.contains("did not answer"), "{said}");
    nb.stop();
    na.stop();
}
