//! Black-box tests of `roost-etcd` against real etcd processes on loopback (started by
//! `roost_etcd::testing`), and against an in-test TCP server that answers like a broken or
//! hostile one. One test binary, so that the tests run in parallel: most of the time is
//! etcd starting and leases expiring.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod hostile;
mod kv;
mod lease;
mod tls;

use std::time::Duration;

use roost_etcd::testing::EtcdServer;
use roost_etcd::Etcd;

/// The per-call timeout of tests against a healthy etcd: generous, a call takes milliseconds.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A one-member etcd in a temporary directory (kept as long as the server) and a client.
pub fn single() -> (tempfile::TempDir, EtcdServer, Etcd) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let server = EtcdServer::start(dir.path()).expect("etcd starts");
    let client = server.client(CALL_TIMEOUT).expect("a client");
    (dir, server, client)
}
