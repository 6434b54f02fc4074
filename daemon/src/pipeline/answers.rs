//! Publishing answers: the engine's part that owns the spool's paths and the [`Publisher`].
//! It writes `out/NAME`, removes `new/NAME`, and tells recovery whose batch a spool name
//! holds now (`names.rs` has the rules); it never plans, claims or decides when an answer
//! may go out (the engine settles a reused name first).

use std::path::Path;
use std::sync::Arc;

use roost_storage::{read_all, OpenMode, Storage};

use super::disk::io_err;
use super::records::ClaimRecord;
use crate::batch::{self, BatchResult};
use crate::config::Config;
use crate::error::EngineError;
use crate::spool::{self, read_dropped, Intake, Prepared, Publisher, SpoolPaths};

/// Whose `new/NAME` or `out/NAME` this is, for recovery.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Owner {
    Missing,
    This,
    Another,
}

/// The spool as the engine answers through it.
pub(super) struct Answers {
    storage: Arc<dyn Storage>,
    config: Arc<Config>,
    spool: SpoolPaths,
    /// Joins its sync helpers when dropped: declared first among the engine's parts that
    /// stop threads, as it was when it was the engine's own field.
    publisher: Publisher,
}

impl Answers {
    pub(super) fn new(
        storage: Arc<dyn Storage>,
        config: Arc<Config>,
        spool: SpoolPaths,
        publisher: Publisher,
    ) -> Answers {
        Answers {
            storage,
            config,
            spool,
            publisher,
        }
    }

    pub(super) fn spool(&self) -> &SpoolPaths {
        &self.spool
    }

    /// (rounds, results) published since start.
    pub(super) fn stats(&self) -> (u64, u64) {
        self.publisher.stats()
    }

    /// Whether each result file is synced on its own (else one `syncfs` per round).
    pub(super) fn syncs_each(&self) -> bool {
        self.publisher.syncs_each()
    }

    /// The results `many` (name, bytes) written and synced as temporaries, not yet renamed.
    pub(super) fn prepare(&self, many: &[(&str, &[u8])]) -> Result<Prepared<'_>, EngineError> {
        (self.publisher.prepare(many)).map_err(io_err("prepare results in", &self.spool.out))
    }

    /// Removes `new/NAME` (not synced here: for a committed batch the claim holds it, and a
    /// file that comes back gives the same answer).
    pub(super) fn remove_input(&self, source: &str) -> Result<(), EngineError> {
        spool::remove_input(self.storage.as_ref(), &self.spool, source)
            .map_err(io_err("remove input", &self.spool.new.join(source)))
    }

    /// Removes `new/NAME` and syncs `new/` at once.
    pub(super) fn remove_input_synced(&self, name: &str) -> Result<(), EngineError> {
        self.remove_input(name)?;
        self.storage
            .sync_dir(&self.spool.new)
            .map_err(io_err("sync", &self.spool.new))
    }

    /// Writes `out/NAME` durably, once the name is settled.
    pub(super) fn publish(&self, source: &str, r: &BatchResult) -> Result<(), EngineError> {
        self.publisher
            .publish(source, r)
            .map_err(io_err("write result", &self.spool.out.join(source)))
    }

    /// Writes `out/NAME` with `bytes` durably, once the name is settled.
    pub(super) fn publish_bytes(&self, name: &str, bytes: &[u8]) -> Result<(), EngineError> {
        self.publisher
            .publish_bytes(name, bytes)
            .map_err(io_err("write result", &self.spool.out.join(name)))
    }

    /// The results of `files` (name, place in `answers`) published in one round: the
    /// `prepared` group's temporaries renamed if it holds exactly these names (it was made
    /// from the same claims, so a difference is a bug: nothing is published and the engine
    /// stops), else written now. Prepared results are not serialized again.
    pub(super) fn publish_claims(
        &self,
        files: &[(&str, usize)],
        answers: &[BatchResult],
        prepared: Option<Prepared<'_>>,
    ) -> Result<(), EngineError> {
        let at = self.spool.out.join(files.first().map_or("", |(n, _)| *n));
        let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        let r = match prepared {
            Some(p) if p.holds(&names) => p.publish(),
            Some(_) => {
                return Err(EngineError::Inconsistent {
                    lsn: 0,
                    detail: format!(
                        "the results prepared at the claims differ from the committed ones \
                         (a group of {}, the first {})",
                        files.len(),
                        at.display()
                    ),
                })
            }
            None if files.is_empty() => return Ok(()),
            None => {
                let lines: Vec<Vec<u8>> = files
                    .iter()
                    .map(|(_, i)| answers[*i].to_json_line())
                    .collect();
                let many: Vec<(&str, &[u8])> = names
                    .iter()
                    .zip(&lines)
                    .map(|(n, l)| (*n, l.as_slice()))
                    .collect();
                self.publisher.publish_many(&many)
            }
        };
        r.map_err(io_err("write result", &at))
    }

    /// Whose batch `new/NAME` holds.
    pub(super) fn input_owner(&self, claim: &ClaimRecord) -> Result<Owner, EngineError> {
        let path = self.spool.new.join(&claim.source);
        let bytes = if self.storage.is_real() {
            match read_dropped(&path, self.config.spool_file_bytes_max) {
                Ok(Intake::Gone) => return Ok(Owner::Missing),
                Ok(Intake::Refused(_)) => return Ok(Owner::Another),
                Ok(Intake::Bytes(b)) => b,
                Err(e) => return Err(io_err("read input", &path)(e)),
            }
        } else {
            match self.read_through_storage(&path)? {
                None => return Ok(Owner::Missing),
                Some(b) => b,
            }
        };
        let same = batch::parse(&bytes, self.config.batch_ops_max).is_ok_and(|b| {
            b.request_key == claim.request_key && batch::fingerprint(&b) == claim.fingerprint
        });
        Ok(if same { Owner::This } else { Owner::Another })
    }

    /// Whose answer `out/NAME` holds (a result of another request key is another's).
    pub(super) fn answer_owner(&self, claim: &ClaimRecord) -> Result<Owner, EngineError> {
        let path = self.spool.out.join(&claim.source);
        let Some(bytes) = self.read_through_storage(&path)? else {
            return Ok(Owner::Missing);
        };
        let mine = serde_json::from_slice::<BatchResult>(&bytes)
            .is_ok_and(|r| r.request_key() == Some(claim.request_key.as_str()));
        Ok(if mine { Owner::This } else { Owner::Another })
    }

    fn read_through_storage(&self, path: &Path) -> Result<Option<Vec<u8>>, EngineError> {
        let file = match self.storage.open(path, OpenMode::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("open", path)(e)),
        };
        read_all(file.as_ref())
            .map(Some)
            .map_err(io_err("read", path))
    }
}
