//! What secures the metrics listener, built from `metrics_web_config` (`web_config.rs`): a
//! rustls acceptor from `tls_server_config` and the `basic_auth_users` check, as
//! exporter-toolkit serves them. Built once per start from the files; a file that cannot be
//! read or does not hold what its key says is a [`ConfigError`] (exit 78) naming it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::digest;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

use super::web_config::{ClientAuth, TlsFiles, Versions, WebConfig};
use crate::config::{Config, ConfigError};

/// A bcrypt hash (cost 10) of no password anyone sends: an unknown user's password is
/// checked against it, so an answer takes as long for an unknown user as for a known one
/// (exporter-toolkit does the same against user enumeration by timing).
const DUMMY_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

/// The listener's security: TLS or not, users or not.
#[derive(Default)]
pub struct Web {
    pub tls: Option<TlsAcceptor>,
    /// The client certificate policy, for the log line.
    pub client_auth: Option<ClientAuth>,
    /// User name to bcrypt hash; empty: no authentication.
    users: BTreeMap<String, String>,
    /// Per user, the salted SHA-256 of the last password bcrypt accepted for it: a scraper
    /// sends the same password every few seconds, and bcrypt is slow by design (231 ms at
    /// cost 10 on the 2-core test machine). At most one entry per configured user; a
    /// password that does not match it goes to bcrypt. Salted per process (`salt`), so the
    /// memory holds no plain SHA-256 of a password.
    verified: Mutex<BTreeMap<String, [u8; 32]>>,
    salt: [u8; 16],
}

impl Web {
    /// The configured security: plain HTTP without users when `metrics_web_config` is
    /// unset.
    pub fn load(cfg: &Config) -> Result<Web, ConfigError> {
        let Some(path) = &cfg.metrics_web_config else {
            return Ok(Web::default());
        };
        let web = WebConfig::load(path)?;
        let bad = |detail: String| ConfigError::Parse {
            path: path.clone(),
            detail: format!("metrics_web_config: {detail}"),
        };
        let tls = match &web.tls {
            Some(files) => Some(TlsAcceptor::from(Arc::new(
                server_config(files).map_err(bad)?,
            ))),
            None => None,
        };
        let mut salt = [0u8; 16];
        SystemRandom::new()
            .fill(&mut salt)
            .map_err(|_| bad("no random bytes for the password cache's salt".into()))?;
        Ok(Web {
            tls,
            client_auth: web.tls.as_ref().map(|t| t.client_auth),
            users: web.users,
            verified: Mutex::default(),
            salt,
        })
    }

    pub fn auth_on(&self) -> bool {
        !self.users.is_empty()
    }

    /// Whether an `Authorization` header's Basic credentials name a user whose bcrypt hash
    /// the password matches (always true without users). A password accepted before is
    /// found in the cache; any other is checked by bcrypt, which takes a large fraction of
    /// a second by design: blocking, run it off the runtime's workers.
    pub fn authorized(&self, authorization: Option<&[u8]>) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let Some((user, password)) = authorization.and_then(basic_credentials) else {
            return false;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.as_str(), true),
            None => (DUMMY_HASH, false),
        };
        let digest = self.digest(&password);
        let hit = known
            && self
                .remembered()
                .get(&user)
                .is_some_and(|d| same(d, &digest));
        if hit {
            return true;
        }
        // A hash that is not bcrypt was refused at load; an error here is a mismatch.
        let matches = bcrypt::verify(password.as_bytes(), hash).unwrap_or(false);
        if known && matches {
            self.remembered().insert(user, digest);
        }
        known && matches
    }

    /// The cache of accepted passwords (a poisoned one only costs bcrypt checks: what it
    /// holds is used).
    fn remembered(&self) -> MutexGuard<'_, BTreeMap<String, [u8; 32]>> {
        roost_storage::lock(&self.verified)
    }

    fn digest(&self, password: &str) -> [u8; 32] {
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(&self.salt);
        ctx.update(password.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    /// The log line saying the listener is up, and once per process a warning when it
    /// serves a non-loopback address without TLS or without users.
    pub fn log_listening(&self, addr: SocketAddr) {
        let (tls, auth) = (self.tls.is_some(), self.auth_on());
        let client_cert = self.client_auth.map_or("none", client_auth_name);
        info!(%addr, tls, basic_auth = auth, client_cert, "metrics listener up: /metrics, /health, /leader, /replica");
        static WARNED: AtomicBool = AtomicBool::new(false);
        if addr.ip().is_loopback() || (tls && auth) || WARNED.swap(true, Ordering::Relaxed) {
            return;
        }
        let what = match (tls, auth) {
            (false, false) => "unauthenticated and unencrypted: anyone who reaches it reads the metrics",
            (false, true) => "without TLS: basic auth passwords cross the network in clear",
            _ => "unauthenticated (TLS without basic_auth_users): anyone who reaches it reads the metrics",
        };
        warn!(%addr, "metrics_listen is not a loopback address and the endpoint is {what}; secure it with metrics_web_config (tls_server_config, basic_auth_users) as Prometheus exporters do");
    }
}

/// Equal, in a time that does not depend on where two digests differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn client_auth_name(c: ClientAuth) -> &'static str {
    match c {
        ClientAuth::NoClientCert => "none",
        ClientAuth::VerifyClientCertIfGiven => "verified_if_given",
        ClientAuth::RequireAndVerifyClientCert => "required",
    }
}

/// `Basic BASE64(user:password)` (the scheme's name in any case, as Go's `BasicAuth`).
fn basic_credentials(header: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(header).ok()?;
    let (scheme, rest) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = B64.decode(rest.trim()).ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// The rustls server configuration `files` describe.
fn server_config(files: &TlsFiles) -> Result<ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match files.versions {
        Versions::Tls12And13 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        Versions::Tls12Only => &[&rustls::version::TLS12],
        Versions::Tls13Only => &[&rustls::version::TLS13],
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?;
    let builder = match (&files.client_ca_file, files.client_auth) {
        (
            Some(ca),
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert,
        ) => {
            let mut roots = RootCertStore::empty();
            for c in certs(ca, "client_ca_file")? {
                roots.add(c).map_err(|e| {
                    format!("tls_server_config.client_ca_file {}: {e}", ca.display())
                })?;
            }
            let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if files.client_auth == ClientAuth::VerifyClientCertIfGiven {
                v = v.allow_unauthenticated();
            }
            let v = v
                .build()
                .map_err(|e| format!("tls_server_config.client_ca_file: {e}"))?;
            builder.with_client_cert_verifier(v)
        }
        _ => builder.with_no_client_auth(),
    };
    let chain = certs(&files.cert_file, "cert_file")?;
    let key = PrivateKeyDer::from_pem_file(&files.key_file).map_err(|e| {
        format!(
            "tls_server_config.key_file {}: {e}",
            files.key_file.display()
        )
    })?;
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("tls_server_config.cert_file and key_file: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad =
        |e: &dyn std::fmt::Display| format!("tls_server_config.{key} {}: {e}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    if certs.is_empty() {
        return Err(bad(&"no CERTIFICATE in the file"));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: only the right user with the right password passes; a malformed header, an
    /// unknown user (checked against the dummy hash) or another scheme does not.
    #[test]
    fn basic_auth_checks_user_and_password() {
        let hash = bcrypt::hash("s3cret", 4).expect("hash");
        let web = Web {
            users: BTreeMap::from([("prom".to_owned(), hash)]),
            ..Web::default()
        };
        let header = |s: &str| format!("Basic {}", B64.encode(s));
        assert!(web.authorized(Some(header("prom:s3cret").as_bytes())));
        assert_eq!(web.verified.lock().expect("cache").len(), 1, "remembered");
        assert!(
            web.authorized(Some(header("prom:s3cret").as_bytes())),
            "from the cache"
        );
        assert!(web.authorized(Some(
            format!("bAsIc {}", B64.encode("prom:s3cret")).as_bytes()
        )));
        for bad in ["prom:wrong", "other:s3cret", "prom", "prom:s3cret:"] {
            assert!(!web.authorized(Some(header(bad).as_bytes())), "{bad}");
        }
        assert!(!web.authorized(Some(b"Bearer abc")));
        assert!(!web.authorized(Some(b"Basic !!!")));
        assert!(!web.authorized(None));
        assert!(
            Web::default().authorized(None),
            "no users: no authentication"
        );
        assert!(
            bcrypt::verify("", DUMMY_HASH).is_ok(),
            "the dummy hash is a bcrypt hash"
        );
    }
}
