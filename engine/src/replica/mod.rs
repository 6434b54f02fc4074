//! Joins the engine to the replication protocol (`roost_replication`, docs/replication.md):
//! the primary's side of a fetch ([`LeaderSide`]), a running standby's ([`FollowerSide`]),
//! and a standby's start-up ([`cut`]), which removes what this node holds past the point
//! where its log and the primary's agree, before the engine opens; the tasks that run them
//! beside the serve loop ([`serve`]), a base backup sent ([`base_backup`]) and received
//! ([`reseed`]).
//!
//! A running standby never truncates: a fetch the primary answers as diverging stops it
//! (`FollowError::Diverged`, exit 74), and the next start cuts, with the engine closed, so
//! no reader or shard owner ever sees records disappear under it.

pub mod ack;
pub mod base_backup;
pub mod cut;
pub mod epoch_file;
pub mod epochs;
pub mod fencing;
pub mod reseed;
pub mod role;
pub mod tasks;
pub mod transport;

pub use role::{FollowLink, Opener, Replication, StandbyState};

use std::sync::Arc;
use std::time::Duration;

use roost_replication::{Entry, Epoch, EpochEnd, FollowerLog, Forwarded, LeaderLog, Lsn};

use crate::error::EngineError;
use crate::pipeline::{Deliver, Engine};

/// An engine and the replication state opened with it: what the serve loop, the control
/// socket, the health endpoints and the cluster agent hold (no downcast of the engine's role).
#[derive(Clone)]
pub struct Node {
    pub engine: Arc<Engine>,
    pub repl: Arc<Replication>,
}

impl Node {
    /// Opens the engine of `opts` with a fresh [`Opener`] as its log role (whatever
    /// `opts.log_role` held is replaced), reporting recovery as `Engine::open_with_progress`.
    pub fn open(
        mut opts: crate::pipeline::EngineOptions,
        progress: &dyn Fn(&str, u64, u64),
    ) -> Result<Node, EngineError> {
        let opener = Arc::new(Opener::default());
        opts.log_role = opener.clone();
        let engine = Engine::open_with_progress(opts, progress)?;
        Ok(Node {
            engine: Arc::new(engine),
            repl: opener.made()?,
        })
    }
}

/// The error that tells the operator to re-seed this standby, and how.
pub fn reseed(detail: String) -> EngineError {
    EngineError::NeedsReseed(format!(
        "{detail}; re-seed this standby: stop the primary gracefully, copy its data directory \
         (without spool/, LOCK and roost.sock) over this one, start the primary, then this standby \
         (docs/replication.md, \"Re-seeding a standby\")"
    ))
}

/// A running standby behind what its primary retains: under `reseed = "auto"` it stops with
/// the I/O class (exit 74; systemd restarts it) and its next start re-seeds; under
/// `"manual"`, [`reseed`]'s instructions (exit 78).
pub fn behind(cfg: &crate::config::Config, detail: String) -> EngineError {
    match cfg.replication.reseed {
        crate::config::Reseed::Auto => EngineError::Replication(format!(
            "{detail}; the next start re-seeds this standby from the primary's base backup \
             (reseed = \"auto\")"
        )),
        crate::config::Reseed::Manual => reseed(detail),
    }
}

/// The primary's WAL as the protocol reads it.
pub struct LeaderSide {
    pub engine: Arc<Engine>,
    pub repl: Arc<Replication>,
}

impl LeaderLog for LeaderSide {
    type Error = EngineError;

    fn leader_epoch(&self) -> Option<Epoch> {
        self.repl.leader_epoch()
    }

    fn log_start(&self) -> Lsn {
        self.engine.wal().first_lsn()
    }

    fn shippable_end(&self) -> Lsn {
        self.repl.shippable_end()
    }

    fn wait_durable(&self, after: Lsn, timeout: Duration) -> Lsn {
        self.engine
            .wal()
            .wait_synced_past(after.saturating_sub(1), timeout)
            + 1
    }

    fn shippable_watch(&self) -> Option<tokio::sync::watch::Receiver<Lsn>> {
        self.repl.shippable_watch()
    }

    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        self.repl.end_offset_for(epoch)
    }

    fn read(&self, from: Lsn, max_bytes: usize) -> Result<Vec<Entry>, EngineError> {
        let until = self.repl.shippable_end();
        let records = self.engine.wal().read_from(from, until, max_bytes)?;
        Ok(records
            .into_iter()
            .map(|r| Entry {
                lsn: r.lsn,
                epoch: r.epoch,
                kind: r.record_type,
                payload: r.payload,
            })
            .collect())
    }

    fn acknowledged(&self, replica: &str, durable_lsn: Lsn) -> Lsn {
        self.repl.standby_acked(replica, durable_lsn)
    }

    fn disconnected(&self, replica: &str) {
        self.repl.standby_disconnected(replica)
    }

    fn fell_behind(&self, replica: &str, why: &str) {
        self.repl.standby_behind(replica, why)
    }

    fn saw_higher_epoch(&self, epoch: Epoch) {
        self.repl.step_down(epoch)
    }

    fn snapshot(
        &self,
        replica: &str,
    ) -> Result<Box<dyn roost_replication::SnapshotSource>, String> {
        self.repl
            .standby_behind(replica, "it asked for a base backup");
        let backup = base_backup::EngineBackup::begin(&self.engine, replica);
        Ok(Box::new(backup.map_err(|e| e.to_string())?))
    }

    fn forward(&self, replica: &str, batch: &[u8]) -> Forwarded {
        let one = forward_here(&self.engine, replica, &[batch.to_vec()]);
        let none = || Forwarded::Refused("the leader gave no outcome".into());
        one.into_iter().next().unwrap_or_else(none)
    }

    fn forward_group(&self, replica: &str, batches: &[Vec<u8>]) -> Vec<Forwarded> {
        forward_here(&self.engine, replica, batches)
    }
}

/// Forwarded batches run here so far, for their sources' names.
static FORWARDED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Batches member `replica` forwarded (issue 27), that came together: run as detached
/// batches of this leader's (sources `fwd/REPLICA/N`) in one group (one plan, one claim
/// sync, as a bulk file's lines), each answered once as durable as this leader's own
/// answers. The standby parsed them already; an invalid one is answered as such all the
/// same.
fn forward_here(engine: &Engine, replica: &str, batches: &[Vec<u8>]) -> Vec<Forwarded> {
    use std::sync::atomic::Ordering;
    let cfg = engine.config();
    let mut out: Vec<Option<Forwarded>> = vec![None; batches.len()];
    let mut parsed = Vec::with_capacity(batches.len());
    for (i, batch) in batches.iter().enumerate() {
        match crate::batch::parse(batch, cfg.batch_ops_max) {
            Ok(b) => {
                let n = FORWARDED.fetch_add(1, Ordering::Relaxed);
                parsed.push((i, b, format!("fwd/{replica}/{n}")));
            }
            Err(inv) => out[i] = Some(answer(engine, &crate::batch::BatchResult::invalid(&inv))),
        }
    }
    let items: Vec<_> = parsed.iter().map(|(_, b, s)| (b, s.as_str())).collect();
    let ran = match items.is_empty() {
        true => Ok(Vec::new()),
        false => engine.submit(&items, Deliver::Returned),
    };
    match ran {
        Ok(results) if results.len() == parsed.len() => {
            for ((i, _, _), r) in parsed.iter().zip(results) {
                engine.stats.forwarded_in.fetch_add(1, Ordering::Relaxed);
                out[*i] = Some(answer(engine, &r));
            }
        }
        Ok(results) => {
            let why = format!(
                "the leader answered {} of {} batches",
                results.len(),
                parsed.len()
            );
            tracing::error!(replica, "{why}");
            refuse(&mut out, &parsed, &why);
        }
        Err(e) if e.latches_nothing() => refuse(&mut out, &parsed, &e.to_string()),
        Err(e) => {
            let first = parsed
                .first()
                .map_or("", |(_, b, _)| b.request_key.as_str());
            tracing::error!(replica, batches = parsed.len(), request_key = %first, error = %e, "forwarded batches failed");
            refuse(&mut out, &parsed, &format!("the leader failed: {e}"));
        }
    }
    let none = || Forwarded::Refused("the leader gave no outcome".into());
    out.into_iter().map(|o| o.unwrap_or_else(none)).collect()
}

/// Every parsed batch of a forwarded group refused for `why` (nothing was decided for it).
fn refuse<B, S>(out: &mut [Option<Forwarded>], parsed: &[(usize, B, S)], why: &str) {
    for (i, _, _) in parsed {
        out[*i] = Some(Forwarded::Refused(why.to_owned()));
    }
}

/// A forwarded batch's answer: its result line, and the log end the standby must hold
/// before it gives it (the claim's, for a committed batch; else all that is durable here).
fn answer(engine: &Engine, r: &crate::batch::BatchResult) -> Forwarded {
    let durable_lsn = match r {
        crate::batch::BatchResult::Committed { lsn, .. } => lsn + 1,
        _ => engine.wal().synced_lsn() + 1,
    };
    Forwarded::Answer {
        answer: r.to_json_line(),
        durable_lsn,
    }
}

/// The protocol's record, as the engine takes fetched records (`pipeline::Fetched`): the
/// engine does not know the replication crate's types.
impl crate::pipeline::Fetched for Entry {
    fn lsn(&self) -> Lsn {
        self.lsn
    }
    fn epoch(&self) -> u32 {
        self.epoch
    }
    fn kind(&self) -> u8 {
        self.kind
    }
    fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// A running standby's log: appends apply through the engine; truncation is refused (it
/// happens at start-up, see the module comment).
pub struct FollowerSide {
    pub engine: Arc<Engine>,
    pub repl: Arc<Replication>,
}

impl FollowerLog for FollowerSide {
    type Error = EngineError;

    fn current_epoch(&self) -> Epoch {
        self.repl.epoch()
    }

    fn set_current_epoch(&self, epoch: Epoch) -> Result<(), EngineError> {
        self.repl.learn_epoch(epoch)
    }

    fn log_end(&self) -> Lsn {
        self.engine.wal().next_lsn()
    }

    fn durable_end(&self) -> Lsn {
        self.engine.wal().synced_lsn() + 1
    }

    fn last_epoch(&self) -> Epoch {
        self.repl.last_epoch()
    }

    fn durable_watch(&self) -> Option<tokio::sync::watch::Receiver<Lsn>> {
        self.repl.durable_watch()
    }

    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        self.repl.end_offset_for(epoch)
    }

    fn append(&self, entries: &[Entry], leader_hw: Lsn) -> Result<(), EngineError> {
        self.engine.standby().apply_replicated(entries)?;
        let bytes: usize = entries.iter().map(|e| e.payload.len()).sum();
        self.repl.update_follow_status(|f| {
            f.leader_hw = f.leader_hw.max(leader_hw);
            f.records += entries.len() as u64;
            f.bytes += bytes as u64;
            f.connected = true;
        });
        Ok(())
    }

    fn truncate_to(&self, lsn: Lsn) -> Result<(), EngineError> {
        Err(EngineError::Replication(format!(
            "the primary's log diverges from this standby's at or below lsn {lsn}: restart to cut it"
        )))
    }
}
