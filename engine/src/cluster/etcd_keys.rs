//! The cluster's keys in etcd and the election's pure rules: `roost_replication::election`
//! (docs/cluster.md), shared with the simulator (`sim/`), so both run the same rules.

pub use roost_replication::election::*;
