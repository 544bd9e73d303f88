//! What a worker does with a run: deliver to Kafka, call HTTP, execute a command, or call a
//! handler that an embedding program registered.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::policy::{self, Policy};
use crate::model::job::HandlerKind;
use crate::model::records::Run;

/// How a handler ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerResult {
    Succeeded {
        output: String,
    },
    /// `retry`: whether another attempt may succeed (a 503 may, a 404 will not).
    Failed {
        error: String,
        retry: bool,
    },
}

/// A handler for programs that embed Tocsin: register it under a name, and jobs whose handler
/// is `custom` with that name as `target` run through it.
pub trait Handler: Send + Sync {
    fn call<'a>(&'a self, run: &'a Run) -> BoxFuture<'a, HandlerResult>;
}

/// The built-in handlers plus the registered ones, under the worker's [`Policy`].
pub struct Handlers {
    producer: super::WorkerProducer,
    /// One client for every run: connections to a target are pooled and reused.
    http: reqwest::Client,
    custom: HashMap<String, Arc<dyn Handler>>,
    policy: Arc<Policy>,
    /// Most bytes of a command's output kept.
    pub output_limit: usize,
}

/// Why the handlers could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HandlersError {
    #[error("invalid setting worker.http.ca_file = {path:?}: {reason}")]
    CaFile { path: String, reason: String },
    #[error("could not build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// The certificates of a PEM file (one or more `BEGIN CERTIFICATE` blocks).
pub fn ca_certificates(path: &Path) -> Result<Vec<reqwest::Certificate>, HandlersError> {
    let fail = |reason: String| HandlersError::CaFile {
        path: path.display().to_string(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| fail(format!("cannot be read: {e}")))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| fail(format!("is not PEM: {}", error_chain(&e))))?;
    if certs.is_empty() {
        return Err(fail("holds no PEM certificate (BEGIN CERTIFICATE)".into()));
    }
    Ok(certs)
}

impl Handlers {
    /// `ca_file`: certificates trusted for `https` targets besides the platform's (the CA of
    /// internal services).
    pub fn new(
        producer: super::WorkerProducer,
        custom: HashMap<String, Arc<dyn Handler>>,
        policy: Policy,
        ca_file: Option<&Path>,
    ) -> Result<Handlers, HandlersError> {
        let policy = Arc::new(policy);
        let mut http = reqwest::Client::builder()
            .use_rustls_tls()
            .dns_resolver(Arc::new(policy::GuardedResolver(policy.clone())))
            .redirect(policy::redirect_policy(policy.clone()))
            .pool_idle_timeout(Duration::from_secs(60));
        if let Some(path) = ca_file {
            for cert in ca_certificates(path)? {
                http = http.add_root_certificate(cert);
            }
        }
        Ok(Handlers {
            producer,
            http: http.build().map_err(HandlersError::Client)?,
            custom,
            policy,
            output_limit: 64 * 1024,
        })
    }

    pub async fn call(&self, run: &Run) -> HandlerResult {
        let refused = |error| HandlerResult::Failed {
            error,
            retry: false,
        };
        match run.handler.kind {
            HandlerKind::Kafka => match self.policy.kafka(run) {
                Ok(()) => self.kafka(run).await,
                Err(e) => refused(e),
            },
            HandlerKind::Http => self.http(run).await,
            HandlerKind::Exec => match self.policy.exec(run) {
                Ok(program) => exec(run, &program, self.output_limit).await,
                Err(e) => refused(e),
            },
            HandlerKind::Custom => match self.custom.get(&run.handler.target) {
                Some(h) => h.call(run).await,
                None => HandlerResult::Failed {
                    error: format!("no handler registered under {:?}", run.handler.target),
                    retry: false,
                },
            },
        }
    }

    /// Delivers the payload to the target topic, keyed by the job id (delayed and recurring
    /// messages). The producer is idempotent; the run id travels as a header for consumers
    /// that deduplicate.
    async fn kafka(&self, run: &Run) -> HandlerResult {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "tocsin-run-id",
            value: Some(run.run_id.as_bytes()),
        });
        for (k, v) in &run.handler.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let record = FutureRecord::to(&run.handler.target)
            .key(run.job_id.as_bytes())
            .payload(&run.handler.payload)
            .headers(headers);
        match self.producer.send(record, Duration::from_secs(30)).await {
            Ok(d) => HandlerResult::Succeeded {
                output: format!(
                    "delivered to {} [{}] @ {}",
                    run.handler.target, d.partition, d.offset
                ),
            },
            Err((e, _)) => HandlerResult::Failed {
                error: format!("delivery to topic {:?} failed: {e}", run.handler.target),
                retry: true,
            },
        }
    }

    async fn http(&self, run: &Run) -> HandlerResult {
        let method = run.handler.method.as_deref().unwrap_or("POST");
        let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
            return HandlerResult::Failed {
                error: format!("invalid HTTP method {method:?}"),
                retry: false,
            };
        };
        let url = match reqwest::Url::parse(&run.handler.target) {
            Ok(u) => u,
            Err(e) => {
                return HandlerResult::Failed {
                    error: format!("invalid http target {:?}: {e}", run.handler.target),
                    retry: false,
                }
            }
        };
        if let Err(error) = self.policy.http(run, &url).await {
            return HandlerResult::Failed {
                error,
                retry: false,
            };
        }
        let mut req = self
            .http
            .request(method, url)
            .timeout(Duration::from_millis(run.timeout_ms))
            .header("Idempotency-Key", &run.run_id)
            .body(run.handler.payload.clone());
        for (k, v) in &run.handler.headers {
            req = req.header(k, v);
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status();
                if status.is_success() {
                    return HandlerResult::Succeeded {
                        output: format!("HTTP {status}"),
                    };
                }
                let code = status.as_u16();
                let retry = code == 408
                    || code == 429
                    || status.is_server_error()
                    || (status.is_client_error()
                        && run
                            .labels
                            .get("retry_client_errors")
                            .is_some_and(|v| v == "true"));
                HandlerResult::Failed {
                    error: format!("{} answered HTTP {status}", run.handler.target),
                    retry,
                }
            }
            Err(e) => match certificate_error(&e) {
                // The same certificate is presented again seconds later: not retried, as a 404.
                Some(why) => HandlerResult::Failed {
                    error: format!("request to {} failed: TLS: {why}", run.handler.target),
                    retry: false,
                },
                None => HandlerResult::Failed {
                    error: format!(
                        "request to {} failed: {}",
                        run.handler.target,
                        error_chain(&e)
                    ),
                    retry: true,
                },
            },
        }
    }
}

/// `e` and its causes, `: `-separated (reqwest's own message names only the URL; the cause,
/// such as a refused connection or a bad certificate, is further down).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cause = c.source();
    }
    parts.join(": ")
}

/// What is wrong with the server's certificate, when that is why `e` failed.
fn certificate_error(e: &reqwest::Error) -> Option<String> {
    rustls_cause(e).map(describe_tls)
}

/// The rustls error among `e` and its causes. It comes wrapped in io::Errors (tokio-rustls's, in
/// hyper-rustls's), whose `source` skips the error they wrap: they are unwrapped by hand.
fn rustls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    if let Some(inner) = e
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        let inner: &(dyn std::error::Error + 'static) = inner;
        if let Some(tls) = rustls_cause(inner) {
            return Some(tls);
        }
    }
    e.source().and_then(rustls_cause)
}

fn describe_tls(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    let why = match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer => "the server's certificate is signed by a CA this worker does not \
                                 trust (neither the platform's nor worker.http.ca_file)"
                .to_owned(),
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                "the server's certificate is not valid for the target's host name".to_owned()
            }
            C::Expired | C::ExpiredContext { .. } => {
                "the server's certificate has expired".to_owned()
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet".to_owned()
            }
            C::Revoked => "the server's certificate is revoked".to_owned(),
            _ => "the server's certificate was refused".to_owned(),
        },
        _ => "the TLS handshake failed".to_owned(),
    };
    format!("{why} ({e})")
}

/// Runs `program` (the run's target as the policy resolved it): argv from the handler, the run
/// described in the environment, the payload on stdin, output kept up to `limit` bytes (the
/// rest is read and dropped, never fatal). The caller's timeout drops this future, which kills
/// the child.
pub async fn exec(run: &Run, program: &std::path::Path, limit: usize) -> HandlerResult {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&run.handler.args)
        .env("TOCSIN_RUN_ID", &run.run_id)
        .env("TOCSIN_JOB_ID", &run.job_id)
        .env("TOCSIN_TENANT", &run.tenant)
        .env("TOCSIN_SCHEDULED_MS", run.scheduled_ms.to_string())
        .env("TOCSIN_ATTEMPT", run.attempt.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in &run.handler.headers {
        cmd.env(k, v);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return HandlerResult::Failed {
                error: format!("could not start {:?}: {e}", run.handler.target),
                retry: false,
            }
        }
    };
    let payload = run.handler.payload.clone();
    let mut stdin = child.stdin.take();
    let feed = async move {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(&payload).await;
        }
        drop(stdin);
    };
    let out = read_limited(child.stdout.take(), limit);
    let err = read_limited(child.stderr.take(), limit);
    let ((), out, err, status) = tokio::join!(feed, out, err, child.wait());
    let mut output = out;
    if !err.is_empty() {
        output.push_str(&err);
    }
    match status {
        Ok(s) if s.success() => HandlerResult::Succeeded { output },
        Ok(s) => HandlerResult::Failed {
            error: format!(
                "{:?} exited with {s}: {}",
                run.handler.target,
                output.trim_end()
            ),
            retry: true,
        },
        Err(e) => HandlerResult::Failed {
            error: format!("waiting for {:?} failed: {e}", run.handler.target),
            retry: true,
        },
    }
}

async fn read_limited(pipe: Option<impl tokio::io::AsyncRead + Unpin>, limit: usize) -> String {
    let Some(mut pipe) = pipe else {
        return String::new();
    };
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut truncated = false;
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
    let mut s = String::from_utf8_lossy(&kept).into_owned();
    if truncated {
        s.push_str("\n[output truncated]");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::{HandlerSpec, RetryPolicy};
    use crate::model::records::FireReason;

    fn run(script: &str) -> Run {
        Run {
            run_id: "r1".into(),
            job_id: "j1".into(),
            tenant: "acme".into(),
            scheduled_ms: 1_000,
            fire_ms: 1_000,
            attempt: 2,
            reason: FireReason::Schedule,
            handler: HandlerSpec {
                kind: HandlerKind::Exec,
                target: "sh".into(),
                payload: b"from stdin".to_vec(),
                headers: Default::default(),
                method: None,
                args: vec!["-c".into(), script.into()],
            },
            timeout_ms: 10_000,
            retry: RetryPolicy::default(),
            labels: Default::default(),
        }
    }

    async fn exec_sh(r: &Run, limit: usize) -> HandlerResult {
        exec(r, std::path::Path::new("/bin/sh"), limit).await
    }

    #[tokio::test]
    async fn exec_output_over_the_limit_is_truncated_not_fatal() {
        let r = exec_sh(&run("head -c 1000000 /dev/zero | tr '\\0' a"), 1_000).await;
        let HandlerResult::Succeeded { output } = r else {
            panic!("{r:?}")
        };
        assert!(output.starts_with(&"a".repeat(1_000)));
        assert!(
            output.ends_with("[output truncated]"),
            "{}",
            &output[1_000..]
        );
        assert!(output.len() < 1_100);
    }

    #[tokio::test]
    async fn exec_sees_the_run_in_its_environment_and_the_payload_on_stdin() {
        let r = exec_sh(
            &run("echo $TOCSIN_RUN_ID $TOCSIN_JOB_ID $TOCSIN_SCHEDULED_MS $TOCSIN_ATTEMPT; cat"),
            1_000,
        )
        .await;
        assert_eq!(
            r,
            HandlerResult::Succeeded {
                output: "r1 j1 1000 2\nfrom stdin".into()
            }
        );
    }

    #[tokio::test]
    async fn exec_failure_is_retryable_and_names_the_exit_status() {
        let r = exec_sh(&run("echo broken >&2; exit 3"), 1_000).await;
        let HandlerResult::Failed { error, retry } = r else {
            panic!("{r:?}")
        };
        assert!(retry);
        assert!(
            error.contains("exit status: 3") && error.contains("broken"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_missing_program_fails_without_retry() {
        let mut r = run("");
        r.handler.target = "/nonexistent/tocsin-test-program".into();
        let HandlerResult::Failed { error, retry } =
            exec(&r, std::path::Path::new(&r.handler.target), 1_000).await
        else {
            panic!()
        };
        assert!(!retry);
        assert!(
            error.contains("/nonexistent/tocsin-test-program"),
            "{error}"
        );
    }
}
