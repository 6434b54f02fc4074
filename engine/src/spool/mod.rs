//! The spool directory (Maildir-style), a public contract:
//!
//! ```text
//! <spool>/tmp/     clients write here ...
//! <spool>/new/     ... and rename into here; the daemon takes files from here
//! <spool>/out/     the result for new/NAME appears atomically as out/NAME
//! <spool>/failed/  files that were not valid batches, kept for inspection
//! ```
//!
//! Reading a dropped file never follows a symlink and never blocks (O_NOFOLLOW|O_NONBLOCK,
//! then fstat must say regular file), and its size is checked before it is read. Result
//! files go through the storage seam so crash tests see them, and are published in rounds
//! ([`Publisher`]).
//!
//! Files: `deliver` (the client's side: tmp/, fsync, rename into new/), `dropped` (reading a
//! dropped file safely), `publish` (result files in rounds), `quarantine` (the bounded
//! `failed/` folder). What arrives, and how, is the `intake/` folder.

mod deliver;
mod dropped;
mod publish;
mod quarantine;
mod sync_helpers;

use std::io;
use std::path::{Path, PathBuf};

use roost_storage::Storage;

pub use deliver::deliver;
pub use dropped::{read_dropped, read_dropped_as, Intake};
pub use publish::{Prepared, Publisher};
pub use quarantine::FailedDir;

#[derive(Clone, Debug)]
pub struct SpoolPaths {
    pub root: PathBuf,
    pub tmp: PathBuf,
    pub new: PathBuf,
    pub out: PathBuf,
    pub failed: PathBuf,
}

impl SpoolPaths {
    pub fn new(root: &Path) -> SpoolPaths {
        SpoolPaths {
            root: root.to_path_buf(),
            tmp: root.join("tmp"),
            new: root.join("new"),
            out: root.join("out"),
            failed: root.join("failed"),
        }
    }

    pub fn create(&self, storage: &dyn Storage) -> io::Result<()> {
        for d in [&self.tmp, &self.new, &self.out, &self.failed] {
            storage.create_dir_all(d)?;
        }
        Ok(())
    }
}

/// A spool name is one plain path component: no `/`, no NUL, not `.`/`..`, not hidden
/// (dot-files are our temporaries and clients' partial writes).
pub fn valid_spool_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains('/')
        && !name.contains('\0')
        && name.len() <= 255
}
/// Removes `new/NAME` once its batch is durable and its result written. Not synced: if a
/// power loss brings the file back, processing it again is harmless (same key, same content:
/// the original result again).
pub fn remove_input(storage: &dyn Storage, spool: &SpoolPaths, name: &str) -> io::Result<()> {
    match storage.remove(&spool.new.join(name)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
