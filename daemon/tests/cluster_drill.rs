//! `roost drill --cluster` (issue 27) in CI: etcd and three nodes on loopback with a 1 s lease,
//! 20 strikes on the leader (SIGKILL, SIGSTOP past its lease, its connections cut), batch
//! files and streamed batches into every node. The drill itself checks every acknowledged
//! batch (sent again: the same answer), every committed create on every node and none twice,
//! the WALs and shards equal, `verify` on every node, and no epoch led by two nodes; this
//! test requires its exit 0, the counts, and prints the failover times. It also requires,
//! for every strike, what a client waits (issue 42): the time to a new leader in status,
//! to the probe client's first committed answer, and its longest stretch without one, per
//! strike kind and overall (printed, never held to a bound: CI's timing is noise).
//! Three more runs: a rolling restart (`--rolling`, each node stopped with SIGTERM in turn
//! and started again) must lose nothing and print its longest stretch without a committed
//! answer; a quiet run (`--quiet-secs`, load and no fault) must see no leader change;
//! planned switchovers (`--switchovers`) must each move the leader and lose nothing; three
//! etcd members (`--etcd-members 3`) with one killed as a strike must lose nothing.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;

use common::BIN;

#[test]
fn twenty_failovers_lose_nothing_and_never_two_leaders_in_one_epoch() {
    let run = drill(&["--kills", "20", "--batches", "400"]);
    let text = &run.text;
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
    assert_client_waits(text);
    assert_single_faults(text, 20);
}

/// Each strike struck a cluster whose every node could take over: the drill waited for the
/// in-sync set to name every node before the first strike and after each (issue 42: a
/// leader struck while both others were out of the set left no node electable, and the
/// drill, waiting for another leader before it restored the struck one, failed after 60 s).
fn assert_single_faults(text: &str, strikes: usize) {
    assert!(
        text.contains("start: every node in the in-sync set after "),
        "no in-sync wait before the first strike: {text}"
    );
    let after = text
        .lines()
        .filter(|l| l.contains(" in the in-sync set again "))
        .count();
    assert_eq!(
        after, strikes,
        "not an in-sync wait after every strike: {text}"
    );
}

/// Goal: with three etcd members, killing one (issue 42: "an etcd member with three etcd
/// members") loses nothing and a client still gets committed answers; the etcd strikes are
/// counted and timed beside the strikes on the leader; all of it over links that hold every
/// byte 5 ms each way. Method: `--etcd-members 3 --kills 8 --seed 4 --delay-ms 5` (seed 4's
/// schedule, from the strikes' own generator: cut, pause, cut, pause, kill, etcd, etcd,
/// kill); whether the leader changed is
/// printed, not asserted (an etcd election on a loaded machine may outlast a 1 s lease).
#[test]
fn killing_one_of_three_etcd_members_over_delayed_links_loses_nothing() {
    let run = drill(&[
        "--etcd-members",
        "3",
        "--kills",
        "8",
        "--batches",
        "120",
        "--seed",
        "4",
        "--delay-ms",
        "5",
    ]);
    let text = &run.text;
    assert!(text.contains("violations: none"), "{text}");
    assert!(
        text.contains("etcd members 3, delay 5 ms each way"),
        "{text}"
    );
    let etcd = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Etcd: "))
        .and_then(|l| l.split(" strikes").next()?.parse::<usize>().ok());
    assert_eq!(etcd, Some(2), "not seed 4's two etcd strikes: {text}");
    let killed = text
        .lines()
        .filter(|l| l.contains(": Etcd member "))
        .count();
    assert_eq!(
        Some(killed),
        etcd,
        "an etcd strike without its line: {text}"
    );
    assert!(
        text.contains("(8 of 8)"),
        "a strike without a committed answer: {text}"
    );
}

/// Goal: a rolling restart (issue 42), as an upgrade does it, loses nothing: each node in
/// turn stops on SIGTERM with exit 0 and is started again, the leader's stop is waited out,
/// and the report gives the longest stretch a client went without a committed answer.
/// Method: `--rolling --kills 3` (a, b, c once each) with small batches; exit 0, the
/// rolling line with a number (printed, not bounded), no violation, a probe per stop.
#[test]
fn a_rolling_restart_stops_each_node_gracefully_and_loses_nothing() {
    let run = drill(&["--rolling", "--kills", "3", "--batches", "60"]);
    let text = &run.text;
    let ms = text
        .lines()
        .find_map(|l| {
            l.trim_start().strip_prefix(
                "longest stretch without a committed answer over the rolling restart: ",
            )
        })
        .and_then(|r| r.strip_suffix(" ms"))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(ms.is_some(), "no rolling line with a number: {text}");
    assert!(text.contains("violations: none"), "{text}");
    assert!(text.contains("    Term: 3 strikes;"), "{text}");
    let probes = text.lines().filter(|l| l.contains(": probe: ")).count();
    assert_eq!(probes, 3, "not a probe line per stop: {text}");
}

/// Goal: planned switchovers (issue 42) move leadership to the named node each time and
/// lose nothing. Method: `--switchovers --kills 3` (to b, c, a or the like); exit 0, no
/// violation, three `Switch` strikes each with a probe, the switchovers' longest stretch
/// with a number (printed, not bounded).
#[test]
fn three_switchovers_move_the_leader_and_lose_nothing() {
    let run = drill(&["--switchovers", "--kills", "3", "--batches", "60"]);
    let text = &run.text;
    assert!(text.contains("violations: none"), "{text}");
    assert!(text.contains("    Switch: 3 strikes;"), "{text}");
    let done = text
        .lines()
        .filter(|l| l.contains("switchover done: "))
        .count();
    assert_eq!(done, 3, "not a switchover per round: {text}");
    let probes = text.lines().filter(|l| l.contains(": probe: ")).count();
    assert_eq!(probes, 3, "not a probe line per switchover: {text}");
    let stretch = "longest stretch without a committed answer over the switchovers: ";
    assert!(text.contains(stretch), "{text}");
}

/// Goal: without a fault the leader never changes (an election under plain load is a
/// client's wait for nothing). Method: `--quiet-secs 20` at a 1 s lease; exit 0, "leader
/// changes without a fault: 0" (the epochs seen led, beyond the first), no violation.
#[test]
fn twenty_quiet_seconds_under_load_change_no_leader() {
    let run = drill(&["--quiet-secs", "20"]);
    let text = &run.text;
    let k = text
        .lines()
        .find_map(|l| {
            l.trim_start()
                .strip_prefix("leader changes without a fault: ")
        })
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(k, Some(0), "{text}");
    assert!(text.contains("violations: none"), "{text}");
}

/// Runs `roost drill --cluster --lease-ms 1000 EXTRA` in a fresh directory; requires exit 0
/// and returns its report (printed) with the directory, which a failing test keeps.
fn drill(extra: &[&str]) -> DrillRun {
    let t = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(t.path())
        .args(["drill", "--cluster", "--lease-ms", "1000"])
        .args(extra)
        .output()
        .expect("run roost drill --cluster");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{text}");
    assert!(
        out.status.success(),
        "drill failed: {text}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        kept(t)
    );
    DrillRun { text, dir: Some(t) }
}

/// A drill's report, and its directory (every node's log, etcd's, the data): removed when
/// the test ends well, kept for reading when one of its checks fails (the drill itself
/// passed, but the report did not say what the test wants: a CI flake must leave the
/// nodes' logs behind).
struct DrillRun {
    text: String,
    dir: Option<tempfile::TempDir>,
}

impl Drop for DrillRun {
    fn drop(&mut self) {
        if let (true, Some(t)) = (std::thread::panicking(), self.dir.take()) {
            eprintln!("{}", kept(t));
        }
    }
}

/// A failed drill's directory (every node's log, etcd's, the data) is kept for reading: its
/// path, for the failure's message.
fn kept(t: tempfile::TempDir) -> String {
    format!("drill directory kept: {}", t.keep().display())
}

/// What a client waits (issue 42): every strike has its three figures, per kind and
/// overall; a probe that never got a committed answer leaves its strike without one.
fn assert_client_waits(text: &str) {
    let all = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("all: "))
        .unwrap_or_else(|| panic!("no overall client-wait line: {text}"));
    assert!(all.starts_with("20 strikes;"), "{all}");
    assert!(
        all.contains("(20 of 20)"),
        "a strike without a committed answer: {all}"
    );
    for figure in [
        "new leader in status ",
        "first committed answer ",
        "longest stretch without one ",
    ] {
        assert!(
            spread_of(all, figure).is_some(),
            "no {figure}figures: {all}"
        );
    }
    let per_kind: usize = ["Kill: ", "Pause: ", "Cut: "]
        .iter()
        .filter_map(|k| text.lines().find_map(|l| l.trim_start().strip_prefix(k)))
        .filter_map(|l| l.split(" strikes").next()?.parse::<usize>().ok())
        .sum();
    assert_eq!(per_kind, 20, "the kinds' strikes do not add up: {text}");
    let probes: Vec<&str> = text.lines().filter(|l| l.contains(": probe: ")).collect();
    assert_eq!(probes.len(), 20, "not a probe line per strike: {text}");
    for l in probes {
        assert!(
            l.contains("first committed answer after "),
            "a probe without a committed answer: {l}"
        );
    }
}

/// The `p50 / p99 / max` in ms that follows `figure` in `line`, if all three are numbers.
fn spread_of(line: &str, figure: &str) -> Option<[u64; 3]> {
    let rest = line.split(figure).nth(1)?;
    let mut n = rest.split(" / ").map(|x| {
        x.split([' ', ';'])
            .next()
            .and_then(|d| d.parse::<u64>().ok())
    });
    Some([n.next()??, n.next()??, n.next()??])
}
