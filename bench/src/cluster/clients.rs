//! The cluster benchmark's stream and bulk clients (issue 42): closed-loop connections to a
//! node's stream socket, each with one batch outstanding, and one bulk file timed until its
//! answers file appears. Every answer is checked (committed, one per batch line); nothing
//! here decides which node is measured or prints anything.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context};

use crate::spool::{body, Workload};

/// How long one answer may take, and a bulk file's answers: past it the run fails (a
/// forward the leader never answers must not hang the benchmark).
const ANSWER_WAIT: Duration = Duration::from_secs(120);
/// Batches one stream connection sends at most in a cell, whatever the cell's length: a bound
/// on the loop that a machine faster than any seen (10^5 batches/s per connection for 10 s)
/// does not reach.
const STREAM_BATCHES_MAX: usize = 1_000_000;

/// Distinct request keys across the cells of one process (a key answered before would be
/// answered from the window, not committed again).
static CELL: AtomicUsize = AtomicUsize::new(0);

/// A cell's key prefix: the process id and its start time beside the cell's number, so that
/// a later run against the same daemon (`--stream-load`) sends new keys too, not keys its
/// window answers from the key table.
fn cell_id() -> String {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let run = RUN.get_or_init(|| {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!("{}p{ms}", std::process::id())
    });
    format!("{run}c{}", CELL.fetch_add(1, Ordering::Relaxed))
}

/// `clients` connections to `socket`, each sending one batch and reading its answer before
/// the next, for `dur`. Returns batches per second over all connections.
pub fn stream_closed_loop(
    socket: &Path,
    clients: usize,
    dur: Duration,
    w: &Workload,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    let n = stream_closed_loop_count(socket, clients, dur, w)?;
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// [`stream_closed_loop`], returning how many batches were answered.
pub fn stream_closed_loop_count(
    socket: &Path,
    clients: usize,
    dur: Duration,
    w: &Workload,
) -> anyhow::Result<usize> {
    let cell = &cell_id();
    let counts = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| s.spawn(move || stream_client(socket, &format!("sl{cell}-{c}"), dur, w)))
            .collect();
        let mut counts = Vec::with_capacity(clients);
        for h in handles {
            counts.push(
                h.join()
                    .map_err(|_| anyhow!("a stream client thread panicked"))??,
            );
        }
        Ok::<_, anyhow::Error>(counts)
    })?;
    Ok(counts.iter().sum())
}

/// One connection's closed loop: batches `{tag}-{i}` one at a time until `dur` has passed;
/// how many were answered.
fn stream_client(socket: &Path, tag: &str, dur: Duration, w: &Workload) -> anyhow::Result<usize> {
    let start = Instant::now();
    let first = format!("{tag}-0");
    let (mut tx, mut rx, answer) = admitted(socket, &first, w)?;
    check_answer(&answer, &first)?;
    let mut answer = String::new();
    let mut sent = 1;
    while sent < STREAM_BATCHES_MAX && start.elapsed() < dur {
        let key = format!("{tag}-{sent}");
        let got = send_and_read(&mut tx, &mut rx, &key, w, &mut answer)
            .with_context(|| format!("the answer to {key} from {}", socket.display()))?;
        ensure!(
            got > 0,
            "{} closed before answering {key}",
            socket.display()
        );
        check_answer(&answer, &key)?;
        sent += 1;
    }
    Ok(sent)
}

/// A connection the server took, with the answer to `key`, its first batch. A server at
/// `stream_connections_max` answers a new connection "unavailable ... try again later" and
/// closes it; the previous cell's connections may not be closed on its side yet, so that
/// answer (or the closed socket it leaves, if the batch's line was sent after the close) is
/// met by connecting again (a client's documented retry; the batch was never read), for at
/// most about 5 s.
fn admitted(
    socket: &Path,
    key: &str,
    w: &Workload,
) -> anyhow::Result<(UnixStream, BufReader<UnixStream>, String)> {
    let mut answer = String::new();
    let mut last = String::new();
    for _ in 0..250 {
        let stream = connect(socket)?;
        stream.set_read_timeout(Some(ANSWER_WAIT))?;
        let mut tx = stream.try_clone().context("clone the stream socket")?;
        let mut rx = BufReader::new(stream);
        match send_and_read(&mut tx, &mut rx, key, w, &mut answer) {
            Ok(n) if n > 0 && !answer.contains("stream_connections_max") => {
                return Ok((tx, rx, answer))
            }
            Ok(0) => last = "the socket closed before an answer".into(),
            Ok(_) => last.clone_from(&answer),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(anyhow!(
        "the answer to {key} from {}: refused 250 times; the last: {last}",
        socket.display()
    ))
}

/// Sends batch `key` as one line and reads one answer line into `answer` (its length).
fn send_and_read(
    tx: &mut UnixStream,
    rx: &mut BufReader<UnixStream>,
    key: &str,
    w: &Workload,
    answer: &mut String,
) -> std::io::Result<usize> {
    let mut line = body(key, w);
    line.push(b'\n');
    tx.write_all(&line)?;
    answer.clear();
    rx.read_line(answer)
}

/// The stream socket is bound a moment after the node says ready: a few tries.
fn connect(socket: &Path) -> anyhow::Result<UnixStream> {
    let mut last = None;
    for _ in 0..500 {
        match UnixStream::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let e = last.map_or_else(|| anyhow!("no attempt"), anyhow::Error::from);
    Err(e.context(format!("connect to {}", socket.display())))
}

/// One answer line: committed, for `key` when the answer names its key.
fn check_answer(line: &str, key: &str) -> anyhow::Result<()> {
    let v: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("the answer to {key}: {line}"))?;
    ensure!(v["status"] == "committed", "the answer to {key}: {line}");
    let named = v["request_key"].as_str();
    ensure!(
        named.is_none_or(|k| k == key),
        "the answer to {key} names another key: {line}"
    );
    Ok(())
}

/// One bulk file of `lines` batches dropped into `spool` (written to `tmp/`, renamed into
/// `new/`); lines per second from the rename until `out/NAME` exists, then every answer line
/// checked.
pub fn bulk_file(spool: &Path, lines: usize, w: &Workload) -> anyhow::Result<f64> {
    let cell = cell_id();
    let name = format!("bulk{cell}.jsonl");
    let keys: Vec<String> = (0..lines).map(|i| format!("bulk{cell}-{i}")).collect();
    let text: Vec<Vec<u8>> = keys.iter().map(|k| body(k, w)).collect();
    let tmp = spool.join("tmp").join(&name);
    std::fs::write(&tmp, text.join(&b'\n')).with_context(|| format!("write {}", tmp.display()))?;
    let out = spool.join("out").join(&name);
    let start = Instant::now();
    std::fs::rename(&tmp, spool.join("new").join(&name))
        .with_context(|| format!("rename {} into new/", tmp.display()))?;
    while !out.exists() {
        ensure!(
            start.elapsed() < ANSWER_WAIT,
            "{}: no answers after {ANSWER_WAIT:?}",
            out.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let rate = lines as f64 / start.elapsed().as_secs_f64();
    check_bulk(&out, &keys)?;
    let _ = std::fs::remove_file(&out);
    Ok(rate)
}

/// A bulk answers file: one committed answer per line, in line order.
fn check_bulk(out: &Path, keys: &[String]) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(out).with_context(|| format!("read {}", out.display()))?;
    let got: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    ensure!(
        got.len() == keys.len(),
        "{}: {} answer lines for {} batch lines",
        out.display(),
        got.len(),
        keys.len()
    );
    for (line, key) in got.iter().zip(keys) {
        check_answer(line, key).with_context(|| format!("{}", out.display()))?;
    }
    Ok(())
}
