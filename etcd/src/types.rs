//! The values the calls take and return: keys as `String` (roost's keys are text), values
//! as bytes, revisions and lease ids as `i64` (etcd's int64).

/// A key and its value as etcd holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision that created the key (since its last delete).
    pub create_revision: i64,
    /// The revision of the last write to it.
    pub mod_revision: i64,
    /// Writes since it was created (1 after the create).
    pub version: i64,
    /// The lease it is attached to; 0 for none.
    pub lease: i64,
}

/// A granted lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    /// The TTL etcd granted: at least the one asked for, and at least etcd's minimum (1.5
    /// election timeouts rounded up to a second).
    pub ttl_secs: i64,
}

/// A transaction: if every `compare` holds, `success` runs, else `failure`; atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Compare>,
    pub success: Vec<Op>,
    pub failure: Vec<Op>,
}

/// How a compare's target relates to its operand (`target OP operand`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// One condition of a [`Txn`]. A missing key has create_revision, mod_revision and version
/// 0, so `Compare::create_revision(k, CmpOp::Equal, 0)` is "k does not exist".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub(crate) key: String,
    pub(crate) op: CmpOp,
    pub(crate) target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    CreateRevision(i64),
    ModRevision(i64),
    Version(i64),
    Value(Vec<u8>),
}

impl Compare {
    pub fn create_revision(key: &str, op: CmpOp, revision: i64) -> Compare {
        Compare::new(key, op, Target::CreateRevision(revision))
    }

    pub fn mod_revision(key: &str, op: CmpOp, revision: i64) -> Compare {
        Compare::new(key, op, Target::ModRevision(revision))
    }

    pub fn version(key: &str, op: CmpOp, version: i64) -> Compare {
        Compare::new(key, op, Target::Version(version))
    }

    /// Compares the key's value as bytes. etcd never matches a missing key on its value
    /// (the compare is false, whatever `op`).
    pub fn value(key: &str, op: CmpOp, value: &[u8]) -> Compare {
        Compare::new(key, op, Target::Value(value.to_vec()))
    }

    fn new(key: &str, op: CmpOp, target: Target) -> Compare {
        Compare {
            key: key.to_owned(),
            op,
            target,
        }
    }
}

/// One operation of a [`Txn`] branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<i64>,
    },
    Get {
        key: String,
    },
    Delete {
        key: String,
    },
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResponse {
    /// Whether every compare held (and so `success` ran).
    pub succeeded: bool,
    /// The store's revision after the transaction (its own, if it wrote).
    pub revision: i64,
    /// One per op of the branch that ran, in order.
    pub responses: Vec<OpResponse>,
}

/// The answer to one [`Op`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResponse {
    /// A `Get`: the key, or nothing.
    Range(Vec<Kv>),
    Put,
    Delete {
        deleted: i64,
    },
}
