//! The stream protocol (docs/contract.md "Streaming intake"), shared by the daemon's listener
//! (`intake/stream_socket.rs`) and its client (`roost submit --stream`): where the socket is, how a
//! request line is framed and parsed, and what an answer line looks like. It never touches
//! the engine.
//!
//! A request line is exactly a batch file's JSON; an answer line is exactly a result file's
//! JSON, or `{"request_key":..,"status":"unavailable","error":..}` when the batch was not
//! taken now (intake paused, not the primary, the daemon stopping): send it again later
//! under the same key. Every request line gets one answer line, in request order.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use crate::batch::{self, Batch, BatchResult, Invalid};
use crate::config::Config;

/// The status of an answer that is not a result: nothing is decided for this batch now.
pub const UNAVAILABLE: &str = "unavailable";

/// `stream_socket`, else `$RUNTIME_DIRECTORY/stream.sock`, else `<data-dir>/stream.sock`
/// (placed like the control socket).
pub fn socket_path(cfg: &Config) -> PathBuf {
    crate::control::socket::runtime_socket(
        cfg.stream_socket.as_deref(),
        "stream.sock",
        &cfg.data_dir,
    )
}

/// One answer line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The batch's result, as its result file would hold it.
    Result(BatchResult),
    /// Not taken now (`EngineError::latches_nothing`, or the daemon stopping): the batch
    /// may have been claimed before the answer gave up; the same key sent again later gets
    /// the original answer if so.
    Unavailable {
        request_key: Option<String>,
        error: String,
    },
}

/// The wire form of [`Answer::Unavailable`], fields in the order of a result file's.
#[derive(Serialize)]
struct UnavailableLine<'a> {
    request_key: Option<&'a str>,
    status: &'static str,
    error: &'a str,
}

impl Answer {
    pub fn unavailable(request_key: Option<&str>, error: impl Into<String>) -> Answer {
        Answer::Unavailable {
            request_key: request_key.map(str::to_owned),
            error: error.into(),
        }
    }

    /// The answer as one JSON line, newline included.
    pub fn to_json_line(&self) -> Vec<u8> {
        match self {
            Answer::Result(r) => r.to_json_line(),
            Answer::Unavailable { request_key, error } => {
                let line = UnavailableLine {
                    request_key: request_key.as_deref(),
                    status: UNAVAILABLE,
                    error,
                };
                let mut v = serde_json::to_vec(&line).unwrap_or_default();
                v.push(b'\n');
                v
            }
        }
    }
}

/// One request line as framed by [`next_line`].
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// The line's bytes, without its newline.
    Bytes(Vec<u8>),
    /// Longer than the limit: skipped to its newline (or the end of the stream) without
    /// being kept; `bytes` is how long it was.
    TooLong { bytes: u64 },
}

/// Reads the next line, never holding more than `max` bytes of it: a longer line is
/// consumed in the reader's chunks and discarded, so a line that never ends costs no
/// memory. `None` at the end of the stream; a last line without a newline is a line.
pub async fn next_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    // `Some(n)`: over the limit, n bytes skipped so far.
    let mut skipped: Option<u64> = None;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(match skipped {
                Some(bytes) => Some(Line::TooLong { bytes }),
                None if line.is_empty() => None,
                None => Some(Line::Bytes(line)),
            });
        }
        let newline = chunk.iter().position(|b| *b == b'\n');
        let take = newline.unwrap_or(chunk.len());
        if skipped.is_none() && line.len() + take > max {
            skipped = Some(line.len() as u64);
            line = Vec::new();
        }
        match &mut skipped {
            Some(n) => *n += take as u64,
            None => line.extend_from_slice(&chunk[..take]),
        }
        r.consume(take + usize::from(newline.is_some()));
        if newline.is_some() {
            return Ok(Some(match skipped {
                Some(bytes) => Line::TooLong { bytes },
                None => Line::Bytes(line),
            }));
        }
    }
}

/// Parses request line `n` (1-based, on its connection) with the batch file's parser; an
/// error names the line (the JSON error's own "line 1 column C" is the column in it).
pub fn parse_line(line: &Line, n: u64, max: usize, batch_ops_max: u32) -> Result<Batch, Invalid> {
    let named = |inv: Invalid| Invalid {
        request_key: inv.request_key,
        error: format!("stream line {n}: {}", inv.error),
    };
    match line {
        Line::TooLong { bytes } => Err(named(Invalid {
            request_key: None,
            error: format!("line is {bytes} bytes, over stream_line_bytes_max {max}"),
        })),
        Line::Bytes(b) => batch::parse(b, batch_ops_max).map_err(named),
    }
}

/// A blocking client for tools (the drill): sends `lines` (one request each, without a
/// newline) on one connection from a second thread and reads answer lines, in request
/// order, until every line is answered or the daemon closes the connection (a kill). An
/// answer that does not come within `timeout` is an error.
pub fn exchange(
    path: &Path,
    lines: Vec<Vec<u8>>,
    timeout: Duration,
) -> std::io::Result<Vec<Vec<u8>>> {
    use std::io::{BufRead, Read, Write};
    let sock = std::os::unix::net::UnixStream::connect(path)?;
    sock.set_read_timeout(Some(timeout))?;
    let w = sock.try_clone()?;
    let n = lines.len();
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut bw = std::io::BufWriter::new(&w);
        for l in &lines {
            bw.write_all(l)?;
            bw.write_all(b"\n")?;
        }
        bw.flush()?;
        drop(bw);
        w.shutdown(std::net::Shutdown::Write)
    });
    let mut r = std::io::BufReader::new(&sock);
    let mut answers = Vec::new();
    let mut result = Ok(());
    while answers.len() < n {
        let mut line = Vec::new();
        match (&mut r).take(ANSWER_BYTES_MAX).read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => answers.push(line),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                result = Err(e);
                break;
            }
            Err(_) => break, // the daemon went away
        }
    }
    // Unblocks the writer if the daemon stopped reading.
    let _ = sock.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
    result.map(|()| answers)
}

/// The longest answer line a client reads (a result names every op of its batch).
pub const ANSWER_BYTES_MAX: u64 = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: lines are framed at newlines in any chunking, a line over the limit is skipped
    /// without being kept (the reader's chunk is all that is ever held) and the next line
    /// is read normally, and a last line without a newline is still a line.
    #[tokio::test]
    async fn lines_are_bounded_and_a_long_line_is_skipped() {
        let mut input = b"{\"a\":1}\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100_000));
        input.extend(b"\nshort\n\nlast");
        // A 7-byte buffer: every line spans chunks.
        let mut r = tokio::io::BufReader::with_capacity(7, &input[..]);
        let mut got = Vec::new();
        while let Some(l) = next_line(&mut r, 1000).await.expect("read") {
            got.push(l);
        }
        assert_eq!(
            got,
            vec![
                Line::Bytes(b"{\"a\":1}".to_vec()),
                Line::TooLong { bytes: 100_000 },
                Line::Bytes(b"short".to_vec()),
                Line::Bytes(Vec::new()),
                Line::Bytes(b"last".to_vec()),
            ]
        );
        // Exactly at the limit is taken; one byte more is not.
        let mut r = tokio::io::BufReader::with_capacity(3, &b"12345\n123456\n"[..]);
        assert_eq!(
            next_line(&mut r, 5).await.expect("read"),
            Some(Line::Bytes(b"12345".to_vec()))
        );
        assert_eq!(
            next_line(&mut r, 5).await.expect("read"),
            Some(Line::TooLong { bytes: 6 })
        );
        assert_eq!(next_line(&mut r, 5).await.expect("read"), None);
    }

    /// Goal: an invalid line's error names its line on the connection and keeps the
    /// parser's column; the unavailable answer has the documented shape.
    #[test]
    fn invalid_lines_are_named_and_answers_keep_their_shape() {
        let e = parse_line(&Line::Bytes(b"{\"request_key\":".to_vec()), 17, 100, 10)
            .expect_err("truncated");
        assert!(
            e.error.starts_with("stream line 17: invalid JSON") && e.error.contains("column"),
            "{}",
            e.error
        );
        let e = parse_line(&Line::Bytes(b"\xff{}".to_vec()), 3, 100, 10).expect_err("utf-8");
        assert!(e.error.contains("stream line 3: not UTF-8"), "{}", e.error);
        let e = parse_line(&Line::TooLong { bytes: 101 }, 4, 100, 10).expect_err("long");
        assert_eq!(
            e.error,
            "stream line 4: line is 101 bytes, over stream_line_bytes_max 100"
        );
        let a = Answer::unavailable(Some("k"), "intake paused");
        assert_eq!(
            String::from_utf8(a.to_json_line()).expect("utf-8"),
            "{\"request_key\":\"k\",\"status\":\"unavailable\",\"error\":\"intake paused\"}\n"
        );
    }
}
