//! [`WalOptions`], the tunables of one log, and what follows from them alone: the size of each
//! next segment ([`WalOptions::next_segment_bytes`]). Shared by the log's open, its rolls and
//! its creation; this module never touches a file.

/// The default [`WalOptions::first_segment_bytes`]: a new log's first segment takes 1 MiB,
/// its spare 2 MiB.
pub const FIRST_SEGMENT_BYTES: u64 = 1 << 20;

/// Tunables of one log.
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// Segments are preallocated to at most this size (unless one record needs more room
    /// than that leaves, or [`crate::Wal::reserve`] asked for more); a record that does not fit the
    /// active segment rolls to a new one.
    pub segment_bytes: u64,
    /// A new log's first segment is preallocated to this size, and each next one to twice
    /// the last one's length (at least the record that rolls to it), up to `segment_bytes`:
    /// a log that holds little takes little disk. The spare is made at the size of the
    /// segment after the active one. A segment is used up to its own length, so segments of
    /// any size (older ones of a full `segment_bytes` among them) open and mix.
    pub first_segment_bytes: u64,
    /// Largest payload accepted on append and on read (checked before allocating).
    pub payload_bytes_max: u32,
    /// Epoch stamped on the records this writer appends, until [`crate::Wal::set_epoch`] (1 until
    /// replication).
    pub epoch: u32,
    /// Open without repairing anything; appends fail. For `roost verify`, `dump`, `audit`
    /// while a daemon may be writing.
    pub read_only: bool,
    /// Zeros written ahead of the log's end, this many bytes at a time (0: none). A segment
    /// is `posix_fallocate`d, so its space is unwritten extents: the first write into each
    /// converts it, a metadata change every `fdatasync` must then commit (a journal commit
    /// on ext4). Zeros written ahead (in the page cache, made durable by the next sync like
    /// any write) turn the space the next appends land in into written extents, so their
    /// syncs write data only: one conversion per `zero_ahead_bytes` instead of one per sync.
    /// Zeros are what the space reads as anyway, so recovery sees no difference.
    pub zero_ahead_bytes: u64,
    /// Scan every sealed segment at open (true), or only the newest (false). A segment is
    /// sealed only after its sync succeeded, so an unscanned sealed segment is whole; what
    /// is given up is finding damage in it at open (a read of a damaged record still fails
    /// as corruption, and `roost verify` reads everything). For logs that grow with
    /// history and are never replayed whole (the audit log, the key table): open time stays
    /// flat whatever they hold. The batch WAL, bounded by checkpoints, is scanned whole.
    pub scan_sealed: bool,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: 64 << 20,
            first_segment_bytes: FIRST_SEGMENT_BYTES,
            payload_bytes_max: 16 << 20,
            epoch: 1,
            read_only: false,
            zero_ahead_bytes: 1 << 20,
            scan_sealed: true,
        }
    }
}

impl WalOptions {
    /// The size of the segment after one of `last` bytes (`None`: the log's first), at least
    /// `need` (the record that rolls to it): twice `last`, at least `first_segment_bytes`,
    /// rounded up to 4 KiB pages, never more than `segment_bytes` unless `need` is.
    pub(crate) fn next_segment_bytes(&self, last: Option<u64>, need: u64) -> u64 {
        let max = self.segment_bytes;
        let first = self.first_segment_bytes.clamp(1, max);
        let doubled = last.map_or(first, |l| l.saturating_mul(2));
        doubled
            .max(first)
            .max(need)
            .next_multiple_of(4096)
            .min(max)
            .max(need)
    }
}
