//! The daemon's records in the batch WAL and the audit log (claim, done, audit row), and the
//! one place that knows how they are encoded: bincode 2 (pinned `>=2.0.1, <3`; bincode 3.x is
//! an empty tombstone, RUSTSEC-2025-0141), little-endian, fixed-width integers, with a decode
//! limit so a length prefix read from disk can never make it allocate more than the frame
//! that holds it. The WAL itself stores opaque `(type, bytes)` records; the version byte of
//! each WAL frame covers these payloads too, so any change here bumps `WAL_FORMAT_VERSION`
//! (the mapping from frame versions to this payload version is pinned below). No `usize` is ever encoded: every integer field has an explicit width.

use std::collections::{BTreeMap, HashMap};

use bincode::{Decode, Encode};
use roost_wal::{Lsn, Record, Wal};

use crate::error::EngineError;

pub use crate::error::CodecError;

/// The payload schema of this module. WAL frames of version 1 and 2 carry payloads of
/// version 1 (frame version 2 changed only the header: the synced mark); frames of version 3
/// carry version 2, which is version 1 plus one record type (`Rejected`, issue 13 item 6).
/// So the frame's version byte tells the payload version, and one decoder reads both.
/// Changing a record below means a new `WAL_FORMAT_VERSION` that announces it and a decoder
/// kept for the old; the assert makes a bump of either version revisit this mapping.
pub const RECORDS_FORMAT_VERSION: u8 = 2;
const _: () = assert!(
    roost_wal::format::WAL_FORMAT_VERSION == 3
        && roost_wal::format::WAL_FORMAT_VERSION_MIN == 1
        && RECORDS_FORMAT_VERSION == 2
);

/// Record types of the batch WAL (`<data-dir>/wal`) and of the audit log
/// (`<data-dir>/audit`, same frame format).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordType {
    /// A batch's plan and claimed ids under its request key ([`ClaimRecord`]).
    Claim = 1,
    /// The batch is finished: every shard committed, every audit row durable ([`DoneRecord`]).
    Done = 2,
    /// One audit row, one per committed op (audit log only, [`AuditRecord`]).
    Audit = 3,
    /// A batch rejected at planning, with its answer ([`RejectedRecord`], batch WAL only;
    /// payload version 2).
    Rejected = 4,
}

impl RecordType {
    pub fn from_u8(v: u8) -> Option<RecordType> {
        match v {
            1 => Some(RecordType::Claim),
            2 => Some(RecordType::Done),
            3 => Some(RecordType::Audit),
            4 => Some(RecordType::Rejected),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            RecordType::Claim => "claim",
            RecordType::Done => "done",
            RecordType::Audit => "audit",
            RecordType::Rejected => "rejected",
        }
    }
}

/// One planned op, exactly as it will be applied: a half-applied batch is finished from this,
/// never planned again.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum PlannedOp {
    /// Create `record` (the canonical JSON bytes) under the claimed id.
    Create {
        shard: String,
        id: u64,
        record: Vec<u8>,
    },
    /// Delete `id`, which existed on `shard` when the batch was planned.
    Delete { shard: String, id: u64 },
}

impl PlannedOp {
    pub fn shard(&self) -> &str {
        match self {
            PlannedOp::Create { shard, .. } | PlannedOp::Delete { shard, .. } => shard,
        }
    }
    pub fn id(&self) -> u64 {
        match self {
            PlannedOp::Create { id, .. } | PlannedOp::Delete { id, .. } => *id,
        }
    }
    pub fn kind(&self) -> OpKind {
        match self {
            PlannedOp::Create { .. } => OpKind::Create,
            PlannedOp::Delete { .. } => OpKind::Delete,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Encode, Decode)]
pub enum OpKind {
    Create,
    Delete,
}

impl OpKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Create => "create",
            OpKind::Delete => "delete",
        }
    }
}

/// The claim: written and synced before any shard commits.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct ClaimRecord {
    pub request_key: String,
    /// The spool file name the batch came from, so recovery can write its result.
    pub source: String,
    /// The batch's fingerprint: a hash of its canonical form, compared when a key comes back.
    pub fingerprint: u64,
    pub ops: Vec<PlannedOp>,
}

impl ClaimRecord {
    /// The shards the batch touches, each once, in name order.
    pub fn touched_shards(&self) -> std::collections::BTreeSet<&str> {
        self.ops.iter().map(PlannedOp::shard).collect()
    }
}

/// A rejection, recorded and synced before it is answered: the same batch (same request key
/// and fingerprint) gets this answer again, whatever changed since; another batch under the
/// same key is planned as new (a client may fix a rejected batch and send it again).
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct RejectedRecord {
    pub request_key: String,
    pub source: String,
    pub fingerprint: u64,
    pub op_index: u32,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct DoneRecord {
    pub claim_lsn: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct AuditRecord {
    /// The lsn of the batch's claim in the batch WAL.
    pub claim_lsn: u64,
    pub request_key: String,
    pub op_index: u32,
    pub op: OpKind,
    pub shard: String,
    pub id: u64,
}

/// Decoding never reads past this many bytes, whatever a length prefix says.
const DECODE_LIMIT_BYTES: usize = 256 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<DECODE_LIMIT_BYTES>()
}

/// Encodes a record. Fails only when the value exceeds the decode limit, which the daemon's
/// own limits (record_bytes_max, batch_ops_max) rule out long before; the error is still
/// reported, never replaced by an empty payload.
pub fn encode<T: Encode>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    bincode::encode_to_vec(value, config()).map_err(|e| CodecError {
        what,
        detail: e.to_string(),
    })
}

pub fn decode<T: Decode<()>>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    let (value, used) = bincode::decode_from_slice(bytes, config()).map_err(|e| CodecError {
        what,
        detail: e.to_string(),
    })?;
    if used != bytes.len() {
        return Err(CodecError {
            what,
            detail: format!("{} trailing bytes", bytes.len() - used),
        });
    }
    Ok(value)
}

/// A request key's answer, kept in the key table (`<data-dir>/keys`, same frame format, type
/// [`KEY_RECORD_TYPE`]) once its batch is below a checkpoint and its WAL records may be gone.
#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub struct KeyRecord {
    pub request_key: String,
    pub fingerprint: u64,
    /// The lsn of the batch's claim or recorded rejection in the batch WAL.
    pub lsn: u64,
    /// Unix milliseconds when the key entered the table (non-decreasing along it): the key is
    /// remembered for the configured window from then.
    pub at_ms: u64,
    pub answer: KeyAnswer,
}

#[derive(Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub enum KeyAnswer {
    /// The ops of the committed batch: kind, shard and id (created or deleted), in op order.
    Committed(Vec<(OpKind, String, u64)>),
    Rejected {
        op_index: u32,
        reason: String,
    },
}

/// The key table's one record type.
pub const KEY_RECORD_TYPE: u8 = 1;

/// What recovery needs that the WAL below `wal_from` held (`<data-dir>/CHECKPOINT`, written
/// tmp + fsync + rename + directory fsync; a version byte and a CRC-32 before this payload).
#[derive(Clone, Debug, Default, PartialEq, Eq, Encode, Decode)]
pub struct Checkpoint {
    /// Every claim below this lsn has a durable `done` record; recovery replays from here.
    pub wal_from: u64,
    /// Audit rows of claims at or after `wal_from` are at or after this audit lsn.
    pub audit_from: u64,
    /// The next id to mint (at least).
    pub next_id: u64,
    /// Every shard ever written, with the largest claim lsn whose frames it has flushed.
    pub shards: Vec<(String, u64)>,
    /// The key table holds every key of a claim or rejection below `wal_from`.
    pub keys_through: u64,
    /// Unix milliseconds when it was taken.
    pub at_ms: u64,
}

/// A batch-WAL record, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalEntry {
    Claim(ClaimRecord),
    Done(DoneRecord),
    Rejected(RejectedRecord),
}

/// Decodes one batch-WAL record. A record whose checksum held but whose type or payload make
/// no sense is damage (corruption class), named by its lsn.
pub fn decode_wal(rec: &Record) -> Result<WalEntry, EngineError> {
    decode_wal_parts(rec.lsn, rec.record_type, &rec.payload)
}

/// [`decode_wal`] from a record's parts (a standby decodes what it fetched before it has a
/// WAL record of its own).
pub fn decode_wal_parts(
    lsn: Lsn,
    record_type: u8,
    payload: &[u8],
) -> Result<WalEntry, EngineError> {
    let codec = |source| EngineError::Codec { lsn, source };
    match RecordType::from_u8(record_type) {
        Some(RecordType::Claim) => decode("claim", payload).map(WalEntry::Claim).map_err(codec),
        Some(RecordType::Done) => decode("done", payload).map(WalEntry::Done).map_err(codec),
        Some(RecordType::Rejected) => decode("rejected", payload)
            .map(WalEntry::Rejected)
            .map_err(codec),
        _ => Err(EngineError::Inconsistent {
            lsn,
            detail: format!("unknown record type {record_type} in the batch wal"),
        }),
    }
}

/// Decodes one key-table record.
pub fn decode_key(rec: &Record) -> Result<KeyRecord, EngineError> {
    decode_only(rec, KEY_RECORD_TYPE, "key", "the key table")
}

/// Decodes a record of a log that holds one record type (`what`, in `log`): another type
/// or an undecodable payload is damage, named by its lsn.
fn decode_only<T: Decode<()>>(
    rec: &Record,
    record_type: u8,
    what: &'static str,
    log: &str,
) -> Result<T, EngineError> {
    if rec.record_type != record_type {
        return Err(EngineError::Inconsistent {
            lsn: rec.lsn,
            detail: format!("unknown record type {} in {log}", rec.record_type),
        });
    }
    decode(what, &rec.payload).map_err(|source| EngineError::Codec {
        lsn: rec.lsn,
        source,
    })
}

/// Version of the `CHECKPOINT` file's layout: version byte, CRC-32 (little-endian) of the
/// payload, payload length (u32 little-endian), then the bincode [`Checkpoint`].
pub const CHECKPOINT_FORMAT_VERSION: u8 = 1;
const CHECKPOINT_HEADER_LEN: usize = 9;

/// The bytes of a `CHECKPOINT` file.
pub fn encode_checkpoint(c: &Checkpoint) -> Result<Vec<u8>, CodecError> {
    let payload = encode("checkpoint", c)?;
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_LEN + payload.len());
    out.push(CHECKPOINT_FORMAT_VERSION);
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// A `CHECKPOINT` file's contents, or why they are not one (a written checkpoint is renamed
/// into place only once synced, so any damage here is corruption).
pub fn decode_checkpoint(bytes: &[u8]) -> Result<Checkpoint, String> {
    let head = bytes
        .get(..CHECKPOINT_HEADER_LEN)
        .ok_or("shorter than its header")?;
    if head[0] != CHECKPOINT_FORMAT_VERSION {
        return Err(format!("unknown checkpoint format version {}", head[0]));
    }
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let payload = &bytes[CHECKPOINT_HEADER_LEN..];
    if payload.len() != word(5) as usize {
        return Err(format!(
            "payload is {} bytes, header says {}",
            payload.len(),
            word(5)
        ));
    }
    if crc32fast::hash(payload) != word(1) {
        return Err("checksum mismatch".into());
    }
    decode("checkpoint", payload).map_err(|e| e.to_string())
}

/// Decodes one audit-log record.
pub fn decode_audit(rec: &Record) -> Result<AuditRecord, EngineError> {
    decode_only(rec, RecordType::Audit as u8, "audit", "the audit log")
}

/// Every batch-WAL record from `from` on, decoded, with its lsn.
pub fn read_wal(
    wal: &Wal,
    from: Lsn,
) -> impl Iterator<Item = Result<(Lsn, WalEntry), EngineError>> + '_ {
    read_wal_frames(wal, from).map(|r| r.map(|(rec, entry)| (rec.lsn, entry)))
}

/// Every batch-WAL record from `from` on, decoded, with its frame (epoch, segment, offset)
/// for tools that show where a record lives (`roost wal dump`).
pub fn read_wal_frames(
    wal: &Wal,
    from: Lsn,
) -> impl Iterator<Item = Result<(Record, WalEntry), EngineError>> + '_ {
    wal.replay(from).map(|rec| {
        let rec = rec?;
        let entry = decode_wal(&rec)?;
        Ok((rec, entry))
    })
}

/// Every audit row from `from` on, decoded, with its own lsn in the audit log.
pub fn read_audit(
    audit: &Wal,
    from: Lsn,
) -> impl Iterator<Item = Result<(Lsn, AuditRecord), EngineError>> + '_ {
    audit.replay(from).map(|rec| {
        let rec = rec?;
        Ok((rec.lsn, decode_audit(&rec)?))
    })
}

/// Claims seen in the WAL, in lsn order, and which of them a `done` record finished. Feeds
/// both recovery and `verify`: the largest claim lsn a `done` record vouches for, per shard
/// (every frame up to it was flushed before that `done` was written).
#[derive(Debug, Default)]
pub struct ClaimLedger {
    /// Claims without a `done` record yet, by claim lsn.
    pub unfinished: BTreeMap<Lsn, ClaimRecord>,
    /// Per shard, the largest claim lsn with a `done` record.
    pub vouched: HashMap<String, Lsn>,
    /// Replay started here (a checkpoint): a `done` for a claim below it finished a batch
    /// the checkpoint already holds.
    pub from: Lsn,
}

impl ClaimLedger {
    pub fn claim(&mut self, lsn: Lsn, c: ClaimRecord) {
        self.unfinished.insert(lsn, c);
    }

    /// [`ClaimLedger::done`], except that a `done` for a claim below `from` (replay started
    /// at a checkpoint above that claim) is `None`, not damage.
    pub fn done_after(
        &mut self,
        lsn: Lsn,
        d: &DoneRecord,
    ) -> Result<Option<ClaimRecord>, EngineError> {
        if d.claim_lsn < self.from && !self.unfinished.contains_key(&d.claim_lsn) {
            return Ok(None);
        }
        self.done(lsn, d).map(Some)
    }

    /// Marks the claim at `d.claim_lsn` finished and returns it; a `done` for a claim not
    /// seen (or finished twice) is damage.
    pub fn done(&mut self, lsn: Lsn, d: &DoneRecord) -> Result<ClaimRecord, EngineError> {
        let Some(c) = self.unfinished.remove(&d.claim_lsn) else {
            return Err(EngineError::Inconsistent {
                lsn,
                detail: format!("done for unknown claim lsn {}", d.claim_lsn),
            });
        };
        for op in &c.ops {
            let t = self.vouched.entry(op.shard().to_owned()).or_insert(0);
            *t = (*t).max(d.claim_lsn);
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn claim_round_trips() {
        let c = ClaimRecord {
            request_key: "order-17".into(),
            source: "a.json".into(),
            fingerprint: 99,
            ops: vec![
                PlannedOp::Create {
                    shard: "users".into(),
                    id: 1001,
                    record: b"{}".to_vec(),
                },
                PlannedOp::Delete {
                    shard: "users".into(),
                    id: 17,
                },
            ],
        };
        let back: ClaimRecord = decode("claim", &encode("claim", &c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]
        /// Random bytes never panic the decoder and never make it allocate past the input:
        /// a length prefix larger than what follows is an error.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<ClaimRecord>("claim", &bytes);
            let _ = decode::<AuditRecord>("audit", &bytes);
        }
    }

    #[test]
    fn huge_length_prefix_is_an_error() {
        let mut b = vec![0u8; 8];
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<ClaimRecord>("claim", &b).is_err());
    }
}
