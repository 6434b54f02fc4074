//! Client certificate authentication (`--client-cert-auth`) against a real etcd.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use roost_etcd::testing::{make_tls, EtcdServer};
use roost_etcd::{Etcd, EtcdError, EtcdOptions, EtcdTls};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::CALL_TIMEOUT;

fn client(url: &str, tls: Option<EtcdTls>) -> Result<Etcd, EtcdError> {
    Etcd::new(EtcdOptions {
        endpoints: vec![url.to_owned()],
        tls,
        request_timeout: CALL_TIMEOUT,
    })
}

/// Goal: with the CA's client certificate the client works over https; a certificate from
/// another CA, a client trusting another CA, and plain http are each refused with an error
/// that names the endpoint, the call and the reason (rustls' alert or verdict). Method: one
/// TLS etcd, a second CA made beside the first, one call per kind of client.
#[tokio::test]
async fn client_certificate_is_required_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let ours = make_tls(&dir.path().join("ours")).unwrap();
    let theirs = make_tls(&dir.path().join("theirs")).unwrap();
    let etcd = EtcdServer::start_tls(&dir.path().join("etcd"), &ours).unwrap();
    let url = etcd.client_url().to_owned();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    let good = client(&url, Some(ours.client())).unwrap();
    let rev = good.put("roost/tls", b"yes", None).await.unwrap();
    let (kv, _) = good.get("roost/tls").await.unwrap();
    assert_eq!(kv.unwrap().mod_revision, rev);

    let foreign_cert = EtcdTls {
        ca: ours.ca.clone(),
        cert: theirs.client_cert.clone(),
        key: theirs.client_key.clone(),
    };
    let err = client(&url, Some(foreign_cert))
        .unwrap()
        .get("k")
        .await
        .unwrap_err();
    assert_refused(&err, &url, "get");

    let foreign_ca = EtcdTls {
        ca: theirs.ca.clone(),
        ..ours.client()
    };
    let err = client(&url, Some(foreign_ca))
        .unwrap()
        .get("k")
        .await
        .unwrap_err();
    assert_refused(&err, &url, "get");
    assert!(err.to_string().contains("certificate"), "{err}");

    let plain = url.replace("https://", "http://");
    let err = client(&plain, None)
        .unwrap()
        .put("k", b"v", None)
        .await
        .unwrap_err();
    // etcd closes a plain connection to a TLS port without an answer.
    assert!(
        matches!(&err, EtcdError::Unreachable { op: "put", endpoint, .. } if *endpoint == plain),
        "{err}"
    );
}

fn assert_refused(err: &EtcdError, url: &str, call: &str) {
    eprintln!("refused as expected: {err}");
    let said = |d: &str| d.contains("TLS") || d.contains("alert");
    assert!(
        matches!(err, EtcdError::Unreachable { endpoint, op, detail }
            if endpoint == url && *op == call && said(detail)),
        "{err:?}"
    );
}

/// Goal: a TLS client that presents no certificate at all gets no answer (the client API
/// always sends one, so this drives rustls directly). Method: handshake trusting the CA,
/// send a range request, read: an alert or a close, never an HTTP answer.
#[tokio::test]
async fn a_client_without_a_certificate_gets_no_answer() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_tls(&dir.path().join("tls")).unwrap();
    let etcd = EtcdServer::start_tls(&dir.path().join("etcd"), &files).unwrap();
    let addr = etcd.client_url().trim_start_matches("https://").to_owned();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&files.ca).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        let mut s = connector.connect(name, tcp).await?;
        let body = r#"{"key":"aw=="}"#;
        let req = format!(
            "POST /v3/kv/range HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.map(|_| buf)
    })
    .await
    .expect("etcd answers or closes within 5 s");
    match answer {
        Err(e) => eprintln!("refused as expected: {e}"),
        Ok(buf) => assert!(
            buf.is_empty(),
            "an answer: {}",
            String::from_utf8_lossy(&buf)
        ),
    }
}

/// Goal: unreadable TLS files are configuration errors that name the file.
#[test]
fn a_missing_tls_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let files = make_tls(dir.path()).unwrap();
    let missing = PathBuf::from("/nonexistent/client-key.pem");
    let tls = EtcdTls {
        key: missing.clone(),
        ..files.client()
    };
    let err = client("https://127.0.0.1:2379", Some(tls)).unwrap_err();
    assert!(
        matches!(&err, EtcdError::Config(m) if m.contains("/nonexistent/client-key.pem")),
        "{err}"
    );
    let tls = EtcdTls {
        ca: files.client_key.clone(),
        ..files.client()
    };
    let err = client("https://127.0.0.1:2379", Some(tls)).unwrap_err();
    let ca = files.client_key.display().to_string();
    assert!(
        matches!(&err, EtcdError::Config(m) if m.contains(&ca)),
        "{err}"
    );
}
