//! An answer under `ack = "standby"` waits for every standby in sync (docs/replication.md);
//! with two, the first of the two acknowledgements of a record cannot release it, and wakes
//! no waiting answer (issue 42: on a loaded leader, every acknowledgement woke every waiting
//! answer, and a third of its samples were thread switches). The one that raises the high
//! watermark wakes them, and the answer goes out. On the real `Replication`, simulated disk.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roost::config::{Ack, Config};
use roost::pipeline::{Engine, EngineOptions, Lead};
use roost_storage::SimStorage;
use roost_tests::{cluster_node_a, create_on, parse, test_config, SubmitOne};

fn cluster_leader_config() -> Config {
    let mut c = test_config();
    cluster_node_a(&mut c, &["a", "b", "c"]);
    c.replication.ack = Ack::Standby;
    c
}

/// Polls `done` every 5 ms for at most 10 s.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Goal: with standbys b and c in sync, b's acknowledgement of a claim wakes nothing and
/// releases nothing; c's wakes the waiting answer once, and it is given.
#[test]
fn only_the_acknowledgement_that_raises_the_high_watermark_wakes_the_answers() {
    let opener = Arc::new(roost::replica::Opener::default());
    let engine = Arc::new(
        Engine::open(EngineOptions {
            storage: Arc::new(SimStorage::new()),
            config: Arc::new(cluster_leader_config()),
            crash: Arc::new(roost::pipeline::crash::NoCrash),
            log_role: opener.clone(),
        })
        .expect("open"),
    );
    let isr: BTreeSet<String> = ["b".to_string(), "c".to_string()].into();
    engine
        .standby()
        .promote(Lead::Won { epoch: 0x105, isr })
        .expect("promote");
    let repl = opener.made().expect("replication");
    let start = engine.wal().next_lsn();
    repl.standby_acked("b", start);
    repl.standby_acked("c", start);
    let submit = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.one_file(&parse(&create_on("k1", &["s1"])), "b1.json"))
    };
    wait_until("the claim is durable here", || {
        let end = engine.wal().next_lsn();
        end > start && repl.durable_end() == end
    });
    let end = engine.wal().next_lsn();
    let wakes = repl.ack_wakes();
    let hw = repl.standby_acked("b", end);
    assert_eq!(hw, start, "c does not hold the claim yet");
    assert_eq!(
        repl.ack_wakes(),
        wakes,
        "b's acknowledgement woke the answers"
    );
    assert!(!submit.is_finished(), "answered before c held the claim");
    assert_eq!(repl.standby_acked("c", end), end, "both hold the claim");
    assert_eq!(
        repl.ack_wakes(),
        wakes + 1,
        "c's acknowledgement woke them once"
    );
    wait_until("the answer", || submit.is_finished());
    let r = submit.join().expect("the submit thread").expect("answered");
    assert_eq!(r.ops().len(), 1, "{r:?}");
}
