//! Replication frames as they come off a connection, before and after authentication: the
//! leader reads a peer's first frame before it checks the name the peer may speak as, and
//! both sides read every later one, all through `wire::read_frame` (length checked against
//! `frame_bytes_max` before anything is allocated) and `wire::decode_frame`. Input: a
//! choice byte, then the bytes of a connection. With the choice's low bit set every frame
//! whose length fits gets its CRC recomputed, so the body decoders of every kind are
//! reached. Property: every frame read re-encodes to exactly the bytes it came from (the
//! encoding is canonical), and reading stops at the first error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roost_replication::wire::{self, read_frame, LEN_PREFIX_BYTES};

const FRAME_BYTES_MAX: u32 = 1 << 16;

fn fix_frames(b: &mut [u8]) {
    let mut at = 0;
    while at + LEN_PREFIX_BYTES + 4 <= b.len() {
        let len = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
        let end = at + LEN_PREFIX_BYTES + len;
        if len < 4 || end > b.len() {
            return;
        }
        roost_fuzz::fix_crc(b, at + 4, at + 8, end);
        at = end;
    }
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    let mut b = bytes.to_vec();
    if c & 1 == 1 {
        fix_frames(&mut b);
    }
    // One frame without its length prefix, as `decode_frame` is handed it.
    if let Ok(m) = wire::decode_frame(b.get(LEN_PREFIX_BYTES..).unwrap_or_default()) {
        let again = wire::encode(&m, u32::MAX).expect("a decoded frame encodes");
        assert_eq!(&again[LEN_PREFIX_BYTES..], &b[LEN_PREFIX_BYTES..]);
    }
    // A connection's frames, one after the other.
    let mut r: &[u8] = &b;
    for _ in 0..64 {
        let before = r;
        match roost_fuzz::ready(read_frame(&mut r, FRAME_BYTES_MAX)) {
            Ok(Some(m)) => {
                let used = &before[..before.len() - r.len()];
                let again = wire::encode(&m, FRAME_BYTES_MAX).expect("a frame read encodes");
                assert_eq!(again, used, "{} re-encoded differs", m.name());
            }
            Ok(None) => {
                assert!(before.is_empty());
                return;
            }
            Err(_) => return,
        }
    }
});
