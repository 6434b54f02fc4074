//! turmoil's sockets behind roost-replication's network seams (`Dial` for the follower's
//! connections, `Listen` for the leader's server), so the protocol's real code runs over
//! the simulated network.

use std::net::SocketAddr;

use roost_replication::{Dial, Io, IoFuture, Listen};

/// Connects through turmoil (`HOST:PORT`, a simulated host's name).
pub struct SimDial;

impl Dial for SimDial {
    fn dial<'a>(&'a self, addr: &'a str) -> IoFuture<'a, Box<dyn Io>> {
        Box::pin(async move {
            let s = turmoil::net::TcpStream::connect(addr).await?;
            Ok(Box::new(s) as Box<dyn Io>)
        })
    }
}

/// Accepts through turmoil.
pub struct SimListen(pub turmoil::net::TcpListener);

impl Listen for SimListen {
    fn accept(&mut self) -> IoFuture<'_, (Box<dyn Io>, SocketAddr)> {
        Box::pin(async move {
            let (s, addr) = self.0.accept().await?;
            Ok((Box::new(s) as Box<dyn Io>, addr))
        })
    }
}
