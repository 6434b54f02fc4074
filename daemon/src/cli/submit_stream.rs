//! `roost submit --stream`: the stream socket's client (the protocol is `intake/stream_protocol.rs`). A
//! sender thread reads batch lines from stdin and writes them to the socket, at most
//! [`WINDOW`] unanswered at once (never one round trip per batch); this thread reads the
//! answers, checks each belongs to its request (answers come in request order), prints it,
//! and keeps the worst status for the exit code: 2 (an invalid line, a timeout, a wrong
//! answer) over 75 (a batch not taken now) over 1 (rejected, conflict) over 0.

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::Duration;

use anyhow::Context;

use crate::config::Config;
use crate::error::{CommandError, EXIT_FAILED, EXIT_INVALID, EXIT_OK, EXIT_UNAVAILABLE};
use crate::intake::stream_protocol::ANSWER_BYTES_MAX;

/// Requests sent and not yet answered, at most (the daemon bounds its own side too:
/// `stream_in_flight_max`).
const WINDOW: usize = 256;

pub(super) fn submit_stream(
    cfg: &Config,
    socket: Option<&Path>,
    timeout: Duration,
) -> anyhow::Result<i32> {
    let path = socket.map_or_else(
        || crate::intake::stream_protocol::socket_path(cfg),
        Path::to_path_buf,
    );
    let sock = UnixStream::connect(&path).map_err(|e| {
        CommandError::usage(format!(
            "cannot connect to the stream socket {}: {e} (is `roost serve` running on this data directory?)",
            path.display()
        ))
    })?;
    sock.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
        .context("setting the stream socket's read timeout")?;
    let w = sock.try_clone().context("cloning the stream socket")?;
    let (keys_tx, keys_rx) = std::sync::mpsc::sync_channel(WINDOW);
    let sender = std::thread::spawn(move || send_lines(std::io::stdin(), &w, &keys_tx));
    let end = read_answers(&sock, &keys_rx)?;
    drop(keys_rx);
    let code = match end {
        End::Done(code) => match sender.join() {
            Ok(Ok(_)) => code,
            Ok(Err(e)) => return Err(e.context(CommandError::usage("submit --stream failed"))),
            Err(_) => anyhow::bail!("the stream sender thread panicked"),
        },
        // The sender may be blocked reading stdin: it is not waited for.
        End::Closed { code, unanswered } => {
            note(&format!("the daemon closed the stream with {unanswered} batches sent and unanswered; send them (and the rest of the input) again under the same keys"));
            worse(code, EXIT_UNAVAILABLE)
        }
        End::TimedOut { code, unanswered } => {
            note(&format!(
                "no answer within {} s; {unanswered} batches sent and unanswered",
                timeout.as_secs()
            ));
            worse(code, EXIT_INVALID)
        }
    };
    let _ = sock.shutdown(std::net::Shutdown::Both);
    Ok(code)
}

/// A line on stderr (a failed write to stderr is no failure of the command).
fn note(text: &str) {
    let _ = writeln!(std::io::stderr(), "roost: {text}");
}

/// How the answers ended, with the worst exit code of those read.
enum End {
    /// Every request sent was answered and the input ended.
    Done(i32),
    /// The daemon closed the connection (it stopped, or refused it).
    Closed { code: i32, unanswered: usize },
    /// No answer within the timeout.
    TimedOut { code: i32, unanswered: usize },
}

/// The exit codes in order of precedence: 0 < 1 < 75 < 2.
fn worse(a: i32, b: i32) -> i32 {
    let rank = |c: i32| match c {
        EXIT_OK => 0,
        EXIT_FAILED => 1,
        EXIT_UNAVAILABLE => 2,
        _ => 3,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// Reads one answer per request sent (`keys` names them, in order), printing each.
fn read_answers(sock: &UnixStream, keys: &Receiver<Option<String>>) -> anyhow::Result<End> {
    let mut r = BufReader::with_capacity(64 << 10, sock);
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut code = EXIT_OK;
    let mut line = Vec::new();
    while let Ok(expected) = keys.recv() {
        line.clear();
        let read = (&mut r).take(ANSWER_BYTES_MAX).read_until(b'\n', &mut line);
        // Only on a way out: it takes the keys still queued.
        let unanswered = || 1 + keys.try_iter().count();
        match read {
            Ok(0) => {
                out.flush()?;
                return Ok(End::Closed {
                    code,
                    unanswered: unanswered(),
                });
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                out.flush()?;
                return Ok(End::TimedOut {
                    code,
                    unanswered: unanswered(),
                });
            }
            Err(e) => {
                note(&format!("reading the stream socket: {e}"));
                out.flush()?;
                return Ok(End::Closed {
                    code,
                    unanswered: unanswered(),
                });
            }
        }
        code = worse(code, judge(&line, expected.as_deref()));
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        out.write_all(&line)?;
        if r.buffer().is_empty() {
            out.flush()?;
        }
    }
    out.flush()?;
    Ok(End::Done(code))
}

/// The exit code one answer line calls for; an answer that is not its request's (another
/// key) or not an answer at all is a 2, said on stderr.
fn judge(line: &[u8], expected: Option<&str>) -> i32 {
    #[derive(serde::Deserialize)]
    struct Head {
        request_key: Option<String>,
        status: String,
        error: Option<String>,
    }
    let Ok(h) = serde_json::from_slice::<Head>(line) else {
        note(&format!(
            "not an answer: {}",
            String::from_utf8_lossy(&line[..line.len().min(200)])
        ));
        return EXIT_INVALID;
    };
    if let (Some(got), Some(want)) = (h.request_key.as_deref(), expected) {
        if got != want {
            note(&format!("answer for {got:?} where {want:?} was due"));
            return EXIT_INVALID;
        }
    }
    match h.status.as_str() {
        "committed" => EXIT_OK,
        "rejected" | "conflict" => EXIT_FAILED,
        crate::intake::stream_protocol::UNAVAILABLE => {
            if h.request_key.is_none() {
                note(h.error.as_deref().unwrap_or("unavailable"));
            }
            EXIT_UNAVAILABLE
        }
        _ => EXIT_INVALID,
    }
}

/// The request key of a batch line, if it has one (the daemon judges the rest).
fn request_key(line: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Key {
        request_key: Option<String>,
    }
    serde_json::from_slice::<Key>(line)
        .ok()
        .and_then(|k| k.request_key)
}

/// Sends every non-blank stdin line, naming each to the reader first (which bounds the
/// window); flushes whenever it would wait (for stdin or for the window). Returns the
/// number sent; an error reading stdin is an error, a closed socket ends the sending
/// quietly (the reader sees the connection close).
fn send_lines(
    input: impl Read,
    sock: &UnixStream,
    keys: &SyncSender<Option<String>>,
) -> anyhow::Result<u64> {
    let mut input = BufReader::with_capacity(64 << 10, input);
    let mut w = BufWriter::with_capacity(64 << 10, sock);
    let mut line = Vec::new();
    let mut sent = 0;
    loop {
        line.clear();
        if input
            .read_until(b'\n', &mut line)
            .context("reading batches from stdin")?
            == 0
        {
            break;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        let key = request_key(&line);
        let queued = match keys.try_send(key) {
            Ok(()) => true,
            Err(TrySendError::Full(key)) => w.flush().is_ok() && keys.send(key).is_ok(),
            Err(TrySendError::Disconnected(_)) => false,
        };
        if !queued || w.write_all(&line).is_err() {
            return Ok(sent);
        }
        sent += 1;
        if input.buffer().is_empty() && w.flush().is_err() {
            return Ok(sent);
        }
    }
    if w.flush().is_ok() {
        let _ = sock.shutdown(std::net::Shutdown::Write);
    }
    Ok(sent)
}
