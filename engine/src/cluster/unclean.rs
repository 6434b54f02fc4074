//! `roost cluster unclean-election NAME --accept-loss` (docs/cluster.md, "When every node
//! the in-sync set names is lost"): the operator's way out of a cluster in which no node may
//! campaign. Only a node etcd's in-sync set names may win (a clean election), so a leader
//! lost for good while the set names only lost nodes (it alone, after a first election or
//! once its standbys fell out; or it died between taking a standby into its own set and
//! writing that to etcd) leaves the cluster without a leader until one of them returns.
//!
//! This makes NAME the set's only member in etcd (the operator declares the others lost: one
//! that came back before NAME won could otherwise win itself, and the set would name NAME
//! beside it without NAME holding its batches), in one transaction that holds only while no
//! leader key exists and the set is still the one read; NAME then campaigns at its next
//! step. It is refused while a node the set names is alive (its member key, under its own
//! lease, is there: it will campaign by itself) and unless NAME is (a name with no member
//! key would leave no node that may campaign); the transaction checks both again. It is
//! Kafka's unclean leader election: NAME may lack batches the lost nodes acknowledged, and
//! those are lost (the model's `campaign-outside-isr` row shows the loss,
//! docs/replication-model.md); a lost node that comes back cuts what NAME never had when it
//! rejoins. Without `--accept-loss` it only says what it would write.

use std::time::Duration;

use roost_etcd::{CmpOp, Compare, Etcd, Op, Txn};

use super::etcd_keys::{self, IsrValue, Keys, LeaderValue};
use super::handle::etcd_client;
use crate::config::{ClusterConfig, Config};
use crate::error::{CommandError, ErrorClass};

/// What the command found, and what it wrote.
#[derive(Debug, PartialEq, Eq)]
pub enum Unclean {
    /// NAME may campaign already: the set names it, or there is none yet (a cluster that
    /// never elected). Nothing written.
    Already(Option<IsrValue>),
    /// Without `--accept-loss`: the set now, and the one it would write. Nothing written.
    Would { before: IsrValue, after: IsrValue },
    /// The set written, at etcd revision `revision`.
    Written {
        before: IsrValue,
        after: IsrValue,
        revision: i64,
    },
}

/// How long the command waits for etcd per call: a one-shot command has no fencing margin
/// to keep (the agent's calls time out after a quarter lease).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Makes `name` the only member of etcd's in-sync set of the cluster `cfg` describes, if no
/// node leads, none the set names is alive and `name` is (`accept_loss`: write it; else only
/// say so). Refused (exit 1) while a leader key exists, and when the leader key or the set
/// changes meanwhile.
pub fn unclean_election(
    cfg: &Config,
    name: &str,
    accept_loss: bool,
) -> Result<Unclean, CommandError> {
    let c = cluster_section(cfg)?;
    let members = &cfg.replication.members;
    if !members.is_empty() && !members.iter().any(|m| m == name) {
        return Err(CommandError::usage(format!(
            "{name} is not one of [replication] members {members:?}: only a member may lead"
        )));
    }
    let etcd = etcd_client(c)
        .map_err(|e| CommandError {
            class: ErrorClass::Config,
            message: e.to_string(),
        })?
        .with_timeout(CALL_TIMEOUT);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CommandError::failed(format!("cannot start a runtime: {e}")))?;
    let at = place(c);
    rt.block_on(admit(&etcd, &Keys::new(&c.prefix), name, accept_loss))
        .map_err(|e| CommandError {
            class: e.class,
            message: format!("{at}: {}", e.message),
        })
}

/// The cluster a message is about: its etcd endpoints and prefix.
pub fn place(c: &ClusterConfig) -> String {
    format!("etcd {:?}, prefix {}", c.etcd, c.prefix)
}

fn cluster_section(cfg: &Config) -> Result<&ClusterConfig, CommandError> {
    cfg.cluster.as_ref().ok_or_else(|| CommandError {
        class: ErrorClass::Config,
        message: "an unclean election needs the cluster's configuration: a [cluster] section \
                  (its etcd endpoints and prefix) and [replication] members"
            .into(),
    })
}

fn etcd_failed(e: roost_etcd::EtcdError) -> CommandError {
    CommandError::failed(format!("{e}"))
}

async fn admit(
    etcd: &Etcd,
    keys: &Keys,
    name: &str,
    accept_loss: bool,
) -> Result<Unclean, CommandError> {
    no_leader(etcd, keys).await?;
    let (isr_kv, _) = etcd.get(&keys.isr).await.map_err(etcd_failed)?;
    let Some(isr_kv) = isr_kv else {
        return Ok(Unclean::Already(None));
    };
    let before: IsrValue =
        etcd_keys::decode(&isr_kv.key, &isr_kv.value).map_err(CommandError::failed)?;
    if etcd_keys::may_campaign(Some(&before), name) {
        return Ok(Unclean::Already(Some(before)));
    }
    alive_only(etcd, keys, &before, name).await?;
    let after = only(&before, name);
    if !accept_loss {
        return Ok(Unclean::Would { before, after });
    }
    let revision = write(etcd, keys, (&before, isr_kv.mod_revision), &after, name).await?;
    Ok(Unclean::Written {
        before,
        after,
        revision,
    })
}

/// Refused while a leader key exists.
async fn no_leader(etcd: &Etcd, keys: &Keys) -> Result<(), CommandError> {
    let (leader, _) = etcd.get(&keys.leader).await.map_err(etcd_failed)?;
    let Some(kv) = leader else {
        return Ok(());
    };
    let l: LeaderValue = etcd_keys::decode(&kv.key, &kv.value).map_err(CommandError::failed)?;
    Err(CommandError::failed(format!(
        "etcd names a leader, {} (epoch {}): an unclean election is only for a cluster in \
         which no node may campaign; nothing written",
        l.name, l.epoch
    )))
}

/// Refused unless `name` is running (its member key is there) and no node `isr` names is
/// (it would campaign by itself: no election needs forcing).
async fn alive_only(
    etcd: &Etcd,
    keys: &Keys,
    isr: &IsrValue,
    name: &str,
) -> Result<(), CommandError> {
    let (kvs, _) = etcd.get_prefix(&keys.members).await.map_err(etcd_failed)?;
    let alive: Vec<&str> = kvs
        .iter()
        .filter_map(|kv| kv.key.strip_prefix(keys.members.as_str()))
        .collect();
    if let Some(m) = isr.members.iter().find(|m| alive.contains(&m.as_str())) {
        return Err(CommandError::failed(format!(
            "{m}, which etcd's in-sync set {:?} names, is running (its member key is there): \
             it campaigns by itself once the leader's lease ends; nothing written",
            isr.members
        )));
    }
    if !alive.contains(&name) {
        return Err(CommandError::failed(format!(
            "{name} is not running (no member key {}{name}; running: {alive:?}): start it \
             first, or name a node that runs; nothing written",
            keys.members
        )));
    }
    Ok(())
}

/// Writes `after` if no leader key exists, the set is still `before` at its revision, no
/// node `before` names has a member key and `name` has one; returns its revision. A write
/// whose answer was lost may have landed: a failed compare reads the set back and counts it
/// written when it holds `after`; a timeout says it may have been written.
async fn write(
    etcd: &Etcd,
    keys: &Keys,
    (before, isr_rev): (&IsrValue, i64),
    after: &IsrValue,
    name: &str,
) -> Result<i64, CommandError> {
    let mut compare = vec![
        Compare::create_revision(&keys.leader, CmpOp::Equal, 0),
        Compare::mod_revision(&keys.isr, CmpOp::Equal, isr_rev),
        Compare::create_revision(&keys.member(name), CmpOp::Greater, 0),
    ];
    for m in &before.members {
        compare.push(Compare::create_revision(&keys.member(m), CmpOp::Equal, 0));
    }
    let txn = Txn {
        compare,
        success: vec![Op::Put {
            key: keys.isr.clone(),
            value: etcd_keys::encode(after),
            lease: None,
        }],
        failure: vec![],
    };
    let r = etcd.txn(txn).await.map_err(|e| {
        CommandError::failed(format!(
            "{e}; the in-sync set may have been written: run the command again to see it"
        ))
    })?;
    if r.succeeded {
        return Ok(r.revision);
    }
    let (now, _) = etcd.get(&keys.isr).await.map_err(etcd_failed)?;
    let now: Option<IsrValue> = now.and_then(|kv| etcd_keys::decode(&kv.key, &kv.value).ok());
    match now {
        Some(v) if v == *after => Ok(r.revision),
        _ => Err(CommandError::failed(
            "a leader was elected, the in-sync set changed, or a node started or stopped while \
             this ran; nothing written (run it again to see the cluster as it is now)",
        )),
    }
}

/// The set `isr` with `name` its only member; its epoch and writer stay, so the winner's
/// transaction still drops the old leader (already gone from it).
fn only(isr: &IsrValue, name: &str) -> IsrValue {
    IsrValue {
        epoch: isr.epoch,
        leader: isr.leader.clone(),
        members: vec![name.to_owned()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the named node becomes the set's only member (the lost ones leave it: one that
    /// came back first could not win and leave the set naming NAME beside it); the epoch and
    /// writer stay, and only the name may then campaign.
    #[test]
    fn the_named_node_is_the_only_member_and_only_it_may_campaign() {
        let isr = IsrValue {
            epoch: 4,
            leader: "c".into(),
            members: vec!["a".into(), "c".into()],
        };
        let after = only(&isr, "b");
        assert_eq!(after.members, vec!["b"]);
        assert_eq!((after.epoch, after.leader.as_str()), (4, "c"));
        assert!(etcd_keys::may_campaign(Some(&after), "b"));
        for lost in ["a", "c"] {
            assert!(
                !etcd_keys::may_campaign(Some(&after), lost),
                "{lost} may win"
            );
        }
        assert_eq!(etcd_keys::isr_after_win(Some(&after), "b"), vec!["b"]);
    }
}
