//! The shard transaction frame, byte by byte (docs/shard-format.md is the same table). One
//! frame holds all of one batch's ops for one shard, under one checksum: that is what makes a
//! shard transaction atomic. This module encodes and verifies; it never does I/O.
//!
//! ```text
//! frame header (FRAME_HEADER_LEN = 32), little-endian
//!      0    4 crc32     CRC-32 over bytes 4..32 of the header, then the body
//!      4    1 version   TXN_FRAME_VERSION (1)
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
//!
//! Format version 2 adds two frame types, written only into compacted segments (`compact.rs`):
//! a compacted segment starts with one `FRAME_TYPE_COMPACT` header frame (the same 32-byte
//! frame header, then `COMPACT_BODY_LEN` bytes: the sequence of the first segment it replaces,
//! the lsn range and largest id of the frames it replaced, and the count and bytes of what
//! follows), then `FRAME_TYPE_LIVE` frames whose body is ops exactly as above (the live
//! records, and the deletes still needed) and whose lsn is zero. Transaction frames are
//! unchanged and still carry version 1, so a held frame compares byte for byte with a
//! re-applied transaction whichever binary wrote it.

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
/// The newest shard format this code reads and writes: 2 since compacted segments.
pub const SHARD_FORMAT_VERSION: u8 = 2;
/// Transaction frames carry version 1 in every format version (they have not changed).
pub const TXN_FRAME_VERSION: u8 = 1;
/// The version of the frames only compacted segments hold.
pub const COMPACT_FRAME_VERSION: u8 = 2;
pub const FRAME_TYPE_TXN: u8 = 1;
/// A compacted segment's live records (and still needed deletes); lsn zero.
pub const FRAME_TYPE_LIVE: u8 = 2;
/// A compacted segment's header frame, at offset 0.
pub const FRAME_TYPE_COMPACT: u8 = 3;
/// Body of the compact header frame: six u64 fields.
pub const COMPACT_BODY_LEN: usize = 48;
pub const COMPACT_HEADER_LEN: usize = FRAME_HEADER_LEN + COMPACT_BODY_LEN;
pub const FIRST_SEQ_OFFSET: usize = 32;
pub const LSN_LO_OFFSET: usize = 40;
pub const LSN_HI_OFFSET: usize = 48;
pub const ID_MAX_OFFSET: usize = 56;
pub const LIVE_FRAMES_OFFSET: usize = 64;
pub const CONTENT_LEN_OFFSET: usize = 72;
pub const OP_CREATE: u8 = 1;
pub const OP_DELETE: u8 = 2;

const _: () = assert!(FRAME_HEADER_LEN == 32);
const _: () = assert!(LSN_OFFSET + 8 <= FRAME_HEADER_LEN);
const _: () = assert!(OP_HEADER_LEN == OP_ID_OFFSET + 8);
const _: () = assert!(COMPACT_HEADER_LEN == 80);
const _: () = assert!(CONTENT_LEN_OFFSET + 8 == COMPACT_HEADER_LEN);
const _: () = assert!(COMPACT_HEADER_LEN.is_multiple_of(FRAME_ALIGN));

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

/// Bytes one op takes in a frame body: its header and its record padded.
pub fn op_bytes(record_len: usize) -> usize {
    OP_HEADER_LEN + pad(record_len)
}

/// Bytes a transaction takes on disk.
pub fn encoded_len(txn: &Txn) -> usize {
    txn_len(txn.ops.iter().map(|op| match op {
        TxnOp::Create { record, .. } => Some(record.len()),
        TxnOp::Delete { .. } => None,
    }))
}

/// Bytes a transaction of these ops will take on disk, before it is built: a create's
/// record length, `None` for a delete.
pub fn txn_len(ops: impl IntoIterator<Item = Option<usize>>) -> usize {
    FRAME_HEADER_LEN
        + ops
            .into_iter()
            .map(|op| op.map_or(OP_HEADER_LEN, op_bytes))
            .sum::<usize>()
}

pub fn encode(txn: &Txn) -> Vec<u8> {
    let mut buf = Vec::with_capacity(encoded_len(txn));
    buf.resize(FRAME_HEADER_LEN, 0);
    for op in &txn.ops {
        match op {
            TxnOp::Create { id, record } => push_op(&mut buf, OP_CREATE, *id, record),
            TxnOp::Delete { id } => push_op(&mut buf, OP_DELETE, *id, &[]),
        }
    }
    seal(
        &mut buf,
        TXN_FRAME_VERSION,
        FRAME_TYPE_TXN,
        txn.ops.len(),
        txn.lsn,
    );
    buf
}

/// Appends one op (header, record, padding) to a frame being built.
fn push_op(buf: &mut Vec<u8>, kind: u8, id: u64, rec: &[u8]) {
    let pos = buf.len();
    buf.resize(pos + op_bytes(rec.len()), 0);
    buf[pos + OP_KIND_OFFSET] = kind;
    buf[pos + OP_REC_LEN_OFFSET..pos + OP_REC_LEN_OFFSET + 4]
        .copy_from_slice(&(rec.len() as u32).to_le_bytes());
    buf[pos + OP_ID_OFFSET..pos + OP_ID_OFFSET + 8].copy_from_slice(&id.to_le_bytes());
    let at = pos + OP_HEADER_LEN;
    buf[at..at + rec.len()].copy_from_slice(rec);
}

/// Fills the frame header of `buf` (header then body) and its checksum.
fn seal(buf: &mut [u8], version: u8, kind: u8, op_count: usize, lsn: u64) {
    buf[VERSION_OFFSET] = version;
    buf[TYPE_OFFSET] = kind;
    let body_len = (buf.len() - FRAME_HEADER_LEN) as u32;
    buf[BODY_LEN_OFFSET..BODY_LEN_OFFSET + 4].copy_from_slice(&body_len.to_le_bytes());
    buf[OP_COUNT_OFFSET..OP_COUNT_OFFSET + 4].copy_from_slice(&(op_count as u32).to_le_bytes());
    buf[LSN_OFFSET..LSN_OFFSET + 8].copy_from_slice(&lsn.to_le_bytes());
    let crc = crc(buf);
    buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Builds one `FRAME_TYPE_LIVE` frame of a compacted segment, op by op.
#[derive(Debug)]
pub struct LiveFrame {
    buf: Vec<u8>,
    ops: usize,
}

impl Default for LiveFrame {
    fn default() -> Self {
        LiveFrame {
            buf: vec![0u8; FRAME_HEADER_LEN],
            ops: 0,
        }
    }
}

impl LiveFrame {
    /// Adds a create; returns the record's offset from the frame start.
    pub fn push_create(&mut self, id: u64, record: &[u8]) -> usize {
        push_op(&mut self.buf, OP_CREATE, id, record);
        self.ops += 1;
        self.buf.len() - pad(record.len())
    }

    pub fn push_delete(&mut self, id: u64) {
        push_op(&mut self.buf, OP_DELETE, id, &[]);
        self.ops += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.ops == 0
    }

    /// Bytes the frame takes so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// The finished frame; the builder starts afresh.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut buf = std::mem::replace(&mut self.buf, vec![0u8; FRAME_HEADER_LEN]);
        seal(
            &mut buf,
            COMPACT_FRAME_VERSION,
            FRAME_TYPE_LIVE,
            self.ops,
            0,
        );
        self.ops = 0;
        buf
    }
}

/// A compacted segment's header (the body of its `FRAME_TYPE_COMPACT` frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactHeader {
    /// Sequence of the first segment this one replaces (its own sequence is the last): on
    /// open, segments with a sequence in `[first_seq, own)` are superseded.
    pub first_seq: u64,
    /// The lsns of the first and last transaction frames it replaced.
    pub lsn_lo: u64,
    pub lsn_hi: u64,
    /// The largest id any create in the replaced frames (or earlier) used.
    pub id_max: u64,
    /// `FRAME_TYPE_LIVE` frames after the header, and their bytes (the file is exactly
    /// `COMPACT_HEADER_LEN + content_len` long).
    pub live_frames: u64,
    pub content_len: u64,
}

impl CompactHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; COMPACT_HEADER_LEN];
        let fields = [
            (FIRST_SEQ_OFFSET, self.first_seq),
            (LSN_LO_OFFSET, self.lsn_lo),
            (LSN_HI_OFFSET, self.lsn_hi),
            (ID_MAX_OFFSET, self.id_max),
            (LIVE_FRAMES_OFFSET, self.live_frames),
            (CONTENT_LEN_OFFSET, self.content_len),
        ];
        for (at, v) in fields {
            buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        seal(
            &mut buf,
            COMPACT_FRAME_VERSION,
            FRAME_TYPE_COMPACT,
            0,
            self.lsn_hi,
        );
        buf
    }

    /// `Ok(None)`: `buf` does not start with a compact header (a segment of transaction
    /// frames, or zeros). `Err`: it claims to be one (version 2, type compact) and does not
    /// verify: a compacted segment is complete and synced before it gets its name, so this is
    /// corruption, never a torn tail.
    pub fn decode(buf: &[u8]) -> Result<Option<CompactHeader>, &'static str> {
        if buf.len() < FRAME_HEADER_LEN
            || buf[VERSION_OFFSET] != COMPACT_FRAME_VERSION
            || buf[TYPE_OFFSET] != FRAME_TYPE_COMPACT
        {
            return Ok(None);
        }
        if buf.len() < COMPACT_HEADER_LEN
            || u32_at(buf, BODY_LEN_OFFSET) as usize != COMPACT_BODY_LEN
        {
            return Err("compact header of the wrong length");
        }
        let h = &buf[..COMPACT_HEADER_LEN];
        if u32_at(h, CRC_OFFSET) != crc(h) {
            return Err("compact header checksum mismatch");
        }
        let hdr = CompactHeader {
            first_seq: u64_at(h, FIRST_SEQ_OFFSET),
            lsn_lo: u64_at(h, LSN_LO_OFFSET),
            lsn_hi: u64_at(h, LSN_HI_OFFSET),
            id_max: u64_at(h, ID_MAX_OFFSET),
            live_frames: u64_at(h, LIVE_FRAMES_OFFSET),
            content_len: u64_at(h, CONTENT_LEN_OFFSET),
        };
        if hdr.lsn_lo > hdr.lsn_hi || u64_at(h, LSN_OFFSET) != hdr.lsn_hi {
            return Err("compact header lsn range inverted");
        }
        // The segment's length is the header's plus this: a forged one near u64::MAX must
        // not wrap that sum into the file's real length (found by the shard_segment fuzz
        // target).
        if hdr.content_len > u64::MAX - COMPACT_HEADER_LEN as u64 {
            return Err("compact header content length overflows a segment length");
        }
        Ok(Some(hdr))
    }
}

fn crc(frame: &[u8]) -> u32 {
    crc32fast::hash(&frame[VERSION_OFFSET..])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
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
    probe_as(buf, TXN_FRAME_VERSION, FRAME_TYPE_TXN)
}

/// [`probe`] for the `FRAME_TYPE_LIVE` frames of a compacted segment.
pub fn probe_live(buf: &[u8]) -> (Seen, Result<FrameView, &'static str>) {
    probe_as(buf, COMPACT_FRAME_VERSION, FRAME_TYPE_LIVE)
}

fn probe_as(buf: &[u8], version: u8, kind: u8) -> (Seen, Result<FrameView, &'static str>) {
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
    if buf[VERSION_OFFSET] != version || buf[TYPE_OFFSET] != kind {
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

    #[test]
    fn live_frame_and_compact_header_round_trip() {
        let mut f = LiveFrame::default();
        let at = f.push_create(7, b"{\"x\":1}");
        f.push_delete(3);
        let bytes = f.finish();
        assert!(f.is_empty());
        let (seen, v) = probe_live(&bytes);
        assert_eq!(seen, Seen::Valid);
        let v = v.unwrap();
        assert_eq!(v.ops[0].record_offset, at);
        assert_eq!(&bytes[at..at + 7], b"{\"x\":1}");
        assert_eq!((v.ops[1].kind, v.ops[1].id, v.lsn), (OP_DELETE, 3, 0));
        assert_ne!(probe(&bytes).0, Seen::Valid, "a live frame is no txn frame");
        let h = CompactHeader {
            first_seq: 2,
            lsn_lo: 5,
            lsn_hi: 9,
            id_max: 40,
            live_frames: 1,
            content_len: bytes.len() as u64,
        };
        let mut enc = h.encode();
        assert_eq!(CompactHeader::decode(&enc), Ok(Some(h)));
        assert_eq!(
            CompactHeader::decode(&encode(&Txn {
                lsn: 1,
                ops: vec![]
            })),
            Ok(None)
        );
        enc[LSN_LO_OFFSET] ^= 1;
        assert!(CompactHeader::decode(&enc).is_err());
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
