//! `[replication]`: `ReplicationConfig`, this node's role (primary, standby), where it
//! listens or follows, how an answer waits for a standby (`Ack`, `StandbyLost`), re-seeding
//! (`Reseed`) and the TLS files. docs/replication.md.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[replication]`: this node's role and how results wait for a standby.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationConfig {
    /// A primary accepts standbys here (e.g. "127.0.0.1:7400").
    pub listen: Option<String>,
    /// A standby follows the primary at this address (`roost serve --follow` sets it). A node
    /// with `follow` set keeps its spool closed until `roost promote`.
    pub follow: Option<String>,
    /// When a result is published: `local` (the claim is durable here; today's behaviour,
    /// the default) or `standby` (also durable on a standby in sync).
    pub ack: Ack,
    /// A standby that has not fetched for this long is out of sync.
    pub standby_timeout_ms: u64,
    /// With `ack = "standby"` and no standby in sync: `wait` (results wait until a standby
    /// is back; nothing published can be lost with one node) or `alone` (publish on local
    /// durability and say so; the batches published alone are lost if this node is lost
    /// before a standby has them).
    pub when_standby_lost: StandbyLost,
    /// This node's name in the primary's status and logs [default: the host name].
    pub name: Option<String>,
    /// 1-255, different on every node: the low byte of every epoch this node mints, so two
    /// nodes promoted without hearing of each other never mint the same epoch [default:
    /// derived from `name`; set it when names could collide].
    pub node_id: Option<u8>,
    /// A standby behind what its primary retains: `auto` (the default) fetches a base
    /// backup of the primary's last checkpoint at start-up and follows from there (what it
    /// held is replaced); `manual` stops with exit 78 and the manual procedure.
    pub reseed: Reseed,
    /// This node's certificate chain (PEM, leaf first): mutual TLS on every replication
    /// connection when `tls_cert`, `tls_key` and `tls_ca` are set (all three or none).
    pub tls_cert: Option<PathBuf>,
    /// The leaf's private key (PEM: PKCS#8, SEC1 or PKCS#1).
    pub tls_key: Option<PathBuf>,
    /// The cluster CA (PEM): a peer's certificate must chain to it.
    pub tls_ca: Option<PathBuf>,
    /// The nodes that may speak replication (each a DNS name its certificate carries as a
    /// SAN): a fetch's replica name must be one, and under TLS the peer's certificate must
    /// be valid for it. Required with TLS; must hold `name` when set.
    pub members: Vec<String>,
    /// Plain TCP, nothing authenticated: needed for `listen` or `follow` on an address that
    /// is not loopback without TLS. Logged at every start and shown in `status`.
    pub insecure: bool,
    /// How long a TLS handshake may take before the connection is closed.
    pub handshake_timeout_ms: u64,
    /// Replication connections from one IP address at once (the rest are closed at accept).
    pub connections_per_address_max: usize,
}

/// Whether HOST:PORT names a loopback address: an IP literal that is loopback, or
/// `localhost`. Any other name counts as reachable from elsewhere.
fn is_loopback(addr: &str) -> bool {
    if let Ok(sa) = addr.parse::<std::net::SocketAddr>() {
        return sa.ip().is_loopback();
    }
    addr.rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

/// See [`ReplicationConfig::reseed`].
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Reseed {
    #[default]
    Auto,
    Manual,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            listen: None,
            follow: None,
            ack: Ack::Local,
            standby_timeout_ms: 10_000,
            when_standby_lost: StandbyLost::Wait,
            name: None,
            node_id: None,
            reseed: Reseed::Auto,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            members: Vec::new(),
            insecure: false,
            handshake_timeout_ms: 5_000,
            connections_per_address_max: 8,
        }
    }
}

/// See [`ReplicationConfig::ack`].
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Ack {
    #[default]
    Local,
    Standby,
}

/// See [`ReplicationConfig::when_standby_lost`].
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StandbyLost {
    #[default]
    Wait,
    Alone,
}

impl ReplicationConfig {
    /// Whether this node starts as a standby.
    pub fn is_standby(&self) -> bool {
        self.follow.is_some()
    }

    /// Whether this node takes part in replication at all (epochs then advance per start).
    pub fn enabled(&self) -> bool {
        self.listen.is_some() || self.follow.is_some()
    }

    pub fn standby_timeout(&self) -> Duration {
        Duration::from_millis(self.standby_timeout_ms.max(100))
    }

    /// The low byte of the epochs this node mints (see [`ReplicationConfig::node_id`]).
    pub fn node_id(&self) -> u32 {
        match self.node_id {
            Some(id) => u32::from(id),
            None => crc32fast::hash(self.node_name().as_bytes()) % 255 + 1,
        }
    }

    /// Whether replication runs over mutual TLS (all three files set).
    pub fn tls(&self) -> bool {
        self.tls_cert.is_some()
    }

    /// TLS all or nothing; members with TLS, holding this node's name; plain TCP on a
    /// non-loopback address only with `insecure`.
    pub(super) fn validate_security(&self) -> Result<(), ConfigError> {
        let set = [&self.tls_cert, &self.tls_key, &self.tls_ca];
        let n = set.iter().filter(|p| p.is_some()).count();
        if n != 0 && n != 3 {
            return Err(ConfigError::Invalid(
                "replication.tls_cert, tls_key and tls_ca go together: set all three or none"
                    .into(),
            ));
        }
        if self.tls() && self.members.is_empty() {
            return Err(ConfigError::Invalid(
                "replication with TLS needs replication.members (the names a peer's certificate may carry)".into(),
            ));
        }
        let name = self.node_name();
        if !self.members.is_empty() && self.enabled() && !self.members.contains(&name) {
            return Err(ConfigError::Invalid(format!(
                "replication.members {:?} does not hold this node's name {name:?} (replication.name)",
                self.members
            )));
        }
        if self.handshake_timeout_ms == 0 || self.connections_per_address_max == 0 {
            return Err(ConfigError::Invalid(
                "replication.handshake_timeout_ms and connections_per_address_max must be above 0"
                    .into(),
            ));
        }
        self.validate_plain()
    }

    fn validate_plain(&self) -> Result<(), ConfigError> {
        if self.tls() || self.insecure {
            return Ok(());
        }
        for (key, addr) in [("listen", &self.listen), ("follow", &self.follow)] {
            match addr {
                Some(a) if !is_loopback(a) => {
                    return Err(ConfigError::Invalid(format!(
                        "replication.{key} = {a:?} is not a loopback address and replication has no TLS: anyone who reaches it could acknowledge, fence or read; set tls_cert, tls_key, tls_ca and members (roost certs makes them), or insecure = true to accept that"
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether this node runs replication without authentication (no TLS).
    pub fn unauthenticated(&self) -> bool {
        self.enabled() && !self.tls()
    }

    /// The name this node gives itself when it fetches.
    pub fn node_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        })
    }
}
