//! The daemon's error type and the one mapping from a failure's class to an exit code.
//!
//! Every failure keeps its class from where it happened to the exit code: damage on disk is
//! `Corruption` (65: systemd must not restart into it), a failed write or sync is `Io` (74: a
//! restart replays and repairs), another roost on the data directory is `Locked` (75), a bad
//! configuration is `Config` (78), bad input from the command line is `Usage` (2). A failure
//! reported to a second waiter (a shard owner answering several batches, a thread joining
//! another) is cloned with [`EngineError::clone_for_reply`], which keeps the class.
//! This module is a leaf: it imports nothing else from the daemon.

use std::path::PathBuf;

use roost_shards::ShardError;
use roost_wal::{Lsn, WalError};

/// A payload could not be decoded: the frame's checksum held, so this is a format mismatch or
/// a bug, never a torn write.
#[derive(Debug, thiserror::Error)]
#[error("{what} payload: {detail}")]
pub struct CodecError {
    pub what: &'static str,
    pub detail: String,
}

/// What kind of failure, as far as the operator and systemd care.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Damage found on disk (a checksum that held over bytes that contradict each other, a
    /// gap below the synced point): a restart cannot help.
    Corruption,
    /// A write, sync or read failed: the pipeline latched; a restart replays and repairs.
    Io,
    /// The data directory is held by another roost.
    Locked,
    /// The configuration is wrong.
    Config,
    /// The command line or its input is wrong.
    Usage,
    /// A command ran and its answer is "no" (`verify` found a violation, `get` found nothing,
    /// a submitted batch was rejected).
    Failed,
}

pub const EXIT_OK: i32 = 0;
/// `submit --wait`: some batch rejected or conflicted; `verify`: a violation; `get`: not found.
pub const EXIT_FAILED: i32 = 1;
/// Usage errors, invalid input; `submit --wait`: an invalid file, an error or a timeout.
pub const EXIT_INVALID: i32 = 2;
/// Damage found on disk: a restart cannot fix it (EX_DATAERR).
pub const EXIT_CORRUPTION: i32 = 65;
/// An I/O failure latched the pipeline; a restart replays and repairs (EX_IOERR).
pub const EXIT_IO: i32 = 74;
/// A panic (a bug) in any thread or task: the whole process stops (EX_SOFTWARE); a restart
/// replays and repairs like after a crash.
pub const EXIT_SOFTWARE: i32 = 70;
/// Another roost holds the data directory (EX_TEMPFAIL).
pub const EXIT_LOCKED: i32 = 75;
/// `submit --stream`: some batch was not taken now (answered `unavailable`, or unanswered
/// when the connection closed): send it again later under the same key (EX_TEMPFAIL).
pub const EXIT_UNAVAILABLE: i32 = 75;
/// The configuration is wrong (EX_CONFIG).
pub const EXIT_CONFIG: i32 = 78;

impl ErrorClass {
    /// The process exit code for this class (sysexits(3); the public contract (docs/contract.md)).
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorClass::Corruption => EXIT_CORRUPTION,
            ErrorClass::Io => EXIT_IO,
            ErrorClass::Locked => EXIT_LOCKED,
            ErrorClass::Config => EXIT_CONFIG,
            ErrorClass::Usage => EXIT_INVALID,
            ErrorClass::Failed => EXIT_FAILED,
        }
    }
}

/// A command's own failure with its class, for what has no typed cause underneath: a shard
/// that is not declared, a submit that cannot deliver, a daemon that does not answer. Used
/// as `.context(CommandError::usage(..))` it also states the class of whatever it wraps
/// (the command decides; `cli::exit_code` looks for it first).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    pub class: ErrorClass,
    pub message: String,
}

impl CommandError {
    /// Bad input from the command line (exit 2).
    pub fn usage(message: impl Into<String>) -> CommandError {
        CommandError {
            class: ErrorClass::Usage,
            message: message.into(),
        }
    }

    /// The command ran and its answer is "no" (exit 1).
    pub fn failed(message: impl Into<String>) -> CommandError {
        CommandError {
            class: ErrorClass::Failed,
            message: message.into(),
        }
    }
}

/// Everything the pipeline can fail with. Each variant names where.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error(transparent)]
    KeyIndex(#[from] roost_keyindex::IndexError),
    #[error("shard {shard}: {source}")]
    Shard { shard: String, source: ShardError },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("record lsn {lsn}: cannot decode {source}")]
    Codec { lsn: Lsn, source: CodecError },
    /// A record could not be encoded (over the codec's limit, which the daemon's own limits
    /// rule out): never written as an empty payload.
    #[error("cannot encode {0}")]
    Encode(CodecError),
    #[error("data directory {} is locked: another roost is running on it", path.display())]
    Locked { path: PathBuf },
    #[error("injected crash at {0}")]
    Crashed(String),
    #[error("pipeline stopped after an earlier failure")]
    Failed,
    #[error("wal record lsn {lsn}: {detail}")]
    Inconsistent { lsn: Lsn, detail: String },
    /// A failure already reported elsewhere (a shard owner stopped), repeated to another
    /// waiter with its class.
    #[error("{message}")]
    Poisoned { class: ErrorClass, message: String },
    /// Intake waits for disk space (a log has no spare segment): nothing was planned or
    /// written for this batch, and nothing is latched.
    #[error("intake paused: {part}: {why}")]
    Paused {
        part: String,
        why: roost_storage::NoRoom,
    },
    /// This node does not take batches (a standby, or a primary that stepped down): nothing
    /// was planned or written, and nothing is latched.
    #[error("not the primary (this node is {role}): batches wait in the spool")]
    NotPrimary { role: &'static str },
    /// The answer for the record at `lsn` waited for a standby and gave up (the node is
    /// stopping or stepped down): nothing was published; the batch stays claimed and is
    /// finished by recovery or by the new primary. Nothing is latched.
    #[error("record lsn {lsn} is not on a standby yet; its answer waits (ack = \"standby\")")]
    Unreplicated { lsn: Lsn },
    /// A standby's fetched records could not be applied, or the protocol stopped it.
    #[error("replication: {0}")]
    Replication(String),
    /// This standby cannot follow from what it holds (the primary no longer has the records
    /// it needs, or the logs diverge below its checkpoint): an operator must re-seed it.
    #[error("replication: {0}")]
    NeedsReseed(String),
    /// The node this standby follows leads an older epoch than one this standby knows
    /// (`--follow` names a former primary): an operator must point it at the primary.
    #[error("replication: {0}; point --follow (or [replication] follow) at the current primary")]
    StaleLeader(String),
    /// The replication credentials (`tls_cert`, `tls_key`, `tls_ca`) cannot be read or do
    /// not make a TLS setup: nothing replication-related starts.
    #[error("replication TLS: {0}")]
    Credentials(String),
}

impl EngineError {
    /// The same failure for a second waiter (I/O errors are not `Clone`): the message and the
    /// class survive, so a corrupt shard still exits 65 whoever reports it.
    pub fn clone_for_reply(&self) -> EngineError {
        match self {
            EngineError::Crashed(p) => EngineError::Crashed(p.clone()),
            other => EngineError::Poisoned {
                class: other.class(),
                message: other.to_string(),
            },
        }
    }

    /// The failure's class, which decides the exit code.
    pub fn class(&self) -> ErrorClass {
        match self {
            EngineError::Wal(e) => wal_class(e),
            EngineError::KeyIndex(e) if e.is_corruption() => ErrorClass::Corruption,
            EngineError::KeyIndex(_) => ErrorClass::Io,
            EngineError::Shard { source, .. } => shard_class(source),
            EngineError::Codec { .. } | EngineError::Inconsistent { .. } => ErrorClass::Corruption,
            EngineError::Locked { .. } => ErrorClass::Locked,
            EngineError::Poisoned { class, .. } => *class,
            EngineError::Io { .. }
            | EngineError::Encode(_)
            | EngineError::Crashed(_)
            | EngineError::Paused { .. }
            | EngineError::Failed
            | EngineError::Replication(_) => ErrorClass::Io,
            EngineError::NotPrimary { .. } | EngineError::Unreplicated { .. } => ErrorClass::Locked,
            EngineError::NeedsReseed(_)
            | EngineError::StaleLeader(_)
            | EngineError::Credentials(_) => ErrorClass::Config,
        }
    }

    /// Failures that leave the engine as it was: the batch waits, nothing is latched.
    pub fn latches_nothing(&self) -> bool {
        matches!(
            self,
            EngineError::Paused { .. }
                | EngineError::NotPrimary { .. }
                | EngineError::Unreplicated { .. }
        )
    }

    pub fn is_corruption(&self) -> bool {
        self.class() == ErrorClass::Corruption
    }
}

/// A WAL failure's class: damage on disk is corruption, a bad option is configuration,
/// everything else (a failed read, write or sync, a latched log) is I/O. Asks the WAL's own
/// `is_corruption`, so a variant added there keeps its meaning here.
pub fn wal_class(e: &WalError) -> ErrorClass {
    match e {
        e if e.is_corruption() => ErrorClass::Corruption,
        WalError::Config(_) => ErrorClass::Config,
        _ => ErrorClass::Io,
    }
}

/// A shard's failure class. A duplicate id or an lsn out of order means the WAL and the shard
/// disagree about what was committed: damage (or a bug), which a restart would only repeat.
pub fn shard_class(e: &ShardError) -> ErrorClass {
    match e {
        ShardError::Corrupt { .. }
        | ShardError::HeldDiffers { .. }
        | ShardError::DuplicateId { .. }
        | ShardError::OutOfOrder { .. } => ErrorClass::Corruption,
        ShardError::Locked { .. } => ErrorClass::Locked,
        ShardError::TxnTooLarge { .. } => ErrorClass::Config,
        ShardError::Io { .. } | ShardError::Poisoned(_) | ShardError::ReadOnly => ErrorClass::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard_failure(source: ShardError) -> EngineError {
        EngineError::Shard {
            shard: "users".into(),
            source,
        }
    }

    /// Issue 12: a shard owner answers every waiting batch with `clone_for_reply()`; a
    /// duplicate id or a corrupt segment reported that way used to become a plain
    /// "poisoned" I/O failure (exit 74, so systemd restarted into the damage). The clone must
    /// keep class Corruption and exit 65, and say the same thing.
    #[test]
    fn shard_corruption_cloned_for_reply_stays_corruption() {
        let cases = [
            shard_failure(ShardError::DuplicateId { id: 7, lsn: 3 }),
            shard_failure(ShardError::OutOfOrder { lsn: 2, max_lsn: 5 }),
            shard_failure(ShardError::Corrupt {
                segment: PathBuf::from("shards/users/0000000001.seg"),
                offset: 4096,
                lsn: 3,
                reason: "checksum".into(),
            }),
        ];
        for e in cases {
            let reply = e.clone_for_reply();
            assert_eq!(e.class(), ErrorClass::Corruption, "{e}");
            assert_eq!(reply.class(), ErrorClass::Corruption, "{reply}");
            assert_eq!(reply.class().exit_code(), EXIT_CORRUPTION);
            assert_eq!(reply.to_string(), e.to_string());
            // A reply of a reply (a thread joining the owner) keeps it too.
            assert_eq!(reply.clone_for_reply().class(), ErrorClass::Corruption);
        }
        let locked = shard_failure(ShardError::Locked {
            path: PathBuf::from("shards/users/lock"),
        });
        assert_eq!(locked.clone_for_reply().class().exit_code(), EXIT_LOCKED);
    }

    /// Goal: every WAL error has the class the README's exit codes promise (a corrupt log
    /// 65, a failed sync 74).
    #[test]
    fn wal_errors_keep_their_class() {
        let corrupt = WalError::Corrupt {
            segment: PathBuf::from("wal/1.wal"),
            offset: 24,
            lsn: 2,
            reason: "checksum".into(),
        };
        assert_eq!(EngineError::Wal(corrupt).class(), ErrorClass::Corruption);
        let io = WalError::Poisoned("fsync failed".into());
        assert_eq!(
            EngineError::Wal(io).clone_for_reply().class(),
            ErrorClass::Io
        );
    }
}
