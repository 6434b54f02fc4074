//! The primary's side of a base backup: the engine's [`BackupHold`] (what to copy, held
//! still) read out file by file for the protocol (`roost_replication`'s `SnapshotSource`).

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;

use roost_replication::{Lsn, SnapshotFile, SnapshotSource};

use crate::pipeline::backup::{BackupBytes, BackupFile, BackupHold};

/// A base backup being sent.
pub struct EngineBackup {
    hold: BackupHold,
    files: VecDeque<BackupFile>,
    current: Option<Current>,
}

/// The file being sent and the bytes of it still to send.
struct Current {
    rel: String,
    from: Reader,
    left: u64,
}

enum Reader {
    File(File),
    Bytes(VecDeque<u8>),
}

impl EngineBackup {
    pub fn new(mut hold: BackupHold) -> EngineBackup {
        let files = std::mem::take(&mut hold.files).into();
        EngineBackup {
            hold,
            files,
            current: None,
        }
    }
}

impl SnapshotSource for EngineBackup {
    fn wal_from(&self) -> Lsn {
        self.hold.checkpoint.wal_from
    }

    fn next_file(&mut self) -> Result<Option<SnapshotFile>, String> {
        let Some(f) = self.files.pop_front() else {
            self.current = None;
            return Ok(None);
        };
        let from = match f.source {
            BackupBytes::Bytes(b) => Reader::Bytes(b.into()),
            BackupBytes::Path(p) => {
                Reader::File(File::open(&p).map_err(|e| format!("open {}: {e}", p.display()))?)
            }
        };
        self.current = Some(Current {
            rel: f.rel.clone(),
            from,
            left: f.len,
        });
        Ok(Some(SnapshotFile {
            path: f.rel,
            size: f.size,
            len: f.len,
        }))
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        let Some(c) = self.current.as_mut() else {
            return Err("read before next_file".into());
        };
        let want = buf.len().min(c.left as usize);
        if want == 0 {
            return Ok(0);
        }
        let n = match &mut c.from {
            Reader::Bytes(b) => b.read(&mut buf[..want]),
            Reader::File(f) => f.read(&mut buf[..want]),
        }
        .map_err(|e| format!("read {}: {e}", c.rel))?;
        if n == 0 {
            return Err(format!("{}: ended {} bytes early", c.rel, c.left));
        }
        c.left -= n as u64;
        Ok(n)
    }
}
