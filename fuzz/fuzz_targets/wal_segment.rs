//! A WAL segment scanned at open (`Wal::open_with`, read-only and read-write) and replayed,
//! each record decoded as the daemon decodes it (`records::decode_wal_parts`). Input: a
//! choice byte, then the segment. With the choice's low bit set every frame whose length
//! fits gets its CRC recomputed first, so the scan's later rules are reached. Properties:
//! no panic, lsns strictly increasing, and a read-write open (which may cut a torn tail)
//! leaves a log that opens again to the same records.
#![no_main]

use std::path::PathBuf;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use roost::pipeline::records::decode_wal_parts;
use roost_storage::SimStorage;
use roost_wal::format::{frame_len, CRC_OFFSET, LEN_OFFSET, RECORD_HEADER_LEN, VERSION_OFFSET};
use roost_wal::{Wal, WalOptions};

const SEGMENT: &str = "/w/00000000000000000001.wal";

fn fix_frames(seg: &mut [u8]) {
    let mut at = 0;
    while at + RECORD_HEADER_LEN <= seg.len() {
        let b = &seg[at + LEN_OFFSET..at + LEN_OFFSET + 4];
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let end = at + RECORD_HEADER_LEN + len;
        if len > 4096 || end > seg.len() {
            return;
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&seg[at + VERSION_OFFSET..end]);
        let crc = h.finalize().to_le_bytes();
        seg[at + CRC_OFFSET..at + CRC_OFFSET + 4].copy_from_slice(&crc);
        at += frame_len(len);
    }
}

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
        fix_frames(&mut seg);
    }
    let disk = SimStorage::new();
    disk.put_file_bytes(&PathBuf::from(SEGMENT), seg);
    let _ = replay(&disk, true);
    if let Ok(first) = replay(&disk, false) {
        let again = replay(&disk, true).expect("a log a read-write open accepted opens again");
        assert_eq!(again, first, "a second open replays other records");
    }
});
