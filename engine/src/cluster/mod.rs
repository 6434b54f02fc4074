//! A cluster that fails over by itself (issue 27, docs/cluster.md): leadership and epochs
//! from etcd, a spool on every node.
//!
//! - `handle.rs`: `Cluster`, this node's handle (the etcd client, the forwarder, the view).
//! - `etcd_keys.rs`: the keys in etcd and the ISR rules (`roost_replication::election`, shared with the simulator).
//! - `agent.rs`: the loop beside the serve loop: renews this node's lease, campaigns when
//!   no one leads and this node is in sync, fences a leader whose lease may have run out,
//!   keeps the in-sync set, and tells the serve loop whom to follow.
//! - `forward.rs`: a standby's intake: each batch goes to the leader over the replication
//!   connection, and its answer is given here once this node holds the claim.
//! - `unclean.rs`: `roost cluster unclean-election`, the operator's way out when every node
//!   etcd's in-sync set names is lost (no node may campaign).
//!
//! The replication side (fencing, answers waiting for every in-sync standby) is
//! `replica/fencing.rs`; promotion into a won epoch is `Standby::promote(Lead::Won)`.

mod agent;
pub mod etcd_keys;
pub mod forward;
pub mod handle;
pub mod unclean;

use std::sync::Arc;

use crate::pipeline::Engine;
use crate::replica::Replication;
pub use handle::{find_leader, Cluster, View};

impl Cluster {
    /// Starts the agent on the current runtime.
    pub fn start(
        self: &Arc<Self>,
        engine: Arc<Engine>,
        repl: Arc<Replication>,
    ) -> tokio::task::JoinHandle<()> {
        let node = Arc::new(agent::Node { engine, repl });
        tokio::spawn(agent::run(self.clone(), node, self.stop.subscribe()))
    }
}
