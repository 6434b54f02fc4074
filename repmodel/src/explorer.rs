//! Exhaustive breadth-first search from `Init`, TLC style, over any `Model`: the Kafka
//! family (every `Spec`) and the election through a lease store (`election.rs`) share it.
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

use std::fmt::Debug;

use crate::base;
use crate::encode::{decode, encode};
use crate::invariants::Invariant;
use crate::step::{Label, Spec, Successors};
use crate::types::{Config, State};

/// What the explorer searches: a single initial state, a `Next` relation, and an injective
/// packing of every type-correct state into a `u128` (`None` for a state outside its type,
/// which is recorded and not searched from).
pub trait Model {
    type State: Copy + Eq + Debug;
    type Config: Copy + Debug;
    fn name(&self) -> &str;
    fn init(&self, cfg: &Self::Config) -> Self::State;
    fn next(&self, cfg: &Self::Config, s: &Self::State, out: &mut Successors<Self::State>);
    fn encode(&self, cfg: &Self::Config, s: &Self::State) -> Option<u128>;
    fn decode(&self, cfg: &Self::Config, key: u128) -> Self::State;
}

/// Every module of the Kafka family is a model: `KafkaReplication!Init` and `encode.rs`.
impl<T: Spec + ?Sized> Model for T {
    type State = State;
    type Config = Config;

    fn name(&self) -> &str {
        Spec::name(self)
    }

    fn init(&self, cfg: &Config) -> State {
        base::init(cfg)
    }

    fn next(&self, cfg: &Config, s: &State, out: &mut Successors) {
        Spec::next(self, cfg, s, out)
    }

    fn encode(&self, cfg: &Config, s: &State) -> Option<u128> {
        encode(cfg, s)
    }

    fn decode(&self, cfg: &Config, key: u128) -> State {
        decode(cfg, key)
    }
}

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
pub struct Step<S = State> {
    pub action: Option<Label>,
    pub state: S,
}

/// A behaviour from `Init`, initial state first.
#[derive(Clone, Debug)]
pub struct Trace<S = State> {
    pub steps: Vec<Step<S>>,
}

/// The verdict on one invariant.
#[derive(Clone, Debug)]
pub struct Verdict<S = State> {
    pub invariant: &'static str,
    /// A shortest behaviour that ends in a state breaking the invariant; `None` if it holds in
    /// every reachable state.
    pub counterexample: Option<Trace<S>>,
}

impl<S> Verdict<S> {
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
pub struct Report<S = State, C = Config> {
    pub spec: String,
    pub cfg: C,
    pub distinct: u64,
    pub generated: u64,
    pub depth: u32,
    /// States with no successor at all (TLC reports the first as a deadlock unless told not to
    /// check for deadlock); informational.
    pub terminal: u64,
    pub verdicts: Vec<Verdict<S>>,
    pub elapsed: Duration,
}

impl<S, C> Report<S, C> {
    pub fn verdict(&self, invariant: &str) -> Option<&Verdict<S>> {
        self.verdicts.iter().find(|v| v.invariant == invariant)
    }
}

/// The search in progress: visited keys, the parent of each, the frontier.
struct Search<'a, M: Model + ?Sized> {
    model: &'a M,
    cfg: &'a M::Config,
    invariants: &'a [Invariant<M::Config, M::State>],
    seen: HashSet<u128, BuildHasherDefault<KeyHasher>>,
    keys: Vec<u128>,
    parents: Vec<u32>,
    queue: VecDeque<(u32, M::State)>,
    first: Vec<First<M::State>>,
}

impl<M: Model + ?Sized> Search<'_, M> {
    /// Records a successor: checks the invariants on a new state and queues it.
    fn admit(&mut self, state: M::State, parent: Option<u32>) {
        let key = self.model.encode(self.cfg, &state);
        if let Some(key) = key {
            if !self.seen.insert(key) {
                return;
            }
            debug_assert_eq!(
                self.model.decode(self.cfg, key),
                state,
                "encode/decode round trip"
            );
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
    fn path_to(&self, index: u32) -> Vec<M::State> {
        let mut chain = vec![index];
        let mut at = index as usize;
        while self.parents[at] != u32::MAX {
            at = self.parents[at] as usize;
            chain.push(at as u32);
        }
        chain
            .iter()
            .rev()
            .map(|&i| self.model.decode(self.cfg, self.keys[i as usize]))
            .collect()
    }
}

/// Explores every state of `spec` reachable from `Init` under `cfg`, checking `invariants`.
pub fn explore(spec: &dyn Spec, cfg: &Config, invariants: &[Invariant]) -> Report {
    search(spec, cfg, invariants)
}

/// Explores every state of `model` reachable from its initial state under `cfg`, checking
/// `invariants`.
pub fn search<M: Model + ?Sized>(
    model: &M,
    cfg: &M::Config,
    invariants: &[Invariant<M::Config, M::State>],
) -> Report<M::State, M::Config> {
    let start = Instant::now();
    let mut search = Search {
        model,
        cfg,
        invariants,
        seen: HashSet::default(),
        keys: Vec::new(),
        parents: Vec::new(),
        queue: VecDeque::new(),
        first: vec![None; invariants.len()],
    };
    search.admit(model.init(cfg), None);
    let (mut generated, mut terminal, mut depth) = (1u64, 0u64, 1u32);
    let mut level_end = search.keys.len() as u32;
    let mut out = Successors::default();
    while let Some((index, state)) = search.queue.pop_front() {
        if index == level_end {
            depth += 1;
            level_end = search.keys.len() as u32;
        }
        out.clear();
        model.next(cfg, &state, &mut out);
        terminal += u64::from(out.items.is_empty());
        generated += out.items.len() as u64;
        for (_, next) in out.items.drain(..) {
            search.admit(next, Some(index));
        }
    }
    let verdicts = verdicts(&search);
    Report {
        spec: model.name().to_string(),
        cfg: *cfg,
        distinct: search.keys.len() as u64,
        generated,
        depth,
        terminal,
        verdicts,
        elapsed: start.elapsed(),
    }
}

/// Per invariant: the first violating state found, and its parent's index.
type First<S> = Option<(Option<u32>, S)>;

fn verdicts<M: Model + ?Sized>(search: &Search<'_, M>) -> Vec<Verdict<M::State>> {
    let verdict = |inv: &Invariant<M::Config, M::State>, first: &First<M::State>| Verdict {
        invariant: inv.name,
        counterexample: first.as_ref().map(|(parent, bad)| {
            let mut states = parent.map_or_else(Vec::new, |p| search.path_to(p));
            states.push(*bad);
            label_trace(search.model, search.cfg, states)
        }),
    };
    search
        .invariants
        .iter()
        .zip(&search.first)
        .map(|(inv, first)| verdict(inv, first))
        .collect()
}

/// Names the action between each pair of consecutive states by generating the first state's
/// successors again and finding the second among them.
pub fn label_trace<M: Model + ?Sized>(
    model: &M,
    cfg: &M::Config,
    states: Vec<M::State>,
) -> Trace<M::State> {
    let mut steps: Vec<Step<M::State>> = Vec::with_capacity(states.len());
    let mut out = Successors::default();
    for state in states {
        let action = steps.last().and_then(|prev| {
            out.clear();
            model.next(cfg, &prev.state, &mut out);
            out.items
                .iter()
                .find(|(_, s)| *s == state)
                .map(|(label, _)| *label)
        });
        steps.push(Step { action, state });
    }
    Trace { steps }
}

/// Checks that `trace` is a behaviour of `model`: it starts in `Init`, and each state is a
/// successor of the one before under the action its label names.
pub fn replay<M: Model + ?Sized>(
    model: &M,
    cfg: &M::Config,
    trace: &Trace<M::State>,
) -> Result<(), String> {
    let first = trace.steps.first().ok_or("empty trace")?;
    if first.state != model.init(cfg) || first.action.is_some() {
        return Err("the trace does not start in Init".into());
    }
    let mut out = Successors::default();
    for (i, pair) in trace.steps.windows(2).enumerate() {
        out.clear();
        model.next(cfg, &pair[0].state, &mut out);
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
