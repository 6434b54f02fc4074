//! The explorer against a second, naive one: a breadth-first search whose visited set holds
//! whole states, not keys. Same distinct states, same generated states, same depth, so the
//! 128-bit keys lose nothing.
#![forbid(unsafe_code)]

use std::collections::{HashSet, VecDeque};

use roost_repmodel::{base, check, Config, Spec, Successors, Variant};

/// (distinct, generated, depth) by a search over `HashSet<State>`.
fn naive(variant: Variant, cfg: &Config) -> (u64, u64, u32) {
    let init = base::init(cfg);
    let mut seen = HashSet::from([init]);
    let mut queue = VecDeque::from([(init, 1u32)]);
    let (mut generated, mut depth) = (1u64, 1u32);
    let mut out = Successors::default();
    while let Some((s, d)) = queue.pop_front() {
        depth = depth.max(d);
        out.clear();
        variant.next(cfg, &s, &mut out);
        generated += out.items.len() as u64;
        for (_, t) in out.items.drain(..) {
            if seen.insert(t) {
                queue.push_back((t, d + 1));
            }
        }
    }
    (seen.len() as u64, generated, depth)
}

#[test]
fn keyed_search_agrees_with_a_search_over_whole_states() {
    for replicas in [2, 3] {
        let cfg = Config::small(replicas).expect("fits");
        for variant in Variant::ALL {
            if replicas == 3 && variant != Variant::Kip320 {
                continue; // the smallest 3-replica space is enough, and keeps the test fast
            }
            let r = check(variant, &cfg);
            assert_eq!(
                (r.distinct, r.generated, r.depth),
                naive(variant, &cfg),
                "{variant}, {replicas} replicas"
            );
        }
    }
}

/// The same with five epochs (MaxLeaderEpoch 4), LogSize 3 and MaxRecords 3: the keys of the
/// wider radices lose nothing either.
#[test]
fn keyed_search_agrees_with_five_epochs() {
    let cfg = Config::new(2, 3, 3, 4).expect("fits");
    let r = check(Variant::Kip320, &cfg);
    assert_eq!(
        (r.distinct, r.generated, r.depth),
        naive(Variant::Kip320, &cfg)
    );
}
