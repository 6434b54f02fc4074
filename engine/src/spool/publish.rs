//! Result files in rounds: group commit for `out/` (see [`Publisher`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use roost_storage::{OpenMode, Storage, StorageFs};
use tracing::{debug, warn};

use super::sync_helpers::{SyncFile, SyncHelpers};
#[cfg(test)]
use crate::batch::BatchResult;
use crate::config::ResultSync;

/// Publishes result files in rounds: group commit for `out/`.
///
/// A result is written to a hidden temporary in `out/` (and, by default, fdatasynced by its
/// own worker, concurrently with the others, then renamed to `out/NAME` by that worker at
/// once), then joins a round. The first caller to find no round running runs one for
/// everything queued: makes the temporaries' data durable and renames them if that is the
/// round's job ([`ResultSync::Syncfs`]), and fsyncs `out/` once, which covers every rename
/// made before it began; the others wait for it. A result renamed while a round runs
/// waits for the next round's fsync, not for the running one to end before it is renamed.
/// So a client that sees `out/NAME` sees the whole result (its data was synced before its
/// rename), its publisher returns only once the rename is durable, and under load a round
/// of N results costs N + 1 syncs instead of 2N (2 with `syncfs`). A rename seen before its
/// round's fsync can be undone by a power loss, as it always could: a committed batch's
/// result is then published again by recovery from its durable claim, and any other
/// answer's input is still in `new/` (removed only after the round).
///
/// A failed round latches (like a failed WAL sync: an fsync is never retried): every later
/// publish fails, the engine stops, and recovery publishes again from the WAL and the inputs
/// still in `new/`.
pub struct Publisher {
    storage: Arc<dyn Storage>,
    out: PathBuf,
    mode: ResultSync,
    /// `out/`, held open from before any result is written: `syncfs` reports every
    /// write-back error after, and each round fsyncs `out/` through it (no open per round).
    fs: Box<dyn StorageFs>,
    st: Mutex<Round>,
    done: Condvar,
    rounds: AtomicU64,
    published: AtomicU64,
    /// Makes every temporary's name unique, so two results for one name never share one.
    tmp_seq: AtomicU64,
    /// A group's temporaries are synced at once, on its worker and standing helpers
    /// (`sync_helpers.rs`: at most 16 for the whole daemon, however many groups publish).
    helpers: SyncHelpers,
}

#[derive(Default)]
struct Round {
    /// Tickets are handed out in order, and a round takes the whole queue, so every ticket up
    /// to `published_through` is in `out/`.
    queue: Vec<Queued>,
    next_ticket: u64,
    published_through: u64,
    running: bool,
    poisoned: Option<String>,
}

/// A result waiting for its round: ticket, its temporary if the round renames it (`None`:
/// its worker renamed it already), its name in `out/`.
type Queued = (u64, Option<PathBuf>, String);

/// A group of results written to hidden temporaries in `out/` (synced, under `fsync`) and
/// not yet renamed: made by [`Publisher::prepare`], published by [`Prepared::publish`].
/// Dropped unpublished (the claims' sync failed, the engine stopped, a crash point), it
/// removes its temporaries, so no client ever sees them; a removal a power loss undoes is
/// redone at the next open.
pub struct Prepared<'p> {
    publisher: &'p Publisher,
    /// Emptied by `publish`: what is left here when dropped was never handed to a round.
    temporaries: Vec<PathBuf>,
    /// The results' names in `out/`, in order.
    names: Vec<String>,
}

impl Prepared<'_> {
    /// Whether this group holds the results of exactly `names`, in order: the pipeline
    /// checks the results it would publish now against those prepared at the claims (their
    /// bytes are the claims', made by the same function from the same claims).
    pub fn holds(&self, names: &[&str]) -> bool {
        self.names.len() == names.len() && self.names.iter().zip(names).all(|(a, b)| a == b)
    }

    /// Renames every temporary to `out/NAME` (at once under `fsync`, in the round under
    /// `syncfs`) and fsyncs `out/` in a round; returns once all are there and durable. Every
    /// temporary is synced before its rename (by `prepare`, or by the round's `syncfs`).
    pub fn publish(mut self) -> io::Result<()> {
        let temporaries = std::mem::take(&mut self.temporaries);
        let names = std::mem::take(&mut self.names);
        self.publisher.publish_prepared(temporaries, &names)
    }
}

impl Drop for Prepared<'_> {
    fn drop(&mut self) {
        for tmp in self.temporaries.drain(..) {
            if let Err(e) = self.publisher.storage.remove(&tmp) {
                if e.kind() != io::ErrorKind::NotFound {
                    warn!(file = %tmp.display(), error = %e, "cannot remove an unpublished result's temporary; the next start removes it");
                }
            }
        }
    }
}

/// `.NAME.SEQ.tmp`: hidden (clients ignore dot-files in `out/`), unique per publish.
fn is_temporary(file_name: &str) -> bool {
    file_name.starts_with('.') && file_name.ends_with(".tmp")
}

impl Publisher {
    /// Opens the publisher on `out/`, first removing the temporaries a crash left there (no
    /// round had renamed them, so no client ever saw them).
    pub fn new(storage: Arc<dyn Storage>, out: &Path, mode: ResultSync) -> io::Result<Publisher> {
        for stale in storage.list(out)?.iter().filter(|n| is_temporary(n)) {
            match storage.remove(&out.join(stale)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => debug!(file = %stale, "removed a temporary result left by a crash"),
            }
        }
        let fs = storage.open_fs(out)?;
        Ok(Publisher {
            storage,
            out: out.to_path_buf(),
            mode,
            fs,
            st: Mutex::new(Round::default()),
            done: Condvar::new(),
            rounds: AtomicU64::new(0),
            published: AtomicU64::new(0),
            tmp_seq: AtomicU64::new(0),
            helpers: SyncHelpers::new(),
        })
    }

    /// (rounds, results published) since start: results per round is the grouping.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.rounds.load(Ordering::Relaxed),
            self.published.load(Ordering::Relaxed),
        )
    }

    /// Whether each result is synced by its own fdatasync (`fsync`), not by the round's
    /// `syncfs`: then preparing a group costs a device sync worth overlapping.
    pub fn syncs_each(&self) -> bool {
        self.mode == ResultSync::Fsync
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        roost_storage::lock(&self.st)
    }

    /// Writes `out/NAME` atomically and durably; returns once it is both. The tests' short
    /// way: the engine gives every answer through `Answers::deliver`, which calls
    /// [`Publisher::publish_many`] or [`Prepared::publish`] (`daemon/tests/one_path.rs`).
    #[cfg(test)]
    pub fn publish(&self, name: &str, result: &BatchResult) -> io::Result<()> {
        self.publish_bytes(name, &result.to_json_line())
    }

    /// [`Publisher::publish`] of ready-made bytes.
    #[cfg(test)]
    pub fn publish_bytes(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        self.publish_many(&[(name, bytes)])
    }

    /// Many results at once (a group of spool files, `pipeline/finish.rs`): every temporary
    /// written first, its write-back started, then all synced at once (`sync_helpers.rs`:
    /// the syncs share a journal commit and the device's flushes), then all of them in one
    /// round. Returns once every one is in `out/` and durable.
    pub fn publish_many(&self, results: &[(&str, &[u8])]) -> io::Result<()> {
        self.prepare(results)?.publish()
    }

    /// The first half of [`Publisher::publish_many`]: every result written to its temporary
    /// and, under `fsync`, synced; nothing renamed, so no client sees any of them yet. The
    /// pipeline runs it while the group's claims are synced to the WAL (a result's bytes
    /// are fixed at its claim), and calls [`Prepared::publish`] once they are durable and
    /// committed. A group dropped unpublished removes its temporaries; those a crash leaves
    /// are removed at the next open ([`Publisher::new`]).
    pub fn prepare(&self, results: &[(&str, &[u8])]) -> io::Result<Prepared<'_>> {
        let mut written: Vec<Temporary> = Vec::with_capacity(results.len());
        let r = self.write_temporaries(results, &mut written);
        let prepared = Prepared {
            publisher: self,
            temporaries: written.into_iter().map(|(tmp, _)| tmp).collect(),
            names: results.iter().map(|(n, _)| (*n).to_owned()).collect(),
        };
        // On an error, dropping `prepared` removes every temporary made.
        r.map(|()| prepared)
    }

    /// Writes each result to its temporary (recorded in `written` as it is made, so the
    /// caller can remove them on failure), then, when this mode syncs results one by one,
    /// syncs each.
    fn write_temporaries(
        &self,
        results: &[(&str, &[u8])],
        written: &mut Vec<Temporary>,
    ) -> io::Result<()> {
        for (name, bytes) in results {
            let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
            let tmp = self.out.join(format!(".{name}.{seq}.tmp"));
            let f = self.storage.open(&tmp, OpenMode::CreateNew)?;
            let w = f.write_at(bytes, 0);
            written.push((tmp, Arc::from(f)));
            w?;
        }
        if self.mode == ResultSync::Fsync {
            if written.len() > 1 {
                for (tmp, f) in written.iter() {
                    // Only a hint: the sync below is what counts.
                    if let Err(e) = f.start_writeback() {
                        debug!(file = %tmp.display(), error = %e, "cannot start write-back");
                    }
                }
            }
            let files: Vec<SyncFile> = written.iter().map(|(_, f)| f.clone()).collect();
            self.helpers.sync(&files)?;
        }
        Ok(())
    }

    /// The second half: the prepared temporaries join a round (renamed, `out/` fsynced, and
    /// under `syncfs` the file system synced first); returns once all are in `out/`.
    fn publish_prepared(&self, temporaries: Vec<PathBuf>, names: &[String]) -> io::Result<()> {
        if temporaries.is_empty() {
            return Ok(());
        }
        // Under `fsync` every temporary is durable already: renamed here, so the client
        // does not wait for a round already running to end before it sees its result.
        let renamed = self.mode == ResultSync::Fsync;
        if renamed {
            self.not_poisoned(&self.lock())?;
            for (tmp, name) in temporaries.iter().zip(names) {
                if let Err(e) = self.rename_into(tmp, name) {
                    // As a failed round: nothing more is published (the temporaries left
                    // are removed at the next start).
                    self.lock().poisoned = Some(e.to_string());
                    self.done.notify_all();
                    return Err(e);
                }
            }
        }
        let mut g = self.lock();
        for (tmp, name) in temporaries.into_iter().zip(names) {
            g.next_ticket += 1;
            let ticket = g.next_ticket;
            g.queue
                .push((ticket, (!renamed).then_some(tmp), name.clone()));
        }
        let last = g.next_ticket;
        self.wait_for_round(g, last)
    }

    /// Waits until every ticket up to `ticket` is published, running a round for the queue
    /// whenever none runs (see the type's comment).
    fn wait_for_round<'a>(&'a self, mut g: MutexGuard<'a, Round>, ticket: u64) -> io::Result<()> {
        loop {
            self.not_poisoned(&g)?;
            if g.published_through >= ticket {
                return Ok(());
            }
            if g.running {
                g = self.done.wait(g).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let round = std::mem::take(&mut g.queue);
            let last = round.last().map_or(ticket, |(t, _, _)| *t);
            g.running = true;
            drop(g);
            let r = self.run(&round);
            g = self.lock();
            g.running = false;
            match r {
                Ok(()) => {
                    g.published_through = g.published_through.max(last);
                    self.rounds.fetch_add(1, Ordering::Relaxed);
                    self.published
                        .fetch_add(round.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    warn!(dir = %self.out.display(), results = round.len(), error = %e, "result round failed; publishing stopped");
                    g.poisoned = Some(e.to_string());
                }
            }
            self.done.notify_all();
        }
    }

    /// An error once a round has failed: nothing more is published.
    fn not_poisoned(&self, g: &Round) -> io::Result<()> {
        match &g.poisoned {
            Some(why) => Err(io::Error::other(format!(
                "result publishing stopped after an earlier failure: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// `tmp` renamed to `out/NAME`.
    fn rename_into(&self, tmp: &Path, name: &str) -> io::Result<()> {
        let to = self.out.join(name);
        self.storage
            .rename(tmp, &to)
            .map_err(|e| ctx("rename of the result to", &to, e))
    }

    fn run(&self, round: &[Queued]) -> io::Result<()> {
        if self.mode == ResultSync::Syncfs {
            self.fs
                .sync_fs()
                .map_err(|e| ctx("syncfs of the file system holding", &self.out, e))?;
        }
        for (_, tmp, name) in round {
            if let Some(tmp) = tmp {
                self.rename_into(tmp, name)?;
            }
        }
        self.fs
            .sync_dir()
            .map_err(|e| ctx("fsync of", &self.out, e))
    }
}

/// `e` with what failed and on which path.
fn ctx(what: &str, p: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
}

type Temporary = (PathBuf, SyncFile);

#[cfg(test)]
mod tests {
    use super::*;

    use crate::batch::Invalid;
    use roost_storage::{CrashMode, SimFaults, SimStorage};

    /// Goal: under `fsync` a result is in `out/` as soon as its worker publishes it, not
    /// once a round already under way (another group's `out/` fsync) has ended; `publish`
    /// still returns only after a round that began after its rename.
    #[test]
    fn a_result_is_renamed_at_once_while_another_round_runs() {
        let out = PathBuf::from("/spool/out");
        let disk = SimStorage::new();
        let p = Publisher::new(Arc::new(disk.clone()), &out, ResultSync::Fsync);
        let p = Arc::new(p.expect("publisher"));
        p.lock().running = true; // another group's round, under way
        let p2 = p.clone();
        let t = std::thread::spawn(move || p2.publish("a.json", &result(1)));
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while disk.file_bytes(&out.join("a.json")).is_none() {
            assert!(
                std::time::Instant::now() < until,
                "not renamed while the round ran"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            !t.is_finished(),
            "returned before a round covered its rename"
        );
        p.lock().running = false;
        p.done.notify_all();
        t.join().expect("publisher thread").expect("published");
        assert_eq!(p.stats(), (1, 1), "one round, after the rename");
    }

    fn result(i: usize) -> BatchResult {
        BatchResult::invalid(&Invalid {
            request_key: Some(format!("key-{i}")),
            error: format!("result number {i}"),
        })
    }

    /// Publishes `n` results one after another on a simulated disk whose power goes after
    /// `freeze` syncs, then checks the disk after the loss: every result acknowledged before
    /// the power went is there whole, and nothing in out/ is partial.
    fn power_loss_case(mode: ResultSync, n: usize, freeze: Option<u64>, crash: CrashMode) {
        let out = PathBuf::from("/spool/out");
        let disk = SimStorage::new();
        disk.set_faults(SimFaults {
            freeze_after_syncs: freeze,
            ..SimFaults::default()
        });
        let p = Publisher::new(Arc::new(disk.clone()), &out, mode).expect("publisher");
        let mut acked = Vec::new();
        for i in 0..n {
            p.publish(&format!("r{i}"), &result(i)).expect("publish");
            if freeze.is_none_or(|f| disk.sync_count() <= f) {
                acked.push(i);
            }
        }
        let after = disk.crash(crash);
        for i in &acked {
            let bytes = after.file_bytes(&out.join(format!("r{i}")));
            assert_eq!(
                bytes.as_deref(),
                Some(result(*i).to_json_line().as_slice()),
                "result r{i} acknowledged before the power loss after {freeze:?} syncs ({mode:?}, {crash:?})"
            );
        }
        for path in after.paths() {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.parent() == Some(out.as_path()) && !name.starts_with('.') {
                let i: usize = name[1..].parse().expect("a result name");
                assert_eq!(
                    after.file_bytes(&path).as_deref(),
                    Some(result(i).to_json_line().as_slice()),
                    "{name} is visible but not whole after a power loss ({mode:?}, {crash:?})"
                );
            }
        }
    }

    #[test]
    fn results_survive_power_loss_at_every_sync() {
        for mode in [ResultSync::Syncfs, ResultSync::Fsync] {
            // Count the syncs a full run makes, then cut the power after each of them.
            let disk = SimStorage::new();
            let p = Publisher::new(Arc::new(disk.clone()), Path::new("/spool/out"), mode)
                .expect("publisher");
            for i in 0..4 {
                p.publish(&format!("r{i}"), &result(i)).expect("publish");
            }
            let total = disk.sync_count();
            assert!(
                total >= 8,
                "{mode:?}: two syncs per round at least, got {total}"
            );
            for freeze in 0..=total {
                power_loss_case(mode, 4, Some(freeze), CrashMode::PowerDrop);
                for seed in 0..4 {
                    power_loss_case(mode, 4, Some(freeze), CrashMode::PowerTear { seed });
                }
            }
            power_loss_case(mode, 4, None, CrashMode::PowerDrop);
        }
    }

    /// Five results, `r0`..`r4`, and their lines.
    fn five_results() -> (Vec<String>, Vec<Vec<u8>>) {
        let lines = (0..5).map(|i| result(i).to_json_line()).collect();
        ((0..5).map(|i| format!("r{i}")).collect(), lines)
    }

    /// `publish_many`'s argument over `names` and `lines`.
    fn as_group<'a>(names: &'a [String], lines: &'a [Vec<u8>]) -> Vec<(&'a str, &'a [u8])> {
        names
            .iter()
            .zip(lines)
            .map(|(n, l)| (n.as_str(), l.as_slice()))
            .collect()
    }

    /// Goal: many results given at once are published in one round, and a power loss at
    /// any sync keeps every one of them if the call returned, and shows none partly.
    #[test]
    fn many_results_go_out_in_one_round_and_survive_power_loss_at_every_sync() {
        let out = PathBuf::from("/spool/out");
        let (names, lines) = five_results();
        let many = as_group(&names, &lines);
        for mode in [ResultSync::Syncfs, ResultSync::Fsync] {
            let disk = SimStorage::new();
            let p = Publisher::new(Arc::new(disk.clone()), &out, mode).expect("publisher");
            p.publish_many(&many).expect("publish");
            assert_eq!(p.stats(), (1, 5), "{mode:?}: one round for all");
            let total = disk.sync_count();
            for freeze in 0..=total {
                for crash in [CrashMode::PowerDrop, CrashMode::PowerTear { seed: 3 }] {
                    let disk = SimStorage::new();
                    disk.set_faults(SimFaults {
                        freeze_after_syncs: Some(freeze),
                        ..SimFaults::default()
                    });
                    let p = Publisher::new(Arc::new(disk.clone()), &out, mode).expect("publisher");
                    p.publish_many(&many).expect("publish");
                    let acked = disk.sync_count() <= freeze;
                    let after = disk.crash(crash);
                    let seen: Vec<bool> = names
                        .iter()
                        .zip(&lines)
                        .map(|(n, l)| match after.file_bytes(&out.join(n)) {
                            Some(b) => {
                                assert_eq!(&b, l, "{n} partly there ({mode:?}, {freeze})");
                                true
                            }
                            None => false,
                        })
                        .collect();
                    if acked {
                        assert!(
                            seen.iter().all(|s| *s),
                            "{mode:?}, freeze {freeze}: {seen:?}"
                        );
                    }
                }
            }
        }
    }

    /// Goal: a temporary's sync that fails, on the caller's thread or on any helper, fails
    /// the whole group before any rename: no result of the group is visible in `out/`.
    /// Method: five results under `fsync`; the k-th sync fails, for every k of the five
    /// temporaries' syncs; the live disk (a process crash's view) is read after the error.
    #[test]
    fn a_failed_sync_of_any_temporary_fails_the_group_before_any_rename() {
        let out = PathBuf::from("/spool/out");
        let (names, lines) = five_results();
        let many = as_group(&names, &lines);
        for k in 1..=5 {
            let disk = SimStorage::new();
            let p =
                Publisher::new(Arc::new(disk.clone()), &out, ResultSync::Fsync).expect("publisher");
            let before = disk.sync_count();
            disk.set_faults(SimFaults {
                fail_sync_at: Some(before + k),
                ..SimFaults::default()
            });
            assert!(
                p.publish_many(&many).is_err(),
                "sync {k} failed, yet the group succeeded"
            );
            let live = disk.crash(CrashMode::Process);
            for n in &names {
                assert!(
                    live.file_bytes(&out.join(n)).is_none(),
                    "sync {k} failed, yet {n} is in out/"
                );
            }
        }
    }

    /// The paths of `disk` that are result temporaries in `out`.
    fn temporaries(disk: &SimStorage, out: &Path) -> Vec<PathBuf> {
        disk.paths()
            .into_iter()
            .filter(|p| p.parent() == Some(out))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(is_temporary)
            })
            .collect()
    }

    /// Goal: a prepared group is invisible until published, and one dropped unpublished (its
    /// claims' sync failed, the engine stopped) leaves nothing: no result, no temporary.
    /// Method: five results prepared in each mode; the temporaries exist and no name is in
    /// `out/`; the group dropped; the live disk and the disk after a power loss read.
    #[test]
    fn a_prepared_group_dropped_unpublished_leaves_nothing() {
        let out = PathBuf::from("/spool/out");
        let (names, lines) = five_results();
        let many = as_group(&names, &lines);
        for mode in [ResultSync::Syncfs, ResultSync::Fsync] {
            let disk = SimStorage::new();
            let p = Publisher::new(Arc::new(disk.clone()), &out, mode).expect("publisher");
            let prepared = p.prepare(&many).expect("prepare");
            let given: Vec<&str> = names.iter().map(String::as_str).collect();
            assert!(prepared.holds(&given), "{mode:?}: holds what it was given");
            assert!(!prepared.holds(&given[1..]), "{mode:?}: not a part of it");
            assert_eq!(temporaries(&disk, &out).len(), 5, "{mode:?}: written");
            for n in &names {
                assert!(
                    disk.file_bytes(&out.join(n)).is_none(),
                    "{mode:?}: {n} seen"
                );
            }
            drop(prepared);
            for after in [
                disk.crash(CrashMode::Process),
                disk.crash(CrashMode::PowerDrop),
            ] {
                assert!(temporaries(&after, &out).is_empty(), "{mode:?}: left");
                for n in &names {
                    assert!(after.file_bytes(&out.join(n)).is_none(), "{mode:?}: {n}");
                }
            }
            assert_eq!(p.stats(), (0, 0), "{mode:?}: no round ran");
        }
    }

    /// Goal: prepare then publish (how the pipeline publishes a group's results, the claim's
    /// sync between the two) keeps the durability of `publish_many`: a power loss at any sync
    /// leaves every result whole or absent, all of them once `publish` returned, none before
    /// it was called; and once the publisher is opened again no temporary is left.
    /// Method: five results, power cut after every sync count, a plain and a torn loss.
    #[test]
    fn prepare_then_publish_survives_power_loss_at_every_sync() {
        let out = PathBuf::from("/spool/out");
        let (names, lines) = five_results();
        let many = as_group(&names, &lines);
        for mode in [ResultSync::Syncfs, ResultSync::Fsync] {
            let disk = SimStorage::new();
            let p = Publisher::new(Arc::new(disk.clone()), &out, mode).expect("publisher");
            p.prepare(&many)
                .expect("prepare")
                .publish()
                .expect("publish");
            let total = disk.sync_count();
            for freeze in 0..=total {
                for crash in [CrashMode::PowerDrop, CrashMode::PowerTear { seed: 5 }] {
                    let disk = SimStorage::new();
                    disk.set_faults(SimFaults {
                        freeze_after_syncs: Some(freeze),
                        ..SimFaults::default()
                    });
                    let p = Publisher::new(Arc::new(disk.clone()), &out, mode).expect("publisher");
                    let prepared = p.prepare(&many).expect("prepare");
                    let before_publish = disk.crash(crash);
                    prepared.publish().expect("publish");
                    let acked = disk.sync_count() <= freeze;
                    let after = disk.crash(crash);
                    let whole = |d: &SimStorage| -> Vec<bool> {
                        names
                            .iter()
                            .zip(&lines)
                            .map(|(n, l)| match d.file_bytes(&out.join(n)) {
                                Some(b) => {
                                    assert_eq!(&b, l, "{n} partly there ({mode:?}, {freeze})");
                                    true
                                }
                                None => false,
                            })
                            .collect()
                    };
                    let early = whole(&before_publish);
                    assert!(!early.iter().any(|s| *s), "{mode:?}, {freeze}: {early:?}");
                    let seen = whole(&after);
                    assert!(
                        !acked || seen.iter().all(|s| *s),
                        "{mode:?}, {freeze}: {seen:?}"
                    );
                    for d in [before_publish, after] {
                        Publisher::new(Arc::new(d.clone()), &out, mode).expect("reopen");
                        assert!(temporaries(&d, &out).is_empty(), "{mode:?}, {freeze}");
                    }
                }
            }
        }
    }

    #[test]
    fn temporaries_left_by_a_crash_are_removed_at_open_and_names_may_repeat() {
        let out = PathBuf::from("/spool/out");
        let disk = SimStorage::new();
        disk.put_file_bytes(&out.join(".a.json.7.tmp"), b"{\"half".to_vec());
        disk.put_file_bytes(&out.join("b.json"), result(1).to_json_line());
        disk.put_file_bytes(&out.join(".note"), b"not ours to judge".to_vec());
        let p = Publisher::new(Arc::new(disk.clone()), &out, ResultSync::Fsync).expect("publisher");
        assert!(
            disk.file_bytes(&out.join(".a.json.7.tmp")).is_none(),
            "stale temporary removed"
        );
        assert!(
            disk.file_bytes(&out.join("b.json")).is_some(),
            "results kept"
        );
        assert!(
            disk.file_bytes(&out.join(".note")).is_some(),
            "other dot-files kept"
        );
        // One name published twice in a row (a client reusing a name): the later wins.
        p.publish("a.json", &result(2)).expect("first");
        p.publish("a.json", &result(3)).expect("second");
        assert_eq!(
            disk.file_bytes(&out.join("a.json")),
            Some(result(3).to_json_line())
        );
        let hidden: Vec<_> = disk
            .paths()
            .into_iter()
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().ends_with(".tmp"))
            })
            .collect();
        assert!(hidden.is_empty(), "{hidden:?}");
    }

    #[test]
    fn a_failed_round_latches_and_publishes_nothing() {
        let out = PathBuf::from("/spool/out");
        let disk = SimStorage::new();
        disk.set_faults(SimFaults {
            fail_sync_at: Some(1),
            ..SimFaults::default()
        });
        let p =
            Publisher::new(Arc::new(disk.clone()), &out, ResultSync::Syncfs).expect("publisher");
        let e = p
            .publish("a", &result(0))
            .expect_err("the round's sync fails");
        assert!(
            e.to_string().contains("/spool/out"),
            "names the directory: {e}"
        );
        assert!(disk.file_bytes(&out.join("a")).is_none(), "not visible");
        // The next sync would succeed, but an fsync failure is never retried.
        let e = p.publish("b", &result(1)).expect_err("latched");
        assert!(e.to_string().contains("earlier failure"), "{e}");
        assert!(disk.file_bytes(&out.join("b")).is_none(), "not visible");
        assert_eq!(p.stats(), (0, 0));
    }

    #[test]
    fn concurrent_publishers_share_rounds_on_a_real_disk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).expect("out");
        for mode in [ResultSync::Syncfs, ResultSync::Fsync] {
            let p = Arc::new(
                Publisher::new(roost_storage::RealStorage::shared(), &out, mode)
                    .expect("publisher"),
            );
            let threads: Vec<_> = (0..8)
                .map(|t| {
                    let p = p.clone();
                    std::thread::spawn(move || {
                        for i in 0..25 {
                            let n = t * 100 + i;
                            p.publish(&format!("{mode:?}-{n}"), &result(n))
                                .expect("publish");
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("publisher thread");
            }
            let (rounds, published) = p.stats();
            assert_eq!(published, 200, "{mode:?}");
            assert!((1..=200).contains(&rounds), "{mode:?}: {rounds} rounds");
            for t in 0..8 {
                for i in 0..25 {
                    let n = t * 100 + i;
                    let got = std::fs::read(out.join(format!("{mode:?}-{n}"))).expect("result");
                    assert_eq!(got, result(n).to_json_line(), "{mode:?}-{n}");
                }
            }
        }
        let hidden = std::fs::read_dir(&out)
            .expect("out")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .count();
        assert_eq!(hidden, 0, "no temporaries left behind");
    }
}
