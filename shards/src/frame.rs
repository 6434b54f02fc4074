//! The shard transaction frame, byte by byte (docs/shard-format.md is the same table). One
//! frame holds all of one batch's ops for one shard, under one checksum: that is what makes a
//! shard transaction atomic. This module encodes and verifies; it never does I/O.
//!
//! ```text
//! frame header (FRAME_HEADER_LEN = 32), little-endian
//!      0    4 crc32     CRC-32 over bytes 4..32 of the header, then the body
//!      4    1 version   SHARD_FORMAT_VERSION
//!      5    1 type      FRAME_TYPE_TXN
//!      6    2 reserved  zero
//!      8    4 body_len  bytes of body (a multiple of 8)
//!     12    4 op_count  ops in the body
//!     16    8 lsn       the batch's claim lsn in the WAL; strictly increasing along a shard
//!     24    8 reserved  zero
//! body: op_count ops, each
//!      0    1 kind      OP_CREATE or OP_DELETE
//!      1    3 reserved  zero
//!      4    4 rec_len   record bytes (0 for a delete)
//!      8    8 id
//!     16  rec_len record   then zero padding to an 8-byte boundary
//! ```

use roost_storage::recovery::Seen;

pub const FRAME_HEADER_LEN: usize = 32;
pub const CRC_OFFSET: usize = 0;
pub const VERSION_OFFSET: usize = 4;
pub const TYPE_OFFSET: usize = 5;
pub const BODY_LEN_OFFSET: usize = 8;
pub const OP_COUNT_OFFSET: usize = 12;
pub const LSN_OFFSET: usize = 16;
pub const OP_HEADER_LEN: usize = 16;
pub const OP_KIND_OFFSET: usize = 0;
pub const OP_REC_LEN_OFFSET: usize = 4;
pub const OP_ID_OFFSET: usize = 8;
pub const FRAME_ALIGN: usize = 8;
pub const SHARD_FORMAT_VERSION: u8 = 1;
pub const FRAME_TYPE_TXN: u8 = 1;
pub const OP_CREATE: u8 = 1;
pub const OP_DELETE: u8 = 2;

const _: () = assert!(FRAME_HEADER_LEN == 32);
const _: () = assert!(LSN_OFFSET + 8 <= FRAME_HEADER_LEN);
const _: () = assert!(OP_HEADER_LEN == OP_ID_OFFSET + 8);

/// One op of a shard transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    Create { id: u64, record: Vec<u8> },
    Delete { id: u64 },
}

/// All of one batch's ops on one shard, applied atomically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Txn {
    pub lsn: u64,
    pub ops: Vec<TxnOp>,
}

/// A decoded op, borrowing its record from the frame; `record_offset` is relative to the
/// frame start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpRef {
    pub kind: u8,
    pub id: u64,
    pub record_offset: usize,
    pub record_len: usize,
}

fn pad(n: usize) -> usize {
    n.next_multiple_of(FRAME_ALIGN)
}

/// Bytes a transaction takes on disk.
pub fn encoded_len(txn: &Txn) -> usize {
    FRAME_HEADER_LEN
        + txn
            .ops
            .iter()
            .map(|op| match op {
                TxnOp::Create { record, .. } => OP_HEADER_LEN + pad(record.len()),
                TxnOp::Delete { .. } => OP_HEADER_LEN,
            })
            .sum::<usize>()
}

pub fn encode(txn: &Txn) -> Vec<u8> {
    let mut buf = vec![0u8; encoded_len(txn)];
    buf[VERSION_OFFSET] = SHARD_FORMAT_VERSION;
    buf[TYPE_OFFSET] = FRAME_TYPE_TXN;
    let body_len = (buf.len() - FRAME_HEADER_LEN) as u32;
    buf[BODY_LEN_OFFSET..BODY_LEN_OFFSET + 4].copy_from_slice(&body_len.to_le_bytes());
    buf[OP_COUNT_OFFSET..OP_COUNT_OFFSET + 4]
        .copy_from_slice(&(txn.ops.len() as u32).to_le_bytes());
    buf[LSN_OFFSET..LSN_OFFSET + 8].copy_from_slice(&txn.lsn.to_le_bytes());
    let mut pos = FRAME_HEADER_LEN;
    for op in &txn.ops {
        let (kind, id, rec): (u8, u64, &[u8]) = match op {
            TxnOp::Create { id, record } => (OP_CREATE, *id, record),
            TxnOp::Delete { id } => (OP_DELETE, *id, &[]),
        };
        buf[pos + OP_KIND_OFFSET] = kind;
        buf[pos + OP_REC_LEN_OFFSET..pos + OP_REC_LEN_OFFSET + 4]
            .copy_from_slice(&(rec.len() as u32).to_le_bytes());
        buf[pos + OP_ID_OFFSET..pos + OP_ID_OFFSET + 8].copy_from_slice(&id.to_le_bytes());
        pos += OP_HEADER_LEN;
        buf[pos..pos + rec.len()].copy_from_slice(rec);
        pos += pad(rec.len());
    }
    let crc = crc(&buf);
    buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    buf
}

fn crc(frame: &[u8]) -> u32 {
    crc32fast::hash(&frame[VERSION_OFFSET..])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// A verified frame: its lsn, total length and ops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameView {
    pub lsn: u64,
    pub len: usize,
    pub ops: Vec<OpRef>,
}

/// Looks at the frame at `buf[0]`: zero, valid (checksum, version and every op's bounds
/// verified) or invalid with a reason. Lengths are checked against the bytes present before
/// use; allocation is bounded by `op_count`, itself bounded by the body length.
pub fn probe(buf: &[u8]) -> (Seen, Result<FrameView, &'static str>) {
    if buf.len() < FRAME_HEADER_LEN {
        let seen = if buf.iter().all(|b| *b == 0) {
            Seen::Zero
        } else {
            Seen::Invalid
        };
        return (seen, Err("short header"));
    }
    if buf[..FRAME_HEADER_LEN].iter().all(|b| *b == 0) {
        return (Seen::Zero, Err("zero header"));
    }
    let bad = |why| (Seen::Invalid, Err(why));
    if buf[VERSION_OFFSET] != SHARD_FORMAT_VERSION || buf[TYPE_OFFSET] != FRAME_TYPE_TXN {
        return bad("unknown version or frame type");
    }
    let body_len = u32_at(buf, BODY_LEN_OFFSET) as usize;
    let len = FRAME_HEADER_LEN + body_len;
    if len > buf.len() {
        return bad("frame runs past end of segment");
    }
    let frame = &buf[..len];
    if u32_at(frame, CRC_OFFSET) != crc(frame) {
        return bad("checksum mismatch");
    }
    let op_count = u32_at(frame, OP_COUNT_OFFSET) as usize;
    if op_count > body_len / OP_HEADER_LEN {
        return bad("op count larger than the body can hold");
    }
    let mut ops = Vec::with_capacity(op_count);
    let mut pos = FRAME_HEADER_LEN;
    for _ in 0..op_count {
        if pos + OP_HEADER_LEN > len {
            return bad("op header past end of frame");
        }
        let kind = frame[pos + OP_KIND_OFFSET];
        let record_len = u32_at(frame, pos + OP_REC_LEN_OFFSET) as usize;
        let id = u64_at(frame, pos + OP_ID_OFFSET);
        let record_offset = pos + OP_HEADER_LEN;
        if (kind != OP_CREATE && kind != OP_DELETE) || (kind == OP_DELETE && record_len != 0) {
            return bad("unknown op kind");
        }
        if record_offset + record_len > len {
            return bad("record past end of frame");
        }
        ops.push(OpRef {
            kind,
            id,
            record_offset,
            record_len,
        });
        pos = record_offset + pad(record_len);
    }
    if pos != len {
        return bad("ops do not fill the body");
    }
    (
        Seen::Valid,
        Ok(FrameView {
            lsn: u64_at(frame, LSN_OFFSET),
            len,
            ops,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frame_round_trips() {
        let t = Txn {
            lsn: 9,
            ops: vec![
                TxnOp::Create {
                    id: 5,
                    record: b"{\"a\":1}".to_vec(),
                },
                TxnOp::Delete { id: 3 },
            ],
        };
        let f = encode(&t);
        assert_eq!(f.len(), encoded_len(&t));
        let (seen, v) = probe(&f);
        assert_eq!(seen, Seen::Valid);
        let v = v.unwrap();
        assert_eq!((v.lsn, v.len, v.ops.len()), (9, f.len(), 2));
        assert_eq!(
            &f[v.ops[0].record_offset..][..v.ops[0].record_len],
            b"{\"a\":1}"
        );
        assert_eq!((v.ops[1].kind, v.ops[1].id), (OP_DELETE, 3));
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]
        /// Random bytes and single bit flips never panic and never verify.
        #[test]
        fn random_and_flipped_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), flip in 0usize..400) {
            let _ = probe(&bytes);
            let t = Txn { lsn: 1, ops: vec![TxnOp::Create { id: 1, record: bytes.clone() }] };
            let mut f = encode(&t);
            let i = flip % f.len();
            f[i] ^= 1;
            prop_assert!(probe(&f).0 != Seen::Valid);
        }
    }
}
