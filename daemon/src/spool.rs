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
//! files go through the storage seam so crash tests see them.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use roost_wal::storage::{OpenMode, Storage};

use crate::batch::BatchResult;

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

/// Writes `out/NAME` atomically and durably: a hidden temporary, fsync, rename, fsync of
/// `out/`. A client that sees `out/NAME` sees the whole result, and keeps it across a power
/// loss.
pub fn write_result(
    storage: &dyn Storage,
    spool: &SpoolPaths,
    name: &str,
    result: &BatchResult,
) -> io::Result<()> {
    let tmp = spool.out.join(format!(".{name}.tmp"));
    match storage.remove(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let f = storage.open(&tmp, OpenMode::CreateNew)?;
    f.write_at(&result.to_json_line(), 0)?;
    f.sync_data()?;
    drop(f);
    storage.rename(&tmp, &spool.out.join(name))?;
    storage.sync_dir(&spool.out)
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

/// What intake found in `new/NAME`.
#[derive(Debug)]
pub enum Intake {
    Bytes(Vec<u8>),
    /// Not something we read: symlink, FIFO, device, directory, too large. The reason.
    Refused(String),
    /// Gone (another worker took it, or the client removed it).
    Gone,
}

/// Opens `path` without following symlinks or blocking, checks it is a regular file of at
/// most `bytes_max`, and reads it.
pub fn read_dropped(path: &Path, bytes_max: u64) -> io::Result<Intake> {
    // lstat first: a device node is never even opened (opening some has side effects).
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Ok(Intake::Refused("a symbolic link: not followed".into()))
        }
        Ok(m) if m.file_type().is_block_device() || m.file_type().is_char_device() => {
            return Ok(Intake::Refused(
                "a device node: only regular files are batches".into(),
            ))
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Intake::Gone),
        Err(e) => return Err(e),
    }
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(
            rustix::fs::OFlags::NOFOLLOW.bits() as i32 | rustix::fs::OFlags::NONBLOCK.bits() as i32,
        )
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Intake::Gone),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Ok(Intake::Refused("a symbolic link: not followed".into()))
        }
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_block_device() || ft.is_char_device() {
            "a device node"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Ok(Intake::Refused(format!(
            "{what}: only regular files are batches"
        )));
    }
    // A hard link could hand the daemon a file its client cannot read itself.
    if meta.nlink() > 1 {
        return Ok(Intake::Refused(format!(
            "a file with {} hard links: only a file's one name may be dropped",
            meta.nlink()
        )));
    }
    if meta.len() > bytes_max {
        return Ok(Intake::Refused(format!(
            "file is {} bytes, over spool_file_bytes_max {bytes_max}",
            meta.len()
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    // The size was checked on the open file; `take` guards against growth since.
    f.take(bytes_max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > bytes_max {
        return Ok(Intake::Refused(format!(
            "file grew past spool_file_bytes_max {bytes_max} while read"
        )));
    }
    Ok(Intake::Bytes(buf))
}
