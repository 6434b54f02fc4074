//! The replication wire format: length-prefixed, checksummed frames over TCP, hand-encoded
//! little-endian (docs/replication.md has the byte layout of every message). This module
//! owns encoding and decoding only; it never decides anything. Every length read from the
//! peer is checked against what is left (or against the frame limit) before anything is
//! allocated for it, and decoding any byte string either yields a message or an error,
//! never a panic.
//!
//! ```text
//! u32 len | u32 crc32 | u8 version | u8 type | body
//!         '-- len counts everything after itself; crc covers version, type, body --'
//! ```

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::log::{Entry, Epoch, Lsn};

/// The only version this crate speaks; a frame carrying another is refused.
pub const PROTOCOL_VERSION: u8 = 1;
/// Bytes before the checksummed part: the `u32` length.
pub const LEN_PREFIX_BYTES: usize = 4;
/// Bytes the length counts before the body: crc32, version, type.
pub const FRAME_HEADER_BYTES: usize = 4 + 1 + 1;
/// The default bound on a frame's `len`, checked before allocating for it.
pub const DEFAULT_FRAME_BYTES_MAX: u32 = 64 << 20;
/// The encoded size of an entry with an empty payload (lsn, epoch, kind, payload length).
pub const ENTRY_HEADER_BYTES: usize = 8 + 4 + 1 + 4;
/// What a `Records` body holds besides its entries (leader epoch, hw, log start, count).
pub const RECORDS_HEADER_BYTES: usize = 4 + 8 + 8 + 4;

const _: () = assert!(FRAME_HEADER_BYTES == 6);
const _: () = assert!(ENTRY_HEADER_BYTES == 17);
const _: () = assert!(RECORDS_HEADER_BYTES == 24);

/// The message type byte.
pub mod kind {
    pub const FETCH: u8 = 1;
    pub const RECORDS: u8 = 2;
    pub const DIVERGING: u8 = 3;
    pub const FENCED_EPOCH: u8 = 4;
    pub const UNKNOWN_EPOCH: u8 = 5;
    pub const OUT_OF_RANGE: u8 = 6;
    pub const NOT_LEADER: u8 = 7;
    pub const ERROR: u8 = 8;
    pub const SNAPSHOT: u8 = 9;
    pub const SNAPSHOT_FILE: u8 = 10;
    pub const SNAPSHOT_DATA: u8 = 11;
    pub const SNAPSHOT_END: u8 = 12;
    pub const FORWARD: u8 = 13;
    pub const FORWARD_ANSWER: u8 = 14;
    pub const FORWARD_REFUSED: u8 = 15;
    pub const FETCH_AHEAD: u8 = 16;
    pub const DURABLE: u8 = 17;
}

/// Every message of the protocol. The follower sends `Fetch`, and the leader answers each
/// with exactly one of `Records` .. `Error`; or, once on a connection of its own, `Snapshot`,
/// which the leader answers with a base backup (`SnapshotFile`, its `SnapshotData`, for
/// every file, then `SnapshotEnd`) or with `NotLeader`, `FencedEpoch`, `UnknownEpoch` or
/// `Error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// `fetch_lsn` is the follower's log end: every record below it is durable there (this
    /// is the acknowledgement). `last_epoch` is the epoch of the record at `fetch_lsn - 1`.
    Fetch {
        replica: String,
        current_epoch: Epoch,
        fetch_lsn: Lsn,
        last_epoch: Epoch,
        max_bytes: u32,
        wait_ms: u32,
    },
    /// A `Fetch` sent before the follower's log is durable up to `fetch_lsn` (issue 42: the
    /// follower fetches again while it syncs). Only `durable_lsn` (<= `fetch_lsn`) is the
    /// acknowledgement: every record below it is durable there; `fetch_lsn` is where the
    /// answer's records start. A type of its own, so that a leader that does not know it
    /// refuses it instead of reading `fetch_lsn` as an acknowledgement.
    FetchAhead {
        replica: String,
        current_epoch: Epoch,
        fetch_lsn: Lsn,
        durable_lsn: Lsn,
        last_epoch: Epoch,
        max_bytes: u32,
        wait_ms: u32,
    },
    /// Sent without an answer by a follower that fetches ahead, on the connection of its
    /// fetches, whenever its log became durable further: every record below `durable_lsn`
    /// is durable there. The leader takes it at once, even during a long-poll.
    Durable { durable_lsn: Lsn },
    /// Records from the fetch's `fetch_lsn` on (none after a long-poll that timed out).
    Records {
        leader_epoch: Epoch,
        hw: Lsn,
        log_start: Lsn,
        entries: Vec<Entry>,
    },
    /// The follower's log diverges: on the leader, `epoch` (the largest it holds that is
    /// <= the fetch's `last_epoch`) ends at `end_lsn`.
    Diverging {
        leader_epoch: Epoch,
        epoch: Epoch,
        end_lsn: Lsn,
    },
    /// The fetch's `current_epoch` is older than the leader's.
    FencedEpoch { leader_epoch: Epoch },
    /// The fetch's `current_epoch` is newer than the leader's: this leader is stale.
    UnknownEpoch { leader_epoch: Epoch },
    /// `fetch_lsn` is below what the leader retains: the follower must be re-seeded.
    OutOfRange { log_start: Lsn },
    /// This node is not the leader; `epoch` is the latest epoch its log holds.
    NotLeader { epoch: Epoch },
    /// The leader could not answer (a read failed, a record was too large, ...).
    Error { message: String },
    /// A follower behind the leader's retained log asks for a base backup.
    Snapshot {
        replica: String,
        current_epoch: Epoch,
    },
    /// The next file of a base backup: `path` relative to the data directory, `size` bytes
    /// on disk, of which the first `len` follow in `SnapshotData` frames (zeros after).
    SnapshotFile { path: String, size: u64, len: u64 },
    /// The next bytes of the current file.
    SnapshotData { data: Vec<u8> },
    /// The base backup is whole: the follower's log starts at `wal_from`, where the
    /// leader's checkpoint does, and `files`/`bytes` count what was sent.
    SnapshotEnd {
        leader_epoch: Epoch,
        wal_from: Lsn,
        files: u32,
        bytes: u64,
    },
    /// A standby hands the leader a client's batch (`forward.rs`), on a connection that
    /// carries only forwards: `id` pairs the answer with it (answers may come in any order).
    Forward {
        replica: String,
        id: u64,
        batch: Vec<u8>,
    },
    /// The leader's answer to `Forward` `id`: the batch's result JSON, given once it is as
    /// durable as the leader's own answers; `durable_lsn` is the leader's durable log end
    /// then (the forwarding standby answers its client once its own log holds as much).
    ForwardAnswer {
        id: u64,
        leader_epoch: Epoch,
        durable_lsn: Lsn,
        answer: Vec<u8>,
    },
    /// `Forward` `id` was not taken (not the leader, stepping down, intake paused): nothing
    /// is decided for it; send it again later, to whoever leads then.
    ForwardRefused {
        id: u64,
        leader_epoch: Epoch,
        reason: String,
    },
}

impl Message {
    /// The type byte of this message.
    pub fn kind(&self) -> u8 {
        match self {
            Message::Fetch { .. } => kind::FETCH,
            Message::Records { .. } => kind::RECORDS,
            Message::Diverging { .. } => kind::DIVERGING,
            Message::FencedEpoch { .. } => kind::FENCED_EPOCH,
            Message::UnknownEpoch { .. } => kind::UNKNOWN_EPOCH,
            Message::OutOfRange { .. } => kind::OUT_OF_RANGE,
            Message::NotLeader { .. } => kind::NOT_LEADER,
            Message::Error { .. } => kind::ERROR,
            Message::Snapshot { .. } => kind::SNAPSHOT,
            Message::SnapshotFile { .. } => kind::SNAPSHOT_FILE,
            Message::SnapshotData { .. } => kind::SNAPSHOT_DATA,
            Message::SnapshotEnd { .. } => kind::SNAPSHOT_END,
            Message::Forward { .. } => kind::FORWARD,
            Message::ForwardAnswer { .. } => kind::FORWARD_ANSWER,
            Message::ForwardRefused { .. } => kind::FORWARD_REFUSED,
            Message::FetchAhead { .. } => kind::FETCH_AHEAD,
            Message::Durable { .. } => kind::DURABLE,
        }
    }

    /// A short name for errors and logs.
    pub fn name(&self) -> &'static str {
        kind_name(self.kind())
    }
}

/// The name of a message type byte (`"unknown"` for none).
pub fn kind_name(kind: u8) -> &'static str {
    match kind {
        kind::FETCH => "Fetch",
        kind::RECORDS => "Records",
        kind::DIVERGING => "Diverging",
        kind::FENCED_EPOCH => "FencedEpoch",
        kind::UNKNOWN_EPOCH => "UnknownEpoch",
        kind::OUT_OF_RANGE => "OutOfRange",
        kind::NOT_LEADER => "NotLeader",
        kind::ERROR => "Error",
        kind::SNAPSHOT => "Snapshot",
        kind::SNAPSHOT_FILE => "SnapshotFile",
        kind::SNAPSHOT_DATA => "SnapshotData",
        kind::SNAPSHOT_END => "SnapshotEnd",
        kind::FORWARD => "Forward",
        kind::FORWARD_ANSWER => "ForwardAnswer",
        kind::FORWARD_REFUSED => "ForwardRefused",
        kind::FETCH_AHEAD => "FetchAhead",
        kind::DURABLE => "Durable",
        _ => "unknown",
    }
}

/// Why a frame could not be read, written or decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u64, max: u32 },
    #[error("frame of {len} bytes is shorter than its {FRAME_HEADER_BYTES}-byte header")]
    TooShort { len: u32 },
    #[error("frame checksum mismatch: header says {expected:#010x}, content gives {actual:#010x}")]
    Checksum { expected: u32, actual: u32 },
    #[error("unsupported protocol version {0} (this node speaks {PROTOCOL_VERSION})")]
    Version(u8),
    #[error("unknown message type {0}")]
    UnknownKind(u8),
    #[error("{message} body truncated while reading {field}")]
    Truncated {
        message: &'static str,
        field: &'static str,
    },
    #[error("{message} body has {extra} bytes after its last field")]
    TrailingBytes { message: &'static str, extra: usize },
    #[error("{message}: {field} is not UTF-8")]
    Utf8 {
        message: &'static str,
        field: &'static str,
    },
    #[error("connection closed in the middle of a frame")]
    UnexpectedEof,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `msg` as one whole frame (length prefix included), refusing one whose `len`
/// would exceed `frame_bytes_max`.
pub fn encode(msg: &Message, frame_bytes_max: u32) -> Result<Vec<u8>, WireError> {
    let mut buf = vec![0u8; LEN_PREFIX_BYTES + 4];
    buf.push(PROTOCOL_VERSION);
    buf.push(msg.kind());
    encode_body(msg, &mut buf);
    let len = buf.len() - LEN_PREFIX_BYTES;
    if len as u64 > u64::from(frame_bytes_max) {
        return Err(WireError::TooLarge {
            len: len as u64,
            max: frame_bytes_max,
        });
    }
    let crc = crc32fast::hash(&buf[LEN_PREFIX_BYTES + 4..]);
    buf[..4].copy_from_slice(&(len as u32).to_le_bytes());
    buf[4..8].copy_from_slice(&crc.to_le_bytes());
    Ok(buf)
}

/// The encoded size of `entries` inside a `Records` body.
pub fn entries_bytes(entries: &[Entry]) -> usize {
    entries
        .iter()
        .map(|e| ENTRY_HEADER_BYTES + e.payload.len())
        .sum()
}

fn encode_body(msg: &Message, out: &mut Vec<u8>) {
    match msg {
        Message::Fetch { .. } | Message::FetchAhead { .. } | Message::Durable { .. } => {
            encode_fetch(msg, out)
        }
        Message::Records {
            leader_epoch,
            hw,
            log_start,
            entries,
        } => {
            put(out, &[leader_epoch, hw, log_start, &(entries.len() as u32)]);
            for e in entries {
                put(out, &[&e.lsn, &e.epoch, &e.kind, &e.payload]);
            }
        }
        Message::Diverging {
            leader_epoch,
            epoch,
            end_lsn,
        } => put(out, &[leader_epoch, epoch, end_lsn]),
        Message::FencedEpoch { leader_epoch } | Message::UnknownEpoch { leader_epoch } => {
            leader_epoch.put(out)
        }
        Message::OutOfRange { log_start } => log_start.put(out),
        Message::NotLeader { epoch } => epoch.put(out),
        Message::Error { message } => message.put(out),
        Message::Snapshot { .. }
        | Message::SnapshotFile { .. }
        | Message::SnapshotData { .. }
        | Message::SnapshotEnd { .. } => encode_snapshot(msg, out),
        Message::Forward { .. }
        | Message::ForwardAnswer { .. }
        | Message::ForwardRefused { .. } => encode_forward(msg, out),
    }
}

/// A follower's fetches and acknowledgements (their bodies; nothing for any other).
fn encode_fetch(msg: &Message, out: &mut Vec<u8>) {
    match msg {
        Message::Fetch {
            replica,
            current_epoch,
            fetch_lsn,
            last_epoch,
            max_bytes,
            wait_ms,
        } => put(
            out,
            &[
                replica,
                current_epoch,
                fetch_lsn,
                last_epoch,
                max_bytes,
                wait_ms,
            ],
        ),
        Message::FetchAhead {
            replica,
            current_epoch,
            fetch_lsn,
            durable_lsn,
            last_epoch,
            max_bytes,
            wait_ms,
        } => put(
            out,
            &[
                replica,
                current_epoch,
                fetch_lsn,
                durable_lsn,
                last_epoch,
                max_bytes,
                wait_ms,
            ],
        ),
        Message::Durable { durable_lsn } => durable_lsn.put(out),
        _ => {}
    }
}

/// The base backup's messages (their bodies; nothing for any other).
fn encode_snapshot(msg: &Message, out: &mut Vec<u8>) {
    match msg {
        Message::Snapshot {
            replica,
            current_epoch,
        } => put(out, &[replica, current_epoch]),
        Message::SnapshotFile { path, size, len } => put(out, &[path, size, len]),
        Message::SnapshotData { data } => data.put(out),
        Message::SnapshotEnd {
            leader_epoch,
            wal_from,
            files,
            bytes,
        } => put(out, &[leader_epoch, wal_from, files, bytes]),
        _ => {}
    }
}

/// A forwarded batch and its answers (their bodies; nothing for any other message).
fn encode_forward(msg: &Message, out: &mut Vec<u8>) {
    match msg {
        Message::Forward { replica, id, batch } => put(out, &[replica, id, batch]),
        Message::ForwardAnswer {
            id,
            leader_epoch,
            durable_lsn,
            answer,
        } => put(out, &[id, leader_epoch, durable_lsn, answer]),
        Message::ForwardRefused {
            id,
            leader_epoch,
            reason,
        } => put(out, &[id, leader_epoch, reason]),
        _ => {}
    }
}

/// A value as the wire writes it: integers little-endian, strings and byte strings as a
/// `u32` length and their bytes.
trait Field {
    fn put(&self, out: &mut Vec<u8>);
}

impl Field for u8 {
    fn put(&self, out: &mut Vec<u8>) {
        out.push(*self);
    }
}

impl Field for u32 {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Field for u64 {
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}

impl Field for String {
    fn put(&self, out: &mut Vec<u8>) {
        put_bytes(out, self.as_bytes());
    }
}

impl Field for Vec<u8> {
    fn put(&self, out: &mut Vec<u8>) {
        put_bytes(out, self);
    }
}

/// `fields`, in order.
fn put(out: &mut Vec<u8>, fields: &[&dyn Field]) {
    for f in fields {
        f.put(out);
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Decodes what follows a frame's length prefix (`len` bytes: crc, version, type, body).
pub fn decode_frame(frame: &[u8]) -> Result<Message, WireError> {
    if frame.len() < FRAME_HEADER_BYTES {
        return Err(WireError::TooShort {
            len: frame.len() as u32,
        });
    }
    let expected = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]);
    let actual = crc32fast::hash(&frame[4..]);
    if expected != actual {
        return Err(WireError::Checksum { expected, actual });
    }
    if frame[4] != PROTOCOL_VERSION {
        return Err(WireError::Version(frame[4]));
    }
    let kind = frame[5];
    let mut r = Reader {
        buf: &frame[FRAME_HEADER_BYTES..],
        message: kind_name(kind),
    };
    let msg = decode_body(kind, &mut r)?;
    if !r.buf.is_empty() {
        return Err(WireError::TrailingBytes {
            message: r.message,
            extra: r.buf.len(),
        });
    }
    Ok(msg)
}

fn decode_body(kind: u8, r: &mut Reader<'_>) -> Result<Message, WireError> {
    Ok(match kind {
        kind::FETCH => Message::Fetch {
            replica: r.string("replica")?,
            current_epoch: r.u32("current_epoch")?,
            fetch_lsn: r.u64("fetch_lsn")?,
            last_epoch: r.u32("last_epoch")?,
            max_bytes: r.u32("max_bytes")?,
            wait_ms: r.u32("wait_ms")?,
        },
        kind::RECORDS => Message::Records {
            leader_epoch: r.u32("leader_epoch")?,
            hw: r.u64("hw")?,
            log_start: r.u64("log_start")?,
            entries: r.entries()?,
        },
        kind::DIVERGING => Message::Diverging {
            leader_epoch: r.u32("leader_epoch")?,
            epoch: r.u32("epoch")?,
            end_lsn: r.u64("end_lsn")?,
        },
        kind::FENCED_EPOCH => Message::FencedEpoch {
            leader_epoch: r.u32("leader_epoch")?,
        },
        kind::UNKNOWN_EPOCH => Message::UnknownEpoch {
            leader_epoch: r.u32("leader_epoch")?,
        },
        kind::OUT_OF_RANGE => Message::OutOfRange {
            log_start: r.u64("log_start")?,
        },
        kind::NOT_LEADER => Message::NotLeader {
            epoch: r.u32("epoch")?,
        },
        kind::ERROR => Message::Error {
            message: r.string("message")?,
        },
        kind::SNAPSHOT..=kind::SNAPSHOT_END => decode_snapshot(kind, r)?,
        kind::FORWARD..=kind::FORWARD_REFUSED => decode_forward(kind, r)?,
        kind::FETCH_AHEAD => Message::FetchAhead {
            replica: r.string("replica")?,
            current_epoch: r.u32("current_epoch")?,
            fetch_lsn: r.u64("fetch_lsn")?,
            durable_lsn: r.u64("durable_lsn")?,
            last_epoch: r.u32("last_epoch")?,
            max_bytes: r.u32("max_bytes")?,
            wait_ms: r.u32("wait_ms")?,
        },
        kind::DURABLE => Message::Durable {
            durable_lsn: r.u64("durable_lsn")?,
        },
        other => return Err(WireError::UnknownKind(other)),
    })
}

/// The base backup's messages.
fn decode_snapshot(kind: u8, r: &mut Reader<'_>) -> Result<Message, WireError> {
    Ok(match kind {
        kind::SNAPSHOT => Message::Snapshot {
            replica: r.string("replica")?,
            current_epoch: r.u32("current_epoch")?,
        },
        kind::SNAPSHOT_FILE => Message::SnapshotFile {
            path: r.string("path")?,
            size: r.u64("size")?,
            len: r.u64("len")?,
        },
        kind::SNAPSHOT_DATA => Message::SnapshotData {
            data: r.bytes("data")?.to_vec(),
        },
        kind::SNAPSHOT_END => Message::SnapshotEnd {
            leader_epoch: r.u32("leader_epoch")?,
            wal_from: r.u64("wal_from")?,
            files: r.u32("files")?,
            bytes: r.u64("bytes")?,
        },
        other => return Err(WireError::UnknownKind(other)),
    })
}

/// A forwarded batch and its answers.
fn decode_forward(kind: u8, r: &mut Reader<'_>) -> Result<Message, WireError> {
    Ok(match kind {
        kind::FORWARD => Message::Forward {
            replica: r.string("replica")?,
            id: r.u64("id")?,
            batch: r.bytes("batch")?.to_vec(),
        },
        kind::FORWARD_ANSWER => Message::ForwardAnswer {
            id: r.u64("id")?,
            leader_epoch: r.u32("leader_epoch")?,
            durable_lsn: r.u64("durable_lsn")?,
            answer: r.bytes("answer")?.to_vec(),
        },
        kind::FORWARD_REFUSED => Message::ForwardRefused {
            id: r.u64("id")?,
            leader_epoch: r.u32("leader_epoch")?,
            reason: r.string("reason")?,
        },
        other => return Err(WireError::UnknownKind(other)),
    })
}

/// A cursor over a frame body; every read checks what is left first.
struct Reader<'a> {
    buf: &'a [u8],
    message: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated {
                message: self.message,
                field,
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.take(1, field)?[0])
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, field)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A `u32` length and that many bytes; the length is checked against what is left.
    fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let len = self.u32(field)? as usize;
        self.take(len, field)
    }

    fn string(&mut self, field: &'static str) -> Result<String, WireError> {
        let bytes = self.bytes(field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::Utf8 {
            message: self.message,
            field,
        })
    }

    fn entries(&mut self) -> Result<Vec<Entry>, WireError> {
        let count = self.u32("entry count")? as usize;
        // Each entry takes at least its header: a count the body cannot hold is refused
        // before the vector is sized by it.
        if count > self.buf.len() / ENTRY_HEADER_BYTES {
            return Err(WireError::Truncated {
                message: self.message,
                field: "entries",
            });
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            entries.push(Entry {
                lsn: self.u64("entry lsn")?,
                epoch: self.u32("entry epoch")?,
                kind: self.u8("entry kind")?,
                payload: self.bytes("entry payload")?.to_vec(),
            });
        }
        Ok(entries)
    }
}

/// Reads one frame. `Ok(None)`: the peer closed the connection between frames (for TLS,
/// with or without a close_notify).
/// The length is checked against `frame_bytes_max` before the frame is allocated.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    frame_bytes_max: u32,
) -> Result<Option<Message>, WireError> {
    FrameReader::default().next(r, frame_bytes_max).await
}

/// Reads frames one after another, cancel-safe: what a dropped [`FrameReader::next`] had
/// read stays here for the next call, so `next` may race another future in a `select!`
/// (a follower's sync beside the answer it waits for, a leader's long-poll beside the
/// follower's next frame). It never reads past the frame it is reading: what follows stays
/// in the socket for whoever reads it next.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    got: usize,
}

/// A reader keeps at most this much buffer between frames (a larger one is let go).
const KEPT_BUFFER_BYTES: usize = 64 << 10;

impl FrameReader {
    /// The next frame, as [`read_frame`] reads it.
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        frame_bytes_max: u32,
    ) -> Result<Option<Message>, WireError> {
        loop {
            let want = self.want(frame_bytes_max)?;
            if self.got == want {
                let frame = decode_frame(&self.buf[LEN_PREFIX_BYTES..want]);
                self.got = 0;
                if self.buf.capacity() > KEPT_BUFFER_BYTES {
                    self.buf = Vec::new();
                }
                return frame.map(Some);
            }
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            let n = match r.read(&mut self.buf[self.got..want]).await {
                // A TLS peer that closed its socket between frames without a close_notify: a
                // close like any other there (nothing of a frame was cut).
                Err(e) if self.got == 0 && e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(WireError::UnexpectedEof)
                }
                r => r?,
            };
            if n == 0 {
                return if self.got == 0 {
                    Ok(None)
                } else {
                    Err(WireError::UnexpectedEof)
                };
            }
            self.got += n;
        }
    }

    /// The bytes the frame being read takes, length prefix included (only the prefix while
    /// its length is not read yet); its length checked against the limits.
    fn want(&self, frame_bytes_max: u32) -> Result<usize, WireError> {
        if self.got < LEN_PREFIX_BYTES {
            return Ok(LEN_PREFIX_BYTES);
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        if len > frame_bytes_max {
            return Err(WireError::TooLarge {
                len: u64::from(len),
                max: frame_bytes_max,
            });
        }
        if (len as usize) < FRAME_HEADER_BYTES {
            return Err(WireError::TooShort { len });
        }
        Ok(LEN_PREFIX_BYTES + len as usize)
    }
}

/// Encodes and writes one frame, then flushes.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &Message,
    frame_bytes_max: u32,
) -> Result<(), WireError> {
    let buf = encode(msg, frame_bytes_max)?;
    write_encoded(w, &buf).await
}

/// Writes a frame `encode` made, then flushes.
pub async fn write_encoded<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &[u8],
) -> Result<(), WireError> {
    w.write_all(frame).await?;
    w.flush().await?;
    Ok(())
}

#[cfg(test)]
mod wire_tests;
