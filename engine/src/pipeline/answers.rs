//! Publishing answers: the engine's part that owns the spool's paths and the [`Publisher`].
//! It prepares a group's results while its claims sync, gives every answer (a committed
//! claim's, a rejection's, a duplicate's, a file's without a claim): writes `out/NAME` once
//! an earlier claim under the name has settled (through the tail's rounds, `Settler`),
//! removes `new/NAME`, and tells recovery whose batch a spool name holds now (`names.rs` has
//! the rules). It never plans or claims: what it answers, the engine has made durable.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use roost_storage::{read_all, OpenMode, Storage};
use roost_wal::Lsn;

use super::crash::Step;
use super::disk::io_err;
use super::env::Env;
use super::invariants;
use super::keys::committed_result;
use super::log_role::LogRole;
use super::logs::Logs;
use super::records::ClaimRecord;
use super::settle::Settler;
use crate::batch::{self, BatchResult};
use crate::config::Config;
use crate::error::EngineError;
use crate::spool::{self, read_dropped, Intake, Prepared, Publisher, SpoolPaths};

/// What becomes of `new/NAME` when its answer is given ([`Answers::deliver`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Input {
    /// Removed before the answer is published, `new/` not synced: a durable claim holds the
    /// batch, and a client may reuse the name as soon as it sees the answer (a removal
    /// after it could take the new file).
    RemovedFirst,
    /// Removed once the answer is durable, and `new/` synced at once: the answer is in no
    /// log, so an input a power loss brought back would be planned again.
    RemovedAfter,
    /// Left alone (quarantined by the caller, or another request's by now).
    Kept,
}

/// One answer [`Answers::deliver`] gives.
pub(super) struct Delivery<'a> {
    pub(super) name: &'a str,
    /// The result's bytes; `None` only for a name the prepared group holds.
    pub(super) bytes: Option<&'a [u8]>,
    /// `Some(own)`: an earlier claim under the name settles first (`own`: this answer's
    /// own claim, which is not waited for); `None`: not settled against.
    pub(super) settle: Option<Option<Lsn>>,
    pub(super) input: Input,
    /// A claim of this node: the claim's crash points are passed.
    pub(super) claimed: bool,
}

impl<'a> Delivery<'a> {
    /// An answer no claim of this node finishes.
    pub(super) fn unclaimed(
        name: &'a str,
        bytes: &'a [u8],
        settle: Option<Option<Lsn>>,
        input: Input,
    ) -> Delivery<'a> {
        Delivery {
            name,
            bytes: Some(bytes),
            settle,
            input,
            claimed: false,
        }
    }
}

/// The lsn of a committed answer's own claim (not waited for when its name settles).
fn own_lsn(r: &BatchResult) -> Option<Lsn> {
    match r {
        BatchResult::Committed { lsn, .. } => Some(*lsn),
        _ => None,
    }
}

fn inconsistent(detail: String) -> EngineError {
    EngineError::Inconsistent { lsn: 0, detail }
}

/// Whose `new/NAME` or `out/NAME` this is, for recovery.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Owner {
    Missing,
    This,
    Another,
}

/// The spool as the engine answers through it.
pub(super) struct Answers {
    storage: Arc<dyn Storage>,
    config: Arc<Config>,
    spool: SpoolPaths,
    /// Joins its sync helpers when dropped: declared first among the engine's parts that
    /// stop threads, as it was when it was the engine's own field.
    publisher: Publisher,
}

impl Answers {
    pub(super) fn new(
        storage: Arc<dyn Storage>,
        config: Arc<Config>,
        spool: SpoolPaths,
        publisher: Publisher,
    ) -> Answers {
        Answers {
            storage,
            config,
            spool,
            publisher,
        }
    }

    pub(super) fn spool(&self) -> &SpoolPaths {
        &self.spool
    }

    /// (rounds, results) published since start.
    pub(super) fn stats(&self) -> (u64, u64) {
        self.publisher.stats()
    }

    /// Whether each result file is synced on its own (else one `syncfs` per round).
    pub(super) fn syncs_each(&self) -> bool {
        self.publisher.syncs_each()
    }

    /// The results `many` (name, bytes) written and synced as temporaries, not yet renamed.
    pub(super) fn prepare(&self, many: &[(&str, &[u8])]) -> Result<Prepared<'_>, EngineError> {
        (self.publisher.prepare(many)).map_err(io_err("prepare results in", &self.spool.out))
    }

    /// Removes `new/NAME` (not synced here: for a committed batch the claim holds it, and a
    /// file that comes back gives the same answer).
    pub(super) fn remove_input(&self, source: &str) -> Result<(), EngineError> {
        spool::remove_input(self.storage.as_ref(), &self.spool, source)
            .map_err(io_err("remove input", &self.spool.new.join(source)))
    }

    /// The one way an answer reaches the spool (claims, rejections, duplicates, bulk files'
    /// results, forwarded answers, recovery's): for every item in order, an earlier claim
    /// under its name settled first (`names.rs`) and, for a [`Input::RemovedFirst`] input,
    /// `new/NAME` removed; then every result written to `out/` in one round (`prepared`,
    /// when given, must hold exactly these names: its temporaries are renamed, not written
    /// again; anything else is a bug and publishes nothing); then the [`Input::RemovedAfter`]
    /// inputs removed and `new/` synced once. A claimed item passes the claim's crash points.
    pub(super) fn deliver(
        &self,
        tail: &Settler,
        items: &[Delivery<'_>],
        prepared: Option<Prepared<'_>>,
    ) -> Result<(), EngineError> {
        for d in items {
            if let Some(own) = d.settle {
                tail.settle_name(d.name, own)?;
            }
            if d.input == Input::RemovedFirst {
                self.remove_input(d.name)?;
            }
            if d.claimed {
                tail.env.hit(Step::AfterInputRemoved.at())?;
            }
        }
        self.publish_all(items, prepared)?;
        let mut removed = false;
        for d in items.iter().filter(|d| d.input == Input::RemovedAfter) {
            self.remove_input(d.name)?;
            removed = true;
        }
        if removed {
            (self.storage.sync_dir(&self.spool.new)).map_err(io_err("sync", &self.spool.new))?;
        }
        for _ in items.iter().filter(|d| d.claimed) {
            tail.env.hit(Step::AfterResult.at())?;
        }
        Ok(())
    }

    /// `deliver`'s one round of `out/` writes.
    fn publish_all(
        &self,
        items: &[Delivery<'_>],
        prepared: Option<Prepared<'_>>,
    ) -> Result<(), EngineError> {
        let at = self.spool.out.join(items.first().map_or("", |d| d.name));
        let names: Vec<&str> = items.iter().map(|d| d.name).collect();
        let r = match prepared {
            Some(p) if p.holds(&names) => p.publish(),
            Some(_) => {
                return Err(inconsistent(format!(
                    "the results prepared at the claims differ from the committed ones \
                 (a group of {}, the first {})",
                    items.len(),
                    at.display()
                )))
            }
            None if items.is_empty() => return Ok(()),
            None => {
                let many = items.iter().map(|d| match d.bytes {
                    Some(b) => Ok((d.name, b)),
                    None => Err(inconsistent(format!(
                        "no result to publish at {}",
                        at.display()
                    ))),
                });
                self.publisher
                    .publish_many(&many.collect::<Result<Vec<_>, _>>()?)
            }
        };
        r.map_err(io_err("write result", &at))
    }

    /// Whose batch `new/NAME` holds.
    pub(super) fn input_owner(&self, claim: &ClaimRecord) -> Result<Owner, EngineError> {
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
    pub(super) fn answer_owner(&self, claim: &ClaimRecord) -> Result<Owner, EngineError> {
        let path = self.spool.out.join(&claim.source);
        let Some(bytes) = self.read_through_storage(&path)? else {
            return Ok(Owner::Missing);
        };
        let mine = serde_json::from_slice::<BatchResult>(&bytes)
            .is_ok_and(|r| r.request_key() == Some(claim.request_key.as_str()));
        Ok(if mine { Owner::This } else { Owner::Another })
    }

    fn read_through_storage(&self, path: &Path) -> Result<Option<Vec<u8>>, EngineError> {
        let file = match self.storage.open(path, OpenMode::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("open", path)(e)),
        };
        read_all(file.as_ref())
            .map(Some)
            .map_err(io_err("read", path))
    }

    /// Publishes an answer that has no claim behind it (rejected, conflict, duplicate), then
    /// removes the input and syncs `new/` at once (issue 13, item 6): the answer is not in
    /// the WAL, so if a power loss brought the input back it would be planned again, maybe
    /// against newer state, and the answer the client read could change. What is left is
    /// the moment between the result's `out/` sync and this one. A detached answer is only
    /// handed back.
    pub(super) fn reply(
        &self,
        tail: &Settler,
        source: &str,
        r: BatchResult,
    ) -> Result<BatchResult, EngineError> {
        if is_detached(source) {
            return Ok(r);
        }
        let line = r.to_json_line();
        let d = Delivery::unclaimed(source, &line, Some(own_lsn(&r)), Input::RemovedAfter);
        self.deliver(tail, &[d], None)?;
        Ok(r)
    }

    /// Writes `out/NAME` durably, in a round with the other batches finishing now; first
    /// settles any earlier claim under the same name (`names.rs`). The input is left alone.
    pub(super) fn publish_settled(
        &self,
        tail: &Settler,
        source: &str,
        r: &BatchResult,
    ) -> Result<(), EngineError> {
        let line = r.to_json_line();
        let d = Delivery::unclaimed(source, &line, Some(own_lsn(r)), Input::Kept);
        self.deliver(tail, &[d], None)
    }

    /// Answers to spool files (name, bytes) that no claim of this node finishes (see
    /// `Engine::answer_files`): every `out/NAME` published in one round (after any earlier
    /// claim under the name settles, if `settle`), then every `new/NAME` removed and `new/`
    /// synced once.
    pub(super) fn answer_files(
        &self,
        tail: &Settler,
        files: &[(&str, &[u8])],
        settle: bool,
    ) -> Result<(), EngineError> {
        if files.is_empty() {
            return Ok(());
        }
        let settle = settle.then_some(None);
        let items: Vec<Delivery> = (files.iter())
            .map(|(name, bytes)| Delivery::unclaimed(name, bytes, settle, Input::RemovedAfter))
            .collect();
        self.deliver(tail, &items, None)
    }

    /// The claims' answers, in claim order, once every claim is on a standby (under `ack =
    /// "standby"`; a wait that gives up leaves every file in `new/`). A detached claim's
    /// answer is only handed back. A live file's name settles and its input goes, then every
    /// live result is published in one round (`Publisher::publish_many`): the input goes
    /// first, since the claim holds the batch from here on and a client may reuse the name
    /// as soon as it sees the answer (a removal after it could take the new file). An
    /// earlier batch under the name settles first (its `done` durable): once the input is
    /// gone, recovery must never finish the earlier one again, or it would publish the
    /// earlier answer where this one belongs. Recovery (`started` is `None`) removes and
    /// publishes only what is still this batch's (`names.rs`). `prepared`, if given, must
    /// hold exactly the results published here (by name): its temporaries are
    /// renamed, not written again.
    pub(super) fn answer_claims(
        &self,
        tail: &Settler,
        role: &dyn LogRole,
        claims: &[(Lsn, &ClaimRecord)],
        (started, prepared): (Option<Instant>, Option<Prepared<'_>>),
    ) -> Result<Vec<BatchResult>, EngineError> {
        let synced = tail.log.wal().synced_lsn();
        for (lsn, _) in claims {
            invariants::answer_is_durable(*lsn, synced);
            tail.log.wait_replicated(*lsn, role, tail.stats)?;
        }
        let mut answers = Vec::with_capacity(claims.len());
        // A live spool file's claim lsn, name and its answer's place in `answers`.
        let mut files: Vec<(Lsn, &str, usize)> = Vec::new();
        for (lsn, c) in claims {
            let r = committed_result(*lsn, c);
            if is_detached(&c.source) {
                tail.env.hit(Step::AfterResult.at())?;
            } else if started.is_none() {
                self.recovery_answer(tail, (*lsn, c), &r)?;
            } else {
                files.push((*lsn, c.source.as_str(), answers.len()));
            }
            answers.push(r);
        }
        // Prepared results are not serialized again.
        let lines: Vec<Vec<u8>> = match prepared {
            Some(_) => Vec::new(),
            None => files.iter().map(|f| answers[f.2].to_json_line()).collect(),
        };
        let items: Vec<Delivery> = (files.iter().enumerate())
            .map(|(k, (lsn, name, _))| Delivery {
                name,
                bytes: lines.get(k).map(Vec::as_slice),
                settle: Some(Some(*lsn)),
                input: Input::RemovedFirst,
                claimed: true,
            })
            .collect();
        self.deliver(tail, &items, prepared)?;
        if let Some(t0) = started {
            for _ in &files {
                tail.stats.latency.batch.record(tail.env.clock.since(t0));
            }
        }
        Ok(answers)
    }

    /// Claim: the claims' one WAL sync, and meanwhile their spool files' results prepared
    /// (`Publisher::prepare`: written to temporaries and synced, not renamed): a committed
    /// result's bytes are fixed at its claim (`committed_result`: lsn, key, ops and ids), so
    /// a closed-loop client waits for two syncs in a row (claim and results at once, then
    /// `out/`) instead of three. Nothing is renamed before the claim is durable and
    /// committed (`answer_claims`); a group not published drops its temporaries. Returns
    /// the group and when the claims were durable (the claim phase's latency ends there,
    /// not when the results are ready).
    pub(super) fn prepare_during_sync<'p>(
        &'p self,
        log: &Logs,
        env: &Env,
        claims: &[(Lsn, &ClaimRecord)],
    ) -> Result<(Option<Prepared<'p>>, Instant), EngineError> {
        let Some(last) = claims.iter().map(|(l, _)| *l).max() else {
            return Ok((None, env.clock.now()));
        };
        let sync = || log.wal().sync_to(last).map(|()| env.clock.now());
        let files: Vec<(&str, Vec<u8>)> = claims
            .iter()
            .filter(|(_, c)| !is_detached(&c.source))
            .map(|(lsn, c)| (c.source.as_str(), committed_result(*lsn, c).to_json_line()))
            .collect();
        if files.is_empty() {
            return Ok((None, sync()?));
        }
        let many: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        let prepare = || -> Result<Prepared<'p>, EngineError> {
            let p = self.prepare(&many)?;
            env.hit(Step::AfterResultsPrepared.at())?;
            Ok(p)
        };
        if !self.syncs_each() {
            // `syncfs`: the temporaries' data is synced by the round, after the claim.
            let p = prepare()?;
            return Ok((Some(p), sync()?));
        }
        let asked = log.ask_sync(last);
        let prepared = prepare();
        let synced = match asked.map(|rx| rx.recv()) {
            Some(Ok(r)) => r,
            // No syncer thread (none could be had, or it is gone): synced here, after.
            _ => sync(),
        };
        // A failed claim sync drops the prepared group: its temporaries go.
        let synced_at = synced?;
        Ok((Some(prepared?), synced_at))
    }
}

/// Whether a claim's source is detached (no spool file of its own: a bulk file's line, a
/// streamed batch). Spool names never contain `/`.
pub fn is_detached(source: &str) -> bool {
    source.contains('/')
}
