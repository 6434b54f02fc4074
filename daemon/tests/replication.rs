//! Replication on real processes over loopback (docs/replication.md): a standby follows,
//! applies and serves reads with its spool closed; `ack = "standby"` holds results until a
//! standby has the claim (or goes on alone when told to); a failover loses no acknowledged
//! batch and the old primary, restarted as a standby, cuts what the new one never had
//! (KIP-101's scenario 2) and ends byte for byte equal below the high watermark.
//! Every wait is bounded.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod repl;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{drop_in, wait_for, BIN};
use repl::*;
use roost::drill::child::ServeChild;
use serde_json::Value;

/// Goal: a standby follows the primary: the same records (lsn, epoch, type, content), the
/// same shard contents; it serves reads and status; files dropped in its spool wait.
#[test]
fn a_standby_follows_applies_and_keeps_its_spool_closed() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    b.start(Some(&a.addr()));
    for i in 0..40 {
        drop_in(
            &a.spool(),
            &format!("f{i}.json"),
            &batch(&format!("k{i}"), "s", 3),
        );
    }
    for i in 0..40 {
        let name = format!("f{i}.json");
        wait_for(&name, LIMIT, || a.result(&name).is_some());
        assert_eq!(a.result(&name).expect("result")["status"], "committed");
    }
    drop_in(&b.spool(), "held.json", &batch("held", "s", 1));
    caught_up(&a, &b);
    let st = b.status();
    assert_eq!(st["replication"]["role"], "standby", "{st}");
    assert_eq!(st["replication"]["follow"]["connected"], true, "{st}");
    // The serve loop copies the follower's view into status on its next pass.
    let epoch = a.status()["replication"]["epoch"].clone();
    assert!(epoch.as_u64() > Some(0), "{epoch}");
    wait_for("the standby to show its primary's epoch", LIMIT, || {
        b.status()["replication"]["follow"]["leader_epoch"] == epoch
    });
    let sa = a.status();
    assert_eq!(sa["replication"]["standbys"][0]["name"], "b", "{sa}");
    wait_for("the standby's lag in bytes to reach 0", LIMIT, || {
        a.status()["replication"]["standbys"][0]["lag_bytes"] == 0
    });
    assert_eq!(a.scan("s"), b.scan("s"));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        b.spool().join("new/held.json").exists(),
        "the standby took a file"
    );
    assert!(b.result("held.json").is_none());
    b.stop();
    a.stop();
    assert!(
        b.data.join("CHECKPOINT").exists(),
        "the standby took no checkpoint at its graceful stop"
    );
    same_logs(&a, &b);
    assert_eq!(a.wal().len(), b.wal().len());
    a.verify();
    b.verify();
}

/// Goal (issue 43): a standby's status shows the hw it knows, the leader's (under
/// `ack = "standby"` its text said "hw 0" while the leader's said 6), and names whom it
/// follows. Method: a primary and a standby, both `ack = "standby"`, five batches; the
/// standby's JSON and text status once caught up.
#[test]
fn a_standby_s_status_shows_the_leader_s_hw() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    b.start(Some(&a.addr()));
    for i in 0..5 {
        let name = format!("h{i}.json");
        drop_in(&a.spool(), &name, &batch(&format!("h{i}"), "s", 1));
        wait_for(&name, LIMIT, || a.result(&name).is_some());
    }
    caught_up(&a, &b);
    let hw = a.status()["replication"]["hw"]
        .as_u64()
        .expect("the primary's hw");
    assert!(hw >= 5, "{hw}");
    // The standby hears the leader's hw with its next fetch's answer.
    wait_for("the standby to show the leader's hw", LIMIT, || {
        b.status()["replication"]["hw"].as_u64() == Some(hw)
    });
    let out = b.roost(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("role standby, hw {hw} (the leader's")),
        "{text}"
    );
    assert!(
        text.contains(&format!("following {}: connected", a.addr())),
        "{text}"
    );
    b.stop();
    a.stop();
}

/// `status.intake` of a node just started (its control socket may be bound a moment after
/// "serving" is logged: until then `status` answers nothing).
fn intake(n: &Node) -> serde_json::Value {
    let mut seen = Value::Null;
    wait_for(&format!("{}'s status", n.name), LIMIT, || {
        seen = n.status()["intake"].clone();
        !seen.is_null()
    });
    seen
}

/// Goal: a graceful stop while answers wait for a standby that is gone (and a duplicate of
/// one of them waits on it) ends within `standby_timeout_ms`, with exit 0 and nothing
/// answered; the next start, with a standby back, gives both files the same answer.
#[test]
fn a_stop_while_answers_wait_for_a_standby_ends_and_loses_nothing() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    drop_in(&a.spool(), "x.json", &batch("dup", "s", 1));
    drop_in(&a.spool(), "y.json", &batch("dup", "s", 1));
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    a.stop();
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "the stop took {:?}",
        t0.elapsed()
    );
    assert!(a.result("x.json").is_none() && a.result("y.json").is_none());
    a.start(None);
    // Its claim waits for a standby before intake opens: status says so (it said "open").
    let at_start = intake(&a);
    assert_eq!(at_start["state"], "finishing_claims", "{at_start}");
    assert_eq!(at_start["claims"], 1, "{at_start}");
    b.start(Some(&a.addr()));
    assert_eq!(intake(&b)["state"], "closed");
    wait_for("x and y answered", LIMIT, || {
        a.result("x.json").is_some() && a.result("y.json").is_some()
    });
    let (x, y) = (
        a.result("x.json").expect("x"),
        a.result("y.json").expect("y"),
    );
    assert_eq!(x["ops"], y["ops"], "{x} {y}");
    assert_eq!(x["status"], "committed");
    wait_for("intake open", LIMIT, || {
        a.status()["intake"]["state"] == "open"
    });
    b.stop();
    a.stop();
}

/// Goal: a standby starts (and can be promoted) while its primary is frozen: a process that
/// accepts connections but never answers is not waited for.
#[test]
fn a_standby_starts_while_its_primary_is_frozen() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    let pid = a.child.as_ref().expect("running").id().to_string();
    let sig = |s: &str| Command::new("kill").args([s, &pid]).status().expect("kill");
    assert!(sig("-STOP").success());
    b.start(Some(&a.addr()));
    let p = b.promote();
    assert_eq!(p["promoted"], true, "{p}");
    assert!(sig("-CONT").success());
    b.stop();
    a.kill();
}

/// Goal: under `ack = "standby"` a result waits until a standby holds the claim; with
/// `when_standby_lost = "alone"` it goes out once no standby is in sync, and says so.
#[test]
fn ack_standby_holds_results_until_a_standby_has_the_claim() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    drop_in(&a.spool(), "w.json", &batch("w", "s", 1));
    std::thread::sleep(Duration::from_millis(3000));
    assert!(a.result("w.json").is_none(), "published without a standby");
    assert_eq!(a.status()["replication"]["waiting_for_standby"], true);
    b.start(Some(&a.addr()));
    wait_for("the result once the standby has it", LIMIT, || {
        a.result("w.json").is_some()
    });
    b.stop();
    a.stop();

    let t = tempfile::tempdir().expect("tempdir");
    let mut c = Node::new(
        t.path(),
        "c",
        "ack = \"standby\"\nwhen_standby_lost = \"alone\"",
    );
    c.start(None);
    drop_in(&c.spool(), "x.json", &batch("x", "s", 1));
    wait_for("the result published alone", LIMIT, || {
        c.result("x.json").is_some()
    });
    assert!(c.status()["replication"]["published_alone"].as_u64() >= Some(1));
    c.stop();
}

/// Goal (KIP-101 scenario 2 on real processes): the primary holds a claim the standby never
/// got (it was stopped), the primary dies, the standby is promoted and writes its own record
/// at that lsn; the old primary, restarted as a standby of the new one, cuts its record and
/// takes the new one: the logs and shards end equal, and the batch the old primary never
/// acknowledged is gone from it, not merged.
#[test]
fn kip101_scenario_2_the_old_primary_cuts_what_the_new_one_never_had() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    b.start(Some(&a.addr()));
    drop_in(&a.spool(), "one.json", &batch("one", "s", 2));
    wait_for("one", LIMIT, || a.result("one.json").is_some());
    caught_up(&a, &b);
    b.kill();
    // Claimed on the old primary only: never acknowledged (no standby).
    drop_in(&a.spool(), "lost.json", &batch("lost", "s", 2));
    wait_for("lost claimed", LIMIT, || {
        a.wal().iter().any(|r| r["request_key"] == "lost")
    });
    assert!(
        a.result("lost.json").is_none(),
        "acknowledged without a standby"
    );
    a.kill();
    b.start(Some(&a.addr()));
    let p = b.promote();
    assert!(p["epoch"].as_u64() > Some(1), "{p}");
    drop_in(&b.spool(), "two.json", &batch("two", "s", 2));
    a.start(Some(&b.addr()));
    wait_for("two", LIMIT, || b.result("two.json").is_some());
    caught_up(&b, &a);
    assert_eq!(a.scan("s"), b.scan("s"));
    assert!(
        !a.scan("s").contains("lost"),
        "the unacknowledged batch survived the cut"
    );
    a.stop();
    b.stop();
    same_logs(&a, &b);
    assert_eq!(a.wal().len(), b.wal().len());
    assert!(!a.wal().iter().any(|r| r["request_key"] == "lost"));
    a.verify();
    b.verify();
}

/// Goal (KIP-101 scenario 1): a standby restart never cuts what it holds to its high
/// watermark: an acknowledged batch it received survives its restart and the primary's
/// loss, and the promoted standby answers the batch's retry with the original result.
#[test]
fn kip101_scenario_1_a_standby_restart_keeps_acknowledged_batches() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    b.start(Some(&a.addr()));
    drop_in(&a.spool(), "acked.json", &batch("acked", "s", 2));
    wait_for("acked", LIMIT, || a.result("acked.json").is_some());
    let original = a.result("acked.json").expect("result");
    // The standby restarts at once (its high watermark may lag its log), and the primary is
    // lost before the standby fetches again.
    b.kill();
    a.kill();
    b.start(Some(&a.addr()));
    b.promote();
    // The old primary comes back as the new one's standby (results wait for a standby).
    a.start(Some(&b.addr()));
    drop_in(&b.spool(), "acked.json", &batch("acked", "s", 2));
    wait_for("the retry's answer", LIMIT, || {
        b.result("acked.json").is_some()
    });
    let again = b.result("acked.json").expect("retry");
    assert_eq!(again["status"], "committed", "{again}");
    assert_eq!(again["ops"], original["ops"], "the retry got other ids");
    caught_up(&b, &a);
    a.stop();
    b.stop();
    same_logs(&a, &b);
    a.verify();
    b.verify();
}

/// Goal: the failover drill in CI: batches stream under `ack = "standby"`, the primary is
/// killed at a random moment, the standby promoted, the old primary restarted as its
/// standby; three rounds, roles swapping. Every acknowledged batch is on the new primary
/// with its ids, the logs are equal, the shards scan equal, verify holds on both.
#[test]
fn failover_drill_loses_no_acknowledged_batch() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    b.start(Some(&a.addr()));
    let mut acked: BTreeMap<String, Value> = BTreeMap::new();
    let mut seed = 0x9e37_79b9_u64;
    for round in 0..3 {
        let (p, s) = if round % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let sent: Vec<String> = (0..30).map(|i| format!("r{round}-{i}.json")).collect();
        for (i, name) in sent.iter().enumerate() {
            drop_in(&p.spool(), name, &batch(&format!("r{round}-{i}"), "s", 2));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(seed % 400));
        p.kill();
        for name in &sent {
            if let Some(r) = p.result(name) {
                acked.insert(name.clone(), r);
            }
        }
        s.promote();
        p.start(Some(&s.addr()));
        // Every acknowledged batch: its retry on the new primary gives the same ids.
        for (name, r) in &acked {
            let key = r["request_key"].as_str().expect("key").to_owned();
            let retry = format!("retry-{round}-{name}");
            drop_in(&s.spool(), &retry, &batch(&key, "s", 2));
            wait_for(&retry, LIMIT, || s.result(&retry).is_some());
            let again = s.result(&retry).expect("retry result");
            assert_eq!(
                again["ops"], r["ops"],
                "{name}: acknowledged batch lost or changed"
            );
        }
        caught_up(s, p);
        let started = Instant::now();
        while p.scan("s") != s.scan("s") && started.elapsed() < LIMIT {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(p.scan("s"), s.scan("s"), "round {round}: shards differ");
    }
    a.stop();
    b.stop();
    same_logs(&a, &b);
    a.verify();
    b.verify();
    assert!(
        !acked.is_empty(),
        "no batch was acknowledged before the kills"
    );
}

/// Goal: a partition between primary and standby (an in-test proxy): under
/// `ack = "standby"` the primary's new result waits; the operator promotes the standby; once
/// the partition heals, the promoted node tells its former primary, which steps down: it
/// never publishes the waiting batch and takes no more files. Restarted as a standby, it
/// cuts that batch and ends with the new primary's log.
#[test]
fn after_a_partition_the_former_primary_steps_down_and_never_answers() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    let proxy = Proxy::start(a.addr()).expect("proxy");
    b.start(Some(&proxy.addr()));
    drop_in(&a.spool(), "before.json", &batch("before", "s", 1));
    wait_for("before", LIMIT, || a.result("before.json").is_some());
    proxy.cut();
    drop_in(&a.spool(), "during.json", &batch("during", "s", 1));
    std::thread::sleep(Duration::from_millis(3000));
    assert!(
        a.result("during.json").is_none(),
        "published during the partition"
    );
    assert_eq!(a.status()["replication"]["waiting_for_standby"], true);
    b.promote();
    proxy.heal();
    wait_for("the former primary to step down", LIMIT, || {
        a.status()["replication"]["role"] == "stepped_down"
    });
    drop_in(&a.spool(), "after.json", &batch("after", "s", 1));
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        a.result("during.json").is_none(),
        "the stepped-down primary answered"
    );
    assert!(
        a.result("after.json").is_none(),
        "the stepped-down primary took a file"
    );
    assert!(a.spool().join("new/after.json").exists());
    a.kill();
    a.start(Some(&b.addr()));
    drop_in(&b.spool(), "two.json", &batch("two", "s", 1));
    wait_for("two", LIMIT, || b.result("two.json").is_some());
    caught_up(&b, &a);
    assert!(
        !a.scan("s").contains("during"),
        "the unanswered batch survived the cut"
    );
    assert_eq!(a.scan("s"), b.scan("s"));
    a.stop();
    b.stop();
    same_logs(&a, &b);
    assert_eq!(a.wal().len(), b.wal().len());
}

/// Goal (issue 27): a node that starts as a standby with files waiting in its `new/` (a
/// demoted primary's leftovers) says so at start, naming how many and the first; the files
/// stay (they are applied only if this node is promoted).
#[test]
fn a_standby_starting_with_files_in_new_says_so() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "");
    a.start(None);
    b.start(Some(&a.addr()));
    b.stop();
    drop_in(&b.spool(), "left-1.json", &batch("left-1", "s", 1));
    drop_in(&b.spool(), "left-2.json", &batch("left-2", "s", 1));
    b.start(Some(&a.addr()));
    // Said right after "serving", which `start` waited for.
    let said = |l: &&str| l.contains("files wait in new/");
    let running = b.child.as_ref().expect("running");
    wait_for("the warning", LIMIT, || {
        running.log_text().lines().any(|l| said(&l))
    });
    let log = running.log_text();
    let line = log.lines().find(said).unwrap_or_default();
    assert!(
        line.contains("files=2") && line.contains("left-1.json"),
        "{line}"
    );
    assert!(b.spool().join("new/left-1.json").exists());
}

/// Goal (issue 27): an idle standby in a long-poll (5 s) longer than `standby_timeout_ms`
/// (2 s here) stays in sync: the high watermark does not fall back while it waits, and the
/// first batch after a pause is not published alone.
#[test]
fn an_idle_standby_in_a_long_poll_stays_in_sync() {
    let t = tempfile::tempdir().expect("tempdir");
    let extra = "ack = \"standby\"\nwhen_standby_lost = \"alone\"";
    let (mut a, mut b) = two_nodes(t.path(), extra);
    a.start(None);
    b.start(Some(&a.addr()));
    drop_in(&a.spool(), "one.json", &batch("one", "s", 1));
    wait_for("one", LIMIT, || a.result("one.json").is_some());
    caught_up(&a, &b);
    let until = Instant::now() + Duration::from_millis(4500);
    while Instant::now() < until {
        let st = a.status();
        let hw = st["replication"]["hw"].as_u64().unwrap_or(0);
        assert!(hw > 0, "the idle standby looked lost: {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop_in(&a.spool(), "two.json", &batch("two", "s", 1));
    wait_for("two", LIMIT, || a.result("two.json").is_some());
    assert_eq!(a.status()["replication"]["published_alone"], 0);
}

/// Goal: with `when_standby_lost = "alone"` a partition does not stop answers: after
/// `standby_timeout_ms` they go out on local durability (counted); when the partition heals
/// the standby catches up and the logs end equal.
#[test]
fn alone_answers_through_a_partition_and_the_standby_catches_up() {
    let t = tempfile::tempdir().expect("tempdir");
    let extra = "ack = \"standby\"\nwhen_standby_lost = \"alone\"";
    let (mut a, mut b) = two_nodes(t.path(), extra);
    a.start(None);
    let proxy = Proxy::start(a.addr()).expect("proxy");
    b.start(Some(&proxy.addr()));
    // The standby fetching first: a batch sent while it still starts may wait past
    // `standby_timeout_ms` (2 s) and go out alone, which a machine under load once showed.
    wait_for("the standby connected", LIMIT, || {
        a.status()["replication"]["standbys"][0]["connected"] == true
    });
    drop_in(&a.spool(), "before.json", &batch("before", "s", 1));
    wait_for("before", LIMIT, || a.result("before.json").is_some());
    assert_eq!(a.status()["replication"]["published_alone"], 0);
    proxy.cut();
    drop_in(&a.spool(), "during.json", &batch("during", "s", 1));
    wait_for("the answer given alone", LIMIT, || {
        a.result("during.json").is_some()
    });
    let st = a.status();
    assert!(st["replication"]["published_alone"].as_u64() >= Some(1));
    let lag = &st["replication"]["standbys"][0];
    assert!(
        lag["lag_bytes"].as_u64() > Some(0),
        "no lag in bytes while cut off: {lag}"
    );
    assert!(lag["lag_lsns"].as_u64() > Some(0), "{lag}");
    let log = a.child.as_ref().expect("running").log_text();
    assert!(
        log.contains("publishing on local durability alone"),
        "not logged:\n{log}"
    );
    proxy.heal();
    caught_up(&a, &b);
    assert_eq!(a.scan("s"), b.scan("s"));
    b.stop();
    a.stop();
    same_logs(&a, &b);
    assert_eq!(a.wal().len(), b.wal().len());
}

/// Copies a stopped node's data directory over another's, without its spool, lock and
/// control socket (docs/replication.md, "Re-seeding a standby").
fn copy_data(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").flatten() {
        let name = e.file_name();
        if ["spool", "LOCK", "roost.sock"].iter().any(|n| name == *n) {
            continue;
        }
        let st = Command::new("cp")
            .arg("-a")
            .arg(e.path())
            .arg(to.join(&name))
            .status()
            .expect("cp");
        assert!(st.success(), "cp {}", e.path().display());
    }
}

/// Two nodes with 4 MiB WAL segments, and a primary (`a`, started) whose WAL below its
/// checkpoint was retired after 24 batches of 8 records of 60 kB.
fn primary_with_retired_wal(root: &Path, extra: &str) -> (Node, Node) {
    let (mut a, b) = two_nodes(root, extra);
    let small = "wal_segment_bytes = 4194304\nbatch_ops_max = 8\n";
    for n in [&a, &b] {
        let text = std::fs::read_to_string(&n.config).expect("config");
        std::fs::write(&n.config, format!("{small}{text}")).expect("config");
    }
    a.start(None);
    let pad = "p".repeat(60_000);
    for i in 0..24 {
        let ops: Vec<String> = (0..8)
            .map(|j| {
                format!(
                    r#"{{"op":"create","shard":"s","record":{{"i":{i},"j":{j},"pad":"{pad}"}}}}"#
                )
            })
            .collect();
        let body = format!(r#"{{"request_key":"big{i}","ops":[{}]}}"#, ops.join(","));
        drop_in(&a.spool(), &format!("big{i}.json"), body.as_bytes());
    }
    for i in 0..24 {
        let name = format!("big{i}.json");
        wait_for(&name, LIMIT, || a.result(&name).is_some());
    }
    a.stop(); // the final checkpoint retires the WAL below it
    let first = a.wal().first().and_then(|r| r["lsn"].as_u64()).unwrap_or(0);
    assert!(first > 1, "no WAL was retired (first lsn {first})");
    a.start(None);
    (a, b)
}

/// Goal: with `reseed = "manual"`, a new standby behind the primary's retained WAL (a
/// checkpoint retired it) stops with exit 78 and says how to re-seed; after the documented
/// re-seed (a copy of the stopped primary's data directory) it follows, with the same
/// records and shards.
#[test]
fn a_standby_behind_the_retained_wal_is_told_to_reseed_and_follows_after_it() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = primary_with_retired_wal(t.path(), "ack = \"local\"\nreseed = \"manual\"");
    let log = t.path().join("b-behind.log");
    let mut behind = ServeChild::spawn(Path::new(BIN), &b.data, &log, |c| {
        c.arg("--config")
            .arg(&b.config)
            .arg("--follow")
            .arg(a.addr());
    })
    .expect("spawn");
    let st = (0..600)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            behind.exited().ok().flatten()
        })
        .expect("the standby behind the retained WAL kept running");
    assert_eq!(st.code(), Some(78), "{}", behind.log_text());
    assert!(
        behind.log_text().contains("re-seed"),
        "{}",
        behind.log_text()
    );
    a.stop();
    copy_data(&a.data, &b.data);
    a.start(None);
    b.start(Some(&a.addr()));
    drop_in(&a.spool(), "after.json", &batch("after", "s", 1));
    wait_for("after", LIMIT, || a.result("after.json").is_some());
    caught_up(&a, &b);
    assert_eq!(a.scan("s"), b.scan("s"));
    b.stop();
    a.stop();
    same_logs(&a, &b);
    b.verify();
}

/// The audit rows a node holds, one JSON line each, sorted (a primary appends rows in the
/// order batches finish, a standby in lsn order).
fn audit(n: &Node) -> Vec<String> {
    let out = n.roost(&["audit"]);
    assert!(
        out.status.success(),
        "audit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut rows: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    rows.sort();
    rows
}

/// Goal: a new standby behind the primary's retained WAL re-seeds itself (`reseed = "auto"`,
/// the default) from the primary's base backup while the primary keeps taking batches, then
/// follows: the same shards and audit rows, equal records at every lsn both hold, verify
/// clean; the primary never stopped answering.
/// Method: a writer drops 2-record batches over four shards (so they finish, and write their
/// audit rows, out of lsn order) into the primary all through the re-seed; the
/// standby starts with an empty data directory.
#[test]
fn a_standby_behind_the_retained_wal_reseeds_itself_from_a_live_primary() {
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = primary_with_retired_wal(t.path(), "ack = \"local\"");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spool = a.spool();
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && n < 2_000 {
                // Four shards, so batches finish out of lsn order (their audit rows too).
                let (name, shard) = (format!("live{n}"), format!("t{}", n % 4));
                drop_in(&spool, &format!("{name}.json"), &batch(&name, &shard, 2));
                n += 1;
                if n % 8 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            n
        })
    };
    b.start(Some(&a.addr()));
    let text = std::fs::read_to_string(b.data.with_extension("log1")).expect("b's log");
    assert!(
        text.contains("re-seeded from the primary's base backup"),
        "{text}"
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = writer.join().expect("writer");
    assert!(
        written > 10,
        "the writer ran through the re-seed ({written} batches)"
    );
    for i in 0..written {
        let name = format!("live{i}.json");
        wait_for(&name, LIMIT, || a.result(&name).is_some());
        let r = a.result(&name).expect("result");
        assert_eq!(r["status"], "committed", "{name}: {r}");
    }
    caught_up(&a, &b);
    for shard in ["s", "t0", "t1", "t2", "t3"] {
        assert_eq!(a.scan(shard), b.scan(shard), "shard {shard}");
    }
    let (ra, rb) = (audit(&a), audit(&b));
    assert_eq!(ra.len(), rb.len(), "audit rows on a and b");
    if let Some((x, y)) = ra.iter().zip(&rb).find(|(x, y)| x != y) {
        panic!("audit rows differ: a has {x}, b has {y}");
    }
    let first = b.wal().first().and_then(|r| r["lsn"].as_u64()).unwrap_or(0);
    assert!(
        first > 1,
        "the standby's log starts at the primary's checkpoint, not {first}"
    );
    b.stop();
    a.stop();
    same_logs(&a, &b);
    b.verify();
    a.verify();
}

/// Goal: under `ack = "standby"` a streamed batch waits for the standby on a thread of the
/// daemon's blocking pool, and the standby's fetches and acknowledgements are answered on
/// threads of that pool too: they must never queue behind the batches waiting for them.
/// With the standby frozen, 63 connections send one line at a time until every streamed
/// place (`stream_batches_running_max`, 256) holds a waiting thread; once the standby runs
/// again every batch is answered. (With a pool sized for 64 streamed batches, 132 threads,
/// the fetches queued behind 132 waiting groups for ever.) Streamed batches gather into at
/// most four groups (issue 42); four groups all waiting for the frozen standby for 100 ms
/// stop the queue from waiting for them, so each connection's line runs as its own group
/// again, and a key answered before the freeze, sent again, is answered at once.
#[test]
fn streamed_batches_waiting_for_a_frozen_standby_leave_it_threads_to_catch_up() {
    use std::io::{BufReader, Write};
    let t = tempfile::tempdir().expect("tempdir");
    let (mut a, mut b) = two_nodes(t.path(), "ack = \"standby\"");
    a.start(None);
    b.start(Some(&a.addr()));
    drop_in(&a.spool(), "w.json", &batch("w", "s", 1));
    wait_for("the first result, the standby in sync", LIMIT, || {
        a.result("w.json").is_some()
    });
    let again = common::stream::batch_line("again", "s", 1);
    let mut first = BufReader::new(common::stream::connect(&a.data, LIMIT));
    first.get_mut().write_all(again.as_bytes()).expect("send");
    let answered = common::stream::read_answer(&mut first);
    assert_eq!(answered["status"], "committed", "{answered}");
    b.signal("STOP");
    let (conns, rounds) = (63, 5);
    let mut socks: Vec<_> = (0..conns)
        .map(|_| common::stream::connect(&a.data, LIMIT))
        .collect();
    for r in 0..rounds {
        for (c, s) in socks.iter_mut().enumerate() {
            let line = common::stream::batch_line(&format!("c{c}-{r}"), "s", 1);
            s.write_all(line.as_bytes()).expect("send a line");
        }
        // Each connection's next line arrives after its reader took this one alone.
        std::thread::sleep(Duration::from_millis(200));
        if r == 0 {
            first
                .get_mut()
                .write_all(again.as_bytes())
                .expect("send again");
            let v = common::stream::read_answer(&mut first);
            assert_eq!(v, answered, "the same key, while the standby is frozen");
        }
    }
    let status = a.status();
    let waiting = status["in_flight"].as_u64().unwrap_or(0);
    b.signal("CONT");
    for (c, s) in socks.into_iter().enumerate() {
        let mut r = BufReader::new(s);
        for round in 0..rounds {
            let v = common::stream::read_answer(&mut r);
            assert_eq!(
                v["status"], "committed",
                "connection {c}, line {round}: {v}"
            );
        }
    }
    assert!(
        waiting > 132,
        "only {waiting} streamed batches were waiting: the test proves nothing"
    );
    assert!(
        status["stream"]["stalled"].as_u64() > Some(0),
        "the queue never stopped waiting: {}",
        status["stream"]
    );
    b.stop();
    a.stop();
}
