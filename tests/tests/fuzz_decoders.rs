//! Property tests over every decoder that reads untrusted bytes: the batch parser (client
//! files), the WAL (record frames and bincode payloads) and the shard frames (disk). Random
//! bytes and mutations of valid inputs must give an error or a value, never a panic, and never
//! a huge allocation: the whole test binary runs under a 1 GiB address-space limit, so an
//! attempt to allocate what a forged length says (4 GiB, u64::MAX) aborts the run.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::{Arc, Once};

use proptest::prelude::*;
use roost::batch;
use roost_shards::{frame, Shard, ShardOptions, Txn, TxnOp};
// The daemon's own record codec (the one it writes and replays with).
use roost::pipeline::records::{self as codec, ClaimRecord, PlannedOp, RecordType};
use roost_storage::{OpenMode, SimStorage, Storage};
use roost_wal::format::{frame_len, LEN_OFFSET};
use roost_wal::{Wal, WalOptions};

fn limit_memory() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let lim = rustix::process::Rlimit {
            current: Some(1 << 30),
            maximum: None,
        };
        let _ = rustix::process::setrlimit(rustix::process::Resource::As, lim);
    });
}

const VALID_BATCH: &str = r#"{"request_key":"order-17","ops":[{"op":"create","shard":"users","record":{"name":"ada","tags":[1,2,{"x":null}]}},{"op":"delete","shard":"users","id":17}]}"#;

fn valid_wal_segment() -> Vec<u8> {
    let disk = SimStorage::new();
    let wal = Wal::open_with(
        Arc::new(disk.clone()),
        "/w",
        WalOptions {
            segment_bytes: 4096,
            payload_bytes_max: 2048,
            ..WalOptions::default()
        },
    )
    .unwrap();
    for i in 0..4u64 {
        let c = ClaimRecord {
            request_key: format!("k{i}"),
            source: "f".into(),
            fingerprint: i,
            ops: vec![PlannedOp::Create {
                shard: "s".into(),
                id: i,
                record: b"{}".to_vec(),
            }],
        };
        wal.append(
            RecordType::Claim as u8,
            &codec::encode("claim", &c).unwrap(),
        )
        .unwrap();
    }
    disk.file_bytes(&PathBuf::from("/w/00000000000000000001.wal"))
        .unwrap()
}

fn valid_shard_segment() -> Vec<u8> {
    let disk = SimStorage::new();
    let mut s = Shard::open_with(
        Arc::new(disk.clone()),
        "/s/x",
        ShardOptions {
            segment_bytes: 4096,
            read_only: false,
            synced_through_lsn: None,
            ..ShardOptions::default()
        },
    )
    .unwrap();
    for lsn in 1..=4u64 {
        s.apply(&Txn {
            lsn,
            ops: vec![
                TxnOp::Create {
                    id: lsn,
                    record: b"{\"a\":1}".to_vec(),
                },
                TxnOp::Delete { id: 99 },
            ],
        })
        .unwrap();
    }
    s.flush().unwrap();
    disk.file_bytes(&PathBuf::from("/s/x/0000000001.seg"))
        .unwrap()
}

/// What opening a segment gave, per mode (read-only, then read-write): the records (WAL)
/// or live records (shard) it yields, or the error that refused it.
type Outcome = Vec<Result<usize, String>>;

/// Opens `bytes` as the only WAL segment, read-only and read-write: the payloads replayed
/// (every one also decoded as a claim, which may fail) or the WAL's error.
fn open_wal(bytes: Vec<u8>) -> Outcome {
    let disk = SimStorage::new();
    disk.put_file_bytes(&PathBuf::from("/w/00000000000000000001.wal"), bytes);
    let mut out = Vec::new();
    for read_only in [true, false] {
        let o = WalOptions {
            segment_bytes: 4096,
            payload_bytes_max: 2048,
            read_only,
            ..WalOptions::default()
        };
        out.push(match Wal::open_with(Arc::new(disk.clone()), "/w", o) {
            Err(e) => Err(e.to_string()),
            Ok(w) => w
                .replay(1)
                .map(|r| {
                    let r = r.map_err(|e| e.to_string())?;
                    let _ = codec::decode::<ClaimRecord>("claim", &r.payload);
                    Ok(())
                })
                .collect::<Result<Vec<()>, String>>()
                .map(|v| v.len()),
        });
    }
    out
}

/// Opens `bytes` as the only segment of a shard, read-only and read-write: the live records
/// (after its frames were summarised too) or the shard's error.
fn open_shard(bytes: Vec<u8>) -> Outcome {
    let disk = SimStorage::new();
    disk.put_file_bytes(&PathBuf::from("/s/x/0000000001.seg"), bytes);
    let mut out = Vec::new();
    for read_only in [true, false] {
        let opts = ShardOptions {
            segment_bytes: 4096,
            read_only,
            synced_through_lsn: None,
            ..ShardOptions::default()
        };
        out.push(
            Shard::open_with(Arc::new(disk.clone()), "/s/x", opts)
                .and_then(|s| {
                    s.frame_summaries()?;
                    s.scan()
                })
                .map(|records| records.len())
                .map_err(|e| e.to_string()),
        );
    }
    out
}

/// A shard of several 512-byte segments whose records four transactions older are deleted:
/// sealed segments with index files and a `dead` file. Returns the disk and its live records.
fn shard_with_index_files() -> (SimStorage, Vec<(u64, Vec<u8>)>) {
    let disk = SimStorage::new();
    let opts = ShardOptions {
        segment_bytes: 512,
        first_segment_bytes: 512,
        ..ShardOptions::default()
    };
    let mut s = Shard::open_with(Arc::new(disk.clone()), "/s/x", opts).unwrap();
    for l in 1..=24u64 {
        let mut ops: Vec<TxnOp> = (0..2)
            .map(|i| TxnOp::Create {
                id: 2 * l + i,
                record: format!("{{\"n\":{l}}}").into_bytes(),
            })
            .collect();
        if l > 4 {
            ops.push(TxnOp::Delete { id: 2 * (l - 4) });
        }
        s.apply(&Txn { lsn: l, ops }).unwrap();
    }
    s.flush().unwrap();
    let records = s.scan().unwrap();
    (disk, records)
}

/// Mutates one of the shard's index files or its `dead` file (which one: `pick`), opens it
/// read-only and writable: the records must be exactly the ones written, or an error (a page
/// read that meets damage); never other records.
fn open_with_mutated_index(pick: usize, edits: &[(usize, u8, u8)]) {
    let (disk, want) = shard_with_index_files();
    let mut files: Vec<PathBuf> = disk
        .paths()
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".idx") || p.ends_with("dead"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    let victim = &files[pick % files.len()];
    let bytes = disk.file_bytes(victim).unwrap();
    disk.put_file_bytes(victim, mutate(bytes, edits));
    for read_only in [true, false] {
        let opts = ShardOptions {
            segment_bytes: 512,
            first_segment_bytes: 512,
            read_only,
            ..ShardOptions::default()
        };
        let got = Shard::open_with(Arc::new(disk.clone()), "/s/x", opts).and_then(|s| s.scan());
        if let Ok(records) = got {
            assert_eq!(
                records,
                want,
                "{} mutated, read_only {read_only}",
                victim.display()
            );
        }
    }
}

fn mutate(mut v: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for (pos, byte, how) in edits {
        if v.is_empty() {
            v.push(*byte);
            continue;
        }
        let p = pos % v.len();
        match how % 4 {
            0 => v[p] ^= byte | 1,
            1 => v.insert(p, *byte),
            2 => {
                v.remove(p);
            }
            _ => v.truncate(p),
        }
    }
    v
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 400,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn batch_parser_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        limit_memory();
        let _ = batch::parse(&bytes, 1000);
    }

    #[test]
    fn batch_parser_mutated_valid(edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..8)) {
        limit_memory();
        let v = mutate(VALID_BATCH.as_bytes().to_vec(), &edits);
        if let Ok(b) = batch::parse(&v, 1000) {
            prop_assert!(!b.request_key.is_empty() && !b.ops.is_empty());
        }
    }

    /// A bulk file's lines: any bytes split into numbered lines without a panic, every
    /// line answered by a batch or an invalid reason that names its line.
    #[test]
    fn bulk_lines_random_bytes(bytes in proptest::collection::vec(prop_oneof![Just(b'\n'), any::<u8>()], 0..2048)) {
        limit_memory();
        let limits = roost::intake::bulk_lines::Limits { lines_max: 100, line_bytes_max: 512, batch_ops_max: 1000 };
        if let Ok(lines) = roost::intake::bulk_lines::lines(&bytes, &limits) {
            for w in lines.windows(2) {
                prop_assert!(w[0].number < w[1].number);
            }
            for l in &lines {
                prop_assert_eq!(&bytes[l.offset as usize..l.offset as usize + l.bytes.len()], l.bytes);
                if let Err(inv) = roost::intake::bulk_lines::parse_line(l, &limits) {
                    let named = inv.error.contains(&format!("line {}", l.number))
                        || !inv.error.contains(" at line ");
                    prop_assert!(named, "{}", inv.error);
                }
            }
        }
    }

    #[test]
    fn wal_random_segment(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        limit_memory();
        let _ = open_wal(bytes);
    }

    #[test]
    fn wal_mutated_segment(edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)) {
        limit_memory();
        let _ = open_wal(mutate(valid_wal_segment(), &edits));
    }

    #[test]
    fn wal_payload_random(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        limit_memory();
        let _ = codec::decode::<ClaimRecord>("claim", &bytes);
        let _ = codec::decode::<codec::AuditRecord>("audit", &bytes);
        let _ = codec::decode::<codec::DoneRecord>("done", &bytes);
    }

    #[test]
    fn shard_random_segment(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        limit_memory();
        let _ = open_shard(bytes);
    }

    #[test]
    fn shard_mutated_segment(edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)) {
        limit_memory();
        let _ = open_shard(mutate(valid_shard_segment(), &edits));
    }

    /// Issue 44: a damaged index file or `dead` file gives the same records or an error.
    #[test]
    fn shard_mutated_index_file(pick in any::<usize>(), edits in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)) {
        limit_memory();
        open_with_mutated_index(pick, &edits);
    }
}

/// Goal: forged lengths everywhere (a WAL record claiming 4 GiB, a bincode string of
/// u64::MAX bytes inside a valid frame, a shard op claiming 4 GiB inside a frame whose
/// checksum holds) are refusals under the 1 GiB limit, never allocations or panics. Method:
/// each forged input is opened and the answer is asserted: damage before valid records is an
/// error in both modes; the forged length as the last record is a torn tail, cut.
#[test]
fn forged_lengths_are_errors() {
    limit_memory();
    let forged_len = |mut seg: Vec<u8>, at: usize| {
        seg[at + LEN_OFFSET..at + LEN_OFFSET + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        seg
    };
    // The first of four records claims 4 GiB: damage below valid records, refused.
    for (mode, got) in open_wal(forged_len(valid_wal_segment(), 0))
        .iter()
        .enumerate()
    {
        assert!(
            got.is_err(),
            "mode {mode}: a 4 GiB record length opened: {got:?}"
        );
    }
    // The last record claims 4 GiB: a torn tail; the three before it replay.
    let seg = valid_wal_segment();
    let last = frame_len(seg_payload_len(&seg)) * 3;
    assert_eq!(open_wal(forged_len(seg, last)), vec![Ok(3), Ok(3)]);
    // A frame whose checksum is right but whose payload's length prefix is absurd.
    let mut payload = vec![0u8; 8];
    payload.extend_from_slice(&u64::MAX.to_le_bytes());
    let frame = roost_wal::format::encode_frame(RecordType::Claim as u8, 1, 1, 0, &payload);
    let disk = SimStorage::new();
    let p = PathBuf::from("/w/00000000000000000001.wal");
    let f = disk.open(&p, OpenMode::CreateNew).unwrap();
    f.write_at(&frame, 0).unwrap();
    let w = Wal::open_with(
        Arc::new(disk.clone()),
        "/w",
        WalOptions {
            segment_bytes: 4096,
            payload_bytes_max: 2048,
            read_only: true,
            ..WalOptions::default()
        },
    )
    .unwrap();
    let rec = w.replay(1).next().unwrap().unwrap();
    assert!(codec::decode::<ClaimRecord>("claim", &rec.payload).is_err());
    // The first op of the first of four shard frames claims a 4 GiB record, and the frame's
    // checksum is recomputed so that only the length check can refuse it.
    let mut sseg = valid_shard_segment();
    let (_, first) = frame::probe(&sseg);
    let first_len = first.expect("the valid segment's first frame").len;
    let at = frame::FRAME_HEADER_LEN + frame::OP_REC_LEN_OFFSET;
    sseg[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let crc = crc32fast::hash(&sseg[frame::VERSION_OFFSET..first_len]);
    sseg[frame::CRC_OFFSET..frame::CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(frame::probe(&sseg).1, Err("record past end of frame"));
    for (mode, got) in open_shard(sseg).iter().enumerate() {
        assert!(
            got.is_err(),
            "mode {mode}: a 4 GiB op length opened: {got:?}"
        );
    }
}

/// The payload length of the first record of a WAL segment (all four valid ones are alike).
fn seg_payload_len(seg: &[u8]) -> usize {
    u32::from_le_bytes(seg[LEN_OFFSET..LEN_OFFSET + 4].try_into().unwrap()) as usize
}

/// Goal: the address-space limit the property tests rely on is really in force (so a huge
/// allocation would fail them, not pass silently).
#[test]
fn memory_limit_is_in_force() {
    limit_memory();
    let mut v: Vec<u8> = Vec::new();
    assert!(
        v.try_reserve_exact(2 << 30).is_err(),
        "a 2 GiB allocation succeeded under the limit"
    );
}

/// Goal (found by the `shard_segment` fuzz target, issue 45): a compacted segment whose
/// header checksum holds but whose content length is near `u64::MAX` is corruption at open,
/// in both modes, never an overflow of the header's length plus its content's. Method: a
/// compact header with that length as a shard's only segment, opened read-only and
/// read-write; the error must name the header.
#[test]
fn compact_header_content_length_near_u64_max_is_an_error() {
    limit_memory();
    for content_len in [u64::MAX, u64::MAX - 79, u64::MAX - 80] {
        let h = frame::CompactHeader {
            first_seq: 1,
            lsn_lo: 1,
            lsn_hi: 1,
            id_max: 0,
            live_frames: 0,
            content_len,
        };
        let want = if content_len > u64::MAX - frame::COMPACT_HEADER_LEN as u64 {
            "content length overflows"
        } else {
            "length differs from its header"
        };
        for (mode, got) in open_shard(h.encode()).iter().enumerate() {
            let err = got.as_ref().expect_err("a forged compact header opened");
            assert!(err.contains(want), "mode {mode}, {content_len}: {err}");
        }
    }
}
