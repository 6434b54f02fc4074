//! A cluster on real links (`cluster_netns.rs`, issue 42): etcd and the nodes {a, b, c} each
//! in a network namespace of its own, joined by one veth pair each to a bridge in a hub
//! namespace, so a partition is a link taken down, not a proxy refusing connections. Every
//! namespace, address and packet exists only inside the namespaces this module creates (the
//! host's own network is never touched); [`NetLab`] kills what it started (by its child
//! handles, never by name) and deletes every namespace when dropped, also on panic.
//!
//! A daemon runs in its namespace through a two-line wrapper script (`ip netns exec NS
//! roost "$@"`, which execs, so the pid `ServeChild` holds is the daemon's): `ServeChild`
//! is used unchanged. The control socket is a unix socket in the data directory, which the
//! host reaches across namespaces, so `roost status` and the cluster helpers work as usual.
//! Requires root; not being root, or `ip netns add` failing, fails the test with a message
//! (never a silent skip). netem (delay, loss) is probed once and reported when missing;
//! every namespace drops 1 % of what it sends through an nftables rule (`lossy`), so the
//! whole test runs on lossy links.

use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{Node, LIMIT, MEMBERS};
use crate::common::BIN;
use roost::drill::child::ServeChild;

/// Where each node's replication listens, on its namespace's address.
const REPL_PORT: u16 = 7400;
const ETCD_CLIENT_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;
/// The longest etcd may take to say it serves.
const ETCD_WAIT: Duration = Duration::from_secs(20);
/// The share of packets each namespace drops on its way out (`lossy`): 1 in 100, as the
/// issue's netem loss; TCP sends them again (an RTO of 200 ms or more each time).
const LOSS_PERCENT: u32 = 1;
/// Labs made by this process so far (part of each namespace's name).
static LABS: AtomicUsize = AtomicUsize::new(0);

/// The namespaces, etcd and the nodes of one test. Member 0 is etcd, member `i + 1` is
/// `nodes[i]`.
pub struct NetLab {
    /// The nodes {a, b, c}, configured, not started ([`NetLab::start`]).
    pub nodes: Vec<Node>,
    /// The first three octets of the lab's /24 (".0" is the net, ".1" etcd, ".11".. nodes).
    subnet: String,
    /// `roost-<pid>-<n>`: every namespace's name begins with it.
    prefix: String,
    /// Every namespace created so far, deleted on drop (and with them every veth).
    spaces: Vec<String>,
    /// The wrapper script per node that runs `roost` in its namespace.
    wrappers: Vec<PathBuf>,
    etcd: Option<Child>,
    etcd_log: PathBuf,
    /// etcd's data, in memory when `/dev/shm` is there (see [`etcd_data`]); removed on drop.
    etcd_data: tempfile::TempDir,
}

impl NetLab {
    /// Namespaces, links and addresses, etcd serving in its namespace, and the three nodes'
    /// configurations under `root` (mutual TLS, `ack = "standby"` and so on in `extra`,
    /// a lease of `lease_ms`). Panics with the reason when any step fails.
    pub fn new(root: &Path, extra: &str, lease_ms: u64) -> NetLab {
        let euid = rustix::process::geteuid();
        assert!(
            euid.is_root(),
            "cluster_netns needs root (network namespaces, veth, a bridge); euid is {}",
            euid.as_raw()
        );
        let n = LABS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let mut lab = NetLab {
            nodes: Vec::new(),
            subnet: format!("10.{}.{}", 100 + random % 151, pid % 250),
            prefix: format!("roost-{pid}-{n}"),
            spaces: Vec::new(),
            wrappers: Vec::new(),
            etcd: None,
            etcd_log: root.join("etcd.log"),
            etcd_data: etcd_data(root),
        };
        lab.wire();
        lab.probe_netem();
        lab.lossy(LOSS_PERCENT);
        lab.start_etcd();
        for (i, name) in MEMBERS.into_iter().enumerate() {
            lab.nodes.push(lab.node_config(root, name, extra, lease_ms));
            lab.wrappers.push(lab.wrapper(root, i + 1));
        }
        eprintln!(
            "netns lab {}: {}.0/24, etcd at {}",
            lab.prefix,
            lab.subnet,
            lab.etcd_url()
        );
        lab
    }

    /// The namespace of member `m` (0 etcd, 1.. the nodes).
    fn space(&self, m: usize) -> String {
        format!("{}-{}", self.prefix, member_name(m))
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// The address of member `m` (0 etcd, 1.. the nodes).
    fn ip(&self, m: usize) -> String {
        if m == 0 {
            format!("{}.1", self.subnet)
        } else {
            format!("{}.{}", self.subnet, 10 + m)
        }
    }

    /// Node `i`'s replication address (its `listen` and `advertise`).
    pub fn addr(&self, i: usize) -> String {
        format!("{}:{REPL_PORT}", self.ip(i + 1))
    }

    pub fn etcd_url(&self) -> String {
        format!("http://{}:{ETCD_CLIENT_PORT}", self.ip(0))
    }

    /// The hub, a bridge in it, and per member a namespace with `lo` up and a veth pair:
    /// `eth0` inside (with the member's address), `p-NAME` in the hub, a port of the bridge.
    fn wire(&mut self) {
        let hub = self.hub();
        self.add_space(&hub);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        for m in 0..=MEMBERS.len() {
            let (ns, port) = (self.space(m), port_name(m));
            self.add_space(&ns);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            let peer = ["peer", "name", "eth0", "netns", &ns];
            ip(&[
                &["-n", &hub, "link", "add", &port, "type", "veth"],
                &peer[..],
            ]
            .concat());
            ip(&["-n", &hub, "link", "set", &port, "master", "br0", "up"]);
            let cidr = format!("{}/24", self.ip(m));
            ip(&["-n", &ns, "addr", "add", &cidr, "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
    }

    /// `ip netns add NAME`, remembered for the drop; a failure fails the test.
    fn add_space(&mut self, name: &str) {
        let out = run("ip", &["netns", "add", name]);
        assert!(
            out.status.success(),
            "ip netns add {name} failed ({}): {}; cluster_netns needs network namespaces",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        self.spaces.push(name.to_owned());
    }

    /// Tries netem once on a hub port (removed again at once): delay and loss need it.
    fn probe_netem(&self) {
        let (hub, port) = (self.hub(), port_name(1));
        let add = ["-n", &hub, "qdisc", "add", "dev", &port, "root", "netem"];
        let out = run("tc", &[&add[..], &["delay", "1ms"]].concat());
        if out.status.success() {
            run("tc", &["-n", &hub, "qdisc", "del", "dev", &port, "root"]);
            eprintln!("netem is available (this test uses link down/up only)");
        } else {
            eprintln!(
                "netem is unavailable here ({}): no delay or loss faults, link down/up only",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }

    /// Every member's namespace drops `percent` of the packets it sends on `eth0`, at
    /// random (an nftables rule: this kernel has no qdiscs, so netem's loss is made here;
    /// the bridge's links are otherwise perfect). Needs `nft` (Debian's nftables): the test
    /// fails, never skips, without it.
    fn lossy(&self, percent: u32) {
        let rule = format!(
            "add table inet roostlab\n\
             add chain inet roostlab out {{ type filter hook output priority 0 ; }}\n\
             add rule inet roostlab out oifname \"eth0\" numgen random mod 100 < {percent} drop\n"
        );
        for m in 0..=MEMBERS.len() {
            let ns = self.space(m);
            let path = std::env::temp_dir().join(format!("{ns}.nft"));
            std::fs::write(&path, &rule).expect("write the nft rules");
            let out = Command::new("ip")
                .args(["netns", "exec", &ns, "nft", "-f"])
                .arg(&path)
                .output()
                .expect("run ip netns exec nft");
            let _ = std::fs::remove_file(&path);
            assert!(
                out.status.success(),
                "nft in {ns} failed ({}): {}; install nftables (Debian) for the lab's packet loss",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        eprintln!("every namespace drops {percent} % of the packets it sends (nftables)");
    }

    /// Cuts node `i` off: its port on the bridge goes down (a pulled cable: its packets
    /// are dropped silently both ways, nothing is refused).
    pub fn cut(&self, i: usize) {
        ip(&["-n", &self.hub(), "link", "set", &port_name(i + 1), "down"]);
    }

    /// Puts node `i`'s port on the bridge back up.
    pub fn heal(&self, i: usize) {
        ip(&["-n", &self.hub(), "link", "set", &port_name(i + 1), "up"]);
    }

    /// etcd (`/usr/bin/etcd` or `$ROOST_ETCD_BIN`) in its namespace, on its address only,
    /// timed as the other test etcds are; waits for it to say it serves.
    fn start_etcd(&mut self) {
        let bin = std::env::var(roost_etcd::testing::ETCD_BIN_ENV)
            .unwrap_or_else(|_| "/usr/bin/etcd".to_owned());
        let (client, peer) = (
            self.etcd_url(),
            format!("http://{}:{ETCD_PEER_PORT}", self.ip(0)),
        );
        let data = self.etcd_data.path().join("data");
        let log = std::fs::File::create(&self.etcd_log).expect("etcd log");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.space(0), &bin, "--name", "e"]);
        cmd.arg("--data-dir").arg(&data);
        cmd.args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ]);
        cmd.args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ]);
        cmd.args(["--initial-cluster", &format!("e={peer}")]);
        cmd.args(["--heartbeat-interval", "50", "--election-timeout", "500"]);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log"))
            .stderr(log);
        self.etcd = Some(
            cmd.spawn()
                .unwrap_or_else(|e| panic!("starting {bin}: {e}")),
        );
        self.wait_etcd();
    }

    /// Until etcd's log says it serves clients (it has elected itself by then); bounded.
    fn wait_etcd(&mut self) {
        let until = Instant::now() + ETCD_WAIT;
        loop {
            let text = std::fs::read_to_string(&self.etcd_log).unwrap_or_default();
            if text.contains("ready to serve client requests") {
                return;
            }
            let etcd = self.etcd.as_mut().expect("etcd");
            if let Ok(Some(st)) = etcd.try_wait() {
                panic!("etcd exited ({st}) while starting:\n{}", tail(&text));
            }
            assert!(
                Instant::now() < until,
                "etcd did not serve within {ETCD_WAIT:?}:\n{}",
                tail(&text)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Node `name`'s configuration as `Node::new` writes it, listening and advertising on
    /// its namespace's address, with a `[cluster]` section naming the lab's etcd.
    fn node_config(&self, root: &Path, name: &'static str, extra: &str, lease_ms: u64) -> Node {
        let node = Node::new(root, name, extra);
        let i = self.nodes.len();
        let text = std::fs::read_to_string(&node.config).expect("config");
        let loopback = format!("listen = \"127.0.0.1:{}\"", node.port.port());
        assert!(text.contains(&loopback), "{text}");
        let text = text.replace(&loopback, &format!("listen = \"{}\"", self.addr(i)));
        let cluster = format!(
            "\n[cluster]\netcd = [\"{}\"]\nadvertise = \"{}\"\nlease_ms = {lease_ms}\n",
            self.etcd_url(),
            self.addr(i)
        );
        std::fs::write(&node.config, format!("{text}{cluster}")).expect("config");
        node
    }

    /// A script that runs `roost` with its arguments in member `m`'s namespace (`exec`
    /// twice: the daemon keeps the script's pid).
    fn wrapper(&self, root: &Path, m: usize) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        assert!(!BIN.contains('\''), "a quote in {BIN}");
        let path = root.join(format!("roost-in-{}", member_name(m)));
        let text = format!(
            "#!/bin/sh\nexec ip netns exec '{}' '{BIN}' \"$@\"\n",
            self.space(m)
        );
        std::fs::write(&path, text).expect("wrapper");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    /// Starts node `i`'s daemon in its namespace and waits for "serving" (as `Node::start`
    /// does, with the same numbered logs that `Node`'s drop prints on a failure).
    pub fn start(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        assert!(node.child.is_none(), "{} already running", node.name);
        node.starts += 1;
        let log = node.data.with_extension(format!("log{}", node.starts));
        let config = node.config.clone();
        let mut c = ServeChild::spawn(&self.wrappers[i], &node.data, &log, |c| {
            c.arg("--config").arg(&config);
        })
        .expect("spawn");
        c.ready(LIMIT)
            .unwrap_or_else(|e| panic!("{}: {e:#}", node.name));
        node.child = Some(c);
    }

    pub fn start_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.start(i);
        }
    }
}

impl Drop for NetLab {
    /// Kills the nodes (their drops print their logs on a failure) and etcd, then deletes
    /// every namespace this lab created, and with them the veths and the bridge.
    fn drop(&mut self) {
        self.nodes.clear();
        if let Some(mut etcd) = self.etcd.take() {
            let _ = etcd.kill();
            let _ = etcd.wait();
        }
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.etcd_log).unwrap_or_default();
            eprintln!("--- etcd, last lines:\n{}", tail(&text));
        }
        for ns in self.spaces.iter().rev() {
            let out = run("ip", &["netns", "del", ns]);
            if !out.status.success() {
                eprintln!(
                    "ip netns del {ns}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
    }
}

/// A directory for etcd's data: in `/dev/shm` when there is one, so that etcd's fsyncs do
/// not wait behind the disk (a loaded machine stalled them for seconds, longer than the
/// 1 s lease: leaders were fenced with no fault at all); under `root` otherwise. What this
/// test puts under fault is roost's links, not etcd's disk.
fn etcd_data(root: &Path) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm } else { root };
    tempfile::Builder::new()
        .prefix("roost-netns-etcd-")
        .tempdir_in(base)
        .expect("etcd's data directory")
}

/// "etcd", then the members' names.
fn member_name(m: usize) -> &'static str {
    if m == 0 {
        "etcd"
    } else {
        MEMBERS[m - 1]
    }
}

/// Member `m`'s port on the hub's bridge.
fn port_name(m: usize) -> String {
    format!("p-{}", member_name(m))
}

fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd}: {e}"))
}

/// `ip ARGS`; a failure fails the test with ip's message.
fn ip(args: &[&str]) {
    let out = run("ip", args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
