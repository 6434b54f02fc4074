//! The Python client (`clients/python`, package `roost-client`) against this build's
//! `roost`: its pytest suite, run from the workspace root with `ROOST_BIN` set, so
//! `cargo test --workspace` covers it. Without pytest the test fails ("install
//! python3-pytest"), never skips.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;

/// The first interpreter that has pytest: `python3` on the PATH, else Debian's
/// `/usr/bin/python3` (where `apt-get install python3-pytest` puts it, when a python3 of
/// another origin, pyenv's say, comes first on the PATH).
fn python_with_pytest() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|py| {
        Command::new(py)
            .args(["-m", "pytest", "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Goal: every test of the Python client passes against the real daemon (spool and stream
/// submissions, typed results, resending after kill -9: `clients/python/tests`).
#[test]
fn python_client_suite_passes() {
    let py = python_with_pytest()
        .expect("`python3 -m pytest --version` failed: install python3-pytest (apt-get install python3-pytest)");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(py)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "clients/python",
        ])
        .current_dir(&root)
        .env("ROOST_BIN", common::BIN)
        .output()
        .expect("run python3 -m pytest");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the Python client's tests failed (exit {:?}); pytest's output is above",
        out.status.code()
    );
}
