//! The engine fuzzed through crashes (`roost_fuzz::engine`): a structure-aware history of
//! batch groups, bulk lines, checkpoints, durability rounds and restarts on the real engine
//! over `SimStorage`, one crash at a chosen crash point or sync, recovery, and the invariants
//! of `RoostApplyBatch.tla` against what was acknowledged. `fuzz/run mutant` builds it with
//! `roost/mutant-no-claim` and must see it fail.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost_fuzz::engine::{run, Case};

fuzz_target!(init: roost_fuzz::limit_memory(), |case: Case| {
    run(&case);
});
