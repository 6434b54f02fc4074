//! Exhaustive breadth-first search from `Init`, TLC style.
//!
//! Every new state is checked against every invariant, and the search goes on after a
//! violation (like TLC's `-continue`), so each invariant gets a verdict. Because the search is
//! breadth-first, the first state found to break an invariant is at the smallest depth: its
//! path from `Init` is a shortest counterexample.
//!
//! Counting follows TLC: `generated` is the initial states plus every successor an enabled
//! action instance produced (duplicates included); `distinct` is the size of the visited set;
//! `depth` is the number of breadth-first levels, the initial state being level 1.

use std::collections::{HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use crate::base;
use crate::encode::{decode, encode};
use crate::invariants::Invariant;
use crate::step::{Label, Spec, Successors};
use crate::types::{Config, State};

/// A hasher for the `u128` keys: the two halves folded and mixed (splitmix64's finaliser).
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u128(&mut self, v: u128) {
        self.0 = (v as u64) ^ ((v >> 64) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// One step of a trace: the action that led here (`None` for the initial state) and the state.
#[derive(Clone, Debug)]
pub struct Step {
    pub action: Option<Label>,
    pub state: State,
}

/// A behaviour from `Init`, initial state first.
#[derive(Clone, Debug)]
pub struct Trace {
    pub steps: Vec<Step>,
}

/// The verdict on one invariant.
#[derive(Clone, Debug)]
pub struct Verdict {
    pub invariant: &'static str,
    /// A shortest behaviour that ends in a state breaking the invariant; `None` if it holds in
    /// every reachable state.
    pub counterexample: Option<Trace>,
}

impl Verdict {
    pub fn holds(&self) -> bool {
        self.counterexample.is_none()
    }

    /// Number of states in the shortest counterexample, the initial one included.
    pub fn counterexample_len(&self) -> Option<usize> {
        self.counterexample.as_ref().map(|t| t.steps.len())
    }
}

/// What a complete search found.
#[derive(Clone, Debug)]
pub struct Report {
    pub spec: String,
    pub cfg: Config,
    pub distinct: u64,
    pub generated: u64,
    pub depth: u32,
    /// States with no successor at all (TLC reports the first as a deadlock unless told not to
    /// check for deadlock); informational.
    pub terminal: u64,
    pub verdicts: Vec<Verdict>,
    pub elapsed: Duration,
}

impl Report {
    pub fn verdict(&self, invariant: &str) -> Option<&Verdict> {
        self.verdicts.iter().find(|v| v.invariant == invariant)
    }
}

/// The search in progress: visited keys, the parent of each, the frontier.
struct Search<'a> {
    cfg: &'a Config,
    invariants: &'a [Invariant],
    seen: HashSet<u128, BuildHasherDefault<KeyHasher>>,
    keys: Vec<u128>,
    parents: Vec<u32>,
    queue: VecDeque<(u32, State)>,
    /// Per invariant: the first violating state found and its parent's index.
    first: Vec<Option<(Option<u32>, State)>>,
}

impl Search<'_> {
    /// Records a successor: checks the invariants on a new state and queues it.
    fn admit(&mut self, state: State, parent: Option<u32>) {
        let key = encode(self.cfg, &state);
        if let Some(key) = key {
            if !self.seen.insert(key) {
                return;
            }
            debug_assert_eq!(decode(self.cfg, key), state, "encode/decode round trip");
        }
        for (i, inv) in self.invariants.iter().enumerate() {
            if self.first[i].is_none() && !(inv.check)(self.cfg, &state) {
                self.first[i] = Some((parent, state));
            }
        }
        // A state outside its type has no key; TypeOk has been recorded as broken and the
        // search does not continue from it.
        if let Some(key) = key {
            let index = self.keys.len() as u32;
            self.keys.push(key);
            self.parents.push(parent.unwrap_or(u32::MAX));
            self.queue.push_back((index, state));
        }
    }

    /// The states from `Init` to the state at `index`.
    fn path_to(&self, index: u32) -> Vec<State> {
        let mut chain = vec![index];
        let mut at = index as usize;
        while self.parents[at] != u32::MAX {
            at = self.parents[at] as usize;
            chain.push(at as u32);
        }
        chain
            .iter()
            .rev()
            .map(|&i| decode(self.cfg, self.keys[i as usize]))
            .collect()
    }
}

/// Explores every state of `spec` reachable from `Init` under `cfg`, checking `invariants`.
pub fn explore(spec: &dyn Spec, cfg: &Config, invariants: &[Invariant]) -> Report {
    let start = Instant::now();
    let mut search = Search {
        cfg,
        invariants,
        seen: HashSet::default(),
        keys: Vec::new(),
        parents: Vec::new(),
        queue: VecDeque::new(),
        first: vec![None; invariants.len()],
    };
    search.admit(base::init(cfg), None);
    let (mut generated, mut terminal, mut depth) = (1u64, 0u64, 1u32);
    let mut level_end = search.keys.len() as u32;
    let mut out = Successors::default();
    while let Some((index, state)) = search.queue.pop_front() {
        if index == level_end {
            depth += 1;
            level_end = search.keys.len() as u32;
        }
        out.clear();
        spec.next(cfg, &state, &mut out);
        terminal += u64::from(out.items.is_empty());
        generated += out.items.len() as u64;
        for (_, next) in out.items.drain(..) {
            search.admit(next, Some(index));
        }
    }
    let verdicts = verdicts(spec, &search);
    Report {
        spec: spec.name().to_string(),
        cfg: *cfg,
        distinct: search.keys.len() as u64,
        generated,
        depth,
        terminal,
        verdicts,
        elapsed: start.elapsed(),
    }
}

fn verdicts(spec: &dyn Spec, search: &Search<'_>) -> Vec<Verdict> {
    let verdict = |(inv, first): (&Invariant, &Option<(Option<u32>, State)>)| Verdict {
        invariant: inv.name,
        counterexample: first.as_ref().map(|(parent, bad)| {
            let mut states = parent.map_or_else(Vec::new, |p| search.path_to(p));
            states.push(*bad);
            label_trace(spec, search.cfg, states)
        }),
    };
    search
        .invariants
        .iter()
        .zip(&search.first)
        .map(verdict)
        .collect()
}

/// Names the action between each pair of consecutive states by generating the first state's
/// successors again and finding the second among them.
pub fn label_trace(spec: &dyn Spec, cfg: &Config, states: Vec<State>) -> Trace {
    let mut steps: Vec<Step> = Vec::with_capacity(states.len());
    let mut out = Successors::default();
    for state in states {
        let action = steps.last().and_then(|prev| {
            out.clear();
            spec.next(cfg, &prev.state, &mut out);
            out.items
                .iter()
                .find(|(_, s)| *s == state)
                .map(|(label, _)| *label)
        });
        steps.push(Step { action, state });
    }
    Trace { steps }
}

/// Checks that `trace` is a behaviour of `spec`: it starts in `Init`, and each state is a
/// successor of the one before under the action its label names.
pub fn replay(spec: &dyn Spec, cfg: &Config, trace: &Trace) -> Result<(), String> {
    let first = trace.steps.first().ok_or("empty trace")?;
    if first.state != base::init(cfg) || first.action.is_some() {
        return Err("the trace does not start in Init".into());
    }
    let mut out = Successors::default();
    for (i, pair) in trace.steps.windows(2).enumerate() {
        out.clear();
        spec.next(cfg, &pair[0].state, &mut out);
        let step = &pair[1];
        let found = out
            .items
            .iter()
            .any(|(label, s)| Some(*label) == step.action && *s == step.state);
        if !found {
            return Err(format!(
                "state {} is not a successor of state {} by {:?}",
                i + 2,
                i + 1,
                step.action
            ));
        }
    }
    Ok(())
}
