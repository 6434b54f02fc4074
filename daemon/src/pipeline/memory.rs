//! Memory by part (issue 25), for `status` and metrics: what the request-key index's
//! filters and fences hold, the cache of keys not yet checkpointed, the shards' in-memory
//! indexes, and the resident set with the rest. Figures for the filters and fences are
//! exact; the key cache and shard indexes are estimates from their counts (their per-entry
//! cost is measured in docs/memory.md). Reads only; never allocates on behalf of a client.

use crate::config::KEY_CACHE_BYTES_PER_KEY;

use super::Engine;

/// A shard's in-memory index per record: a sorted id (8 bytes) and its location (12).
pub const SHARD_INDEX_BYTES_PER_RECORD: u64 = 20;

/// Bytes held, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    pub budget_bytes: u64,
    pub key_filter_bytes: u64,
    pub key_fence_bytes: u64,
    pub key_cache_keys: u64,
    pub key_cache_bytes: u64,
    /// Live records of the open shards (a shard closed while idle holds no index).
    pub shard_index_records: u64,
    pub shard_index_bytes: u64,
    /// The process's resident set (0 where /proc is not there).
    pub rss_bytes: u64,
    /// The resident set less the parts above: buffers, code, allocator slack.
    pub other_bytes: u64,
}

impl Engine {
    /// Shards that exist, against `shards_max` (issue 25, item 3).
    pub fn shards_known(&self) -> usize {
        super::lock(&self.known_shards).count()
    }

    pub fn memory(&self) -> MemoryReport {
        let ix = self.index.stats();
        let cache_keys = self.cached_keys() as u64;
        // A closed shard's index is not in memory.
        let records: u64 = self
            .shard_figures()
            .values()
            .filter(|f| f.open)
            .map(|f| f.records as u64)
            .sum();
        let mut m = MemoryReport {
            budget_bytes: self.config.memory_budget_bytes,
            key_filter_bytes: ix.filter_bytes,
            key_fence_bytes: ix.fence_bytes,
            key_cache_keys: cache_keys,
            key_cache_bytes: cache_keys * KEY_CACHE_BYTES_PER_KEY,
            shard_index_records: records,
            shard_index_bytes: records * SHARD_INDEX_BYTES_PER_RECORD,
            rss_bytes: rss_bytes(),
            other_bytes: 0,
        };
        let parts =
            m.key_filter_bytes + m.key_fence_bytes + m.key_cache_bytes + m.shard_index_bytes;
        m.other_bytes = m.rss_bytes.saturating_sub(parts);
        m
    }
}

/// This process's resident set in bytes, from `/proc/self/status` (0 if unreadable).
pub fn rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
