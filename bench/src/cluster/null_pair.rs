//! The replicated durable null (issue 42): what `ack = "standby"` can cost against `ack =
//! "local"` on this machine at best, measured in the same run as roost's cluster. One leader
//! and two followers (threads of this process, TCP on loopback, each with its own log file in
//! its own directory on the benchmark's file system), and closed-loop clients with one
//! request outstanding each. A request is one batch's bytes (1,200 B) appended to the
//! leader's log (a zero-filled file, so a sync writes no metadata) and made durable by a
//! group-committed fdatasync (one standing syncer thread); the bytes are shipped to both
//! followers as soon as they are written (before the leader's sync, as roost ships early), and
//! each follower appends them to its own log, group-commits an fdatasync and sends back its
//! durable end. Under `local` the answer waits for the leader's sync only (the followers
//! still copy everything, as roost's standbys do); under `standby` it also waits until both
//! followers hold the request durably. Nothing else: no parsing, no store, no TLS, no
//! answer file, no election. So `standby / local` here is the physical ratio of this rig
//! (three logs on one device, two cores), the ceiling roost's own ratio is read against.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};

/// One request's bytes: about one batch of 10 creates of ~100 B.
pub const RECORD_BYTES: usize = 1_200;
/// Each log is zero-filled to this size and written round it.
const LOG_BYTES: u64 = 8 << 20;
/// A request waits this long at most: past it the run fails (a lost wake-up must not hang).
const ANSWER_WAIT: Duration = Duration::from_secs(30);
const FOLLOWERS: usize = 2;

/// What the leader and its threads share.
#[derive(Default)]
struct Shared {
    /// Requests written to the leader's log (the last one's number); every condvar below
    /// waits under it, so no signal is missed between a check and a wait.
    written: Mutex<u64>,
    /// Signalled when a request is written: the syncer and the shippers wait on it.
    work: Condvar,
    /// Signalled when `synced` or an ack moves (or a sync failed): the clients wait on it.
    answered: Condvar,
    synced: AtomicU64,
    acked: [AtomicU64; FOLLOWERS],
    /// Bytes written and not yet shipped, per follower, with the last request's number.
    outbox: [Mutex<(Vec<u8>, u64)>; FOLLOWERS],
    /// A sync or a write failed: every request fails at once.
    failed: AtomicBool,
    stop: AtomicBool,
}

impl Shared {
    /// Wakes the clients (after `synced` or an ack moved).
    fn answer(&self) {
        let _g = self.written.lock().unwrap_or_else(|p| p.into_inner());
        self.answered.notify_all();
    }

    /// Wakes everyone (a stop or a failure).
    fn wake_all(&self) {
        let _g = self.written.lock().unwrap_or_else(|p| p.into_inner());
        self.work.notify_all();
        self.answered.notify_all();
    }
}

/// A zero-filled log written round and round.
struct Log {
    file: File,
    at: u64,
}

impl Log {
    fn create(path: &Path) -> anyhow::Result<Log> {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(path)
            .with_context(|| format!("create {}", path.display()))?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..LOG_BYTES >> 20 {
            file.write_all(&zeros)?;
        }
        file.sync_all()?;
        Ok(Log { file, at: 0 })
    }

    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.at + bytes.len() as u64 > LOG_BYTES {
            self.at = 0;
        }
        self.file.write_all_at(bytes, self.at)?;
        self.at += bytes.len() as u64;
        Ok(())
    }
}

/// A running leader, its followers and their threads.
struct Pair {
    shared: Arc<Shared>,
    log: Mutex<Log>,
    sockets: Vec<TcpStream>,
    threads: Vec<JoinHandle<()>>,
}

impl Pair {
    fn start(dir: &Path) -> anyhow::Result<Pair> {
        std::fs::create_dir_all(dir)?;
        let shared = Arc::new(Shared::default());
        let mut threads = Vec::new();
        let mut sockets = Vec::new();
        for f in 0..FOLLOWERS {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let to_follower = TcpStream::connect(listener.local_addr()?)?;
            let (at_follower, _) = listener.accept()?;
            to_follower.set_nodelay(true)?;
            at_follower.set_nodelay(true)?;
            let flog = Log::create(&dir.join(format!("follower-{f}.log")))?;
            threads.extend(follower(flog, at_follower.try_clone()?, shared.clone())?);
            let (sh, out) = (shared.clone(), to_follower.try_clone()?);
            threads.push(std::thread::spawn(move || ship(&sh, f, out)));
            let (sh, back) = (shared.clone(), to_follower.try_clone()?);
            threads.push(std::thread::spawn(move || take_acks(&sh, f, back)));
            sockets.extend([to_follower, at_follower]);
        }
        let log = Log::create(&dir.join("leader.log"))?;
        let file = log.file.try_clone()?;
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || sync_leader(&sh, &file)));
        Ok(Pair {
            shared,
            log: Mutex::new(log),
            sockets,
            threads,
        })
    }

    /// One request: written, shipped, and waited for as `standby` says.
    fn request(&self, bytes: &[u8], standby: bool) -> anyhow::Result<()> {
        let sh = &self.shared;
        let n = {
            let mut w = sh.written.lock().unwrap_or_else(|p| p.into_inner());
            self.log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .append(bytes)?;
            *w += 1;
            for out in &sh.outbox {
                let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
                o.0.extend_from_slice(bytes);
                o.1 = *w;
            }
            sh.work.notify_all();
            *w
        };
        let done = || {
            sh.synced.load(Ordering::Acquire) >= n
                && (!standby || sh.acked.iter().all(|a| a.load(Ordering::Acquire) >= n))
        };
        let deadline = Instant::now() + ANSWER_WAIT;
        let mut g = sh.written.lock().unwrap_or_else(|p| p.into_inner());
        while !done() {
            ensure!(
                !sh.failed.load(Ordering::SeqCst),
                "a sync or a write failed"
            );
            ensure!(
                Instant::now() < deadline,
                "request {n} unanswered after {ANSWER_WAIT:?}"
            );
            g = (sh.answered.wait_timeout(g, Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }
}

impl Drop for Pair {
    /// Every thread told, its socket shut, and joined.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake_all();
        for s in &self.sockets {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The leader's syncer: one fdatasync for every request written since the last.
fn sync_leader(sh: &Shared, file: &File) {
    loop {
        let target = {
            let mut w = sh.written.lock().unwrap_or_else(|p| p.into_inner());
            while *w <= sh.synced.load(Ordering::Acquire) && !sh.stop.load(Ordering::SeqCst) {
                w = (sh.work.wait_timeout(w, Duration::from_millis(50)))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            *w
        };
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        if file.sync_data().is_err() {
            sh.failed.store(true, Ordering::SeqCst);
            return sh.wake_all();
        }
        sh.synced.store(target, Ordering::Release);
        sh.answer();
    }
}

/// Ships what was written to follower `f`: `[last request u64][len u32][bytes]` frames.
fn ship(sh: &Shared, f: usize, mut out: TcpStream) {
    while !sh.stop.load(Ordering::SeqCst) {
        let (bytes, last) = {
            let mut w = sh.written.lock().unwrap_or_else(|p| p.into_inner());
            while sh.outbox[f].lock().map_or(true, |o| o.0.is_empty()) {
                if sh.stop.load(Ordering::SeqCst) {
                    return;
                }
                w = (sh.work.wait_timeout(w, Duration::from_millis(50)))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            drop(w);
            let mut o = sh.outbox[f].lock().unwrap_or_else(|p| p.into_inner());
            (std::mem::take(&mut o.0), o.1)
        };
        let mut frame = Vec::with_capacity(12 + bytes.len());
        frame.extend_from_slice(&last.to_le_bytes());
        frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        frame.extend_from_slice(&bytes);
        if out.write_all(&frame).is_err() {
            return;
        }
    }
}

/// The leader's side of follower `f`'s acknowledgements: its durable end, 8 bytes each.
fn take_acks(sh: &Shared, f: usize, mut back: TcpStream) {
    let mut buf = [0u8; 8];
    while back.read_exact(&mut buf).is_ok() {
        sh.acked[f].store(u64::from_le_bytes(buf), Ordering::Release);
        sh.answer();
    }
}

/// A follower: a reader that appends each frame to its log, and a syncer that group-commits
/// an fdatasync and sends back the last request it covers.
fn follower(log: Log, stream: TcpStream, sh: Arc<Shared>) -> anyhow::Result<[JoinHandle<()>; 2]> {
    let state = Arc::new((Mutex::new((0u64, 0u64)), Condvar::new())); // (written, synced)
    let file = log.file.try_clone()?;
    let (st, mut input) = (state.clone(), stream.try_clone()?);
    let reader = std::thread::spawn(move || {
        let mut log = log;
        let mut head = [0u8; 12];
        let mut body = Vec::new();
        while input.read_exact(&mut head).is_ok() {
            let last = u64::from_le_bytes(head[..8].try_into().unwrap_or([0; 8]));
            let len = u32::from_le_bytes(head[8..].try_into().unwrap_or([0; 4])) as usize;
            body.resize(len, 0);
            if input.read_exact(&mut body).is_err() || log.append(&body).is_err() {
                break;
            }
            st.0.lock().unwrap_or_else(|p| p.into_inner()).0 = last;
            st.1.notify_all();
        }
    });
    let mut output = stream;
    let syncer = std::thread::spawn(move || loop {
        let target = {
            let mut g = state.0.lock().unwrap_or_else(|p| p.into_inner());
            while g.0 <= g.1 && !sh.stop.load(Ordering::SeqCst) {
                g = (state.1.wait_timeout(g, Duration::from_millis(50)))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            g.0
        };
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        if file.sync_data().is_err() {
            sh.failed.store(true, Ordering::SeqCst);
            return sh.wake_all();
        }
        state.0.lock().unwrap_or_else(|p| p.into_inner()).1 = target;
        if output.write_all(&target.to_le_bytes()).is_err() {
            return;
        }
    });
    Ok([reader, syncer])
}

/// `clients` closed-loop clients for `cell` against a fresh pair in `dir`, answers waiting
/// as `standby` says. Returns requests per second.
pub fn closed_loop(
    dir: &Path,
    clients: usize,
    cell: Duration,
    standby: bool,
) -> anyhow::Result<f64> {
    let pair = Arc::new(Pair::start(dir)?);
    let start = Instant::now();
    let mut handles = Vec::new();
    for c in 0..clients {
        let p = pair.clone();
        handles.push(std::thread::spawn(move || -> anyhow::Result<u64> {
            let bytes = vec![b'a' + (c % 26) as u8; RECORD_BYTES];
            let mut n = 0u64;
            while start.elapsed() < cell {
                p.request(&bytes, standby)?;
                n += 1;
            }
            Ok(n)
        }));
    }
    let mut total = 0u64;
    for h in handles {
        total += h
            .join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
    }
    let rate = total as f64 / start.elapsed().as_secs_f64();
    drop(pair); // the last reference: its threads stop (`Drop`)
    let _ = std::fs::remove_dir_all(dir);
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under `standby` an answer comes only once both followers acknowledged it: the acks
    /// seen at the end cover every request answered.
    #[test]
    fn standby_answers_wait_for_both_followers() {
        let dir = std::env::temp_dir().join(format!("null-pair-{}", std::process::id()));
        let pair = Pair::start(&dir).expect("start");
        for _ in 0..20 {
            pair.request(&[1u8; 100], true).expect("request");
            let n = *pair.shared.written.lock().expect("lock");
            for a in &pair.shared.acked {
                assert!(
                    a.load(Ordering::Acquire) >= n,
                    "answered before a follower held it"
                );
            }
            assert!(pair.shared.synced.load(Ordering::Acquire) >= n);
        }
        drop(pair);
        let rate = closed_loop(&dir, 2, Duration::from_millis(200), true).expect("run");
        assert!(rate > 0.0);
    }
}
