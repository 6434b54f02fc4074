//! Segment rolls and the spare (the sizes are [`crate::WalOptions::next_segment_bytes`]). When
//! a record does not fit the active segment the log seals it and moves to the next one: the
//! spare renamed into place, or, for a record larger than the spare, a segment made for it.
//! Then it makes the spare after it.
//!
//! Segments grow with use: a new log's first segment is `first_segment_bytes` (1 MiB), each
//! next one twice the last one's length, up to `segment_bytes`, and the spare is always made
//! at the size of the segment after the active one. So a roll takes space made ahead of need
//! and never allocates, except for a record larger than the spare: on a leader only a claim
//! or a rejection can be (the daemon pauses intake when the log says `NoSpace`), and a
//! writer that must not be refused asks [`Wal::reserve`] first. A segment is used up to its
//! own length; nothing in a record depends on it, so segments of any size mix. This module
//! never writes a record.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use tracing::{debug, warn};

use crate::log::{segment_name, Active, Inner, Segment, Wal};
use crate::{Lsn, WalError};
use roost_storage::{is_no_space, preallocate, NoRoom, Refilled, Spare, StorageFile};

impl Wal {
    /// Rolls to a new segment when a frame of `len` bytes does not fit the active one.
    pub(crate) fn make_room(
        &self,
        g: &mut MutexGuard<'_, Inner>,
        lsn: Lsn,
        len: u64,
    ) -> Result<(), WalError> {
        if g.active.as_ref().is_some_and(|a| a.fits(len)) {
            return Ok(());
        }
        self.roll(g, lsn, len).inspect_err(|e| {
            // No room for a new segment: nothing was written, the log goes on as it was.
            if !matches!(e, WalError::NoSpace(_)) {
                g.poisoned.get_or_insert_with(|| e.to_string());
            }
        })
    }

    /// Seals the active segment (synced, so a sealed segment never has a torn tail), takes
    /// the spare as the next one when it holds `need` bytes (else creates and preallocates
    /// one of [`crate::WalOptions::next_segment_bytes`]), then makes the next spare. No room
    /// for the new segment is `NoSpace` with nothing written and the sealed segment still
    /// active; no room for the next spare only shows in [`Wal::spare_missing`]. An active segment that holds no
    /// record is grown instead ([`Wal::grow_empty`]).
    fn roll(
        &self,
        g: &mut MutexGuard<'_, Inner>,
        first_lsn: Lsn,
        need: u64,
    ) -> Result<(), WalError> {
        if g.active.as_ref().is_some_and(|a| a.write_offset == 0) {
            return self.grow_empty(g, need);
        }
        let old = g.active.take();
        if let Some(old) = &old {
            let path = self.dir.join(segment_name(old.first_lsn));
            old.file.sync_data().map_err(|source| WalError::Io {
                op: "sync",
                path,
                source,
            })?;
            g.synced_lsn = g.written_lsn;
            self.synced.notify_all();
            self.synced_moved(g.synced_lsn);
        }
        let bytes = self
            .opts
            .next_segment_bytes(old.as_ref().map(|a| a.len), need);
        let path = self.dir.join(segment_name(first_lsn));
        let (file, len) = match self.next_segment(g, &path, need, bytes) {
            Ok(made) => made,
            Err(e) => {
                g.active = old;
                return Err(e);
            }
        };
        debug!(segment = %path.display(), first_lsn, len, "wal: rolled to new segment");
        g.segments.push(Segment {
            first_lsn,
            path,
            bytes: len,
        });
        g.active = Some(Active::new(Arc::from(file), first_lsn, len, 0));
        self.spare_after(g)?;
        Ok(())
    }

    /// The active segment holds no record (a log made by [`Wal::create_at`], one cut back to
    /// a segment's start, or a crash right after a roll) and `need` does not fit it: it is
    /// allocated further in place, since sealing it would leave a sealed segment without
    /// records (corrupt) and the next one would take its name. Rare, and only for a record
    /// larger than the segment; `NoSpace` when the disk has no room (nothing changed).
    fn grow_empty(&self, g: &mut MutexGuard<'_, Inner>, need: u64) -> Result<(), WalError> {
        let bytes = self.opts.next_segment_bytes(None, need);
        let Some(a) = g.active.as_mut() else {
            return Err(WalError::Poisoned("no active segment".into()));
        };
        let path = self.dir.join(segment_name(a.first_lsn));
        match a.file.allocate(bytes).and_then(|()| a.file.sync_data()) {
            Ok(()) => {}
            Err(e) if is_no_space(&e) => {
                return Err(WalError::NoSpace(NoRoom {
                    path,
                    needed_bytes: bytes,
                    error: e.to_string(),
                }))
            }
            Err(source) => {
                let op = "allocate";
                return Err(WalError::Io { op, path, source });
            }
        }
        a.len = a.len.max(bytes);
        let len = a.len;
        if let Some(seg) = g.segments.last_mut() {
            seg.bytes = len;
        }
        debug!(segment = %path.display(), len, "wal: empty segment grown");
        self.spare_after(g)?;
        Ok(())
    }

    /// The new segment at `path` and its length: the spare renamed when it holds `need`
    /// bytes, else one of `bytes` made now.
    fn next_segment(
        &self,
        g: &mut MutexGuard<'_, Inner>,
        path: &Path,
        need: u64,
        bytes: u64,
    ) -> Result<(Box<dyn StorageFile>, u64), WalError> {
        let io = |op: &'static str| {
            let path = path.to_path_buf();
            move |source| WalError::Io { op, path, source }
        };
        let storage = self.storage.as_ref();
        let took = match g.spare.as_mut() {
            Some(spare) => spare.take(storage, path, need).map_err(io("take spare"))?,
            None => false,
        };
        if !took {
            match preallocate(storage, path, bytes, false) {
                Ok(()) => self.sync_dir()?,
                Err(e) if is_no_space(&e) => {
                    return Err(WalError::NoSpace(NoRoom {
                        path: path.to_path_buf(),
                        needed_bytes: bytes,
                        error: e.to_string(),
                    }))
                }
                Err(e) => return Err(io("allocate")(e)),
            }
        }
        let file = storage
            .open(path, roost_storage::OpenMode::ReadWrite)
            .map_err(io("open"))?;
        let len = file.len().map_err(io("length"))?;
        Ok((file, len))
    }

    /// After a roll: the spare at least the size of the segment after the new active one,
    /// made now (a full disk leaves it short: [`Wal::spare_missing`]).
    fn spare_after(&self, g: &mut MutexGuard<'_, Inner>) -> Result<bool, WalError> {
        let next = self
            .opts
            .next_segment_bytes(g.active.as_ref().map(|a| a.len), 0);
        if let Some(spare) = g.spare.as_mut() {
            spare
                .grow(self.storage.as_ref(), next)
                .map_err(|source| WalError::Io {
                    op: "grow spare segment",
                    path: self.dir.join(roost_storage::SPARE_FILE),
                    source,
                })?;
        }
        self.refill(g)
    }

    /// Makes the spare again if it is missing or short; a full disk is logged (once), not
    /// an error.
    fn refill(&self, g: &mut MutexGuard<'_, Inner>) -> Result<bool, WalError> {
        let Some(spare) = g.spare.as_mut() else {
            return Ok(true);
        };
        let r = spare
            .refill(self.storage.as_ref())
            .map_err(|source| WalError::Io {
                op: "make spare segment",
                path: self.dir.join(roost_storage::SPARE_FILE),
                source,
            })?;
        if let (Refilled::NoRoom { first: true }, Some(why)) = (r, spare.missing()) {
            warn!(dir = %self.dir.display(), %why, "wal: no room for the spare segment");
        }
        self.spare_short
            .store(r != Refilled::Ready, Ordering::Relaxed);
        Ok(r == Refilled::Ready)
    }

    /// Why the log has no spare segment of the size its next roll needs (that roll would need
    /// room the disk may not have): `None` when it has one, or is read-only.
    pub fn spare_missing(&self) -> Option<NoRoom> {
        if !self.spare_short.load(Ordering::Relaxed) {
            return None;
        }
        self.lock().spare.as_ref()?.missing().cloned()
    }

    /// Tries to make a missing spare segment. Ok(true) once there is one.
    pub fn refill_spare(&self) -> Result<bool, WalError> {
        let mut g = self.lock();
        if let Some(why) = &g.poisoned {
            return Err(WalError::Poisoned(why.clone()));
        }
        self.refill(&mut g)
    }

    /// Makes sure the next `bytes` of appends (whole frames, as [`crate::format::frame_len`]
    /// counts them) need no new space: they fit the active segment's rest, or the spare is
    /// grown now to hold them all, so a roll moves to it and no second roll follows. For a
    /// writer that must not meet a full disk half-way (a checkpoint's key records).
    /// `NoSpace` when the disk has no room: nothing is written, and the spare counts as
    /// missing ([`Wal::spare_missing`]: intake pauses) until a refill makes it. The spare
    /// keeps the larger size from then on.
    pub fn reserve(&self, bytes: u64) -> Result<(), WalError> {
        if self.opts.read_only {
            return Err(WalError::ReadOnly);
        }
        let mut g = self.lock();
        if let Some(why) = &g.poisoned {
            return Err(WalError::Poisoned(why.clone()));
        }
        if g.active.as_ref().is_some_and(|a| a.fits(bytes)) {
            return Ok(());
        }
        let want = bytes.next_multiple_of(4096);
        let storage = self.storage.as_ref();
        let Some(spare) = g.spare.as_mut() else {
            return Ok(());
        };
        spare.grow(storage, want).map_err(|source| WalError::Io {
            op: "grow spare segment",
            path: self.dir.join(roost_storage::SPARE_FILE),
            source,
        })?;
        self.refill(&mut g)?;
        match g.spare.as_ref() {
            Some(spare) if spare.have() < want => Err(WalError::NoSpace(
                spare.missing().cloned().unwrap_or_else(|| NoRoom {
                    path: self.dir.join(roost_storage::SPARE_FILE),
                    needed_bytes: want,
                    error: "no room to grow the spare".into(),
                }),
            )),
            _ => Ok(()),
        }
    }

    /// Bytes the log's files take: its segments (preallocated) and its spare.
    pub fn disk_bytes(&self) -> u64 {
        let g = self.lock();
        let spare = g.spare.as_ref().map_or(0, Spare::have);
        g.segments.iter().map(|s| s.bytes).sum::<u64>() + spare
    }

    /// The segments, oldest first: first lsn, path and length (preallocated).
    pub fn segment_files(&self) -> Vec<(Lsn, PathBuf, u64)> {
        let g = self.lock();
        g.segments
            .iter()
            .map(|s| (s.first_lsn, s.path.clone(), s.bytes))
            .collect()
    }
}
