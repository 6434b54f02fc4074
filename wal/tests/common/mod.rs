//! Helpers shared by the WAL's integration tests: a log on the simulated disk.
#![allow(dead_code)] // each test file uses its own subset

use std::path::PathBuf;
use std::sync::Arc;

use roost_storage::SimStorage;
use roost_wal::{Wal, WalError, WalOptions};

pub fn dir() -> PathBuf {
    PathBuf::from("/sim/wal")
}

pub fn opts(segment_bytes: u64) -> WalOptions {
    WalOptions {
        segment_bytes,
        payload_bytes_max: (segment_bytes as u32 - 32).min(4096),
        ..WalOptions::default()
    }
}

pub fn open(disk: &SimStorage, o: WalOptions) -> Result<Wal, WalError> {
    Wal::open_with(Arc::new(disk.clone()), dir(), o)
}

/// Every record from lsn 1: (lsn, payload).
pub fn all(wal: &Wal) -> Vec<(u64, Vec<u8>)> {
    wal.replay(1)
        .map(|r| r.map(|r| (r.lsn, r.payload)))
        .collect::<Result<_, _>>()
        .expect("replay")
}

/// The newest segment of the log on `disk`.
pub fn last_segment(disk: &SimStorage) -> PathBuf {
    let mut p: Vec<PathBuf> = disk
        .paths()
        .into_iter()
        .filter(|p| p.starts_with(dir()))
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    p.sort();
    p.pop().expect("a segment")
}
