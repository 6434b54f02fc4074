//! The election model's constants and variables: the lease store, each node's view, and the
//! batches' history.
//!
//! Times are kept relative to the store's clock (ticks left, ticks since), so the state space
//! is finite without a bound on time: a state says how long each lease has left, not when it
//! was granted.

use std::fmt;

use crate::types::{Replica, ReplicaSet};

/// Capacity of the per-node arrays.
pub const MAX_NODES: usize = 4;
/// Capacity of the batch arrays and of a log (every batch is claimed at most once, so a log
/// never holds more entries than there are batches).
pub const MAX_BATCHES: usize = 3;
/// Epochs run `1..=max_epoch`; 0 is "none yet".
pub const MAX_EPOCH: u8 = 6;

/// What a leader waits for before it answers a batch (roost's `ack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    /// Its own durable claim: no standby needed.
    Local,
    /// Every in-memory ISR standby holds the claim (the leader's hw has passed it).
    Standby,
}

/// A deliberate flaw: each one removes a rule the design relies on, so a test can show the
/// invariant that rule keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// (a) A node believes its lease valid until send time + TTL: no fencing margin.
    NoMargin,
    /// (b) A node campaigns whether or not it is in the store's ISR.
    CampaignOutsideIsr,
    /// (c) A standby that caught up joins the store's ISR before the leader's memory.
    IsrGrowStoreFirst,
    /// (c') A lost standby leaves the leader's memory before the store's ISR.
    IsrShrinkMemoryFirst,
    /// (d) The leader counts a standby holding an offset whatever epoch the standby is in.
    AcksAcrossEpochs,
    /// (e) The winner takes its own last epoch + 1, not the store's counter + 1.
    EpochFromNode,
    /// (f) A standby counts as caught up once it reaches the leader's hw, not its log end.
    IsrGrowAtHw,
    /// (g) A leader handing over deletes its key before it stops answering.
    ResignBeforeStepDown,
    /// (h) A leader's hw may pass its own durable end: it counts what standbys hold of
    /// records it has written and not yet synced (only visible with `Config::crash`, and
    /// under ack=standby only when records are shipped before the leader's sync).
    HwPastDurable,
    /// (i) With `Config::fetch_before_sync`, the leader counts what a standby has written
    /// (its log end), not what it has synced, for its hw and for the standby's catch-up: the
    /// acknowledgement is the fetch position again.
    AckWritten,
    /// (i') With `Config::fetch_before_sync`, the hw counts a standby's durable end but its
    /// catch-up (its return to the ISR) counts its log end.
    CatchUpWritten,
    /// (j) With `Config::lost_win`, a node that finds the store naming it without leading
    /// adopts the win (`AdoptWin`) with its view of the lease counted from then, not from
    /// the renewal before its campaign: the wrong fix of a lost answer.
    AdoptLostWinFresh,
}

impl Flaw {
    pub const ALL: [Flaw; 12] = [
        Flaw::NoMargin,
        Flaw::CampaignOutsideIsr,
        Flaw::IsrGrowStoreFirst,
        Flaw::IsrShrinkMemoryFirst,
        Flaw::AcksAcrossEpochs,
        Flaw::EpochFromNode,
        Flaw::IsrGrowAtHw,
        Flaw::ResignBeforeStepDown,
        Flaw::HwPastDurable,
        Flaw::AckWritten,
        Flaw::CatchUpWritten,
        Flaw::AdoptLostWinFresh,
    ];

    /// The name printed in tables and accepted by the command line.
    pub fn key(self) -> &'static str {
        match self {
            Flaw::NoMargin => "no-margin",
            Flaw::CampaignOutsideIsr => "campaign-outside-isr",
            Flaw::IsrGrowStoreFirst => "isr-grow-store-first",
            Flaw::IsrShrinkMemoryFirst => "isr-shrink-memory-first",
            Flaw::AcksAcrossEpochs => "acks-across-epochs",
            Flaw::EpochFromNode => "epoch-from-node",
            Flaw::IsrGrowAtHw => "isr-grow-at-hw",
            Flaw::ResignBeforeStepDown => "resign-before-step-down",
            Flaw::HwPastDurable => "hw-past-durable",
            Flaw::AckWritten => "ack-written",
            Flaw::CatchUpWritten => "catch-up-written",
            Flaw::AdoptLostWinFresh => "adopt-lost-win-fresh",
        }
    }

    pub fn parse(key: &str) -> Option<Flaw> {
        Flaw::ALL.into_iter().find(|f| f.key() == key)
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// A set of flaws; empty for the design as built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flaws(u16);

impl Flaws {
    pub const NONE: Flaws = Flaws(0);

    pub fn has(self, flaw: Flaw) -> bool {
        self.0 & flaw.bit() != 0
    }

    pub fn with(self, flaw: Flaw) -> Flaws {
        Flaws(self.0 | flaw.bit())
    }

    pub fn iter(self) -> impl Iterator<Item = Flaw> {
        Flaw::ALL.into_iter().filter(move |&f| self.has(f))
    }
}

/// The model's constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    pub nodes: u8,
    /// Store ticks a lease lasts after the store grants or renews it.
    pub ttl: u8,
    /// Ticks a node takes off its own view of the lease (the fencing margin).
    pub margin: u8,
    /// Ticks a node's clock may lag the store's over one lease (rate skew): its deadline, in
    /// store time, falls this much later than it meant (the worst case is the one modelled).
    pub skew: u8,
    pub max_epoch: u8,
    /// Batches the clients send in a whole behaviour.
    pub batches: u8,
    pub ack: Ack,
    /// Whether a pause can fall between a leader's deadline check and its act (a real process
    /// can stop there); without it the check and the act are one step.
    pub gap: bool,
    /// Whether a leader may hand over (issue 42: a switchover, a graceful stop): it stops
    /// answering (`StepDown`), then deletes its key (`Resign`) so that another may win.
    pub handover: bool,
    /// Whether a node can lose power (issue 42): its log is cut to what it synced, and it
    /// starts again as a follower of the epoch it knew. Without it every claim is synced in
    /// the step that appends it.
    pub crash: bool,
    /// Whether a leader serves standbys records it has written and not yet synced (issue 42:
    /// the standby's sync overlaps the leader's, as Raft's leaders do). Without it a leader
    /// serves only its durable records (roost until now).
    pub ship_written: bool,
    /// Whether a standby fetches again before it has synced what it fetched (issue 42: a
    /// fetch in flight while the standby syncs, the convoy in docs/scaling.md): its log takes
    /// a record unsynced (its `Sync` step comes later), and its acknowledgement carries its
    /// durable end, apart from its fetch position. Without it a standby syncs what it
    /// fetched in the step that takes it, and its next fetch acknowledges it.
    pub fetch_before_sync: bool,
    /// Whether a campaign's winning transaction may be applied while its answer is lost
    /// (issue 42: "txn: no answer within 251ms", then no leader for a minute): the store
    /// names the node, which stays a follower of the epoch it knew (`CampaignAnswerLost`) and
    /// may then give the key up (`Resign`, as after a handover: the daemon revokes its lease).
    pub lost_win: bool,
    pub flaws: Flaws,
}

/// Constants the model cannot hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Two nodes: TTL 2, margin 1, skew 1, epochs 1..=3, 2 batches, pauses in the
    /// check-then-act gap, no flaw.
    pub const fn two_nodes(ack: Ack) -> Config {
        Config {
            nodes: 2,
            ttl: 2,
            margin: 1,
            skew: 1,
            max_epoch: 3,
            batches: 2,
            ack,
            gap: true,
            handover: false,
            crash: false,
            ship_written: false,
            fetch_before_sync: false,
            lost_win: false,
            flaws: Flaws::NONE,
        }
    }

    /// Three nodes (what an ISR change needs: a leader and two standbys), epochs 1..=2, one
    /// batch.
    pub const fn three_nodes(ack: Ack) -> Config {
        Config {
            nodes: 3,
            max_epoch: 2,
            batches: 1,
            ..Config::two_nodes(ack)
        }
    }

    pub const fn with_max_epoch(self, max_epoch: u8) -> Config {
        Config { max_epoch, ..self }
    }

    pub const fn with_batches(self, batches: u8) -> Config {
        Config { batches, ..self }
    }

    pub const fn without_gap(self) -> Config {
        Config { gap: false, ..self }
    }

    pub const fn with_handover(self) -> Config {
        Config {
            handover: true,
            ..self
        }
    }

    /// A winning campaign's answer may be lost (`Config::lost_win`).
    pub const fn with_lost_win(self) -> Config {
        Config {
            lost_win: true,
            ..self
        }
    }

    /// Nodes may lose power, and lose what they had not synced.
    pub const fn with_crash(self) -> Config {
        Config {
            crash: true,
            ..self
        }
    }

    /// A leader serves records before its own sync.
    pub const fn with_ship_written(self) -> Config {
        Config {
            ship_written: true,
            ..self
        }
    }

    /// A standby fetches before it syncs, and acknowledges its durable end.
    pub const fn with_fetch_before_sync(self) -> Config {
        Config {
            fetch_before_sync: true,
            ..self
        }
    }

    pub fn with(self, flaw: Flaw) -> Config {
        Config {
            flaws: self.flaws.with(flaw),
            ..self
        }
    }

    /// The margin the nodes apply: none under `Flaw::NoMargin`.
    pub fn margin(&self) -> u8 {
        if self.flaws.has(Flaw::NoMargin) {
            0
        } else {
            self.margin
        }
    }

    /// How long, in store ticks, a node's own view of its lease lasts after it sent the
    /// request that won or renewed it: ttl - margin + skew.
    pub fn view_max(&self) -> u8 {
        self.ttl - self.margin() + self.skew
    }

    pub fn all(&self) -> impl Iterator<Item = Replica> + Clone {
        0..self.nodes
    }

    pub fn node_set(&self) -> ReplicaSet {
        ReplicaSet((1u8 << self.nodes) - 1)
    }
}

/// An entry of a log: the claim of batch `batch`, made by the leader of `epoch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub batch: u8,
    pub epoch: u8,
}

/// A node's log; `None` past its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Log {
    pub entries: [Option<Entry>; MAX_BATCHES],
}

impl Log {
    pub fn end(&self) -> u8 {
        self.entries.iter().take_while(|e| e.is_some()).count() as u8
    }

    pub fn at(&self, offset: u8) -> Option<Entry> {
        self.entries.get(usize::from(offset)).copied().flatten()
    }

    /// The offset of `batch`'s claim, if this log holds it.
    pub fn offset_of(&self, batch: u8) -> Option<u8> {
        (0..self.end()).find(|&k| self.at(k).is_some_and(|e| e.batch == batch))
    }

    pub fn push(&mut self, entry: Entry) {
        let end = usize::from(self.end());
        self.entries[end] = Some(entry);
    }

    /// The log's first `end` entries.
    pub fn cut_to(&self, end: u8) -> Log {
        let mut out = *self;
        out.entries[usize::from(end).min(MAX_BATCHES)..].fill(None);
        out
    }

    /// The log cut to the longest prefix it shares with `leader`'s: what truncating by epoch
    /// (KIP-279's rounds against a leader whose log only grows) ends with.
    pub fn truncated_to_match(&self, leader: &Log) -> Log {
        let mut out = *self;
        let keep = (0..self.end())
            .take_while(|&k| self.at(k) == leader.at(k))
            .count();
        out.entries[keep..].fill(None);
        out
    }
}

/// What a node believes it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Follower,
    Leader,
}

/// A leader's lease renewal (etcd's keepalive) in flight. `age` is the ticks since the
/// request was sent (clamped at `Config::view_max`, past which a reply extends nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Renewal {
    Idle,
    /// Sent, not yet at the store.
    Sent {
        age: u8,
    },
}

/// One node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub role: Role,
    /// The epoch it leads or follows; 0 before it knows any.
    pub epoch: u8,
    pub log: Log,
    /// How much of `log` is synced (a standby syncs what a fetch brought before its next
    /// fetch acknowledges it, so its whole log is, except with `Config::fetch_before_sync`;
    /// a leader's claims, and then a standby's records, are synced by `Sync`).
    /// Without `Config::crash` a claim is synced in the step that appends it.
    pub durable: u8,
    /// A leader's high watermark: every offset below is held by every in-memory ISR standby
    /// (ack=standby) or by itself (ack=local). It starts at 0 in each term (a new leader
    /// counts again what its ISR holds); 0 for a follower.
    pub hw: u8,
    /// A leader's in-memory ISR: the standbys its hw waits for. Empty for a follower.
    pub isr: ReplicaSet,
    /// A leader's own view of its lease: store ticks until it believes the lease gone
    /// (0: passed). It fences when it sees 0.
    pub deadline: u8,
    pub renewal: Renewal,
    /// With the gap: it checked its deadline and has not acted since (one act allowed).
    pub checked: bool,
}

impl Node {
    pub const INIT: Node = Node {
        role: Role::Follower,
        epoch: 0,
        log: Log {
            entries: [None; MAX_BATCHES],
        },
        durable: 0,
        hw: 0,
        isr: ReplicaSet::EMPTY,
        deadline: 0,
        renewal: Renewal::Idle,
        checked: false,
    };

    pub fn is_leader(&self) -> bool {
        self.role == Role::Leader
    }
}

/// The etcd-like store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    /// The leader key's holder. The key carries the epoch it was won with, which is always
    /// `epoch`: the winning transaction writes both and nothing else writes either.
    pub holder: Option<Replica>,
    /// The epoch counter.
    pub epoch: u8,
    /// Ticks until the key's lease expires (0 with no key). The tick that brings it to 0
    /// deletes the key.
    pub lease: u8,
    /// The ISR as the store has it (names, the leader included): who may campaign.
    pub isr: ReplicaSet,
}

/// An answer given to a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Answer {
    /// A leader's answer: its epoch. A forwarding standby's: the epoch it follows, whose
    /// leader's hw it relays.
    pub epoch: u8,
    pub by: Replica,
    /// Whether the store held the answering node's key in its epoch at that moment.
    pub in_lease: bool,
}

/// One batch's history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Batch {
    /// The standby that took it from the client and forwarded it; `None`: sent to the leader.
    pub via: Option<Replica>,
    pub answer: Option<Answer>,
}

/// The whole state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub store: Store,
    pub nodes: [Node; MAX_NODES],
    /// Batches `0..next_batch` have been claimed.
    pub next_batch: u8,
    pub batches: [Batch; MAX_BATCHES],
}

impl State {
    pub fn init(cfg: &Config) -> State {
        State {
            store: Store {
                holder: None,
                epoch: 0,
                lease: 0,
                isr: cfg.node_set(),
            },
            nodes: [Node::INIT; MAX_NODES],
            next_batch: 0,
            batches: [Batch::default(); MAX_BATCHES],
        }
    }

    pub fn node(&self, n: Replica) -> &Node {
        &self.nodes[usize::from(n)]
    }

    pub fn node_mut(&mut self, n: Replica) -> &mut Node {
        &mut self.nodes[usize::from(n)]
    }

    /// The node that leads `epoch`, if it still believes it does.
    pub fn leader_of(&self, cfg: &Config, epoch: u8) -> Option<Replica> {
        cfg.all()
            .find(|&n| self.node(n).is_leader() && self.node(n).epoch == epoch)
    }

    /// Whether the store's key names `n` in the epoch `n` leads.
    pub fn holds_key(&self, n: Replica) -> bool {
        self.store.holder == Some(n) && self.store.epoch == self.node(n).epoch
    }
}
