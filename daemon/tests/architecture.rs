//! ARCHITECTURE.md checks itself (issues 30 and 46): it stays short (at most 250 lines),
//! every path it names exists, every folder of sources is on its map, every source file
//! says what it holds in its own `//!` comment, and every name it places ("`name` in
//! `path`") is defined in that file: a false line fails here.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

const SOURCE_ROOTS: &[&str] = &[
    "daemon/src",
    "engine/src",
    "drill/src",
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
    "sim/src",
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
/// (`plan.rs` under the pipeline's heading, `engine/src/pipeline/plan.rs` in full).
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
    let text = architecture();
    let files = repo_files();
    let named = named_paths(&text);
    assert!(named.len() > 40, "only {} paths named", named.len());
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| !outside(n) && !exists(n, &files))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

/// At most this many lines: a map short enough to stay true (rust-analyzer's
/// architecture.md is the model: only what rarely changes).
const LINES_MAX: usize = 250;

fn architecture() -> String {
    std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

/// Goal: the map stays short.
#[test]
fn it_is_short() {
    let lines = architecture().lines().count();
    assert!(
        lines <= LINES_MAX,
        "ARCHITECTURE.md has {lines} lines, at most {LINES_MAX}"
    );
}

/// The source files of every crate, as repository paths.
fn sources(files: &[String]) -> Vec<&String> {
    files
        .iter()
        .filter(|f| {
            f.ends_with(".rs") && SOURCE_ROOTS.iter().any(|r| f.starts_with(&format!("{r}/")))
        })
        .collect()
}

/// Goal: every folder that holds source files is on the map (named as `folder/`), so a new
/// folder needs its place.
#[test]
fn every_source_folder_is_on_the_map() {
    let text = architecture();
    let files = repo_files();
    let mut folders: Vec<&str> = sources(&files)
        .iter()
        .filter_map(|f| f.rsplit_once('/').map(|(d, _)| d))
        .collect();
    folders.sort_unstable();
    folders.dedup();
    assert!(folders.len() > 20, "only {} folders found", folders.len());
    let missing: Vec<&&str> = folders
        .iter()
        .filter(|d| !text.contains(&format!("`{d}/`")))
        .collect();
    assert!(missing.is_empty(), "folders not on the map: {missing:#?}");
}

/// Whether a source file opens with a `//!` comment (after attributes and blank lines).
fn says_what_it_holds(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("#!["))
        .is_some_and(|l| l.starts_with("//!"))
}

/// Goal: every source file of every crate says what it holds in its own `//!` comment (the
/// map names folders; the files describe themselves).
#[test]
fn every_source_file_says_what_it_holds() {
    let root = repo();
    let files = repo_files();
    let sources = sources(&files);
    assert!(sources.len() > 100, "only {} source files", sources.len());
    let silent: Vec<&&String> = sources
        .iter()
        .filter(|f| !says_what_it_holds(&std::fs::read_to_string(root.join(f)).expect("read")))
        .collect();
    assert!(
        silent.is_empty(),
        "source files without a `//!` comment: {silent:#?}"
    );
}

/// Each "`name` in `path.rs`" of the text: (name, path).
fn placed_names(text: &str) -> Vec<(String, String)> {
    let parts: Vec<&str> = text.split('`').collect();
    let mut out = Vec::new();
    // parts[1], parts[3], ... are in backquotes; parts[i + 1] is the text between two.
    for i in (1..parts.len().saturating_sub(2)).step_by(2) {
        let (name, between, path) = (parts[i], parts[i + 1], parts[i + 2]);
        let is_name = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
        if is_name && between == " in " && path.ends_with(".rs") {
            out.push((name.to_owned(), path.to_owned()));
        }
    }
    out
}

/// Whether `source` defines `name` (`Type::method`: an `impl` of the type (or the type
/// itself) is there and the method defined; else a fn, type, trait, const, static or macro of that name).
fn defines(source: &str, name: &str) -> bool {
    let (ty, item) = match name.rsplit_once("::") {
        Some((ty, item)) => (Some(ty.rsplit("::").next().unwrap_or(ty)), item),
        None => (None, name),
    };
    let kinds = [
        "fn", "struct", "enum", "trait", "const", "static", "type", "mod",
    ];
    let defined = kinds.iter().any(|k| {
        source.contains(&format!("{k} {item}("))
            || source.contains(&format!("{k} {item} "))
            || source.contains(&format!("{k} {item}<"))
            || source.contains(&format!("{k} {item};"))
            || source.contains(&format!("{k} {item}:"))
    });
    let has_type = |t: &str| {
        ["impl ", "for ", "struct ", "enum ", "trait "]
            .iter()
            .any(|k| source.contains(&format!("{k}{t} ")) || source.contains(&format!("{k}{t}<")))
    };
    defined && ty.is_none_or(has_type)
}

/// Goal: every name ARCHITECTURE.md places in a file ("`Engine::submit` in
/// `engine/src/pipeline/plan.rs`") is defined there: a moved or renamed function fails here.
#[test]
fn every_name_it_places_is_defined_there() {
    let text = architecture();
    let placed = placed_names(&text);
    assert!(placed.len() >= 25, "only {} names placed", placed.len());
    let wrong: Vec<&(String, String)> = placed
        .iter()
        .filter(|(name, path)| {
            let source = std::fs::read_to_string(repo().join(path)).unwrap_or_default();
            !defines(&source, name)
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "names not defined where ARCHITECTURE.md places them: {wrong:#?}"
    );
}

/// Goal: the checks can fail: a made-up path is not found, a real one is, and a phrase in
/// backquotes is not taken for a path.
#[test]
fn the_checks_can_fail() {
    let files = repo_files();
    assert!(exists("engine/src/pipeline/plan.rs", &files));
    assert!(exists("plan.rs", &files));
    assert!(!exists("pipeline/no_such_file.rs", &files));
    assert!(!exists("lan.rs", &files), "a suffix must start at a `/`");
    let words = named_paths("see `a/b.rs` and `not a path.rs` and `c.md`, `x`");
    assert_eq!(words, ["a/b.rs", "c.md"]);
    let placed =
        placed_names("`Engine::submit` in `a/plan.rs`, `x` and `y` in `b.md`, `f` in `c.rs`");
    assert_eq!(
        placed,
        [
            ("Engine::submit".to_owned(), "a/plan.rs".to_owned()),
            ("f".to_owned(), "c.rs".to_owned())
        ]
    );
    let plan = std::fs::read_to_string(repo().join("engine/src/pipeline/plan.rs")).expect("plan");
    assert!(defines(&plan, "Engine::submit"));
    assert!(!defines(&plan, "Engine::no_such_method"));
    assert!(
        !defines(&plan, "Wal::submit"),
        "the type must be named there too"
    );
    assert!(!defines("fn submitted(", "submit"));
    assert!(says_what_it_holds(
        "#![forbid(unsafe_code)]\n\n//! What it holds.\nfn f() {}"
    ));
    assert!(!says_what_it_holds("// A plain comment.\n//! Too late."));
}
