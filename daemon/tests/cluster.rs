//! The cluster (issue 27, docs/cluster.md) on real processes over loopback: etcd (Debian's
//! etcd-server, started here on a temporary data directory) and three `roost serve` nodes
//! over mutual TLS. One leader is elected; every node's spool and stream socket take
//! batches (a standby forwards them); a killed leader is replaced within the lease and the
//! fencing margin, and rejoins as a follower when it comes back; a paused one fences itself;
//! a restarted old leader does not resume its epoch. Every wait is bounded.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod repl;

use std::time::{Duration, Instant};

use common::{drop_in, wait_for};
use repl::cluster::*;
use repl::*;
use roost_etcd::testing::EtcdServer;
use serde_json::Value;

/// Goal: three nodes elect one leader through etcd; each node's spool takes batches (the
/// standbys forward them, and answer once they hold the claim); the same key given to two
/// nodes is one batch (the same ids); the leader's epoch is the one etcd's counter gave.
#[test]
fn three_nodes_elect_one_leader_and_every_spool_takes_batches() {
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes = three(t.path(), etcd.client_url(), "ack = \"standby\"");
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    let epoch = cluster(&nodes[l])["epoch"].as_u64().expect("epoch");
    assert!(epoch >= 1, "epoch {epoch}");
    for n in &nodes {
        for i in 0..5 {
            submit_at(n, &format!("{}-{i}", n.name));
        }
    }
    // One key at two standbys: one batch.
    let others: Vec<&Node> = (0..3).filter(|i| *i != l).map(|i| &nodes[i]).collect();
    let first = submit_at(others[0], "shared");
    let second = submit_at(others[1], "shared");
    assert_eq!(ids(&first), ids(&second), "one key, two batches");
    assert_eq!(first["lsn"], second["lsn"]);
    let st = cluster(others[0]);
    assert!(st["forwarded_out"].as_u64() >= Some(6), "{st}");
    let lead = cluster(&nodes[l]);
    assert!(lead["forwarded_in"].as_u64() >= Some(12), "{lead}");
    assert_eq!(lead["isr"].as_array().map(Vec::len), Some(3), "{lead}");
    let metrics =
        |n: &Node| String::from_utf8_lossy(&n.roost(&["status", "--metrics"]).stdout).into_owned();
    let m = metrics(&nodes[l]);
    assert!(m.contains("roost_cluster_leading 1\n"), "{m}");
    assert!(m.contains("roost_cluster_isr_members 3\n"), "{m}");
    let m = metrics(others[0]);
    assert!(m.contains("roost_cluster_leading 0\n"), "{m}");
    assert!(!m.contains("roost_cluster_forwarded_out_total 0\n"), "{m}");
    for n in nodes.iter_mut() {
        n.stop();
    }
    for n in &nodes {
        n.verify();
    }
}

/// Goal (issue 42): a standby's intake is the leader's: a bulk file dropped on a standby is
/// forwarded line by line and its answers file appears there (it used to wait in `new/`
/// until that node led); many files dropped at once on a standby are forwarded together
/// (pipelined) and answered in shared publishing rounds; every line and file keeps its ids
/// when sent again to the leader. Method: three nodes, `ack = "standby"`; 40 lines in one
/// bulk file and 40 files dropped while the standby is frozen (SIGSTOP), so that it finds
/// them all at once.
#[test]
fn a_standby_forwards_bulk_files_and_many_files_at_once() {
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes = three(t.path(), etcd.client_url(), "ack = \"standby\"");
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    let s = (l + 1) % 3;
    let body: Vec<u8> = (0..40)
        .flat_map(|i| {
            let mut line = batch(&format!("bulk-{i}"), "s", 2);
            line.push(b'\n');
            line
        })
        .collect();
    submit_at(&nodes[s], "warm");
    // Frozen while they are dropped, the standby finds them all waiting at once.
    nodes[s].signal("STOP");
    drop_in(&nodes[s].spool(), "load.jsonl", &body);
    for i in 0..40 {
        let key = format!("many-{i}");
        drop_in(
            &nodes[s].spool(),
            &format!("{key}.json"),
            &batch(&key, "s", 2),
        );
    }
    nodes[s].signal("CONT");
    let out = nodes[s].spool().join("out/load.jsonl");
    wait_for("the bulk file's answers at the standby", LIMIT, || {
        out.exists()
    });
    let text = std::fs::read_to_string(&out).expect("answers");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("an answer line"))
        .collect();
    assert_eq!(lines.len(), 40, "{text}");
    for i in 0..40 {
        let name = format!("many-{i}.json");
        wait_for(&format!("{name} answered at the standby"), LIMIT, || {
            nodes[s].result(&name).is_some()
        });
        let r = nodes[s].result(&name).expect("result");
        assert_eq!(r["status"], "committed", "{name}: {r}");
        let again = submit_at(&nodes[l], &format!("many-{i}"));
        assert_eq!(ids(&again), ids(&r), "many-{i} became two batches");
    }
    for (i, a) in lines.iter().enumerate() {
        assert_eq!(a["status"], "committed", "line {i}: {a}");
        let again = submit_at(&nodes[l], &format!("bulk-{i}"));
        assert_eq!(ids(&again), ids(a), "bulk-{i} became two batches");
    }
    assert!(!nodes[s].spool().join("new/load.jsonl").exists());
    let st = cluster(&nodes[s]);
    assert!(st["forwarded_out"].as_u64() >= Some(80), "{st}");
    answered_in_shared_rounds(&nodes[s]);
    for n in nodes.iter_mut() {
        n.stop();
    }
    for n in &nodes {
        n.verify();
    }
}

/// Files a standby forwarded together were answered in one publishing round: each group of
/// k files saved k - 1 rounds (rounds shared by concurrent groups only save more).
fn answered_in_shared_rounds(standby: &Node) {
    let st = standby.status();
    let n = |k: &str| st[k].as_u64().unwrap_or(0);
    let grouped = n("files_in_groups") - n("file_groups").min(n("files_in_groups"));
    assert!(
        grouped > 0,
        "no files were forwarded together: the test proves nothing: {st}"
    );
    let saved = n("results_published").saturating_sub(n("result_rounds"));
    assert!(
        saved >= grouped,
        "each forwarded file had a round of its own: {st}"
    );
}

/// Goal (issue 42): a line streamed to a standby is answered there only once that standby's
/// own log holds its claim durably, even where the leader (`ack = "local"`) answered at
/// once: a failover after the answer finds the claim on this node too. Method: three nodes
/// under `ack = "local"`; strace holds every `fdatasync` of one standby for 1.5 s (the
/// leader answers in milliseconds); the line's answer at that standby must take at least
/// that long. A lower bound only: a slow machine makes it later, never sooner.
#[test]
fn a_standby_answers_a_streamed_line_only_once_its_own_log_holds_it() {
    use std::io::{BufReader, Write};
    if !common::strace::required("the held-fdatasync test") {
        return;
    }
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes = three(t.path(), etcd.client_url(), "ack = \"local\"");
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    let s = (l + 1) % 3;
    submit_at(&nodes[s], "warm");
    let pid = nodes[s].child.as_ref().expect("the standby runs").id();
    let trace = t.path().join("strace.out");
    let mut strace = std::process::Command::new("strace")
        .args(["-f", "-qq", "-o"])
        .arg(&trace)
        .args([
            "-e",
            "trace=fdatasync",
            "-e",
            "inject=fdatasync:delay_exit=1500000",
        ])
        .args(["-p", &pid.to_string()])
        .spawn()
        .expect("run strace");
    wait_for(
        "strace attached to every thread of the standby",
        LIMIT,
        || every_thread_traced(pid),
    );
    let mut conn = BufReader::new(common::stream::connect(&nodes[s].data, LIMIT));
    let sent = Instant::now();
    let line = common::stream::batch_line("held", "s", 1);
    conn.get_mut().write_all(line.as_bytes()).expect("send");
    let answer = common::stream::read_answer(&mut conn);
    let waited = sent.elapsed();
    let _ = strace.kill();
    let _ = strace.wait();
    assert_eq!(answer["status"], "committed", "{answer}");
    assert!(
        waited >= Duration::from_millis(1400),
        "answered after {waited:?}, before the standby's log could hold the claim: {answer}"
    );
    let traced = std::fs::read_to_string(&trace).unwrap_or_default();
    assert!(
        traced.contains("DELAYED"),
        "no fdatasync was held: {traced}"
    );
    for n in nodes.iter_mut() {
        n.stop();
    }
}

/// Whether every thread of `pid` has a tracer (strace attached to them all).
fn every_thread_traced(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .is_some_and(|v| v.trim() != "0")
    })
}

/// Goal: a leader killed with -9 is replaced within the lease and the fencing margin plus
/// the election's own steps (bounded here by 3 lease periods); nothing it acknowledged is
/// lost; restarted, it follows the new leader (a node started by a supervisor leads only
/// when etcd says so) and its log ends equal to the new leader's.
#[test]
fn a_killed_leader_is_replaced_and_rejoins_as_a_follower() {
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes = three(t.path(), etcd.client_url(), "ack = \"standby\"");
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    let before: Vec<Value> = (0..10)
        .map(|i| submit_at(&nodes[l], &format!("pre-{i}")))
        .collect();
    let old_epoch = cluster(&nodes[l])["epoch"].as_u64().expect("epoch");
    isr_names_all(&nodes, l);
    nodes[l].kill();
    let t0 = Instant::now();
    let l2 = one_leader(&nodes, LIMIT);
    let took = t0.elapsed();
    assert_ne!(l2, l);
    let new_epoch = cluster(&nodes[l2])["epoch"].as_u64().expect("epoch");
    assert!(new_epoch > old_epoch, "epoch {new_epoch} after {old_epoch}");
    eprintln!("new leader after {took:?}");
    // Every acknowledged batch is there: sent again, each gets its original ids.
    for (i, r) in before.iter().enumerate() {
        let again = submit_at(&nodes[l2], &format!("pre-{i}"));
        assert_eq!(ids(&again), ids(r), "pre-{i} lost or duplicated");
    }
    // A file dropped into the old leader's spool while it is down, its key meanwhile sent
    // to the new leader: at the restart it is forwarded, not applied locally, and gets the
    // new leader's answer (issue 27's stale spool file).
    drop_in(
        &nodes[l].spool(),
        "while-down.json",
        &batch("while-down", "s", 2),
    );
    let at_new = submit_at(&nodes[l2], "while-down");
    nodes[l].start(None);
    // The leader it follows: l2, or (beside a CPU hog, seen once in 20 loaded runs) a
    // node that replaced l2 when l2's first renewal came too late for a 1 s lease.
    let mut l2 = l2;
    wait_for("the old leader follows", LIMIT, || {
        let c = cluster(&nodes[l]);
        let leader = (0..nodes.len()).find(|&i| i != l && c["leader"] == nodes[i].name);
        if let Some(i) = leader.filter(|&i| cluster(&nodes[i])["leading"] == true) {
            l2 = i;
        }
        c["leading"] == false && leader == Some(l2)
    });
    assert_eq!(nodes[l].status()["replication"]["role"], "standby");
    wait_for("while-down.json answered", LIMIT, || {
        nodes[l].result("while-down.json").is_some()
    });
    let at_old = nodes[l].result("while-down.json").expect("result");
    assert_eq!(
        ids(&at_old),
        ids(&at_new),
        "a file kept while down became a second batch"
    );
    submit_at(&nodes[l], "after-rejoin");
    caught_up(&nodes[l2], &nodes[l]);
    for n in nodes.iter_mut() {
        n.stop();
    }
    same_logs(&nodes[l2], &nodes[l]);
    for n in &nodes {
        n.verify();
    }
}

/// Goal: a leader paused past its lease (SIGSTOP) has been replaced when it wakes; it fences
/// itself (no answer in the old epoch after the new leader's first) and rejoins.
#[test]
fn a_paused_leader_fences_itself_and_rejoins() {
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes = three(t.path(), etcd.client_url(), "ack = \"standby\"");
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    submit_at(&nodes[l], "before-pause");
    isr_names_all(&nodes, l);
    nodes[l].signal("STOP");
    let l2 = {
        let mut found = None;
        wait_for("another leader while the old one sleeps", LIMIT, || {
            found = (0..3)
                .filter(|i| *i != l)
                .find(|i| cluster(&nodes[*i])["leading"] == true);
            found.is_some()
        });
        found.expect("a new leader")
    };
    // A batch dropped at the sleeping leader waits; it is answered once, after the wake,
    // by forwarding, with the new leader's ids.
    drop_in(&nodes[l].spool(), "during.json", &batch("during", "s", 2));
    submit_at(&nodes[l2], "new-epoch");
    nodes[l].signal("CONT");
    wait_for("the woken leader follows", LIMIT, || {
        let c = cluster(&nodes[l]);
        c["leading"] == false && c["leader"] == nodes[l2].name
    });
    wait_for("during.json answered", LIMIT, || {
        nodes[l].result("during.json").is_some()
    });
    let at_old = nodes[l].result("during.json").expect("result");
    let at_new = submit_at(&nodes[l2], "during");
    assert_eq!(
        ids(&at_old),
        ids(&at_new),
        "the woken leader answered on its own"
    );
    caught_up(&nodes[l2], &nodes[l]);
    for n in nodes.iter_mut() {
        n.stop();
    }
    same_logs(&nodes[l2], &nodes[l]);
}

/// Goal: roost talks to an etcd that requires client certificates (`--client-cert-auth`):
/// with `etcd_ca`, `etcd_cert` and `etcd_key` the cluster elects and a standby forwards;
/// a node whose certificate is from another CA never leads nor follows, and says why.
#[test]
fn etcd_with_client_certificates() {
    let t = tempfile::tempdir().expect("tempdir");
    let tls = roost_etcd::testing::make_tls(&t.path().join("etcd-tls")).expect("certs");
    let etcd = EtcdServer::start_tls(&t.path().join("etcd"), &tls).expect("etcd with TLS");
    let lines = format!(
        "etcd_ca = {:?}\netcd_cert = {:?}\netcd_key = {:?}\n",
        tls.ca, tls.client_cert, tls.client_key
    );
    let url = vec![etcd.client_url().to_owned()];
    let mut nodes: Vec<Node> = ["a", "b"]
        .into_iter()
        .map(|n| cluster_node_with(t.path(), n, &url, "ack = \"standby\"", &lines))
        .collect();
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    submit_at(&nodes[1 - l], "over-tls");
    // `c` with a certificate of another CA: refused by etcd, so it neither leads nor
    // follows, and its status names the failure.
    let other = roost_etcd::testing::make_tls(&t.path().join("other-tls")).expect("certs");
    let wrong = format!(
        "etcd_ca = {:?}\netcd_cert = {:?}\netcd_key = {:?}\n",
        tls.ca, other.client_cert, other.client_key
    );
    let mut c = cluster_node_with(t.path(), "c", &url, "ack = \"standby\"", &wrong);
    c.start(None);
    wait_for("c says etcd refused it", LIMIT, || {
        cluster(&c)["etcd_error"].is_string()
    });
    let st = cluster(&c);
    assert_eq!(st["leading"], false, "{st}");
    assert!(st["leader"].is_null(), "{st}");
    c.stop();
    for n in nodes.iter_mut() {
        n.stop();
    }
}

/// Goal: a leader cut off from a three-member etcd (an in-test proxy per etcd member per
/// node, all of the leader's broken) fences itself within its lease and another node wins;
/// healed, the old leader rejoins as a follower and the logs end equal.
#[test]
fn a_leader_cut_off_from_etcd_fences_itself() {
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = roost_etcd::testing::EtcdCluster::start(&t.path().join("etcd"), 3).expect("etcd");
    let urls = etcd.client_urls();
    let mut proxies: Vec<Vec<Proxy>> = Vec::new();
    let mut nodes = Vec::new();
    for name in ["a", "b", "c"] {
        let mine: Vec<Proxy> = urls
            .iter()
            .map(|u| Proxy::start(u.trim_start_matches("http://").to_owned()).expect("proxy"))
            .collect();
        let via: Vec<String> = mine
            .iter()
            .map(|p| format!("http://{}", p.addr()))
            .collect();
        nodes.push(cluster_node_with(
            t.path(),
            name,
            &via,
            "ack = \"standby\"",
            "",
        ));
        proxies.push(mine);
    }
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    submit_at(&nodes[l], "before-cut");
    isr_names_all(&nodes, l);
    for p in &proxies[l] {
        p.cut();
    }
    // The old leader must fence itself before another node leads: every poll reads the
    // others first, so a new leader seen while the old one still says it leads is an overlap.
    let mut l2 = None;
    let mut fenced = false;
    wait_for(
        "the cut-off leader fences itself and another leads",
        LIMIT,
        || {
            let now = (0..3)
                .filter(|i| *i != l)
                .find(|i| cluster(&nodes[*i])["leading"] == true);
            let st = nodes[l].status();
            // `leading` is false once the lease deadline passed, whether or not the agent
            // has run since (the engine refuses every batch and answer from then on).
            let still = st["cluster"]["leading"] == true;
            assert!(
                !(still && now.is_some()),
                "{} leads while the cut-off {} still does: {st}",
                now.map_or("?", |i| nodes[i].name),
                nodes[l].name
            );
            fenced |= !still && !st.is_null() && st["replication"]["role"] != "primary";
            l2 = now;
            fenced && l2.is_some()
        },
    );
    let l2 = l2.expect("a new leader");
    submit_at(&nodes[l2], "after-cut");
    for p in &proxies[l] {
        p.heal();
    }
    wait_for("the old leader follows", LIMIT, || {
        let c = cluster(&nodes[l]);
        c["leading"] == false && c["leader"] == nodes[l2].name
    });
    submit_at(&nodes[l], "after-heal");
    caught_up(&nodes[l2], &nodes[l]);
    for n in nodes.iter_mut() {
        n.stop();
    }
    same_logs(&nodes[l2], &nodes[l]);
}

/// Goal (issue 42, found by the cluster drill beside a CPU hog): a campaign whose winning
/// transaction etcd applied while its answer was lost ("txn: no answer within 251ms") leaves
/// etcd naming a leader that does not lead, under that node's live lease; the node gives the
/// key up and an election follows. Before, it ignored its own key, which it kept renewing
/// with its lease: nobody led for the whole minute the drill waited. Method: three nodes;
/// the leader key and the epoch counter written by hand as standby `x`'s lost win would
/// have written them (a newer epoch, `x`'s advertised address, `x`'s current lease, read
/// from its member key); then a node must lead in a later epoch still.
#[test]
fn a_win_whose_answer_was_lost_is_given_up_and_another_election_follows() {
    let t = tempfile::tempdir().expect("tempdir");
    let server = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes = three(t.path(), server.client_url(), "");
    start_all(&mut nodes);
    let l = one_leader(&nodes, LIMIT);
    isr_names_all(&nodes, l);
    let x = (l + 1) % 3;
    let (etcd, rt) = etcd_client(&server);
    let key = |k: &str| format!("/roost/default/{k}");
    let get = |k: &str| {
        let (kv, _) = rt.block_on(etcd.get(&key(k))).expect("get");
        kv.unwrap_or_else(|| panic!("no key {k}"))
    };
    let member = get(&format!("members/{}", nodes[x].name));
    let advertise = serde_json::from_slice::<Value>(&member.value).expect("member")["advertise"]
        .as_str()
        .expect("advertise")
        .to_owned();
    let epoch: u64 = serde_json::from_slice(&get("epoch").value).expect("epoch");
    let won = epoch + 1;
    let leader = serde_json::json!({"name": nodes[x].name, "advertise": advertise, "epoch": won});
    rt.block_on(etcd.put(&key("epoch"), won.to_string().as_bytes(), None))
        .expect("put epoch");
    let value = serde_json::to_vec(&leader).expect("json");
    rt.block_on(etcd.put(&key("leader"), &value, Some(member.lease)))
        .expect("put leader");
    wait_for("a node leading an epoch after the lost win", LIMIT, || {
        nodes.iter().any(|n| {
            let c = cluster(n);
            c["leading"] == true && c["epoch"].as_u64().is_some_and(|e| e > won)
        })
    });
    let l2 = one_leader(&nodes, LIMIT);
    submit_at(&nodes[l2], "after-the-lost-win");
    for n in nodes.iter_mut() {
        n.stop();
    }
}

/// Runs `roost cluster unclean-election` with `node`'s configuration; its exit code and
/// stdout.
fn unclean(node: &Node, args: &[&str]) -> (i32, String) {
    let mut all = vec!["cluster", "unclean-election"];
    all.extend_from_slice(args);
    let out = node.roost(&all);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), format!("{text}{err}"))
}

/// Leaves {a, b, c} with no node that may campaign: a leads alone (etcd's set is only a)
/// and takes "only-a", then is killed for good; b and c run. Checks on the way that naming
/// a node that does not run (c, before it starts) is refused, and that for 2 leases neither
/// b nor c leads, b says why exactly once, and its status says so. Returns a's epoch.
fn lose_the_only_member(nodes: &mut [Node]) -> u64 {
    nodes[0].start(None);
    assert_eq!(one_leader(nodes, LIMIT), 0);
    submit_at(&nodes[0], "only-a");
    let old_epoch = cluster(&nodes[0])["epoch"].as_u64().expect("epoch");
    nodes[0].kill();
    nodes[1].start(None);
    wait_for("a's leader key to expire, as b sees it", LIMIT, || {
        let c = cluster(&nodes[1]);
        c["isr"] == serde_json::json!(["a"]) && c["leader"].is_null()
    });
    let (code, text) = unclean(&nodes[1], &["c", "--accept-loss"]);
    assert_eq!(code, 1, "c does not run: {text}");
    assert!(text.contains("c is not running"), "{text}");
    nodes[2].start(None);
    let until = Instant::now() + Duration::from_millis(2 * LEASE_MS);
    while Instant::now() < until {
        for n in &nodes[1..] {
            assert_ne!(
                cluster(n)["leading"],
                true,
                "{} led outside the set",
                n.name
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::read_to_string(nodes[1].data.with_extension("log1")).expect("b's log");
    let said = log.matches("does not name this node").count();
    assert_eq!(
        said, 1,
        "b said why it may not campaign {said} times:\n{log}"
    );
    assert_eq!(cluster(&nodes[1])["may_campaign"], false);
    let status = String::from_utf8_lossy(&nodes[1].roost(&["status"]).stdout).into_owned();
    assert!(
        status.contains("NO LEADER; this node may not campaign"),
        "{status}"
    );
    old_epoch
}

/// Goal: a leader lost for good while etcd's in-sync set names only it leaves a cluster in
/// which no node may campaign (a clean election only; each node says why once), and `roost
/// cluster unclean-election` is the way out: refused for a non-member and for a node that
/// does not run, only said without `--accept-loss`, written with it; the named node then
/// wins a new epoch, the other follows it and takes batches, and the lost leader, back,
/// follows and cuts the batch nobody else held; refused once a node leads.
#[test]
fn an_unclean_election_ends_a_cluster_whose_in_sync_set_is_lost() {
    let t = tempfile::tempdir().expect("tempdir");
    let etcd = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let mut nodes = three(t.path(), etcd.client_url(), "");
    let old_epoch = lose_the_only_member(&mut nodes);
    let (code, text) = unclean(&nodes[1], &["x", "--accept-loss"]);
    assert_eq!(code, 2, "a non-member: {text}");
    assert!(text.contains("not one of [replication] members"), "{text}");
    let (code, text) = unclean(&nodes[1], &["b"]);
    assert_eq!(code, 2, "without --accept-loss: {text}");
    assert!(
        text.contains("names only [\"a\"]") && text.contains("nothing written"),
        "{text}"
    );
    std::thread::sleep(Duration::from_millis(2 * LEASE_MS));
    assert_ne!(
        cluster(&nodes[1])["leading"],
        true,
        "b led with nothing written"
    );
    let (code, text) = unclean(&nodes[2], &["b", "--accept-loss"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("Written") && text.contains("now [\"b\"]"),
        "{text}"
    );
    let l = one_leader(&nodes, LIMIT);
    assert_eq!(nodes[l].name, "b");
    let epoch = cluster(&nodes[1])["epoch"].as_u64().expect("epoch");
    assert!(epoch > old_epoch, "epoch {epoch} after {old_epoch}");
    submit_at(&nodes[2], "after");
    wait_for("c may campaign once b's set names it", LIMIT, || {
        cluster(&nodes[2])["may_campaign"] == true
    });
    let (code, text) = unclean(&nodes[2], &["c", "--accept-loss"]);
    assert_eq!(code, 1, "with a leader: {text}");
    assert!(text.contains("etcd names a leader, b"), "{text}");
    // The lost leader comes back: it follows b and cuts what b never had.
    nodes[0].start(None);
    wait_for("a follows b", LIMIT, || {
        let c = cluster(&nodes[0]);
        c["leading"] == false && c["leader"] == "b"
    });
    submit_at(&nodes[0], "after-a-returned");
    caught_up(&nodes[1], &nodes[0]);
    for n in nodes.iter_mut() {
        n.stop();
    }
    same_logs(&nodes[1], &nodes[0]);
    for n in &nodes {
        let records = n.scan("s");
        assert!(!records.contains("only-a"), "{} still holds only-a", n.name);
        assert!(records.contains("after-a-returned"), "{}", n.name);
        n.verify();
    }
}

/// Goal: `roost cluster unclean-election` writes only when it is needed and safe to: refused
/// while a node the set names runs (its member key is there), while a leader key exists;
/// with neither, it makes the named node the set's only member (keeping the epoch and the
/// writer); run again, or with no set at all, it writes nothing. Method: keys put by hand in
/// a real etcd, no node running.
#[test]
fn an_unclean_election_writes_only_when_no_node_may_campaign() {
    let t = tempfile::tempdir().expect("tempdir");
    let server = EtcdServer::start(&t.path().join("etcd")).expect("etcd");
    let nodes = three(t.path(), server.client_url(), "");
    let (etcd, rt) = etcd_client(&server);
    let put = |k: &str, v: &str| {
        rt.block_on(etcd.put(&format!("/roost/default/{k}"), v.as_bytes(), None))
            .expect("put");
    };
    let del = |k: &str| {
        rt.block_on(etcd.delete(&format!("/roost/default/{k}")))
            .expect("delete");
    };
    let isr = || {
        let (kv, _) = rt.block_on(etcd.get("/roost/default/isr")).expect("get");
        kv.map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
    };
    put("isr", r#"{"epoch":3,"leader":"a","members":["a","c"]}"#);
    put(
        "members/a",
        r#"{"name":"a","advertise":"x","role":"standby"}"#,
    );
    put(
        "members/b",
        r#"{"name":"b","advertise":"x","role":"standby"}"#,
    );
    let (code, text) = unclean(&nodes[1], &["b", "--accept-loss"]);
    assert_eq!(code, 1, "a runs: {text}");
    assert!(text.contains("a, which etcd's in-sync set"), "{text}");
    del("members/a");
    put("leader", r#"{"name":"c","advertise":"x","epoch":3}"#);
    let (code, text) = unclean(&nodes[1], &["b", "--accept-loss"]);
    assert_eq!(code, 1, "c leads: {text}");
    assert!(text.contains("etcd names a leader, c (epoch 3)"), "{text}");
    del("leader");
    let (code, text) = unclean(&nodes[1], &["b", "--accept-loss"]);
    assert_eq!(code, 0, "{text}");
    let written = isr().expect("isr");
    let v: Value = serde_json::from_str(&written).expect("json");
    assert_eq!(
        v,
        serde_json::json!({"epoch":3,"leader":"a","members":["b"]})
    );
    let (code, text) = unclean(&nodes[1], &["b", "--accept-loss"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("names b already"), "{text}");
    assert_eq!(isr().as_deref(), Some(written.as_str()), "written twice");
    del("isr");
    let (code, text) = unclean(&nodes[1], &["b", "--accept-loss"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("no in-sync set yet"), "{text}");
    assert_eq!(isr(), None, "a set written where none was");
}

/// A plain client of `server` and a runtime to drive it, for keys read and put by hand.
fn etcd_client(server: &EtcdServer) -> (roost_etcd::Etcd, tokio::runtime::Runtime) {
    let etcd = roost_etcd::Etcd::new(roost_etcd::EtcdOptions {
        endpoints: vec![server.client_url().to_owned()],
        tls: None,
        request_timeout: Duration::from_secs(5),
    })
    .expect("client");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    (etcd, rt)
}
