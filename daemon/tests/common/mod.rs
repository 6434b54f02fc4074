//! Helpers shared by the black-box tests of the `roost` binary.
#![allow(dead_code)] // each test file uses its own subset

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_roost");

/// Polls `f` until it holds; fails the test naming `what` after `limit`.
pub fn wait_for<F: Fn() -> bool>(what: &str, limit: Duration, f: F) {
    let until = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills a child process when the test ends, passing or not (a leaked daemon would hold the
/// test harness's pipes open and keep running).
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Drops a batch into a spool the client's way ([`roost::spool::deliver`]: `tmp/`, fsync,
/// rename into `new/`, fsync `new/`).
pub fn drop_in(spool: &Path, name: &str, body: &[u8]) {
    roost::spool::deliver(&roost::spool::SpoolPaths::new(spool), name, body)
        .unwrap_or_else(|e| panic!("delivering {name}: {e}"));
}

/// Starts `roost serve --data-dir DATA ARGS...` logging to `log`, and returns once it logs
/// "serving" (recovery done).
pub fn serve_ready(data: &Path, log: &Path, args: &[&str]) -> Guard {
    let child = Command::new(BIN)
        .args(["serve", "--data-dir"])
        .arg(data)
        .args(args)
        .env("ROOST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let guard = Guard(child);
    wait_for("serving", Duration::from_secs(20), || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("serving")
    });
    guard
}

/// `roost serve` under `strace -f`, for the fault walk.
pub mod strace;
