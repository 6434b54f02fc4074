//! The cluster agent (docs/cluster.md): one task beside the serve loop, one step every
//! quarter lease.
//!
//! - **Following**: renew this node's lease (its member key lives under it); read the leader
//!   key; another node there: follow it (the serve loop re-points its follower). No one
//!   there: campaign, if the ISR in etcd names this node.
//! - **Campaign**: one transaction: the leader key must not exist, and the epoch counter and
//!   the ISR must be as read; it puts the leader key under this node's lease, the counter +1
//!   (above every epoch this node knows) as the new epoch, and the ISR without the old
//!   leader. The winner promotes itself into that epoch.
//! - **Leading**: renew the lease; the deadline to renew by is the moment the last
//!   successful renewal was sent plus the TTL, minus a quarter of it (the fencing margin).
//!   Past it, or when etcd no longer names this node, the engine is fenced at once: no more
//!   batches, no more answers. The ISR follows the standbys: one caught up joins (engine
//!   first, then etcd); one silent for `standby_timeout_ms` leaves (etcd first, then the
//!   engine), but under `ack = "standby"` with `wait` never the last.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use roost_etcd::{CmpOp, Compare, Op, Txn};
use tokio::sync::watch;
use tracing::{info, warn};

use super::etcd_keys::{self as keys, IsrValue, LeaderValue, MemberValue};
use super::handle::Cluster;
use crate::config::{Ack, StandbyLost};
use crate::pipeline::{Engine, Lead, Role};
use crate::replica::Replication;

/// The engine and its replication state, as the agent drives them.
pub struct Node {
    pub engine: Arc<Engine>,
    pub repl: Arc<Replication>,
}

/// Runs until `stop`; then revokes this node's lease.
pub(super) async fn run(cl: Arc<Cluster>, node: Arc<Node>, mut stop: watch::Receiver<bool>) {
    let tick = cl.cfg.lease() / 4;
    let mut members_read: Option<Instant> = None;
    while !*stop.borrow() {
        match node.engine.role() {
            Role::Primary => lead(&cl, &node, &mut stop).await,
            Role::Standby => {
                if let Err(e) = follow_step(&cl, &node).await {
                    note_error(&cl, e);
                }
            }
            Role::SteppedDown { .. } => {}
        }
        if members_read.is_none_or(|t| t.elapsed() > Duration::from_secs(2)) {
            members_read = Some(Instant::now());
            read_members(&cl).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => {}
        }
    }
    let id = cl.view().lease_id;
    if id != 0 {
        match cl.etcd.revoke(id).await {
            Ok(()) => info!(lease = id, "cluster: lease revoked at stop"),
            Err(e) => {
                warn!(error = %e, "cluster: cannot revoke the lease at stop; it expires by itself")
            }
        }
    }
}

fn note_error(cl: &Cluster, e: String) {
    let first = cl.view().etcd_error.is_none();
    if first {
        warn!(error = %e, "cluster: etcd");
    }
    cl.update(|v| v.etcd_error = Some(e));
}

/// Keeps this node's lease alive (granting a new one, and writing the member key under it,
/// when there is none or it expired). Returns the moment the renewal was sent and the TTL.
async fn renew(cl: &Cluster, node: &Node) -> Result<(Instant, i64), String> {
    let v = cl.view();
    let sent = Instant::now();
    if v.lease_id != 0 {
        match cl
            .etcd
            .keepalive(v.lease_id)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(ttl) => return Ok((sent, ttl)),
            None => info!(
                lease = v.lease_id,
                "cluster: this node's lease expired; taking a new one"
            ),
        }
    }
    let ttl_asked = i64::try_from(cl.cfg.lease_ms.div_ceil(1000)).unwrap_or(60);
    let sent = Instant::now();
    let lease = cl.etcd.grant(ttl_asked).await.map_err(|e| e.to_string())?;
    if lease.ttl_secs > ttl_asked {
        warn!(asked = ttl_asked, granted = lease.ttl_secs, "cluster: etcd granted a longer lease than lease_ms (its minimum TTL); failover takes that long");
    }
    cl.update(|v| {
        v.lease_id = lease.id;
        v.lease_ttl_secs = lease.ttl_secs;
    });
    put_member(cl, node, lease.id).await?;
    Ok((sent, lease.ttl_secs))
}

async fn put_member(cl: &Cluster, node: &Node, lease: i64) -> Result<(), String> {
    let m = MemberValue {
        name: cl.name.clone(),
        advertise: cl.cfg.advertise.clone(),
        role: node.engine.role().name().to_owned(),
    };
    let key = cl.keys.member(&cl.name);
    cl.etcd
        .put(&key, &keys::encode(&m), Some(lease))
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The members' keys and the ISR, for status (best effort).
async fn read_members(cl: &Cluster) {
    if let Ok((kvs, _)) = cl.etcd.get_prefix(&cl.keys.members).await {
        let members: Vec<MemberValue> = kvs
            .iter()
            .filter_map(|kv| keys::decode(&kv.key, &kv.value).ok())
            .collect();
        cl.update(|v| v.members = members);
    }
    if let Ok((Some(kv), _)) = cl.etcd.get(&cl.keys.isr).await {
        if let Ok(isr) = keys::decode::<IsrValue>(&kv.key, &kv.value) {
            cl.update(|v| v.isr = Some(isr));
        }
    }
}

/// One step of a following node: renew, read the leader key, follow or campaign.
async fn follow_step(cl: &Cluster, node: &Node) -> Result<(), String> {
    let (sent, ttl) = renew(cl, node).await?;
    let (kv, _) = cl
        .etcd
        .get(&cl.keys.leader)
        .await
        .map_err(|e| e.to_string())?;
    cl.update(|v| v.etcd_error = None);
    let leader = match kv {
        Some(kv) => Some(keys::decode::<LeaderValue>(&kv.key, &kv.value)?),
        None => None,
    };
    match leader {
        Some(l) if l.name != cl.name => {
            let changed = cl.view().leader.as_ref() != Some(&l);
            if changed {
                info!(leader = %l.name, advertise = %l.advertise, epoch = l.epoch, "cluster: following the leader etcd names");
                cl.update(|v| v.leader = Some(l));
                cl.wake.notify_one();
            }
            Ok(())
        }
        // This node's own key from before a restart: it leads nothing now; the key goes
        // with its old lease.
        Some(_) => {
            cl.update(|v| v.leader = None);
            Ok(())
        }
        None => {
            cl.update(|v| v.leader = None);
            campaign(cl, node, (sent, ttl)).await
        }
    }
}

/// Campaigns once (see the module comment); promotes this node if it wins.
async fn campaign(cl: &Cluster, node: &Node, (sent, ttl): (Instant, i64)) -> Result<(), String> {
    let err = |e: roost_etcd::EtcdError| e.to_string();
    let (isr_kv, _) = cl.etcd.get(&cl.keys.isr).await.map_err(err)?;
    let isr = match &isr_kv {
        Some(kv) => Some(keys::decode::<IsrValue>(&kv.key, &kv.value)?),
        None => None,
    };
    cl.update(|v| v.isr = isr.clone());
    if !keys::may_campaign(isr.as_ref(), &cl.name) {
        if cl.view().refused_by != isr {
            let members = isr.as_ref().map(|v| v.members.clone());
            info!(isr = ?members, "cluster: no node leads, and etcd's in-sync set does not name this node: waiting for a node it names (if all are lost for good: `roost cluster unclean-election`, docs/cluster.md)");
            cl.update(|v| v.refused_by = isr.clone());
        }
        return Ok(());
    }
    cl.update(|v| v.refused_by = None);
    let (epoch_kv, _) = cl.etcd.get(&cl.keys.epoch).await.map_err(err)?;
    let counter = match &epoch_kv {
        Some(kv) => keys::decode::<u32>(&kv.key, &kv.value)?,
        None => 0,
    };
    let epoch = counter
        .max(node.repl.highest_epoch_known())
        .saturating_add(1);
    if epoch >= roost_replication::EPOCH_CEILING {
        return Err(format!(
            "cannot campaign: the next epoch {epoch} reaches the ceiling"
        ));
    }
    let members = keys::isr_after_win(isr.as_ref(), &cl.name);
    let won = try_win(cl, epoch, &members, (&epoch_kv, &isr_kv)).await?;
    let Some(rev) = won else {
        return Ok(());
    };
    let fence_at = sent + fence_after(ttl);
    node.repl.lease_renewed_until(fence_at);
    let standbys: BTreeSet<String> = members.iter().filter(|n| **n != cl.name).cloned().collect();
    let e = node.engine.clone();
    let lead = Lead::Won {
        epoch,
        isr: standbys,
    };
    let promoted = tokio::task::spawn_blocking(move || e.promote(lead)).await;
    match promoted {
        Ok(Ok(_)) => {
            cl.elections_won.fetch_add(1, Ordering::Relaxed);
            let isr = IsrValue {
                epoch,
                leader: cl.name.clone(),
                members,
            };
            cl.update(|v| {
                v.leading_rev = Some(rev);
                v.fence_at = Some(fence_at);
                v.leader = None;
                v.isr = Some(isr);
            });
            info!(epoch, revision = rev, "cluster: won the election; leading");
            cl.wake.notify_one();
            let lease = cl.view().lease_id;
            put_member(cl, node, lease).await
        }
        other => {
            // Won in etcd but cannot lead: give the key up at once (revoking the lease).
            let id = cl.view().lease_id;
            let _ = cl.etcd.revoke(id).await;
            cl.update(|v| v.lease_id = 0);
            Err(format!(
                "won epoch {epoch} but could not promote: {other:?}"
            ))
        }
    }
}

/// How long after sending a successful renewal a leader may still answer: the TTL minus
/// the fencing margin (a quarter of it).
fn fence_after(ttl_secs: i64) -> Duration {
    let ttl = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0));
    ttl - ttl / 4
}

/// The winning transaction; `Some(revision)` when this node won.
async fn try_win(
    cl: &Cluster,
    epoch: u32,
    members: &[String],
    (epoch_kv, isr_kv): (&Option<roost_etcd::Kv>, &Option<roost_etcd::Kv>),
) -> Result<Option<i64>, String> {
    let rev = |kv: &Option<roost_etcd::Kv>| kv.as_ref().map_or(0, |k| k.mod_revision);
    let lease = cl.view().lease_id;
    let leader = LeaderValue {
        name: cl.name.clone(),
        advertise: cl.cfg.advertise.clone(),
        epoch,
    };
    let isr = IsrValue {
        epoch,
        leader: cl.name.clone(),
        members: members.to_vec(),
    };
    let k = &cl.keys;
    let txn = Txn {
        compare: vec![
            Compare::create_revision(&k.leader, CmpOp::Equal, 0),
            Compare::mod_revision(&k.epoch, CmpOp::Equal, rev(epoch_kv)),
            Compare::mod_revision(&k.isr, CmpOp::Equal, rev(isr_kv)),
        ],
        success: vec![
            Op::Put {
                key: k.leader.clone(),
                value: keys::encode(&leader),
                lease: Some(lease),
            },
            Op::Put {
                key: k.epoch.clone(),
                value: keys::encode(&epoch),
                lease: None,
            },
            Op::Put {
                key: k.isr.clone(),
                value: keys::encode(&isr),
                lease: None,
            },
        ],
        failure: vec![],
    };
    let r = cl.etcd.txn(txn).await.map_err(|e| e.to_string())?;
    Ok(r.succeeded.then_some(r.revision))
}

/// Leads until fenced or stopped: renews, checks the leader key, keeps the ISR.
async fn lead(cl: &Cluster, node: &Node, stop: &mut watch::Receiver<bool>) {
    let tick = cl.cfg.lease() / 4;
    let led_since = Instant::now();
    loop {
        let Some(deadline) = cl.view().fence_at else {
            return fence(cl, node, "no lease deadline while leading");
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                return fence(cl, node, "the leadership lease was not renewed in time (etcd unreachable or this process paused)");
            }
            _ = stop.changed() => return,
            r = lead_step(cl, node, led_since) => match r {
                Ok(Step::Leading) => cl.update(|v| v.etcd_error = None),
                Ok(Step::Fence(why)) => return fence(cl, node, &why),
                Err(e) => note_error(cl, e),
            },
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = stop.changed() => return,
        }
    }
}

enum Step {
    Leading,
    Fence(String),
}

fn fence(cl: &Cluster, node: &Node, why: &str) {
    node.repl.fence(why);
    cl.fenced.fetch_add(1, Ordering::Relaxed);
    cl.update(|v| {
        v.leading_rev = None;
        v.fence_at = None;
    });
    cl.wake.notify_one();
}

async fn lead_step(cl: &Cluster, node: &Node, led_since: Instant) -> Result<Step, String> {
    let id = cl.view().lease_id;
    let sent = Instant::now();
    let Some(ttl) = cl.etcd.keepalive(id).await.map_err(|e| e.to_string())? else {
        return Ok(Step::Fence("the leadership lease expired in etcd".into()));
    };
    let fence_at = sent + fence_after(ttl);
    node.repl.lease_renewed_until(fence_at);
    cl.update(|v| v.fence_at = Some(fence_at));
    let (kv, _) = cl
        .etcd
        .get(&cl.keys.leader)
        .await
        .map_err(|e| e.to_string())?;
    let mine = cl.view().leading_rev;
    if kv.as_ref().map(|k| k.create_revision) != mine {
        return Ok(Step::Fence(
            "etcd no longer names this node the leader".into(),
        ));
    }
    keep_isr(cl, node, led_since).await
}

/// Joins caught-up standbys to the ISR and removes silent ones (see the module comment).
async fn keep_isr(cl: &Cluster, node: &Node, led_since: Instant) -> Result<Step, String> {
    let Some(now) = node.repl.isr() else {
        return Ok(Step::Leading);
    };
    let (add, remove) = isr_changes(cl, node, &now, led_since);
    if add.is_empty() && remove.is_empty() {
        return Ok(Step::Leading);
    }
    for n in &add {
        node.repl.isr_add(n);
    }
    let mut members: BTreeSet<String> = now.union(&add).cloned().collect();
    for n in &remove {
        members.remove(n);
    }
    members.insert(cl.name.clone());
    let isr = IsrValue {
        epoch: node.repl.epoch(),
        leader: cl.name.clone(),
        members: members.into_iter().collect(),
    };
    let rev = cl.view().leading_rev.unwrap_or(-1);
    let txn = Txn {
        compare: vec![Compare::create_revision(&cl.keys.leader, CmpOp::Equal, rev)],
        success: vec![Op::Put {
            key: cl.keys.isr.clone(),
            value: keys::encode(&isr),
            lease: None,
        }],
        failure: vec![],
    };
    let r = cl.etcd.txn(txn).await.map_err(|e| e.to_string())?;
    if !r.succeeded {
        return Ok(Step::Fence(
            "etcd no longer names this node the leader (ISR update refused)".into(),
        ));
    }
    for n in &remove {
        node.repl.isr_remove(n);
    }
    info!(isr = ?isr.members, "cluster: in-sync set written");
    cl.update(|v| v.isr = Some(isr));
    Ok(Step::Leading)
}

/// `(join, leave)`: standbys that hold every acknowledged batch, and in-sync ones silent for
/// `standby_timeout_ms` (after this node has led that long), never the last under
/// `ack = "standby"`/`wait`. A standby holds every acknowledged batch once it acknowledged
/// both this epoch's start (everything earlier leaders acknowledged is below it: this node
/// held it to be elected) and this leader's high watermark (everything it acknowledged).
/// The slowest in-sync standby's position is not enough: a new leader's in-sync standbys
/// may not have fetched from it yet (the election model's flaw (f),
/// docs/replication-model.md).
fn isr_changes(
    cl: &Cluster,
    node: &Node,
    now: &BTreeSet<String>,
    led_since: Instant,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let standbys = node.repl.standbys();
    let fresh = |s: &crate::replica::StandbyState| {
        s.connected && s.last_fetch.elapsed() < cl.standby_timeout
    };
    let floor = node.repl.epoch_start().max(node.repl.high_watermark());
    let add: BTreeSet<String> = standbys
        .iter()
        .filter(|(n, s)| !now.contains(n) && fresh(s) && s.acked >= floor && s.acked > 0)
        .map(|(n, _)| n.clone())
        .collect();
    if led_since.elapsed() < cl.standby_timeout {
        return (add, BTreeSet::new());
    }
    let silent = |n: &String| !standbys.iter().any(|(s, st)| s == n && fresh(st));
    let mut remove: BTreeSet<String> = now.iter().filter(|n| silent(n)).cloned().collect();
    let rep = &node.engine.config().replication;
    let keep_one = rep.ack == Ack::Standby && rep.when_standby_lost == StandbyLost::Wait;
    if keep_one && add.is_empty() && remove.len() == now.len() {
        if let Some(first) = remove.iter().next().cloned() {
            remove.remove(&first);
        }
    }
    (add, remove)
}
