//! `roost drill --replicated` as an operator runs it (issue 15's failover drill "for long
//! runs"), small: two nodes on loopback, two failovers (one at a random moment, one at a named
//! crash point), about 60 batches. It must find no violation on a correct build and say what it
//! checked. That its checks can fail is shown by the unit tests of `drill::verdict`, fed
//! a fabricated lost batch, a missing create and diverging logs.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_roost");

/// The number after `label` in the summary (the first occurrence).
fn count(text: &str, label: &str) -> Option<u64> {
    let rest = &text[text.find(label)? + label.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Goal: two failovers under `ack = "standby"` lose no acknowledged batch, the nodes never
/// diverge (shards each round, WAL records and shards after a graceful stop), `verify` holds
/// on both, and the summary's counts add up: every file answered, every answer retried at
/// least once on a new primary.
#[test]
fn replicated_drill_loses_nothing_over_two_failovers() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["drill", "--replicated", "--batches", "60", "--kills", "2"])
        .args(["--seed", "7", "--data-dir"])
        .arg(t.path())
        .output()
        .expect("run roost drill");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drill failed ({}):\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("violations: none"), "{text}");
    assert_eq!(count(&text, "failovers:"), Some(2), "{text}");
    assert_eq!(count(&text, "lost:"), Some(0), "{text}");
    assert_eq!(count(&text, "divergences:"), Some(0), "{text}");
    let files = count(&text, "batches (").expect("file count");
    assert!(files >= 60, "{text}");
    let acked = count(&text, "acknowledged:").expect("acknowledged");
    assert_eq!(acked, files, "every file is answered in the end:\n{text}");
    let retried = count(&text, "retried:").expect("retried");
    assert!(retried >= acked, "{text}");
    let common = count(&text, "WAL records at the").expect("common lsns");
    assert!(common > 0, "the WALs were compared at no lsn:\n{text}");
    assert!(text.contains("promoted (epoch"), "{text}");
    assert!(t.path().join("a").is_dir() && t.path().join("b").is_dir());
}

/// A node for the reproduction below: data directory, config, control socket, maybe a daemon.
struct Node {
    data: std::path::PathBuf,
    config: std::path::PathBuf,
    /// The replication port, held from the kernel's own picks between the daemon's runs.
    port: roost_etcd::testing::ReservedPort,
    child: Option<roost::drill::child::ServeChild>,
    starts: usize,
}

impl Node {
    fn new(root: &std::path::Path, name: &str) -> Node {
        let port = roost_etcd::testing::ReservedPort::new().expect("reserve a port");
        let (data, config) = (root.join(name), root.join(format!("{name}.toml")));
        let tls = roost::ops::tls_certs::member_config(&root.join("certs"), name, &["a", "b"])
            .expect("certificates");
        let text = format!("rescan_interval_ms = 100\n[replication]\nlisten = \"127.0.0.1:{port}\"\nname = \"{name}\"\nack = \"standby\"\nstandby_timeout_ms = 2000\n{tls}", port = port.port());
        std::fs::write(&config, text).expect("config");
        Node {
            data,
            config,
            port,
            child: None,
            starts: 0,
        }
    }

    fn start(&mut self, follow: Option<u16>) {
        self.starts += 1;
        let log = self.data.with_extension(format!("log{}", self.starts));
        std::fs::create_dir_all(&self.data).expect("mkdir");
        let config = self.config.clone();
        let bin = std::path::Path::new(BIN);
        let mut c = roost::drill::child::ServeChild::spawn(bin, &self.data, &log, |c| {
            c.arg("--config").arg(&config);
            if let Some(p) = follow {
                c.arg("--follow").arg(format!("127.0.0.1:{p}"));
            }
        })
        .expect("spawn");
        c.ready(std::time::Duration::from_secs(30))
            .expect("serving");
        self.child = Some(c);
    }

    fn ask(&self, what: &str) -> serde_json::Value {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let sock = self.data.join("roost.sock");
            if let Ok(t) = roost::control::socket::request(&sock, what) {
                return serde_json::from_str(&t).expect("answer");
            }
            assert!(std::time::Instant::now() < until, "no answer to {what}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    fn drop_batch(&self, name: &str, key: &str) {
        let body = format!(
            r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"s","record":{{"k":"{key}"}}}}]}}"#
        );
        let sp = roost::spool::SpoolPaths::new(&self.data.join("spool"));
        roost::spool::deliver(&sp, name, body.as_bytes()).expect("deliver");
    }

    fn wait(&self, what: &str, f: impl Fn(&Node) -> bool) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !f(self) {
            assert!(
                std::time::Instant::now() < until,
                "timed out waiting for {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// Reproduces the epoch collision `roost drill --replicated` found (seed 42, 1,000 batches,
/// 10 failovers, before the armed rounds waited for the standby): a primary restarted while
/// its standby is away takes epoch E+1 at start (`replica/epochs.rs`, `lead_at_start`);
/// it claims a batch and dies; the standby, which never heard of E+1, is promoted and takes
/// E+1 too (`replica/epochs.rs`, `take_new_epoch`: highest known + 1), and claims another
/// batch at the same lsn. Restarted as its standby, the old primary's fetch says "last epoch
/// E+1, log end L+1": the leader's epoch E+1 ends past L, so nothing diverges by epoch and the
/// old primary keeps its own claim: two logs with different records at one lsn, same epoch.
#[test]
fn a_restarted_primary_and_a_promoted_standby_never_share_an_epoch() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = (Node::new(t.path(), "a"), Node::new(t.path(), "b"));
    a.start(None);
    b.start(Some(a.port.port()));
    a.drop_batch("one.json", "one");
    a.wait("one", |n| n.data.join("spool/out/one.json").exists());
    // The standby holds "one" and its `done`: promoted, it has nothing to finish.
    b.wait("the standby to hold one's done record", |n| {
        n.ask("status")["last_lsn"].as_u64() >= Some(2)
    });
    b.child.take(); // SIGKILL: the standby is away
    if let Some(mut c) = a.child.take() {
        assert!(c
            .stop(std::time::Duration::from_secs(30))
            .expect("stop")
            .success());
    }
    a.start(None); // the primary restarts (systemd would): epoch E+1
    let a_epoch = a.ask("status")["replication"]["epoch"].as_u64();
    a.drop_batch("x.json", "x");
    a.wait("x claimed", |n| {
        n.wal_keys().values().any(|k| k.ends_with("\"x\""))
    });
    a.child.take(); // SIGKILL before any standby has x
    b.start(Some(a.port.port()));
    let p = b.ask("promote");
    assert_eq!(p["promoted"], true, "{p}");
    b.drop_batch("y.json", "y");
    b.wait("y claimed", |n| {
        n.wal_keys().values().any(|k| k.ends_with("\"y\""))
    });
    a.start(Some(b.port.port()));
    b.wait("y", |n| n.data.join("spool/out/y.json").exists());
    for n in [&mut b, &mut a] {
        if let Some(mut c) = n.child.take() {
            assert!(c
                .stop(std::time::Duration::from_secs(30))
                .expect("stop")
                .success());
        }
    }
    let (wa, wb) = (a.wal_keys(), b.wal_keys());
    let diverging: Vec<String> = wa
        .iter()
        .filter(|(lsn, ka)| wb.get(lsn).is_some_and(|kb| kb != *ka))
        .map(|(lsn, ka)| format!("lsn {lsn}: a {ka} / b {}", wb[lsn]))
        .collect();
    assert!(
        p["epoch"].as_u64() > a_epoch && diverging.is_empty(),
        "the promoted standby took epoch {} (the restarted primary had taken {a_epoch:?}); the logs differ at {diverging:?}; a {wa:?}; b {wb:?}",
        p["epoch"]
    );
}

impl Node {
    /// Each WAL record's (epoch, type, request key) by lsn, from `roost wal dump --json`.
    fn wal_keys(&self) -> std::collections::BTreeMap<u64, String> {
        let out = Command::new(BIN)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config)
            .args(["wal", "dump", "--json"])
            .output()
            .expect("wal dump");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|v| {
                let lsn = v["lsn"].as_u64().unwrap_or(0);
                (
                    lsn,
                    format!("epoch {} {} {}", v["epoch"], v["type"], v["request_key"]),
                )
            })
            .collect()
    }
}
