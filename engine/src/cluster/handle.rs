//! This node's cluster handle: the etcd client from `[cluster]`, the `Forwarder`, the view
//! the agent keeps for status and metrics, and `find_leader` before a life opens.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use roost_etcd::{Etcd, EtcdOptions, EtcdTls};
use roost_replication::Forwarder;
use tokio::sync::{watch, Notify};

use super::etcd_keys::{self, IsrValue, Keys, LeaderValue, MemberValue, SwitchoverValue};
use crate::config::{ClusterConfig, Config};
use crate::error::EngineError;

/// What this node knows of the cluster now (for the serve loop, forwarding and status).
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The leader etcd names, when it is another node.
    pub leader: Option<LeaderValue>,
    /// This node leads: the leader key's create revision (its election's transaction).
    pub leading_rev: Option<i64>,
    pub isr: Option<IsrValue>,
    pub members: Vec<MemberValue>,
    pub lease_id: i64,
    pub lease_ttl_secs: i64,
    /// While leading: when this node stops answering unless it renews first.
    pub fence_at: Option<Instant>,
    /// The last failure talking to etcd (cleared by the next success).
    pub etcd_error: Option<String>,
    /// The in-sync set last logged as not naming this node, while no node leads (a node that
    /// may not campaign says so once per set).
    pub refused_by: Option<IsrValue>,
    /// The switchover asked for, as last read (issue 42): a leader hands over to its
    /// target; the target campaigns at once; the others let it.
    pub switchover: Option<SwitchoverValue>,
}

impl View {
    /// While leading: how long this node may still answer without renewing (ms).
    pub fn lease_left_ms(&self) -> Option<u64> {
        self.fence_at.map(|t| {
            let left = t.saturating_duration_since(Instant::now());
            u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
        })
    }

    /// Leading: etcd named this node at the last renewal and the deadline has not passed
    /// (false at once after it, whether or not the agent has run since).
    pub fn leading(&self) -> bool {
        self.leading_rev.is_some() && self.lease_left_ms().is_some_and(|ms| ms > 0)
    }
}

/// The cluster side of one serving node.
pub struct Cluster {
    pub(super) cfg: ClusterConfig,
    pub(super) name: String,
    pub(super) keys: Keys,
    pub(super) etcd: Etcd,
    pub(super) standby_timeout: Duration,
    /// Forwards this standby's batches to the leader (mutual TLS, as fetches).
    pub forwarder: Forwarder,
    pub(super) view: Mutex<View>,
    /// The serve loop's wake-up: the leader changed, this node won or was fenced.
    pub(super) wake: Arc<Notify>,
    pub(super) stop: watch::Sender<bool>,
    pub elections_won: AtomicU64,
    pub fenced: AtomicU64,
}

impl Cluster {
    /// The cluster side of `cfg` (`None` without `[cluster]`): the etcd client (its TLS files
    /// read now: a bad one is a configuration error, exit 78) and the forwarder.
    pub fn new(cfg: &Config) -> Result<Option<Arc<Cluster>>, EngineError> {
        let Some(c) = cfg.cluster.clone() else {
            return Ok(None);
        };
        let etcd = etcd_client(&c)?;
        let transport = crate::replica::transport::transport(&cfg.replication)?;
        let name = cfg.replication.node_name();
        let forwarder = Forwarder::new(
            transport,
            name.clone(),
            roost_replication::wire::DEFAULT_FRAME_BYTES_MAX,
        );
        Ok(Some(Arc::new(Cluster {
            keys: Keys::new(&c.prefix),
            standby_timeout: cfg.replication.standby_timeout(),
            cfg: c,
            name,
            etcd,
            forwarder,
            view: Mutex::new(View::default()),
            wake: Arc::new(Notify::new()),
            stop: watch::channel(false).0,
            elections_won: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
        })))
    }

    /// Stops the agent; it revokes this node's lease on the way out (a leader's key goes at
    /// once, so a graceful stop fails over without waiting for the lease).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Notified when the serve loop has something to do: the leader changed, this node won
    /// or was fenced.
    pub fn changed(&self) -> &Notify {
        &self.wake
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn view(&self) -> View {
        self.view.lock().map(|v| v.clone()).unwrap_or_default()
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut View)) {
        if let Ok(mut v) = self.view.lock() {
            f(&mut v);
        }
    }

    /// The replication address of the leader, when another node leads.
    pub fn leader_addr(&self) -> Option<String> {
        self.view().leader.map(|l| l.advertise)
    }

    /// The `cluster` object of `roost status`.
    pub fn status_json(&self, node: &crate::replica::Node) -> serde_json::Value {
        let engine = &*node.engine;
        let v = self.view();
        let leader = match (&v.leader, v.leading_rev) {
            (_, Some(_)) => Some(self.name.clone()),
            (Some(l), None) => Some(l.name.clone()),
            (None, None) => None,
        };
        serde_json::json!({
            "name": self.name,
            "advertise": self.cfg.advertise,
            "etcd": self.cfg.etcd,
            "prefix": self.cfg.prefix,
            "lease_ms": self.cfg.lease_ms,
            "leader": leader,
            "leader_advertise": v.leader.as_ref().map(|l| l.advertise.clone()),
            "epoch": node.repl.epoch(),
            "leading": v.leading(),
            "lease_left_ms": v.lease_left_ms(),
            "isr": v.isr.as_ref().map(|i| i.members.clone()),
            "may_campaign": etcd_keys::may_campaign(v.isr.as_ref(), &self.name),
            "members": v.members.iter().map(|m| serde_json::json!({"name": m.name, "advertise": m.advertise, "role": m.role})).collect::<Vec<_>>(),
            "forwarded_in": engine.stats.forwarded_in.load(Ordering::Relaxed),
            "forwarded_out": engine.stats.forwarded_out.load(Ordering::Relaxed),
            "elections_won": self.elections_won.load(Ordering::Relaxed),
            "fenced": self.fenced.load(Ordering::Relaxed),
            "etcd_error": v.etcd_error,
        })
    }
}

/// The replication address of the leader etcd names now, when it is another node (before
/// a life's engine opens, to reconcile with it). etcd unreachable: `None`, logged; the
/// agent finds the leader later, and a follower that must cut then starts again.
pub fn find_leader(cfg: &Config) -> Result<Option<String>, EngineError> {
    let Some(c) = &cfg.cluster else {
        return Ok(None);
    };
    let etcd = etcd_client(c)?;
    let key = Keys::new(&c.prefix).leader;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| EngineError::Io {
            op: "start the cluster runtime",
            path: cfg.data_dir.clone(),
            source,
        })?;
    let found = rt.block_on(etcd.get(&key));
    let me = cfg.replication.node_name();
    match found {
        Ok((Some(kv), _)) => {
            let l: LeaderValue =
                etcd_keys::decode(&kv.key, &kv.value).map_err(EngineError::Replication)?;
            Ok((l.name != me).then_some(l.advertise))
        }
        Ok((None, _)) => Ok(None),
        Err(e) => {
            tracing::warn!(error = %e, "cluster: etcd unreachable at start; following whoever it names once it answers");
            Ok(None)
        }
    }
}

/// The etcd client of `[cluster]`; calls time out after a quarter of the lease (at least
/// 100 ms), so one slow call never holds the agent past its fencing margin.
pub fn etcd_client(c: &ClusterConfig) -> Result<Etcd, EngineError> {
    let tls = match (&c.etcd_ca, &c.etcd_cert, &c.etcd_key) {
        (Some(ca), Some(cert), Some(key)) => Some(EtcdTls {
            ca: ca.clone(),
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    let opts = EtcdOptions {
        endpoints: c.etcd.clone(),
        tls,
        request_timeout: c.margin().max(Duration::from_millis(100)),
    };
    Etcd::new(opts).map_err(|e| EngineError::Credentials(format!("[cluster] etcd: {e}")))
}
