//! A cluster leader's handover (issue 42): at a graceful stop, and at a switchover (`roost
//! cluster switchover NAME`). Its in-flight batches are finished first (`shutdown`); then
//! it waits, a bounded time, until the standbys it hands to hold its log's durable end;
//! then it stops leading (no batch taken, no answer given from here on) before its agent
//! gives up the lease, which deletes the leader key. The order is the election model's
//! `StepDown` then `Resign`; the other order lets an answer outlive the key (its flaw (g),
//! docs/replication-model.md).

use std::time::{Duration, Instant};

use tracing::info;

use crate::intake::Shared;
use crate::pipeline::Role;

/// How long a leader's graceful stop gives its in-sync standbys to fetch its log's durable
/// end before it gives up its lease (a clean handover: the next leader holds everything this
/// one wrote, and nothing is cut when it rejoins).
const HANDOVER_WAIT: Duration = Duration::from_millis(500);

/// How long a switchover's leader waits for its target to hold its log's durable end. Past
/// it the handover goes on (the target may still win: it is in the in-sync set, so it holds
/// every acknowledged batch; what it lacks is cut from this node when it rejoins).
pub const SWITCHOVER_WAIT: Duration = Duration::from_secs(2);

/// The target of a switchover asked of this leader in its epoch (`cluster/agent.rs` checked
/// that the target is in the in-sync set), or `None`.
pub(super) fn switchover_asked(shared: &Shared) -> Option<String> {
    let cl = shared.cluster.as_ref()?;
    let v = cl.view().switchover?;
    (v.from == cl.name() && v.epoch == shared.repl.epoch()).then_some(v.to)
}

/// See the module comment. Nothing to do on a node that does not lead in a cluster.
pub(super) async fn hand_over(shared: &Shared) {
    let repl = &shared.repl;
    if shared.engine.role() != Role::Primary || shared.engine.is_failed() {
        return;
    }
    let Some(isr) = repl.isr() else {
        return;
    };
    let (to, wait) = match switchover_asked(shared) {
        Some(to) => (Some(to), SWITCHOVER_WAIT),
        None => (None, HANDOVER_WAIT),
    };
    let waited_for = |name: &String| to.as_ref().map_or(isr.contains(name), |t| t == name);
    let until = Instant::now() + wait;
    loop {
        let end = repl.durable_end();
        let behind = repl
            .standbys()
            .iter()
            .any(|(n, s)| waited_for(n) && s.connected && s.acked < end);
        if !behind {
            break;
        }
        if Instant::now() >= until {
            info!(to = ?to, "handing over: a standby did not fetch this leader's log end in time");
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let why = match &to {
        Some(t) => format!("switchover to {t}"),
        None => "a graceful stop".to_owned(),
    };
    repl.hand_over_lead(&why);
}
