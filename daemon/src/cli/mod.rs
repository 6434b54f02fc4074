//! The `roost` command line (a public contract: commands and flags are only ever added).
//! Exit codes follow sysexits(3) so systemd can tell a restart that may help from one that
//! cannot (see `systemd/roost.service`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pipeline::records::{
    self as codec, AuditRecord, ClaimRecord, DoneRecord, PlannedOp, RecordType,
};
use anyhow::{anyhow, bail, Context};
use clap::{Parser, Subcommand};
use roost_shards::{Shard, ShardOptions};
use roost_wal::storage::RealStorage;
use roost_wal::{Wal, WalOptions};

use crate::batch::{BatchResult, Status};
use crate::config::Config;
use crate::error::EngineError;
use crate::layout::{AUDIT_DIR, SHARDS_DIR, WAL_DIR};
use crate::pipeline::{Engine, EngineOptions};
use crate::spool::SpoolPaths;

pub const EXIT_OK: i32 = 0;
/// `submit --wait`: some batch rejected or conflicted; `verify`: a violation; `get`: not found.
pub const EXIT_FAILED: i32 = 1;
/// `submit --wait`: invalid input or an error; also clap's usage errors.
pub const EXIT_INVALID: i32 = 2;
/// Damage found on disk: a restart cannot fix it (EX_DATAERR).
pub const EXIT_CORRUPTION: i32 = 65;
/// An I/O failure latched the pipeline; a restart replays and repairs (EX_IOERR).
pub const EXIT_IO: i32 = 74;
/// Another roost holds the data directory (EX_TEMPFAIL).
pub const EXIT_LOCKED: i32 = 75;
/// The configuration is wrong (EX_CONFIG).
pub const EXIT_CONFIG: i32 = 78;

#[derive(Debug, Parser)]
#[command(
    name = "roost",
    version,
    about = "roost: a write-ahead-log batch-apply daemon.\n\nClients drop batch files into a spool directory; roost plans each batch, claims its ids in a checksummed WAL, commits one atomic transaction per shard and writes a result file. It survives kill -9 and power loss without losing an acknowledged batch or creating a record twice."
)]
pub struct Cli {
    /// TOML configuration file (see examples/roost.toml). Without it, the embedded default.
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
    Serve,
    /// Deliver batch files safely (tmp/, fsync, rename into new/, fsync the directory).
    Submit {
        /// Wait for each result and print it; exit 0 if all committed, 1 if any was rejected
        /// or conflicted, 2 on invalid input or error.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up after this many seconds (exit 2).
        #[arg(long, value_name = "SECS", default_value_t = 60)]
        timeout: u64,
        #[arg(required = true, value_name = "FILE")]
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
    /// Print the audit rows as JSON lines.
    Audit,
    /// Check every checksum and the spec's invariants on a data directory; exit 0 only if all
    /// hold.
    Verify,
    /// The crash-recovery drill: run `roost serve` as a child, stream batches, kill it with
    /// SIGKILL at random moments and at named crash points, restart it, and check the
    /// invariants after every restart. Exit 1 on any violation.
    Drill {
        /// Number of batches to stream.
        #[arg(long, default_value_t = 200)]
        batches: usize,
        /// Number of kills.
        #[arg(long, default_value_t = 6)]
        kills: usize,
        /// Seed: the same seed gives the same batches and kill schedule.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Inspect the write-ahead log.
    Wal {
        #[command(subcommand)]
        command: WalCommand,
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

/// The configuration the flags and file describe.
pub fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut cfg = match &cli.config {
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

/// Maps an error to the process exit code.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(ee) = cause.downcast_ref::<EngineError>() {
            return match ee {
                _ if ee.is_corruption() => EXIT_CORRUPTION,
                EngineError::Locked { .. } => EXIT_LOCKED,
                _ => EXIT_IO,
            };
        }
        if cause.downcast_ref::<crate::config::ConfigError>().is_some() {
            return EXIT_CONFIG;
        }
    }
    EXIT_FAILED
}

pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let cfg = load_config(&cli)?;
    match &cli.command {
        Command::Serve => serve(cfg),
        Command::Submit {
            wait,
            timeout,
            files,
        } => submit(&cfg, *wait, Duration::from_secs(*timeout), files),
        Command::Status { json, metrics } => {
            let path = crate::ops::control::socket_path(&cfg);
            let what = if *metrics { "metrics" } else { "status" };
            let text = crate::ops::control::request(&path, what).with_context(|| {
                format!(
                    "roost is not running, or not on this data directory (control socket {})",
                    path.display()
                )
            })?;
            if *json || *metrics {
                print!("{text}");
            } else {
                let v: serde_json::Value =
                    serde_json::from_str(&text).context("reading the status answer")?;
                println!(
                    "roost: {}",
                    if v["healthy"] == true {
                        "serving"
                    } else {
                        "UNHEALTHY"
                    }
                );
                println!(
                    "  epoch {}, last lsn {}, {} batches in flight",
                    v["epoch"], v["last_lsn"], v["in_flight"]
                );
                println!("  since start: {} committed, {} rejected, {} invalid, {} conflict, {} duplicate", v["committed"], v["rejected"], v["invalid"], v["conflict"], v["duplicate"]);
                println!(
                    "  wal: {} appends, {} syncs ({:.1} records, {:.1} batches per sync)",
                    v["wal_appends"],
                    v["wal_syncs"],
                    v["wal_records_per_sync"].as_f64().unwrap_or(0.0),
                    v["wal_batches_per_sync"].as_f64().unwrap_or(0.0)
                );
                println!(
                    "  results: {} published in {} rounds ({:.1} per round)",
                    v["results_published"],
                    v["result_rounds"],
                    v["results_per_round"].as_f64().unwrap_or(0.0)
                );
                let ms = |phase: &str, q: &str| {
                    v["latency_ms"][phase][q]
                        .as_f64()
                        .map_or("-".to_owned(), |x| format!("{x}"))
                };
                println!(
                    "  latency p50/p99 (bucket bounds, ms): plan {}/{}, claim {}/{}, commit {}/{}, finish {}/{}, to result {}/{}",
                    ms("plan", "p50"), ms("plan", "p99"),
                    ms("claim", "p50"), ms("claim", "p99"),
                    ms("commit", "p50"), ms("commit", "p99"),
                    ms("finish", "p50"), ms("finish", "p99"),
                    ms("batch", "p50"), ms("batch", "p99"),
                );
                if let Some(m) = v["shards"].as_object() {
                    for (k, n) in m {
                        println!("  shard {k}: {n} records");
                    }
                }
                let r = &v["recovery"];
                println!("  last recovery: {} ms, {} records replayed, {} batches finished, {} bytes truncated", r["duration_ms"], r["records_replayed"], r["batches_finished"], r["bytes_truncated"]);
            }
            Ok(EXIT_OK)
        }
        Command::Get { shard, id } => {
            let s = open_shard_read_only(&cfg, shard)?;
            match s
                .get(*id)
                .with_context(|| format!("reading shard {shard}"))?
            {
                Some(rec) => {
                    println!("{}", record_line(shard, *id, &rec));
                    Ok(EXIT_OK)
                }
                None => {
                    eprintln!("roost: no record {id} on shard {shard}");
                    Ok(EXIT_FAILED)
                }
            }
        }
        Command::Scan { shard } => {
            let s = open_shard_read_only(&cfg, shard)?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for (id, rec) in s
                .scan()
                .with_context(|| format!("scanning shard {shard}"))?
            {
                writeln!(out, "{}", record_line(shard, id, &rec))?;
            }
            out.flush()?;
            Ok(EXIT_OK)
        }
        Command::Audit => {
            let wal = open_wal_read_only(&cfg.data_dir.join(AUDIT_DIR))?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            for rec in wal.replay(1) {
                let rec = rec?;
                let a: AuditRecord = codec::decode("audit", &rec.payload)
                    .with_context(|| format!("audit lsn {}", rec.lsn))?;
                let line = AuditLine {
                    lsn: a.claim_lsn,
                    request_key: &a.request_key,
                    op_index: a.op_index,
                    op: a.op.as_str(),
                    shard: &a.shard,
                    id: a.id,
                };
                writeln!(out, "{}", serde_json::to_string(&line)?)?;
            }
            out.flush()?;
            Ok(EXIT_OK)
        }
        Command::Verify => {
            let report = crate::ops::verify::verify(RealStorage::shared(), &cfg.data_dir);
            println!("roost verify {}", cfg.data_dir.display());
            for line in &report.checked {
                println!("  checked {line}");
            }
            for v in &report.violations {
                println!("  VIOLATION {v}");
            }
            println!(
                "{}",
                if report.ok() {
                    "all invariants hold"
                } else {
                    "FAILED"
                }
            );
            Ok(if report.ok() { EXIT_OK } else { EXIT_FAILED })
        }
        Command::Wal {
            command: WalCommand::Dump { from, json },
        } => wal_dump(&cfg, *from, *json),
        Command::Drill {
            batches,
            kills,
            seed,
        } => {
            // A scratch directory unless --data-dir was given; the drill's daemon gets
            // <dir>/data.
            let dir = match &cli.data_dir {
                Some(d) => d.clone(),
                None => tempfile_dir()?,
            };
            let violations = crate::ops::drill::run(&crate::ops::drill::DrillOptions {
                data_dir: dir.clone(),
                batches: *batches,
                kills: *kills,
                seed: *seed,
            })?;
            println!("drill directory: {}", dir.display());
            Ok(if violations == 0 {
                EXIT_OK
            } else {
                EXIT_FAILED
            })
        }
    }
}

/// Refuses a data directory that someone else could write: another owner, or group- or
/// world-writable. The spool may be group-writable (clients write `tmp/` and `new/`); the
/// WAL, audit log and shards may not.
pub fn check_permissions(data_dir: &Path) -> Result<(), crate::config::ConfigError> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    for d in [
        data_dir.to_path_buf(),
        data_dir.join(WAL_DIR),
        data_dir.join(AUDIT_DIR),
        data_dir.join(SHARDS_DIR),
    ] {
        let Ok(m) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        let bad = if m.file_type().is_symlink() {
            Some("is a symbolic link".to_owned())
        } else if m.uid() != me {
            Some(format!(
                "is owned by uid {}, but roost runs as uid {me}",
                m.uid()
            ))
        } else if m.mode() & 0o022 != 0 {
            Some(format!(
                "is writable by other users (mode {:o}); run: chmod go-w {}",
                m.mode() & 0o7777,
                d.display()
            ))
        } else {
            None
        };
        if let Some(why) = bad {
            return Err(crate::config::ConfigError::Invalid(format!(
                "refusing data directory: {} {why}",
                d.display()
            )));
        }
    }
    Ok(())
}

fn serve(cfg: Config) -> anyhow::Result<i32> {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(cfg.umask));
    check_permissions(&cfg.data_dir)?;
    let data_dir = cfg.data_dir.clone();
    let crash = crate::pipeline::crash::EnvCrash::from_env()
        .map_err(|e| crate::config::ConfigError::Invalid(format!("ROOST_CRASH_AT: {e}")))?;
    crate::ops::notify::status("recovering: opening the data directory");
    // A progress bar when a person is watching; STATUS= (at most once a second) for systemd.
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "recovery: {msg} [{bar:40}] {pos}/{len} ({elapsed})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let last_status = std::cell::Cell::new(Instant::now() - Duration::from_secs(2));
    let progress = |phase: &str, done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_message(phase.to_owned());
            b.set_length(total);
            b.set_position(done);
        }
        if last_status.get().elapsed() >= Duration::from_secs(1) {
            last_status.set(Instant::now());
            crate::ops::notify::status(&format!("recovering: {phase} {done}/{total}"));
        }
    };
    let engine = Engine::open_with_progress(
        EngineOptions {
            storage: RealStorage::shared(),
            config: Arc::new(cfg),
            crash: Arc::new(crash),
        },
        &progress,
    )
    .map_err(|e| {
        crate::ops::notify::status(&format!("failed: {e}"));
        e
    })
    .with_context(|| format!("opening data directory {}", data_dir.display()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    crate::serve::serve(Arc::new(engine)).context("serving")?;
    Ok(EXIT_OK)
}

/// `{"shard":..,"id":..,"record":{..}}`, fields in the documented order.
#[derive(serde::Serialize)]
struct RecordLine<'a> {
    shard: &'a str,
    id: u64,
    record: serde_json::Value,
}

/// `{"lsn":..,"request_key":..,"op_index":..,"op":..,"shard":..,"id":..}`; `lsn` is the
/// batch's claim lsn.
#[derive(serde::Serialize)]
struct AuditLine<'a> {
    lsn: u64,
    request_key: &'a str,
    op_index: u32,
    op: &'a str,
    shard: &'a str,
    id: u64,
}

fn record_line(shard: &str, id: u64, rec: &[u8]) -> String {
    // Records are canonical JSON written by roost and checksummed; a record that does not
    // parse is shown as a string rather than hidden.
    let record = serde_json::from_slice(rec)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(rec).into_owned()));
    serde_json::to_string(&RecordLine { shard, id, record }).unwrap_or_default()
}

fn open_shard_read_only(cfg: &Config, shard: &str) -> anyhow::Result<Shard> {
    if !crate::batch::valid_shard_name(shard) {
        bail!("shard name {shard:?} must match [a-z0-9][a-z0-9_-]{{0,63}}");
    }
    let dir = cfg.data_dir.join(SHARDS_DIR).join(shard);
    if !dir.is_dir() {
        bail!("no shard {shard} in {}", cfg.data_dir.display());
    }
    // Plain reads, no lock: works beside a running daemon (a frame being written is seen as
    // a torn tail and left out) and when it is stopped.
    Shard::open(
        &dir,
        ShardOptions {
            read_only: true,
            ..ShardOptions::default()
        },
    )
    .with_context(|| format!("opening shard {}", dir.display()))
}

fn open_wal_read_only(dir: &Path) -> anyhow::Result<Wal> {
    Wal::open(
        dir,
        WalOptions {
            read_only: true,
            payload_bytes_max: 128 << 20,
            segment_bytes: 256 << 20,
            ..WalOptions::default()
        },
    )
    .with_context(|| format!("opening {}", dir.display()))
}

fn wal_dump(cfg: &Config, from: u64, json: bool) -> anyhow::Result<i32> {
    let wal = open_wal_read_only(&cfg.data_dir.join(WAL_DIR))?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for rec in wal.replay(from) {
        let rec = rec?;
        let ty = RecordType::from_u8(rec.record_type);
        let ctx = || {
            format!(
                "wal lsn {} ({}:{})",
                rec.lsn,
                rec.segment.display(),
                rec.offset
            )
        };
        match ty {
            Some(RecordType::Claim) => {
                let c: ClaimRecord = codec::decode("claim", &rec.payload).with_context(ctx)?;
                if json {
                    let ops: Vec<serde_json::Value> = c
                        .ops
                        .iter()
                        .map(|op| match op {
                            PlannedOp::Create { shard, id, record } => serde_json::json!({"op": "create", "shard": shard, "id": id, "record": serde_json::from_slice::<serde_json::Value>(record).unwrap_or_default()}),
                            PlannedOp::Delete { shard, id } => serde_json::json!({"op": "delete", "shard": shard, "id": id}),
                        })
                        .collect();
                    let claimed: Vec<u64> = c
                        .ops
                        .iter()
                        .filter(|o| matches!(o, PlannedOp::Create { .. }))
                        .map(PlannedOp::id)
                        .collect();
                    writeln!(
                        out,
                        "{}",
                        serde_json::json!({"lsn": rec.lsn, "epoch": rec.epoch, "type": "claim", "request_key": c.request_key, "source": c.source, "fingerprint": format!("{:016x}", c.fingerprint), "claimed_ids": claimed, "ops": ops})
                    )?;
                } else {
                    let ops: Vec<String> = c
                        .ops
                        .iter()
                        .map(|op| format!("{} {} {}", op.kind().as_str(), op.shard(), op.id()))
                        .collect();
                    writeln!(
                        out,
                        "lsn {} epoch {} claim key={:?} source={:?} ops=[{}]",
                        rec.lsn,
                        rec.epoch,
                        c.request_key,
                        c.source,
                        ops.join(", ")
                    )?;
                }
            }
            Some(RecordType::Done) => {
                let d: DoneRecord = codec::decode("done", &rec.payload).with_context(ctx)?;
                if json {
                    writeln!(
                        out,
                        "{}",
                        serde_json::json!({"lsn": rec.lsn, "epoch": rec.epoch, "type": "done", "claim_lsn": d.claim_lsn})
                    )?;
                } else {
                    writeln!(
                        out,
                        "lsn {} epoch {} done claim_lsn={}",
                        rec.lsn, rec.epoch, d.claim_lsn
                    )?;
                }
            }
            _ => {
                return Err(anyhow!(
                    "{}: unknown record type {}",
                    ctx(),
                    rec.record_type
                ))
            }
        }
    }
    out.flush()?;
    Ok(EXIT_OK)
}

fn submit(cfg: &Config, wait: bool, timeout: Duration, files: &[PathBuf]) -> anyhow::Result<i32> {
    let sp = SpoolPaths::new(&cfg.spool_dir());
    for d in [&sp.tmp, &sp.new] {
        if !d.is_dir() {
            bail!("spool directory {} does not exist (is `roost serve` set up with this --data-dir/--spool-dir?)", d.display());
        }
    }
    let mut names = Vec::new();
    for f in files {
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let base = f
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| crate::spool::valid_spool_name(n))
            .ok_or_else(|| anyhow!("{}: not a usable file name", f.display()))?;
        let name = free_name(&sp, base);
        let tmp = sp.tmp.join(format!(".{name}.{}", std::process::id()));
        {
            let mut o = std::fs::File::options()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .with_context(|| format!("creating {}", tmp.display()))?;
            o.write_all(&bytes)?;
            o.sync_all()
                .with_context(|| format!("syncing {}", tmp.display()))?;
        }
        std::fs::rename(&tmp, sp.new.join(&name))
            .with_context(|| format!("renaming into {}", sp.new.display()))?;
        std::fs::File::open(&sp.new)?
            .sync_all()
            .with_context(|| format!("syncing {}", sp.new.display()))?;
        eprintln!("submitted {} as {}", f.display(), name);
        names.push(name);
    }
    if !wait {
        return Ok(EXIT_OK);
    }
    let deadline = Instant::now() + timeout;
    let mut code = EXIT_OK;
    for name in names {
        let out = sp.out.join(&name);
        let text = loop {
            match std::fs::read_to_string(&out) {
                Ok(t) => break Some(t),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(_) => break None,
            }
        };
        let Some(text) = text else {
            eprintln!("roost: no result for {name} within {} s", timeout.as_secs());
            code = EXIT_INVALID;
            continue;
        };
        print!("{text}");
        match serde_json::from_str::<BatchResult>(&text).map(|r| r.status()) {
            Ok(Status::Committed) => {}
            Ok(Status::Rejected | Status::Conflict) => code = code.max(EXIT_FAILED),
            Ok(Status::Invalid) | Err(_) => code = EXIT_INVALID,
        }
    }
    Ok(code)
}

/// A fresh scratch directory under the system temporary directory.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    for n in 0..1000u32 {
        let d = base.join(format!("roost-drill-{}-{n}", std::process::id()));
        if std::fs::create_dir(&d).is_ok() {
            return Ok(d);
        }
    }
    bail!("cannot create a scratch directory in {}", base.display())
}

/// The file's own name unless new/, out/ or failed/ already has it; then NAME-1, NAME-2, ...
fn free_name(sp: &SpoolPaths, base: &str) -> String {
    let taken = |n: &str| {
        [&sp.new, &sp.out, &sp.failed]
            .iter()
            .any(|d| d.join(n).symlink_metadata().is_ok())
    };
    if !taken(base) {
        return base.to_owned();
    }
    let (stem, ext) = match base.rsplit_once('.') {
        Some((s, e)) if !s.is_empty() => (s, format!(".{e}")),
        _ => (base, String::new()),
    };
    (1u64..)
        .map(|n| format!("{stem}-{n}{ext}"))
        .find(|n| !taken(n))
        .unwrap_or_else(|| base.to_owned())
}
