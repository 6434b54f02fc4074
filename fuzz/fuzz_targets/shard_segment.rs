//! A shard segment scanned at open (`Shard::open_with`, read-only and read-write), its
//! frames summarised and its live records scanned. Input: a choice byte, then the segment;
//! with the choice's low bit set every frame whose length fits gets its CRC recomputed, so
//! the rules past the checksum are reached. Properties: no panic, and a read-write open
//! (which may cut a torn tail) leaves a shard that opens again to the same records.
#![no_main]

use std::path::PathBuf;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use roost_shards::frame::{BODY_LEN_OFFSET, CRC_OFFSET, FRAME_HEADER_LEN, VERSION_OFFSET};
use roost_shards::{Shard, ShardOptions};
use roost_storage::SimStorage;

const SEGMENT: &str = "/s/x/0000000001.seg";

fn fix_frames(seg: &mut [u8]) {
    let mut at = 0;
    while at + FRAME_HEADER_LEN <= seg.len() {
        let b = &seg[at + BODY_LEN_OFFSET..at + BODY_LEN_OFFSET + 4];
        let end = at + FRAME_HEADER_LEN + u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if end > seg.len() {
            return;
        }
        roost_fuzz::fix_crc(seg, at + CRC_OFFSET, at + VERSION_OFFSET, end);
        at = end.next_multiple_of(8);
    }
}

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
        fix_frames(&mut seg);
    }
    let disk = SimStorage::new();
    disk.put_file_bytes(&PathBuf::from(SEGMENT), seg);
    let _ = open(&disk, true);
    if let Ok(first) = open(&disk, false) {
        let again = open(&disk, true).expect("a shard a read-write open accepted opens again");
        assert_eq!(again, first, "a second open scans other records");
    }
});
