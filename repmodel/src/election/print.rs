//! Printing the election model: states, traces, and the results table.

use std::fmt::Write;

use super::state::{Ack, Batch, Config, Log, Node, Renewal, State};
use crate::explorer::{Report, Trace};
use crate::print::{set, trace_with};
use crate::step::replica_name;

/// `[b0@e1, b1@e2]`: batch 0 claimed in epoch 1, ...
pub fn log(l: &Log) -> String {
    let entries: Vec<String> = (0..l.end())
        .filter_map(|k| l.at(k))
        .map(|e| format!("b{}@e{}", e.batch, e.epoch))
        .collect();
    format!("[{}]", entries.join(", "))
}

fn node(n: &Node) -> String {
    let mut text = format!("e{} log={}", n.epoch, log(&n.log));
    if n.durable < n.log.end() {
        let _ = write!(text, " synced={}", n.durable);
    }
    if !n.is_leader() {
        return format!("follower {text}");
    }
    let _ = write!(text, " hw={}", n.hw);
    let renewal = match n.renewal {
        Renewal::Idle => "none".to_string(),
        Renewal::Sent { age } => format!("sent {age} ticks ago"),
    };
    let _ = write!(
        text,
        " isr={} lease-view={} keepalive={}",
        set(n.isr),
        n.deadline,
        renewal
    );
    if n.checked {
        text.push_str(" checked");
    }
    format!("leader {text}")
}

fn batch(b: u8, x: &Batch) -> String {
    let via = match x.via {
        None => "direct".to_string(),
        Some(f) => format!("via {}", replica_name(Some(f))),
    };
    let answer = match x.answer {
        None => "unanswered".to_string(),
        Some(a) => format!(
            "answered by {} in e{}{}",
            replica_name(Some(a.by)),
            a.epoch,
            if a.in_lease {
                " (key held)"
            } else {
                " (key NOT held)"
            }
        ),
    };
    format!("b{b} {via}, {answer}")
}

/// One state: the store, each node, the claimed batches.
pub fn state(cfg: &Config, s: &State) -> String {
    let mut text = String::new();
    let key = match s.store.holder {
        None => "none".to_string(),
        Some(h) => format!(
            "{}@e{} lease={}",
            replica_name(Some(h)),
            s.store.epoch,
            s.store.lease
        ),
    };
    let _ = writeln!(
        text,
        "    store: key={} epoch={} isr={}",
        key,
        s.store.epoch,
        set(s.store.isr)
    );
    for n in cfg.all() {
        let _ = writeln!(text, "    {}: {}", replica_name(Some(n)), node(s.node(n)));
    }
    if s.next_batch > 0 {
        let batches: Vec<String> = (0..s.next_batch)
            .map(|b| batch(b, &s.batches[usize::from(b)]))
            .collect();
        let _ = writeln!(text, "    batches: {}", batches.join("; "));
    }
    text
}

pub fn trace(cfg: &Config, t: &Trace<State>) -> String {
    trace_with(t, |s| state(cfg, s))
}

/// The configuration in a few words: `ack=standby gap`, `ack=local no-gap flaw=no-margin`.
pub fn describe(cfg: &Config) -> String {
    let ack = match cfg.ack {
        Ack::Local => "local",
        Ack::Standby => "standby",
    };
    let gap = if cfg.gap { "gap" } else { "no-gap" };
    let mut text = format!("ack={ack} {gap}");
    if cfg.handover {
        text.push_str(" handover");
    }
    if cfg.crash {
        text.push_str(" crash");
    }
    if cfg.ship_written {
        text.push_str(" ship-written");
    }
    if cfg.fetch_before_sync {
        text.push_str(" fetch-before-sync");
    }
    if cfg.lost_win {
        text.push_str(" lost-win");
    }
    for flaw in cfg.flaws.iter() {
        let _ = write!(text, " flaw={}", flaw.key());
    }
    text
}

/// One row per report: configuration, counts, time, and per invariant `ok` or `FAIL(n)`
/// (n states in the shortest counterexample, the initial one included).
pub fn table(reports: &[Report<State, Config>]) -> String {
    let mut text = format!(
        "{:<48} {:>3} {:>6} {:>7} {:>10} {:>11} {:>5} {:>8}",
        "election", "N", "epochs", "batches", "distinct", "generated", "depth", "time"
    );
    for inv in &super::INVARIANTS {
        let _ = write!(text, " {:>w$}", inv.name, w = inv.name.len());
    }
    text.push('\n');
    for r in reports {
        let secs = format!("{:.2}s", r.elapsed.as_secs_f64());
        let _ = write!(
            text,
            "{:<48} {:>3} {:>6} {:>7} {:>10} {:>11} {:>5} {:>8}",
            describe(&r.cfg),
            r.cfg.nodes,
            r.cfg.max_epoch,
            r.cfg.batches,
            r.distinct,
            r.generated,
            r.depth,
            secs
        );
        for v in &r.verdicts {
            let cell = match v.counterexample_len() {
                None => "ok".to_string(),
                Some(n) => format!("FAIL({n})"),
            };
            let _ = write!(text, " {:>w$}", cell, w = v.invariant.len());
        }
        text.push('\n');
    }
    text
}

/// The table, then every counterexample of every report.
pub fn full(reports: &[Report<State, Config>]) -> String {
    let mut text = table(reports);
    for r in reports {
        for v in &r.verdicts {
            if let Some(t) = &v.counterexample {
                let _ = writeln!(
                    text,
                    "\nElection ({}) with {} nodes: {} is violated; shortest counterexample, {} states:",
                    describe(&r.cfg),
                    r.cfg.nodes,
                    v.invariant,
                    t.steps.len()
                );
                text.push_str(&trace(&r.cfg, t));
            }
        }
    }
    text
}
