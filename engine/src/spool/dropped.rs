//! Reading a dropped file: never follows a symlink, never blocks (O_NOFOLLOW|O_NONBLOCK,
//! then fstat must say regular file), refuses hard links, and checks the size before reading.
//! Uses `std::fs` directly: client files are outside what recovery relies on.

use std::fs::OpenOptions;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

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
/// most `bytes_max` (`spool_file_bytes_max`), and reads it.
pub fn read_dropped(path: &Path, bytes_max: u64) -> io::Result<Intake> {
    read_dropped_as(path, bytes_max, "spool_file_bytes_max")
}

/// [`read_dropped`] under another size limit, `limit` its name in the refusal (a bulk
/// file's `bulk_file_bytes_max`).
pub fn read_dropped_as(path: &Path, bytes_max: u64, limit: &str) -> io::Result<Intake> {
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
            "file is {} bytes, over {limit} {bytes_max}",
            meta.len()
        )));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    // The size was checked on the open file; `take` guards against growth since.
    f.take(bytes_max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > bytes_max {
        return Ok(Intake::Refused(format!(
            "file grew past {limit} {bytes_max} while read"
        )));
    }
    Ok(Intake::Bytes(buf))
}
