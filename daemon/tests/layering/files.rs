//! The file graph of a crate's sources: which file each file refers to, read from the paths
//! it names (`use` trees expanded, `crate::`, `super::`, `self::` and a declared child
//! module's name), each resolved to the deepest file that defines a prefix of it. Comments
//! and everything from the first `#[cfg(test)]` on (the unit tests) are left out, and so is a
//! `pub use` re-export (a folder's facade: what it shows, not what it needs).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// File (relative to `src`) -> the files it refers to.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module path a file defines: `pipeline/mod.rs` -> `pipeline`, `lib.rs` -> ``.
fn module_of(file: &str) -> Vec<String> {
    let stem = file.trim_end_matches(".rs");
    let mut parts: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The source with comments and inline unit-test modules (`#[cfg(test)] mod x { .. }`) cut
/// away.
fn code_of(text: &str) -> String {
    let text: Vec<&str> = text
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect();
    let (mut out, mut skip, mut depth, mut armed) = (String::new(), false, 0i64, false);
    for line in text {
        let t = line.trim();
        if t == "#[cfg(test)]" {
            armed = true;
            continue;
        }
        if armed && t.starts_with("mod ") && t.ends_with('{') {
            (skip, depth) = (true, 0);
        }
        armed = false;
        if skip {
            depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            skip = depth > 0;
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `a::{b, c::{d, e}}` -> `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let (Some(open), true) = (tree.find('{'), tree.ends_with('}')) else {
        return vec![tree.to_owned()];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.len() - 1]);
    let mut items = vec![String::new()];
    let mut depth = 0;
    for ch in inner.chars() {
        depth += i32::from(ch == '{') - i32::from(ch == '}');
        match ch {
            ',' if depth == 0 => items.push(String::new()),
            _ => items.last_mut().expect("one item at least").push(ch),
        }
    }
    items
        .iter()
        .filter(|i| !i.trim().is_empty())
        .flat_map(|i| expand(i))
        .map(|e| format!("{prefix}{e}"))
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Where a `use` statement starts on a line: `Some(true)` for a re-export (`pub use`).
fn use_start(line: &str) -> Option<bool> {
    let l = line.trim_start();
    let l = l.strip_prefix("pub(crate) ").map_or(l, |r| r);
    if l.starts_with("use ") {
        return Some(false);
    }
    l.strip_prefix("pub ")
        .filter(|r| r.starts_with("use "))
        .map(|_| true)
}

/// Every path in `code` that starts with one of `heads` (`crate`, `super`, `self`, a child
/// module's name), as its segments; `use` statements expanded, re-exports skipped.
fn paths_in(code: &str, heads: &BTreeSet<String>) -> Vec<Vec<String>> {
    let (mut raw, mut rest) = (Vec::new(), String::new());
    let mut stmt: Option<(bool, String)> = None;
    for line in code.lines() {
        if stmt.is_none() {
            match use_start(line) {
                Some(reexport) => stmt = Some((reexport, String::new())),
                None => {
                    rest.push_str(line);
                    rest.push('\n');
                    continue;
                }
            }
        }
        let Some((reexport, text)) = stmt.as_mut() else {
            continue;
        };
        text.push_str(line);
        if let Some(end) = text.find(';') {
            let tree = text[..end].trim_start();
            let tree = tree.split_once("use ").map_or("", |(_, t)| t);
            if !*reexport {
                raw.extend(expand(tree));
            }
            stmt = None;
        }
    }
    raw.extend(inline_paths(&rest, heads));
    raw.iter()
        .map(|p| {
            p.split("::")
                .map(|s| s.split(" as ").next().unwrap_or("").trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .filter(|p: &Vec<String>| p.first().is_some_and(|h| heads.contains(h)))
        .collect()
}

/// `head::x::y` occurrences in code outside `use` statements.
fn inline_paths(code: &str, heads: &BTreeSet<String>) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts =
            is_ident(chars[i]) && (i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len()
            && (is_ident(chars[j]) || (chars[j] == ':' && chars.get(j + 1) == Some(&':')))
        {
            j += if chars[j] == ':' { 2 } else { 1 };
        }
        let path: String = chars[i..j].iter().collect();
        let head = path.split("::").next().unwrap_or("");
        if path.contains("::") && heads.contains(head) {
            out.push(path);
        }
        i = j.max(i + 1);
    }
    out
}

/// The child modules a file declares (`mod x;`, `pub mod x;`, `pub(crate) mod x;`).
fn children_of(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l
                .strip_prefix("pub(crate) ")
                .or_else(|| l.strip_prefix("pub "))
                .unwrap_or(l);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            name.chars().all(is_ident).then(|| name.to_owned())
        })
        .collect()
}

/// A path's absolute module path, seen from the module `me`.
fn absolute(me: &[String], path: &[String]) -> Vec<String> {
    match path.first().map(String::as_str) {
        Some("crate") => path[1..].to_vec(),
        Some("self") => [me, &path[1..]].concat(),
        Some("super") => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let base = &me[..me.len().saturating_sub(ups)];
            [base, &path[ups..]].concat()
        }
        _ => [me, path].concat(),
    }
}

/// The graph of the `.rs` files under `src`, named relative to it.
pub fn graph(src: &Path, files: &[std::path::PathBuf]) -> Graph {
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            f.strip_prefix(src)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/")
        })
        .collect();
    let by_module: BTreeMap<Vec<String>, String> = names
        .iter()
        .filter(|n| *n != "main.rs")
        .map(|n| (module_of(n), n.clone()))
        .collect();
    let resolve = |m: &[String]| {
        (1..=m.len())
            .rev()
            .find_map(|k| by_module.get(&m[..k]).cloned())
    };
    let mut g = Graph::new();
    for (name, file) in names.iter().zip(files) {
        let code = code_of(&std::fs::read_to_string(file).expect("read source"));
        let mut heads = children_of(&code);
        heads.extend(["crate", "super", "self"].map(str::to_owned));
        let me = module_of(name);
        let targets = paths_in(&code, &heads)
            .iter()
            .filter_map(|p| resolve(&absolute(&me, p)))
            .filter(|t| t != name)
            .collect();
        g.insert(name.clone(), targets);
    }
    g
}

/// The circles of `g`: its strongly connected components of more than one file (Tarjan).
pub fn circles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                t.low.entry(v).and_modify(|l| *l = (*l).min(lw));
            } else if t.stack.contains(&w) {
                let iw = t.index[w];
                t.low.entry(v).and_modify(|l| *l = (*l).min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let at = t.stack.iter().rposition(|x| *x == v).expect("on the stack");
            let comp: Vec<String> = t.stack.drain(at..).map(str::to_owned).collect();
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}
