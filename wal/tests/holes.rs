//! Holes after a power loss (issue 13 item 3): records appended and not yet synced can come
//! back with a later page written and an earlier one not (write-back order, ext4 zeroing an
//! extent whose conversion was lost, a record over a page, a volatile disk cache). Damage that
//! no completed sync covered is a torn tail, cut with a warning; damage below a point some
//! durable record vouches was synced is corruption. The images are built by hand from the
//! simulated disk's durable and live bytes, page by page.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::{all, dir, last_segment, open, opts};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use roost_storage::{CrashMode, SimStorage, SplitMix};
use roost_wal::format::{frame_len, probe, Header, Probe, RECORD_HEADER_LEN, WAL_FORMAT_VERSION};
use roost_wal::recovery::HOLE_REASON;
use roost_wal::WalError;

fn payload(lsn: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (lsn as usize * 31 + i) as u8 | 1)
        .collect()
}

/// Every valid record of a segment image in order: offset and header.
fn records(bytes: &[u8]) -> Vec<(usize, Header)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let Probe::Valid(h) = probe(&bytes[pos..], 4096) else {
            break;
        };
        out.push((pos, h));
        pos += frame_len(h.len as usize);
    }
    out
}

/// Runs `f` with the WAL's log lines on this thread captured; returns what it logged.
///
/// One global subscriber for this test binary, writing into the calling thread's buffer:
/// a scoped subscriber (`with_default`) raced other test threads that ran with none and
/// cached "nobody listens" for the WAL's callsites (the log came back empty in a CI run,
/// even after rebuilding the interest cache under the scoped subscriber).
fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        let sub = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(|| ThreadBuf)
            .finish();
        tracing::subscriber::set_global_default(sub).expect("the only global subscriber");
    });
    let buf = Arc::new(Mutex::new(Vec::new()));
    CAPTURE.with(|c| *c.borrow_mut() = Some(buf.clone()));
    let out = f();
    CAPTURE.with(|c| *c.borrow_mut() = None);
    let text = String::from_utf8_lossy(&buf.lock().unwrap()).into_owned();
    (out, text)
}

thread_local! {
    /// Where this thread's log lines go while [`logged`] runs.
    static CAPTURE: std::cell::RefCell<Option<Arc<Mutex<Vec<u8>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// The global subscriber's writer: the calling thread's capture buffer, if any.
struct ThreadBuf;

impl Write for ThreadBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(buf) = c.borrow().as_ref() {
                buf.lock().unwrap().extend_from_slice(b);
            }
        });
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Four records appended and synced, then six appended without a sync; returns the disk and
/// the written payloads by lsn (index 0 is lsn 1).
fn four_synced_six_not() -> (SimStorage, Vec<Vec<u8>>) {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(1 << 16)).unwrap();
    let mut written = Vec::new();
    for lsn in 1..=10u64 {
        let p = payload(lsn, 40 + lsn as usize * 13);
        if lsn <= 4 {
            wal.append(1, &p).unwrap();
        } else {
            wal.append_nowait(1, &p).unwrap();
        }
        written.push(p);
    }
    assert_eq!(wal.synced_lsn(), 4);
    (disk, written)
}

/// Goal: a hole among records appended after the last sync (lsn 6 dropped, zeroed or torn,
/// lsn 7..10 written back) is a torn tail: open cuts at lsn 6 with a warning, keeps 1..5,
/// and the next append gets lsn 6 and survives a power loss right after (the cut was synced
/// before it).
#[test]
fn a_hole_among_unsynced_records_is_a_torn_tail() {
    for how in ["dropped", "torn", "garbled"] {
        let (disk, written) = four_synced_six_not();
        let seg = last_segment(&disk);
        let lost = disk.crash(CrashMode::PowerDrop);
        let mut img = disk.file_bytes(&seg).unwrap();
        let recs = records(&img);
        let (at, h) = recs[5];
        assert_eq!(h.lsn, 6);
        let end = at + RECORD_HEADER_LEN + h.len as usize;
        match how {
            "dropped" => img[at..end].fill(0),
            "torn" => img[at + 20..end].fill(0),
            _ => img[at + 30] ^= 0x5a,
        }
        lost.put_file_bytes(&seg, img);
        let (wal, log) = logged(|| open(&lost, opts(1 << 16)));
        let wal = wal.unwrap_or_else(|e| panic!("{how}: {e}"));
        let want: Vec<(u64, Vec<u8>)> = (1..=5)
            .map(|l| (l, written[l as usize - 1].clone()))
            .collect();
        assert_eq!(all(&wal), want, "{how}");
        assert_eq!(
            wal.recovery_report().torn_reason,
            Some(HOLE_REASON),
            "{how}"
        );
        assert!(
            log.contains("WARN") && log.contains("cutting torn tail") && log.contains("hole"),
            "{how}: {log}"
        );
        assert_eq!(wal.append(1, b"after the cut").unwrap(), 6);
        drop(wal);
        let wal = open(&lost.crash(CrashMode::PowerDrop), opts(1 << 16)).unwrap();
        let got = all(&wal);
        assert_eq!(got.len(), 6, "{how}");
        assert_eq!(got[5], (6, b"after the cut".to_vec()), "{how}");
    }
}

/// Goal: damage to a synced record with valid records after it, one of which vouches that
/// a sync covered it, is corruption (exit class 65 in the daemon), reported at the damaged
/// record; the unsynced tail after it changes nothing.
#[test]
fn damage_below_the_synced_point_with_valid_records_after_is_corruption() {
    for damaged in [3u64, 4] {
        let (disk, _) = four_synced_six_not();
        let seg = last_segment(&disk);
        let mut img = disk.file_bytes(&seg).unwrap();
        let (at, _) = records(&img)[damaged as usize - 1];
        img[at + RECORD_HEADER_LEN + 2] ^= 0x01;
        disk.put_file_bytes(&seg, img);
        match open(&disk, opts(1 << 16)) {
            Err(e @ WalError::Corrupt { .. }) => {
                assert!(e.is_corruption());
                let WalError::Corrupt {
                    offset,
                    lsn,
                    reason,
                    ..
                } = e
                else {
                    unreachable!()
                };
                assert_eq!((offset, lsn), (at as u64, damaged));
                assert!(reason.contains("below the synced point"), "{reason}");
            }
            other => panic!("lsn {damaged}: expected corruption, got {other:?}"),
        }
    }
}

/// Goal: the record right after the synced point may be in a hole when the only records
/// after it vouch for less: lsn 5 (not synced) damaged, 6..10 vouch for 4 → torn tail.
#[test]
fn damage_just_past_the_synced_point_is_a_torn_tail() {
    let (disk, _) = four_synced_six_not();
    let seg = last_segment(&disk);
    let mut img = disk.file_bytes(&seg).unwrap();
    let (at, _) = records(&img)[4];
    img[at + RECORD_HEADER_LEN] ^= 0x01;
    disk.put_file_bytes(&seg, img);
    let wal = open(&disk, opts(1 << 16)).unwrap();
    assert_eq!(wal.next_lsn(), 5);
}

fn fixture_v1() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wal-v1")
}

/// The committed version 1 fixture (12 records, two segments of 512 bytes) on a simulated
/// disk; returns the disk and the path of its newest segment.
fn v1_on_sim() -> (SimStorage, PathBuf) {
    let disk = SimStorage::new();
    let mut names: Vec<_> = std::fs::read_dir(fixture_v1())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for n in &names {
        let bytes = std::fs::read(fixture_v1().join(n)).unwrap();
        disk.put_file_bytes(&dir().join(n), bytes);
    }
    (disk, dir().join(names.last().unwrap()))
}

/// Goal: version 1 records carry no synced mark, and their old rule holds: a damaged record
/// followed by a valid version 1 record is corruption, never cut.
#[test]
fn version_1_log_keeps_the_old_rule() {
    let (disk, seg) = v1_on_sim();
    let mut img = disk.file_bytes(&seg).unwrap();
    let recs = records(&img);
    assert!(recs.len() >= 2 && recs.iter().all(|(_, h)| h.version == 1));
    let (at, h) = recs[recs.len() - 2];
    img[at + RECORD_HEADER_LEN] ^= 0x01;
    disk.put_file_bytes(&seg, img);
    let err = open(&disk, opts(512)).unwrap_err();
    assert!(
        matches!(err, WalError::Corrupt { lsn, .. } if lsn == h.lsn),
        "{err}"
    );
}

/// Goal: a version 1 log upgraded in place: records appended by version 2 after the open
/// vouch for every version 1 record (the open synced them), so damage among the old records
/// is still corruption, while a hole among new unsynced records is a torn tail.
#[test]
fn upgraded_log_mixes_both_rules() {
    let o = opts(512);
    let (disk, _) = v1_on_sim();
    let wal = open(&disk, o.clone()).unwrap();
    assert_eq!(wal.append_nowait(1, &payload(13, 30)).unwrap(), 13);
    assert_eq!(wal.append_nowait(1, &payload(14, 30)).unwrap(), 14);
    drop(wal);
    let seg = last_segment(&disk);
    let base = disk.file_bytes(&seg).unwrap();
    let recs = records(&base);
    let at = |lsn: u64| recs.iter().find(|(_, h)| h.lsn == lsn).unwrap().0;
    assert_eq!(recs.last().unwrap().1.version, WAL_FORMAT_VERSION);

    let mut img = base.clone();
    img[at(12) + RECORD_HEADER_LEN] ^= 0x01;
    disk.put_file_bytes(&seg, img);
    let err = open(&disk, o.clone()).unwrap_err();
    assert!(matches!(err, WalError::Corrupt { lsn: 12, .. }), "{err}");

    let mut img = base;
    img[at(13) + RECORD_HEADER_LEN] ^= 0x01;
    disk.put_file_bytes(&seg, img);
    let wal = open(&disk, o).unwrap();
    assert_eq!(wal.next_lsn(), 13);
}

/// What a power loss did to one page of the unsynced part of the newest segment.
fn damage_page(img: &mut [u8], live: &[u8], range: std::ops::Range<usize>, rng: &mut SplitMix) {
    match rng.below(5) {
        // Written back.
        0 | 1 => img[range.clone()].copy_from_slice(&live[range]),
        // Never written (the durable bytes stay: zeros of the preallocation), or zeroed.
        2 => img[range].fill(0),
        // Torn: a prefix of the page reached the disk.
        3 => {
            let k = range.start + rng.below(range.len() as u64 + 1) as usize;
            img[range.start..k].copy_from_slice(&live[range.start..k]);
            img[k..range.end].fill(0);
        }
        // Garbage from a disk that lost power mid-sector.
        _ => img[range]
            .iter_mut()
            .for_each(|b| *b = rng.next_u64() as u8),
    }
}

/// A power-loss image of the newest segment: the durable bytes, then each page of what was
/// written after them kept, dropped, zeroed, torn or garbled, in any combination (holes
/// included: a later page kept, an earlier one lost).
fn power_loss_image(durable: &[u8], live: &[u8], page: usize, seed: u64) -> Vec<u8> {
    let synced_end = records(durable)
        .last()
        .map_or(0, |(at, h)| at + frame_len(h.len as usize));
    let written_end = records(live)
        .last()
        .map_or(0, |(at, h)| at + frame_len(h.len as usize));
    let mut img = durable.to_vec();
    img.resize(live.len(), 0);
    let mut rng = SplitMix(seed);
    let mut pos = synced_end;
    while pos < written_end {
        let end = ((pos / page + 1) * page).min(written_end);
        damage_page(&mut img, live, pos..end, &mut rng);
        pos = end;
    }
    img
}

/// One writer run: appends `ops` (payload length, sync after it?) and returns the disk, the
/// payloads by lsn, and the highest lsn whose `sync_to` returned.
fn write(ops: &[(usize, bool)], segment_bytes: u64) -> (SimStorage, Vec<Vec<u8>>, u64) {
    let disk = SimStorage::new();
    let wal = open(&disk, opts(segment_bytes)).unwrap();
    let (mut written, mut acked) = (Vec::new(), 0);
    for (len, sync) in ops {
        let lsn = written.len() as u64 + 1;
        let p = payload(lsn, *len);
        assert_eq!(wal.append_nowait(1, &p).unwrap(), lsn);
        written.push(p);
        if *sync {
            wal.sync_to(lsn).unwrap();
            acked = lsn;
        }
    }
    (disk, written, acked)
}

/// The power-loss disk: every file as durable, the newest segment as `power_loss_image`.
fn lose_power(disk: &SimStorage, page: usize, seed: u64) -> SimStorage {
    let lost = disk.crash(CrashMode::PowerDrop);
    let seg = last_segment(disk);
    let durable = lost.file_bytes(&seg).unwrap();
    let live = disk.file_bytes(&seg).unwrap();
    lost.put_file_bytes(&seg, power_loss_image(&durable, &live, page, seed));
    lost
}

fn ops_strategy() -> impl Strategy<Value = Vec<(usize, bool)>> {
    prop::collection::vec((1usize..1500, prop::bool::weighted(0.3)), 1..24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    /// Goal: whatever a power loss leaves of the unsynced records (any subset of pages
    /// written back, holes included), open succeeds, every record whose `sync_to` returned
    /// replays in order and unchanged, whatever else replays is what was written, and after
    /// an append the log survives another power loss.
    #[test]
    fn any_power_loss_keeps_every_synced_record(
        ops in ops_strategy(),
        segment_bytes in prop::sample::select(vec![2048u64, 1 << 16]),
        page in prop::sample::select(vec![8usize, 64, 512, 4096]),
        seed in any::<u64>(),
    ) {
        let (disk, written, acked) = write(&ops, segment_bytes);
        let lost = lose_power(&disk, page, seed);
        let wal = open(&lost, opts(segment_bytes))
            .map_err(|e| TestCaseError::fail(format!("open refused: {e}")))?;
        let got = all(&wal);
        prop_assert!(got.len() as u64 >= acked, "{} records < {acked} synced", got.len());
        for (i, (lsn, p)) in got.iter().enumerate() {
            prop_assert_eq!(*lsn, i as u64 + 1);
            prop_assert_eq!(p, &written[i]);
        }
        let next = got.len() as u64 + 1;
        prop_assert_eq!(wal.append(1, b"after").unwrap(), next);
        drop(wal);
        let wal = open(&lost.crash(CrashMode::PowerDrop), opts(segment_bytes)).unwrap();
        let again = all(&wal);
        prop_assert_eq!(again.len() as u64, next);
        prop_assert_eq!(&again[..got.len()], &got[..]);
    }

    /// Goal: damage to a record below the synced point that a durable record vouches for is
    /// corruption whatever the power loss did to the tail after it: never cut.
    #[test]
    fn damage_below_a_durable_mark_is_corruption(
        ops in ops_strategy(),
        page in prop::sample::select(vec![8usize, 512, 4096]),
        seed in any::<u64>(),
        pick in any::<prop::sample::Index>(),
        at_frac in 0.0f64..1.0,
    ) {
        let (disk, _, _) = write(&ops, 1 << 16);
        let lost = lose_power(&disk, page, seed);
        let seg = last_segment(&lost);
        let mut img = lost.file_bytes(&seg).unwrap();
        let durable = records(&disk.crash(CrashMode::PowerDrop).file_bytes(&seg).unwrap());
        let mark = durable.iter().filter(|(_, h)| h.synced_back > 0)
            .map(|(_, h)| h.lsn - u64::from(h.synced_back)).max().unwrap_or(0);
        let vouched: Vec<&(usize, Header)> = durable.iter().filter(|(_, h)| h.lsn <= mark).collect();
        prop_assume!(!vouched.is_empty());
        let (at, h) = *vouched[pick.index(vouched.len())];
        let byte = at + ((RECORD_HEADER_LEN + h.len as usize) as f64 * at_frac) as usize;
        img[byte] ^= 0x10;
        lost.put_file_bytes(&seg, img);
        match open(&lost, opts(1 << 16)) {
            Err(WalError::Corrupt { lsn, offset, .. }) => {
                prop_assert_eq!((lsn, offset), (h.lsn, at as u64));
            }
            other => prop_assert!(false, "lsn {} damaged at byte {}: {:?}", h.lsn, byte, other.map(|_| ())),
        }
    }
}
