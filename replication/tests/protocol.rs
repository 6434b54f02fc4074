//! The protocol end to end over real TCP on 127.0.0.1 between in-memory logs: catching up
//! and streaming, fencing in both directions, truncation over several rounds, the start-up
//! `reconcile` and the `truncate_allowed` switch, re-seeding, and bad peers. Every wait is
//! bounded (`common::LIMIT`).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, fast_opts, fetch, raw_exchange, records, within, Follower, Leader};
use roost_replication::testing::MemLog;
use roost_replication::wire::{read_frame, write_frame, DEFAULT_FRAME_BYTES_MAX};
use roost_replication::{FollowEnd, FollowError, FollowerLog, LeaderLog, LeaderOptions, Message};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Goal: a follower starting empty catches up with a leader's history, then keeps up while
/// the leader appends, and the hw follows the follower's acknowledgements.
/// Method: 200 records before the follower starts (small fetches, so many rounds), 100 more
/// written in bursts while it streams; the logs must end equal and the hw at the log end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_catches_up_from_empty_then_streams() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(1, &["b"]);
    for i in 0..200u32 {
        a.write(1, &i.to_le_bytes());
    }
    a.sync();
    let leader = Leader::start(Arc::clone(&a)).await;
    let b = Arc::new(MemLog::new("b"));
    let mut opts = fast_opts("b");
    opts.fetch_bytes_max = 256;
    let follower = Follower::start(&leader.addr, Arc::clone(&b), opts);
    eventually("b catches up", || b.end() == 201).await;
    for burst in 0..10u32 {
        for i in 0..10u32 {
            a.write(2, &(1000 + burst * 10 + i).to_le_bytes());
        }
        a.sync();
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    eventually("b keeps up", || b.entries() == a.entries()).await;
    eventually("hw reaches the log end", || a.hw() == 301).await;
    eventually("b learns the hw", || {
        b.hw() == 301 && follower.status.hw() == 301
    })
    .await;
    let status = follower.status.snapshot();
    assert!(status.connected);
    assert_eq!(status.records, 300);
    assert_eq!(status.leader_epoch, 1);
    assert_eq!(status.leader, leader.addr);
    follower.stop().await;
    eventually("the leader sees b go", || a.disconnects() == ["b"]).await;
    leader.stop().await;
}

/// Goal: the hw counts only the in-sync set's acknowledgements, and several followers can
/// be served at once. Method: isr {b, c}; with only b following the hw stays at 1; once c
/// follows too it reaches the log end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_followers_and_the_hw_waits_for_the_whole_isr() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(1, &["b", "c"]);
    let leader = Leader::start(Arc::clone(&a)).await;
    for i in 0..5u8 {
        a.write_durable(0, &[i]);
    }
    let b = Arc::new(MemLog::new("b"));
    let fb = Follower::start(&leader.addr, Arc::clone(&b), fast_opts("b"));
    eventually("b catches up", || b.end() == 6).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(a.hw(), 1, "c has not acknowledged anything");
    let c = Arc::new(MemLog::new("c"));
    let fc = Follower::start(&leader.addr, Arc::clone(&c), fast_opts("c"));
    eventually("hw reaches the end", || a.hw() == 6).await;
    assert_eq!(c.entries(), a.entries());
    fb.stop().await;
    fc.stop().await;
    leader.stop().await;
}

/// Goal: a fetch in an older epoch is fenced, and the follower adopts the leader's epoch.
/// Method: a raw fetch in epoch 1 to a leader in epoch 3 gets FencedEpoch { 3 }; a follower
/// that knows epoch 1 ends up in epoch 3 with the leader's records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_epoch_is_fenced_and_the_follower_adopts_the_leaders() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(3, &["b"]);
    a.write_durable(0, b"x");
    let leader = Leader::start(Arc::clone(&a)).await;
    let answer = raw_exchange(&leader.addr, &fetch("z", 1, 1, 0)).await;
    assert_eq!(answer, Some(Message::FencedEpoch { leader_epoch: 3 }));
    let b = Arc::new(MemLog::new("b"));
    b.learn_epoch(1);
    let follower = Follower::start(&leader.addr, Arc::clone(&b), fast_opts("b"));
    eventually("b catches up", || b.entries() == a.entries()).await;
    assert_eq!(FollowerLog::current_epoch(&*b), 3);
    follower.stop().await;
    leader.stop().await;
}

/// Goal: a fetch in a newer epoch than the leader's tells the leader it is stale: it steps
/// down (`saw_higher_epoch`) and the follower stops with `StaleLeader`.
/// Method: leader in epoch 2, follower knowing epoch 5; afterwards the old leader answers
/// NotLeader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_epoch_makes_the_leader_step_down_and_the_follower_stop() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(2, &["b"]);
    a.write_durable(0, b"x");
    let leader = Leader::start(Arc::clone(&a)).await;
    let b = Arc::new(MemLog::new("b"));
    b.learn_epoch(5);
    let end = Follower::start(&leader.addr, Arc::clone(&b), fast_opts("b"))
        .finished()
        .await;
    assert!(
        matches!(
            end,
            Err(FollowError::StaleLeader {
                leader_epoch: 2,
                current_epoch: 5,
                ..
            })
        ),
        "{end:?}"
    );
    assert_eq!(a.higher_epoch_seen(), Some(5));
    assert!(!a.is_leader());
    let answer = raw_exchange(&leader.addr, &fetch("z", 5, 1, 0)).await;
    assert_eq!(answer, Some(Message::NotLeader { epoch: 2 }));
    leader.stop().await;
}

/// Two logs that share epoch 1 (lsn 1..3) and then hold epochs the other never had: leader
/// 3 and 5, follower 2 and 4. Returns (leader, follower).
fn split_history() -> (Arc<MemLog>, Arc<MemLog>) {
    let a = Arc::new(MemLog::new("a"));
    a.seed(&[(1, b"p1"), (1, b"p2"), (3, b"a3"), (3, b"a4")]);
    a.become_leader(5, &["b"]);
    a.write_durable(0, b"a5");
    a.write_durable(0, b"a6");
    let b = Arc::new(MemLog::new("b"));
    b.seed(&[
        (1, b"p1"),
        (1, b"p2"),
        (2, b"b3"),
        (2, b"b4"),
        (4, b"b5"),
        (4, b"b6"),
    ]);
    b.learn_epoch(5);
    (a, b)
}

/// Goal: truncation over several rounds (KIP-279's case): the follower holds epochs the
/// leader never had. Method: the follower's fetch (lsn 7, last epoch 4) gets Diverging
/// { 3, 5 }; it lacks epoch 3, so it cuts to the end of its epoch 2 (lsn 5) and asks again
/// (lsn 5, last epoch 2): Diverging { 1, 3 }; it cuts to 3, where the logs agree, and
/// fetches the leader's a3..a6. Two truncations, then equal logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_takes_two_rounds_when_the_follower_lacks_the_leaders_epoch() {
    let (a, b) = split_history();
    let leader = Leader::start(Arc::clone(&a)).await;
    let follower = Follower::start(&leader.addr, Arc::clone(&b), fast_opts("b"));
    eventually("logs agree", || b.entries() == a.entries()).await;
    assert_eq!(follower.status.truncations(), 2);
    assert_eq!(b.epochs(), [(1, 1), (3, 3), (5, 5)]);
    // The leader was told at each diverging answer (its ISR must not wait for b then).
    assert_eq!(a.fell_behind(), ["b", "b"]);
    follower.stop().await;
    leader.stop().await;
}

/// Goal: with `truncate_allowed` off, a diverging answer stops `follow` with `Diverged`
/// and the log is untouched; `reconcile` then truncates (two rounds), appends the first
/// records and returns `Reconciled`; `follow` without truncation then streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diverged_without_truncation_then_reconcile_at_startup() {
    let (a, b) = split_history();
    let leader = Leader::start(Arc::clone(&a)).await;
    let before = records(&b);
    let mut opts = fast_opts("b");
    opts.truncate_allowed = false;
    let end = Follower::start(&leader.addr, Arc::clone(&b), opts.clone())
        .finished()
        .await;
    assert!(
        matches!(
            end,
            Err(FollowError::Diverged {
                epoch: 3,
                end_lsn: 5,
                log_end: 7,
                ..
            })
        ),
        "{end:?}"
    );
    assert_eq!(records(&b), before, "nothing truncated");

    let end = Follower::start_reconcile(&leader.addr, Arc::clone(&b), opts.clone())
        .finished()
        .await;
    assert!(
        matches!(end, Ok(FollowEnd::Reconciled { log_end: 7, .. })),
        "{end:?}"
    );
    assert_eq!(b.entries(), a.entries());

    let follower = Follower::start(&leader.addr, Arc::clone(&b), opts);
    a.write_durable(0, b"a7");
    eventually("b streams a7", || b.entries() == a.entries()).await;
    assert_eq!(follower.status.truncations(), 0);
    follower.stop().await;
    leader.stop().await;
}

/// Goal: a follower behind what the leader retains is told to re-seed.
/// Method: the leader retired lsn 1..5; an empty follower gets NeedsReseed { 5, 1 }.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_means_reseed() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(1, &[]);
    for i in 0..8u8 {
        a.write_durable(0, &[i]);
    }
    a.retire_below(5);
    let leader = Leader::start(Arc::clone(&a)).await;
    let b = Arc::new(MemLog::new("b"));
    let end = Follower::start(&leader.addr, Arc::clone(&b), fast_opts("b"))
        .finished()
        .await;
    assert!(
        matches!(
            end,
            Err(FollowError::NeedsReseed {
                log_start: 5,
                fetch_lsn: 1,
                ..
            })
        ),
        "{end:?}"
    );
    leader.stop().await;
}

/// Goal: a follower whose log fails stops with `Log` naming the call and the lsn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_append_stops_the_follower() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(1, &[]);
    a.write_durable(0, b"x");
    let leader = Leader::start(Arc::clone(&a)).await;
    let b = Arc::new(MemLog::new("b"));
    b.learn_epoch(1);
    b.fail_next("append");
    let end = Follower::start(&leader.addr, Arc::clone(&b), fast_opts("b"))
        .finished()
        .await;
    assert!(
        matches!(
            end,
            Err(FollowError::Log {
                op: "append",
                lsn: 1,
                ..
            })
        ),
        "{end:?}"
    );
    leader.stop().await;
}

/// Goal: bad input from one peer ends only that peer's connection; the server keeps serving.
/// Method: random bytes, a frame with a wrong checksum, a length over the limit, and a
/// well-formed message that is not a Fetch, each on its own connection (the server answers
/// an Error or closes), while a real follower catches up and streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_a_peer_ends_only_its_connection() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(1, &["b"]);
    a.write_durable(0, b"x");
    let opts = LeaderOptions {
        frame_bytes_max: 1 << 20,
        ..LeaderOptions::default()
    };
    let leader = Leader::start_with(Arc::clone(&a), opts).await;
    let b = Arc::new(MemLog::new("b"));
    let follower = Follower::start(&leader.addr, Arc::clone(&b), fast_opts("b"));

    // len 10: crc (wrong), version 1, type Fetch, four body bytes.
    let bad_crc = vec![10, 0, 0, 0, 1, 2, 3, 4, 1, 1, 0, 0, 0, 0];
    let inputs: Vec<Vec<u8>> = vec![
        (0..200u8)
            .map(|i| i.wrapping_mul(151).wrapping_add(7))
            .collect(),
        bad_crc,
        u32::MAX.to_le_bytes().to_vec(),
    ];
    for bytes in inputs {
        let mut s = TcpStream::connect(&leader.addr).await.expect("connect");
        s.write_all(&bytes).await.expect("write garbage");
        let answer = within(
            "garbage answered",
            read_frame(&mut s, DEFAULT_FRAME_BYTES_MAX),
        )
        .await;
        assert!(
            matches!(answer, Ok(Some(Message::Error { .. })) | Ok(None) | Err(_)),
            "{answer:?}"
        );
    }
    let not_a_fetch = Message::OutOfRange { log_start: 1 };
    let answer = raw_exchange(&leader.addr, &not_a_fetch).await;
    assert!(matches!(answer, Some(Message::Error { .. })), "{answer:?}");

    a.write_durable(0, b"y");
    eventually("the real follower still streams", || {
        b.entries() == a.entries()
    })
    .await;
    follower.stop().await;
    leader.stop().await;
}

/// Goal: the leader's long-poll answers as soon as a record is durable, not at its timeout,
/// and an unsynced record is never served: waiting on the blocking pool (`wait_durable`)
/// and, as the daemon's log does (issue 42), on the log's durable-end watch, which then
/// takes no blocking wait at all.
/// Method: a raw caught-up fetch with wait_ms 5000; a record written but not synced, then
/// synced 100 ms later; the answer carries it well before 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_wakes_on_durable_records_only() {
    let blocking = long_poll_wakes_on_sync(MemLog::new("a")).await;
    assert!(
        blocking > 0,
        "without a watch the long-poll waits in wait_durable"
    );
    let watched = long_poll_wakes_on_sync(MemLog::with_shippable_watch("a")).await;
    assert_eq!(
        watched, 0,
        "with a watch the long-poll takes no blocking wait"
    );
}

/// One run of `long_poll_wakes_on_durable_records_only`; the blocking waits it took.
async fn long_poll_wakes_on_sync(log: MemLog) -> u64 {
    let a = Arc::new(log);
    a.become_leader(1, &[]);
    let leader = Leader::start(Arc::clone(&a)).await;
    let mut s = TcpStream::connect(&leader.addr).await.expect("connect");
    let mut f = fetch("z", 1, 1, 0);
    if let Message::Fetch { wait_ms, .. } = &mut f {
        *wait_ms = 5_000;
    }
    write_frame(&mut s, &f, DEFAULT_FRAME_BYTES_MAX)
        .await
        .expect("write");
    a.write(0, b"x");
    let started = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(LeaderLog::shippable_end(&*a), 1);
    a.sync();
    let answer = within("long-poll", read_frame(&mut s, DEFAULT_FRAME_BYTES_MAX)).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    match answer {
        Ok(Some(Message::Records { entries, .. })) => assert_eq!(entries.len(), 1),
        other => panic!("expected one record, got {other:?}"),
    }
    leader.stop().await;
    a.blocking_waits()
}

/// Goal: shutdown ends a long-poll at once and stops both sides cleanly, whether it waits
/// on the blocking pool or on the log's durable-end watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_a_long_poll() {
    shutdown_ends_a_long_poll_on(MemLog::new("a")).await;
    shutdown_ends_a_long_poll_on(MemLog::with_shippable_watch("a")).await;
}

async fn shutdown_ends_a_long_poll_on(log: MemLog) {
    let a = Arc::new(log);
    a.become_leader(1, &[]);
    let leader = Leader::start(Arc::clone(&a)).await;
    let b = Arc::new(MemLog::new("b"));
    let mut opts = fast_opts("b");
    opts.wait_ms = 60_000;
    let follower = Follower::start(&leader.addr, Arc::clone(&b), opts);
    eventually("b connected", || follower.status.connected()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = tokio::time::Instant::now();
    leader.stop().await;
    follower.stop().await;
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// Goal: `NotLeader` is not fatal: the follower retries (with backoff) until the node leads.
/// Method: the server runs before its node leads; the follower's status shows the refusal;
/// then the node becomes leader and the follower catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_retries_a_node_that_does_not_lead_yet() {
    let a = Arc::new(MemLog::new("a"));
    let leader = Leader::start(Arc::clone(&a)).await;
    let b = Arc::new(MemLog::new("b"));
    let follower = Follower::start(&leader.addr, Arc::clone(&b), fast_opts("b"));
    eventually("b is refused", || {
        let error = follower.status.snapshot().last_error;
        error.is_some_and(|e| e.contains("is not the leader"))
    })
    .await;
    a.become_leader(1, &["b"]);
    a.write_durable(0, b"x");
    eventually("b catches up", || b.entries() == a.entries()).await;
    follower.stop().await;
    leader.stop().await;
}

/// Goal: a follower survives its leader's server going away and coming back (same address):
/// it reconnects and resumes from its log end without truncating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_reconnects_when_the_leader_comes_back() {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(1, &["b"]);
    a.write_durable(0, b"x");
    let leader = Leader::start(Arc::clone(&a)).await;
    let addr = leader.addr.clone();
    let b = Arc::new(MemLog::new("b"));
    let follower = Follower::start(&addr, Arc::clone(&b), fast_opts("b"));
    eventually("b catches up", || b.entries() == a.entries()).await;
    leader.stop().await;
    eventually("b sees the leader go", || !follower.status.connected()).await;
    a.write_durable(0, b"y");
    let leader = Leader::start_at(Arc::clone(&a), &addr).await;
    eventually("b resumes", || b.entries() == a.entries()).await;
    assert_eq!(follower.status.truncations(), 0);
    follower.stop().await;
    leader.stop().await;
}
