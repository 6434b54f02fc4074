//! Reading the workspace's own sources for the tests that hold the code to a shape (one
//! path per job, every write through the seam): where they are, and their production code
//! without comments and `#[cfg(test)]` items.

use std::path::{Path, PathBuf};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `line` without its `//` comment; a `//` inside a string literal (`"http://"`) is kept.
fn without_comment(line: &str) -> &str {
    let mut in_str = false;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '"' if prev != '\\' => in_str = !in_str,
            '/' if !in_str && prev == '/' => return &line[..i - 1],
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    line
}

/// `text` without `//` comments and without the items under `#[cfg(test)]` (a test module
/// or function, to its closing brace; a `mod x;` or `use` line, to its `;`).
pub fn production_code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(without_comment).collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            out.push_str(lines[i]);
            out.push('\n');
            i += 1;
            continue;
        }
        // Skip to the line where the item's braces close, or where it ends without any.
        let mut depth = 0i64;
        let mut opened = false;
        while i < lines.len() {
            let mut ended = false;
            for c in lines[i].chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    ';' if !opened => ended = true,
                    _ => {}
                }
            }
            i += 1;
            out.push('\n'); // a blank line for each one dropped: the line numbers stay true
            if (opened && depth <= 0) || ended {
                break;
            }
        }
    }
    out
}

/// The reader's own checks: what it keeps and what it drops.
#[allow(dead_code)] // run by one_path.rs; seam_writes.rs shares the module
pub fn production_code_self_check() {
    let text = "#[cfg(test)]\nmod tests;\nfn kept() { x.publish(); } // a.publish_many(\nfn url() { get(\"http://h\"); p.publish_bytes(b); }\n#[cfg(test)]\nmod t {\n    fn gone() { p.publish(); }\n}\nfn after() {}\n";
    let code = production_code(text);
    assert!(code.contains("fn kept() { x.publish(); }"), "{code}");
    assert!(!code.contains("publish_many"), "a comment was kept: {code}");
    assert!(
        code.contains("p.publish_bytes(b)"),
        "a string's // cut the line: {code}"
    );
    assert!(!code.contains("gone"), "a test module was kept: {code}");
    assert!(
        code.contains("fn after() {}"),
        "the item after a test module went: {code}"
    );
    assert_eq!(
        code.lines().count(),
        text.lines().count(),
        "line numbers moved"
    );
}
