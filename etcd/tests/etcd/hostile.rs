//! Answers no etcd gives: an in-test TCP server on loopback that answers every connection
//! the same broken way. Each call must end in a typed error naming the endpoint and the
//! call, within its timeout, without a panic.

use std::time::{Duration, Instant};

use roost_etcd::{Etcd, EtcdError, EtcdOptions, RESPONSE_BYTES_MAX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const TIMEOUT: Duration = Duration::from_millis(800);
const SLACK: Duration = Duration::from_millis(400);
/// Connections one fake server serves (a call makes at most `ROUNDS_MAX` per endpoint).
const CONNECTIONS_MAX: usize = 16;
/// What a streaming fake writes at most, whatever the client does.
const STREAM_BYTES_MAX: usize = 64 << 20;

#[derive(Clone, Copy, Debug)]
enum Fake {
    Garbage,
    Status500,
    HugeDeclared,
    HugeChunked,
    Trickle,
    Silent,
    CloseAtOnce,
    NotJson,
    NoHeader,
    BadInt,
}

/// A fake server; aborted (its connections with it) when dropped.
struct FakeServer {
    url: String,
    task: JoinHandle<()>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn fake(kind: Fake) -> FakeServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut conns = Vec::new();
        for _ in 0..CONNECTIONS_MAX {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            conns.push(tokio::spawn(answer(s, kind)));
        }
        // Held here so that aborting this task is the only way they end early.
        for c in conns {
            let _ = c.await;
        }
    });
    FakeServer { url, task }
}

fn ok_json(body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

async fn answer(mut s: TcpStream, kind: Fake) {
    let mut req = vec![0u8; 64 << 10];
    let _ = s.read(&mut req).await;
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
    let reply = match kind {
        Fake::Garbage => "SSH-2.0-OpenSSH_9.2\r\n\x00\x01\x02 not http\r\n\r\n".to_owned(),
        Fake::Status500 => {
            let body = format!("{{\"error\":\"{}\"}}", "x".repeat(4096));
            format!(
                "HTTP/1.1 500 Internal Server Error\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        }
        Fake::HugeDeclared => format!("{head}Content-Length: {}\r\n\r\n{{", 100 << 20),
        Fake::HugeChunked => return stream_chunks(s, head).await,
        Fake::Trickle => return trickle(s).await,
        Fake::Silent => return hold(s).await,
        Fake::CloseAtOnce => return,
        Fake::NotJson => ok_json("<html>not json</html>"),
        Fake::NoHeader => ok_json("{}"),
        Fake::BadInt => ok_json(r#"{"header":{"revision":"12x"}}"#),
    };
    let _ = s.write_all(reply.as_bytes()).await;
    hold(s).await;
}

/// A chunked body of 'a's without end (bounded by `STREAM_BYTES_MAX`).
async fn stream_chunks(mut s: TcpStream, head: &str) {
    let _ = s
        .write_all(format!("{head}Transfer-Encoding: chunked\r\n\r\n").as_bytes())
        .await;
    let chunk = format!("10000\r\n{}\r\n", "a".repeat(0x10000));
    for _ in 0..STREAM_BYTES_MAX / chunk.len() {
        if s.write_all(chunk.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// A status line one byte every 100 ms (about 5 s in all, far past any call's timeout).
async fn trickle(mut s: TcpStream) {
    for b in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" {
        if s.write_all(&[*b]).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Keeps the connection open, saying nothing, until the client goes (or 30 s).
async fn hold(mut s: TcpStream) {
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
}

/// Goal: every kind of broken answer ends in the error of its kind, naming the endpoint
/// and the call, within the timeout. Method: one fake server per kind, one put each (the
/// body cap: 100 MiB declared, then an endless chunked body).
#[tokio::test]
async fn hostile_answers_are_typed_errors_within_the_timeout() {
    let cases = [
        Fake::Garbage,
        Fake::Status500,
        Fake::HugeDeclared,
        Fake::HugeChunked,
        Fake::Trickle,
        Fake::Silent,
        Fake::CloseAtOnce,
        Fake::NotJson,
        Fake::NoHeader,
        Fake::BadInt,
    ];
    let checks = cases.map(|kind| tokio::spawn(check(kind)));
    for c in checks {
        c.await.unwrap();
    }
}

async fn check(kind: Fake) {
    let server = fake(kind).await;
    let c = Etcd::new(EtcdOptions {
        endpoints: vec![server.url.clone()],
        tls: None,
        request_timeout: TIMEOUT,
    })
    .unwrap();
    let started = Instant::now();
    let err = c.put("roost/k", b"v", None).await.unwrap_err();
    let took = started.elapsed();
    eprintln!("{kind:?} after {took:?}: {err}");
    assert!(took <= TIMEOUT + SLACK, "{kind:?} took {took:?}");
    let named = match &err {
        EtcdError::Unreachable { endpoint, op, .. }
        | EtcdError::Timeout { endpoint, op, .. }
        | EtcdError::Status { endpoint, op, .. }
        | EtcdError::Malformed { endpoint, op, .. } => *endpoint == server.url && *op == "put",
        EtcdError::Config(_) => false,
    };
    assert!(named, "{kind:?}: {err:?}");
    let expected = match kind {
        Fake::Garbage | Fake::NotJson | Fake::NoHeader | Fake::BadInt => {
            matches!(err, EtcdError::Malformed { .. })
        }
        Fake::HugeDeclared | Fake::HugeChunked => {
            matches!(&err, EtcdError::Malformed { detail, .. }
                if detail.contains(&RESPONSE_BYTES_MAX.to_string()))
        }
        Fake::Status500 => {
            matches!(&err, EtcdError::Status { code: 500, body, .. } if body.len() < 1024)
        }
        Fake::Trickle | Fake::Silent => matches!(err, EtcdError::Timeout { .. }),
        Fake::CloseAtOnce => matches!(err, EtcdError::Unreachable { .. }),
    };
    assert!(expected, "{kind:?}: {err:?}");
}
