//! Commit and Finish for durable claims, a group of them at once (a live pass of `plan.rs`;
//! recovery finishes each claim as a group of one): every shard transaction sent before any
//! is waited for, one transaction per shard in lsn order, audit rows (skipping those already
//! written), the inputs removed, the results; then the claims are handed to the durability
//! tail's next round (`settle.rs`: the shards' flushes, the audit log's sync, the `done`
//! records, shared with every claim answered since the last round). Every step is
//! idempotent, so recovery can run it again from any crash point.
//!
//! A result is published once every shard transaction is applied (readable) and the audit
//! rows are written, but before the shards and the audit log are synced: the claim, durable
//! since the claim step, is what the result stands on. A power loss before the `done` record
//! is durable makes recovery run this again from the claim (a held lsn is a no-op, audit
//! rows already there are skipped, the result is the same), so the shards' and the audit
//! log's syncs come off the client's wait. The `done` record is appended only after them:
//! done means nothing is left to redo.

use std::collections::HashSet;
use std::time::Instant;

use roost_wal::Lsn;

use super::plan::Slot;
use super::records::ClaimRecord;
use super::round_queue::Tail;
use super::Engine;
use crate::batch::{Batch, BatchResult};
use crate::error::EngineError;
use crate::spool::Prepared;

impl Engine {
    /// Recovery's finish for the durable claim at `lsn`, as a group of one; `audited` holds
    /// the op indexes whose audit rows exist already. Its input is removed and its result
    /// published only where they are still this batch's (`names.rs`).
    pub(super) fn finish(
        &self,
        lsn: Lsn,
        claim: &ClaimRecord,
        audited: &HashSet<u32>,
    ) -> Result<BatchResult, EngineError> {
        let claims = [(lsn, claim)];
        let (mut r, tail) = self.commit_and_answer(&claims, &[audited], None, None)?;
        self.tail().hold_for_round(&claims, tail)?;
        self.settle()?;
        r.pop().ok_or(EngineError::Inconsistent {
            lsn,
            detail: "its claim has no answer".into(),
        })
    }

    /// Commit and Finish up to the answers for durable claims: every transaction, the audit
    /// rows (`audited[i]`: claim `i`'s rows written already; none past its end), the answers
    /// in claim order. `started` is when a live group entered the pipeline; `None` in
    /// recovery. `prepared`: the live claims' result files, written and synced while the
    /// claims were (`plan.rs`, `sync_claims`). What is left is the [`Tail`], for
    /// `Settler::hold_for_round` (`settle.rs`).
    pub(super) fn commit_and_answer<'c>(
        &self,
        claims: &[(Lsn, &'c ClaimRecord)],
        audited: &[&HashSet<u32>],
        started: Option<Instant>,
        prepared: Option<Prepared<'_>>,
    ) -> Result<(Vec<BatchResult>, Tail<'c>), EngineError> {
        let t_commit = self.env.clock.now();
        let mut tail = Tail {
            touched: Vec::new(),
            last_row: None,
            committed: t_commit,
        };
        if claims.is_empty() {
            return Ok((Vec::new(), tail));
        }
        tail.touched = self
            .claims
            .wait_commits(self.shards.send_commits(claims)?, &|| self.is_failed())?;
        tail.committed = self.env.clock.now();
        for _ in claims {
            self.stats.latency.commit.record(tail.committed - t_commit);
        }
        tail.last_row = self.log.write_audit_rows(claims, audited, &self.env)?;
        let role = self.log_role.as_ref();
        let answered =
            (self.answers).answer_claims(&self.tail(), role, claims, (started, prepared));
        Ok((answered?, tail))
    }

    /// Every item's answer that needs no other batch to finish first, handed to `hand` as
    /// it is made; `None` for an item whose key is in flight ([`Slot::Later`]).
    /// `committed` holds the claims' answers, in item order.
    pub(super) fn answers(
        &self,
        items: &[(&Batch, &str)],
        slots: &[Slot],
        committed: Vec<BatchResult>,
        hand: &mut dyn FnMut(usize, &BatchResult),
    ) -> Result<Vec<Option<BatchResult>>, EngineError> {
        let mut committed = committed.into_iter();
        let mut out = Vec::with_capacity(items.len());
        for (i, ((b, source), slot)) in items.iter().zip(slots).enumerate() {
            let r = self.item_answer(b, source, slot, &mut committed)?;
            if let Some(r) = &r {
                hand(i, r);
            }
            out.push(r);
        }
        Ok(out)
    }

    /// One item's answer once the pass's records are durable.
    fn item_answer(
        &self,
        b: &Batch,
        source: &str,
        slot: &Slot,
        committed: &mut impl Iterator<Item = BatchResult>,
    ) -> Result<Option<BatchResult>, EngineError> {
        let key = b.request_key.as_str();
        let r = match slot {
            Slot::Answered(r) => self.answers.reply(&self.tail(), source, r.clone())?,
            Slot::Rejected(lsn, r) => {
                self.log
                    .answer_durable(*lsn, self.log_role.as_ref(), &self.stats)?;
                self.answers.reply(&self.tail(), source, r.clone())?
            }
            Slot::Claimed(lsn, _) => committed.next().ok_or(EngineError::Inconsistent {
                lsn: *lsn,
                detail: format!("request key {key:?}: its claim has no answer"),
            })?,
            Slot::Known { fp, k } => {
                let r = self
                    .claims
                    .answer_for(
                        (&self.keys, &self.log, self.log_role.as_ref(), &self.stats),
                        (key, *fp),
                        Some(*k),
                    )?
                    .ok_or(EngineError::Inconsistent {
                        lsn: k.lsn,
                        detail: format!("request key {key:?} has no answer"),
                    })?;
                self.answers.reply(&self.tail(), source, r)?
            }
            Slot::Later | Slot::Plan { .. } => return Ok(None),
        };
        Ok(Some(r))
    }

    /// Writes `out/NAME` durably, in a round with the other batches finishing now; first
    /// settles any earlier claim under the same name (`names.rs`).
    pub fn publish(&self, source: &str, r: &BatchResult) -> Result<(), EngineError> {
        self.answers.publish_settled(&self.tail(), source, r)
    }

    /// An answer to spool file `name` that no claim of this node finishes, once it is
    /// durable: `out/NAME` published (after any earlier claim under the name settles, if
    /// `settle`), then `new/NAME` removed and `new/` synced at once. Two intakes answer so:
    /// - A bulk file, once every line is answered (`intake/bulk_files.rs`, settled): its result
    ///   lines. The lines' claims are detached: recovery never touches `new/NAME` or
    ///   `out/NAME` for them, so until the removal is durable the file is simply processed
    ///   again, and each line's key gives its original answer: the same bytes.
    /// - A cluster standby's file whose batch the leader ran (`cluster/forward.rs`), not
    ///   settled against this node's own claims: one it made under the name while it led (and
    ///   was fenced before finishing) is never finished here while it follows, so waiting for
    ///   it would wait forever; if this node leads again, recovery's answer for it touches no
    ///   other request's input or answer (`names.rs`).
    pub fn answer_file(&self, name: &str, bytes: &[u8], settle: bool) -> Result<(), EngineError> {
        self.answer_files(&[(name, bytes)], settle)
    }

    /// [`Engine::answer_file`] for many files at once, in one publishing round: a cluster
    /// standby's forwarded files answered together (`intake/worker.rs`), as a leader's group
    /// of claims is.
    pub fn answer_files(&self, files: &[(&str, &[u8])], settle: bool) -> Result<(), EngineError> {
        self.answers.answer_files(&self.tail(), files, settle)
    }
}
