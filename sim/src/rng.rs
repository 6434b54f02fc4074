//! The simulator's own random numbers (splitmix64): every choice a run makes outside turmoil
//! (faults, skew, the workload) comes from the seed through here, so one seed is one run.
//! The generator is the storage simulator's (`roost_storage::SplitMix`); this adds the draws
//! the run needs.

use std::time::Duration;

use roost_storage::SplitMix;

/// A small deterministic generator.
#[derive(Clone, Debug)]
pub struct Rng(SplitMix);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix(seed ^ 0x5DEE_CE66_D1CE_4E5B))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.below(n)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// A uniform fraction in `0..1`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A duration uniform in `lo_ms..=hi_ms` milliseconds.
    pub fn ms(&mut self, lo_ms: u64, hi_ms: u64) -> Duration {
        Duration::from_millis(lo_ms + self.below(hi_ms.saturating_sub(lo_ms) + 1))
    }

    /// An independent generator for a part of the run.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}
