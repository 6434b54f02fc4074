//! The read commands: `get`, `scan`, `audit`, `wal dump`. They open the files read-only and
//! without a lock, so they work beside a running daemon (a frame being written is seen as a
//! torn tail and left out) and when it is stopped. Records are decoded by
//! `pipeline::records`, the same decoder recovery uses, so damage is a typed corruption
//! (exit 65) naming the file, offset or lsn; these commands never write.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use roost_shards::{Shard, ShardOptions};
use roost_wal::{Record, Wal, WalOptions};

use crate::config::Config;
use crate::error::{CommandError, EXIT_FAILED, EXIT_OK};
use crate::layout::{AUDIT_DIR, SHARDS_DIR, WAL_DIR};
use crate::pipeline::records::{
    read_audit, read_wal_frames, ClaimRecord, DoneRecord, PlannedOp, RejectedRecord, WalEntry,
};

/// `roost get SHARD ID`: the record as one JSON line, or exit 1 if there is none.
pub(super) fn get(cfg: &Config, shard: &str, id: u64) -> anyhow::Result<i32> {
    let s = open_shard_read_only(cfg, shard)?;
    match s
        .get(id)
        .with_context(|| format!("reading id {id} of shard {shard}"))?
    {
        Some(rec) => {
            super::output::out(&format!("{}\n", record_line(shard, id, &rec)))?;
            Ok(EXIT_OK)
        }
        None => {
            let _ = writeln!(std::io::stderr(), "roost: no record {id} on shard {shard}");
            Ok(EXIT_FAILED)
        }
    }
}

/// `roost scan SHARD`: every record as JSON lines, in id order.
pub(super) fn scan(cfg: &Config, shard: &str) -> anyhow::Result<i32> {
    let s = open_shard_read_only(cfg, shard)?;
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

/// `roost audit`: one JSON line per audit row.
pub(super) fn audit(cfg: &Config, from: u64) -> anyhow::Result<i32> {
    let dir = cfg.data_dir.join(AUDIT_DIR);
    let wal = open_wal_read_only(&dir)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for row in read_audit(&wal, 1) {
        let (_, a) = row.with_context(|| format!("reading the audit log {}", dir.display()))?;
        if a.claim_lsn < from {
            continue;
        }
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

/// `roost wal dump [--from LSN] [--json]`: one line per batch-WAL record.
pub(super) fn wal_dump(cfg: &Config, from: u64, json: bool) -> anyhow::Result<i32> {
    let dir = cfg.data_dir.join(WAL_DIR);
    let wal = open_wal_read_only(&dir)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for entry in read_wal_frames(&wal, from) {
        let (rec, entry) = entry.with_context(|| format!("reading the wal {}", dir.display()))?;
        let line = match (&entry, json) {
            (WalEntry::Claim(c), true) => claim_json(&rec, c).to_string(),
            (WalEntry::Claim(c), false) => claim_text(&rec, c),
            (WalEntry::Done(d), true) => done_json(&rec, d).to_string(),
            (WalEntry::Done(d), false) => done_text(&rec, d),
            (WalEntry::Rejected(r), true) => rejected_json(&rec, r).to_string(),
            (WalEntry::Rejected(r), false) => rejected_text(&rec, r),
        };
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(EXIT_OK)
}

fn claim_json(rec: &Record, c: &ClaimRecord) -> serde_json::Value {
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
    serde_json::json!({"lsn": rec.lsn, "epoch": rec.epoch, "type": "claim", "request_key": c.request_key, "source": c.source, "fingerprint": format!("{:016x}", c.fingerprint), "claimed_ids": claimed, "ops": ops})
}

fn claim_text(rec: &Record, c: &ClaimRecord) -> String {
    let ops: Vec<String> = c
        .ops
        .iter()
        .map(|op| format!("{} {} {}", op.kind().as_str(), op.shard(), op.id()))
        .collect();
    format!(
        "lsn {} epoch {} claim key={:?} source={:?} ops=[{}]",
        rec.lsn,
        rec.epoch,
        c.request_key,
        c.source,
        ops.join(", ")
    )
}

fn rejected_json(rec: &Record, r: &RejectedRecord) -> serde_json::Value {
    serde_json::json!({"lsn": rec.lsn, "epoch": rec.epoch, "type": "rejected", "request_key": r.request_key, "source": r.source, "fingerprint": format!("{:016x}", r.fingerprint), "op_index": r.op_index, "reason": r.reason})
}

fn rejected_text(rec: &Record, r: &RejectedRecord) -> String {
    format!(
        "lsn {} epoch {} rejected key={:?} source={:?} op_index={} reason={:?}",
        rec.lsn, rec.epoch, r.request_key, r.source, r.op_index, r.reason
    )
}

fn done_json(rec: &Record, d: &DoneRecord) -> serde_json::Value {
    serde_json::json!({"lsn": rec.lsn, "epoch": rec.epoch, "type": "done", "claim_lsn": d.claim_lsn})
}

fn done_text(rec: &Record, d: &DoneRecord) -> String {
    format!(
        "lsn {} epoch {} done claim_lsn={}",
        rec.lsn, rec.epoch, d.claim_lsn
    )
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

/// Opens a shard for reading. A shard the configuration declares (or any valid name when it
/// declares none: shards are created on first use) is empty until its first commit, so a
/// missing directory reads as no records; a name the configuration does not declare and
/// that has no directory is a usage error (exit 2). A directory that exists is read even if
/// the configuration no longer declares it: its records are there.
fn open_shard_read_only(cfg: &Config, shard: &str) -> anyhow::Result<Shard> {
    if !crate::batch::valid_shard_name(shard) {
        return Err(CommandError::usage(format!(
            "shard name {shard:?} must match [a-z0-9][a-z0-9_-]{{0,63}}"
        ))
        .into());
    }
    let dir = cfg.data_dir.join(SHARDS_DIR).join(shard);
    if cfg.shard(shard).is_none() && !dir.exists() {
        return Err(CommandError::usage(format!(
            "shard {shard} is not declared in the configuration (and {} does not exist)",
            dir.display()
        ))
        .into());
    }
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
