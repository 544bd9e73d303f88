//! The HTTP endpoint of every node: `/metrics` (Prometheus text), `/healthz`,
//! `/readyz` and `/status` (JSON).
//!
//! It owns: the listening socket and the process's metrics recorder. It must never change the
//! node it reports on (it only reads its status), and never panic or hold memory without bound
//! because of what a client sends: request heads are capped, slow clients time out, and each
//! connection answers one request and closes.
//!
//! A deliberately small HTTP/1.1 server (GET and HEAD, `Connection: close`) rather than a
//! framework: four read-only routes do not justify one, and probes and Prometheus need no more.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::node::{NodeStatus, Reach};

/// Largest request head (request line and headers) read; a longer one gets 431.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Time a client has to send its request head, and then to take the response.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; further ones wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;
/// After answering, how long and how much of what the client still sends is read and dropped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
const DRAIN_BYTES: usize = 64 * 1024;
/// How often the recorder folds histogram samples even when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("could not bind the HTTP endpoint to {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = HttpError> = std::result::Result<T, E>;

/// The process's Prometheus recorder, installed on first use. `None` when another recorder
/// was installed first (an embedding program's): `/metrics` then says so instead of lying.
pub fn prometheus() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| match PrometheusBuilder::new().install_recorder() {
            Ok(handle) => {
                describe_metrics();
                Some(handle)
            }
            Err(e) => {
                warn!(error = %e, "could not install the prometheus recorder; /metrics is disabled");
                None
            }
        })
        .clone()
}

fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        "tocsin_runs_fired_total",
        "Runs committed to the tenant lanes."
    );
    describe_counter!(
        "tocsin_transactions_aborted_total",
        "Firing transactions aborted (broker trouble, fencing)."
    );
    describe_counter!(
        "tocsin_instants_missed_total",
        "Instants past the misfire threshold, handled by the job's misfire policy."
    );
    describe_counter!(
        "tocsin_records_rejected_total",
        "Records of jobs or control set aside on jobs.rejected."
    );
    describe_gauge!(
        "tocsin_scheduler_partitions_owned",
        "Partitions of jobs assigned to this scheduler node."
    );
    describe_gauge!(
        "tocsin_scheduler_partitions_active",
        "Owned partitions restored and firing."
    );
    describe_gauge!(
        "tocsin_scheduler_ready",
        "1 when every owned partition is active and the last step succeeded."
    );
    describe_gauge!(
        "tocsin_worker_ready",
        "1 when the worker consumes its lanes."
    );
}

/// What the endpoint reports on: the roles this process runs.
#[derive(Clone)]
pub struct Endpoint {
    node_id: String,
    scheduler: Option<Arc<NodeStatus>>,
    worker_ready: Option<Arc<AtomicBool>>,
    brokers: Option<Arc<Reach>>,
    metrics: Option<PrometheusHandle>,
}

impl Endpoint {
    /// An endpoint that renders `metrics`; [`prometheus`] gives the process's recorder.
    pub fn new(node_id: impl Into<String>, metrics: Option<PrometheusHandle>) -> Endpoint {
        Endpoint {
            node_id: node_id.into(),
            scheduler: None,
            worker_ready: None,
            brokers: None,
            metrics,
        }
    }

    pub fn with_scheduler(mut self, status: Arc<NodeStatus>) -> Endpoint {
        // Counters exist from the start, so a scrape before the first fire shows 0 and
        // `rate()` has a first sample.
        for name in [
            "tocsin_runs_fired_total",
            "tocsin_transactions_aborted_total",
            "tocsin_instants_missed_total",
            "tocsin_records_rejected_total",
        ] {
            metrics::counter!(name).increment(0);
        }
        self.scheduler = Some(status);
        self
    }

    /// `ready` is set by the worker's caller once the worker consumes its lanes.
    pub fn with_worker(mut self, ready: Arc<AtomicBool>) -> Endpoint {
        self.worker_ready = Some(ready);
        self
    }

    /// `reach` is what the node's broker probe finds (`kafka::reach`): no broker answering
    /// makes the node not ready, and for longer than the stall limit, unhealthy.
    pub fn with_brokers(mut self, reach: Arc<Reach>) -> Endpoint {
        self.brokers = Some(reach);
        self
    }

    /// Why the node cannot make progress on its own, or `None` while it can.
    fn stalled(&self) -> Option<String> {
        if let Some(r) = &self.brokers {
            if let Some(Some(for_ms)) = r.unreachable_for(now_ms()) {
                if for_ms > crate::node::STALL_LIMIT_MS {
                    return Some(format!(
                        "no broker answered for {} s (limit {} s): {}",
                        for_ms / 1000,
                        crate::node::STALL_LIMIT_MS / 1000,
                        r.last_error
                            .lock()
                            .unwrap()
                            .as_deref()
                            .unwrap_or("no answer")
                    ));
                }
            }
        }
        let s = self.scheduler.as_ref()?;
        let since = s.failing_since_ms.load(Ordering::Relaxed);
        let failing_for = now_ms() - since;
        if since == 0 || failing_for <= crate::node::STALL_LIMIT_MS {
            return None;
        }
        let last = s.last_error.lock().unwrap().clone();
        Some(format!(
            "scheduler: every step failed for {} s (limit {} s); last error: {}",
            failing_for / 1000,
            crate::node::STALL_LIMIT_MS / 1000,
            last.map_or_else(|| "none".into(), |(_, e)| e)
        ))
    }

    /// Why the node is not ready, or `None` when it is.
    fn not_ready(&self) -> Option<String> {
        let mut why = Vec::new();
        if let Some(r) = &self.brokers {
            match r.unreachable_for(now_ms()) {
                None => {}
                Some(None) => why.push("brokers: none has answered yet".to_owned()),
                Some(Some(for_ms)) => why.push(format!(
                    "brokers: none answered for {} s: {}",
                    for_ms / 1000,
                    r.last_error
                        .lock()
                        .unwrap()
                        .as_deref()
                        .unwrap_or("no answer")
                )),
            }
        }
        if let Some(s) = &self.scheduler {
            if !s.ready.load(Ordering::Relaxed) {
                let owned = s.owned.load(Ordering::Relaxed);
                let active = s.active.load(Ordering::Relaxed);
                why.push(if active < owned {
                    format!(
                        "scheduler: {} of {owned} owned partitions still restoring",
                        owned - active
                    )
                } else {
                    match s.last_error.lock().unwrap().clone() {
                        Some((_, e)) if s.failing_since_ms.load(Ordering::Relaxed) != 0 => {
                            format!("scheduler: the last step failed: {e}")
                        }
                        _ => "scheduler: not in the group yet".to_owned(),
                    }
                });
            }
        }
        if let Some(r) = &self.worker_ready {
            if !r.load(Ordering::Relaxed) {
                why.push("worker: not consuming its lanes yet".to_owned());
            }
        }
        (!why.is_empty()).then(|| why.join("; "))
    }

    fn status_json(&self) -> String {
        let mut doc = serde_json::json!({
            "node_id": self.node_id,
            "version": env!("CARGO_PKG_VERSION"),
            "ready": self.not_ready().is_none(),
        });
        if let Some(s) = &self.scheduler {
            doc["scheduler"] = serde_json::json!({
                "ready": s.ready.load(Ordering::Relaxed),
                "owned": s.owned.load(Ordering::Relaxed),
                "active": s.active.load(Ordering::Relaxed),
                "fires": s.fires.load(Ordering::Relaxed),
                "last_error": s.last_error.lock().unwrap().as_ref().map(|(at, e)| {
                    serde_json::json!({ "at_ms": at, "error": e })
                }),
            });
        }
        if let Some(r) = &self.worker_ready {
            doc["worker"] = serde_json::json!({ "ready": r.load(Ordering::Relaxed) });
        }
        if let Some(r) = &self.brokers {
            doc["brokers"] = serde_json::json!({
                "answered_ms": r.answered_ms.load(Ordering::Relaxed),
                "last_error": *r.last_error.lock().unwrap(),
            });
        }
        let mut body = doc.to_string();
        body.push('\n');
        body
    }

    fn render_metrics(&self) -> Option<String> {
        let handle = self.metrics.as_ref()?;
        // The status gauges are read at scrape time rather than pushed by the scheduler thread.
        if let Some(s) = &self.scheduler {
            metrics::gauge!("tocsin_scheduler_partitions_owned")
                .set(s.owned.load(Ordering::Relaxed) as f64);
            metrics::gauge!("tocsin_scheduler_partitions_active")
                .set(s.active.load(Ordering::Relaxed) as f64);
            metrics::gauge!("tocsin_scheduler_ready")
                .set(u8::from(s.ready.load(Ordering::Relaxed)) as f64);
        }
        if let Some(r) = &self.worker_ready {
            metrics::gauge!("tocsin_worker_ready").set(u8::from(r.load(Ordering::Relaxed)) as f64);
        }
        Some(handle.render())
    }

    /// The answer to one complete request head. Pure apart from reading the node's status.
    pub fn respond(&self, head: &[u8]) -> Response {
        let request = match parse_head(head) {
            Ok(r) => r,
            Err(status) => return Response::text(status, format!("{}\n", reason(status))),
        };
        let known = matches!(
            request.path,
            "/metrics" | "/healthz" | "/readyz" | "/status"
        );
        let response = if !known {
            Response::text(404, format!("no route {}\n", request.path))
        } else if !matches!(request.method, "GET" | "HEAD") {
            Response::text(405, "only GET and HEAD\n")
        } else {
            self.route(request.path)
        };
        Response {
            head_only: request.method == "HEAD",
            ..response
        }
    }

    fn route(&self, path: &str) -> Response {
        match path {
            "/healthz" => match self.stalled() {
                None => Response::text(200, "ok\n"),
                Some(why) => Response::text(503, format!("unhealthy: {why}\n")),
            },
            "/readyz" => match self.not_ready() {
                None => Response::text(200, "ready\n"),
                Some(why) => Response::text(503, format!("not ready: {why}\n")),
            },
            "/status" => Response {
                status: 200,
                content_type: "application/json",
                body: self.status_json(),
                head_only: false,
            },
            "/metrics" => match self.render_metrics() {
                Some(text) => Response {
                    status: 200,
                    content_type: "text/plain; version=0.0.4; charset=utf-8",
                    body: text,
                    head_only: false,
                },
                None => Response::text(503, "another metrics recorder is installed\n"),
            },
            _ => Response::text(404, format!("no route {path}\n")),
        }
    }
}

/// Method and path (without the query) of a request.
#[derive(Debug, PartialEq, Eq)]
struct Request<'a> {
    method: &'a str,
    path: &'a str,
}

/// Parses the request line of a head; `Err` holds the status to answer with.
fn parse_head(head: &[u8]) -> std::result::Result<Request<'_>, u16> {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = std::str::from_utf8(&head[..line_end]).map_err(|_| 400u16)?;
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(400);
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(400);
    }
    if !target.starts_with('/') {
        return Err(400);
    }
    match version {
        "HTTP/1.0" | "HTTP/1.1" => {}
        v if v.starts_with("HTTP/") => return Err(505),
        _ => return Err(400),
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    Ok(Request { method, path })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// One response; every connection closes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    /// A HEAD request: the headers of the GET answer, no body.
    pub head_only: bool,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
            head_only: false,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let allow = if self.status == 405 {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        let mut out = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}\
             Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len(),
        )
        .into_bytes();
        if !self.head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

/// Where the end of the head is (just past its blank line), if it has arrived.
fn head_end(buf: &[u8]) -> Option<usize> {
    // Bare LF line ends are accepted, as RFC 9112 allows a server to.
    (0..buf.len()).find_map(|i| {
        if buf[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if buf[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

enum Head {
    Complete(usize),
    TooLarge,
    Closed,
}

async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Head> {
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = head_end(buf) {
            return Ok(Head::Complete(end));
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Ok(Head::TooLarge);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn serve_connection(mut stream: TcpStream, endpoint: &Endpoint) {
    let mut buf = Vec::with_capacity(1024);
    let response = match tokio::time::timeout(IO_TIMEOUT, read_head(&mut stream, &mut buf)).await {
        Ok(Ok(Head::Complete(end))) => endpoint.respond(&buf[..end]),
        Ok(Ok(Head::TooLarge)) => Response::text(431, "request head too large\n"),
        Ok(Ok(Head::Closed)) | Ok(Err(_)) => return,
        Err(_) => Response::text(408, "request head not received in time\n"),
    };
    let _ = tokio::time::timeout(IO_TIMEOUT, async {
        stream.write_all(&response.encode()).await?;
        stream.shutdown().await
    })
    .await;
    // Read what the client still sends (the rest of an oversized head, a body) before closing:
    // closing with unread data resets the connection, and the client may lose the response.
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        let mut drained = 0;
        while drained < DRAIN_BYTES {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// A bound, not yet serving, endpoint.
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Server {
    pub async fn bind(listen: &str) -> Result<Server> {
        let bind_error = |source| HttpError::Bind {
            addr: listen.to_owned(),
            source,
        };
        let listener = TcpListener::bind(listen).await.map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        Ok(Server { listener, addr })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn run(self, endpoint: Endpoint, shutdown: CancellationToken) {
        let endpoint = Arc::new(endpoint);
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut upkeep = tokio::time::interval(UPKEEP_EVERY);
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = upkeep.tick() => {
                    if let Some(m) = &endpoint.metrics {
                        m.run_upkeep();
                    }
                    continue;
                }
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => break,
                a = self.listener.accept() => a,
            };
            match accepted {
                Ok((stream, peer)) => {
                    debug!(peer = %peer, "http connection");
                    let endpoint = endpoint.clone();
                    tokio::spawn(async move {
                        serve_connection(stream, &endpoint).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    warn!(error = %e, addr = %self.addr, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        debug!(addr = %self.addr, "http endpoint stopped");
    }
}

/// Binds `listen` and serves `endpoint` on it until `shutdown`; an empty `listen` disables the
/// endpoint (`Ok(None)`). Returns the bound address.
pub async fn start(
    listen: &str,
    endpoint: Endpoint,
    shutdown: CancellationToken,
) -> Result<Option<SocketAddr>> {
    if listen.is_empty() {
        return Ok(None);
    }
    let server = Server::bind(listen).await?;
    let addr = server.local_addr();
    info!(addr = %addr, "http endpoint listening");
    tokio::spawn(server.run(endpoint, shutdown));
    Ok(Some(addr))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheduler_failing_past_the_stall_limit_is_unhealthy() {
        let e = scheduler(8, 8, false);
        let status = e.scheduler.clone().unwrap();
        *status.last_error.lock().unwrap() = Some((now_ms(), "kafka: broker down".into()));
        status
            .failing_since_ms
            .store(now_ms() - 5_000, Ordering::Relaxed);
        assert_eq!(get(&e, "/healthz").status, 200);
        assert_eq!(
            get(&e, "/readyz").body,
            "not ready: scheduler: the last step failed: kafka: broker down\n"
        );
        status.failing_since_ms.store(
            now_ms() - crate::node::STALL_LIMIT_MS - 1_000,
            Ordering::Relaxed,
        );
        let why = unhealthy(&e);
        assert!(
            why.starts_with("scheduler: every step failed for 12")
                && why.contains("last error: kafka: broker down"),
            "{why}"
        );
        status.failing_since_ms.store(0, Ordering::Relaxed);
        assert_eq!(get(&e, "/healthz").status, 200);
    }

    #[test]
    fn a_node_no_broker_answers_is_not_ready_and_past_the_stall_limit_unhealthy() {
        let reach = Arc::new(Reach::default());
        let e = scheduler(8, 8, true).with_brokers(reach.clone());
        assert_eq!(
            get(&e, "/readyz").body,
            "not ready: brokers: none has answered yet\n"
        );
        reach.answered_ms.store(now_ms(), Ordering::Relaxed);
        assert_eq!(get(&e, "/readyz").status, 200);
        *reach.last_error.lock().unwrap() = Some("Local: Broker transport failure".into());
        reach.answered_ms.store(
            now_ms() - crate::node::UNREACHABLE_AFTER_MS - 2_000,
            Ordering::Relaxed,
        );
        assert_eq!(
            get(&e, "/readyz").body,
            "not ready: brokers: none answered for 7 s: Local: Broker transport failure\n"
        );
        assert_eq!(get(&e, "/healthz").status, 200);
        reach.answered_ms.store(
            now_ms() - crate::node::STALL_LIMIT_MS - 1_000,
            Ordering::Relaxed,
        );
        let why = unhealthy(&e);
        assert!(
            why.starts_with("no broker answered for 121 s (limit 120 s)"),
            "{why}"
        );
        reach.answered_ms.store(now_ms(), Ordering::Relaxed);
        assert_eq!(get(&e, "/healthz").status, 200);
        assert_eq!(get(&e, "/readyz").status, 200);
    }

    /// Why `/healthz` says the node is unhealthy (it must).
    fn unhealthy(e: &Endpoint) -> String {
        let h = get(e, "/healthz");
        assert_eq!(h.status, 503, "{}", h.body);
        h.body
            .strip_prefix("unhealthy: ")
            .unwrap_or_else(|| panic!("{}", h.body))
            .to_owned()
    }

    fn scheduler(owned: usize, active: usize, ready: bool) -> Endpoint {
        let status = Arc::new(NodeStatus::default());
        status.owned.store(owned, Ordering::Relaxed);
        status.active.store(active, Ordering::Relaxed);
        status.ready.store(ready, Ordering::Relaxed);
        status.fires.store(42, Ordering::Relaxed);
        // A recorder of its own, not installed: the test does not depend on global state.
        let handle = PrometheusBuilder::new().build_recorder().handle();
        Endpoint::new("n1", Some(handle)).with_scheduler(status)
    }

    fn get(e: &Endpoint, path: &str) -> Response {
        e.respond(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
    }

    #[test]
    fn routes_answer_with_status_and_reason() {
        let e = scheduler(8, 8, true);
        assert_eq!(get(&e, "/healthz").status, 200);
        assert_eq!(get(&e, "/healthz").body, "ok\n");
        assert_eq!(get(&e, "/readyz").status, 200);
        assert_eq!(get(&e, "/readyz?verbose=1").status, 200);
        let m = get(&e, "/metrics");
        assert_eq!(m.status, 200);
        assert!(m.content_type.starts_with("text/plain; version=0.0.4"));
        assert_eq!(get(&e, "/nope").status, 404);
        assert_eq!(get(&e, "/").status, 404);
        let post = e.respond(b"POST /readyz HTTP/1.1\r\n\r\n");
        assert_eq!(post.status, 405);
        assert!(String::from_utf8(post.encode())
            .unwrap()
            .contains("Allow: GET, HEAD\r\n"));
    }

    #[test]
    fn readiness_says_why_not() {
        let r = get(&scheduler(8, 5, false), "/readyz");
        assert_eq!(r.status, 503);
        assert!(r.body.contains("3 of 8 owned partitions"), "{}", r.body);
        let r = get(&scheduler(8, 8, false), "/readyz");
        assert_eq!(r.status, 503);
        assert!(r.body.contains("not in the group yet"), "{}", r.body);

        let ready = Arc::new(AtomicBool::new(false));
        let both = scheduler(2, 2, true).with_worker(ready.clone());
        let r = get(&both, "/readyz");
        assert_eq!(
            (r.status, r.body.as_str()),
            (503, "not ready: worker: not consuming its lanes yet\n")
        );
        ready.store(true, Ordering::Relaxed);
        assert_eq!(get(&both, "/readyz").status, 200);
    }

    #[test]
    fn status_is_json_with_the_node_counts() {
        let r = get(&scheduler(8, 5, false), "/status");
        assert_eq!(r.content_type, "application/json");
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["node_id"], "n1");
        assert_eq!(v["ready"], false);
        assert_eq!(v["scheduler"]["owned"], 8);
        assert_eq!(v["scheduler"]["active"], 5);
        assert_eq!(v["scheduler"]["fires"], 42);
        assert!(v.get("worker").is_none());
    }

    #[test]
    fn malformed_requests_get_4xx_never_a_panic() {
        let e = scheduler(1, 1, true);
        for (head, status) in [
            (&b"\r\n\r\n"[..], 400),
            (b"GET\r\n\r\n", 400),
            (b"GET /healthz\r\n\r\n", 400),
            (b"GET /healthz HTTP/1.1 extra\r\n\r\n", 400),
            (b"get /healthz HTTP/1.1\r\n\r\n", 400),
            (b"GET healthz HTTP/1.1\r\n\r\n", 400),
            (b"GET /healthz HTTP/2.0\r\n\r\n", 505),
            (b"GET /healthz SPDY/1\r\n\r\n", 400),
            (b"GET /\xff\xfe HTTP/1.1\r\n\r\n", 400),
            (b"GET /healthz HTTP/1.0\n\n", 200),
        ] {
            assert_eq!(
                e.respond(head).status,
                status,
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
    }

    #[test]
    fn head_requests_get_headers_only() {
        let e = scheduler(1, 1, true);
        let r = e.respond(b"HEAD /healthz HTTP/1.1\r\n\r\n");
        let wire = String::from_utf8(r.encode()).unwrap();
        assert!(wire.starts_with("HTTP/1.1 200 OK\r\n"), "{wire}");
        assert!(wire.contains("Content-Length: 3\r\n"), "{wire}");
        assert!(wire.ends_with("\r\n\r\n"), "{wire}");
        let r = e.respond(b"HEAD /nope HTTP/1.1\r\n\r\n");
        assert_eq!(r.status, 404);
        assert!(String::from_utf8(r.encode()).unwrap().ends_with("\r\n\r\n"));
    }

    #[test]
    fn head_end_finds_the_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody"), Some(27));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }

    #[tokio::test]
    async fn serves_over_tcp_and_caps_the_head() {
        let server = Server::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.run(scheduler(1, 1, true), shutdown.clone()));

        let ask = move |request: Vec<u8>| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            // The server may answer (431) before it read everything; a reset then is fine.
            let _ = s.write_all(&request).await;
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).into_owned()
        };
        let ok = ask(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()).await;
        assert!(
            ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("\r\n\r\nok\n"),
            "{ok}"
        );
        let mut huge = b"GET /healthz HTTP/1.1\r\nX-Pad: ".to_vec();
        huge.resize(MAX_HEAD_BYTES * 2, b'a');
        let big = ask(huge).await;
        assert!(big.starts_with("HTTP/1.1 431 "), "{big}");
        // Still serving after the oversized request.
        assert!(ask(b"GET /readyz HTTP/1.1\r\n\r\n".to_vec())
            .await
            .starts_with("HTTP/1.1 200"));

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("server stops on shutdown")
            .unwrap();
    }

    #[tokio::test]
    async fn a_taken_address_is_an_error_naming_it() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let err = Server::bind(&addr).await.err().expect("bind must fail");
        assert!(err.to_string().contains(&addr), "{err}");
    }
}
