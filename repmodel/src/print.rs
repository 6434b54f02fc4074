//! Printing: states, counterexample traces (numbered like TLC's, initial state first, the
//! action between states) and the results table.

use std::fmt::Write;

use crate::explorer::{Report, Trace};
use crate::step::replica_name;
use crate::types::{Config, Log, ReplicaSet, State};

/// `{r1, r2}`.
pub fn set(s: ReplicaSet) -> String {
    let names: Vec<String> = s.iter().map(|r| replica_name(Some(r))).collect();
    format!("{{{}}}", names.join(","))
}

/// `[m0@e0, m1@e1]`: record id 0 written in epoch 0, ...
pub fn log(l: &Log) -> String {
    let records: Vec<String> = l
        .all_entries()
        .map(|(_, r)| format!("m{}@e{}", r.id, r.epoch))
        .collect();
    format!("[{}]", records.join(", "))
}

/// One state, one line per variable group, indented.
pub fn state(cfg: &Config, s: &State) -> String {
    let mut text = String::new();
    let q = s.quorum_state;
    let _ = writeln!(
        text,
        "    quorumState: leaderEpoch={} leader={} isr={}   nextRecordId={} nextLeaderEpoch={}",
        q.leader_epoch,
        replica_name(q.leader),
        set(q.isr),
        s.next_record_id,
        s.next_leader_epoch
    );
    let requests: Vec<String> = s
        .leader_and_isr_requests
        .iter()
        .map(|r| {
            format!(
                "[e{} leader={} isr={}]",
                r.leader_epoch,
                replica_name(r.leader),
                set(r.isr)
            )
        })
        .collect();
    let _ = writeln!(text, "    leaderAndIsrRequests: {{{}}}", requests.join(" "));
    for r in cfg.all() {
        let rs = s.rs(r);
        let _ = writeln!(
            text,
            "    {}: log={} hw={} leaderEpoch={} leader={} isr={}",
            replica_name(Some(r)),
            log(s.log(r)),
            rs.hw,
            rs.leader_epoch,
            replica_name(rs.leader),
            set(rs.isr)
        );
    }
    text
}

/// A trace: `State 1: <Init>`, then `State k: <Action(args)>` and the state.
pub fn trace(cfg: &Config, t: &Trace) -> String {
    trace_with(t, |s| state(cfg, s))
}

/// A trace of any model, each state printed by `state`.
pub fn trace_with<S>(t: &Trace<S>, state: impl Fn(&S) -> String) -> String {
    let mut text = String::new();
    for (i, step) in t.steps.iter().enumerate() {
        let action = match step.action {
            Some(label) => label.to_string(),
            None if i == 0 => "Init".to_string(),
            None => "no action of Next leads here (transcription bug)".to_string(),
        };
        let _ = writeln!(text, "  State {}: <{}>", i + 1, action);
        text.push_str(&state(&step.state));
    }
    text
}

/// The results table, one row per report: counts, time, per invariant `ok` or `FAIL(n)`
/// with n the number of states in the shortest counterexample, and the number of states
/// without successors.
pub fn table(reports: &[Report]) -> String {
    let Some(first) = reports.first() else {
        return String::new();
    };
    let mut text = String::new();
    let _ = write!(
        text,
        "{:<30} {:>3} {:>10} {:>11} {:>5} {:>8}",
        "spec", "N", "distinct", "generated", "depth", "time"
    );
    for v in &first.verdicts {
        let _ = write!(text, " {:>w$}", v.invariant, w = v.invariant.len().max(8));
    }
    text.push_str("  terminal\n");
    for r in reports {
        let secs = format!("{:.2}s", r.elapsed.as_secs_f64());
        let _ = write!(
            text,
            "{:<30} {:>3} {:>10} {:>11} {:>5} {:>8}",
            r.spec, r.cfg.replicas, r.distinct, r.generated, r.depth, secs
        );
        for v in &r.verdicts {
            let cell = match v.counterexample_len() {
                None => "ok".to_string(),
                Some(n) => format!("FAIL({n})"),
            };
            let _ = write!(text, " {:>w$}", cell, w = v.invariant.len().max(8));
        }
        let _ = writeln!(text, " {:>9}", r.terminal);
    }
    text
}

/// The table, then every counterexample of every report.
pub fn full(reports: &[Report]) -> String {
    let mut text = table(reports);
    for r in reports {
        for v in &r.verdicts {
            if let Some(t) = &v.counterexample {
                let _ = writeln!(
                    text,
                    "\n{} with {} replicas: {} is violated; shortest counterexample, {} states:",
                    r.spec,
                    r.cfg.replicas,
                    v.invariant,
                    t.steps.len()
                );
                text.push_str(&trace(&r.cfg, t));
            }
        }
    }
    text
}
