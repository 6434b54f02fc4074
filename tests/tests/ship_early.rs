//! Records shipped before the leader's own sync (docs/replication.md, "Early shipping";
//! the model is docs/replication-model.md, "shipped before the sync"). A leader of an epoch
//! it won in etcd may send a standby what it has written but not yet synced, so that the
//! two syncs overlap; a primary that may resume its epoch after a restart (a static
//! primary) sends only what it has synced. Either way the high watermark stays below the
//! leader's own durable end. Checked at the moment a claim is written and not yet synced
//! (the crash hook's `AfterClaimAppend`), on the real `Replication` over the simulated disk.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use roost::config::Config;
use roost::error::EngineError;
use roost::pipeline::crash::{CrashHook, CrashPoint, Step};
use roost::pipeline::{Engine, EngineOptions, Lead};
use roost::replica::Replication;
use roost_storage::SimStorage;
use roost_tests::{cluster_node_a, create_on, parse, test_config, SubmitOne};
use roost_wal::Lsn;

/// What the leader showed while a claim was written and not yet synced.
#[derive(Clone, Copy, Debug)]
struct Seen {
    written_end: Lsn,
    durable_end: Lsn,
    shippable_end: Lsn,
    watched: Option<Lsn>,
    /// The high watermark after a standby in sync acknowledged everything written.
    hw_after_ack: Lsn,
}

/// Looks at the replication state at every `AfterClaimAppend`.
#[derive(Default)]
struct Look {
    engine: OnceLock<Weak<Engine>>,
    repl: OnceLock<Arc<Replication>>,
    seen: Mutex<Vec<Seen>>,
}

impl CrashHook for Look {
    fn hit(&self, point: CrashPoint) -> Result<(), EngineError> {
        let (Some(repl), Some(engine), Step::AfterClaimAppend) = (
            self.repl.get(),
            self.engine.get().and_then(Weak::upgrade),
            point.step,
        ) else {
            return Ok(());
        };
        let written_end = engine.wal().next_lsn();
        let durable_end = repl.durable_end();
        let shippable_end = repl.shippable_end();
        let watched = repl.shippable_watch().map(|w| *w.borrow());
        let hw_after_ack = repl.standby_acked("b", written_end);
        self.seen.lock().unwrap().push(Seen {
            written_end,
            durable_end,
            shippable_end,
            watched,
            hw_after_ack,
        });
        Ok(())
    }
}

fn clustered(c: &mut Config) {
    cluster_node_a(c, &["a", "b"]);
}

fn static_primary(c: &mut Config) {
    c.replication.listen = Some("127.0.0.1:9".into());
}

/// Opens a leader (`lead`: how it comes to lead), submits three batches and returns what
/// the hook saw at each claim.
fn lead_and_submit(tune: fn(&mut Config), lead: Option<Lead>) -> Vec<Seen> {
    let disk = SimStorage::new();
    let mut cfg = test_config();
    tune(&mut cfg);
    let look = Arc::new(Look::default());
    let opener = Arc::new(roost::replica::Opener::default());
    let engine = Arc::new(
        Engine::open(EngineOptions {
            storage: Arc::new(disk.clone()),
            config: Arc::new(cfg),
            crash: look.clone(),
            log_role: opener.clone(),
        })
        .expect("open"),
    );
    if let Some(lead) = lead {
        engine.standby().promote(lead).expect("promote");
    }
    let repl = opener.made().expect("replication");
    assert!(
        repl.shippable_watch().is_some(),
        "the WAL's hooks were taken"
    );
    assert!(look.repl.set(repl).is_ok(), "set once");
    assert!(look.engine.set(Arc::downgrade(&engine)).is_ok(), "set once");
    for i in 0..3 {
        let r = engine
            .one_file(
                &parse(&create_on(&format!("k{i}"), &["s1"])),
                &format!("b{i}.json"),
            )
            .expect("submit");
        assert_eq!(r.ops().len(), 1, "{r:?}");
    }
    let seen = look.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "one look per claim: {seen:?}");
    seen
}

/// Goal: a leader of an epoch won in etcd serves a claim as soon as it is written, and its
/// standbys' long-polls hear of it then; the high watermark still waits for its own sync.
#[test]
fn a_leader_of_a_won_epoch_ships_what_it_has_written_and_answers_only_what_it_synced() {
    let isr: BTreeSet<String> = ["b".to_string()].into();
    let seen = lead_and_submit(clustered, Some(Lead::Won { epoch: 0x105, isr }));
    for s in seen {
        assert!(
            s.durable_end < s.written_end,
            "the claim is not synced yet: {s:?}"
        );
        assert_eq!(s.shippable_end, s.written_end, "{s:?}");
        assert_eq!(
            s.watched,
            Some(s.written_end),
            "the watch heard the write: {s:?}"
        );
        assert!(
            s.hw_after_ack <= s.durable_end,
            "hw past the durable end: {s:?}"
        );
    }
}

/// Goal: a primary that resumes its epoch at a restart (a static primary) ships only what
/// it synced: a standby could otherwise keep a record that the primary lost in a power cut
/// and then wrote again, differently, at the same lsn in the same epoch.
#[test]
fn a_static_primary_ships_only_what_it_synced() {
    let seen = lead_and_submit(static_primary, None);
    for s in seen {
        assert!(
            s.durable_end < s.written_end,
            "the claim is not synced yet: {s:?}"
        );
        assert_eq!(s.shippable_end, s.durable_end, "{s:?}");
        assert_eq!(s.watched, Some(s.durable_end), "{s:?}");
        assert!(
            s.hw_after_ack <= s.durable_end,
            "hw past the durable end: {s:?}"
        );
    }
}
