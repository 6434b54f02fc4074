//! KIP-101's two scenarios (Kip101.tla; the KIP's "Scenario 1: High Watermark Truncation
//! followed by Immediate Leader Election" and "Scenario 2: Replica Divergence on Restart
//! after Multiple Hard Failures"), run over real TCP between in-memory logs. Each scenario
//! runs twice: under the rule before KIP-101 (`TestFollower::hw_truncation`: truncate to the
//! high watermark on restart, fetch without epochs), where a test shows the failure, and
//! under roost's rule (truncate by epoch, never to the hw), where it does not happen.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{eventually, fast_opts, records, Follower, Leader, TestFollower};
use roost_replication::testing::MemLog;
use roost_replication::{Epoch, Lsn};

type Records = Vec<(Lsn, Epoch, Vec<u8>)>;

/// What scenario 1 leaves behind.
struct Scenario1 {
    /// The leader's records below its hw when it died: acknowledged to its clients.
    acknowledged: Records,
    /// The new leader's log, and the old leader's after it rejoined as a follower.
    b: Records,
    a: Records,
}

/// A leads epoch 1 with B in sync. B replicates m1 and m2; A's hw passes m2 (B's fetch
/// acknowledged it), so A answers its client; B has not seen that hw yet (it would come
/// with the next answer) when it restarts. A then dies, B is elected with epoch 2 and writes
/// m3; A comes back as B's follower.
async fn scenario1(hw_truncation: bool) -> Scenario1 {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(1, &["b"]);
    let leader = Leader::start(Arc::clone(&a)).await;
    let b = Arc::new(MemLog::new("b"));
    let b_follower = TestFollower::new(&b, hw_truncation);
    let mut opts = fast_opts("b");
    // A long long-poll: B's acknowledgement of m2 reaches A, A's new hw does not reach B.
    opts.wait_ms = 60_000;
    let follower = Follower::start(&leader.addr, Arc::clone(&b_follower), opts);
    a.write_durable(0, b"m1");
    eventually("A's hw passes m1", || a.hw() == 2).await;
    a.write_durable(0, b"m2");
    eventually("A's hw passes m2", || a.hw() == 3).await;
    let acknowledged: Records = records(&a).into_iter().filter(|r| r.0 < a.hw()).collect();
    follower.stop().await;
    assert_eq!(b.hw(), 2, "B has seen the hw that covers m1 only");

    b_follower.restart();
    a.crash();
    leader.stop().await;
    b.become_leader(2, &[]);
    b.write_durable(0, b"m3");

    let new_leader = Leader::start(Arc::clone(&b)).await;
    let a_follower = Follower::start(&new_leader.addr, Arc::clone(&a), fast_opts("a"));
    eventually("A catches up with B", || a.entries() == b.entries()).await;
    a_follower.stop().await;
    new_leader.stop().await;
    Scenario1 {
        acknowledged,
        b: records(&b),
        a: records(&a),
    }
}

/// Scenario 1 under the pre-KIP-101 rule: B's restart truncates to its hw (2) and drops m2,
/// which A had acknowledged; once B leads, m3 takes lsn 2 and A, rejoining, truncates m2
/// away too. The acknowledged record is gone from every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip101_scenario1_hw_truncation_loses_an_acknowledged_record() {
    let s = scenario1(true).await;
    let m2 = (2, 1, b"m2".to_vec());
    assert!(
        s.acknowledged.contains(&m2),
        "m2 was acknowledged: {:?}",
        s.acknowledged
    );
    assert!(
        !s.b.contains(&m2),
        "the mutant rule lost m2 on the new leader: {:?}",
        s.b
    );
    assert!(
        !s.a.contains(&m2),
        "and on the old one once it followed: {:?}",
        s.a
    );
    assert_eq!(s.b[1], (2, 2, b"m3".to_vec()));
}

/// Scenario 1 under roost's rule: B keeps everything it appended across the restart (only a
/// diverging answer from a leader truncates), so m2 survives the election, and A rejoining
/// finds nothing to truncate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip101_scenario1_epoch_rule_keeps_the_acknowledged_record() {
    let s = scenario1(false).await;
    for r in &s.acknowledged {
        assert!(
            s.b.contains(r),
            "acknowledged {r:?} is on the new leader: {:?}",
            s.b
        );
        assert!(
            s.a.contains(r),
            "acknowledged {r:?} is on the old leader: {:?}",
            s.a
        );
    }
    assert_eq!(s.a, s.b);
    assert_eq!(s.b.len(), 3, "m1, m2, m3: {:?}", s.b);
}

/// A leads epoch 1 with B in sync; both hold m1 and have seen hw 2. B falls out of the
/// in-sync set (it stops fetching) and A, alone, commits m2 (hw 3) and appends m' that it
/// never syncs. Both lose power: A loses m', B nothing unsynced. B restarts first, is elected
/// with epoch 2 and writes m3 at lsn 2, where A holds m2. A restarts as B's follower;
/// B then writes m4. Returns (A's records, B's records) once A has caught up with B's end.
async fn scenario2(hw_truncation: bool) -> (Records, Records) {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(1, &["b"]);
    let leader = Leader::start(Arc::clone(&a)).await;
    let b = Arc::new(MemLog::new("b"));
    let b_follower = TestFollower::new(&b, hw_truncation);
    let follower = Follower::start(&leader.addr, Arc::clone(&b_follower), fast_opts("b"));
    a.write_durable(0, b"m1");
    eventually("B has seen hw 2", || b.hw() == 2).await;
    follower.stop().await;

    a.become_leader(1, &[]);
    a.write_durable(0, b"m2");
    assert_eq!(a.hw(), 3, "A alone in sync commits m2");
    a.write(0, b"m'");
    a.crash();
    b.crash();
    leader.stop().await;

    b_follower.restart();
    b.become_leader(2, &[]);
    b.write_durable(0, b"m3");
    let new_leader = Leader::start(Arc::clone(&b)).await;
    let a_follower_log = TestFollower::new(&a, hw_truncation);
    a_follower_log.restart();
    let a_follower = Follower::start(&new_leader.addr, a_follower_log, fast_opts("a"));
    b.write_durable(0, b"m4");
    eventually("A reaches B's log end", || a.end() == b.end()).await;
    a_follower.stop().await;
    new_leader.stop().await;
    (records(&a), records(&b))
}

/// Scenario 2 under the pre-KIP-101 rule: A truncates to its hw (3), which keeps m2, and
/// fetches from there; the two logs then have the same length and differ at lsn 2 (m2 on A,
/// m3 on B) with m4 on both after it: silent divergence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip101_scenario2_hw_truncation_diverges() {
    let (a, b) = scenario2(true).await;
    assert_eq!(a.len(), b.len());
    assert_eq!(a[1].2, b"m2".to_vec());
    assert_eq!(b[1].2, b"m3".to_vec());
    assert_eq!(
        a[2], b[2],
        "both hold m4 at lsn 3, on top of different histories"
    );
}

/// Scenario 2 under roost's rule: A's fetch says its last record is from epoch 1; B's epoch
/// 1 ends at lsn 2, so B answers Diverging { epoch 1, end 2 }, A truncates m2 and fetches
/// m3, m4: the logs match at every lsn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kip101_scenario2_epoch_rule_converges() {
    let (a, b) = scenario2(false).await;
    assert_eq!(a, b);
    let payloads: Vec<&[u8]> = a.iter().map(|r| r.2.as_slice()).collect();
    assert_eq!(payloads, [&b"m1"[..], b"m3", b"m4"]);
}
