//! The cluster's keys in etcd: their names in the simulator's stand-in, and the values and
//! rules of `roost_replication::election`, the REAL code the daemon's agent applies too
//! (`LeaderValue`, `IsrValue`, `may_campaign`, `isr_after_win`, `fence_after`).

use serde::Serialize;

pub use roost_replication::election::{
    fence_after, isr_after_win, may_campaign, IsrValue as IsrVal, LeaderValue as LeaderVal,
};

pub const KEY_LEADER: &str = "roost/leader";
pub const KEY_EPOCH: &str = "roost/epoch";
pub const KEY_ISR: &str = "roost/isr";
/// The replication port on every node.
pub const REPL_PORT: u16 = 7000;

pub fn decode<T: serde::de::DeserializeOwned>(value: &str) -> Result<T, String> {
    serde_json::from_str(value).map_err(|e| format!("bad value {value:?}: {e}"))
}

pub fn encode<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
