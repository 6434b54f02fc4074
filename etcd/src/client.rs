//! [`Etcd`], the client: its options, and `call`, the one path every request takes (the
//! endpoint order, the time split between endpoints, which failures move on to the next
//! member). The calls themselves (`get`, `txn`, `grant` ...) are in `calls`.
//!
//! A call may be sent to more than one member: after a member timed out or closed the
//! connection, the request may or may not have been applied there. Retrying is safe for
//! reads, keepalives and revokes; for writes it means "at least once": a repeated campaign
//! txn finds its own key (compare `create_revision == 0` fails, the failure branch's Get
//! shows our lease), a repeated put or delete changes nothing but the revision, and a
//! repeated grant leaves an unused lease that expires by itself.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use serde::de::DeserializeOwned;
use tokio_rustls::TlsConnector;

use crate::endpoint::{self, Endpoint};
use crate::error::EtcdError;
use crate::http;
use crate::tls::{self, EtcdTls};

/// The least time one endpoint is given within a call, however many endpoints share the
/// call's timeout (a loopback connect and a small answer take well under this).
pub const ATTEMPT_MIN: Duration = Duration::from_millis(100);

/// How many times a call goes round the endpoints before it gives up (time permitting): a
/// second round catches a member that was electing or restarting during the first.
pub const ROUNDS_MAX: usize = 2;

/// The pause before a second round, so that members that refuse at once are not hammered.
const ROUND_PAUSE: Duration = Duration::from_millis(50);

/// The most endpoints a client takes (an etcd cluster has 3, 5 or 7 members).
pub const ENDPOINTS_MAX: usize = 16;

/// What [`Etcd::new`] needs.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Client URLs of the members, `http://host:port` or `https://host:port` (all of one
    /// scheme: https exactly when `tls` is given).
    pub endpoints: Vec<String>,
    pub tls: Option<EtcdTls>,
    /// The most one call takes, failover included.
    pub request_timeout: Duration,
}

/// An etcd client; cheap to clone (the endpoints, the TLS config and the endpoint that last
/// worked are shared).
#[derive(Clone)]
pub struct Etcd {
    inner: Arc<Inner>,
    timeout: Duration,
}

struct Inner {
    endpoints: Vec<Endpoint>,
    tls: Option<TlsConnector>,
    /// The endpoint that answered last: tried first by the next call, so a dead member costs
    /// one failover, not one per call.
    preferred: AtomicUsize,
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<&str> = self
            .inner
            .endpoints
            .iter()
            .map(|e| e.url.as_str())
            .collect();
        f.debug_struct("Etcd")
            .field("endpoints", &urls)
            .field("tls", &self.inner.tls.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A 2xx answer and who gave it (decoding errors name that endpoint).
pub(crate) struct Answer {
    pub endpoint: String,
    pub body: Bytes,
}

impl Answer {
    pub(crate) fn malformed(&self, op: &'static str, detail: impl Into<String>) -> EtcdError {
        EtcdError::Malformed {
            endpoint: self.endpoint.clone(),
            op,
            detail: detail.into(),
        }
    }

    /// The body as `T`; a JSON error quotes the start of the body.
    pub(crate) fn parse<T: DeserializeOwned>(&self, op: &'static str) -> Result<T, EtcdError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            let start = String::from_utf8_lossy(&self.body[..self.body.len().min(120)]);
            self.malformed(op, format!("invalid JSON ({e}): {start:?}"))
        })
    }
}

impl Etcd {
    /// Checks the endpoints and reads the TLS files (errors name the endpoint or the file).
    pub fn new(opts: EtcdOptions) -> Result<Etcd, EtcdError> {
        if opts.endpoints.is_empty() || opts.endpoints.len() > ENDPOINTS_MAX {
            return Err(EtcdError::Config(format!(
                "{} endpoints given: between 1 and {ENDPOINTS_MAX} are accepted",
                opts.endpoints.len()
            )));
        }
        if opts.request_timeout.is_zero() {
            return Err(EtcdError::Config(
                "request_timeout must be above zero".into(),
            ));
        }
        let tls = opts.tls.as_ref().map(tls::connector).transpose()?;
        let endpoints = opts
            .endpoints
            .iter()
            .map(|url| endpoint::parse(url, tls.is_some()))
            .collect::<Result<Vec<_>, _>>()?;
        let inner = Inner {
            endpoints,
            tls,
            preferred: AtomicUsize::new(0),
        };
        Ok(Etcd {
            inner: Arc::new(inner),
            timeout: opts.request_timeout,
        })
    }

    /// The same client (endpoints, TLS, preferred endpoint) with another per-call timeout.
    pub fn with_timeout(&self, t: Duration) -> Etcd {
        Etcd {
            inner: Arc::clone(&self.inner),
            timeout: t.max(Duration::from_millis(1)),
        }
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// POSTs `body` to `path`: the preferred endpoint first, then the others in order, for
    /// up to `ROUNDS_MAX` rounds, all within the call's timeout. Each attempt gets the time
    /// left divided by the endpoints left in its round (at least `ATTEMPT_MIN`), so a stopped
    /// member (its kernel still accepts connections) costs a share, not the whole budget.
    /// A 4xx answer ends the call at once: every member would refuse the request alike.
    pub(crate) async fn call(
        &self,
        op: &'static str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Answer, EtcdError> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let body = Bytes::from(body);
        let n = self.inner.endpoints.len();
        let first = self.inner.preferred.load(Ordering::Relaxed).min(n - 1);
        let mut last = None;
        for attempt in 0..n * ROUNDS_MAX {
            let pos = attempt % n;
            if attempt > 0 && pos == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(ROUND_PAUSE.min(left)).await;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let budget = (left / (n - pos) as u32).max(ATTEMPT_MIN).min(left);
            let idx = nth_in_order(first, pos);
            let ep = &self.inner.endpoints[idx];
            let tls = self.inner.tls.as_ref();
            let err =
                match tokio::time::timeout(budget, http::post(ep, tls, path, body.clone())).await {
                    Ok(Ok(body)) => {
                        self.inner.preferred.store(idx, Ordering::Relaxed);
                        let endpoint = ep.url.clone();
                        return Ok(Answer { endpoint, body });
                    }
                    Ok(Err(failure)) => failure.into_error(&ep.url, op),
                    Err(_) => EtcdError::Timeout {
                        endpoint: ep.url.clone(),
                        op,
                        after: started.elapsed(),
                    },
                };
            if !worth_another(&err) {
                return Err(err);
            }
            tracing::debug!(error = %err, "etcd call failed on one endpoint; trying the next");
            last = Some(err);
        }
        Err(last.unwrap_or_else(|| EtcdError::Timeout {
            endpoint: self.inner.endpoints[first].url.clone(),
            op,
            after: started.elapsed(),
        }))
    }
}

/// The endpoint tried at position `pos` of a round: `first`, then the others by index.
fn nth_in_order(first: usize, pos: usize) -> usize {
    match pos {
        0 => first,
        p if p - 1 < first => p - 1,
        p => p,
    }
}

/// Whether another member may answer differently: not after a 4xx (the request itself was
/// refused), yes after anything else (no answer, a 5xx such as "no leader", garbage).
fn worth_another(err: &EtcdError) -> bool {
    !matches!(
        err,
        EtcdError::Status {
            code: 400..=499,
            ..
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_preferred_then_the_others_by_index() {
        let order = |first, n| (0..n).map(|p| nth_in_order(first, p)).collect::<Vec<_>>();
        assert_eq!(order(0, 3), [0, 1, 2]);
        assert_eq!(order(1, 3), [1, 0, 2]);
        assert_eq!(order(2, 3), [2, 0, 1]);
        assert_eq!(order(0, 1), [0]);
    }
}
