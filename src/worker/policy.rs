//! What a worker refuses to run, whoever put the job: `exec` programs not allowed (exec is off by
//! default), HTTP hosts on loopback, private or link-local addresses not allowed, and `kafka`
//! deliveries into Tocsin's own topics. A refused run fails without retry, so it goes to `dead`
//! with the reason, which names the program, host or topic, the tenant and the rule.
//!
//! It owns: the decision, from `[worker.exec]`, `[worker.http]` and the topic prefix. Pure,
//! except for looking a program up in `PATH` and an HTTP host up in DNS.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;
use crate::model::records::Run;

/// An entry of `worker.http.allow_hosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRule {
    /// A host name, lower case; `*.example.com` matches its subdomains.
    Name(String),
    /// An address and prefix length (a bare address: the full length).
    Net(IpAddr, u8),
}

impl HostRule {
    pub fn parse(s: &str) -> Result<HostRule, String> {
        let s = s.trim();
        let bare = s.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(HostRule::Net(ip, max_len(ip)));
        }
        if let Some((addr, len)) = s.split_once('/') {
            let ip: IpAddr = addr
                .parse()
                .map_err(|_| format!("{addr:?} is no address"))?;
            let len: u8 = len
                .parse()
                .map_err(|_| format!("{len:?} is no prefix length"))?;
            if len > max_len(ip) {
                return Err(format!("prefix /{len} is longer than the address"));
            }
            return Ok(HostRule::Net(ip, len));
        }
        let name = s.strip_prefix("*.").unwrap_or(s);
        let valid = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            });
        if !valid {
            return Err(format!("{s:?} is not a host name, address or CIDR"));
        }
        Ok(HostRule::Name(s.to_ascii_lowercase()))
    }

    fn matches_name(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match self {
            HostRule::Name(n) => match n.strip_prefix("*.") {
                Some(domain) => host.ends_with(&format!(".{domain}")),
                None => *n == host,
            },
            HostRule::Net(..) => false,
        }
    }

    fn matches_ip(&self, ip: IpAddr) -> bool {
        let HostRule::Net(net, len) = self else {
            return false;
        };
        match (canonical(*net), canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), *len),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), *len),
            _ => false,
        }
    }
}

fn max_len(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

fn prefix_eq(a: &[u8], b: &[u8], len: u8) -> bool {
    let (bytes, bits) = ((len / 8) as usize, len % 8);
    a[..bytes] == b[..bytes] && (bits == 0 || (a[bytes] ^ b[bytes]) & (0xffu8 << (8 - bits)) == 0)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

/// Whether `ip` is a globally reachable unicast address: not loopback, private, link-local,
/// shared (CGNAT), unspecified, multicast, broadcast, documentation, benchmarking or reserved,
/// nor an IPv6 form of one (mapped, NAT64, 6to4).
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(a) => public_v4(a),
        IpAddr::V6(a) => public_v6(a),
    }
}

fn public_v4(a: Ipv4Addr) -> bool {
    let [o0, o1, o2, _] = a.octets();
    !(o0 == 0
        || o0 == 10
        || o0 == 127
        || (o0 == 100 && (64..128).contains(&o1))
        || (o0 == 169 && o1 == 254)
        || (o0 == 172 && (16..32).contains(&o1))
        || (o0 == 192 && o1 == 0 && (o2 == 0 || o2 == 2))
        || (o0 == 192 && o1 == 168)
        || (o0 == 198 && (18..20).contains(&o1))
        || (o0 == 198 && o1 == 51 && o2 == 100)
        || (o0 == 203 && o1 == 0 && o2 == 113)
        || o0 >= 224)
}

fn public_v6(a: Ipv6Addr) -> bool {
    let s = a.segments();
    let embedded_v4 = |hi: u16, lo: u16| {
        public_v4(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        ))
    };
    if a.is_unspecified() || a.is_loopback() || a.is_multicast() {
        return false;
    }
    match s[0] {
        // Unique local, link-local, site-local (deprecated), documentation.
        x if x & 0xfe00 == 0xfc00 || x & 0xffc0 == 0xfe80 || x & 0xffc0 == 0xfec0 => false,
        0x2001 if s[1] == 0x0db8 => false,
        // 6to4 carries an IPv4 address.
        0x2002 => embedded_v4(s[1], s[2]),
        // NAT64 (64:ff9b::/96) and IPv4-compatible (::a.b.c.d).
        0x0064 if s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] => embedded_v4(s[6], s[7]),
        0 if s[1..6] == [0, 0, 0, 0, 0] => false,
        _ => true,
    }
}

/// Environment variables a run may not set for its command: they change what a program
/// allowed by name actually executes.
fn env_refused(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("LD_")
        || upper.starts_with("DYLD_")
        || matches!(upper.as_str(), "PATH" | "BASH_ENV" | "ENV" | "IFS")
}

/// The rules of one worker.
#[derive(Debug, Clone)]
pub struct Policy {
    exec_enabled: bool,
    exec_allow: Vec<PathBuf>,
    exec_tenants: Vec<String>,
    http_public: bool,
    http_allow: Vec<HostRule>,
    prefix: String,
}

impl Policy {
    pub fn new(config: &Config) -> Policy {
        let w = &config.worker;
        Policy {
            exec_enabled: w.exec.enabled,
            exec_allow: w.exec.allow.clone(),
            exec_tenants: w.exec.tenants.clone(),
            http_public: w.http.allow_public,
            http_allow: w
                .http
                .allow_hosts
                .iter()
                .filter_map(|h| HostRule::parse(h).ok())
                .collect(),
            prefix: config.topic_prefix.clone(),
        }
    }

    /// The program an `exec` run may start (its target, looked up in `PATH` when it has no
    /// `/`), or why it may not.
    pub fn exec(&self, run: &Run) -> Result<PathBuf, String> {
        let target = &run.handler.target;
        let tenant = &run.tenant;
        if !self.exec_enabled {
            return Err(format!(
                "refused: exec is disabled on this worker (worker.exec.enabled = false); \
                 program {target:?}, tenant {tenant:?}"
            ));
        }
        if !self.exec_tenants.is_empty() && !self.exec_tenants.contains(tenant) {
            return Err(format!(
                "refused: tenant {tenant:?} may not use exec (not in worker.exec.tenants); \
                 program {target:?}"
            ));
        }
        let program = resolve_program(target).ok_or_else(|| {
            format!(
                "refused: exec program {target:?} (tenant {tenant:?}) is not an absolute path \
                 and not found in the worker's PATH; worker.exec.allow lists absolute paths"
            )
        })?;
        if !self.exec_allow.contains(&program) {
            return Err(format!(
                "refused: exec program {:?} (tenant {tenant:?}) is not in worker.exec.allow",
                program.display().to_string()
            ));
        }
        if let Some(k) = run.handler.headers.keys().find(|k| env_refused(k)) {
            return Err(format!(
                "refused: exec run of tenant {tenant:?} sets the environment variable {k:?}, \
                 which may change what {target:?} executes (LD_*, DYLD_*, PATH, BASH_ENV, ENV, \
                 IFS are refused)"
            ));
        }
        Ok(program)
    }

    /// Whether a `kafka` run may deliver to `topic`: never into Tocsin's own topics, which are
    /// every topic under the prefix (and, with an empty prefix, the lanes and the fleet's
    /// topics by name), nor into Kafka's internal `__` topics.
    pub fn kafka(&self, run: &Run) -> Result<(), String> {
        let topic = &run.handler.target;
        if crate::config::is_tocsin_topic(&self.prefix, topic) {
            return Err(format!(
                "refused: kafka target {topic:?} (tenant {:?}) is a Tocsin topic (topic prefix \
                 {:?}: the lanes, jobs, jobs.rejected, timers, control, runs, dead); a handler \
                 may not write into them",
                run.tenant, self.prefix
            ));
        }
        if topic.starts_with("__") {
            return Err(format!(
                "refused: kafka target {topic:?} (tenant {:?}) is an internal Kafka topic",
                run.tenant
            ));
        }
        Ok(())
    }

    /// Whether `host` (as named in a URL), at address `ip`, may be called.
    pub fn ip_allowed(&self, host: &str, ip: IpAddr) -> bool {
        self.http_allow
            .iter()
            .any(|r| r.matches_name(host) || r.matches_ip(ip))
            || (self.http_public && is_public(ip))
    }

    /// Whether an `http` run may call `url`: every address its host resolves to must be
    /// allowed. A name that does not resolve is let through: the request then fails (and is
    /// retried) as it would have; the client's resolver applies the same rule to what it
    /// connects to, so a name that changes its answer after this check is still refused.
    pub async fn http(&self, run: &Run, url: &reqwest::Url) -> Result<(), String> {
        let tenant = &run.tenant;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "refused: http target {:?} (tenant {tenant:?}) is not an http or https URL",
                url.as_str()
            ));
        }
        let Some(host) = url.host_str() else {
            return Err(format!(
                "refused: http target {:?} (tenant {tenant:?}) names no host",
                url.as_str()
            ));
        };
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if self.http_allow.iter().any(|r| r.matches_name(bare)) {
            return Ok(());
        }
        let addrs: Vec<IpAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                let port = url.port_or_known_default().unwrap_or(80);
                match tokio::net::lookup_host((bare, port)).await {
                    Ok(a) => a.map(|a| a.ip()).collect(),
                    Err(_) => return Ok(()),
                }
            }
        };
        match addrs.iter().find(|ip| !self.ip_allowed(bare, **ip)) {
            Some(ip) => Err(format!(
                "refused: http target host {host:?} (tenant {tenant:?}) is at {ip}, {}",
                self.why_not(*ip)
            )),
            None => Ok(()),
        }
    }

    fn why_not(&self, ip: IpAddr) -> &'static str {
        if is_public(ip) {
            "a public address, and worker.http.allow_public = false; list it in \
             worker.http.allow_hosts to allow it"
        } else {
            "a loopback, private, link-local or otherwise non-public address; list it in \
             worker.http.allow_hosts to allow it"
        }
    }
}

/// `target` when absolute, else the first executable file of that name on `PATH` (relative
/// `PATH` entries are skipped); `None` for a relative path with a `/`.
fn resolve_program(target: &str) -> Option<PathBuf> {
    if target.contains('/') {
        let p = Path::new(target);
        return p.is_absolute().then(|| p.to_owned());
    }
    if target.is_empty() {
        return None;
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(target))
        .find(|c| is_executable(c))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The HTTP client's resolver: the addresses of a name, less those the policy refuses (none
/// left: the connection fails, naming the rule).
pub struct GuardedResolver(pub Arc<Policy>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(guarded_lookup(self.0.clone(), name.as_str().to_owned()))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn guarded_lookup(
    policy: Arc<Policy>,
    host: String,
) -> Result<reqwest::dns::Addrs, BoxError> {
    let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
    let allowed: Vec<SocketAddr> = all
        .iter()
        .copied()
        .filter(|a| policy.ip_allowed(&host, a.ip()))
        .collect();
    if allowed.is_empty() && !all.is_empty() {
        return Err(format!(
            "refused: {host} resolves only to addresses worker.http.allow_hosts does not allow \
             ({})",
            all.iter()
                .map(|a| a.ip().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
        .into());
    }
    Ok(Box::new(allowed.into_iter()))
}

/// The HTTP client's redirect rule: at most 10, and never to an address literal the policy
/// refuses (a name is checked by the resolver).
pub fn redirect_policy(policy: Arc<Policy>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            return attempt.error("too many redirects");
        }
        let host = attempt.url().host_str().unwrap_or_default();
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        match bare.parse::<IpAddr>() {
            Ok(ip) if !policy.ip_allowed(&bare, ip) => attempt.error(format!(
                "refused: redirect to {bare}, an address worker.http.allow_hosts does not allow"
            )),
            _ => attempt.follow(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::{HandlerKind, HandlerSpec, RetryPolicy};
    use crate::model::records::FireReason;

    fn run(kind: HandlerKind, target: &str, tenant: &str) -> Run {
        Run {
            run_id: "r1".into(),
            job_id: "j1".into(),
            tenant: tenant.into(),
            scheduled_ms: 1_000,
            fire_ms: 1_000,
            attempt: 1,
            reason: FireReason::Schedule,
            handler: HandlerSpec {
                kind,
                target: target.into(),
                payload: vec![],
                headers: Default::default(),
                method: None,
                args: vec![],
            },
            timeout_ms: 10_000,
            retry: RetryPolicy::default(),
            labels: Default::default(),
        }
    }

    fn policy(f: impl FnOnce(&mut Config)) -> Policy {
        let mut c = Config::default();
        f(&mut c);
        Policy::new(&c)
    }

    #[test]
    fn exec_is_refused_by_default_and_outside_the_allow_list() {
        let p = policy(|_| {});
        let e = p
            .exec(&run(HandlerKind::Exec, "/bin/true", "acme"))
            .unwrap_err();
        assert!(
            e.contains("worker.exec.enabled") && e.contains("/bin/true"),
            "{e}"
        );
        let p = policy(|c| {
            c.worker.exec.enabled = true;
            c.worker.exec.allow = vec!["/bin/true".into()];
        });
        assert_eq!(
            p.exec(&run(HandlerKind::Exec, "/bin/true", "acme")),
            Ok("/bin/true".into())
        );
        let e = p
            .exec(&run(HandlerKind::Exec, "/bin/sh", "acme"))
            .unwrap_err();
        assert!(
            e.contains("\"/bin/sh\"") && e.contains("worker.exec.allow"),
            "{e}"
        );
        // Written another way, the same file is still not the path allowed.
        let e = p
            .exec(&run(HandlerKind::Exec, "/bin/../bin/true", "acme"))
            .unwrap_err();
        assert!(e.contains("worker.exec.allow"), "{e}");
        let e = p
            .exec(&run(HandlerKind::Exec, "./true", "acme"))
            .unwrap_err();
        assert!(e.contains("absolute"), "{e}");
        let mut r = run(HandlerKind::Exec, "/bin/true", "acme");
        r.handler
            .headers
            .insert("LD_PRELOAD".into(), "/tmp/x.so".into());
        let e = p.exec(&r).unwrap_err();
        assert!(e.contains("LD_PRELOAD"), "{e}");
    }

    #[test]
    fn exec_tenants_limit_who_may_run_and_bare_names_resolve_on_path() {
        let sh = resolve_program("sh").expect("sh on PATH");
        let p = policy(|c| {
            c.worker.exec.enabled = true;
            c.worker.exec.allow = vec![sh.clone()];
            c.worker.exec.tenants = vec!["ops".into()];
        });
        assert_eq!(p.exec(&run(HandlerKind::Exec, "sh", "ops")), Ok(sh));
        let e = p.exec(&run(HandlerKind::Exec, "sh", "acme")).unwrap_err();
        assert!(
            e.contains("\"acme\"") && e.contains("worker.exec.tenants"),
            "{e}"
        );
    }

    #[test]
    fn kafka_targets_in_tocsin_topics_are_refused() {
        let p = policy(|_| {});
        for t in [
            "tocsin.lane.other",
            "tocsin.jobs",
            "tocsin.control",
            "tocsin.runs",
            "tocsin.dead",
            "tocsin.timers",
            "tocsin.jobs.rejected",
            "__consumer_offsets",
        ] {
            let e = p.kafka(&run(HandlerKind::Kafka, t, "acme")).unwrap_err();
            assert!(e.contains(t), "{e}");
        }
        for t in ["orders", "tocsin", "tocsinx.jobs", "other.lane.x"] {
            assert_eq!(p.kafka(&run(HandlerKind::Kafka, t, "acme")), Ok(()), "{t}");
        }
        assert!(p
            .kafka(&run(HandlerKind::Kafka, "tocsin.sink", "acme"))
            .is_err());
        // With no prefix, the fleet's topics by name.
        let p = policy(|c| c.topic_prefix = String::new());
        for t in [
            "lane.other",
            "jobs",
            "control",
            "runs",
            "dead",
            "timers",
            "jobs.rejected",
        ] {
            assert!(p.kafka(&run(HandlerKind::Kafka, t, "acme")).is_err(), "{t}");
        }
        assert_eq!(p.kafka(&run(HandlerKind::Kafka, "orders", "acme")), Ok(()));
    }

    #[test]
    fn public_addresses_are_told_apart() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
        ] {
            assert!(!is_public(a.parse().unwrap()), "{a}");
        }
        for a in ["1.1.1.1", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(a.parse().unwrap()), "{a}");
        }
    }

    #[test]
    fn host_rules_match_names_addresses_and_networks() {
        assert!(HostRule::parse("10.0.0.0/33").is_err());
        assert!(HostRule::parse("not a host").is_err());
        let p = policy(|c| {
            c.worker.http.allow_hosts = vec![
                "10.1.0.0/16".into(),
                "::1".into(),
                "*.internal".into(),
                "db.lan".into(),
            ]
        });
        assert!(p.ip_allowed("x", "10.1.200.3".parse().unwrap()));
        assert!(!p.ip_allowed("x", "10.2.0.1".parse().unwrap()));
        assert!(p.ip_allowed("x", "::1".parse().unwrap()));
        assert!(!p.ip_allowed("x", "127.0.0.1".parse().unwrap()));
        assert!(p.ip_allowed("billing.internal", "127.0.0.1".parse().unwrap()));
        assert!(!p.ip_allowed("internal", "127.0.0.1".parse().unwrap()));
        assert!(p.ip_allowed("DB.lan", "192.168.0.1".parse().unwrap()));
        assert!(p.ip_allowed("anything", "8.8.8.8".parse().unwrap()));
        let strict = policy(|c| c.worker.http.allow_public = false);
        assert!(!strict.ip_allowed("anything", "8.8.8.8".parse().unwrap()));
    }

    #[tokio::test]
    async fn http_to_loopback_is_refused_unless_listed() {
        let r = run(HandlerKind::Http, "http://127.0.0.1:9/x", "acme");
        let url = reqwest::Url::parse(&r.handler.target).unwrap();
        let e = policy(|_| {}).http(&r, &url).await.unwrap_err();
        assert!(
            e.contains("127.0.0.1") && e.contains("worker.http.allow_hosts"),
            "{e}"
        );
        let url = reqwest::Url::parse("http://localhost:9/x").unwrap();
        assert!(policy(|_| {}).http(&r, &url).await.is_err());
        let open = policy(|c| c.worker.http.allow_hosts = vec!["127.0.0.0/8".into()]);
        let url = reqwest::Url::parse(&r.handler.target).unwrap();
        assert_eq!(open.http(&r, &url).await, Ok(()));
    }
}
