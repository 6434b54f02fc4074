//! `roost cluster switchover NAME` (issue 42): a planned change of leader with no gap, as
//! `patronictl switchover` does. It writes `PREFIX/switchover` (docs/cluster.md) under a
//! lease of its own of about two leases, guarded by the leader key it read; the leader sees
//! it at its next step (a quarter lease), takes no more batches, finishes those in flight,
//! waits until NAME holds its whole log, stops leading and gives up its lease; NAME, which
//! looks every 50 ms once it is named, campaigns at once, and the other members let it.
//! The command then waits until etcd names NAME the leader.
//!
//! Exit 0 when NAME leads (or led already), 1 when refused (no leader, NAME not in the
//! in-sync set or not running, the leader changed meanwhile), when another node won, when
//! it did not happen in time or etcd does not answer; 78 without `[cluster]`.

use std::time::{Duration, Instant};

use roost_etcd::{CmpOp, Compare, Etcd, Op, Txn};

use crate::cluster::etcd_keys::{self, IsrValue, Keys, LeaderValue, SwitchoverValue};
use crate::cluster::unclean::place;
use crate::config::{ClusterConfig, Config};
use crate::error::{CommandError, ErrorClass, EXIT_OK};
use crate::serve::{STANDBY_GRACE_AT_STOP, SWITCHOVER_WAIT};

/// How long the command waits for etcd per call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often it looks whether NAME leads.
const LOOK_EVERY: Duration = Duration::from_millis(20);

pub(crate) fn switchover(cfg: &Config, to: &str) -> anyhow::Result<i32> {
    let c = cfg.cluster.as_ref().ok_or_else(|| CommandError {
        class: ErrorClass::Config,
        message: "`roost cluster switchover` needs the cluster's configuration: a [cluster] \
                  section (its etcd endpoints and prefix)"
            .into(),
    })?;
    let etcd = crate::cluster::handle::etcd_client(c)
        .map(|e| e.with_timeout(CALL_TIMEOUT))
        .map_err(|e| CommandError::failed(format!("{}: {e}", place(c))))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CommandError::failed(format!("cannot start a runtime: {e}")))?;
    let text = rt
        .block_on(run(c, &etcd, to))
        .map_err(|e| CommandError::failed(format!("{}: {e}", place(c))))?;
    super::super::output::out(&text)?;
    Ok(EXIT_OK)
}

/// Asks, then waits; the text to print, or why it was refused or failed.
async fn run(c: &ClusterConfig, etcd: &Etcd, to: &str) -> Result<String, String> {
    let keys = Keys::new(&c.prefix);
    let (leader, leader_rev) = read_leader(etcd, &keys).await?;
    let Some(leader) = leader else {
        return Err(
            "no node leads now: nothing to switch over (a node of the in-sync set \
                    campaigns by itself; `roost cluster list`)"
                .into(),
        );
    };
    if leader.name == to {
        return Ok(format!(
            "{to} leads already (epoch {}); nothing written\n",
            leader.epoch
        ));
    }
    check_target(etcd, &keys, to).await?;
    let asked = Instant::now();
    ask(c, etcd, &keys, &leader, leader_rev, to).await?;
    let won = wait_for(c, etcd, &keys, &leader, to).await?;
    Ok(format!(
        "asked {} (epoch {}) to hand over to {to}\nswitchover done: {to} leads epoch {} \
         ({} ms after the request)\n",
        leader.name,
        leader.epoch,
        won.epoch,
        asked.elapsed().as_millis()
    ))
}

async fn read_leader(etcd: &Etcd, keys: &Keys) -> Result<(Option<LeaderValue>, i64), String> {
    let (kv, _) = etcd.get(&keys.leader).await.map_err(|e| e.to_string())?;
    match kv {
        Some(kv) => Ok((
            Some(etcd_keys::decode(&kv.key, &kv.value)?),
            kv.create_revision,
        )),
        None => Ok((None, 0)),
    }
}

/// NAME must be in etcd's in-sync set (it holds every acknowledged batch) and running (its
/// member key lives under its own lease).
async fn check_target(etcd: &Etcd, keys: &Keys, to: &str) -> Result<(), String> {
    let (isr_kv, _) = etcd.get(&keys.isr).await.map_err(|e| e.to_string())?;
    let isr: Option<IsrValue> = isr_kv
        .map(|kv| etcd_keys::decode(&kv.key, &kv.value))
        .transpose()?;
    let members = isr.map(|i| i.members).unwrap_or_default();
    if !members.iter().any(|m| m == to) {
        return Err(format!(
            "refused: {to} is not in the in-sync set {members:?}, so it may lack acknowledged \
             batches; wait until it is (`roost cluster list`)"
        ));
    }
    let (member, _) = etcd
        .get(&keys.member(to))
        .await
        .map_err(|e| e.to_string())?;
    if member.is_none() {
        return Err(format!(
            "refused: {to} is not running (no member key in etcd)"
        ));
    }
    Ok(())
}

/// Writes the request under a lease of its own, guarded by the leader key read.
async fn ask(
    c: &ClusterConfig,
    etcd: &Etcd,
    keys: &Keys,
    leader: &LeaderValue,
    leader_rev: i64,
    to: &str,
) -> Result<(), String> {
    let ttl = request_ttl_secs(c.lease_ms);
    let lease = etcd.grant(ttl).await.map_err(|e| e.to_string())?;
    let v = SwitchoverValue {
        from: leader.name.clone(),
        to: to.to_owned(),
        epoch: leader.epoch,
    };
    let txn = Txn {
        compare: vec![Compare::create_revision(
            &keys.leader,
            CmpOp::Equal,
            leader_rev,
        )],
        success: vec![Op::Put {
            key: keys.switchover.clone(),
            value: etcd_keys::encode(&v),
            lease: Some(lease.id),
        }],
        failure: vec![],
    };
    let r = etcd.txn(txn).await.map_err(|e| e.to_string())?;
    if !r.succeeded {
        let _ = etcd.revoke(lease.id).await;
        return Err(format!(
            "refused: the leader changed while the request was written (it was {} in epoch \
             {}); look again (`roost cluster list`)",
            leader.name, leader.epoch
        ));
    }
    Ok(())
}

/// The request's lease: the leader's whole handover and two leases (the leader sees the
/// request within a quarter lease; its in-flight batches then get up to
/// `STANDBY_GRACE_AT_STOP` and the target up to `SWITCHOVER_WAIT` to catch up, and the
/// target must still find the request when the leader key goes, or another member may win
/// first: a drill under load saw a handover take 4.5 s past a request of 2 s); etcd's leases
/// are whole seconds.
fn request_ttl_secs(lease_ms: u64) -> i64 {
    let handover = STANDBY_GRACE_AT_STOP + SWITCHOVER_WAIT + Duration::from_millis(2 * lease_ms);
    i64::try_from(handover.as_millis().div_ceil(1000).max(2)).unwrap_or(60)
}

/// Until etcd names `to` the leader in a later epoch; another winner, or no winner before
/// the request's lease and a lease more have passed, is a failure.
async fn wait_for(
    c: &ClusterConfig,
    etcd: &Etcd,
    keys: &Keys,
    from: &LeaderValue,
    to: &str,
) -> Result<LeaderValue, String> {
    let secs = u64::try_from(request_ttl_secs(c.lease_ms)).unwrap_or(60);
    let limit = Duration::from_secs(secs) + Duration::from_millis(c.lease_ms);
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let (Some(l), _) = read_leader(etcd, keys).await? {
            if l.epoch > from.epoch && l.name == to {
                return Ok(l);
            }
            if l.epoch > from.epoch {
                return Err(format!(
                    "{} won epoch {} instead of {to} (was {to} stopped or cut off?)",
                    l.name, l.epoch
                ));
            }
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    Err(format!(
        "{to} did not lead within {} ms; the request expires with its lease (`roost cluster \
         list`, and the leader's log)",
        limit.as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the request outlives the leader's longest handover (in-flight grace and the
    /// target's catch-up, 4 s) by two leases, so the target still finds it when the leader
    /// key goes.
    #[test]
    fn the_request_outlives_the_leaders_handover() {
        assert_eq!(request_ttl_secs(1000), 6);
        assert_eq!(request_ttl_secs(3000), 10);
        assert_eq!(request_ttl_secs(250), 5);
        let handover = (STANDBY_GRACE_AT_STOP + SWITCHOVER_WAIT).as_secs() as i64;
        assert!(request_ttl_secs(1000) > handover);
    }
}
