//! One HTTP/1.1 POST to one endpoint, on a connection of its own: connect, TLS handshake
//! (https), hyper's client connection for the framing, the body read under a cap. It knows
//! nothing of timeouts or failover: the caller (`client::Etcd::call`) bounds the whole
//! exchange and picks the endpoint. A failure is sorted by what it says about the member:
//! `Unreachable` (no answer), `Status` (the gateway refused) or `Malformed` (whatever
//! answered does not speak HTTP as the gateway does, or said too much).

use std::error::Error as StdError;

use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Bytes;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

use crate::endpoint::Endpoint;
use crate::error::EtcdError;

/// The most bytes of a response body that are read: a range bounded by
/// `PREFIX_KVS_MAX` keys of election-sized values fits many times over, and a hostile or
/// confused server cannot make us buffer more.
pub const RESPONSE_BYTES_MAX: usize = 4 << 20;

/// The most characters of an error body kept in `EtcdError::Status`.
const STATUS_BODY_CHARS_MAX: usize = 512;

/// How one exchange failed; `into_error` adds the endpoint and the call.
#[derive(Debug)]
pub(crate) enum Failure {
    Unreachable(String),
    Status(u16, String),
    Malformed(String),
}

impl Failure {
    pub(crate) fn into_error(self, endpoint: &str, op: &'static str) -> EtcdError {
        let endpoint = endpoint.to_owned();
        match self {
            Failure::Unreachable(detail) => EtcdError::Unreachable {
                endpoint,
                op,
                detail,
            },
            Failure::Status(code, body) => EtcdError::Status {
                endpoint,
                op,
                code,
                body,
            },
            Failure::Malformed(detail) => EtcdError::Malformed {
                endpoint,
                op,
                detail,
            },
        }
    }
}

/// POSTs `body` (JSON) to `path` on `ep`; the 2xx answer's body.
pub(crate) async fn post(
    ep: &Endpoint,
    tls: Option<&TlsConnector>,
    path: &str,
    body: Bytes,
) -> Result<Bytes, Failure> {
    let tcp = TcpStream::connect(&ep.authority)
        .await
        .map_err(|e| Failure::Unreachable(format!("connect: {e}")))?;
    // Requests are small and answered at once: Nagle would only add latency.
    let _ = tcp.set_nodelay(true);
    match (tls, &ep.server_name) {
        (Some(connector), Some(name)) => {
            let stream = connector
                .connect(name.clone(), tcp)
                .await
                .map_err(|e| Failure::Unreachable(format!("TLS handshake: {}", chain(&e))))?;
            exchange(stream, ep, path, body).await
        }
        _ => exchange(tcp, ep, path, body).await,
    }
}

/// Aborts the connection's driver task when the exchange ends or is dropped (a timeout):
/// a server that never closes must not keep a task and a socket alive.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The request and its answer over an open stream.
async fn exchange<S>(io: S, ep: &Endpoint, path: &str, body: Bytes) -> Result<Bytes, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| Failure::Unreachable(format!("HTTP handshake: {}", chain(&e))))?;
    let _driver = AbortOnDrop(tokio::spawn(async move {
        // Its error, if any, reaches `send_request` or the body read as theirs.
        let _ = conn.await;
    }));
    let request = Request::post(path)
        .header(HOST, &ep.authority)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| Failure::Malformed(format!("building the request for {path}: {e}")))?;
    let response = sender.send_request(request).await.map_err(hyper_failure)?;
    let status = response.status();
    if let Some(len) = declared_length(response.headers()) {
        if len > RESPONSE_BYTES_MAX as u64 {
            return Err(too_large());
        }
    }
    let body = read_capped(response.into_body()).await?;
    if !status.is_success() {
        return Err(Failure::Status(status.as_u16(), status_body(&body)));
    }
    Ok(body)
}

fn declared_length(headers: &hyper::HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// The whole body, refused past `RESPONSE_BYTES_MAX` bytes (checked as it arrives: a
/// chunked body declares no length).
async fn read_capped(body: hyper::body::Incoming) -> Result<Bytes, Failure> {
    match Limited::new(body, RESPONSE_BYTES_MAX).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => {
            let detail = format!("reading the answer: {}", chain(e.as_ref()));
            match e.downcast_ref::<hyper::Error>() {
                Some(h) if h.is_parse() => Err(Failure::Malformed(detail)),
                _ => Err(Failure::Unreachable(detail)),
            }
        }
    }
}

fn too_large() -> Failure {
    Failure::Malformed(format!(
        "response body over {RESPONSE_BYTES_MAX} bytes (RESPONSE_BYTES_MAX)"
    ))
}

/// A hyper error while sending or reading the head: unparsable HTTP is `Malformed` (not a
/// gateway), anything else (closed, reset, TLS alert) `Unreachable`.
fn hyper_failure(e: hyper::Error) -> Failure {
    if e.is_parse() || e.is_parse_status() {
        Failure::Malformed(format!("not an HTTP answer: {}", chain(&e)))
    } else if e.is_incomplete_message() {
        Failure::Unreachable(format!(
            "connection closed before a full answer: {}",
            chain(&e)
        ))
    } else {
        Failure::Unreachable(chain(&e))
    }
}

/// An error body as text, cut to `STATUS_BODY_CHARS_MAX` characters.
fn status_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    match text.char_indices().nth(STATUS_BODY_CHARS_MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// `e` and its sources, joined by ": " (a rustls alert sits several levels down a hyper
/// error, and it is the part that says why).
pub(crate) fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    // Bounded: error chains are short, and a cyclic one must not loop.
    for _ in 0..8 {
        let Some(s) = source else { break };
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_body_is_cut_on_a_char_boundary() {
        let long = "é".repeat(STATUS_BODY_CHARS_MAX + 10);
        let cut = status_body(long.as_bytes());
        assert_eq!(cut.chars().count(), STATUS_BODY_CHARS_MAX + 3);
        assert_eq!(status_body(b"  short \n"), "short");
    }
}
