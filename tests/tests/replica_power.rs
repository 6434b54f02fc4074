//! A standby's power loss at every sync of its apply (docs/replication.md, "A standby's
//! apply order"), on the simulated disk: the standby applies chunks of the primary's WAL
//! (shard frames and audit rows first, then the records, synced), the power goes at the
//! n-th sync, the standby restarts (its start-up cut removes effects past its WAL's end,
//! then the engine opens as a standby) and fetches the rest. In every run it ends with the
//! primary's records (lsn, epoch, type, content), the primary's shard contents, every audit
//! row of every claim exactly once, and `verify` clean; a `done` record is never durable
//! before its claim's effects (a skipped flush before a `done` fails it: docs/replication.md).
//! Beside it, one write of the run fails (EIO) at each point in turn, the process going on,
//! with the same checks after a restart; and the syncs of a run are counted: a standby
//! flushes its applied effects in quarter rounds of the leader's tail, not behind every
//! chunk.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use roost::config::Config;
use roost::pipeline::records::WalEntry;
use roost::pipeline::{Engine, EngineOptions};
use roost::replica::cut::Cutter;
use roost_replication::Entry;
use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_tests::*;
use serde_json::json;

const SHARDS: [&str; 2] = ["s1", "s2"];

/// The primary: creates over two shards, deletes of earlier ids, one rejection; its WAL
/// synced, so every record can be sent.
fn primary() -> (SimStorage, Vec<Entry>) {
    let disk = SimStorage::new();
    let e = open_engine(&disk, no_crash()).expect("primary");
    let mut ids = Vec::new();
    for i in 0..12u64 {
        let shard = SHARDS[(i % 2) as usize];
        let v = match i {
            i if i % 4 == 3 => json!({"request_key": format!("k{i}"), "ops": [
                {"op": "delete", "shard": SHARDS[0], "id": ids.first().copied().unwrap_or(999_999)}]}),
            7 => {
                json!({"request_key": "k7", "ops": [{"op": "delete", "shard": shard, "id": 999_999}]})
            }
            _ => json!({"request_key": format!("k{i}"), "ops": [
                {"op": "create", "shard": shard, "record": {"i": i}},
                {"op": "create", "shard": SHARDS[0], "record": {"j": i}}]}),
        };
        let r = e
            .one_file(&parse(&v), &format!("b{i}.json"))
            .expect("submit");
        ids.extend(
            r.ops()
                .iter()
                .filter(|o| o.op == "create" && o.shard == SHARDS[0])
                .map(|o| o.id),
        );
    }
    e.sync().expect("sync");
    let end = e.wal().synced_lsn() + 1;
    let recs = e.wal().read_from(1, end, usize::MAX).expect("read");
    let entries = recs
        .into_iter()
        .map(|r| Entry {
            lsn: r.lsn,
            epoch: r.epoch,
            kind: r.record_type,
            payload: r.payload,
        })
        .collect();
    drop(e);
    (disk, entries)
}

fn standby_config() -> Config {
    let mut c = test_config();
    c.replication.follow = Some("127.0.0.1:9".into());
    c
}

fn open_standby(disk: &SimStorage) -> Engine {
    open_standby_with(disk, standby_config())
}

fn open_standby_with(disk: &SimStorage, cfg: Config) -> Engine {
    let cut = Cutter::open_with(Arc::new(disk.clone()), &cfg).expect("cutter");
    cut.cut_past_end().expect("cut past end");
    drop(cut);
    Engine::open(EngineOptions {
        storage: Arc::new(disk.clone()),
        config: Arc::new(cfg),
        crash: no_crash(),
        log_role: std::sync::Arc::new(roost::replica::Opener::default()),
    })
    .expect("open standby")
}

/// Applies `entries` from the standby's WAL end on, `chunk` records at a time; stops at the
/// first error (the power went: later writes fail or vanish).
fn apply(e: &Engine, entries: &[Entry], chunk: usize) {
    let from = e.wal().next_lsn();
    let rest: Vec<Entry> = entries.iter().filter(|x| x.lsn >= from).cloned().collect();
    for c in rest.chunks(chunk) {
        if e.standby().apply_replicated(c).is_err() {
            return;
        }
    }
}

/// Records as (lsn, epoch, type, payload).
fn records(disk: &SimStorage) -> Vec<(u64, u32, u8, Vec<u8>)> {
    let w = roost_wal::Wal::open_with(
        Arc::new(disk.clone()),
        data_dir().join("wal"),
        roost_wal::WalOptions {
            read_only: true,
            ..roost_wal::WalOptions::default()
        },
    )
    .expect("wal");
    w.replay(1)
        .map(|r| r.expect("record"))
        .map(|r| (r.lsn, r.epoch, r.record_type, r.payload))
        .collect()
}

/// Every claim's audit rows, exactly once each: claim lsn -> op indexes.
fn audit_by_claim(disk: &SimStorage) -> BTreeMap<u64, Vec<u32>> {
    let mut m: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for (_, row) in audit_rows(Arc::new(disk.clone()), &data_dir()) {
        m.entry(row.claim_lsn).or_default().push(row.op_index);
    }
    m
}

/// What a standby must end with: the primary's records (lsn, epoch, type, payload), shard
/// contents and audit rows by claim.
struct Want {
    records: Vec<(u64, u32, u8, Vec<u8>)>,
    shards: Contents,
    audit: BTreeMap<u64, Vec<u32>>,
}

impl Want {
    fn of(pdisk: &SimStorage, entries: &[Entry]) -> Want {
        Want {
            records: (entries.iter())
                .map(|e| (e.lsn, e.epoch, e.kind, e.payload.clone()))
                .collect(),
            shards: contents(pdisk, &SHARDS),
            audit: audit_by_claim(pdisk),
        }
    }

    /// The standby's disk `after` holds what the primary does, and `verify` is clean.
    fn check(&self, after: &SimStorage, what: &str) {
        assert_eq!(records(after), self.records, "{what}: records");
        assert_eq!(contents(after, &SHARDS), self.shards, "{what}: shards");
        assert_eq!(audit_by_claim(after), self.audit, "{what}: audit rows");
        let report = roost::ops::verify::verify(Arc::new(after.clone()), &data_dir());
        assert!(report.ok(), "{what}: {:?}", report.violations);
    }
}

/// Goal: see the module comment. Method: count the syncs of a whole standby run, then for
/// every n, freeze durability at the n-th sync, lose the power (dropped or torn), restart the
/// standby and let it fetch the rest. Twice: with the default tail round (this run's claims
/// never fill a quarter of it, so every `done` flushes its claim's effects itself), and with
/// `tail_round_claims = 4` (a flush begun behind every other claim, which a `done` waits
/// for).
#[test]
fn a_standby_power_loss_at_every_sync_of_its_apply_loses_and_repeats_nothing() {
    let (pdisk, entries) = primary();
    let want = Want::of(&pdisk, &entries);
    let mut small = standby_config();
    small.tail_round_claims = 4;
    let mut runs = 0;
    for cfg in [standby_config(), small] {
        let whole = SimStorage::new();
        apply(&open_standby_with(&whole, cfg.clone()), &entries, 3);
        let syncs = whole.sync_count();
        assert!(syncs > 20, "a standby run syncs {syncs} times");
        assert_eq!(records(&whole), want.records);
        for n in 0..syncs {
            for mode in [CrashMode::PowerDrop, CrashMode::PowerTear { seed: n }] {
                let disk = SimStorage::new();
                disk.set_faults(SimFaults {
                    freeze_after_syncs: Some(n),
                    ..SimFaults::default()
                });
                apply(&open_standby_with(&disk, cfg.clone()), &entries, 3);
                let after = disk.crash(mode);
                apply(&open_standby_with(&after, cfg.clone()), &entries, 3);
                let what = format!(
                    "tail_round_claims {}: power loss ({mode:?}) after sync {n}",
                    cfg.tail_round_claims
                );
                want.check(&after, &what);
                runs += 1;
            }
        }
    }
    assert!(runs >= 80, "only {runs} runs");
}

/// Goal: a write that fails anywhere in a standby's apply (a shard frame, an audit row, a
/// WAL record: EIO once, the process goes on) stops the standby before any `done` record
/// vouches for effects that were not written, and a restart (the page cache kept) fetches
/// the rest and ends equal to the primary. A shard owner's failed apply fails the chunk
/// (`pipeline/apply.rs` waits for the owners before the chunk's append returns), and the
/// owner refuses every later flush; a `done` let through over it would be durable and the
/// restart would never apply that claim again. Method: count the writes of a whole standby
/// run; fail each in turn (writes on the owners' threads and on the applying one may
/// interleave differently from run to run, so "the n-th write" is not always the same one).
#[test]
fn a_failed_write_at_every_point_of_a_standbys_apply_loses_and_repeats_nothing() {
    let (pdisk, entries) = primary();
    let want = Want::of(&pdisk, &entries);
    let whole = SimStorage::new();
    let e = open_standby(&whole);
    let w0 = whole.write_count();
    apply(&e, &entries, 3);
    let writes = whole.write_count() - w0;
    drop(e);
    assert!(writes > 20, "a standby run writes {writes} times");
    for n in 1..=writes {
        let disk = SimStorage::new();
        let e = open_standby(&disk);
        let target = disk.write_count() + n;
        disk.set_faults(SimFaults {
            fail_write_at: Some(target),
            ..SimFaults::default()
        });
        let stopped = apply_all(&e, &entries, 3);
        let what = format!("write {n} of {writes} failed (the apply: {stopped:?})");
        assert!(disk.write_count() >= target, "{what}: never reached");
        assert!(stopped.is_err(), "{what}: the standby went on");
        drop(e);
        let after = disk.crash(CrashMode::Process);
        apply(&open_standby(&after), &entries, 3);
        want.check(&after, &what);
    }
    println!("a failed write at each of {writes} points");
}

/// [`apply`], returning the first error.
fn apply_all(e: &Engine, entries: &[Entry], chunk: usize) -> Result<(), String> {
    let from = e.wal().next_lsn();
    let rest: Vec<Entry> = entries.iter().filter(|x| x.lsn >= from).cloned().collect();
    for c in rest.chunks(chunk) {
        e.standby()
            .apply_replicated(c)
            .map_err(|err| err.to_string())?;
    }
    Ok(())
}

/// Records of the primary's run whose apply also creates files (each shard's first
/// segment, the audit log, `LEADER_EPOCHS`: their syncs and their directories'): the first
/// two claims touch both shards.
const WARM: usize = 2;

/// The syncs of a standby's run that applies `entries` one record per chunk, the simulated
/// clock moved `tick` before each, counted after the first [`WARM`] records and once the
/// engine (and its flushing thread) is gone.
fn syncs_of_run(entries: &[Entry], cfg: Config, tick: Duration) -> u64 {
    let disk = SimStorage::new();
    let e = open_standby_with(&disk, cfg);
    let mut s0 = disk.sync_count();
    for (i, x) in entries.iter().enumerate() {
        if i == WARM {
            s0 = disk.sync_count();
        }
        disk.advance(tick);
        e.standby()
            .apply_replicated(std::slice::from_ref(x))
            .expect("apply");
    }
    drop(e);
    disk.sync_count() - s0
}

/// Goal (issue 42): a standby flushes the effects it applied in quarter rounds of the
/// leader's tail (`tail_round_claims / 4` claims, or the oldest `tail_round_ms / 4` old),
/// not behind every chunk: at one closed-loop client the flush behind every chunk was four
/// shard flushes and an audit sync per batch on each standby. Method: the primary's run
/// (its `done` records all come after its claims), one record per chunk, syncs counted.
/// With neither quarter reached, a run syncs its WAL once per chunk and flushes its shards
/// and audit log once, for the first `done`; with the clock moved a quarter round before
/// each chunk, or a quarter round of one claim, flushes start behind the chunks (every other
/// claim: a claim is not yet due in the chunk that applies it), more syncs than one per
/// claim beyond the WAL's.
#[test]
fn a_standby_flushes_in_quarter_rounds() {
    let (_, entries) = primary();
    let records = (entries.len() - WARM) as u64;
    let kind = |x: &Entry| roost::pipeline::records::decode_wal_parts(x.lsn, x.kind, &x.payload);
    let claims = (entries.iter().skip(WARM))
        .take_while(|x| !matches!(kind(x), Ok(WalEntry::Done(_))))
        .filter(|x| matches!(kind(x), Ok(WalEntry::Claim(_))))
        .count() as u64;
    assert!(
        claims >= 6,
        "the primary's run has {claims} claims before a done"
    );
    let once = (SHARDS.len() + 1) as u64;
    let quiet = syncs_of_run(&entries, standby_config(), Duration::ZERO);
    assert!(
        quiet <= records + once,
        "{quiet} syncs for {records} records: more than one per chunk and {once} for the first done"
    );
    let c = standby_config();
    let aged = syncs_of_run(
        &entries,
        c.clone(),
        Duration::from_millis(c.tail_round_ms / 4),
    );
    let mut one = standby_config();
    one.tail_round_claims = 4;
    let counted = syncs_of_run(&entries, one, Duration::ZERO);
    for (what, n) in [("by age", aged), ("by count", counted)] {
        assert!(
            n >= records + claims,
            "{what}: {n} syncs for {records} records, {claims} claims: not a flush behind each claim"
        );
    }
    println!(
        "{records} records, {claims} claims: {quiet} syncs, {aged} by age, {counted} by count"
    );
}

/// Goal (a review of the quarter rounds): a standby promoted while it holds claims whose
/// effects it applied but has not flushed (less than a quarter round) finishes them with
/// their audit rows durable before their `done` records. The rows are already in its audit
/// log's page cache, so the finish writes none of them again, and its round would sync none
/// before the `done`s. Method: the primary's claims (none of its `done`s) applied, the
/// standby promoted and its claims finished, then the power lost (every unsynced write
/// dropped): each claim keeps every audit row, once, and the shards what the primary's hold.
#[test]
fn a_promoted_standby_finishes_unflushed_claims_with_their_audit_rows_durable() {
    let (pdisk, entries) = primary();
    let is_done = |x: &Entry| {
        let d = roost::pipeline::records::decode_wal_parts(x.lsn, x.kind, &x.payload);
        matches!(d, Ok(WalEntry::Done(_)))
    };
    let claims: Vec<Entry> = entries
        .iter()
        .take_while(|x| !is_done(x))
        .cloned()
        .collect();
    assert!(
        claims.len() >= 8,
        "the primary's run has {} records before a done",
        claims.len()
    );
    let disk = SimStorage::new();
    let e = open_standby(&disk);
    apply(&e, &claims, 3);
    assert_eq!(
        e.wal().next_lsn(),
        claims.len() as u64 + 1,
        "every claim applied"
    );
    e.standby()
        .promote(roost::pipeline::Lead::Next)
        .expect("promote");
    let finished = e.finish_deferred().expect("finish the claims");
    assert!(finished >= 6, "{finished} claims finished");
    let after = disk.crash(CrashMode::PowerDrop);
    drop(e);
    let want: BTreeMap<u64, Vec<u32>> = audit_by_claim(&pdisk)
        .into_iter()
        .filter(|(lsn, _)| *lsn <= claims.len() as u64)
        .collect();
    assert_eq!(
        audit_by_claim(&after),
        want,
        "audit rows after the power loss"
    );
    assert_eq!(
        contents(&after, &SHARDS),
        contents(&pdisk, &SHARDS),
        "shards"
    );
}
