//! `announce_epoch`: a newly promoted leader tells its former leader that a newer epoch
//! exists, with one `Fetch` whose `current_epoch` is the new epoch. A former leader still
//! running answers `UnknownEpoch` and steps down (its `LeaderLog::saw_higher_epoch`): it
//! takes no more batches. This is a courtesy, not fencing: a former leader cut off from the
//! network hears nothing (the lease of the etcd issue is what fences).

use std::time::Duration;

use crate::log::Epoch;
use crate::transport::Transport;
use crate::wire::{read_frame, write_frame, Message, DEFAULT_FRAME_BYTES_MAX};

/// What the former leader answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Announced {
    /// It was leading an older epoch and stepped down.
    SteppedDown { its_epoch: Epoch },
    /// It leads nothing (or knows this epoch already).
    NotLeading,
}

/// One attempt: connect to `addr`, send the announcement as `replica`, read the answer.
/// Errors (unreachable, timeout, garbage) are returned as text for the caller's log; the
/// caller retries.
pub async fn announce_epoch(
    transport: &Transport,
    addr: &str,
    replica: &str,
    epoch: Epoch,
    timeout: Duration,
) -> Result<Announced, String> {
    let attempt = async {
        let mut s = transport
            .connect(addr, timeout)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        let fetch = Message::Fetch {
            replica: replica.to_owned(),
            current_epoch: epoch,
            fetch_lsn: 1,
            last_epoch: 0,
            max_bytes: 0,
            wait_ms: 0,
        };
        write_frame(&mut s, &fetch, DEFAULT_FRAME_BYTES_MAX)
            .await
            .map_err(|e| format!("announcing to {addr}: {e}"))?;
        match read_frame(&mut s, DEFAULT_FRAME_BYTES_MAX).await {
            Ok(Some(Message::UnknownEpoch { leader_epoch })) => Ok(Announced::SteppedDown {
                its_epoch: leader_epoch,
            }),
            // A refusal (this node may not speak as `replica`, an implausible epoch) is no
            // answer: the caller keeps trying and logs it.
            Ok(Some(Message::Error { message })) => Err(format!("{addr} refused: {message}")),
            Ok(Some(_)) => Ok(Announced::NotLeading),
            Ok(None) => Err(format!("{addr} closed the connection")),
            Err(e) => Err(format!("reading {addr}'s answer: {e}")),
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| format!("{addr}: no answer within {timeout:?}"))?
}
