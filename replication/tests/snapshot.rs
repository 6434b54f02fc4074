//! Base backups over real TCP on 127.0.0.1: a follower fetches the leader's files whole
//! (chunked, with a size larger than the content), is refused by a node that is not the
//! leader, refuses a leader of an older epoch (which steps down), and rejects a leader that
//! sends fewer bytes than it announced. Every wait is bounded (`common::LIMIT`).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{within, Leader};
use roost_replication::testing::MemLog;
use roost_replication::wire::{read_frame, write_frame, DEFAULT_FRAME_BYTES_MAX};
use roost_replication::{
    fetch_snapshot, Message, SnapshotError, SnapshotFile, SnapshotOptions, SnapshotSink,
    SNAPSHOT_CHUNK_BYTES,
};
use tokio::net::TcpListener;

/// A sink that keeps every file in memory, and what it was told in order.
#[derive(Default)]
struct VecSink {
    files: Vec<(SnapshotFile, Vec<u8>)>,
    ended: usize,
}

impl SnapshotSink for VecSink {
    fn begin_file(&mut self, file: &SnapshotFile) -> Result<(), String> {
        self.files.push((file.clone(), Vec::new()));
        Ok(())
    }
    fn write(&mut self, data: &[u8]) -> Result<(), String> {
        let f = self.files.last_mut().ok_or("write before begin_file")?;
        f.1.extend_from_slice(data);
        Ok(())
    }
    fn end_file(&mut self) -> Result<(), String> {
        self.ended += 1;
        Ok(())
    }
}

fn files() -> Vec<(String, Vec<u8>, u64)> {
    let big: Vec<u8> = (0..SNAPSHOT_CHUNK_BYTES * 2 + 17)
        .map(|i| (i % 251) as u8)
        .collect();
    vec![
        ("CHECKPOINT".into(), b"checkpoint bytes".to_vec(), 16),
        ("shards/s0/000001.seg".into(), big, 4 << 20),
        ("keys/empty".into(), Vec::new(), 4096),
    ]
}

/// Goal: every file arrives whole, in order, with its size, and the end carries the
/// leader's epoch and where the follower's log starts. Method: a 2 MiB + 17 byte file (three
/// data frames) in a 4 MiB one, an empty one, a small one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_backup_arrives_whole() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(3, &["b"]);
    a.set_snapshot(41, files());
    let leader = Leader::start(Arc::clone(&a)).await;
    let mut sink = VecSink::default();
    let opts = SnapshotOptions::new("b");
    let done = within(
        "the backup",
        fetch_snapshot(&leader.addr, 2, &opts, &mut sink),
    )
    .await
    .expect("a whole backup");
    assert_eq!((done.leader_epoch, done.wal_from, done.files), (3, 41, 3));
    let want = files();
    assert_eq!(
        done.bytes,
        want.iter().map(|f| f.1.len() as u64).sum::<u64>()
    );
    assert_eq!(sink.ended, 3);
    let got: Vec<(String, Vec<u8>, u64)> = sink
        .files
        .into_iter()
        .map(|(f, data)| {
            assert_eq!(f.len, data.len() as u64);
            (f.path, data, f.size)
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(a.snapshots_taken(), 1);
    leader.stop().await;
}

/// Goal: a node that is not the leader refuses, and a leader whose epoch is older than the
/// follower's is refused and steps down (as for a fetch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_leader_refuses_and_a_stale_leader_steps_down() {
    let a = Arc::new(MemLog::new("a"));
    a.set_snapshot(5, files());
    let leader = Leader::start(Arc::clone(&a)).await;
    let opts = SnapshotOptions::new("b");
    let mut sink = VecSink::default();
    let r = within(
        "not leader",
        fetch_snapshot(&leader.addr, 1, &opts, &mut sink),
    )
    .await;
    assert!(matches!(r, Err(SnapshotError::Refused { .. })), "{r:?}");
    a.become_leader(2, &["b"]);
    let r = within("stale", fetch_snapshot(&leader.addr, 7, &opts, &mut sink)).await;
    assert!(
        matches!(
            r,
            Err(SnapshotError::StaleLeader {
                leader_epoch: 2,
                current_epoch: 7,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(a.higher_epoch_seen(), Some(7));
    assert!(sink.files.is_empty(), "nothing was handed to the sink");
    assert_eq!(a.snapshots_taken(), 0);
    leader.stop().await;
}

/// Goal: a leader that announces more bytes than it sends is caught before the end is
/// accepted (a backup with a short file must never be installed). Method: a raw server
/// that announces 10 bytes, sends 5 and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_file_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let max = DEFAULT_FRAME_BYTES_MAX;
        let ask = read_frame(&mut s, max)
            .await
            .expect("read")
            .expect("a frame");
        assert!(matches!(ask, Message::Snapshot { .. }), "{ask:?}");
        let frames = [
            Message::SnapshotFile {
                path: "CHECKPOINT".into(),
                size: 10,
                len: 10,
            },
            Message::SnapshotData {
                data: b"12345".to_vec(),
            },
            Message::SnapshotEnd {
                leader_epoch: 1,
                wal_from: 3,
                files: 1,
                bytes: 5,
            },
        ];
        for m in &frames {
            write_frame(&mut s, m, max).await.expect("write");
        }
    });
    let mut sink = VecSink::default();
    let r = within(
        "short",
        fetch_snapshot(&addr, 0, &SnapshotOptions::new("b"), &mut sink),
    )
    .await;
    match r {
        Err(SnapshotError::Failed { what, .. }) => {
            assert!(what.contains("5 bytes missing"), "{what}")
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(sink.ended, 0, "the short file was never closed as whole");
    server.await.expect("server");
}
