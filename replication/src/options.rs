//! [`LeaderOptions`]: the leader's limits, read by the server (`serve.rs`) and by the
//! admission of connections before their handshake (`admit.rs`).

use std::time::Duration;

use crate::transport::Transport;
use crate::wire::DEFAULT_FRAME_BYTES_MAX;

/// The leader's limits.
#[derive(Clone, Debug)]
pub struct LeaderOptions {
    /// The largest frame read or written (the follower's must match or exceed it).
    pub frame_bytes_max: u32,
    /// How long a connection may stay silent before the next `Fetch`.
    pub idle_timeout: Duration,
    /// How long writing one answer may take.
    pub write_timeout: Duration,
    /// The longest long-poll, whatever the fetch's `wait_ms` asks.
    pub wait_max: Duration,
    /// Connections served at once; more are closed at accept.
    pub connections_max: usize,
    /// Connections from one IP address (an IPv6 /64) at once, handshaking or served; more
    /// are closed at accept, so one host cannot take every place.
    pub connections_per_address_max: usize,
    /// Connections in their TLS handshake at once (not yet authenticated); more are closed
    /// at accept, so strangers leave the other places to members.
    pub handshakes_max: usize,
    /// How connections are accepted and who may speak (mutual TLS, or plain TCP).
    pub transport: Transport,
}

impl Default for LeaderOptions {
    fn default() -> Self {
        LeaderOptions {
            frame_bytes_max: DEFAULT_FRAME_BYTES_MAX,
            idle_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(10),
            wait_max: Duration::from_secs(10),
            connections_max: 64,
            connections_per_address_max: 8,
            handshakes_max: 16,
            transport: Transport::plain(Vec::new()),
        }
    }
}
