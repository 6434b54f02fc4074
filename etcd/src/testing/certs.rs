//! Certificates for a TLS test server, made with rcgen: a CA, a server certificate for
//! `127.0.0.1` and `localhost` (what loopback endpoints name) and a client certificate with
//! the clientAuth usage (what etcd's `--client-cert-auth` asks of a client), both signed by
//! the CA. ECDSA P-256, written as PEM into a directory of the test's.

use std::io;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::tls::EtcdTls;

/// The PEM files [`make_tls`] wrote.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// The client side, for [`crate::EtcdOptions::tls`].
    pub fn client(&self) -> EtcdTls {
        EtcdTls {
            ca: self.ca.clone(),
            cert: self.client_cert.clone(),
            key: self.client_key.clone(),
        }
    }
}

/// Writes a CA, a server and a client certificate with their keys into `dir` (created if
/// missing): `ca.pem`, `server.pem`, `server-key.pem`, `client.pem`, `client-key.pem`.
pub fn make_tls(dir: &Path) -> io::Result<TlsFiles> {
    std::fs::create_dir_all(dir)?;
    let ca_key = KeyPair::generate().map_err(rc("CA key"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(rc("CA parameters"))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "roost-etcd test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(rc("CA certificate"))?;
    let issuer = Issuer::new(ca, ca_key);
    let files = TlsFiles {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client-key.pem"),
    };
    std::fs::write(&files.ca, ca_cert.pem())?;
    let server = ["127.0.0.1", "localhost"];
    // clientAuth too: etcd 3.4's JSON gateway reaches its own gRPC server over TLS with the
    // server's certificate as its client certificate; without clientAuth, every gateway call
    // of a `--client-cert-auth` server fails with 503 "use of closed network connection".
    let usage = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    leaf(
        &issuer,
        &server,
        usage,
        &files.server_cert,
        &files.server_key,
    )?;
    let usage = vec![ExtendedKeyUsagePurpose::ClientAuth];
    leaf(
        &issuer,
        &["roost"],
        usage,
        &files.client_cert,
        &files.client_key,
    )?;
    Ok(files)
}

/// A certificate for `names` (an IP address becomes an IP SAN) with extended `usages`.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    names: &[&str],
    usages: Vec<ExtendedKeyUsagePurpose>,
    cert_path: &Path,
    key_path: &Path,
) -> io::Result<()> {
    let key = KeyPair::generate().map_err(rc("leaf key"))?;
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut p = CertificateParams::new(names.clone()).map_err(rc("leaf parameters"))?;
    p.distinguished_name.push(DnType::CommonName, &names[0]);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = usages;
    let cert = p.signed_by(&key, issuer).map_err(rc("signing a leaf"))?;
    std::fs::write(cert_path, cert.pem())?;
    std::fs::write(key_path, key.serialize_pem())
}

fn rc(what: &'static str) -> impl Fn(rcgen::Error) -> io::Error {
    move |e| io::Error::other(format!("making the test {what}: {e}"))
}
