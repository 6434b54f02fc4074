//! The invariants, checked by the runner every few steps (`check_logs`) and by a leader at
//! each answer (`on_answer`), as the election model states them (repmodel/src/election/
//! invariants.rs) and on the real logs:
//!
//! - **NoAckLost**: a batch a leader answered is, at the same lsn and byte for byte, in the
//!   log of every node that leads the answer's epoch or a later one.
//! - **NoTwoAnswerInOneEpoch**: no two nodes answer as leader in one epoch.
//! - **AnswersWithinLease**: a leader answers only while etcd still holds its leader key in
//!   its epoch (what the fencing margin buys).
//! - **LogsAgreeBelowHw**: records below any node's high watermark are committed: every
//!   two nodes agree below the lower of their hws, and the newest leader holds every node's
//!   committed prefix.
//! - **EveryStopStops** is checked where stops are asked (`agent.rs`, `run.rs`).

use std::sync::Arc;
use std::time::Duration;

use roost_replication::{Entry, Epoch, Lsn};

use crate::keys::{LeaderVal, KEY_LEADER};
use crate::world::{Answered, World};

/// A leader (`by`) answers the batch `entry` in `epoch` at `at`: checked, then recorded.
pub fn on_answer(w: &World, by: usize, epoch: Epoch, entry: Entry, at: Duration) {
    let twice = w
        .record()
        .answers
        .iter()
        .find(|a| a.epoch == epoch && a.by != by)
        .map(|a| a.by);
    if let Some(other) = twice {
        let (a, b) = (&w.names[other], &w.names[by]);
        w.violation(format!(
            "NoTwoAnswerInOneEpoch: {a} and {b} both answered in epoch {epoch}"
        ));
    }
    let holder = w
        .store()
        .get_at(KEY_LEADER, at)
        .and_then(|kv| serde_json::from_str::<LeaderVal>(&kv.value).ok());
    let name = &w.names[by];
    if !holder
        .as_ref()
        .is_some_and(|h| &h.name == name && h.epoch == epoch)
    {
        w.violation(format!(
            "AnswersWithinLease: {name} answered lsn {} in epoch {epoch} while etcd's leader key was {holder:?}",
            entry.lsn
        ));
    }
    w.event(format!("{name} answers lsn {} epoch {epoch}", entry.lsn));
    w.record().answers.push(Answered {
        by,
        epoch,
        entry,
        at,
    });
}

/// What the checker reads of one node.
struct NodeView {
    leader: Option<Epoch>,
    hw: Lsn,
    entries: Arc<Vec<Entry>>,
}

impl NodeView {
    fn at(&self, lsn: Lsn) -> Option<&Entry> {
        let i = usize::try_from(lsn.checked_sub(1)?).ok()?;
        self.entries.get(i)
    }
}

/// NoAckLost and LogsAgreeBelowHw over every node's log now.
pub fn check_logs(w: &World) {
    let nodes: Vec<NodeView> = w
        .logs
        .iter()
        .map(|l| NodeView {
            leader: roost_replication::LeaderLog::leader_epoch(l.as_ref()),
            hw: l.mem.hw(),
            entries: l.mem.entries_shared(),
        })
        .collect();
    // The record's lock is let go before a violation is recorded (which takes it).
    let lost = first_lost(w, &nodes, &w.record().answers);
    match lost {
        Some(v) => w.violation(v),
        None => agree_below_hw(w, &nodes),
    }
}

/// NoAckLost: the first answer a leader's log lacks, said.
fn first_lost(w: &World, nodes: &[NodeView], answers: &[Answered]) -> Option<String> {
    for (i, n) in nodes.iter().enumerate() {
        let Some(epoch) = n.leader else { continue };
        for a in answers.iter().filter(|a| a.epoch <= epoch) {
            if n.at(a.entry.lsn) != Some(&a.entry) {
                return Some(format!(
                    "NoAckLost: {} leads epoch {epoch} without lsn {} answered by {} in epoch {} (holds {:?})",
                    w.names[i], a.entry.lsn, w.names[a.by], a.epoch, n.at(a.entry.lsn)
                ));
            }
        }
    }
    None
}

fn agree_below_hw(w: &World, nodes: &[NodeView]) {
    for (i, a) in nodes.iter().enumerate() {
        for (j, b) in nodes.iter().enumerate().skip(i + 1) {
            let hw = a.hw.min(b.hw);
            if let Some(lsn) = (1..hw).find(|&l| a.at(l) != b.at(l)) {
                w.violation(format!(
                    "LogsAgreeBelowHw: {} (hw {}) and {} (hw {}) differ at lsn {lsn}: {:?} / {:?}",
                    w.names[i],
                    a.hw,
                    w.names[j],
                    b.hw,
                    a.at(lsn),
                    b.at(lsn)
                ));
                return;
            }
        }
    }
    let newest = nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| n.leader.map(|e| (e, i)))
        .max();
    let Some((_, l)) = newest else { return };
    for (i, n) in nodes.iter().enumerate() {
        if let Some(lsn) = (1..n.hw).find(|&x| n.at(x) != nodes[l].at(x)) {
            w.violation(format!(
                "LogsAgreeBelowHw: leader {} lacks {}'s committed lsn {lsn} (hw {})",
                w.names[l], w.names[i], n.hw
            ));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::Config;
    use roost_repmodel::election::Flaws;

    fn world() -> World {
        World::new(Config::new(0, Flaws::NONE), 3)
    }

    /// Goal: the checker can fail. Method: n0 answers lsn 1 in epoch 1; n1 leads epoch 2
    /// with another record at lsn 1: NoAckLost. And two logs that differ below both hws:
    /// LogsAgreeBelowHw.
    #[test]
    fn the_checker_flags_a_lost_answer_and_disagreeing_logs() {
        let w = world();
        w.logs[0].mem.become_leader(1, &[]);
        w.logs[0].mem.write_durable(0, b"a");
        let entry = w.logs[0].mem.entries()[0].clone();
        w.record().answers.push(Answered {
            by: 0,
            epoch: 1,
            entry,
            at: Duration::ZERO,
        });
        check_logs(&w);
        assert!(
            w.record().violations.is_empty(),
            "{:?}",
            w.record().violations
        );
        w.logs[0].mem.resign();
        w.logs[1].mem.seed(&[(1, b"b")]);
        w.logs[1].mem.become_leader(2, &[]);
        check_logs(&w);
        let v = w.record().violations.clone();
        assert!(v.iter().any(|v| v.starts_with("NoAckLost")), "{v:?}");

        let w = world();
        for (i, p) in [(0, b"x"), (1, b"y")] {
            w.logs[i].mem.become_leader(1, &[]);
            w.logs[i].mem.write_durable(0, p);
            w.logs[i].mem.write_durable(0, p);
            w.logs[i].mem.resign();
        }
        check_logs(&w);
        let v = w.record().violations.clone();
        assert!(v.iter().any(|v| v.starts_with("LogsAgreeBelowHw")), "{v:?}");
    }

    /// Goal: an answer given by two nodes in one epoch, or without etcd naming the leader,
    /// is flagged at once.
    #[test]
    fn two_answerers_in_one_epoch_and_an_answer_outside_the_lease_are_flagged() {
        let w = world();
        let e = Entry {
            lsn: 1,
            epoch: 1,
            kind: 0,
            payload: vec![],
        };
        on_answer(&w, 0, 1, e.clone(), Duration::ZERO);
        let v = w.record().violations.clone();
        assert!(
            v.iter().any(|v| v.starts_with("AnswersWithinLease")),
            "{v:?}"
        );
        on_answer(&w, 1, 1, e, Duration::ZERO);
        let v = w.record().violations.clone();
        assert!(
            v.iter().any(|v| v.starts_with("NoTwoAnswerInOneEpoch")),
            "{v:?}"
        );
    }
}
