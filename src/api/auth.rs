//! Who may change jobs through the API: bearer tokens, each for every tenant or for one.
//!
//! Tokens come from a file (`scheduler.api_tokens_file`, `--api-tokens-file`,
//! `TOCSIN_API_TOKENS_FILE`) or the environment (`TOCSIN_API_TOKEN`, one token for every
//! tenant), never from a flag's value, which `ps` shows to every user of the machine. Without
//! any token, mutations are served only on a loopback address.

use std::net::SocketAddr;
use std::path::Path;

/// The environment variable holding one token for every tenant.
pub const TOKEN_ENV: &str = "TOCSIN_API_TOKEN";

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("could not read the API tokens file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "invalid API tokens file {path}, line {line}: expected `TOKEN` or `TOKEN TENANT` \
         (a token of at least 16 characters)"
    )]
    Line { path: String, line: usize },
    #[error("invalid {TOKEN_ENV}: a token has at least 16 characters and no whitespace")]
    Env,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    secret: String,
    /// The one tenant whose jobs it may change; `None`: every tenant.
    tenant: Option<String>,
}

/// Whoever a mutating request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Any tenant (an unscoped token, or no token on a loopback address).
    Any,
    Tenant(String),
}

impl Caller {
    /// Whether this caller may change a job of `tenant`.
    pub fn may(&self, tenant: &str) -> bool {
        match self {
            Caller::Any => true,
            Caller::Tenant(t) => t == tenant,
        }
    }
}

/// Why a mutating request is refused: 401 (who are you?) or 403 (not you, not here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Unauthenticated(String),
    Forbidden(String),
}

#[derive(Debug, Clone)]
pub struct Auth {
    tokens: Vec<Token>,
    /// Mutations without a token are served only here: the address listened on is loopback.
    loopback: bool,
    listen: String,
}

const MIN_TOKEN_LEN: usize = 16;

impl Auth {
    /// The tokens of `file` and of `env` (the value of [`TOKEN_ENV`]), for a node listening on
    /// `listen`.
    pub fn load(
        file: Option<&Path>,
        env: Option<&str>,
        listen: SocketAddr,
    ) -> Result<Auth, AuthError> {
        let mut tokens = Vec::new();
        if let Some(path) = file {
            let shown = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| AuthError::Read {
                path: shown.clone(),
                source,
            })?;
            tokens
                .extend(parse_tokens(&text).map_err(|line| AuthError::Line { path: shown, line })?);
        }
        if let Some(secret) = env.map(str::trim).filter(|s| !s.is_empty()) {
            if secret.len() < MIN_TOKEN_LEN || secret.contains(char::is_whitespace) {
                return Err(AuthError::Env);
            }
            tokens.push(Token {
                secret: secret.to_owned(),
                tenant: None,
            });
        }
        Ok(Auth {
            tokens,
            loopback: listen.ip().is_loopback(),
            listen: listen.to_string(),
        })
    }

    /// Whether mutations are refused whatever the request: no token, not on loopback.
    pub fn mutations_disabled(&self) -> Option<String> {
        (self.tokens.is_empty() && !self.loopback).then(|| {
            format!(
                "mutations are disabled: this node listens on {}, not a loopback address, and \
                 has no API token (set {TOKEN_ENV} or scheduler.api_tokens_file)",
                self.listen
            )
        })
    }

    /// Who sends a mutating request with this `Authorization` header value.
    pub fn caller(&self, authorization: Option<&str>) -> Result<Caller, Refusal> {
        if let Some(why) = self.mutations_disabled() {
            return Err(Refusal::Forbidden(why));
        }
        if self.tokens.is_empty() {
            return Ok(Caller::Any);
        }
        let Some(header) = authorization else {
            return Err(Refusal::Unauthenticated(
                "this endpoint needs an Authorization: Bearer TOKEN header".into(),
            ));
        };
        let Some(secret) = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
        else {
            return Err(Refusal::Unauthenticated(
                "the Authorization header must be `Bearer TOKEN`".into(),
            ));
        };
        let secret = secret.trim();
        // Every token is compared, each in time independent of where it differs.
        let found = self
            .tokens
            .iter()
            .fold(None, |found, t| match same(&t.secret, secret) {
                true => Some(t),
                false => found,
            });
        match found {
            None => Err(Refusal::Unauthenticated("unknown API token".into())),
            Some(Token { tenant: None, .. }) => Ok(Caller::Any),
            Some(Token {
                tenant: Some(t), ..
            }) => Ok(Caller::Tenant(t.clone())),
        }
    }
}

fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Lines `TOKEN` or `TOKEN TENANT`; `#` starts a comment. `Err` holds the first bad line's
/// number (the line itself is not repeated: it holds a secret).
fn parse_tokens(text: &str) -> Result<Vec<Token>, usize> {
    let mut tokens = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(secret), tenant, None) = (words.next(), words.next(), words.next()) else {
            return Err(i + 1);
        };
        if secret.len() < MIN_TOKEN_LEN {
            return Err(i + 1);
        }
        tokens.push(Token {
            secret: secret.to_owned(),
            tenant: tenant.map(str::to_owned),
        });
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn tokens_scope_callers_to_their_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(
            &file,
            "# admin\nadmin-0123456789abcdef\nacme-0123456789abcdef acme  # acme's\n\n",
        )
        .unwrap();
        let auth = Auth::load(Some(&file), None, addr("0.0.0.0:9090")).unwrap();
        assert_eq!(auth.mutations_disabled(), None);
        assert_eq!(
            auth.caller(Some("Bearer admin-0123456789abcdef")),
            Ok(Caller::Any)
        );
        let acme = auth.caller(Some("Bearer acme-0123456789abcdef")).unwrap();
        assert!(acme.may("acme") && !acme.may("globex"));
        assert!(matches!(
            auth.caller(None),
            Err(Refusal::Unauthenticated(_))
        ));
        assert!(matches!(
            auth.caller(Some("Bearer nope-0123456789abcdef")),
            Err(Refusal::Unauthenticated(_))
        ));
        assert!(matches!(
            auth.caller(Some("Basic YWxpY2U6cHc=")),
            Err(Refusal::Unauthenticated(_))
        ));
    }

    #[test]
    fn without_a_token_only_loopback_serves_mutations() {
        let local = Auth::load(None, None, addr("127.0.0.1:9090")).unwrap();
        assert_eq!(local.caller(None), Ok(Caller::Any));
        let open = Auth::load(None, Some("  "), addr("0.0.0.0:9090")).unwrap();
        let Err(Refusal::Forbidden(why)) = open.caller(Some("Bearer x")) else {
            panic!("a node on 0.0.0.0 without a token must refuse mutations");
        };
        assert!(
            why.contains("0.0.0.0:9090") && why.contains(TOKEN_ENV),
            "{why}"
        );
        let env = Auth::load(None, Some("env-0123456789abcdef"), addr("[::]:1")).unwrap();
        assert_eq!(
            env.caller(Some("Bearer env-0123456789abcdef")),
            Ok(Caller::Any)
        );
    }

    #[test]
    fn bad_token_sources_name_the_file_and_line_not_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(&file, "good-0123456789abcdef\nshort\n").unwrap();
        let e = Auth::load(Some(&file), None, addr("127.0.0.1:1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && !e.contains("short"), "{e}");
        let missing = dir.path().join("missing");
        let e = Auth::load(Some(&missing), None, addr("127.0.0.1:1")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        assert!(matches!(
            Auth::load(None, Some("short"), addr("127.0.0.1:1")),
            Err(AuthError::Env)
        ));
    }
}
