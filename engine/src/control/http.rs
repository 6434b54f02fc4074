//! The metrics and health checks over HTTP on `metrics_listen` (off by default; any address
//! the operator sets, as Prometheus exporters bind): hyper's HTTP/1 server on tokio, over
//! TLS and with basic auth when `metrics_web_config` says so (exporter-toolkit's web
//! configuration: `web_config.rs` reads it, `web.rs` builds the rustls acceptor and checks
//! users). `GET /health`, `/leader` and `/replica` (HEAD too) are the health checks a load
//! balancer asks, as Patroni's REST API offers them: 200 or 503 and a small JSON body
//! (`health.rs` says which node passes which); like Patroni's, they need no password (a
//! balancer's probe often cannot send one; they tell a node's role, nothing else), while TLS
//! and a required client certificate cover them as every path. Every other path (`/metrics`
//! by convention, and `/`) is answered with `metrics.rs`'s text, OpenMetrics unless the
//! `Accept` header asks for `text/plain` (then the Prometheus text 0.0.4), and 401 without
//! the right user and password when `basic_auth_users` is set. Bounded: [`CONNECTIONS_MAX`]
//! connections at once (more are closed unanswered), the TLS handshake and a request head of
//! at most [`REQUEST_HEAD_BYTES_MAX`] read within [`REQUEST_HEAD_TIMEOUT`], a request body
//! never read, one request per connection, and [`CONNECTION_TIMEOUT`] for the whole
//! exchange. Serves nothing else, and changes nothing.

mod health;
pub mod web;
pub mod web_config;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{
    HeaderValue, ACCEPT, ALLOW, AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, WWW_AUTHENTICATE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::metrics::{render, Format};
use crate::cluster::Cluster;
use crate::replica::Node;
use health::{Check, Health};
use web::Web;

/// Connections served at once; one past it is closed at once (a scraper tries again at its
/// next interval).
pub const CONNECTIONS_MAX: usize = 16;
/// Bytes of a request's head (request line and headers): hyper's smallest read buffer; a
/// longer head is answered 431 and closed.
pub const REQUEST_HEAD_BYTES_MAX: usize = 8192;
/// Time for the request head to arrive; a slower client is dropped.
pub const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for the whole exchange, the answer's writing included.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (out of descriptors, say) before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The metrics listener on `addr`, bound now (before READY=1, so a scraper started after it
/// never finds the port closed). Must be called inside the runtime.
pub fn bind_metrics(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    TcpListener::from_std(std_listener)
}

/// What every connection needs: the engine, the cluster agent, the listener's security.
#[derive(Clone)]
struct Served {
    node: Node,
    cluster: Option<Arc<Cluster>>,
    web: Arc<Web>,
}

/// Serves the metrics and health checks on `listener` until the task is dropped.
pub async fn serve_metrics_tcp(
    listener: TcpListener,
    web: Arc<Web>,
    node: Node,
    cluster: Option<Arc<Cluster>>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let served = Served { node, cluster, web };
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, a connection reset before it was taken: the endpoint
                // stays up and tries again.
                warn!(error = %e, "metrics: cannot accept a connection; retrying");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            debug!(%peer, "metrics: {CONNECTIONS_MAX} connections open; closing this one");
            continue;
        };
        let served = served.clone();
        tokio::spawn(async move {
            let exchange = accept(stream, peer, served);
            if tokio::time::timeout(CONNECTION_TIMEOUT, exchange)
                .await
                .is_err()
            {
                debug!(%peer, "metrics connection took longer than {CONNECTION_TIMEOUT:?}; closed");
            }
            drop(permit);
        });
    }
}

/// A TLS listener's handshake (within [`REQUEST_HEAD_TIMEOUT`]), then the exchange. A
/// client speaking plain HTTP to it is answered 400 in plain text and closed, as Go's server
/// does ("Client sent an HTTP request to an HTTPS server."): never the metrics.
async fn accept(mut stream: TcpStream, peer: SocketAddr, served: Served) {
    let Some(acceptor) = served.web.tls.clone() else {
        return serve_connection(stream, served).await;
    };
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(REQUEST_HEAD_TIMEOUT, stream.peek(&mut first)).await;
    if !matches!(peeked, Ok(Ok(1))) {
        return;
    }
    // Every TLS connection opens with a handshake record (content type 22).
    if first[0] != 22 {
        debug!(%peer, "metrics: plain HTTP on the TLS listener; answered 400");
        let _ = stream.write_all(PLAIN_ON_TLS).await;
        return;
    }
    match tokio::time::timeout(REQUEST_HEAD_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => serve_connection(tls, served).await,
        Ok(Err(e)) => debug!(%peer, error = %e, "metrics: TLS handshake failed"),
        Err(_) => debug!(%peer, "metrics: TLS handshake took longer than {REQUEST_HEAD_TIMEOUT:?}"),
    }
}

/// The answer to plain HTTP on a TLS listener.
const PLAIN_ON_TLS: &[u8] = b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// One connection, one request, within the bounds above.
async fn serve_connection<S>(stream: S, served: Served)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
        let served = served.clone();
        async move { Ok::<_, Infallible>(answer(&req, served).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_HEAD_TIMEOUT)
        .max_buf_size(REQUEST_HEAD_BYTES_MAX)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    if let Err(e) = conn.await {
        debug!(error = %e, "metrics connection ended with an error");
    }
}

/// `GET` or `HEAD` only (hyper sends a HEAD answer's head alone). A health check reads a few
/// flags at once; the metrics check the password (bcrypt) and read the disk (the shards'
/// sizes), off the runtime's workers.
async fn answer<B>(req: &Request<B>, served: Served) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET or HEAD of /metrics, /health, /leader, /replica\n".into(),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    if let Some(check) = Check::of_path(req.uri().path()) {
        return health_answer(check, &served.node, served.cluster.as_deref());
    }
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::from_accept(accept);
    let authorization = req
        .headers()
        .get(AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec());
    tokio::task::spawn_blocking(move || {
        if !served.web.authorized(authorization.as_deref()) {
            return unauthorized();
        }
        metrics_answer(format, &served.node, served.cluster.as_ref())
    })
    .await
    .unwrap_or_else(|e| plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")))
}

/// 401 with the challenge a browser or Prometheus answers with its credentials.
fn unauthorized() -> Response<Full<Bytes>> {
    let mut r = plain(StatusCode::UNAUTHORIZED, "Unauthorized\n".into());
    let challenge = HeaderValue::from_static("Basic realm=\"roost\"");
    r.headers_mut().insert(WWW_AUTHENTICATE, challenge);
    r
}

/// A health check: 200 when it passes, 503 when not, and why as JSON.
fn health_answer(check: Check, node: &Node, cluster: Option<&Cluster>) -> Response<Full<Bytes>> {
    let h = Health::read(node, cluster);
    let status = match h.passes(check) {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut r = Response::new(Full::new(Bytes::from(format!("{}\n", h.json(check)))));
    *r.status_mut() = status;
    let headers = r.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // A check's answer is now's: never from a cache between the balancer and this node.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// Any other path (`/metrics` by convention; the endpoint always answered every path): the
/// metrics in the format `Accept` asks for.
fn metrics_answer(
    format: Format,
    node: &Node,
    cluster: Option<&Arc<Cluster>>,
) -> Response<Full<Bytes>> {
    match render(node, cluster, format) {
        Ok(text) => {
            let mut r = Response::new(Full::new(Bytes::from(text)));
            let ct = HeaderValue::from_static(format.content_type());
            r.headers_mut().insert(CONTENT_TYPE, ct);
            r
        }
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the metrics could not be rendered: {e}\n"),
        ),
    }
}

fn plain(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    let ct = HeaderValue::from_static("text/plain; charset=utf-8");
    r.headers_mut().insert(CONTENT_TYPE, ct);
    r
}
