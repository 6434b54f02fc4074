//! A shard segment scanned at open (`Shard::open_with`, read-only and read-write), its
//! frames summarised and its live records scanned. Input: a choice byte, then the segment;
//! with the choice's low bit set every frame whose length fits gets its CRC recomputed, so
//! the rules past the checksum are reached. Properties: no panic, and a read-write open
//! (which may cut a torn tail) leaves a shard that opens again to the same records.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use roost_shards::frame::{BODY_LEN_OFFSET, CRC_OFFSET, FRAME_HEADER_LEN, VERSION_OFFSET};
use roost_shards::{Shard, ShardOptions};
use roost_storage::SimStorage;

const SEGMENT: &str = "/s/x/0000000001.seg";

const FRAMES: roost_fuzz::FrameLayout = roost_fuzz::FrameLayout {
    header_len: FRAME_HEADER_LEN,
    len_offset: BODY_LEN_OFFSET,
    crc_offset: CRC_OFFSET,
    version_offset: VERSION_OFFSET,
    body_len_max: usize::MAX,
};

/// The live records of the shard (after its frames were summarised), or the error.
fn open(disk: &SimStorage, read_only: bool) -> Result<Vec<(u64, Vec<u8>)>, String> {
    let opts = ShardOptions {
        segment_bytes: 8192,
        read_only,
        synced_through_lsn: None,
        ..ShardOptions::default()
    };
    let s = Shard::open_with(Arc::new(disk.clone()), "/s/x", opts).map_err(|e| e.to_string())?;
    s.frame_summaries().map_err(|e| e.to_string())?;
    let records = s.scan().map_err(|e| e.to_string())?;
    for (id, rec) in records.iter().take(4) {
        assert_eq!(s.get(*id).map_err(|e| e.to_string())?.as_ref(), Some(rec));
    }
    Ok(records)
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    let mut seg = bytes.to_vec();
    if c & 1 == 1 {
        roost_fuzz::fix_frame_crcs(&mut seg, &FRAMES);
    }
    roost_fuzz::reopened_same(SEGMENT, seg, "shard", open);
});
