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

/// `text` without `//` comments and without the items under `#[cfg(test)]` (a test module
/// or function, to its closing brace).
pub fn production_code(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            out.push_str(lines[i]);
            out.push('\n');
            i += 1;
            continue;
        }
        // Skip to the line where the item's braces close.
        let mut depth = 0i64;
        let mut opened = false;
        while i < lines.len() {
            for c in lines[i].chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            i += 1;
            out.push('\n'); // a blank line for each one dropped: the line numbers stay true
            if opened && depth <= 0 {
                break;
            }
        }
    }
    out
}
