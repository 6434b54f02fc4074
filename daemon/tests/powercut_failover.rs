//! A power cut of the primary during a replicated stream, on real ext4 (docs/durability.md,
//! "Power cuts and failover"): node A (primary, `ack = "standby"`) keeps its data directory
//! and spool on two loop-mounted ext4 images, node B (its standby) on the plain temporary
//! directory. A client streams batches into A's spool and records every result A publishes.
//! At a seeded random moment A is frozen (SIGSTOP), its images copied (the disk after a
//! power cut) and A killed; then B is promoted, A restarted from the copies as B's standby
//! (it must cut what B never had), and the checks run: every acknowledged batch answered
//! again by B with the same ids, shards equal, WAL records equal, `verify` clean on both.
//!
//! Needs root (loop devices, mount): without it the test prints "SKIPPED: ..." and fails,
//! unless `ROOST_ALLOW_NO_ROOT=1`. `ROOST_POWERCUT_FAILOVER_CUTS=N` runs N cuts instead of 5,
//! `ROOST_POWERCUT_FAILOVER_SEED=S` replays a seed (the batches and the moments; where a cut
//! lands in the daemon's work still depends on timing).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)] // the failover test uses part of the client's ledger
#[path = "powercut/client.rs"]
mod client;
mod common;
#[path = "powercut/loopfs.rs"]
mod loopfs;
#[path = "powercut/node.rs"]
mod node;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use client::{Client, Ledger, SHARDS};
use loopfs::{Mount, MountError};
use node::{Node, LIMIT};
use roost::spool::SpoolPaths;
use roost_storage::SplitMix;
use serde_json::Value;

const CUTS_DEFAULT: u64 = 5;
/// Sparse; the daemon's logs with their spare segments fit with room to spare.
const IMAGE_BYTES: u64 = 256 << 20;
/// How long the client streams before the cut: 300 ms plus up to this.
const STREAM_MS_MAX: u64 = 1500;

/// What the run counts (printed at the end; `lost` and `divergences` must stay 0).
#[derive(Default, Debug)]
struct Totals {
    cuts: usize,
    acked_checked: usize,
    acked_committed: usize,
    unanswered_retried: usize,
    records_cut: u64,
    cuts_that_cut: usize,
    lsns_compared: usize,
    lost: usize,
    divergences: usize,
    copy_retries: usize,
    /// Checkpoints A's log reports before its cut (they must never pass the hw).
    checkpoints: usize,
}

/// One cut's world: A (on the images), B (on the temporary directory), the mounts and the
/// directory. Fields drop in this order: daemons killed, then unmounted, then removed.
struct Rig {
    a: Node,
    b: Node,
    mounts: Option<[Mount; 2]>,
    images: [PathBuf; 2],
    tmp: tempfile::TempDir,
}

impl Rig {
    fn new() -> Result<Rig, MountError> {
        let tmp = tempfile::tempdir().expect("tempdir");
        let t = tmp.path().to_path_buf();
        let images = [t.join("data-0.img"), t.join("spool-0.img")];
        for img in &images {
            loopfs::make_image(img, IMAGE_BYTES).map_err(MountError::Other)?;
        }
        let mounts = mount_pair(&t, &images)?;
        let a = Node::new(&t, "a", t.join("mnt-data/data"), t.join("mnt-spool/spool"));
        let b_data = t.join("b-data");
        let b = Node::new(&t, "b", b_data.clone(), b_data.join("spool"));
        Ok(Rig {
            a,
            b,
            mounts: Some(mounts),
            images,
            tmp,
        })
    }

    /// A primary, B its standby, connected; the client streams into A until the cut, which
    /// freezes A, copies its images, kills it and mounts the copies. Returns the ledger.
    fn stream_and_cut(&mut self, rng: &mut SplitMix, totals: &mut Totals) -> Ledger {
        self.a.start(None).unwrap_or_else(|e| panic!("{e}"));
        self.b
            .start(Some(&self.a.addr()))
            .unwrap_or_else(|e| panic!("{e}"));
        common::wait_for("a standby connected to A", LIMIT, || {
            self.a.status()["replication"]["standby_connected"] == true
        });
        let mut client = Client {
            spool: SpoolPaths::new(&self.a.spool),
            rng: SplitMix(rng.next_u64()),
        };
        let mut ledger = Ledger::default();
        let ms = 300 + rng.below(STREAM_MS_MAX);
        let a = &self.a;
        stream_then(&mut client, &mut ledger, ms, || a.signal("STOP"));
        let t = self.tmp.path();
        let copies = [t.join("data-1.img"), t.join("spool-1.img")];
        let mounts = self.mounts.take().expect("A's images mounted");
        let tries = loopfs::copy_quiescent(&[
            (&mounts[0], copies[0].clone()),
            (&mounts[1], copies[1].clone()),
        ])
        .expect("copying A's images");
        totals.copy_retries += tries as usize - 1;
        totals.checkpoints += self.a.log_text().matches("checkpoint wal_from=").count();
        self.a.kill();
        drop(mounts);
        for img in &self.images {
            let _ = std::fs::remove_file(img);
        }
        self.images = copies;
        let m = mount_pair(t, &self.images).unwrap_or_else(|e| match e {
            MountError::NotPermitted(e) | MountError::Other(e) => panic!("mounting copies: {e}"),
        });
        self.mounts = Some(m);
        ledger
    }

    /// B promoted, A restarted from its cut disk as B's standby, every acknowledged batch
    /// retried on B, A caught up, the shards compared; then both stopped and their WALs
    /// compared and verified. Returns the violations.
    fn fail_over(&mut self, ledger: &Ledger, totals: &mut Totals) -> Vec<String> {
        let mut v = Vec::new();
        let cut_wal = self.a.wal().unwrap_or_else(|e| panic!("A's cut disk: {e}"));
        if let Err(e) = self.b.promote() {
            return vec![e];
        }
        if let Err(e) = self.a.start(Some(&self.b.addr())) {
            return vec![format!("the old primary did not start as a standby: {e}")];
        }
        match records_cut(&self.a.log_text()) {
            Ok(n) => {
                totals.records_cut += n;
                totals.cuts_that_cut += usize::from(n > 0);
            }
            Err(e) => v.push(e),
        }
        v.extend(retry_on_b(&self.b, ledger, totals));
        v.extend(self.caught_up_and_equal());
        v.extend(self.stop_both());
        v.extend(compare_wals(&self.a, &self.b, &cut_wal, totals));
        v.extend(self.a.verify());
        v.extend(self.b.verify());
        v
    }

    /// Waits (bounded) until A holds everything durable on B and both scan equal; then
    /// no tag may be on two records (no batch applied twice).
    fn caught_up_and_equal(&self) -> Vec<String> {
        let want = self.b.durable_lsn();
        let until = Instant::now() + LIMIT;
        while self.a.last_lsn() < want {
            if Instant::now() > until {
                return vec![format!(
                    "A did not reach B's durable lsn {want} in {LIMIT:?} (A at {})",
                    self.a.last_lsn()
                )];
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut v = Vec::new();
        for shard in SHARDS {
            let until = Instant::now() + LIMIT;
            let (sa, sb) = loop {
                let (sa, sb) = (self.a.scan(shard), self.b.scan(shard));
                if sa == sb || Instant::now() > until {
                    break (sa, sb);
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            match (sa, sb) {
                (Ok(sa), Ok(sb)) if sa == sb => v.extend(tags_once(shard, &sb)),
                (Ok(sa), Ok(sb)) => v.push(format!(
                    "divergence: shard {shard} scans differ:\nA:\n{sa}\nB:\n{sb}"
                )),
                (Err(e), _) | (_, Err(e)) => v.push(e),
            }
        }
        v
    }

    /// SIGTERM to both (A first, the standby); each must exit 0.
    fn stop_both(&mut self) -> Vec<String> {
        let mut v = Vec::new();
        for n in [&mut self.a, &mut self.b] {
            if let Some(st) = n.exited() {
                v.push(format!("{} exited by itself: {st}", n.name));
            }
            match n.stop() {
                Ok(st) if st.success() => {}
                Ok(st) => v.push(format!("{} stopped with {st}", n.name)),
                Err(e) => v.push(e),
            }
        }
        v
    }
}

fn mount_pair(t: &std::path::Path, images: &[PathBuf; 2]) -> Result<[Mount; 2], MountError> {
    let d = Mount::attach(&images[0], &t.join("mnt-data"))?;
    let s = Mount::attach(&images[1], &t.join("mnt-spool"))?;
    Ok([d, s])
}

/// Sets the client's stop flag when dropped (a panic never leaves the client running).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Streams for `ms`, runs `at_end` while the client still streams, then stops the client
/// (it finishes the delivery or read in hand: what it has read is fixed from then on).
fn stream_then(client: &mut Client, ledger: &mut Ledger, ms: u64, at_end: impl FnOnce()) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let stop = &stop;
        let h = s.spawn(move || client.run(ledger, stop, Duration::from_secs(20)));
        let guard = StopOnDrop(stop);
        std::thread::sleep(Duration::from_millis(ms));
        at_end();
        drop(guard);
        h.join().expect("client thread");
    });
}

/// The number in the restarted old primary's "standby: this log agrees ... records_cut=N".
fn records_cut(log: &str) -> Result<u64, String> {
    let line = log
        .lines()
        .find(|l| l.contains("standby: this log agrees"))
        .ok_or_else(|| format!("the old primary never reconciled with B; its log:\n{log}"))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("records_cut="))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("no records_cut in {line:?}"))
}

/// Delivers every file A answered (and every one it had not) to B again under a new name,
/// same key and content. An acknowledged answer must come back the same (status, lsn,
/// ids); an unanswered file may get any answer. Returns the violations.
fn retry_on_b(b: &Node, ledger: &Ledger, totals: &mut Totals) -> Vec<String> {
    let sp = SpoolPaths::new(&b.spool);
    let mut names = Vec::new();
    for (name, sent) in &ledger.sent {
        let again = format!("retry-{name}");
        roost::spool::deliver(&sp, &again, &sent.body)
            .unwrap_or_else(|e| panic!("delivering {again} to B: {e}"));
        names.push((name, again));
    }
    let mut v = Vec::new();
    let until = Instant::now() + 2 * LIMIT;
    for (name, again) in names {
        let got = loop {
            if let Some(r) = b.result(&again) {
                break Some(r);
            }
            if Instant::now() > until {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let Some(want) = ledger.acked.get(name) else {
            totals.unanswered_retried += 1;
            if got.is_none() {
                v.push(format!("{name} (unanswered by A): no answer from B"));
            }
            continue;
        };
        totals.acked_checked += 1;
        totals.acked_committed += usize::from(want["status"] == "committed");
        if got.as_ref() != Some(want) {
            totals.lost += 1;
            v.push(format!(
                "lost: A acknowledged {name} as {want}, B answers its retry with {got:?}"
            ));
        }
    }
    v
}

/// No record tag twice in one shard's scan (a tag belongs to one create of one batch).
fn tags_once(shard: &str, scan: &str) -> Vec<String> {
    let mut tags: HashMap<String, usize> = HashMap::new();
    for line in scan.lines() {
        let r: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        if let Some(t) = r["record"]["tag"].as_str() {
            *tags.entry(t.to_string()).or_default() += 1;
        }
    }
    tags.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(t, n)| format!("shard {shard}: tag {t} on {n} records (a batch applied twice)"))
        .collect()
}

/// After both stopped: A's and B's WALs equal at every lsn both hold; and B's records of
/// A's epochs (before the promotion) all on A's cut disk, equal (a standby never holds a
/// record its primary could lose).
fn compare_wals(
    a: &Node,
    b: &Node,
    cut_wal: &BTreeMap<u64, Value>,
    totals: &mut Totals,
) -> Vec<String> {
    let (wa, wb) = match (a.wal(), b.wal()) {
        (Ok(wa), Ok(wb)) => (wa, wb),
        (Err(e), _) | (_, Err(e)) => return vec![e],
    };
    let mut v = Vec::new();
    for (lsn, rb) in &wb {
        if let Some(ra) = wa.get(lsn) {
            totals.lsns_compared += 1;
            if ra != rb {
                totals.divergences += 1;
                v.push(format!("divergence at lsn {lsn}: A {ra}, B {rb}"));
            }
        }
    }
    let a_epoch = cut_wal.values().filter_map(|r| r["epoch"].as_u64()).max();
    let a_end = cut_wal.keys().next_back().copied().unwrap_or(0);
    for (lsn, rb) in wb.iter().filter(|(_, r)| r["epoch"].as_u64() <= a_epoch) {
        match cut_wal.get(lsn) {
            Some(ra) if ra == rb => {}
            None if *lsn <= a_end => {} // retired on A's disk by a checkpoint
            other => {
                totals.divergences += 1;
                v.push(format!(
                    "B held lsn {lsn} ({rb}) that A's cut disk has as {other:?}"
                ));
            }
        }
    }
    v
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// Goal: a batch the primary acknowledged under `ack = "standby"` survives a power cut of
/// the primary followed by a failover: the promoted standby answers its retry with the same
/// result (status, lsn, ids); the old primary, restarted from its cut disk as the new one's
/// standby, cuts what the new primary never had and ends with the same records and shards;
/// `verify` is clean on both. Several cuts, each from fresh directories.
///
/// Method: `roost serve` A on two loop-mounted ext4 images (`commit=600`: only a sync makes
/// anything durable), B following it on the temporary directory; a client thread streams
/// creates, deletes and repeats into A's spool and records every result it reads. At a
/// random moment A is frozen (SIGSTOP), the images copied while no loop write is in flight
/// (the copy is the disk after a power cut), A killed, the copies mounted. Then `roost
/// promote` on B, A started with `--follow B` on the copies, every file retried on B, A
/// caught up (bounded), shards and WAL records compared, both stopped, `verify` on both.
#[test]
fn acknowledged_batches_survive_a_primary_power_cut_and_failover() {
    let cuts = env_u64("ROOST_POWERCUT_FAILOVER_CUTS").unwrap_or(CUTS_DEFAULT);
    let seed = env_u64("ROOST_POWERCUT_FAILOVER_SEED").unwrap_or_else(random_seed);
    println!("failover power cuts: {cuts} cuts, seed {seed} (ROOST_POWERCUT_FAILOVER_SEED={seed} to replay)");
    if loopfs::euid() != Some(0) {
        return loopfs::skip_or_fail("failover power-cut test", "not running as root");
    }
    let started = Instant::now();
    let mut rng = SplitMix(seed);
    let mut totals = Totals::default();
    for cut in 0..cuts {
        let mut rig = match Rig::new() {
            Ok(r) => r,
            Err(MountError::NotPermitted(e)) => {
                return loopfs::skip_or_fail("failover power-cut test", &e)
            }
            Err(MountError::Other(e)) => panic!("loop mount: {e}"),
        };
        let ledger = rig.stream_and_cut(&mut rng, &mut totals);
        let v = rig.fail_over(&ledger, &mut totals);
        assert!(
            v.is_empty(),
            "cut {cut} (seed {seed}): {} violations:\n{}\n{totals:?}\nA's log:\n{}\nB's log:\n{}",
            v.len(),
            v.join("\n"),
            rig.a.log_text(),
            rig.b.log_text()
        );
        totals.cuts += 1;
        println!(
            "cut {cut}: {} sent, {} acknowledged, {} records cut on the old primary so far ({:.1} s)",
            ledger.sent.len(),
            ledger.acked.len(),
            totals.records_cut,
            started.elapsed().as_secs_f64()
        );
    }
    report(&totals, started);
}

fn report(t: &Totals, started: Instant) {
    println!(
        "failover power cuts: {} cuts in {:.1} s; {} acknowledged batches checked on the \
         promoted standby ({} committed), {} unanswered files retried; {} records cut on the \
         restarted old primaries (in {} of the cuts); {} lsns compared; lost = {}, \
         divergences = {}; {} image copies retried; {} checkpoints on the primaries before \
         their cuts",
        t.cuts,
        started.elapsed().as_secs_f64(),
        t.acked_checked,
        t.acked_committed,
        t.unanswered_retried,
        t.records_cut,
        t.cuts_that_cut,
        t.lsns_compared,
        t.lost,
        t.divergences,
        t.copy_retries,
        t.checkpoints
    );
    assert_eq!((t.lost, t.divergences), (0, 0), "{t:?}");
}
