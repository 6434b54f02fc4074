//! Base backups: a follower behind the leader's retained log (`OutOfRange`) asks, on a
//! connection of its own, for a copy of the leader's state at its last checkpoint, then
//! follows from there (Kafka's and PostgreSQL's re-seed from a base backup). The leader's
//! log hands out the files ([`SnapshotSource`], in `log.rs`); this module streams them, and on the
//! follower's side hands them to a [`SnapshotSink`]. What makes the copy consistent while
//! the leader keeps running is the log's business (the daemon's `replica/base_backup.rs`); the
//! protocol only checks that every file arrives whole and that the counts match.
//!
//! ```text
//! follower                         leader
//!    Snapshot{replica, epoch}  ->
//!                              <-  SnapshotFile{path, size, len}, SnapshotData* (len bytes)
//!                              <-  ... for every file
//!                              <-  SnapshotEnd{leader_epoch, wal_from, files, bytes}
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::timeout;
use tracing::{info, warn};

use crate::decide::plausible_epoch;
use crate::log::{Epoch, LeaderLog, Lsn, SnapshotFile, SnapshotSource};
use crate::transport::{Stream, Transport};
use crate::wire::{read_frame, write_frame, Message};

/// Bytes of file content per `SnapshotData` frame.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// The follower's side: where the files go. Blocking (called from the follower's start-up
/// runtime, which runs nothing else).
pub trait SnapshotSink {
    fn begin_file(&mut self, file: &SnapshotFile) -> Result<(), String>;
    fn write(&mut self, data: &[u8]) -> Result<(), String>;
    /// The current file's `len` bytes all arrived.
    fn end_file(&mut self) -> Result<(), String>;
}

/// What a finished base backup said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotDone {
    pub leader_epoch: Epoch,
    pub wal_from: Lsn,
    pub files: u32,
    pub bytes: u64,
}

/// Why fetching a base backup failed (nothing of it may be used).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("base backup from {leader}: {what}")]
    Failed { leader: String, what: String },
    #[error("base backup from {leader}: the leader refused: {answer}")]
    Refused { leader: String, answer: String },
    #[error("base backup from {leader}: the leader's epoch {leader_epoch} is older than this node's {current_epoch}")]
    StaleLeader {
        leader: String,
        leader_epoch: Epoch,
        current_epoch: Epoch,
    },
    #[error("base backup from {leader}: writing {path}: {what}")]
    Sink {
        leader: String,
        path: String,
        what: String,
    },
}

/// Limits of one base backup transfer on the follower's side.
#[derive(Clone, Debug)]
pub struct SnapshotOptions {
    pub replica: String,
    pub frame_bytes_max: u32,
    pub connect_timeout: Duration,
    /// The longest silence between two frames (the leader may take a checkpoint first).
    pub read_timeout: Duration,
    /// How the leader is reached (mutual TLS or plain TCP).
    pub transport: Transport,
}

impl SnapshotOptions {
    pub fn new(replica: impl Into<String>) -> SnapshotOptions {
        SnapshotOptions {
            replica: replica.into(),
            frame_bytes_max: crate::wire::DEFAULT_FRAME_BYTES_MAX,
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(60),
            transport: Transport::plain(Vec::new()),
        }
    }
}

/// Fetches a base backup from `leader` into `sink`. `current_epoch` is this node's: a leader
/// of an older epoch is refused.
pub async fn fetch_snapshot(
    leader: &str,
    current_epoch: Epoch,
    opts: &SnapshotOptions,
    sink: &mut dyn SnapshotSink,
) -> Result<SnapshotDone, SnapshotError> {
    let failed = |what: String| SnapshotError::Failed {
        leader: leader.to_owned(),
        what,
    };
    let mut stream = match opts.transport.connect(leader, opts.connect_timeout).await {
        Ok(s) => s,
        Err(e) => return Err(failed(format!("connecting: {e}"))),
    };
    let ask = Message::Snapshot {
        replica: opts.replica.clone(),
        current_epoch,
    };
    write_frame(&mut stream, &ask, opts.frame_bytes_max)
        .await
        .map_err(|e| failed(format!("sending the request: {e}")))?;
    let mut rx = Receiving::new(leader, current_epoch, sink);
    loop {
        let msg = match timeout(
            opts.read_timeout,
            read_frame(&mut stream, opts.frame_bytes_max),
        )
        .await
        {
            Err(_) => return Err(failed("timed out waiting for the next frame".into())),
            Ok(Err(e)) => return Err(failed(format!("reading: {e}"))),
            Ok(Ok(None)) => return Err(failed("connection closed before SnapshotEnd".into())),
            Ok(Ok(Some(msg))) => msg,
        };
        if let Some(done) = rx.take(msg)? {
            info!(
                leader,
                wal_from = done.wal_from,
                files = done.files,
                bytes = done.bytes,
                "base backup received"
            );
            return Ok(done);
        }
    }
}

/// The follower's side of a base backup over frames already read, as [`fetch_snapshot`]
/// takes those off its connection: `Some` once `SnapshotEnd` made the backup whole, `None`
/// if the frames ran out before it. The fuzz target's way in (issue 45); the daemon uses
/// `fetch_snapshot`.
#[doc(hidden)]
pub fn receive_messages(
    leader: &str,
    current_epoch: Epoch,
    sink: &mut dyn SnapshotSink,
    msgs: impl IntoIterator<Item = Message>,
) -> Result<Option<SnapshotDone>, SnapshotError> {
    let mut rx = Receiving::new(leader, current_epoch, sink);
    for msg in msgs {
        if let Some(done) = rx.take(msg)? {
            return Ok(Some(done));
        }
    }
    Ok(None)
}

/// The follower's state while files arrive: each frame must be the one the protocol
/// allows next.
struct Receiving<'a> {
    leader: &'a str,
    current_epoch: Epoch,
    sink: &'a mut dyn SnapshotSink,
    /// The file being received and the bytes still owed for it.
    file: Option<(SnapshotFile, u64)>,
    files: u32,
    bytes: u64,
}

impl<'a> Receiving<'a> {
    fn new(leader: &'a str, current_epoch: Epoch, sink: &'a mut dyn SnapshotSink) -> Self {
        Receiving {
            leader,
            current_epoch,
            sink,
            file: None,
            files: 0,
            bytes: 0,
        }
    }

    fn failed(&self, what: String) -> SnapshotError {
        SnapshotError::Failed {
            leader: self.leader.to_owned(),
            what,
        }
    }

    fn sink_err(&self, path: &str, what: String) -> SnapshotError {
        SnapshotError::Sink {
            leader: self.leader.to_owned(),
            path: path.to_owned(),
            what,
        }
    }

    /// One frame; `Some` once the backup is whole.
    fn take(&mut self, msg: Message) -> Result<Option<SnapshotDone>, SnapshotError> {
        match msg {
            Message::SnapshotFile { path, size, len } => {
                self.finish_file()?;
                if len > size {
                    return Err(
                        self.failed(format!("{path}: {len} bytes sent of a {size}-byte file"))
                    );
                }
                let f = SnapshotFile { path, size, len };
                self.sink
                    .begin_file(&f)
                    .map_err(|e| self.sink_err(&f.path, e))?;
                self.files += 1;
                self.file = Some((f, len));
                Ok(None)
            }
            Message::SnapshotData { data } => self.data(&data).map(|()| None),
            Message::SnapshotEnd {
                leader_epoch,
                wal_from,
                files,
                bytes,
            } => self.end(leader_epoch, wal_from, files, bytes).map(Some),
            Message::UnknownEpoch { leader_epoch } => Err(SnapshotError::StaleLeader {
                leader: self.leader.to_owned(),
                leader_epoch,
                current_epoch: self.current_epoch,
            }),
            Message::NotLeader { .. } | Message::Error { .. } | Message::FencedEpoch { .. } => {
                Err(SnapshotError::Refused {
                    leader: self.leader.to_owned(),
                    answer: format!("{msg:?}"),
                })
            }
            other => Err(self.failed(format!("unexpected {} during a base backup", other.name()))),
        }
    }

    fn data(&mut self, data: &[u8]) -> Result<(), SnapshotError> {
        let Some((f, owed)) = self.file.as_mut() else {
            return Err(self.failed("SnapshotData before any SnapshotFile".into()));
        };
        if data.len() as u64 > *owed {
            let path = f.path.clone();
            return Err(self.failed(format!("{path}: more bytes than announced")));
        }
        *owed -= data.len() as u64;
        let path = f.path.clone();
        self.bytes += data.len() as u64;
        self.sink.write(data).map_err(|e| self.sink_err(&path, e))
    }

    /// Closes the current file, which must have all its bytes.
    fn finish_file(&mut self) -> Result<(), SnapshotError> {
        match self.file.take() {
            None => Ok(()),
            Some((f, 0)) => self.sink.end_file().map_err(|e| self.sink_err(&f.path, e)),
            Some((f, owed)) => Err(self.failed(format!("{}: {owed} bytes missing", f.path))),
        }
    }

    fn end(
        &mut self,
        leader_epoch: Epoch,
        wal_from: Lsn,
        files: u32,
        bytes: u64,
    ) -> Result<SnapshotDone, SnapshotError> {
        self.finish_file()?;
        if (files, bytes) != (self.files, self.bytes) {
            return Err(self.failed(format!(
                "SnapshotEnd counts {files} files and {bytes} bytes, {} and {} arrived",
                self.files, self.bytes
            )));
        }
        if leader_epoch < self.current_epoch {
            return Err(SnapshotError::StaleLeader {
                leader: self.leader.to_owned(),
                leader_epoch,
                current_epoch: self.current_epoch,
            });
        }
        Ok(SnapshotDone {
            leader_epoch,
            wal_from,
            files,
            bytes,
        })
    }
}

/// The leader's answer to a `Snapshot` request on `stream`: checks leadership and epochs,
/// then streams the log's files. Errors are logged; the connection ends either way.
pub(crate) async fn serve_snapshot<L: LeaderLog>(
    stream: &mut Stream,
    peer: SocketAddr,
    log: &Arc<L>,
    limits: (u32, Duration),
    replica: String,
    current_epoch: Epoch,
) {
    let started = std::time::Instant::now();
    let (frame_bytes_max, write_timeout) = limits;
    let out = &mut Out {
        stream,
        frame_bytes_max,
        write_timeout,
    };
    match send_snapshot(out, log, &replica, current_epoch).await {
        Ok(Some(end)) => info!(%peer, replica, ?end, secs = started.elapsed().as_secs_f64(),
            "base backup sent"),
        Ok(None) => {}
        Err(what) => {
            warn!(%peer, replica, error = %what, "base backup failed");
            let msg = Message::Error {
                message: format!("base backup failed: {what}"),
            };
            let _ = out.send(&msg).await;
        }
    }
}

/// The leader's side of one backup connection: every frame written within the write
/// timeout, so a follower that stops reading ends the copy (and its hold on the log) soon.
struct Out<'a> {
    stream: &'a mut Stream,
    frame_bytes_max: u32,
    write_timeout: Duration,
}

impl Out<'_> {
    async fn send(&mut self, msg: &Message) -> Result<(), String> {
        match timeout(
            self.write_timeout,
            write_frame(self.stream, msg, self.frame_bytes_max),
        )
        .await
        {
            Ok(r) => r.map_err(|e| format!("sending {}: {e}", msg.name())),
            Err(_) => Err(format!(
                "sending {}: timed out after {:?}",
                msg.name(),
                self.write_timeout
            )),
        }
    }
}

/// `Ok(None)`: refused with an answer already sent.
async fn send_snapshot<L: LeaderLog>(
    out: &mut Out<'_>,
    log: &Arc<L>,
    replica: &str,
    current_epoch: Epoch,
) -> Result<Option<Message>, String> {
    let refusal = match log.leader_epoch() {
        None => Some(Message::NotLeader { epoch: 0 }),
        Some(e) if !plausible_epoch(e, current_epoch) => {
            warn!(
                replica,
                epoch = current_epoch,
                leader_epoch = e,
                "a base backup request claims an epoch no promotion could have minted yet: refused"
            );
            Some(Message::Error {
                message: format!(
                    "epoch {current_epoch} is implausible beside this leader's {e}: refused"
                ),
            })
        }
        Some(e) if current_epoch > e => {
            log.saw_higher_epoch(current_epoch);
            Some(Message::UnknownEpoch { leader_epoch: e })
        }
        Some(_) => None,
    };
    if let Some(msg) = refusal {
        out.send(&msg).await?;
        return Ok(None);
    }
    let name = replica.to_owned();
    let l = Arc::clone(log);
    let src = tokio::task::spawn_blocking(move || l.snapshot(&name))
        .await
        .map_err(|e| format!("the snapshot task failed: {e}"))??;
    let src = Arc::new(Mutex::new(src));
    let (files, bytes) = send_files(out, &src).await?;
    let wal_from = with_source(&src, |s| Ok(s.wal_from())).await?;
    let leader_epoch = log.leader_epoch().ok_or("no longer the leader")?;
    let end = Message::SnapshotEnd {
        leader_epoch,
        wal_from,
        files,
        bytes,
    };
    out.send(&end).await?;
    Ok(Some(end))
}

type SharedSource = Arc<Mutex<Box<dyn SnapshotSource>>>;

/// Runs `f` on the source on the blocking pool.
async fn with_source<T: Send + 'static>(
    src: &SharedSource,
    f: impl FnOnce(&mut dyn SnapshotSource) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let src = Arc::clone(src);
    tokio::task::spawn_blocking(move || {
        let mut g = src
            .lock()
            .map_err(|_| "snapshot source poisoned".to_owned())?;
        f(g.as_mut())
    })
    .await
    .map_err(|e| format!("the snapshot task failed: {e}"))?
}

/// Every file: its header, then its bytes in chunks. Returns (files, bytes).
async fn send_files(out: &mut Out<'_>, src: &SharedSource) -> Result<(u32, u64), String> {
    let (mut files, mut bytes) = (0u32, 0u64);
    while let Some(f) = with_source(src, |s| s.next_file()).await? {
        let path = f.path.clone();
        let header = Message::SnapshotFile {
            path: f.path,
            size: f.size,
            len: f.len,
        };
        out.send(&header)
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        let mut sent = 0u64;
        loop {
            let chunk = with_source(src, |s| {
                let mut buf = vec![0u8; SNAPSHOT_CHUNK_BYTES];
                let n = s.read(&mut buf)?;
                buf.truncate(n);
                Ok(buf)
            })
            .await?;
            if chunk.is_empty() {
                break;
            }
            sent += chunk.len() as u64;
            let data = Message::SnapshotData { data: chunk };
            out.send(&data).await.map_err(|e| format!("{path}: {e}"))?;
        }
        if sent != f.len {
            return Err(format!("{path}: read {sent} of {} bytes", f.len));
        }
        files += 1;
        bytes += sent;
    }
    Ok((files, bytes))
}
