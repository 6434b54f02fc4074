//! What an action produces: a labelled successor state. A `Spec` is a `Next` relation.

use std::fmt;

use crate::types::{Config, Replica, State};

/// The value bound to one of an action's existential quantifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgValue {
    /// A replica, or `None` ("NONE").
    Replica(Option<Replica>),
    Int(i16),
}

/// The name of an action and the values its `\E` bound, for traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    pub action: &'static str,
    pub args: [Option<(&'static str, ArgValue)>; 4],
}

impl Label {
    pub fn new(action: &'static str) -> Label {
        Label {
            action,
            args: [None; 4],
        }
    }

    fn arg(mut self, name: &'static str, value: ArgValue) -> Label {
        if let Some(slot) = self.args.iter_mut().find(|a| a.is_none()) {
            *slot = Some((name, value));
        }
        self
    }

    pub fn replica(self, name: &'static str, r: Replica) -> Label {
        self.arg(name, ArgValue::Replica(Some(r)))
    }

    pub fn replica_opt(self, name: &'static str, r: Option<Replica>) -> Label {
        self.arg(name, ArgValue::Replica(r))
    }

    pub fn int(self, name: &'static str, value: impl Into<i16>) -> Label {
        self.arg(name, ArgValue::Int(value.into()))
    }
}

/// `r1`, `r2`, ... for replica 0, 1, ...; `NONE` for none.
pub fn replica_name(r: Option<Replica>) -> String {
    match r {
        Some(r) => format!("r{}", u16::from(r) + 1),
        None => "NONE".to_string(),
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.action)?;
        for (i, (name, value)) in self.args.iter().flatten().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            match value {
                ArgValue::Replica(r) => write!(f, "{sep}{name}={}", replica_name(*r))?,
                ArgValue::Int(v) => write!(f, "{sep}{name}={v}")?,
            }
        }
        write!(f, ")")
    }
}

/// The successors of one state, with the action instance that produced each. Duplicates are
/// kept: they count as generated states, as in TLC.
pub struct Successors<S = State> {
    pub items: Vec<(Label, S)>,
}

impl<S> Default for Successors<S> {
    fn default() -> Self {
        Successors { items: Vec::new() }
    }
}

impl<S> Successors<S> {
    pub fn push(&mut self, label: Label, state: S) {
        self.items.push((label, state));
    }

    pub fn clear(&mut self) {
        self.items.clear();
    }
}

/// A specification: `Init` is shared by every module of the family (`KafkaReplication!Init`);
/// `next` is the module's `Next`.
pub trait Spec {
    fn name(&self) -> &str;
    fn next(&self, cfg: &Config, s: &State, out: &mut Successors);
}
