//! A 3-member cluster: failover when a member is stopped (SIGSTOP) or killed, and the error
//! when the only endpoint given is the one down.

use std::time::{Duration, Instant};

use roost_etcd::testing::EtcdCluster;
use roost_etcd::{Etcd, EtcdError, EtcdOptions};

/// Short enough that a call stuck on a stopped member would fail; long enough that the two
/// thirds left after the stopped member's share hold a leader election (election timeout
/// 500 to 1000 ms here, more on a busy machine).
const TIMEOUT: Duration = Duration::from_secs(3);
/// The timeout once a member is killed: nothing is stopped any more, and the call may wait
/// for an election while the machine is busy.
const KILLED_TIMEOUT: Duration = Duration::from_secs(6);
/// The longest we wait for a resumed member to answer again.
const RESUME_WAIT: Duration = Duration::from_secs(10);
/// The timeout of a client given only the member that is down.
const ALONE_TIMEOUT: Duration = Duration::from_millis(800);
/// What a call may take beyond its timeout (scheduling, the last read's wake-up).
const SLACK: Duration = Duration::from_millis(500);

fn alone(url: &str) -> Etcd {
    Etcd::new(EtcdOptions {
        endpoints: vec![url.to_owned()],
        tls: None,
        request_timeout: ALONE_TIMEOUT,
    })
    .unwrap()
}

/// Goal: with all three endpoints, the client keeps working when the member it prefers is
/// stopped or killed, each call within its timeout, and after one failover it goes to the
/// member that answered first; given only the member that is down, the error names that
/// endpoint and the call, within the timeout. Method: a put makes member 0 preferred;
/// SIGSTOP it (its kernel still accepts connections: the case the time split exists for)
/// and put, then get (which must not wait on member 0 again); a client of member 0 alone
/// times out; SIGCONT. Then SIGKILL the member the client prefers now and put/get again; a
/// client of it alone is refused; restart it and it serves the value written meanwhile.
#[tokio::test]
async fn one_member_down_the_client_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = EtcdCluster::start(dir.path(), 3).unwrap();
    let urls = cluster.client_urls();
    let c = Etcd::new(cluster.options(TIMEOUT)).unwrap();
    c.put("roost/k", b"0", None).await.unwrap();

    cluster.member(0).pause().unwrap();
    timed(TIMEOUT, || c.put("roost/k", b"1", None))
        .await
        .unwrap();
    // A call that tried member 0 first would wait out its share of the timeout there.
    let share = TIMEOUT / 3;
    let started = Instant::now();
    let (kv, _) = c.get("roost/k").await.unwrap();
    let took = started.elapsed();
    assert!(
        took < share,
        "the get went to the stopped member first: {took:?}"
    );
    assert_eq!(kv.unwrap().value, b"1");
    let stopped = alone(&urls[0]);
    let err = timed(ALONE_TIMEOUT, || stopped.get("roost/k"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EtcdError::Timeout { endpoint, op: "get", .. } if *endpoint == urls[0]),
        "{err}"
    );
    cluster.member(0).resume().unwrap();
    wait_answers(&stopped).await;

    // The client now prefers member 1, the first that answered after member 0.
    cluster.member(1).kill().unwrap();
    let c = c.with_timeout(KILLED_TIMEOUT);
    let rev = timed(KILLED_TIMEOUT, || c.put("roost/k", b"2", None))
        .await
        .unwrap();
    let (kv, _) = timed(KILLED_TIMEOUT, || c.get("roost/k")).await.unwrap();
    let kv = kv.unwrap();
    assert_eq!((kv.value.as_slice(), kv.mod_revision), (&b"2"[..], rev));
    let killed = alone(&urls[1]);
    let put = || killed.put("roost/k", b"3", None);
    let err = timed(ALONE_TIMEOUT, put).await.unwrap_err();
    assert!(
        matches!(&err, EtcdError::Unreachable { endpoint, op: "put", .. } if *endpoint == urls[1]),
        "{err}"
    );
    eprintln!("as expected: {err}");

    // Started again from its data directory, it rejoins and serves what was written while
    // it was down (the drill's etcd-member strike relies on it).
    cluster.member(1).restart().unwrap();
    let back = alone(&urls[1]).with_timeout(KILLED_TIMEOUT);
    wait_answers(&back).await;
    let (kv, _) = back.get("roost/k").await.unwrap();
    assert_eq!(kv.unwrap().value, b"2");
}

/// Waits (bounded) until `c` reads successfully.
async fn wait_answers(c: &Etcd) {
    let started = Instant::now();
    while c.get("roost/k").await.is_err() {
        assert!(
            started.elapsed() < RESUME_WAIT,
            "no answer after {RESUME_WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `f` and checks it took no longer than `limit` and the slack (a bound on failover,
/// which a broken failover exceeds by a whole share of the timeout, not a speed test).
async fn timed<F, Fut, T>(limit: Duration, f: F) -> T
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let started = Instant::now();
    let out = f().await;
    let took = started.elapsed();
    eprintln!("a call took {took:?}");
    assert!(took <= limit + SLACK, "the call took {took:?}");
    out
}
