//! The canonical encoding of a state: every variable, in a fixed order, as digits of one
//! mixed-radix number in a `u128`. Injective on type-correct states (each digit's radix is the
//! size of the variable's type), so the explorer's visited set holds these keys, not states.

use crate::types::{Config, Log, QuorumState, Record, ReplicaSet, ReplicaState, Requests, State};

/// Appends digits, least significant first. `None` once a digit is out of its range or the
/// number overflows. The election model (`election/encode.rs`) packs its states with it too.
pub(crate) struct Packer {
    key: u128,
    weight: u128,
    ok: bool,
}

impl Packer {
    pub(crate) fn new() -> Packer {
        Packer {
            key: 0,
            weight: 1,
            ok: true,
        }
    }

    /// The key, if every digit was in range and the number fits.
    pub(crate) fn key(&self) -> Option<u128> {
        self.ok.then_some(self.key)
    }

    pub(crate) fn push(&mut self, digit: u32, radix: u32) {
        if !self.ok || digit >= radix {
            self.ok = false;
            return;
        }
        match (
            self.weight.checked_mul(u128::from(digit)),
            self.weight.checked_mul(u128::from(radix)),
        ) {
            (Some(add), Some(weight)) => match self.key.checked_add(add) {
                Some(key) => {
                    self.key = key;
                    self.weight = weight;
                }
                None => self.ok = false,
            },
            _ => self.ok = false,
        }
    }
}

/// Reads digits back in the order they were pushed.
pub(crate) struct Unpacker(pub(crate) u128);

impl Unpacker {
    pub(crate) fn pop(&mut self, radix: u32) -> u32 {
        let digit = self.0 % u128::from(radix);
        self.0 /= u128::from(radix);
        digit as u32
    }
}

/// The radices, derived from the constants.
struct Radix {
    offset: u32,
    record: u32,
    epoch_opt: u32,
    replica_opt: u32,
    set: u32,
    request: u32,
}

impl Radix {
    fn of(cfg: &Config) -> Radix {
        let epochs = u32::from(cfg.max_leader_epoch) + 1;
        let replica_opt = u32::from(cfg.replicas) + 1;
        let set = 1u32 << cfg.replicas;
        Radix {
            offset: u32::from(cfg.log_size) + 1,
            record: 1 + u32::from(cfg.max_records) * epochs,
            epoch_opt: epochs + 1,
            replica_opt,
            set,
            request: 1 + replica_opt * set,
        }
    }
}

fn replica_opt_digit(cfg: &Config, r: Option<u8>) -> u32 {
    u32::from(r.unwrap_or(cfg.replicas))
}

fn replica_opt_of(cfg: &Config, digit: u32) -> Option<u8> {
    (digit < u32::from(cfg.replicas)).then_some(digit as u8)
}

/// `Nil` is 0, a record is `1 + id * epochs + epoch`.
fn record_digit(cfg: &Config, r: Option<Record>) -> u32 {
    match r {
        None => 0,
        Some(r) if r.epoch < 0 => u32::MAX,
        Some(r) => 1 + u32::from(r.id) * (u32::from(cfg.max_leader_epoch) + 1) + r.epoch as u32,
    }
}

fn record_of(cfg: &Config, digit: u32) -> Option<Record> {
    let epochs = u32::from(cfg.max_leader_epoch) + 1;
    (digit > 0).then(|| Record {
        id: ((digit - 1) / epochs) as u8,
        epoch: ((digit - 1) % epochs) as i8,
    })
}

fn push_quorum(p: &mut Packer, cfg: &Config, x: &Radix, q: &QuorumState) {
    p.push((i16::from(q.leader_epoch) + 1) as u32, x.epoch_opt);
    p.push(replica_opt_digit(cfg, q.leader), x.replica_opt);
    p.push(u32::from(q.isr.0), x.set);
}

/// The key of a state, or `None` if a variable is outside its type (then `TypeOk` is false).
pub fn encode(cfg: &Config, s: &State) -> Option<u128> {
    let x = Radix::of(cfg);
    let mut p = Packer::new();
    for r in cfg.all() {
        let log = s.log(r);
        p.push(u32::from(log.end_offset), x.offset);
        for offset in cfg.offsets() {
            p.push(
                record_digit(cfg, log.records[usize::from(offset)]),
                x.record,
            );
        }
        let rs = s.rs(r);
        p.push(u32::from(rs.hw), x.offset);
        p.push((i16::from(rs.leader_epoch) + 1) as u32, x.epoch_opt);
        p.push(replica_opt_digit(cfg, rs.leader), x.replica_opt);
        p.push(u32::from(rs.isr.0), x.set);
    }
    p.push(u32::from(s.next_record_id), u32::from(cfg.max_records) + 1);
    p.push(u32::from(s.next_leader_epoch), x.epoch_opt);
    for slot in &s.leader_and_isr_requests.by_epoch[..=usize::from(cfg.max_leader_epoch)] {
        let digit = slot.map_or(0, |(leader, isr)| {
            1 + replica_opt_digit(cfg, leader) * x.set + u32::from(isr.0)
        });
        p.push(digit, x.request);
    }
    push_quorum(&mut p, cfg, &x, &s.quorum_state);
    p.key()
}

fn pop_quorum(u: &mut Unpacker, cfg: &Config, x: &Radix) -> QuorumState {
    let leader_epoch = u.pop(x.epoch_opt) as i8 - 1;
    let leader = replica_opt_of(cfg, u.pop(x.replica_opt));
    QuorumState {
        leader_epoch,
        leader,
        isr: ReplicaSet(u.pop(x.set) as u8),
    }
}

/// The state of a key `encode` made.
pub fn decode(cfg: &Config, key: u128) -> State {
    let x = Radix::of(cfg);
    let mut u = Unpacker(key);
    let mut s = crate::base::init(cfg);
    for r in cfg.all() {
        let mut log = Log {
            end_offset: u.pop(x.offset) as u8,
            ..Log::EMPTY
        };
        for offset in cfg.offsets() {
            log.records[usize::from(offset)] = record_of(cfg, u.pop(x.record));
        }
        s.set_log(r, log);
        *s.rs_mut(r) = ReplicaState {
            hw: u.pop(x.offset) as u8,
            leader_epoch: u.pop(x.epoch_opt) as i8 - 1,
            leader: replica_opt_of(cfg, u.pop(x.replica_opt)),
            isr: ReplicaSet(u.pop(x.set) as u8),
        };
    }
    s.next_record_id = u.pop(u32::from(cfg.max_records) + 1) as u8;
    s.next_leader_epoch = u.pop(x.epoch_opt) as u8;
    let mut requests = Requests::default();
    for slot in requests.by_epoch[..=usize::from(cfg.max_leader_epoch)].iter_mut() {
        let digit = u.pop(x.request);
        *slot = (digit > 0).then(|| {
            let (leader, isr) = ((digit - 1) / x.set, (digit - 1) % x.set);
            (replica_opt_of(cfg, leader), ReplicaSet(isr as u8))
        });
    }
    s.leader_and_isr_requests = requests;
    s.quorum_state = pop_quorum(&mut u, cfg, &x);
    s
}

/// Whether the largest state of these constants packs into 128 bits.
pub fn fits(cfg: &Config) -> bool {
    let x = Radix::of(cfg);
    let mut p = Packer::new();
    let per_replica = [x.offset, x.offset, x.epoch_opt, x.replica_opt, x.set];
    for _ in cfg.all() {
        per_replica
            .iter()
            .for_each(|&radix| p.push(radix - 1, radix));
        cfg.offsets().for_each(|_| p.push(x.record - 1, x.record));
    }
    p.push(u32::from(cfg.max_records), u32::from(cfg.max_records) + 1);
    p.push(x.epoch_opt - 1, x.epoch_opt);
    (0..=cfg.max_leader_epoch).for_each(|_| p.push(x.request - 1, x.request));
    [x.epoch_opt, x.replica_opt, x.set]
        .iter()
        .for_each(|&radix| p.push(radix - 1, radix));
    p.key().is_some()
}
