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
use crate::pipeline::{Lead, Role};

/// The engine and its replication state, as the agent drives them.
pub use crate::replica::Node;

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
            _ = tokio::time::sleep(follow_tick(&cl, tick)) => {}
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

/// A switchover's target looks for the leader key's end every [`TARGET_TICK`], not every
/// quarter lease: that wait is most of a switchover's gap.
fn follow_tick(cl: &Cluster, tick: Duration) -> Duration {
    let v = cl.view();
    let target = v.leading_rev.is_none() && v.switchover.is_some_and(|s| s.to == cl.name);
    if target {
        TARGET_TICK.min(tick)
    } else {
        tick
    }
}

/// See [`follow_tick`].
const TARGET_TICK: Duration = Duration::from_millis(50);

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
    let key_lease = kv.as_ref().map_or(0, |kv| kv.lease);
    let leader = match kv {
        Some(kv) => Some(keys::decode::<LeaderValue>(&kv.key, &kv.value)?),
        None => None,
    };
    let defer = note_switchover(cl, get_switchover(cl).await?);
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
        // with its old lease. Under its current lease, its own campaign won in etcd while
        // the answer was lost (a timeout), so etcd names a leader that does not lead, for
        // as long as this node renews that lease: it is given up (`resign_unknown_win`).
        Some(l) => {
            cl.update(|v| v.leader = None);
            let lease = cl.view().lease_id;
            if lease != 0 && key_lease == lease {
                resign_unknown_win(cl, l.epoch).await;
            }
            Ok(())
        }
        None => {
            cl.update(|v| v.leader = None);
            if defer {
                return Ok(());
            }
            campaign(cl, node, (sent, ttl)).await
        }
    }
}

/// Gives up a leader key this node holds under its current lease without leading: its
/// winning transaction was applied while its answer was lost (the cluster drill saw "txn:
/// no answer within 251ms", then no leader for a minute: the key stayed, renewed with the
/// lease, and every node, this one included, waited on it). The lease is revoked, as a
/// winner that cannot promote does, which deletes the key; the next step takes a new lease
/// and may campaign again. Nothing was answered in that epoch (this node never promoted), so
/// giving it up loses nothing; a failed revoke leaves the lease to expire unrenewed.
async fn resign_unknown_win(cl: &Cluster, epoch: u32) {
    let id = cl.view().lease_id;
    warn!(
        epoch,
        "cluster: etcd names this node the leader under its current lease, but it does not lead (a winning transaction whose answer was lost): giving the key up"
    );
    if let Err(e) = cl.etcd.revoke(id).await {
        warn!(error = %e, "cluster: cannot revoke the lease; it expires by itself");
    }
    cl.update(|v| v.lease_id = 0);
}

/// Keeps the switchover request found (issue 42) in the view; true when it names another
/// node, which this one then lets campaign first for as long as the request's lease lasts
/// (`roost cluster switchover` gives it the leader's handover and two leases), campaigning after that as after
/// any loss of a leader. The target itself looks again every [`TARGET_TICK`].
fn note_switchover(cl: &Cluster, found: Option<keys::SwitchoverValue>) -> bool {
    let other = found.as_ref().is_some_and(|v| v.to != cl.name);
    if cl.view().switchover != found {
        if let Some(v) = &found {
            info!(from = %v.from, to = %v.to, epoch = v.epoch, "cluster: a switchover is asked");
        }
    }
    cl.update(|v| v.switchover = found);
    other
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
    let fence_at = renew_after_win(cl, sent + fence_after(ttl)).await;
    node.repl.lease_renewed_until(fence_at);
    lead_won(cl, node, (epoch, rev, fence_at), members).await
}

/// Promotes this node into `epoch`, won at etcd revision `rev` with `members` in sync
/// (this node among them) and fenced from `fence_at`, and names it in etcd; a win it cannot
/// lead is given up at once (revoking the lease).
async fn lead_won(
    cl: &Cluster,
    node: &Node,
    (epoch, rev, fence_at): (u32, i64, Instant),
    members: Vec<String>,
) -> Result<(), String> {
    let standbys: BTreeSet<String> = members.iter().filter(|n| **n != cl.name).cloned().collect();
    let e = node.engine.clone();
    let lead = Lead::Won {
        epoch,
        isr: standbys,
    };
    let promoted = tokio::task::spawn_blocking(move || e.standby().promote(lead)).await;
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

/// The fencing deadline a winner starts with: from the renewal before its campaign, or
/// from one sent right after the winning transaction when that answers. The steps of a
/// campaign (three etcd calls) can take most of the margin on a loaded machine, and a winner
/// fenced by its own stale deadline before its first renewal answers is an election
/// without a fault (the drill saw one fenced 115 ms after winning).
async fn renew_after_win(cl: &Cluster, before: Instant) -> Instant {
    let sent = Instant::now();
    match cl.etcd.keepalive(cl.view().lease_id).await {
        Ok(Some(ttl)) => before.max(sent + fence_after(ttl)),
        _ => before,
    }
}

/// How long after sending a successful renewal a leader may still answer: the TTL minus
/// the fencing margin (a quarter of it).
fn fence_after(ttl_secs: i64) -> Duration {
    keys::fence_after(Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(0)))
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
            // A switchover asked of an earlier epoch is done (or stale) once anyone wins.
            Op::Delete {
                key: k.switchover.clone(),
            },
        ],
        failure: vec![],
    };
    let r = cl.etcd.txn(txn).await.map_err(|e| e.to_string())?;
    Ok(r.succeeded.then_some(r.revision))
}

/// Leads until fenced or stopped. Renewing the lease is apart from the other steps and
/// never waits on them or on itself (issue 42, "no election without a fault"): a keepalive
/// is sent every eighth of the lease, up to [`RENEWALS_IN_FLIGHT_MAX`] at once, each allowed
/// until the fencing deadline to answer; every answer moves the deadline to its own send
/// time plus the TTL less the margin. One slow etcd call is not a lost lease; only no
/// answer to any renewal sent in the last TTL less the margin is. The leader key and the
/// ISR are checked each quarter lease by one step at a time, which the renewals never wait
/// for.
async fn lead(cl: &Cluster, node: &Node, stop: &mut watch::Receiver<bool>) {
    let tick = cl.cfg.lease() / 4;
    let led_since = Instant::now();
    let mut renewals = Renewals::new(cl.cfg.lease() / 8);
    let mut check = Box::pin(lead_step(cl, node, led_since));
    let mut next_check: Option<tokio::time::Instant> = None;
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
            _ = tokio::time::sleep_until(renewals.next_send) => renewals.send(cl, deadline.into_std()),
            Some(done) = renewals.set.join_next() => {
                if let Err(why) = renewed(cl, node, done) {
                    return fence(cl, node, &why);
                }
            }
            r = &mut check, if next_check.is_none() => {
                match r {
                    Ok(Step::Leading) => cl.update(|v| v.etcd_error = None),
                    Ok(Step::Fence(why)) => return fence(cl, node, &why),
                    Err(e) => note_error(cl, e),
                }
                next_check = Some(tokio::time::Instant::now() + tick);
            }
            _ = sleep_until_some(next_check) => {
                next_check = None;
                check = Box::pin(lead_step(cl, node, led_since));
            }
        }
    }
}

/// How many keepalives a leader may have in flight at once (bounded: an etcd that answers
/// none holds at most this many requests, each until the fencing deadline).
const RENEWALS_IN_FLIGHT_MAX: usize = 8;

/// A leader's keepalives in flight: each yields the moment it was sent and etcd's answer.
struct Renewals {
    set: tokio::task::JoinSet<(Instant, Result<Option<i64>, String>)>,
    every: Duration,
    next_send: tokio::time::Instant,
}

impl Renewals {
    fn new(every: Duration) -> Renewals {
        Renewals {
            set: tokio::task::JoinSet::new(),
            every: every.max(Duration::from_millis(10)),
            next_send: tokio::time::Instant::now(),
        }
    }

    /// Sends one keepalive (unless [`RENEWALS_IN_FLIGHT_MAX`] are in flight) that may take
    /// until `deadline` to answer.
    fn send(&mut self, cl: &Cluster, deadline: Instant) {
        self.next_send = tokio::time::Instant::now() + self.every;
        if self.set.len() >= RENEWALS_IN_FLIGHT_MAX {
            return;
        }
        let sent = Instant::now();
        let left = deadline.saturating_duration_since(sent);
        let etcd = cl.etcd.with_timeout(left.max(Duration::from_millis(50)));
        let id = cl.view().lease_id;
        self.set.spawn(async move {
            let r = etcd.keepalive(id).await.map_err(|e| e.to_string());
            (sent, r)
        });
    }
}

/// One renewal's answer: the deadline moves to its send time plus the TTL less the margin
/// (never back); `Err(why)` when etcd says the lease is gone. A failed call is only noted.
fn renewed(
    cl: &Cluster,
    node: &Node,
    done: Result<(Instant, Result<Option<i64>, String>), tokio::task::JoinError>,
) -> Result<(), String> {
    match done {
        Ok((sent, Ok(Some(ttl)))) => {
            let fence_at = sent + fence_after(ttl);
            if cl.view().fence_at.is_some_and(|f| fence_at > f) {
                node.repl.lease_renewed_until(fence_at);
                cl.update(|v| v.fence_at = Some(fence_at));
            }
            Ok(())
        }
        Ok((_, Ok(None))) => Err("the leadership lease expired in etcd".into()),
        Ok((_, Err(e))) => {
            note_error(cl, format!("renewing the leadership lease: {e}"));
            Ok(())
        }
        Err(e) => {
            note_error(cl, format!("renewing the leadership lease: {e}"));
            Ok(())
        }
    }
}

/// Resolves at `at`, never when `None`.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
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

/// Checks that etcd still names this node the leader, then keeps the ISR (the lease is
/// renewed apart: [`Renewals`]).
async fn lead_step(cl: &Cluster, node: &Node, led_since: Instant) -> Result<Step, String> {
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
    let step = keep_isr(cl, node, led_since).await?;
    if matches!(step, Step::Leading) {
        // A failed read is only noted: it must not hide the step's outcome.
        if let Err(e) = read_switchover(cl, node).await {
            note_error(cl, e);
        }
    }
    Ok(step)
}

/// A leader's look at `PREFIX/switchover` (issue 42): a request that asks this leader, in
/// its epoch, to hand over to a member of its in-sync set is passed to the serve loop,
/// which ends this life with a handover (`serve/handover.rs`). Anything else is left to
/// its lease.
async fn read_switchover(cl: &Cluster, node: &Node) -> Result<(), String> {
    let Some(v) = get_switchover(cl).await? else {
        return Ok(());
    };
    let isr: Vec<String> = cl.view().isr.map(|i| i.members).unwrap_or_default();
    if !v.asks(&cl.name, node.repl.epoch(), &isr) || cl.view().switchover.as_ref() == Some(&v) {
        return Ok(());
    }
    info!(to = %v.to, epoch = v.epoch, "cluster: switchover asked: handing over");
    cl.update(|view| view.switchover = Some(v));
    cl.wake.notify_one();
    Ok(())
}

async fn get_switchover(cl: &Cluster) -> Result<Option<keys::SwitchoverValue>, String> {
    let (kv, _) = cl
        .etcd
        .get(&cl.keys.switchover)
        .await
        .map_err(|e| e.to_string())?;
    kv.map(|kv| keys::decode(&kv.key, &kv.value)).transpose()
}

/// Joins caught-up standbys to the ISR and removes silent ones (see the module comment).
async fn keep_isr(cl: &Cluster, node: &Node, led_since: Instant) -> Result<Step, String> {
    let Some(now) = node.repl.isr() else {
        return Ok(Step::Leading);
    };
    let (add, remove) = isr_changes(cl, node, &now, led_since);
    let mut members: BTreeSet<String> = now.union(&add).cloned().collect();
    for n in &remove {
        members.remove(n);
    }
    members.insert(cl.name.clone());
    // Also when nothing changes here: a join is made in memory first, so a write that
    // failed (a timeout, which may or may not have applied) is written again until etcd
    // names the same set (seen under packet loss: a member in sync in memory, never in
    // etcd, so never electable).
    let written = cl.view().isr.filter(|v| v.epoch == node.repl.epoch());
    let same =
        written.is_some_and(|v| v.members.iter().cloned().collect::<BTreeSet<_>>() == members);
    if add.is_empty() && remove.is_empty() && same {
        return Ok(Step::Leading);
    }
    for n in &add {
        node.repl.isr_add(n);
    }
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

/// `(join, leave)`: standbys that hold every acknowledged batch, and in-sync ones that
/// cannot hold anything new soon: silent for `standby_timeout_ms` (after this node has led
/// that long), or told their log diverges or is behind (`behind`: at once, issue 42: a new
/// leader never waits on a standby that must cut or be re-seeded first); never the last
/// under `ack = "standby"`/`wait`. A standby holds every acknowledged batch once it
/// acknowledged both this epoch's start (everything earlier leaders acknowledged is below
/// it: this node held it to be elected) and this leader's high watermark (everything it
/// acknowledged). The slowest in-sync standby's position is not enough: a new leader's
/// in-sync standbys may not have fetched from it yet (the election model's flaw (f),
/// docs/replication-model.md). Taking a member out is always safe (it only shrinks who may
/// win and who answers wait for); when is a matter of availability.
fn isr_changes(
    cl: &Cluster,
    node: &Node,
    now: &BTreeSet<String>,
    led_since: Instant,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let rep = &node.engine.config().replication;
    let rule = IsrRule {
        floor: node.repl.epoch_start().max(node.repl.high_watermark()),
        standby_timeout: cl.standby_timeout,
        patient: led_since.elapsed() < cl.standby_timeout,
        keep_one: rep.ack == Ack::Standby && rep.when_standby_lost == StandbyLost::Wait,
    };
    rule.changes(&node.repl.standbys(), now)
}

/// What [`isr_changes`] decides by, apart from the node (so that a test walks it).
struct IsrRule {
    /// A joining standby must have acknowledged this far.
    floor: u64,
    standby_timeout: Duration,
    /// This node has led for less than `standby_timeout`: a silent member stays.
    patient: bool,
    /// Never remove the last member (`ack = "standby"`, `when_standby_lost = "wait"`).
    keep_one: bool,
}

impl IsrRule {
    fn changes(
        &self,
        standbys: &[(String, crate::replica::StandbyState)],
        now: &BTreeSet<String>,
    ) -> (BTreeSet<String>, BTreeSet<String>) {
        let fresh = |s: &crate::replica::StandbyState| {
            s.connected && !s.behind && s.last_fetch.elapsed() < self.standby_timeout
        };
        let add: BTreeSet<String> = standbys
            .iter()
            .filter(|(n, s)| !now.contains(n) && fresh(s) && s.acked >= self.floor && s.acked > 0)
            .map(|(n, _)| n.clone())
            .collect();
        let state = |n: &String| standbys.iter().find(|(s, _)| s == n).map(|(_, st)| st);
        let leaves = |n: &&String| match state(n) {
            Some(st) if st.behind => true,
            _ if self.patient => false,
            st => !st.is_some_and(fresh),
        };
        let mut remove: BTreeSet<String> = now.iter().filter(leaves).cloned().collect();
        if self.keep_one && add.is_empty() && remove.len() == now.len() {
            if let Some(first) = remove.iter().next().cloned() {
                remove.remove(&first);
            }
        }
        (add, remove)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::StandbyState;

    fn standby(acked: u64, connected: bool, behind: bool, ago: Duration) -> StandbyState {
        StandbyState {
            acked,
            last_fetch: Instant::now() - ago,
            connected,
            behind,
        }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn rule(patient: bool, keep_one: bool) -> IsrRule {
        IsrRule {
            floor: 10,
            standby_timeout: Duration::from_secs(10),
            patient,
            keep_one,
        }
    }

    /// Goal (issue 42): a member told that its log diverges (it must cut or be re-seeded)
    /// leaves the in-sync set at once, even while a new leader is still patient with
    /// silent members; a silent one leaves only once the leader is not patient; a fresh
    /// one caught up joins, a behind one never does.
    #[test]
    fn a_member_that_must_cut_leaves_at_once_and_a_silent_one_after_the_timeout() {
        let short = Duration::from_millis(10);
        let long = Duration::from_secs(20);
        let standbys = vec![
            ("b".to_owned(), standby(12, true, true, short)),
            ("c".to_owned(), standby(12, false, false, long)),
            ("d".to_owned(), standby(12, true, false, short)),
            ("e".to_owned(), standby(12, true, true, short)),
        ];
        let (add, remove) = rule(true, false).changes(&standbys, &set(&["b", "c"]));
        assert_eq!(
            add,
            set(&["d"]),
            "fresh and caught up joins; behind e does not"
        );
        assert_eq!(
            remove,
            set(&["b"]),
            "patient: only the behind member leaves"
        );
        let (_, remove) = rule(false, false).changes(&standbys, &set(&["b", "c"]));
        assert_eq!(remove, set(&["b", "c"]));
    }

    /// Under `ack = "standby"` with `wait` the last member stays, behind or not.
    #[test]
    fn the_last_member_stays_when_answers_must_wait_for_one() {
        let standbys = vec![("b".to_owned(), standby(12, true, true, Duration::ZERO))];
        let (add, remove) = rule(true, true).changes(&standbys, &set(&["b"]));
        assert!(add.is_empty() && remove.is_empty(), "{add:?} {remove:?}");
        let (_, remove) = rule(true, false).changes(&standbys, &set(&["b"]));
        assert_eq!(remove, set(&["b"]));
    }
}
