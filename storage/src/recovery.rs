//! Recovery as a decision table (after TigerBeetle's `journal.zig`), shared by every store
//! that appends checksummed frames to preallocated segments (the WAL, the shards): at each
//! frame position a scan looks at a few facts and [`decide`] maps them to exactly one action.
//! This module owns the table and the zero-skipping search for a later valid frame; it knows
//! no frame format (each store probes its own) and never reads or writes a file.

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
    /// Durable evidence says a completed sync covered this position: a later valid frame
    /// vouches for it (the WAL's synced mark), or the store has no such evidence and keeps the
    /// old assumption that the disk persists unsynced writes as a prefix (a shard with no
    /// `synced_through_lsn`, a WAL record of format version 1). Consulted only when a valid
    /// frame follows: damage with nothing valid after it is a torn tail either way.
    pub below_synced: bool,
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
/// | seen    | lsn next | last seg | valid follows | below synced | action        |
/// |---------|----------|----------|---------------|--------------|---------------|
/// | Valid   | yes      | any      | any           | any          | Accept        |
/// | Valid   | no       | any      | any           | any          | Corrupt       |
/// | Zero    | any      | no       | no            | any          | EndOfSegment  |
/// | Zero    | any      | yes      | no            | any          | EndOfLog      |
/// | Zero    | any      | no       | yes           | any          | Corrupt       |
/// | Zero    | any      | yes      | yes           | yes          | Corrupt       |
/// | Zero    | any      | yes      | yes           | no           | TruncateTail  |
/// | Invalid | any      | yes      | no            | any          | TruncateTail  |
/// | Invalid | any      | yes      | yes           | yes          | Corrupt       |
/// | Invalid | any      | yes      | yes           | no           | TruncateTail  |
/// | Invalid | any      | no       | any           | any          | Corrupt       |
pub fn decide(o: Observation) -> Action {
    match (
        o.seen,
        o.lsn_is_next,
        o.last_segment,
        o.valid_follows,
        o.below_synced,
    ) {
        (Seen::Valid, true, _, _, _) => Action::Accept,
        (Seen::Valid, false, _, _, _) => Action::Corrupt("lsn out of sequence"),
        (Seen::Zero, _, false, false, _) => Action::EndOfSegment,
        (Seen::Zero, _, true, false, _) => Action::EndOfLog,
        (Seen::Zero, _, false, true, _) => Action::Corrupt("zeroed gap before valid records"),
        (Seen::Zero, _, true, true, true) => {
            Action::Corrupt("zeroed gap below the synced point before valid records")
        }
        (Seen::Invalid, _, true, false, _) => Action::TruncateTail,
        (Seen::Invalid, _, true, true, true) => {
            Action::Corrupt("damaged record below the synced point followed by valid records")
        }
        // No sync ever covered this position, so a power loss may have kept later unsynced
        // pages and not this one (write-back order, a volatile disk cache, ext4 zeroing an
        // extent whose conversion was lost): a hole in the tail, not damage to durable data.
        (Seen::Zero | Seen::Invalid, _, true, true, false) => Action::TruncateTail,
        // Segments are synced before the next one is created, so a sealed segment can never
        // have a torn tail: any damage there is corruption.
        (Seen::Invalid, _, false, _, _) => Action::Corrupt("damaged record in a sealed segment"),
    }
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
    /// in the newest segment, with nothing valid after it or with nothing after it that a
    /// completed sync covered; anything else that has a valid record after it and is not
    /// itself accepted is corruption; without evidence of a sync (`below_synced` true, the
    /// default of a store that has none) the table is the old one.
    #[test]
    fn decision_table_covers_every_combination() {
        let mut seen_actions = std::collections::HashSet::new();
        let mut n = 0;
        for seen in [Seen::Zero, Seen::Valid, Seen::Invalid] {
            for lsn_is_next in [false, true] {
                for last_segment in [false, true] {
                    for valid_follows in [false, true] {
                        for below_synced in [false, true] {
                            n += 1;
                            let o = Observation {
                                seen,
                                lsn_is_next,
                                last_segment,
                                valid_follows,
                                below_synced,
                            };
                            let a = decide(o);
                            seen_actions
                                .insert(format!("{a:?}").split('(').next().unwrap().to_owned());
                            check_row(o, a);
                        }
                    }
                }
            }
        }
        assert_eq!(n, 48);
        assert_eq!(
            seen_actions.len(),
            5,
            "every action is reachable: {seen_actions:?}"
        );
    }

    /// The rules each row must satisfy, stated without the table.
    fn check_row(o: Observation, a: Action) {
        let damaged = o.seen != Seen::Valid;
        assert_eq!(
            a == Action::Accept,
            o.seen == Seen::Valid && o.lsn_is_next,
            "{o:?}"
        );
        if a == Action::TruncateTail {
            assert!(o.last_segment && damaged, "{o:?}");
            assert!(
                (!o.valid_follows && o.seen == Seen::Invalid) || !o.below_synced,
                "{o:?}"
            );
        }
        if o.valid_follows && a != Action::Accept {
            // A hole: damage in the newest segment that no completed sync covered.
            let hole = o.last_segment && !o.below_synced && damaged;
            assert_eq!(a == Action::TruncateTail, hole, "{o:?} -> {a:?}");
            if !hole {
                assert!(matches!(a, Action::Corrupt(_)), "{o:?} -> {a:?}");
            }
        }
        if o.seen == Seen::Invalid && !o.last_segment {
            assert!(matches!(a, Action::Corrupt(_)), "{o:?}");
        }
        if o.seen == Seen::Zero && !o.valid_follows {
            let want = if o.last_segment {
                Action::EndOfLog
            } else {
                Action::EndOfSegment
            };
            assert_eq!(a, want);
        }
        // Without evidence of a sync, the table is the one before `below_synced` existed.
        if o.below_synced {
            let old = match (o.seen, o.last_segment, o.valid_follows) {
                (Seen::Valid, _, _) => a,
                (Seen::Zero, false, false) => Action::EndOfSegment,
                (Seen::Zero, true, false) => Action::EndOfLog,
                (Seen::Invalid, true, false) => Action::TruncateTail,
                _ => Action::Corrupt(""),
            };
            assert_eq!(
                std::mem::discriminant(&a),
                std::mem::discriminant(&old),
                "{o:?}"
            );
        }
    }
}
