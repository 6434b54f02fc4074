//! What a standby holds of its claims between fetches, and the claims a node finishes before
//! intake opens (`apply.rs` works on them; recovery fills them). It knows nothing of the
//! engine.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use roost_wal::Lsn;

use super::owner::ShardSlot;
use super::records::{ClaimLedger, ClaimRecord};

/// The claims a standby holds back or has applied unflushed, and the claims to finish
/// before intake opens.
#[derive(Default)]
pub(super) struct HeldClaims {
    /// Held while a fetched chunk is applied, and by promotion.
    pub(super) apply_lock: Mutex<()>,
    /// Claims whose effects are applied but not yet flushed.
    pub(super) unflushed: Mutex<Unflushed>,
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
