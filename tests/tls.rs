//! TLS in both directions, against real parts. A broker of the test's own whose only client
//! listener is SASL_SSL with SCRAM-SHA-512 (`TOCSIN_KAFKA_TLS=1 scripts/kafka`: certificates made
//! with openssl, users created with Kafka's own tools): a scheduler and a worker, each logged in
//! as its own SCRAM user and trusting the broker's CA, fire and run jobs through it, and a wrong
//! password or an untrusted CA is refused: a node so refused does not start and names the cause
//! (`authentication`, `tls`), and a running worker whose password was rotated says so in
//! `/readyz` and `/status` once the broker restarts. And `https` handler targets on a local TLS server with
//! a CA made here: a run succeeds when the worker trusts the CA (`worker.http.ca_file`), and goes
//! to `dead` at its first attempt, naming what is wrong with the certificate, when it does not
//! or when the certificate names another host.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::broker::OwnBroker;
use common::fleet::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use tocsin::config::Config;
use tocsin::model::job::JobDefinition;
use tocsin::model::records::RunEventKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

const USERS: &str = "scheduler:sched-pw,worker-alice:wa-pw";

fn openssl(args: &[&str]) {
    common::run_ok(
        Command::new("openssl").args(args),
        &format!("openssl {args:?}"),
    );
}

/// A CA in `dir/NAME.pem` (its key beside it).
fn make_ca(dir: &Path, name: &str) -> PathBuf {
    let pem = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN={name}"),
        "-keyout",
        key.to_str().unwrap(),
        "-out",
        pem.to_str().unwrap(),
    ]);
    pem
}

/// A server certificate for `san` signed by the CA `ca`, as DER (certificate, PKCS#8 key).
fn make_cert(dir: &Path, ca: &Path, name: &str, san: &str) -> (Vec<u8>, Vec<u8>) {
    let p = |ext: &str| {
        dir.join(format!("{name}.{ext}"))
            .to_str()
            .unwrap()
            .to_owned()
    };
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=tocsin test server",
        "-keyout",
        &p("key"),
        "-out",
        &p("csr"),
    ]);
    std::fs::write(p("ext"), format!("subjectAltName={san}\n")).unwrap();
    let ca_key = ca.with_extension("key");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &p("csr"),
        "-CA",
        ca.to_str().unwrap(),
        "-CAkey",
        ca_key.to_str().unwrap(),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &p("ext"),
        "-out",
        &p("pem"),
    ]);
    openssl(&[
        "x509",
        "-in",
        &p("pem"),
        "-outform",
        "DER",
        "-out",
        &p("der"),
    ]);
    openssl(&[
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        &p("key"),
        "-outform",
        "DER",
        "-out",
        &p("key.der"),
    ]);
    (
        std::fs::read(p("der")).unwrap(),
        std::fs::read(p("key.der")).unwrap(),
    )
}

/// An HTTPS server on 127.0.0.1 presenting `cert`, answering 200 to every request; counts the
/// requests it answered (a client that refused the certificate sends none).
async fn https_server(cert: Vec<u8>, key: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert)],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key)),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/run", listener.local_addr().unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, count) = (acceptor.clone(), count.clone());
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // The head, then the body its Content-Length announces.
                loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                let _ = s
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = s.shutdown().await;
            });
        }
    });
    (url, answered)
}

#[tokio::test(flavor = "multi_thread")]
async fn https_targets_succeed_with_a_trusted_ca_and_a_bad_certificate_fails_naming_why() {
    let (mut config, dir) = setup("https").await;
    let pki = dir.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let ca = make_ca(&pki, "test-ca");
    let rogue = make_ca(&pki, "rogue-ca");
    let (cert, key) = make_cert(&pki, &ca, "good", "IP:127.0.0.1");
    let (good, good_seen) = https_server(cert, key).await;
    let (cert, key) = make_cert(&pki, &rogue, "untrusted", "IP:127.0.0.1");
    let (untrusted, untrusted_seen) = https_server(cert, key).await;
    let (cert, key) = make_cert(&pki, &ca, "elsewhere", "DNS:elsewhere.test");
    let (wrong_name, wrong_name_seen) = https_server(cert, key).await;

    config.worker.http.allow_hosts = vec!["127.0.0.1".into()];
    config.worker.http.ca_file = Some(ca.clone());
    tocsin::kafka::admin::Admin::new(&config)
        .unwrap()
        .ensure(&[tocsin::kafka::admin::lane_topic(&config, "acme")])
        .await
        .unwrap();
    let w = Node::worker(&config, dir.path(), "w1", "p");
    let runs = [
        lane_run("good", "acme", http(&good)),
        lane_run("untrusted", "acme", http(&untrusted)),
        lane_run("wrong-name", "acme", http(&wrong_name)),
    ];
    put_runs(&config, &runs).await;

    let mut dead = Vec::new();
    wait_watching(
        Duration::from_secs(60),
        "the good run to succeed and the other two to go dead",
        &[&w],
        || {
            dead = common::topics::dead_letters(&config);
            let ev = common::topics::events(&config, Duration::from_millis(300));
            ev.iter()
                .any(|e| e.job_id == "good" && e.kind == RunEventKind::Succeeded)
                && ["untrusted", "wrong-name"]
                    .iter()
                    .all(|j| dead.iter().any(|d| d.run.job_id == *j))
        },
    );
    assert_eq!(
        good_seen.load(Ordering::SeqCst),
        1,
        "the good target was not called once"
    );
    let error = |job: &str| {
        let d = dead.iter().find(|d| d.run.job_id == job).unwrap();
        assert_eq!(d.attempts, 1, "a certificate error was retried: {d:?}");
        d.error.clone()
    };
    let e = error("untrusted");
    assert!(
        e.contains(&untrusted)
            && e.contains(
                "TLS: the server's certificate is signed by a CA this worker does not trust"
            )
            && e.contains("worker.http.ca_file"),
        "{e}"
    );
    let e = error("wrong-name");
    assert!(
        e.contains(&wrong_name) && e.contains("not valid for the target's host name"),
        "{e}"
    );
    assert_eq!(
        untrusted_seen.load(Ordering::SeqCst),
        0,
        "a request crossed a refused handshake"
    );
    assert_eq!(wrong_name_seen.load(Ordering::SeqCst), 0);
    w.stop();
}

/// A worker whose `worker.http.ca_file` is not a CA file does not start, and says which setting.
#[test]
fn a_worker_with_a_ca_file_that_holds_no_certificate_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("ca.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    let mut config = common::test_config("badca");
    config.worker.data_dir = dir.path().join("work");
    config.worker.http.ca_file = Some(bad.clone());
    let mut w = Node::worker(&config, dir.path(), "w1", "p");
    let status = w.child.wait().unwrap();
    let log = w.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "invalid setting worker.http.ca_file = {:?}: holds no PEM certificate",
            bad.display().to_string()
        )),
        "{log}"
    );
}

/// `config` logged in over SASL_SSL as the SCRAM user `user`, trusting the CA `ca`.
fn scram(config: &Config, user: &str, password: &str, ca: Option<&Path>) -> Config {
    let ca = ca.map(|p| p.display().to_string());
    let mut settings = vec![
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", user),
        ("sasl.password", password),
    ];
    if let Some(ca) = &ca {
        settings.push(("ssl.ca.location", ca));
    }
    common::with_kafka(config, &settings)
}

fn password(user: &str) -> &'static str {
    common::password_of(USERS, user)
}

/// Keeps the errors librdkafka reports on the side (an authentication or TLS refusal shows
/// there; the request itself only fails for want of a broker).
#[derive(Default)]
struct Errors(std::sync::Mutex<Vec<String>>);

impl rdkafka::ClientContext for Errors {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.0.lock().unwrap().push(format!("{error}: {reason}"));
    }
}

impl rdkafka::consumer::ConsumerContext for Errors {}

/// The broker's metadata as `config` asks for it, or the errors librdkafka reported meanwhile.
fn metadata(config: &Config) -> Result<usize, String> {
    let consumer: BaseConsumer<Errors> = tocsin::kafka::base_config(config)
        .create_with_context(Errors::default())
        .unwrap();
    consumer
        .fetch_metadata(None, Duration::from_secs(15))
        .map(|m| m.topics().len())
        .map_err(|e| {
            // Errors reach the context through the consumer's queue.
            for _ in 0..10 {
                let _ = consumer.poll(Duration::from_millis(100));
            }
            let mut seen = consumer.context().0.lock().unwrap().clone();
            seen.push(e.to_string());
            seen.join("; ")
        })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scheduler_and_a_worker_fire_and_run_jobs_over_sasl_ssl_with_scram() {
    let broker = OwnBroker::start(
        "tls",
        &[
            ("TOCSIN_KAFKA_TLS", "1"),
            ("TOCSIN_KAFKA_SASL_USERS", USERS),
        ],
    );
    let ca = broker.state.join("tls/ca.pem");
    let admin_password = std::fs::read_to_string(broker.state.join("sasl")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut base = common::test_config_on(&broker.bootstrap, "tls");
    // The broker's ACLs (the recipe's) grant the default scheduler group; the broker is the
    // test's own, so no other test shares that group.
    base.scheduler.group_id = tocsin::config::Config::default().scheduler.group_id;
    base.scheduler.data_dir = dir.path().join("sched");
    base.worker.data_dir = dir.path().join("work");
    let admin = scram(&base, "admin", admin_password.trim(), Some(&ca));

    // What the listener refuses: a wrong password, and a client that does not trust its CA.
    assert!(metadata(&admin).is_ok(), "{:?}", metadata(&admin));
    let wrong = metadata(&scram(&base, "scheduler", "not-the-password", Some(&ca)));
    assert!(
        wrong
            .as_ref()
            .is_err_and(|e| e.contains("Authentication failed") && e.contains("SCRAM-SHA-512")),
        "a wrong SCRAM password was let in: {wrong:?}"
    );
    let untrusted = metadata(&scram(&base, "scheduler", password("scheduler"), None));
    assert!(
        untrusted
            .as_ref()
            .is_err_and(|e| e.contains("certificate verify failed")),
        "a client that does not trust the broker's CA: {untrusted:?}"
    );

    // A node refused the same ways does not start, and its error names the cause, typed.
    let refused = [
        (
            "authentication",
            "Authentication failed",
            Some(ca.as_path()),
            "not-the-password",
        ),
        (
            "tls",
            "certificate verify failed",
            None,
            password("worker-alice"),
        ),
    ];
    for (kind, words, trusted, pw) in refused {
        let config = scram(&base, "worker-alice", pw, trusted);
        let mut node =
            Node::tenant_worker(&config, dir.path(), "alice", &format!("refused-{kind}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = node.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "a node refused for {kind} runs on"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let log = node.log_text();
        assert!(!status.success(), "{log}");
        let said = log
            .lines()
            .find(|l| l.contains("cannot reach Kafka"))
            .unwrap_or("");
        assert!(
            said.contains(&format!("within 10 s: {kind}: ")) && said.contains(words),
            "a node refused for {kind} said: {log}"
        );
        eprintln!("refused for {kind}: {said}");
    }

    ensure_fleet_topics(&admin).await;
    broker.acl_recipe(&base.topic_prefix, &[]);

    let as_user = |user: &str| scram(&base, user, password(user), Some(&ca));
    let scheduler = Node::spawn_in(
        &as_user("scheduler"),
        dir.path(),
        "s1",
        &["scheduler", "--node-id", "s1"],
    );
    let mut worker_config = as_user("worker-alice");
    let worker_http = common::http::free_addr();
    worker_config.worker.http_listen = worker_http.to_string();
    let worker = Node::tenant_worker(&worker_config, dir.path(), "alice", "w-alice");
    let ran = dir.path().join("ran");
    let handler = exec(&format!("echo \"$TOCSIN_RUN_ID\" >> '{}'", ran.display()));
    let job = JobDefinition::new("report", "alice", every(1000), handler);
    put_jobs(&admin, &[job]).await;

    let runs = || std::fs::read_to_string(&ran).unwrap_or_default();
    wait_watching(
        Duration::from_secs(120),
        "three runs fired by the scheduler and run by the worker over SASL_SSL",
        &[&scheduler, &worker],
        || runs().lines().count() >= 3,
    );

    // The worker's password changed while it runs (a rotation it missed), and the broker
    // restarted: its clients log in again with the old one, and its `/readyz` and `/status`
    // name the refusal, typed, as soon as it comes.
    let classpath = broker.run(&["classpath"]);
    let admin_props = broker.state.join("admin.properties");
    common::run_ok(
        Command::new("java")
            .args([
                "-cp",
                &classpath,
                "kafka.admin.ConfigCommand",
                "--bootstrap-server",
            ])
            .arg(&broker.bootstrap)
            .arg("--command-config")
            .arg(&admin_props)
            .args([
                "--alter",
                "--entity-type",
                "users",
                "--entity-name",
                "worker-alice",
            ])
            .args([
                "--add-config",
                "SCRAM-SHA-512=[iterations=4096,password=rotated-pw]",
            ]),
        "ConfigCommand: a new password for worker-alice",
    );
    broker.stop();
    broker.start_again();
    let mut said = (String::new(), serde_json::Value::Null);
    wait_watching(
        Duration::from_secs(60),
        "the worker to say its login is refused",
        &[&worker],
        || {
            let ready = common::http::get(worker_http, "/readyz").unwrap_or_default();
            let status = common::http::get(worker_http, "/status").unwrap_or_default();
            said = (ready.1, serde_json::from_str(&status.1).unwrap_or_default());
            ready.0 == 503
                && said.0.starts_with("not ready: brokers: authentication: ")
                && said.1["brokers"]["last_client_error"]["kind"] == "authentication"
        },
    );
    assert!(
        said.0.contains("Authentication failed"),
        "/readyz: {}",
        said.0
    );
    assert_eq!(said.1["ready"], false, "/status: {}", said.1);
    assert_eq!(said.1["brokers"]["reachable"], false, "/status: {}", said.1);
    eprintln!(
        "after the rotation: /readyz {:?}; /status brokers {}",
        said.0, said.1["brokers"]
    );
    worker.kill();
    scheduler.stop();
    let lines: Vec<String> = runs().lines().map(str::to_owned).collect();
    let distinct: std::collections::BTreeSet<&String> = lines.iter().collect();
    assert_eq!(distinct.len(), lines.len(), "a run ran twice: {lines:?}");
    drop(broker);
}
