//! The replication transport from `[replication]` (issue 26): mutual TLS from the PEM files
//! `tls_cert`, `tls_key` and `tls_ca`, or plain TCP. Read once at start (`serve`), and again
//! by the start-up phases that connect before the serve loop (reconcile, re-seed). A file
//! that cannot be read or parsed stops the start with exit 78 naming it.

use std::path::Path;
use std::time::Duration;

use roost_replication::{TlsIdentity, Transport};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ReplicationConfig;
use crate::error::EngineError;

/// The transport `cfg` asks for.
pub fn transport(cfg: &ReplicationConfig) -> Result<Transport, EngineError> {
    let members = cfg.members.clone();
    let limit = Duration::from_millis(cfg.handshake_timeout_ms);
    let (Some(cert), Some(key), Some(ca)) = (&cfg.tls_cert, &cfg.tls_key, &cfg.tls_ca) else {
        return Ok(Transport::plain(members).handshake_timeout(limit));
    };
    let identity = TlsIdentity {
        chain: certs(cert, "tls_cert")?,
        key: PrivateKeyDer::from_pem_file(key).map_err(|e| bad("tls_key", key, &e.to_string()))?,
        ca: certs(ca, "tls_ca")?,
    };
    let name = cfg.node_name();
    if !identity.valid_for(&name) {
        return Err(bad(
            "tls_cert",
            cert,
            &format!("the certificate does not name this node {name:?} (replication.name) in a SAN dNSName"),
        ));
    }
    Transport::tls(identity, members)
        .map(|t| t.handshake_timeout(limit))
        .map_err(|e| EngineError::Credentials(e.to_string()))
}

fn certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, EngineError> {
    let iter = CertificateDer::pem_file_iter(path).map_err(|e| bad(key, path, &e.to_string()))?;
    let certs = iter
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(key, path, &e.to_string()))?;
    if certs.is_empty() {
        return Err(bad(key, path, "no CERTIFICATE in the file"));
    }
    Ok(certs)
}

fn bad(key: &str, path: &Path, why: &str) -> EngineError {
    EngineError::Credentials(format!("replication.{key} {}: {why}", path.display()))
}
