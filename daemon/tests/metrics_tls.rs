//! A Prometheus on another machine scrapes roost (issue 43, docs/metrics.md "Securing the
//! endpoint"): `roost serve` in one network namespace with `metrics_listen` on its own
//! non-loopback address, secured by an exporter-toolkit web configuration (TLS from a `roost
//! certs` CA, basic auth with a bcrypt hash); the scraper in a second namespace across a veth
//! link, a rustls client that checks the server's certificate against that CA and its name.
//! Every namespace, address and packet exists only inside the two namespaces this test makes
//! (the host's own network is never touched); they are deleted when it ends, also on panic.
//! Needs root and `ip netns` (iproute2); fails, never skips, without them.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

const PORT: u16 = 9187;
/// The name `roost certs issue` puts in the server certificate (SAN dNSName).
const SERVER_NAME: &str = "metrics.roost.test";
const USER: &str = "prometheus";
const PASSWORD: &str = "scrape-me";

/// Links made by this process so far (part of each namespace's name).
static LINKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Two namespaces joined by a veth pair: the daemon's (`.1`) and the scraper's (`.2`).
struct Link {
    server_ns: String,
    client_ns: String,
    server_ip: String,
}

impl Link {
    fn new() -> Link {
        let euid = rustix::process::geteuid();
        assert!(
            euid.is_root(),
            "metrics_tls needs root (network namespaces, a veth pair); euid is {}",
            euid.as_raw()
        );
        let pid = std::process::id();
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let subnet = format!("10.{}.{}", 100 + random % 151, pid % 250);
        let n = LINKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let link = Link {
            server_ns: format!("roost-m{pid}-{n}-srv"),
            client_ns: format!("roost-m{pid}-{n}-cli"),
            server_ip: format!("{subnet}.1"),
        };
        for ns in [&link.server_ns, &link.client_ns] {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        let (s, c) = (&link.server_ns, &link.client_ns);
        ip(&[
            "-n", s, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", c,
        ]);
        for (ns, host) in [(s, 1), (c, 2)] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{subnet}.{host}/24"),
                "dev",
                "eth0",
            ]);
            ip(&["-n", ns, "link", "set", "eth0", "up"]);
        }
        link
    }

    fn addr(&self) -> SocketAddr {
        format!("{}:{PORT}", self.server_ip)
            .parse()
            .expect("an address")
    }

    /// Runs `f` on a thread moved into the scraper's namespace (its sockets are made there).
    fn in_client_ns<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.client_ns);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .expect("setns into the scraper's namespace");
            f()
        })
        .join()
        .expect("the scraper's thread")
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        for ns in [&self.server_ns, &self.client_ns] {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip not found ({e}): install iproute2 (.ci/run does)"));
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// `roost certs init` and `issue NAME` in `dir`: the CA's path.
fn certs(dir: &Path, name: &str) -> PathBuf {
    roost_certs(&["init"], dir);
    issue(dir, name);
    dir.join("ca.pem")
}

/// `roost certs issue NAME` by the CA in `dir`.
fn issue(dir: &Path, name: &str) {
    roost_certs(&["issue", name], dir);
}

fn roost_certs(args: &[&str], dir: &Path) {
    let out = Command::new(BIN)
        .arg("certs")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("run roost certs");
    assert!(out.status.success(), "roost certs {args:?}: {out:?}");
}

/// What a scraper trusts (a CA) and, for client certificate authentication, shows.
#[derive(Clone)]
struct Client {
    ca: PathBuf,
    /// Its certificate and key (PEM).
    identity: Option<(PathBuf, PathBuf)>,
}

impl Client {
    fn trusting(ca: &Path) -> Client {
        Client {
            ca: ca.to_path_buf(),
            identity: None,
        }
    }
}

/// What a scrape got: the status code and the body, or the failure before any answer.
type Scraped = Result<(u16, String), String>;

/// `GET path` over TLS, the server's certificate checked against the client's CA for
/// [`SERVER_NAME`], with `credentials` as basic auth.
fn https_get(
    addr: SocketAddr,
    client: &Client,
    path: &str,
    credentials: Option<(&str, &str)>,
) -> Scraped {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&client.ca).expect("the CA") {
        roots.add(c.expect("a CA certificate")).expect("add the CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let config = match &client.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .expect("the client certificate")
                .collect::<Result<Vec<_>, _>>()
                .expect("a certificate");
            let key = PrivateKeyDer::from_pem_file(key).expect("the client key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("a client identity")
        }
    };
    let name = ServerName::try_from(SERVER_NAME).expect("a DNS name");
    let conn = rustls::ClientConnection::new(Arc::new(config), name).expect("a TLS client");
    let tcp =
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let auth = credentials.map_or(String::new(), |(u, p)| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
        format!("Authorization: Basic {b64}\r\n")
    });
    let req = format!("GET {path} HTTP/1.1\r\nHost: {SERVER_NAME}\r\nAccept: text/plain; version=0.0.4\r\n{auth}\r\n");
    tls.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    if let Err(e) = tls.read_to_end(&mut out) {
        // The server closes after its one answer; a close without close_notify is fine once
        // the answer is in.
        if out.is_empty() {
            return Err(e.to_string());
        }
    }
    parse(&String::from_utf8_lossy(&out))
}

/// A plain-HTTP `GET /metrics`, no TLS.
fn http_get(addr: SocketAddr) -> Scraped {
    let mut s =
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse(&String::from_utf8_lossy(&out))
}

fn parse(answer: &str) -> Scraped {
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no answer: {answer:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((code, body.to_owned()))
}

/// `roost serve` in the server's namespace with `metrics_listen` on its veth address,
/// `web.yml` holding `yml` and `extra` added to the configuration; waits until it serves.
fn serve_in(link: &Link, dir: &Path, yml: &str, extra: &str) -> roost::drill::child::ServeChild {
    let web = dir.join("web.yml");
    std::fs::write(&web, yml).expect("web.yml");
    let cfg = dir.join("roost.toml");
    let toml = format!(
        "metrics_listen = \"{}\"\nmetrics_web_config = \"{}\"\n{extra}",
        link.addr(),
        web.display()
    );
    std::fs::write(&cfg, toml).expect("roost.toml");
    let wrapper = dir.join("roost-in-ns");
    let script = format!(
        "#!/bin/sh\nexec ip netns exec {} {BIN} \"$@\"\n",
        link.server_ns
    );
    std::fs::write(&wrapper, script).expect("wrapper");
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&wrapper, mode).expect("chmod");
    let (data, log) = (dir.join("data"), dir.join("serve.log"));
    let mut d = roost::drill::child::ServeChild::spawn(&wrapper, &data, &log, |c| {
        c.arg("--config").arg(&cfg);
    })
    .expect("spawn roost serve");
    d.ready(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e:#}"));
    d
}

/// Goal: a remote scrape works by the Prometheus book: over TLS with basic auth from a
/// client that checks the certificate; a wrong or missing password gets 401, plain HTTP
/// and a client that trusts another CA get no metrics; the right one gets 200 and text that
/// `promtool check metrics` accepts, the renamed metrics' old names beside the new ones
/// (`metrics_legacy_names = true`); the health checks answer without a password.
/// Method: the daemon in one namespace on its veth address, the scraper in another.
#[test]
fn a_remote_scrape_over_tls_with_basic_auth() {
    let link = Link::new();
    let t = tempfile::tempdir().expect("tempdir");
    let ca = Client::trusting(&certs(&t.path().join("tls"), SERVER_NAME));
    let other = Client::trusting(&certs(&t.path().join("other"), SERVER_NAME));
    let hash = bcrypt::hash(PASSWORD, 10).expect("bcrypt");
    let yml = format!("tls_server_config:\n  cert_file: tls/{SERVER_NAME}.pem\n  key_file: tls/{SERVER_NAME}.key\nbasic_auth_users:\n  {USER}: {hash}\n");
    let mut d = serve_in(&link, t.path(), &yml, "metrics_legacy_names = true\n");
    drop_and_wait(&t.path().join("data/spool"), "m1", Duration::from_secs(30));
    let log = d.log_text();
    assert!(
        log.contains("metrics listener up")
            && log.contains("tls=true")
            && log.contains("basic_auth=true"),
        "{log}"
    );
    assert!(
        !log.contains("not a loopback address"),
        "warned with TLS and auth:\n{log}"
    );
    let addr = link.addr();
    let answers = link.in_client_ns(move || {
        [
            https_get(addr, &ca, "/metrics", Some((USER, "wrong"))),
            https_get(addr, &ca, "/metrics", None),
            https_get(addr, &ca, "/metrics", Some(("nobody", PASSWORD))),
            http_get(addr),
            https_get(addr, &other, "/metrics", Some((USER, PASSWORD))),
            https_get(addr, &ca, "/health", None),
            timed(
                || https_get(addr, &ca, "/metrics", Some((USER, PASSWORD))),
                "first",
            ),
            timed(
                || https_get(addr, &ca, "/metrics", Some((USER, PASSWORD))),
                "next",
            ),
        ]
    });
    let [wrong, none, nobody, plain, untrusted, health, right, again] = answers;
    assert!(
        matches!(again, Ok((200, _))),
        "the password remembered: {}",
        short(&again)
    );
    for (what, a) in [
        ("a wrong password", &wrong),
        ("no password", &none),
        ("an unknown user", &nobody),
    ] {
        assert!(matches!(a, Ok((401, _))), "{what}: {}", short(a));
    }
    assert!(
        matches!(&plain, Ok((400, b)) if !b.contains("roost_")),
        "plain HTTP got {}",
        short(&plain)
    );
    assert!(
        untrusted.is_err(),
        "a client trusting another CA got {}",
        short(&untrusted)
    );
    assert!(
        matches!(&health, Ok((200, b)) if b.contains("\"check\":\"health\"")),
        "{}",
        short(&health)
    );
    let Ok((200, text)) = right else {
        panic!("the right password: {}", short(&right));
    };
    assert!(
        text.contains("roost_batches_total{status=\"committed\"} 1\n"),
        "{text}"
    );
    if let Err(e) = promtool(&text) {
        panic!("{e}\n--- the metrics:\n{text}");
    }
    old_names_beside_new(&text);
    assert_eq!(stop_code(&mut d), Some(0), "{}", d.log_text());
}

/// Goal: `client_auth_type: RequireAndVerifyClientCert` with `client_ca_file` admits only a
/// client whose certificate chains to that CA: one without a certificate, or with one from
/// another CA, gets no answer; the log names the policy.
/// Method: as above, no users; certificates from `roost certs issue` (clientAuth usage).
#[test]
fn a_required_client_certificate_is_verified() {
    let link = Link::new();
    let t = tempfile::tempdir().expect("tempdir");
    let (tls, foreign) = (t.path().join("tls"), t.path().join("other"));
    let ca = certs(&tls, SERVER_NAME);
    certs(&foreign, "scraper");
    let identity = |dir: &Path| Some((dir.join("scraper.pem"), dir.join("scraper.key")));
    issue(&tls, "scraper");
    let yml = format!("tls_server_config:\n  cert_file: tls/{SERVER_NAME}.pem\n  key_file: tls/{SERVER_NAME}.key\n  client_ca_file: tls/ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n");
    let mut d = serve_in(&link, t.path(), &yml, "");
    assert!(
        d.log_text().contains("client_cert=\"required\""),
        "{}",
        d.log_text()
    );
    let clients = [
        Client {
            ca: ca.clone(),
            identity: identity(&tls),
        },
        Client::trusting(&ca),
        Client {
            ca: ca.clone(),
            identity: identity(&foreign),
        },
    ];
    let addr = link.addr();
    let [member, anonymous, stranger] =
        link.in_client_ns(move || clients.map(|c| https_get(addr, &c, "/metrics", None)));
    assert!(
        matches!(&member, Ok((200, b)) if b.contains("roost_batches_total")),
        "{}",
        short(&member)
    );
    assert!(
        anonymous.is_err(),
        "no client certificate: {}",
        short(&anonymous)
    );
    assert!(
        stranger.is_err(),
        "another CA's client certificate: {}",
        short(&stranger)
    );
    assert_eq!(stop_code(&mut d), Some(0), "{}", d.log_text());
}

/// `scrape()`, its time printed (the first right password is checked by bcrypt, the next
/// ones by the cache of web.rs).
fn timed(scrape: impl FnOnce() -> Scraped, which: &str) -> Scraped {
    let started = std::time::Instant::now();
    let answer = scrape();
    eprintln!(
        "{which} scrape with the right password: {:?}",
        started.elapsed()
    );
    answer
}

/// An answer for a failure message: the status and the body's first line.
fn short(a: &Scraped) -> String {
    match a {
        Ok((code, body)) => format!("{code} {:?}", body.lines().next().unwrap_or_default()),
        Err(e) => format!("no answer: {e}"),
    }
}

/// Each renamed metric under its new name and, with the same value, its old one.
fn old_names_beside_new(text: &str) {
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(str::to_owned)
    };
    for (old, new) in [
        (
            "roost_replication_hw",
            "roost_replication_high_watermark_lsn",
        ),
        ("roost_checkpoint_wal_from", "roost_checkpoint_wal_from_lsn"),
    ] {
        assert!(value(new).is_some(), "no {new} in\n{text}");
        assert_eq!(value(old), value(new), "{old} is not {new}'s old name");
    }
}
