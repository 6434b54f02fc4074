//! The one place that knows how payloads are encoded: bincode 2 (pinned `>=2.0.1, <3`;
//! bincode 3.x is an empty tombstone, RUSTSEC-2025-0141), little-endian, fixed-width
//! integers, with a decode limit so a length prefix read from disk can never make it allocate
//! more than the frame that holds it. Any change here bumps `WAL_FORMAT_VERSION`. No `usize`
//! is ever encoded: every integer field has an explicit width.

use bincode::{Decode, Encode};

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
}

impl RecordType {
    pub fn from_u8(v: u8) -> Option<RecordType> {
        match v {
            1 => Some(RecordType::Claim),
            2 => Some(RecordType::Done),
            3 => Some(RecordType::Audit),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            RecordType::Claim => "claim",
            RecordType::Done => "done",
            RecordType::Audit => "audit",
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

/// A payload could not be decoded: the frame's checksum held, so this is a format mismatch or
/// a bug, never a torn write.
#[derive(Debug, thiserror::Error)]
#[error("cannot decode {what} payload: {detail}")]
pub struct CodecError {
    pub what: &'static str,
    pub detail: String,
}

/// Decoding never reads past this many bytes, whatever a length prefix says.
const DECODE_LIMIT_BYTES: usize = 256 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<DECODE_LIMIT_BYTES>()
}

pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    // Encoding into a Vec fails only when the value exceeds the limit, which the daemon's
    // own limits (record_bytes_max, batch_ops_max) rule out long before.
    bincode::encode_to_vec(value, config()).unwrap_or_default()
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
        let back: ClaimRecord = decode("claim", &encode(&c)).unwrap();
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
