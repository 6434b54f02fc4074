//! Named crash points: every step boundary of the pipeline calls [`CrashHook::hit`]. In
//! production the hook is [`EnvCrash`], inert unless `ROOST_CRASH_AT` is set, and then it
//! kills the process with SIGKILL at the named point (how `roost drill` and the black-box
//! crash tests reach them in a release binary). In-process crash tests use [`NthCrash`], which
//! makes the pipeline return [`EngineError::Crashed`] so the test can take the simulated disk
//! as a crash would leave it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::engine::EngineError;

/// The crash points, in pipeline order. Points with a suffix take the shard's position in
/// the batch (`after_commit.0`) or the op index (`after_audit.2`).
pub const POINTS: &[&str] = &[
    "after_plan",
    "after_claim_append",
    "after_claim_sync",
    "after_commit.K",
    "after_audit.I",
    "after_input_removed",
    "after_result",
    "after_flush.K",
    "after_audit_sync",
    "after_done",
];

pub trait CrashHook: Send + Sync {
    fn hit(&self, point: &str) -> Result<(), EngineError>;
    /// False when no point can ever fire: callers then skip formatting indexed point names
    /// (`after_audit.{i}` was a string per op per batch for nothing).
    fn armed(&self) -> bool {
        true
    }
    /// The name of point `BASE.I` (`after_audit.2`), formatted only when a hook is armed;
    /// otherwise just `BASE`, which nothing matches.
    fn nth<'a>(&self, base: &'a str, i: usize) -> std::borrow::Cow<'a, str> {
        if self.armed() {
            format!("{base}.{i}").into()
        } else {
            base.into()
        }
    }
}

/// Never crashes.
#[derive(Debug, Default)]
pub struct NoCrash;

impl CrashHook for NoCrash {
    fn hit(&self, _point: &str) -> Result<(), EngineError> {
        Ok(())
    }
    fn armed(&self) -> bool {
        false
    }
}

/// `ROOST_CRASH_AT=POINT` or `POINT#N` (the N-th time the point is reached, 1-based):
/// SIGKILL there. Inert when the variable is unset.
#[derive(Debug)]
pub struct EnvCrash {
    target: Option<(String, u64)>,
    seen: AtomicU64,
}

impl EnvCrash {
    pub fn from_env() -> EnvCrash {
        let target = std::env::var("ROOST_CRASH_AT")
            .ok()
            .filter(|s| !s.is_empty())
            .map(|s| match s.split_once('#') {
                Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
                None => (s, 1),
            });
        EnvCrash {
            target,
            seen: AtomicU64::new(0),
        }
    }
}

impl CrashHook for EnvCrash {
    fn armed(&self) -> bool {
        self.target.is_some()
    }
    fn hit(&self, point: &str) -> Result<(), EngineError> {
        if let Some((p, n)) = &self.target {
            if p == point && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == *n {
                tracing::warn!(point, "ROOST_CRASH_AT reached: killing this process");
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
                std::process::abort();
            }
        }
        Ok(())
    }
}

/// Crashes (returns `Crashed`) at the `n`-th point reached overall, 1-based; records every
/// point reached, so a test can first enumerate a schedule's points and then crash at each.
#[derive(Debug, Default)]
pub struct NthCrash {
    pub crash_at: Option<u64>,
    reached: Mutex<Vec<String>>,
}

impl NthCrash {
    pub fn new(crash_at: Option<u64>) -> NthCrash {
        NthCrash {
            crash_at,
            reached: Mutex::new(Vec::new()),
        }
    }
    pub fn reached(&self) -> Vec<String> {
        self.reached.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

impl CrashHook for NthCrash {
    fn hit(&self, point: &str) -> Result<(), EngineError> {
        let mut r = self.reached.lock().unwrap_or_else(|p| p.into_inner());
        r.push(point.to_owned());
        if self.crash_at == Some(r.len() as u64) {
            return Err(EngineError::Crashed(point.to_owned()));
        }
        Ok(())
    }
}
