//! Keys and transactions against one etcd member.

use roost_etcd::{CmpOp, Compare, Op, OpResponse, Txn};

use crate::single;

/// Goal: put, get, get_prefix and delete round-trip keys and binary values, with the
/// revisions etcd assigns. Method: write keys inside and just outside a prefix (one with an
/// empty value, which the gateway omits), read them back one by one and by prefix, rewrite
/// one, delete one twice; a key never written reads as `None`.
#[tokio::test]
async fn put_get_prefix_delete_round_trip() {
    let (_dir, _etcd, c) = single();
    let binary = b"\x00\xff\x80 bin\n".to_vec();
    let r1 = c.put("roost/a", &binary, None).await.unwrap();
    let r2 = c.put("roost/b", b"", None).await.unwrap();
    let r3 = c.put("roost0", b"outside", None).await.unwrap();
    assert!(r1 < r2 && r2 < r3, "{r1} {r2} {r3}");

    let (a, rev) = c.get("roost/a").await.unwrap();
    let a = a.expect("roost/a exists");
    assert_eq!((a.key.as_str(), &a.value), ("roost/a", &binary));
    assert_eq!(
        (a.create_revision, a.mod_revision, a.version, a.lease),
        (r1, r1, 1, 0)
    );
    assert_eq!(rev, r3);
    let (missing, _) = c.get("roost/missing").await.unwrap();
    assert!(missing.is_none());

    let (kvs, rev) = c.get_prefix("roost/").await.unwrap();
    let keys: Vec<&str> = kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["roost/a", "roost/b"]);
    assert!(kvs[1].value.is_empty());
    assert_eq!(rev, r3);
    let (none, _) = c.get_prefix("nothing/").await.unwrap();
    assert!(none.is_empty());

    let r4 = c.put("roost/a", b"again", None).await.unwrap();
    let a = c.get("roost/a").await.unwrap().0.unwrap();
    assert_eq!((a.create_revision, a.mod_revision, a.version), (r1, r4, 2));
    assert_eq!(c.delete("roost/a").await.unwrap(), 1);
    assert_eq!(c.delete("roost/a").await.unwrap(), 0);
    assert!(c.get("roost/a").await.unwrap().0.is_none());
}

/// Goal: the election's campaign works as one transaction. Method: "create k under my
/// lease if it does not exist, else read it" twice: the first wins (its revision is k's
/// create revision), the second loses and learns the holder (value and lease) from the
/// failure branch's Get. Then a value compare deletes k, and a false compare runs nothing.
#[tokio::test]
async fn campaign_txn_elects_one_and_shows_the_holder() {
    let (_dir, _etcd, c) = single();
    let lease = c.grant(30).await.unwrap();
    let campaign = |me: &[u8]| Txn {
        compare: vec![Compare::create_revision("roost/leader", CmpOp::Equal, 0)],
        success: vec![Op::Put {
            key: "roost/leader".into(),
            value: me.to_vec(),
            lease: Some(lease.id),
        }],
        failure: vec![Op::Get {
            key: "roost/leader".into(),
        }],
    };
    let won = c.txn(campaign(b"node-1")).await.unwrap();
    assert!(won.succeeded);
    assert_eq!(won.responses, [OpResponse::Put]);
    let holder = c.get("roost/leader").await.unwrap().0.unwrap();
    assert_eq!(won.revision, holder.create_revision);

    let lost = c.txn(campaign(b"node-2")).await.unwrap();
    assert!(!lost.succeeded);
    assert_eq!(lost.revision, won.revision, "a failed txn writes nothing");
    let [OpResponse::Range(kvs)] = &lost.responses[..] else {
        panic!("one Range answer: {lost:?}");
    };
    assert_eq!(kvs.len(), 1);
    assert_eq!(
        (kvs[0].value.as_slice(), kvs[0].lease),
        (&b"node-1"[..], lease.id)
    );
    assert_eq!(kvs[0].create_revision, won.revision);

    let resign = Txn {
        compare: vec![
            Compare::value("roost/leader", CmpOp::Equal, b"node-1"),
            Compare::version("roost/leader", CmpOp::Equal, 1),
            Compare::mod_revision("roost/leader", CmpOp::Less, won.revision + 1),
        ],
        success: vec![Op::Delete {
            key: "roost/leader".into(),
        }],
        failure: vec![],
    };
    let done = c.txn(resign.clone()).await.unwrap();
    assert!(done.succeeded);
    assert_eq!(done.responses, [OpResponse::Delete { deleted: 1 }]);
    assert!(done.revision > won.revision);
    let again = c.txn(resign).await.unwrap();
    assert!(!again.succeeded && again.responses.is_empty());
}
