//! Mutual TLS and who may say what (issue 26), over real TCP on 127.0.0.1 between in-memory
//! logs: a member follows over TLS; a member cannot fetch under another member's name; a
//! plain client, a certificate from another CA and an expired certificate get nothing; an
//! implausible epoch does not step the leader down (a plausible one does); the handshake
//! has a limit and one address a cap on its connections. Certificates are made here with
//! rcgen (the crate `roost certs` uses). Every wait is bounded (`common::LIMIT`).
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{eventually, fast_opts, within, Follower, Leader};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use roost_replication::testing::{fetch, MemLog};
use roost_replication::{LeaderOptions, Message, Stream, TlsIdentity, Transport};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const MEMBERS: [&str; 3] = ["a", "b", "c"];

/// A test CA that issues member certificates.
struct Ca {
    cert: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = p.self_signed(&key).expect("self-sign the CA");
        Ca {
            cert: cert.der().clone(),
            issuer: Issuer::new(p, key),
        }
    }

    /// A member's credentials for `name`, trusting this CA; `expired` makes a certificate
    /// whose validity ended in 2021.
    fn identity(&self, name: &str, expired: bool) -> TlsIdentity {
        let key = KeyPair::generate().expect("member key");
        let mut p = CertificateParams::new(vec![name.to_owned()]).expect("member params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = p.signed_by(&key, &self.issuer).expect("sign");
        TlsIdentity {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            ca: vec![self.cert.clone()],
        }
    }

    fn transport(&self, name: &str) -> Transport {
        self.transport_of(self.identity(name, false))
    }

    fn transport_of(&self, identity: TlsIdentity) -> Transport {
        let members = MEMBERS.iter().map(|m| m.to_string()).collect();
        Transport::tls(identity, members).expect("a TLS transport")
    }
}

/// Leader `a` of epoch 0x105 (generation 1, node 5) over TLS, with `b` its in-sync set and
/// one durable record.
async fn tls_leader(ca: &Ca) -> (Arc<MemLog>, Leader) {
    tls_leader_with(ca, Duration::from_millis(500)).await
}

/// `tls_leader` with another handshake limit.
async fn tls_leader_with(ca: &Ca, handshake: Duration) -> (Arc<MemLog>, Leader) {
    tls_leader_opts(ca, handshake, 16).await
}

/// `tls_leader_with` with at most `handshakes` connections in their handshake.
async fn tls_leader_opts(ca: &Ca, handshake: Duration, handshakes: usize) -> (Arc<MemLog>, Leader) {
    let a = Arc::new(MemLog::new("a"));
    a.become_leader(0x105, &["b"]);
    a.write_durable(1, b"one");
    let opts = LeaderOptions {
        transport: ca.transport("a").handshake_timeout(handshake),
        connections_per_address_max: 4,
        handshakes_max: handshakes,
        ..LeaderOptions::default()
    };
    let leader = Leader::start_with(Arc::clone(&a), opts).await;
    (a, leader)
}

/// Sends `msg` on `s` and reads one answer (`None`: the leader closed the connection).
async fn ask(s: &mut Stream, msg: &Message) -> Option<Message> {
    roost_replication::testing::ask(s, msg, common::LIMIT).await
}

/// Goal: a member follows over mutual TLS: it catches up and its acknowledgement counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_follows_over_tls_and_its_acknowledgement_counts() {
    let ca = Ca::new("cluster");
    let (a, leader) = tls_leader(&ca).await;
    let b = Arc::new(MemLog::new("b"));
    let mut opts = fast_opts("b");
    opts.transport = ca.transport("b");
    let follower = Follower::start(&leader.addr, Arc::clone(&b), opts);
    eventually("b catches up and the hw passes it", || {
        b.end() == 2 && a.hw() == 2
    })
    .await;
    assert_eq!(b.entries(), a.entries());
    follower.stop().await;
    leader.stop().await;
}

/// Goal: an authenticated member cannot acknowledge for another: `c`'s certificate fetching
/// as `b` is refused with an error, and the hw does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_fetch_as_another_member() {
    let ca = Ca::new("cluster");
    let (a, leader) = tls_leader(&ca).await;
    let mut s = connect_as(&ca, "c", &leader.addr).await;
    let answer = ask(&mut s, &fetch("b", 0x105, 2)).await;
    match answer {
        Some(Message::Error { message }) => assert!(message.contains("\"b\""), "{message}"),
        other => panic!("c fetching as b was answered {other:?}"),
    }
    assert_eq!(a.hw(), 1, "a forged acknowledgement moved the hw");
    // Neither can a member with a name outside `members`.
    let mut s = connect_as(&ca, "d", &leader.addr).await;
    assert!(matches!(
        ask(&mut s, &fetch("d", 0x105, 2)).await,
        Some(Message::Error { .. })
    ));
    // `b` as itself is believed (the control).
    let mut s = connect_as(&ca, "b", &leader.addr).await;
    let answer = ask(&mut s, &fetch("b", 0x105, 2)).await;
    assert!(
        matches!(answer, Some(Message::Records { .. })),
        "{answer:?}"
    );
    assert_eq!(a.hw(), 2);
    leader.stop().await;
}

/// A TLS connection to `addr` with a certificate for `name` (which need not be a member).
async fn connect_as(ca: &Ca, name: &str, addr: &str) -> Stream {
    let t = ca.transport_of(ca.identity(name, false));
    t.connect(addr, Duration::from_secs(2))
        .await
        .unwrap_or_else(|e| panic!("{name} connects: {e}"))
}

/// Whether the leader at `addr` ends a TLS connection made with `identity` without
/// answering a fetch: the handshake fails (on either side), or the connection is closed.
async fn refused(ca: &Ca, identity: TlsIdentity, addr: &str) -> bool {
    let Ok(mut s) = ca
        .transport_of(identity)
        .connect(addr, Duration::from_secs(2))
        .await
    else {
        return true;
    };
    ask(&mut s, &fetch("b", 0x105, 2)).await.is_none()
}

/// Goal: a client with no certificate at all (plain TCP, the two forged frames)
/// gets nothing: neither a fetch nor a base backup is answered, and the hw does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_gets_nothing_from_a_tls_leader() {
    let ca = Ca::new("cluster");
    let (a, leader) = tls_leader(&ca).await;
    for msg in [
        fetch("b", 0x105, 99),
        fetch("b", 0x105, 2),
        Message::Snapshot {
            replica: "b".into(),
            current_epoch: 0x105,
        },
    ] {
        let mut s = Stream::Plain(TcpStream::connect(&leader.addr).await.expect("connect"));
        let answer = ask(&mut s, &msg).await;
        assert!(answer.is_none(), "a plain client was answered {answer:?}");
    }
    assert_eq!(a.hw(), 1, "an unauthenticated fetch moved the hw");
    assert_eq!(
        a.snapshots_taken(),
        0,
        "a base backup was taken for a stranger"
    );
    leader.stop().await;
}

/// Goal: a certificate from another CA, and an expired one from the right CA, are refused
/// at the handshake; the same name with a good certificate is served (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_ca_and_an_expired_certificate_are_refused() {
    let ca = Ca::new("cluster");
    let (a, leader) = tls_leader(&ca).await;
    let other = Ca::new("another cluster");
    let mut foreign = other.identity("b", false);
    foreign.ca = vec![ca.cert.clone()];
    assert!(
        refused(&ca, foreign, &leader.addr).await,
        "another CA's certificate was served"
    );
    assert!(
        refused(&ca, ca.identity("b", true), &leader.addr).await,
        "an expired certificate was served"
    );
    assert_eq!(a.hw(), 1);
    assert!(!refused(&ca, ca.identity("b", false), &leader.addr).await);
    assert_eq!(a.hw(), 2);
    leader.stop().await;
}

/// Goal: a follower refuses a leader whose certificate is from another CA (a stranger
/// cannot pose as the primary and feed a standby records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_refuses_a_leader_from_another_ca() {
    let other = Ca::new("another cluster");
    let (_a, leader) = tls_leader(&other).await;
    let ca = Ca::new("cluster");
    let b = Arc::new(MemLog::new("b"));
    let mut opts = fast_opts("b");
    opts.transport = ca.transport("b");
    let follower = Follower::start(&leader.addr, Arc::clone(&b), opts);
    eventually("the follower says why", || {
        follower.status.snapshot().last_error.is_some()
    })
    .await;
    let why = follower.status.snapshot().last_error.unwrap_or_default();
    assert!(why.contains("TLS handshake"), "{why}");
    assert_eq!(b.end(), 1, "records from a leader of another CA");
    follower.stop().await;
    leader.stop().await;
}

/// Goal: no single message steps the leader down with an epoch no promotion could have
/// minted: the 4294967280, and one too many generations ahead, are refused with an
/// error and the leader stays; a plausible newer epoch does step it down (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_implausible_epoch_does_not_step_the_leader_down() {
    let ca = Ca::new("cluster");
    let (a, leader) = tls_leader(&ca).await;
    let too_far = (0x1 + roost_replication::EPOCH_GENERATIONS_AHEAD_MAX + 1) << 8;
    for epoch in [4_294_967_280, too_far] {
        let mut s = connect_as(&ca, "b", &leader.addr).await;
        let answer = ask(&mut s, &fetch("b", epoch, 1)).await;
        assert!(
            matches!(answer, Some(Message::Error { .. })),
            "{epoch}: {answer:?}"
        );
        assert!(a.is_leader(), "epoch {epoch} stepped the leader down");
        assert_eq!(a.higher_epoch_seen(), None);
    }
    let mut s = connect_as(&ca, "b", &leader.addr).await;
    let answer = ask(&mut s, &fetch("b", 0x206, 1)).await;
    assert!(
        matches!(
            answer,
            Some(Message::UnknownEpoch {
                leader_epoch: 0x105
            })
        ),
        "{answer:?}"
    );
    assert_eq!(a.higher_epoch_seen(), Some(0x206));
    leader.stop().await;
}

/// Goal: a connection that never completes its handshake is closed after the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_handshake_is_closed_after_the_limit() {
    let ca = Ca::new("cluster");
    let (_a, leader) = tls_leader(&ca).await;
    let mut silent = TcpStream::connect(&leader.addr).await.expect("connect");
    let mut buf = [0u8; 1];
    let n = within("the silent connection is closed", silent.read(&mut buf)).await;
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    leader.stop().await;
}

/// Goal: one address gets at most `connections_per_address_max` connections at once: with
/// four silent ones handshaking (a 60 s limit, so they stay), the fifth is closed at accept;
/// once they close, a member is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_is_capped() {
    let ca = Ca::new("cluster");
    let (_a, leader) = tls_leader_with(&ca, Duration::from_secs(60)).await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(&leader.addr).await.expect("connect"));
    }
    let mut extra = TcpStream::connect(&leader.addr).await.expect("connect");
    let mut buf = [0u8; 1];
    let n = within("the fifth connection is closed", extra.read(&mut buf)).await;
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "the fifth connection was kept: {n:?}"
    );
    let still = tokio::time::timeout(Duration::from_millis(300), silent[0].read(&mut buf)).await;
    assert!(
        still.is_err(),
        "a handshaking connection was closed: {still:?}"
    );
    drop(silent);
    let t = ca.transport("b");
    let served = async {
        loop {
            if let Ok(mut s) = t.connect(&leader.addr, Duration::from_secs(2)).await {
                if ask(&mut s, &fetch("b", 0x105, 2)).await.is_some() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    within("a member is served once the places are free", served).await;
    leader.stop().await;
}

/// Goal: connections still in their handshake are capped apart from the rest: with two
/// silent ones handshaking (limit 2, a 60 s handshake limit), a third is closed at accept;
/// a member's connection, once authenticated, no longer counts among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshaking_connections_are_capped() {
    let ca = Ca::new("cluster");
    let (_a, leader) = tls_leader_opts(&ca, Duration::from_secs(60), 2).await;
    let mut member = connect_as(&ca, "b", &leader.addr).await;
    assert!(ask(&mut member, &fetch("b", 0x105, 2)).await.is_some());
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(&leader.addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = TcpStream::connect(&leader.addr).await.expect("connect");
    let mut buf = [0u8; 1];
    let n = within("the third handshake is closed", third.read(&mut buf)).await;
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "the third handshake was kept: {n:?}"
    );
    assert!(
        ask(&mut member, &fetch("b", 0x105, 2)).await.is_some(),
        "the member lost its place"
    );
    leader.stop().await;
}

/// Goal: a member's forwarded batches (issue 27) reach the leader over mutual TLS, many in
/// flight on one connection, each answer paired with its own batch; a member cannot
/// forward under another member's name, and a plain client forwards nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_forwards_batches_and_only_as_itself() {
    use roost_replication::{Forwarded, Forwarder};
    let ca = Ca::new("cluster");
    let (a, leader) = tls_leader(&ca).await;
    let fwd = Arc::new(Forwarder::new(ca.transport("b"), "b", 1 << 20));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40u32 {
        let (fwd, addr) = (fwd.clone(), leader.addr.clone());
        tasks.spawn(async move {
            let batch = format!("batch-{i}").into_bytes();
            let r = fwd.forward(&addr, batch, Duration::from_secs(5)).await;
            (i, r)
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (i, r) = done.expect("forward task");
        let reply = r.unwrap_or_else(|e| panic!("forward {i}: {e}"));
        assert_eq!(reply.leader_epoch, 0x105);
        let want = format!("fwd:b:batch-{i}").into_bytes();
        assert_eq!(
            reply.outcome,
            Forwarded::Answer {
                answer: want,
                durable_lsn: 2
            },
            "forward {i} got another batch's answer"
        );
    }
    assert_eq!(a.forwarded(), 40);
    // `c` speaking as `b`: an error, the connection closed, nothing run.
    let mut s = connect_as(&ca, "c", &leader.addr).await;
    let forged = Message::Forward {
        replica: "b".into(),
        id: 1,
        batch: b"forged".to_vec(),
    };
    assert!(matches!(
        ask(&mut s, &forged).await,
        Some(Message::Error { .. })
    ));
    // A plain client: the TLS leader never reads its frame.
    let plain = Forwarder::new(Transport::plain(vec!["b".into()]), "b", 1 << 20);
    let r = plain
        .forward(&leader.addr, b"plain".to_vec(), Duration::from_secs(2))
        .await;
    assert!(r.is_err(), "a plain client forwarded: {r:?}");
    assert_eq!(a.forwarded(), 40, "a forged or plain forward was run");
    // A leader that no longer leads refuses (nothing decided), and says so.
    a.resign();
    let r = fwd
        .forward(&leader.addr, b"late".to_vec(), Duration::from_secs(5))
        .await;
    let reply = r.expect("a reply from a node that leads nothing");
    assert!(matches!(reply.outcome, Forwarded::Refused(_)), "{reply:?}");
    leader.stop().await;
}

/// Goal: forwards that come together run as one group (`LeaderLog::forward_group`: one
/// plan and one sync on the daemon's leader, issue 42), each still answered under its own
/// id with its own batch's outcome. Method: ten `Forward` frames in one write on a member's
/// connection; the leader's largest group holds more than one, and every answer pairs
/// with its batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_that_come_together_run_as_one_group() {
    use roost_replication::wire::{encode, read_frame, DEFAULT_FRAME_BYTES_MAX};
    use tokio::io::AsyncWriteExt;
    let ca = Ca::new("cluster");
    let (a, leader) = tls_leader(&ca).await;
    let mut s = connect_as(&ca, "b", &leader.addr).await;
    let mut bytes = Vec::new();
    for id in 0..10u64 {
        let f = Message::Forward {
            replica: "b".into(),
            id: 100 + id,
            batch: format!("batch-{id}").into_bytes(),
        };
        bytes.extend(encode(&f, DEFAULT_FRAME_BYTES_MAX).expect("encodes"));
    }
    s.write_all(&bytes).await.expect("write");
    s.flush().await.expect("flush");
    let mut answered = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let msg = within("an answer", read_frame(&mut s, DEFAULT_FRAME_BYTES_MAX)).await;
        match msg.expect("reads").expect("not closed") {
            Message::ForwardAnswer { id, answer, .. } => {
                let want = format!("fwd:b:batch-{}", id - 100).into_bytes();
                assert_eq!(answer, want, "forward {id} got another batch's answer");
                assert!(answered.insert(id), "forward {id} answered twice");
            }
            other => panic!("expected a ForwardAnswer, got {other:?}"),
        }
    }
    assert_eq!(answered.len(), 10);
    assert_eq!(a.forwarded(), 10);
    let group = a.largest_forward_group();
    assert!(
        group > 1,
        "ten forwards in one write ran one by one (largest group {group})"
    );
    leader.stop().await;
}
