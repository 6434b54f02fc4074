//! The verdicts of the four variants at 2 and 3 replicas with the models' constants
//! (LogSize 2, MaxRecords 2, MaxLeaderEpoch 2), pinned: a change in any count, any verdict or
//! any shortest counterexample's length fails here. `docs/replication-model.md` explains them.
//!
//! With MaxRecords 2 log matching cannot fail (a record sits at the offset where it was
//! written, so breaking it takes three records); the `*_three_records` rows run MaxRecords 3.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{assert_pinned, report, Expect};
use roost_repmodel::Variant::{self, Hw, Kip101, Kip279, Kip320};

const HOLDS: Option<usize> = None;

fn fails(states: usize) -> Option<usize> {
    Some(states)
}

#[test]
fn hw_two_replicas() {
    assert_pinned(&Expect {
        variant: Hw,
        replicas: 2,
        max_records: 2,
        distinct: 10131,
        generated: 24459,
        depth: 20,
        cex: [HOLDS, fails(9), fails(10), fails(1), HOLDS, HOLDS, HOLDS],
    });
}

#[test]
fn hw_three_replicas() {
    assert_pinned(&Expect {
        variant: Hw,
        replicas: 3,
        max_records: 2,
        distinct: 1988158,
        generated: 7491589,
        depth: 28,
        cex: [HOLDS, fails(9), fails(9), fails(1), HOLDS, HOLDS, HOLDS],
    });
}

#[test]
fn kip101_two_replicas() {
    assert_pinned(&Expect {
        variant: Kip101,
        replicas: 2,
        max_records: 2,
        distinct: 9045,
        generated: 21447,
        depth: 18,
        cex: [HOLDS, fails(12), fails(12), fails(1), HOLDS, HOLDS, HOLDS],
    });
}

#[test]
fn kip101_three_replicas() {
    assert_pinned(&Expect {
        variant: Kip101,
        replicas: 3,
        max_records: 2,
        distinct: 1613089,
        generated: 5796838,
        depth: 26,
        cex: [HOLDS, fails(11), fails(11), fails(1), HOLDS, HOLDS, HOLDS],
    });
}

#[test]
fn kip279_two_replicas() {
    assert_pinned(&Expect {
        variant: Kip279,
        replicas: 2,
        max_records: 2,
        distinct: 9027,
        generated: 23425,
        depth: 18,
        cex: [HOLDS, HOLDS, HOLDS, fails(1), HOLDS, HOLDS, HOLDS],
    });
}

#[test]
fn kip279_three_replicas() {
    assert_pinned(&Expect {
        variant: Kip279,
        replicas: 3,
        max_records: 2,
        distinct: 1616461,
        generated: 6718690,
        depth: 26,
        cex: [HOLDS, fails(11), fails(11), fails(1), HOLDS, HOLDS, HOLDS],
    });
}

#[test]
fn kip320_two_replicas() {
    assert_pinned(&Expect {
        variant: Kip320,
        replicas: 2,
        max_records: 2,
        distinct: 5973,
        generated: 11839,
        depth: 18,
        cex: [HOLDS, HOLDS, HOLDS, fails(1), HOLDS, HOLDS, HOLDS],
    });
}

#[test]
fn kip320_three_replicas() {
    assert_pinned(&Expect {
        variant: Kip320,
        replicas: 3,
        max_records: 2,
        distinct: 737794,
        generated: 1967560,
        depth: 26,
        cex: [HOLDS, HOLDS, HOLDS, fails(1), HOLDS, HOLDS, HOLDS],
    });
}

#[test]
fn three_records_two_replicas() {
    let rows = [
        (
            Hw,
            16949,
            39227,
            21,
            [
                HOLDS,
                fails(9),
                fails(10),
                fails(1),
                HOLDS,
                fails(13),
                HOLDS,
            ],
        ),
        (
            Kip101,
            15055,
            34265,
            19,
            [
                HOLDS,
                fails(12),
                fails(12),
                fails(1),
                HOLDS,
                fails(12),
                HOLDS,
            ],
        ),
        (
            Kip279,
            14915,
            36369,
            19,
            [HOLDS, HOLDS, HOLDS, fails(1), HOLDS, HOLDS, HOLDS],
        ),
        (
            Kip320,
            10595,
            20601,
            19,
            [HOLDS, HOLDS, HOLDS, fails(1), HOLDS, HOLDS, HOLDS],
        ),
    ];
    for (variant, distinct, generated, depth, cex) in rows {
        assert_pinned(&Expect {
            variant,
            replicas: 2,
            max_records: 3,
            distinct,
            generated,
            depth,
            cex,
        });
    }
}

fn three_records_three_replicas(variant: Variant) {
    let (distinct, generated, depth, cex) = match variant {
        Hw => (
            4078546,
            14773327,
            30,
            [HOLDS, fails(9), fails(9), fails(1), HOLDS, fails(13), HOLDS],
        ),
        Kip101 => (
            3386155,
            11722588,
            28,
            [
                HOLDS,
                fails(11),
                fails(11),
                fails(1),
                HOLDS,
                fails(12),
                HOLDS,
            ],
        ),
        Kip279 => (
            3310783,
            12998290,
            27,
            [
                HOLDS,
                fails(11),
                fails(11),
                fails(1),
                HOLDS,
                fails(13),
                HOLDS,
            ],
        ),
        Kip320 => (
            1694476,
            4617910,
            27,
            [HOLDS, HOLDS, HOLDS, fails(1), HOLDS, HOLDS, HOLDS],
        ),
    };
    assert_pinned(&Expect {
        variant,
        replicas: 3,
        max_records: 3,
        distinct,
        generated,
        depth,
        cex,
    });
}

#[test]
fn hw_three_records_three_replicas() {
    three_records_three_replicas(Hw);
}

#[test]
fn kip101_three_records_three_replicas() {
    three_records_three_replicas(Kip101);
}

#[test]
fn kip279_three_records_three_replicas() {
    three_records_three_replicas(Kip279);
}

#[test]
fn kip320_three_records_three_replicas() {
    three_records_three_replicas(Kip320);
}

/// The protocol roost implements is the variant that keeps every invariant at 3 replicas
/// (reading `LeaderInIsr` as `LeaderInIsrUnlessNone`: the literal one fails in `Init` in
/// every variant).
#[test]
fn only_kip320_keeps_every_invariant_at_three_replicas() {
    let keeps_all = |v: Variant| {
        [2, 3].iter().all(|&records| {
            report(v, 3, records)
                .verdicts
                .iter()
                .all(|x| x.invariant == "LeaderInIsr" || x.holds())
        })
    };
    let safe: Vec<Variant> = Variant::ALL.into_iter().filter(|&v| keeps_all(v)).collect();
    assert_eq!(safe, vec![Kip320]);
}

/// `FencedLeaderShrinkIsr`'s condition is a disjunction in the action: with both disjuncts
/// true (the follower is off the leader's epoch and behind it) TLC generates the successor
/// once per disjunct, with one true disjunct once.
#[test]
fn fenced_leader_shrink_isr_yields_one_successor_per_true_disjunct() {
    use roost_repmodel::base;
    use roost_repmodel::types::{QuorumState, Record, ReplicaSet};
    use roost_repmodel::variants::kip320::fenced_leader_shrink_isr;
    use roost_repmodel::{Config, State, Successors};

    let cfg = Config::small(2).expect("fits");
    let both = ReplicaSet::EMPTY.with(0).with(1);
    let mut s = base::init(&cfg);
    let q = QuorumState {
        leader_epoch: 0,
        leader: Some(0),
        isr: both,
    };
    s.quorum_state = q;
    s.leader_and_isr_requests.insert(q);
    s.next_leader_epoch = 1;
    let r1 = s.rs_mut(0);
    (r1.leader_epoch, r1.leader, r1.isr) = (0, Some(0), both);
    let m0 = Record { id: 0, epoch: 0 };
    let log = s.log(0).append(&cfg, m0, 0).expect("room for m0");
    s.set_log(0, log);
    s.next_record_id = 1;
    let count = |s: &State| {
        let mut out = Successors::default();
        fenced_leader_shrink_isr(&cfg, s, &mut out);
        assert!(out.items.windows(2).all(|w| w[0] == w[1]), "one state");
        out.items.len()
    };
    // r2 follows no one and holds nothing: both disjuncts.
    assert_eq!(count(&s), 2);
    // r2 follows r1 in epoch 0 but lacks m0: only "behind".
    let r2 = s.rs_mut(1);
    (r2.leader_epoch, r2.leader, r2.isr) = (0, Some(0), both);
    assert_eq!(count(&s), 1);
    // r2 holds m0 too: neither.
    s.set_log(1, log);
    assert_eq!(count(&s), 0);
}

/// A larger model than the spec's: LogSize 3, MaxRecords 3 and MaxLeaderEpoch 4 (five epochs,
/// past the four the state arrays once held) at 2 replicas. KIP-320 still keeps every
/// invariant (bar the literal `LeaderInIsr`, note 2). Every counterexample is replayed.
#[test]
fn kip320_two_replicas_five_epochs() {
    use roost_repmodel::explorer::replay;
    use roost_repmodel::{check, Config};

    let cfg = Config::new(2, 3, 3, 4).expect("five epochs fit");
    let r = check(Kip320, &cfg);
    assert_eq!((r.distinct, r.generated, r.depth), (561287, 1246115, 30));
    let found: Vec<Option<usize>> = r.verdicts.iter().map(|v| v.counterexample_len()).collect();
    assert_eq!(
        found,
        [HOLDS, HOLDS, HOLDS, fails(1), HOLDS, HOLDS, HOLDS],
        "{:?}",
        common::NAMES
    );
    for trace in r.verdicts.iter().filter_map(|v| v.counterexample.as_ref()) {
        replay(&Kip320, &cfg, trace).expect("a behaviour of Kip320");
    }
}
