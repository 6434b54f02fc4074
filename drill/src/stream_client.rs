//! The drill's streamed batches (issue 16): beside each round's spool files, a share of new
//! batches goes over the stream socket at the same time, so the round's kill lands
//! mid-stream too. After every restart every streamed batch is sent again under its key: an
//! answer the drill read before a kill must come back identical (same status, lsn and ids),
//! and the answers join the spool's results in the checks (committed creates present once,
//! their deletes accounted for, a batch meant to be rejected not committed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::Context;

use super::batches::Sent;
use super::setup::READY_LIMIT;
use crate::batch::BatchResult;
use crate::config::Config;

/// A streamed batch: key, JSON, meant to be rejected.
pub(super) type StreamBatch = (String, Vec<u8>, bool);

/// A round's stream: its batches' keys, and the thread that sends them.
pub(super) type Running = (Vec<String>, JoinHandle<std::io::Result<Vec<Vec<u8>>>>);

/// Every batch the drill streamed, and the answers read.
pub(super) struct Streamed {
    socket: PathBuf,
    batches: Vec<StreamBatch>,
    /// The answer each key got, once one was read (in its round, or at a recheck).
    answered: BTreeMap<String, BatchResult>,
    /// Answers read in the rounds (before the round's kill).
    pub read_in_rounds: usize,
}

impl Streamed {
    pub fn new(data: &Path) -> Streamed {
        let cfg = Config {
            data_dir: data.to_path_buf(),
            ..Config::default()
        };
        Streamed {
            socket: crate::intake::stream_protocol::socket_path(&cfg),
            batches: Vec::new(),
            answered: BTreeMap::new(),
            read_in_rounds: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Streams `batches` on one connection from a thread, which ends once all are answered
    /// or the daemon dies.
    pub fn start(&mut self, batches: Vec<StreamBatch>) -> Running {
        let keys = batches.iter().map(|b| b.0.clone()).collect();
        let lines = batches.iter().map(|b| b.1.clone()).collect();
        self.batches.extend(batches);
        let socket = self.socket.clone();
        let h = std::thread::spawn(move || {
            crate::intake::stream_protocol::exchange(&socket, lines, READY_LIMIT)
        });
        (keys, h)
    }

    /// Takes the answers the round's thread read (those of batches not taken now are left).
    pub fn finish(&mut self, (keys, h): Running) -> anyhow::Result<()> {
        use std::io::ErrorKind::{ConnectionRefused, ConnectionReset, NotFound};
        let answers = match h.join() {
            Ok(Ok(a)) => a,
            // The round's daemon died before the stream connected (a crash point).
            Ok(Err(e)) if matches!(e.kind(), ConnectionRefused | ConnectionReset | NotFound) => {
                Vec::new()
            }
            Ok(Err(e)) => return Err(e).context("streaming the round's batches"),
            Err(_) => anyhow::bail!("the drill's stream thread panicked"),
        };
        for (key, line) in keys.into_iter().zip(answers) {
            if let Ok(r) = serde_json::from_slice::<BatchResult>(&line) {
                self.answered.insert(key, r);
                self.read_in_rounds += 1;
            }
        }
        Ok(())
    }

    /// After a restart: every streamed batch again, in one stream. A different answer than
    /// one read before is a violation; returns each batch with its answer, for the checks.
    pub fn recheck(
        &mut self,
        violations: &mut Vec<String>,
    ) -> anyhow::Result<Vec<(Sent, BatchResult)>> {
        let lines = self.batches.iter().map(|b| b.1.clone()).collect();
        let answers = crate::intake::stream_protocol::exchange(&self.socket, lines, READY_LIMIT)
            .context("streaming every batch again")?;
        if answers.len() != self.batches.len() {
            violations.push(format!(
                "stream: {} of {} batches answered after a restart",
                answers.len(),
                self.batches.len()
            ));
        }
        let mut out = Vec::new();
        for ((key, _, expect_rejected), line) in self.batches.iter().zip(answers) {
            let r: BatchResult = serde_json::from_slice(&line).with_context(|| {
                format!(
                    "stream answer for {key}: {}",
                    String::from_utf8_lossy(&line)
                )
            })?;
            match self.answered.get(key) {
                Some(before) if *before != r => violations.push(format!(
                    "stream {key}: answered {before:?} before a kill, {r:?} after"
                )),
                Some(_) => {}
                None => {
                    self.answered.insert(key.clone(), r.clone());
                }
            }
            let sent = Sent {
                name: format!("stream {key}"),
                key: key.clone(),
                retry_of: None,
                expect_rejected: *expect_rejected,
            };
            out.push((sent, r));
        }
        Ok(out)
    }
}
