//! Fetching ahead (issue 42, `follow/ahead.rs`): a follower asks for the next records while
//! the last ones sync, and acknowledges only what is durable (`FetchAhead`'s `durable_lsn`,
//! `Durable` frames). The model is `roost-repmodel election --fetch-before-sync`.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use roost_replication::testing::MemLog;
use roost_replication::wire::{read_frame, write_frame, DEFAULT_FRAME_BYTES_MAX};
use roost_replication::{LeaderOptions, Lsn, Message};
use tokio::net::{TcpListener, TcpStream};

/// Goal: a follower fetches its next records while the last ones sync, the leader counts
/// none of them before they are durable there, and learns at once when they are (a
/// `Durable` frame, not the end of the long-poll). Method: the follower's first append
/// waits on a gate; a record written meanwhile must be read for it from lsn 4 (the fetch
/// went out ahead), while the leader's acknowledgement and hw stay at 1; once the gate
/// opens, the acknowledgement reaches the log end well before a 60 s long-poll could
/// end. Both long-poll kinds: on the log's watch and in `wait_durable` slices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_fetches_ahead_and_acknowledges_only_what_is_durable() {
    for watch in [true, false] {
        fetches_ahead(watch).await;
    }
}

/// A leader of epoch 1 holding lsn 1-3 for follower `f`, served with 60 s long-polls.
async fn leader_of_three(watch: bool) -> (Arc<MemLog>, Leader) {
    let leader = Arc::new(match watch {
        true => MemLog::with_shippable_watch("leader"),
        false => MemLog::new("leader"),
    });
    leader.become_leader(1, &["f"]);
    for p in [b"a", b"b", b"c"] {
        leader.write_durable(0, p);
    }
    let long = LeaderOptions {
        wait_max: Duration::from_secs(60),
        ..LeaderOptions::default()
    };
    let server = Leader::start_with(Arc::clone(&leader), long).await;
    (leader, server)
}

async fn fetches_ahead(watch: bool) {
    let (leader, server) = leader_of_three(watch).await;
    let flog = Arc::new(MemLog::new("f"));
    let gated = TestFollower::gated(&flog);
    let mut opts = fast_opts("f");
    opts.wait_ms = 60_000;
    let f = Follower::start(&server.addr, Arc::clone(&gated), opts);
    eventually("the first append reaches the gate", || {
        gated.gate.reached() >= 1
    })
    .await;
    leader.write_durable(0, b"d");
    eventually(
        "the leader reads lsn 4 for a fetch sent while 1-3 sync",
        || leader.furthest_read() >= 4,
    )
    .await;
    assert_eq!(flog.end(), 1, "nothing is appended while the gate is shut");
    let acked = leader.acked("f").unwrap_or(0);
    assert!(
        acked <= 1,
        "acknowledged lsn {acked} before it was durable (watch {watch})"
    );
    assert!(
        leader.hw() <= 1,
        "hw {} before the follower synced",
        leader.hw()
    );
    gated.gate.open();
    eventually(
        "a Durable frame acknowledges lsn 1-4 during the long-poll",
        || leader.acked("f") == Some(5),
    )
    .await;
    assert_eq!(leader.hw(), 5);
    assert_eq!(records(&flog), records(&leader));
    f.stop().await;
    server.stop().await;
}

/// Goal: a follower whose log keeps a durable watch acknowledges records as soon as the
/// watch says they are durable, not when their append returns (a standby's apply after
/// its WAL sync is off the leader's wait). Method: the append makes the records durable,
/// sends the watch, then waits at a shut gate; the leader's acknowledgement and hw must
/// reach the log end while no append has returned. Then the gate opens and a new record
/// follows as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_acknowledges_at_its_durable_watch_before_the_append_returns() {
    let (leader, server) = leader_of_three(true).await;
    let flog = Arc::new(MemLog::new("f"));
    let log = TestFollower::durable_first(&flog, false);
    let mut opts = fast_opts("f");
    opts.wait_ms = 60_000;
    let f = Follower::start(&server.addr, Arc::clone(&log), opts);
    eventually("lsn 1-3 acknowledged while their append still runs", || {
        leader.acked("f") == Some(4)
    })
    .await;
    let returned = log.returned.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(returned, 0, "acknowledged only once the append returned");
    assert_eq!(leader.hw(), 4);
    log.gate.open();
    leader.write_durable(0, b"d");
    eventually("lsn 4 acknowledged after the gate opened", || {
        leader.acked("f") == Some(5)
    })
    .await;
    assert_eq!(records(&flog), records(&leader));
    f.stop().await;
    server.stop().await;
}

/// Goal: as above when the next records come before the sync ends (the follower then
/// waits for the append before acting on them): the acknowledgement still leaves at the
/// sync, between fetches, not when the append returns. Method: the append is held before
/// its records are durable; a record written meanwhile is read for the fetch sent ahead
/// (its answer now waits for the append); then the records become durable while the rest
/// of the append waits at a shut gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_waiting_for_the_append_does_not_hold_back_its_acknowledgement() {
    let (leader, server) = leader_of_three(true).await;
    let flog = Arc::new(MemLog::new("f"));
    let log = TestFollower::durable_first(&flog, true);
    let mut opts = fast_opts("f");
    opts.wait_ms = 60_000;
    let f = Follower::start(&server.addr, Arc::clone(&log), opts);
    eventually("the first append starts", || log.before.reached() >= 1).await;
    leader.write_durable(0, b"d");
    eventually("lsn 4 read for the fetch sent ahead", || {
        leader.furthest_read() >= 4
    })
    .await;
    // Time for the answer to reach the follower, which then waits for the append.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        leader.acked("f").unwrap_or(0) <= 1,
        "acknowledged before durable"
    );
    log.before.open();
    eventually("lsn 1-3 acknowledged while their append still runs", || {
        leader.acked("f") == Some(4)
    })
    .await;
    let returned = log.returned.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(returned, 0, "acknowledged only once the append returned");
    log.gate.open();
    eventually("lsn 4 acknowledged", || leader.acked("f") == Some(5)).await;
    assert_eq!(records(&flog), records(&leader));
    f.stop().await;
    server.stop().await;
}

/// Goal: a new follower keeps following a leader of the version before `FetchAhead` (a
/// rolling upgrade): that leader answers the unknown frame with an `Error` and closes;
/// the follower fetches the classic way from then on. Method: a fake leader that refuses
/// the first connection's `FetchAhead` exactly as the old decoder did, then reads the
/// second connection's first frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_predates_fetch_ahead_is_followed_the_classic_way() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let flog = Arc::new(MemLog::new("f"));
    let f = Follower::start(&addr, flog, fast_opts("f"));
    let first = accept_and_read(&listener).await;
    let (mut s, msg) = first;
    assert!(matches!(msg, Message::FetchAhead { .. }), "first: {msg:?}");
    let message = "bad frame: unknown message type 16".to_string();
    write_frame(&mut s, &Message::Error { message }, DEFAULT_FRAME_BYTES_MAX)
        .await
        .expect("answer");
    drop(s);
    let (_s, msg) = accept_and_read(&listener).await;
    assert!(
        matches!(msg, Message::Fetch { .. }),
        "after the refusal: {msg:?}"
    );
    f.stop().await;
}

async fn accept_and_read(listener: &TcpListener) -> (TcpStream, Message) {
    within("a follower connects and fetches", async {
        let (mut s, _) = listener.accept().await.expect("accept");
        let msg = read_frame(&mut s, DEFAULT_FRAME_BYTES_MAX)
            .await
            .expect("a frame")
            .expect("not closed");
        (s, msg)
    })
    .await
}

fn ahead(fetch_lsn: Lsn, durable_lsn: Lsn) -> Message {
    Message::FetchAhead {
        replica: "f".into(),
        current_epoch: 1,
        fetch_lsn,
        durable_lsn,
        last_epoch: 1,
        max_bytes: 1 << 20,
        wait_ms: 0,
    }
}

async fn exchange(s: &mut TcpStream, msg: &Message) -> Option<Message> {
    within("an answer", async {
        write_frame(s, msg, DEFAULT_FRAME_BYTES_MAX)
            .await
            .expect("write");
        read_frame(s, DEFAULT_FRAME_BYTES_MAX).await.ok().flatten()
    })
    .await
}

async fn send(s: &mut TcpStream, msg: &Message) {
    write_frame(s, msg, DEFAULT_FRAME_BYTES_MAX)
        .await
        .expect("write");
}

fn hw_of(answer: Option<Message>) -> Lsn {
    match answer {
        Some(Message::Records { hw, .. }) => hw,
        other => panic!("expected Records, got {other:?}"),
    }
}

/// Goal: no frame acknowledges more than the follower's fetches established. Method, raw
/// frames against a leader holding lsn 1-4 with `f` its only in-sync standby: a
/// `FetchAhead` acknowledging past its own `fetch_lsn` is refused and ends the connection;
/// a `Durable` past the last fetch answered with records is ignored, one within it counts
/// (the hw in the next answer shows which), one before any fetch counts for nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_takes_no_acknowledgement_past_what_the_fetches_established() {
    let leader = Arc::new(MemLog::with_shippable_watch("leader"));
    leader.become_leader(1, &["f"]);
    for p in [b"a", b"b", b"c", b"d"] {
        leader.write_durable(1, p);
    }
    let server = Leader::start(Arc::clone(&leader)).await;
    let mut s = TcpStream::connect(&server.addr).await.expect("connect");
    let refused = exchange(&mut s, &ahead(2, 3)).await;
    assert!(
        matches!(refused, Some(Message::Error { .. })),
        "{refused:?}"
    );
    assert_eq!(
        read_frame(&mut s, DEFAULT_FRAME_BYTES_MAX)
            .await
            .ok()
            .flatten(),
        None
    );
    assert_eq!(leader.acked("f"), None, "the refused fetch acknowledged");

    let mut s = TcpStream::connect(&server.addr).await.expect("connect");
    send(&mut s, &Message::Durable { durable_lsn: 5 }).await;
    assert_eq!(hw_of(exchange(&mut s, &ahead(3, 1)).await), 1);
    send(&mut s, &Message::Durable { durable_lsn: 5 }).await;
    send(&mut s, &Message::Durable { durable_lsn: 3 }).await;
    // This fetch says only lsn 1 is durable (as of its sending); the hw keeps what the
    // Durable frame before it established, and no more.
    assert_eq!(hw_of(exchange(&mut s, &ahead(5, 1)).await), 3);
    assert_eq!(leader.hw(), 3);
    server.stop().await;
}
