//! Checking the election model's constants ([`Config::validate`]): against the arrays of
//! `state.rs` and the 128-bit key of `encode.rs`, which is why it sits above both.

use super::encode::fits;
use super::state::{Config, ConfigError, MAX_BATCHES, MAX_EPOCH, MAX_NODES};

impl Config {
    /// Checks the constants against the arrays and the 128-bit state key.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let fail = |m: &str| Err(ConfigError(m.to_string()));
        if !(1..=MAX_NODES as u8).contains(&self.nodes) {
            return fail("nodes must be 1..=4");
        }
        if !(1..=MAX_BATCHES as u8).contains(&self.batches) {
            return fail("batches must be 1..=3");
        }
        if !(1..=MAX_EPOCH).contains(&self.max_epoch) {
            return fail("max epoch must be 1..=6");
        }
        if self.ttl == 0 || self.ttl > 8 || self.skew > 2 {
            return fail("ttl must be 1..=8 and skew 0..=2");
        }
        if self.margin >= self.ttl {
            return fail("the margin must be below the ttl");
        }
        if !fits(&self) {
            return fail("these constants do not pack into 128 bits");
        }
        Ok(self)
    }
}
