//! The bad-input corpus (`tests/corpus/`, expectations in `MANIFEST.tsv`), run as one
//! table-driven test in-process, and dropped, mixed with valid batches and with hostile
//! non-files, into a running daemon.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use roost::batch::{self, Status};
use roost::config::Config;
use roost::pipeline::crash::NoCrash;
use roost::pipeline::{one_answer, Deliver, Engine, EngineOptions};
use roost_storage::SimStorage;
use serde_json::Value;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// (file, status, error substring)
fn manifest() -> Vec<(String, String, String)> {
    std::fs::read_to_string(corpus_dir().join("MANIFEST.tsv"))
        .expect("manifest")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut p = l.splitn(3, '\t');
            let f = p.next().unwrap_or_default().to_owned();
            let s = p.next().unwrap_or_default().to_owned();
            let e = p.next().unwrap_or_default().to_owned();
            (f, s, e)
        })
        .collect()
}

/// Asserts that `r`, the answer for `name`, has `status` and an error or reason containing
/// `err`; returns that error or reason.
fn assert_answer<'a>(name: &str, r: &'a Value, status: &str, err: &str) -> &'a str {
    assert_eq!(r["status"], status, "{name}: {r}");
    let text = r["error"].as_str().or(r["reason"].as_str()).unwrap_or("");
    assert!(text.contains(err), "{name}: {text:?} lacks {err:?}");
    text
}

/// Goal: every corpus file gets exactly the status and error the manifest names, through the
/// same parse and pipeline the daemon uses (in-process, over the simulated disk).
#[test]
fn corpus_table() {
    let disk = SimStorage::new();
    let cfg = Config {
        data_dir: "/sim/d".into(),
        ..Config::default()
    };
    let engine = Engine::open(EngineOptions {
        storage: Arc::new(disk.clone()),
        config: Arc::new(cfg.clone()),
        crash: Arc::new(NoCrash),
        log_role: std::sync::Arc::new(roost::replica::Opener::default()),
    })
    .unwrap();
    let cases = manifest();
    assert!(cases.len() >= 35, "corpus has {} cases", cases.len());
    for (file, status, err) in &cases {
        let bytes = std::fs::read(corpus_dir().join(file)).unwrap();
        let (got_status, got_err) = match batch::parse(&bytes, cfg.batch_ops_max) {
            Err(inv) => ("invalid".to_owned(), inv.error),
            Ok(b) => {
                let r = engine
                    .submit(&[(&b, file.as_str())], Deliver::Files)
                    .unwrap();
                let r = one_answer(r).unwrap();
                let s = serde_json::to_value(r.status())
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned();
                (s, r.reason().unwrap_or_default().to_owned())
            }
        };
        assert_eq!(&got_status, status, "{file}: {got_err}");
        assert!(
            got_err.contains(err.as_str()),
            "{file}: error {got_err:?} lacks {err:?}"
        );
    }
    // Nothing invalid reached the WAL; each rejection is recorded there, as a rejection
    // (issue 13, item 6), and nothing else.
    let rejected = cases.iter().filter(|(_, s, _)| s == "rejected").count() as u64;
    assert_eq!(
        engine.wal().next_lsn(),
        1 + rejected,
        "a bad input wrote to the WAL"
    );
    let kinds: Vec<_> = roost::pipeline::records::read_wal(engine.wal(), 1)
        .map(|e| e.expect("wal record").1)
        .collect();
    assert!(
        kinds
            .iter()
            .all(|k| matches!(k, roost::pipeline::records::WalEntry::Rejected(_))),
        "{kinds:?}"
    );
    println!("corpus: {} cases", cases.len());
}

/// Goal: the whole corpus, hostile non-files (symlink, hard link, FIFO, device node,
/// directory, a 2 GiB sparse file) and valid batches dropped at once into a running daemon:
/// every valid batch commits, every bad file is quarantined in failed/ with its reason in
/// out/, nothing blocks, and the daemon still serves afterwards.
#[test]
fn corpus_into_a_running_daemon() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let mut child = serve_ready(&data, &t.path().join("serve.log"), &[]);
    let spool = data.join("spool");
    let new = spool.join("new");
    let mut expect: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (file, status, err) in manifest() {
        drop_in(
            &spool,
            &file,
            &std::fs::read(corpus_dir().join(&file)).unwrap(),
        );
        expect.insert(file, (status, err));
    }
    for i in 0..20 {
        let name = format!("valid-{i}.json");
        drop_in(&spool, &name, format!(r#"{{"request_key":"valid-{i}","ops":[{{"op":"create","shard":"s","record":{{"i":{i}}}}}]}}"#).as_bytes());
        expect.insert(name, ("committed".into(), String::new()));
    }
    // Hostile entries, made in place.
    let secret = t.path().join("secret");
    std::fs::write(
        &secret,
        b"{\"request_key\":\"stolen\",\"ops\":[{\"op\":\"create\",\"shard\":\"s\",\"record\":{}}]}",
    )
    .unwrap();
    std::os::unix::fs::symlink(&secret, new.join("symlink.json")).unwrap();
    expect.insert(
        "symlink.json".into(),
        ("invalid".into(), "symbolic link".into()),
    );
    std::fs::hard_link(&secret, new.join("hardlink.json")).unwrap();
    expect.insert(
        "hardlink.json".into(),
        ("invalid".into(), "hard links".into()),
    );
    assert!(Command::new("mkfifo")
        .arg(new.join("fifo.json"))
        .status()
        .unwrap()
        .success());
    expect.insert("fifo.json".into(), ("invalid".into(), "FIFO".into()));
    std::fs::create_dir(new.join("dir.json")).unwrap();
    expect.insert("dir.json".into(), ("invalid".into(), "directory".into()));
    if Command::new("mknod")
        .arg(new.join("dev.json"))
        .args(["c", "1", "3"])
        .status()
        .is_ok_and(|s| s.success())
    {
        expect.insert("dev.json".into(), ("invalid".into(), "device node".into()));
    }
    let huge = spool.join("tmp").join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    std::fs::rename(&huge, new.join("huge.json")).unwrap();
    expect.insert(
        "huge.json".into(),
        ("invalid".into(), "over spool_file_bytes_max".into()),
    );

    let out = spool.join("out");
    wait_for("every result", Duration::from_secs(60), || {
        expect.keys().all(|n| out.join(n).exists())
    });
    let mut quarantined = 0;
    for (name, (status, err)) in &expect {
        let r: Value = serde_json::from_slice(&std::fs::read(out.join(name)).unwrap()).unwrap();
        assert_answer(name, &r, status, err);
        if status == "invalid" {
            assert!(
                spool.join("failed").join(name).symlink_metadata().is_ok(),
                "{name} not kept in failed/"
            );
            assert!(
                new.join(name).symlink_metadata().is_err(),
                "{name} still in new/"
            );
            quarantined += 1;
        }
    }
    // The secret behind the links was never applied, and the valid ones all were.
    let scan = Command::new(BIN)
        .args(["scan", "s", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&scan.stdout);
    assert_eq!(text.lines().count(), 20, "{text}");
    // Still serving.
    drop_and_wait(&spool, "after", Duration::from_secs(20));
    let r: Value = serde_json::from_slice(&std::fs::read(out.join("after.json")).unwrap()).unwrap();
    assert_eq!(r["status"], "committed");
    assert!(child.exited().unwrap().is_none(), "daemon died");
    println!("{} inputs, {quarantined} quarantined", expect.len());
    assert_eq!(
        Status::Invalid,
        serde_json::from_str::<Status>("\"invalid\"").unwrap()
    );
}

/// One expected result line of a bulk file: (line or `-` or `*`, status, error substring).
type BulkExpect = (String, String, String);

/// `corpus/bulk/MANIFEST.tsv`, by file.
fn bulk_manifest() -> BTreeMap<String, Vec<BulkExpect>> {
    let text = std::fs::read_to_string(corpus_dir().join("bulk/MANIFEST.tsv")).expect("manifest");
    let mut by_file: BTreeMap<String, Vec<BulkExpect>> = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = l.splitn(4, '\t').collect();
        let get = |i: usize| f.get(i).copied().unwrap_or_default().to_owned();
        by_file
            .entry(get(0))
            .or_default()
            .push((get(1), get(2), get(3)));
    }
    by_file
}

/// The generated bulk cases (too large for the repository) in `spool`, with their
/// expectations under the default limits: more lines than `bulk_lines_max`, a line over
/// `bulk_line_bytes_max` between two good ones, and a sparse 10 GiB file (a line that
/// never ends) over `bulk_file_bytes_max`.
fn generated_bulk_cases(spool: &Path, expect: &mut BTreeMap<String, Vec<BulkExpect>>) {
    let e = |line: &str, status: &str, err: &str| (line.into(), status.into(), err.into());
    drop_in(
        spool,
        "too-many-lines.jsonl",
        "x\n".repeat(100_001).as_bytes(),
    );
    let too_many = vec![e(
        "-",
        "invalid",
        "100001 lines, over bulk_lines_max 100000",
    )];
    expect.insert("too-many-lines.jsonl".into(), too_many);
    let good = |k: &str| {
        format!(r#"{{"request_key":"{k}","ops":[{{"op":"create","shard":"s","record":{{}}}}]}}"#)
    };
    let long = format!(
        "{}\n{}\n{}",
        good("long-1"),
        "a".repeat((16 << 20) + 1),
        good("long-3")
    );
    drop_in(spool, "long-line.jsonl", long.as_bytes());
    let long_expect = vec![
        e("1", "committed", ""),
        e(
            "2",
            "invalid",
            "line 2 is 16777217 bytes, over bulk_line_bytes_max 16777216",
        ),
        e("3", "committed", ""),
    ];
    expect.insert("long-line.jsonl".into(), long_expect);
    let huge = spool.join("tmp/never-ending.jsonl");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(10 << 30))
        .expect("sparse file");
    std::fs::rename(&huge, spool.join("new/never-ending.jsonl")).expect("rename");
    let never = vec![e("-", "invalid", "over bulk_file_bytes_max")];
    expect.insert("never-ending.jsonl".into(), never);
}

/// Checks `out/NAME` of a bulk file against its expected lines.
fn check_bulk_result(spool: &Path, name: &str, expect: &[BulkExpect]) {
    let text = std::fs::read_to_string(spool.join("out").join(name)).expect("result");
    let got: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: {l:?}: {e}")))
        .collect();
    let says = |r: &Value, status: &str, err: &str| {
        let why = r["error"].as_str().or(r["reason"].as_str()).unwrap_or("");
        assert_eq!(r["status"], status, "{name}: {r}");
        assert!(why.contains(err), "{name}: {why:?} lacks {err:?}");
    };
    match expect.first().map(|x| x.0.as_str()) {
        Some("-") => {
            assert_eq!(got.len(), 1, "{name}: {text}");
            assert!(got[0].get("line").is_none(), "{name}: {text}");
            says(&got[0], &expect[0].1, &expect[0].2);
            assert!(
                spool.join("failed").join(name).exists(),
                "{name} not quarantined"
            );
        }
        Some("*") => {
            assert!(!got.is_empty(), "{name}: no result line");
            got.iter().for_each(|r| says(r, &expect[0].1, &expect[0].2));
        }
        _ => {
            let lines: Vec<String> = got.iter().map(|r| r["line"].to_string()).collect();
            let want: Vec<String> = expect.iter().map(|x| x.0.clone()).collect();
            assert_eq!(lines, want, "{name}: result lines");
            for (r, (_, status, err)) in got.iter().zip(expect) {
                says(r, status, err);
            }
        }
    }
}

/// Goal: the bulk-file corpus (`corpus/bulk/`, and generated files too large to keep:
/// too many lines, a 16 MiB line, a sparse 10 GiB file) into a running daemon with the
/// default limits: every result line has the manifest's line, status and error, in line
/// order, and no other; a file refused whole is quarantined with one result line about
/// the whole file; the daemon serves on.
#[test]
fn bulk_corpus_into_a_running_daemon() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let mut child = serve_ready(&data, &t.path().join("serve.log"), &[]);
    let spool = data.join("spool");
    let mut expect = bulk_manifest();
    assert!(expect.len() >= 4, "bulk corpus has {} files", expect.len());
    for name in expect.keys() {
        let bytes = std::fs::read(corpus_dir().join("bulk").join(name)).unwrap();
        drop_in(&spool, name, &bytes);
    }
    generated_bulk_cases(&spool, &mut expect);
    let out = spool.join("out");
    wait_for("every bulk result", Duration::from_secs(120), || {
        expect.keys().all(|n| out.join(n).exists())
    });
    for (name, lines) in &expect {
        check_bulk_result(&spool, name, lines);
    }
    drop_in(
        &spool,
        "after-bulk.json",
        br#"{"request_key":"after-bulk","ops":[{"op":"create","shard":"s","record":{}}]}"#,
    );
    wait_for(
        "a result after the bulk files",
        Duration::from_secs(20),
        || out.join("after-bulk.json").exists(),
    );
    assert!(child.exited().unwrap().is_none(), "daemon died");
    println!("bulk corpus: {} files", expect.len());
}

/// Goal: the corpus as stream lines (issue 16): every corpus file that is one line, sent as
/// one request line on one connection of a running daemon, gets the status and error the
/// manifest names, its error naming its line, and the connection goes on to the valid batch
/// after them.
#[test]
fn corpus_over_a_stream() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let _d = serve_ready(&data, &t.path().join("serve.log"), &[]);
    let mut input = Vec::new();
    let mut expect = Vec::new();
    for (file, status, err) in manifest() {
        let bytes = std::fs::read(corpus_dir().join(&file)).unwrap();
        let line = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        if line.contains(&b'\n') {
            continue; // more than one line: not a stream request
        }
        input.extend_from_slice(line);
        input.push(b'\n');
        expect.push((file, status, err));
    }
    input.extend(common::stream::batch_line("after-corpus", "s", 1).bytes());
    // The client skips blank lines; the daemon answers an empty line itself.
    let s = common::stream::connect(&data, Duration::from_secs(30));
    let writer = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || std::io::Write::write_all(&mut w, &input))
    };
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    for (n, (file, status, err)) in expect.iter().enumerate() {
        let a = common::stream::read_answer(&mut r);
        let text = assert_answer(file, &a, status, err);
        if status == "invalid" {
            let line = format!("stream line {}: ", n + 1);
            assert!(text.starts_with(&line), "{file}: {text:?}");
        }
    }
    let last = common::stream::read_answer(&mut r);
    assert_eq!(last["request_key"], "after-corpus");
    assert_eq!(last["status"], "committed", "{last}");
    writer.join().unwrap().unwrap();
    s.shutdown(std::net::Shutdown::Both).unwrap();
    println!("corpus over a stream: {} lines", expect.len());
}
