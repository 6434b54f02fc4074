//! The engine sees replication only through its log role (`pipeline/log_role.rs`): it asks
//! before it takes a batch, and waits for the role's acknowledgement point before it answers.
//! These tests hand the engine a role that refuses or holds answers back (over the real
//! `Replication`, on the simulated disk) and check what the engine does with it.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use roost::batch::BatchResult;
use roost::error::EngineError;
use roost::pipeline::crash::NoCrash;
use roost::pipeline::{Engine, EngineOptions, Lead, LogRole, OpenLogRole, Role, RoleParts};
use roost_storage::SimStorage;
use roost_tests::{create_on, open_engine, parse, test_config, visible_result, SubmitOne};
use roost_wal::Lsn;

/// The real role, with two switches: refuse batches, hold answers back.
struct Switched {
    inner: Arc<dyn LogRole>,
    refuse: AtomicBool,
    hold: AtomicBool,
    /// The lsns the engine asked to wait for.
    waited: Mutex<Vec<Lsn>>,
}

impl LogRole for Switched {
    fn role(&self) -> Role {
        self.inner.role()
    }
    fn check_primary(&self) -> Result<(), EngineError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(EngineError::NotPrimary { role: "standby" });
        }
        self.inner.check_primary()
    }
    fn still_answering(&self, lsn: Lsn) -> Result<(), EngineError> {
        self.inner.still_answering(lsn)
    }
    fn wait_replicated(
        &self,
        lsn: Lsn,
        below: &dyn Fn() -> Lsn,
    ) -> Result<Option<Duration>, EngineError> {
        self.waited.lock().unwrap().push(lsn);
        if self.hold.load(Ordering::SeqCst) {
            return Err(EngineError::Unreplicated { lsn });
        }
        self.inner.wait_replicated(lsn, below)
    }
    fn high_watermark(&self) -> Lsn {
        self.inner.high_watermark()
    }
    fn lead_at_start(&self) -> Result<u32, EngineError> {
        self.inner.lead_at_start()
    }
    fn take_lead(&self, lead: Lead) -> Result<u32, EngineError> {
        self.inner.take_lead(lead)
    }
    fn become_primary(&self) {
        self.inner.become_primary()
    }
    fn note_epoch(&self, epoch: u32, lsn: Lsn) -> Result<(), EngineError> {
        self.inner.note_epoch(epoch, lsn)
    }
    fn epochs_below(&self, lsn: Lsn) -> Vec<(u32, Lsn)> {
        self.inner.epochs_below(lsn)
    }
}

/// Opens the real role and keeps the switched one for the test.
#[derive(Default)]
struct SwitchedOpener(Mutex<Option<Arc<Switched>>>);

impl OpenLogRole for SwitchedOpener {
    fn open(&self, parts: RoleParts) -> Result<Arc<dyn LogRole>, EngineError> {
        let role = Arc::new(Switched {
            inner: OpenLogRole::open(&roost::replica::Opener::default(), parts)?,
            refuse: AtomicBool::new(false),
            hold: AtomicBool::new(false),
            waited: Mutex::new(Vec::new()),
        });
        *self.0.lock().unwrap() = Some(role.clone());
        Ok(role)
    }
}

fn open_switched(disk: &SimStorage) -> (Engine, Arc<Switched>) {
    let opener = Arc::new(SwitchedOpener::default());
    let engine = Engine::open(EngineOptions {
        storage: Arc::new(disk.clone()),
        config: Arc::new(test_config()),
        crash: Arc::new(NoCrash),
        log_role: opener.clone(),
    })
    .expect("open");
    let role = opener
        .0
        .lock()
        .unwrap()
        .clone()
        .expect("the engine opened its role");
    (engine, role)
}

/// Goal: the engine takes a batch only when its log role says this node may.
/// Method: refuse, submit a spool file; then allow, submit it again.
#[test]
fn the_engine_takes_a_batch_only_when_its_log_role_allows() {
    let disk = SimStorage::new();
    let (engine, role) = open_switched(&disk);
    let batch = parse(&create_on("k1", &["a"]));
    role.refuse.store(true, Ordering::SeqCst);
    let lsn_before = engine.wal().next_lsn();
    let refused = engine.one_file(&batch, "k1.json");
    assert!(
        matches!(refused, Err(EngineError::NotPrimary { .. })),
        "a refused batch was taken: {refused:?}"
    );
    assert_eq!(
        engine.wal().next_lsn(),
        lsn_before,
        "a refused batch was claimed"
    );
    assert_eq!(visible_result(&disk, "k1.json").unwrap(), None);
    role.refuse.store(false, Ordering::SeqCst);
    let r = engine.one_file(&batch, "k1.json").expect("allowed");
    assert!(matches!(r, BatchResult::Committed { .. }), "{r:?}");
}

/// Goal: no answer is published before the role's acknowledgement point passes its claim,
/// and a batch whose answer was held back stays claimed: recovery answers it once, with
/// the ids it claimed.
/// Method: hold answers back, submit; check the wait was asked for the claim's lsn and
/// nothing is visible; reopen with the plain role and check the one result and record.
#[test]
fn an_answer_waits_for_the_log_roles_acknowledgement_point() {
    let disk = SimStorage::new();
    let (engine, role) = open_switched(&disk);
    role.hold.store(true, Ordering::SeqCst);
    let batch = parse(&create_on("k2", &["a"]));
    let held = engine.one_file(&batch, "k2.json");
    let Err(EngineError::Unreplicated { lsn }) = held else {
        panic!("an answer was given past a role that holds answers back: {held:?}");
    };
    assert_eq!(role.waited.lock().unwrap().as_slice(), &[lsn]);
    assert_eq!(
        visible_result(&disk, "k2.json").unwrap(),
        None,
        "answered early"
    );
    // The role holds the WAL too: both go before the directory is opened again.
    drop((engine, role));
    let engine = open_engine(&disk, Arc::new(NoCrash)).expect("reopen");
    let r = visible_result(&disk, "k2.json").unwrap();
    let Some(BatchResult::Committed { lsn: answered, .. }) = r else {
        panic!("recovery did not answer the held batch: {r:?}");
    };
    assert_eq!(answered, lsn, "recovery answered another claim");
    assert_eq!(
        engine.shards().figures().get("a").map(|f| f.records),
        Some(1),
        "created twice or never"
    );
}
