//! The command line: a table row per explored variant, traces, and usage errors.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_roost-repmodel"))
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn prints_the_table_and_the_shortest_counterexamples() {
    let (code, out) = run(&["--replicas", "2", "--variant", "kip101"]);
    assert_eq!(code, Some(0));
    let row = out
        .lines()
        .find(|l| l.starts_with("Kip101 "))
        .expect("a row for Kip101");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..4], ["2", "9045", "21447"]);
    assert!(cells.contains(&"FAIL(12)"));
    assert!(out.contains(
        "Kip101 with 2 replicas: WeakIsr is violated; shortest counterexample, 12 states:"
    ));
    assert!(
        out.contains("  State 1: <Init>")
            && out.contains("  State 12: <BecomeFollowerTruncateKip101(")
    );
    assert!(!out.contains("Kip320"), "only the variant asked for");
}

#[test]
fn usage_errors_exit_64() {
    for args in [
        &["--variant", "kip999"][..],
        &["--replicas", "9"],
        &["--replicas"],
        &["--bogus"],
    ] {
        assert_eq!(run(args).0, Some(64), "{args:?}");
    }
}

#[test]
fn runs_the_election_and_prints_its_counterexamples() {
    let args = [
        "election",
        "--ack",
        "local",
        "--no-gap",
        "--batches",
        "1",
        "--flaw",
        "no-margin",
    ];
    let (code, out) = run(&args);
    assert_eq!(code, Some(0));
    let row = out
        .lines()
        .find(|l| l.starts_with("ack=local no-gap flaw=no-margin "))
        .expect("a row for the configuration");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[3..7], ["2", "3", "1", "122286"]);
    assert!(out.contains(
        "Election (ack=local no-gap flaw=no-margin) with 2 nodes: AnswersWithinLease is \
         violated; shortest counterexample, 7 states:"
    ));
    assert!(out.contains("  State 7: <Answer(leader=r1, batch=0)>"));
    for args in [&["election", "--flaw", "bogus"][..], &["election", "--ack"]] {
        assert_eq!(run(args).0, Some(64), "{args:?}");
    }
}
