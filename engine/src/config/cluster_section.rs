//! `[cluster]` (issue 27, docs/cluster.md): automatic failover through etcd. Without it roost
//! runs as before (one node, or a standby by hand).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The shortest lease: etcd grants whole seconds, and one second is its floor with a
/// tuned election timeout (`docs/cluster.md`).
pub const LEASE_MS_MIN: u64 = 1_000;
/// The longest lease roost takes.
pub const LEASE_MS_MAX: u64 = 60_000;

/// `[cluster]`: where etcd is, who this node is, how long its leadership lease lasts.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd's client URLs (`http://HOST:PORT`, or `https://` with `etcd_ca`, `etcd_cert`
    /// and `etcd_key`).
    pub etcd: Vec<String>,
    /// This node's name in the cluster [default: `replication.name`, else the host name];
    /// it is also its replication name, which `replication.members` must hold.
    #[serde(default)]
    pub name: Option<String>,
    /// This node's replication address as the other nodes reach it (HOST:PORT): where they
    /// fetch from and forward batches to while it leads.
    pub advertise: String,
    /// The leadership lease: a leader that could not renew it for `lease_ms` minus the
    /// fencing margin (a quarter of it) stops answering; another node may win once it
    /// expired in etcd. [default: 3000]
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// Where the cluster's keys live in etcd; several clusters may share one etcd under
    /// different prefixes. [default: "/roost/default"]
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// etcd's CA (PEM), for `https://` endpoints.
    #[serde(default)]
    pub etcd_ca: Option<PathBuf>,
    /// This node's client certificate for etcd (PEM), for `--client-cert-auth`.
    #[serde(default)]
    pub etcd_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(default)]
    pub etcd_key: Option<PathBuf>,
}

fn default_lease_ms() -> u64 {
    3_000
}

fn default_prefix() -> String {
    "/roost/default".into()
}

impl ClusterConfig {
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    /// How long before the lease could expire in etcd a leader stops answering: a quarter
    /// of the lease (clock-rate differences and one renewal's trip, `docs/cluster.md`).
    pub fn margin(&self) -> Duration {
        Duration::from_millis(self.lease_ms / 4)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.etcd.is_empty() {
            return bad("cluster.etcd needs at least one etcd client URL".into());
        }
        for url in &self.etcd {
            let tls = url.starts_with("https://");
            if !(tls || url.starts_with("http://")) {
                return bad(format!(
                    "cluster.etcd: {url:?} is not an http:// or https:// URL"
                ));
            }
            if tls != self.etcd_ca.is_some() {
                return bad(format!("cluster.etcd: {url:?}: https:// endpoints need cluster.etcd_ca, etcd_cert and etcd_key (and http:// ones none): all endpoints alike"));
            }
        }
        let set = [&self.etcd_ca, &self.etcd_cert, &self.etcd_key];
        let n = set.iter().filter(|p| p.is_some()).count();
        if n != 0 && n != 3 {
            return bad(
                "cluster.etcd_ca, etcd_cert and etcd_key go together: set all three or none".into(),
            );
        }
        if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&self.lease_ms) {
            return bad(format!(
                "cluster.lease_ms = {} is outside {LEASE_MS_MIN}..={LEASE_MS_MAX}",
                self.lease_ms
            ));
        }
        if self.advertise.is_empty() || !self.advertise.contains(':') {
            return bad(format!(
                "cluster.advertise = {:?} is not HOST:PORT",
                self.advertise
            ));
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') {
            return bad(format!(
                "cluster.prefix = {:?} must start with / and not end with one",
                self.prefix
            ));
        }
        Ok(())
    }
}
