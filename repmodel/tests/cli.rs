//! The command line: a table row per explored variant, traces, and usage errors.
#![forbid(unsafe_code)]

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
