//! Spool names reused while an earlier batch under the same name is not yet settled
//! (issue 13, item 2). A client may reuse `NAME` once its answer is out, but the earlier
//! batch's `done` record may still be in flight (the durability tail runs after the answer)
//! or not yet synced. If the power went then, recovery would finish that batch again and, by
//! name alone, delete the new batch's input and publish the old answer over the new one (or
//! bring back an answer the client already consumed). Two rules close this:
//!
//! - Live: neither is a later batch's input under `NAME` removed nor any answer for `NAME`
//!   published while an earlier claim under `NAME` lacks a durable `done` record; the worker
//!   waits for that `done` and syncs the WAL up to it first ([`Settler::settle_name`]). So once
//!   the later input is gone or its answer is out, recovery never finishes the earlier batch
//!   again (and while the later input is still in `new/`, recovery sees it is another's).
//! - Recovery: an earlier batch finished again removes `new/NAME` only if it holds that very
//!   batch (same request key and fingerprint), and publishes its answer only if neither
//!   `new/NAME` nor `out/NAME` belongs to another request ([`Answers::recovery_answer`]).

use std::time::Duration;

use roost_wal::Lsn;
use tracing::info;

use super::answers::{Answers, Delivery, Input, Owner};
use super::crash::Step;
use super::records::ClaimRecord;
use super::settle::Settler;
use crate::batch::BatchResult;
use crate::error::EngineError;

impl Settler<'_> {
    /// Before an answer for `name` is published: waits until every other claim under `name`
    /// has appended its `done` record (running the round an answered one waits for), then
    /// makes those durable (see the module comment).
    /// `own` is the claim being answered, if any.
    pub(super) fn settle_name(&self, name: &str, own: Option<Lsn>) -> Result<(), EngineError> {
        let mut t = self.claims.lock();
        loop {
            self.env.check()?;
            t.tails.forget_synced(self.log.wal().synced_lsn());
            match t.tails.others(name, own) {
                Ok(0) => return Ok(()),
                Ok(done) => {
                    drop(t);
                    return self.log.wal().sync_to(done).map_err(EngineError::from);
                }
                Err(()) if self.log.rounds().waiting() > 0 => {
                    // An earlier claim under the name may wait for its round: run it now
                    // (`settle.rs`), then look again.
                    drop(t);
                    self.settle()?;
                    t = self.claims.lock();
                }
                Err(()) => {
                    // One still before its answer: its hand-in (under this lock) wakes us.
                    t = self
                        .env
                        .finished_cv
                        .wait_timeout(t, Duration::from_millis(50))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
            }
        }
    }
}

impl Answers {
    /// Recovery's answer for the claim at `lsn` finished again: removes `new/NAME` only if
    /// it is this batch, and publishes only where no other request's input or answer would
    /// be touched; the claim's crash points are passed either way.
    pub(super) fn recovery_answer(
        &self,
        tail: &Settler,
        (lsn, claim): (Lsn, &ClaimRecord),
        r: &BatchResult,
    ) -> Result<(), EngineError> {
        // The input goes at once, as before any other step: a client that saw the answer
        // may reuse the name, and recovery must not take the new file.
        let input = self.input_owner(claim)?;
        if input == Owner::This {
            self.remove_input(&claim.source)?;
        }
        tail.env.hit(Step::AfterInputRemoved.at())?;
        let out = self.answer_owner(claim)?;
        if input == Owner::Another || out == Owner::Another {
            info!(file = %claim.source, request_key = %claim.request_key, ?input, ?out,
                "recovery: the name now belongs to another request; its input and answer are left alone");
            return tail.env.hit(Step::AfterResult.at());
        }
        let line = r.to_json_line();
        let d = Delivery::unclaimed(&claim.source, &line, Some(Some(lsn)), Input::Kept);
        self.deliver(tail, &[d], None)?;
        tail.env.hit(Step::AfterResult.at())
    }
}
