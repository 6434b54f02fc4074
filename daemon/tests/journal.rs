//! The log under systemd: what `roost::logging::build` sends to the journal's native socket,
//! read back datagram by datagram as journald would.
//!
//! tracing-journald 0.3 sends to the fixed path `/run/systemd/journal/socket`, so this test
//! binds that path itself. It runs only as root and only where no journald owns the path (CI:
//! root, no systemd); elsewhere it fails saying why, unless `ROOST_ALLOW_NO_JOURNAL_TEST=1` (then
//! it says why and checks nothing: never a silent skip). A file lock serialises
//! it with any other copy of this test on the machine, and the socket (and the folders it
//! made) are removed afterwards.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::Duration;

use roost::logging::{build, Env};
use tracing::level_filters::LevelFilter;

const SOCKET: &str = "/run/systemd/journal/socket";
const LOCK: &str = "/run/roost-journal-test.lock";

/// Removes the socket and the folders this test created for it, deepest first.
struct Cleanup {
    socket: PathBuf,
    made_dirs: Vec<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        for d in self.made_dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Creates the missing folders above `SOCKET`, remembering which, and binds it.
fn bind_journal() -> (UnixDatagram, Cleanup) {
    let socket = Path::new(SOCKET);
    let mut made_dirs = Vec::new();
    let mut missing: Vec<&Path> = socket
        .ancestors()
        .skip(1)
        .take_while(|d| !d.exists())
        .collect();
    missing.reverse();
    for d in missing {
        std::fs::create_dir(d).expect("create the journal's folder");
        made_dirs.push(d.to_path_buf());
    }
    let cleanup = Cleanup {
        socket: socket.to_path_buf(),
        made_dirs,
    };
    let sock = UnixDatagram::bind(socket).expect("bind the journal socket");
    (sock, cleanup)
}

/// The native protocol: `NAME=value\n`, or `NAME\n` + u64 little-endian length + value + `\n`.
fn fields(mut d: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while !d.is_empty() {
        let nl = d
            .iter()
            .position(|&c| c == b'\n')
            .expect("a field ends in a newline");
        let line = &d[..nl];
        if let Some(eq) = line.iter().position(|&c| c == b'=') {
            let name = String::from_utf8_lossy(&line[..eq]).into_owned();
            out.push((name, String::from_utf8_lossy(&line[eq + 1..]).into_owned()));
            d = &d[nl + 1..];
        } else {
            let name = String::from_utf8_lossy(line).into_owned();
            let len = u64::from_le_bytes(d[nl + 1..nl + 9].try_into().unwrap()) as usize;
            let value = &d[nl + 9..nl + 9 + len];
            assert_eq!(d[nl + 9 + len], b'\n', "field {name} ends in a newline");
            out.push((name, String::from_utf8_lossy(value).into_owned()));
            d = &d[nl + 10 + len..];
        }
    }
    out
}

fn field<'a>(entry: &'a [(String, String)], name: &str) -> Option<&'a str> {
    entry
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Goal: under systemd (stderr is the `JOURNAL_STREAM`), an error and a warning reach the
/// journal with priorities 3 and 4, their message, `SYSLOG_IDENTIFIER=roost` and their fields
/// as journal fields, and the `ROOST_LOG` filter holds back what it should.
/// Method: bind the journal socket, build the subscriber as `main` does with `JOURNAL_STREAM`
/// set to this process's own stderr and `ROOST_LOG=warn`, log an error, a warning and an info,
/// and receive the datagrams.
/// The test cannot run here: a failure, unless `ROOST_ALLOW_NO_JOURNAL_TEST=1` says to go on
/// without it (printed either way).
fn cannot_run(why: &str) {
    let allowed = std::env::var_os("ROOST_ALLOW_NO_JOURNAL_TEST").is_some_and(|v| v == "1");
    assert!(
        allowed,
        "the journal test cannot run: {why} (run as root on a machine without journald, or set ROOST_ALLOW_NO_JOURNAL_TEST=1)"
    );
    eprintln!("NOT CHECKED (ROOST_ALLOW_NO_JOURNAL_TEST=1): {why}");
}

#[test]
fn errors_and_warnings_reach_the_journal_with_their_priority() {
    if !rustix::process::geteuid().is_root() {
        return cannot_run(&format!("binding {SOCKET} needs root"));
    }
    let lock = File::create(LOCK).expect("create the lock file");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).expect("lock");
    if Path::new(SOCKET).exists() {
        return cannot_run(&format!(
            "{SOCKET} exists (a real journald); not taking it over"
        ));
    }
    let (journal, _cleanup) = bind_journal();
    journal
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();

    let st = rustix::fs::fstat(std::io::stderr()).expect("fstat stderr");
    let env = Env {
        filter: Some("warn".into()),
        format: None,
        journal_stream: Some(format!("{}:{}", st.st_dev, st.st_ino)),
    };
    let built = build(&env, LevelFilter::INFO);
    assert!(built.notes.is_empty(), "{:?}", built.notes);
    tracing::subscriber::with_default(built.subscriber, || {
        tracing::error!(
            shard = "users",
            lsn = 42u64,
            "journal test: the disk is on fire"
        );
        tracing::warn!(shard = "orders", "journal test: a slow fsync");
        tracing::info!("journal test: held back by ROOST_LOG=warn");
    });

    let mut entries = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while entries.len() < 2 {
        let n = journal.recv(&mut buf).expect("a datagram within 5 s");
        // The layer probes the socket with an empty datagram when it opens it.
        if n > 0 {
            entries.push(fields(&buf[..n]));
        }
    }
    journal
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let extra = journal.recv(&mut buf);
    assert!(
        extra.is_err(),
        "nothing more may arrive: {:?}",
        extra.map(|n| fields(&buf[..n]))
    );

    let (error, warn) = (&entries[0], &entries[1]);
    assert_eq!(field(error, "PRIORITY"), Some("3"), "{error:?}");
    assert_eq!(
        field(error, "MESSAGE"),
        Some("journal test: the disk is on fire")
    );
    assert_eq!(field(error, "SYSLOG_IDENTIFIER"), Some("roost"));
    assert_eq!(field(error, "F_SHARD"), Some("users"), "{error:?}");
    assert_eq!(field(error, "F_LSN"), Some("42"), "{error:?}");
    assert_eq!(field(warn, "PRIORITY"), Some("4"), "{warn:?}");
    assert_eq!(field(warn, "MESSAGE"), Some("journal test: a slow fsync"));
    assert_eq!(field(warn, "SYSLOG_IDENTIFIER"), Some("roost"));
    assert_eq!(field(warn, "F_SHARD"), Some("orders"), "{warn:?}");
}
