//! The cluster's election in etcd (docs/cluster.md): its keys and values, and the pure rules
//! the cluster agent (`engine/src/cluster/agent.rs`) and the simulator (`sim/`) both apply:
//! who may campaign, the in-sync set a win writes, how long a renewal keeps a leader
//! answering. The keys, all under `[cluster] prefix`:
//!
//! | key | value | written by |
//! |---|---|---|
//! | `PREFIX/leader` | [`LeaderValue`] | the winning transaction, under the winner's lease |
//! | `PREFIX/epoch` | the last epoch won, decimal | the winning transaction |
//! | `PREFIX/isr` | [`IsrValue`]: the nodes that hold every acknowledged batch | the winning transaction, then the leader (guarded by its leader key) |
//! | `PREFIX/members/NAME` | [`MemberValue`] | each node, under its own lease |
//! | `PREFIX/switchover` | [`SwitchoverValue`] | `roost cluster switchover`, under a short lease of its own; deleted by the next winning transaction |
//!
//! Values are JSON; a value this node cannot read is an error naming the key (never taken
//! for absent: an unreadable ISR must not let anyone campaign).

use serde::{Deserialize, Serialize};

/// The keys of one cluster.
#[derive(Clone, Debug)]
pub struct Keys {
    pub leader: String,
    pub epoch: String,
    pub isr: String,
    pub members: String,
    pub switchover: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            leader: format!("{prefix}/leader"),
            epoch: format!("{prefix}/epoch"),
            isr: format!("{prefix}/isr"),
            members: format!("{prefix}/members/"),
            switchover: format!("{prefix}/switchover"),
        }
    }

    pub fn member(&self, name: &str) -> String {
        format!("{}{name}", self.members)
    }
}

/// Who leads, from which epoch, and where the others fetch from and forward to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderValue {
    pub name: String,
    pub advertise: String,
    pub epoch: u32,
}

/// The in-sync set: every node named here holds every batch acknowledged so far (the
/// leader's answers wait for each of them); only they may campaign. `leader` is the node
/// that wrote it (it leaves the set at the next election: it must rejoin first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsrValue {
    pub epoch: u32,
    pub leader: String,
    pub members: Vec<String>,
}

/// A node as it says it is (for status).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberValue {
    pub name: String,
    pub advertise: String,
    pub role: String,
}

/// A planned change of leader asked for (issue 42, `roost cluster switchover NAME`): the
/// leader `from` of `epoch` hands over to `to`, a member of the in-sync set. Stale once
/// another epoch is won; its lease removes it if nobody acts on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchoverValue {
    pub from: String,
    pub to: String,
    pub epoch: u32,
}

impl SwitchoverValue {
    /// Whether it asks the leader `name` of `epoch` to hand over, to a member of `isr`.
    pub fn asks(&self, name: &str, epoch: u32, isr: &[String]) -> bool {
        self.from == name && self.epoch == epoch && self.to != name && isr.contains(&self.to)
    }
}

/// Reads a JSON value, naming the key when it is not one.
pub fn decode<T: for<'a> Deserialize<'a>>(key: &str, bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "etcd key {key} holds {:?}, not what roost writes there: {e}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(120)])
        )
    })
}

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

/// The ISR after `winner` wins: the old set without the old leader (not in sync with the
/// new epoch until it rejoins), with the winner.
pub fn isr_after_win(old: Option<&IsrValue>, winner: &str) -> Vec<String> {
    let mut m: Vec<String> = old
        .map(|v| {
            v.members
                .iter()
                .filter(|n| **n != v.leader)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    if !m.iter().any(|n| n == winner) {
        m.push(winner.to_owned());
    }
    m.sort();
    m
}

/// How long after a renewal was sent a leader may still answer under a lease of `ttl`: the
/// TTL less a quarter of it, the fencing margin (`RoostElection`'s `margin`: it covers a
/// clock that runs slow by up to a quarter against etcd's).
pub fn fence_after(ttl: std::time::Duration) -> std::time::Duration {
    ttl - ttl / 4
}

/// Whether `name` may campaign under `isr`: a member of it, or anyone while there is none
/// (a cluster that never elected: nothing was acknowledged yet).
pub fn may_campaign(isr: Option<&IsrValue>, name: &str) -> bool {
    isr.is_none_or(|v| v.members.iter().any(|n| n == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_answers_for_three_quarters_of_its_ttl_after_a_renewal() {
        use std::time::Duration;
        assert_eq!(fence_after(Duration::from_secs(4)), Duration::from_secs(3));
        assert_eq!(
            fence_after(Duration::from_millis(1000)),
            Duration::from_millis(750)
        );
    }

    fn isr(leader: &str, members: &[&str]) -> IsrValue {
        IsrValue {
            epoch: 3,
            leader: leader.into(),
            members: members.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn only_in_sync_nodes_campaign_and_the_old_leader_leaves_the_set() {
        let v = isr("a", &["a", "b"]);
        assert!(may_campaign(Some(&v), "b"));
        assert!(
            !may_campaign(Some(&v), "c"),
            "a node out of sync campaigned"
        );
        assert!(may_campaign(None, "c"), "a fresh cluster elects anyone");
        assert_eq!(isr_after_win(Some(&v), "b"), vec!["b".to_string()]);
        assert_eq!(
            isr_after_win(Some(&isr("a", &["a", "b", "c"])), "c"),
            vec!["b", "c"]
        );
        assert_eq!(isr_after_win(None, "c"), vec!["c"]);
    }

    #[test]
    fn a_switchover_asks_only_its_leader_in_its_epoch_for_an_in_sync_target() {
        let v = SwitchoverValue {
            from: "a".into(),
            to: "b".into(),
            epoch: 4,
        };
        let isr = ["a".to_string(), "b".to_string()];
        assert!(v.asks("a", 4, &isr));
        assert!(!v.asks("c", 4, &isr), "another node handed over");
        assert!(!v.asks("a", 5, &isr), "a stale request was acted on");
        assert!(
            !v.asks("a", 4, &isr[..1]),
            "handed over to a node out of sync"
        );
        let to_self = SwitchoverValue {
            to: "a".into(),
            ..v
        };
        assert!(!to_self.asks("a", 4, &isr), "handed over to itself");
    }

    #[test]
    fn an_unreadable_value_is_an_error_naming_its_key() {
        let e = decode::<IsrValue>("/roost/x/isr", b"garbage").expect_err("not JSON");
        assert!(e.contains("/roost/x/isr"), "{e}");
    }
}
