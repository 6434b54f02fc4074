//! The cluster drill's probe (issue 42, "Measure what a client waits"): a client thread
//! started at each strike on the leader (with `--rolling`, at each graceful stop of a node,
//! leader or not). One batch at a time, it sends a batch of creates over the stream socket
//! of a node other than the struck one, the two in turn, each try
//! bounded (`TRY_LIMIT` to connect, to write, to read the answer) and at most one try per
//! `PACE`. As `roost submit --stream` tells a client, a batch answered `unavailable` or not
//! answered at all is sent again under its key (to the other node); a new batch follows
//! each result. It measures what a client waits: from the strike to the first `committed`
//! answer, and the longest stretch without one, from the strike until the drill says the
//! struck node is back and `TAIL` more.
//!
//! It judges nothing. Every batch it sent goes back to the drill: the answered ones are
//! acknowledged and checked at the end like every streamed batch, the others sent again
//! until they are answered. Every loop is bounded in tries and in time. `summary` prints
//! the figures per strike kind, `rolling_line` the rolling restart's longest stretch.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::batches::Batches;
use crate::batch::BatchResult;

/// A try's bound: to connect, to write the batch, to read its answer.
const TRY_LIMIT: Duration = Duration::from_secs(2);
/// At most one try per this long (a node that refuses at once is not hammered).
const PACE: Duration = Duration::from_millis(20);
/// How long the probe goes on once the struck node is back.
const TAIL: Duration = Duration::from_secs(1);
/// The probe's bounds whatever the drill does: time from the strike, and tries.
const PROBE_LIMIT: Duration = Duration::from_secs(120);
const TRIES_MAX: usize = 6000;
/// An answer line longer than this is not an answer.
const ANSWER_BYTES_MAX: u64 = 1 << 20;

/// Where and when a probe runs.
pub(super) struct Plan {
    /// The strike's instant: every figure is measured from it.
    pub t0: Instant,
    /// Names the batches' keys (`p{round}-{n}`), unique over the drill.
    pub round: usize,
    /// The two nodes other than the struck one: name and stream socket.
    pub to: Vec<(&'static str, PathBuf)>,
    /// The probe's own batches (its own random source; `live` empty: creates only).
    pub batches: Batches,
    /// How long the first committed answer may take before the probe gives up.
    pub first_limit: Duration,
}

/// A running probe. Dropping it without `finish` leaves the thread to its own bounds.
pub(super) struct Probe {
    /// Set once by the drill when the struck node is back; the probe stops `TAIL` later.
    back: Arc<OnceLock<Instant>>,
    thread: JoinHandle<Outcome>,
}

/// Tries and their outcomes, for the report.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Counts {
    pub tries: usize,
    pub committed: usize,
    /// Results other than `committed` (none expected: the batches are creates only).
    pub other: usize,
    pub unavailable: usize,
    /// Sent, and no answer within `TRY_LIMIT` (or the connection closed first).
    pub no_answer: usize,
    /// No connection within `TRY_LIMIT` (the batch was not sent).
    pub not_connected: usize,
}

/// What a probe saw, and every batch it sent.
#[derive(Default)]
pub(super) struct Outcome {
    /// From the strike to the first `committed` answer, and the node that gave it; `None`
    /// if none came within the plan's `first_limit`.
    pub first_commit: Option<(Duration, &'static str)>,
    /// The longest stretch without a `committed` answer, from the strike to the probe's end.
    pub longest_gap: Duration,
    /// Batches with a result: key, body, result.
    pub answered: Vec<(String, Vec<u8>, BatchResult)>,
    /// Batches sent without a result (`unavailable`, or no answer): key, body.
    pub unanswered: Vec<(String, Vec<u8>)>,
    pub counts: Counts,
}

/// One try's outcome.
enum Try {
    Answer(BatchResult),
    Unavailable,
    NoAnswer,
    NotConnected,
}

impl Probe {
    pub fn start(plan: Plan) -> anyhow::Result<Probe> {
        let back: Arc<OnceLock<Instant>> = Arc::default();
        let seen = back.clone();
        let thread = std::thread::Builder::new()
            .name("drill-probe".into())
            .spawn(move || run(plan, &seen))
            .context("starting the drill's probe thread")?;
        Ok(Probe { back, thread })
    }

    /// The struck node is back: the probe stops `TAIL` from now (once it has had its first
    /// committed answer, or given up on it).
    pub fn struck_node_back(&self) {
        let _ = self.back.set(Instant::now());
    }

    /// Waits for the probe to end (within its bounds) and returns what it saw.
    pub fn finish(self) -> anyhow::Result<Outcome> {
        let _ = self.back.set(Instant::now());
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the drill's probe thread panicked"))
    }
}

/// The probe's loop: a try per `PACE` at most, until `done`.
fn run(mut plan: Plan, back: &OnceLock<Instant>) -> Outcome {
    let mut o = Outcome::default();
    let mut last_commit = plan.t0;
    let mut batch: Option<(String, Vec<u8>)> = None;
    for n in 0..TRIES_MAX {
        let started = Instant::now();
        if done(&plan, o.first_commit.is_some(), back.get(), started) {
            break;
        }
        let (key, body) = match batch.take() {
            Some(b) => b,
            None => match plan.batches.fresh_creates(&format!("p{}-{n}", plan.round)) {
                Ok(b) => b,
                Err(_) => break,
            },
        };
        let (name, sock) = &plan.to[n % plan.to.len()];
        o.counts.tries += 1;
        match try_one(sock, &body) {
            Try::Answer(r) => {
                let now = Instant::now();
                if matches!(r, BatchResult::Committed { .. }) {
                    o.counts.committed += 1;
                    o.longest_gap = o.longest_gap.max(now - last_commit);
                    last_commit = now;
                    o.first_commit = o.first_commit.or(Some((now - plan.t0, *name)));
                } else {
                    o.counts.other += 1;
                }
                o.answered.push((key, body, r));
            }
            Try::Unavailable => {
                o.counts.unavailable += 1;
                batch = Some((key, body));
            }
            Try::NoAnswer => {
                o.counts.no_answer += 1;
                batch = Some((key, body));
            }
            Try::NotConnected => {
                o.counts.not_connected += 1;
                batch = Some((key, body));
            }
        }
        std::thread::sleep(PACE.saturating_sub(started.elapsed()));
    }
    o.longest_gap = o.longest_gap.max(last_commit.elapsed());
    // The batch in hand was sent (unless its last try did not connect): the drill sends it
    // again until it is answered.
    o.unanswered.extend(batch);
    o
}

/// Whether the probe stops at `now`: past its own bound; without a committed answer past
/// the plan's limit for one; or with one, `TAIL` after the struck node came back.
fn done(plan: &Plan, committed: bool, back: Option<&Instant>, now: Instant) -> bool {
    let since = now - plan.t0;
    if since >= PROBE_LIMIT {
        return true;
    }
    if !committed {
        return since >= plan.first_limit;
    }
    back.is_some_and(|b| now >= *b + TAIL)
}

/// Sends `body` on a new connection to `sock` and reads its answer, each step bounded.
fn try_one(sock: &Path, body: &[u8]) -> Try {
    let Ok(mut s) = connect(sock) else {
        return Try::NotConnected;
    };
    let sent = s
        .write_all(body)
        .and_then(|()| s.write_all(b"\n"))
        .and_then(|()| s.shutdown(std::net::Shutdown::Write));
    if sent.is_err() {
        return Try::NoAnswer;
    }
    let mut line = String::new();
    match BufReader::new(s.take(ANSWER_BYTES_MAX)).read_line(&mut line) {
        Ok(n) if n > 0 && line.ends_with('\n') => {}
        _ => return Try::NoAnswer,
    }
    // As the drill's other stream clients read it: a line that is no result is `unavailable`.
    match serde_json::from_str::<BatchResult>(&line) {
        Ok(r) => Try::Answer(r),
        Err(_) => Try::Unavailable,
    }
}

/// A connection to the Unix socket `sock`, with `TRY_LIMIT` as its send and receive
/// timeouts. The send timeout is set before the connect because a blocking connect to a
/// Unix socket whose listener's backlog is full waits that long (a node that does not
/// accept must not hold the probe).
fn connect(sock: &Path) -> std::io::Result<UnixStream> {
    use rustix::net::sockopt::{set_socket_timeout, Timeout};
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    set_socket_timeout(&fd, Timeout::Send, Some(TRY_LIMIT))?;
    set_socket_timeout(&fd, Timeout::Recv, Some(TRY_LIMIT))?;
    rustix::net::connect(&fd, &SocketAddrUnix::new(sock)?)?;
    Ok(UnixStream::from(fd))
}

impl Outcome {
    /// The probe's line in the drill's log.
    pub fn describe(&self, round: usize) -> String {
        let c = &self.counts;
        let first = match self.first_commit {
            Some((d, name)) => format!(
                "first committed answer after {} ms (from {name})",
                d.as_millis()
            ),
            None => "NO committed answer".into(),
        };
        format!(
            "round {round}: probe: {first}, longest stretch without one {} ms; {} tries: {} committed, {} other results, {} unavailable, {} without an answer, {} not connected",
            self.longest_gap.as_millis(),
            c.tries,
            c.committed,
            c.other,
            c.unavailable,
            c.no_answer,
            c.not_connected
        )
    }
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        self.tries += o.tries;
        self.committed += o.committed;
        self.other += o.other;
        self.unavailable += o.unavailable;
        self.no_answer += o.no_answer;
        self.not_connected += o.not_connected;
    }
}

/// What one strike cost a client.
pub(super) struct Waited {
    /// The strike's kind (`Kill`, `Pause`, `Cut`, `Term`).
    pub kind: &'static str,
    /// From the strike to another node saying it leads in `status`; `None` when the struck
    /// node did not lead (a rolling restart's stop of a standby: no election).
    pub new_leader: Option<Duration>,
    /// From the strike to the probe's first committed answer, if it had one.
    pub first_commit: Option<Duration>,
    /// The probe's longest stretch without a committed answer.
    pub longest_gap: Duration,
}

/// The report's lines on what a client waits: a line per kind in `kinds` and one for all.
pub(super) fn summary(waits: &[Waited], kinds: &[&str], totals: &Counts) -> String {
    let mut text = String::from(
        "  what a client waits per strike kind (ms, p50 / p99 / max; the probe's first committed answer: strikes with one of all):\n",
    );
    for k in kinds {
        let of_kind: Vec<&Waited> = waits.iter().filter(|w| w.kind == *k).collect();
        text += &kind_line(k, &of_kind);
    }
    text += &kind_line("all", &waits.iter().collect::<Vec<_>>());
    text += &format!(
        "  probe: {} tries, {} committed, {} other results, {} unavailable, {} without an answer, {} not connected\n",
        totals.tries,
        totals.committed,
        totals.other,
        totals.unavailable,
        totals.no_answer,
        totals.not_connected
    );
    text
}

/// `    KIND: N strikes; new leader in status A / B / C; first committed answer ... (n of N);
/// longest stretch without one ...`. The new leader's figures are over the strikes on a
/// leader; when some struck a standby, `(n of N on a leader)` follows them.
fn kind_line(kind: &str, ws: &[&Waited]) -> String {
    if ws.is_empty() {
        return format!("    {kind}: 0 strikes\n");
    }
    let firsts: Vec<Duration> = ws.iter().filter_map(|w| w.first_commit).collect();
    let leaders: Vec<Duration> = ws.iter().filter_map(|w| w.new_leader).collect();
    let on_leader = match leaders.len() == ws.len() {
        true => String::new(),
        false => format!(" ({} of {} on a leader)", leaders.len(), ws.len()),
    };
    format!(
        "    {kind}: {} strikes; new leader in status {}{on_leader}; first committed answer {} ({} of {}); longest stretch without one {}\n",
        ws.len(),
        spread(leaders),
        spread(firsts.clone()),
        firsts.len(),
        ws.len(),
        spread(ws.iter().map(|w| w.longest_gap).collect())
    )
}

/// The rolling restart's line (`--rolling`): the longest stretch without a committed answer
/// over its strikes of `kind` (0 without any).
pub(super) fn rolling_line(waits: &[Waited], kind: &str, over: &str) -> String {
    let longest = waits
        .iter()
        .filter(|w| w.kind == kind)
        .map(|w| w.longest_gap)
        .max()
        .unwrap_or_default();
    format!(
        "  longest stretch without a committed answer over {over}: {} ms\n",
        longest.as_millis()
    )
}

/// `p50 / p99 / max` in ms (nearest rank, as the report's other figures), or `-` if empty.
fn spread(mut ds: Vec<Duration>) -> String {
    ds.sort_unstable();
    let q = |p: f64| {
        let i = ((ds.len() as f64 - 1.0) * p).round() as usize;
        ds.get(i).map_or(0, Duration::as_millis)
    };
    match ds.last() {
        None => "-".into(),
        Some(max) => format!("{} / {} / {}", q(0.5), q(0.99), max.as_millis()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{rolling_line, summary, Counts, Waited};

    fn w(kind: &'static str, leader: u64, first: Option<u64>, gap: u64) -> Waited {
        Waited {
            kind,
            new_leader: (leader > 0).then(|| Duration::from_millis(leader)),
            first_commit: first.map(Duration::from_millis),
            longest_gap: Duration::from_millis(gap),
        }
    }

    #[test]
    fn summary_counts_strikes_without_a_committed_answer() {
        let waits = [
            w("Kill", 1200, Some(1300), 1400),
            w("Kill", 1000, None, 60000),
            w("Cut", 900, Some(950), 990),
        ];
        let text = summary(&waits, &["Kill", "Pause", "Cut"], &Counts::default());
        assert!(
            text.contains("    Kill: 2 strikes; new leader in status 1200 / 1200 / 1200; first committed answer 1300 / 1300 / 1300 (1 of 2); longest stretch without one 60000 / 60000 / 60000\n"),
            "{text}"
        );
        assert!(text.contains("    Pause: 0 strikes\n"), "{text}");
        assert!(
            text.contains("    all: 3 strikes; new leader in status 1000 / 1200 / 1200; first committed answer 1300 / 1300 / 1300 (2 of 3);"),
            "{text}"
        );
    }

    /// Goal: a rolling restart's stops of a standby elect nobody, and its summary says so
    /// instead of counting them as instant elections; the rolling line is the longest
    /// stretch of its own kind only.
    #[test]
    fn a_stop_of_a_standby_has_no_new_leader_and_the_rolling_line_takes_the_longest() {
        let waits = [
            w("Term", 1500, Some(1600), 1700),
            w("Term", 0, Some(40), 2100),
            w("Term", 0, Some(30), 90),
            w("Kill", 1000, Some(1100), 9000),
        ];
        let text = summary(&waits, &["Kill", "Term"], &Counts::default());
        assert!(
            text.contains("    Term: 3 strikes; new leader in status 1500 / 1500 / 1500 (1 of 3 on a leader); first committed answer 40 / 1600 / 1600 (3 of 3); longest stretch without one 1700 / 2100 / 2100\n"),
            "{text}"
        );
        assert!(
            text.contains("    Kill: 1 strikes; new leader in status 1000 / 1000 / 1000; first"),
            "{text}"
        );
        assert_eq!(
            rolling_line(&waits, "Term", "the rolling restart"),
            "  longest stretch without a committed answer over the rolling restart: 2100 ms\n"
        );
        assert_eq!(
            rolling_line(&[], "Term", "the rolling restart"),
            "  longest stretch without a committed answer over the rolling restart: 0 ms\n"
        );
    }
}
