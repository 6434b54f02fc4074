//! The WAL record frame, byte by byte (docs/wal-format.md is the same table in prose).
//! This module only encodes and checks frames; it never does I/O.
//!
//! ```text
//! offset size field
//!      0    4 crc32     CRC-32 (crc32fast, IEEE) over bytes 4..24 of the header, then the payload
//!      4    1 version   WAL_FORMAT_VERSION (3; versions 1 and 2 are still read)
//!      5    1 type      record type (the caller's; the daemon's are in pipeline/records.rs)
//!      6    2 synced    synced_back: lsn minus the highest lsn durable when this record was
//!                       appended; 0 = no mark (more than u16::MAX records unsynced). Version 1:
//!                       reserved, zero (its records keep the old rule, see Header::vouches_for)
//!      8    4 len       payload length in bytes, <= the log's payload_bytes_max
//!     12    4 epoch     leader epoch the record was written in; never decreases along a log
//!     16    8 lsn       log sequence number, strictly increasing by 1 across the whole log
//!     24  len payload   opaque bytes (the daemon's bincode records), then zero padding to 8
//! ```
//! All integers little-endian.

pub const RECORD_HEADER_LEN: usize = 24;
pub const CRC_OFFSET: usize = 0;
pub const VERSION_OFFSET: usize = 4;
pub const TYPE_OFFSET: usize = 5;
/// Where the synced mark lives (the reserved field of version 1, always zero there).
pub const SYNCED_BACK_OFFSET: usize = 6;
pub const LEN_OFFSET: usize = 8;
pub const EPOCH_OFFSET: usize = 12;
pub const LSN_OFFSET: usize = 16;
/// Every record starts on this boundary, so a scan for later valid records (corruption vs.
/// torn tail) tests one position in eight, and headers never straddle a 512-byte sector.
pub const RECORD_ALIGN: usize = 8;
/// Bumped on any change to the header or to the payload codec. Version 2 gave the reserved
/// field a meaning (`synced_back`); the payloads did not change. Version 3 has version 2's
/// header; the daemon's payloads gained a record type (a recorded rejection), so an older
/// roost refuses the log by its version instead of misreading a record.
pub const WAL_FORMAT_VERSION: u8 = 3;
/// The oldest version still read: a version 1 record carries no synced mark, and recovery
/// applies the old rule to it (damage followed by it is corruption).
pub const WAL_FORMAT_VERSION_MIN: u8 = 1;
/// Hard ceiling on `payload_bytes_max`; the length field is checked against the configured
/// limit before anything is allocated.
pub const PAYLOAD_BYTES_MAX_LIMIT: u32 = 256 << 20;

const _: () = assert!(RECORD_HEADER_LEN == 24);
const _: () = assert!(LSN_OFFSET + 8 == RECORD_HEADER_LEN);
const _: () = assert!(RECORD_HEADER_LEN.is_multiple_of(RECORD_ALIGN));

/// A decoded, verified header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub record_type: u8,
    /// Distance back from `lsn` to the highest lsn durable when the record was appended; 0
    /// when the record carries no mark.
    pub synced_back: u16,
    pub len: u32,
    pub epoch: u32,
    pub lsn: u64,
}

impl Header {
    /// Whether this record is durable evidence that a completed sync covered `lsn`: the
    /// writer knew every record up to `self.lsn - synced_back` durable when it appended this
    /// one. A version 1 record vouches for everything (the old rule: its writer assumed the
    /// disk keeps unsynced writes as a prefix, so damage before it is corruption); a record
    /// without a mark vouches for nothing.
    pub fn vouches_for(&self, lsn: u64) -> bool {
        match self.version {
            1 => true,
            _ => self.synced_back != 0 && self.lsn.saturating_sub(self.synced_back.into()) >= lsn,
        }
    }
}

/// The `synced_back` a record at `lsn` carries when every record up to `synced_lsn` is known
/// durable: 0 (no mark) when the distance does not fit, so a mark never claims more than
/// was synced.
pub fn synced_back(lsn: u64, synced_lsn: u64) -> u16 {
    match lsn.checked_sub(synced_lsn).map(u16::try_from) {
        Some(Ok(d)) => d,
        _ => 0,
    }
}

/// Total on-disk size of a record with `len` payload bytes, padding included.
pub fn frame_len(len: usize) -> usize {
    (RECORD_HEADER_LEN + len).next_multiple_of(RECORD_ALIGN)
}

/// Encodes one record frame (header, payload, padding) of the current version;
/// `synced_lsn` is the highest lsn known durable now (lower than `lsn`).
pub fn encode_frame(
    record_type: u8,
    epoch: u32,
    lsn: u64,
    synced_lsn: u64,
    payload: &[u8],
) -> Vec<u8> {
    let mut buf = vec![0u8; frame_len(payload.len())];
    buf[VERSION_OFFSET] = WAL_FORMAT_VERSION;
    buf[TYPE_OFFSET] = record_type;
    buf[SYNCED_BACK_OFFSET..SYNCED_BACK_OFFSET + 2]
        .copy_from_slice(&synced_back(lsn, synced_lsn).to_le_bytes());
    buf[LEN_OFFSET..LEN_OFFSET + 4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    buf[EPOCH_OFFSET..EPOCH_OFFSET + 4].copy_from_slice(&epoch.to_le_bytes());
    buf[LSN_OFFSET..LSN_OFFSET + 8].copy_from_slice(&lsn.to_le_bytes());
    buf[RECORD_HEADER_LEN..RECORD_HEADER_LEN + payload.len()].copy_from_slice(payload);
    let crc = checksum(&buf[..RECORD_HEADER_LEN], payload);
    buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    buf
}

fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&header[VERSION_OFFSET..RECORD_HEADER_LEN]);
    h.update(payload);
    h.finalize()
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// What a scan sees at one offset: the inputs of the recovery decision table that depend on
/// the bytes alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The header bytes are all zero (preallocated space, or nothing reached the disk).
    Zero,
    /// A whole frame whose checksum and version verify.
    Valid(Header),
    /// Anything else: short header, unknown version, length over the limit, payload running
    /// past the end of the file, or a checksum mismatch. The string says which.
    Invalid(&'static str),
}

/// Looks at the frame starting at `buf[0]`. Never allocates; a length is checked against
/// `payload_bytes_max` and against the bytes present before it is used.
pub fn probe(buf: &[u8], payload_bytes_max: u32) -> Probe {
    if buf.len() < RECORD_HEADER_LEN {
        return if buf.iter().all(|b| *b == 0) {
            Probe::Zero
        } else {
            Probe::Invalid("short header")
        };
    }
    let head = &buf[..RECORD_HEADER_LEN];
    if head.iter().all(|b| *b == 0) {
        return Probe::Zero;
    }
    let version = head[VERSION_OFFSET];
    if !(WAL_FORMAT_VERSION_MIN..=WAL_FORMAT_VERSION).contains(&version) {
        return Probe::Invalid("unknown format version");
    }
    let len = le_u32(head, LEN_OFFSET);
    if len > payload_bytes_max {
        return Probe::Invalid("payload length over limit");
    }
    let end = RECORD_HEADER_LEN + len as usize;
    if end > buf.len() {
        return Probe::Invalid("payload runs past end of segment");
    }
    if le_u32(head, CRC_OFFSET) != checksum(head, &buf[RECORD_HEADER_LEN..end]) {
        return Probe::Invalid("checksum mismatch");
    }
    Probe::Valid(Header {
        version,
        record_type: head[TYPE_OFFSET],
        synced_back: le_u16(head, SYNCED_BACK_OFFSET),
        len,
        epoch: le_u32(head, EPOCH_OFFSET),
        lsn: le_u64(head, LSN_OFFSET),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trips_and_detects_each_flipped_byte() {
        let f = encode_frame(3, 1, 42, 40, b"payload!");
        assert_eq!(f.len(), 32);
        let h = match probe(&f, 1024) {
            Probe::Valid(h) => h,
            other => panic!("{other:?}"),
        };
        assert_eq!((h.record_type, h.len, h.epoch, h.lsn), (3, 8, 1, 42));
        assert_eq!((h.version, h.synced_back), (WAL_FORMAT_VERSION, 2));
        for i in 0..RECORD_HEADER_LEN + 8 {
            let mut g = f.clone();
            g[i] ^= 0x40;
            assert!(matches!(probe(&g, 1024), Probe::Invalid(_)), "byte {i}");
        }
    }

    /// A header that claims a 4 GiB payload is refused by its length, before anything reads
    /// or allocates for it.
    #[test]
    fn absurd_length_is_invalid_not_an_allocation() {
        let mut f = encode_frame(1, 1, 1, 0, b"x");
        f[LEN_OFFSET..LEN_OFFSET + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            probe(&f, 1 << 20),
            Probe::Invalid("payload length over limit")
        );
    }

    /// A mark never claims more than was synced: a distance that does not fit is no mark,
    /// and a record vouches for exactly the lsns at or below its mark.
    #[test]
    fn synced_mark_is_a_lower_bound() {
        assert_eq!(synced_back(10, 9), 1);
        assert_eq!(synced_back(10, 0), 10);
        assert_eq!(synced_back(70_000, 1), 0);
        assert_eq!(synced_back(5, 5), 0);
        let h = |version, synced_back| Header {
            version,
            record_type: 1,
            synced_back,
            len: 0,
            epoch: 1,
            lsn: 10,
        };
        assert!(h(2, 3).vouches_for(7) && !h(2, 3).vouches_for(8));
        assert!(!h(2, 0).vouches_for(1), "no mark, no evidence");
        assert!(h(1, 0).vouches_for(9), "version 1: the old prefix rule");
        assert!(
            !h(2, u16::MAX).vouches_for(1),
            "a mark below lsn 1 vouches for nothing"
        );
    }
}
