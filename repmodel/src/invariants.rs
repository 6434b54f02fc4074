//! The invariants: the four `KafkaReplication.tla` defines (`TypeOk`, `WeakIsr`, `StrongIsr`,
//! `LeaderInIsr`), one reading of `LeaderInIsr` that tolerates "no leader", log matching, and
//! `EpochMinted` (no replica holds an epoch the controller never minted).

use crate::base::presumes_leadership;
use crate::types::{Config, Log, QuorumState, Record, ReplicaSet, State, MAX_LOG_SIZE, NIL};

/// A named state predicate (of the Kafka family's states unless told otherwise).
pub struct Invariant<C = Config, S = State> {
    pub name: &'static str,
    /// Where it is defined.
    pub source: &'static str,
    pub check: fn(&C, &S) -> bool,
}

impl<C, S> Clone for Invariant<C, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C, S> Copy for Invariant<C, S> {}

/// Every invariant, in report order.
pub const INVARIANTS: [Invariant; 7] = [
    Invariant {
        name: "TypeOk",
        source: "KafkaReplication.tla",
        check: type_ok,
    },
    Invariant {
        name: "WeakIsr",
        source: "KafkaReplication.tla",
        check: weak_isr,
    },
    Invariant {
        name: "StrongIsr",
        source: "KafkaReplication.tla",
        check: strong_isr,
    },
    Invariant {
        name: "LeaderInIsr",
        source: "KafkaReplication.tla",
        check: leader_in_isr,
    },
    Invariant {
        name: "LeaderInIsrUnlessNone",
        source: "interpretation",
        check: leader_in_isr_unless_none,
    },
    Invariant {
        name: "LogMatching",
        source: "issue 15",
        check: log_matching,
    },
    Invariant {
        name: "EpochMinted",
        source: "issue 26",
        check: epoch_minted,
    },
];

/// Looks an invariant up by name.
pub fn by_name(name: &str) -> Option<Invariant> {
    INVARIANTS.into_iter().find(|i| i.name == name)
}

/// `r \in LogRecords`.
fn is_log_record(cfg: &Config, r: Record) -> bool {
    r.id < cfg.max_records && (0..=cfg.max_leader_epoch as i8).contains(&r.epoch)
}

/// `LeaderEpochOpt == LeaderEpochSeq!IdSet \union {Nil}`.
fn is_leader_epoch_opt(cfg: &Config, e: i8) -> bool {
    e == NIL || (0..=cfg.max_leader_epoch as i8).contains(&e)
}

/// `ReplicaOpt`, `SUBSET Replicas`.
fn is_replica_opt(cfg: &Config, r: Option<u8>) -> bool {
    r.is_none_or(|r| r < cfg.replicas)
}

fn is_replica_subset(cfg: &Config, set: ReplicaSet) -> bool {
    set.0 & !cfg.replica_set().0 == 0
}

/// `q \in QuorumState`.
fn is_quorum_state(cfg: &Config, q: QuorumState) -> bool {
    is_leader_epoch_opt(cfg, q.leader_epoch)
        && is_replica_opt(cfg, q.leader)
        && is_replica_subset(cfg, q.isr)
}

/// `ReplicaLogTypeOk(replica)`: the domain `Offsets` holds records or `Nil`, the written
/// offsets hold records, the unwritten ones `Nil` (slots past `LogSize` are outside the
/// function's domain and must stay empty).
fn replica_log_type_ok(cfg: &Config, log: &Log) -> bool {
    log.end_offset <= cfg.log_size
        && (0..MAX_LOG_SIZE).all(|offset| match log.records[offset] {
            Some(r) => offset < usize::from(log.end_offset) && is_log_record(cfg, r),
            None => offset >= usize::from(log.end_offset),
        })
}

/// `TypeOk`.
pub fn type_ok(cfg: &Config, s: &State) -> bool {
    let sequences =
        s.next_leader_epoch <= cfg.max_leader_epoch + 1 && s.next_record_id <= cfg.max_records;
    let logs = cfg.all().all(|r| replica_log_type_ok(cfg, s.log(r)));
    let replica_states = cfg.all().all(|r| {
        let rs = s.rs(r);
        rs.hw <= cfg.log_size
            && is_leader_epoch_opt(cfg, rs.leader_epoch)
            && is_replica_opt(cfg, rs.leader)
            && is_replica_subset(cfg, rs.isr)
    });
    let requests = s
        .leader_and_isr_requests
        .iter()
        .all(|q| is_quorum_state(cfg, q));
    sequences && logs && replica_states && is_quorum_state(cfg, s.quorum_state) && requests
}

/// The body shared by `WeakIsr` and `StrongIsr`: every presumed leader `r1` with `hw > 0` has,
/// for every `r2` in `isr(r1)` and offset below its hw, a record that both logs hold there.
fn isr_holds_log_below_hw(cfg: &Config, s: &State, isr: impl Fn(u8) -> ReplicaSet) -> bool {
    cfg.all().all(|r1| {
        if !presumes_leadership(s, r1) {
            return true;
        }
        let hw = s.rs(r1).hw;
        isr(r1).iter().all(|r2| {
            (0..hw).all(|offset| {
                let record = s.log(r1).entry_at(offset);
                record.is_some() && record == s.log(r2).entry_at(offset)
            })
        })
    })
}

/// `WeakIsr`: over the presumed leader's own idea of the ISR.
pub fn weak_isr(cfg: &Config, s: &State) -> bool {
    isr_holds_log_below_hw(cfg, s, |r1| s.rs(r1).isr)
}

/// `StrongIsr`: over the quorum's ISR.
pub fn strong_isr(cfg: &Config, s: &State) -> bool {
    isr_holds_log_below_hw(cfg, s, |_| s.quorum_state.isr)
}

/// `LeaderInIsr == quorumState.leader \in quorumState.isr`, literally: false whenever the
/// quorum has no leader (`None` is never in the ISR), which includes `Init`.
pub fn leader_in_isr(_cfg: &Config, s: &State) -> bool {
    s.quorum_state
        .leader
        .is_some_and(|l| s.quorum_state.isr.contains(l))
}

/// Interpretation of `LeaderInIsr` after its comment ("even if all brokers failed, we still
/// keep the leader in ISR"): `quorumState.leader # None => quorumState.leader \in
/// quorumState.isr`.
pub fn leader_in_isr_unless_none(_cfg: &Config, s: &State) -> bool {
    s.quorum_state
        .leader
        .is_none_or(|l| s.quorum_state.isr.contains(l))
}

/// Log matching: if two replicas hold the same record at an offset, their logs are equal up to
/// and including that offset.
pub fn log_matching(cfg: &Config, s: &State) -> bool {
    cfg.all().all(|r1| {
        cfg.all()
            .filter(|&r2| r2 > r1)
            .all(|r2| logs_match(s.log(r1), s.log(r2)))
    })
}

/// Log matching for one pair of logs.
pub fn logs_match(a: &Log, b: &Log) -> bool {
    let common = a.end_offset.min(b.end_offset);
    (0..common).all(|offset| {
        let same_here = a.entry_at(offset).is_some() && a.entry_at(offset) == b.entry_at(offset);
        !same_here || (0..offset).all(|below| a.entry_at(below) == b.entry_at(below))
    })
}

/// `EpochMinted`: every replica's leader epoch is `Nil` or one `LeaderEpochSeq` has handed out
/// (`< nextLeaderEpoch`). A replica holding an epoch the controller has not reached refuses
/// every LeaderAndIsr request up to it (`BecomeLeader` and the followers' truncations need a
/// request epoch above the replica's): it is lost to the partition until the controller
/// catches up, and forever if the epoch is the last one. Holds in every variant (epochs come
/// only from requests); `outsider.rs` shows what breaks it.
pub fn epoch_minted(cfg: &Config, s: &State) -> bool {
    cfg.all().all(|r| {
        let epoch = s.rs(r).leader_epoch;
        epoch == NIL || i16::from(epoch) < i16::from(s.next_leader_epoch)
    })
}
