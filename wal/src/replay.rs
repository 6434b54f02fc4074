//! Replay (`Wal::replay`): every record from an lsn on, streamed one segment at a time.

use std::sync::Arc;

use roost_storage::{read_data, OpenMode, Storage};

use crate::log::{Record, Segment};
use crate::open::corrupt;
use crate::recovery::{step, ScanState, Step};
use crate::{Lsn, Wal, WalError};

impl Wal {
    /// Every record with lsn >= `from`, oldest first. Reads segment by segment, so memory is
    /// bounded by one segment.
    pub fn replay(&self, from: Lsn) -> Replay {
        let g = self.lock();
        let segs = g.segments.clone();
        let end = g.next_lsn;
        drop(g);
        Replay::new(
            self.storage.clone(),
            segs,
            from,
            end,
            self.opts.payload_bytes_max,
        )
    }
}

/// Iterator over records; see [`Wal::replay`]. Streams: it holds one segment's bytes and
/// copies out one record at a time.
pub struct Replay {
    storage: Arc<dyn Storage>,
    segments: std::vec::IntoIter<Segment>,
    from: Lsn,
    end: Lsn,
    payload_bytes_max: u32,
    current: Option<(Segment, Vec<u8>, ScanState)>,
}

impl Replay {
    fn new(storage: Arc<dyn Storage>, segs: Vec<Segment>, from: Lsn, end: Lsn, max: u32) -> Replay {
        // Skip segments that end before `from`: segment i ends where i+1 starts.
        let start = segs.iter().rposition(|s| s.first_lsn <= from).unwrap_or(0);
        let mut segs = segs;
        segs.drain(..start);
        Replay {
            storage,
            segments: segs.into_iter(),
            from,
            end,
            payload_bytes_max: max,
            current: None,
        }
    }

    fn load(&self, seg: &Segment) -> Result<Vec<u8>, WalError> {
        let io = |op: &'static str| {
            let path = seg.path.clone();
            move |source| WalError::Io { op, path, source }
        };
        let file = self
            .storage
            .open(&seg.path, OpenMode::Read)
            .map_err(io("open"))?;
        read_data(file.as_ref()).map_err(io("read"))
    }

    fn advance(&mut self) -> Result<Option<Record>, WalError> {
        loop {
            let Some((seg, bytes, st)) = self.current.as_mut() else {
                let Some(seg) = self.segments.next() else {
                    return Ok(None);
                };
                let bytes = self.load(&seg)?;
                let st = ScanState::new(seg.first_lsn);
                self.current = Some((seg, bytes, st));
                continue;
            };
            // Treated as the last segment: a record beyond what open accepted (a concurrent
            // writer's torn tail) ends the replay instead of failing it.
            match step(bytes, st, true, self.payload_bytes_max)
                .map_err(|c| corrupt(&seg.path, c))?
            {
                Step::Record { header, .. } if header.lsn >= self.end => {
                    self.segments = Vec::new().into_iter();
                    self.current = None;
                    return Ok(None);
                }
                Step::Record {
                    offset,
                    header,
                    payload,
                } if header.lsn >= self.from => {
                    return Ok(Some(Record {
                        lsn: header.lsn,
                        epoch: header.epoch,
                        record_type: header.record_type,
                        payload: bytes[payload].to_vec(),
                        segment: seg.path.clone(),
                        offset,
                    }));
                }
                Step::Record { .. } => {}
                Step::End(_) => self.current = None,
            }
        }
    }
}

impl Iterator for Replay {
    type Item = Result<Record, WalError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.advance() {
            Ok(r) => r.map(Ok),
            Err(e) => {
                self.segments = Vec::new().into_iter();
                self.current = None;
                Some(Err(e))
            }
        }
    }
}
