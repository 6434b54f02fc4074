//! The cluster's election through an external lease store (issue 27, `docs/cluster.md`),
//! modelled before it is built: nodes win leadership with one etcd-like transaction, hold it
//! with a lease they renew, fence themselves by their own view of that lease, and replicate
//! and answer batches fenced by epoch. Not in the TLA+ specs: it has its own state, actions,
//! invariants and key, and shares with the Kafka family only the explorer and its plumbing
//! (labels, node sets, the digit packer); it changes nothing of theirs.
//!
//! The store holds the leader key (its holder, in the epoch it won) under a lease, the epoch
//! counter (advanced by the winning transaction, so epochs are unique and grow), and the ISR
//! (names, the leader included), written only by a transaction guarded by the leader's key.
//!
//! Actions (`actions.rs`): `Tick` (the store's clock; an expiring lease deletes the key),
//! `Campaign`, `KeepAliveSend`/`KeepAliveGranted`/`KeepAliveRefused`,
//! `Check` and `Fence`, `Append`/`AppendForwarded`, `Follow` (truncating by epoch), `Fetch`,
//! `IncHw`, `Answer`/`AnswerForwarded`, `IsrGrowMemory`/`IsrGrowStore`,
//! `IsrShrinkStore`/`IsrShrinkMemory`, and with `Config::handover` `StepDown`/`Resign`.
//! Invariants (`invariants.rs`): `NoTwoAnswerInOneEpoch`,
//! `AnswersWithinLease`, `NoAckLost`, `OneLeaderKey`.
//!
//! Abstractions:
//! - A tick is the store's unit of time. Times are relative (ticks left, ticks since), so the
//!   space is finite with no bound on time.
//! - A node's clock may lag the store's by `skew` ticks per lease; the model takes the worst
//!   case, a deadline (in store time) of `send + ttl - margin + skew`. (A node whose clock
//!   runs true fences sooner; everything it can do, the lagging node can do too.) The margin
//!   must cover that lag; a request's travel time needs no margin because the node counts from
//!   when it sent the request and the store from when it got it.
//! - A pause is a node taking no step. With `Config::gap`, a leader's deadline check and its
//!   act are two steps, so a pause can fall between them: one act after a stale check.
//! - A fetch is one step: the standby takes the next entry, and the leader learns (for its
//!   hw) what the standby holds (with `Config::fetch_before_sync`, what it holds durably).
//!   Truncation on a new epoch cuts to the longest prefix shared with the new leader's log,
//!   which is where KIP-279's rounds end against a leader whose log only grows.
//! - Power loss (`Config::crash`): a node loses what it wrote and had not synced, and its
//!   leadership; without it every claim is durable in the step that makes it.
//! - Not modelled: the published
//!   hw key (the ISR check stands for it), messages lost or reordered other than by the steps
//!   above, client retries (each batch is claimed at most once), log compaction.

mod actions;
pub mod encode;
pub mod invariants;
pub mod print;
pub mod state;
mod validate;

pub use invariants::INVARIANTS;
pub use state::{Ack, Config, ConfigError, Flaw, Flaws, State};

use crate::explorer::{search, Model, Report};
use crate::step::Successors;

/// The election model, for the explorer.
pub struct Election;

impl Model for Election {
    type State = State;
    type Config = Config;

    fn name(&self) -> &str {
        "Election"
    }

    fn init(&self, cfg: &Config) -> State {
        State::init(cfg)
    }

    fn next(&self, cfg: &Config, s: &State, out: &mut Successors<State>) {
        actions::next(cfg, s, out);
    }

    fn encode(&self, cfg: &Config, s: &State) -> Option<u128> {
        encode::encode(cfg, s)
    }

    fn decode(&self, cfg: &Config, key: u128) -> State {
        encode::decode(cfg, key)
    }
}

/// The rows of the results table (`docs/replication-model.md`), each pinned by
/// `tests/election.rs`: the design as built, under both acks, with and without pauses in the
/// check-then-act gap; then each flaw on the built row it is compared with. ack=local rows
/// take one batch (two batches and pauses: 4.5 million states), except the one that
/// `Flaw::EpochFromNode` needs two answers for; `Flaw::IsrGrowAtHw` needs three elections.
/// Then the handover (issue 42's switchover and graceful stop) on built rows, and its flaw.
/// Then power loss (issue 42): the design as built (a leader serves only synced records),
/// a leader that serves records before its own sync (two and three nodes), and the flaw
/// that lets its hw pass its own durable end. Then a standby that fetches before it syncs
/// and acknowledges its durable end apart from its fetch position (two and three nodes),
/// and the flaws that count what it has only written (for the hw and its catch-up, or for
/// its catch-up alone). Last, a campaign whose answer is lost (two and three nodes) and the
/// flaw that adopts such a win with a fresh view of the lease.
pub fn rows() -> Vec<Config> {
    let two = Config::two_nodes;
    let three = Config::three_nodes;
    let local = two(Ack::Local).with_batches(1);
    let local_two_answers = two(Ack::Local).with_max_epoch(2).without_gap();
    let three_elections = three(Ack::Standby).without_gap().with_max_epoch(3);
    let mut rows = vec![
        two(Ack::Standby),
        two(Ack::Standby).without_gap(),
        local,
        local.without_gap(),
        local_two_answers,
        three(Ack::Standby),
        three(Ack::Standby).without_gap(),
        three_elections,
        local.without_gap().with(Flaw::NoMargin),
        three(Ack::Standby)
            .without_gap()
            .with(Flaw::CampaignOutsideIsr),
        three(Ack::Standby)
            .without_gap()
            .with(Flaw::IsrGrowStoreFirst),
        three(Ack::Standby)
            .without_gap()
            .with(Flaw::IsrShrinkMemoryFirst),
        two(Ack::Standby).without_gap().with(Flaw::AcksAcrossEpochs),
        local_two_answers.with(Flaw::EpochFromNode),
        three_elections.with(Flaw::IsrGrowAtHw),
        two(Ack::Standby).with_handover(),
        three(Ack::Standby).with_handover(),
        three(Ack::Standby).without_gap().with_handover(),
        local.without_gap().with_handover(),
        three(Ack::Standby)
            .without_gap()
            .with_handover()
            .with(Flaw::ResignBeforeStepDown),
        local
            .without_gap()
            .with_handover()
            .with(Flaw::ResignBeforeStepDown),
    ];
    rows.extend(power_loss_rows());
    rows
}

/// The power-loss rows of [`rows`] (issue 42).
fn power_loss_rows() -> Vec<Config> {
    let two = Config::two_nodes;
    let three = Config::three_nodes;
    let fetch2 = two(Ack::Standby)
        .without_gap()
        .with_crash()
        .with_ship_written()
        .with_fetch_before_sync();
    let fetch3 = three(Ack::Standby)
        .without_gap()
        .with_crash()
        .with_ship_written()
        .with_fetch_before_sync();
    vec![
        two(Ack::Standby).without_gap().with_crash(),
        two(Ack::Standby)
            .without_gap()
            .with_crash()
            .with_ship_written(),
        three(Ack::Standby)
            .without_gap()
            .with_crash()
            .with_ship_written(),
        two(Ack::Standby)
            .without_gap()
            .with_crash()
            .with_ship_written()
            .with(Flaw::HwPastDurable),
        two(Ack::Standby)
            .without_gap()
            .with_crash()
            .with(Flaw::HwPastDurable),
        fetch2,
        fetch3,
        fetch2.with(Flaw::AckWritten),
        fetch3.with(Flaw::CatchUpWritten),
        two(Ack::Standby).without_gap().with_lost_win(),
        three(Ack::Standby).without_gap().with_lost_win(),
        two(Ack::Standby)
            .without_gap()
            .with_lost_win()
            .with(Flaw::AdoptLostWinFresh),
    ]
}

/// Explores the election under `cfg` with every invariant.
pub fn check(cfg: &Config) -> Result<Report<State, Config>, ConfigError> {
    let cfg = cfg.validate()?;
    Ok(search(&Election, &cfg, &INVARIANTS))
}
