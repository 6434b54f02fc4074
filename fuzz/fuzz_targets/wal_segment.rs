//! A WAL segment scanned at open (`Wal::open_with`, read-only and read-write) and replayed,
//! each record decoded as the daemon decodes it (`records::decode_wal_parts`). Input: a
//! choice byte, then the segment. With the choice's low bit set every frame whose length
//! fits gets its CRC recomputed first, so the scan's later rules are reached. Properties:
//! no panic, lsns strictly increasing, and a read-write open (which may cut a torn tail)
//! leaves a log that opens again to the same records.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use roost::pipeline::records::decode_wal_parts;
use roost_storage::SimStorage;
use roost_wal::format::{CRC_OFFSET, LEN_OFFSET, RECORD_HEADER_LEN, VERSION_OFFSET};
use roost_wal::{Wal, WalOptions};

const SEGMENT: &str = "/w/00000000000000000001.wal";

const FRAMES: roost_fuzz::FrameLayout = roost_fuzz::FrameLayout {
    header_len: RECORD_HEADER_LEN,
    len_offset: LEN_OFFSET,
    crc_offset: CRC_OFFSET,
    version_offset: VERSION_OFFSET,
    body_len_max: 4096,
};

/// The records a replay from lsn 1 yields (lsn, type, payload), or the first error.
fn replay(disk: &SimStorage, read_only: bool) -> Result<Vec<(u64, u8, Vec<u8>)>, String> {
    let o = WalOptions {
        segment_bytes: 8192,
        payload_bytes_max: 4096,
        read_only,
        ..WalOptions::default()
    };
    let w = Wal::open_with(Arc::new(disk.clone()), "/w", o).map_err(|e| e.to_string())?;
    let mut out: Vec<(u64, u8, Vec<u8>)> = Vec::new();
    for r in w.replay(1) {
        let r = r.map_err(|e| e.to_string())?;
        if let Some(prev) = out.last() {
            assert!(r.lsn > prev.0, "lsn {} replayed after {}", r.lsn, prev.0);
        }
        let _ = decode_wal_parts(r.lsn, r.record_type, &r.payload);
        out.push((r.lsn, r.record_type, r.payload));
    }
    Ok(out)
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    let mut seg = bytes.to_vec();
    if c & 1 == 1 {
        roost_fuzz::fix_frame_crcs(&mut seg, &FRAMES);
    }
    roost_fuzz::reopened_same(SEGMENT, seg, "WAL", replay);
});
