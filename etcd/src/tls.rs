//! The TLS side of [`crate::EtcdOptions`] ([`EtcdTls`]): the CA, client certificate and key
//! PEM files read once, when the client is made (an unreadable or unparsable file is a
//! `Config` error that names it), into a rustls connector. etcd with `--client-cert-auth` refuses a client
//! without a certificate from its trusted CA; the CA file is the only root we trust for the
//! server (no system roots: an etcd cluster has its own CA).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

use crate::error::EtcdError;

/// Client certificate authentication (etcd `--client-cert-auth`): PEM files.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The CA that signed the members' certificates: the only root trusted.
    pub ca: PathBuf,
    /// Our certificate chain (leaf first), signed by a CA etcd trusts.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A connector that trusts only `tls.ca` and proves `tls.cert`/`tls.key`.
pub(crate) fn connector(tls: &EtcdTls) -> Result<TlsConnector, EtcdError> {
    let ca = read_certs(&tls.ca, "CA")?;
    let chain = read_certs(&tls.cert, "client certificate")?;
    let key_pem = read(&tls.key, "client key")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        EtcdError::Config(format!(
            "etcd TLS client key file {}: no usable PEM private key: {e}",
            tls.key.display()
        ))
    })?;
    let mut roots = RootCertStore::empty();
    for c in ca {
        roots.add(c).map_err(|e| {
            EtcdError::Config(format!("etcd TLS CA file {}: {e}", tls.ca.display()))
        })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| EtcdError::Config(format!("etcd TLS protocol versions: {e}")))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| {
            EtcdError::Config(format!(
                "etcd TLS client certificate {} with key {}: {e}",
                tls.cert.display(),
                tls.key.display()
            ))
        })?;
    Ok(TlsConnector::from(Arc::new(config)))
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|e| {
        EtcdError::Config(format!(
            "cannot read etcd TLS {what} file {}: {e}",
            path.display()
        ))
    })
}

/// Every certificate in the PEM file at `path`; at least one.
fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, EtcdError> {
    let pem = read(path, what)?;
    let bad =
        |why: String| EtcdError::Config(format!("etcd TLS {what} file {}: {why}", path.display()));
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate".to_owned()));
    }
    Ok(certs)
}
