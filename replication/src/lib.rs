//! `roost-replication`: the WAL replication protocol of `Kip320.tla` between one leader and
//! its followers (docs/replication.md). A follower's fetch carries its current leader epoch,
//! its log end (the acknowledgement) and the epoch of its last record; the leader fences
//! stale and future epochs and answers a diverging fetch with the end of that epoch on its
//! side; the follower truncates there and fetches again until the logs agree. `wire` is the
//! frame format, `decide` the pure rules, `serve` and `follow` the tokio runtime around
//! them, `testing` an in-memory log for tests. The crate never touches a disk: the daemon's
//! `LeaderLog`/`FollowerLog` do.
#![forbid(unsafe_code)]

mod admit;
mod announce;
pub mod decide;
pub mod election;
mod fetching;
mod follow;
pub mod forward;
mod log;
mod options;
mod serve;
mod snapshot;
mod status;
mod task;
pub mod testing;
pub mod transport;
pub mod wire;

pub use announce::{announce_epoch, Announced};
pub use decide::{
    follower_truncation, leader_answer, plausible_epoch, Answer, FetchView, Truncation,
    EPOCH_CEILING, EPOCH_GENERATIONS_AHEAD_MAX,
};
pub use follow::{follow, reconcile, FollowEnd, FollowError, FollowerOptions};
pub use forward::{ForwardError, ForwardReply, Forwarder};
pub use log::{
    Entry, Epoch, EpochEnd, FollowerLog, Forwarded, LeaderLog, Lsn, SnapshotFile, SnapshotSource,
};
pub use options::LeaderOptions;
pub use serve::{serve_followers, serve_followers_on};
pub use snapshot::{
    fetch_snapshot, receive_messages, SnapshotDone, SnapshotError, SnapshotOptions, SnapshotSink,
    SNAPSHOT_CHUNK_BYTES,
};
pub use status::{FollowerStatus, StatusSnapshot};
pub use transport::{
    Dial, Io, IoFuture, Listen, Peer, Stream, TlsIdentity, Transport, TransportError,
    HANDSHAKE_TIMEOUT,
};
pub use wire::{Message, WireError, PROTOCOL_VERSION};
