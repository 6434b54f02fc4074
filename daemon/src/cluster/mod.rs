//! A cluster that fails over by itself (issue 27, docs/cluster.md): leadership and epochs
//! from etcd, a spool on every node.
//!
//! - `handle.rs`: `Cluster`, this node's handle (the etcd client, the forwarder, the view).
//! - `etcd_keys.rs`: the keys in etcd and their values, the ISR rules (who may campaign).
//! - `agent.rs`: the loop beside the serve loop: renews this node's lease, campaigns when
//!   no one leads and this node is in sync, fences a leader whose lease may have run out,
//!   keeps the in-sync set, and tells the serve loop whom to follow.
//! - `forward.rs`: a standby's intake: each batch goes to the leader over the replication
//!   connection, and its answer is given here once this node holds the claim.
//!
//! The engine's side (promotion into a won epoch, fencing, answers waiting for every
//! in-sync standby) is `pipeline/cluster.rs`.

mod agent;
pub mod etcd_keys;
pub mod forward;
pub mod handle;

use std::sync::Arc;

use crate::pipeline::Engine;
pub use handle::{find_leader, Cluster, View};

impl Cluster {
    /// Starts the agent on the current runtime.
    pub fn start(self: &Arc<Self>, engine: Arc<Engine>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(agent::run(self.clone(), engine, self.stop.subscribe()))
    }
}
