//! One replicating `roost serve` node for the failover power-cut test: its data directory and
//! spool (on loop-mounted images or on the plain temporary directory), its config, its logs,
//! and the commands the checks need (`status`, `promote`, `wal dump`, `scan`, `verify`).
//! Every wait is bounded; nothing read from a child or from disk is unwrapped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use roost::drill::child::ServeChild;
use roost_storage::RealStorage;
use serde_json::Value;

/// The bound on every single wait (a start, a stop, a catch-up, a promote).
pub const LIMIT: Duration = Duration::from_secs(30);

/// Small segments and frequent checkpoints (as in `powercut.rs`), so cuts also land in
/// checkpoints and WAL retirement, which must never pass the high watermark.
const CONFIG: &str = r#"
wal_segment_bytes = 4194304
shard_segment_bytes = 65536
rescan_interval_ms = 100
batch_ops_max = 8
checkpoint_wal_bytes = 262144
checkpoint_interval_ms = 500
shard_compact_dead_fraction = 0.1
[shards.a]
[shards.b]
"#;

pub struct Node {
    pub name: &'static str,
    pub data: PathBuf,
    pub spool: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    /// The replication port, held from the kernel's own picks between the daemon's runs.
    port: roost_etcd::testing::ReservedPort,
    child: Option<ServeChild>,
    last_log: Option<PathBuf>,
    starts: usize,
}

impl Node {
    /// A node whose config, control socket and logs live in `logs` (the host's file system),
    /// with `[replication] ack = "standby"` (the default `when_standby_lost = "wait"`) over
    /// mutual TLS (certificates in `logs/certs`).
    pub fn new(logs: &Path, name: &'static str, data: PathBuf, spool: PathBuf) -> Node {
        let port = roost_etcd::testing::ReservedPort::new().expect("reserve a port");
        let config = logs.join(format!("{name}.toml"));
        let sock = logs.join(format!("{name}.sock"));
        let tls = roost::ops::tls_certs::member_config(&logs.join("certs"), name, &["a", "b"])
            .expect("certificates");
        let text = format!(
            "control_socket = {:?}\n{CONFIG}[replication]\nlisten = \"127.0.0.1:{port}\"\n\
             name = \"{name}\"\nstandby_timeout_ms = 2000\nack = \"standby\"\n{tls}",
            sock.display().to_string(),
            port = port.port()
        );
        std::fs::write(&config, text).expect("writing a config");
        Node {
            name,
            data,
            spool,
            config,
            logs: logs.to_path_buf(),
            port,
            child: None,
            last_log: None,
            starts: 0,
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port.port())
    }

    /// Starts `roost serve` (following `follow` if given) and waits for "serving".
    pub fn start(&mut self, follow: Option<&str>) -> Result<(), String> {
        assert!(self.child.is_none(), "{} already running", self.name);
        self.starts += 1;
        let log = self.logs.join(format!("{}-{}.log", self.name, self.starts));
        let (config, spool) = (self.config.clone(), self.spool.clone());
        let follow = follow.map(str::to_owned);
        let mut c = ServeChild::spawn(Path::new(crate::common::BIN), &self.data, &log, |c| {
            c.arg("--config")
                .arg(&config)
                .arg("--spool-dir")
                .arg(&spool);
            if let Some(f) = follow {
                c.arg("--follow").arg(f);
            }
        })
        .map_err(|e| format!("{}: {e:#}", self.name))?;
        self.last_log = Some(log);
        c.ready(LIMIT)
            .map_err(|e| format!("{}: {e:#}", self.name))?;
        self.child = Some(c);
        Ok(())
    }

    /// The log of the running daemon, or of the last one.
    pub fn log_text(&self) -> String {
        self.last_log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// `kill -SIG` to the running daemon.
    pub fn signal(&self, sig: &str) {
        let c = self.child.as_ref().expect("a running daemon to signal");
        crate::common::signal(c.id(), sig);
    }

    /// SIGKILL (also ends a stopped process) and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    /// SIGTERM and the exit status (bounded).
    pub fn stop(&mut self) -> Result<ExitStatus, String> {
        match self.child.take() {
            Some(mut c) => c.stop(LIMIT).map_err(|e| format!("{}: {e:#}", self.name)),
            None => Err(format!("{} is not running", self.name)),
        }
    }

    /// Whether the daemon has exited by itself (its status), without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.exited().ok().flatten())
    }

    pub fn roost(&self, args: &[&str]) -> Output {
        Command::new(crate::common::BIN)
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--spool-dir")
            .arg(&self.spool)
            .output()
            .expect("run roost")
    }

    pub fn status(&self) -> Value {
        let out = self.roost(&["status", "--json"]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    pub fn last_lsn(&self) -> u64 {
        self.status()["last_lsn"].as_u64().unwrap_or(0)
    }

    /// The last lsn durable here (what a standby can be sent).
    pub fn durable_lsn(&self) -> u64 {
        self.status()["replication"]["durable_lsn"]
            .as_u64()
            .unwrap_or(0)
    }

    /// `roost promote`, retried while the control socket is not bound yet (bounded).
    pub fn promote(&self) -> Result<Value, String> {
        let until = Instant::now() + LIMIT;
        loop {
            let out = self.roost(&["promote"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if out.status.success() {
                return serde_json::from_str(&text).map_err(|e| format!("promote: {e}: {text}"));
            }
            if !text.is_empty() || Instant::now() > until {
                return Err(format!(
                    "promote {} exited {:?}: {text}{}",
                    self.name,
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every WAL record `roost wal dump --json` prints, by lsn.
    pub fn wal(&self) -> Result<BTreeMap<u64, Value>, String> {
        let out = self.roost(&["wal", "dump", "--json"]);
        if !out.status.success() {
            return Err(format!(
                "wal dump {} exited {:?}: {}",
                self.name,
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let mut m = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let r: Value =
                serde_json::from_str(line).map_err(|e| format!("wal dump line {line}: {e}"))?;
            let lsn = r["lsn"].as_u64().ok_or_else(|| format!("no lsn: {line}"))?;
            m.insert(lsn, r);
        }
        Ok(m)
    }

    /// `roost scan SHARD`'s output.
    pub fn scan(&self, shard: &str) -> Result<String, String> {
        let out = self.roost(&["scan", shard]);
        if !out.status.success() {
            return Err(format!(
                "scan {shard} on {} exited {:?}",
                self.name,
                out.status.code()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `roost verify`'s invariants on this node's files (the daemon stopped).
    pub fn verify(&self) -> Vec<String> {
        roost::ops::verify::verify(RealStorage::shared(), &self.data)
            .violations
            .into_iter()
            .map(|v| format!("verify {}: {v}", self.name))
            .collect()
    }

    /// The result file `out/NAME`, if there is one and it is JSON.
    pub fn result(&self, name: &str) -> Option<Value> {
        let b = std::fs::read(self.spool.join("out").join(name)).ok()?;
        serde_json::from_slice(&b).ok()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}
