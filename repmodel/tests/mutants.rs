//! The explorer can fail: deliberately broken versions of the safe variant (`Kip320`) are
//! caught, with a counterexample that is a real behaviour of the broken spec.
#![forbid(unsafe_code)]

use roost_repmodel::base::{self, presumes_leadership};
use roost_repmodel::explorer::{explore, replay};
use roost_repmodel::types::ReplicaState;
use roost_repmodel::variants::{kip279, kip320};
use roost_repmodel::{check, Config, Label, Report, Spec, State, Successors, Variant, INVARIANTS};

/// `Kip320` whose new followers never truncate: `FencedBecomeFollowerAndTruncate` with the
/// truncation offset replaced by the follower's own end offset.
struct NeverTruncates;

fn fenced_become_follower_without_truncating(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        for replica in cfg.all().filter(|&r| r != leader) {
            for request in s.leader_and_isr_requests.iter() {
                let fresh = request.leader == Some(leader)
                    && request.leader_epoch > s.rs(replica).leader_epoch;
                let fenced = presumes_leadership(s, leader)
                    && s.rs(leader).leader_epoch == request.leader_epoch;
                if !fresh || !fenced {
                    continue;
                }
                let mut next = *s;
                *next.rs_mut(replica) = ReplicaState {
                    leader_epoch: request.leader_epoch,
                    leader: request.leader,
                    isr: request.isr,
                    hw: s.rs(replica).hw,
                };
                let label = Label::new("BecomeFollowerWithoutTruncating").replica("leader", leader);
                out.push(
                    label
                        .replica("replica", replica)
                        .int("requestEpoch", request.leader_epoch),
                    next,
                );
            }
        }
    }
}

impl Spec for NeverTruncates {
    fn name(&self) -> &str {
        "Kip320 without truncation"
    }

    fn next(&self, cfg: &Config, s: &State, out: &mut Successors) {
        base::controller_elect_leader(cfg, s, out);
        base::controller_shrink_isr(cfg, s, out);
        base::become_leader(cfg, s, out);
        kip320::fenced_leader_expand_isr(cfg, s, out);
        kip320::fenced_leader_shrink_isr(cfg, s, out);
        base::leader_write(cfg, s, out);
        kip320::fenced_leader_inc_high_watermark(cfg, s, out);
        fenced_become_follower_without_truncating(cfg, s, out);
        kip320::fenced_follower_fetch(cfg, s, out);
    }
}

/// `Kip320` with its truncation unfenced: `BecomeFollowerTruncateKip279` in place of
/// `FencedBecomeFollowerAndTruncate`, the experiment the comment in `Kip320.tla` proposes
/// ("You can verify this failure by replacing this action...").
struct UnfencedTruncation;

impl Spec for UnfencedTruncation {
    fn name(&self) -> &str {
        "Kip320 with Kip279's truncation"
    }

    fn next(&self, cfg: &Config, s: &State, out: &mut Successors) {
        base::controller_elect_leader(cfg, s, out);
        base::controller_shrink_isr(cfg, s, out);
        base::become_leader(cfg, s, out);
        kip320::fenced_leader_expand_isr(cfg, s, out);
        kip320::fenced_leader_shrink_isr(cfg, s, out);
        base::leader_write(cfg, s, out);
        kip320::fenced_leader_inc_high_watermark(cfg, s, out);
        kip279::become_follower_truncate_kip279(cfg, s, out);
        kip320::fenced_follower_fetch(cfg, s, out);
    }
}

fn cex_len(r: &Report, invariant: &str) -> Option<usize> {
    r.verdict(invariant).and_then(|v| v.counterexample_len())
}

fn assert_traces_replay(spec: &dyn Spec, r: &Report) {
    for v in &r.verdicts {
        if let Some(t) = &v.counterexample {
            replay(spec, &r.cfg, t).unwrap_or_else(|e| panic!("{}: {e}", v.invariant));
        }
    }
}

#[test]
fn a_follower_that_never_truncates_is_caught() {
    let cfg = Config::small(2).expect("small constants fit");
    let safe = check(Variant::Kip320, &cfg);
    assert_eq!(
        cex_len(&safe, "WeakIsr"),
        None,
        "the unbroken variant keeps WeakIsr"
    );
    let broken = explore(&NeverTruncates, &cfg, &INVARIANTS);
    assert_traces_replay(&NeverTruncates, &broken);
    assert_eq!(cex_len(&broken, "WeakIsr"), Some(9));
    assert_eq!(cex_len(&broken, "StrongIsr"), Some(9));
    // With three records the stale record also breaks log matching.
    let cfg3 = Config::new(2, 2, 3, 2).expect("fits");
    let broken3 = explore(&NeverTruncates, &cfg3, &INVARIANTS);
    assert_traces_replay(&NeverTruncates, &broken3);
    assert_eq!(cex_len(&broken3, "LogMatching"), Some(10));
}

#[test]
fn kip320_without_its_truncation_fence_breaks_the_isr_invariants_at_three_replicas() {
    let cfg = Config::small(3).expect("small constants fit");
    let broken = explore(&UnfencedTruncation, &cfg, &INVARIANTS);
    assert_traces_replay(&UnfencedTruncation, &broken);
    assert_eq!(cex_len(&broken, "WeakIsr"), Some(14));
    assert_eq!(cex_len(&broken, "StrongIsr"), Some(14));
    // At two replicas the only possible leader of a new follower is the true one.
    let cfg2 = Config::small(2).expect("small constants fit");
    let broken2 = explore(&UnfencedTruncation, &cfg2, &INVARIANTS);
    assert_eq!(cex_len(&broken2, "StrongIsr"), None);
}
