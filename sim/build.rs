//! Declares the `tokio_unstable` cfg, which `sim/run` sets (RUSTFLAGS) so that tokio's own
//! RNG is seeded from the simulation's seed (lib.rs, "Determinism").

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tokio_unstable)");
}
