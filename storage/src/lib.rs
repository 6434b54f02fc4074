//! `roost-storage`: what the WAL and the shards share about putting bytes on a disk. It owns
//! the storage seam (the [`Storage`] traits, [`RealStorage`] over the OS, [`SimStorage`] for
//! crash tests, and the seam's clock, handed around as a [`Clock`]), the recovery decision
//! table both stores scan their segments with ([`recovery`]), the directory lock that keeps a
//! second writer out ([`DirLock`]), the spare segment each log keeps preallocated ahead of
//! need ([`Spare`]), the one atomic replacement of a small file ([`replace_file`]) and the
//! one poison-tolerant [`lock`]. It never knows a record or frame format, never retries an
//! I/O error and never does async.
#![forbid(unsafe_code)]

mod clock;
mod lock;
mod mutex;
mod real;
pub mod recovery;
mod replace;
mod seam;
mod sim;
mod spare;

pub use clock::Clock;
pub use lock::{DirLock, LockError, LOCK_FILE};
pub use mutex::lock;
pub use real::{RealStorage, FILE_MODE, PRIVATE_FILE_MODE};
pub use replace::{install, replace_file, ReplaceError};
pub use seam::{
    read_all, read_data, write_zeros, MappedFile, OpenMode, Storage, StorageFile, StorageFs,
};
pub use sim::{CrashMode, SimFaults, SimStorage, SplitMix};
pub use spare::{is_no_space, preallocate, zeros_due, NoRoom, Refilled, Spare, SPARE_FILE};
