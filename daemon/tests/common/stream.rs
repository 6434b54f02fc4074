//! Stream clients for the tests: `roost submit --stream` with its input, a raw socket, the
//! daemon's memory.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::BIN;

/// A batch line of `creates` creates on `shard`, each record naming its key and op index
/// (so a record twice on a shard shows).
pub fn batch_line(key: &str, shard: &str, creates: usize) -> String {
    let ops: Vec<String> = (0..creates)
        .map(|i| {
            format!(r#"{{"op":"create","shard":"{shard}","record":{{"key":"{key}","i":{i}}}}}"#)
        })
        .collect();
    format!(
        "{{\"request_key\":\"{key}\",\"ops\":[{}]}}\n",
        ops.join(",")
    )
}

/// `roost submit --stream --data-dir DATA ARGS...` with `input` on stdin, run to its end
/// (at most two minutes).
pub fn submit_stream(data: &Path, args: &[&str], input: Vec<u8>) -> Output {
    start_submit_stream(data, args, input)
        .recv_timeout(Duration::from_secs(120))
        .expect("roost submit --stream did not end")
}

/// Starts `roost submit --stream --data-dir DATA ARGS...` with `input` on stdin, written by
/// a thread while another collects its output (so neither a client that stops reading
/// stdin nor a full stdout pipe can stall it); its output arrives on the receiver.
pub fn start_submit_stream(
    data: &Path,
    args: &[&str],
    input: Vec<u8>,
) -> std::sync::mpsc::Receiver<Output> {
    let mut child = Command::new(BIN)
        .args(["submit", "--stream", "--timeout", "60", "--data-dir"])
        .arg(data)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run roost submit --stream");
    let mut stdin = child.stdin.take().expect("stdin");
    std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(
            child
                .wait_with_output()
                .expect("roost submit --stream output"),
        );
    });
    rx
}

/// The answer lines of an output, parsed.
pub fn answers(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("answer {l:?}: {e}")))
        .collect()
}

/// A raw connection to the stream socket, reads bounded by `read_timeout`.
pub fn connect(data: &Path, read_timeout: Duration) -> UnixStream {
    let s = UnixStream::connect(data.join("stream.sock")).expect("connect to stream.sock");
    s.set_read_timeout(Some(read_timeout)).expect("timeout");
    s
}

/// Reads one answer line from a raw connection.
pub fn read_answer(r: &mut BufReader<UnixStream>) -> Value {
    let mut line = String::new();
    r.read_line(&mut line).expect("an answer line");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("answer {line:?}: {e}"))
}

/// The daemon's resident memory in KiB (`VmRSS` of `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS")
}

/// The records of `shard` (`roost scan`).
pub fn scan(data: &Path, shard: &str) -> Vec<Value> {
    let out = Command::new(BIN)
        .args(["scan", shard, "--data-dir"])
        .arg(data)
        .output()
        .expect("roost scan");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("scan line"))
        .collect()
}
