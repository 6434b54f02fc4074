//! The `roost` command line (a public contract: commands and flags are only ever added).
//! Exit codes follow sysexits(3) so systemd can tell a restart that may help from one that
//! cannot (see `systemd/roost.service`); [`exit_code`] is the one mapping from a failure to
//! its code. One file per command group: `serve` (the daemon, permissions, recovery
//! progress), `read` (`get`, `scan`, `audit`, `wal dump`), `submit` (delivery and waiting),
//! `stream` (`submit --stream`, the stream socket's client),
//! `status` (the control socket), `check` (`verify`, `drill`), `cluster` (operating the
//! cluster through etcd), `config` (`config check`: the configuration checked and shown). This module only parses and
//! dispatches; it never touches the data directory itself.

mod certs;
mod check;
mod cluster;
mod config_check;
mod output;
mod read;
mod serve;
mod status;
mod submit;
mod submit_stream;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, Subcommand};
use roost_shards::ShardError;
use roost_wal::WalError;

use crate::config::{Config, ConfigError};
use crate::error::{shard_class, wal_class, CommandError, EngineError, ErrorClass};

pub use crate::error::{
    EXIT_CONFIG, EXIT_CORRUPTION, EXIT_FAILED, EXIT_INVALID, EXIT_IO, EXIT_LOCKED, EXIT_OK,
};
pub use serve::check_permissions;

#[derive(Debug, Parser)]
#[command(
    name = "roost",
    version,
    about = "a write-ahead-log batch-apply daemon",
    long_about = "roost: a write-ahead-log batch-apply daemon.\n\nClients drop batch files into a spool directory (or send batch lines over a stream socket); roost plans each batch, claims its ids in a checksummed WAL, commits one atomic transaction per shard and writes a result file. It survives kill -9 and power loss without losing an acknowledged batch or creating a record twice."
)]
pub struct Cli {
    /// TOML configuration file [default: /etc/roost/roost.toml if it exists and this is
    /// /usr/bin/roost, else the built-in defaults].
    ///
    /// examples/roost.toml explains every key; the package installs it as
    /// /usr/share/doc/roost/examples/roost.toml. An installed <prefix>/bin/roost looks for
    /// <prefix>/etc/roost/roost.toml (/etc for the prefix /usr); a roost elsewhere (a build
    /// tree's target/) reads no file unless given one. --config /dev/null runs on the
    /// built-in defaults whatever is installed. --data-dir and --spool-dir override the file.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Data directory [default: $STATE_DIRECTORY, else ./roost-data].
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Spool directory [default: <data-dir>/spool].
    #[arg(long, global = true, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: recover, then apply every batch dropped into <spool>/new.
    Serve {
        /// Run as a standby following the primary at HOST:PORT (its spool stays closed until
        /// `roost promote`); the same as `[replication] follow`.
        #[arg(long, value_name = "HOST:PORT")]
        follow: Option<String>,
    },
    /// Make the standby running on this data directory the primary of a new epoch: it stops
    /// following, finishes the batches it holds claims for, and opens its spool.
    Promote,
    /// Deliver batch files safely (tmp/, fsync, rename into new/, fsync the directory), or
    /// with --stream send batch lines from stdin over the stream socket.
    Submit {
        /// Wait for each result and print it; exit 0 if all committed, 1 if any was rejected
        /// or conflicted, 2 on invalid input or error.
        #[arg(long, conflicts_with = "stream")]
        wait: bool,
        /// With --wait: give up after this many seconds (exit 2); a spool that does not exist
        /// yet (the daemon is starting) is waited for within them. With --stream: give up when
        /// no answer came for this long while batches wait for one (exit 2).
        #[arg(long, value_name = "SECS", default_value_t = 60)]
        timeout: u64,
        /// Read one batch JSON per line from stdin, send them over the daemon's stream
        /// socket (many in flight at once) and print one answer line per batch, in order.
        /// Exit 0 if all committed, 1 if any was rejected or conflicted, 2 on invalid input,
        /// a timeout or no daemon to connect to, 75 if any was not taken now (unavailable,
        /// or unanswered when the connection closed): send those again under the same keys.
        #[arg(long)]
        stream: bool,
        /// With --stream: the stream socket [default: `stream_socket`, else
        /// $RUNTIME_DIRECTORY/stream.sock, else <data-dir>/stream.sock].
        #[arg(long, value_name = "PATH", requires = "stream")]
        socket: Option<PathBuf>,
        /// Batch files to deliver, in order: NAME.json holds one batch, NAME.jsonl a bulk
        /// file of one batch per line. Each goes into the spool under its own name (or
        /// NAME-1.json, ... while new/, out/ or failed/ holds that name); with --wait its
        /// result is printed and out/NAME removed once read.
        #[arg(
            required_unless_present = "stream",
            conflicts_with = "stream",
            value_name = "FILE"
        )]
        files: Vec<PathBuf>,
    },
    /// Ask the running daemon (over its control socket) for its state: epoch, last lsn,
    /// batches in flight, counts since start, records per shard, the last recovery.
    Status {
        /// The raw JSON object.
        #[arg(long)]
        json: bool,
        /// Prometheus text format instead.
        #[arg(long, conflicts_with = "json")]
        metrics: bool,
    },
    /// Print one record as JSON: {"shard":..,"id":..,"record":{..}}. Exit 1 if absent.
    Get { shard: String, id: u64 },
    /// Print every record of a shard as JSON lines, in id order.
    Scan { shard: String },
    /// Print the audit rows as JSON lines (those retained: see `audit_retain_bytes`).
    Audit {
        /// Only rows of batches at or after this lsn (a claim lsn, as in results).
        #[arg(long, default_value_t = 1)]
        from: u64,
    },
    /// Check every checksum and the spec's invariants on a data directory; exit 0 only if all
    /// hold.
    Verify,
    /// The crash-recovery drill (one node, or with --replicated or --cluster a failover
    /// drill): kill roost at random moments, restart it, check every invariant.
    ///
    /// Alone: run `roost serve` as a child, stream batches, kill it with SIGKILL at random
    /// moments and at named crash points, restart it, and check the invariants after every
    /// restart. With --replicated, the failover drill by hand: two nodes (DIR/a, DIR/b) on
    /// loopback under `ack = "standby"`; each kill is a failover (promote the standby,
    /// restart the old primary as its standby), and every acknowledged batch must survive
    /// it. With --cluster: etcd and three nodes that fail over by themselves (see --cluster
    /// below). Exit 1 on any violation.
    Drill {
        /// Number of batches to stream.
        #[arg(long, default_value_t = 200)]
        batches: usize,
        /// Number of kills (with --replicated: of failovers).
        #[arg(long, default_value_t = 6)]
        kills: usize,
        /// Seed: the same seed gives the same batches and kill schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Two replicated nodes instead of one: kill the primary, fail over, check that no
        /// acknowledged batch is lost and that the nodes do not diverge.
        #[arg(long)]
        replicated: bool,
        /// Three nodes and etcd (docs/cluster.md): each kill is a strike on the leader
        /// (SIGKILL, SIGSTOP past its lease, or its connections cut); the cluster fails over
        /// by itself; every acknowledged batch must survive, no two nodes lead one epoch.
        /// Needs Debian's etcd-server (/usr/bin/etcd, or ROOST_ETCD_BIN).
        #[arg(long, conflicts_with = "replicated")]
        cluster: bool,
        /// With --cluster: the nodes' `[cluster] lease_ms`.
        #[arg(long, default_value_t = 3000, requires = "cluster")]
        lease_ms: u64,
        /// With --cluster: a rolling restart instead of strikes on the leader: each of the
        /// --kills strikes stops the next node in turn (a, b, c, a, ...) with SIGTERM (exit 0
        /// within 10 s, else a violation) and starts it again; prints the longest stretch a
        /// client went without a committed answer.
        #[arg(long, requires = "cluster")]
        rolling: bool,
        /// With --cluster: no strikes: load into every node for this many seconds, then the
        /// final checks; a leader change is a violation.
        #[arg(long, requires = "cluster", conflicts_with = "rolling",
              value_parser = clap::value_parser!(u64).range(1..=86_400))]
        quiet_secs: Option<u64>,
        /// With --cluster: planned switchovers instead of strikes: each of the --kills
        /// strikes runs `roost cluster switchover` to the next node (exit 0 and that node
        /// leading, else a violation); prints the longest stretch a client went without a
        /// committed answer.
        #[arg(long, requires = "cluster", conflicts_with_all = ["rolling", "quiet_secs"])]
        switchovers: bool,
        /// With --cluster: etcd members on loopback (1 to 7). With 3 or more, a fourth
        /// strike joins the three on the leader: SIGKILL of one etcd member, in turn,
        /// started again two leases later.
        #[arg(long, requires = "cluster", default_value_t = 1,
              value_parser = clap::value_parser!(u64).range(1..=7))]
        etcd_members: u64,
        /// With --cluster: every byte between the nodes, and between a node and etcd, is
        /// held this long each way (a proxy in user space: netem's delay).
        #[arg(long, requires = "cluster", default_value_t = 0,
              value_parser = clap::value_parser!(u64).range(0..=1000))]
        delay_ms: u64,
    },
    /// Certificates for replication's mutual TLS (a test cluster's CA and its members).
    Certs {
        #[command(subcommand)]
        command: CertsCommand,
    },
    /// Inspect the write-ahead log.
    Wal {
        #[command(subcommand)]
        command: WalCommand,
    },
    /// Operate the cluster through etcd (docs/cluster.md); needs the `[cluster]` section.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Check the configuration (--config, the flags, the environment) as `serve` would.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load and check the configuration as `serve` does before it opens anything: every
    /// value, the metrics listener's web configuration and TLS files, replication's TLS
    /// files. Exit 0 when it would start, 78 when not (naming what is wrong).
    Check {
        /// Print the effective configuration as TOML, every key with where its value came
        /// from (default, file, env, flag); unset keys commented out.
        #[arg(long)]
        print: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// When no node leads and every node etcd's in-sync set names is lost for good: make the
    /// running member NAME the set's only member, so that it campaigns and leads. Batches
    /// the lost nodes acknowledged that NAME does not hold are lost (Kafka's unclean leader
    /// election). Refused while a node leads; without --accept-loss it only says what it
    /// would write (exit 2).
    UncleanElection {
        /// The member to elect: a name in `[replication] members`, running.
        name: String,
        /// Write it, accepting that acknowledged batches NAME does not hold are lost.
        #[arg(long)]
        accept_loss: bool,
    },
    /// One line per member, as etcd sees it: name, advertise address, role (leader,
    /// standby, or unknown: no key in etcd, not running), whether etcd's in-sync set names
    /// it, epoch, the leader's lease left, and the lag per standby when the daemon on this
    /// configuration knows it. Exit 0, 1 when etcd does not answer.
    List {
        /// One JSON object: the cluster and a `members` array.
        #[arg(long)]
        json: bool,
    },
    /// A planned change of leader with no gap: the leader takes no more batches, finishes
    /// those in flight, waits until NAME holds its whole log and gives up its lease; NAME
    /// campaigns at once. Waits until etcd names NAME. Exit 0 when NAME leads, 1 when
    /// refused (no leader, NAME not in the in-sync set or not running) or not done in time.
    Switchover {
        /// The member to lead: in etcd's in-sync set, running.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make a CA: DIR/ca.pem and DIR/ca.key (0600). Keep ca.key off the nodes.
    Init {
        /// Where the files go (created 0700 if missing).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Days the CA is valid.
        #[arg(long, default_value_t = certs::CA_DAYS)]
        days: u32,
        /// Replace an existing CA (every certificate it issued stops being trusted).
        #[arg(long)]
        force: bool,
    },
    /// Make member NAME's certificate (SAN NAME, serverAuth and clientAuth) and key (0600),
    /// DIR/NAME.pem and DIR/NAME.key, signed by the CA in DIR.
    Issue {
        /// The member's name: a DNS name, as in `[replication] members` and `name`.
        name: String,
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = certs::MEMBER_DAYS)]
        days: u32,
        /// Replace an existing certificate and key for NAME.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum WalCommand {
    /// Print the WAL records (lsn, epoch, type, request key, ops, claimed ids).
    Dump {
        /// Start at this lsn.
        #[arg(long, value_name = "LSN", default_value_t = 1)]
        from: u64,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

/// The command line as a [`clap::Command`], for what is generated from it rather than parsed
/// with it: the man pages and shell completions (`packaging/gen`, run by `packaging/deb-check`).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// The configuration the flags and file describe: `--config FILE`, else the installed
/// roost's own file ([`default_config_file`]) if it exists, else the built-in defaults.
pub fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let file = cli.config.clone().or_else(default_config_file);
    let mut cfg = match &file {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(d) = &cli.data_dir {
        cfg.data_dir = d.clone();
    }
    if let Some(s) = &cli.spool_dir {
        cfg.spool_dir = Some(s.clone());
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The file an installed roost reads when `--config` is absent, if it exists: that of
/// [`installed_config`] for the running binary. A roost run from a build tree
/// (`target/debug/roost`) has none, so a host's package configuration never leaks into a
/// test, a drill or a benchmark run from a checkout.
pub fn default_config_file() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    installed_config(&exe).filter(|p| p.is_file())
}

/// Where `<prefix>/bin/roost` looks for its configuration, after the GNU layout:
/// `<prefix>/etc/roost/roost.toml`, and `/etc/roost/roost.toml` for the prefixes `/usr` (the
/// Debian package's `/usr/bin/roost`) and `/`. `None` for a binary outside a `bin` directory.
pub fn installed_config(exe: &Path) -> Option<PathBuf> {
    let bin = exe.parent()?;
    if bin.file_name()? != "bin" {
        return None;
    }
    let prefix = bin.parent()?;
    let etc = if prefix == Path::new("/usr") || prefix == Path::new("/") {
        PathBuf::from("/etc")
    } else {
        prefix.join("etc")
    };
    Some(etc.join("roost").join("roost.toml"))
}

/// A failure as one line, each cause once: `anyhow`'s `{:#}` prints every cause after the
/// message before it, and a message that already ends with its cause's text (a typed error
/// whose `Display` includes its `source`, as `create DIR: {source}` does) would show that
/// cause twice ("Permission denied (os error 13): Permission denied (os error 13)").
pub fn failure_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.is_empty() && out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Maps a failure to the process exit code: a class the command stated itself (a
/// [`CommandError`], also as context) wins; otherwise the outermost typed cause in the chain
/// decides; a failure with no typed cause at all is a plain failure (1).
pub fn exit_code(e: &anyhow::Error) -> i32 {
    if is_broken_pipe(e) {
        return EXIT_OK;
    }
    e.downcast_ref::<CommandError>()
        .map(|c| c.class)
        .or_else(|| e.chain().find_map(class_of))
        .map_or(EXIT_FAILED, ErrorClass::exit_code)
}

/// True when the failure is only that stdout's reader went away.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The class of one error in a chain, if it is one of the typed errors roost knows.
fn class_of(cause: &(dyn std::error::Error + 'static)) -> Option<ErrorClass> {
    if let Some(e) = cause.downcast_ref::<CommandError>() {
        Some(e.class)
    } else if let Some(e) = cause.downcast_ref::<EngineError>() {
        Some(e.class())
    } else if cause.downcast_ref::<ConfigError>().is_some() {
        Some(ErrorClass::Config)
    } else if let Some(e) = cause.downcast_ref::<WalError>() {
        Some(wal_class(e))
    } else if let Some(e) = cause.downcast_ref::<ShardError>() {
        Some(shard_class(e))
    } else if cause.downcast_ref::<std::io::Error>().is_some() {
        Some(ErrorClass::Io)
    } else {
        None
    }
}

/// Runs one command; `Ok` carries the exit code of a command that ran to its answer.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let cfg = load_config(&cli)?;
    match &cli.command {
        Command::Serve { follow } => {
            let mut cfg = cfg;
            if let Some(addr) = follow {
                cfg.replication.follow = Some(addr.clone());
                cfg.validate()?;
            }
            serve::serve(cfg)
        }
        Command::Promote => status::promote(&cfg),
        Command::Submit {
            stream: true,
            socket,
            timeout,
            ..
        } => submit_stream::submit_stream(&cfg, socket.as_deref(), Duration::from_secs(*timeout)),
        Command::Submit {
            wait,
            timeout,
            files,
            ..
        } => submit::submit(&cfg, *wait, Duration::from_secs(*timeout), files),
        Command::Status { json, metrics } => status::status(&cfg, *json, *metrics),
        Command::Get { shard, id } => read::get(&cfg, shard, *id),
        Command::Scan { shard } => read::scan(&cfg, shard),
        Command::Audit { from } => read::audit(&cfg, *from),
        Command::Wal {
            command: WalCommand::Dump { from, json },
        } => read::wal_dump(&cfg, *from, *json),
        Command::Verify => check::verify(&cfg),
        Command::Cluster {
            command: ClusterCommand::UncleanElection { name, accept_loss },
        } => cluster::unclean_election(&cfg, name, *accept_loss),
        Command::Cluster {
            command: ClusterCommand::List { json },
        } => cluster::list(&cfg, *json),
        Command::Cluster {
            command: ClusterCommand::Switchover { name },
        } => cluster::switchover(&cfg, name),
        Command::Certs {
            command: CertsCommand::Init { dir, days, force },
        } => certs::init(dir, *days, *force),
        Command::Certs {
            command:
                CertsCommand::Issue {
                    name,
                    dir,
                    days,
                    force,
                },
        } => certs::issue(dir, name, *days, *force),
        Command::Drill { .. } => drill(&cli),
        Command::Config {
            command: ConfigCommand::Check { print },
        } => config_check::check(
            &config_check::Given {
                config: cli.config.as_deref(),
                data_dir: cli.data_dir.is_some(),
                spool_dir: cli.spool_dir.is_some(),
            },
            &cfg,
            *print,
        ),
    }
}

/// `roost drill`: the kind of drill its flags name.
fn drill(cli: &Cli) -> anyhow::Result<i32> {
    let Command::Drill {
        batches,
        kills,
        seed,
        replicated,
        cluster,
        lease_ms,
        rolling,
        quiet_secs,
        switchovers,
        etcd_members,
        delay_ms,
    } = &cli.command
    else {
        anyhow::bail!("not a drill command");
    };
    let kind = match (*replicated, *cluster) {
        (_, true) => check::DrillKind::Cluster(crate::drill::ClusterRun {
            lease_ms: *lease_ms,
            mode: match (*rolling, *quiet_secs, *switchovers) {
                (_, Some(secs), _) => crate::drill::ClusterMode::Quiet { secs },
                (true, None, _) => crate::drill::ClusterMode::Rolling,
                (false, None, true) => crate::drill::ClusterMode::Switchovers,
                (false, None, false) => crate::drill::ClusterMode::Strikes,
            },
            etcd_members: *etcd_members as usize,
            delay_ms: *delay_ms,
        }),
        (true, false) => check::DrillKind::Replicated,
        (false, false) => check::DrillKind::One,
    };
    let opts = crate::drill::DrillOptions {
        data_dir: PathBuf::new(),
        batches: *batches,
        kills: *kills,
        seed: *seed,
    };
    check::drill(cli.data_dir.as_deref(), opts, kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    /// Goal: the chain walk finds the typed cause under any context, a command's own class
    /// wins over its cause's, and an untyped failure is a plain 1.
    #[test]
    fn exit_code_follows_the_typed_cause() {
        let corrupt = WalError::Corrupt {
            segment: PathBuf::from("wal/1.wal"),
            offset: 48,
            lsn: 2,
            reason: "checksum".into(),
        };
        let e = anyhow::Error::new(corrupt).context("opening wal");
        assert_eq!(exit_code(&e), EXIT_CORRUPTION);
        let dup = ShardError::DuplicateId { id: 1, lsn: 2 };
        assert_eq!(exit_code(&anyhow::Error::new(dup)), EXIT_CORRUPTION);
        let locked = ShardError::Locked {
            path: PathBuf::from("x"),
        };
        assert_eq!(exit_code(&anyhow::Error::new(locked)), EXIT_LOCKED);
        let io: anyhow::Result<()> = Err(std::io::Error::other("disk")).context("writing");
        let io = io.unwrap_err();
        assert_eq!(exit_code(&io), EXIT_IO);
        assert_eq!(
            exit_code(&io.context(CommandError::usage("cannot submit"))),
            EXIT_INVALID
        );
        let cfg = anyhow::Error::new(ConfigError::Invalid("x".into()));
        assert_eq!(exit_code(&cfg), EXIT_CONFIG);
        assert_eq!(exit_code(&anyhow::anyhow!("untyped")), EXIT_FAILED);
    }

    /// Goal: the cause a message already ends with is printed once (the package's first run
    /// printed "Permission denied (os error 13): Permission denied (os error 13)"); a cause
    /// the message does not hold is still printed, after it.
    #[test]
    fn failure_text_prints_each_cause_once() {
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let engine = EngineError::Io {
            op: "create",
            path: PathBuf::from("roost-data"),
            source: denied(),
        };
        let e = anyhow::Error::new(engine).context("opening data directory roost-data");
        let cause = denied().to_string();
        let text = failure_text(&e);
        assert_eq!(
            text,
            format!("opening data directory roost-data: create roost-data: {cause}")
        );
        assert_eq!(text.matches(&cause).count(), 1, "{text}");
        let io: anyhow::Result<()> = Err(denied()).context("reading x.json");
        assert_eq!(
            failure_text(&io.unwrap_err()),
            format!("reading x.json: {cause}")
        );
    }

    /// Goal: the installed binary's configuration file follows its prefix (/usr/bin/roost
    /// reads /etc/roost/roost.toml), and a binary outside a bin/ directory (a build tree's)
    /// reads none.
    #[test]
    fn the_default_configuration_follows_the_install_prefix() {
        let at = |exe: &str| installed_config(Path::new(exe));
        let etc = Some(PathBuf::from("/etc/roost/roost.toml"));
        assert_eq!(at("/usr/bin/roost"), etc);
        assert_eq!(at("/bin/roost"), etc);
        assert_eq!(
            at("/usr/local/bin/roost"),
            Some(PathBuf::from("/usr/local/etc/roost/roost.toml"))
        );
        assert_eq!(at("/work/roost/target/debug/roost"), None);
        assert_eq!(at("/work/roost/target/release/roost"), None);
        assert_eq!(at("roost"), None);
    }
}
