//! The Python client (`clients/python`, package `roost-client`) against this build's
//! `roost`: its pytest suite, run from the workspace root with `ROOST_BIN` set, so
//! `cargo test --workspace` covers it, and `mypy --strict` on it. Without pytest or mypy
//! the test fails ("install python3-pytest", "install mypy"), never skips. Its failover
//! against the three-node cluster: `python_failover.rs`.
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

/// How to run mypy: `python3 -m mypy`, Debian's `/usr/bin/python3 -m mypy`, or a `mypy` on
/// the PATH.
fn mypy() -> Option<Vec<&'static str>> {
    let candidates: [&[&'static str]; 3] = [
        &["python3", "-m", "mypy"],
        &["/usr/bin/python3", "-m", "mypy"],
        &["mypy"],
    ];
    candidates.into_iter().map(<[&str]>::to_vec).find(|c| {
        Command::new(c[0])
            .args(&c[1..])
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Goal (issue 43): the client is typed for its callers: `mypy --strict` (the settings in
/// `clients/python/pyproject.toml`, Python 3.9) finds nothing in the package, in the
/// failover test's client script, nor in `tests/typing_usage.py`, which assigns
/// `Spool.submit`'s answer to a `Result` by default and to a `str` under `wait=False`.
#[test]
fn python_client_is_mypy_strict_clean() {
    let cmd = mypy().expect("no mypy: install mypy (apt-get install mypy)");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .args([
            "--strict",
            "--no-incremental",
            "--cache-dir",
            "/dev/null",
            "roost_client",
            "tests/typing_usage.py",
            "tests/failover_client.py",
        ])
        .current_dir(&dir)
        .output()
        .expect("run mypy");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "mypy --strict found errors:\n{text}");
    assert!(text.contains("Success: no issues found"), "{text}");
}
