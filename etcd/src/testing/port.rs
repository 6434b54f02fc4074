//! A loopback port held for a process that listens on it later, and again after every
//! restart: [`ReservedPort`].
//!
//! Picking a port by binding `127.0.0.1:0` and letting it go leaves it free until the
//! daemon binds it, and free again each time a drill kills that daemon. In that window the
//! kernel may hand it to another process's bind to port 0 (other tests and etcd test
//! servers pick theirs that way, from the same part of the range), or to an outgoing
//! connection once the part of the range connections prefer runs short; the restarted
//! daemon then cannot bind. A [`ReservedPort`] is a socket bound with `SO_REUSEADDR` that
//! never listens, held as long as the port is meant for the daemon:
//! - the kernel's own picks skip it: another bind to port 0 (an automatic pick shares no
//!   port with a bound socket on the same address, unless `net.ipv4.ip_autobind_reuse` is
//!   set and the range is exhausted) and an outgoing connection's port (never shared with
//!   a port that `bind` holds);
//! - a listener that sets `SO_REUSEADDR` too binds it all the same, as Rust's std, tokio
//!   and Go's `net.Listen` do, since no socket listens there; connections reach that
//!   listener, and after a kill the port binds again over its accepted connections'
//!   TIME_WAIT entries (they carry the listener's `SO_REUSEADDR`).
//!
//! The socket is close-on-exec, so no daemon started meanwhile holds it after it is dropped.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;

use rustix::net::{
    bind, getsockname, socket_with, sockopt, AddressFamily, SocketFlags, SocketType,
};

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
        let s = tcp_socket()?;
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

/// A new IPv4 TCP socket, close-on-exec.
fn tcp_socket() -> io::Result<OwnedFd> {
    Ok(socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bind to `port` without `SO_REUSEADDR`: refused while any socket holds the port.
    fn plain_bind(port: u16) -> io::Result<OwnedFd> {
        let s = tcp_socket()?;
        bind(&s, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))?;
        Ok(s)
    }

    /// A reserved port is held from a bind that does not share it, before the daemon's
    /// listener binds it and after that listener is gone (the daemon killed); the listener
    /// binds it, a connection reaches it, and a new one binds it again after a kill.
    #[test]
    fn a_listener_binds_a_reserved_port_and_the_port_stays_held_between_runs() {
        let r = ReservedPort::new().unwrap();
        let held = |when: &str| {
            let err = plain_bind(r.port()).expect_err(when);
            assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{when}: {err}");
        };
        held("bound by another before the daemon");
        drop(std::net::TcpListener::bind(("127.0.0.1", r.port())).unwrap());
        held("bound by another between the daemon's runs");
        let l = std::net::TcpListener::bind(("127.0.0.1", r.port())).unwrap();
        let c = std::net::TcpStream::connect(("127.0.0.1", r.port())).unwrap();
        let (accepted, _) = l.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), c.local_addr().unwrap());
        drop((l, accepted, c));
        std::net::TcpListener::bind(("127.0.0.1", r.port())).unwrap();
    }

    /// While a port is reserved, no automatic bind gets it: 500 picks (each let go at
    /// once), none on one of 256 reserved ports. Released at once instead, about 18 of the
    /// picks would land on one: a bind to port 0 with `SO_REUSEADDR`, as std's, picks from
    /// about 7,000 ports of the default range.
    #[test]
    fn an_automatic_bind_skips_a_reserved_port() {
        let held: Vec<ReservedPort> = (0..256).map(|_| ReservedPort::new().unwrap()).collect();
        let reserved: std::collections::HashSet<u16> = held.iter().map(|r| r.port()).collect();
        assert_eq!(reserved.len(), held.len(), "two reservations share a port");
        for _ in 0..500 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let p = l.local_addr().unwrap().port();
            assert!(
                !reserved.contains(&p),
                "an automatic bind took reserved port {p}"
            );
        }
    }

    /// A daemon started while a reservation lives does not inherit it.
    #[test]
    fn a_reservation_is_close_on_exec() {
        let r = ReservedPort::new().unwrap();
        let flags = rustix::io::fcntl_getfd(&r._socket).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    }
}
