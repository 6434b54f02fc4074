//! `roost-etcd`: an async etcd v3 client that speaks etcd's JSON gateway (`POST /v3/kv/range`,
//! `/v3/kv/put`, `/v3/kv/txn`, `/v3/kv/deleterange`, `/v3/lease/*`) instead of gRPC, because
//! the `etcd-client` crate needs `protoc` at build time and the default build must not. roost
//! elects its cluster leader through it (docs/cluster.md). It owns only what an
//! election needs: single-key reads and writes, a bounded prefix read, transactions with
//! compares, and leases; no watches (a watch is a long-lived stream; the daemon polls).
//!
//! HTTP/1.1 framing is hyper's client connection (`hyper::client::conn::http1`) over a TCP
//! or rustls stream we open ourselves: one connection per call, which keeps every call
//! bounded and independent (no pool whose dead connections a failover must notice). Every
//! call has a timeout, split between the endpoints so that one member that is down or
//! stopped cannot eat the whole budget, and a response body is capped
//! ([`RESPONSE_BYTES_MAX`]) before it is buffered. `testing` runs real etcd processes
//! (one, a cluster, with mutual TLS) for this crate's tests and the daemon's.
//!
//! The gateway's JSON is proto3 JSON: int64 fields are strings (`"revision":"5"`) and a
//! field holding its default value is absent (`succeeded` absent is false, `kvs` absent is
//! no keys, a `value` absent is empty, `lease` absent is 0). `wire` decodes both forms.
//!
//! The crate depends on no other roost crate.
#![forbid(unsafe_code)]

mod calls;
mod client;
mod endpoint;
mod error;
mod http;
mod tls;
mod types;
mod wire;

pub mod testing;

pub use calls::{decode_answer, PREFIX_KVS_MAX};
pub use client::{Etcd, EtcdOptions, ATTEMPT_MIN, ENDPOINTS_MAX, ROUNDS_MAX};
pub use error::EtcdError;
pub use http::RESPONSE_BYTES_MAX;
pub use tls::EtcdTls;
pub use types::{CmpOp, Compare, Kv, Lease, Op, OpResponse, Txn, TxnResponse};
