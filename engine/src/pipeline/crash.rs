//! Named crash points: every step boundary of the pipeline calls [`CrashHook::hit`] with a
//! [`CrashPoint`]. In production the hook is [`EnvCrash`], inert unless `ROOST_CRASH_AT` is
//! set, and then it kills the process with SIGKILL at the named point (how `roost drill` and
//! the black-box crash tests reach them in a release binary). In-process crash tests use
//! [`NthCrash`], which makes the pipeline return [`EngineError::Crashed`] so the test can take
//! the simulated disk as a crash would leave it.
//!
//! A point is a typed value (a step and, for per-shard and per-op steps, an index); its
//! name (`after_commit.0`) is parsed once, when the variable is read, and formatted only when
//! a hook records or reports it.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::EngineError;

/// The pipeline's step boundaries, in pipeline order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    AfterPlan,
    AfterClaimAppend,
    /// A group's spool-file results written to temporaries and synced, while the claims'
    /// WAL sync may still run (`plan.rs`, `sync_claims`): none of them renamed.
    AfterResultsPrepared,
    AfterClaimSync,
    /// After shard K of the batch applied its transaction (K: the shard's position).
    AfterCommit,
    /// After audit row I was appended (I: the op index).
    AfterAudit,
    AfterInputRemoved,
    AfterResult,
    /// After shard K flushed.
    AfterFlush,
    AfterAuditSync,
    AfterDone,
    /// A checkpoint (`checkpoint.rs`): the key table's new records synced ...
    AfterKeysSync,
    /// After the checkpoint's keys were written as a key index run (synced, renamed).
    AfterKeyIndex,
    /// ... the `CHECKPOINT` file renamed into place and its directory synced ...
    AfterCheckpoint,
    /// ... the WAL segments below it removed.
    AfterWalRetired,
}

impl Step {
    /// Every step, in pipeline order.
    pub const ALL: [Step; 15] = [
        Step::AfterPlan,
        Step::AfterClaimAppend,
        Step::AfterResultsPrepared,
        Step::AfterClaimSync,
        Step::AfterCommit,
        Step::AfterAudit,
        Step::AfterInputRemoved,
        Step::AfterResult,
        Step::AfterFlush,
        Step::AfterAuditSync,
        Step::AfterDone,
        Step::AfterKeysSync,
        Step::AfterKeyIndex,
        Step::AfterCheckpoint,
        Step::AfterWalRetired,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Step::AfterPlan => "after_plan",
            Step::AfterClaimAppend => "after_claim_append",
            Step::AfterResultsPrepared => "after_results_prepared",
            Step::AfterClaimSync => "after_claim_sync",
            Step::AfterCommit => "after_commit",
            Step::AfterAudit => "after_audit",
            Step::AfterInputRemoved => "after_input_removed",
            Step::AfterResult => "after_result",
            Step::AfterFlush => "after_flush",
            Step::AfterAuditSync => "after_audit_sync",
            Step::AfterDone => "after_done",
            Step::AfterKeysSync => "after_keys_sync",
            Step::AfterKeyIndex => "after_key_index",
            Step::AfterCheckpoint => "after_checkpoint",
            Step::AfterWalRetired => "after_wal_retired",
        }
    }

    /// Steps that happen once per shard or per op carry an index.
    pub fn indexed(self) -> bool {
        matches!(
            self,
            Step::AfterCommit | Step::AfterAudit | Step::AfterFlush
        )
    }

    /// The point of this step without an index.
    pub const fn at(self) -> CrashPoint {
        CrashPoint {
            step: self,
            index: None,
        }
    }

    /// The point of this step for shard or op `index`.
    pub const fn nth(self, index: usize) -> CrashPoint {
        CrashPoint {
            step: self,
            index: Some(index as u32),
        }
    }
}

/// One crash point: `after_claim_sync`, `after_commit.1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CrashPoint {
    pub step: Step,
    pub index: Option<u32>,
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}.{i}", self.step.name()),
            None => f.write_str(self.step.name()),
        }
    }
}

/// A name that is not a crash point.
#[derive(Debug, thiserror::Error)]
#[error("unknown crash point {0:?} (known: after_plan, after_claim_append, after_results_prepared, after_claim_sync, after_commit.K, after_audit.I, after_input_removed, after_result, after_flush.K, after_audit_sync, after_done, after_keys_sync, after_key_index, after_checkpoint, after_wal_retired)")]
pub struct UnknownPoint(pub String);

impl FromStr for CrashPoint {
    type Err = UnknownPoint;

    fn from_str(s: &str) -> Result<CrashPoint, UnknownPoint> {
        let bad = || UnknownPoint(s.to_owned());
        let (name, index) = match s.split_once('.') {
            Some((n, i)) => (n, Some(i.parse::<u32>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let step = Step::ALL
            .into_iter()
            .find(|st| st.name() == name)
            .ok_or_else(bad)?;
        if index.is_some() && !step.indexed() {
            return Err(bad());
        }
        Ok(CrashPoint { step, index })
    }
}

pub trait CrashHook: Send + Sync {
    fn hit(&self, point: CrashPoint) -> Result<(), EngineError>;
}

/// Never crashes.
#[derive(Debug, Default)]
pub struct NoCrash;

impl CrashHook for NoCrash {
    fn hit(&self, _point: CrashPoint) -> Result<(), EngineError> {
        Ok(())
    }
}

/// A target as `ROOST_CRASH_AT` names it: `POINT` or `POINT#N` (the N-th time the point is
/// reached, 1-based). An indexed step named without its index (`after_commit`) matches it at
/// any index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashTarget {
    pub point: CrashPoint,
    pub nth: u64,
}

impl CrashTarget {
    fn matches(&self, p: CrashPoint) -> bool {
        p.step == self.point.step && (self.point.index.is_none() || self.point.index == p.index)
    }
}

/// The name `ROOST_CRASH_AT` takes: `POINT#N`.
impl fmt::Display for CrashTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.point, self.nth)
    }
}

impl FromStr for CrashTarget {
    type Err = UnknownPoint;

    fn from_str(s: &str) -> Result<CrashTarget, UnknownPoint> {
        let (p, n) = match s.split_once('#') {
            Some((p, n)) => (p, n.parse::<u64>().map_err(|_| UnknownPoint(s.to_owned()))?),
            None => (s, 1),
        };
        if n == 0 {
            return Err(UnknownPoint(s.to_owned()));
        }
        Ok(CrashTarget {
            point: p.parse()?,
            nth: n,
        })
    }
}

/// How an armed [`EnvCrash`] stops the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// SIGKILL: the process vanishes, as under `kill -9` or the OOM killer.
    Kill,
    /// A panic in the thread that reached the point (a shard owner, a worker): shows that a
    /// panic anywhere stops the whole daemon with a known exit code.
    Panic,
}

/// `ROOST_CRASH_AT=POINT[#N]`: SIGKILL there (or a panic, with `ROOST_CRASH_MODE=panic`).
/// Inert when the variable is unset or empty.
#[derive(Debug)]
pub struct EnvCrash {
    target: Option<CrashTarget>,
    mode: CrashMode,
    seen: AtomicU64,
}

impl EnvCrash {
    /// Reads `ROOST_CRASH_AT` and `ROOST_CRASH_MODE` once; a name that is not a crash point
    /// or a mode that is not `kill` or `panic` is an error (a drill that can never crash
    /// would pass for the wrong reason).
    pub fn from_env() -> Result<EnvCrash, UnknownPoint> {
        let target = match std::env::var("ROOST_CRASH_AT") {
            Ok(s) if !s.is_empty() => Some(s.parse()?),
            _ => None,
        };
        let mode = match std::env::var("ROOST_CRASH_MODE").as_deref() {
            Err(_) | Ok("") | Ok("kill") => CrashMode::Kill,
            Ok("panic") => CrashMode::Panic,
            Ok(other) => return Err(UnknownPoint(format!("ROOST_CRASH_MODE={other}"))),
        };
        Ok(EnvCrash {
            target,
            mode,
            seen: AtomicU64::new(0),
        })
    }
}

impl CrashHook for EnvCrash {
    fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
        let Some(t) = &self.target else {
            return Ok(());
        };
        if !t.matches(point) || self.seen.fetch_add(1, Ordering::SeqCst) + 1 != t.nth {
            return Ok(());
        }
        tracing::warn!(%point, mode = ?self.mode, "ROOST_CRASH_AT reached");
        if self.mode == CrashMode::Panic {
            panic!("ROOST_CRASH_AT={point} with ROOST_CRASH_MODE=panic");
        }
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::process::abort();
    }
}

/// Crashes (returns `Crashed`) at the `n`-th point reached overall, 1-based; records every
/// point reached, so a test can first enumerate a schedule's points and then crash at each.
#[derive(Debug, Default)]
pub struct NthCrash {
    pub crash_at: Option<u64>,
    reached: Mutex<Vec<CrashPoint>>,
}

impl NthCrash {
    pub fn new(crash_at: Option<u64>) -> NthCrash {
        NthCrash {
            crash_at,
            reached: Mutex::new(Vec::new()),
        }
    }

    /// The names of the points reached so far, in order.
    pub fn reached(&self) -> Vec<String> {
        self.reached
            .lock()
            .map(|v| v.iter().map(CrashPoint::to_string).collect())
            .unwrap_or_default()
    }
}

impl CrashHook for NthCrash {
    fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
        let mut r = roost_storage::lock(&self.reached);
        r.push(point);
        if self.crash_at == Some(r.len() as u64) {
            return Err(EngineError::Crashed(point.to_string()));
        }
        Ok(())
    }
}

/// Holds the first thread that reaches `point` until released (then passes everything):
/// for tests that need a batch stopped at a step while others go on.
#[derive(Debug)]
pub struct HoldOnce {
    point: CrashPoint,
    reached: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: Mutex<std::sync::mpsc::Receiver<()>>,
    /// How long a held thread waits for its release at most.
    limit: std::time::Duration,
}

/// The test's side of a [`HoldOnce`]: wait until the point is reached, then release it.
#[derive(Debug)]
pub struct HoldHandle {
    reached: std::sync::mpsc::Receiver<()>,
    release: std::sync::mpsc::Sender<()>,
}

impl HoldOnce {
    pub fn new(point: CrashPoint) -> (std::sync::Arc<HoldOnce>, HoldHandle) {
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let hold = HoldOnce {
            point,
            reached: Mutex::new(Some(reached_tx)),
            release: Mutex::new(release_rx),
            limit: std::time::Duration::from_secs(20),
        };
        (std::sync::Arc::new(hold), HoldHandle { reached, release })
    }
}

impl CrashHook for HoldOnce {
    fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
        if point != self.point {
            return Ok(());
        }
        let first = self.reached.lock().ok().and_then(|mut r| r.take());
        if let Some(tx) = first {
            let _ = tx.send(());
            let _ = self.release.lock().map(|r| r.recv_timeout(self.limit));
        }
        Ok(())
    }
}

impl HoldHandle {
    /// Waits (at most `limit`) until a thread is held at the point.
    pub fn reached(&self, limit: std::time::Duration) -> bool {
        self.reached.recv_timeout(limit).is_ok()
    }

    /// Lets the held thread go on.
    pub fn release(&self) {
        let _ = self.release.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_name_round_trips() {
        for step in Step::ALL {
            let p = if step.indexed() {
                step.nth(3)
            } else {
                step.at()
            };
            assert_eq!(p.to_string().parse::<CrashPoint>().unwrap(), p);
        }
    }

    #[test]
    fn targets_parse_once_and_bad_names_are_errors() {
        let t: CrashTarget = "after_commit.1#2".parse().unwrap();
        assert_eq!((t.point, t.nth), (Step::AfterCommit.nth(1), 2));
        assert_eq!(t.to_string().parse::<CrashTarget>().unwrap(), t);
        let any: CrashTarget = "after_audit".parse().unwrap();
        assert!(any.matches(Step::AfterAudit.nth(7)));
        assert!(!any.matches(Step::AfterFlush.nth(7)));
        for bad in [
            "after_lunch",
            "after_plan.1",
            "after_commit.x",
            "after_done#0",
            "#2",
        ] {
            assert!(bad.parse::<CrashTarget>().is_err(), "{bad} parsed");
        }
    }
}
