//! The cluster's keys in etcd and the rules over them: a PORT of daemon/src/cluster/
//! etcd_keys.rs (the leader key under the leader's lease, the epoch counter, the in-sync
//! set written only under the leader's key; `may_campaign`, `isr_after_win`), with values as
//! JSON.

use serde::{Deserialize, Serialize};

pub const KEY_LEADER: &str = "roost/leader";
pub const KEY_EPOCH: &str = "roost/epoch";
pub const KEY_ISR: &str = "roost/isr";
/// The replication port on every node.
pub const REPL_PORT: u16 = 7000;

/// The leader key's value (`LeaderValue`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderVal {
    pub name: String,
    pub epoch: u32,
}

/// The ISR key's value (`IsrValue`): written only under the leader's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsrVal {
    pub epoch: u32,
    pub leader: String,
    pub members: Vec<String>,
}

/// `etcd_keys::may_campaign`.
pub fn may_campaign(isr: Option<&IsrVal>, name: &str) -> bool {
    isr.is_none_or(|v| v.members.iter().any(|n| n == name))
}

/// `etcd_keys::isr_after_win`.
pub fn isr_after_win(old: Option<&IsrVal>, winner: &str) -> Vec<String> {
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

pub fn decode<T: serde::de::DeserializeOwned>(value: &str) -> Result<T, String> {
    serde_json::from_str(value).map_err(|e| format!("bad value {value:?}: {e}"))
}

pub fn encode<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
