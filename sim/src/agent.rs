//! The election driver of one node: a PORT of the cluster agent (engine/src/cluster/
//! agent.rs), not the agent itself, which needs the engine and the real etcd client; the
//! pure rules it applies (`may_campaign`, `isr_after_win`, `fence_after`) and the keys'
//! values are the real ones, shared with the daemon (`roost_replication::election`, through
//! `keys.rs`). Its steps:
//!
//! - **Following** (every quarter TTL): renew the lease (a new one when it expired), read the
//!   leader key; another node there: follow it (the real `follow`); no one: campaign, only if
//!   etcd's in-sync set names this node (`may_campaign`).
//! - **Campaign**: one transaction: the leader key must not exist and the epoch counter and
//!   the ISR must be as read; it puts the leader key under this node's lease, the counter + 1
//!   (above every epoch this node knows) and the ISR without the old leader
//!   (`isr_after_win`). The winner leads that epoch (`MemLog::become_leader`) and serves its
//!   followers (the real `serve_followers_on`).
//! - **Leading**: a keepalive every eighth of the TTL (up to 8 in flight); each answer moves
//!   the fencing deadline to its send time + TTL - TTL/4; past the deadline the node is
//!   fenced: no more answers. Every quarter TTL a check: the leader key is still this
//!   node's (else fence), then the ISR: a caught-up standby joins (engine first, then etcd),
//!   a silent or behind one leaves (etcd first, then the engine).
//!
//! Differences, said plainly: a fenced leader goes on as a follower at once (the daemon
//! ends that life and restarts as a standby); the workload (a record written, synced later,
//! answered once the hw passes it and the lease is still valid) stands in for the engine;
//! switchovers, member keys and unclean elections are left out. Clock skew: a node's
//! durations run `1 + skew` times longer in simulated time (a slow clock). The flaws of the
//! election model (`Flaw`) switch single rules to their broken form.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use roost_replication::testing::MemLog;
use roost_replication::{
    follow, serve_followers_on, FollowerOptions, FollowerStatus, LeaderLog, LeaderOptions,
    Transport,
};
use roost_repmodel::election::Flaw;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use crate::etcd::{Client, Cmp, Op};
use crate::keys::{
    decode, encode, fence_after, isr_after_win, may_campaign, IsrVal, LeaderVal, KEY_EPOCH,
    KEY_ISR, KEY_LEADER, REPL_PORT,
};
use crate::log::SimLog;
use crate::net::{SimDial, SimListen};
use crate::rng::Rng;
use crate::world::World;

/// A task of a role (following one leader, or serving followers) and how to stop it.
struct RoleTask {
    leader: String,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

/// What a leading node keeps.
struct Lead {
    epoch: u32,
    /// The leader key's create revision: the key is still ours while it is unchanged.
    rev: i64,
    fence_at: Instant,
    led_since: Instant,
    /// The engine's ISR (standbys only, as `MemLog`'s).
    isr_mem: BTreeSet<String>,
    /// What etcd's ISR says, as last written or read.
    isr_etcd: Option<IsrVal>,
    /// Written, not yet answered: lsns in order.
    pending: Vec<u64>,
    written: u64,
}

/// One node's driver.
pub struct Node {
    idx: usize,
    name: String,
    world: Arc<World>,
    log: Arc<SimLog>,
    etcd: Client,
    rng: Rng,
    skew: f64,
    stop: watch::Receiver<bool>,
    lease_id: i64,
    leader: Option<LeaderVal>,
    follow: Option<RoleTask>,
    serve: Option<RoleTask>,
    lead: Option<Lead>,
}

/// A node host's life: restart (what was not synced is lost), run until stopped, stop.
pub async fn node_main(world: Arc<World>, idx: usize, rng: Rng, skew: f64) -> turmoil::Result {
    let log = Arc::clone(&world.logs[idx]);
    log.mem.crash();
    log.forget_standbys();
    world.set_running(idx, true);
    world.event(format!(
        "{} starts (log end {})",
        world.names[idx],
        log.mem.end()
    ));
    let mut node = Node {
        idx,
        name: world.names[idx].clone(),
        etcd: Client {
            limit: Duration::from_millis(250),
        },
        stop: world.stop.subscribe(),
        world,
        log,
        rng,
        skew,
        lease_id: 0,
        leader: None,
        follow: None,
        serve: None,
        lead: None,
    };
    node.run().await;
    node.world.set_running(idx, false);
    node.world.event(format!("{} stopped", node.name));
    Ok(())
}

impl Node {
    /// A duration of this node's clock, in simulated time.
    fn local(&self, d: Duration) -> Duration {
        d.mul_f64(1.0 + self.skew)
    }

    fn mem(&self) -> &MemLog {
        &self.log.mem
    }

    async fn run(&mut self) {
        let tick = self.local(self.world.cfg.ttl / 4);
        while !*self.stop.borrow() {
            if self.lead.is_some() {
                self.lead_loop().await;
            } else if let Err(e) = self.follow_step().await {
                self.world.event(format!("{}: {e}", self.name));
            }
            tokio::select! {
                _ = sleep(tick) => {}
                _ = self.stop.changed() => {}
            }
        }
        if self.lead.take().is_some() {
            self.mem().resign();
        }
        self.stop_role(false).await;
        self.stop_role(true).await;
        let _ = self.etcd.revoke(self.lease_id).await;
    }

    /// Keeps the lease alive (a new one when it expired). The renewal's send time and TTL.
    async fn renew(&mut self) -> Result<(Instant, Duration), String> {
        let sent = Instant::now();
        if self.lease_id != 0 {
            if let Some(ttl) = self.etcd.keepalive(self.lease_id).await? {
                return Ok((sent, Duration::from_millis(ttl)));
            }
        }
        let sent = Instant::now();
        let ttl_ms = self.world.cfg.ttl.as_millis() as u64;
        let (id, ttl) = self.etcd.grant(ttl_ms).await?;
        self.lease_id = id;
        Ok((sent, Duration::from_millis(ttl)))
    }

    /// One step of a following node: renew, read the leader key, follow or campaign.
    async fn follow_step(&mut self) -> Result<(), String> {
        let renewed = self.renew().await?;
        let kv = self.etcd.get(KEY_LEADER).await?;
        let key_lease = kv.as_ref().and_then(|kv| kv.lease);
        let leader: Option<LeaderVal> = kv.map(|kv| decode(&kv.value)).transpose()?;
        match leader {
            Some(l) if l.name != self.name => {
                self.leader = Some(l.clone());
                self.ensure_following(&l.name).await;
                Ok(())
            }
            // Its own key: from an earlier lease, it goes with it; under the current one, a
            // win whose answer was lost (the daemon's `resign_unknown_win`): given up.
            Some(_) => {
                self.leader = None;
                if self.lease_id != 0 && key_lease == Some(self.lease_id) {
                    self.world.event(format!(
                        "{} gives up a win whose answer was lost",
                        self.name
                    ));
                    let _ = self.etcd.revoke(self.lease_id).await;
                    self.lease_id = 0;
                }
                Ok(())
            }
            None => {
                self.leader = None;
                self.campaign(renewed).await
            }
        }
    }

    /// Follows `leader` (the real `follow`), restarting the task if it follows another or
    /// ended.
    async fn ensure_following(&mut self, leader: &str) {
        let same = self
            .follow
            .as_ref()
            .is_some_and(|t| t.leader == leader && !t.handle.is_finished());
        if same {
            return;
        }
        self.stop_role(false).await;
        let (stop, rx) = watch::channel(false);
        let mut opts = FollowerOptions::new(self.name.clone());
        opts.transport = Transport::plain(Vec::new()).with_dialer(Arc::new(SimDial));
        opts.connect_timeout = Duration::from_millis(500);
        opts.write_timeout = Duration::from_secs(1);
        opts.read_timeout = Duration::from_secs(1);
        opts.wait_ms = 300;
        opts.backoff_min = Duration::from_millis(20);
        opts.backoff_max = Duration::from_millis(300);
        let addr = format!("{leader}:{REPL_PORT}");
        let log = Arc::clone(&self.log);
        let world = Arc::clone(&self.world);
        let me = self.name.clone();
        let handle = tokio::task::spawn_local(async move {
            let status = Arc::new(FollowerStatus::default());
            let end = follow(addr, log, opts, rx, status).await;
            if let Err(e) = end {
                world.event(format!("{me}: replication stopped: {e}"));
            }
        });
        self.world.event(format!("{} follows {leader}", self.name));
        let leader = leader.to_owned();
        self.follow = Some(RoleTask {
            leader,
            stop,
            handle,
        });
    }

    /// Stops the follower task (`serve` false) or the server (`serve` true), and checks that
    /// it ends within the bound: EveryStopStops.
    async fn stop_role(&mut self, serve: bool) {
        let task = if serve {
            self.serve.take()
        } else {
            self.follow.take()
        };
        let Some(mut t) = task else { return };
        let _ = t.stop.send(true);
        let bound = self.world.cfg.stop_bound;
        let ended = timeout(bound, &mut t.handle).await;
        if let Ok(Err(e)) = &ended {
            if e.is_panic() {
                self.world
                    .violation(format!("{}: a role task panicked: {e}", self.name));
            }
        }
        if ended.is_err() {
            let what = if serve {
                "serving followers"
            } else {
                "following"
            };
            self.world.violation(format!(
                "EveryStopStops: {} {what} {} did not stop within {bound:?}",
                self.name, t.leader
            ));
            t.handle.abort();
        }
    }
}

impl Node {
    /// Campaigns once (see the module doc); leads if it wins.
    async fn campaign(&mut self, (sent, ttl): (Instant, Duration)) -> Result<(), String> {
        let isr_kv = self.etcd.get(KEY_ISR).await?;
        let isr: Option<IsrVal> = isr_kv.as_ref().map(|kv| decode(&kv.value)).transpose()?;
        let outside = !may_campaign(isr.as_ref(), &self.name);
        if outside && !self.world.cfg.has(Flaw::CampaignOutsideIsr) {
            return Ok(());
        }
        let epoch_kv = self.etcd.get(KEY_EPOCH).await?;
        let counter: u32 = epoch_kv
            .as_ref()
            .map(|kv| decode(&kv.value))
            .transpose()?
            .unwrap_or(0);
        let known = roost_replication::FollowerLog::current_epoch(self.log.as_ref());
        let epoch = if self.world.cfg.has(Flaw::EpochFromNode) {
            roost_replication::FollowerLog::last_epoch(self.log.as_ref()) + 1
        } else {
            counter.max(known).saturating_add(1)
        };
        let members = isr_after_win(isr.as_ref(), &self.name);
        let rev = |kv: &Option<crate::etcd::Kv>| kv.as_ref().map_or(0, |k| k.mod_revision);
        let leader = LeaderVal {
            name: self.name.clone(),
            advertise: format!("{}:{REPL_PORT}", self.name),
            epoch,
        };
        let new_isr = IsrVal {
            epoch,
            leader: self.name.clone(),
            members: members.clone(),
        };
        let compare = vec![
            Cmp::CreateRevision(KEY_LEADER.into(), 0),
            Cmp::ModRevision(KEY_EPOCH.into(), rev(&epoch_kv)),
            Cmp::ModRevision(KEY_ISR.into(), rev(&isr_kv)),
        ];
        let put = |key: &str, value: String, lease| Op::Put {
            key: key.into(),
            value,
            lease,
        };
        let success = vec![
            put(KEY_LEADER, encode(&leader), Some(self.lease_id)),
            put(KEY_EPOCH, encode(&epoch), None),
            put(KEY_ISR, encode(&new_isr), None),
        ];
        let Some(won_rev) = self.etcd.txn(compare, success).await? else {
            return Ok(());
        };
        let fence_at = self.renew_after_win(sent + self.fence_after(ttl)).await;
        self.promote(epoch, won_rev, fence_at, new_isr).await
    }

    /// TTL less the fencing margin (a quarter), in simulated time on this node's clock.
    fn fence_after(&self, ttl: Duration) -> Duration {
        let valid = if self.world.cfg.has(Flaw::NoMargin) {
            ttl
        } else {
            fence_after(ttl)
        };
        self.local(valid)
    }

    /// `renew_after_win`: a renewal right after the win may move the deadline on.
    async fn renew_after_win(&self, before: Instant) -> Instant {
        let sent = Instant::now();
        match self.etcd.keepalive(self.lease_id).await {
            Ok(Some(ttl)) => before.max(sent + self.fence_after(Duration::from_millis(ttl))),
            _ => before,
        }
    }

    /// The winner leads `epoch`: stops following, becomes the log's leader, serves.
    async fn promote(
        &mut self,
        epoch: u32,
        rev: i64,
        fence_at: Instant,
        isr: IsrVal,
    ) -> Result<(), String> {
        self.stop_role(false).await;
        let standbys: BTreeSet<String> = isr
            .members
            .iter()
            .filter(|n| **n != self.name)
            .cloned()
            .collect();
        let listener = match turmoil::net::TcpListener::bind(("0.0.0.0", REPL_PORT)).await {
            Ok(l) => l,
            Err(e) => {
                let _ = self.etcd.revoke(self.lease_id).await;
                self.lease_id = 0;
                return Err(format!("won epoch {epoch} but cannot listen: {e}"));
            }
        };
        let names: Vec<&str> = standbys.iter().map(String::as_str).collect();
        self.log.forget_standbys();
        self.mem().become_leader(epoch, &names);
        self.world.record().elections += 1;
        self.world.event(format!(
            "{} wins epoch {epoch} (log end {}, isr {:?})",
            self.name,
            self.mem().end(),
            isr.members
        ));
        self.start_serving(listener);
        self.lead = Some(Lead {
            epoch,
            rev,
            fence_at,
            led_since: Instant::now(),
            isr_mem: standbys,
            isr_etcd: Some(isr),
            pending: Vec::new(),
            written: 0,
        });
        Ok(())
    }

    fn start_serving(&mut self, listener: turmoil::net::TcpListener) {
        let (stop, rx) = watch::channel(false);
        let opts = LeaderOptions {
            idle_timeout: Duration::from_secs(3),
            write_timeout: Duration::from_secs(1),
            wait_max: Duration::from_secs(1),
            ..LeaderOptions::default()
        };
        let log = Arc::clone(&self.log);
        let listener = Box::new(SimListen(listener));
        let handle = tokio::task::spawn_local(serve_followers_on(listener, log, opts, rx));
        self.serve = Some(RoleTask {
            leader: self.name.clone(),
            stop,
            handle,
        });
    }
}

/// What a leader's periodic check decided.
enum Step {
    Leading,
    Fence(String),
}

/// A renewal's send time and etcd's answer.
type Renewal = (Instant, Result<Option<u64>, String>);

impl Node {
    /// Leads until fenced or stopped (the agent's `lead`): the renewals and the periodic
    /// check run beside each other, neither waits on the other.
    async fn lead_loop(&mut self) {
        let tick = self.local(self.world.cfg.ttl / 4);
        let every = self.local(self.world.cfg.ttl / 8);
        let mut renewals: JoinSet<Renewal> = JoinSet::new();
        let mut check: Option<JoinHandle<CheckOut>> = None;
        let mut next_send = Instant::now();
        let mut next_check = Some(Instant::now());
        let mut next_work = Instant::now();
        let why = loop {
            let Some(fence_at) = self.lead.as_ref().map(|l| l.fence_at) else {
                return;
            };
            tokio::select! {
                _ = sleep_until(fence_at) => break "the lease was not renewed in time".to_owned(),
                _ = self.stop.changed() => break String::new(),
                _ = sleep_until(next_send) => {
                    next_send = Instant::now() + every;
                    self.send_renewal(&mut renewals, fence_at);
                }
                Some(done) = renewals.join_next(), if !renewals.is_empty() => {
                    if let Err(why) = self.renewed(done) {
                        break why;
                    }
                }
                done = join_some(&mut check) => {
                    check = None;
                    next_check = Some(Instant::now() + tick);
                    if let Some(why) = self.checked(done) {
                        break why;
                    }
                }
                _ = sleep_until_some(next_check) => {
                    next_check = None;
                    check = self.spawn_check();
                }
                _ = sleep_until(next_work) => {
                    let pause = self.rng.ms(5, 40);
                    next_work = Instant::now() + self.local(pause);
                    if self.mem().leader_epoch().is_none() {
                        break "a follower knew a newer epoch".to_owned();
                    }
                    self.work();
                }
            }
        };
        if let Some(c) = check {
            c.abort();
        }
        if !why.is_empty() {
            self.fence(&why).await;
        }
    }

    fn send_renewal(&self, set: &mut JoinSet<Renewal>, deadline: Instant) {
        if set.len() >= 8 {
            return;
        }
        let sent = Instant::now();
        let left = deadline.saturating_duration_since(sent);
        let etcd = Client {
            limit: left.max(Duration::from_millis(50)),
        };
        let id = self.lease_id;
        set.spawn_local(async move { (sent, etcd.keepalive(id).await) });
    }

    /// A renewal's answer moves the deadline on (never back); a lease gone is `Err`.
    fn renewed(&mut self, done: Result<Renewal, tokio::task::JoinError>) -> Result<(), String> {
        match done {
            Ok((sent, Ok(Some(ttl)))) => {
                let at = sent + self.fence_after(Duration::from_millis(ttl));
                if let Some(l) = self.lead.as_mut() {
                    l.fence_at = l.fence_at.max(at);
                }
                Ok(())
            }
            Ok((_, Ok(None))) => Err("the leadership lease expired in etcd".into()),
            Ok((_, Err(_))) | Err(_) => Ok(()),
        }
    }

    /// Fenced: no more answers; the server stops (bounded); the node follows again.
    async fn fence(&mut self, why: &str) {
        let Some(l) = self.lead.take() else { return };
        self.mem().resign();
        self.world
            .event(format!("{} fenced in epoch {}: {why}", self.name, l.epoch));
        self.stop_role(true).await;
    }
}

/// Resolves with the task's output once it ends; never while there is none.
async fn join_some(task: &mut Option<JoinHandle<CheckOut>>) -> Option<CheckOut> {
    match task {
        Some(t) => t.await.ok(),
        None => std::future::pending().await,
    }
}

/// Resolves at `at`, never when `None`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What a leader's periodic check works from (taken at its start; it runs beside the
/// renewals, as the agent's `lead_step` does).
struct Check {
    etcd: Client,
    log: Arc<SimLog>,
    world: Arc<World>,
    name: String,
    epoch: u32,
    rev: i64,
    isr_mem: BTreeSet<String>,
    isr_etcd: Option<IsrVal>,
    /// This node has led for less than the standby timeout (its clock).
    patient: bool,
    standby_timeout: Duration,
}

/// The check's decision and the ISR it leaves, in the engine and in etcd.
struct CheckOut {
    step: Result<Step, String>,
    isr_mem: BTreeSet<String>,
    isr_etcd: Option<IsrVal>,
}

impl Node {
    fn spawn_check(&self) -> Option<JoinHandle<CheckOut>> {
        let l = self.lead.as_ref()?;
        let c = Check {
            etcd: self.etcd.clone(),
            log: Arc::clone(&self.log),
            world: Arc::clone(&self.world),
            name: self.name.clone(),
            epoch: l.epoch,
            rev: l.rev,
            isr_mem: l.isr_mem.clone(),
            isr_etcd: l.isr_etcd.clone(),
            patient: l.led_since.elapsed() < self.local(self.world.cfg.standby_timeout),
            standby_timeout: self.local(self.world.cfg.standby_timeout),
        };
        Some(tokio::task::spawn_local(lead_step(c)))
    }

    /// Takes a check's outcome in; `Some(why)` to fence.
    fn checked(&mut self, done: Option<CheckOut>) -> Option<String> {
        let out = done?;
        if let Some(l) = self.lead.as_mut() {
            l.isr_mem = out.isr_mem;
            l.isr_etcd = out.isr_etcd;
        }
        match out.step {
            Ok(Step::Leading) => None,
            Ok(Step::Fence(why)) => Some(why),
            Err(e) => {
                self.world.event(format!("{}: {e}", self.name));
                None
            }
        }
    }
}

/// The agent's `lead_step`: the leader key still ours (its create revision), then the ISR.
async fn lead_step(mut c: Check) -> CheckOut {
    let step = match c.etcd.get(KEY_LEADER).await {
        Err(e) => Err(e),
        Ok(kv) if kv.as_ref().map(|k| k.create_revision) != Some(c.rev) => Ok(Step::Fence(
            "etcd no longer names this node the leader".into(),
        )),
        Ok(_) => keep_isr(&mut c).await,
    };
    CheckOut {
        step,
        isr_mem: c.isr_mem,
        isr_etcd: c.isr_etcd,
    }
}

/// The agent's `keep_isr` (see the module doc for the order of the writes).
async fn keep_isr(c: &mut Check) -> Result<Step, String> {
    let (add, remove) = isr_changes(c);
    let mut members: BTreeSet<String> = c.isr_mem.union(&add).cloned().collect();
    for n in &remove {
        members.remove(n);
    }
    members.insert(c.name.clone());
    let written = c.isr_etcd.as_ref().filter(|v| v.epoch == c.epoch);
    let same =
        written.is_some_and(|v| v.members.iter().cloned().collect::<BTreeSet<_>>() == members);
    if add.is_empty() && remove.is_empty() && same {
        return Ok(Step::Leading);
    }
    let cfg = &c.world.cfg;
    let grow_first = !cfg.has(Flaw::IsrGrowStoreFirst);
    let shrink_first = cfg.has(Flaw::IsrShrinkMemoryFirst);
    let standbys: BTreeSet<String> = members.iter().filter(|n| **n != c.name).cloned().collect();
    let grown: BTreeSet<String> = c.isr_mem.union(&add).cloned().collect();
    if grow_first {
        set_isr(c, &grown);
    }
    if shrink_first {
        set_isr(c, &standbys);
    }
    let isr = IsrVal {
        epoch: c.epoch,
        leader: c.name.clone(),
        members: members.into_iter().collect(),
    };
    let compare = vec![Cmp::CreateRevision(KEY_LEADER.into(), c.rev)];
    let put = Op::Put {
        key: KEY_ISR.into(),
        value: encode(&isr),
        lease: None,
    };
    if c.etcd.txn(compare, vec![put]).await?.is_none() {
        return Ok(Step::Fence(
            "etcd refused the ISR update: not the leader".into(),
        ));
    }
    set_isr(c, &standbys);
    c.world.event(format!(
        "{} isr {:?} epoch {}",
        c.name, isr.members, c.epoch
    ));
    c.isr_etcd = Some(isr);
    Ok(Step::Leading)
}

/// The engine's ISR (standbys whose acknowledgements the hw waits for).
fn set_isr(c: &mut Check, standbys: &BTreeSet<String>) {
    if c.log.mem.leader_epoch() != Some(c.epoch) {
        return;
    }
    let names: Vec<&str> = standbys.iter().map(String::as_str).collect();
    c.log.mem.set_isr(&names);
    c.isr_mem = standbys.clone();
}

/// The agent's `isr_changes`/`IsrRule::changes` (`keep_one` off: the last standby may
/// leave): `(join, leave)`.
fn isr_changes(c: &Check) -> (BTreeSet<String>, BTreeSet<String>) {
    let floor = c.log.epoch_start(c.epoch).max(c.log.mem.hw());
    let now = crate::etcd::now();
    let standbys = c.log.standbys();
    let fresh = |s: &crate::log::Standby| {
        s.connected && !s.behind && now.saturating_sub(s.last_fetch) < c.standby_timeout
    };
    let add = standbys
        .iter()
        .filter(|(n, s)| **n != c.name && !c.isr_mem.contains(*n) && fresh(s))
        .filter(|(_, s)| s.acked >= floor && s.acked > 0)
        .map(|(n, _)| n.clone())
        .collect();
    let leaves = |n: &&String| match standbys.get(*n) {
        Some(st) if st.behind => true,
        _ if c.patient => false,
        st => !st.is_some_and(fresh),
    };
    let remove = c.isr_mem.iter().filter(leaves).cloned().collect();
    (add, remove)
}

impl Node {
    /// The engine's stand-in: now and then a record (a batch) is written, the log synced,
    /// and every written record the hw passed is answered, while the lease is valid on this
    /// node's clock and the log still leads this epoch.
    fn work(&mut self) {
        let Some(l) = self.lead.as_mut() else { return };
        let mem = &self.log.mem;
        let valid = Instant::now() < l.fence_at;
        if valid && self.rng.chance(0.5) && mem.leader_epoch() == Some(l.epoch) {
            l.written += 1;
            let payload = format!("{}:{}:{}", self.name, l.epoch, l.written);
            l.pending.push(mem.write(0, payload.as_bytes()));
        }
        if self.rng.chance(0.4) {
            mem.sync();
        }
        let hw = mem.hw();
        let due = l.pending.iter().take_while(|&&lsn| lsn < hw).count();
        let answered: Vec<u64> = l.pending.drain(..due).collect();
        if !(valid && mem.leader_epoch() == Some(l.epoch)) {
            return;
        }
        let (epoch, entries) = (l.epoch, mem.entries());
        for lsn in answered {
            let Some(e) = usize::try_from(lsn - 1).ok().and_then(|i| entries.get(i)) else {
                continue;
            };
            crate::check::on_answer(&self.world, self.idx, epoch, e.clone(), crate::etcd::now());
        }
    }
}
