//! `roost-sim`: roost's replication protocol and cluster agent in a deterministic network
//! simulator (turmoil, the tokio project's; issue 45, docs/faults.md "Simulator").
//!
//! What runs is REAL code of `roost-replication`: `serve_followers_on` (the leader's server,
//! `serve.rs`, over turmoil's listener), `follow` (`follow.rs`, over turmoil's sockets
//! through `Transport::with_dialer`), the wire frames (`wire.rs`) and the rules
//! (`decide.rs`), on `roost_replication::testing::MemLog` as each node's log (`log.rs`
//! wraps it, keeping per-standby state and asking for inline log calls). What is a PORT is
//! the election driver (`agent.rs`): the cluster agent's loop (engine/src/cluster/agent.rs)
//! rewritten over the simulator's etcd stand-in (`etcd.rs`), applying the real pure rules
//! and key values of `roost_replication::election` (`keys.rs`), because the real
//! agent needs the engine and the real etcd client. The invariants are in `check.rs`, the
//! run and its faults in `run.rs`.
//!
//! Determinism: every choice comes from the seed (turmoil's RNG, `rng.rs`), log calls run
//! inline, time is turmoil's. tokio's own RNG (which branch of a `select!` is polled first,
//! which shard of a `watch` a waiter lands in) is seeded only when built with
//! `--cfg tokio_unstable`, which `sim/run` sets; without it a seed's run may differ slightly
//! from one run to the next (the invariants still hold for every run).

// A harness: a broken assumption here is a bug of the simulator, and a panic says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![forbid(unsafe_code)]

pub mod agent;
pub mod check;
pub mod etcd;
pub mod keys;
pub mod log;
pub mod net;
pub mod rng;
pub mod run;
pub mod world;

pub use run::{run, Outcome};
pub use world::Config;
