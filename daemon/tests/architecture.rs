//! ARCHITECTURE.md checks itself (issue 30): every file path it names exists, and every
//! source file of every crate has its line in it, so the map cannot drift from the house.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

const SOURCE_ROOTS: &[&str] = &[
    "daemon/src",
    "storage/src",
    "wal/src",
    "shards/src",
    "keyindex/src",
    "replication/src",
    "etcd/src",
    "repmodel/src",
    "bench/src",
    "benchkit/src",
    "tests/src",
    "packaging/gen/src",
    "fuzz/src",
    "fuzz/fuzz_targets",
];

/// File kinds a path names; a word in backquotes ending in one of these is a path.
const EXTENSIONS: &[&str] = &[".rs", ".md", ".toml", ".tla", ".py", ".conf", ".service"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() && !name.starts_with('.') && name != "target" {
            walk(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

/// Every file of the repository, as a `/`-joined path from its root.
fn repo_files() -> Vec<String> {
    let root = repo();
    let mut all = Vec::new();
    walk(&root, &mut all);
    all.iter()
        .map(|p| {
            p.strip_prefix(&root)
                .expect("under root")
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect()
}

/// The words in backquotes that name files: `pipeline/plan.rs`, `docs/cluster.md`.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.contains(' ') && !w.contains('*') && !w.contains('<'))
        .filter(|w| EXTENSIONS.iter().any(|x| w.ends_with(x)))
        .map(str::to_owned)
        .collect()
}

/// A named path exists when some file of the repository ends with it at a `/` boundary
/// (`plan.rs` under the pipeline's heading, `daemon/src/pipeline/plan.rs` in full).
fn exists(named: &str, files: &[String]) -> bool {
    files
        .iter()
        .any(|f| f == named || f.ends_with(&format!("/{named}")))
}

/// Paths outside this repository: where the package installs (`/etc/roost/roost.toml`,
/// checked by `packaging/deb-check`) and the shared design beside it (`shared/`, the TLA+
/// specs), which a clone of this repository does not hold.
fn outside(named: &str) -> bool {
    named.starts_with('/') || named.starts_with("shared/") || named.ends_with(".tla")
}

/// Goal: every file path ARCHITECTURE.md names exists (a moved or deleted file fails here).
/// Method: take every backquoted word ending in a file extension, find a repository file
/// that ends with it.
#[test]
fn every_path_it_names_exists() {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let files = repo_files();
    let named = named_paths(&text);
    assert!(named.len() > 100, "only {} paths named", named.len());
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| !outside(n) && !exists(n, &files))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

/// Goal: every source file of every crate has its line in ARCHITECTURE.md's file list.
/// Method: for each `.rs` file under a crate's `src/`, look for its full path in backquotes.
#[test]
fn every_source_file_has_its_line() {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let named = named_paths(&text);
    let files = repo_files();
    let sources: Vec<&String> = files
        .iter()
        .filter(|f| {
            f.ends_with(".rs") && SOURCE_ROOTS.iter().any(|r| f.starts_with(&format!("{r}/")))
        })
        .collect();
    assert!(
        sources.len() > 100,
        "only {} source files found",
        sources.len()
    );
    let unlisted: Vec<&&String> = sources.iter().filter(|s| !named.contains(s)).collect();
    assert!(
        unlisted.is_empty(),
        "source files without a line in ARCHITECTURE.md: {unlisted:#?}"
    );
}

/// Goal: the checks can fail: a made-up path is not found, a real one is, and a phrase in
/// backquotes is not taken for a path.
#[test]
fn the_checks_can_fail() {
    let files = repo_files();
    assert!(exists("daemon/src/pipeline/plan.rs", &files));
    assert!(exists("plan.rs", &files));
    assert!(!exists("pipeline/no_such_file.rs", &files));
    assert!(!exists("lan.rs", &files), "a suffix must start at a `/`");
    let words = named_paths("see `a/b.rs` and `not a path.rs` and `c.md`, `x`");
    assert_eq!(words, ["a/b.rs", "c.md"]);
}
