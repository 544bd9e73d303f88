//! The base of every node's Kafka clients: what librdkafka reports outside any one request
//! (a refused login, a failed TLS handshake, every broker down, a fatal error) is classified
//! here, once, into a [`ClientErrorKind`], counted in `tocsin_kafka_client_errors_total`, and
//! kept as the node's latest [`ClientFault`], which `/readyz` and `/status` report.
//!
//! A node is one process, so the latest fault is kept per process: every client of the node,
//! scheduler or worker, reports into the same place, whichever context type it has
//! ([`NodeContext`], or a context of its own that calls [`report`]).

use std::sync::{Arc, LazyLock, Mutex};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryResult, ProducerContext};
use rdkafka::ClientContext;

/// What kind of trouble a client error is, as far as the node's operator is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientErrorKind {
    /// The brokers refused the node's credentials (SASL): nothing changes until they do.
    Authentication,
    /// The brokers refused an operation for want of an ACL.
    Authorization,
    /// A TLS handshake failed (an untrusted or mismatched certificate, a plaintext listener).
    Tls,
    /// No broker of the cluster is connected.
    AllBrokersDown,
    /// librdkafka raised a fatal error: the client is unusable and must be recreated.
    Fatal,
    /// A transient error (a broker's connection dropped, a name that did not resolve).
    Transient,
}

impl ClientErrorKind {
    pub const ALL: [ClientErrorKind; 6] = [
        ClientErrorKind::Authentication,
        ClientErrorKind::Authorization,
        ClientErrorKind::Tls,
        ClientErrorKind::AllBrokersDown,
        ClientErrorKind::Fatal,
        ClientErrorKind::Transient,
    ];

    /// The kind's name in `/status`, logs and the metric's `kind` label.
    pub fn name(self) -> &'static str {
        match self {
            ClientErrorKind::Authentication => "authentication",
            ClientErrorKind::Authorization => "authorization",
            ClientErrorKind::Tls => "tls",
            ClientErrorKind::AllBrokersDown => "all_brokers_down",
            ClientErrorKind::Fatal => "fatal",
            ClientErrorKind::Transient => "transient",
        }
    }

    /// Whether this kind takes the node out of service as soon as it is reported, until the
    /// broker probe is answered again, rather than once the probe has had no answer for a
    /// while: waiting does not cure it. (A refused ACL does not: it names one topic or group,
    /// and the node may well do the rest of its work; every brokers down does not either, as
    /// librdkafka also says so when idle connections close.)
    pub fn blocks_readiness(self) -> bool {
        matches!(
            self,
            ClientErrorKind::Authentication | ClientErrorKind::Tls | ClientErrorKind::Fatal
        )
    }
}

/// Classifies one of librdkafka's error codes.
pub fn classify(code: RDKafkaErrorCode) -> ClientErrorKind {
    use RDKafkaErrorCode as C;
    match code {
        C::Authentication | C::SaslAuthenticationFailed | C::UnsupportedSASLMechanism => {
            ClientErrorKind::Authentication
        }
        C::TopicAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed => ClientErrorKind::Authorization,
        C::SSL => ClientErrorKind::Tls,
        C::AllBrokersDown => ClientErrorKind::AllBrokersDown,
        C::Fatal => ClientErrorKind::Fatal,
        _ => ClientErrorKind::Transient,
    }
}

/// A client error as the node reports it: its kind, librdkafka's words, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFault {
    pub kind: ClientErrorKind,
    pub error: String,
    pub at_ms: i64,
}

/// `fault` after `latest`: the newer one, except that a transient error does not hide a telling
/// one (the dropped connection after a refused login), and of two of the same kind the words
/// kept are the fuller (librdkafka's log line says more than its error event), with the newer
/// instant.
fn merge(latest: &mut Option<ClientFault>, fault: ClientFault) {
    let telling = |f: &ClientFault| f.kind != ClientErrorKind::Transient;
    match latest {
        Some(l) if l.kind == fault.kind => {
            l.at_ms = fault.at_ms;
            if fault.error.len() > l.error.len() {
                l.error = fault.error;
            }
        }
        Some(l) if telling(l) && !telling(&fault) => {}
        _ => *latest = Some(fault),
    }
}

impl ClientFault {
    /// `error` (with librdkafka's `reason`), classified, as of now; `None` for the end of a
    /// partition, which a reader that asked to be told gets as news, not as an error.
    pub fn of(error: &KafkaError, reason: &str) -> Option<ClientFault> {
        let code = error.rdkafka_error_code();
        if code == Some(RDKafkaErrorCode::PartitionEOF) {
            return None;
        }
        Some(ClientFault {
            kind: code.map_or(ClientErrorKind::Transient, classify),
            error: match reason {
                "" => error.to_string(),
                _ => format!("{error}: {reason}"),
            },
            at_ms: crate::node::system_clock()(),
        })
    }

    /// A librdkafka log line that reports a refused login or a failed TLS handshake
    /// ([`classify_log`]), as of now.
    fn logged(level: RDKafkaLogLevel, fac: &str, message: &str) -> Option<ClientFault> {
        Some(ClientFault {
            kind: classify_log(level, fac, message)?,
            error: message.to_owned(),
            at_ms: crate::node::system_clock()(),
        })
    }
}

/// The latest client error of a node.
#[derive(Debug, Default)]
pub struct ClientFaults {
    latest: Mutex<Option<ClientFault>>,
}

impl ClientFaults {
    /// The faults of this process, which every client reports into.
    pub fn process() -> Arc<ClientFaults> {
        static PROCESS: LazyLock<Arc<ClientFaults>> = LazyLock::new(Arc::default);
        PROCESS.clone()
    }

    pub fn record(&self, fault: ClientFault) {
        merge(&mut self.latest.lock().unwrap(), fault);
    }

    /// The latest client error reported, if any.
    pub fn latest(&self) -> Option<ClientFault> {
        self.latest.lock().unwrap().clone()
    }
}

/// Reports a client error of this process: classified, counted and logged
/// (`telemetry::kafka_client_error`), and kept as its latest fault. Returns it.
pub fn report(error: &KafkaError, reason: &str) -> Option<ClientFault> {
    let fault = ClientFault::of(error, reason)?;
    crate::telemetry::kafka_client_error(fault.kind, Some(&fault.error));
    ClientFaults::process().record(fault.clone());
    Some(fault)
}

/// The kind of a librdkafka log line that reports a broker connection's failure (`FAIL`), when
/// it says why in terms an operator acts on: librdkafka logs a refused login or a failed TLS
/// handshake that way, and raises no error event for it when the connection is retried.
pub fn classify_log(level: RDKafkaLogLevel, fac: &str, message: &str) -> Option<ClientErrorKind> {
    use RDKafkaLogLevel as L;
    if fac != "FAIL" || !matches!(level, L::Emerg | L::Alert | L::Critical | L::Error) {
        return None;
    }
    if message.contains("SASL authentication error") || message.contains("Authentication failed") {
        Some(ClientErrorKind::Authentication)
    } else if message.contains("SSL handshake failed")
        || message.contains("certificate verify failed")
    {
        Some(ClientErrorKind::Tls)
    } else {
        None
    }
}

/// A librdkafka log line of a node's client: logged as rdkafka's default context does, and,
/// when it reports a refused login or a failed TLS handshake ([`classify_log`]), counted and
/// kept as the latest fault too (not logged again).
pub fn log(level: RDKafkaLogLevel, fac: &str, message: &str) {
    use RDKafkaLogLevel as L;
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        L::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}"),
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}"),
        L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
    }
    if let Some(fault) = ClientFault::logged(level, fac, message) {
        crate::telemetry::kafka_client_error(fault.kind, None);
        ClientFaults::process().record(fault);
    }
}

/// The context of a node's clients that need nothing else of one.
#[derive(Debug, Default, Clone, Copy)]
pub struct NodeContext;

impl ClientContext for NodeContext {
    fn error(&self, error: KafkaError, reason: &str) {
        report(&error, reason);
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        log(level, fac, message);
    }
}

impl ConsumerContext for NodeContext {}

impl ProducerContext for NodeContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

/// A node's consumer that needs no context of its own.
pub type NodeConsumer = BaseConsumer<NodeContext>;

/// The context of a one-off client (the CLI's reachability check) that keeps its errors to
/// itself, unlogged, for the caller to name the cause of a failure.
#[derive(Debug, Default)]
pub struct Recording(Mutex<Option<ClientFault>>);

impl Recording {
    pub fn record(&self, error: &KafkaError, reason: &str) {
        if let Some(fault) = ClientFault::of(error, reason) {
            merge(&mut self.0.lock().unwrap(), fault);
        }
    }

    /// The most telling error seen: the latest that is not transient, else the latest.
    pub fn latest(&self) -> Option<ClientFault> {
        self.0.lock().unwrap().clone()
    }
}

impl ClientContext for Recording {
    fn error(&self, error: KafkaError, reason: &str) {
        self.record(&error, reason);
    }

    /// Quiet: only a line [`classify_log`] types is kept (as the latest error).
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        if let Some(fault) = ClientFault::logged(level, fac, message) {
            merge(&mut self.0.lock().unwrap(), fault);
        }
    }
}

impl ConsumerContext for Recording {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified_by_what_an_operator_must_do() {
        use RDKafkaErrorCode as C;
        let kinds: Vec<&str> = [
            C::Authentication,
            C::SaslAuthenticationFailed,
            C::TopicAuthorizationFailed,
            C::SSL,
            C::AllBrokersDown,
            C::Fatal,
            C::BrokerTransportFailure,
            C::Resolve,
        ]
        .into_iter()
        .map(|c| classify(c).name())
        .collect();
        assert_eq!(
            kinds,
            [
                "authentication",
                "authentication",
                "authorization",
                "tls",
                "all_brokers_down",
                "fatal",
                "transient",
                "transient"
            ]
        );
        assert!(classify(C::SSL).blocks_readiness());
        assert!(classify(C::Authentication).blocks_readiness());
        assert!(!classify(C::TopicAuthorizationFailed).blocks_readiness());
        assert!(!classify(C::AllBrokersDown).blocks_readiness());
        assert!(!classify(C::BrokerTransportFailure).blocks_readiness());
    }

    #[test]
    fn connection_failures_logged_for_a_refused_login_or_a_bad_certificate_are_typed() {
        let auth = "sasl_ssl://127.0.0.1:1/bootstrap: SASL authentication error: Authentication \
                    failed during authentication due to invalid credentials with SASL mechanism \
                    SCRAM-SHA-512 (after 340ms in state AUTH_REQ)";
        let tls = "ssl://127.0.0.1:1/bootstrap: SSL handshake failed: error:0A000086:SSL \
                   routines::certificate verify failed: broker certificate could not be verified";
        let kind = |level, fac, m| classify_log(level, fac, m).map(ClientErrorKind::name);
        assert_eq!(
            kind(RDKafkaLogLevel::Error, "FAIL", auth),
            Some("authentication")
        );
        assert_eq!(kind(RDKafkaLogLevel::Error, "FAIL", tls), Some("tls"));
        assert_eq!(
            kind(RDKafkaLogLevel::Error, "FAIL", "Connection refused"),
            None
        );
        assert_eq!(kind(RDKafkaLogLevel::Debug, "FAIL", auth), None);
        assert_eq!(kind(RDKafkaLogLevel::Error, "SASL", auth), None);
    }

    #[test]
    fn a_reported_error_is_the_latest_fault_with_its_kind_and_words() {
        let f = report(
            &KafkaError::Global(RDKafkaErrorCode::Authentication),
            "SASL authentication error: Authentication failed",
        )
        .unwrap();
        assert_eq!(f.kind, ClientErrorKind::Authentication);
        assert!(f.error.contains("Authentication failed"), "{}", f.error);
        // Other tests of this process may report meanwhile; this one was reported.
        assert!(ClientFaults::process().latest().is_some());
        let eof = KafkaError::Global(RDKafkaErrorCode::PartitionEOF);
        assert_eq!(report(&eof, "end of partition"), None, "not an error");
    }
}
