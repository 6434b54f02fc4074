//! Every replication message kind, structured (`arbitrary`): encoded, then decoded from the
//! frame and read from a stream, each giving the same message back; one over the frame
//! limit is refused at `encode`.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use roost_replication::wire::{self, read_frame, LEN_PREFIX_BYTES};
use roost_replication::{Entry, Message};

/// `Message`, mirrored so that `arbitrary` can build one of every kind.
#[derive(Arbitrary, Debug)]
enum Any {
    Fetch(String, u32, u64, u32, u32, u32),
    Records(u32, u64, u64, Vec<(u64, u32, u8, Vec<u8>)>),
    Diverging(u32, u32, u64),
    FencedEpoch(u32),
    UnknownEpoch(u32),
    OutOfRange(u64),
    NotLeader(u32),
    Error(String),
    Snapshot(String, u32),
    SnapshotFile(String, u64, u64),
    SnapshotData(Vec<u8>),
    SnapshotEnd(u32, u64, u32, u64),
    Forward(String, u64, Vec<u8>),
    ForwardAnswer(u64, u32, u64, Vec<u8>),
    ForwardRefused(u64, u32, String),
}

fn message(a: Any) -> Message {
    match a {
        Any::Fetch(replica, current_epoch, fetch_lsn, last_epoch, max_bytes, wait_ms) => {
            Message::Fetch {
                replica,
                current_epoch,
                fetch_lsn,
                last_epoch,
                max_bytes,
                wait_ms,
            }
        }
        Any::Records(leader_epoch, hw, log_start, e) => Message::Records {
            leader_epoch,
            hw,
            log_start,
            entries: e
                .into_iter()
                .map(|(lsn, epoch, kind, payload)| Entry {
                    lsn,
                    epoch,
                    kind,
                    payload,
                })
                .collect(),
        },
        Any::Diverging(leader_epoch, epoch, end_lsn) => Message::Diverging {
            leader_epoch,
            epoch,
            end_lsn,
        },
        Any::FencedEpoch(leader_epoch) => Message::FencedEpoch { leader_epoch },
        Any::UnknownEpoch(leader_epoch) => Message::UnknownEpoch { leader_epoch },
        Any::OutOfRange(log_start) => Message::OutOfRange { log_start },
        Any::NotLeader(epoch) => Message::NotLeader { epoch },
        Any::Error(message) => Message::Error { message },
        Any::Snapshot(replica, current_epoch) => Message::Snapshot {
            replica,
            current_epoch,
        },
        Any::SnapshotFile(path, size, len) => Message::SnapshotFile { path, size, len },
        Any::SnapshotData(data) => Message::SnapshotData { data },
        Any::SnapshotEnd(leader_epoch, wal_from, files, bytes) => Message::SnapshotEnd {
            leader_epoch,
            wal_from,
            files,
            bytes,
        },
        Any::Forward(replica, id, batch) => Message::Forward { replica, id, batch },
        Any::ForwardAnswer(id, leader_epoch, durable_lsn, answer) => Message::ForwardAnswer {
            id,
            leader_epoch,
            durable_lsn,
            answer,
        },
        Any::ForwardRefused(id, leader_epoch, reason) => Message::ForwardRefused {
            id,
            leader_epoch,
            reason,
        },
    }
}

fuzz_target!(init: roost_fuzz::limit_memory(), |a: Any| {
    let m = message(a);
    let f = wire::encode(&m, u32::MAX).expect("encoding under no limit");
    assert_eq!(wire::decode_frame(&f[LEN_PREFIX_BYTES..]).expect("an encoded frame decodes"), m);
    let mut r: &[u8] = &f;
    let read = roost_fuzz::ready(read_frame(&mut r, u32::MAX)).expect("an encoded frame reads");
    assert_eq!(read, Some(m.clone()));
    assert!(r.is_empty(), "bytes left after one frame");
    let small = (f.len() - LEN_PREFIX_BYTES - 1) as u32;
    assert!(wire::encode(&m, small).is_err(), "a frame over the limit was encoded");
});
