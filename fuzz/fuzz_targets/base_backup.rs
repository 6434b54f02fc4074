//! The follower's side of a base backup (`roost_replication::receive_messages`, what
//! `fetch_snapshot` runs on the frames off its connection), with a sink that refuses what
//! the daemon's does (`replica::reseed::allowed_path`). Input: a choice byte, then either
//! the connection's bytes (frames read by `wire::read_frame`) or, with the choice's low bit
//! set, structured messages encoded into frames first. Properties: no panic; a backup that
//! completes delivered every announced byte of every file to allowed paths, and its counts
//! are the files and bytes the sink saw.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use roost::replica::reseed::allowed_path;
use roost_fuzz::repl::Any;
use roost_replication::wire;
use roost_replication::{receive_messages, Message, SnapshotFile, SnapshotSink};

const FRAME_BYTES_MAX: u32 = 1 << 16;

/// What a base backup's leader sends, for structured input.
#[derive(Arbitrary, Debug)]
enum Sent {
    File(u8, u16, u16),
    Data(Vec<u8>),
    End(u32, u64, u32, u64),
    Other(u8),
}

const PATHS: [&str; 6] = [
    "CHECKPOINT",
    "keys/00000000000000000001.wal",
    "../x",
    "shards/a/1.seg",
    "audit/",
    "LEADER_EPOCHS",
];

fn message(s: Sent) -> Message {
    roost_fuzz::repl::message(match s {
        Sent::File(p, size, len) => Any::SnapshotFile(
            PATHS[usize::from(p) % PATHS.len()].to_owned(),
            u64::from(size),
            u64::from(len),
        ),
        Sent::Data(data) => Any::SnapshotData(data),
        Sent::End(leader_epoch, wal_from, files, bytes) => {
            Any::SnapshotEnd(leader_epoch, wal_from, files, bytes)
        }
        Sent::Other(e) => Any::NotLeader(u32::from(e)),
    })
}

/// Files as the daemon's sink would take them, in memory.
#[derive(Default)]
struct Sink {
    /// (path, announced len, bytes written, ended)
    files: Vec<(String, u64, u64, bool)>,
}

impl SnapshotSink for Sink {
    fn begin_file(&mut self, f: &SnapshotFile) -> Result<(), String> {
        if !allowed_path(&f.path) {
            return Err(format!("refusing {:?}", f.path));
        }
        assert!(
            f.len <= f.size,
            "{}: {} bytes of a {}-byte file",
            f.path,
            f.len,
            f.size
        );
        assert!(
            self.files.last().is_none_or(|l| l.3),
            "a file begun before the last ended"
        );
        self.files.push((f.path.clone(), f.len, 0, false));
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> Result<(), String> {
        let f = self.files.last_mut().ok_or("write before begin_file")?;
        assert!(!f.3, "a write after end_file");
        f.2 += data.len() as u64;
        assert!(f.2 <= f.1, "{}: more than its {} bytes written", f.0, f.1);
        Ok(())
    }

    fn end_file(&mut self) -> Result<(), String> {
        let f = self.files.last_mut().ok_or("end_file before begin_file")?;
        assert_eq!(f.2, f.1, "{}: ended short", f.0);
        f.3 = true;
        Ok(())
    }
}

fn frames(c: u8, bytes: &[u8]) -> Vec<u8> {
    if c & 1 == 0 {
        return bytes.to_vec();
    }
    let mut u = Unstructured::new(bytes);
    let mut out = Vec::new();
    for s in u.arbitrary_iter::<Sent>().into_iter().flatten().take(64) {
        let Ok(s) = s else { break };
        out.extend(wire::encode(&message(s), FRAME_BYTES_MAX).unwrap_or_default());
    }
    out
}

fuzz_target!(init: roost_fuzz::limit_memory(), |data: &[u8]| {
    let (c, bytes) = roost_fuzz::choice(data);
    let b = frames(c, bytes);
    let msgs = roost_fuzz::repl::read_frames(&b, FRAME_BYTES_MAX);
    let mut sink = Sink::default();
    let epoch = u32::from(c >> 4);
    if let Ok(Some(done)) = receive_messages("leader", epoch, &mut sink, msgs) {
        assert!(done.leader_epoch >= epoch);
        assert_eq!(done.files as usize, sink.files.len());
        assert!(sink.files.iter().all(|f| f.3), "a complete backup with an unended file");
        let bytes: u64 = sink.files.iter().map(|f| f.2).sum();
        assert_eq!(done.bytes, bytes);
    }
});
