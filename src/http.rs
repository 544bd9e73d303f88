//! The HTTP endpoint of every node: `/metrics` (Prometheus text), `/healthz`,
//! `/readyz` and `/status` (JSON), and on scheduler nodes the job API under `/v1/` (`api`).
//!
//! It owns: the listening socket and the process's metrics recorder. The probe routes never
//! change the node they report on. Nothing a client sends may panic it or hold memory without
//! bound: request heads are capped (431), bodies too (`api::MAX_BODY_BYTES`, 413), slow
//! clients time out, and each connection answers one request and closes.
//!
//! HTTP/1.1 is hyper's (the API takes bodies: a maintained parser rather than our own);
//! routing is ours, a handful of fixed paths.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::kafka::client::{ClientFault, ClientFaults};
use crate::node::{NodeStatus, Reach, StoreHealth};

/// Largest request head (request line and headers) read; a longer one gets 431.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Time a client has to send its request head, and then to take the response.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; further ones wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;
/// The longest one connection is served, body and answer included.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
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
        .get_or_init(|| match crate::telemetry::builder().install_recorder() {
            Ok(handle) => {
                crate::telemetry::describe();
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
        "tocsin_instants_missed_total",
        "Instants past the misfire threshold, handled by the job's misfire policy."
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
        "1 when the group has assigned the worker its lanes (or none, after 15 s) and its ledger can write."
    );
    describe_gauge!(
        "tocsin_worker_ledger_writable",
        "1 while the worker's ledger can write (0 after a failed write, until it recovers)."
    );
}

/// What the endpoint reports on: the roles this process runs.
#[derive(Clone)]
pub struct Endpoint {
    node_id: String,
    scheduler: Option<Arc<NodeStatus>>,
    worker_ready: Option<Arc<AtomicBool>>,
    ledger: Option<Arc<StoreHealth>>,
    brokers: Option<Arc<Reach>>,
    /// The latest error of the node's Kafka clients (`kafka::client`): the process's own.
    client_faults: Arc<ClientFaults>,
    metrics: Option<PrometheusHandle>,
    api: Option<Arc<crate::api::Api>>,
}

impl Endpoint {
    /// An endpoint that renders `metrics`; [`prometheus`] gives the process's recorder.
    pub fn new(node_id: impl Into<String>, metrics: Option<PrometheusHandle>) -> Endpoint {
        Endpoint {
            node_id: node_id.into(),
            scheduler: None,
            worker_ready: None,
            ledger: None,
            brokers: None,
            client_faults: ClientFaults::process(),
            metrics,
            api: None,
        }
    }

    pub fn with_scheduler(mut self, status: Arc<NodeStatus>) -> Endpoint {
        crate::telemetry::scheduler_started();
        self.scheduler = Some(status);
        self
    }

    /// `ready` is set by the worker's caller once the worker consumes its lanes.
    pub fn with_worker(mut self, ready: Arc<AtomicBool>) -> Endpoint {
        crate::telemetry::worker_started();
        self.worker_ready = Some(ready);
        self
    }

    /// Serves the job API (`/v1/...`) of a scheduler node.
    pub fn with_api(mut self, api: Arc<crate::api::Api>) -> Endpoint {
        self.api = Some(api);
        self
    }

    /// `ledger` is whether the worker's ledger can write: while it cannot, the node is not ready.
    pub fn with_ledger(mut self, ledger: Arc<StoreHealth>) -> Endpoint {
        self.ledger = Some(ledger);
        self
    }

    /// `reach` is what the node's broker probe finds (`kafka::reach`): no broker answering
    /// makes the node not ready, and for longer than the stall limit, unhealthy.
    pub fn with_brokers(mut self, reach: Arc<Reach>) -> Endpoint {
        self.brokers = Some(reach);
        self
    }

    /// Why no broker answers the probe: the latest client error since its last answer, typed
    /// (`kafka::client`), or else the probe's own error.
    fn no_answer_because(&self, r: &Reach) -> String {
        let answered = r.answered_ms.load(Ordering::Relaxed);
        match self.client_faults.latest() {
            Some(f) if f.at_ms >= answered => format!("{}: {}", f.kind.name(), f.error),
            _ => (r.last_error.lock().unwrap().clone()).unwrap_or_else(|| "no answer".into()),
        }
    }

    /// A client error that takes the node out of service at once (a refused login, a failed
    /// TLS handshake, a fatal error), reported since the probe's last answer.
    fn client_fault(&self, r: &Reach) -> Option<ClientFault> {
        let answered = r.answered_ms.load(Ordering::Relaxed);
        self.client_faults
            .latest()
            .filter(|f| f.kind.blocks_readiness() && f.at_ms >= answered)
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
                        self.no_answer_because(r)
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
            match (r.unreachable_for(now_ms()), self.client_fault(r)) {
                (_, Some(f)) => why.push(format!("brokers: {}: {}", f.kind.name(), f.error)),
                (None, None) => {}
                (Some(None), None) => why.push("brokers: none has answered yet".to_owned()),
                (Some(Some(for_ms)), None) => why.push(format!(
                    "brokers: none answered for {} s: {}",
                    for_ms / 1000,
                    self.no_answer_because(r)
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
        if let Some((since, error)) = self.ledger.as_ref().and_then(|l| l.failing()) {
            why.push(format!(
                "worker: the ledger cannot write since {} s: {error}",
                (now_ms() - since).max(0) / 1000
            ));
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
        if let Some(l) = &self.ledger {
            doc["worker"]["ledger"] = match l.failing() {
                None => serde_json::json!({ "writable": true }),
                Some((since, error)) => serde_json::json!({
                    "writable": false, "failing_since_ms": since, "error": error,
                }),
            };
        }
        if let Some(r) = &self.brokers {
            let fault = self.client_faults.latest().map(|f| {
                serde_json::json!({ "kind": f.kind.name(), "error": f.error, "at_ms": f.at_ms })
            });
            doc["brokers"] = serde_json::json!({
                "reachable": r.unreachable_for(now_ms()).is_none() && self.client_fault(r).is_none(),
                "answered_ms": r.answered_ms.load(Ordering::Relaxed),
                "last_error": *r.last_error.lock().unwrap(),
                "last_client_error": fault,
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
        if let Some(l) = &self.ledger {
            metrics::gauge!("tocsin_worker_ledger_writable")
                .set(u8::from(l.failing().is_none()) as f64);
        }
        Some(handle.render())
    }

    /// The answer to a probe route (`/healthz`, `/readyz`, `/metrics`, `/status`). Pure apart
    /// from reading the node's status.
    pub fn probe(&self, method: &str, path: &str) -> Response {
        let known = matches!(path, "/metrics" | "/healthz" | "/readyz" | "/status");
        let response = if !known {
            Response::text(404, format!("no route {path}\n"))
        } else if !matches!(method, "GET" | "HEAD") {
            Response::text(405, "only GET and HEAD\n")
        } else {
            self.route(path)
        };
        Response {
            head_only: method == "HEAD",
            ..response
        }
    }

    /// The answer to one request, its body read up to `api::MAX_BODY_BYTES`.
    async fn answer(&self, request: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
        let method = request.method().as_str().to_owned();
        let path = request.uri().path().to_owned();
        if !path.starts_with("/v1/") {
            return self.probe(&method, &path).into_hyper();
        }
        let Some(api) = &self.api else {
            return Response::text(404, "this node serves no job API (only schedulers do)\n")
                .into_hyper();
        };
        let query = request.uri().query().map(str::to_owned);
        let authorization = request
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let declared = request
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let too_large = || {
            crate::api::Reply::error(
                413,
                format!(
                    "request body over the limit of {} bytes",
                    crate::api::MAX_BODY_BYTES
                ),
            )
        };
        if declared.is_some_and(|n| n > crate::api::MAX_BODY_BYTES as u64) {
            return reply_to_hyper(too_large(), method == "HEAD");
        }
        let limited = Limited::new(request.into_body(), crate::api::MAX_BODY_BYTES);
        let body = match tokio::time::timeout(IO_TIMEOUT, limited.collect()).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return reply_to_hyper(too_large(), method == "HEAD")
            }
            Ok(Err(_)) => {
                return reply_to_hyper(
                    crate::api::Reply::error(400, "could not read the request body"),
                    false,
                )
            }
            Err(_) => {
                return reply_to_hyper(
                    crate::api::Reply::error(408, "request body not received in time"),
                    false,
                )
            }
        };
        let reply = api
            .handle(&crate::api::Request {
                method: &method,
                path: &path,
                query: query.as_deref(),
                authorization: authorization.as_deref(),
                body: &body,
            })
            .await;
        reply_to_hyper(reply, method == "HEAD")
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
}

impl Response {
    fn into_hyper(self) -> hyper::Response<Full<Bytes>> {
        let mut b = hyper::Response::builder()
            .status(self.status)
            .header("Content-Type", self.content_type)
            .header("Cache-Control", "no-store");
        if self.status == 405 {
            b = b.header("Allow", "GET, HEAD");
        }
        let body = if self.head_only {
            Bytes::new()
        } else {
            Bytes::from(self.body)
        };
        b.body(Full::new(body))
            .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
    }
}

fn reply_to_hyper(r: crate::api::Reply, head_only: bool) -> hyper::Response<Full<Bytes>> {
    let mut b = hyper::Response::builder()
        .status(r.status)
        .header("Content-Type", r.content_type)
        .header("Cache-Control", "no-store");
    if let Some(location) = &r.location {
        b = b.header("Location", location);
    }
    if let Some(allow) = &r.allow {
        b = b.header("Allow", allow);
    }
    if r.challenge {
        b = b.header("WWW-Authenticate", "Bearer");
    }
    let body = if head_only {
        Bytes::new()
    } else {
        Bytes::from(r.body)
    };
    b.body(Full::new(body))
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
}

/// Serves one connection: one request, then close (no keep-alive: probes and API clients open
/// few connections, and a closed connection holds nothing).
async fn serve_connection(stream: TcpStream, endpoint: Arc<Endpoint>) {
    let service = service_fn(move |request| {
        let endpoint = endpoint.clone();
        async move { Ok::<_, std::convert::Infallible>(endpoint.answer(request).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(IO_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    if tokio::time::timeout(CONNECTION_TIMEOUT, connection)
        .await
        .is_err()
    {
        debug!("http connection timed out");
    }
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
                        serve_connection(stream, endpoint).await;
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
    fn a_worker_whose_ledger_cannot_write_is_not_ready_until_it_can() {
        let ledger = Arc::new(StoreHealth::default());
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let e = Endpoint::new("w1", Some(handle))
            .with_worker(Arc::new(AtomicBool::new(true)))
            .with_ledger(ledger.clone());
        assert_eq!(get(&e, "/readyz").status, 200);
        ledger
            .failing_since_ms
            .store(now_ms() - 3_000, Ordering::Relaxed);
        *ledger.last_error.lock().unwrap() = Some("IO error: No space left on device".into());
        assert_eq!(
            get(&e, "/readyz").body,
            "not ready: worker: the ledger cannot write since 3 s: IO error: No space left on \
             device\n"
        );
        let status: serde_json::Value = serde_json::from_str(&get(&e, "/status").body).unwrap();
        assert_eq!(status["worker"]["ledger"]["writable"], false);
        assert_eq!(
            status["worker"]["ledger"]["error"],
            "IO error: No space left on device"
        );
        assert_eq!(
            get(&e, "/healthz").status,
            200,
            "a full disk is no reason to restart"
        );
        ledger.failing_since_ms.store(0, Ordering::Relaxed);
        assert_eq!(get(&e, "/readyz").status, 200);
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&get(&e, "/status").body).unwrap()["worker"]
                ["ledger"]["writable"],
            true
        );
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

    #[test]
    fn a_refused_login_makes_a_node_not_ready_at_once_naming_it_until_a_broker_answers() {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        let fault = |e: &KafkaError, reason: &str| ClientFault::of(e, reason).unwrap();
        let reach = Arc::new(Reach::default());
        let e = scheduler(8, 8, true).with_brokers(reach.clone());
        reach.answered_ms.store(now_ms() - 10, Ordering::Relaxed);
        // Every broker down is what a probe's silence decides, not the error itself.
        e.client_faults.record(fault(
            &KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        ));
        assert_eq!(get(&e, "/readyz").status, 200);
        e.client_faults.record(fault(
            &KafkaError::Global(RDKafkaErrorCode::Authentication),
            "SASL authentication error: Authentication failed during authentication due to \
             invalid credentials with SASL mechanism SCRAM-SHA-512",
        ));
        let r = get(&e, "/readyz");
        assert_eq!(r.status, 503);
        assert!(
            r.body.starts_with("not ready: brokers: authentication: ")
                && r.body.contains("invalid credentials"),
            "{}",
            r.body
        );
        let status: serde_json::Value = serde_json::from_str(&get(&e, "/status").body).unwrap();
        assert_eq!(status["ready"], false);
        assert_eq!(status["brokers"]["reachable"], false);
        assert_eq!(
            status["brokers"]["last_client_error"]["kind"],
            "authentication"
        );
        // The probe answered since: the login works again.
        reach.answered_ms.store(now_ms() + 1, Ordering::Relaxed);
        assert_eq!(get(&e, "/readyz").status, 200);
        // A silent probe names the latest client error since its last answer.
        reach.answered_ms.store(
            now_ms() - crate::node::UNREACHABLE_AFTER_MS - 2_000,
            Ordering::Relaxed,
        );
        e.client_faults.record(fault(
            &KafkaError::Global(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        ));
        let body = get(&e, "/readyz").body;
        assert!(
            body.starts_with("not ready: brokers: none answered for 7 s: all_brokers_down: "),
            "{body}"
        );
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
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let mut e = Endpoint::new("n1", Some(handle)).with_scheduler(status);
        // Faults of its own, not the process's, which other tests report into.
        e.client_faults = Arc::default();
        e
    }

    fn get(e: &Endpoint, path: &str) -> Response {
        e.probe("GET", path)
    }

    #[test]
    fn routes_answer_with_status_and_reason() {
        let e = scheduler(8, 8, true);
        assert_eq!(get(&e, "/healthz").status, 200);
        assert_eq!(get(&e, "/healthz").body, "ok\n");
        assert_eq!(get(&e, "/readyz").status, 200);
        let m = get(&e, "/metrics");
        assert_eq!(m.status, 200);
        assert!(m.content_type.starts_with("text/plain; version=0.0.4"));
        assert_eq!(get(&e, "/nope").status, 404);
        assert_eq!(get(&e, "/").status, 404);
        let post = e.probe("POST", "/readyz");
        assert_eq!(post.status, 405);
        assert_eq!(post.into_hyper().headers()["Allow"], "GET, HEAD");
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
    fn head_requests_get_headers_only() {
        let e = scheduler(1, 1, true);
        let r = e.probe("HEAD", "/healthz").into_hyper();
        assert_eq!(r.status(), 200);
        assert_eq!(hyper::body::Body::size_hint(r.body()).exact(), Some(0));
        assert_eq!(e.probe("HEAD", "/nope").status, 404);
    }

    #[tokio::test]
    async fn serves_over_tcp_and_caps_the_head() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
        // Malformed requests get a 4xx or 5xx, never a panic, and the server keeps serving.
        for head in [
            &b"\r\n\r\n"[..],
            b"GET\r\n\r\n",
            b"GET /healthz HTTP/1.1 extra\r\n\r\n",
            b"GET healthz HTTP/1.1\r\n\r\n",
            b"GET /\xff\xfe HTTP/1.1\r\n\r\n",
            b"GET /healthz SPDY/1\r\n\r\n",
        ] {
            let answer = ask(head.to_vec()).await;
            let status: u16 = answer
                .get(9..12)
                .and_then(|s| s.parse().ok())
                .unwrap_or(400);
            assert!(
                (400..600).contains(&status) || answer.is_empty(),
                "{:?}: {answer}",
                String::from_utf8_lossy(head)
            );
        }
        // A probe ignores a body; an API path on a node without the API is 404.
        let v1 = ask(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()).await;
        assert!(v1.starts_with("HTTP/1.1 404"), "{v1}");
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
