//! Who may speak replication (issue 26), on real processes over loopback: the issue's
//! forged acknowledgement (a stranger's two frames, and a member fetching under another
//! member's name) does not answer a waiting batch; a forged epoch does not step the primary
//! down (over TLS, and over plain TCP, where only the plausibility rule stands); a stranger
//! reads nothing, neither records nor a base backup; a standby with a certificate from
//! another CA cannot follow; plain TCP on a public address needs `insecure = true`, which
//! the daemon says at start and in `status`. Every wait is bounded.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod repl;

use std::path::Path;
use std::time::Duration;

use common::{drop_in, wait_for, BIN};
use repl::*;
use roost::config::ReplicationConfig;
use roost_replication::testing::fetch;
use roost_replication::{Message, Stream, Transport};

/// The forged epoch: near the top of `u32`.
const FORGED_EPOCH: u32 = 4_294_967_280;

/// How long a test watches for something that must not happen.
const QUIET: Duration = Duration::from_millis(1500);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Member `name`'s transport, from the files `roost certs` made in `<root>/certs`.
fn member(root: &Path, name: &str) -> Transport {
    tls_lines(root, name); // makes the CA and `name`'s certificate if missing
    let d = root.join("certs");
    let cfg = ReplicationConfig {
        tls_cert: Some(d.join(format!("{name}.pem"))),
        tls_key: Some(d.join(format!("{name}.key"))),
        tls_ca: Some(d.join("ca.pem")),
        members: MEMBERS.iter().map(|m| m.to_string()).collect(),
        name: Some(name.to_owned()),
        ..ReplicationConfig::default()
    };
    roost::replica::transport::transport(&cfg).expect("member transport")
}

/// Connects with `transport` (a plain one: a stranger) and sends each message in turn on
/// one connection; the answers up to the first the leader did not give (closed, refused).
fn exchange(transport: &Transport, addr: &str, msgs: &[Message]) -> Vec<Message> {
    runtime().block_on(async {
        let mut answers = Vec::new();
        let Ok(mut s) = transport.connect(addr, Duration::from_secs(5)).await else {
            return answers;
        };
        for m in msgs {
            match ask(&mut s, m).await {
                Some(a) => answers.push(a),
                None => break,
            }
        }
        answers
    })
}

async fn ask(s: &mut Stream, msg: &Message) -> Option<Message> {
    roost_replication::testing::ask(s, msg, Duration::from_secs(5)).await
}

fn stranger() -> Transport {
    Transport::plain(Vec::new())
}

fn epoch(n: &Node) -> u32 {
    let e = n.status()["replication"]["epoch"].as_u64().expect("epoch");
    u32::try_from(e).expect("u32 epoch")
}

/// The two frames: a fetch far ahead learns the end from the `Diverging` answer,
/// a second one at exactly that end counts as the standby's acknowledgement.
fn forge_ack(transport: &Transport, addr: &str, as_replica: &str, epoch: u32) -> Vec<Message> {
    let mut answers = exchange(transport, addr, &[fetch(as_replica, epoch, 1 << 40)]);
    let end = match answers.first() {
        Some(Message::Diverging { end_lsn, .. }) => *end_lsn,
        _ => return answers,
    };
    answers.extend(exchange(transport, addr, &[fetch(as_replica, epoch, end)]));
    answers
}

/// A primary under `ack = "standby"`, `when_standby_lost = "wait"` whose standby `b` was
/// killed, with `waiting.json` claimed and its answer waiting.
fn primary_waiting(root: &Path) -> (Node, Node) {
    let (mut a, mut b) = two_nodes(root, "ack = \"standby\"\nwhen_standby_lost = \"wait\"");
    a.start(None);
    b.start(Some(&a.addr()));
    drop_in(&a.spool(), "first.json", &batch("first", "s", 1));
    wait_for("first", LIMIT, || a.result("first.json").is_some());
    b.kill();
    drop_in(&a.spool(), "waiting.json", &batch("waiting", "s", 1));
    wait_for("the answer to wait for a standby", LIMIT, || {
        a.status()["replication"]["waiting_for_standby"] == true
            && a.wal().iter().any(|r| r["request_key"] == "waiting")
    });
    (a, b)
}

/// Goal: the forged acknowledgement does not answer a waiting batch: neither a
/// stranger's frames as `b` nor member `c`'s fetches under `b`'s name; `b` itself does
/// (the control). The primary logs the stranger's failed handshake with its address.
#[test]
fn a_forged_acknowledgement_does_not_answer_a_waiting_batch() {
    let t = tempfile::tempdir().expect("tempdir");
    let (a, mut b) = primary_waiting(t.path());
    let e = epoch(&a);
    let got = forge_ack(&stranger(), &a.addr(), "b", e);
    assert!(got.is_empty(), "a stranger was answered: {got:?}");
    let got = forge_ack(&member(t.path(), "c"), &a.addr(), "b", e);
    assert!(
        matches!(got.as_slice(), [Message::Error { .. }]),
        "c fetching as b was answered {got:?}"
    );
    std::thread::sleep(QUIET);
    assert!(
        a.result("waiting.json").is_none(),
        "a forged acknowledgement answered the batch"
    );
    let log = a.child.as_ref().expect("running").log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("failed the TLS handshake") && l.contains("peer=127.0.0.1:")),
        "no handshake failure logged with the stranger's address:\n{log}"
    );
    b.start(Some(&a.addr()));
    wait_for("the real standby's acknowledgement", LIMIT, || {
        a.result("waiting.json").is_some()
    });
    assert_eq!(
        a.result("waiting.json").expect("result")["status"],
        "committed"
    );
}

/// Goal: a fetch with the epoch does not stop the primary, over TLS from a member
/// and over plain TCP from a stranger: it keeps its epoch and takes the next batch.
#[test]
fn a_forged_epoch_does_not_step_the_primary_down() {
    let t = tempfile::tempdir().expect("tempdir");
    let mut tls = Node::new(t.path(), "a", "");
    let mut plain = Node::with_security(t.path(), "b", "");
    tls.start(None);
    plain.start(None);
    let cases = [(&tls, member(t.path(), "b")), (&plain, stranger())];
    for (n, transport) in cases {
        let before = epoch(n);
        let got = exchange(&transport, &n.addr(), &[fetch("b", FORGED_EPOCH, 1)]);
        assert!(
            matches!(got.as_slice(), [Message::Error { .. }]),
            "{}: answered {got:?}",
            n.name
        );
        std::thread::sleep(QUIET);
        let st = n.status();
        assert_eq!(st["replication"]["role"], "primary", "{}: {st}", n.name);
        assert_eq!(epoch(n), before, "{}: the epoch moved", n.name);
        drop_in(&n.spool(), "after.json", &batch("after", "s", 1));
        wait_for("a batch after the forged epoch", LIMIT, || {
            n.result("after.json").is_some()
        });
    }
}

/// Goal: a stranger reads nothing from a TLS primary that has a checkpoint: no records
/// from lsn 1, no base backup.
#[test]
fn a_stranger_reads_no_records_and_no_base_backup() {
    let t = tempfile::tempdir().expect("tempdir");
    let mut a = Node::new(t.path(), "a", "");
    a.start(None);
    drop_in(&a.spool(), "one.json", &batch("one", "s", 1));
    wait_for("one", LIMIT, || a.result("one.json").is_some());
    a.stop();
    a.start(None);
    assert!(a.data.join("CHECKPOINT").exists());
    let e = epoch(&a);
    let snapshot = Message::Snapshot {
        replica: "b".into(),
        current_epoch: e,
    };
    for msg in [fetch("b", e, 1), snapshot.clone()] {
        let got = exchange(&stranger(), &a.addr(), &[msg]);
        assert!(got.is_empty(), "a stranger was answered {got:?}");
    }
    // The control: member b gets records and a backup's first file.
    let got = exchange(&member(t.path(), "b"), &a.addr(), &[fetch("b", e, 1)]);
    assert!(
        matches!(got.as_slice(), [Message::Records { entries, .. }] if !entries.is_empty()),
        "{got:?}"
    );
    let got = exchange(&member(t.path(), "b"), &a.addr(), &[snapshot]);
    assert!(
        matches!(got.as_slice(), [Message::SnapshotFile { .. }]),
        "{got:?}"
    );
}

/// Goal: a standby whose certificate comes from another CA cannot follow: the primary's
/// answer keeps waiting, the standby says it is not connected, the primary logs why.
#[test]
fn a_standby_with_a_certificate_from_another_ca_cannot_follow() {
    let t = tempfile::tempdir().expect("tempdir");
    let other = t.path().join("elsewhere");
    std::fs::create_dir_all(&other).expect("mkdir");
    let extra = "ack = \"standby\"\nwhen_standby_lost = \"wait\"";
    let mut a = Node::new(t.path(), "a", extra);
    let mut b = Node::with_security(t.path(), "b", &format!("{}{extra}", tls_lines(&other, "b")));
    a.start(None);
    b.start(Some(&a.addr()));
    drop_in(&a.spool(), "one.json", &batch("one", "s", 1));
    std::thread::sleep(QUIET);
    assert!(
        a.result("one.json").is_none(),
        "answered through a foreign standby"
    );
    assert_eq!(b.status()["replication"]["follow"]["connected"], false);
    assert_eq!(b.last_lsn(), 0, "the foreign standby holds records");
    let log = a.child.as_ref().expect("running").log_text();
    assert!(log.contains("failed the TLS handshake"), "{log}");
}

/// Runs `roost serve` on `data` with `config`, which must refuse to start with exit 78 (a
/// configuration error); its stderr.
fn refused_start(data: &Path, config: &Path) -> String {
    let out = std::process::Command::new(BIN)
        .arg("--data-dir")
        .arg(data)
        .arg("--config")
        .arg(config)
        .arg("serve")
        .output()
        .expect("run roost serve");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(78), "{err}");
    err
}

/// Goal: a node whose own certificate does not name it refuses to start (exit 78 naming
/// the file), instead of having every request refused by its peers.
#[test]
fn a_certificate_that_does_not_name_this_node_stops_the_start() {
    let t = tempfile::tempdir().expect("tempdir");
    let b_lines = tls_lines(t.path(), "b");
    let config = t.path().join("a.toml");
    let reserved = free_port();
    let text = format!(
        "[replication]\nlisten = \"127.0.0.1:{}\"\nname = \"a\"\n{b_lines}",
        reserved.port()
    );
    std::fs::write(&config, text).expect("config");
    let err = refused_start(&t.path().join("a"), &config);
    assert!(
        err.contains("b.pem") && err.contains("does not name this node"),
        "{err}"
    );
}

/// Goal: plain TCP on an address that is not loopback refuses to start (exit 78, naming the
/// way out); with `insecure = true` it starts, says so in its log and in `status`.
#[test]
fn plain_replication_on_a_public_address_needs_insecure() {
    let t = tempfile::tempdir().expect("tempdir");
    let reserved = free_port();
    let port = reserved.port();
    let config = t.path().join("public.toml");
    let listen = format!("[replication]\nlisten = \"0.0.0.0:{port}\"\nname = \"a\"\n");
    std::fs::write(&config, &listen).expect("config");
    let err = refused_start(&t.path().join("public"), &config);
    assert!(
        err.contains("insecure = true") && err.contains("tls_cert"),
        "{err}"
    );
    let public = format!("{listen}insecure = true\n");
    std::fs::write(&config, public).expect("config");
    let mut started = roost::drill::child::ServeChild::spawn(
        Path::new(BIN),
        &t.path().join("public"),
        &t.path().join("public.log"),
        |c| {
            c.arg("--config").arg(&config);
        },
    )
    .expect("spawn");
    started
        .ready(LIMIT)
        .expect("an insecure node on 0.0.0.0 starts");
    assert!(started
        .log_text()
        .contains("REPLICATION IS NOT AUTHENTICATED"));
    started.kill();
    let mut n = Node::with_security(t.path(), "a", "insecure = true");
    n.start(None);
    let st = n.status();
    assert_eq!(st["replication"]["insecure"], true, "{st}");
    assert_eq!(st["replication"]["security"], "plain", "{st}");
    let log = n.child.as_ref().expect("running").log_text();
    assert!(log.contains("REPLICATION IS NOT AUTHENTICATED"), "{log}");
    let metrics = String::from_utf8_lossy(&n.roost(&["status", "--metrics"]).stdout).into_owned();
    assert!(
        metrics.contains("roost_replication_insecure 1"),
        "{metrics}"
    );
    let mut secure = Node::new(t.path(), "b", "");
    secure.start(None);
    let st = secure.status();
    assert_eq!(st["replication"]["insecure"], false, "{st}");
    assert_eq!(st["replication"]["security"], "mutual_tls", "{st}");
    let metrics =
        String::from_utf8_lossy(&secure.roost(&["status", "--metrics"]).stdout).into_owned();
    assert!(
        metrics.contains("roost_replication_insecure 0"),
        "{metrics}"
    );
}
