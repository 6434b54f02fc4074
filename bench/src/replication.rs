//! `roost-bench --replication` (issue 15's benchmark): what waiting for a standby costs. Real
//! `roost serve` processes (the `roost` binary beside this one: `target/release/roost` in a
//! release run; `ROOST_BIN` overrides) on loopback, in three modes: a primary alone without
//! replication (the reference), a primary with `ack = "local"` and a standby connected (the
//! same replication traffic, results not waiting), `ack = "standby"` with a standby
//! (results wait until the standby holds the claim durably), and that over mutual TLS
//! (issue 26; `tls/plain` is the TLS column over the plain one). Every round starts each mode on
//! fresh directories, in turn (the order reversed every other round: the machine's speed
//! drifts), and runs the same batches (10 creates of ~100 B, as the end-to-end bench): a
//! burst of N files, then closed-loop cells. The median over rounds is reported, the cells
//! beside it.
//!
//! During the burst both nodes' status is sampled every 100 ms over the control socket: the
//! standby's lag (the primary's durable lsn minus the standby's, at the same sample), and,
//! after the last result, the time until the standby holds everything the primary had
//! durably at that moment. The standby's apply rate is its durable lsns from the burst's
//! start to that moment, in batches (lsns per batch as the primary wrote them).
//!
//! `ROOST_BENCH_QUICK=1` makes it tiny (the CI smoke), `ROOST_BENCH_ROUNDS=N` sets the rounds,
//! `ROOST_BENCH_DIR` puts the files elsewhere (default `target/bench-replication`), and
//! `ROOST_BENCH_LOOP=1` (as root) runs both nodes on one fresh journaled ext4 loop image, and
//! `ROOST_BENCH_WAL_SEGMENT_BYTES=N` gives both nodes WAL and audit segments of N bytes
//! instead of the default 64 MiB (a standby's apply reads its audit segments whole:
//! docs/benchmarks.md, "Replication"). No figure is asserted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use roost::drill::child::ServeChild;
use roost_benchkit::{bench_base, raw_fdatasync, SyncFile};
use serde_json::Value;

use crate::loopfs::LoopMount;
use crate::spool::{burst_timed, clear_out, closed_loop, Workload};

/// Bound on every wait for a daemon (start, connect, catch-up).
const LIMIT: Duration = Duration::from_secs(120);
/// How often the status of both nodes is sampled during a burst.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

struct RepSizes {
    quick: bool,
    burst: usize,
    clients: Vec<usize>,
    cell: Duration,
    rounds: usize,
}

fn rep_sizes() -> RepSizes {
    let quick = std::env::var_os("ROOST_BENCH_QUICK").is_some();
    let rounds = std::env::var("ROOST_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok());
    if quick {
        RepSizes {
            quick,
            burst: 100,
            clients: vec![4],
            cell: Duration::from_millis(300),
            rounds: rounds.unwrap_or(1),
        }
    } else {
        RepSizes {
            quick,
            burst: 3_000,
            clients: vec![4, 32],
            cell: Duration::from_secs(3),
            rounds: rounds.unwrap_or(3),
        }
    }
}

/// The three configurations compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// No `[replication]` section: the reference.
    Alone,
    /// `ack = "local"`, a standby connected.
    Local,
    /// `ack = "standby"`, a standby connected.
    Standby,
    /// `ack = "standby"` over mutual TLS (issue 26: at least 0.9 of plain TCP).
    StandbyTls,
}

const MODES: [Mode; 4] = [Mode::Alone, Mode::Local, Mode::Standby, Mode::StandbyTls];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Alone => "alone",
            Mode::Local => "ack=local",
            Mode::Standby => "ack=standby",
            Mode::StandbyTls => "standby+tls",
        }
    }
}

/// One running `roost serve` and its control socket.
struct Node {
    child: ServeChild,
    spool: PathBuf,
    socket: PathBuf,
}

impl Node {
    /// Writes `<dir>.toml` (`extra` is the `[replication]` section, if any), starts the
    /// daemon on `dir` and waits for "serving".
    fn start(bin: &Path, dir: &Path, extra: &str) -> anyhow::Result<Node> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let socket = dir.join("roost.sock");
        let config = dir.with_extension("toml");
        let text = format!(
            "control_socket = \"{}\"\n{}{extra}",
            socket.display(),
            segment_config()
        );
        std::fs::write(&config, text).with_context(|| format!("write {}", config.display()))?;
        let log = dir.with_extension("log");
        let mut child = ServeChild::spawn(bin, dir, &log, |c| {
            c.arg("--config")
                .arg(&config)
                .env_remove("RUNTIME_DIRECTORY");
        })?;
        child.ready(LIMIT)?;
        Ok(Node {
            child,
            spool: dir.join("spool"),
            socket,
        })
    }

    /// `roost status --json` over the control socket (retried while the socket is not bound
    /// yet, bounded).
    fn status(&self) -> anyhow::Result<Value> {
        let until = Instant::now() + LIMIT;
        loop {
            match roost::control::socket::request(&self.socket, "status") {
                Ok(text) => return serde_json::from_str(&text).context("status JSON"),
                Err(e) if Instant::now() > until => {
                    return Err(e).context(format!("status of {}", self.socket.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn durable_lsn(&self) -> anyhow::Result<u64> {
        let s = self.status()?;
        s["replication"]["durable_lsn"]
            .as_u64()
            .context("status without replication.durable_lsn")
    }

    fn stop(mut self) -> anyhow::Result<()> {
        let st = self.child.stop(LIMIT)?;
        if !st.success() {
            bail!(
                "roost serve stopped with {st}; log {}",
                self.child.log_path().display()
            );
        }
        Ok(())
    }
}

/// `ROOST_BENCH_WAL_SEGMENT_BYTES=N`: WAL and audit segments of N bytes on both nodes (with
/// batches of at most 10 ops and 64 KiB spool files, so that a small segment holds two of
/// the largest claims); empty (the defaults) otherwise.
fn segment_config() -> String {
    match std::env::var("ROOST_BENCH_WAL_SEGMENT_BYTES") {
        Ok(n) if !n.is_empty() => {
            format!("wal_segment_bytes = {n}\nbatch_ops_max = 10\nspool_file_bytes_max = 65536\n")
        }
        _ => String::new(),
    }
}

/// A primary and, unless the mode is `Alone`, its standby, connected.
struct Pair {
    primary: Node,
    standby: Option<Node>,
}

impl Pair {
    fn start(bin: &Path, root: &Path, mode: Mode) -> anyhow::Result<Pair> {
        // Kept from the kernel's own picks until the node listens on it.
        let reserved = roost_etcd::testing::ReservedPort::new()?;
        let port = reserved.port();
        let ack = if matches!(mode, Mode::Standby | Mode::StandbyTls) {
            "standby"
        } else {
            "local"
        };
        let tls = |name: &str| -> anyhow::Result<String> {
            if mode != Mode::StandbyTls {
                return Ok(String::new());
            }
            roost::ops::tls_certs::member_config(&root.join("certs"), name, &["primary", "standby"])
        };
        let section = match mode {
            Mode::Alone => String::new(),
            _ => format!(
                "[replication]\nlisten = \"127.0.0.1:{port}\"\nname = \"primary\"\nack = \"{ack}\"\n{}",
                tls("primary")?
            ),
        };
        let primary = Node::start(bin, &root.join("primary"), &section)?;
        if mode == Mode::Alone {
            return Ok(Pair {
                primary,
                standby: None,
            });
        }
        let follow = format!(
            "[replication]\nfollow = \"127.0.0.1:{port}\"\nname = \"standby\"\n{}",
            tls("standby")?
        );
        let standby = Node::start(bin, &root.join("standby"), &follow)?;
        let until = Instant::now() + LIMIT;
        while !primary.status()?["replication"]["standby_connected"]
            .as_bool()
            .unwrap_or(false)
        {
            if Instant::now() > until {
                bail!("the standby did not connect within {LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Pair {
            primary,
            standby: Some(standby),
        })
    }

    fn stop(self) -> anyhow::Result<()> {
        self.primary.stop()?;
        if let Some(s) = self.standby {
            s.stop()?;
        }
        Ok(())
    }
}

/// The `roost` binary: `ROOST_BIN`, else the one beside this executable.
pub(crate) fn roost_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("ROOST_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("current_exe")?;
    let bin = exe.with_file_name("roost");
    if !bin.exists() {
        bail!(
            "{} not found: build it first (`cargo build --release -p roost`, or `cargo build -p roost` for a debug run) or set ROOST_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

/// What one burst showed about the standby.
#[derive(Clone, Copy)]
struct BurstFigures {
    rate: f64,
    /// The standby's durable lsns per second from the burst's start until it caught up, in
    /// batches (NaN without a standby).
    apply_rate: f64,
    max_lag: f64,
    catch_up_ms: f64,
}

/// `(primary durable lsn, standby durable lsn)` every [`SAMPLE_EVERY`] until `stop` is set.
fn sampler(
    primary: PathBuf,
    standby: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<(u64, u64)>> {
    std::thread::spawn(move || {
        let durable = |p: &Path| -> Option<u64> {
            let text = roost::control::socket::request(p, "status").ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            v["replication"]["durable_lsn"].as_u64()
        };
        let mut out = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            // The standby first: a lag read this way is never smaller than the true one.
            if let (Some(s), Some(p)) = (durable(&standby), durable(&primary)) {
                out.push((p, s));
            }
            std::thread::sleep(SAMPLE_EVERY);
        }
        out
    })
}

/// A burst of `n` files on the pair's primary, with the standby sampled meanwhile.
fn burst_cell(pair: &Pair, n: usize, w: &Workload) -> anyhow::Result<BurstFigures> {
    let Some(standby) = &pair.standby else {
        let b = burst_timed(&pair.primary.spool, n, w)?;
        clear_out(&pair.primary.spool);
        return Ok(BurstFigures {
            rate: b.rate,
            apply_rate: f64::NAN,
            max_lag: f64::NAN,
            catch_up_ms: f64::NAN,
        });
    };
    let last_lsn = |v: Value| v["last_lsn"].as_u64().unwrap_or(0);
    let (p0, s0) = (last_lsn(pair.primary.status()?), standby.durable_lsn()?);
    let stop = Arc::new(AtomicBool::new(false));
    let h = sampler(
        pair.primary.socket.clone(),
        standby.socket.clone(),
        stop.clone(),
    );
    let b = burst_timed(&pair.primary.spool, n, w);
    let caught_up = pair
        .primary
        .durable_lsn()
        .and_then(|target| wait_caught_up(standby, target));
    stop.store(true, Ordering::Relaxed);
    let samples = h.join().map_err(|_| anyhow::anyhow!("sampler panicked"))?;
    let (b, (at, s1)) = (b?, caught_up?);
    clear_out(&pair.primary.spool);
    let lsns_per_batch = (last_lsn(pair.primary.status()?) - p0) as f64 / n as f64;
    Ok(BurstFigures {
        rate: b.rate,
        apply_rate: (s1 - s0) as f64 / lsns_per_batch / (at - b.start).as_secs_f64(),
        max_lag: samples
            .iter()
            .map(|(p, s)| p.saturating_sub(*s))
            .max()
            .unwrap_or(0) as f64,
        catch_up_ms: at.saturating_duration_since(b.end).as_secs_f64() * 1e3,
    })
}

/// Polls the standby until it holds every lsn up to `target` durably: when, and its lsn.
fn wait_caught_up(standby: &Node, target: u64) -> anyhow::Result<(Instant, u64)> {
    let until = Instant::now() + LIMIT;
    loop {
        let s = standby.durable_lsn()?;
        if s >= target {
            return Ok((Instant::now(), s));
        }
        anyhow::ensure!(
            Instant::now() < until,
            "the standby did not reach lsn {target}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One closed-loop cell: batches/s, p50 and p99 in ms.
#[derive(Clone, Copy)]
struct Cell {
    rate: f64,
    p50: f64,
    p99: f64,
}

/// One mode's round: its burst, its closed-loop cells, and the primary's own figures.
struct Round {
    burst: BurstFigures,
    cells: Vec<Cell>,
    /// `latency_ms.replicate` p50/p99 over the round (bucket bounds; NaN if none).
    replicate: (f64, f64),
    /// `latency_ms.batch` p50/p99 over the round.
    batch: (f64, f64),
    batches_per_sync: f64,
}

fn run_round(bin: &Path, root: &Path, mode: Mode, sz: &RepSizes) -> anyhow::Result<Round> {
    let _ = std::fs::remove_dir_all(root);
    let w = Workload {
        ops: 10,
        record_bytes: 100,
    };
    let pair = Pair::start(bin, root, mode)?;
    let burst = burst_cell(&pair, sz.burst, &w)?;
    let mut cells = Vec::new();
    for &c in &sz.clients {
        let (rate, mut lat) = closed_loop(&pair.primary.spool, c, sz.cell, &w)?;
        lat.sort();
        let pct = |p: f64| {
            let i = ((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1));
            lat.get(i).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
        };
        cells.push(Cell {
            rate,
            p50: pct(0.5),
            p99: pct(0.99),
        });
    }
    let st = pair.primary.status()?;
    let q = |phase: &str, p: &str| st["latency_ms"][phase][p].as_f64().unwrap_or(f64::NAN);
    let round = Round {
        burst,
        cells,
        replicate: (q("replicate", "p50"), q("replicate", "p99")),
        batch: (q("batch", "p50"), q("batch", "p99")),
        batches_per_sync: st["wal_batches_per_sync"].as_f64().unwrap_or(f64::NAN),
    };
    pair.stop()?;
    let _ = std::fs::remove_dir_all(root);
    Ok(round)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| !x.is_nan());
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `--replication`: the rounds, then the table.
pub fn run() -> anyhow::Result<()> {
    let sz = rep_sizes();
    let bin = roost_bin()?;
    let base = bench_base("target/bench-replication");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let mount = match std::env::var_os("ROOST_BENCH_LOOP") {
        Some(_) => Some(LoopMount::new(&base, 4 << 30)?),
        None => None,
    };
    let root = mount.as_ref().map_or(base.clone(), |m| m.dir.clone());
    println!(
        "roost replication benchmark in {} with {}: {} rounds; burst of {} files, closed-loop clients {:?} for {:?} each; batches of 10 creates of ~100 B; extra config: {:?}",
        root.display(), bin.display(), sz.rounds, sz.burst, sz.clients, sz.cell, segment_config()
    );
    let secs = if sz.quick { 0.3 } else { 2.0 };
    let sync = raw_fdatasync(
        &root.join("raw-sync"),
        1200,
        Duration::from_secs_f64(secs),
        SyncFile::Append,
    )?
    .ops_per_sec;
    let _ = std::fs::remove_file(root.join("raw-sync"));
    println!("raw disk: {sync:.0} fdatasync/s (1.2 KB writes)");
    let mut rounds: Vec<Vec<(Mode, Round)>> = Vec::new();
    for r in 0..sz.rounds {
        let mut order = MODES.to_vec();
        if r % 2 == 1 {
            order.reverse();
        }
        let mut this = Vec::new();
        for mode in order {
            let round = run_round(&bin, &root.join(format!("r{r}-{}", mode.name())), mode, &sz)?;
            print_round(r, mode, &round, &sz);
            this.push((mode, round));
        }
        rounds.push(this);
    }
    print_table(&rounds, &sz, sync);
    drop(mount);
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}

fn print_round(r: usize, mode: Mode, x: &Round, sz: &RepSizes) {
    let cells: Vec<String> = sz
        .clients
        .iter()
        .zip(&x.cells)
        .map(|(c, cell)| {
            format!(
                "{c} clients {:.0}/s p50 {:.1} p99 {:.1} ms",
                cell.rate, cell.p50, cell.p99
            )
        })
        .collect();
    println!(
        "round {r} {:<11}: burst {:.0}/s (standby applied {:.0}/s, max lag {:.0} lsns, caught up {:.0} ms after); {}; replicate p50/p99 <= {:.1}/{:.1} ms; batch p50/p99 <= {:.1}/{:.1} ms; {:.1} batches per WAL sync",
        mode.name(), x.burst.rate, x.burst.apply_rate, x.burst.max_lag, x.burst.catch_up_ms,
        cells.join(", "), x.replicate.0, x.replicate.1, x.batch.0, x.batch.1, x.batches_per_sync
    );
}

/// One figure of every round of `mode`.
fn of(rounds: &[Vec<(Mode, Round)>], mode: Mode, f: impl Fn(&Round) -> f64) -> Vec<f64> {
    rounds
        .iter()
        .flat_map(|r| r.iter().filter(|(m, _)| *m == mode).map(|(_, x)| f(x)))
        .collect()
}

/// One row of the table: `f` of each round per mode, the median with every round's figure
/// in brackets, and (`ratio`) standby/local and tls/plain.
fn print_row(
    rounds: &[Vec<(Mode, Round)>],
    label: &str,
    f: &dyn Fn(&Round) -> f64,
    (prec, ratio): (usize, bool),
    raw: &str,
) {
    let v: Vec<f64> = MODES.iter().map(|m| median(of(rounds, *m, f))).collect();
    let cells: Vec<String> = MODES
        .iter()
        .zip(&v)
        .map(|(m, med)| {
            let all: Vec<String> = of(rounds, *m, f)
                .iter()
                .map(|x| format!("{x:.prec$}"))
                .collect();
            if med.is_nan() {
                "-".to_owned()
            } else {
                format!("{med:.prec$} ({})", all.join("/"))
            }
        })
        .collect();
    let r = if ratio {
        format!("{:.2} | {:.2}", v[2] / v[1], v[3] / v[2])
    } else {
        " | ".to_owned()
    };
    println!("| {label} | {} | {r} | {raw} |", cells.join(" | "));
}

/// The primary's and the standby's own figures: label, figure, decimals.
type Extra = (&'static str, fn(&Round) -> f64, usize);

const EXTRA: [Extra; 6] = [
    (
        "standby apply during the burst, batches/s",
        |x| x.burst.apply_rate,
        0,
    ),
    (
        "standby max lag during the burst, lsns",
        |x| x.burst.max_lag,
        0,
    ),
    (
        "standby caught up after the burst's last result, ms",
        |x| x.burst.catch_up_ms,
        0,
    ),
    (
        "batches per WAL fdatasync (primary, round)",
        |x| x.batches_per_sync,
        1,
    ),
    (
        "replicate wait p50 ms (primary, bucket bound)",
        |x| x.replicate.0,
        1,
    ),
    (
        "replicate wait p99 ms (primary, bucket bound)",
        |x| x.replicate.1,
        1,
    ),
];

fn print_table(rounds: &[Vec<(Mode, Round)>], sz: &RepSizes, sync: f64) {
    println!();
    println!(
        "medians of {} rounds (each round's figure in brackets)",
        sz.rounds
    );
    println!("| measure | alone | ack=local | ack=standby | standby+tls | standby/local | tls/plain | raw disk |");
    println!("|---|---|---|---|---|---|---|---|");
    let raw = format!("{sync:.0} fdatasync/s");
    let burst = format!("burst of {} files, batches/s", sz.burst);
    print_row(rounds, &burst, &|x| x.burst.rate, (0, true), &raw);
    for (i, c) in sz.clients.iter().enumerate() {
        let cell = move |x: &Round| x.cells.get(i).copied();
        let rate = move |x: &Round| cell(x).map_or(f64::NAN, |c| c.rate);
        let p50 = move |x: &Round| cell(x).map_or(f64::NAN, |c| c.p50);
        let p99 = move |x: &Round| cell(x).map_or(f64::NAN, |c| c.p99);
        let label = format!("{c} closed-loop clients, batches/s");
        print_row(rounds, &label, &rate, (0, true), &raw);
        print_row(rounds, &format!("{c} clients, p50 ms"), &p50, (1, true), "");
        print_row(rounds, &format!("{c} clients, p99 ms"), &p99, (1, true), "");
    }
    for (label, f, prec) in EXTRA {
        print_row(rounds, label, &f, (prec, false), "");
    }
}
