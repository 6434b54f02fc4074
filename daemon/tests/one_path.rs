//! One finish function and one durability tail (issue 46): every answer reaches the spool
//! through `Answers::deliver` (the only caller of the publisher's writes, and with
//! recovery's ownership check the only remover of an input), and every claim's applied
//! effects become durable through `effects_durable`'s halves (the only sender of a shard
//! flush). ARCHITECTURE.md names both; this test fails
//! when a second path appears in the engine's production code.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod source;

use std::collections::BTreeSet;

use source::{production_code, repo, rust_files};

/// (what is called, the functions allowed to call it, as `file:fn`).
const ONE_PATH: &[(&str, &[&str])] = &[
    (".publish_many(", &["pipeline/answers.rs:publish_all"]),
    (".publish_bytes(", &[]),
    (
        ".publish(",
        &[
            "pipeline/answers.rs:publish_all",
            // `Engine::publish`, which delivers (`finish.rs`).
            "intake/invalid_files.rs:quarantine",
        ],
    ),
    ("::publish", &[]),
    (
        "remove_input(",
        &[
            "pipeline/answers.rs:remove_input",
            "pipeline/answers.rs:deliver",
            "pipeline/names.rs:recovery_answer",
        ],
    ),
    (".send_flush(", &["pipeline/effects_flush.rs:send_flushes"]),
];

/// The name of the function whose body holds byte `at` of `code`: the last `fn NAME` before
/// it (closures and nested blocks belong to their function).
fn enclosing_fn(code: &str, at: usize) -> String {
    let before = &code[..at];
    let Some(i) = before.rfind("fn ") else {
        return "(top level)".to_owned();
    };
    before[i + 3..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Every (`file:fn`, call) in the engine crate's production code outside `spool/` (the
/// publisher's own module) for the calls of [`ONE_PATH`].
fn callers(files: &[(String, String)]) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for (name, code) in files {
        for (call, _) in ONE_PATH {
            for (at, _) in code.match_indices(call) {
                // A definition (`fn remove_input(`) is not a call.
                if code[..at].ends_with("fn ") || code[..at].ends_with("fn") {
                    continue;
                }
                found.insert((
                    format!("{name}:{}", enclosing_fn(code, at)),
                    call.to_string(),
                ));
            }
        }
    }
    found
}

/// The calls made from a function not allowed to make them.
fn second_paths(found: &BTreeSet<(String, String)>) -> Vec<String> {
    let allowed = |who: &str, call: &str| {
        ONE_PATH
            .iter()
            .any(|(c, fns)| *c == call && fns.contains(&who))
    };
    found
        .iter()
        .filter(|(who, call)| !allowed(who, call))
        .map(|(who, call)| format!("{who} calls {call}"))
        .collect()
}

fn engine_sources() -> Vec<(String, String)> {
    let root = repo().join("engine/src");
    let mut paths = Vec::new();
    rust_files(&root, &mut paths);
    paths
        .iter()
        .filter(|p| !p.to_string_lossy().ends_with("_tests.rs"))
        .filter_map(|p| {
            let name = p.strip_prefix(&root).ok()?.to_string_lossy().into_owned();
            let text = std::fs::read_to_string(p).ok()?;
            (!name.starts_with("spool/")).then(|| (name, production_code(&text)))
        })
        .collect()
}

/// Goal: see the module comment. Method: find every call of [`ONE_PATH`] in the engine's
/// production code and the function it is in; any function not listed is a second path.
#[test]
fn every_answer_goes_through_deliver_and_every_flush_through_the_one_tail() {
    let files = engine_sources();
    assert!(files.len() > 50, "the engine's sources were not found");
    let found = callers(&files);
    for (call, fns) in ONE_PATH {
        for f in fns.iter() {
            let seen = found.iter().any(|(who, c)| who == f && c == call);
            assert!(seen, "{f} no longer calls {call}: update the list");
        }
    }
    let second = second_paths(&found);
    assert!(
        second.is_empty(),
        "a second finish or tail path: {second:?}"
    );
}

/// The two halves are named where ARCHITECTURE.md says (its own test checks that each
/// name it places is defined in the file it names).
#[test]
fn architecture_names_the_one_finish_and_the_one_tail() {
    let text = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for placed in [
        "`Answers::deliver` in `engine/src/pipeline/answers.rs`",
        "`effects_durable` in `engine/src/pipeline/effects_flush.rs`",
    ] {
        assert!(
            text.contains(placed),
            "ARCHITECTURE.md does not say {placed}"
        );
    }
}

#[test]
fn a_second_path_is_seen() {
    let text = "fn sneak() {\n    self.publisher.publish_many(&x);\n}\nfn one(p: &Publisher) {\n    p.publish(name, r)?;\n    p.publish_bytes(name, b)?;\n    Publisher::publish_many(p, &x)?;\n}\n#[cfg(test)]\nmod tests;\nfn after() { s.send_flush(0); }\n";
    let files = vec![("pipeline/plan.rs".to_owned(), production_code(text))];
    let second = second_paths(&callers(&files));
    let expected = [
        "pipeline/plan.rs:after calls .send_flush(",
        "pipeline/plan.rs:one calls .publish(",
        "pipeline/plan.rs:one calls .publish_bytes(",
        "pipeline/plan.rs:one calls ::publish",
        "pipeline/plan.rs:sneak calls .publish_many(",
    ];
    assert_eq!(second, expected);
}

#[test]
fn the_source_reader_keeps_what_it_must() {
    source::production_code_self_check();
}
