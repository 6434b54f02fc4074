//! `roost cluster unclean-election NAME --accept-loss` (docs/cluster.md, "When every node
//! the in-sync set names is lost"): the operator's way out of a cluster in which no node may
//! campaign. Only a node etcd's in-sync set names may win (a clean election), so a leader
//! lost for good while the set names only lost nodes (it alone, after a first election or
//! once its standbys fell out; or it died between taking a standby into its own set and
//! writing that to etcd) leaves the cluster without a leader until one of them returns.
//!
//! This adds NAME to the set in etcd, in one transaction that holds only while no leader key
//! exists and the set is still the one read; NAME then campaigns at its next step. It is
//! Kafka's unclean leader election: NAME may lack batches the lost nodes acknowledged, and
//! those are lost (the model's `campaign-outside-isr` row shows the loss,
//! docs/replication-model.md); a lost node that comes back cuts what NAME never had when it
//! rejoins. Without `--accept-loss` it only says what it would write.

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

/// Adds `name` to etcd's in-sync set of the cluster `cfg` describes, if no node leads and
/// the set does not name it (`accept_loss`: write it; else only say so). Refused (exit 1)
/// while a leader key exists, and when the leader key or the set changes meanwhile.
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
    let etcd = etcd_client(c).map_err(|e| CommandError {
        class: ErrorClass::Config,
        message: e.to_string(),
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CommandError::failed(format!("cannot start a runtime: {e}")))?;
    rt.block_on(admit(&etcd, &Keys::new(&c.prefix), name, accept_loss))
}

fn cluster_section(cfg: &Config) -> Result<&ClusterConfig, CommandError> {
    cfg.cluster.as_ref().ok_or_else(|| CommandError {
        class: ErrorClass::Config,
        message: "an unclean election needs the cluster's configuration: a [cluster] section \
                  (its etcd endpoints and prefix) and [replication] members"
            .into(),
    })
}

async fn admit(
    etcd: &Etcd,
    keys: &Keys,
    name: &str,
    accept_loss: bool,
) -> Result<Unclean, CommandError> {
    let unreachable = |e: roost_etcd::EtcdError| CommandError::failed(format!("etcd: {e}"));
    let (leader, _) = etcd.get(&keys.leader).await.map_err(unreachable)?;
    if let Some(kv) = leader {
        let l: LeaderValue = etcd_keys::decode(&kv.key, &kv.value).map_err(CommandError::failed)?;
        return Err(CommandError::failed(format!(
            "etcd names a leader, {} (epoch {}): an unclean election is only for a cluster in \
             which no node may campaign; nothing written",
            l.name, l.epoch
        )));
    }
    let (isr_kv, _) = etcd.get(&keys.isr).await.map_err(unreachable)?;
    let Some(isr_kv) = isr_kv else {
        return Ok(Unclean::Already(None));
    };
    let before: IsrValue =
        etcd_keys::decode(&isr_kv.key, &isr_kv.value).map_err(CommandError::failed)?;
    if etcd_keys::may_campaign(Some(&before), name) {
        return Ok(Unclean::Already(Some(before)));
    }
    let after = with_member(&before, name);
    if !accept_loss {
        return Ok(Unclean::Would { before, after });
    }
    let txn = Txn {
        compare: vec![
            Compare::create_revision(&keys.leader, CmpOp::Equal, 0),
            Compare::mod_revision(&keys.isr, CmpOp::Equal, isr_kv.mod_revision),
        ],
        success: vec![Op::Put {
            key: keys.isr.clone(),
            value: etcd_keys::encode(&after),
            lease: None,
        }],
        failure: vec![],
    };
    let r = etcd.txn(txn).await.map_err(unreachable)?;
    if !r.succeeded {
        return Err(CommandError::failed(
            "a leader was elected or the in-sync set changed while this ran; nothing written \
             (run it again to see the cluster as it is now)",
        ));
    }
    Ok(Unclean::Written {
        before,
        after,
        revision: r.revision,
    })
}

/// The set `isr` with `name` added (sorted, as the agent writes it); its epoch and writer
/// stay, so the winner's transaction still drops the old leader from it.
fn with_member(isr: &IsrValue, name: &str) -> IsrValue {
    let mut members = isr.members.clone();
    members.push(name.to_owned());
    members.sort();
    members.dedup();
    IsrValue {
        epoch: isr.epoch,
        leader: isr.leader.clone(),
        members,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the name joins the set sorted, once; the epoch and writer stay (so the win
    /// that follows still drops the lost leader), and the name may then campaign.
    #[test]
    fn the_named_node_joins_the_set_and_the_lost_leader_leaves_it_at_the_win() {
        let isr = IsrValue {
            epoch: 4,
            leader: "c".into(),
            members: vec!["c".into()],
        };
        let after = with_member(&isr, "b");
        assert_eq!(after.members, vec!["b", "c"]);
        assert_eq!((after.epoch, after.leader.as_str()), (4, "c"));
        assert!(etcd_keys::may_campaign(Some(&after), "b"));
        assert!(!etcd_keys::may_campaign(Some(&after), "a"));
        assert_eq!(etcd_keys::isr_after_win(Some(&after), "b"), vec!["b"]);
        assert_eq!(with_member(&after, "b"), after, "added twice");
    }
}
