//! A loopback port held for a process that listens on it later, and again after every
//! restart: [`ReservedPort`].
//!
//! Picking a port by binding `127.0.0.1:0` and letting it go leaves it free until the
//! daemon binds it, and free again each time a drill kills that daemon. In that window the
//! kernel may hand it to any outgoing connection (etcd calls open one per call, and their
//! TIME_WAIT entries hold the port for a minute), and the restarted daemon then cannot
//! bind. A [`ReservedPort`] is a socket bound with `SO_REUSEADDR` that never listens, held
//! as long as the port is meant for the daemon:
//! - the kernel's own picks skip it: an outgoing connection's port (a port bound by
//!   `bind` is never shared with one) and another `bind` to port 0 (an automatic pick
//!   never shares a port with a bound socket);
//! - a listener that sets `SO_REUSEADDR` too binds it all the same, as Rust's std, tokio
//!   and Go's `net.Listen` do, since no socket listens there.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;

use rustix::net::{bind, getsockname, socket, sockopt, AddressFamily, SocketType};

/// A loopback TCP port kept from the kernel's automatic picks while this lives (see the
/// module's comment). Dropping it lets the port go.
#[derive(Debug)]
pub struct ReservedPort {
    /// Bound, never listening; only its being open matters.
    _socket: OwnedFd,
    port: u16,
}

impl ReservedPort {
    /// A port the kernel picks among those no socket holds, reserved from now on.
    pub fn new() -> io::Result<ReservedPort> {
        let s = socket(AddressFamily::INET, SocketType::STREAM, None)?;
        sockopt::set_socket_reuseaddr(&s, true)?;
        bind(&s, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
        let addr = SocketAddr::try_from(getsockname(&s)?)
            .map_err(|_| io::Error::other("a reserved socket has no IP address"))?;
        Ok(ReservedPort {
            _socket: s,
            port: addr.port(),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's listener binds the reserved port, a connection reaches it, and after
    /// the listener is gone (the daemon killed) a new one binds it again.
    #[test]
    fn a_listener_binds_a_reserved_port() {
        let r = ReservedPort::new().unwrap();
        let l = std::net::TcpListener::bind(("127.0.0.1", r.port())).unwrap();
        let c = std::net::TcpStream::connect(("127.0.0.1", r.port())).unwrap();
        let (accepted, _) = l.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), c.local_addr().unwrap());
        drop((l, accepted, c));
        std::net::TcpListener::bind(("127.0.0.1", r.port())).unwrap();
    }

    /// While a port is reserved, neither an automatic bind nor an outgoing connection gets
    /// it: 1,000 of those picks, none on one of 256 reserved ports (with the reservation
    /// let go at once, about 9 of them would be expected to land on one).
    #[test]
    fn the_kernels_own_picks_skip_a_reserved_port() {
        let held: Vec<ReservedPort> = (0..256).map(|_| ReservedPort::new().unwrap()).collect();
        let reserved: std::collections::HashSet<u16> = held.iter().map(|r| r.port()).collect();
        assert_eq!(reserved.len(), held.len(), "two reservations share a port");
        let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        for _ in 0..500 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let c = std::net::TcpStream::connect(target.local_addr().unwrap()).unwrap();
            let _accepted = target.accept().unwrap();
            for p in [
                l.local_addr().unwrap().port(),
                c.local_addr().unwrap().port(),
            ] {
                assert!(
                    !reserved.contains(&p),
                    "the kernel picked reserved port {p}"
                );
            }
        }
    }
}
