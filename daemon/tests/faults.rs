//! The fault walk on the real binary (issue 13, "I/O errors on the real binary", and the
//! ENOSPC part of item 7): `roost serve` runs under `strace -f --inject`, and for every
//! syscall that makes or syncs data the N-th call (N = 1..=K) fails with EIO (and ENOSPC for
//! the writes and `fallocate`). After each run the daemon must have stopped by itself with 74
//! (or, for a failed write to its log, kept serving), never panicked or hung; a restart
//! without strace must recover, `roost verify` must pass, every result a client read before
//! the fault must still be the answer, and no record may exist twice.
//!
//! Two phases: while streaming batches (a data directory with one committed batch, then
//! batches delivered one at a time), and during recovery (a data directory left with an
//! unfinished claim by `ROOST_CRASH_AT=after_claim_sync`, so recovery's own writes take the
//! fault). `docs/faults.md` is the recipe and what each fault does.
//!
//! strace counts `when=N` per syscall and per thread: one run may fail the N-th call in
//! several threads at once (every run's injected calls are counted and printed).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::strace::{max_calls_per_thread, Call, Trace, TracedServe};
use common::{drop_in, BIN};
use roost::drill::child::ServeChild;
use serde_json::Value;

/// The most calls of one syscall per thread the walk fails, one run each.
const CALLS_MAX: usize = 15;
/// How long a step (a result, an exit, a stop) may take before the run counts as a hang.
const STEP_LIMIT: Duration = Duration::from_secs(20);

/// Faults that reach the data (the daemon must stop with 74), or only its log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// A failed data write or sync: the daemon latches and exits 74, never retries.
    Data,
    /// A failed write to stderr (its log, traced with `-P LOG`): dropped, nothing changes.
    Log,
    /// ENOSPC where a segment is preallocated (issue 13, item 7): nothing was written, so
    /// intake pauses, resumes by itself once a preallocation succeeds, and everything is
    /// served (exit 0); a preallocation that must succeed at once (the re-reservation after a
    /// torn tail is cut at open) may still stop the daemon with 74.
    Room,
}

/// One syscall family of the walk.
struct Family {
    name: &'static str,
    /// The strace syscall set.
    set: &'static str,
    errnos: &'static [&'static str],
    class: Class,
}

const FAMILIES: &[Family] = &[
    Family {
        name: "fdatasync",
        set: "fdatasync",
        errnos: &["EIO"],
        class: Class::Data,
    },
    Family {
        name: "fsync",
        set: "fsync",
        errnos: &["EIO"],
        class: Class::Data,
    },
    Family {
        name: "msync",
        set: "msync",
        errnos: &["EIO"],
        class: Class::Data,
    },
    Family {
        name: "pwrite64",
        set: "pwrite64",
        errnos: &["EIO", "ENOSPC"],
        class: Class::Data,
    },
    Family {
        name: "fallocate",
        set: "fallocate",
        errnos: &["EIO"],
        class: Class::Data,
    },
    Family {
        name: "fallocate",
        set: "fallocate",
        errnos: &["ENOSPC"],
        class: Class::Room,
    },
    Family {
        name: "rename",
        set: "rename,renameat,renameat2",
        errnos: &["EIO"],
        class: Class::Data,
    },
    Family {
        name: "write (log)",
        set: "write",
        errnos: &["EIO", "ENOSPC"],
        class: Class::Log,
    },
];

/// Syscalls that would write a data file but that the walk does not fail: the census
/// requires the daemon never to make them on a data file (else the walk would miss faults).
const UNWALKED_WRITES: &str = "write,writev,pwritev,pwritev2,sync_file_range,syncfs,sync";

/// A batch of two creates (users, orders) tagged `NAME/0`, `NAME/1`; `rejected` adds a
/// delete of an id that never exists, so the batch is rejected and creates nothing.
fn body(name: &str, rejected: bool) -> Vec<u8> {
    let tail = if rejected {
        r#",{"op":"delete","shard":"orders","id":999999}"#
    } else {
        ""
    };
    format!(
        r#"{{"request_key":"key-{name}","ops":[{{"op":"create","shard":"users","record":{{"tag":"{name}/0"}}}},{{"op":"create","shard":"orders","record":{{"tag":"{name}/1"}}}}{tail}]}}"#
    )
    .into_bytes()
}

/// The configuration of every run: small shard segments, so a few batches fill one and the
/// shard owners preallocate, sync and map new ones during the run (fallocate is walked
/// too), and small ops per batch, so the WAL and audit segments are small and `verify`
/// reads little.
const CONFIG: &str = "batch_ops_max = 4\nwal_segment_bytes = 8192\nshard_segment_bytes = 128\n";

/// Writes [`CONFIG`] to `root/roost.toml`.
fn write_config(root: &Path) -> PathBuf {
    let path = root.join("roost.toml");
    std::fs::write(&path, CONFIG).expect("writing the configuration");
    path
}

/// What a phase's runs do once the daemon is up.
#[derive(Clone, Debug)]
enum Step {
    /// Deliver the batch and wait for its result (or the daemon's exit).
    Deliver(&'static str, bool),
    /// Wait for a result recovery writes (or the daemon's exit).
    Await(&'static str),
}

/// A phase: a template data directory and the steps of each run.
struct Phase {
    label: &'static str,
    config: PathBuf,
    template: PathBuf,
    steps: Vec<Step>,
    /// Batches in the template: (name, rejected, result read before the walk, if any).
    before: Vec<(&'static str, bool, Option<Value>)>,
    /// Ids the template's WAL claims for an unfinished batch: its final result must use them.
    claimed: Option<(&'static str, Vec<u64>)>,
}

fn result(data: &Path, name: &str) -> Option<Value> {
    let bytes = std::fs::read(data.join("spool/out").join(name)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Waits for `out/NAME` while `alive()` holds; None if it stops or `limit` passes first.
fn await_result(
    data: &Path,
    name: &str,
    limit: Duration,
    mut alive: impl FnMut() -> bool,
) -> Option<Value> {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = result(data, name) {
            return Some(v);
        }
        if !alive() || Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

/// Runs `roost ARGS --data-dir DATA`: (exit code, stdout).
fn roost(data: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .output()
        .expect("running roost");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The streaming phase's template: one committed batch `t1`, daemon stopped cleanly.
fn streaming_phase(root: &Path) -> Phase {
    let data = root.join("template-stream");
    let log = root.join("template-stream.log");
    let config = write_config(root);
    let mut d = ServeChild::spawn(Path::new(BIN), &data, &log, |c| {
        c.arg("--config").arg(&config);
    })
    .expect("spawn");
    d.ready(STEP_LIMIT).expect("serving");
    drop_in(&data.join("spool"), "t1", &body("t1", false));
    let t1 = await_result(&data, "t1", STEP_LIMIT, || true).expect("t1's result");
    assert_eq!(d.stop(STEP_LIMIT).expect("stop").code(), Some(0));
    Phase {
        label: "streaming",
        config,
        template: data,
        steps: vec![
            Step::Deliver("b1", false),
            Step::Deliver("b2", false),
            Step::Deliver("r1", true),
            Step::Deliver("b3", false),
        ],
        before: vec![("t1", false, Some(t1))],
        claimed: None,
    }
}

/// The fresh phase's template: an empty data directory, so the first start creates the WAL,
/// the audit log, the shards and their directories under the fault.
fn fresh_phase(root: &Path) -> Phase {
    let data = root.join("template-fresh");
    std::fs::create_dir(&data).expect("template-fresh");
    Phase {
        label: "fresh",
        config: write_config(root),
        template: data,
        steps: vec![Step::Deliver("b1", false), Step::Deliver("b2", false)],
        before: vec![],
        claimed: None,
    }
}

/// The recovery phase's template: the streaming template plus batch `c1` claimed (its claim
/// synced) and the daemon killed there (`ROOST_CRASH_AT=after_claim_sync`).
fn recovery_phase(root: &Path, stream: &Phase) -> Phase {
    let data = root.join("template-recover");
    copy_dir(&stream.template, &data);
    let log = root.join("template-recover.log");
    let mut d = ServeChild::spawn(Path::new(BIN), &data, &log, |c| {
        c.arg("--config")
            .arg(&stream.config)
            .env("ROOST_CRASH_AT", "after_claim_sync");
    })
    .expect("spawn");
    d.ready(STEP_LIMIT).expect("serving");
    drop_in(&data.join("spool"), "c1", &body("c1", false));
    assert!(d.died_within(STEP_LIMIT), "no crash at after_claim_sync");
    assert!(
        result(&data, "c1").is_none(),
        "c1 finished before the crash"
    );
    let (code, dump) = roost(&data, &["wal", "dump", "--json"]);
    assert_eq!(code, Some(0), "wal dump");
    let claim: Value = dump
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "claim" && v["request_key"] == "key-c1")
        .expect("c1's claim in the WAL");
    let ids = claim["claimed_ids"]
        .as_array()
        .expect("claimed_ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    Phase {
        label: "recovery",
        config: stream.config.clone(),
        template: data,
        steps: vec![Step::Await("c1"), Step::Deliver("b1", false)],
        before: stream.before.clone(),
        claimed: Some(("c1", ids)),
    }
}

/// What one run under strace did, as the client saw it.
struct RunOutcome {
    /// Batches delivered or awaited, with `rejected`.
    names: Vec<(&'static str, bool)>,
    /// Results read while the traced daemon ran.
    seen: BTreeMap<String, Value>,
    served_all: bool,
    /// The exit code (None: killed by a signal).
    code: Option<i32>,
    injected: Vec<Call>,
    calls: Vec<Call>,
    log: String,
}

/// Copies the phase's template to `dir/data`, runs the daemon there under strace through
/// the phase's steps, then stops it (SIGTERM) if it still runs. Err on a hang.
fn run_traced(phase: &Phase, dir: &Path, trace: &Trace) -> Result<RunOutcome, String> {
    let data = dir.join("data");
    copy_dir(&phase.template, &data);
    let mut d = TracedServe::spawn(
        &data,
        &phase.config,
        &dir.join("serve.log"),
        &dir.join("trace"),
        trace,
    )
    .map_err(|e| format!("starting strace: {e}"))?;
    let mut names = Vec::new();
    let mut seen = BTreeMap::new();
    // A fresh data directory has no spool until the daemon makes it (or fails to).
    let spool = data.join("spool");
    let until = Instant::now() + STEP_LIMIT;
    while !(spool.join("tmp").is_dir() && spool.join("new").is_dir()) && d.exited().is_none() {
        if Instant::now() > until {
            d.kill();
            return Err(format!("hang: no spool within {STEP_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for step in &phase.steps {
        if d.exited().is_some() {
            break;
        }
        let (name, rejected) = match *step {
            Step::Deliver(name, rejected) => {
                drop_in(&data.join("spool"), name, &body(name, rejected));
                (name, rejected)
            }
            Step::Await(name) => (name, false),
        };
        names.push((name, rejected));
        match await_result(&data, name, STEP_LIMIT, || d.exited().is_none()) {
            Some(v) => {
                seen.insert(name.to_string(), v);
            }
            None if d.exited().is_some() => break,
            None => {
                d.kill();
                return Err(format!(
                    "hang: no result for {name} within {STEP_LIMIT:?}, daemon still running; log:\n{}",
                    tail(&d.log_text())
                ));
            }
        }
    }
    let served_all = seen.len() == phase.steps.len();
    let Some(status) = d.stop(STEP_LIMIT) else {
        d.kill();
        return Err(format!(
            "hang: no exit within {STEP_LIMIT:?} of SIGTERM; log:\n{}",
            tail(&d.log_text())
        ));
    };
    let calls = d.calls();
    Ok(RunOutcome {
        names,
        seen,
        served_all,
        code: status.code(),
        injected: calls.iter().filter(|c| c.injected).cloned().collect(),
        calls,
        log: d.log_text(),
    })
}

/// The last lines of a log.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Exit 74 after a data fault, or served everything (and stopped with 0) when the fault
/// only hit the log or nothing was injected; anything else is an anomaly.
fn judge(class: Class, out: &RunOutcome) -> Result<&'static str, String> {
    let hit = !out.injected.is_empty();
    match (class, hit, out.code) {
        (_, _, Some(70)) | (_, _, Some(101)) => Err("panicked".to_string()),
        (Class::Data, true, Some(74)) => Ok("exit 74"),
        (Class::Data, false, Some(0)) | (Class::Log, _, Some(0)) if out.served_all => Ok("served"),
        (Class::Data, true, Some(0)) => Err("ignored the failed call: exited 0".to_string()),
        (Class::Room, true, Some(0)) if out.served_all && out.log.contains("intake paused") => {
            Ok("paused")
        }
        (Class::Room, _, Some(0)) if out.served_all => Ok("served"),
        (Class::Room, true, Some(74)) => Ok("exit 74"),
        (_, _, code) => Err(format!(
            "exit {code:?} (served all: {}, injected: {hit})",
            out.served_all
        )),
    }
}

/// After a traced run: restarts the daemon without strace and checks recovery, the answers,
/// resubmission, `verify` and the shards. Err names the first thing that does not hold.
fn check_after(phase: &Phase, dir: &Path, out: &RunOutcome) -> Result<(), String> {
    let data = dir.join("data");
    let mut d = ServeChild::spawn(Path::new(BIN), &data, &dir.join("restart.log"), |c| {
        c.arg("--config").arg(&phase.config);
    })
    .map_err(|e| format!("restart: {e:#}"))?;
    d.ready(STEP_LIMIT)
        .map_err(|e| format!("recovery after the fault failed: {e:#}"))?;
    let mut batches: Vec<(&str, bool, Option<&Value>)> = phase
        .before
        .iter()
        .map(|(n, r, v)| (*n, *r, v.as_ref()))
        .collect();
    batches.extend(out.names.iter().map(|(n, r)| (*n, *r, out.seen.get(*n))));
    // The claimed batch is answered after the restart even when the fault stopped the
    // traced daemon before the client began to wait for it.
    if let Some((name, _)) = &phase.claimed {
        if !batches.iter().any(|(n, _, _)| n == name) {
            batches.push((name, false, None));
        }
    }
    let finals = final_answers(&data, &batches, phase)?;
    for (name, rejected, _) in &batches {
        drop_in(
            &data.join("spool"),
            &format!("again-{name}"),
            &body(name, *rejected),
        );
    }
    for (name, _, _) in &batches {
        let again = await_result(&data, &format!("again-{name}"), STEP_LIMIT, || true)
            .ok_or_else(|| format!("no result for the resubmitted {name}"))?;
        if again != finals[*name] {
            return Err(format!(
                "resubmitting {name} answered {again}, its result is {}",
                finals[*name]
            ));
        }
    }
    let st = d.stop(STEP_LIMIT).map_err(|e| format!("stop: {e:#}"))?;
    if st.code() != Some(0) {
        return Err(format!("the restarted daemon exited {st}"));
    }
    let (code, report) = roost(&data, &["verify"]);
    if code != Some(0) {
        return Err(format!("verify exited {code:?}:\n{report}"));
    }
    check_shards(&data, &finals)
}

/// Every batch's result after the restart: there, with its expected status, equal to what
/// the client read before the fault, and for a claimed batch with the claimed ids.
fn final_answers(
    data: &Path,
    batches: &[(&str, bool, Option<&Value>)],
    phase: &Phase,
) -> Result<BTreeMap<String, Value>, String> {
    let mut finals = BTreeMap::new();
    for (name, rejected, seen) in batches {
        let v = await_result(data, name, STEP_LIMIT, || true)
            .ok_or_else(|| format!("no result for {name} after the restart"))?;
        let want = if *rejected { "rejected" } else { "committed" };
        if v["status"] != want {
            return Err(format!("{name}: {v}, expected {want}"));
        }
        if let Some(seen) = seen {
            if *seen != &v {
                return Err(format!("{name}: the client read {seen}, now {v}"));
            }
        }
        finals.insert(name.to_string(), v);
    }
    if let Some((name, ids)) = &phase.claimed {
        let got: Vec<u64> = finals[*name]["ops"]
            .as_array()
            .map(|ops| ops.iter().filter_map(|o| o["id"].as_u64()).collect())
            .unwrap_or_default();
        if &got != ids {
            return Err(format!(
                "{name} claimed ids {ids:?}, its result has {got:?}"
            ));
        }
    }
    Ok(finals)
}

/// `roost scan` of both shards: every tag once, and each committed create's id holds its
/// tag; nothing else.
fn check_shards(data: &Path, finals: &BTreeMap<String, Value>) -> Result<(), String> {
    let mut held: BTreeMap<(String, u64), String> = BTreeMap::new();
    let mut tags = BTreeSet::new();
    for shard in ["users", "orders"] {
        let (code, out) = roost(data, &["scan", shard]);
        if code != Some(0) {
            return Err(format!("scan {shard} exited {code:?}"));
        }
        for line in out.lines() {
            let v: Value =
                serde_json::from_str(line).map_err(|e| format!("scan line {line}: {e}"))?;
            let tag = v["record"]["tag"].as_str().unwrap_or_default().to_string();
            if !tags.insert(tag.clone()) {
                return Err(format!("record {tag} exists twice: {line}"));
            }
            held.insert((shard.to_string(), v["id"].as_u64().unwrap_or(0)), tag);
        }
    }
    let mut expected = 0;
    for (name, v) in finals.iter().filter(|(_, v)| v["status"] == "committed") {
        for (i, op) in v["ops"].as_array().into_iter().flatten().enumerate() {
            let key = (
                op["shard"].as_str().unwrap_or_default().to_string(),
                op["id"].as_u64().unwrap_or(0),
            );
            expected += 1;
            if held.get(&key) != Some(&format!("{name}/{i}")) {
                return Err(format!(
                    "{name} op {i} ({key:?}) holds {:?}",
                    held.get(&key)
                ));
            }
        }
    }
    if held.len() != expected {
        return Err(format!(
            "{} records, {expected} committed creates",
            held.len()
        ));
    }
    Ok(())
}

/// One run without a fault, tracing every family and the writes the walk does not fail: K
/// per family (the most calls one thread made, capped at [`CALLS_MAX`]). Fails if the
/// daemon made an unwalked call on a data file (the walk would miss its faults).
fn census(phase: &Phase, root: &Path) -> BTreeMap<&'static str, usize> {
    let dir = root.join(format!("{}-census", phase.label));
    std::fs::create_dir_all(&dir).expect("census dir");
    let mut set: Vec<&str> = FAMILIES.iter().map(|f| f.set).collect();
    set.push(UNWALKED_WRITES);
    let set = set.join(",");
    let trace = Trace {
        set: &set,
        inject: None,
        paths: vec![],
        env: vec![],
    };
    let out = run_traced(phase, &dir, &trace).expect("census run");
    assert!(
        out.served_all && out.code == Some(0),
        "census run without faults: exit {:?}; log:\n{}",
        out.code,
        tail(&out.log)
    );
    let data = format!("{}/", dir.join("data").display());
    let log = dir.join("serve.log").display().to_string();
    let unwalked: Vec<&str> = out
        .calls
        .iter()
        .filter(|c| UNWALKED_WRITES.split(',').any(|s| s == c.name))
        .filter(|c| c.name == "sync" || c.line.contains(&data))
        .map(|c| c.line.as_str())
        .collect();
    assert!(
        unwalked.is_empty(),
        "the daemon writes or syncs data with calls the walk does not fail (add them to \
         FAMILIES):\n{}",
        unwalked.join("\n")
    );
    let mut ks = BTreeMap::new();
    for fam in FAMILIES {
        let calls: Vec<Call> = out
            .calls
            .iter()
            .filter(|c| fam.set.split(',').any(|s| s == c.name))
            .filter(|c| fam.class != Class::Log || c.line.contains(&log))
            .cloned()
            .collect();
        let per_thread = max_calls_per_thread(&calls)
            .into_values()
            .max()
            .unwrap_or(0);
        eprintln!(
            "census {}: {}: {} calls, at most {per_thread} in one thread",
            phase.label,
            fam.name,
            calls.len()
        );
        ks.insert(fam.name, per_thread.min(CALLS_MAX));
    }
    ks
}

/// Counts for one (family, errno) of a phase.
#[derive(Default)]
struct Tally {
    runs: usize,
    /// Runs in which strace failed at least one call.
    hit: usize,
    /// Calls failed over all runs (one run can fail the N-th call in several threads).
    faults: usize,
    exit_74: usize,
    served: usize,
    /// Runs in which intake paused for want of room and then served everything.
    paused: usize,
    anomalies: usize,
}

/// The walk over one phase: every family, errno and N = 1..=K; returns the anomalies.
fn walk(phase: &Phase, root: &Path) -> Vec<String> {
    let ks = census(phase, root);
    let started = Instant::now();
    let mut anomalies = Vec::new();
    let mut report = Vec::new();
    let mut runs = 0;
    for fam in FAMILIES {
        for errno in fam.errnos {
            let mut t = Tally::default();
            for n in 1..=ks[fam.name] {
                let what = format!("{} phase, {} {errno} when={n}", phase.label, fam.name);
                match one_run(phase, root, fam, errno, n, &mut t) {
                    Ok(()) => {}
                    Err(e) => {
                        t.anomalies += 1;
                        anomalies.push(format!("{what}: {e}"));
                    }
                }
            }
            runs += t.runs;
            if fam.class == Class::Room && t.hit > 0 && t.paused == 0 {
                anomalies.push(format!(
                    "{} phase, {} {errno}: {} runs failed a preallocation and none paused intake",
                    phase.label, fam.name, t.hit
                ));
            }
            report.push(format!(
                "{:<10} {:<12} {:<6} K={:<2} runs={:<2} faulted={:<2} faults={:<3} exit74={:<2} served={:<2} paused={:<2} anomalies={}",
                phase.label, fam.name, errno, ks[fam.name], t.runs, t.hit, t.faults, t.exit_74, t.served, t.paused, t.anomalies
            ));
        }
    }
    eprintln!(
        "fault walk, {} phase: {runs} runs in {:.1?}\n{}",
        phase.label,
        started.elapsed(),
        report.join("\n")
    );
    anomalies
}

/// One traced run with the N-th call failed, judged and checked after a restart.
fn one_run(
    phase: &Phase,
    root: &Path,
    fam: &Family,
    errno: &str,
    n: usize,
    t: &mut Tally,
) -> Result<(), String> {
    let first = fam.set.split(',').next().unwrap_or(fam.set);
    let dir = root.join(format!("{}-{first}-{errno}-{n}", phase.label));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let paths = match fam.class {
        Class::Log => vec![dir.join("serve.log")],
        Class::Data | Class::Room => vec![],
    };
    let trace = Trace {
        set: fam.set,
        inject: Some((errno, n as u32)),
        paths,
        env: vec![],
    };
    t.runs += 1;
    let out = run_traced(phase, &dir, &trace)?;
    t.hit += usize::from(!out.injected.is_empty());
    t.faults += out.injected.len();
    let verdict = judge(fam.class, &out)
        .and_then(|v| check_after(phase, &dir, &out).map(|()| v))
        .map_err(|e| describe(&out, &e))?;
    match verdict {
        "exit 74" => t.exit_74 += 1,
        "paused" => t.paused += 1,
        _ => t.served += 1,
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// An anomaly with what was injected, what the client saw and the log's end.
fn describe(out: &RunOutcome, e: &str) -> String {
    let injected: Vec<&str> = out.injected.iter().map(|c| c.line.as_str()).collect();
    let seen: Vec<String> = out.seen.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    format!(
        "{e}\n  injected: {}\n  exit: {:?}\n  client read: {}\n  log:\n{}",
        injected.join("\n            "),
        out.code,
        seen.join("; "),
        tail(&out.log)
    )
}

/// A scratch root, or None when strace cannot inject here and `ROOST_ALLOW_NO_STRACE=1`
/// says that is fine (never a silent skip: the reason is printed, or the test fails).
fn scratch() -> Option<tempfile::TempDir> {
    common::strace::required("the fault walk").then(|| tempfile::tempdir().expect("tempdir"))
}

/// Builds a phase in a scratch root and walks it; fails with every anomaly, keeping the
/// root (the failing runs' directories) for a look.
fn walk_phase(make: impl FnOnce(&Path) -> Phase) {
    let Some(root) = scratch() else { return };
    let base = root.path().canonicalize().expect("tempdir");
    let phase = make(&base);
    let anomalies = walk(&phase, &base);
    if !anomalies.is_empty() {
        let kept = root.keep();
        panic!(
            "{} anomalies in the {} fault walk (runs kept in {}):\n\n{}",
            anomalies.len(),
            phase.label,
            kept.display(),
            anomalies.join("\n\n")
        );
    }
}

/// Goal: a failed data write or sync (EIO, ENOSPC) anywhere while batches stream stops the
/// daemon with 74, a failed log write changes nothing, and a restart loses and duplicates
/// nothing. Method: one run per syscall family, errno and N = 1..=K under `strace --inject`,
/// each restarted without strace and checked (results, resubmission, verify, shards).
#[test]
fn io_faults_while_streaming_stop_with_74_and_lose_nothing() {
    walk_phase(streaming_phase);
}

/// Goal: the same when the fault hits the first start on an empty data directory (creating
/// the WAL, audit log, shards, their directories and first segments). Method: as above.
#[test]
fn io_faults_on_a_fresh_data_directory_stop_with_74_and_lose_nothing() {
    walk_phase(fresh_phase);
}

/// Goal: the same when the fault hits recovery's own writes (an unfinished claim left by a
/// crash after its sync), and the batch then keeps its claimed ids. Method: as above, from
/// a data directory killed at `after_claim_sync`.
#[test]
fn io_faults_during_recovery_stop_with_74_and_lose_nothing() {
    walk_phase(|base| recovery_phase(base, &streaming_phase(base)));
}
