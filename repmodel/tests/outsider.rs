//! An outsider on the replication port (issue 26, `src/outsider.rs`): a peer that is no
//! replica sends a leader fetches naming a follower at any offset, and fetches with a higher
//! epoch. The built leader ignores both: the same states as `Kip320`, every invariant kept.
//! With a check switched off the explorer finds what it guarded: a leader that believes a
//! fetch's name acknowledges a record no follower holds (`StrongIsr`, lost after failover); a
//! leader that believes an outsider's epoch holds one the controller never minted
//! (`EpochMinted`) and refuses the controller from then on.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashSet, VecDeque};

use roost_repmodel::explorer::{explore, replay};
use roost_repmodel::invariants::Invariant;
use roost_repmodel::outsider::{Checks, Outsider};
use roost_repmodel::types::{Record, NIL};
use roost_repmodel::{check, Config, Report, Spec, State, Successors, Variant, INVARIANTS};

/// Mutant A: the leader counts a fetch as the acknowledgement of the replica it names,
/// whoever sent it.
const TRUSTS_NAMES: Outsider = Outsider {
    checks: Checks {
        name_is_peer: false,
        ..Checks::ALL
    },
    name: "Kip320, leader trusting fetch names",
};

/// Mutant B: the leader believes a higher epoch from anyone, however high (roost before
/// issue 26).
const TRUSTS_EPOCHS: Outsider = Outsider {
    checks: Checks {
        epoch_from_member: false,
        epoch_minted: false,
        ..Checks::ALL
    },
    name: "Kip320, leader trusting any epoch",
};

/// Mutant B with the plausibility check back: a minted epoch is believed from anyone.
const TRUSTS_MINTED_EPOCHS: Outsider = Outsider {
    checks: Checks {
        epoch_from_member: false,
        ..Checks::ALL
    },
    name: "Kip320, leader trusting any minted epoch",
};

/// Mutant B with the authentication check back: any epoch is believed from a member.
const TRUSTS_MEMBERS_EPOCHS: Outsider = Outsider {
    checks: Checks {
        epoch_minted: false,
        ..Checks::ALL
    },
    name: "Kip320, leader trusting any epoch from a member",
};

fn small(replicas: u8) -> Config {
    Config::small(replicas).expect("small constants fit")
}

/// The violated invariants and their shortest counterexamples' lengths, in report order.
fn failures(r: &Report) -> Vec<(&'static str, usize)> {
    r.verdicts
        .iter()
        .filter_map(|v| v.counterexample_len().map(|n| (v.invariant, n)))
        .collect()
}

/// `LeaderInIsr` as written fails in `Init` in every spec (note 2 of the model's doc).
const ONLY_LITERAL_LEADER_IN_ISR: [(&str, usize); 1] = [("LeaderInIsr", 1)];

/// Model-only property, not one of roost's (its `announce_epoch` legitimately deposes a
/// leader; `Kip320` has nothing like it): a replica that holds an epoch holds it with the
/// leader the controller's request for that epoch named. Only the controller deposes.
fn epoch_from_controller(cfg: &Config, s: &State) -> bool {
    cfg.all().all(|r| {
        let rs = s.rs(r);
        rs.leader_epoch == NIL
            || s.leader_and_isr_requests
                .iter()
                .any(|q| q.leader_epoch == rs.leader_epoch && q.leader == rs.leader)
    })
}

/// `INVARIANTS` and `EpochFromController`.
fn with_epoch_from_controller() -> Vec<Invariant> {
    let mut all = INVARIANTS.to_vec();
    all.push(Invariant {
        name: "EpochFromController",
        source: "tests/outsider.rs",
        check: epoch_from_controller,
    });
    all
}

/// The counterexample to `invariant` replays against `spec`, breaks it only in its last
/// state, and ends with `last_action`; returns its last state.
fn assert_counterexample(spec: &dyn Spec, r: &Report, invariant: &str, last_action: &str) -> State {
    let trace = r
        .verdict(invariant)
        .and_then(|v| v.counterexample.as_ref())
        .unwrap_or_else(|| panic!("{}: {invariant} holds", r.spec));
    replay(spec, &r.cfg, trace).unwrap_or_else(|e| panic!("{invariant}: {e}"));
    let check = with_epoch_from_controller()
        .into_iter()
        .find(|i| i.name == invariant)
        .map(|i| i.check)
        .expect("a known invariant");
    let (last, before) = trace.steps.split_last().expect("a trace has a state");
    assert!(
        !check(&r.cfg, &last.state),
        "the last state breaks {invariant}"
    );
    assert!(
        before.iter().all(|step| check(&r.cfg, &step.state)),
        "an earlier state breaks {invariant}"
    );
    let action = last.action.map(|l| l.to_string());
    assert_eq!(action.as_deref(), Some(last_action), "{invariant}");
    last.state
}

/// The successor of `s` by the action instance printed as `label`.
fn take(spec: &dyn Spec, cfg: &Config, s: &State, label: &str) -> State {
    let mut out = Successors::default();
    spec.next(cfg, s, &mut out);
    out.items
        .iter()
        .find(|(l, _)| l.to_string() == label)
        .map(|(_, next)| *next)
        .unwrap_or_else(|| panic!("{label} is not enabled"))
}

/// Every state reachable from `from` by `spec`.
fn reachable(spec: &dyn Spec, cfg: &Config, from: State) -> HashSet<State> {
    let mut seen = HashSet::from([from]);
    let mut queue = VecDeque::from([from]);
    let mut out = Successors::default();
    while let Some(s) = queue.pop_front() {
        out.clear();
        spec.next(cfg, &s, &mut out);
        for (_, next) in out.items.drain(..) {
            if seen.insert(next) {
                queue.push_back(next);
            }
        }
    }
    seen
}

/// The outsider's actions are enabled (more generated states) and change nothing: the
/// distinct states and depth are `Kip320`'s, every invariant is kept, and no replica is
/// deposed but by the controller.
#[test]
fn the_built_leader_ignores_the_outsider() {
    let cfg2 = small(2);
    let kip320 = check(Variant::Kip320, &cfg2);
    let built2 = explore(&Outsider::BUILT, &cfg2, &with_epoch_from_controller());
    assert_eq!(failures(&built2), ONLY_LITERAL_LEADER_IN_ISR);
    assert_eq!((kip320.distinct, kip320.depth), (5973, 18));
    assert_eq!(
        (built2.distinct, built2.generated, built2.depth),
        (kip320.distinct, 34277, kip320.depth)
    );
    // Kip320 at 3 replicas has 737794 states in 26 levels (`verdicts.rs`).
    let built3 = explore(&Outsider::BUILT, &small(3), &INVARIANTS);
    assert_eq!(failures(&built3), ONLY_LITERAL_LEADER_IN_ISR);
    assert_eq!(
        (built3.distinct, built3.generated, built3.depth),
        (737794, 7218592, 26)
    );
}

/// Mutant A: r1 leads epoch 0 with ISR {r1, r2} and writes m0; the outsider fetches as r2 at
/// offset 1, and r1 counts it: hw 1, m0 acknowledged, while r2 holds nothing.
#[test]
fn a_leader_that_believes_a_fetchs_name_acknowledges_a_record_no_follower_holds() {
    let r = explore(&TRUSTS_NAMES, &small(2), &INVARIANTS);
    assert_eq!(
        failures(&r),
        [("WeakIsr", 5), ("StrongIsr", 5), ("LeaderInIsr", 1)]
    );
    let forged = "OutsiderFetch(leader=r1, as=r2, offset=1)";
    for invariant in ["WeakIsr", "StrongIsr"] {
        assert_counterexample(&TRUSTS_NAMES, &r, invariant, forged);
    }
    assert_eq!((r.distinct, r.generated, r.depth), (8241, 49709, 18));
}

/// Mutant A, continued: after the forged acknowledgement r1 fails over to r2 (in the ISR, so
/// electable), r2 writes m1 at offset 0, and r1, following r2, truncates m0 away. A record
/// the leader acknowledged is on no replica.
#[test]
fn the_forged_acknowledgement_is_lost_after_failover() {
    let cfg = small(2);
    let r = explore(&TRUSTS_NAMES, &cfg, &INVARIANTS);
    let forged = "OutsiderFetch(leader=r1, as=r2, offset=1)";
    let mut s = assert_counterexample(&TRUSTS_NAMES, &r, "StrongIsr", forged);
    let m0 = Record { id: 0, epoch: 0 };
    assert!(
        s.rs(0).hw == 1 && s.log(0).has_entry(m0, 0),
        "m0 acknowledged"
    );
    for label in [
        "ControllerElectLeader(newLeader=r2)",
        "BecomeLeader(leader=r2, requestEpoch=1)",
        "LeaderWrite(replica=r2, id=1, offset=0)",
        "FencedBecomeFollowerAndTruncate(leader=r2, replica=r1, requestEpoch=1)",
    ] {
        s = take(&TRUSTS_NAMES, &cfg, &s, label);
    }
    assert!(
        cfg.all()
            .all(|x| !s.log(x).all_entries().any(|(_, rec)| rec == m0)),
        "m0 survives on some replica: {s:?}"
    );
}

/// Mutant B: r1 leads epoch 0; the outsider sends epoch 1, which the controller has not
/// minted, and r1 steps down to it. No record is lost (every safety invariant holds at 2 and
/// 3 replicas): an availability attack, caught by `EpochMinted`.
#[test]
fn a_leader_that_believes_an_outsiders_epoch_holds_one_never_minted() {
    let broken = "OutsiderHigherEpoch(leader=r1, epoch=1)";
    let r2 = explore(&TRUSTS_EPOCHS, &small(2), &INVARIANTS);
    assert_eq!(failures(&r2), [("LeaderInIsr", 1), ("EpochMinted", 4)]);
    assert_counterexample(&TRUSTS_EPOCHS, &r2, "EpochMinted", broken);
    assert_eq!((r2.distinct, r2.generated, r2.depth), (11225, 45685, 18));
    let r3 = explore(&TRUSTS_EPOCHS, &small(3), &INVARIANTS);
    assert_eq!(failures(&r3), [("LeaderInIsr", 1), ("EpochMinted", 4)]);
    assert_counterexample(&TRUSTS_EPOCHS, &r3, "EpochMinted", broken);
    assert_eq!(
        (r3.distinct, r3.generated, r3.depth),
        (1198414, 9649561, 26)
    );
}

/// Mutant B at the top epoch (roost's attack sent one near `u32::MAX`): once r1 believes
/// `MaxLeaderEpoch`, no behaviour lets it lead or follow again, though the controller can
/// still name it leader.
#[test]
fn a_believed_top_epoch_takes_the_leader_out_for_good() {
    let cfg = small(2);
    let mut s = roost_repmodel::base::init(&cfg);
    for label in [
        "ControllerElectLeader(newLeader=r1)",
        "BecomeLeader(leader=r1, requestEpoch=0)",
        "OutsiderHigherEpoch(leader=r1, epoch=2)",
    ] {
        s = take(&TRUSTS_EPOCHS, &cfg, &s, label);
    }
    let after = reachable(&TRUSTS_EPOCHS, &cfg, s);
    assert!(
        after.iter().all(|x| x.rs(0).leader.is_none()),
        "r1 leads or follows again"
    );
    assert!(
        after
            .iter()
            .any(|x| x.quorum_state.leader == Some(0) && x.quorum_state.leader_epoch == 2),
        "the controller names r1 leader of epoch 2"
    );
}

/// The two halves of the epoch rule against an outsider. Plausibility alone keeps epochs
/// minted, but the outsider still deposes the leader with one the controller minted for
/// someone else (or for r1, not yet delivered): a transient availability attack that only the
/// model-only `EpochFromController` sees. Authentication alone keeps the outsider out
/// entirely: the same states as `Kip320`.
#[test]
fn only_authentication_keeps_an_outsider_from_deposing_a_leader() {
    let cfg = small(2);
    let minted = explore(&TRUSTS_MINTED_EPOCHS, &cfg, &with_epoch_from_controller());
    assert_eq!(
        failures(&minted),
        [("LeaderInIsr", 1), ("EpochFromController", 5)]
    );
    let broken = "OutsiderHigherEpoch(leader=r1, epoch=1)";
    assert_counterexample(
        &TRUSTS_MINTED_EPOCHS,
        &minted,
        "EpochFromController",
        broken,
    );
    assert_eq!((minted.distinct, minted.generated), (9853, 42195));
    let members = explore(&TRUSTS_MEMBERS_EPOCHS, &cfg, &with_epoch_from_controller());
    assert_eq!(failures(&members), ONLY_LITERAL_LEADER_IN_ISR);
    assert_eq!((members.distinct, members.generated), (5973, 34277));
}
