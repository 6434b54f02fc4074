//! `EPOCH` on disk (docs/replication.md, `Kip320.tla`), and the arithmetic of epochs: the
//! next one a node mints, the one of the WAL's last record. What a node does with them is
//! `epochs.rs`. It knows nothing of the replication state.
//!
//! A promotion, or a first start as primary, mints `highest known + 1` (made unique per
//! node by its low byte, the node id) and writes it to `EPOCH` and to `LEADER_EPOCHS` (at
//! the WAL's next lsn) before its first append; a primary that restarts resumes the epoch it
//! led while that is the highest it knows. A standby learns the primary's epoch from its
//! answers and writes it to `EPOCH` before acting on it: a promotion after a restart must
//! never reuse an epoch the old primary wrote under.

use std::path::Path;

use roost_storage::{read_all, OpenMode, Storage};
use roost_wal::{LeaderEpochs, Wal};

use crate::error::EngineError;
use crate::pipeline::disk::{io_err, replace_file};

/// What `EPOCH` holds: the highest leader epoch this node has known, and the epoch it last
/// led itself (0: never). A primary that restarts resumes the epoch it led when that is
/// still the highest known (no one else can have written under it: only a promotion mints
/// an epoch, and it takes the highest known + 1); any other start as primary, and every
/// promotion, takes a new one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochFile {
    pub known: u32,
    pub led: u32,
}

/// Reads `EPOCH` (zeros when absent): `known` and `led`, 4 bytes each, little-endian, then
/// their CRC-32.
pub fn read_epoch_file(storage: &dyn Storage, path: &Path) -> Result<EpochFile, EngineError> {
    let f = match storage.open(path, OpenMode::Read) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(EpochFile::default()),
        r => r.map_err(io_err("open", path))?,
    };
    let bytes = read_all(f.as_ref()).map_err(io_err("read", path))?;
    let (v, crc) = match (bytes.get(0..8), bytes.get(8..12)) {
        (Some(v), Some(c)) if bytes.len() == 12 => (v, c),
        _ => return Err(bad_epoch_file(path, "not 12 bytes")),
    };
    if crc32fast::hash(v).to_le_bytes() != crc {
        return Err(bad_epoch_file(path, "checksum mismatch"));
    }
    let word = |i: usize| u32::from_le_bytes([v[i], v[i + 1], v[i + 2], v[i + 3]]);
    Ok(EpochFile {
        known: word(0),
        led: word(4),
    })
}

/// Replaces `EPOCH` (tmp, fdatasync, rename, directory fsync).
pub fn write_epoch_file(
    storage: &dyn Storage,
    path: &Path,
    e: EpochFile,
) -> Result<(), EngineError> {
    let mut bytes = e.known.to_le_bytes().to_vec();
    bytes.extend_from_slice(&e.led.to_le_bytes());
    let crc = crc32fast::hash(&bytes).to_le_bytes();
    bytes.extend_from_slice(&crc);
    replace_file(storage, path, &bytes)
}

fn bad_epoch_file(path: &Path, why: &str) -> EngineError {
    EngineError::Inconsistent {
        lsn: 0,
        detail: format!("{}: {why}", path.display()),
    }
}

/// The epoch of the WAL's last record; for a WAL that holds none yet (a re-seeded standby's
/// starts empty at the checkpoint's lsn) the epoch of the record before it, which
/// `LEADER_EPOCHS` keeps.
pub fn last_epoch_of(wal: &Wal, epochs: &LeaderEpochs) -> u32 {
    match wal.last_record_epoch() {
        0 => epochs.latest().map_or(0, |(e, _)| e),
        e => e,
    }
}

/// The next epoch above `known` with `node_id` in its low byte, or `None` when it would
/// reach `EPOCH_CEILING` (computed in 64 bits: an epoch near the top of `u32` must not wrap
/// to a small one).
pub fn next_epoch(known: u32, node_id: u32) -> Option<u32> {
    let next = ((u64::from(known >> 8) + 1) << 8) | u64::from(node_id & 0xff);
    u32::try_from(next)
        .ok()
        .filter(|e| *e < roost_replication::EPOCH_CEILING)
}

#[cfg(test)]
mod tests {
    use super::next_epoch;

    #[test]
    fn the_next_epoch_is_one_generation_up_and_never_wraps_past_the_ceiling() {
        assert_eq!(next_epoch(0, 5), Some(0x105));
        assert_eq!(next_epoch(0x105, 7), Some(0x207));
        assert_eq!(
            next_epoch(4_294_967_280, 5),
            None,
            "wrapped to a small epoch"
        );
        assert_eq!(
            next_epoch(roost_replication::EPOCH_CEILING - 0x100, 1),
            None
        );
        assert_eq!(
            next_epoch(roost_replication::EPOCH_CEILING - 0x200, 1),
            Some(roost_replication::EPOCH_CEILING - 0xff)
        );
    }
}
