//! roost's replication model: `KafkaReplication.tla` and its four truncation variants
//! (`/work/shared/spec/kafka/`, from hachikuji/kafka-specification) transcribed into a Rust
//! state machine, and an exhaustive breadth-first explorer that checks the spec's invariants
//! in every reachable state, the way TLC does.
//!
//! | file | TLA+ |
//! |---|---|
//! | `types.rs` | CONSTANTS, VARIABLES and their types (`LogRecords`, `ReplicaState`, `QuorumState`) |
//! | `config.rs` | the constants' limits (`Config::new`) |
//! | `log.rs` | `FiniteReplicatedLog.tla` (`ReplicaLog!...`) |
//! | `base.rs` | `KafkaReplication.tla`: `Init` and the shared actions |
//! | `variants/` | `KafkaTruncateToHighWatermark.tla`, `Kip101.tla`, `Kip279.tla`, `Kip320.tla` |
//! | `invariants.rs` | `TypeOk`, `WeakIsr`, `StrongIsr`, `LeaderInIsr`, log matching, `EpochMinted` |
//! | `outsider.rs` | not in the spec: an unauthenticated peer sending fetches to `Kip320`'s leaders (issue 26) |
//! | `election.rs`, `election/` | not in the specs: the cluster's election through an etcd-like lease store, with fencing by lease and by epoch (issue 27) |
//! | `encode.rs`, `explorer.rs`, `print.rs` | the model checker: state keys, BFS, traces |
//!
//! `docs/replication-model.md` lists every place where the transcription had to interpret
//! the spec, and the results.
#![forbid(unsafe_code)]

pub mod base;
mod config;
pub mod election;
pub mod encode;
pub mod explorer;
pub mod invariants;
pub mod log;
pub mod outsider;
pub mod print;
pub mod step;
pub mod types;
pub mod variants;

pub use explorer::{explore, search, Model, Report, Trace, Verdict};
pub use invariants::INVARIANTS;
pub use step::{Label, Spec, Successors};
pub use types::{Config, State};
pub use variants::Variant;

/// Explores one variant with every invariant.
pub fn check(variant: Variant, cfg: &Config) -> Report {
    explore(&variant, cfg, &INVARIANTS)
}
