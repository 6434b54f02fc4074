//! `roost certs init|issue` (issue 26) on the real binary: the member certificate chains to
//! the CA, is valid for its name and no other, for client and server use; keys are 0600; an
//! existing CA is not replaced without `--force`; a bad name is a usage error; a certificate
//! from another CA does not verify against this one.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::BIN;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

fn certs(args: &[&str], dir: &Path) -> Output {
    Command::new(BIN)
        .arg("certs")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("run roost certs")
}

fn ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}

fn cert(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).expect("a PEM certificate")
}

/// Whether `leaf` chains to `ca` for `usage` now.
fn chains(ca: &CertificateDer<'_>, leaf: &CertificateDer<'_>, usage: webpki::KeyUsage) -> bool {
    let anchor = webpki::anchor_from_trusted_cert(ca).expect("trust anchor");
    let ee = webpki::EndEntityCert::try_from(leaf).expect("end entity");
    ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &[anchor],
        &[],
        UnixTime::now(),
        usage,
        None,
        None,
    )
    .is_ok()
}

fn valid_for(leaf: &CertificateDer<'_>, name: &str) -> bool {
    let ee = webpki::EndEntityCert::try_from(leaf).expect("end entity");
    let name = ServerName::try_from(name.to_owned()).expect("a DNS name");
    ee.verify_is_valid_for_subject_name(&name).is_ok()
}

/// Goal: a CA and member b's certificate that the daemon's TLS accepts for b only.
#[test]
fn issue_makes_a_member_certificate_that_chains_to_the_ca() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("tls");
    let init = ok(&certs(&["init"], &dir));
    assert!(
        init["not_after"].as_str().is_some_and(|s| s.len() > 10),
        "{init}"
    );
    let b = ok(&certs(&["issue", "b"], &dir));
    assert_eq!(b["name"], "b");
    let (ca, leaf) = (cert(&dir.join("ca.pem")), cert(&dir.join("b.pem")));
    assert!(chains(&ca, &leaf, webpki::KeyUsage::client_auth()));
    assert!(chains(&ca, &leaf, webpki::KeyUsage::server_auth()));
    assert!(valid_for(&leaf, "b"));
    assert!(!valid_for(&leaf, "a"), "b's certificate is valid for a");
    for key in ["ca.key", "b.key"] {
        let mode = std::fs::metadata(dir.join(key))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key} mode {mode:o}");
    }
    let other = t.path().join("other");
    ok(&certs(&["init"], &other));
    ok(&certs(&["issue", "b"], &other));
    assert!(
        !chains(
            &ca,
            &cert(&other.join("b.pem")),
            webpki::KeyUsage::client_auth()
        ),
        "another CA's certificate chains to this one"
    );
}

/// Goal: nothing is replaced or made by mistake: a second init, a second issue, a bad name
/// and zero days are usage errors (exit 2) naming the problem, and the CA is unchanged.
#[test]
fn certs_refuses_to_replace_and_to_name_badly() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("tls");
    ok(&certs(&["init"], &dir));
    ok(&certs(&["issue", "a"], &dir));
    let before = std::fs::read(dir.join("ca.key")).expect("ca.key");
    let again = certs(&["init"], &dir);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("ca.pem exists"));
    assert_eq!(std::fs::read(dir.join("ca.key")).expect("ca.key"), before);
    assert_eq!(certs(&["issue", "a"], &dir).status.code(), Some(2));
    ok(&certs(&["issue", "a", "--force"], &dir));
    for bad in ["bad_name!", "", "a b"] {
        let out = certs(&["issue", bad], &dir);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a DNS name"));
    }
    assert_eq!(
        certs(&["issue", "c", "--days", "0"], &dir).status.code(),
        Some(2)
    );
    let none = certs(&["issue", "c"], &t.path().join("nowhere"));
    assert_eq!(
        none.status.code(),
        Some(78),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );
}
