//! `EPOCH` (`replica::epoch_file`) and `LEADER_EPOCHS` (`roost_wal::epochs`): any bytes
//! give the file's values or an error naming what failed; what decodes re-encodes to
//! bytes that decode equal.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use roost::replica::epoch_file::{read_epoch_file, write_epoch_file};
use roost_storage::SimStorage;
use roost_wal::epochs;

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    let mut b = bytes.to_vec();
    if c & 1 == 1 && b.len() == 12 {
        roost_fuzz::fix_crc(&mut b, 8, 0, 8);
    }
    let disk = SimStorage::new();
    let p = Path::new("/d/EPOCH");
    disk.put_file_bytes(p, b.clone());
    if let Ok(e) = read_epoch_file(&disk, p) {
        write_epoch_file(&disk, p, e).expect("rewriting EPOCH in memory");
        assert_eq!(read_epoch_file(&disk, p).expect("a rewritten EPOCH reads"), e);
    }
    if c & 2 == 2 && b.len() >= 4 {
        let n = b.len() - 4;
        roost_fuzz::fix_crc(&mut b, n, 0, n);
    }
    if let Ok(entries) = epochs::decode(&b) {
        assert_eq!(epochs::decode(&epochs::encode(&entries)), Ok(entries));
    }
});
