//! `KafkaReplication.tla`: `Init`, the predicates and the actions every variant shares.
//!
//! Each action is `fn(cfg, s, out)`: it pushes one successor per binding of its `\E`
//! quantifiers for which the action is enabled. Helpers that are not actions on their own
//! (`ControllerUpdateIsr`, `QuorumUpdateLeaderAndIsr`, `BecomeFollowerAndTruncateTo`) change
//! a successor under construction and return whether they were enabled.

use crate::step::{Label, Successors};
use crate::types::{Config, Log, QuorumState, Record, Replica, ReplicaSet, ReplicaState, Requests};
use crate::types::{State, MAX_REPLICAS, NIL};

/// `Init`.
pub fn init(cfg: &Config) -> State {
    let empty = ReplicaState {
        hw: 0,
        leader_epoch: NIL,
        leader: None,
        isr: ReplicaSet::EMPTY,
    };
    State {
        replica_log: [Log::EMPTY; MAX_REPLICAS],
        replica_state: [empty; MAX_REPLICAS],
        next_record_id: 0,
        next_leader_epoch: 0,
        leader_and_isr_requests: Requests::default(),
        quorum_state: QuorumState {
            leader_epoch: NIL,
            leader: None,
            isr: cfg.replica_set(),
        },
    }
}

/// `ReplicaPresumesLeadership(replica)`.
pub fn presumes_leadership(s: &State, replica: Replica) -> bool {
    s.rs(replica).leader == Some(replica)
}

/// `ReplicaIsFollowing(follower, leader)`.
pub fn is_following(s: &State, follower: Replica, leader: Replica) -> bool {
    s.rs(follower).leader == Some(leader)
}

/// `IsTrueLeader(leader)`.
pub fn is_true_leader(s: &State, leader: Replica) -> bool {
    s.quorum_state.leader == Some(leader)
        && presumes_leadership(s, leader)
        && s.rs(leader).leader_epoch == s.quorum_state.leader_epoch
}

/// `IdSequence!NextId(id)` with `\E id \in IdSet`: the id handed out, if `nextId <= MaxId`.
fn next_id(next: u8, max_id: i16) -> Option<u8> {
    (i16::from(next) <= max_id).then_some(next)
}

/// `ControllerUpdateIsr(newLeader, newIsr)`: bump the epoch, set the quorum state, send the
/// request. Writes `nextLeaderEpoch`, `quorumState` and `leaderAndIsrRequests` of `next`.
fn controller_update_isr(
    cfg: &Config,
    s: &State,
    next: &mut State,
    new_leader: Option<Replica>,
    new_isr: ReplicaSet,
) -> bool {
    let Some(epoch) = next_id(s.next_leader_epoch, i16::from(cfg.max_leader_epoch)) else {
        return false;
    };
    next.next_leader_epoch = s.next_leader_epoch + 1;
    let state = QuorumState {
        leader_epoch: epoch as i8,
        leader: new_leader,
        isr: new_isr,
    };
    next.quorum_state = state;
    next.leader_and_isr_requests.insert(state);
    true
}

/// `ControllerShrinkIsr`: the three disjuncts are mutually exclusive for a given replica.
pub fn controller_shrink_isr(cfg: &Config, s: &State, out: &mut Successors) {
    let q = s.quorum_state;
    for replica in cfg.all() {
        let (new_leader, new_isr) =
            if q.leader == Some(replica) && q.isr == ReplicaSet::single(replica) {
                (None, q.isr)
            } else if q.leader == Some(replica) {
                (None, q.isr.without(replica))
            } else if q.isr.contains(replica) {
                (q.leader, q.isr.without(replica))
            } else {
                continue;
            };
        let mut next = *s;
        if controller_update_isr(cfg, s, &mut next, new_leader, new_isr) {
            out.push(
                Label::new("ControllerShrinkIsr").replica("replica", replica),
                next,
            );
        }
    }
}

/// `ControllerElectLeader`.
pub fn controller_elect_leader(cfg: &Config, s: &State, out: &mut Successors) {
    let q = s.quorum_state;
    for new_leader in q.isr.iter() {
        if q.leader == Some(new_leader) {
            continue;
        }
        let mut next = *s;
        if controller_update_isr(cfg, s, &mut next, Some(new_leader), q.isr) {
            out.push(
                Label::new("ControllerElectLeader").replica("newLeader", new_leader),
                next,
            );
        }
    }
}

/// `BecomeLeader`.
pub fn become_leader(_cfg: &Config, s: &State, out: &mut Successors) {
    for request in s.leader_and_isr_requests.iter() {
        let Some(leader) = request.leader else {
            continue;
        };
        if request.leader_epoch <= s.rs(leader).leader_epoch {
            continue;
        }
        let mut next = *s;
        *next.rs_mut(leader) = ReplicaState {
            hw: s.rs(leader).hw,
            leader_epoch: request.leader_epoch,
            leader: Some(leader),
            isr: request.isr,
        };
        let label = Label::new("BecomeLeader").replica("leader", leader);
        out.push(label.int("requestEpoch", request.leader_epoch), next);
    }
}

/// `LeaderWrite`. `offset` is bound by `Append`'s `offset = log.endOffset`.
pub fn leader_write(cfg: &Config, s: &State, out: &mut Successors) {
    for replica in cfg.all() {
        if !presumes_leadership(s, replica) {
            continue;
        }
        let Some(id) = next_id(s.next_record_id, i16::from(cfg.max_records) - 1) else {
            return;
        };
        let record = Record {
            id,
            epoch: s.rs(replica).leader_epoch,
        };
        let offset = s.log(replica).end_offset();
        let Some(log) = s.log(replica).append(cfg, record, offset) else {
            continue;
        };
        let mut next = *s;
        next.next_record_id = s.next_record_id + 1;
        next.set_log(replica, log);
        let label = Label::new("LeaderWrite")
            .replica("replica", replica)
            .int("id", id);
        out.push(label.int("offset", offset), next);
    }
}

/// `QuorumUpdateLeaderAndIsr(leader, newIsr)`: the successor with `quorumState.isr` and
/// `replicaState[leader].isr` set, if `leader` is the true leader.
pub fn quorum_update_leader_and_isr(
    s: &State,
    leader: Replica,
    new_isr: ReplicaSet,
) -> Option<State> {
    if !is_true_leader(s, leader) || s.quorum_state.leader != Some(leader) {
        return None;
    }
    let mut next = *s;
    next.quorum_state.isr = new_isr;
    next.rs_mut(leader).isr = new_isr;
    Some(next)
}

/// `IsFollowerCaughtUp(leader, follower, endOffset)`.
pub fn is_follower_caught_up(
    s: &State,
    leader: Replica,
    follower: Replica,
    end_offset: u8,
) -> bool {
    is_following(s, follower, leader)
        && (end_offset == 0
            || (s.log(leader).entry_at(end_offset - 1).is_some()
                && s.log(follower).has_offset(end_offset - 1)))
}

/// `LeaderShrinkIsr`.
pub fn leader_shrink_isr(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        let isr = s.rs(leader).isr;
        let end_offset = s.log(leader).end_offset();
        for replica in isr.without(leader).iter() {
            if is_follower_caught_up(s, leader, replica, end_offset) {
                continue;
            }
            if let Some(next) = quorum_update_leader_and_isr(s, leader, isr.without(replica)) {
                let label = Label::new("LeaderShrinkIsr").replica("leader", leader);
                out.push(label.replica("replica", replica), next);
            }
        }
    }
}

/// `LeaderExpandIsr`.
pub fn leader_expand_isr(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        let isr = s.rs(leader).isr;
        let leader_hw = s.rs(leader).hw;
        for replica in cfg.all().filter(|&r| !isr.contains(r)) {
            if !is_follower_caught_up(s, leader, replica, leader_hw) {
                continue;
            }
            if let Some(next) = quorum_update_leader_and_isr(s, leader, isr.with(replica)) {
                let label = Label::new("LeaderExpandIsr").replica("leader", leader);
                out.push(label.replica("replica", replica), next);
            }
        }
    }
}

/// `LeaderIncHighWatermark`. `offset \in Offsets` with `offset = hw`: enabled only while
/// `hw < LogSize`.
pub fn leader_inc_high_watermark(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        let offset = s.rs(leader).hw;
        if !presumes_leadership(s, leader) || offset >= cfg.log_size {
            continue;
        }
        let all_have_it = s
            .rs(leader)
            .isr
            .iter()
            .all(|f| is_following(s, f, leader) && s.log(f).has_offset(offset));
        if all_have_it {
            let mut next = *s;
            next.rs_mut(leader).hw = offset + 1;
            out.push(
                Label::new("LeaderIncHighWatermark").replica("leader", leader),
                next,
            );
        }
    }
}

/// `BecomeFollowerAndTruncateTo(leader, replica, truncationOffset)`, one successor per
/// request. `label` names the calling action and its bindings; the request's epoch is added.
pub fn become_follower_and_truncate_to(
    s: &State,
    leader: Option<Replica>,
    replica: Replica,
    truncation_offset: u8,
    label: Label,
    out: &mut Successors,
) {
    if leader == Some(replica) {
        return;
    }
    for request in s.leader_and_isr_requests.iter() {
        if request.leader != leader || request.leader_epoch <= s.rs(replica).leader_epoch {
            continue;
        }
        let mut next = *s;
        // \/ leader = None /\ UNCHANGED replicaLog  \/ leader # None /\ TruncateTo(...)
        if leader.is_some() {
            let Some(log) = s.log(replica).truncate_to(truncation_offset) else {
                continue;
            };
            next.set_log(replica, log);
        }
        *next.rs_mut(replica) = ReplicaState {
            leader_epoch: request.leader_epoch,
            leader,
            isr: request.isr,
            hw: truncation_offset.min(s.rs(replica).hw),
        };
        out.push(label.int("requestEpoch", request.leader_epoch), next);
    }
}

/// `FollowerReplicate`.
pub fn follower_replicate(cfg: &Config, s: &State, out: &mut Successors) {
    for follower in cfg.all() {
        for leader in cfg.all() {
            if !presumes_leadership(s, leader) || !is_following(s, follower, leader) {
                continue;
            }
            let Some(log) = s.log(follower).replicate_from(cfg, s.log(leader)) else {
                continue;
            };
            let new_end_offset = s.log(follower).end_offset() + 1;
            let mut next = *s;
            next.set_log(follower, log);
            next.rs_mut(follower).hw = s.rs(leader).hw.min(new_end_offset);
            let label = Label::new("FollowerReplicate").replica("follower", follower);
            out.push(label.replica("leader", leader), next);
        }
    }
}
