//! The engine fuzzed through crashes (issue 45; the `engine_crash` target): a structure-aware
//! case (`arbitrary`) is a short history of batches (spool-file groups and bulk-line groups,
//! request keys from a small set so duplicates and same-key conflicts happen, deletes of ids
//! that may not exist), checkpoints, durability rounds and graceful restarts, run on the real
//! engine over `SimStorage` with one crash: at the n-th named crash point (`NthCrash`), or a
//! power cut after the n-th sync, taken as a process crash, a power loss or a torn power loss.
//! Recovery then opens the files and the invariants of `RoostApplyBatch.tla` are checked
//! against the oracle of what was acknowledged, with `roost-tests`' checks (the crash
//! schedules' `check_invariants`, `apply_committed`, `roost verify`). Never does it write a
//! model of its own: the expected shards are the acknowledged answers applied in order.
//! A violated invariant is a panic naming it; sizes are bounded so a case runs in a few ms.

use std::collections::BTreeMap;
use std::sync::Arc;

use arbitrary::Arbitrary;
use roost::batch::{Batch, BatchResult, Status};
use roost::error::EngineError;
use roost::pipeline::crash::NthCrash;
use roost::pipeline::{Deliver, Engine};
use roost_storage::{CrashMode, SimFaults, SimStorage};
use roost_tests::{apply_committed, check_invariants, contents, open_engine_with, Contents};
use roost_wal::Lsn;

/// Shards a case writes to, and request keys it draws from (few, so keys repeat).
pub const SHARDS: &[&str] = &["s0", "s1", "s2"];
const KEYS: u8 = 4;
/// Bounds that keep one case to a few milliseconds.
const STEPS_MAX: usize = 10;
const GROUP_MAX: usize = 4;
const OPS_MAX: usize = 3;
/// Ids a delete names: the first few minted, and some never minted.
const DELETE_IDS: u8 = 12;

/// One op of a batch, with everything small.
#[derive(Arbitrary, Clone, Debug)]
pub enum OpSpec {
    Create { shard: u8, tag: u8 },
    Delete { shard: u8, id: u8 },
}

/// One batch: a key from the small set and up to `OPS_MAX` ops.
#[derive(Arbitrary, Clone, Debug)]
pub struct BatchSpec {
    pub key: u8,
    pub ops: Vec<OpSpec>,
}

/// One step of a history.
#[derive(Arbitrary, Clone, Debug)]
pub enum Step {
    /// Spool files found waiting together: one group, results published as `out/NAME`.
    Files(Vec<BatchSpec>),
    /// Lines of a bulk file: one group, answers returned (`bulk/NAME/LINE`).
    Lines(Vec<BatchSpec>),
    Checkpoint,
    /// The durability round the serve loop runs (`Engine::settle`).
    Settle,
    /// A graceful stop and a start (recovery with nothing unfinished).
    Restart,
}

/// Where the one crash of a case happens.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum CrashAt {
    /// At the n-th named crash point of the run (1-based; past the last point, none).
    Point(u8),
    /// The power goes after the n-th sync: later syncs succeed and keep nothing.
    Syncs(u8),
}

/// One fuzz case.
#[derive(Arbitrary, Clone, Debug)]
pub struct Case {
    pub steps: Vec<Step>,
    pub crash: CrashAt,
    /// 0: process crash (not with `Syncs`), 1: power loss, else a torn power loss.
    pub mode: u8,
}

/// A batch as the engine sees it, with the source it was submitted under.
struct Sent {
    batch: Batch,
    source: String,
    file: bool,
}

/// What was acknowledged: per key, the first batch sent under it and its answer, and the
/// shards those answers imply.
#[derive(Default)]
struct Oracle {
    answers: BTreeMap<String, (Vec<u8>, BatchResult)>,
    want: Contents,
    /// The shards before each commit that recovery finished was taken: a rejection recorded
    /// before the crash was decided in one of these states (the answer does not say which),
    /// one decided after recovery in `want`.
    before_recovered: Vec<Contents>,
}

impl Oracle {
    /// Takes the answer `r` to `b`: the same key and batch answer the same (AckedResultKept);
    /// the same key with another batch is a conflict, unless the key's answer was a rejection
    /// (docs/contract.md: such a batch is planned as new); a new key's commit is applied, and
    /// its rejection must have a reason in the acknowledged shards.
    fn observe(&mut self, b: &Batch, r: &BatchResult) -> Result<(), String> {
        let json = b.to_json();
        let fixed = |(sent, first): &(Vec<u8>, BatchResult)| {
            *sent != json && first.status() == Status::Rejected
        };
        if let Some((sent, first)) = self.answers.get(&b.request_key).filter(|a| !fixed(a)) {
            if *sent == json && r != first {
                return Err(format!(
                    "AckedResultKept: {:?} was answered {first:?}, now {r:?}",
                    b.request_key
                ));
            }
            if *sent != json && r.status() != Status::Conflict {
                return Err(format!(
                    "key {:?} reused with another batch answered {r:?}, not a conflict",
                    b.request_key
                ));
            }
            return Ok(());
        }
        match r.status() {
            Status::Committed => apply_committed(&mut self.want, b, r)?,
            Status::Rejected => self.rejection_has_a_reason(b, r)?,
            _ => return Err(format!("a new key {:?} answered {r:?}", b.request_key)),
        }
        self.answers
            .insert(b.request_key.clone(), (json, r.clone()));
        Ok(())
    }

    /// A rejected batch names a delete of an id its shard does not hold (after its own
    /// earlier ops): RejectedBatchWritesNothing is checked on the files; this checks the
    /// engine did not reject a batch it should have committed.
    fn rejection_has_a_reason(&self, b: &Batch, r: &BatchResult) -> Result<(), String> {
        let states = std::iter::once(&self.want).chain(&self.before_recovered);
        for held in states {
            if names_an_absent_id(held, b) {
                return Ok(());
            }
        }
        Err(format!(
            "{r:?}: every delete of {:?} names a held id",
            b.request_key
        ))
    }
}

/// A delete of `b` names an id its shard does not hold (after `b`'s own earlier ops).
fn names_an_absent_id(held: &Contents, b: &Batch) -> bool {
    let mut held = held.clone();
    b.ops.iter().any(|op| match op {
        roost::batch::BatchOp::Delete { shard, id, .. } => {
            held.entry(shard.clone()).or_default().remove(id).is_none()
        }
        _ => false,
    })
}

fn op_json(key: &str, k: usize, op: &OpSpec) -> serde_json::Value {
    match op {
        OpSpec::Create { shard, tag } => serde_json::json!({
            "op": "create",
            "shard": SHARDS[*shard as usize % SHARDS.len()],
            // Unique per (key, op): AtMostOnePerCreate counts a create's record by content.
            "record": {"k": key, "o": k, "t": tag % 4},
        }),
        OpSpec::Delete { shard, id } => serde_json::json!({
            "op": "delete",
            "shard": SHARDS[*shard as usize % SHARDS.len()],
            "id": 1 + u64::from(*id % DELETE_IDS),
        }),
    }
}

/// The batch of `spec`, or none for a spec without ops (an invalid batch, not this target's
/// subject: `batch_file` fuzzes the parser).
fn batch_of(spec: &BatchSpec) -> Option<Batch> {
    let key = format!("k{}", spec.key % KEYS);
    let ops: Vec<serde_json::Value> = spec
        .ops
        .iter()
        .take(OPS_MAX)
        .enumerate()
        .map(|(k, op)| op_json(&key, k, op))
        .collect();
    if ops.is_empty() {
        return None;
    }
    let v = serde_json::json!({"request_key": key, "ops": ops});
    let bytes = serde_json::to_vec(&v).expect("json of a batch");
    Some(roost::batch::parse(&bytes, 16).expect("a batch the target builds parses"))
}

/// A run of the engine over one disk, with the oracle of what it acknowledged.
struct Run {
    disk: SimStorage,
    oracle: Oracle,
    /// Batches submitted whose answer was not returned (the crash came first).
    pending: Vec<Sent>,
    /// Names used so far: every spool file and bulk line has its own.
    sent: usize,
    /// The power goes after this many syncs (`CrashAt::Syncs`).
    cut: Option<u64>,
}

fn open(disk: &SimStorage, crash: Arc<NthCrash>) -> Result<Engine, EngineError> {
    open_engine_with(disk, crash, |c| {
        // Compaction runs in idle owners on a timer: off, so a case replays the same.
        c.shard_compact_bytes_per_sec = 0;
        c.shard_threads = 1;
    })
}

impl Run {
    fn sents(&mut self, specs: &[BatchSpec], file: bool) -> Vec<Sent> {
        let mut out = Vec::new();
        for spec in specs.iter().take(GROUP_MAX) {
            let Some(batch) = batch_of(spec) else {
                continue;
            };
            self.sent += 1;
            let source = if file {
                format!("b{}.json", self.sent)
            } else {
                format!("bulk/f{}.jsonl/{}", self.sent, self.sent)
            };
            out.push(Sent {
                batch,
                source,
                file,
            });
        }
        out
    }

    /// Submits a group; on an error the whole group is pending.
    fn group(&mut self, e: &Engine, specs: &[BatchSpec], file: bool) -> Result<(), EngineError> {
        let group = self.sents(specs, file);
        if group.is_empty() {
            return Ok(());
        }
        let items: Vec<(&Batch, &str)> = group
            .iter()
            .map(|s| (&s.batch, s.source.as_str()))
            .collect();
        let deliver = if file {
            Deliver::Files
        } else {
            Deliver::Returned
        };
        match e.submit(&items, deliver) {
            Ok(answers) => {
                assert_eq!(answers.len(), group.len(), "one answer per batch");
                for (s, r) in group.iter().zip(&answers) {
                    self.oracle
                        .observe(&s.batch, r)
                        .unwrap_or_else(|m| panic!("{} ({}): {m}", s.batch.request_key, s.source));
                }
                Ok(())
            }
            Err(err) => {
                self.pending.extend(group);
                Err(err)
            }
        }
    }

    /// Runs one step; an error is the crash (any other error is a finding). A restart is a
    /// graceful stop (`serve`'s: the last checkpoint, the WAL synced), then a start.
    fn step(
        &mut self,
        e: Engine,
        step: &Step,
        hook: &Arc<NthCrash>,
    ) -> Result<Engine, EngineError> {
        match step {
            Step::Files(g) => self.group(&e, g, true)?,
            Step::Lines(g) => self.group(&e, g, false)?,
            Step::Checkpoint => drop(e.checkpoint()?),
            Step::Settle => drop(e.settle()?),
            Step::Restart => {
                e.checkpoint()?;
                e.sync()?;
                drop(e);
                if self.frozen() {
                    // The power went during the stop: nothing starts again on this machine
                    // (a start would read the page cache of a machine that is off).
                    return Err(EngineError::Crashed("power cut during a restart".into()));
                }
                return open(&self.disk, hook.clone());
            }
        }
        Ok(e)
    }
}

fn crash_mode(mode: u8, seed: u64, power_only: bool) -> CrashMode {
    match mode % 3 {
        0 if !power_only => CrashMode::Process,
        0 | 1 => CrashMode::PowerDrop,
        _ => CrashMode::PowerTear { seed },
    }
}

/// Runs a case: the history up to its crash, recovery, the checks. Panics on a violation.
pub fn run(case: &Case) {
    let disk = SimStorage::new();
    let (hook, power_only) = match case.crash {
        CrashAt::Point(n) => (Arc::new(NthCrash::new(Some(u64::from(n) + 1))), false),
        CrashAt::Syncs(n) => {
            disk.set_faults(SimFaults {
                freeze_after_syncs: Some(u64::from(n)),
                ..SimFaults::default()
            });
            (Arc::new(NthCrash::new(None)), true)
        }
    };
    let oracle = Oracle {
        answers: BTreeMap::new(),
        before_recovered: Vec::new(),
        // `contents` names every shard, written or not.
        want: SHARDS
            .iter()
            .map(|s| (s.to_string(), BTreeMap::new()))
            .collect(),
    };
    let mut r = Run {
        disk: disk.clone(),
        oracle,
        pending: Vec::new(),
        sent: 0,
        cut: match case.crash {
            CrashAt::Syncs(n) => Some(u64::from(n)),
            CrashAt::Point(_) => None,
        },
    };
    r.history(case, &hook);
    let at_cut = r.results_at_cut();
    let seed = case.steps.len() as u64 * 31 + u64::from(case.mode);
    let after = disk.crash(crash_mode(case.mode, seed, power_only));
    r.disk = after;
    r.recover_and_check(at_cut);
}

impl Run {
    /// Runs the steps until the crash; with a power cut (`Syncs`), what is answered after the
    /// cut was never seen by a client (the power was gone): it is pending too.
    fn history(&mut self, case: &Case, hook: &Arc<NthCrash>) {
        let mut e = match open(&self.disk, hook.clone()) {
            Ok(e) => e,
            Err(EngineError::Crashed(_)) => return,
            Err(err) => panic!("the first open failed: {err}"),
        };
        for step in case.steps.iter().take(STEPS_MAX) {
            let oracle_before = (self.oracle.answers.clone(), self.oracle.want.clone());
            e = match self.step(e, step, hook) {
                Ok(e) => e,
                Err(EngineError::Crashed(_)) => return,
                Err(err) => panic!("step {step:?}: {err}"),
            };
            if self.frozen() {
                // The power went during this step: its answers came after the cut (no client
                // saw them) and nothing later can reach the disk.
                self.unacknowledge(step, oracle_before);
                return;
            }
        }
        // No crash in the history: the power goes (or the process dies) at its end.
    }

    fn frozen(&self) -> bool {
        self.cut.is_some_and(|n| self.disk.sync_count() > n)
    }

    /// Moves a step's batches back to pending and restores the oracle from before it.
    fn unacknowledge(
        &mut self,
        step: &Step,
        before: (BTreeMap<String, (Vec<u8>, BatchResult)>, Contents),
    ) {
        let (Step::Files(g) | Step::Lines(g)) = step else {
            return;
        };
        let file = matches!(step, Step::Files(_));
        let first = self.sent
            - g.iter()
                .take(GROUP_MAX)
                .filter(|s| batch_of(s).is_some())
                .count();
        self.sent = first;
        let again = self.sents(g, file);
        self.pending.extend(again);
        (self.oracle.answers, self.oracle.want) = before;
    }
}

impl Run {
    /// Recovery, then: nothing acknowledged lost and the pending batches whole or absent
    /// (NoPartialShard, AtMostOnePerCreate, `roost verify`); every pending batch retried and
    /// every acknowledged one sent again (AckedResultKept, RetryConverges: the shards are
    /// exactly the oracle's).
    fn recover_and_check(&mut self, at_cut: BTreeMap<String, BatchResult>) {
        let mut seen = self.visible_results();
        for (name, r) in at_cut {
            seen.entry(name).or_insert(r);
        }
        let e = open(&self.disk, Arc::new(NthCrash::new(None)))
            .unwrap_or_else(|err| panic!("recovery refused to open: {err}"));
        self.check_recovered();
        let pending = std::mem::take(&mut self.pending);
        let recovered_end = e.wal().next_lsn();
        let answered: Vec<(&Sent, BatchResult)> =
            pending.iter().map(|s| (s, self.one(&e, s))).collect();
        let mut recovering = true;
        for (k, recovered) in commit_order(&answered, recovered_end) {
            let (s, r) = (answered[k].0, answered[k].1.clone());
            if recovering {
                // The state before this recovered commit, or after the last of them.
                let before = self.oracle.want.clone();
                self.oracle.before_recovered.push(before);
                recovering = recovered;
            }
            // A rejection seen, then its key taken by another batch in flight beside it: the
            // key remembers that batch, so the rejected one sent again is a conflict (the
            // other committed) or planned as new (the other was rejected too), and the oracle
            // checks it as such (docs/contract.md).
            let rebound = |a: &BatchResult| a.status() == Status::Rejected && rival(&pending, s);
            if let Some(acked) = seen.get(&s.source).filter(|a| **a != r && !rebound(a)) {
                panic!(
                    "AckedResultKept: {} saw {acked:?} in out/, the retry answers {r:?}",
                    s.source
                );
            }
            if r.status() == Status::Conflict && rival(&pending, s) {
                // Another batch in flight under this key may hold it now (the second of a
                // group, planned as new after this one's rejection): its retry is checked.
                continue;
            }
            self.oracle
                .observe(&s.batch, &r)
                .unwrap_or_else(|m| panic!("retry of {}: {m}", s.source));
        }
        self.resend_acknowledged(&e);
        e.settle()
            .unwrap_or_else(|err| panic!("the durability round after recovery: {err}"));
        drop(e);
        let now = contents(&self.disk, SHARDS);
        if now != self.oracle.want {
            panic!(
                "RetryConverges: the shards are {now:?}, the acknowledged answers say {:?}",
                self.oracle.want
            );
        }
        verified(&self.disk, "after the retries");
    }

    /// The results a client can read in `out/` after the crash, for pending spool files.
    fn visible_results(&self) -> BTreeMap<String, BatchResult> {
        self.pending
            .iter()
            .filter(|s| s.file)
            .filter_map(|s| {
                let r = roost_tests::visible_result(&self.disk, &s.source)
                    .unwrap_or_else(|m| panic!("{m}"));
                r.map(|r| (s.source.clone(), r))
            })
            .collect()
    }

    /// The results a client could read in `out/` when the power went (a power cut after a
    /// sync): renamed before the cut, whatever the cut then took.
    fn results_at_cut(&self) -> BTreeMap<String, BatchResult> {
        let out = roost_tests::data_dir().join("spool").join("out");
        self.pending
            .iter()
            .filter(|s| s.file)
            .filter_map(|s| {
                let bytes = self.disk.file_bytes_at_freeze(&out.join(&s.source))?;
                let r = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                    panic!(
                        "out/{} was visible at the cut but not whole ({e})",
                        s.source
                    )
                });
                Some((s.source.clone(), r))
            })
            .collect()
    }

    fn one(&self, e: &Engine, s: &Sent) -> BatchResult {
        let deliver = if s.file {
            Deliver::Files
        } else {
            Deliver::Returned
        };
        let answers = e
            .submit(&[(&s.batch, s.source.as_str())], deliver)
            .unwrap_or_else(|err| panic!("{} after recovery: {err}", s.source));
        answers
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no answer to {}", s.source))
    }

    /// Right after recovery: with one batch pending, the crash schedules' checks on it over
    /// the acknowledged shards; with none, exactly the acknowledged shards; always `verify`.
    fn check_recovered(&self) {
        match self.pending.as_slice() {
            [] => {
                let now = contents(&self.disk, SHARDS);
                if now != self.oracle.want {
                    panic!(
                        "an acknowledged answer lost: the shards are {now:?}, the answers say {:?}",
                        self.oracle.want
                    );
                }
                verified(&self.disk, "after recovery");
            }
            [one] => {
                check_invariants(&self.disk, SHARDS, &self.oracle.want, &one.batch, None)
                    .unwrap_or_else(|m| panic!("after recovery, {} pending: {m}", one.source));
            }
            _ => verified(&self.disk, "after recovery"),
        }
    }

    /// Every acknowledged batch sent again, detached: the same answer (a committed batch's
    /// ids, a rejection's op) whatever the crash and the checkpoints did.
    fn resend_acknowledged(&mut self, e: &Engine) {
        let sent: Vec<(Vec<u8>, BatchResult)> = self.oracle.answers.values().cloned().collect();
        for (json, first) in sent {
            let b = roost::batch::parse(&json, 16).expect("a batch the target built");
            self.sent += 1;
            let s = Sent {
                batch: b,
                source: format!("bulk/again.jsonl/{}", self.sent),
                file: false,
            };
            let r = self.one(e, &s);
            if r != first {
                panic!(
                    "AckedResultKept: {:?} was answered {first:?}, sent again after recovery {r:?}",
                    s.batch.request_key
                );
            }
        }
    }
}

/// Whether another batch in flight has `s`'s key and other content.
fn rival(pending: &[Sent], s: &Sent) -> bool {
    let json = s.batch.to_json();
    pending
        .iter()
        .any(|o| o.batch.request_key == s.batch.request_key && o.batch.to_json() != json)
}

fn verified(disk: &SimStorage, when: &str) {
    let report = roost::ops::verify::verify(Arc::new(disk.clone()), &roost_tests::data_dir());
    if !report.ok() {
        panic!("verify {when}: {:?}", report.violations);
    }
}

/// The order the retries' answers are taken in (indices into `answered`, each with whether
/// it is a commit recovery finished): the commits recovery finished (below
/// `recovered_end`) in lsn order, which come before anything decided after recovery, then
/// the others as sent. Found by this target: a retried delete of an id that a later batch of
/// its group minted, which recovery had finished; and a retry answered with the commit of a
/// later batch of the same content under the same key. A rejection recorded before the
/// crash was decided among the recovered commits: `Oracle::before_recovered`.
fn commit_order(answered: &[(&Sent, BatchResult)], recovered_end: Lsn) -> Vec<(usize, bool)> {
    let recovered_lsn = |i: usize| match &answered[i].1 {
        BatchResult::Committed { lsn, .. } if *lsn < recovered_end => Some(*lsn),
        _ => None,
    };
    let (mut first, rest): (Vec<usize>, Vec<usize>) =
        (0..answered.len()).partition(|&i| recovered_lsn(i).is_some());
    first.sort_by_key(|&i| recovered_lsn(i));
    let mut out: Vec<(usize, bool)> = first.into_iter().map(|i| (i, true)).collect();
    out.extend(rest.into_iter().map(|i| (i, false)));
    out
}
