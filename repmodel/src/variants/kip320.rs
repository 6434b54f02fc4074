//! `Kip320.tla` (extends `Kip279`): fetches, high watermark increments, ISR changes and the
//! truncation on becoming a follower are all fenced by the leader epoch.

use crate::base::{self, presumes_leadership};
use crate::step::{Label, Successors};
use crate::types::{Config, QuorumState, Replica, ReplicaState, State};
use crate::variants::kip279::first_non_matching_offset_from_tail;

/// `IsFollowingLeaderEpoch(leader, follower)` (LOCAL).
pub fn is_following_leader_epoch(s: &State, leader: Replica, follower: Replica) -> bool {
    presumes_leadership(s, leader)
        && s.rs(follower).leader == Some(leader)
        && s.rs(follower).leader_epoch == s.rs(leader).leader_epoch
}

/// `FencedFollowerFetch`.
pub fn fenced_follower_fetch(cfg: &Config, s: &State, out: &mut Successors) {
    for follower in cfg.all() {
        for leader in cfg.all() {
            if !is_following_leader_epoch(s, leader, follower) {
                continue;
            }
            let Some(log) = s.log(follower).replicate_from(cfg, s.log(leader)) else {
                continue;
            };
            let new_end_offset = s.log(follower).end_offset() + 1;
            let mut next = *s;
            next.set_log(follower, log);
            next.rs_mut(follower).hw = s.rs(leader).hw.min(new_end_offset);
            let label = Label::new("FencedFollowerFetch").replica("follower", follower);
            out.push(label.replica("leader", leader), next);
        }
    }
}

/// `FencedLeaderIncHighWatermark`.
///
/// Interpretation note: unlike `LeaderIncHighWatermark`, this action does not itself require
/// `ReplicaPresumesLeadership(leader)`; only `IsFollowingLeaderEpoch` over a non-empty ISR
/// implies it. A replica whose cached ISR is empty may advance its hw. Kept as written.
pub fn fenced_leader_inc_high_watermark(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        let leader_hw = s.rs(leader).hw;
        if !s.log(leader).has_offset(leader_hw) {
            continue;
        }
        let all_follow = s.rs(leader).isr.iter().all(|follower| {
            is_following_leader_epoch(s, leader, follower) && s.log(follower).has_offset(leader_hw)
        });
        if all_follow {
            let mut next = *s;
            next.rs_mut(leader).hw = leader_hw + 1;
            out.push(
                Label::new("FencedLeaderIncHighWatermark").replica("leader", leader),
                next,
            );
        }
    }
}

/// `FencedLeaderShrinkIsr`. The condition is a disjunction (`~IsFollowingLeaderEpoch \/
/// end offset lagging`) in the action, so, as TLC does, each true disjunct yields its own
/// successor: a follower that is both off the epoch and behind gives the same state twice (both
/// count in *generated*, note 9).
pub fn fenced_leader_shrink_isr(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        let isr = s.rs(leader).isr;
        let leader_end_offset = s.log(leader).end_offset();
        for follower in isr.without(leader).iter() {
            let enabled_disjuncts = [
                !is_following_leader_epoch(s, leader, follower),
                s.log(follower).end_offset() < leader_end_offset,
            ];
            let copies = enabled_disjuncts.iter().filter(|&&d| d).count();
            if copies == 0 {
                continue;
            }
            if let Some(next) = base::quorum_update_leader_and_isr(s, leader, isr.without(follower))
            {
                let label = Label::new("FencedLeaderShrinkIsr").replica("leader", leader);
                let label = label.replica("follower", follower);
                (0..copies).for_each(|_| out.push(label, next));
            }
        }
    }
}

/// `HasHighWatermarkReachedCurrentEpoch(leader)` (LOCAL).
pub fn has_high_watermark_reached_current_epoch(s: &State, leader: Replica) -> bool {
    let hw = s.rs(leader).hw;
    hw == s.log(leader).end_offset()
        || s.log(leader)
            .entry_at(hw)
            .is_some_and(|r| r.epoch == s.rs(leader).leader_epoch)
}

/// `HasFollowerReachedHighWatermark(leader, follower)` (LOCAL).
pub fn has_follower_reached_high_watermark(s: &State, leader: Replica, follower: Replica) -> bool {
    let hw = s.rs(leader).hw;
    hw == 0 || s.log(follower).has_offset(hw - 1)
}

/// `FencedLeaderExpandIsr`.
pub fn fenced_leader_expand_isr(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        let isr = s.rs(leader).isr;
        for follower in cfg.all().filter(|&r| !isr.contains(r)) {
            if !is_following_leader_epoch(s, leader, follower)
                || !has_follower_reached_high_watermark(s, leader, follower)
                || !has_high_watermark_reached_current_epoch(s, leader)
            {
                continue;
            }
            if let Some(next) = base::quorum_update_leader_and_isr(s, leader, isr.with(follower)) {
                let label = Label::new("FencedLeaderExpandIsr").replica("leader", leader);
                out.push(label.replica("follower", follower), next);
            }
        }
    }
}

/// `BecomeFollower(replica, leaderAndIsrRequest, newHighWatermark)` (LOCAL): the new
/// `replicaState[replica]`.
fn become_follower(request: QuorumState, new_high_watermark: u8) -> ReplicaState {
    ReplicaState {
        leader_epoch: request.leader_epoch,
        leader: request.leader,
        isr: request.isr,
        hw: new_high_watermark,
    }
}

/// `FencedBecomeFollowerAndTruncate`. As in the other variants `leader` ranges over
/// `Replicas`, so the `leader = None` disjunct is never enabled (see the notes).
pub fn fenced_become_follower_and_truncate(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        for replica in cfg.all().filter(|&r| r != leader) {
            for request in s.leader_and_isr_requests.iter() {
                if request.leader != Some(leader)
                    || request.leader_epoch <= s.rs(replica).leader_epoch
                {
                    continue;
                }
                if !presumes_leadership(s, leader)
                    || s.rs(leader).leader_epoch != request.leader_epoch
                {
                    continue;
                }
                let truncation_offset = first_non_matching_offset_from_tail(s, leader, replica);
                let new_high_watermark = truncation_offset.min(s.rs(replica).hw);
                let Some(log) = s.log(replica).truncate_to(truncation_offset) else {
                    continue;
                };
                let mut next = *s;
                next.set_log(replica, log);
                *next.rs_mut(replica) = become_follower(request, new_high_watermark);
                let label = Label::new("FencedBecomeFollowerAndTruncate")
                    .replica("leader", leader)
                    .replica("replica", replica);
                out.push(label.int("requestEpoch", request.leader_epoch), next);
            }
        }
    }
}

/// `Next`.
pub fn next(cfg: &Config, s: &State, out: &mut Successors) {
    base::controller_elect_leader(cfg, s, out);
    base::controller_shrink_isr(cfg, s, out);
    base::become_leader(cfg, s, out);
    fenced_leader_expand_isr(cfg, s, out);
    fenced_leader_shrink_isr(cfg, s, out);
    base::leader_write(cfg, s, out);
    fenced_leader_inc_high_watermark(cfg, s, out);
    fenced_become_follower_and_truncate(cfg, s, out);
    fenced_follower_fetch(cfg, s, out);
}
