//! What the verdict tests share: the cached reports and the check of a pinned verdict.
#![allow(dead_code)]

use std::sync::OnceLock;

use roost_repmodel::explorer::replay;
use roost_repmodel::invariants::by_name;
use roost_repmodel::{check, Config, Report, Variant, INVARIANTS};

/// One pinned row of the results table. `cex[i]` is the length (states, initial included)
/// of the shortest counterexample to `INVARIANTS[i]`, or `None` if it holds.
pub struct Expect {
    pub variant: Variant,
    pub replicas: u8,
    pub max_records: u8,
    pub distinct: u64,
    pub generated: u64,
    pub depth: u32,
    pub cex: [Option<usize>; 7],
}

/// Invariant order of `cex`: TypeOk, WeakIsr, StrongIsr, LeaderInIsr, LeaderInIsrUnlessNone,
/// LogMatching, EpochMinted.
pub const NAMES: [&str; 7] = [
    "TypeOk",
    "WeakIsr",
    "StrongIsr",
    "LeaderInIsr",
    "LeaderInIsrUnlessNone",
    "LogMatching",
    "EpochMinted",
];

fn slot(variant: Variant, replicas: u8, max_records: u8) -> usize {
    let v = Variant::ALL.iter().position(|&x| x == variant).unwrap_or(0);
    v * 8 + usize::from(replicas - 1) * 2 + usize::from(max_records == 3)
}

/// Explores a variant once per test binary, with LogSize 2 and MaxLeaderEpoch 2.
pub fn report(variant: Variant, replicas: u8, max_records: u8) -> &'static Report {
    static CACHE: [OnceLock<Report>; 32] = [const { OnceLock::new() }; 32];
    CACHE[slot(variant, replicas, max_records)].get_or_init(|| {
        let cfg = Config::new(replicas, 2, max_records, 2).expect("the models' constants fit");
        check(variant, &cfg)
    })
}

/// Checks a report against its pinned row, and every counterexample against the spec: it is
/// a behaviour from Init, its last state breaks the invariant and no earlier state does.
pub fn assert_pinned(e: &Expect) {
    assert_eq!(
        INVARIANTS.map(|i| i.name),
        NAMES,
        "the invariant order the pins assume"
    );
    let r = report(e.variant, e.replicas, e.max_records);
    let row = format!(
        "{} with {} replicas, MaxRecords {}",
        e.variant.module(),
        e.replicas,
        e.max_records
    );
    assert_eq!(
        (r.distinct, r.generated, r.depth),
        (e.distinct, e.generated, e.depth),
        "{row}: counts"
    );
    let found: Vec<Option<usize>> = r.verdicts.iter().map(|v| v.counterexample_len()).collect();
    assert_eq!(
        found,
        e.cex.to_vec(),
        "{row}: verdicts (counterexample lengths) for {NAMES:?}"
    );
    for v in &r.verdicts {
        let Some(trace) = &v.counterexample else {
            continue;
        };
        let inv = by_name(v.invariant).expect("a known invariant");
        replay(&e.variant, &r.cfg, trace)
            .unwrap_or_else(|err| panic!("{row}: {}: {err}", v.invariant));
        let (last, before) = trace.steps.split_last().expect("a trace has a state");
        assert!(
            !(inv.check)(&r.cfg, &last.state),
            "{row}: the last state breaks {}",
            v.invariant
        );
        for step in before {
            assert!(
                (inv.check)(&r.cfg, &step.state),
                "{row}: an earlier state breaks {}",
                v.invariant
            );
        }
    }
}
