//! The constants and variables of `KafkaReplication.tla`, as Rust types.
//!
//! TLA+ sets become fixed-size arrays and bitmasks so a state is `Copy` and packs into one
//! `u128` (`encode.rs`). The arrays are sized for the largest model the packing can hold;
//! `Config::new` (`config.rs`) refuses constants that do not fit.

use std::fmt;

/// Capacity of the per-replica arrays (`Replicas` has at most this many elements).
pub const MAX_REPLICAS: usize = 4;
/// Capacity of a log's record array (`LogSize` is at most this).
pub const MAX_LOG_SIZE: usize = 4;
/// Capacity of the request map: one slot per epoch `0..=MaxLeaderEpoch` (so MaxLeaderEpoch is
/// at most 7; 4 slots refused MaxLeaderEpoch 4, whose states need only 74 bits at 2 replicas).
pub const MAX_EPOCHS: usize = 8;

/// An element of `Replicas`: `r1` is 0, `r2` is 1, ...
pub type Replica = u8;

/// `Nil == -1`: the leader epoch of a replica that has seen no LeaderAndIsr request yet.
pub const NIL: i8 = -1;

/// CONSTANTS Replicas, LogSize, MaxRecords, MaxLeaderEpoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// `Replicas == {r1, ..., rN}`: N.
    pub replicas: u8,
    pub log_size: u8,
    pub max_records: u8,
    pub max_leader_epoch: u8,
}

/// Constants the model cannot hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// `\A r \in Replicas` / `\E r \in Replicas`.
    pub fn all(&self) -> impl Iterator<Item = Replica> + Clone {
        0..self.replicas
    }

    /// `Replicas` as a set.
    pub fn replica_set(&self) -> ReplicaSet {
        ReplicaSet((1u8 << self.replicas) - 1)
    }

    /// `ReplicaLog!Offsets == 0 .. LogSize - 1`.
    pub fn offsets(&self) -> std::ops::Range<u8> {
        0..self.log_size
    }
}

/// An element of `SUBSET Replicas`, as a bitmask (bit i is replica i).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReplicaSet(pub u8);

impl ReplicaSet {
    pub const EMPTY: ReplicaSet = ReplicaSet(0);

    pub fn contains(self, r: Replica) -> bool {
        r < 8 && self.0 & (1 << r) != 0
    }

    /// `self \union {r}`.
    pub fn with(self, r: Replica) -> ReplicaSet {
        ReplicaSet(self.0 | (1 << r))
    }

    /// `self \ {r}`.
    pub fn without(self, r: Replica) -> ReplicaSet {
        ReplicaSet(self.0 & !(1 << r))
    }

    /// `{r}`.
    pub fn single(r: Replica) -> ReplicaSet {
        ReplicaSet(1 << r)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Replica> {
        (0..8u8).filter(move |&r| self.contains(r))
    }
}

/// An element of `LogRecords == [id : RecordSeq!IdSet, epoch : LeaderEpochSeq!IdSet]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    pub id: u8,
    pub epoch: i8,
}

/// A replica's log in `FiniteReplicatedLog`: `[endOffset, records : [Offsets -> LogRecords
/// \union {Nil}]]`. `None` in `records` is `Nil`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Log {
    pub end_offset: u8,
    pub records: [Option<Record>; MAX_LOG_SIZE],
}

/// An element of `ReplicaState == [hw, leaderEpoch, leader, isr]`. `leader: None` is `None`
/// (the string "NONE" in the spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplicaState {
    pub hw: u8,
    pub leader_epoch: i8,
    pub leader: Option<Replica>,
    pub isr: ReplicaSet,
}

/// An element of `QuorumState == [leaderEpoch, leader, isr]`; also the type of a
/// LeaderAndIsr request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuorumState {
    pub leader_epoch: i8,
    pub leader: Option<Replica>,
    pub isr: ReplicaSet,
}

/// `leaderAndIsrRequests`, a subset of `QuorumState`, stored as a map from epoch to
/// `(leader, isr)`.
///
/// Interpretation: every request is made by `ControllerUpdateIsr`, whose epoch comes from
/// `LeaderEpochSeq!NextId` and is therefore fresh, so no two requests share an epoch and
/// nothing is lost by keying the set on it. `insert` asserts the slot is free (debug builds,
/// which is what `cargo test` runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Requests {
    pub by_epoch: [Option<(Option<Replica>, ReplicaSet)>; MAX_EPOCHS],
}

impl Requests {
    /// `leaderAndIsrRequests \union {request}`.
    pub fn insert(&mut self, request: QuorumState) {
        let slot = &mut self.by_epoch[request.leader_epoch as usize];
        debug_assert!(slot.is_none(), "two LeaderAndIsr requests with one epoch");
        *slot = Some((request.leader, request.isr));
    }

    /// `\E leaderAndIsrRequest \in leaderAndIsrRequests`.
    pub fn iter(&self) -> impl Iterator<Item = QuorumState> + '_ {
        self.by_epoch
            .iter()
            .enumerate()
            .filter_map(|(epoch, slot)| {
                slot.map(|(leader, isr)| QuorumState {
                    leader_epoch: epoch as i8,
                    leader,
                    isr,
                })
            })
    }
}

/// VARIABLES replicaLog, replicaState, nextRecordId, nextLeaderEpoch, leaderAndIsrRequests,
/// quorumState. Slots past `Config::replicas` stay at their default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub replica_log: [Log; MAX_REPLICAS],
    pub replica_state: [ReplicaState; MAX_REPLICAS],
    pub next_record_id: u8,
    pub next_leader_epoch: u8,
    pub leader_and_isr_requests: Requests,
    pub quorum_state: QuorumState,
}

impl State {
    /// `replicaLog[r]`.
    pub fn log(&self, r: Replica) -> &Log {
        &self.replica_log[usize::from(r)]
    }

    /// `replicaState[r]`.
    pub fn rs(&self, r: Replica) -> &ReplicaState {
        &self.replica_state[usize::from(r)]
    }

    pub fn rs_mut(&mut self, r: Replica) -> &mut ReplicaState {
        &mut self.replica_state[usize::from(r)]
    }

    pub fn set_log(&mut self, r: Replica, log: Log) {
        self.replica_log[usize::from(r)] = log;
    }
}
