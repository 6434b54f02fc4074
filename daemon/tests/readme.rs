//! README's quickstart and cluster block, run as a new user runs them: every command of each
//! block, in one shell, from a fresh directory, twice in that directory (the second time shows
//! the block can be run again as it is), checking the exit code each command must have (0, or
//! what a `# exit N` comment says), each line README says it prints (`# => TEXT` under the
//! command; `...` matches anything), and that the block's stop leaves no process running.
//!
//! Two lines are checked but not run, and the test says so: `cargo build --release -p roost`
//! (the test puts the `roost` this build made first on the PATH in its place, so `export
//! PATH="$PWD/target/release:$PATH"` finds it) and the `apt-get install` of etcd-server,
//! which `.ci/run` has done (the cluster block fails, never skips, without `/usr/bin/etcd`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BUILD_LINE: &str =
    r#"cargo build --release -p roost && export PATH="$PWD/target/release:$PATH""#;

/// One command of a block: the shell text, the exit code it must have, the lines it prints.
#[derive(Debug)]
struct Step {
    cmd: String,
    exit: i32,
    expect: Vec<String>,
}

/// The text of README's section whose heading starts with `heading` (up to the next `## `).
fn section(readme: &str, heading: &str) -> String {
    let start = readme
        .find(&format!("\n## {heading}"))
        .unwrap_or_else(|| panic!("README has no section \"## {heading}\""));
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_owned()
}

/// The bodies of the section's ```sh blocks, in order.
fn sh_blocks(section: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut rest = section;
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + 6..];
        let close = body.find("```").expect("an unclosed ```sh block");
        blocks.push(body[..close].to_owned());
        rest = &body[close + 3..];
    }
    blocks
}

/// Commands (continuation lines joined), each with its `# exit N` and `# => TEXT` lines.
fn steps(block: &str) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut pending = String::new();
    for line in block.lines() {
        if let Some(want) = line.strip_prefix("# => ") {
            out.last_mut()
                .expect("a `# =>` line before any command")
                .expect
                .push(want.to_owned());
            continue;
        }
        if pending.is_empty() && (line.trim().is_empty() || line.starts_with('#')) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        let full = std::mem::take(&mut pending);
        let (cmd, comment) = match full.find("  # ") {
            Some(i) => (full[..i].trim_end().to_owned(), full[i..].to_owned()),
            None => (full.clone(), String::new()),
        };
        let exit = comment
            .split("# exit ")
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .map_or(0, |n| n.parse().expect("a number after `# exit`"));
        out.push(Step {
            cmd,
            exit,
            expect: Vec::new(),
        });
    }
    assert!(pending.is_empty(), "a block ends in a continuation line");
    out
}

/// The script that runs the steps, each followed by a marker line with its exit code.
fn script(steps: &[Step]) -> String {
    let mut s = String::from("exec 0</dev/null\n");
    for (i, st) in steps.iter().enumerate() {
        s.push_str(&format!("{}\necho \"@@step {i} rc=$?\"\n", st.cmd));
    }
    s
}

/// Whether `line` matches README's `want` (`...` matches any text).
fn matches(want: &str, line: &str) -> bool {
    let parts: Vec<&str> = want.split("...").collect();
    let mut at = 0;
    for (k, p) in parts.iter().enumerate() {
        match line[at..].find(p) {
            Some(i) if k > 0 || i == 0 => at += i + p.len(),
            _ => return false,
        }
    }
    parts.len() > 1 || at == line.len()
}

/// Runs the steps in `dir` in one bash (its own process group, killed at `limit`), then
/// checks every step's exit code and expected lines, and that nothing it started still runs.
fn run(dir: &Path, steps: &[Step], limit: Duration, what: &str) {
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(script(steps))
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run bash");
    let pgid = child.id();
    let until = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            group_signal(pgid, "KILL");
            panic!("{what}: the block did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let left = group_signal(pgid, "0");
    if left {
        group_signal(pgid, "KILL");
    }
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let ctx = format!("{what}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    assert!(
        !left,
        "{what}: a process the block started still runs after it\n{ctx}"
    );
    check(steps, &stdout, &ctx);
}

/// `kill -SIG -- -PGID`: whether any process of the group was there to take it.
fn group_signal(pgid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Each step's exit code and expected lines, from the script's stdout.
fn check(steps: &[Step], stdout: &str, ctx: &str) {
    let mut printed: Vec<&str> = Vec::new();
    let mut next = 0;
    for line in stdout.lines() {
        let Some(rc) = line.strip_prefix(&format!("@@step {next} rc=")) else {
            printed.push(line);
            continue;
        };
        let st = &steps[next];
        let rc: i32 = rc.parse().unwrap();
        assert_eq!(rc, st.exit, "`{}` exited {rc}\n{ctx}", st.cmd);
        for want in &st.expect {
            assert!(
                printed.iter().any(|l| matches(want, l)),
                "`{}` did not print README's line {want:?}\n{ctx}",
                st.cmd
            );
        }
        printed.clear();
        next += 1;
    }
    assert_eq!(next, steps.len(), "the block stopped early\n{ctx}");
}

/// A fresh directory as the repository's root looks to the blocks: `examples/`, and in
/// `target/release` a link to the `roost` this build made (what README's build line makes,
/// found through the block's `export PATH="$PWD/target/release:$PATH"`).
fn fresh_dir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let st = Command::new("cp")
        .arg("-r")
        .arg(repo.join("examples"))
        .arg(t.path())
        .status()
        .unwrap();
    assert!(st.success(), "copying examples/");
    let bin = t.path().join("target/release");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(common::BIN, bin.join("roost")).unwrap();
    t
}

fn readme() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&p).unwrap()
}

/// Goal: README's quickstart works as written, twice in one directory, each command printing
/// what README says; the first screen and the quickstart fit in 60 lines.
/// Method: its first block must be exactly the build line (not run: the test's `roost` is put
/// where it builds one); every command of the second is run.
#[test]
fn the_quickstart_runs_as_written_twice() {
    let text = readme();
    let end = text.find("\n## A three-node cluster").unwrap();
    let lines = text[..end].lines().count();
    assert!(
        lines < 60,
        "the first screen and quickstart take {lines} lines"
    );
    let blocks = sh_blocks(&section(&text, "Quickstart"));
    assert_eq!(
        blocks.len(),
        2,
        "the quickstart has a build block and a run block"
    );
    assert_eq!(blocks[0].trim(), BUILD_LINE, "the build line changed");
    println!("not run here: {BUILD_LINE} (this build's roost is put first on the PATH)");
    let steps: Vec<Step> = std::iter::once(Step {
        cmd: r#"export PATH="$PWD/target/release:$PATH""#.to_owned(),
        exit: 0,
        expect: Vec::new(),
    })
    .chain(steps(&blocks[1]))
    .collect();
    assert!(steps.iter().any(|s| !s.expect.is_empty()));
    let dir = fresh_dir();
    for round in ["first run", "second run"] {
        run(dir.path(), &steps, Duration::from_secs(120), round);
    }
}

/// Goal: README's cluster block (etcd, certificates, three nodes, a batch through a standby,
/// `cluster list`, the stop and the clean-up) works as written, twice from one directory.
/// Method: every command run; etcd on 2379/2380 and the nodes on 7401-7403 as the examples
/// say, so those ports must be free.
#[test]
fn the_cluster_block_runs_as_written_twice() {
    assert!(
        Path::new("/usr/bin/etcd").exists(),
        "install etcd-server (Debian) for README's cluster block"
    );
    for port in [2379, 2380, 7401, 7402, 7403] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "port {port} is taken: README's cluster block needs it"
        );
    }
    let text = readme();
    let sec = section(&text, "A three-node cluster");
    assert!(sec.contains("apt-get install -y\n--no-install-recommends etcd-server"));
    println!("not run here: apt-get install etcd-server (.ci/run installs it)");
    let blocks = sh_blocks(&sec);
    assert_eq!(blocks.len(), 1, "the cluster section has one block");
    let mut steps = vec![Step {
        cmd: r#"export PATH="$PWD/target/release:$PATH""#.to_owned(),
        exit: 0,
        expect: Vec::new(),
    }];
    steps.extend(self::steps(&blocks[0]));
    let dir = fresh_dir();
    for round in ["first run", "second run"] {
        run(dir.path(), &steps, Duration::from_secs(180), round);
    }
    assert!(!dir.path().join("cluster-data").exists());
}

#[test]
fn the_block_parser_reads_exit_codes_and_expected_lines() {
    let s = steps("a \\\n  b  # exit 3: why\n# => x...y\n# a comment\n\nc\n");
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].cmd, "a   b");
    assert_eq!(s[0].exit, 3);
    assert_eq!(s[0].expect, vec!["x...y".to_owned()]);
    assert_eq!(s[1].exit, 0);
    assert!(matches("x...y", "x 1 2 y"));
    assert!(!matches("x...y", "x 1 2"));
    assert!(matches("abc", "abc"));
    assert!(!matches("abc", "abcd"));
}
