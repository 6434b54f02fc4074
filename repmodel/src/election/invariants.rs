//! The election model's invariants, each a predicate on one state (the answers' history is
//! part of the state).

use super::state::{Answer, Config, State};
use crate::invariants::Invariant;

/// Every invariant, in report order.
pub const INVARIANTS: [Invariant<Config, State>; 4] = [
    Invariant {
        name: "NoTwoAnswerInOneEpoch",
        source: "issue 27",
        check: no_two_answer_in_one_epoch,
    },
    Invariant {
        name: "AnswersWithinLease",
        source: "issue 27",
        check: answers_within_lease,
    },
    Invariant {
        name: "NoAckLost",
        source: "issue 27",
        check: no_ack_lost,
    },
    Invariant {
        name: "OneLeaderKey",
        source: "issue 27",
        check: one_leader_key,
    },
];

/// Looks an invariant up by name.
pub fn by_name(name: &str) -> Option<Invariant<Config, State>> {
    INVARIANTS.into_iter().find(|i| i.name == name)
}

/// The answers leaders gave themselves (not those a forwarding standby relayed).
fn leader_answers<'a>(cfg: &Config, s: &'a State) -> impl Iterator<Item = Answer> + 'a {
    s.batches[..usize::from(cfg.batches)]
        .iter()
        .filter(|b| b.via.is_none())
        .filter_map(|b| b.answer)
}

/// No two distinct nodes answer as leader in one epoch. (A forwarding standby's answer
/// relays its leader's acknowledgement; it is not a second answerer.)
pub fn no_two_answer_in_one_epoch(cfg: &Config, s: &State) -> bool {
    leader_answers(cfg, s)
        .all(|a| leader_answers(cfg, s).all(|b| a.epoch != b.epoch || a.by == b.by))
}

/// Every leader's answer was given while the store still held that leader's key in its
/// epoch: no answer overlaps another node's term. What the fencing margin buys, when the
/// check and the act are one step.
pub fn answers_within_lease(cfg: &Config, s: &State) -> bool {
    leader_answers(cfg, s).all(|a| a.in_lease)
}

/// Every answered batch is in the log of every node that leads in the answer's epoch or a
/// later one (checked in every state, so also in the last leader's log).
pub fn no_ack_lost(cfg: &Config, s: &State) -> bool {
    s.batches[..usize::from(cfg.batches)]
        .iter()
        .enumerate()
        .filter_map(|(b, batch)| batch.answer.map(|a| (b as u8, a.epoch)))
        .all(|(b, epoch)| {
            cfg.all().all(|n| {
                let node = s.node(n);
                !node.is_leader() || node.epoch < epoch || node.log.offset_of(b).is_some()
            })
        })
}

/// The store holds one leader key (by construction: one `holder`), and at most one node
/// believes it holds it: a leader whose own view of its lease has not run out is the key's
/// holder, in its epoch.
pub fn one_leader_key(cfg: &Config, s: &State) -> bool {
    cfg.all()
        .filter(|&n| s.node(n).is_leader() && s.node(n).deadline > 0)
        .all(|n| s.holds_key(n))
}
