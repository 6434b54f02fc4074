//! Real etcd processes for tests: [`EtcdServer`] (one member, plain or with client
//! certificate auth), [`EtcdCluster`] (several members on loopback) and [`make_tls`] (a CA,
//! a server and a client certificate made with rcgen); [`ReservedPort`], a loopback port
//! held for a daemon that binds it later and after each restart. Not `cfg(test)`: the
//! daemon's tests and its drill use them too.
//!
//! etcd runs as `/usr/bin/etcd` (or `$ROOST_ETCD_BIN`) with `--heartbeat-interval 50
//! --election-timeout 500`: elections take a fraction of a second, and the minimum lease
//! TTL (1.5 election timeouts rounded up to a second) is 1 s. A missing binary is an error
//! that says how to install it, never a silent skip. Every wait here is bounded in time and
//! in count; a server is killed and reaped when dropped.

mod certs;
mod port;
mod server;

pub use certs::{make_tls, TlsFiles};
pub use port::ReservedPort;
pub use server::{EtcdCluster, EtcdServer, ETCD_BIN_ENV, HEALTH_WAIT};
