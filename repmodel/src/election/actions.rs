//! The election model's `Next`: the store's clock, the campaign and the lease renewals, the
//! leaders' fencing, the records, and the ISR. Each action pushes one successor per binding
//! of its parameters (node, leader, standby, batch) for which it is enabled; no action is a
//! disjunction whose parts can be true together, so that is also one per true disjunct (the
//! count TLC gives). A stutter (a `Tick` with no lease running) is a successor like any other.

use super::state::{Ack, Answer, Config, Entry, Flaw, Node, Renewal, Role, State, Store};
use crate::step::{Label, Successors};
use crate::types::{Replica, ReplicaSet};

/// `Next`.
pub fn next(cfg: &Config, s: &State, out: &mut Successors<State>) {
    tick(cfg, s, out);
    campaign(cfg, s, out);
    keepalive(cfg, s, out);
    check_and_fence(cfg, s, out);
    hand_over(cfg, s, out);
    append(cfg, s, out);
    sync_and_crash(cfg, s, out);
    follow(cfg, s, out);
    fetch(cfg, s, out);
    inc_hw(cfg, s, out);
    answer(cfg, s, out);
    answer_forwarded(cfg, s, out);
    isr_grow(cfg, s, out);
    isr_shrink(cfg, s, out);
}

/// The nodes that believe they lead.
fn leaders<'a>(cfg: &Config, s: &'a State) -> impl Iterator<Item = Replica> + 'a {
    cfg.all().filter(move |&n| s.node(n).is_leader())
}

/// `f` is a standby in the epoch `l` leads.
fn follows(s: &State, f: Replica, l: Replica) -> bool {
    let (leader, node) = (s.node(l), s.node(f));
    f != l && leader.is_leader() && !node.is_leader() && node.epoch == leader.epoch
}

fn count(set: ReplicaSet) -> u32 {
    set.0.count_ones()
}

/// `Tick`: the store's clock advances. The lease that runs out deletes the leader key in the
/// same step (etcd revokes on expiry); every node's own view of its lease runs down with it.
/// A node whose clock lags is modelled by a later deadline (`Config::skew`), not here.
fn tick(cfg: &Config, s: &State, out: &mut Successors<State>) {
    let mut next = *s;
    next.store.lease = s.store.lease.saturating_sub(1);
    if next.store.lease == 0 {
        next.store.holder = None;
    }
    let older = |age: u8| (age + 1).min(cfg.view_max());
    for n in cfg.all() {
        let node = next.node_mut(n);
        node.deadline = node.deadline.saturating_sub(1);
        if let Renewal::Sent { age } = node.renewal {
            node.renewal = Renewal::Sent { age: older(age) };
        }
    }
    out.push(Label::new("Tick"), next);
}

/// `Campaign(node)`: one transaction that compares "no leader key" (and the node's
/// membership of the store's ISR) and, if it holds, advances the epoch counter, puts the key
/// under a fresh lease and leaves the ISR as it was. The node learns of it in the same step
/// (a later reply only shortens its view). Its view of the lease: `Config::view_max`.
fn campaign(cfg: &Config, s: &State, out: &mut Successors<State>) {
    if s.store.holder.is_some() {
        return;
    }
    for n in cfg.all() {
        let node = s.node(n);
        let electable = s.store.isr.contains(n) || cfg.flaws.has(Flaw::CampaignOutsideIsr);
        let epoch = if cfg.flaws.has(Flaw::EpochFromNode) {
            node.epoch + 1
        } else {
            s.store.epoch + 1
        };
        if node.is_leader() || !electable || epoch > cfg.max_epoch {
            continue;
        }
        let mut next = *s;
        next.store = Store {
            holder: Some(n),
            epoch,
            lease: cfg.ttl,
            isr: s.store.isr,
        };
        if cfg.lost_win {
            out.push(Label::new("CampaignAnswerLost").replica("node", n), next);
        }
        *next.node_mut(n) = Node {
            role: Role::Leader,
            epoch,
            isr: s.store.isr.without(n),
            deadline: cfg.view_max(),
            renewal: Renewal::Idle,
            checked: false,
            ..*node
        };
        out.push(Label::new("Campaign").replica("node", n), next);
    }
}

/// The lease renewal in two steps, with any number of ticks between: `KeepAliveSend(node)`
/// (any time a leader has none in flight), then at the store `KeepAliveGranted(node)` (the
/// key is still the node's: its lease runs ttl from now, and the node's view becomes
/// `Config::view_max` counted from the moment it SENT the request, never from the reply) or
/// `KeepAliveRefused(node)` (the lease is gone). The reply is taken to reach the node at
/// once: a later reply only keeps its view shorter for longer.
fn keepalive(cfg: &Config, s: &State, out: &mut Successors<State>) {
    for n in leaders(cfg, s) {
        let mut next = *s;
        match s.node(n).renewal {
            Renewal::Idle => {
                next.node_mut(n).renewal = Renewal::Sent { age: 0 };
                out.push(Label::new("KeepAliveSend").replica("node", n), next);
            }
            Renewal::Sent { age } if s.holds_key(n) => keepalive_granted(cfg, s, n, age, out),
            Renewal::Sent { .. } => {
                next.node_mut(n).renewal = Renewal::Idle;
                out.push(Label::new("KeepAliveRefused").replica("node", n), next);
            }
        }
    }
}

fn keepalive_granted(cfg: &Config, s: &State, n: Replica, age: u8, out: &mut Successors<State>) {
    let mut next = *s;
    next.store.lease = cfg.ttl;
    let node = next.node_mut(n);
    node.deadline = node.deadline.max(cfg.view_max().saturating_sub(age));
    node.renewal = Renewal::Idle;
    out.push(Label::new("KeepAliveGranted").replica("node", n), next);
}

/// `Check(node)` (with the gap only): the leader finds its deadline ahead and may act once,
/// however long it is paused before it does. `Fence(node)`: it finds its deadline passed
/// (and has no check left to use): it stops leading, keeping its epoch and log.
fn check_and_fence(cfg: &Config, s: &State, out: &mut Successors<State>) {
    for n in leaders(cfg, s) {
        let node = s.node(n);
        if node.checked {
            continue;
        }
        let mut next = *s;
        if node.deadline == 0 {
            *next.node_mut(n) = Node {
                role: Role::Follower,
                hw: 0,
                isr: ReplicaSet::EMPTY,
                renewal: Renewal::Idle,
                ..*node
            };
            out.push(Label::new("Fence").replica("node", n), next);
        } else if cfg.gap {
            next.node_mut(n).checked = true;
            out.push(Label::new("Check").replica("node", n), next);
        }
    }
}

/// A leader's handover (with `Config::handover`), in two steps with any steps between:
/// `StepDown(node)`: it stops leading, at any time, keeping its epoch and log (as a fence
/// does, before its lease ran out); `Resign(node)`: a node that no longer leads deletes the
/// key it still holds, in a transaction guarded by that key, so that a node of the ISR may
/// win at once (whoever wins: that a switchover's target is preferred only narrows who
/// campaigns). `Flaw::ResignBeforeStepDown` lets a leader delete its key while it leads.
fn hand_over(cfg: &Config, s: &State, out: &mut Successors<State>) {
    if !cfg.handover && !cfg.lost_win {
        return;
    }
    for n in cfg.all() {
        let node = s.node(n);
        if node.is_leader() && cfg.handover {
            let mut next = *s;
            *next.node_mut(n) = Node {
                role: Role::Follower,
                hw: 0,
                isr: ReplicaSet::EMPTY,
                renewal: Renewal::Idle,
                deadline: 0,
                checked: false,
                ..*node
            };
            out.push(Label::new("StepDown").replica("node", n), next);
        }
        if s.holds_key(n) && !node.is_leader() && cfg.flaws.has(Flaw::AdoptLostWinFresh) {
            let mut next = *s;
            *next.node_mut(n) = Node {
                role: Role::Leader,
                epoch: s.store.epoch,
                isr: s.store.isr.without(n),
                deadline: cfg.view_max(),
                renewal: Renewal::Idle,
                checked: false,
                ..*node
            };
            out.push(Label::new("AdoptWin").replica("node", n), next);
        }
        let may_resign = !node.is_leader() || cfg.flaws.has(Flaw::ResignBeforeStepDown);
        if s.holds_key(n) && may_resign {
            let mut next = *s;
            next.store.holder = None;
            next.store.lease = 0;
            out.push(Label::new("Resign").replica("node", n), next);
        }
    }
}

/// Whether leader `l` may take or answer a batch now, and its state once it has: without the
/// gap the deadline is checked in the same step; with it, an earlier `Check` is used up.
fn act(cfg: &Config, s: &State, l: Replica) -> Option<Node> {
    let node = *s.node(l);
    if !node.is_leader() {
        return None;
    }
    if cfg.gap {
        node.checked.then_some(Node {
            checked: false,
            ..node
        })
    } else {
        (node.deadline > 0).then_some(node)
    }
}

/// `Append(leader, batch)`: a client's batch, claimed in the leader's epoch.
/// `AppendForwarded(leader, via, batch)`: the same batch sent to standby `via`, which
/// forwarded it to the leader it follows.
fn append(cfg: &Config, s: &State, out: &mut Successors<State>) {
    let b = s.next_batch;
    if b >= cfg.batches {
        return;
    }
    for l in cfg.all() {
        let Some(mut node) = act(cfg, s, l) else {
            continue;
        };
        node.log.push(Entry {
            batch: b,
            epoch: node.epoch,
        });
        if !cfg.crash {
            node.durable = node.log.end();
        }
        let mut next = *s;
        *next.node_mut(l) = node;
        next.next_batch = b + 1;
        let label = Label::new("Append").replica("leader", l);
        out.push(label.int("batch", b), next);
        for f in cfg.all().filter(|&f| follows(s, f, l)) {
            let mut forwarded = next;
            forwarded.batches[usize::from(b)].via = Some(f);
            let label = Label::new("AppendForwarded")
                .replica("leader", l)
                .replica("via", f);
            out.push(label.int("batch", b), forwarded);
        }
    }
}

/// With `Config::crash`: `Sync(node)`: what a node wrote is durable (its group commit's
/// fdatasync returned); `Crash(node)`: it loses power, and starts again with its log cut to
/// what it had synced, following the epoch it knew (its epoch file is synced before it acts
/// in an epoch), leading nothing. Its lease, if it held one, runs out in the store.
fn sync_and_crash(cfg: &Config, s: &State, out: &mut Successors<State>) {
    for n in cfg.all() {
        let node = s.node(n);
        if node.durable < node.log.end() {
            let mut next = *s;
            next.node_mut(n).durable = node.log.end();
            out.push(Label::new("Sync").replica("node", n), next);
        }
        if !cfg.crash {
            continue;
        }
        let mut next = *s;
        *next.node_mut(n) = Node {
            epoch: node.epoch,
            log: node.log.cut_to(node.durable),
            durable: node.durable,
            ..Node::INIT
        };
        if next != *s {
            out.push(Label::new("Crash").replica("node", n), next);
        }
    }
}

/// `Follow(node, leader)`: a node learns a higher epoch (from the store's key or a fetch
/// answer) and follows its leader: it stops leading if it did, and truncates the suffix its
/// log does not share with the leader's, by epoch (Kip320).
fn follow(cfg: &Config, s: &State, out: &mut Successors<State>) {
    for l in leaders(cfg, s) {
        let leader = s.node(l);
        for f in cfg
            .all()
            .filter(|&f| f != l && s.node(f).epoch < leader.epoch)
        {
            let mut next = *s;
            let log = s.node(f).log.truncated_to_match(&leader.log);
            *next.node_mut(f) = Node {
                epoch: leader.epoch,
                log,
                durable: s.node(f).durable.min(log.end()),
                ..Node::INIT
            };
            let label = Label::new("Follow").replica("node", f);
            out.push(label.replica("leader", l), next);
        }
    }
}

/// `Fetch(node, leader)`: a standby in the leader's epoch takes the leader's next entry:
/// one the leader has synced, or with `Config::ship_written` one it has written. The standby
/// syncs it before its next fetch acknowledges it (so its log is durable in this step), or,
/// with `Config::fetch_before_sync`, takes it unsynced (its `Sync` comes later).
/// The leader fences a fetch from another epoch (`FencedEpoch`): a standby that follows a
/// newer leader never fetches from, or acknowledges to, an older one. The fetch is also the
/// acknowledgement: the leader learns what the standby holds in the same step (`counts`);
/// with `Config::fetch_before_sync` it learns the standby's durable end, so a later `Sync`
/// counts at once (that end only grows while the standby follows one epoch).
fn fetch(cfg: &Config, s: &State, out: &mut Successors<State>) {
    for l in leaders(cfg, s) {
        let leader = s.node(l);
        for f in cfg.all().filter(|&f| follows(s, f, l)) {
            let node = s.node(f);
            if node.log.truncated_to_match(&leader.log) != node.log {
                continue; // diverged (only if two leaders share an epoch: Flaw::EpochFromNode)
            }
            let served = if cfg.ship_written {
                leader.log.end()
            } else {
                leader.durable
            };
            let Some(entry) = leader.log.at(node.log.end()) else {
                continue;
            };
            if node.log.end() >= served {
                continue;
            }
            let mut next = *s;
            let standby = next.node_mut(f);
            standby.log.push(entry);
            if !cfg.fetch_before_sync {
                standby.durable = standby.log.end();
            }
            let label = Label::new("Fetch").replica("node", f);
            out.push(label.replica("leader", l), next);
        }
    }
}

/// Whether leader `l` counts standby `f` as holding `offset`: `f` acknowledged it by a fetch
/// in `l`'s epoch. (As in Kip320, the standby's state is read in the same step: what a fetch
/// told the leader is what the standby held when it sent it, and what a standby holds
/// durably only grows while it follows one epoch: a `Crash` cuts its log to that.)
/// `Flaw::AcksAcrossEpochs` counts a standby in any epoch.
fn counts(cfg: &Config, s: &State, l: Replica, f: Replica, offset: u8) -> bool {
    let node = s.node(f);
    let standby = f != l && !node.is_leader();
    let in_epoch = follows(s, f, l) || (standby && cfg.flaws.has(Flaw::AcksAcrossEpochs));
    in_epoch && acknowledged(cfg, node, Flaw::AckWritten) > offset
}

/// What a standby's acknowledgement says it holds: its log, which is all durable, or with
/// `Config::fetch_before_sync` its durable end; under `written_flaw` its log end again
/// (`Flaw::AckWritten` for the hw and the catch-up, `Flaw::CatchUpWritten` for the catch-up
/// alone).
fn acknowledged(cfg: &Config, node: &Node, written_flaw: Flaw) -> u8 {
    let written = cfg.flaws.has(Flaw::AckWritten) || cfg.flaws.has(written_flaw);
    if cfg.fetch_before_sync && !written {
        node.durable
    } else {
        node.log.end()
    }
}

/// `IncHw(leader)`: the hw passes the next offset once the leader has synced it and every
/// in-memory ISR standby holds it (ack=standby), or once the leader has synced it
/// (ack=local). `Flaw::HwPastDurable` drops the leader's own sync from the rule. Not a
/// client-facing act: no deadline check.
fn inc_hw(cfg: &Config, s: &State, out: &mut Successors<State>) {
    for l in leaders(cfg, s) {
        let node = s.node(l);
        let hw = node.hw;
        let acked = match cfg.ack {
            Ack::Local => true,
            Ack::Standby => node.isr.iter().all(|f| counts(cfg, s, l, f, hw)),
        };
        let own = if cfg.flaws.has(Flaw::HwPastDurable) {
            node.log.end()
        } else {
            node.durable
        };
        if hw < own && acked {
            let mut next = *s;
            next.node_mut(l).hw = hw + 1;
            out.push(Label::new("IncHw").replica("leader", l), next);
        }
    }
}

/// `Answer(leader, batch)`: the leader answers a batch sent to it, claimed in its epoch and
/// below its hw. History: the answer's epoch and node, and whether the store's key was the
/// node's at that moment.
fn answer(cfg: &Config, s: &State, out: &mut Successors<State>) {
    for l in cfg.all() {
        let Some(node) = act(cfg, s, l) else {
            continue;
        };
        for b in 0..s.next_batch {
            let batch = s.batches[usize::from(b)];
            let Some(k) = node.log.offset_of(b) else {
                continue;
            };
            let mine = node.log.at(k).is_some_and(|e| e.epoch == node.epoch);
            if batch.via.is_some() || batch.answer.is_some() || !mine || k >= node.hw {
                continue;
            }
            let mut next = *s;
            *next.node_mut(l) = node;
            next.batches[usize::from(b)].answer = Some(Answer {
                epoch: node.epoch,
                by: l,
                in_lease: s.holds_key(l),
            });
            let label = Label::new("Answer").replica("leader", l);
            out.push(label.int("batch", b), next);
        }
    }
}

/// `AnswerForwarded(node, batch)`: the standby that forwarded a batch answers it once it
/// holds the claim and its leader's hw has passed it (so every node that may be elected holds
/// it durably, with `Config::fetch_before_sync` too): the leader's acknowledgement,
/// relayed, for a claim that cannot be lost from under it. (The hw reaches the standby in a
/// fetch answer; reading the leader's in the same step only answers sooner.)
fn answer_forwarded(cfg: &Config, s: &State, out: &mut Successors<State>) {
    for b in 0..s.next_batch {
        let batch = s.batches[usize::from(b)];
        let (Some(f), None) = (batch.via, batch.answer) else {
            continue;
        };
        let Some(k) = s.node(f).log.offset_of(b) else {
            continue;
        };
        for l in cfg.all().filter(|&l| follows(s, f, l) && s.node(l).hw > k) {
            let mut next = *s;
            next.batches[usize::from(b)].answer = Some(Answer {
                epoch: s.node(f).epoch,
                by: f,
                in_lease: s.holds_key(f),
            });
            let label = Label::new("AnswerForwarded")
                .replica("node", f)
                .replica("leader", l);
            out.push(label.int("batch", b), next);
        }
    }
}

/// Whether `f` has caught up with leader `l`: it follows `l`'s epoch and holds `l`'s whole
/// log (its log is a prefix of `l`'s, so that is its end reaching `l`'s). Reaching `l`'s hw
/// is not enough (`Flaw::IsrGrowAtHw`): a new leader's hw can lag entries an earlier leader
/// acknowledged. With `Config::fetch_before_sync` what counts is what `f` has synced (its
/// acknowledgement), as for the hw: a standby admitted on what it had only written could lose
/// it in a crash, and be elected without an acknowledged batch (`Flaw::CatchUpWritten`).
fn caught_up(cfg: &Config, s: &State, l: Replica, f: Replica) -> bool {
    let leader = s.node(l);
    let target = if cfg.flaws.has(Flaw::IsrGrowAtHw) {
        leader.hw
    } else {
        leader.log.end()
    };
    follows(s, f, l) && acknowledged(cfg, s.node(f), Flaw::CatchUpWritten) >= target
}

/// The ISR grows when a standby catches up: `IsrGrowMemory(leader, node)` first (the hw
/// waits for it from then on), then `IsrGrowStore(leader, node)`, a transaction guarded by
/// the leader's key (from then on it may be elected). `Flaw::IsrGrowStoreFirst` swaps them.
fn isr_grow(cfg: &Config, s: &State, out: &mut Successors<State>) {
    let store_first = cfg.flaws.has(Flaw::IsrGrowStoreFirst);
    for l in leaders(cfg, s) {
        let memory = s.node(l).isr;
        for f in cfg.all().filter(|&f| f != l) {
            let in_store = s.store.isr.contains(f);
            let grow_memory = !memory.contains(f)
                && if store_first {
                    in_store
                } else {
                    caught_up(cfg, s, l, f)
                };
            if grow_memory {
                let mut next = *s;
                next.node_mut(l).isr = memory.with(f);
                let label = Label::new("IsrGrowMemory").replica("leader", l);
                out.push(label.replica("node", f), next);
            }
            let ready = if store_first {
                caught_up(cfg, s, l, f)
            } else {
                memory.contains(f)
            };
            if s.holds_key(l) && !in_store && ready {
                let mut next = *s;
                next.store.isr = s.store.isr.with(f);
                let label = Label::new("IsrGrowStore").replica("leader", l);
                out.push(label.replica("node", f), next);
            }
        }
    }
}

/// The ISR shrinks when the leader gives a standby up (any time: it is slow, or gone):
/// `IsrShrinkStore(leader, node)` first (it may no longer be elected), then
/// `IsrShrinkMemory(leader, node)` (the hw stops waiting for it). Under ack=standby neither
/// set drops below one standby. `Flaw::IsrShrinkMemoryFirst` swaps them.
fn isr_shrink(cfg: &Config, s: &State, out: &mut Successors<State>) {
    let memory_first = cfg.flaws.has(Flaw::IsrShrinkMemoryFirst);
    let wait = cfg.ack == Ack::Standby;
    for l in leaders(cfg, s) {
        let memory = s.node(l).isr;
        for f in cfg.all().filter(|&f| f != l) {
            let in_store = s.store.isr.contains(f);
            let store_left = count(s.store.isr.without(l).without(f));
            let store_ok = !wait || store_left >= 1;
            let memory_ok = !wait || count(memory.without(f)) >= 1;
            let first_done = memory.contains(f) != memory_first;
            if s.holds_key(l) && in_store && first_done && store_ok {
                let mut next = *s;
                next.store.isr = s.store.isr.without(f);
                let label = Label::new("IsrShrinkStore").replica("leader", l);
                out.push(label.replica("node", f), next);
            }
            if memory.contains(f) && (in_store == memory_first) && memory_ok {
                let mut next = *s;
                next.node_mut(l).isr = memory.without(f);
                let label = Label::new("IsrShrinkMemory").replica("leader", l);
                out.push(label.replica("node", f), next);
            }
        }
    }
}
