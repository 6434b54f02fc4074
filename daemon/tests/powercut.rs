//! Power cuts on a real file system (issue 13): the real `roost serve` on two loop-mounted
//! ext4 images (data, spool), frozen with SIGSTOP at a random moment while a client streams
//! batches, the images copied (that copy is the disk after a power cut), then recovery on the
//! copies and the checks. The recipe and the reasoning are in `docs/durability.md`.
//!
//! Needs root (loop devices, mount). Without it the test prints
//! "SKIPPED: power-cut harness needs root (loop mounts)" and fails, unless
//! `ROOST_ALLOW_NO_ROOT=1`. `ROOST_POWERCUT_CUTS=N` runs N cuts instead of 20;
//! `ROOST_POWERCUT_SEED=S` replays a seed (the batches and the schedule; where a cut lands
//! still depends on timing).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "powercut/client.rs"]
mod client;
mod common;
#[path = "powercut/loopfs.rs"]
mod loopfs;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use client::{Client, Ledger, SHARDS};
use common::BIN;
use loopfs::{Mount, MountError};
use roost::spool::SpoolPaths;
use roost_storage::SplitMix;
use serde_json::Value;

const CUTS_DEFAULT: usize = 20;
/// Room for the spool's many small files (each takes a 4 KiB block: 60 cuts leave ~25,000).
const IMAGE_BYTES: u64 = 256 << 20;
/// Whole-run bound, whatever the cut count (about 6 s a cut is plenty).
const CUT_SECS_MAX: u64 = 30;

/// Small segments, and few ops per batch so that the WAL's segments stay small too (a WAL
/// segment holds two of the largest claims): every log and its spare segment fit the image.
/// Checkpoints every 256 KiB of WAL or half a second, so cuts also land in checkpoints, WAL
/// retirement and compaction.
const CONFIG: &str = r#"
wal_segment_bytes = 4194304
shard_segment_bytes = 65536
rescan_interval_ms = 100
batch_ops_max = 8
checkpoint_wal_bytes = 262144
checkpoint_interval_ms = 500
shard_compact_dead_fraction = 0.1
[shards.a]
[shards.b]
"#;

/// Where everything of one run lives: the temporary directory (on the host's file system),
/// the two mount points and the config.
struct Rig {
    tmp: PathBuf,
    config: PathBuf,
    data: PathBuf,
    spool: PathBuf,
    starts: usize,
}

impl Rig {
    fn data_mnt(&self) -> PathBuf {
        self.tmp.join("mnt-data")
    }
    fn spool_mnt(&self) -> PathBuf {
        self.tmp.join("mnt-spool")
    }

    /// `roost ARGS --config .. --data-dir .. --spool-dir ..`, not yet run.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .arg("--config")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--spool-dir")
            .arg(&self.spool);
        c
    }

    fn roost(&self, args: &[&str]) -> std::process::Output {
        self.command(args).output().expect("run roost")
    }

    /// Starts `roost serve` and waits (60 s at most) for "serving": recovery is done. A
    /// daemon killed by a signal this test did not send (another program's SIGTERM on a
    /// shared machine) is reported and started again, up to three times: to recovery that is
    /// one more crash.
    fn serve(&mut self) -> Daemon {
        for _ in 0..3 {
            match self.try_serve() {
                Ok(d) => return d,
                Err(why) => println!("power-cut harness: {why}; starting it again"),
            }
        }
        panic!("roost serve was killed during recovery three times in a row");
    }

    fn try_serve(&mut self) -> Result<Daemon, String> {
        use std::os::unix::process::ExitStatusExt;
        self.starts += 1;
        let log = self.tmp.join(format!("serve-{}.log", self.starts));
        let child = self
            .command(&["serve"])
            .env("ROOST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn roost serve");
        let mut d = Daemon { child, log };
        let until = Instant::now() + Duration::from_secs(60);
        while !d.log_text().contains("serving") {
            if let Ok(Some(st)) = d.child.try_wait() {
                if let Some(sig) = st.signal() {
                    return Err(format!(
                        "roost serve killed by signal {sig} during recovery"
                    ));
                }
                panic!(
                    "roost serve exited during recovery ({st}):\n{}",
                    d.log_text()
                );
            }
            assert!(
                Instant::now() < until,
                "roost serve not ready in 60 s:\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(d)
    }
}

/// The daemon; dropping it kills it (SIGKILL also ends a stopped process).
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, sig: &str) {
        common::signal(self.child.id(), sig);
    }

    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sets the client's stop flag when dropped, so a panic in the test never leaves the
/// client thread (and the scope joining it) running.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Streams with the client for `secs_ms` milliseconds, then runs `at_end` (the daemon is
/// still running) before the client stops; returns what `at_end` returned. The client
/// finishes its current delivery or read and stops.
fn stream_then<T>(
    client: &mut Client,
    ledger: &mut Ledger,
    ms: u64,
    at_end: impl FnOnce() -> T,
) -> T {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let stop = &stop;
        let h = s.spawn(move || client.run(ledger, stop, Duration::from_secs(20)));
        let guard = StopOnDrop(stop);
        std::thread::sleep(Duration::from_millis(ms));
        let r = at_end();
        drop(guard);
        h.join().expect("client thread");
        r
    })
}

fn skip_or_fail(why: &str) {
    loopfs::skip_or_fail("power-cut harness", why);
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Goal: a batch whose result a client has read survives a power cut on a real journaled
/// file system, with and without a `kill -9` and a recovery shortly before the cut (recovery
/// must not build on what only the page cache holds); nothing is created twice.
///
/// Method: the real `roost serve` on two loop-mounted ext4 images (data and spool, `commit=600`
/// so only fsync makes anything durable); a client thread streams creates, deletes and
/// repeats and records every result it reads. At a random moment the daemon is frozen
/// (SIGSTOP), the client stopped, and both images copied while no loop write is in flight:
/// the copy is what the disks hold if the power goes now. Then SIGKILL, unmount, mount the
/// copies (ext4 replays its journal), recover, and check: `roost verify` exits 0, every
/// result read before the cut is still in `out/` and is the answer to a resubmission of the
/// same file, every acknowledged create is present once, no tag is on two records. Half the
/// cuts come after a `kill -9` and a restart that served for a moment. The recovered copies
/// carry on into the next cut.
#[test]
fn acknowledged_batches_survive_power_cuts_on_ext4() {
    let cuts = env_u64("ROOST_POWERCUT_CUTS").unwrap_or(CUTS_DEFAULT as u64) as usize;
    let seed = env_u64("ROOST_POWERCUT_SEED").unwrap_or_else(random_seed);
    println!("power-cut harness: {cuts} cuts, seed {seed} (ROOST_POWERCUT_SEED={seed} to replay)");
    if loopfs::euid() != Some(0) {
        return skip_or_fail("not running as root");
    }
    let t = tempfile::tempdir().expect("tempdir");
    let mut rig = Rig {
        tmp: t.path().to_path_buf(),
        config: t.path().join("roost.toml"),
        data: t.path().join("mnt-data/data"),
        spool: t.path().join("mnt-spool/spool"),
        starts: 0,
    };
    let sock = t.path().join("roost.sock");
    std::fs::write(
        &rig.config,
        format!(
            "control_socket = {:?}\n{CONFIG}",
            sock.display().to_string()
        ),
    )
    .expect("config");
    let mut images = [t.path().join("data-0.img"), t.path().join("spool-0.img")];
    for img in &images {
        loopfs::make_image(img, IMAGE_BYTES).expect("mkfs.ext4");
    }
    let mut mounts = match mount_pair(&rig, &images) {
        Ok(m) => m,
        Err(MountError::NotPermitted(e)) => return skip_or_fail(&e),
        Err(MountError::Other(e)) => panic!("loop mount: {e}"),
    };
    let started = Instant::now();
    let mut rng = SplitMix(seed);
    let mut client = Client {
        spool: SpoolPaths::new(&rig.spool),
        rng: SplitMix(seed ^ 0x5eed),
    };
    let mut ledger = Ledger::default();
    let mut stats = Stats::default();
    let mut daemon = rig.serve();
    for cut in 0..cuts {
        assert!(
            started.elapsed() < Duration::from_secs(CUT_SECS_MAX * cuts as u64 + 60),
            "the run took too long"
        );
        if cut % 2 == 1 {
            // kill -9 while streaming, and a recovery that serves for a moment before the cut.
            let ms = 50 + rng.below(300);
            stream_then(&mut client, &mut ledger, ms, || ());
            stats.count_log(&daemon.log_text());
            daemon.kill9();
            daemon = rig.serve();
            stats.kills += 1;
        }
        let ms = 30 + rng.below(600);
        let copies = [
            t.path().join(format!("data-{}.img", cut + 1)),
            t.path().join(format!("spool-{}.img", cut + 1)),
        ];
        stream_then(&mut client, &mut ledger, ms, || daemon.signal("STOP"));
        let tries = loopfs::copy_quiescent(&[
            (&mounts[0], copies[0].clone()),
            (&mounts[1], copies[1].clone()),
        ])
        .expect("copying the images");
        stats.copy_retries += tries as usize - 1;
        stats.count_log(&daemon.log_text());
        daemon.kill9();
        drop(mounts);
        for img in &images {
            let _ = std::fs::remove_file(img);
        }
        images = copies;
        mounts = mount_pair(&rig, &images).unwrap_or_else(|e| match e {
            MountError::NotPermitted(e) | MountError::Other(e) => panic!("mounting copies: {e}"),
        });
        stats.acked_missing_on_disk += acked_missing(&rig, &ledger);
        daemon = rig.serve();
        let violations = check_after_cut(&rig, &mut ledger, cut);
        if !violations.is_empty() {
            panic!(
                "cut {cut} (seed {seed}): {} violations:\n{}\nserve log:\n{}",
                violations.len(),
                violations.join("\n"),
                daemon.log_text()
            );
        }
        stats.cuts += 1;
        println!(
            "cut {cut}: {} files sent, {} results read so far ({:.1} s)",
            ledger.sent.len(),
            ledger.acked.len(),
            started.elapsed().as_secs_f64()
        );
    }
    drop(daemon);
    let secs = started.elapsed().as_secs_f64();
    println!(
        "power-cut harness: {} cuts ({} after a kill -9 and a recovery) in {secs:.1} s; \
         {} files sent, {} results read; {} read results were not yet on the cut disk \
         (recovery wrote them again); {} image copies retried; {} checkpoints, {} shard \
         compactions in the daemons' logs",
        stats.cuts,
        stats.kills,
        ledger.sent.len(),
        ledger.acked.len(),
        stats.acked_missing_on_disk,
        stats.copy_retries,
        stats.checkpoints,
        stats.compactions
    );
    assert!(
        stats.cuts < 4 || stats.checkpoints > 0,
        "no checkpoint ran: the cuts never met one"
    );
}

#[derive(Default)]
struct Stats {
    cuts: usize,
    kills: usize,
    acked_missing_on_disk: usize,
    copy_retries: usize,
    checkpoints: usize,
    compactions: usize,
}

impl Stats {
    /// Checkpoints and compactions a daemon's log reports, before it is killed.
    fn count_log(&mut self, log: &str) {
        self.checkpoints += log.matches("checkpoint wal_from=").count();
        self.compactions += log.matches("shard: compacted").count();
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

fn mount_pair(rig: &Rig, images: &[PathBuf; 2]) -> Result<[Mount; 2], MountError> {
    let d = Mount::attach(&images[0], &rig.data_mnt())?;
    let s = Mount::attach(&images[1], &rig.spool_mnt())?;
    Ok([d, s])
}

/// Results the client read whose file is not in `out/` on the cut disk (before recovery).
fn acked_missing(rig: &Rig, ledger: &Ledger) -> usize {
    let out = rig.spool.join("out");
    ledger
        .acked
        .keys()
        .filter(|n| !out.join(n).exists())
        .count()
}

/// Waits (60 s at most) until every sent file has a result; returns them all.
fn drain(rig: &Rig, ledger: &Ledger) -> Result<BTreeMap<String, Value>, String> {
    let out = rig.spool.join("out");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let mut all = BTreeMap::new();
        let mut missing = Vec::new();
        for name in ledger.sent.keys() {
            match std::fs::read(out.join(name)) {
                Ok(b) => {
                    let v: Value = serde_json::from_slice(&b)
                        .map_err(|e| format!("result {name} is not JSON: {e}"))?;
                    all.insert(name.clone(), v);
                }
                Err(_) => missing.push(name.clone()),
            }
        }
        if missing.is_empty() {
            return Ok(all);
        }
        if Instant::now() > until {
            return Err(format!(
                "{} delivered files have no result after 60 s: {:?}",
                missing.len(),
                &missing[..missing.len().min(10)]
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every check after a cut's recovery; returns the violations (empty: all hold). Results
/// read here join the acknowledged ones, so later cuts check them too.
fn check_after_cut(rig: &Rig, ledger: &mut Ledger, cut: usize) -> Vec<String> {
    let mut v = Vec::new();
    let results = match drain(rig, ledger) {
        Ok(r) => r,
        Err(e) => return vec![e],
    };
    for (name, was) in &ledger.acked {
        let now = &results[name];
        if now != was {
            v.push(format!(
                "acknowledged {name}: read {was} before the cut, now {now}"
            ));
        }
    }
    for (name, s) in &ledger.sent {
        if let Some(of) = &s.repeat_of {
            if results[of]["status"] == "committed" && results[of] != results[name] {
                v.push(format!(
                    "{name} repeats {of}: got {} for {}",
                    results[name], results[of]
                ));
            }
        }
    }
    v.extend(resubmit(rig, ledger, &results, cut));
    ledger.resubmitted.extend(ledger.acked.keys().cloned());
    v.extend(records_once(rig, ledger, &results));
    let out = rig.roost(&["verify"]);
    if !out.status.success() {
        v.push(format!(
            "roost verify exited {:?}:\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    for (name, r) in results {
        client::learn(ledger, &name, &r);
        ledger.acked.insert(name, r);
    }
    ledger.pending.clear();
    v
}

/// Resubmits every acknowledged file (same key, same content, a new name `rN-NAME`) and
/// compares the answer with the one read before the cut.
fn resubmit(
    rig: &Rig,
    ledger: &Ledger,
    results: &BTreeMap<String, Value>,
    cut: usize,
) -> Vec<String> {
    let sp = SpoolPaths::new(&rig.spool);
    let mut names = Vec::new();
    for name in ledger
        .acked
        .keys()
        .filter(|n| !ledger.resubmitted.contains(*n))
    {
        let again = format!("r{cut}-{name}");
        roost::spool::deliver(&sp, &again, &ledger.sent[name].body)
            .unwrap_or_else(|e| panic!("delivering {again}: {e}"));
        names.push((name, again));
    }
    let mut v = Vec::new();
    let until = Instant::now() + Duration::from_secs(60);
    for (name, again) in names {
        let got = loop {
            if let Ok(b) = std::fs::read(sp.out.join(&again)) {
                break serde_json::from_slice::<Value>(&b).ok();
            }
            if Instant::now() > until {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let want = &results[name];
        match got {
            None => v.push(format!("resubmitted {name} as {again}: no result in 60 s")),
            Some(g) if want["status"] == "committed" && &g != want => v.push(format!(
                "resubmitted {name}: answered {g}, acknowledged {want}"
            )),
            Some(g) if g["status"] == "committed" && want["status"] != "committed" => v.push(
                format!("resubmitted {name}: committed {g}, acknowledged {want}"),
            ),
            Some(_) => {}
        }
    }
    v
}

/// Scans both shards: no tag on two records, and every create of a committed original batch
/// present with its record unless a committed batch deleted it.
fn records_once(rig: &Rig, ledger: &Ledger, results: &BTreeMap<String, Value>) -> Vec<String> {
    let mut v = Vec::new();
    let mut by_id: HashMap<u64, (String, Value)> = HashMap::new();
    let mut tags: HashMap<String, usize> = HashMap::new();
    for shard in SHARDS {
        let out = rig.roost(&["scan", shard]);
        if !out.status.success() {
            v.push(format!("scan {shard} exited {:?}", out.status.code()));
            continue;
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let r: Value = match serde_json::from_str(line) {
                Ok(r) => r,
                Err(e) => {
                    v.push(format!("scan {shard}: {e}: {line}"));
                    continue;
                }
            };
            let tag = r["record"]["tag"].as_str().unwrap_or("").to_string();
            *tags.entry(tag).or_default() += 1;
            if let Some(id) = r["id"].as_u64() {
                by_id.insert(id, (shard.to_string(), r["record"].clone()));
            }
        }
    }
    for (tag, n) in &tags {
        if *n > 1 {
            v.push(format!("a create produced {n} records: tag {tag}"));
        }
    }
    let committed = |r: &&Value| r["status"] == "committed";
    let deleted: HashSet<u64> = results
        .values()
        .filter(committed)
        .flat_map(|r| r["ops"].as_array().cloned().unwrap_or_default())
        .filter(|op| op["op"] == "delete")
        .filter_map(|op| op["id"].as_u64())
        .collect();
    for (name, r) in results.iter().filter(|(_, r)| committed(r)) {
        let body: Value = serde_json::from_slice(&ledger.sent[name].body).expect("our own JSON");
        for (k, op) in r["ops"].as_array().into_iter().flatten().enumerate() {
            let Some(id) = op["id"].as_u64() else {
                continue;
            };
            if op["op"] != "create" || deleted.contains(&id) {
                continue;
            }
            let want = &body["ops"][k]["record"];
            match by_id.get(&id) {
                None => v.push(format!(
                    "{name}: committed create id {id} (op {k}) is missing"
                )),
                Some((shard, rec)) if op["shard"] != shard.as_str() || rec != want => v.push(
                    format!("{name}: id {id} holds {rec} on {shard}, created {want}"),
                ),
                Some(_) => {}
            }
        }
    }
    v
}
