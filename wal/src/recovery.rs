//! The WAL's recovery scan: [`step`] probes the record at a position with the WAL's `format`
//! and applies the shared decision table (`roost_storage::recovery::decide`) to it. The scan
//! ([`scan_segment`]) is shared by open, replay and `roost verify`; it reads only the bytes it
//! is handed and never writes: the caller acts on a torn tail.

use crate::format::{frame_len, probe, Header, Probe, RECORD_ALIGN, RECORD_HEADER_LEN};
use roost_storage::recovery::{decide, valid_record_follows, Action, Observation, Seen};

/// The reason a torn tail gives when valid records follow the damage: none of them vouches
/// that a sync covered it, so a power loss kept later unsynced pages and not this one.
pub const HOLE_REASON: &str =
    "hole among records no sync covered (a power loss kept a later page, not an earlier one)";

/// How a segment scan ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Zeros or the exact end of the file after the last record.
    Clean,
    /// A torn tail from `offset` on (only ever in the newest segment).
    TornTail { offset: u64, reason: &'static str },
}

/// The result of scanning one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentScan {
    /// Offset just past the last accepted record.
    pub valid_end: u64,
    /// The lsn the next record must carry.
    pub next_lsn: u64,
    pub records: u64,
    pub ending: Ending,
}

/// Refusal to go on: where and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorruptAt {
    pub offset: u64,
    /// The lsn expected at `offset`.
    pub lsn: u64,
    pub reason: String,
}

fn valid_follows(bytes: &[u8], from: usize, payload_bytes_max: u32) -> bool {
    valid_record_follows(bytes, from, RECORD_ALIGN, |b| {
        matches!(probe(b, payload_bytes_max), Probe::Valid(_))
    })
}

/// Whether a valid record after `from` vouches that a completed sync covered `lsn` (its
/// synced mark reaches `lsn`, or it is a version 1 record: the old rule). Records before the
/// damage cannot: a mark is always below its own record's lsn.
fn sync_vouched_after(bytes: &[u8], from: usize, lsn: u64, payload_bytes_max: u32) -> bool {
    valid_record_follows(
        bytes,
        from,
        RECORD_ALIGN,
        |b| matches!(probe(b, payload_bytes_max), Probe::Valid(h) if h.vouches_for(lsn)),
    )
}

/// Where a scan of one segment stands: the next offset, the lsn the next record must carry,
/// and how many records it has accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanState {
    pub pos: usize,
    pub next_lsn: u64,
    pub records: u64,
}

impl ScanState {
    pub fn new(first_lsn: u64) -> ScanState {
        ScanState {
            pos: 0,
            next_lsn: first_lsn,
            records: 0,
        }
    }
}

/// One step of a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// An accepted record: its offset, header and where its payload is in the segment.
    Record {
        offset: u64,
        header: Header,
        payload: std::ops::Range<usize>,
    },
    /// The segment ends here (cleanly or with a torn tail); `state.pos` is the valid end.
    End(Ending),
}

/// Advances a scan of `bytes` (one whole segment) by one record, applying the decision table.
/// The one loop behind [`scan_segment`] and the WAL's streaming replay.
pub fn step(
    bytes: &[u8],
    st: &mut ScanState,
    last_segment: bool,
    payload_bytes_max: u32,
) -> Result<Step, CorruptAt> {
    let pos = st.pos;
    if pos >= bytes.len() {
        return Ok(Step::End(Ending::Clean));
    }
    let p = probe(&bytes[pos..], payload_bytes_max);
    let (seen, lsn_is_next, why) = match p {
        Probe::Zero => (Seen::Zero, false, "zero header"),
        Probe::Valid(h) => (Seen::Valid, h.lsn == st.next_lsn, "lsn out of sequence"),
        Probe::Invalid(why) => (Seen::Invalid, false, why),
    };
    let follows = match seen {
        Seen::Valid => false,
        _ => valid_follows(bytes, pos + RECORD_ALIGN, payload_bytes_max),
    };
    let below_synced =
        follows && sync_vouched_after(bytes, pos + RECORD_ALIGN, st.next_lsn, payload_bytes_max);
    let obs = Observation {
        seen,
        lsn_is_next,
        last_segment,
        valid_follows: follows,
        below_synced,
    };
    let corrupt = |reason: &str| CorruptAt {
        offset: pos as u64,
        lsn: st.next_lsn,
        reason: reason.to_owned(),
    };
    match (decide(obs), p) {
        (Action::Accept, Probe::Valid(h)) => {
            let start = pos + RECORD_HEADER_LEN;
            st.records += 1;
            st.next_lsn += 1;
            st.pos += frame_len(h.len as usize);
            Ok(Step::Record {
                offset: pos as u64,
                header: h,
                payload: start..start + h.len as usize,
            })
        }
        (Action::EndOfSegment | Action::EndOfLog, _) => Ok(Step::End(Ending::Clean)),
        (Action::TruncateTail, _) => Ok(Step::End(Ending::TornTail {
            offset: pos as u64,
            reason: if follows { HOLE_REASON } else { why },
        })),
        (Action::Corrupt(reason), _) => {
            let detail = if matches!(seen, Seen::Valid | Seen::Zero) {
                reason.to_owned()
            } else {
                format!("{reason} ({why})")
            };
            Err(corrupt(&detail))
        }
        (Action::Accept, _) => Err(corrupt("decision table accepted a non-record")),
    }
}

/// Scans `bytes` (one whole segment) from offset 0, expecting lsn `first_lsn` first, and calls
/// `on_record` for each accepted record with its offset, header and payload.
pub fn scan_segment(
    bytes: &[u8],
    first_lsn: u64,
    last_segment: bool,
    payload_bytes_max: u32,
    mut on_record: impl FnMut(u64, &Header, &[u8]) -> Result<(), CorruptAt>,
) -> Result<SegmentScan, CorruptAt> {
    let mut st = ScanState::new(first_lsn);
    loop {
        match step(bytes, &mut st, last_segment, payload_bytes_max)? {
            Step::Record {
                offset,
                header,
                payload,
            } => on_record(offset, &header, &bytes[payload])?,
            Step::End(ending) => {
                return Ok(SegmentScan {
                    valid_end: st.pos as u64,
                    next_lsn: st.next_lsn,
                    records: st.records,
                    ending,
                })
            }
        }
    }
}
