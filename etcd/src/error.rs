//! `EtcdError`, the one error type of the client: every variant but `Config` names the
//! endpoint that answered (or did not) and the call (`"put"`, `"txn"`, ...), so a log line
//! alone says which member and which step of the election failed.

use std::time::Duration;

/// Why an etcd call failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No answer could be had: connection refused or reset, TLS handshake refused, the
    /// connection closed before a full answer.
    #[error("etcd {endpoint}: {op}: unreachable: {detail}")]
    Unreachable {
        endpoint: String,
        op: &'static str,
        detail: String,
    },
    /// The call's time ran out while this endpoint was being tried.
    #[error("etcd {endpoint}: {op}: no answer within {after:?}")]
    Timeout {
        endpoint: String,
        op: &'static str,
        after: Duration,
    },
    /// The gateway answered with a non-2xx HTTP status (etcd's gRPC error mapped to HTTP:
    /// 400 invalid argument, 404 lease not found, 503 no leader ...); `body` is truncated.
    #[error("etcd {endpoint}: {op}: HTTP {code}: {body}")]
    Status {
        endpoint: String,
        op: &'static str,
        code: u16,
        body: String,
    },
    /// An answer that is not what the gateway sends: broken HTTP, a body over the cap, JSON
    /// that does not parse or lacks what the call needs, a range over its limit.
    #[error("etcd {endpoint}: {op}: malformed answer: {detail}")]
    Malformed {
        endpoint: String,
        op: &'static str,
        detail: String,
    },
    /// The options cannot make a client: a bad endpoint, an unreadable TLS file.
    #[error("etcd client configuration: {0}")]
    Config(String),
}
