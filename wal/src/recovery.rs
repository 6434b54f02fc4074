//! Recovery as a decision table (after TigerBeetle's `journal.zig`): at each record position
//! a scan looks at a few facts and [`decide`] maps them to exactly one action. The scan
//! ([`scan_segment`]) is shared by open, replay and `roost verify`; it reads only the bytes it
//! is handed and never writes: the caller acts on a torn tail.

use crate::format::{frame_len, probe, Header, Probe, RECORD_ALIGN, RECORD_HEADER_LEN};

/// What the bytes at a position are, as far as recovery cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Seen {
    /// All-zero header: preallocated space or a write that never reached the disk.
    Zero,
    /// A whole frame whose version and checksum verify.
    Valid,
    /// Damaged or partial: short header, bad version, length over limit or past the end,
    /// checksum mismatch.
    Invalid,
}

/// The inputs of one recovery decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Observation {
    pub seen: Seen,
    /// The frame's lsn is the one after the last accepted (only meaningful for `Valid`).
    pub lsn_is_next: bool,
    /// This is the newest segment of the log (the only one that may have a torn tail).
    pub last_segment: bool,
    /// Some valid frame exists at a later aligned offset of this segment.
    pub valid_follows: bool,
}

/// What recovery does at that position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Take the record and move past it.
    Accept,
    /// A sealed segment ends here; the rest is preallocated zeros.
    EndOfSegment,
    /// The log ends here; the rest of the newest segment is preallocated zeros.
    EndOfLog,
    /// The newest segment ends with a partial or damaged record that nothing valid follows:
    /// a write that a crash interrupted. Cut the segment back to here (and sync) before
    /// appending.
    TruncateTail,
    /// Anything else: refuse to open.
    Corrupt(&'static str),
}

/// The decision table. Every combination of inputs has exactly one row; the unit test walks
/// all of them.
///
/// | seen    | lsn next | last seg | valid follows | action        |
/// |---------|----------|----------|---------------|---------------|
/// | Valid   | yes      | any      | any           | Accept        |
/// | Valid   | no       | any      | any           | Corrupt       |
/// | Zero    | any      | no       | no            | EndOfSegment  |
/// | Zero    | any      | yes      | no            | EndOfLog      |
/// | Zero    | any      | any      | yes           | Corrupt       |
/// | Invalid | any      | yes      | no            | TruncateTail  |
/// | Invalid | any      | yes      | yes           | Corrupt       |
/// | Invalid | any      | no       | any           | Corrupt       |
pub fn decide(o: Observation) -> Action {
    match (o.seen, o.lsn_is_next, o.last_segment, o.valid_follows) {
        (Seen::Valid, true, _, _) => Action::Accept,
        (Seen::Valid, false, _, _) => Action::Corrupt("lsn out of sequence"),
        (Seen::Zero, _, false, false) => Action::EndOfSegment,
        (Seen::Zero, _, true, false) => Action::EndOfLog,
        (Seen::Zero, _, _, true) => Action::Corrupt("zeroed gap before valid records"),
        (Seen::Invalid, _, true, false) => Action::TruncateTail,
        (Seen::Invalid, _, true, true) => {
            Action::Corrupt("damaged record followed by valid records")
        }
        // Segments are synced before the next one is created, so a sealed segment can never
        // have a torn tail: any damage there is corruption.
        (Seen::Invalid, _, false, _) => Action::Corrupt("damaged record in a sealed segment"),
    }
}

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

/// Index of the first non-zero byte at or after `from`. Word-at-a-time: preallocated
/// segments are mostly zeros, and recovery scans all of them.
pub fn first_nonzero(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from.min(bytes.len());
    while i < bytes.len() && !i.is_multiple_of(8) {
        if bytes[i] != 0 {
            return Some(i);
        }
        i += 1;
    }
    let words = &bytes[i..];
    let mut chunks = words.chunks_exact(64);
    let mut base = i;
    for c in &mut chunks {
        if c.iter().fold(0u8, |a, b| a | b) != 0 {
            return c.iter().position(|b| *b != 0).map(|p| base + p);
        }
        base += 64;
    }
    chunks
        .remainder()
        .iter()
        .position(|b| *b != 0)
        .map(|p| base + p)
}

/// Whether some aligned offset at or after `from` starts a record that `is_valid` accepts.
/// A record's header has a non-zero byte within its first `align + 4` bytes (the version byte
/// at offset 4 is never zero), so only the aligned offsets just before each run of non-zero
/// bytes can start one.
pub fn valid_record_follows(
    bytes: &[u8],
    from: usize,
    align: usize,
    is_valid: impl Fn(&[u8]) -> bool,
) -> bool {
    let mut pos = from.next_multiple_of(align);
    while let Some(p) = first_nonzero(bytes, pos) {
        let start = (p / align) * align;
        for o in [start, start + align] {
            if o >= pos && o < bytes.len() && is_valid(&bytes[o..]) {
                return true;
            }
        }
        pos = start + align;
    }
    false
}

fn valid_follows(bytes: &[u8], from: usize, payload_bytes_max: u32) -> bool {
    valid_record_follows(bytes, from, RECORD_ALIGN, |b| {
        matches!(probe(b, payload_bytes_max), Probe::Valid(_))
    })
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
    let obs = Observation {
        seen,
        lsn_is_next,
        last_segment,
        valid_follows: follows,
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
            reason: why,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_nonzero_finds_every_position() {
        for len in [0usize, 1, 7, 8, 63, 64, 65, 200] {
            for at in 0..len {
                let mut b = vec![0u8; len];
                b[at] = 9;
                for from in 0..=at {
                    assert_eq!(
                        first_nonzero(&b, from),
                        Some(at),
                        "len {len} at {at} from {from}"
                    );
                }
                assert_eq!(first_nonzero(&b, at + 1), None);
            }
        }
    }

    /// Walks every combination of the decision table's inputs and checks each row against the
    /// rules stated independently: accept only a verified record in sequence; a torn tail only
    /// in the newest segment with nothing valid after it; anything that has a valid record
    /// after it and is not itself accepted is corruption.
    #[test]
    fn decision_table_covers_every_combination() {
        let mut seen_actions = std::collections::HashSet::new();
        let mut n = 0;
        for seen in [Seen::Zero, Seen::Valid, Seen::Invalid] {
            for lsn_is_next in [false, true] {
                for last_segment in [false, true] {
                    for valid_follows in [false, true] {
                        n += 1;
                        let o = Observation {
                            seen,
                            lsn_is_next,
                            last_segment,
                            valid_follows,
                        };
                        let a = decide(o);
                        seen_actions.insert(format!("{a:?}").split('(').next().unwrap().to_owned());
                        assert_eq!(
                            a == Action::Accept,
                            seen == Seen::Valid && lsn_is_next,
                            "{o:?}"
                        );
                        if a == Action::TruncateTail {
                            assert!(last_segment && !valid_follows && seen == Seen::Invalid);
                        }
                        if valid_follows && a != Action::Accept {
                            assert!(matches!(a, Action::Corrupt(_)), "{o:?} -> {a:?}");
                        }
                        if seen == Seen::Invalid && !last_segment {
                            assert!(matches!(a, Action::Corrupt(_)), "{o:?}");
                        }
                        if seen == Seen::Zero && !valid_follows {
                            let want = if last_segment {
                                Action::EndOfLog
                            } else {
                                Action::EndOfSegment
                            };
                            assert_eq!(a, want);
                        }
                    }
                }
            }
        }
        assert_eq!(n, 24);
        assert_eq!(
            seen_actions.len(),
            5,
            "every action is reachable: {seen_actions:?}"
        );
    }
}
