//! Leases: etcd's minimum TTL here, keepalive, expiry and revoke.

use std::time::{Duration, Instant};

use roost_etcd::EtcdError;

use crate::single;

/// How long the key is kept alive by keepalives before they stop.
const KEEP_FOR: Duration = Duration::from_secs(3);
/// The longest we wait for the key to go once keepalives stop (the TTL is 1 s; etcd's
/// lessor checks every 500 ms and revokes through raft): a bound, not a speed assertion.
const EXPIRY_WAIT: Duration = Duration::from_secs(5);

/// Goal: a lease of 1 s (the harness's minimum: election timeout 500 ms) keeps its key
/// alive while renewed and drops it once not. Method: grant 1 s, attach a key, keepalive
/// every 300 ms for 3 s checking the key each time, stop, wait (bounded) for the key to
/// go; keepalive and time_to_live then report the lease unknown.
#[tokio::test]
async fn keepalive_holds_a_key_and_expiry_drops_it() {
    let (_dir, _etcd, c) = single();
    let lease = c.grant(1).await.unwrap();
    assert_eq!(
        lease.ttl_secs, 1,
        "etcd's minimum TTL with a 500 ms election timeout"
    );
    c.put("roost/member/1", b"me", Some(lease.id))
        .await
        .unwrap();
    let until = Instant::now() + KEEP_FOR;
    while Instant::now() < until {
        assert_eq!(c.keepalive(lease.id).await.unwrap(), Some(1));
        let (kv, _) = c.get("roost/member/1").await.unwrap();
        assert_eq!(kv.expect("kept alive").lease, lease.id);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let stopped = Instant::now();
    let mut gone = false;
    while stopped.elapsed() < EXPIRY_WAIT {
        if c.get("roost/member/1").await.unwrap().0.is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the key outlived its lease by {EXPIRY_WAIT:?}");
    eprintln!("key gone {:?} after the last keepalive", stopped.elapsed());
    assert_eq!(c.keepalive(lease.id).await.unwrap(), None);
    assert_eq!(c.time_to_live(lease.id).await.unwrap(), None);
}

/// Goal: revoke deletes the lease's keys at once, and revoking an unknown lease is not an
/// error. Method: grant 30 s, attach two keys, revoke, read; revoke again; a put under the
/// revoked lease is refused with etcd's 404.
#[tokio::test]
async fn revoke_deletes_the_keys_at_once() {
    let (_dir, _etcd, c) = single();
    let lease = c.grant(30).await.unwrap();
    assert!(lease.ttl_secs >= 30);
    let left = c
        .time_to_live(lease.id)
        .await
        .unwrap()
        .expect("a live lease");
    assert!((1..=30).contains(&left), "{left}");
    c.put("roost/a", b"1", Some(lease.id)).await.unwrap();
    c.put("roost/b", b"2", Some(lease.id)).await.unwrap();
    c.revoke(lease.id).await.unwrap();
    let (kvs, _) = c.get_prefix("roost/").await.unwrap();
    assert!(kvs.is_empty(), "{kvs:?}");
    c.revoke(lease.id).await.unwrap();
    let err = c.put("roost/a", b"1", Some(lease.id)).await.unwrap_err();
    assert!(
        matches!(
            &err,
            EtcdError::Status {
                code: 404,
                op: "put",
                ..
            }
        ),
        "{err}"
    );
}
