//! What a standby holds of its claims between fetches, and the claims a node finishes before
//! intake opens (`apply.rs` works on them; recovery fills them). It knows nothing of the
//! engine.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use roost_wal::Lsn;

use super::owner::ShardSlot;
use super::records::{ClaimLedger, ClaimRecord};
use crate::error::EngineError;

/// The claims a standby holds back or has applied unflushed, and the claims to finish
/// before intake opens.
#[derive(Default)]
pub(super) struct HeldClaims {
    /// Held while a fetched chunk is applied, and by promotion.
    pub(super) apply_lock: Mutex<()>,
    /// Claims whose effects are applied but not yet flushed.
    pub(super) unflushed: Mutex<Unflushed>,
    /// Flushes begun behind the fetches, oldest first (at most [`FLUSHES_IN_FLIGHT`]).
    pub(super) flushing: Mutex<VecDeque<Flushing>>,
    /// A standby's claims without a `done` record yet (their effects are applied).
    pub(super) ledger: Mutex<ClaimLedger>,
    /// Claims to finish before intake opens: recovery's under `ack = "standby"` (a standby
    /// must have them before their results appear), and a promoted standby's.
    pub(super) deferred: Mutex<Vec<(Lsn, ClaimRecord)>>,
}

/// Effects a standby applied and has not flushed yet: the claims, the shards they touched,
/// the last audit row written.
#[derive(Default)]
pub(super) struct Unflushed {
    pub(super) claims: BTreeSet<Lsn>,
    pub(super) shards: BTreeMap<String, Arc<ShardSlot>>,
    pub(super) last_row: Option<Lsn>,
}

/// How many flushes a standby keeps running behind its fetches; past it, effects wait
/// unflushed for the next chunk (or their `done`).
pub(super) const FLUSHES_IN_FLIGHT: usize = 4;

/// A flush begun at the end of a chunk: the claims whose effects it makes durable, and
/// where the flusher answers (`effects_flush.rs`).
pub(super) struct Flushing {
    pub(super) claims: BTreeSet<Lsn>,
    pub(super) outcome: Receiver<Result<(), EngineError>>,
}
