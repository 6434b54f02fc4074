//! The four modules that extend `KafkaReplication` with a truncation rule, each with its
//! own `Next`.

pub mod hw;
pub mod kip101;
pub mod kip279;
pub mod kip320;

use std::fmt;

use crate::step::{Spec, Successors};
use crate::types::{Config, State};

/// One of the four truncation variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `KafkaTruncateToHighWatermark.tla`.
    Hw,
    /// `Kip101.tla`.
    Kip101,
    /// `Kip279.tla`.
    Kip279,
    /// `Kip320.tla`.
    Kip320,
}

impl Variant {
    pub const ALL: [Variant; 4] = [
        Variant::Hw,
        Variant::Kip101,
        Variant::Kip279,
        Variant::Kip320,
    ];

    /// The command-line name: `hw`, `kip101`, `kip279`, `kip320`.
    pub fn key(self) -> &'static str {
        match self {
            Variant::Hw => "hw",
            Variant::Kip101 => "kip101",
            Variant::Kip279 => "kip279",
            Variant::Kip320 => "kip320",
        }
    }

    pub fn parse(key: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.key() == key)
    }

    /// The TLA+ module.
    pub fn module(self) -> &'static str {
        match self {
            Variant::Hw => "KafkaTruncateToHighWatermark",
            Variant::Kip101 => "Kip101",
            Variant::Kip279 => "Kip279",
            Variant::Kip320 => "Kip320",
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

impl Spec for Variant {
    fn name(&self) -> &str {
        self.module()
    }

    fn next(&self, cfg: &Config, s: &State, out: &mut Successors) {
        match self {
            Variant::Hw => hw::next(cfg, s, out),
            Variant::Kip101 => kip101::next(cfg, s, out),
            Variant::Kip279 => kip279::next(cfg, s, out),
            Variant::Kip320 => kip320::next(cfg, s, out),
        }
    }
}
