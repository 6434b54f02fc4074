//! `roost verify`: an offline check of a data directory. Opens everything read-only (so it
//! also works beside a running daemon, seeing a consistent prefix), verifies every checksum,
//! and checks the invariants of RoostApplyBatch.tla that can be read off the files. Never
//! writes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use crate::pipeline::records::{
    self as codec, AuditRecord, ClaimRecord, DoneRecord, PlannedOp, RecordType,
};
use roost_shards::{Shard, ShardOptions};
use roost_wal::storage::Storage;
use roost_wal::{Lsn, Wal, WalOptions};

use crate::layout::{AUDIT_DIR, SHARDS_DIR, WAL_DIR};

#[derive(Debug, Default)]
pub struct VerifyReport {
    /// What was checked, with counts, one line each.
    pub checked: Vec<String>,
    /// Every violation found; empty means all hold.
    pub violations: Vec<String>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// One shard's frames: lsn -> (ids created, ids deleted).
type HeldFrames = BTreeMap<Lsn, (Vec<u64>, Vec<u64>)>;

fn read_only() -> WalOptions {
    WalOptions {
        read_only: true,
        payload_bytes_max: 128 << 20,
        segment_bytes: 256 << 20,
        ..WalOptions::default()
    }
}

/// Runs every check. Errors opening or decoding are violations, not early returns.
pub fn verify(storage: Arc<dyn Storage>, data_dir: &Path) -> VerifyReport {
    let mut r = VerifyReport::default();
    let mut claims: BTreeMap<Lsn, ClaimRecord> = BTreeMap::new();
    let mut done: BTreeSet<Lsn> = BTreeSet::new();
    let mut wal_records = 0u64;
    match Wal::open_with(storage.clone(), data_dir.join(WAL_DIR), read_only()) {
        Err(e) => r.violations.push(format!("wal: {e}")),
        Ok(wal) => {
            for rec in wal.replay(1) {
                let rec = match rec {
                    Ok(rec) => rec,
                    Err(e) => {
                        r.violations.push(format!("wal: {e}"));
                        break;
                    }
                };
                wal_records += 1;
                match RecordType::from_u8(rec.record_type) {
                    Some(RecordType::Claim) => {
                        match codec::decode::<ClaimRecord>("claim", &rec.payload) {
                            Ok(c) => {
                                claims.insert(rec.lsn, c);
                            }
                            Err(e) => r.violations.push(format!("wal lsn {}: {e}", rec.lsn)),
                        }
                    }
                    Some(RecordType::Done) => {
                        match codec::decode::<DoneRecord>("done", &rec.payload) {
                            Ok(d) => {
                                done.insert(d.claim_lsn);
                            }
                            Err(e) => r.violations.push(format!("wal lsn {}: {e}", rec.lsn)),
                        }
                    }
                    _ => r.violations.push(format!(
                        "wal lsn {}: unknown record type {}",
                        rec.lsn, rec.record_type
                    )),
                }
            }
            let torn = wal.recovery_report().torn_bytes_truncated;
            r.checked.push(format!(
                "wal: {wal_records} records checksummed ({} claims, {} done), torn tail {torn} bytes",
                claims.len(),
                done.len()
            ));
        }
    }
    let mut audit: Vec<AuditRecord> = Vec::new();
    match Wal::open_with(storage.clone(), data_dir.join(AUDIT_DIR), read_only()) {
        Err(e) => r.violations.push(format!("audit: {e}")),
        Ok(a) => {
            for rec in a.replay(1) {
                match rec.map_err(|e| e.to_string()).and_then(|rec| {
                    codec::decode::<AuditRecord>("audit", &rec.payload)
                        .map_err(|e| format!("lsn {}: {e}", rec.lsn))
                }) {
                    Ok(row) => audit.push(row),
                    Err(e) => {
                        r.violations.push(format!("audit: {e}"));
                        break;
                    }
                }
            }
            r.checked
                .push(format!("audit: {} rows checksummed", audit.len()));
        }
    }
    // Shards: every one the WAL names, plus every directory on disk.
    let mut names: BTreeSet<String> = claims
        .values()
        .flat_map(|c| c.ops.iter().map(|o| o.shard().to_owned()))
        .collect();
    if let Ok(rd) = std::fs::read_dir(data_dir.join(SHARDS_DIR)) {
        names.extend(
            rd.flatten()
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().to_str().map(str::to_owned)),
        );
    }
    // What recovery trusts as flushed per shard (the engine's rule): frames up to the last
    // claim with a `done` record; a gap among later frames is a torn tail, not corruption.
    let mut synced: BTreeMap<&str, Lsn> = BTreeMap::new();
    for lsn in &done {
        if let Some(c) = claims.get(lsn) {
            for op in &c.ops {
                let t = synced.entry(op.shard()).or_insert(0);
                *t = (*t).max(*lsn);
            }
        }
    }
    let mut held: BTreeMap<String, HeldFrames> = BTreeMap::new();
    let mut frames = 0usize;
    for name in &names {
        let dir = data_dir.join(SHARDS_DIR).join(name);
        let opts = ShardOptions {
            read_only: true,
            synced_through_lsn: Some(synced.get(name.as_str()).copied().unwrap_or(0)),
            ..ShardOptions::default()
        };
        match Shard::open_with(storage.clone(), &dir, opts).and_then(|s| s.frame_summaries()) {
            Err(e) => r.violations.push(format!("shard {name}: {e}")),
            Ok(fs) => {
                frames += fs.len();
                held.insert(
                    name.clone(),
                    fs.into_iter()
                        .map(|f| (f.lsn, (f.creates, f.deletes)))
                        .collect(),
                );
            }
        }
    }
    r.checked.push(format!(
        "shards: {} shards, {frames} transaction frames checksummed",
        held.len()
    ));

    // AtMostOnePerCreate, read off the files: every id is created by at most one frame in all
    // shards, and every request key has at most one claim (a second claim for the same key is
    // what a retry without its claim produces).
    let mut creators: HashMap<u64, Vec<(String, Lsn)>> = HashMap::new();
    for (name, fs) in &held {
        for (lsn, (creates, _)) in fs {
            for id in creates {
                creators.entry(*id).or_default().push((name.clone(), *lsn));
            }
        }
    }
    let mut dup_ids = 0;
    for (id, who) in &creators {
        if who.len() > 1 {
            dup_ids += 1;
            r.violations.push(format!(
                "AtMostOnePerCreate: id {id} created {} times: {who:?}",
                who.len()
            ));
        }
    }
    let mut by_key: HashMap<&str, Vec<Lsn>> = HashMap::new();
    for (lsn, c) in &claims {
        by_key.entry(&c.request_key).or_default().push(*lsn);
    }
    for (key, lsns) in &by_key {
        if lsns.len() > 1 {
            let landed: Vec<&Lsn> = lsns
                .iter()
                .filter(|l| held.values().any(|fs| fs.contains_key(l)))
                .collect();
            r.violations.push(format!(
                "AtMostOnePerCreate: request key {key:?} claimed {} times (lsns {lsns:?}, {} with shard effects)",
                lsns.len(),
                landed.len()
            ));
        }
    }
    let mut claimed_ids: HashMap<u64, Lsn> = HashMap::new();
    for (lsn, c) in &claims {
        for op in &c.ops {
            if let PlannedOp::Create { id, .. } = op {
                if let Some(other) = claimed_ids.insert(*id, *lsn) {
                    r.violations.push(format!(
                        "id {id} claimed by lsn {other} and lsn {lsn}: ids must never be reused"
                    ));
                }
            }
        }
    }
    r.checked.push(format!(
        "AtMostOnePerCreate: {} created ids, {} claimed ids, {} request keys; {dup_ids} duplicates",
        creators.len(),
        claimed_ids.len(),
        by_key.len()
    ));

    // NoPartialShard: every frame is exactly its claim's ops for that shard.
    let mut partial = 0;
    for (name, fs) in &held {
        for (lsn, (creates, deletes)) in fs {
            let Some(c) = claims.get(lsn) else {
                partial += 1;
                r.violations.push(format!(
                    "shard {name} holds lsn {lsn}, which no claim in the wal has"
                ));
                continue;
            };
            let want_c: Vec<u64> = c
                .ops
                .iter()
                .filter(|o| o.shard() == name && matches!(o, PlannedOp::Create { .. }))
                .map(PlannedOp::id)
                .collect();
            let want_d: Vec<u64> = c
                .ops
                .iter()
                .filter(|o| o.shard() == name && matches!(o, PlannedOp::Delete { .. }))
                .map(PlannedOp::id)
                .collect();
            if &want_c != creates || &want_d != deletes {
                partial += 1;
                r.violations.push(format!("NoPartialShard: shard {name} lsn {lsn} holds creates {creates:?} deletes {deletes:?}, claim says {want_c:?} {want_d:?}"));
            }
        }
    }
    r.checked.push(format!(
        "NoPartialShard: {frames} frames match their claims; {partial} do not"
    ));

    // AuditOnlyCommitted.
    let mut bad_audit = 0;
    let mut audited: HashMap<Lsn, BTreeSet<u32>> = HashMap::new();
    for row in &audit {
        audited
            .entry(row.claim_lsn)
            .or_default()
            .insert(row.op_index);
        let ok = held
            .get(&row.shard)
            .is_some_and(|fs| fs.contains_key(&row.claim_lsn));
        if !ok {
            bad_audit += 1;
            r.violations.push(format!("AuditOnlyCommitted: audit row lsn {} op {} on shard {} but the shard does not hold that transaction", row.claim_lsn, row.op_index, row.shard));
        }
    }
    r.checked.push(format!(
        "AuditOnlyCommitted: {} audit rows; {bad_audit} without a committed transaction",
        audit.len()
    ));

    // Every finished batch's effects are present.
    let mut missing = 0;
    for lsn in &done {
        let Some(c) = claims.get(lsn) else {
            missing += 1;
            r.violations
                .push(format!("done record for lsn {lsn} without a claim"));
            continue;
        };
        let shards: BTreeSet<&str> = c.ops.iter().map(PlannedOp::shard).collect();
        for s in shards {
            if !held.get(s).is_some_and(|fs| fs.contains_key(lsn)) {
                missing += 1;
                r.violations.push(format!(
                    "finished batch lsn {lsn} ({:?}): shard {s} lacks its transaction",
                    c.request_key
                ));
            }
        }
        let rows = audited.get(lsn).map_or(0, BTreeSet::len);
        if rows != c.ops.len() {
            missing += 1;
            r.violations.push(format!(
                "finished batch lsn {lsn}: {rows} audit rows for {} ops",
                c.ops.len()
            ));
        }
    }
    r.checked.push(format!(
        "finished batches: {} checked; {missing} missing effects",
        done.len()
    ));
    r
}
