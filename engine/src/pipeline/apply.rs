//! A standby applies what it fetched (docs/replication.md, "In the daemon"), and is
//! promoted (the claims it holds are then finished by `Engine::finish_deferred`, in
//! `recover.rs`, before intake opens).
//!
//! One fetched chunk, record by record in lsn order, is the primary's own rule replayed:
//! 1. a claim's effects (shard frames and audit rows exactly as recovery writes them) are
//!    applied, not flushed, and the claim is appended to the WAL; a run of claims goes to
//!    the shard owners in one message per shard, waited for after the chunk's WAL sync;
//! 2. before a `done` record is appended, the effects of its claim are made durable (every
//!    shard touched since the last flush, then the audit log): a `done` is never durable
//!    before what it vouches for;
//! 3. the chunk's records are synced (a `Durable` frame acknowledges them as the sync
//!    ends, through the WAL's durable watch: `replica/role.rs`), and the planner learns
//!    them (keys, ids, open claims), as replay does;
//! 4. once a quarter of the leader's tail round waits (`tail_round_claims` / 4 claims, or
//!    the oldest applied `tail_round_ms` / 4 ago: `held::FlushDue`), the effects applied so
//!    far start flushing behind the chunk (`effects_flush.rs`): the shard owners flush, a
//!    standing thread waits for them and syncs the audit log.
//!
//! The leader settles its claims in rounds (`settle.rs`) and sends their `done` records
//! after each round, so a `done` usually arrives many fetches after its claim, when the
//! flush begun behind an earlier fetch has run: the acknowledgement of the next claims
//! waits for one WAL sync, not for the shards and the audit log (before issue 42 that flush
//! ran when the `done` came, on the fetch path). Flushing in quarter rounds rather than
//! behind every chunk takes four shard flushes and an audit sync per batch off a closed-loop
//! client's standbys (issue 42, docs/scaling.md). A `done` whose claim is still unflushed
//! (it came in the same chunk, or before the flush was due: a leader's round forced by a
//! reused spool name, or a trickle of claims) flushes there and then. A power loss can
//! take the effects of a claim without a `done`: recovery applies them again from the
//! claim (`settle_unfinished`).
//! Effects written before their claim reached the WAL are cut at the next start
//! (`replica/cut.rs`) and come back with the same records.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use roost_storage::lock;
use roost_wal::Lsn;
use tracing::info;

use super::claim_lock::Claims;
use super::env::Env;
use super::held::{self, FlushDue, FlushWith, HeldClaims};
use super::keys::KeyAt;
use super::log_role::{Lead, LogRole, Role};
use super::logs::Logs;
use super::owner::ShardSlot;
use super::records::{self, ClaimRecord, WalEntry};
use super::shard_set::{SentCommits, ShardSet};
use crate::error::EngineError;

/// A record fetched from the primary, as the engine sees it: the replication protocol's
/// record type is the replica adapter's (`replica/mod.rs` implements this for it), so the
/// engine does not depend on the protocol.
pub trait Fetched {
    fn lsn(&self) -> Lsn;
    fn epoch(&self) -> u32;
    fn kind(&self) -> u8;
    fn payload(&self) -> &[u8];
}

/// A standby's side of the engine: the held claims it works on and the log role (epochs,
/// promotion), with the parts it applies through (the shard pool, the logs, the claims
/// part for the overlays, the environment for the latch and crash points). Got from
/// `Engine::standby`.
pub struct Standby<'a> {
    pub(super) held: &'a HeldClaims,
    pub(super) log_role: &'a dyn LogRole,
    pub(super) shards: &'a ShardSet,
    pub(super) log: &'a Logs,
    pub(super) claims: &'a Claims,
    pub(super) env: &'a Env,
}

impl Standby<'_> {
    /// Applies records fetched from the primary (see the module comment); `entries[0]`
    /// continues this WAL. A failure latches the engine like any write failure.
    pub fn apply_replicated<E: Fetched>(&self, entries: &[E]) -> Result<(), EngineError> {
        let _one = lock(&self.held.apply_lock);
        if self.log_role.role() != Role::Standby {
            return Err(EngineError::NotPrimary {
                role: self.log_role.role().name(),
            });
        }
        self.env.check()?;
        let decoded = decode_entries(entries)?;
        let audit_mark = self.log.audit().next_lsn();
        let offsets = self
            .apply_chunk(&decoded)
            .inspect_err(|_| self.env.fail())?;
        let mut p = self.claims.lock();
        let mut ledger = lock(&self.held.ledger);
        for ((e, d), offset) in decoded.into_iter().zip(offsets) {
            let at = KeyAt::Wal { offset };
            p.absorb(&mut ledger, e.lsn(), at, d, audit_mark)?;
        }
        p.vouched = ledger.vouched.clone();
        Ok(())
    }

    /// Steps 1 to 3 of the module comment; returns each record's offset in its segment.
    /// The claims' transactions go to the shard owners together (one message per shard
    /// for a run of claims) and are waited for after the WAL sync, so that the owners
    /// apply (behind a flush of the chunk before, perhaps) while the WAL syncs: the next
    /// fetch, which acknowledges the chunk, waits for the longer of the two, not for both
    /// (with the durable watch, the acknowledgement leaves at the sync; the chunk's append
    /// still returns only once the owners answered, so a failed apply stops the standby
    /// before any later `done`).
    /// The chunk's effects start flushing behind it (step 4).
    fn apply_chunk<E: Fetched>(&self, decoded: &[(&E, WalEntry)]) -> Result<Vec<u64>, EngineError> {
        let mut offsets = Vec::with_capacity(decoded.len());
        let mut run: Vec<(Lsn, &ClaimRecord)> = Vec::new();
        for (e, d) in decoded {
            match d {
                WalEntry::Claim(c) => run.push((e.lsn(), c)),
                WalEntry::Done(done) => {
                    if run.iter().any(|(lsn, _)| *lsn == done.claim_lsn) {
                        let sent = self.send_unflushed(&std::mem::take(&mut run))?;
                        sent.map(|s| self.claims.wait_commits(s, &|| self.env.is_failed()))
                            .transpose()?;
                    }
                    let w = FlushWith {
                        audit: self.log.audit(),
                        failed: &|| self.env.is_failed(),
                    };
                    self.held.effects_durable(done.claim_lsn, &w)?;
                }
                _ => {}
            }
            // The record into this WAL (a new epoch first into `LEADER_EPOCHS`).
            self.log_role.note_epoch(e.epoch(), e.lsn())?;
            let wal = self.log.wal();
            let (_, offset) =
                wal.append_replicated_at(e.lsn(), e.epoch(), e.kind(), e.payload())?;
            offsets.push(offset);
        }
        let sent = self.send_unflushed(&run)?;
        let synced = match decoded.last() {
            Some((last, _)) => self.log.wal().sync_to(last.lsn()),
            None => Ok(()),
        };
        let applied = sent
            .map(|s| self.claims.wait_commits(s, &|| self.env.is_failed()))
            .transpose();
        synced?;
        applied?;
        let w = FlushWith {
            audit: self.log.audit(),
            failed: &|| self.env.is_failed(),
        };
        self.held
            .flush_behind(self.shards.flusher(), &w, self.flush_due())?;
        Ok(offsets)
    }

    /// When applied effects start flushing behind the fetches: a quarter of the leader's
    /// tail round, by count and by age (`held::FlushDue`).
    fn flush_due(&self) -> FlushDue {
        let c = &self.env.config;
        FlushDue {
            claims: (c.tail_round_claims / 4).max(1),
            age: Duration::from_millis(c.tail_round_ms / 4),
            now: self.env.clock.now(),
        }
    }

    /// A run of claims' shard transactions sent to their owners and their audit rows
    /// written (fetched claims have no audit rows here yet: rows past the WAL's end were
    /// cut at start-up); remembered until flushed. The caller waits for the owners
    /// (`Claims::wait_commits` in `claim_lock.rs`).
    fn send_unflushed<'c>(
        &self,
        run: &[(Lsn, &'c ClaimRecord)],
    ) -> Result<Option<SentCommits<'c>>, EngineError> {
        if run.is_empty() {
            return Ok(None);
        }
        let sent = self.shards.send_commits(run)?;
        let row = match self.log.write_audit_rows(run, &[], self.env) {
            Ok(row) => row,
            Err(e) => {
                // The owners still answer before this returns (no owner writing after it).
                let _ = self.claims.wait_commits(sent, &|| self.env.is_failed());
                return Err(e);
            }
        };
        let mut u = lock(&self.held.unflushed);
        u.since.get_or_insert_with(|| self.env.clock.now());
        u.claims.extend(run.iter().map(|(lsn, _)| *lsn));
        for t in sent.touched().flatten() {
            u.shards.insert(t.name.to_owned(), t.slot.clone());
        }
        u.last_row = row.or(u.last_row);
        Ok(Some(sent))
    }

    /// A standby's recovery: each claim's shard transactions and audit rows (held lsns and
    /// rows already written are skipped), then every touched shard flushed once and the
    /// audit log synced. No result, no `done` record: the primary writes those.
    /// `audited`: the rows already written, by claim lsn (recovery's; a fetched chunk has
    /// none).
    pub(super) fn apply_effects<'c>(
        &self,
        claims: impl Iterator<Item = (Lsn, &'c ClaimRecord)>,
        audited: &std::collections::HashMap<Lsn, HashSet<u32>>,
    ) -> Result<(), EngineError> {
        let mut touched: BTreeMap<String, Arc<ShardSlot>> = BTreeMap::new();
        let mut last_row = None;
        let none = HashSet::new();
        for (lsn, claim) in claims {
            let sent = self.shards.send_commits(&[(lsn, claim)])?;
            for t in self
                .claims
                .wait_commits(sent, &|| self.env.is_failed())?
                .into_iter()
                .flatten()
            {
                touched.insert(t.name.to_owned(), t.slot);
            }
            let done_rows = audited.get(&lsn).unwrap_or(&none);
            if let Some(row) = self
                .log
                .write_audit_rows(&[(lsn, claim)], &[done_rows], self.env)?
            {
                last_row = Some(row);
            }
        }
        let w = FlushWith {
            audit: self.log.audit(),
            failed: &|| self.env.is_failed(),
        };
        held::flush_effects(&touched, last_row, &w)
    }

    /// Promotion (`roost promote`, or an election won in etcd): this standby becomes the
    /// primary of the epoch `lead` names. The claims it holds without a `done` are finished
    /// (with their claimed ids) before intake opens (`Engine::finish_deferred`).
    pub fn promote(&self, lead: Lead) -> Result<u32, EngineError> {
        let _one = lock(&self.held.apply_lock);
        if self.log_role.role() != Role::Standby {
            return Err(EngineError::Replication(format!(
                "promote: this node is the {}, not a standby",
                self.log_role.role().name()
            )));
        }
        self.env.check()?;
        self.held.drain_flushing()?;
        let w = FlushWith {
            audit: self.log.audit(),
            failed: &|| self.env.is_failed(),
        };
        self.held.flush_unflushed(&w)?;
        let epoch = self.log_role.take_lead(lead)?;
        let unfinished = std::mem::take(&mut lock(&self.held.ledger).unfinished);
        let n = unfinished.len();
        lock(&self.held.deferred).extend(unfinished);
        self.log_role.become_primary();
        info!(
            epoch,
            claims_to_finish = n,
            next_lsn = self.log.wal().next_lsn(),
            "promoted: this node is the primary"
        );
        Ok(epoch)
    }

    /// Claims waiting to be finished before intake opens.
    pub fn deferred_claims(&self) -> usize {
        lock(&self.held.deferred).len()
    }
}

/// Decodes every fetched record before anything is written: a record this node cannot
/// read stops the chunk whole.
fn decode_entries<E: Fetched>(entries: &[E]) -> Result<Vec<(&E, WalEntry)>, EngineError> {
    entries
        .iter()
        .map(|e| records::decode_wal_parts(e.lsn(), e.kind(), e.payload()).map(|d| (e, d)))
        .collect()
}
