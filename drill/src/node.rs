//! One node of the replicated drill: a data directory `<root>/NAME`, its configuration file
//! (the drill's small segments and frequent checkpoints, `[replication]` with a loopback port
//! reserved for the node's life so that a restart finds it free
//! (`roost_etcd::testing::ReservedPort`), `ack = "standby"`, mutual TLS with certificates
//! made in `<root>/certs`), its control socket, and at most one running `roost serve`
//! (a [`ServeChild`], killed when dropped). Everything it asks a running daemon goes through
//! the control socket, every wait is bounded, and nothing it reads from disk or from the
//! daemon is trusted to parse.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost_etcd::testing::ReservedPort;
use serde_json::Value;

use super::child::ServeChild;
use super::setup::{read_result, read_shards, DRILL_CONFIG, READY_LIMIT};
use crate::batch::BatchResult;
use crate::pipeline::crash::CrashTarget;
use crate::spool::SpoolPaths;

/// How long the control socket may take to answer a promote.
const PROMOTE_LIMIT: Duration = Duration::from_secs(30);

pub(super) struct Node {
    pub name: &'static str,
    pub data: PathBuf,
    pub config: PathBuf,
    socket: PathBuf,
    root: PathBuf,
    /// The replication port, held from the kernel's own picks between the daemon's runs.
    port: ReservedPort,
    pub child: Option<ServeChild>,
    /// Process starts so far (names the logs `<root>/NAME-serve-N.log`).
    pub starts: usize,
}

impl Node {
    /// Creates `<root>/NAME` and its configuration `<root>/NAME.toml`.
    pub fn new(root: &Path, name: &'static str) -> anyhow::Result<Node> {
        Node::member(root, name, &["a", "b"])
    }

    /// A node of the cluster whose members are `members` (`<root>/NAME`, `<root>/NAME.toml`).
    pub fn member(root: &Path, name: &'static str, members: &[&str]) -> anyhow::Result<Node> {
        let data = root.join(name);
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        let port = ReservedPort::new().context("reserving a loopback port")?;
        let socket = data.join("roost.sock");
        let config = root.join(format!("{name}.toml"));
        let tls = crate::ops::tls_certs::member_config(&root.join("certs"), name, members)?;
        let text = format!(
            "{DRILL_CONFIG}rescan_interval_ms = 100\ncontrol_socket = {socket:?}\n\n[replication]\nlisten = \"127.0.0.1:{port}\"\nname = \"{name}\"\nack = \"standby\"\nstandby_timeout_ms = 2000\n{tls}",
            socket = socket.display().to_string(),
            port = port.port()
        );
        std::fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
        Ok(Node {
            name,
            data,
            config,
            socket,
            root: root.to_path_buf(),
            port,
            child: None,
            starts: 0,
        })
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port.port())
    }

    /// Appends `text` to the configuration (before the next start).
    pub fn append_config(&self, text: &str) -> anyhow::Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.config)
            .with_context(|| format!("opening {}", self.config.display()))?;
        f.write_all(text.as_bytes())
            .with_context(|| format!("writing {}", self.config.display()))
    }

    /// SIGSTOP or SIGCONT to the running daemon (nothing if not running).
    pub fn signal(&self, sig: rustix::process::Signal) {
        if let Some(c) = &self.child {
            if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
    }

    pub fn spool(&self) -> SpoolPaths {
        SpoolPaths::new(&self.data.join("spool"))
    }

    pub fn log_path(&self, n: usize) -> PathBuf {
        self.root.join(format!("{}-serve-{n}.log", self.name))
    }

    /// Spawns `roost serve` (a standby of `follow` if given, dying at `crash` if given); does
    /// not wait for it.
    pub fn spawn(
        &mut self,
        bin: &Path,
        follow: Option<&str>,
        crash: Option<CrashTarget>,
    ) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("{}: already running", self.name);
        }
        let log = self.log_path(self.starts);
        self.starts += 1;
        let config = self.config.clone();
        let child = ServeChild::spawn(bin, &self.data, &log, |cmd| {
            cmd.arg("--config").arg(&config);
            if let Some(f) = follow {
                cmd.arg("--follow").arg(f);
            }
            if let Some(t) = crash {
                cmd.env("ROOST_CRASH_AT", t.to_string());
            }
        })?;
        self.child = Some(child);
        Ok(())
    }

    /// Its process, for a failure's report: running, not started, or how it exited with the
    /// last lines of its log (a node that died by itself leaves the files dropped into its
    /// spool unanswered, and its log says why).
    pub fn state(&mut self) -> String {
        let name = self.name;
        let Some(c) = self.child.as_mut() else {
            return format!("{name}: not running");
        };
        match c.exit_report() {
            Ok(None) => format!("{name}: running"),
            Ok(Some(how)) => format!("{name}: {how}"),
            Err(e) => format!("{name}: cannot tell whether it runs ({e})"),
        }
    }

    /// Waits for the running daemon to serve; its spawn-to-serving time.
    pub fn ready(&mut self) -> anyhow::Result<Duration> {
        match self.child.as_mut() {
            Some(c) => c.ready(READY_LIMIT).with_context(|| self.name.to_owned()),
            None => bail!("{}: not running", self.name),
        }
    }

    /// SIGKILL (nothing if not running).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    /// SIGTERM, bounded; an error unless the daemon exits 0.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut c) = self.child.take() {
            let st = c.stop(READY_LIMIT)?;
            if !st.success() {
                bail!(
                    "{}: stopped with {st}; log {}",
                    self.name,
                    c.log_path().display()
                );
            }
        }
        Ok(())
    }

    /// Waits up to `limit` for the running daemon to exit (after a SIGTERM the caller sent);
    /// its exit status, the process then forgotten, or `None` if it still runs (kept: the
    /// caller decides). `None` also when no daemon runs.
    pub fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let until = Instant::now() + limit;
        let Some(c) = self.child.as_mut() else {
            return Ok(None);
        };
        loop {
            if let Some(st) = c.exited().context("waiting for roost serve")? {
                self.child = None;
                return Ok(Some(st));
            }
            if Instant::now() > until {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// True if the daemon was started and has exited since.
    pub fn died(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.exited(), Ok(Some(_))))
    }

    /// `status` over the control socket; `None` while it does not answer.
    pub fn status(&self) -> Option<Value> {
        let text = crate::control::socket::request(&self.socket, "status").ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn last_lsn(&self) -> Option<u64> {
        self.status()?["last_lsn"].as_u64()
    }

    /// The last lsn durable here (what a standby can be sent).
    pub fn durable_lsn(&self) -> Option<u64> {
        self.status()?["replication"]["durable_lsn"].as_u64()
    }

    /// The last lsn once this primary is quiet: no batch in flight and none waiting for its
    /// durability round (a batch's `done` record is appended by that round, after its
    /// answer) and its whole log durable (the idle tail sync sends a standby that record
    /// too). `None` while not, or when the daemon does not answer.
    pub fn quiet_end(&self) -> Option<u64> {
        let st = self.status()?;
        let last = st["last_lsn"].as_u64()?;
        let quiet = st["in_flight"] == 0
            && st["tail_rounds"]["waiting"] == 0
            && st["replication"]["durable_lsn"].as_u64() == Some(last);
        quiet.then_some(last)
    }

    /// `promote` over the control socket, asked again until it is promoted (the socket may
    /// be bound a moment after "serving"); its epoch.
    pub fn promote(&self) -> anyhow::Result<u64> {
        let until = Instant::now() + PROMOTE_LIMIT;
        let mut last = String::new();
        while Instant::now() < until {
            match crate::control::socket::request(&self.socket, "promote") {
                Ok(text) => {
                    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    if v["promoted"] == true {
                        return Ok(v["epoch"].as_u64().unwrap_or(0));
                    }
                    last = text;
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "{}: not promoted within {PROMOTE_LIMIT:?}: {last}",
            self.name
        )
    }

    /// The result the daemon published for `name`, if any.
    pub fn result(&self, name: &str) -> Option<BatchResult> {
        read_result(&self.spool(), name)
    }

    /// Every record of the drill's shards, by id (read-only; an error while a shard is being
    /// rewritten under the reader, which the caller retries).
    pub fn records(&self) -> anyhow::Result<super::verdict::Records> {
        Ok(read_shards(&self.data)?.0)
    }

    /// Every WAL record, as `roost wal dump --json` prints it, by lsn (the daemon stopped).
    pub fn wal(&self, bin: &Path) -> anyhow::Result<BTreeMap<u64, Value>> {
        let out = std::process::Command::new(bin)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--config")
            .arg(&self.config)
            .args(["wal", "dump", "--json"])
            .output()
            .context("running roost wal dump")?;
        if !out.status.success() {
            bail!(
                "{}: roost wal dump exited {}: {}",
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut records = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("{}: a wal dump line: {line}", self.name))?;
            let lsn = v["lsn"].as_u64().context("a wal dump line without lsn")?;
            records.insert(lsn, v);
        }
        Ok(records)
    }

    /// Records cut at start-ups as a standby: the sum of `wal_end - from_lsn` over the
    /// "cutting records" lines of every log of this node.
    pub fn cut_records(&self) -> u64 {
        (0..self.starts)
            .filter_map(|n| std::fs::read_to_string(self.log_path(n)).ok())
            .flat_map(|t| {
                t.lines()
                    .filter(|l| l.contains("cutting records"))
                    .map(|l| field(l, "wal_end=").saturating_sub(field(l, "from_lsn=")))
                    .collect::<Vec<_>>()
            })
            .sum()
    }
}

/// The number after `key` in a log line (0 if absent).
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
        .unwrap_or(0)
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Goal: a failure's report tells a node that died by itself from one that runs, with
    /// the end of its log (the drill once reported only "unanswered after the limit", which
    /// left open whether a node was down). Method: a node whose "daemon" is a script that
    /// logs a line and exits 3.
    #[test]
    fn a_node_that_died_by_itself_says_so_with_the_end_of_its_log() {
        let t = tempfile::tempdir().expect("tempdir");
        let mut n = Node::new(t.path(), "a").expect("node");
        assert_eq!(n.state(), "a: not running");
        let script = t.path().join("dies.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\necho 'bind 127.0.0.1: address in use' >&2\nexit 3\n",
        )
        .expect("script");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        n.spawn(&script, None, None).expect("spawn");
        let until = Instant::now() + Duration::from_secs(10);
        while !n.state().contains("exited") && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = n.state();
        assert!(s.contains("a: exited ("), "{s}");
        assert!(s.contains("exit status: 3"), "{s}");
        assert!(s.contains("address in use"), "{s}");
    }
}
