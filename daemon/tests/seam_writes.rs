//! Every file the daemon writes goes through the storage seam (issue 46), so the crash
//! schedules see every write: no `std::fs` (or `tokio::fs`) write in the source of the crates
//! the daemon is made of, outside `storage/` (the seam itself), the command line and tests.
//! Reads may use `std::fs` (a read changes nothing a crash could tear).
//!
//! And the engine's pipeline reads the time only through the seam's clock (`Storage::now`,
//! `Storage::system_now`, the `Clock` handle), so the simulator drives its time as it drives
//! its disk: no `Instant::now`, `SystemTime::now` or `.elapsed()` (the OS clock read behind
//! the seam's back) in the source under `engine/src/pipeline/`, outside tests.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod source;

use source::{production_code, repo, rust_files};

/// The source folders scanned: the crates the daemon is built of (`storage/` is the seam).
const ROOTS: &[&str] = &[
    "daemon/src",
    "engine/src",
    "drill/src",
    "wal/src",
    "shards/src",
    "keyindex/src",
    "replication/src",
    "etcd/src",
];

/// Where a write around the seam is allowed, and why.
const EXEMPT: &[(&str, &str)] = &[
    (
        "daemon/src/cli/",
        "the command line, a client of the daemon",
    ),
    (
        "drill/src/",
        "`roost drill` drives the daemon as a test does (its own crate, `roost-drill`)",
    ),
    (
        "engine/src/ops/tls_certs.rs",
        "`roost certs` (the command line): a key directory made with mode 0700",
    ),
    ("etcd/src/testing/", "a test etcd and its certificates"),
];

/// Calls that create, change or remove a file or directory. A chain from
/// `OpenOptions::new()` counts when it asks to write or create ([`WRITE_OPTIONS`]).
const WRITES: &[&str] = &[
    "fs::write(",
    "fs::rename(",
    "fs::remove_file(",
    "fs::remove_dir(",
    "fs::remove_dir_all(",
    "fs::create_dir(",
    "fs::create_dir_all(",
    "fs::copy(",
    "fs::hard_link(",
    "File::create(",
    "File::create_new(",
    "DirBuilder::new(",
];

const WRITE_OPTIONS: &[&str] = &[
    ".write(true)",
    ".append(true)",
    ".create(true)",
    ".create_new(true)",
    ".truncate(true)",
];

/// The writes around the seam in `code` (production code), as (line, call).
fn writes_in(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        for w in WRITES.iter().filter(|w| line.contains(**w)) {
            found.push((n + 1, w.trim_end_matches('(').to_owned()));
        }
    }
    for (at, _) in code.match_indices("OpenOptions::new()") {
        let chain = &code[at..];
        let end = chain.find(".open(").or_else(|| chain.find(';'));
        let chain = &chain[..end.unwrap_or(chain.len())];
        if WRITE_OPTIONS.iter().any(|o| chain.contains(o)) {
            let line = code[..at].lines().count().max(1);
            found.push((line, "OpenOptions for writing".to_owned()));
        }
    }
    found
}

/// Where the pipeline's time is read only through the seam's clock.
const CLOCK_ROOT: &str = "engine/src/pipeline";

/// Reads of the OS clock: the time now, and an `Instant`'s or a `SystemTime`'s age.
const CLOCK_READS: &[&str] = &["Instant::now", "SystemTime::now", ".elapsed()"];

/// The reads of the OS clock in `code` (production code), as (line, read).
fn clock_reads_in(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        for r in CLOCK_READS.iter().filter(|r| line.contains(**r)) {
            found.push((n + 1, (*r).to_owned()));
        }
    }
    found
}

/// Goal: see the module comment. Method: read every source file of the daemon's crates,
/// drop comments and `#[cfg(test)]` items, and look for each call of `WRITES` and any
/// `OpenOptions` opened for writing; a hit outside `EXEMPT` fails with its file and line.
#[test]
fn no_file_write_goes_around_the_storage_seam() {
    let repo = repo();
    let mut files = Vec::new();
    for root in ROOTS {
        rust_files(&repo.join(root), &mut files);
    }
    assert!(files.len() > 100, "only {} source files found", files.len());
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&repo).expect("under the repo");
        let rel = rel.to_string_lossy().into_owned();
        if EXEMPT.iter().any(|(p, _)| rel.starts_with(p)) || rel.ends_with("tests.rs") {
            // A unit-test file (`*tests.rs`): declared only under `#[cfg(test)]`, which
            // `layering.rs` (`every_test_file_is_declared_under_cfg_test`) checks.
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read source");
        for (line, call) in writes_in(&production_code(&text)) {
            bad.push(format!("{rel}:{line}: {call}"));
        }
    }
    assert!(
        bad.is_empty(),
        "file writes around the storage seam (use roost_storage::Storage, or say in this \
         test's EXEMPT why not):\n{}",
        bad.join("\n")
    );
}

/// Goal: the scan sees a write in production code, in each form, and not one in a test
/// module or a comment. Method: a made-up source file.
#[test]
fn a_write_around_the_seam_is_seen() {
    let src = r#"
use std::fs;
fn install(a: &Path, b: &Path) {
    std::fs::rename(a, b).ok(); // moved
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(a);
    let r = std::fs::OpenOptions::new().read(true).open(b);
    // fs::remove_file(a) is not called here
}
#[cfg(test)]
mod tests {
    fn helper() {
        std::fs::write("x", "y").unwrap();
    }
}
fn after() { tokio::fs::create_dir_all("d"); }
"#;
    let found = writes_in(&production_code(src));
    let calls: Vec<&str> = found.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(
        calls,
        vec![
            "fs::rename",
            "fs::create_dir_all",
            "OpenOptions for writing"
        ],
        "{found:?}"
    );
    assert_eq!(found[0].0, 4, "the line of the rename");
}

/// Goal: see the module comment (the pipeline's clock). Method: as for the writes, every
/// source file under [`CLOCK_ROOT`] but unit-test files (`*tests.rs`), without comments and
/// `#[cfg(test)]` items, searched for each of [`CLOCK_READS`].
#[test]
fn no_clock_read_in_the_pipeline_goes_around_the_storage_seam() {
    let repo = repo();
    let mut files = Vec::new();
    rust_files(&repo.join(CLOCK_ROOT), &mut files);
    assert!(files.len() > 30, "only {} source files found", files.len());
    let mut bad = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(&repo).expect("under the repo");
        let rel = rel.to_string_lossy().into_owned();
        if rel.ends_with("tests.rs") {
            continue; // a unit-test file, as in `no_file_write_goes_around_the_storage_seam`
        }
        let text = std::fs::read_to_string(f).expect("read source");
        for (line, read) in clock_reads_in(&production_code(&text)) {
            bad.push(format!("{rel}:{line}: {read}"));
        }
    }
    assert!(
        bad.is_empty(),
        "the OS clock read in the pipeline (read the storage's: `Clock::now`, `Clock::since`, \
         `Clock::unix_ms`):\n{}",
        bad.join("\n")
    );
}

/// Goal: the clock scan sees each read in production code, a function passed by name
/// included, and none in a test module or a comment. Method: a made-up source file.
#[test]
fn a_clock_read_around_the_seam_is_seen() {
    let src = r#"
fn due(q: &Queue, clock: &Clock) -> bool {
    let t0 = Instant::now(); // Instant::now() again in a comment
    q.since.get_or_insert_with(Instant::now);
    clock.since(t0) > q.wait || t0.elapsed() > q.wait
}
#[cfg(test)]
mod tests {
    fn helper() -> u64 {
        std::time::SystemTime::now().elapsed().unwrap().as_secs()
    }
}
fn stamp() -> SystemTime { SystemTime::now() }
"#;
    let found = clock_reads_in(&production_code(src));
    let want = [
        (3, "Instant::now"),
        (4, "Instant::now"),
        (5, ".elapsed()"),
        (13, "SystemTime::now"),
    ];
    let found: Vec<(usize, &str)> = found.iter().map(|(l, r)| (*l, r.as_str())).collect();
    assert_eq!(found, want);
}
