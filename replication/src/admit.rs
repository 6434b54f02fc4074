//! Who gets a place on the leader before authenticating (issue 26): all connections
//! together within `connections_max`, those still in their handshake within
//! `handshakes_max` (so strangers cannot take the places members need), and one address
//! within `connections_per_address_max` (IPv6 counted per /64, what one host can hold).
//! Refusals and failed handshakes are logged at most once a second, with the count left out.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::warn;

use crate::options::LeaderOptions;

/// The leader's count of places.
pub(crate) struct Admission {
    per_address: Mutex<HashMap<IpAddr, usize>>,
    handshaking: AtomicUsize,
    started: Instant,
    /// Milliseconds since `started` of the last refusal logged; refusals not logged since.
    last_logged_ms: AtomicU64,
    unlogged: AtomicU64,
}

/// One connection's place, given back when it ends (its handshake's place at
/// `authenticated`, or then).
pub(crate) struct Place {
    admission: Arc<Admission>,
    key: IpAddr,
    handshaking: bool,
}

impl Admission {
    pub(crate) fn new() -> Arc<Admission> {
        Arc::new(Admission {
            per_address: Mutex::new(HashMap::new()),
            handshaking: AtomicUsize::new(0),
            started: Instant::now(),
            last_logged_ms: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
        })
    }

    /// A place for a connection from `peer` while `open` connections are served, or `None`
    /// (the connection is closed at once, before any handshake).
    pub(crate) fn admit(
        self: &Arc<Self>,
        open: usize,
        peer: SocketAddr,
        opts: &LeaderOptions,
    ) -> Option<Place> {
        let handshaking = self.handshaking.load(Ordering::SeqCst);
        let refuse = if open >= opts.connections_max {
            Some(("too many replication connections", opts.connections_max))
        } else if handshaking >= opts.handshakes_max {
            Some((
                "too many replication connections in their handshake",
                opts.handshakes_max,
            ))
        } else {
            None
        };
        if let Some((why, max)) = refuse {
            self.log(|n| warn!(%peer, max, also_refused = n, "{why}: closed"));
            return None;
        }
        let key = address_key(peer.ip());
        let mut m = self.per_address.lock().ok()?;
        let n = m.entry(key).or_insert(0);
        if *n >= opts.connections_per_address_max {
            let max = opts.connections_per_address_max;
            self.log(|n| warn!(%peer, max, also_refused = n, "too many replication connections from this address: closed"));
            return None;
        }
        *n += 1;
        self.handshaking.fetch_add(1, Ordering::SeqCst);
        let admission = Arc::clone(self);
        Some(Place {
            admission,
            key,
            handshaking: true,
        })
    }

    /// Calls `say` with the number of refusals not logged since, at most once a second.
    pub(crate) fn log(&self, say: impl FnOnce(u64)) {
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.last_logged_ms.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= 1000;
        if due
            && self
                .last_logged_ms
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            say(self.unlogged.swap(0, Ordering::Relaxed));
        } else {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Place {
    pub(crate) fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// The handshake is over: its place among the handshaking is free.
    pub(crate) fn handshake_done(&mut self) {
        if std::mem::take(&mut self.handshaking) {
            self.admission.handshaking.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.handshake_done();
        if let Ok(mut m) = self.admission.per_address.lock() {
            if let Some(n) = m.get_mut(&self.key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&self.key);
                }
            }
        }
    }
}

/// The key an address is counted under: an IPv4 address, or an IPv6 address's /64 (one
/// host is usually given a whole /64).
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(bits))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_counts_per_64_and_v4_mapped_as_v4() {
        let a: IpAddr = "2001:db8::1".parse().expect("v6");
        let b: IpAddr = "2001:db8::ffff:1".parse().expect("v6");
        let c: IpAddr = "2001:db8:0:1::1".parse().expect("v6");
        assert_eq!(address_key(a), address_key(b));
        assert_ne!(address_key(a), address_key(c));
        let m: IpAddr = "::ffff:10.0.0.1".parse().expect("mapped");
        assert_eq!(address_key(m), "10.0.0.1".parse::<IpAddr>().expect("v4"));
    }
}
