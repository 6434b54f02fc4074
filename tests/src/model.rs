//! `RoostApplyBatch.tla` transcribed into Rust, and a breadth-first explorer of every
//! reachable state (a small TLC). Same variables, same actions, same invariants; the comments
//! name the TLA+ definition each piece mirrors. Sets are sorted vectors or bitmasks so states
//! hash cheaply.
//!
//! Ids: `Old` are `0..old`, `Fresh` are `old..old + fresh`; `NONE` is TLA+'s "none".
//! A record's `src` is 0 for a record that was there before, `k` for the create at op `k`
//! (1-based, as `Idx == 1..N`).

use std::collections::{HashMap, VecDeque};
use std::fmt;

pub const NONE: u8 = u8::MAX;

/// CONSTANTS Shards, Old, Fresh, N, Claiming.
#[derive(Clone, Copy, Debug)]
pub struct Constants {
    pub shards: u8,
    pub old: u8,
    pub fresh: u8,
    pub n: u8,
    pub claiming: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Create,
    Delete,
}

/// An element of `Ops`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    pub kind: Kind,
    pub shard: u8,
    /// `NONE` for a create; an `Old` id for a delete.
    pub id: u8,
}

/// `Phases`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Plan,
    Claim,
    Commit,
    Finish,
    Done,
    Rejected,
    Crashed,
}

/// An element of `Records`: `[id, src]`.
pub type Rec = (u8, u8);

/// VARIABLES ops, rejects, db0, db, dbStart, claim, phase, i, committed, ever, audit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub ops: Vec<Op>,
    /// Bit k-1: op k is rejected.
    pub rejects: u8,
    /// Per shard, a bitmask of `Old`.
    pub db0: Vec<u8>,
    /// Per shard, a sorted set of records.
    pub db: Vec<Vec<Rec>>,
    pub db_start: Vec<Vec<Rec>>,
    /// Per op (index k-1), the claimed id or `NONE`.
    pub claim: Vec<u8>,
    pub phase: Phase,
    pub i: u8,
    pub committed: u8,
    pub ever: u8,
    /// Bit k-1: op k audited.
    pub audit: u8,
}

fn bit(k: u8) -> u8 {
    1 << (k - 1)
}

fn all_shards(c: &Constants) -> u8 {
    ((1u16 << c.shards) - 1) as u8
}

fn all_idx(c: &Constants) -> u8 {
    ((1u16 << c.n) - 1) as u8
}

impl State {
    fn op(&self, k: u8) -> Op {
        self.ops[k as usize - 1]
    }

    /// `Apply(S, k)`.
    fn apply(&self, s: &[Rec], k: u8) -> Vec<Rec> {
        let op = self.op(k);
        let mut out: Vec<Rec> = match op.kind {
            Kind::Create => {
                let mut v = s.to_vec();
                v.push((self.claim[k as usize - 1], k));
                v
            }
            Kind::Delete => s.iter().copied().filter(|r| r.0 != op.id).collect(),
        };
        out.sort_unstable();
        out.dedup();
        out
    }

    /// `ApplyUpTo(S, s, k)`.
    fn apply_up_to(&self, s_set: &[Rec], s: u8, k: u8) -> Vec<Rec> {
        let mut cur = s_set.to_vec();
        for j in 1..=k {
            if self.op(j).shard == s {
                cur = self.apply(&cur, j);
            }
        }
        cur
    }

    fn creates(&self) -> impl Iterator<Item = u8> + '_ {
        (1..=self.ops.len() as u8).filter(|k| self.op(*k).kind == Kind::Create)
    }

    /// `UsedIds`.
    fn used_ids(&self) -> u64 {
        let mut m = 0u64;
        for s in &self.db {
            for r in s {
                m |= 1 << r.0;
            }
        }
        for c in &self.claim {
            if *c != NONE {
                m |= 1 << c;
            }
        }
        m
    }
}

/// `Before(D)`.
fn before(db0: &[u8], c: &Constants) -> Vec<Vec<Rec>> {
    db0.iter()
        .map(|m| {
            (0..c.old)
                .filter(|x| m & (1 << x) != 0)
                .map(|x| (x, 0))
                .collect()
        })
        .collect()
}

fn all_ops(c: &Constants) -> Vec<Op> {
    let mut v = Vec::new();
    for s in 0..c.shards {
        v.push(Op {
            kind: Kind::Create,
            shard: s,
            id: NONE,
        });
    }
    for s in 0..c.shards {
        for id in 0..c.old {
            v.push(Op {
                kind: Kind::Delete,
                shard: s,
                id,
            });
        }
    }
    v
}

/// `Init`: every assignment of ops, rejects and db0.
pub fn init(c: &Constants) -> Vec<State> {
    let ops_all = all_ops(c);
    let mut opss: Vec<Vec<Op>> = vec![vec![]];
    for _ in 0..c.n {
        opss = opss
            .into_iter()
            .flat_map(|p| {
                ops_all.iter().map(move |o| {
                    let mut q = p.clone();
                    q.push(*o);
                    q
                })
            })
            .collect();
    }
    let mut db0s: Vec<Vec<u8>> = vec![vec![]];
    for _ in 0..c.shards {
        db0s = db0s
            .into_iter()
            .flat_map(|p| {
                (0..(1u8 << c.old)).map(move |m| {
                    let mut q = p.clone();
                    q.push(m);
                    q
                })
            })
            .collect();
    }
    let mut out = Vec::new();
    for ops in &opss {
        for rejects in 0..=all_idx(c) {
            for db0 in &db0s {
                let db = before(db0, c);
                out.push(State {
                    ops: ops.clone(),
                    rejects,
                    db0: db0.clone(),
                    db_start: db.clone(),
                    db,
                    claim: vec![NONE; c.n as usize],
                    phase: Phase::Plan,
                    i: 1,
                    committed: 0,
                    ever: 0,
                    audit: 0,
                });
            }
        }
    }
    out
}

/// `Next`: every successor with the name of the action that leads to it.
pub fn next(st: &State, c: &Constants) -> Vec<(String, State)> {
    let mut out = Vec::new();
    // Plan
    if st.phase == Phase::Plan && st.i <= c.n {
        let mut t = st.clone();
        if st.rejects & bit(st.i) != 0 {
            t.phase = Phase::Rejected;
        } else {
            t.i = st.i + 1;
            t.phase = if st.i == c.n {
                Phase::Claim
            } else {
                Phase::Plan
            };
        }
        out.push((format!("Plan (op {})", st.i), t));
    }
    // Claim: fresh, distinct ids for the unclaimed creates.
    if st.phase == Phase::Claim {
        let unclaimed: Vec<u8> = st
            .creates()
            .filter(|k| st.claim[*k as usize - 1] == NONE)
            .collect();
        let used = st.used_ids();
        let avail: Vec<u8> = (c.old..c.old + c.fresh)
            .filter(|x| used & (1 << x) == 0)
            .collect();
        let mut choices: Vec<Vec<u8>> = vec![vec![]];
        for _ in &unclaimed {
            let mut grown = Vec::new();
            for p in &choices {
                for x in avail.iter().filter(|x| !p.contains(x)) {
                    let mut q = p.clone();
                    q.push(*x);
                    grown.push(q);
                }
            }
            choices = grown;
        }
        for f in choices {
            let mut t = st.clone();
            for (k, x) in unclaimed.iter().zip(&f) {
                t.claim[*k as usize - 1] = *x;
            }
            t.phase = Phase::Commit;
            let named: Vec<String> = unclaimed
                .iter()
                .zip(&f)
                .map(|(k, x)| format!("op{k}->f{}", x - c.old + 1))
                .collect();
            out.push((format!("Claim {}", named.join(",")), t));
        }
    }
    // Commit(s)
    if st.phase == Phase::Commit {
        for s in 0..c.shards {
            if st.committed & (1 << s) != 0 {
                continue;
            }
            let mut t = st.clone();
            t.db[s as usize] = st.apply_up_to(&st.db[s as usize], s, c.n);
            t.committed |= 1 << s;
            t.ever |= 1 << s;
            t.phase = if t.committed == all_shards(c) {
                Phase::Finish
            } else {
                Phase::Commit
            };
            out.push((format!("Commit(s{})", s + 1), t));
        }
    }
    // Finish(k)
    if st.phase == Phase::Finish {
        for k in 1..=c.n {
            if st.audit & bit(k) == 0 && st.committed & (1 << st.op(k).shard) != 0 {
                let mut t = st.clone();
                t.audit |= bit(k);
                t.phase = if t.audit == all_idx(c) {
                    Phase::Done
                } else {
                    Phase::Finish
                };
                out.push((format!("Finish({k})"), t));
            }
        }
    }
    // Crash
    if matches!(
        st.phase,
        Phase::Plan | Phase::Claim | Phase::Commit | Phase::Finish
    ) {
        let mut t = st.clone();
        t.phase = Phase::Crashed;
        out.push(("Crash".into(), t));
    }
    // Retry
    if st.phase == Phase::Crashed {
        let mut t = st.clone();
        t.phase = Phase::Plan;
        t.i = 1;
        t.committed = 0;
        t.db_start = st.db.clone();
        if !c.claiming {
            t.claim = vec![NONE; c.n as usize];
        }
        out.push(("Retry".into(), t));
    }
    out
}

/// The invariants, by their TLA+ names; the first that fails.
pub fn check(st: &State, c: &Constants) -> Result<(), &'static str> {
    // TypeOK
    let ids_ok = |r: &Rec| r.0 < c.old + c.fresh && r.1 <= c.n;
    let type_ok = st.ops.len() == c.n as usize
        && st
            .db
            .iter()
            .chain(&st.db_start)
            .all(|s| s.iter().all(ids_ok))
        && st
            .claim
            .iter()
            .all(|x| *x == NONE || (*x >= c.old && *x < c.old + c.fresh))
        && st.i >= 1
        && st.i <= c.n + 1
        && st.committed & !all_shards(c) == 0
        && st.ever & !all_shards(c) == 0
        && st.audit & !all_idx(c) == 0;
    if !type_ok {
        return Err("TypeOK");
    }
    // NoPartialShard
    for s in 0..c.shards {
        let (now, start) = (&st.db[s as usize], &st.db_start[s as usize]);
        if now != start && *now != st.apply_up_to(start, s, c.n) {
            return Err("NoPartialShard");
        }
    }
    // RejectedBatchWritesNothing
    if st.phase == Phase::Rejected && st.db != st.db_start {
        return Err("RejectedBatchWritesNothing");
    }
    // AuditOnlyCommitted
    for k in 1..=c.n {
        if st.audit & bit(k) != 0 && st.ever & (1 << st.op(k).shard) == 0 {
            return Err("AuditOnlyCommitted");
        }
    }
    // AtMostOnePerCreate
    for k in st.creates() {
        let n: usize = st
            .db
            .iter()
            .map(|s| s.iter().filter(|r| r.1 == k).count())
            .sum();
        if n > 1 {
            return Err("AtMostOnePerCreate");
        }
    }
    // RetryConverges
    if st.phase == Phase::Done {
        for s in 0..c.shards {
            let deleted: Vec<u8> = (1..=c.n)
                .filter(|k| st.op(*k).kind == Kind::Delete && st.op(*k).shard == s)
                .map(|k| st.op(k).id)
                .collect();
            let mut expected: Vec<Rec> = (0..c.old)
                .filter(|x| st.db0[s as usize] & (1 << x) != 0 && !deleted.contains(x))
                .map(|x| (x, 0))
                .collect();
            for k in st.creates().filter(|k| st.op(*k).shard == s) {
                expected.push((st.claim[k as usize - 1], k));
            }
            expected.sort_unstable();
            expected.dedup();
            if st.db[s as usize] != expected {
                return Err("RetryConverges");
            }
        }
    }
    Ok(())
}

/// What an exploration found.
pub struct Exploration {
    /// How many ids are `Old` (for naming ids o1.. and f1.. in traces).
    pub old: u8,
    pub distinct: usize,
    pub generated: usize,
    pub depth: usize,
    /// The first violated invariant and the shortest trace to it (actions and states).
    pub violation: Option<(&'static str, Vec<(String, State)>)>,
}

impl fmt::Display for Exploration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} distinct states, {} states generated, depth {}",
            self.distinct, self.generated, self.depth
        )?;
        if let Some((inv, trace)) = &self.violation {
            writeln!(
                f,
                "invariant {inv} violated; shortest trace ({} steps):",
                trace.len() - 1
            )?;
            if let Some((_, s0)) = trace.first() {
                let ops: Vec<String> = s0
                    .ops
                    .iter()
                    .enumerate()
                    .map(|(k, o)| {
                        let rej = if s0.rejects & (1 << k) != 0 {
                            " (rejected)"
                        } else {
                            ""
                        };
                        match o.kind {
                            Kind::Create => format!("{}: create on s{}{rej}", k + 1, o.shard + 1),
                            Kind::Delete => format!(
                                "{}: delete {} on s{}{rej}",
                                k + 1,
                                id_name(o.id, self.old),
                                o.shard + 1
                            ),
                        }
                    })
                    .collect();
                writeln!(f, "  ops: {}", ops.join("; "))?;
            }
            for (i, (action, s)) in trace.iter().enumerate() {
                let db: Vec<String> =
                    s.db.iter()
                        .enumerate()
                        .map(|(j, recs)| {
                            format!(
                                "s{}={{{}}}",
                                j + 1,
                                recs.iter()
                                    .map(|(id, src)| format!(
                                        "[id {}, src {src}]",
                                        id_name(*id, self.old)
                                    ))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        })
                        .collect();
                let claim: Vec<String> = s
                    .claim
                    .iter()
                    .map(|x| {
                        if *x == NONE {
                            "none".into()
                        } else {
                            id_name(*x, self.old)
                        }
                    })
                    .collect();
                writeln!(
                    f,
                    "  {i:>2}. {action:<22} phase={:?} i={} claim={claim:?} db: {}",
                    s.phase,
                    s.i,
                    db.join(" ")
                )?;
            }
        }
        Ok(())
    }
}

fn id_name(x: u8, old: u8) -> String {
    if x < old {
        format!("o{}", x + 1)
    } else {
        format!("f{}", x - old + 1)
    }
}

/// Breadth-first exploration with a visited set, checking every invariant in every state.
/// Stops at the first violation (which, breadth-first, has a shortest trace).
pub fn explore(c: &Constants) -> Exploration {
    let mut g = Graph::default();
    // Initial states are their own parents (`None` below), at depth 0.
    for s in init(c) {
        if let Some(e) = g.visit(c, s, None, "Init".into()) {
            return e;
        }
    }
    while let Some(at) = g.queue.pop_front() {
        for (action, s) in next(&g.states[at], c) {
            if let Some(e) = g.visit(c, s, Some(at), action) {
                return e;
            }
        }
    }
    g.result(c, None)
}

/// The explored graph: every distinct state once, with (parent, action, depth) for traces.
#[derive(Default)]
struct Graph {
    index: HashMap<State, usize>,
    states: Vec<State>,
    meta: Vec<(usize, String, usize)>,
    queue: VecDeque<usize>,
    generated: usize,
    depth: usize,
}

impl Graph {
    /// Counts `s` as generated; if it is new, records, checks and enqueues it. Returns the
    /// finished exploration when `s` violates an invariant.
    fn visit(
        &mut self,
        c: &Constants,
        s: State,
        parent: Option<usize>,
        action: String,
    ) -> Option<Exploration> {
        self.generated += 1;
        if self.index.contains_key(&s) {
            return None;
        }
        let id = self.states.len();
        let (parent, depth) = match parent {
            Some(p) => (p, self.meta[p].2 + 1),
            None => (id, 0),
        };
        self.depth = self.depth.max(depth);
        self.index.insert(s.clone(), id);
        self.states.push(s);
        self.meta.push((parent, action, depth));
        if let Err(inv) = check(&self.states[id], c) {
            return Some(self.result(c, Some((inv, self.trace(id)))));
        }
        self.queue.push_back(id);
        None
    }

    fn trace(&self, mut at: usize) -> Vec<(String, State)> {
        let mut t = Vec::new();
        loop {
            t.push((self.meta[at].1.clone(), self.states[at].clone()));
            if self.meta[at].0 == at {
                break;
            }
            at = self.meta[at].0;
        }
        t.reverse();
        t
    }

    fn result(
        &self,
        c: &Constants,
        violation: Option<(&'static str, Vec<(String, State)>)>,
    ) -> Exploration {
        Exploration {
            old: c.old,
            distinct: self.states.len(),
            generated: self.generated,
            depth: self.depth,
            violation,
        }
    }
}
