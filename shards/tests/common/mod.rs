//! Helpers shared by the shard tests.
#![allow(dead_code)] // each test file uses its own subset

use std::path::PathBuf;

use roost_shards::ShardOptions;

/// Where a shard lives on the simulated disk.
pub fn sim_dir() -> PathBuf {
    PathBuf::from("/sim/shards/users")
}

/// A writable shard's options with `segment_bytes` segments, nothing vouched for.
pub fn opts(segment_bytes: u64) -> ShardOptions {
    ShardOptions {
        segment_bytes,
        read_only: false,
        synced_through_lsn: None,
        ..ShardOptions::default()
    }
}
