//! `roost-replication`: the WAL replication protocol of `Kip320.tla` (see
//! docs/replication.md).
#![forbid(unsafe_code)]

mod log;

pub use log::{Entry, Epoch, EpochEnd, FollowerLog, LeaderLog, Lsn};
