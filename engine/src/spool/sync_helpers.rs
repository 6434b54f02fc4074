//! Standing helper threads that sync a group's result temporaries beside its worker
//! (`publish.rs`): fdatasyncs that wait together share the file system's journal commit and
//! the device's cache flush, where one after another each pays its own (issue 30). The
//! threads are started as they are first needed, never more than [`SYNC_THREADS`] for the
//! whole daemon, and kept until the publisher goes: a thread started and joined per group
//! put the start on the client's wait (at 4 clients, one start per five batches). A leaf:
//! it knows files, not the publisher.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use roost_storage::{lock, StorageFile};

/// Helper threads for the whole daemon, at most.
pub(crate) const SYNC_THREADS: usize = 16;

/// A file to sync, shared with the helper that syncs it.
pub(crate) type SyncFile = Arc<dyn StorageFile>;

/// A share of files to sync, and where its outcome goes.
type Job = (Vec<SyncFile>, SyncSender<io::Result<()>>);

/// The helpers: lent to one caller at a time each, started on demand, joined at drop.
pub(crate) struct SyncHelpers {
    /// Helpers lent out now, across all callers.
    lent: AtomicUsize,
    /// The queue every helper takes from (`None` once dropping; a `Sender` is shared
    /// without a lock, and `Drop` has `&mut`).
    jobs: Option<Sender<Job>>,
    queue: Arc<Mutex<Receiver<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl SyncHelpers {
    pub fn new() -> SyncHelpers {
        let (tx, rx) = mpsc::channel();
        SyncHelpers {
            lent: AtomicUsize::new(0),
            jobs: Some(tx),
            queue: Arc::new(Mutex::new(rx)),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Every file's data synced, in shares: the first on this thread, one on each helper it
    /// could borrow (none when all are lent: this thread syncs them all). Every share is
    /// answered before an error is returned, so no sync outlives the call.
    pub fn sync(&self, files: &[SyncFile]) -> io::Result<()> {
        let borrowed = Borrowed {
            n: take(&self.lent, files.len().saturating_sub(1)),
            lent: &self.lent,
        };
        if borrowed.n == 0 || !self.start_threads() {
            return sync_all(files);
        }
        let mut shares = files.chunks(files.len().div_ceil(borrowed.n + 1));
        let mine = shares.next().unwrap_or(&[]);
        let mut answers = Vec::new();
        let mut result = Ok(());
        for share in shares {
            match self.hand(share.to_vec()) {
                Some(rx) => answers.push(rx),
                None => result = result.and(sync_all(share)),
            }
        }
        result = result.and(sync_all(mine));
        for rx in answers {
            let r = rx.recv();
            result =
                result.and(r.unwrap_or_else(|_| Err(io::Error::other("a sync helper is gone"))));
        }
        result
    }

    /// Starts threads until there is one per helper lent (at most [`SYNC_THREADS`]), so a
    /// share handed out finds one free. False when there is none at all: the caller then
    /// syncs everything itself.
    fn start_threads(&self) -> bool {
        let mut threads = lock(&self.threads);
        let want = self.lent.load(Ordering::SeqCst).min(SYNC_THREADS);
        while threads.len() < want {
            let queue = self.queue.clone();
            match std::thread::Builder::new()
                .name("roost-sync".into())
                .spawn(move || work(&queue))
            {
                Ok(t) => threads.push(t),
                Err(_) => break,
            }
        }
        !threads.is_empty()
    }

    /// Queues `share` for a helper; `None` when the queue is closed.
    fn hand(&self, share: Vec<SyncFile>) -> Option<Receiver<io::Result<()>>> {
        let (reply, rx) = mpsc::sync_channel(1);
        self.jobs.as_ref()?.send((share, reply)).ok()?;
        Some(rx)
    }

    /// Helper threads started so far.
    #[cfg(test)]
    fn started(&self) -> usize {
        lock(&self.threads).len()
    }
}

impl Default for SyncHelpers {
    fn default() -> Self {
        SyncHelpers::new()
    }
}

impl Drop for SyncHelpers {
    fn drop(&mut self) {
        self.jobs.take();
        for t in std::mem::take(&mut *lock(&self.threads)) {
            let _ = t.join();
        }
    }
}

/// A helper thread: takes shares until the queue closes. Its files are let go before the
/// answer (the caller renames or removes them next), and a panic in a sync is an answer
/// too: the thread stays, so a share queued later always finds one.
fn work(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = lock(queue).recv();
        let Ok((files, reply)) = job else { return };
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sync_all(&files)))
            .unwrap_or_else(|_| Err(io::Error::other("a result sync panicked")));
        drop(files);
        let _ = reply.send(r);
    }
}

fn sync_all(files: &[SyncFile]) -> io::Result<()> {
    files.iter().try_for_each(|f| f.sync_data())
}

/// Up to `want` helpers, taken from `lent` (none when all are lent).
fn take(lent: &AtomicUsize, want: usize) -> usize {
    let mut got = 0;
    let _ = lent.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
        got = want.min(SYNC_THREADS.saturating_sub(n));
        Some(n + got)
    });
    got
}

/// Helpers borrowed by one caller, given back when dropped (a panic too).
struct Borrowed<'a> {
    n: usize,
    lent: &'a AtomicUsize,
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        self.lent.fetch_sub(self.n, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roost_storage::{OpenMode, SimStorage, Storage};
    use std::path::Path;

    /// The helpers are bounded for the whole daemon, however many groups publish at once:
    /// a caller gets what is left, none when all are taken, and they come back.
    #[test]
    fn sync_helper_threads_are_bounded_across_callers() {
        let lent = AtomicUsize::new(0);
        assert_eq!(take(&lent, 10), 10);
        assert_eq!(take(&lent, 10), SYNC_THREADS - 10);
        assert_eq!(take(&lent, 10), 0);
        assert_eq!(lent.load(Ordering::SeqCst), SYNC_THREADS);
        lent.fetch_sub(10, Ordering::SeqCst);
        assert_eq!(take(&lent, 3), 3);
    }

    fn files(disk: &SimStorage, group: usize, n: usize) -> Vec<SyncFile> {
        (0..n)
            .map(|i| {
                let p = Path::new("/out").join(format!("g{group}-f{i}"));
                let f = disk.open(&p, OpenMode::CreateNew).expect("open");
                f.write_at(b"result", 0).expect("write");
                Arc::from(f)
            })
            .collect()
    }

    /// Goal: the helpers stand; groups one after another reuse them rather than start
    /// threads of their own, and every file of every group is synced.
    #[test]
    fn helpers_are_started_once_and_kept_across_groups() {
        let disk = SimStorage::new();
        let h = SyncHelpers::new();
        for g in 0..20 {
            let fs = files(&disk, g, 4);
            let before = disk.sync_count();
            h.sync(&fs).expect("sync");
            assert_eq!(disk.sync_count() - before, 4, "one sync per file");
        }
        assert_eq!(
            h.started(),
            3,
            "three helpers for shares of four files, kept"
        );
        assert_eq!(h.lent.load(Ordering::SeqCst), 0, "every helper given back");
    }
}
