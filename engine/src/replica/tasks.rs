//! The replication tasks beside the serve loop (docs/replication.md): the primary's listener
//! for standbys (`[replication] listen`, also started on a standby, which answers "not the
//! leader" until it is promoted), and a standby's follower, which stops when the node is
//! promoted. A follower failure while still a standby stops the daemon with its class.
//! The serve loop hands in what they need of it ([`Host`]); they know nothing else of it.

use std::sync::Arc;

use std::time::Duration;

use roost_replication::{
    Announced, FollowError, FollowerOptions, FollowerStatus, LeaderOptions, Transport,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use super::{FollowerSide, LeaderSide};
use crate::error::EngineError;
use crate::pipeline::{Engine, Role};

/// What the replication tasks need from the serve loop that runs them.
#[derive(Clone)]
pub struct Host {
    pub engine: Arc<Engine>,
    pub repl: Arc<super::Replication>,
    /// A cluster node: a follower that ends for another reason than its own log rejoins
    /// (this life ends, the process goes on) rather than stopping the daemon.
    pub clustered: bool,
    /// Told once when the follower ends this life: to rejoin, or to stop with the error.
    pub ended: Arc<dyn Fn(FollowerEnd) + Send + Sync>,
}

/// How a standby's follower ended this life.
pub enum FollowerEnd {
    /// A cluster standby starts again as a follower (it may have to cut or re-seed first).
    Rejoin,
    /// The daemon stops with this error's class.
    Fatal(EngineError),
}

pub struct ReplTasks {
    host: Host,
    stop: watch::Sender<bool>,
    stop_follower: watch::Sender<bool>,
    listener: Option<JoinHandle<()>>,
    follower: Option<JoinHandle<()>>,
    /// The follower's own view (connection, leader epoch), copied into the engine's status.
    pub status: Arc<FollowerStatus>,
    /// How every replication connection is made (mutual TLS or plain TCP).
    transport: Transport,
}

impl ReplTasks {
    /// Binds the listener (a bind failure stops the start: the operator named the address)
    /// and starts following when this node is a standby.
    pub async fn start(host: Host) -> Result<ReplTasks, EngineError> {
        let (stop, stop_rx) = watch::channel(false);
        let (stop_follower, follower_rx) = watch::channel(false);
        let cfg = host.engine.config().replication.clone();
        let transport = super::transport::transport(&cfg)?;
        say_security(&cfg, &transport);
        let status = Arc::new(FollowerStatus::default());
        let listener = match &cfg.listen {
            None => None,
            Some(addr) => {
                let l = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| EngineError::Io {
                        op: "listen for standbys",
                        path: addr.into(),
                        source,
                    })?;
                info!(listen = %addr, "replication: accepting standbys");
                let log = Arc::new(LeaderSide {
                    engine: host.engine.clone(),
                    repl: host.repl.clone(),
                });
                let opts = LeaderOptions {
                    connections_per_address_max: cfg.connections_per_address_max,
                    transport: transport.clone(),
                    ..LeaderOptions::default()
                };
                Some(tokio::spawn(roost_replication::serve_followers(
                    l, log, opts, stop_rx,
                )))
            }
        };
        let follower = match (&cfg.follow, host.engine.role()) {
            (Some(addr), Role::Standby) => Some(tokio::spawn(run_follower(
                host.clone(),
                (addr.clone(), transport.clone()),
                status.clone(),
                follower_rx,
            ))),
            _ => None,
        };
        Ok(ReplTasks {
            host,
            stop,
            stop_follower,
            listener,
            follower,
            status,
            transport,
        })
    }

    /// A cluster standby follows `addr` (etcd named it the leader): the follower of the
    /// previous leader stops first (at most 5 s), so one follower appends at a time.
    pub async fn follow_at(&mut self, addr: String) {
        let _ = self.stop_follower.send(true);
        if let Some(h) = self.follower.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), h).await;
        }
        let (tx, rx) = watch::channel(false);
        self.stop_follower = tx;
        let to = (addr, self.transport.clone());
        let status = self.status.clone();
        let host = self.host.clone();
        self.follower = Some(tokio::spawn(run_follower(host, to, status, rx)));
    }

    /// The node was promoted: it follows no one from now on, and tells its former primary
    /// (if that one still runs, it steps down: `roost_replication::announce_epoch`).
    pub fn promoted(&mut self) {
        let _ = self.stop_follower.send(true);
        self.follower = None;
        let cfg = &self.host.engine.config().replication;
        if let Some(addr) = cfg.follow.clone() {
            let (name, epoch) = (cfg.node_name(), self.host.repl.epoch());
            let to = (self.transport.clone(), addr);
            tokio::spawn(announce(to, name, epoch, self.stop.subscribe()));
        }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.stop_follower.send(true);
        for h in [self.listener, self.follower].into_iter().flatten() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), h).await;
        }
    }
}

/// Says at every start how replication connections are secured; plain TCP loudly, since
/// then anyone who reaches the port may acknowledge, fence and read.
fn say_security(cfg: &crate::config::ReplicationConfig, transport: &Transport) {
    if !cfg.enabled() {
        return;
    }
    if transport.is_tls() {
        info!(members = ?cfg.members, "replication: mutual TLS; only members' certificates are accepted");
        return;
    }
    warn!(
        insecure = cfg.insecure,
        listen = ?cfg.listen,
        follow = ?cfg.follow,
        "REPLICATION IS NOT AUTHENTICATED: plain TCP; anyone who can reach the replication port can acknowledge batches for a standby, make this node step down, and read every record (set tls_cert, tls_key, tls_ca and members; docs/replication.md)"
    );
}

/// How often, and how many times, a promoted node tells its former primary.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);
const ANNOUNCE_TRIES: u32 = 600;
const ANNOUNCE_LATER: Duration = Duration::from_secs(30);

/// Tells the former primary at `addr` about `epoch` until it answers (or the daemon stops,
/// or [`ANNOUNCE_TRIES`] attempts failed: then nobody is listening there).
async fn announce(
    (transport, addr): (Transport, String),
    name: String,
    epoch: u32,
    mut stop: watch::Receiver<bool>,
) {
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        let said =
            roost_replication::announce_epoch(&transport, &addr, &name, epoch, ANNOUNCE_EVERY);
        match said.await {
            Ok(Announced::SteppedDown { its_epoch }) => {
                info!(former_primary = %addr, its_epoch, epoch, "the former primary stepped down");
                return;
            }
            Ok(Announced::NotLeading) => {
                info!(former_primary = %addr, epoch, "the former primary leads nothing");
                return;
            }
            Err(e) if attempt == 1 => {
                info!(former_primary = %addr, error = %e, "cannot tell the former primary yet; retrying")
            }
            Err(_) => {}
        }
        // Every second at first, then every 30 s for as long as this node runs: a former
        // primary restarted much later must still hear of the new epoch.
        let pause = if attempt < ANNOUNCE_TRIES {
            ANNOUNCE_EVERY
        } else {
            ANNOUNCE_LATER
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Follows until stopped or promoted; any other end stops the daemon.
async fn run_follower(
    host: Host,
    (addr, transport): (String, Transport),
    status: Arc<FollowerStatus>,
    stop: watch::Receiver<bool>,
) {
    let engine = host.engine.clone();
    host.repl.update_follow_status(|f| f.leader = addr.clone());
    let log = Arc::new(FollowerSide {
        engine: engine.clone(),
        repl: host.repl.clone(),
    });
    let opts = FollowerOptions {
        truncate_allowed: false,
        transport,
        ..FollowerOptions::new(engine.config().replication.node_name())
    };
    let repointed = stop.clone();
    let r = roost_replication::follow(addr.clone(), log, opts, stop, status).await;
    if engine.role() != Role::Standby {
        return; // promoted: the follower's end is expected
    }
    if host.clustered && !matches!(r, Ok(_) | Err(FollowError::Log { .. })) {
        // A cluster standby cuts, re-seeds or adopts what it must at a new start as a
        // follower of whoever leads then: this life ends, the process goes on.
        if *repointed.borrow() {
            return; // re-pointed to another leader meanwhile
        }
        if let Err(e) = &r {
            warn!(leader = %addr, error = %e, "cluster: the follower must start again; rejoining");
        }
        (host.ended)(FollowerEnd::Rejoin);
        return;
    }
    let e = match r {
        Ok(_) => return,
        Err(FollowError::Log { source, .. }) => source,
        Err(e @ FollowError::NeedsReseed { .. }) => super::behind(engine.config(), e.to_string()),
        Err(e @ FollowError::StaleLeader { .. }) => EngineError::StaleLeader(e.to_string()),
        Err(other) => EngineError::Replication(format!("following {addr}: {other}")),
    };
    error!(error = %e, "replication: the standby stops");
    (host.ended)(FollowerEnd::Fatal(e));
}
