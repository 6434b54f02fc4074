//! The data directory's names, in one place: the pipeline, `verify`, `drill` and the read
//! commands all find the WAL, the audit log and the shards through [`Layout`].
//! A leaf module: it imports nothing else from the daemon.
//!
//! ```text
//! <data-dir>/LOCK            flock held by the running daemon (roost_storage::DirLock)
//! <data-dir>/wal/            the batch WAL (claims, done records)
//! <data-dir>/audit/          the audit log (one row per committed op), same frame format
//! <data-dir>/shards/<name>/  one shard's segments
//! <data-dir>/keys/           the request-key table (answers of checkpointed batches)
//! <data-dir>/keyindex/       the key table's index on disk (roost_keyindex: runs, SEED)
//! <data-dir>/CHECKPOINT      the last checkpoint (recovery starts from it)
//! <data-dir>/LEADER_EPOCHS   epoch -> first lsn of the WAL's records (replication)
//! <data-dir>/EPOCH           the highest leader epoch this node has known (replication)
//! ```

use std::path::{Path, PathBuf};

pub const WAL_DIR: &str = "wal";
pub const AUDIT_DIR: &str = "audit";
pub const SHARDS_DIR: &str = "shards";
pub const KEYS_DIR: &str = "keys";
pub const KEY_INDEX_DIR: &str = "keyindex";
pub const CHECKPOINT_FILE: &str = "CHECKPOINT";
pub const LEADER_EPOCHS_FILE: &str = "LEADER_EPOCHS";
pub const EPOCH_FILE: &str = "EPOCH";

/// The paths of one data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    data_dir: PathBuf,
}

impl Layout {
    pub fn new(data_dir: &Path) -> Layout {
        Layout {
            data_dir: data_dir.to_path_buf(),
        }
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn wal(&self) -> PathBuf {
        self.data_dir.join(WAL_DIR)
    }

    pub fn audit(&self) -> PathBuf {
        self.data_dir.join(AUDIT_DIR)
    }

    pub fn shards(&self) -> PathBuf {
        self.data_dir.join(SHARDS_DIR)
    }

    pub fn shard(&self, name: &str) -> PathBuf {
        self.shards().join(name)
    }

    pub fn keys(&self) -> PathBuf {
        self.data_dir.join(KEYS_DIR)
    }

    pub fn key_index(&self) -> PathBuf {
        self.data_dir.join(KEY_INDEX_DIR)
    }

    pub fn leader_epochs(&self) -> PathBuf {
        self.data_dir.join(LEADER_EPOCHS_FILE)
    }

    pub fn epoch(&self) -> PathBuf {
        self.data_dir.join(EPOCH_FILE)
    }

    pub fn checkpoint(&self) -> PathBuf {
        self.data_dir.join(CHECKPOINT_FILE)
    }
}
