//! `roost cluster`: operating the cluster through etcd with a node's configuration.
//!
//! `roost cluster unclean-election NAME [--accept-loss]`: the operator's way out when every
//! node etcd's in-sync set names is lost (`cluster/unclean.rs`, docs/cluster.md). Exit 0
//! when written or nothing is needed, 2 without `--accept-loss` (nothing written) or for a
//! name that is not a member, 1 when refused (a node leads, a node the set names runs, NAME
//! does not run, the set changed meanwhile) or etcd does not answer, 78 without `[cluster]`.
//!
//! `roost cluster list [--json]`: the members as etcd sees them (`list.rs`).
//!
//! `roost cluster switchover NAME`: a planned change of leader (`switchover.rs`).

mod list;
mod switchover;

use crate::cluster::etcd_keys::IsrValue;
use crate::cluster::unclean::{place, unclean_election as admit, Unclean};
use crate::config::Config;
use crate::error::{CommandError, EXIT_OK};
pub(super) use list::list;
pub(super) use switchover::switchover;

pub(super) fn unclean_election(cfg: &Config, name: &str, accept_loss: bool) -> anyhow::Result<i32> {
    let (quarter, at) = cfg
        .cluster
        .as_ref()
        .map_or((0, String::new()), |c| (c.lease_ms / 4, place(c)));
    match admit(cfg, name, accept_loss)? {
        Unclean::Already(None) => super::output::out(&format!(
            "{at}: no in-sync set yet (a cluster that never elected): any node may campaign, \
             {name} too. Nothing written.\n"
        ))?,
        Unclean::Already(Some(isr)) => super::output::out(&format!(
            "{at}: the in-sync set {:?} names {name} already: it may campaign. Nothing \
             written.\n",
            isr.members
        ))?,
        Unclean::Would { before, after } => {
            super::output::out(&format!(
                "{}With --accept-loss this writes {:?}.\n{}",
                stuck(&at, &before),
                after.members,
                loss(&before, name)
            ))?;
            return Err(CommandError::usage(
                "nothing written: an unclean election may lose acknowledged batches; \
                 add --accept-loss to write it",
            )
            .into());
        }
        Unclean::Written {
            before,
            after,
            revision,
        } => super::output::out(&format!(
            "{}Written: the in-sync set is now {:?} (revision {revision}); {name} campaigns \
             at its next step (within {quarter} ms, a quarter lease).\n{}",
            stuck(&at, &before),
            after.members,
            loss(&before, name)
        ))?,
    }
    Ok(EXIT_OK)
}

fn stuck(at: &str, isr: &IsrValue) -> String {
    format!(
        "{at}: no node leads, and the in-sync set names only {:?} (written by {} in epoch \
         {}), none of them running: no running node may campaign.\n",
        isr.members, isr.leader, isr.epoch
    )
}

fn loss(isr: &IsrValue, name: &str) -> String {
    format!(
        "Batches that {:?} acknowledged and {name} does not hold are lost; a node of {:?} \
         that comes back follows {name} and cuts them. Name the running node furthest along \
         (`roost status --json`: replication.durable_lsn).\n",
        isr.members, isr.members
    )
}
