//! `roost verify`: an offline check of a data directory. Opens everything read-only (so it
//! also works beside a running daemon, seeing a consistent prefix), verifies every checksum,
//! and checks the invariants of RoostApplyBatch.tla that can be read off the files. Never
//! writes.
//!
//! One loading step reads the WAL, the audit log and the shards into [`Files`] (every
//! checksum is verified there); then one function per invariant of the spec, named after it,
//! each pushing its violations and one "checked" line. Errors opening or decoding are
//! violations, never early returns: the checks run on whatever could be read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use crate::error::EngineError;
use crate::pipeline::records::{
    decode_checkpoint, decode_key, read_audit, read_wal, AuditRecord, ClaimLedger, ClaimRecord,
    KeyAnswer, PlannedOp, WalEntry,
};
use roost_shards::{Shard, ShardOptions};
use roost_storage::{read_all, OpenMode, Storage};
use roost_wal::{Lsn, Wal, WalOptions};

use crate::layout::{AUDIT_DIR, CHECKPOINT_FILE, KEYS_DIR, SHARDS_DIR, WAL_DIR};

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

    fn violation(&mut self, v: String) {
        self.violations.push(v);
    }
}

/// One shard's frames: lsn -> (ids created, ids deleted).
type HeldFrames = BTreeMap<Lsn, (Vec<u64>, Vec<u64>)>;

/// Everything the checks read, loaded once.
#[derive(Debug, Default)]
struct Files {
    /// Every claim in the batch WAL, finished or not, by lsn.
    claims: BTreeMap<Lsn, ClaimRecord>,
    /// The claim lsns `done` records name (a name without a claim is a violation, reported
    /// by [`retry_converges`]).
    done: BTreeSet<Lsn>,
    /// Per shard, the largest claim lsn a `done` record vouches for: the engine's recovery
    /// rule, from the same [`ClaimLedger`].
    vouched: HashMap<String, Lsn>,
    audit: Vec<AuditRecord>,
    /// Per shard, its transaction frames.
    held: BTreeMap<String, HeldFrames>,
    /// The lsns of recorded rejections (in the WAL or in the key table).
    rejections: BTreeSet<Lsn>,
    /// The last checkpoint's `wal_from`: every batch below it is finished, and the WAL below
    /// it may be gone (1 without a checkpoint).
    wal_from: Lsn,
    /// The WAL's oldest record: claims below it were retired.
    wal_first: Lsn,
    /// Records in the key table.
    key_records: usize,
    /// Per shard, the lsn ranges its compacted segments cover: batches there are finished
    /// and below a checkpoint; their frames were rewritten without what was deleted.
    compacted: BTreeMap<String, Vec<(Lsn, Lsn)>>,
    /// Frames over all shards.
    frames: usize,
}

impl Files {
    /// Whether the WAL record at `lsn` was retired below a checkpoint (its batch finished).
    fn retired(&self, lsn: Lsn) -> bool {
        lsn < self.wal_from && lsn < self.wal_first
    }

    /// Whether `shard` compacted the batch at `lsn` (finished, below a checkpoint).
    fn compacted_at(&self, shard: &str, lsn: Lsn) -> bool {
        self.compacted
            .get(shard)
            .is_some_and(|rs| rs.iter().any(|(lo, hi)| (*lo..=*hi).contains(&lsn)))
    }

    /// Whether `shard` holds the batch at `lsn`: its frame, or a compacted range over it.
    fn holds(&self, shard: &str, lsn: Lsn) -> bool {
        self.held.get(shard).is_some_and(|fs| fs.contains_key(&lsn))
            || self.compacted_at(shard, lsn)
    }
}

/// How an offline reader opens the batch WAL or the audit log: read-only (nothing is cut or
/// created), with limits above any a daemon writes, so a log from any configuration opens.
pub fn offline_wal_options() -> WalOptions {
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
    let mut f = Files::default();
    load_checkpoint(&storage, data_dir, &mut f, &mut r);
    load_wal(&storage, data_dir, &mut f, &mut r);
    load_audit(&storage, data_dir, &mut f, &mut r);
    load_shards(&storage, data_dir, &mut f, &mut r);
    at_most_one_per_create(&f, &mut r);
    no_partial_shard(&f, &mut r);
    rejected_batch_writes_nothing(&f, &mut r);
    audit_only_committed(&f, &mut r);
    retry_converges(&f, &mut r);
    key_index_holds_the_table(&storage, data_dir, &mut r);
    r.checked.push(format!(
        "checkpoint: the wal is replayed from lsn {} (records below lsn {} retired); key table: {} records checksummed",
        f.wal_from, f.wal_first, f.key_records
    ));
    r
}

/// Reads `CHECKPOINT` (if any) and the key table: the WAL below the checkpoint may be gone,
/// and the table says which of those lsns were rejections.
fn load_checkpoint(
    storage: &Arc<dyn Storage>,
    data_dir: &Path,
    f: &mut Files,
    r: &mut VerifyReport,
) {
    f.wal_from = 1;
    let path = data_dir.join(CHECKPOINT_FILE);
    if let Ok(file) = storage.open(&path, OpenMode::Read) {
        match read_all(file.as_ref())
            .map_err(|e| e.to_string())
            .and_then(|b| decode_checkpoint(&b))
        {
            Ok(c) => f.wal_from = c.wal_from,
            Err(e) => r.violation(format!("{}: {e}", path.display())),
        }
    }
    let mut keys = 0;
    if let Some(table) = open_log(storage, data_dir, KEYS_DIR, r) {
        for rec in table.replay(1) {
            match rec
                .map_err(EngineError::from)
                .and_then(|rec| decode_key(&rec))
            {
                Ok(k) => {
                    keys += 1;
                    if matches!(k.answer, KeyAnswer::Rejected { .. }) {
                        f.rejections.insert(k.lsn);
                    }
                }
                Err(e) => {
                    r.violation(format!("key table: {e}"));
                    break;
                }
            }
        }
    }
    f.key_records = keys;
}

/// The key index (`keyindex/`) finds every key table record it covers, and holds nothing
/// else: each record's key is looked up and must be among its candidates, and the runs hold
/// as many entries as the table records in their range. Records past the newest run are
/// ones a crash left unindexed (the next open indexes them): counted, not a violation.
fn key_index_holds_the_table(storage: &Arc<dyn Storage>, data_dir: &Path, r: &mut VerifyReport) {
    let dir = data_dir.join(crate::layout::KEY_INDEX_DIR);
    let index = match roost_keyindex::KeyIndex::open_read_only(storage.clone(), &dir) {
        Ok(Some(ix)) => ix,
        Ok(None) => {
            r.checked
                .push("key index: none yet (the next open builds it from the key table)".into());
            return;
        }
        Err(e) => return r.violation(format!("key index: {e}")),
    };
    let Some(table) = open_log(storage, data_dir, KEYS_DIR, r) else {
        return;
    };
    let (first, last) = (
        index.first_table_lsn().unwrap_or(u64::MAX),
        index.last_table_lsn().unwrap_or(0),
    );
    let (mut found, mut pending, mut bad) = (0u64, 0u64, 0usize);
    for rec in table.replay(1) {
        let k = match rec
            .map_err(EngineError::from)
            .and_then(|rec| decode_key(&rec).map(|k| (rec.lsn, rec.offset, k.request_key)))
        {
            Ok(k) => k,
            Err(e) => return r.violation(format!("key table: {e}")),
        };
        let (lsn, offset, key) = k;
        if lsn < first {
            continue;
        }
        if lsn > last {
            pending += 1;
            continue;
        }
        match index.candidates(key.as_bytes()) {
            Ok(c) if c.contains(&(lsn, offset)) => found += 1,
            Ok(_) if bad < 10 => {
                bad += 1;
                r.violation(format!(
                    "KeyIndexHoldsTheTable: key {key:?} (table lsn {lsn}, offset {offset}) is not in the key index"
                ));
            }
            Ok(_) => {}
            Err(e) => return r.violation(format!("key index: {e}")),
        }
    }
    let entries = index.stats().entries;
    if entries != found && bad == 0 {
        r.violation(format!(
            "KeyIndexHoldsTheTable: the index holds {entries} entries for {found} table records in its range"
        ));
    }
    r.checked.push(format!(
        "KeyIndexHoldsTheTable: {found} key table records found through {} index runs; {pending} past the newest run (indexed at the next open)",
        index.stats().runs
    ));
}

/// Opens the log in `data_dir/name` read-only; a failure is a violation named after the log.
fn open_log(
    storage: &Arc<dyn Storage>,
    data_dir: &Path,
    name: &str,
    r: &mut VerifyReport,
) -> Option<Wal> {
    Wal::open_with(storage.clone(), data_dir.join(name), offline_wal_options())
        .map_err(|e| r.violation(format!("{name}: {e}")))
        .ok()
}

/// Loads the batch WAL, checksumming every record. A record that does not decode is skipped
/// (and reported); a frame that does not check out ends the replay.
fn load_wal(storage: &Arc<dyn Storage>, data_dir: &Path, f: &mut Files, r: &mut VerifyReport) {
    let Some(wal) = open_log(storage, data_dir, WAL_DIR, r) else {
        return;
    };
    let mut ledger = ClaimLedger {
        from: f.wal_from,
        ..ClaimLedger::default()
    };
    f.wal_first = wal.first_lsn();
    let mut wal_records = 0u64;
    for entry in read_wal(&wal, 1) {
        match entry {
            Ok((lsn, WalEntry::Claim(c))) => {
                ledger.claim(lsn, c.clone());
                f.claims.insert(lsn, c);
            }
            Ok((lsn, WalEntry::Rejected(_))) => {
                f.rejections.insert(lsn);
            }
            Ok((lsn, WalEntry::Done(d))) => {
                f.done.insert(d.claim_lsn);
                // A `done` for a claim never seen is reported with the finished batches; one
                // for a claim already finished is damage recovery would refuse too.
                if let Err(e) = ledger.done_after(lsn, &d) {
                    if f.claims.contains_key(&d.claim_lsn) {
                        r.violation(format!("wal: {e}"));
                    }
                }
            }
            Err(EngineError::Codec { lsn, source }) => {
                r.violation(format!("wal lsn {lsn}: {source}"));
            }
            Err(EngineError::Inconsistent { lsn, detail }) => {
                r.violation(format!("wal lsn {lsn}: {detail}"));
            }
            Err(e) => {
                r.violation(format!("wal: {e}"));
                break;
            }
        }
        wal_records += 1;
    }
    f.vouched = ledger.vouched;
    let torn = wal.recovery_report().torn_bytes_truncated;
    r.checked.push(format!(
        "wal: {wal_records} records checksummed ({} claims, {} done), torn tail {torn} bytes",
        f.claims.len(),
        f.done.len()
    ));
}

/// Loads the audit log, checksumming every row; the first that fails ends the replay.
fn load_audit(storage: &Arc<dyn Storage>, data_dir: &Path, f: &mut Files, r: &mut VerifyReport) {
    let Some(audit) = open_log(storage, data_dir, AUDIT_DIR, r) else {
        return;
    };
    for row in read_audit(&audit, 1) {
        match row {
            Ok((_, row)) => f.audit.push(row),
            Err(e) => {
                r.violation(match e {
                    EngineError::Codec { lsn, source } => format!("audit: lsn {lsn}: {source}"),
                    e => format!("audit: {e}"),
                });
                break;
            }
        }
    }
    r.checked
        .push(format!("audit: {} rows checksummed", f.audit.len()));
}

/// Loads every shard the WAL names plus every shard directory on disk, checksumming every
/// frame. A shard trusts as flushed what a `done` record vouches for; a gap among later
/// frames is a torn tail, not corruption.
fn load_shards(storage: &Arc<dyn Storage>, data_dir: &Path, f: &mut Files, r: &mut VerifyReport) {
    let mut names: BTreeSet<String> = f
        .claims
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
    for name in &names {
        let dir = data_dir.join(SHARDS_DIR).join(name);
        let opts = ShardOptions {
            read_only: true,
            index_files: false,
            synced_through_lsn: Some(f.vouched.get(name).copied().unwrap_or(0)),
            ..ShardOptions::default()
        };
        let opened = Shard::open_with(storage.clone(), &dir, opts).and_then(|s| {
            for p in s.index_file_problems() {
                r.violation(format!("shard {name}: index file: {p}"));
            }
            Ok((s.frame_summaries()?, s.compacted_ranges()))
        });
        match opened {
            Err(e) => r.violation(format!("shard {name}: {e}")),
            Ok((fs, ranges)) => {
                f.compacted.insert(name.clone(), ranges);
                f.frames += fs.len();
                let frames = fs.into_iter().map(|s| (s.lsn, (s.creates, s.deletes)));
                f.held.insert(name.clone(), frames.collect());
            }
        }
    }
    r.checked.push(format!(
        "shards: {} shards, {} transaction frames checksummed",
        f.held.len(),
        f.frames
    ));
}

/// `AtMostOnePerCreate`, read off the files: every id is created by at most one frame in all
/// shards, and every request key has at most one claim (a second claim for the same key is
/// what a retry without its claim produces). Also the Claim step's `Fresh \ UsedIds`: no id
/// is claimed twice.
fn at_most_one_per_create(f: &Files, r: &mut VerifyReport) {
    let mut creators: HashMap<u64, Vec<(String, Lsn)>> = HashMap::new();
    for (name, fs) in &f.held {
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
            r.violation(format!(
                "AtMostOnePerCreate: id {id} created {} times: {who:?}",
                who.len()
            ));
        }
    }
    let keys = one_claim_per_request_key(f, r);
    let claimed = claimed_ids_are_fresh(f, r);
    r.checked.push(format!(
        "AtMostOnePerCreate: {} created ids, {claimed} claimed ids, {keys} request keys; {dup_ids} duplicates",
        creators.len(),
    ));
}

/// Every request key has one claim at or after the checkpoint (a claim below it may be of
/// a key that has since left the window, after which the key is a new batch); returns the
/// number of keys.
fn one_claim_per_request_key(f: &Files, r: &mut VerifyReport) -> usize {
    let mut by_key: HashMap<&str, Vec<Lsn>> = HashMap::new();
    for (lsn, c) in f.claims.range(f.wal_from..) {
        by_key.entry(&c.request_key).or_default().push(*lsn);
    }
    for (key, lsns) in &by_key {
        if lsns.len() > 1 {
            let landed = lsns
                .iter()
                .filter(|l| f.held.values().any(|fs| fs.contains_key(l)))
                .count();
            r.violation(format!(
                "AtMostOnePerCreate: request key {key:?} claimed {} times (lsns {lsns:?}, {landed} with shard effects)",
                lsns.len(),
            ));
        }
    }
    by_key.len()
}

/// The Claim step draws from `Fresh \ UsedIds`: no id is claimed by two claims. Returns the
/// number of claimed ids.
fn claimed_ids_are_fresh(f: &Files, r: &mut VerifyReport) -> usize {
    let mut claimed_ids: HashMap<u64, Lsn> = HashMap::new();
    for (lsn, c) in &f.claims {
        for op in &c.ops {
            if let PlannedOp::Create { id, .. } = op {
                if let Some(other) = claimed_ids.insert(*id, *lsn) {
                    r.violation(format!(
                        "id {id} claimed by lsn {other} and lsn {lsn}: ids must never be reused"
                    ));
                }
            }
        }
    }
    claimed_ids.len()
}

/// The ids of `c`'s ops of one kind on `shard`, in op order: what its frame there must hold.
fn claimed_on(c: &ClaimRecord, shard: &str, creates: bool) -> Vec<u64> {
    c.ops
        .iter()
        .filter(|o| o.shard() == shard && matches!(o, PlannedOp::Create { .. }) == creates)
        .map(PlannedOp::id)
        .collect()
}

/// `NoPartialShard`: every frame is exactly its claim's ops for that shard (a shard commits
/// a batch's ops for it in one transaction, so a frame with some of them is a partial one).
fn no_partial_shard(f: &Files, r: &mut VerifyReport) {
    let mut partial = 0;
    for (name, fs) in &f.held {
        for (lsn, (creates, deletes)) in fs {
            let Some(c) = f.claims.get(lsn) else {
                if !f.retired(*lsn) {
                    partial += 1; // reported by rejected_batch_writes_nothing
                }
                continue;
            };
            if f.compacted_at(name, *lsn) {
                continue; // rewritten without what later batches deleted
            }
            let want_c = claimed_on(c, name, true);
            let want_d = claimed_on(c, name, false);
            if &want_c != creates || &want_d != deletes {
                partial += 1;
                r.violation(format!("NoPartialShard: shard {name} lsn {lsn} holds creates {creates:?} deletes {deletes:?}, claim says {want_c:?} {want_d:?}"));
            }
        }
    }
    r.checked.push(format!(
        "NoPartialShard: {} frames match their claims; {partial} do not",
        f.frames
    ));
}

/// `RejectedBatchWritesNothing`, as far as the files show it: a batch is rejected while it is
/// planned, before it claims, so a rejected batch has no claim; every shard frame must
/// therefore belong to a claim in the WAL.
fn rejected_batch_writes_nothing(f: &Files, r: &mut VerifyReport) {
    for (name, fs) in &f.held {
        for lsn in fs.keys().filter(|l| !f.claims.contains_key(l)) {
            let what = match f.rejections.contains(lsn) {
                true => "a recorded rejection",
                false if f.retired(*lsn) => continue,
                false => "no claim in the wal",
            };
            r.violation(format!(
                "RejectedBatchWritesNothing: shard {name} holds lsn {lsn}, which is {what}"
            ));
        }
    }
    let audited = f
        .audit
        .iter()
        .filter(|row| f.rejections.contains(&row.claim_lsn))
        .count();
    if audited > 0 {
        r.violation(format!(
            "RejectedBatchWritesNothing: {audited} audit rows name a recorded rejection"
        ));
    }
    r.checked.push(format!(
        "RejectedBatchWritesNothing: {} recorded rejections; no shard frame or audit row names one",
        f.rejections.len()
    ));
}

/// `AuditOnlyCommitted`: every audit row names a transaction its shard holds.
fn audit_only_committed(f: &Files, r: &mut VerifyReport) {
    let mut bad_audit = 0;
    for row in &f.audit {
        let ok = f.holds(&row.shard, row.claim_lsn);
        if !ok {
            bad_audit += 1;
            r.violation(format!("AuditOnlyCommitted: audit row lsn {} op {} on shard {} but the shard does not hold that transaction", row.claim_lsn, row.op_index, row.shard));
        }
    }
    r.checked.push(format!(
        "AuditOnlyCommitted: {} audit rows; {bad_audit} without a committed transaction",
        f.audit.len()
    ));
}

/// `RetryConverges`, for the batches the files call finished (a `done` record, written only
/// after every shard flushed and every audit row synced): each touched shard holds the
/// batch's transaction and every op has its audit row. What the transaction holds is
/// [`no_partial_shard`]'s to check.
fn retry_converges(f: &Files, r: &mut VerifyReport) {
    let mut audited: HashMap<Lsn, BTreeSet<u32>> = HashMap::new();
    for row in &f.audit {
        audited
            .entry(row.claim_lsn)
            .or_default()
            .insert(row.op_index);
    }
    let mut missing = 0;
    for lsn in &f.done {
        let Some(c) = f.claims.get(lsn) else {
            if f.retired(*lsn) {
                continue;
            }
            missing += 1;
            r.violation(format!("done record for lsn {lsn} without a claim"));
            continue;
        };
        for s in c.touched_shards() {
            if !f.holds(s, *lsn) {
                missing += 1;
                r.violation(format!(
                    "finished batch lsn {lsn} ({:?}): shard {s} lacks its transaction",
                    c.request_key
                ));
            }
        }
        let rows = audited.get(lsn).map_or(0, BTreeSet::len);
        if rows != c.ops.len() {
            missing += 1;
            r.violation(format!(
                "finished batch lsn {lsn}: {rows} audit rows for {} ops",
                c.ops.len()
            ));
        }
    }
    r.checked.push(format!(
        "finished batches: {} checked; {missing} missing effects",
        f.done.len()
    ));
}
