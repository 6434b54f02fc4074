//! An outsider on the replication port (issue 26): a network peer that is no replica, sending
//! fetches to the leaders of `Kip320`. It owns two actions and the leader's checks on them; it
//! never changes a `Kip320` action.
//!
//! - `OutsiderFetch(leader, as, offset)`: a fetch naming follower `as`, in the leader's own
//!   epoch (so the epoch fence passes), at any fetch offset from 0 to the leader's end offset.
//!   Offsets are 0-based here; in roost's lsns that is 1 to `durable_end + 1`, and a fetch past
//!   it is answered `Diverging`, which acknowledges nothing.
//! - `OutsiderHigherEpoch(leader, epoch)`: a fetch whose epoch is above the leader's, up to
//!   `MaxLeaderEpoch` (the attack sent one near `u32::MAX`; `MaxLeaderEpoch` is the model's top).
//!
//! What a leader does with them is `Checks`. The built leader (mutual TLS) runs all three and
//! ignores both actions, which are then stutter steps; the tests turn checks off to show what
//! each one guards (`docs/replication-model.md`, "An outsider on the replication port").
//!
//! Modelling notes:
//! - `Kip320` keeps no record of what the leader heard from its followers: its hw and ISR
//!   rules read each follower's log and epoch directly, as if every fetch were honest and acted
//!   on at once. A believed forged fetch is acted on the same way, in the same step:
//!   `FencedLeaderIncHighWatermark` or `FencedLeaderExpandIsr` with the named replica's part
//!   read from the claim (it follows the leader's epoch and holds every offset below the fetch
//!   offset). The outsider can send at any moment, so a forged acknowledgement acted on later
//!   is the same as one sent just then.
//! - A leader that believes a higher epoch steps down as roost's `saw_higher_epoch` does:
//!   `leader := None`, `leaderEpoch := epoch`; its hw, isr and log stay.
//! - Members are honest: a member's fetches are `Kip320`'s, name the member and carry an epoch
//!   the controller minted, so they pass every check. `Kip320` has no fetch that announces a
//!   newer epoch to a leader (roost's `announce_epoch`), so the epoch checks are only ever asked
//!   about the outsider's epochs.

use crate::base::{presumes_leadership, quorum_update_leader_and_isr};
use crate::step::{Label, Spec, Successors};
use crate::types::{Config, Replica, State};
use crate::variants::kip320;

/// Who sent a message, as the leader's TLS layer knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A replica that proved its name with its certificate.
    Member(Replica),
    /// Anyone else on the network.
    Outsider,
}

/// The checks a leader runs on a fetch before acting on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    /// The fetch's replica name must be the authenticated peer's; otherwise the fetch
    /// acknowledges nothing.
    pub name_is_peer: bool,
    /// A higher epoch is believed only from an authenticated member ...
    pub epoch_from_member: bool,
    /// ... and only if the epoch source could have minted it (`< nextLeaderEpoch`).
    pub epoch_minted: bool,
}

impl Checks {
    /// The built leader.
    pub const ALL: Checks = Checks {
        name_is_peer: true,
        epoch_from_member: true,
        epoch_minted: true,
    };

    /// Whether a fetch from `peer` naming `named` counts as `named`'s.
    pub fn believes_name(self, peer: Peer, named: Replica) -> bool {
        !self.name_is_peer || peer == Peer::Member(named)
    }

    /// Whether a leader believes `epoch`, above its own, from `peer`.
    pub fn believes_epoch(self, s: &State, peer: Peer, epoch: i8) -> bool {
        let member = !self.epoch_from_member || matches!(peer, Peer::Member(_));
        let minted = !self.epoch_minted || i16::from(epoch) < i16::from(s.next_leader_epoch);
        member && minted
    }
}

/// `Kip320` with an outsider on the network, its leaders running `checks`.
pub struct Outsider {
    pub checks: Checks,
    pub name: &'static str,
}

impl Outsider {
    /// The built system: every check on.
    pub const BUILT: Outsider = Outsider {
        checks: Checks::ALL,
        name: "Kip320 with an outsider",
    };
}

impl Spec for Outsider {
    fn name(&self) -> &str {
        self.name
    }

    fn next(&self, cfg: &Config, s: &State, out: &mut Successors) {
        kip320::next(cfg, s, out);
        outsider_fetch(self.checks, cfg, s, out);
        outsider_higher_epoch(self.checks, cfg, s, out);
    }
}

/// What a believed fetch tells the leader: `follower` follows the leader's epoch and holds
/// every offset below `end_offset`.
#[derive(Clone, Copy)]
struct Claim {
    follower: Replica,
    end_offset: u8,
}

/// What `leader` takes `r` to be: (following its epoch, end offset). The claim for the named
/// replica; `r`'s own state (the honest fetches `Kip320` abstracts) for every other.
fn seen(s: &State, leader: Replica, r: Replica, claim: Claim) -> (bool, u8) {
    if r == claim.follower {
        (true, claim.end_offset)
    } else {
        (
            kip320::is_following_leader_epoch(s, leader, r),
            s.log(r).end_offset(),
        )
    }
}

/// `leader` acting on a believed claim: `FencedLeaderIncHighWatermark` if the named replica
/// is in its ISR, `FencedLeaderExpandIsr` if not, its part read from the claim. `None` if the
/// claim enables neither.
fn act_on_claim(s: &State, leader: Replica, claim: Claim) -> Option<State> {
    let isr = s.rs(leader).isr;
    let hw = s.rs(leader).hw;
    if isr.contains(claim.follower) {
        let all_hold = s.log(leader).has_offset(hw)
            && isr.iter().all(|r| {
                let (follows, end_offset) = seen(s, leader, r, claim);
                follows && hw < end_offset
            });
        return all_hold.then(|| {
            let mut next = *s;
            next.rs_mut(leader).hw = hw + 1;
            next
        });
    }
    let reached_hw = hw == 0 || claim.end_offset >= hw;
    if !reached_hw || !kip320::has_high_watermark_reached_current_epoch(s, leader) {
        return None;
    }
    quorum_update_leader_and_isr(s, leader, isr.with(claim.follower))
}

/// `OutsiderFetch`: one successor per (leader, named follower, fetch offset); the state itself
/// when the leader does not believe the name, or the claim changes nothing.
pub fn outsider_fetch(checks: Checks, cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all().filter(|&l| presumes_leadership(s, l)) {
        for named in cfg.all().filter(|&r| r != leader) {
            for offset in 0..=s.log(leader).end_offset() {
                let claim = Claim {
                    follower: named,
                    end_offset: offset,
                };
                let next = checks
                    .believes_name(Peer::Outsider, named)
                    .then(|| act_on_claim(s, leader, claim))
                    .flatten();
                let label = Label::new("OutsiderFetch")
                    .replica("leader", leader)
                    .replica("as", named);
                out.push(label.int("offset", offset), next.unwrap_or(*s));
            }
        }
    }
}

/// `OutsiderHigherEpoch`: one successor per (leader, epoch above its own); the state itself
/// when the leader does not believe the epoch.
pub fn outsider_higher_epoch(checks: Checks, cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all().filter(|&l| presumes_leadership(s, l)) {
        let own = s.rs(leader).leader_epoch;
        for epoch in own + 1..=cfg.max_leader_epoch as i8 {
            let mut next = *s;
            if checks.believes_epoch(s, Peer::Outsider, epoch) {
                let rs = next.rs_mut(leader);
                rs.leader = None;
                rs.leader_epoch = epoch;
            }
            let label = Label::new("OutsiderHigherEpoch").replica("leader", leader);
            out.push(label.int("epoch", epoch), next);
        }
    }
}
