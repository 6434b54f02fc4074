//! The daemon's folders are layers (ARCHITECTURE.md, "Code map"): each part may use only the
//! parts below it, so there is no module cycle. Cargo enforces the crate graph (the engine,
//! `roost-engine`, cannot use the command line or the drills of `roost` above it); this test
//! enforces the module graph inside both crates.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// The parts, lowest first. A part may refer to itself and to any part before it.
const LAYERS: &[&[&str]] = &[
    &["error", "layout", "logging"],
    &["batch"],
    &["config"],
    &["spool"],
    &["pipeline"],
    &["replica"],
    &["cluster"],
    &["control"],
    &["ops"],
    &["intake"],
    &["serve"],
    &["drill"],
    &["cli"],
];

fn rank(part: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&part))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The sources of the daemon's three crates, each `src` with the part its files belong to
/// (`None`: a file's part is its first path component) and its files: `engine/src`
/// (`roost-engine`), `drill/src` (`roost-drill`, all of it the part `drill`) and `daemon/src`
/// (`roost`: the command line). The two above the engine see its parts through re-exports,
/// so `crate::X` names the same parts in all three.
fn daemon_sources() -> Vec<(PathBuf, Option<&'static str>, Vec<PathBuf>)> {
    let daemon = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = daemon.parent().expect("the workspace root");
    [
        (root.join("engine/src"), None),
        (root.join("drill/src"), Some("drill")),
        (daemon.join("src"), None),
    ]
    .into_iter()
    .map(|(src, part)| {
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        (src, part, files)
    })
    .collect()
}

/// Every `crate::NAME` a file refers to.
fn crate_refs(text: &str) -> Vec<String> {
    text.match_indices("crate::")
        .map(|(i, m)| {
            text[i + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect()
        })
        .collect()
}

/// Goal: no part of the daemon refers to a part above it (which would allow a cycle), and
/// every part is in the table (a new folder must be placed).
/// Method: read every source file under `engine/src`, `drill/src` and `daemon/src`, take its
/// part (`drill` for the drill crate, else its first path component), and check each
/// `crate::X` it names against the layer table.
#[test]
fn every_part_uses_only_the_parts_below_it() {
    let sources = daemon_sources();
    let count: usize = sources.iter().map(|(_, _, f)| f.len()).sum();
    assert!(count > 20, "found only {count} files");
    let mut violations = Vec::new();
    for (src, part, files) in &sources {
        for f in files {
            let rel = f.strip_prefix(src).expect("under src");
            violations.extend(part_violations(rel, *part, f));
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// What file `f` (`rel` under its `src`) names of the parts above its own: `part`, or else
/// its first path component.
fn part_violations(rel: &Path, part: Option<&str>, f: &Path) -> Vec<String> {
    let first = rel.components().next().expect("a component");
    let part = match part {
        Some(p) => p.to_owned(),
        None => first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned(),
    };
    if part == "lib" || part == "main" {
        return Vec::new();
    }
    let Some(mine) = rank(&part) else {
        return vec![format!(
            "{}: part {part:?} is not in the layer table",
            rel.display()
        )];
    };
    let text = std::fs::read_to_string(f).expect("read source");
    let mut violations = Vec::new();
    for r in crate_refs(&text) {
        match rank(&r) {
            Some(theirs) if theirs <= mine => {}
            Some(_) => violations.push(format!(
                "{}: {part} uses {r}, a part above it",
                rel.display()
            )),
            None => violations.push(format!("{}: crate::{r} is not a known part", rel.display())),
        }
    }
    violations
}

/// Goal: the checker itself can fail: a reference upwards is reported.
#[test]
fn an_upward_reference_is_seen() {
    let refs = crate_refs("use crate::serve::x; crate::error::EngineError");
    assert_eq!(refs, ["serve", "error"]);
    assert!(rank("serve") > rank("pipeline"));
}

#[path = "layering/files.rs"]
mod files;

/// Goal: no two files of the daemon refer to each other in a circle (issue 30): each file
/// can be read knowing only the files below it.
/// Method: build the file graph from every path each file names (`layering/files.rs`) and
/// report every strongly connected component of more than one file.
#[test]
fn no_circle_between_files() {
    let mut edges = 0;
    for (src, _, list) in daemon_sources() {
        let g = files::graph(&src, &list);
        edges += g.values().map(|t| t.len()).sum::<usize>();
        let found = files::circles(&g);
        let text: Vec<String> = found.iter().map(|c| c.join(", ")).collect();
        assert!(
            found.is_empty(),
            "files in one circle, each line:\n{}",
            text.join("\n")
        );
    }
    assert!(edges > 100, "too few edges: {edges}");
}

/// The workspace's crates that have sources: every `members` entry of the root `Cargo.toml`
/// with a `src` folder, as (name, its `src`).
fn workspace_crates() -> Vec<(String, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    let start = manifest.find("members = [").expect("a members list");
    let list = &manifest[start..];
    let list = &list[list.find('[').expect("[") + 1..list.find(']').expect("]")];
    list.split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| (m.to_owned(), root.join(m).join("src")))
        .filter(|(_, src)| src.is_dir())
        .collect()
}

/// Goal: no two files of any crate in the workspace refer to each other in a circle (issue
/// 46; `no_circle_between_files` above is the daemon's, with its edge count): in every crate
/// each file can be read knowing only the files below it.
/// Method: for each workspace member with a `src` folder, build its file graph as for the
/// daemon and report every circle, named by crate.
#[test]
fn no_circle_between_files_in_any_crate() {
    let crates = workspace_crates();
    let names: Vec<&str> = crates.iter().map(|(n, _)| n.as_str()).collect();
    for must in [
        "daemon",
        "engine",
        "drill",
        "storage",
        "wal",
        "shards",
        "replication",
        "repmodel",
        "bench",
    ] {
        assert!(names.contains(&must), "crate {must} not found in {names:?}");
    }
    let mut text = Vec::new();
    for (name, src) in &crates {
        let mut list = Vec::new();
        rust_files(src, &mut list);
        let g = files::graph(src, &list);
        for c in files::circles(&g) {
            text.push(format!("{name}: {}", c.join(", ")));
        }
    }
    assert!(
        text.is_empty(),
        "files in one circle, each line:\n{}",
        text.join("\n")
    );
}

/// The most lines a source file may hold (issue 46): a file longer than this holds more than
/// one job. Unit-test files (`*tests.rs`) are not counted; an inline `#[cfg(test)]` module is.
const FILE_LINES_MAX: usize = 800;

/// Every non-test source file of `crates` (unit-test files `*tests.rs` aside): `f` is called
/// with its path as "crate/src/rel" and its text.
fn each_source(crates: &[(String, PathBuf)], mut f: impl FnMut(String, &str)) {
    for (name, src) in crates {
        let mut list = Vec::new();
        rust_files(src, &mut list);
        for file in list {
            let file_name = file.file_name().map(|n| n.to_string_lossy().into_owned());
            if file_name.is_some_and(|n| n.ends_with("tests.rs")) {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("a source file");
            let rel = file.strip_prefix(src).expect("under src").display();
            f(format!("{name}/src/{rel}"), &text);
        }
    }
}

/// The source files of `crates` over [`FILE_LINES_MAX`] lines, as "path (lines)".
fn files_over_the_limit(crates: &[(String, PathBuf)]) -> Vec<String> {
    let mut over = Vec::new();
    each_source(crates, |path, text| {
        let lines = text.lines().count();
        if lines > FILE_LINES_MAX {
            over.push(format!("{path} ({lines})"));
        }
    });
    over
}

/// Goal: no source file of any workspace crate is over 800 lines (issue 46), so a file's name
/// can say the one thing it holds.
/// Method: count the lines of every `.rs` file under each member's `src`, unit-test files
/// aside; the check is seen failing by `a_long_file_is_seen`.
#[test]
fn no_source_file_is_over_800_lines() {
    let crates = workspace_crates();
    assert!(crates.len() >= 10, "too few crates found: {}", crates.len());
    let over = files_over_the_limit(&crates);
    assert!(
        over.is_empty(),
        "files over {FILE_LINES_MAX} lines: {over:?}"
    );
}

/// STYLE.md: a function fits on a screen, as TigerBeetle's do.
const FN_LINES_MAX: usize = 70;

/// Whether `line` starts a function with a body (rustfmt layout): its indentation, else None.
fn fn_start(line: &str) -> Option<usize> {
    let t = line.trim_start();
    let mut rest = t;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let named = rest.starts_with("fn ") && !line.trim_end().ends_with(';');
    named.then(|| line.len() - t.len())
}

/// The lines of the function starting at `lines[i]` (to its closing brace at the same
/// indentation), or None for a trait method without a body.
fn fn_length(lines: &[&str], i: usize, ind: usize) -> Option<usize> {
    if lines[i].trim_end().ends_with('}') {
        return Some(1);
    }
    for (j, l) in lines.iter().enumerate().skip(i + 1) {
        let at = l.len() - l.trim_start().len();
        if at == ind && l.trim_start().starts_with('}') {
            return Some(j - i + 1);
        }
        if at == ind && l.trim_end().ends_with(';') {
            return None;
        }
    }
    None
}

/// The functions of `text` over [`FN_LINES_MAX`] lines, as (line, length); unit tests
/// (`#[cfg(test)] mod` blocks) aside.
fn long_functions(text: &str) -> Vec<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" && i + 1 < lines.len() {
            let next = lines[i + 1];
            let ind = next.len() - next.trim_start().len();
            if next.trim_start().starts_with("mod ") && next.trim_end().ends_with('{') {
                i += fn_length(&lines, i + 1, ind).unwrap_or(1) + 1;
                continue;
            }
        }
        if let Some(ind) = fn_start(lines[i]) {
            match fn_length(&lines, i, ind) {
                Some(n) if n > FN_LINES_MAX => out.push((i + 1, n)),
                _ => {}
            }
        }
        i += 1;
    }
    out
}

/// The functions over the limit in the non-test sources of `crates` (the test harness crate
/// under `tests/` aside), as "path:line (lines)".
fn functions_over_the_limit(crates: &[(String, PathBuf)]) -> Vec<String> {
    let harness = |src: &PathBuf| src.parent().is_some_and(|p| p.ends_with("tests"));
    let crates: Vec<(String, PathBuf)> = crates
        .iter()
        .filter(|(_, s)| !harness(s))
        .cloned()
        .collect();
    let mut over = Vec::new();
    each_source(&crates, |path, text| {
        for (line, n) in long_functions(text) {
            over.push(format!("{path}:{line} ({n})"));
        }
    });
    over
}

/// Goal: no function in the non-test sources of any workspace crate is over 70 lines
/// (STYLE.md; issue 46). Method: every `fn` with a body, from its line to its closing brace;
/// seen failing by `a_long_function_is_seen`.
#[test]
fn no_function_is_over_70_lines() {
    let crates = workspace_crates();
    let over = functions_over_the_limit(&crates);
    assert!(
        over.is_empty(),
        "functions over {FN_LINES_MAX} lines: {over:?}"
    );
}

#[test]
fn a_long_function_is_seen() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let text = format!(
        "pub(crate) fn long() {{\n{}}}\n\nfn fits() {{\n{}}}\ntrait T {{\n    fn m(&self);\n}}\n\
         #[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n",
        body(69),
        body(68),
        body(90)
    );
    assert_eq!(long_functions(&text), vec![(1, 71)]);
}

/// The unit-test files (`*tests.rs`) of `crates` not declared as `#[cfg(test)] mod NAME;` by
/// the file of their parent module, as paths.
fn test_files_not_under_cfg_test(crates: &[(String, PathBuf)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (_, src) in crates {
        let mut list = Vec::new();
        rust_files(src, &mut list);
        for f in list
            .iter()
            .filter(|f| f.to_string_lossy().ends_with("tests.rs"))
        {
            let stem = f.file_stem().map(|s| s.to_string_lossy().into_owned());
            let dir = f.parent().expect("a folder");
            let parents = [
                dir.join("mod.rs"),
                dir.join("lib.rs"),
                dir.with_extension("rs"),
            ];
            let declared = stem.is_some_and(|stem| {
                let decl = format!("#[cfg(test)]\nmod {stem};");
                parents.iter().any(|p| {
                    std::fs::read_to_string(p).is_ok_and(|t| t.replace("\r", "").contains(&decl))
                })
            });
            if !declared {
                bad.push(f.display().to_string());
            }
        }
    }
    bad
}

/// Goal: a unit-test file (`*tests.rs`, which the size check and `seam_writes.rs` pass over)
/// is compiled only for tests: its parent module declares it `#[cfg(test)] mod NAME;`.
/// Method: for each such file in every workspace crate, look for that declaration in its
/// parent module's file (`mod.rs`, `lib.rs` or the folder's `.rs`); a test below sees it fail.
#[test]
fn every_test_file_is_declared_under_cfg_test() {
    let crates = workspace_crates();
    let bad = test_files_not_under_cfg_test(&crates);
    assert!(
        bad.is_empty(),
        "test files not declared under #[cfg(test)]: {bad:?}"
    );
}

/// Goal: the declaration check can fail: `x_tests.rs` declared without `#[cfg(test)]` is
/// reported, `y_tests.rs` declared with it is not.
#[test]
fn a_test_file_outside_cfg_test_is_seen() {
    let dir = std::env::temp_dir().join(format!("roost-testfiles-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(
        src.join("a.rs"),
        "mod x_tests;\n#[cfg(test)]\nmod y_tests;\n",
    )
    .unwrap();
    std::fs::write(src.join("a/x_tests.rs"), "").unwrap();
    std::fs::write(src.join("a/y_tests.rs"), "").unwrap();
    let bad = test_files_not_under_cfg_test(&[("x".to_owned(), src)]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].ends_with("a/x_tests.rs"), "{bad:?}");
}

/// Goal: the size check can fail: a file of 801 lines is reported, one of 800 and a unit-test
/// file of 900 are not.
#[test]
fn a_long_file_is_seen() {
    let dir = std::env::temp_dir().join(format!("roost-size-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("long.rs"), "//\n".repeat(801)).unwrap();
    std::fs::write(src.join("fits.rs"), "//\n".repeat(800)).unwrap();
    std::fs::write(src.join("long_tests.rs"), "//\n".repeat(900)).unwrap();
    let over = files_over_the_limit(&[("x".to_owned(), src)]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(over, vec!["x/src/long.rs (801)".to_owned()]);
}

/// Goal: the circle finder can fail: a circle of three files through a `use` tree, a
/// `super::` path and an inline `crate::` call is reported; a re-export and a unit test's
/// `use` are not edges (else `a/mod.rs` would be in it).
#[test]
fn a_circle_is_seen() {
    let dir = tempfile_dir();
    let write = |p: &str, t: &str| {
        let p = dir.join(p);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, t).expect("write");
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    write(
        "a/mod.rs",
        "mod x;\nmod y;\npub use x::X;\nuse crate::b::B;\n",
    );
    write(
        "a/x.rs",
        "use super::y::Y;\n#[cfg(test)]\nmod t {\n    use crate::a::*;\n}\n",
    );
    write("a/y.rs", "pub fn f() { crate::b::g(); }\n");
    write("b.rs", "use crate::a::{\n    x::X,\n};\n");
    let mut list = Vec::new();
    rust_files(&dir, &mut list);
    let g = files::graph(&dir, &list);
    let mut found = files::circles(&g);
    found.iter_mut().for_each(|c| c.sort());
    assert_eq!(found, [["a/x.rs", "a/y.rs", "b.rs"]], "{g:?}");
    std::fs::remove_dir_all(&dir).expect("clean");
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("roost-layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Goal: no two files of the daemon share a name (`mod.rs` and each crate's `lib.rs` aside), so a name says which job
/// (issue 30 found four `stream.rs`, three `bulk.rs`, two `backup.rs`).
/// Method: count every file name under `engine/src`, `drill/src` and `daemon/src`.
#[test]
fn no_two_files_share_a_name() {
    let mut seen = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (src, _, list) in daemon_sources() {
        for f in &list {
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
            let rel = f
                .strip_prefix(&src)
                .expect("under src")
                .display()
                .to_string();
            seen.entry(name.unwrap_or_default()).or_default().push(rel);
        }
    }
    let twice: Vec<_> = seen
        .iter()
        .filter(|(n, paths)| !["mod.rs", "lib.rs"].contains(&n.as_str()) && paths.len() > 1)
        .collect();
    assert!(twice.is_empty(), "files that share a name: {twice:?}");
}

/// The crates the engine (`engine/src/pipeline/`) must not name: it sees replication only
/// through `LogRole` and `Fetched` (issue 46), etcd and the CLI not at all. (tokio is not
/// listed: `pipeline/intake_bytes.rs`, the intakes' byte budget, is an async semaphore.)
const ENGINE_MUST_NOT_NAME: &[&str] = &["roost_replication", "roost_etcd", "clap::"];

/// The forbidden crate paths a source text names outside comments.
fn forbidden_in(text: &str) -> Vec<&'static str> {
    let code: Vec<&str> = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect();
    ENGINE_MUST_NOT_NAME
        .iter()
        .filter(|c| code.iter().any(|l| l.contains(*c)))
        .copied()
        .collect()
}

/// Goal: the engine names no replication, etcd or CLI crate: the replication
/// protocol's types stay in the replica adapter (`engine/src/replica/`), which implements
/// the engine's traits for them.
/// Method: read every file under `engine/src/pipeline/` and look for those crates' paths
/// outside comments; the check itself is shown to fail on a text that names one.
#[test]
fn the_engine_names_no_replication_etcd_or_cli_crate() {
    assert_eq!(
        forbidden_in("use roost_replication::Entry;"),
        ["roost_replication"]
    );
    assert_eq!(forbidden_in("use roost_etcd as e;"), ["roost_etcd"]);
    assert!(forbidden_in("// roost_replication::Entry is the adapter's").is_empty());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/src/pipeline");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "only {} engine files", files.len());
    let bad: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let names = forbidden_in(&std::fs::read_to_string(f).expect("read"));
            (!names.is_empty()).then(|| format!("{}: {names:?}", f.display()))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "the engine names crates it must not: {bad:#?}"
    );
}

/// Goal: nothing above the engine turns its log role back into the concrete replication type
/// (issue 46: `LogRole::into_any` and `replica::of` downcast it from six places); what needs
/// the replication state holds it beside the engine (`replica::Node`).
/// Method: no `into_any`, `dyn Any` or downcast to a type (`downcast::<`, as opposed to an
/// error's `downcast_ref`, which the exit code's class needs) in the daemon's sources,
/// outside comments.
#[test]
fn no_downcast_of_the_log_role() {
    let mut found = Vec::new();
    for (_, _, list) in daemon_sources() {
        for f in &list {
            let text = std::fs::read_to_string(f).expect("a source file");
            for (n, line) in text.lines().enumerate() {
                let code = line.find("//").map_or(line, |i| &line[..i]);
                if ["into_any", "downcast::<", "dyn Any"]
                    .iter()
                    .any(|w| code.contains(w))
                {
                    found.push(format!("{}:{}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "a downcast of the role: {found:?}");
}
