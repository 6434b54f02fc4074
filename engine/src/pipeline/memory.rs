//! Memory by part (issues 25 and 44), for `status` and metrics: what the request-key index's
//! filters and fences hold, the cache of keys not yet checkpointed, the shards' in-memory
//! indexes, the intakes' unanswered input, and the resident set with the rest, split into
//! anonymous memory and file-backed pages (the maps of shard segments and logs). Figures
//! for the filters, fences and intake bytes are exact; the key cache and shard indexes are
//! estimates from their counts (their per-entry cost is measured in docs/memory.md). Reads
//! only; never allocates on behalf of a client.

use crate::config::KEY_CACHE_BYTES_PER_KEY;

use super::Engine;

/// Bytes held, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    pub budget_bytes: u64,
    pub key_filter_bytes: u64,
    pub key_fence_bytes: u64,
    pub key_cache_keys: u64,
    pub key_cache_bytes: u64,
    /// Live records of the open shards (a shard closed while idle holds no index) and the
    /// bytes their indexes hold: an entry a record (20 B) and a frame held (24 B).
    pub shard_index_records: u64,
    pub shard_index_bytes: u64,
    /// Unanswered input held now by the bulk files and the stream, their peaks since the
    /// start, the bound each has (`intake_bytes_max`) and how often one waited for it.
    pub intake_bulk_bytes: u64,
    pub intake_bulk_bytes_peak: u64,
    pub intake_stream_bytes: u64,
    pub intake_stream_bytes_peak: u64,
    pub intake_bytes_max: u64,
    pub intake_waits: u64,
    /// The process's resident set (0 where /proc is not there) ...
    pub rss_bytes: u64,
    /// ... of it anonymous memory (heap, stacks) ...
    pub rss_anon_bytes: u64,
    /// ... and file-backed pages: shard segments and logs read or written through their
    /// maps, and the binary. The kernel drops these first under memory pressure.
    pub rss_file_bytes: u64,
    /// The resident set less the parts above (file-backed pages included).
    pub other_bytes: u64,
    /// Anonymous memory less the parts above: buffers of batches in flight, thread stacks,
    /// code's data, the allocator's free memory not yet returned.
    pub other_anon_bytes: u64,
}

impl Engine {
    pub fn memory(&self) -> MemoryReport {
        let ix = self.keys.index_stats();
        let cache_keys = self.claims.lock().keys.len() as u64;
        // A closed shard's index is not in memory.
        let open: Vec<_> = self
            .shards
            .figures()
            .into_values()
            .filter(|f| f.open)
            .collect();
        let records: u64 = open.iter().map(|f| f.records as u64).sum();
        let index_bytes: u64 = open.iter().map(|f| f.index_bytes).sum();
        let (bulk, stream) = (&self.intake.bulk, &self.intake.stream);
        let rss = Rss::of_self();
        let mut m = MemoryReport {
            budget_bytes: self.env.config.memory_budget_bytes,
            key_filter_bytes: ix.filter_bytes,
            key_fence_bytes: ix.fence_bytes,
            key_cache_keys: cache_keys,
            key_cache_bytes: cache_keys * KEY_CACHE_BYTES_PER_KEY,
            shard_index_records: records,
            shard_index_bytes: index_bytes,
            intake_bulk_bytes: bulk.held(),
            intake_bulk_bytes_peak: bulk.peak(),
            intake_stream_bytes: stream.held(),
            intake_stream_bytes_peak: stream.peak(),
            intake_bytes_max: bulk.max(),
            intake_waits: bulk.waits() + stream.waits(),
            rss_bytes: rss.total,
            rss_anon_bytes: rss.anon,
            rss_file_bytes: rss.file,
            other_bytes: 0,
            other_anon_bytes: 0,
        };
        let parts = m.key_filter_bytes
            + m.key_fence_bytes
            + m.key_cache_bytes
            + m.shard_index_bytes
            + m.intake_bulk_bytes
            + m.intake_stream_bytes;
        m.other_bytes = m.rss_bytes.saturating_sub(parts);
        m.other_anon_bytes = m.rss_anon_bytes.saturating_sub(parts);
        m
    }
}

/// The resident set from `/proc/self/status`, in bytes (0 where unreadable).
#[derive(Clone, Copy, Debug, Default)]
struct Rss {
    total: u64,
    anon: u64,
    /// `RssFile` and `RssShmem`.
    file: u64,
}

impl Rss {
    fn of_self() -> Rss {
        let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
            return Rss::default();
        };
        let kb = |name: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |kb| kb * 1024)
        };
        Rss {
            total: kb("VmRSS:"),
            anon: kb("RssAnon:"),
            file: kb("RssFile:") + kb("RssShmem:"),
        }
    }
}
