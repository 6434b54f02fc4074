//! The replication messages, built by `arbitrary` (`repl_message`, `base_backup`): a mirror
//! of `roost_replication::Message` with every kind, and the frames of a byte stream read as
//! the follower reads its connection.

use arbitrary::Arbitrary;
use roost_replication::wire::read_frame;
use roost_replication::{Entry, Message};

/// `Message`, mirrored so that `arbitrary` can build one of every kind.
#[derive(Arbitrary, Debug)]
pub enum Any {
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
    FetchAhead(String, u32, (u64, u64), u32, u32, u32),
    Durable(u64),
}

pub fn message(a: Any) -> Message {
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
        Any::FetchAhead(
            replica,
            current_epoch,
            (fetch_lsn, durable_lsn),
            last_epoch,
            max_bytes,
            wait_ms,
        ) => Message::FetchAhead {
            replica,
            current_epoch,
            fetch_lsn,
            durable_lsn,
            last_epoch,
            max_bytes,
            wait_ms,
        },
        Any::Durable(durable_lsn) => Message::Durable { durable_lsn },
    }
}

/// The messages of the frames at the start of `bytes` (`wire::read_frame` under
/// `frame_bytes_max`), up to the first that does not read.
pub fn read_frames(bytes: &[u8], frame_bytes_max: u32) -> Vec<Message> {
    let mut r: &[u8] = bytes;
    let mut msgs = Vec::new();
    while let Ok(Some(m)) = crate::ready(read_frame(&mut r, frame_bytes_max)) {
        msgs.push(m);
    }
    msgs
}
