//! Checking the model's constants ([`Config::new`]): against the arrays' capacities in
//! `types.rs` and against the 128-bit packing of `encode.rs`, which is why it sits above both.

use crate::encode::fits;
use crate::types::{Config, ConfigError, MAX_EPOCHS, MAX_LOG_SIZE, MAX_REPLICAS};

impl Config {
    /// Checks the constants against the arrays' capacities and the 128-bit state packing.
    pub fn new(
        replicas: u8,
        log_size: u8,
        max_records: u8,
        max_leader_epoch: u8,
    ) -> Result<Config, ConfigError> {
        let cfg = Config {
            replicas,
            log_size,
            max_records,
            max_leader_epoch,
        };
        if !(1..=MAX_REPLICAS as u8).contains(&replicas) {
            return Err(ConfigError(format!("replicas must be 1..={MAX_REPLICAS}")));
        }
        if !(1..=MAX_LOG_SIZE as u8).contains(&log_size) {
            return Err(ConfigError(format!("LogSize must be 1..={MAX_LOG_SIZE}")));
        }
        if !(1..=16).contains(&max_records) {
            return Err(ConfigError("MaxRecords must be 1..=16".into()));
        }
        if usize::from(max_leader_epoch) >= MAX_EPOCHS {
            return Err(ConfigError(format!(
                "MaxLeaderEpoch must be 0..={}",
                MAX_EPOCHS - 1
            )));
        }
        if !fits(&cfg) {
            return Err(ConfigError(
                "these constants do not pack into 128 bits".into(),
            ));
        }
        Ok(cfg)
    }

    /// The models' small constants: LogSize 2, MaxRecords 2, MaxLeaderEpoch 2.
    pub fn small(replicas: u8) -> Result<Config, ConfigError> {
        Config::new(replicas, 2, 2, 2)
    }
}
