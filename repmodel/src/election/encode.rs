//! The election state as one `u128`: every variable a digit of a mixed-radix number whose
//! radix is the size of its type, as `crate::encode` does for the Kafka family. Injective on
//! type-correct states; `None` for a state outside its type.

use super::state::{Answer, Batch, Config, Entry, Log, Node, Renewal, Role, State, Store};
use crate::encode::{Packer, Unpacker};
use crate::types::ReplicaSet;

/// The radices, from the constants.
struct Radix {
    node_opt: u32,
    epoch: u32,
    lease: u32,
    set: u32,
    entry: u32,
    hw: u32,
    deadline: u32,
    renewal: u32,
    batch_count: u32,
    answer: u32,
}

impl Radix {
    fn of(cfg: &Config) -> Radix {
        let nodes = u32::from(cfg.nodes);
        let epochs = u32::from(cfg.max_epoch);
        let view = u32::from(cfg.view_max()) + 1;
        Radix {
            node_opt: nodes + 1,
            epoch: epochs + 1,
            lease: u32::from(cfg.ttl) + 1,
            set: 1 << nodes,
            entry: 1 + u32::from(cfg.batches) * epochs,
            hw: u32::from(cfg.batches) + 1,
            deadline: view,
            renewal: 1 + view,
            batch_count: u32::from(cfg.batches) + 1,
            answer: 1 + epochs * nodes * 2,
        }
    }
}

fn opt_digit(cfg: &Config, n: Option<u8>) -> u32 {
    u32::from(n.unwrap_or(cfg.nodes))
}

fn opt_of(cfg: &Config, digit: u32) -> Option<u8> {
    (digit < u32::from(cfg.nodes)).then_some(digit as u8)
}

/// 0 for none; epochs start at 1.
fn entry_digit(cfg: &Config, e: Option<Entry>) -> u32 {
    match e {
        None => 0,
        Some(e) if e.epoch == 0 => u32::MAX,
        Some(e) => 1 + u32::from(e.batch) * u32::from(cfg.max_epoch) + u32::from(e.epoch - 1),
    }
}

fn entry_of(cfg: &Config, digit: u32) -> Option<Entry> {
    let epochs = u32::from(cfg.max_epoch);
    (digit > 0).then(|| Entry {
        batch: ((digit - 1) / epochs) as u8,
        epoch: ((digit - 1) % epochs) as u8 + 1,
    })
}

fn renewal_digit(x: &Radix, r: Renewal) -> u32 {
    match r {
        Renewal::Idle => 0,
        Renewal::Sent { age } if u32::from(age) < x.deadline => 1 + u32::from(age),
        Renewal::Sent { .. } => u32::MAX,
    }
}

fn renewal_of(digit: u32) -> Renewal {
    match digit {
        0 => Renewal::Idle,
        d => Renewal::Sent { age: (d - 1) as u8 },
    }
}

fn answer_digit(cfg: &Config, a: Option<Answer>) -> u32 {
    match a {
        None => 0,
        Some(a) if a.epoch == 0 || a.by >= cfg.nodes => u32::MAX,
        Some(a) => {
            let epoch = u32::from(a.epoch - 1);
            1 + (epoch * u32::from(cfg.nodes) + u32::from(a.by)) * 2 + u32::from(a.in_lease)
        }
    }
}

fn answer_of(cfg: &Config, digit: u32) -> Option<Answer> {
    (digit > 0).then(|| {
        let d = digit - 1;
        Answer {
            epoch: (d / 2 / u32::from(cfg.nodes)) as u8 + 1,
            by: (d / 2 % u32::from(cfg.nodes)) as u8,
            in_lease: d % 2 == 1,
        }
    })
}

fn push_node(p: &mut Packer, cfg: &Config, x: &Radix, n: &Node) {
    p.push(u32::from(n.is_leader()), 2);
    p.push(u32::from(n.epoch), x.epoch);
    for slot in &n.log.entries[..usize::from(cfg.batches)] {
        p.push(entry_digit(cfg, *slot), x.entry);
    }
    p.push(u32::from(n.durable), x.hw);
    p.push(u32::from(n.hw), x.hw);
    p.push(u32::from(n.isr.0), x.set);
    p.push(u32::from(n.deadline), x.deadline);
    p.push(renewal_digit(x, n.renewal), x.renewal);
    p.push(u32::from(n.checked), 2);
}

fn pop_node(u: &mut Unpacker, cfg: &Config, x: &Radix) -> Node {
    let role = if u.pop(2) == 1 {
        Role::Leader
    } else {
        Role::Follower
    };
    let epoch = u.pop(x.epoch) as u8;
    let mut log = Log::default();
    for slot in log.entries[..usize::from(cfg.batches)].iter_mut() {
        *slot = entry_of(cfg, u.pop(x.entry));
    }
    Node {
        role,
        epoch,
        log,
        durable: u.pop(x.hw) as u8,
        hw: u.pop(x.hw) as u8,
        isr: ReplicaSet(u.pop(x.set) as u8),
        deadline: u.pop(x.deadline) as u8,
        renewal: renewal_of(u.pop(x.renewal)),
        checked: u.pop(2) == 1,
    }
}

/// A log is canonical when nothing follows its first empty slot.
fn canonical(log: &Log) -> bool {
    log.entries[usize::from(log.end())..]
        .iter()
        .all(Option::is_none)
}

/// The key of a state, or `None` if a variable is outside its type.
pub fn encode(cfg: &Config, s: &State) -> Option<u128> {
    let x = Radix::of(cfg);
    let mut p = Packer::new();
    p.push(opt_digit(cfg, s.store.holder), x.node_opt);
    p.push(u32::from(s.store.epoch), x.epoch);
    p.push(u32::from(s.store.lease), x.lease);
    p.push(u32::from(s.store.isr.0), x.set);
    for n in cfg.all() {
        let node = s.node(n);
        if !canonical(&node.log) || node.durable > node.log.end() {
            return None;
        }
        push_node(&mut p, cfg, &x, s.node(n));
    }
    p.push(u32::from(s.next_batch), x.batch_count);
    for b in &s.batches[..usize::from(cfg.batches)] {
        p.push(opt_digit(cfg, b.via), x.node_opt);
        p.push(answer_digit(cfg, b.answer), x.answer);
    }
    p.key()
}

/// The state of a key `encode` made.
pub fn decode(cfg: &Config, key: u128) -> State {
    let x = Radix::of(cfg);
    let mut u = Unpacker(key);
    let mut s = State::init(cfg);
    s.store = Store {
        holder: opt_of(cfg, u.pop(x.node_opt)),
        epoch: u.pop(x.epoch) as u8,
        lease: u.pop(x.lease) as u8,
        isr: ReplicaSet(u.pop(x.set) as u8),
    };
    for n in cfg.all() {
        *s.node_mut(n) = pop_node(&mut u, cfg, &x);
    }
    s.next_batch = u.pop(x.batch_count) as u8;
    for b in s.batches[..usize::from(cfg.batches)].iter_mut() {
        *b = Batch {
            via: opt_of(cfg, u.pop(x.node_opt)),
            answer: answer_of(cfg, u.pop(x.answer)),
        };
    }
    s
}

/// Whether the largest state of these constants packs into 128 bits.
pub fn fits(cfg: &Config) -> bool {
    let x = Radix::of(cfg);
    let mut p = Packer::new();
    let mut most = |radix: u32| p.push(radix - 1, radix);
    [x.node_opt, x.epoch, x.lease, x.set]
        .into_iter()
        .for_each(&mut most);
    for _ in cfg.all() {
        [2, x.epoch, x.hw, x.hw, x.set, x.deadline, x.renewal, 2]
            .into_iter()
            .for_each(&mut most);
        (0..cfg.batches).for_each(|_| most(x.entry));
    }
    most(x.batch_count);
    (0..cfg.batches).for_each(|_| {
        most(x.node_opt);
        most(x.answer);
    });
    p.key().is_some()
}
