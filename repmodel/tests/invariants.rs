//! The invariant checkers on hand-built states: each can fail, and fails for the reason it
//! names. Also the state key: it round-trips, and a state outside its type has none.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use roost_repmodel::base::init;
use roost_repmodel::encode::{decode, encode};
use roost_repmodel::invariants::{
    epoch_minted, leader_in_isr, leader_in_isr_unless_none, log_matching, logs_match, strong_isr,
    type_ok, weak_isr,
};
use roost_repmodel::types::{Log, Record, ReplicaSet, ReplicaState};
use roost_repmodel::{Config, State};

fn cfg(replicas: u8) -> Config {
    Config::new(replicas, 2, 3, 2).expect("fits")
}

/// A log holding `(id, epoch)` records from offset 0.
fn log(records: &[(u8, i8)]) -> Log {
    let c = cfg(2);
    records.iter().fold(Log::EMPTY, |l, &(id, epoch)| {
        l.append(&c, Record { id, epoch }, l.end_offset)
            .expect("room in the log")
    })
}

fn set(replicas: &[u8]) -> ReplicaSet {
    replicas.iter().fold(ReplicaSet::EMPTY, |s, &r| s.with(r))
}

/// Replica 0 presumes leadership in epoch 0 with `hw` and its own `isr`; the quorum agrees
/// on the leader and has `quorum_isr`.
fn leader_state(c: &Config, hw: u8, isr: &[u8], quorum_isr: &[u8], logs: &[Log]) -> State {
    let mut s = init(c);
    *s.rs_mut(0) = ReplicaState {
        hw,
        leader_epoch: 0,
        leader: Some(0),
        isr: set(isr),
    };
    s.quorum_state.leader_epoch = 0;
    s.quorum_state.leader = Some(0);
    s.quorum_state.isr = set(quorum_isr);
    for (r, l) in logs.iter().enumerate() {
        s.set_log(r as u8, *l);
    }
    s
}

#[test]
fn log_matching_on_pairs_of_logs() {
    let (m0, m1, m2) = ((0, 0), (1, 0), (2, 1));
    assert!(logs_match(&log(&[m0, m1]), &log(&[m0, m1])), "equal logs");
    assert!(logs_match(&log(&[m0]), &log(&[m0, m1])), "a prefix");
    assert!(logs_match(&log(&[]), &log(&[m0, m1])), "an empty log");
    assert!(
        logs_match(&log(&[m0, m1]), &log(&[m0, m2])),
        "same prefix, diverging after it"
    );
    assert!(
        logs_match(&log(&[m0, m1]), &log(&[m2])),
        "different records at an offset, nothing shared after"
    );
    assert!(
        !logs_match(&log(&[m0, m1]), &log(&[m2, m1])),
        "m1 at offset 1 on both, different below it"
    );
}

#[test]
fn log_matching_checks_every_pair_of_replicas() {
    let c = cfg(3);
    let mut s = init(&c);
    s.set_log(0, log(&[(0, 0), (1, 0)]));
    s.set_log(1, log(&[(0, 0)]));
    s.set_log(2, log(&[(2, 1), (1, 0)]));
    assert!(
        !log_matching(&c, &s),
        "r1 and r3 share m1 at offset 1 but not offset 0"
    );
    s.set_log(2, log(&[(0, 0), (1, 0)]));
    assert!(log_matching(&c, &s));
}

#[test]
fn weak_isr_needs_the_leaders_isr_to_hold_its_log_below_hw() {
    let c = cfg(2);
    let m0 = log(&[(0, 0)]);
    assert!(weak_isr(
        &c,
        &leader_state(&c, 1, &[0, 1], &[0, 1], &[m0, m0])
    ));
    assert!(
        !weak_isr(
            &c,
            &leader_state(&c, 1, &[0, 1], &[0, 1], &[m0, Log::EMPTY])
        ),
        "r2 lacks offset 0"
    );
    let other = log(&[(1, 0)]);
    assert!(
        !weak_isr(&c, &leader_state(&c, 1, &[0, 1], &[0, 1], &[m0, other])),
        "r2 holds another record"
    );
    assert!(
        weak_isr(
            &c,
            &leader_state(&c, 0, &[0, 1], &[0, 1], &[m0, Log::EMPTY])
        ),
        "nothing below hw 0"
    );
    let mut not_leader = leader_state(&c, 1, &[0, 1], &[0, 1], &[m0, Log::EMPTY]);
    not_leader.rs_mut(0).leader = Some(1);
    assert!(
        weak_isr(&c, &not_leader),
        "only presumed leaders are checked"
    );
}

#[test]
fn strong_isr_uses_the_quorums_isr() {
    let c = cfg(2);
    let m0 = log(&[(0, 0)]);
    let s = leader_state(&c, 1, &[0], &[0, 1], &[m0, Log::EMPTY]);
    assert!(weak_isr(&c, &s), "the leader's own ISR is {{r1}}");
    assert!(
        !strong_isr(&c, &s),
        "the quorum's ISR holds r2, which lacks offset 0"
    );
    assert!(strong_isr(
        &c,
        &leader_state(&c, 1, &[0], &[0], &[m0, Log::EMPTY])
    ));
}

#[test]
fn leader_in_isr_literal_and_unless_none() {
    let c = cfg(2);
    let s = init(&c);
    assert!(
        !leader_in_isr(&c, &s),
        "Init has no leader, and None is in no ISR"
    );
    assert!(leader_in_isr_unless_none(&c, &s));
    let elected = leader_state(&c, 0, &[0], &[0, 1], &[]);
    assert!(leader_in_isr(&c, &elected) && leader_in_isr_unless_none(&c, &elected));
    let outside = leader_state(&c, 0, &[0], &[1], &[]);
    assert!(!leader_in_isr(&c, &outside) && !leader_in_isr_unless_none(&c, &outside));
}

#[test]
fn epoch_minted_needs_every_replicas_epoch_below_next_leader_epoch() {
    let c = cfg(2);
    assert!(
        epoch_minted(&c, &init(&c)),
        "Init: no replica holds an epoch"
    );
    let mut s = leader_state(&c, 0, &[0], &[0, 1], &[]);
    assert!(
        !epoch_minted(&c, &s),
        "r1 leads epoch 0, which nextLeaderEpoch 0 says was never minted"
    );
    s.next_leader_epoch = 1;
    assert!(epoch_minted(&c, &s));
    s.rs_mut(1).leader_epoch = 1;
    assert!(!epoch_minted(&c, &s), "r2 holds epoch 1, not minted yet");
    s.next_leader_epoch = 2;
    assert!(epoch_minted(&c, &s));
}

#[test]
fn type_ok_rejects_values_outside_their_types() {
    let c = cfg(2);
    assert!(type_ok(&c, &init(&c)));
    let broken: [fn(&mut State); 5] = [
        |s| s.rs_mut(0).hw = 3,
        |s| s.rs_mut(1).isr = ReplicaSet::single(2),
        |s| s.next_record_id = 4,
        |s| s.replica_log[0].records[1] = Some(Record { id: 0, epoch: 0 }),
        |s| {
            s.replica_log[1] = Log {
                end_offset: 1,
                ..Log::EMPTY
            }
        },
    ];
    for (i, breaks) in broken.iter().enumerate() {
        let mut s = init(&c);
        breaks(&mut s);
        assert!(!type_ok(&c, &s), "case {i}");
    }
}

#[test]
fn state_keys_round_trip_and_refuse_ill_typed_states() {
    let c = cfg(3);
    let mut s = leader_state(
        &c,
        1,
        &[0, 2],
        &[0, 1, 2],
        &[log(&[(0, 0), (2, 2)]), log(&[(1, 1)])],
    );
    s.next_record_id = 3;
    let key = encode(&c, &s).expect("a type-correct state has a key");
    assert_eq!(decode(&c, key), s);
    assert_ne!(encode(&c, &init(&c)), Some(key));
    s.rs_mut(2).hw = 3;
    assert_eq!(encode(&c, &s), None);
}

#[test]
fn constants_that_do_not_fit_are_refused() {
    assert!(Config::new(5, 2, 2, 2).is_err());
    assert!(Config::new(3, 2, 2, 8).is_err(), "epochs 0..=7");
    assert!(Config::new(4, 4, 16, 3).is_err(), "more than 128 bits");
    assert!(Config::new(3, 3, 3, 7).is_err(), "132 bits");
    assert!(Config::small(3).is_ok());
    assert!(Config::new(2, 3, 3, 4).is_ok(), "74 bits, 5 epochs");
    assert!(Config::new(3, 3, 3, 4).is_ok(), "109 bits, 5 epochs");
    assert!(Config::new(2, 2, 2, 7).is_ok(), "the top epoch");
}
