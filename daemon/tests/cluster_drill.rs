//! `roost drill --cluster` (issue 27) in CI: etcd and three nodes on loopback with a 1 s lease,
//! 20 strikes on the leader (SIGKILL, SIGSTOP past its lease, its connections cut), batch
//! files and streamed batches into every node. The drill itself checks every acknowledged
//! batch (sent again: the same answer), every committed create on every node and none twice,
//! the WALs and shards equal, `verify` on every node, and no epoch led by two nodes; this
//! test requires its exit 0, the counts, and prints the failover times.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::BIN;

#[test]
fn twenty_failovers_lose_nothing_and_never_two_leaders_in_one_epoch() {
    let t = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(t.path())
        .args([
            "drill",
            "--cluster",
            "--lease-ms",
            "1000",
            "--kills",
            "20",
            "--batches",
            "400",
        ])
        .output()
        .expect("run roost drill --cluster");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(
        out.status.success(),
        "drill failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("violations: none"), "{text}");
    assert!(text.contains(", 20 failovers"), "{text}");
    assert!(text.contains("lost: 0"), "{text}");
    // The failover times are printed, not asserted (a shared machine's timing is noise).
    let p99 = text
        .lines()
        .find_map(|l| l.split("p99 ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(p99.is_some(), "no failover time in the report: {text}");
}
