//! Spool names reused while an earlier batch under the same name is not yet settled
//! (issue 13, item 2). A client may reuse `NAME` once its answer is out, but the earlier
//! batch's `done` record may still be in flight (the durability tail runs after the answer)
//! or not yet synced. If the power went then, recovery would finish that batch again and, by
//! name alone, delete the new batch's input and publish the old answer over the new one (or
//! bring back an answer the client already consumed). Two rules close this:
//!
//! - Live: neither is a later batch's input under `NAME` removed nor any answer for `NAME`
//!   published while an earlier claim under `NAME` lacks a durable `done` record; the worker
//!   waits for that `done` and syncs the WAL up to it first ([`Engine::settle_name`]). So once
//!   the later input is gone or its answer is out, recovery never finishes the earlier batch
//!   again (and while the later input is still in `new/`, recovery sees it is another's).
//! - Recovery: an earlier batch finished again removes `new/NAME` only if it holds that very
//!   batch (same request key and fingerprint), and publishes its answer only if neither
//!   `new/NAME` nor `out/NAME` belongs to another request ([`Engine::recovery_answer`]).

use std::time::Duration;

use roost_storage::{lock, read_all, OpenMode};
use roost_wal::Lsn;
use tracing::info;

use super::crash::Step;
use super::records::ClaimRecord;
use super::{io_err, Engine};
use crate::batch::{self, BatchResult};
use crate::error::EngineError;
use crate::spool::{read_dropped, Intake};

/// Whose `new/NAME` or `out/NAME` this is, for recovery.
#[derive(Debug, PartialEq, Eq)]
enum Owner {
    Missing,
    This,
    Another,
}

impl Engine {
    /// Before an answer for `name` is published: waits until every other claim under `name`
    /// has appended its `done` record (running the round an answered one waits for), then
    /// makes those durable (see the module comment).
    /// `own` is the claim being answered, if any.
    pub(super) fn settle_name(&self, name: &str, own: Option<Lsn>) -> Result<(), EngineError> {
        let mut t = lock(&self.planner);
        loop {
            self.check()?;
            t.tails.forget_synced(self.wal.synced_lsn());
            match t.tails.others(name, own) {
                Ok(0) => return Ok(()),
                Ok(done) => {
                    drop(t);
                    return self.wal.sync_to(done).map_err(EngineError::from);
                }
                Err(()) if self.rounds.waiting() > 0 => {
                    // An earlier claim under the name may wait for its round: run it now
                    // (`settle.rs`), then look again.
                    drop(t);
                    self.settle()?;
                    t = lock(&self.planner);
                }
                Err(()) => {
                    // One still before its answer: its hand-in (under this lock) wakes us.
                    t = self
                        .finished_cv
                        .wait_timeout(t, Duration::from_millis(50))
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0);
                }
            }
        }
    }

    /// Recovery's answer for a claim finished again: removes `new/NAME` only if it is this
    /// batch, and publishes only where no other request's input or answer would be touched.
    pub(super) fn recovery_answer(
        &self,
        claim: &ClaimRecord,
        r: &BatchResult,
    ) -> Result<(), EngineError> {
        let input = self.input_owner(claim)?;
        if input == Owner::This {
            self.remove_input(&claim.source)?;
        }
        self.hit(Step::AfterInputRemoved.at())?;
        let out = self.answer_owner(claim)?;
        if input == Owner::Another || out == Owner::Another {
            info!(file = %claim.source, request_key = %claim.request_key, ?input, ?out,
                "recovery: the name now belongs to another request; its input and answer are left alone");
            return Ok(());
        }
        self.publish(&claim.source, r)
    }

    /// Whose batch `new/NAME` holds.
    fn input_owner(&self, claim: &ClaimRecord) -> Result<Owner, EngineError> {
        let path = self.spool.new.join(&claim.source);
        let bytes = if self.storage.is_real() {
            match read_dropped(&path, self.config.spool_file_bytes_max) {
                Ok(Intake::Gone) => return Ok(Owner::Missing),
                Ok(Intake::Refused(_)) => return Ok(Owner::Another),
                Ok(Intake::Bytes(b)) => b,
                Err(e) => return Err(io_err("read input", &path)(e)),
            }
        } else {
            match self.read_through_storage(&path)? {
                None => return Ok(Owner::Missing),
                Some(b) => b,
            }
        };
        let same = batch::parse(&bytes, self.config.batch_ops_max).is_ok_and(|b| {
            b.request_key == claim.request_key && batch::fingerprint(&b) == claim.fingerprint
        });
        Ok(if same { Owner::This } else { Owner::Another })
    }

    /// Whose answer `out/NAME` holds (a result of another request key is another's).
    fn answer_owner(&self, claim: &ClaimRecord) -> Result<Owner, EngineError> {
        let path = self.spool.out.join(&claim.source);
        let Some(bytes) = self.read_through_storage(&path)? else {
            return Ok(Owner::Missing);
        };
        let mine = serde_json::from_slice::<BatchResult>(&bytes)
            .is_ok_and(|r| r.request_key() == Some(claim.request_key.as_str()));
        Ok(if mine { Owner::This } else { Owner::Another })
    }

    fn read_through_storage(&self, path: &std::path::Path) -> Result<Option<Vec<u8>>, EngineError> {
        let file = match self.storage.open(path, OpenMode::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("open", path)(e)),
        };
        read_all(file.as_ref())
            .map(Some)
            .map_err(io_err("read", path))
    }
}
