//! The HTTP endpoint of real nodes against the real broker: liveness at once, readiness once
//! every partition is active, fires in `/metrics` and `/status`, 404 and 405, a worker's
//! readiness, and a taken port as a start-up error naming the address.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::fleet::*;
use common::http::*;
use common::*;

fn status_json(addr: SocketAddr) -> serde_json::Value {
    let (code, body) = get(addr, "/status").expect("/status answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status is not JSON ({e}): {body}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_serve_health_readiness_metrics_and_status() {
    let (mut config, dir) = setup("http").await;
    let sched_addr = free_addr();
    let work_addr = free_addr();
    config.scheduler.http_listen = sched_addr.to_string();
    config.worker.http_listen = work_addr.to_string();
    let partitions = config.topics.job_partitions as u64;

    let node = Node::start(&config, dir.path(), "n1");
    let nodes = [&node];
    wait_watching(
        Duration::from_secs(30),
        "/healthz to answer 200",
        &nodes,
        || get(sched_addr, "/healthz").is_some_and(|(c, b)| c == 200 && b == "ok\n"),
    );

    // Not ready says why; ready only once this only node owns every partition and all are
    // active: never before its first assignment (when it owns none), nor while restoring.
    let mut saw_not_ready = None;
    wait_watching(
        Duration::from_secs(60),
        "/readyz 200 with every partition owned",
        &nodes,
        || match get(sched_addr, "/readyz") {
            Some((200, body)) => {
                assert_eq!(body, "ready\n");
                let s = &status_json(sched_addr)["scheduler"];
                assert_eq!(
                    s["owned"], partitions,
                    "ready before owning every partition: {s}"
                );
                assert_eq!(s["active"], partitions, "ready while restoring: {s}");
                true
            }
            Some((503, body)) => {
                // The broker probe's reason may come first, in the node's first moments.
                assert!(
                    body.starts_with("not ready: ") && body.contains("scheduler: "),
                    "{body}"
                );
                saw_not_ready = Some(body);
                false
            }
            other => panic!("/readyz answered {other:?}"),
        },
    );
    let before = saw_not_ready.expect("a node just started is not ready before it is assigned");
    eprintln!("not ready before: {before}");
    let status = status_json(sched_addr);
    assert_eq!(status["node_id"], "n1");
    assert_eq!(status["ready"], true);
    assert_eq!(status["scheduler"]["ready"], true);
    assert_eq!(status["scheduler"]["owned"], partitions);
    assert_eq!(status["scheduler"]["active"], partitions);
    let (code, metrics) = get(sched_addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        sample(&metrics, "tocsin_scheduler_partitions_owned"),
        Some(partitions as f64),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "tocsin_scheduler_partitions_active"),
        Some(partitions as f64)
    );
    assert_eq!(sample(&metrics, "tocsin_scheduler_ready"), Some(1.0));

    // A job every second: fires show up in both the Prometheus counter and /status.
    put_jobs(&config, &[job("tick", "acme", every(1000))]).await;
    wait_watching(
        Duration::from_secs(30),
        "tocsin_runs_fired_total >= 2 in /metrics",
        &nodes,
        || {
            get(sched_addr, "/metrics")
                .and_then(|(_, m)| sample(&m, "tocsin_runs_fired_total"))
                .is_some_and(|v| v >= 2.0)
        },
    );
    let (_, metrics) = get(sched_addr, "/metrics").unwrap();
    assert!(
        metrics.contains("# TYPE tocsin_runs_fired_total counter"),
        "{metrics}"
    );
    // The goals' telemetry: histograms with buckets (not summaries) that saw the fires, the
    // restores and the transactions; the rebalance and the partitions by state.
    for h in [
        "tocsin_fire_lag_seconds",
        "tocsin_transaction_duration_seconds",
        "tocsin_restore_duration_seconds",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {h} histogram")),
            "{h} is not a histogram:\n{metrics}"
        );
        assert!(
            metrics.contains(&format!("{h}_bucket{{le=\"0.1\"}}")),
            "{h} has no buckets:\n{metrics}"
        );
        let count = sample(&metrics, &format!("{h}_count")).unwrap_or(0.0);
        assert!(count > 0.0, "{h}_count is {count}:\n{metrics}");
    }
    let restores = sample(&metrics, "tocsin_restore_duration_seconds_count").unwrap();
    assert_eq!(restores, partitions as f64, "one restore per partition");
    assert!(
        sample(&metrics, "tocsin_rebalances_total{kind=\"assign\"}").is_some_and(|v| v >= 1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "tocsin_scheduler_partitions{state=\"active\"}"),
        Some(partitions as f64),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE tocsin_scheduler_due_runs gauge")
            && sample(&metrics, "tocsin_scheduler_due_runs").is_some(),
        "no due backlog gauge:\n{metrics}"
    );
    assert_eq!(
        sample(&metrics, "tocsin_tenant_runs_fired_total{tenant=\"acme\"}").map(|v| v >= 2.0),
        Some(true),
        "{metrics}"
    );
    let fired = sample(&metrics, "tocsin_runs_fired_total").unwrap();
    let fires = status_json(sched_addr)["scheduler"]["fires"]
        .as_f64()
        .unwrap();
    assert!(fires >= fired, "/status fires {fires} < /metrics {fired}");

    // Wrong path, wrong method, garbage: answered, and the endpoint keeps serving.
    assert_eq!(get(sched_addr, "/nope").map(|r| r.0), Some(404));
    assert_eq!(
        ask(sched_addr, "DELETE /status HTTP/1.1\r\n\r\n").map(|r| r.0),
        Some(405)
    );
    assert_eq!(
        ask(sched_addr, "\u{1}\u{2} what\r\n\r\n").map(|r| r.0),
        Some(400)
    );
    assert_eq!(get(sched_addr, "/healthz").map(|r| r.0), Some(200));

    // A worker's endpoint: ready once it consumes its lanes; it reports no scheduler.
    let worker = Node::worker(&config, dir.path(), "w1", "default");
    wait_watching(
        Duration::from_secs(30),
        "worker /readyz 200",
        &[&node, &worker],
        || {
            let ready = get(work_addr, "/readyz").is_some_and(|(c, _)| c == 200);
            // Ready means assigned: its lane exists, so the group assigns it within seconds.
            assert!(
                !ready || worker.log_text().contains("lane partitions assigned"),
                "the worker was ready before the group assigned it its lane"
            );
            ready
        },
    );
    // It takes the job's runs (a handler it does not register: each attempt fails) and says so
    // in its histograms and its outcome counter.
    let outcomes = |m: &str| -> f64 {
        ["succeeded", "retrying", "dead"]
            .iter()
            .filter_map(|o| sample(m, &format!("tocsin_worker_runs_total{{outcome=\"{o}\"}}")))
            .sum()
    };
    wait_watching(
        Duration::from_secs(30),
        "the worker to finish attempts",
        &[&node, &worker],
        || get(work_addr, "/metrics").is_some_and(|(_, m)| outcomes(&m) >= 1.0),
    );
    let (_, wm) = get(work_addr, "/metrics").unwrap();
    for h in [
        "tocsin_worker_lag_seconds",
        "tocsin_handler_duration_seconds",
    ] {
        assert!(wm.contains(&format!("# TYPE {h} histogram")), "{h}:\n{wm}");
        let count = sample(&wm, &format!("{h}_count")).unwrap_or(0.0);
        assert!(count > 0.0, "{h}_count is {count}:\n{wm}");
    }
    let ws = status_json(work_addr);
    assert_eq!(ws["node_id"], "w1");
    assert_eq!(ws["worker"]["ready"], true);
    assert!(ws.get("scheduler").is_none(), "{ws}");
    let (code, metrics) = get(work_addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        sample(&metrics, "tocsin_worker_ready"),
        Some(1.0),
        "{metrics}"
    );

    // Both stop cleanly on SIGTERM with the endpoint running, and the endpoint goes with them.
    worker.stop();
    node.stop();
    assert!(get(sched_addr, "/healthz").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_taken_port_stops_the_node_with_the_address_in_the_error() {
    let (config, dir) = setup("http-taken").await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let data = dir.path().join("sched");
    let out = run_tocsin(
        &config,
        &[
            "scheduler",
            "--node-id",
            "taken",
            "--data-dir",
            data.to_str().unwrap(),
            "--http-listen",
            &addr,
        ],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "the node started anyway:\n{stderr}");
    assert!(
        stderr.contains(&format!("could not bind the HTTP endpoint to {addr}")),
        "{stderr}"
    );
}

/// A fleet with more nodes than partitions: the node the group gives nothing becomes ready
/// (librdkafka reports no empty assignment, so after `IDLE_READY_AFTER` in the group with
/// none), and the other once its one partition is active.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_assigned_nothing_is_ready_after_its_assignment() {
    let (config, dir) = setup_sized("http-idle", 1).await;
    let addrs = [free_addr(), free_addr()];
    let nodes: Vec<Node> = ["n1", "n2"]
        .iter()
        .zip(&addrs)
        .map(|(id, addr)| {
            let data = dir.path().join(format!("data-{id}"));
            Node::spawn(
                &config,
                dir.path(),
                id,
                &[
                    "scheduler",
                    "--node-id",
                    id,
                    "--data-dir",
                    data.to_str().unwrap(),
                    "--http-listen",
                    &addr.to_string(),
                ],
            )
        })
        .collect();
    let watched: Vec<&Node> = nodes.iter().collect();
    wait_watching(
        Duration::from_secs(60),
        "both nodes ready",
        &watched,
        || {
            addrs
                .iter()
                .all(|a| get(*a, "/readyz").is_some_and(|(c, _)| c == 200))
        },
    );
    let owned: Vec<u64> = addrs
        .iter()
        .map(|a| status_json(*a)["scheduler"]["owned"].as_u64().unwrap())
        .collect();
    let mut sorted = owned.clone();
    sorted.sort();
    assert_eq!(sorted, [0, 1], "one partition, two nodes: {owned:?}");
    for n in nodes {
        n.stop();
    }
}
