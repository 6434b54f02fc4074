//! The spare segment: a log's next segment, created and preallocated ahead of need under a
//! fixed name (`SPARE` in the log's directory), so that a full disk shows before anything is
//! claimed instead of in the middle of a batch. PostgreSQL keeps WAL segments ahead the same
//! way (`PreallocXlogFiles`). A roll renames the spare to the new segment's name (then syncs
//! the directory) and makes the next spare; when there is no room for it, the log goes on in
//! the segment it just got, and its owner stops taking new work (the daemon pauses intake)
//! until a [`Spare::refill`] succeeds.
//!
//! The spare is never written, only allocated: renamed into place it reads as zeros, which
//! every log's recovery takes for preallocated space. Once in use, the WAL and the shards
//! write zeros a little ahead of their end ([`zeros_due`], [`crate::write_zeros`]), so the space
//! their next appends land in is written extents and their syncs need no extent conversion.

use std::io;
use std::path::{Path, PathBuf};

use crate::seam::{OpenMode, Storage, StorageFile};

/// The spare's file name in a log's directory. Not a segment name of any log (those end in
/// `.wal` or `.seg`), so listings of segments never see it.
pub const SPARE_FILE: &str = "SPARE";

/// Whether `e` says the disk (or the quota) is full: ENOSPC or EDQUOT.
pub fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(28) | Some(122))
}

/// Why a log has no spare: how many bytes it needs, where, and the error that said so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoRoom {
    pub path: PathBuf,
    pub needed_bytes: u64,
    pub error: String,
}

impl std::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no room for the next segment: {} needs {} bytes ({})",
            self.path.display(),
            self.needed_bytes,
            self.error
        )
    }
}

/// What [`Spare::refill`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refilled {
    /// The spare is there.
    Ready,
    /// No room for it; `first` when this shortage is new (the caller logs it once).
    NoRoom { first: bool },
}

/// One log's spare segment.
#[derive(Debug)]
pub struct Spare {
    dir: PathBuf,
    path: PathBuf,
    /// The size the spare is made at (its target); it never shrinks.
    bytes: u64,
    /// The bytes the spare file holds, allocated (0: no spare). Below `bytes` when the disk
    /// had no room to grow it: it is kept as it was, and still taken by a roll it is large
    /// enough for.
    have: u64,
    /// Set while `have < bytes`: intake waits.
    missing: Option<NoRoom>,
    /// The shortage in `missing` was reported by a refill already.
    reported: bool,
}

impl Spare {
    /// At a writable open: keeps an existing spare (allocated again: a crash may have cut its
    /// preallocation short) or makes one. A full disk is no error here: the spare is then
    /// missing ([`Spare::missing`]); any other failure is.
    pub fn open(storage: &dyn Storage, dir: &Path, bytes: u64) -> io::Result<Spare> {
        let mut spare = Spare {
            dir: dir.to_path_buf(),
            path: dir.join(SPARE_FILE),
            bytes,
            have: 0,
            missing: None,
            reported: false,
        };
        spare.make(storage)?;
        Ok(spare)
    }

    /// The size the spare is made at (an existing spare file may be larger: allocation
    /// never shrinks a file).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The bytes the spare on disk holds now, allocated (0 when there is none): the largest
    /// segment [`Spare::take`] can give.
    pub fn have(&self) -> u64 {
        self.have
    }

    /// Makes the spare at least `bytes` long: later refills make it that size, and an
    /// existing spare is allocated further now (a log whose segments grow needs a larger
    /// spare for its next roll). A full disk leaves the spare as it was (still usable for a
    /// roll it is large enough for) and short, as in [`Spare::refill`]; any other failure is
    /// an error.
    pub fn grow(&mut self, storage: &dyn Storage, bytes: u64) -> io::Result<()> {
        if bytes <= self.bytes {
            return Ok(());
        }
        self.bytes = bytes;
        if self.have >= bytes {
            return Ok(());
        }
        match self.missing {
            None => self.make(storage),
            Some(ref mut why) => {
                why.needed_bytes = bytes;
                Ok(())
            }
        }
    }

    /// `Some` while the spare is missing or smaller than its target: intake must wait.
    pub fn missing(&self) -> Option<&NoRoom> {
        self.missing.as_ref()
    }

    /// Makes the spare (at its target size) if it is missing or short; Err for any failure
    /// but a full disk.
    pub fn refill(&mut self, storage: &dyn Storage) -> io::Result<Refilled> {
        if self.missing.is_some() {
            self.make(storage)?;
        }
        if self.missing.is_none() {
            return Ok(Refilled::Ready);
        }
        let first = !self.reported;
        self.reported = true;
        Ok(Refilled::NoRoom { first })
    }

    /// Renames the spare to `target` (a segment name in the same directory) and syncs the
    /// directory, when it holds at least `need` bytes: the caller then opens a zeroed,
    /// preallocated segment of [`Spare::have`] bytes (read it before). Ok(false) when there
    /// is no spare that large. Does not make the next one: call [`Spare::refill`] after it.
    pub fn take(&mut self, storage: &dyn Storage, target: &Path, need: u64) -> io::Result<bool> {
        if self.have == 0 || self.have < need {
            return Ok(false);
        }
        storage.rename(&self.path, target)?;
        storage.sync_dir(&self.dir)?;
        self.have = 0;
        self.missing = Some(NoRoom {
            path: self.path.clone(),
            needed_bytes: self.bytes,
            error: "taken, not yet made again".into(),
        });
        Ok(true)
    }

    /// Create (or reuse), allocate to the target, sync the file and the directory. On a full
    /// disk an existing spare is kept at the length it had (if that much is still
    /// allocated), a new one removed, and the shortage recorded.
    fn make(&mut self, storage: &dyn Storage) -> io::Result<()> {
        let file = match storage.open(&self.path, OpenMode::CreateNew) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                storage.open(&self.path, OpenMode::ReadWrite)?
            }
            other => other?,
        };
        let before = file.len()?;
        match file.allocate(self.bytes).and_then(|()| file.sync_data()) {
            Ok(()) => {
                storage.sync_dir(&self.dir)?;
                self.have = file.len()?.max(self.bytes);
                self.missing = None;
                self.reported = false;
                Ok(())
            }
            Err(e) if is_no_space(&e) => {
                self.have = keep_as_it_was(file.as_ref(), before);
                if self.have == 0 {
                    drop(file);
                    let _ = storage.remove(&self.path); // best effort: it holds nothing
                }
                self.missing = Some(NoRoom {
                    path: self.path.clone(),
                    needed_bytes: self.bytes,
                    error: e.to_string(),
                });
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// After an allocation that found the disk full: the spare back at its former length
/// `before` (a failed `fallocate` may have extended it partly), confirmed allocated and
/// synced. Returns the bytes it holds now, 0 when there was none or it cannot be confirmed.
fn keep_as_it_was(file: &dyn StorageFile, before: u64) -> u64 {
    if before == 0 {
        return 0;
    }
    let kept = file
        .set_len(before)
        .and_then(|()| file.allocate(before))
        .and_then(|()| file.sync_data());
    if kept.is_ok() {
        before
    } else {
        0
    }
}

/// Creates `path` (or, with `reuse`, opens it if it exists), allocates `bytes` and syncs it.
/// On ENOSPC the file is removed again (best effort: it holds nothing) and the error
/// returned. The caller syncs the directory.
pub fn preallocate(storage: &dyn Storage, path: &Path, bytes: u64, reuse: bool) -> io::Result<()> {
    let file = match storage.open(path, OpenMode::CreateNew) {
        Err(e) if reuse && e.kind() == io::ErrorKind::AlreadyExists => {
            storage.open(path, OpenMode::ReadWrite)?
        }
        other => other?,
    };
    match file.allocate(bytes).and_then(|()| file.sync_data()) {
        Ok(()) => Ok(()),
        Err(e) if is_no_space(&e) => {
            drop(file);
            let _ = storage.remove(path);
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// The zeros to write before data ending at `end` goes into a preallocated segment of `len`
/// bytes, zeroed up to `zeroed_to` so far, `ahead` bytes at a time (0: never): once `end`
/// comes within half of `ahead` of the mark, from the mark (never before `end`) to `ahead`
/// past `end`, within the segment. Zeros are what the space reads as anyway; writing them
/// turns it from unwritten extents into written ones, so the next syncs there write data
/// only instead of committing an extent conversion each (a journal commit on ext4).
pub fn zeros_due(zeroed_to: u64, end: u64, ahead: u64, len: u64) -> Option<(u64, u64)> {
    if ahead == 0 || zeroed_to >= end + ahead / 2 {
        return None;
    }
    let from = zeroed_to.max(end);
    let to = (end + ahead).min(len);
    (to > from).then_some((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimFaults, SimStorage};

    fn sim_with_room(bytes: Option<u64>) -> SimStorage {
        let disk = SimStorage::new();
        disk.set_faults(SimFaults {
            space_bytes_max: bytes,
            ..SimFaults::default()
        });
        disk
    }

    /// Goal: zeros are due only when the end nears the mark, start at the mark (never before
    /// the end), reach `ahead` past the end, and stop at the segment's length.
    #[test]
    fn zeros_due_stay_ahead_of_the_end_and_inside_the_segment() {
        let mib = 1 << 20;
        assert_eq!(zeros_due(0, 100, 0, 64 * mib), None, "off");
        assert_eq!(zeros_due(0, 100, mib, 64 * mib), Some((100, 100 + mib)));
        assert_eq!(
            zeros_due(100 + mib, 200, mib, 64 * mib),
            None,
            "far enough ahead"
        );
        let mark = 100 + mib;
        let end = mark - mib / 2 + 1;
        assert_eq!(zeros_due(mark, end, mib, 64 * mib), Some((mark, end + mib)));
        assert_eq!(
            zeros_due(10, 500, mib, 64 * mib),
            Some((500, 500 + mib)),
            "never before the end"
        );
        assert_eq!(
            zeros_due(0, 3000, mib, 4096),
            Some((3000, 4096)),
            "within the segment"
        );
        assert_eq!(
            zeros_due(4096, 4000, mib, 4096),
            None,
            "segment zeroed to its end"
        );
        assert_eq!(zeros_due(0, 4096, mib, 4096), None, "segment full");
    }

    /// Goal: a spare is made at open, taken by a rename, and missing until refilled; a full
    /// disk makes it missing (with the size needed), not an error, and leaves no file behind.
    #[test]
    fn spare_is_made_taken_and_refilled_and_a_full_disk_is_no_error() {
        let disk = sim_with_room(Some(1500));
        let dir = Path::new("/d");
        let mut spare = Spare::open(&disk, dir, 1000).expect("open");
        assert!(spare.missing().is_none());
        assert!(spare.take(&disk, &dir.join("1.seg"), 1000).expect("take"));
        assert!(disk.list(dir).expect("list").contains(&"1.seg".to_owned()));
        assert!(spare.missing().is_some(), "taken: missing until refilled");
        // 1000 of 1500 bytes are used by the segment: no room for another 1000.
        assert_eq!(
            spare.refill(&disk).expect("refill"),
            Refilled::NoRoom { first: true }
        );
        assert_eq!(
            spare.refill(&disk).expect("refill"),
            Refilled::NoRoom { first: false },
            "a shortage is reported once"
        );
        let why = spare.missing().expect("still missing");
        assert_eq!(why.needed_bytes, 1000);
        assert!(!disk
            .list(dir)
            .expect("list")
            .contains(&SPARE_FILE.to_owned()));
        assert!(!spare.take(&disk, &dir.join("2.seg"), 1).expect("take"));
        disk.set_faults(SimFaults::default());
        assert_eq!(spare.refill(&disk).expect("refill"), Refilled::Ready);
        assert!(spare.missing().is_none());
    }

    /// Goal: a spare grows to a larger size in place (and is made at it once taken), never
    /// shrinks, and a full disk while growing leaves it short with the size it needs, kept
    /// at the size it had: a roll it is large enough for still takes it, a larger one not.
    #[test]
    fn a_spare_grows_in_place_and_refills_at_its_new_size() {
        let disk = sim_with_room(Some(1000));
        let dir = Path::new("/d");
        let len = |disk: &SimStorage, name: &str| {
            let f = disk.open(&dir.join(name), OpenMode::Read).expect("file");
            f.len().expect("len")
        };
        let mut spare = Spare::open(&disk, dir, 100).expect("open");
        spare.grow(&disk, 50).expect("no shrink");
        assert_eq!((spare.bytes(), len(&disk, SPARE_FILE)), (100, 100));
        spare.grow(&disk, 200).expect("grow");
        assert_eq!((spare.bytes(), len(&disk, SPARE_FILE)), (200, 200));
        assert!(spare.take(&disk, &dir.join("1.seg"), 200).expect("take"));
        assert_eq!(len(&disk, "1.seg"), 200);
        spare.grow(&disk, 400).expect("grow while missing");
        assert_eq!(spare.refill(&disk).expect("refill"), Refilled::Ready);
        assert_eq!(len(&disk, SPARE_FILE), 400);
        spare.grow(&disk, 900).expect("a full disk is no error");
        let why = spare.missing().expect("no room for 900 more");
        assert_eq!(why.needed_bytes, 900);
        assert_eq!((spare.have(), len(&disk, SPARE_FILE)), (400, 400), "kept");
        assert!(!spare.take(&disk, &dir.join("2.seg"), 401).expect("take"));
        assert!(spare.take(&disk, &dir.join("2.seg"), 400).expect("take"));
        assert_eq!((spare.have(), len(&disk, "2.seg")), (0, 400));
        assert_eq!(
            spare.refill(&disk).expect("refill"),
            Refilled::NoRoom { first: true },
            "no room for 900 (600 used of 1000): nothing left behind"
        );
        assert!(!disk
            .list(dir)
            .expect("list")
            .contains(&SPARE_FILE.to_owned()));
    }

    /// Goal: an existing spare is kept at open (not an error that it exists).
    #[test]
    fn an_existing_spare_is_reused_at_open() {
        let disk = sim_with_room(None);
        let dir = Path::new("/d");
        drop(Spare::open(&disk, dir, 100).expect("first"));
        let spare = Spare::open(&disk, dir, 100).expect("second");
        assert!(spare.missing().is_none());
        let f = disk
            .open(&dir.join(SPARE_FILE), OpenMode::Read)
            .expect("spare");
        assert_eq!(f.len().expect("len"), 100);
    }
}
