//! Starting, probing, signalling and stopping etcd processes. A member listens on two
//! loopback ports picked by binding port 0 (then released: etcd cannot report a port it
//! chose), so another process may take one in between; a start whose etcd logs "address
//! already in use" is retried with new ports, at most `PORT_TRIES` times. A start returns
//! once every member answers a read through this crate's client (a read needs a leader),
//! within `HEALTH_WAIT`; an etcd that exits first fails the start with its log's tail.

use std::fs::File;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

use super::certs::TlsFiles;
use crate::client::{Etcd, EtcdOptions};

/// Names the etcd binary to run instead of `/usr/bin/etcd`.
pub const ETCD_BIN_ENV: &str = "ROOST_ETCD_BIN";

/// The longest a start waits for its members to answer.
pub const HEALTH_WAIT: Duration = Duration::from_secs(20);

const DEFAULT_BIN: &str = "/usr/bin/etcd";
const PORT_TRIES: usize = 3;
const PROBE_PAUSE: Duration = Duration::from_millis(50);
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// How long `stop` waits after SIGTERM before SIGKILL.
const STOP_WAIT: Duration = Duration::from_secs(10);
const LOG_TAIL_BYTES: u64 = 2048;
const MEMBERS_MAX: usize = 7;

/// One etcd member, killed and reaped when dropped.
#[derive(Debug)]
pub struct EtcdServer {
    /// `None` once stopped or killed.
    child: Option<Child>,
    pid: u32,
    client_url: String,
    log: PathBuf,
    tls: Option<TlsFiles>,
    /// How it was started (binary and arguments), for `restart`.
    launch: (PathBuf, Vec<std::ffi::OsString>),
}

/// Several members of one cluster on loopback.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<EtcdServer>,
}

/// What one member is started with.
struct Spec<'a> {
    dir: &'a Path,
    name: String,
    client_port: u16,
    peer_port: u16,
    initial_cluster: &'a str,
    token: &'a str,
    tls: Option<&'a TlsFiles>,
}

impl EtcdServer {
    /// A one-member etcd with its data and log under `dir`, plain HTTP.
    pub fn start(dir: &Path) -> io::Result<EtcdServer> {
        Ok(start_members(dir, 1, None)?.remove(0))
    }

    /// A one-member etcd that serves https and refuses a client without a certificate from
    /// `tls.ca` (`--client-cert-auth`).
    pub fn start_tls(dir: &Path, tls: &TlsFiles) -> io::Result<EtcdServer> {
        Ok(start_members(dir, 1, Some(tls))?.remove(0))
    }

    /// `http://127.0.0.1:PORT` (https with TLS).
    pub fn client_url(&self) -> &str {
        &self.client_url
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Where etcd's output goes.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Options for a client of this member alone (with the test client certificate under
    /// TLS).
    pub fn options(&self, request_timeout: Duration) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![self.client_url.clone()],
            tls: self.tls.as_ref().map(TlsFiles::client),
            request_timeout,
        }
    }

    /// A client of this member alone.
    pub fn client(&self, request_timeout: Duration) -> io::Result<Etcd> {
        Etcd::new(self.options(request_timeout)).map_err(io::Error::other)
    }

    /// SIGTERM, then (after `STOP_WAIT`) SIGKILL; reaped either way.
    pub fn stop(&mut self) -> io::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        signal(&child, Signal::TERM)?;
        // A paused etcd acts on SIGTERM only once continued.
        signal(&child, Signal::CONT)?;
        let deadline = Instant::now() + STOP_WAIT;
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill()?;
        child.wait().map(drop)
    }

    /// SIGKILL (a crash), reaped.
    pub fn kill(&mut self) -> io::Result<()> {
        match self.child.take() {
            Some(mut child) => {
                child.kill()?;
                child.wait().map(drop)
            }
            None => Ok(()),
        }
    }

    /// Starts a stopped or killed member again with its data directory and flags (etcd
    /// rejoins its cluster from the data directory; the initial-cluster flags are ignored),
    /// its output appended to its log. Does not wait for it to answer.
    pub fn restart(&mut self) -> io::Result<()> {
        if self.child.is_some() {
            return Err(io::Error::other(format!(
                "etcd {} still runs",
                self.client_url
            )));
        }
        let out = File::options().append(true).create(true).open(&self.log)?;
        let child = launch(&self.launch.0, &self.launch.1, out)?;
        self.pid = child.id();
        self.child = Some(child);
        Ok(())
    }

    /// SIGSTOP: the process holds its sockets (the kernel still accepts connections) but
    /// answers nothing, as a hung or swapped-out member would.
    pub fn pause(&self) -> io::Result<()> {
        signal(self.running()?, Signal::STOP)
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) -> io::Result<()> {
        signal(self.running()?, Signal::CONT)
    }

    fn running(&self) -> io::Result<&Child> {
        self.child
            .as_ref()
            .ok_or_else(|| io::Error::other(format!("etcd {} was stopped", self.client_url)))
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

impl EtcdCluster {
    /// `members` (1 to 7) members on loopback, data and logs under `dir`, all answering.
    pub fn start(dir: &Path, members: usize) -> io::Result<EtcdCluster> {
        if members == 0 || members > MEMBERS_MAX {
            let msg = format!("a test cluster has 1 to {MEMBERS_MAX} members, not {members}");
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        let members = start_members(dir, members, None)?;
        Ok(EtcdCluster { members })
    }

    pub fn client_urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Member `i`, to kill, stop or pause; panics if there is no member `i`.
    pub fn member(&mut self, i: usize) -> &mut EtcdServer {
        &mut self.members[i]
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Options for a client of every member.
    pub fn options(&self, request_timeout: Duration) -> EtcdOptions {
        EtcdOptions {
            endpoints: self.client_urls(),
            tls: None,
            request_timeout,
        }
    }
}

fn signal(child: &Child, sig: Signal) -> io::Result<()> {
    kill_process(Pid::from_child(child), sig).map_err(io::Error::from)
}

/// `n` members of one new cluster, started and answering; retried with new ports when a
/// port was taken between picking and etcd's bind.
fn start_members(dir: &Path, n: usize, tls: Option<&TlsFiles>) -> io::Result<Vec<EtcdServer>> {
    let bin = etcd_bin()?;
    let mut last = None;
    for _ in 0..PORT_TRIES {
        let ports = free_ports(2 * n)?;
        let members = spawn_members(&bin, dir, &ports, tls)?;
        match wait_healthy(members) {
            Ok(members) => return Ok(members),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("etcd did not start")))
}

/// The binary to run; a clear error if it is not there.
fn etcd_bin() -> io::Result<PathBuf> {
    let bin = std::env::var_os(ETCD_BIN_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_BIN));
    check_bin(bin)
}

fn check_bin(bin: PathBuf) -> io::Result<PathBuf> {
    if bin.is_file() {
        return Ok(bin);
    }
    let msg = format!(
        "etcd not found at {}: apt-get install etcd-server (or set {ETCD_BIN_ENV})",
        bin.display()
    );
    Err(io::Error::new(io::ErrorKind::NotFound, msg))
}

/// `n` distinct loopback ports that were free a moment ago (all bound at once, so distinct).
fn free_ports(n: usize) -> io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

fn spawn_members(
    bin: &Path,
    dir: &Path,
    ports: &[u16],
    tls: Option<&TlsFiles>,
) -> io::Result<Vec<EtcdServer>> {
    let n = ports.len() / 2;
    let name = |i: usize| format!("m{i}-{}", ports[2 * i]);
    let initial_cluster = (0..n)
        .map(|i| format!("{}=http://127.0.0.1:{}", name(i), ports[2 * i + 1]))
        .collect::<Vec<_>>()
        .join(",");
    let token = format!("roost-test-{}-{}", std::process::id(), ports[0]);
    (0..n)
        .map(|i| {
            let spec = Spec {
                dir,
                name: name(i),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                initial_cluster: &initial_cluster,
                token: &token,
                tls,
            };
            spawn(bin, &spec)
        })
        .collect()
}

/// Starts one member (does not wait for it).
fn spawn(bin: &Path, s: &Spec<'_>) -> io::Result<EtcdServer> {
    let scheme = if s.tls.is_some() { "https" } else { "http" };
    let client_url = format!("{scheme}://127.0.0.1:{}", s.client_port);
    let peer_url = format!("http://127.0.0.1:{}", s.peer_port);
    let data = s.dir.join(format!("{}.etcd", s.name));
    let log = s.dir.join(format!("{}.log", s.name));
    std::fs::create_dir_all(s.dir)?;
    let out = File::create(&log)?;
    let mut args: Vec<std::ffi::OsString> = vec!["--name".into(), s.name.clone().into()];
    args.extend(["--data-dir".into(), data.into_os_string()]);
    let flags = [
        ("--listen-client-urls", client_url.as_str()),
        ("--advertise-client-urls", client_url.as_str()),
        ("--listen-peer-urls", peer_url.as_str()),
        ("--initial-advertise-peer-urls", peer_url.as_str()),
        ("--initial-cluster", s.initial_cluster),
        ("--initial-cluster-state", "new"),
        ("--initial-cluster-token", s.token),
        ("--heartbeat-interval", "50"),
        ("--election-timeout", "500"),
    ];
    for (k, v) in flags {
        args.extend([k.into(), v.into()]);
    }
    if let Some(t) = s.tls {
        args.push("--client-cert-auth".into());
        args.extend(["--trusted-ca-file".into(), t.ca.clone().into_os_string()]);
        args.extend(["--cert-file".into(), t.server_cert.clone().into_os_string()]);
        args.extend(["--key-file".into(), t.server_key.clone().into_os_string()]);
    }
    let child = launch(bin, &args, out)?;
    Ok(EtcdServer {
        pid: child.id(),
        child: Some(child),
        client_url,
        log,
        tls: s.tls.cloned(),
        launch: (bin.to_path_buf(), args),
    })
}

/// Runs `bin ARGS`, its output to `out`, without the environment's `ETCD_*` variables (our
/// flags say how it runs).
fn launch(bin: &Path, args: &[std::ffi::OsString], out: File) -> io::Result<Child> {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ETCD_") {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    cmd.spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", bin.display())))
}

/// Waits until every member answers a read, within `HEALTH_WAIT`. The probes run on a
/// runtime of their own in a thread of their own, so a caller inside a tokio runtime may
/// call this too. A member that exits fails the wait with its log's tail (`AddrInUse` if
/// it could not bind); the members are dropped (killed) on failure.
fn wait_healthy(mut members: Vec<EtcdServer>) -> io::Result<Vec<EtcdServer>> {
    let clients = members
        .iter()
        .map(|m| m.client(PROBE_TIMEOUT))
        .collect::<io::Result<Vec<_>>>()?;
    let deadline = Instant::now() + HEALTH_WAIT;
    let probes_max = (HEALTH_WAIT.as_millis() / PROBE_PAUSE.as_millis()) as usize + 1;
    let waited = std::thread::scope(|s| {
        s.spawn(|| probe_until_healthy(&mut members, &clients, deadline, probes_max))
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the etcd health probe panicked")))
    });
    waited.map(|()| members)
}

fn probe_until_healthy(
    members: &mut [EtcdServer],
    clients: &[Etcd],
    deadline: Instant,
    probes_max: usize,
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Per member: `None` once it answered, else the last probe's error.
    let mut waiting: Vec<Option<String>> = vec![Some("not probed".into()); members.len()];
    for _ in 0..probes_max {
        for (i, m) in members.iter_mut().enumerate() {
            check_alive(m)?;
            if waiting[i].is_some() {
                let probe = rt.block_on(clients[i].get("roost-etcd/health"));
                waiting[i] = probe.err().map(|e| e.to_string());
            }
        }
        if waiting.iter().all(Option::is_none) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(PROBE_PAUSE);
    }
    let slow: Vec<String> = members
        .iter()
        .zip(&waiting)
        .filter_map(|(m, w)| Some(format!("{} ({})", m.log.display(), w.as_ref()?)))
        .collect();
    let msg = format!(
        "etcd did not answer within {HEALTH_WAIT:?}: {}",
        slow.join("; ")
    );
    Err(io::Error::new(io::ErrorKind::TimedOut, msg))
}

/// An error (with the log's tail) if `m` has exited.
fn check_alive(m: &mut EtcdServer) -> io::Result<()> {
    let Some(child) = m.child.as_mut() else {
        return Err(io::Error::other(format!(
            "etcd {} was stopped",
            m.client_url
        )));
    };
    let Some(status) = child.try_wait()? else {
        return Ok(());
    };
    let tail = log_tail(&m.log);
    let kind = if tail.contains("address already in use") {
        io::ErrorKind::AddrInUse
    } else {
        io::ErrorKind::Other
    };
    let msg = format!(
        "etcd {} exited ({status}) while starting; {}:\n{tail}",
        m.client_url,
        m.log.display()
    );
    Err(io::Error::new(kind, msg))
}

/// The last `LOG_TAIL_BYTES` of `log`, as text.
fn log_tail(log: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = File::open(log) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)));
    let mut buf = Vec::new();
    let _ = f.take(LOG_TAIL_BYTES).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_etcd_says_how_to_install_it() {
        let err = check_bin(PathBuf::from("/nonexistent/etcd")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let msg = err.to_string();
        assert!(msg.contains("etcd not found at /nonexistent/etcd"), "{msg}");
        assert!(msg.contains("apt-get install etcd-server"), "{msg}");
    }
}
