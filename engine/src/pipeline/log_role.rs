//! What the engine sees of replication (docs/replication.md, `Kip320.tla`): a small
//! interface, [`LogRole`], that the batch path calls (may this node take a batch, may an
//! answer still be given, wait for the acknowledgement point; the epoch appends carry) and
//! that the daemon's `replica` part implements with the role, the epochs, the standbys and
//! the lease behind it. The engine is handed one at open ([`OpenLogRole`]) and never names
//! what is behind it. Stepping down and fencing are the replication side's: it changes the
//! role, wakes the engine's waiters (`RoleParts::changed`), and the engine sees the change
//! at its next `check_primary` or `still_answering`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar};
use std::time::Duration;

use roost_storage::Storage;
use roost_wal::{Lsn, Wal};

use super::backup_gate::Pins;
use crate::config::Config;
use crate::error::EngineError;

/// What this node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Takes batches; serves standbys if `[replication] listen` is set.
    Primary,
    /// Follows a primary; its spool is closed.
    Standby,
    /// Was the primary and saw a higher epoch: takes nothing more.
    SteppedDown { epoch: u32 },
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Standby => "standby",
            Role::SteppedDown { .. } => "stepped_down",
        }
    }
}

/// The epoch a standby leads once promoted.
pub enum Lead {
    /// `highest known + 1` with this node's id in the low byte (`roost promote`).
    Next,
    /// The epoch won in etcd, with the standbys in sync at the win (issue 27).
    Won { epoch: u32, isr: BTreeSet<String> },
}

/// What the engine asks of replication. Every method is cheap unless it says it waits.
pub trait LogRole: Send + Sync {
    fn role(&self) -> Role;
    /// `Ok` while this node may take batches (the primary, its lease not lapsed).
    fn check_primary(&self) -> Result<(), EngineError>;
    /// `Err(Unreplicated)` once answers waiting for a standby must give up (a stop, a step
    /// down): a duplicate waiting on a batch in flight gives up with it.
    fn still_answering(&self, lsn: Lsn) -> Result<(), EngineError>;
    /// Waits until the record at `lsn` (durable here) is the acknowledgement point's:
    /// under `ack = "standby"`, held by a standby. `checkpointed_below` tells where the last
    /// checkpoint starts (asked only when needed). Returns how long it waited for a
    /// standby's acknowledgement (`None`: none was waited for).
    fn wait_replicated(
        &self,
        lsn: Lsn,
        checkpointed_below: &dyn Fn() -> Lsn,
    ) -> Result<Option<Duration>, EngineError>;
    /// Below it every record is durable here and on a standby in sync.
    fn high_watermark(&self) -> Lsn;
    /// A primary's start: resumes the epoch it led, or takes a new one, before any append.
    fn lead_at_start(&self) -> Result<u32, EngineError>;
    /// A standby's promotion, step one: takes the epoch it will lead (durable before any
    /// append under it). The role changes at [`LogRole::become_primary`].
    fn take_lead(&self, lead: Lead) -> Result<u32, EngineError>;
    /// A standby's promotion, step two: it takes batches from now on.
    fn become_primary(&self);
    /// A fetched record at `lsn` carries `epoch` (recorded when it is new) before it is
    /// appended.
    fn note_epoch(&self, epoch: u32, lsn: Lsn) -> Result<(), EngineError>;
    /// The leader epochs of the records below `lsn` (a base backup's).
    fn epochs_below(&self, lsn: Lsn) -> Vec<(u32, Lsn)>;
}

/// What a log role is opened from, by the engine, once its WAL is open.
pub struct RoleParts {
    pub storage: Arc<dyn Storage>,
    pub config: Arc<Config>,
    /// `EPOCH`.
    pub epoch_file: PathBuf,
    /// `LEADER_EPOCHS`.
    pub leader_epochs: PathBuf,
    pub wal: Arc<Wal>,
    /// The engine's latch: set when a write the role makes fails (the engine takes nothing
    /// more).
    pub failed: Arc<AtomicBool>,
    /// Signalled when the role changes (answers waiting on a batch in flight look again).
    pub changed: Arc<Condvar>,
    /// WAL lsns kept for standbys that were just re-seeded (a fetch past one frees it).
    pub pins: Arc<Pins>,
}

/// Makes the engine's log role (the daemon's `replica` part implements it).
pub trait OpenLogRole: Send + Sync {
    fn open(&self, parts: RoleParts) -> Result<Arc<dyn LogRole>, EngineError>;
}
