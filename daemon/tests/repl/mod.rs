//! The nodes of the replication tests (`replication.rs`, `replication_security.rs`): one
//! `roost serve` process each on loopback, its configuration, and what the tests read of
//! it; an in-test TCP proxy for partitions. Every wait is bounded.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{wait_for, BIN};

pub mod cluster;
pub mod netns;
use roost::drill::child::ServeChild;
use roost_storage::RealStorage;
use serde_json::Value;

pub const LIMIT: Duration = Duration::from_secs(30);

/// One node: a data directory, a config file, a log, maybe a running daemon.
pub struct Node {
    pub name: &'static str,
    pub data: PathBuf,
    pub config: PathBuf,
    /// The replication port, held from the kernel's own picks between the daemon's runs.
    pub port: roost_etcd::testing::ReservedPort,
    pub child: Option<ServeChild>,
    starts: usize,
}

/// A loopback port kept from the kernel's own picks until the reservation is dropped
/// (`roost_etcd::testing::ReservedPort`): hold it while a daemon binds the port.
pub fn free_port() -> roost_etcd::testing::ReservedPort {
    roost_etcd::testing::ReservedPort::new().expect("reserve a port")
}

impl Node {
    /// A node of the cluster {a, b, c} over mutual TLS, with certificates `roost certs`
    /// made in `<root>/certs` (`tls_lines`).
    pub fn new(root: &Path, name: &'static str, extra: &str) -> Node {
        let tls = tls_lines(root, name);
        Node::with_security(root, name, &format!("{tls}{extra}"))
    }

    /// A node with only `extra` as its security settings (plain TCP on loopback when it
    /// sets none).
    pub fn with_security(root: &Path, name: &'static str, extra: &str) -> Node {
        let data = root.join(name);
        std::fs::create_dir_all(&data).expect("mkdir");
        let port = free_port();
        let config = root.join(format!("{name}.toml"));
        let text = format!(
            "rescan_interval_ms = 100\ncheckpoint_wal_bytes = 65536\n[replication]\nlisten = \"127.0.0.1:{}\"\nname = \"{name}\"\nstandby_timeout_ms = 2000\n{extra}\n",
            port.port()
        );
        std::fs::write(&config, text).expect("config");
        Node {
            name,
            data,
            config,
            port,
            child: None,
            starts: 0,
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port.port())
    }

    pub fn spool(&self) -> PathBuf {
        self.data.join("spool")
    }

    /// Starts `roost serve` (following `follow` if given) and waits for "serving".
    pub fn start(&mut self, follow: Option<&str>) {
        self.spawn(follow);
        let c = self.child.as_mut().expect("spawned");
        c.ready(LIMIT)
            .unwrap_or_else(|e| panic!("{}: {e:#}", self.name));
    }

    /// Starts `roost serve` as [`Node::start`] does, without waiting for "serving" (to
    /// catch it while it joins, reconciles or recovers).
    pub fn spawn(&mut self, follow: Option<&str>) {
        assert!(self.child.is_none(), "{} already running", self.name);
        self.starts += 1;
        let log = self.data.with_extension(format!("log{}", self.starts));
        let (config, follow) = (self.config.clone(), follow.map(str::to_owned));
        let c = ServeChild::spawn(Path::new(BIN), &self.data, &log, |c| {
            c.arg("--config").arg(&config);
            if let Some(f) = follow {
                c.arg("--follow").arg(f);
            }
        })
        .expect("spawn");
        self.child = Some(c);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let st = c.stop(LIMIT).unwrap_or_else(|e| {
                let log = c.log_text();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                panic!("{}: {e:#}; its log ends:\n{tail}", self.name)
            });
            assert!(st.success(), "{} stopped with {st}", self.name);
        }
    }

    /// `kill -SIG` to the running daemon.
    pub fn signal(&self, sig: &str) {
        let c = self.child.as_ref().expect("a running daemon to signal");
        crate::common::signal(c.id(), sig);
    }

    pub fn roost(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .expect("run roost")
    }

    pub fn status(&self) -> Value {
        let out = self.roost(&["status", "--json"]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    pub fn promote(&self) -> Value {
        // The control socket may be bound a moment after "serving" is logged.
        let mut out = self.roost(&["promote"]);
        let until = Instant::now() + LIMIT;
        while out.stdout.is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
            out = self.roost(&["promote"]);
        }
        assert!(
            out.status.success(),
            "promote {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stdout)
        );
        serde_json::from_slice(&out.stdout).expect("promote answer")
    }

    pub fn last_lsn(&self) -> u64 {
        self.status()["last_lsn"].as_u64().unwrap_or(0)
    }

    pub fn result(&self, name: &str) -> Option<Value> {
        let b = std::fs::read(self.spool().join("out").join(name)).ok()?;
        serde_json::from_slice(&b).ok()
    }

    /// Every WAL record as `roost wal dump --json` prints it (lsn, epoch, type, content).
    pub fn wal(&self) -> Vec<Value> {
        let out = self.roost(&["wal", "dump", "--json"]);
        assert!(out.status.success(), "wal dump {}", self.name);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("dump line"))
            .collect()
    }

    pub fn scan(&self, shard: &str) -> String {
        let out = self.roost(&["scan", shard]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `roost verify`'s invariants on this node's files (the daemon stopped).
    pub fn verify(&self) {
        let r = roost::ops::verify::verify(RealStorage::shared(), &self.data);
        assert!(r.violations.is_empty(), "{}: {:?}", self.name, r.violations);
    }
}

impl Drop for Node {
    /// Kills the daemon; when the test is failing, prints the tail of each of this node's
    /// logs first (the temporary directory goes with the test).
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() {
            return;
        }
        for n in 1..=self.starts {
            let path = self.data.with_extension(format!("log{n}"));
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            eprintln!(
                "--- {} start {n} ({}), last 40 lines:\n{tail}",
                self.name,
                path.display()
            );
        }
    }
}

pub fn batch(key: &str, shard: &str, n: usize) -> Vec<u8> {
    let ops: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"op":"create","shard":"{shard}","record":{{"k":"{key}","i":{i}}}}}"#))
        .collect();
    format!(r#"{{"request_key":"{key}","ops":[{}]}}"#, ops.join(",")).into_bytes()
}

/// Waits until `standby` holds all `primary` has written and will write without new input:
/// the primary is quiet (`quiet_end`, the same end on two reads in a row) and the standby
/// has reached that end. Two nodes stopped after it hold equal logs, whichever stops first.
pub fn caught_up(primary: &Node, standby: &Node) {
    let mut last = None;
    wait_for(
        &format!("{} to hold all of {}'s log", standby.name, primary.name),
        LIMIT,
        || {
            let end = quiet_end(primary);
            let steady = end.is_some() && end == last;
            last = end;
            steady && end.is_some_and(|end| standby.last_lsn() >= end)
        },
    );
}

/// The primary's last lsn once it is quiet: no batch in flight and none answered and
/// waiting for its durability round (a batch's `done` record is appended by that round,
/// after its answer is published: `pipeline/settle.rs`) and its whole log
/// durable (the idle tail sync has made that `done` record durable, so a standby is sent
/// it). `None` while either is not so. A caller wants it twice in a row: status reads its
/// fields one after another, and a `done` appended between them could pass for quiet once.
/// An empty log (0) is quiet too: a failover round whose primary was killed before any
/// batch reached the standby leaves the new primary with nothing (under load, the
/// replication test's drill waited 30 s for a "last lsn > 0" that could never come).
pub fn quiet_end(primary: &Node) -> Option<u64> {
    let st = primary.status();
    let last = st["last_lsn"].as_u64()?;
    let durable = st["replication"]["durable_lsn"].as_u64();
    let quiet = st["in_flight"] == 0
        && st["tail_rounds"]["waiting"] == 0
        && (durable == Some(last) || (last == 0 && durable.is_some()));
    quiet.then_some(last)
}

/// The records both logs hold must be equal (lsn, epoch, type, content), neither may hold a
/// record the other has a different one for, and both end at the same lsn (a standby's log
/// may start later, at the checkpoint of the snapshot it was seeded from). Called on stopped
/// nodes after `caught_up`.
pub fn same_logs(a: &Node, b: &Node) {
    let (wa, wb) = (a.wal(), b.wal());
    let n = wa.len().min(wb.len());
    assert!(n > 0, "empty logs");
    let by_lsn = |w: &[Value]| -> BTreeMap<u64, Value> {
        w.iter()
            .map(|r| (r["lsn"].as_u64().expect("lsn"), r.clone()))
            .collect()
    };
    let (ma, mb) = (by_lsn(&wa), by_lsn(&wb));
    let end = |m: &BTreeMap<u64, Value>| m.keys().next_back().copied();
    assert_eq!(
        end(&ma),
        end(&mb),
        "the logs of {} and {} end at different lsns",
        a.name,
        b.name
    );
    for (lsn, ra) in &ma {
        if let Some(rb) = mb.get(lsn) {
            assert_eq!(
                ra, rb,
                "lsn {lsn} differs between {} and {}",
                a.name, b.name
            );
        }
    }
}

/// The members of every test cluster.
pub const MEMBERS: [&str; 3] = ["a", "b", "c"];

/// Runs `roost certs ARGS` and asserts it succeeded.
pub fn certs(args: &[&str]) {
    let out = Command::new(BIN)
        .arg("certs")
        .args(args)
        .output()
        .expect("run roost certs");
    assert!(
        out.status.success(),
        "roost certs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `[replication]` lines for member `name` of the cluster whose CA `roost certs init`
/// makes in `<root>/certs` (once), with `name`'s certificate from `roost certs issue`.
pub fn tls_lines(root: &Path, name: &str) -> String {
    let dir = root.join("certs");
    let d = dir.to_str().expect("utf-8 path");
    if !dir.join("ca.pem").exists() {
        certs(&["init", "--dir", d]);
    }
    if !dir.join(format!("{name}.pem")).exists() {
        certs(&["issue", name, "--dir", d]);
    }
    format!(
        "tls_cert = \"{d}/{name}.pem\"\ntls_key = \"{d}/{name}.key\"\ntls_ca = \"{d}/ca.pem\"\nmembers = {MEMBERS:?}\n"
    )
}

pub fn two_nodes(root: &Path, extra: &str) -> (Node, Node) {
    (Node::new(root, "a", extra), Node::new(root, "b", extra))
}

/// The in-test TCP proxy for partitions is the cluster drill's (`drill/proxy.rs`):
/// `cut` closes every connection and refuses new ones until `heal`.
#[allow(unused_imports)] // not every test binary that includes this module cuts connections
pub use roost::drill::proxy::Proxy;
