//! The tests of `wire.rs`.

use super::*;
use proptest::prelude::*;
use std::future::Future;

fn entry() -> impl Strategy<Value = Entry> {
    (
        any::<u64>(),
        any::<u32>(),
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(lsn, epoch, kind, payload)| Entry {
            lsn,
            epoch,
            kind,
            payload,
        })
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            ".{0,20}",
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(
                |(replica, current_epoch, fetch_lsn, last_epoch, max_bytes, wait_ms)| {
                    Message::Fetch {
                        replica,
                        current_epoch,
                        fetch_lsn,
                        last_epoch,
                        max_bytes,
                        wait_ms,
                    }
                }
            ),
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(entry(), 0..8)
        )
            .prop_map(|(leader_epoch, hw, log_start, entries)| Message::Records {
                leader_epoch,
                hw,
                log_start,
                entries
            }),
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(leader_epoch, epoch, end_lsn)| {
            Message::Diverging {
                leader_epoch,
                epoch,
                end_lsn,
            }
        }),
        any::<u32>().prop_map(|leader_epoch| Message::FencedEpoch { leader_epoch }),
        any::<u32>().prop_map(|leader_epoch| Message::UnknownEpoch { leader_epoch }),
        any::<u64>().prop_map(|log_start| Message::OutOfRange { log_start }),
        any::<u32>().prop_map(|epoch| Message::NotLeader { epoch }),
        ".{0,40}".prop_map(|message| Message::Error { message }),
        (".{0,20}", any::<u32>()).prop_map(|(replica, current_epoch)| Message::Snapshot {
            replica,
            current_epoch
        }),
        (".{0,40}", any::<u64>(), any::<u64>())
            .prop_map(|(path, size, len)| Message::SnapshotFile { path, size, len }),
        proptest::collection::vec(any::<u8>(), 0..64)
            .prop_map(|data| Message::SnapshotData { data }),
        (any::<u32>(), any::<u64>(), any::<u32>(), any::<u64>()).prop_map(
            |(leader_epoch, wal_from, files, bytes)| Message::SnapshotEnd {
                leader_epoch,
                wal_from,
                files,
                bytes
            }
        ),
        (
            ".{0,20}",
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(replica, id, batch)| Message::Forward { replica, id, batch }),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|(id, leader_epoch, durable_lsn, answer)| {
                Message::ForwardAnswer {
                    id,
                    leader_epoch,
                    durable_lsn,
                    answer,
                }
            }),
        (any::<u64>(), any::<u32>(), ".{0,40}").prop_map(|(id, leader_epoch, reason)| {
            Message::ForwardRefused {
                id,
                leader_epoch,
                reason,
            }
        }),
        (
            ".{0,20}",
            any::<u32>(),
            (any::<u64>(), any::<u64>()),
            any::<u32>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(
                |(
                    replica,
                    current_epoch,
                    (fetch_lsn, durable_lsn),
                    last_epoch,
                    max_bytes,
                    wait_ms,
                )| {
                    Message::FetchAhead {
                        replica,
                        current_epoch,
                        fetch_lsn,
                        durable_lsn,
                        last_epoch,
                        max_bytes,
                        wait_ms,
                    }
                }
            ),
        any::<u64>().prop_map(|durable_lsn| Message::Durable { durable_lsn }),
    ]
}

/// One message of every kind, with distinct field values, and its whole frame as
/// bytes: the layout docs/replication.md gives, taken from the encoder as it was when
/// this test was written (4 December 2026).
fn every_kind() -> Vec<(Message, &'static str)> {
    vec![
            (Message::Fetch { replica: "b".into(), current_epoch: 2, fetch_lsn: 3, last_epoch: 4, max_bytes: 5, wait_ms: 6 }, "230000003766f3bb01010100000062020000000300000000000000040000000500000006000000"),
            (Message::Records { leader_epoch: 7, hw: 8, log_start: 9, entries: vec![Entry { lsn: 10, epoch: 11, kind: 12, payload: vec![13, 14] }] }, "310000008f1e764201020700000008000000000000000900000000000000010000000a000000000000000b0000000c020000000d0e"),
            (Message::Diverging { leader_epoch: 15, epoch: 16, end_lsn: 17 }, "160000005b9930e901030f000000100000001100000000000000"),
            (Message::FencedEpoch { leader_epoch: 18 }, "0a000000d24b0e75010412000000"),
            (Message::UnknownEpoch { leader_epoch: 19 }, "0a0000000705d2f0010513000000"),
            (Message::OutOfRange { log_start: 20 }, "0e0000001345a38701061400000000000000"),
            (Message::NotLeader { epoch: 21 }, "0a000000bb0979af010715000000"),
            (Message::Error { message: "e".into() }, "0b000000c0eaf0d701080100000065"),
            (Message::Snapshot { replica: "s".into(), current_epoch: 22 }, "0f000000f9c3678a0109010000007316000000"),
            (Message::SnapshotFile { path: "p".into(), size: 23, len: 24 }, "1b00000088802e31010a010000007017000000000000001800000000000000"),
            (Message::SnapshotData { data: vec![25] }, "0b00000079a5d708010b0100000019"),
            (Message::SnapshotEnd { leader_epoch: 26, wal_from: 27, files: 28, bytes: 29 }, "1e000000bffa02d7010c1a0000001b000000000000001c0000001d00000000000000"),
            (Message::Forward { replica: "f".into(), id: 30, batch: vec![31] }, "18000000a5cc5d38010d01000000661e00000000000000010000001f"),
            (Message::ForwardAnswer { id: 32, leader_epoch: 33, durable_lsn: 34, answer: vec![35] }, "1f000000e6a80f4b010e20000000000000002100000022000000000000000100000023"),
            (Message::ForwardRefused { id: 36, leader_epoch: 37, reason: "r".into() }, "17000000260633ed010f2400000000000000250000000100000072"),
            // Pinned 6 December 2026 (issue 42).
            (Message::FetchAhead { replica: "a".into(), current_epoch: 38, fetch_lsn: 39, durable_lsn: 40, last_epoch: 41, max_bytes: 42, wait_ms: 43 }, "2b00000008239328011001000000612600000027000000000000002800000000000000290000002a0000002b000000"),
            (Message::Durable { durable_lsn: 44 }, "0e00000063222a1901112c00000000000000"),
        ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Goal: the bytes on the wire do not change under a refactor: a node of this version
/// and one built before it read each other's frames (the round trip alone would accept
/// a change made on both sides). Method: every kind's frame against its pinned bytes,
/// and each pinned frame decodes to its message.
#[test]
fn every_kind_keeps_its_bytes() {
    let all = every_kind();
    assert_eq!(all.len(), usize::from(kind::DURABLE), "one per kind");
    for (msg, want) in all {
        let frame = encode(&msg, DEFAULT_FRAME_BYTES_MAX).expect("encodes");
        assert_eq!(hex(&frame), want, "{msg:?}");
        let back = decode_frame(&frame[LEN_PREFIX_BYTES..]).expect("decodes");
        assert_eq!(back, msg);
    }
}

proptest! {
    /// Every message survives encode -> decode unchanged, through the async reader too.
    #[test]
    fn round_trip(msg in message()) {
        let frame = encode(&msg, DEFAULT_FRAME_BYTES_MAX).expect("small message encodes");
        prop_assert_eq!(decode_frame(&frame[LEN_PREFIX_BYTES..]).expect("decodes"), msg.clone());
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let mut cursor = &frame[..];
        let read = rt.block_on(read_frame(&mut cursor, DEFAULT_FRAME_BYTES_MAX));
        prop_assert_eq!(read.expect("reads").expect("one frame"), msg);
    }

    /// Random bytes give an error or a message, never a panic.
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_frame(&bytes);
    }

    /// Random bodies behind a valid header (right crc, version, any type) exercise the
    /// body decoders rather than the checksum.
    #[test]
    fn garbage_body_never_panics(kind in 0u8..20, body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut frame = vec![0u8; 4];
        frame.push(PROTOCOL_VERSION);
        frame.push(kind);
        frame.extend_from_slice(&body);
        let crc = crc32fast::hash(&frame[4..]);
        frame[..4].copy_from_slice(&crc.to_le_bytes());
        let _ = decode_frame(&frame);
    }

    /// A frame cut short anywhere is an error, never a message or a panic.
    #[test]
    fn truncated_frame_is_an_error(msg in message(), cut in any::<prop::sample::Index>()) {
        let frame = encode(&msg, DEFAULT_FRAME_BYTES_MAX).expect("encodes");
        let body = &frame[LEN_PREFIX_BYTES..];
        let at = cut.index(body.len());
        prop_assert!(decode_frame(&body[..at]).is_err());
    }
}

#[test]
fn a_huge_length_is_refused_before_allocating() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let bytes = u32::MAX.to_le_bytes();
    let got = rt.block_on(read_frame(&mut &bytes[..], 1024));
    assert!(matches!(got, Err(WireError::TooLarge { max: 1024, .. })));
}

#[test]
fn an_entry_count_larger_than_the_body_is_refused() {
    let msg = Message::Records {
        leader_epoch: 1,
        hw: 1,
        log_start: 1,
        entries: vec![],
    };
    let mut frame = encode(&msg, DEFAULT_FRAME_BYTES_MAX).expect("encodes");
    let count_at = frame.len() - 4;
    frame[count_at..].copy_from_slice(&u32::MAX.to_le_bytes());
    let crc = crc32fast::hash(&frame[8..]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        decode_frame(&frame[LEN_PREFIX_BYTES..]),
        Err(WireError::Truncated {
            field: "entries",
            ..
        })
    ));
}

#[test]
fn an_oversized_message_is_refused_at_encode() {
    let msg = Message::Error {
        message: "x".repeat(100),
    };
    assert!(matches!(
        encode(&msg, 50),
        Err(WireError::TooLarge { max: 50, .. })
    ));
}

/// A source that gives one byte per read and is not ready every other poll: a reader
/// dropped while waiting must lose nothing.
struct Trickle {
    bytes: Vec<u8>,
    at: usize,
    ready: bool,
}

impl tokio::io::AsyncRead for Trickle {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.ready = !self.ready;
        if !self.ready {
            return std::task::Poll::Pending;
        }
        if self.at < self.bytes.len() && buf.remaining() > 0 {
            buf.put_slice(&[self.bytes[self.at]]);
            self.at += 1;
        }
        std::task::Poll::Ready(Ok(()))
    }
}

/// Goal: `FrameReader::next` is cancel-safe and never reads past its frame, so a leader
/// may race it against a long-poll and a follower against its sync. Method: two frames
/// fed a byte at a time to a `next` that is polled once and dropped, again and again;
/// both frames come out whole, and after the first nothing of the second was taken.
#[test]
fn a_frame_reader_dropped_mid_frame_loses_nothing() {
    let first = Message::Durable { durable_lsn: 7 };
    let second = Message::Error {
        message: "next".into(),
    };
    let mut bytes = encode(&first, DEFAULT_FRAME_BYTES_MAX).expect("encodes");
    let first_len = bytes.len();
    bytes.extend(encode(&second, DEFAULT_FRAME_BYTES_MAX).expect("encodes"));
    let total = bytes.len();
    let mut src = Trickle {
        bytes,
        at: 0,
        ready: false,
    };
    let mut reader = FrameReader::default();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut got = Vec::new();
    for _ in 0..10 * total {
        let polled = {
            let next = std::pin::pin!(reader.next(&mut src, DEFAULT_FRAME_BYTES_MAX));
            next.poll(&mut cx)
        };
        if let std::task::Poll::Ready(r) = polled {
            got.push(r.expect("reads").expect("a frame"));
            if got.len() == 1 {
                assert_eq!(src.at, first_len, "read past the first frame");
            }
            if got.len() == 2 {
                break;
            }
        }
    }
    assert_eq!(got, vec![first, second]);
}
