//! The cluster drill's partitions (and the replication tests'): a TCP proxy on loopback in front of a node's replication
//! port (what the other nodes reach it by) or in front of etcd (what one node reaches etcd
//! by). `cut` closes every connection through it and refuses new ones until `heal`.
//! Each connection's sockets are dropped when both directions end, so a long drill (etcd
//! calls make a connection each) holds only the connections open now. `start_delayed` holds
//! every byte for a fixed time each way (the drill's `--delay-ms`: netem's delay, which this
//! kernel cannot give, made in user space), pipelined: a chunk waits only for its own time.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Open = Arc<Mutex<HashMap<u64, [TcpStream; 2]>>>;

pub struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    open: Open,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// A proxy to `target` (HOST:PORT) on a free loopback port.
    pub fn start(target: String) -> io::Result<Proxy> {
        Proxy::start_delayed(target, Duration::ZERO)
    }

    /// A proxy that delivers every chunk `delay` after it read it, each way.
    pub fn start_delayed(target: String, delay: Duration) -> io::Result<Proxy> {
        let l = TcpListener::bind("127.0.0.1:0")?;
        l.set_nonblocking(true)?;
        let port = l.local_addr()?.port();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Open = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (c, o, s) = (cut.clone(), open.clone(), stop.clone());
        std::thread::spawn(move || {
            let ids = AtomicU64::new(0);
            while !s.load(Ordering::SeqCst) {
                match l.accept() {
                    Ok((down, _)) if !c.load(Ordering::SeqCst) => {
                        let id = ids.fetch_add(1, Ordering::Relaxed);
                        let _ = pipe(id, down, &target, &o, delay);
                    }
                    Ok(_) => {} // cut: dropped at once
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(Proxy {
            port,
            cut,
            open,
            stop,
        })
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Closes every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        let conns: Vec<[TcpStream; 2]> = match self.open.lock() {
            Ok(mut m) => m.drain().map(|(_, c)| c).collect(),
            Err(_) => return,
        };
        for [a, b] in conns {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
    }
}

/// Connects `down` to `target` with a copying thread each way; the pair leaves `open` when
/// both have ended.
fn pipe(id: u64, down: TcpStream, target: &str, open: &Open, delay: Duration) -> io::Result<()> {
    let up = TcpStream::connect_timeout(
        &target
            .parse()
            .map_err(|_| io::Error::other(format!("proxy target {target:?}")))?,
        Duration::from_secs(2),
    )?;
    down.set_nonblocking(false)?;
    if let Ok(mut m) = open.lock() {
        m.insert(id, [down.try_clone()?, up.try_clone()?]);
    }
    let left = Arc::new(AtomicUsize::new(2));
    for (mut r, mut w) in [
        (down.try_clone()?, up.try_clone()?),
        (up.try_clone()?, down.try_clone()?),
    ] {
        let (left, open) = (left.clone(), open.clone());
        std::thread::spawn(move || {
            let _ = match delay.is_zero() {
                true => io::copy(&mut r, &mut w).map(drop),
                false => copy_delayed(&mut r, &mut w, delay),
            };
            let _ = w.shutdown(Shutdown::Both);
            let _ = r.shutdown(Shutdown::Both);
            if left.fetch_sub(1, Ordering::SeqCst) == 1 {
                if let Ok(mut m) = open.lock() {
                    m.remove(&id);
                }
            }
        });
    }
    Ok(())
}

/// Copies `r` to `w`, each chunk written `delay` after it was read: a reader thread stamps
/// the chunks, this one writes each at its time (so chunks in flight overlap, as on a long
/// link). Ends when `r` ends or `w` fails.
fn copy_delayed(r: &mut TcpStream, w: &mut TcpStream, delay: Duration) -> io::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    let mut reader = r.try_clone()?;
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match io::Read::read(&mut reader, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let at = std::time::Instant::now() + delay;
                    if tx.send((at, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    for (at, chunk) in rx {
        std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
        io::Write::write_all(w, &chunk)?;
    }
    Ok(())
}
