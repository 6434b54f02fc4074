//! A key index run file (`roost_keyindex::Run::open`: header, filter, fences, then every
//! block read and checked). Input: a choice byte, then the file. Choice bits: 1 sizes the
//! file to what its header says, 2 fixes the tail's CRC (filter and fences), 4 fixes the
//! header's CRC, so the fuzzer reaches the decoders behind each check. Properties: no panic,
//! no unbounded allocation or loop, every entry the blocks hold is found by its hash. With
//! bit 8 the rest is structured input instead: entries written through `KeyIndex::add_run`
//! read back equal.
#![no_main]

use std::path::Path;
use std::sync::Arc;

use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use roost_keyindex::{Entry, IndexOptions, KeyIndex, Run, RunMeta, HEADER_LEN};
use roost_storage::SimStorage;

const PATH: &str = "/k/00000000000000000001-00000000000000000009.run";

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
}

/// The file length the header's counts give, if it is small.
fn header_len(b: &[u8]) -> Option<usize> {
    let count = le64(b, 16);
    let filter_blocks = le64(b, 64);
    let len = (HEADER_LEN as u64)
        .checked_add(count.checked_mul(24)?)?
        .checked_add(filter_blocks.checked_mul(64)?)?
        .checked_add(count.div_ceil(128).checked_mul(12)?)?
        .checked_add(4)?;
    (len <= 1 << 16).then_some(len as usize)
}

fn fix(c: u8, b: &mut Vec<u8>) {
    if c & 1 == 1 {
        if let Some(n) = header_len(b) {
            b.resize(n, 0);
        }
    }
    if c & 2 == 2 && b.len() >= HEADER_LEN + 4 {
        let count = le64(b, 16);
        let off = count
            .checked_mul(24)
            .and_then(|e| e.checked_add(HEADER_LEN as u64));
        let n = b.len() - 4;
        if let Some(off) = off.filter(|o| *o <= n as u64) {
            roost_fuzz::fix_crc(b, n, off as usize, n);
        }
    }
    if c & 4 == 4 && b.len() >= HEADER_LEN {
        roost_fuzz::fix_crc(b, HEADER_LEN - 4, 0, HEADER_LEN - 4);
    }
}

fn open_run(bytes: Vec<u8>) {
    let disk = SimStorage::new();
    let p = Path::new(PATH);
    disk.put_file_bytes(p, bytes.clone());
    // The seed check the header names: the check is the index's, not the file's decoder.
    let Ok(r) = Run::open(&disk, p, le64(&bytes, 72)) else {
        return;
    };
    let _ = r.may_contain(0);
    let mut found = Vec::new();
    for (i, e) in (0..r.blocks())
        .flat_map(|b| entries(&r, b))
        .enumerate()
        .take(512)
    {
        if i % 64 == 0 {
            found.clear();
            if r.find(e.hash, &mut found).is_ok() {
                assert!(found.contains(&e), "entry {i} not found by its hash");
            }
        }
    }
}

/// Block `b`'s entries; none when it fails its check.
fn entries(r: &Run, b: usize) -> Vec<Entry> {
    r.block(b).unwrap_or_default()
}

fn round_trip(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let mut entries: Vec<Entry> = u
        .arbitrary_iter::<(u64, u64, u64)>()?
        .map(|e| {
            e.map(|(hash, table_lsn, offset)| Entry {
                hash,
                table_lsn,
                offset,
            })
        })
        .collect::<arbitrary::Result<_>>()?;
    entries.truncate(600);
    let disk: Arc<SimStorage> = Arc::new(SimStorage::new());
    let opts = IndexOptions {
        filter_bytes_max: 1 << 16,
        run_entries_max: 1 << 20,
    };
    let idx = KeyIndex::open(disk, Path::new("/k"), opts).expect("a new index in memory");
    let meta = RunMeta {
        first_table_lsn: 1,
        last_table_lsn: 9,
        ..RunMeta::default()
    };
    idx.add_run(entries.clone(), meta).expect("a run in memory");
    entries.sort_unstable();
    let got: Vec<Entry> = idx
        .runs()
        .iter()
        .flat_map(|r| (0..r.blocks()).flat_map(|b| r.block(b).expect("a block just written reads")))
        .collect();
    assert_eq!(got, entries);
    Ok(())
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    if c & 8 == 8 {
        let _ = round_trip(&mut Unstructured::new(bytes));
        return;
    }
    let mut b = bytes.to_vec();
    fix(c, &mut b);
    open_run(b);
});
