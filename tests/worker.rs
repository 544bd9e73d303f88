//! Workers against the real broker, with a scheduler process: a worker killed mid-run and
//! the ledger that keeps a redelivered run from running twice.

mod common;

use std::time::Duration;

use common::fleet::*;
use common::topics::{events, read_all};
use tocsin::codec::{self, Framing};
use tocsin::model::job::{HandlerKind, HandlerSpec, JobDefinition, ScheduleSpec};
use tocsin::model::records::{FireReason, Run, RunEventKind};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn once_in(id: &str, tenant: &str, secs: i64, handler: HandlerSpec) -> JobDefinition {
    let mut j = job(
        id,
        tenant,
        ScheduleSpec::Once {
            at_ms: (now_ms() / 1000 + secs) * 1000,
        },
    );
    j.handler = handler;
    j
}

fn exec(script: &str) -> HandlerSpec {
    HandlerSpec {
        kind: HandlerKind::Exec,
        target: "sh".into(),
        payload: vec![],
        headers: Default::default(),
        method: None,
        args: vec!["-c".into(), script.into()],
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_worker_s_run_completes_elsewhere_and_a_redelivery_is_not_run_again() {
    let _g = SERIAL.lock().await;
    let (config, dir) = setup("killworker").await;
    let mut long = once_in("long", "acme", 2, exec("sleep 4"));
    long.timeout_ms = 30_000;
    let _node = Node::start(&config, dir.path(), "s1");
    let w1 = Node::worker(&config, dir.path(), "w1", "p");
    let w2 = Node::worker(&config, dir.path(), "w2", "p");
    std::thread::sleep(Duration::from_secs(3));
    put_jobs(&config, &[long]).await;
    let mut runner = String::new();
    wait_until(Duration::from_secs(30), "the run to start", || {
        let ev = events(&config, Duration::from_millis(500));
        match ev
            .iter()
            .find(|e| e.job_id == "long" && e.kind == RunEventKind::Started)
        {
            Some(e) => {
                runner = e.node.clone();
                true
            }
            None => false,
        }
    });
    let (killed, survivor) = if runner == "w1" { (w1, w2) } else { (w2, w1) };
    killed.kill();
    wait_until(
        Duration::from_secs(90),
        "the run to succeed on the other worker",
        || {
            events(&config, Duration::from_millis(500)).iter().any(|e| {
                e.job_id == "long" && e.kind == RunEventKind::Succeeded && e.node == survivor.id
            })
        },
    );

    // Deliver the same run again: the ledger acknowledges it without running it.
    let lane = read_all(&config, "lane.acme", Duration::from_secs(1));
    let (key, value) = lane.into_iter().next().unwrap();
    let run: Run = codec::decode(&value).unwrap();
    assert_eq!(run.reason, FireReason::Schedule);
    produce_raw(
        &config,
        "lane.acme",
        &[(key, Some(codec::encode(&run, &Framing::SingleObject)))],
    )
    .await;
    std::thread::sleep(Duration::from_secs(4));
    let ev = events(&config, Duration::from_secs(1));
    let started_on_survivor = ev
        .iter()
        .filter(|e| e.job_id == "long" && e.kind == RunEventKind::Started && e.node == survivor.id)
        .count();
    assert_eq!(
        started_on_survivor, 1,
        "the ledger let a finished run execute again"
    );
    assert!(
        survivor.log_text().contains("already finished"),
        "redelivery not acknowledged"
    );
}
