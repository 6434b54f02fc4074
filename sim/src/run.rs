//! One run of the simulator: a seed chooses the network (latency, random link failures), each
//! node's clock skew and a schedule of faults (partitions and their healing, held links,
//! paused hosts, crashes and restarts, latency spikes); the runner steps turmoil through
//! them, checks the logs every [`CHECK_EVERY`] steps, then heals everything, stops every
//! node and checks that each stops within the bound. The trace's hash (with every log's
//! final content) is the run's fingerprint: one seed, one hash.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::agent::node_main;
use crate::check::check_logs;
use crate::etcd::{self, Aim, IsrWriteFault};
use crate::rng::Rng;
use crate::world::{Config, World};

/// Steps (of 1 ms) between two log checks.
pub const CHECK_EVERY: u64 = 10;
/// The nodes of the cluster.
pub const NODES: usize = 3;

/// How a run ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    /// The trace's hash: equal for two runs of one seed.
    pub hash: u64,
    pub violations: Vec<String>,
    pub answers: usize,
    pub elections: u32,
    pub steps: u64,
    /// The trace's last lines.
    pub tail: Vec<String>,
}

/// A change to the network or the hosts, at a moment of the run.
#[derive(Clone, Debug)]
enum Action {
    Partition(&'static str, &'static str),
    Repair(&'static str, &'static str),
    Hold(&'static str, &'static str),
    Release(&'static str, &'static str),
    Crash(usize),
    Bounce(usize),
    Latency(Duration),
    /// The next write of the in-sync set is lost (or its answer is), and its writer is cut
    /// off from etcd (and maybe a standby) for a while (`etcd::Aimed`).
    Aim(Aim),
}

const HOSTS: [&str; 4] = ["n0", "n1", "n2", "etcd"];

/// The faults of a run, with the actions that end them: `(at, action)`, in time order.
fn plan(cfg: &Config, rng: &mut Rng, base_latency: Duration) -> Vec<(Duration, Action)> {
    let mut out = Vec::new();
    let end_ms = cfg.duration.as_millis() as u64;
    for _ in 0..4 + rng.below(10) {
        let at = rng.ms(500, end_ms.saturating_sub(2000));
        let lasts = rng.ms(100, 4000);
        let a = HOSTS[rng.below(4) as usize];
        let b = HOSTS[rng.below(4) as usize];
        let n = rng.below(NODES as u64) as usize;
        match rng.below(6) {
            0 if a != b => {
                out.push((at, Action::Partition(a, b)));
                out.push((at + lasts, Action::Repair(a, b)));
            }
            1 if a != b => {
                out.push((at, Action::Hold(a, b)));
                out.push((
                    at + lasts.min(Duration::from_millis(1500)),
                    Action::Release(a, b),
                ));
            }
            2 => {
                // A paused host: everything to and from it held, then delivered late.
                for o in HOSTS.iter().filter(|o| **o != HOSTS[n]) {
                    out.push((at, Action::Hold(HOSTS[n], o)));
                    out.push((
                        at + lasts.min(Duration::from_secs(2)),
                        Action::Release(HOSTS[n], o),
                    ));
                }
            }
            3 => {
                for o in HOSTS.iter().filter(|o| **o != a) {
                    out.push((at, Action::Partition(a, o)));
                    out.push((at + lasts, Action::Repair(a, o)));
                }
            }
            4 => {
                out.push((at, Action::Crash(n)));
                out.push((at + lasts.min(Duration::from_secs(3)), Action::Bounce(n)));
            }
            _ => {
                out.push((at, Action::Latency(rng.ms(20, 400))));
                out.push((at + lasts, Action::Latency(base_latency)));
            }
        }
    }
    // Drawn after the faults above, so that these stay what they were for every seed.
    for _ in 0..rng.below(3) {
        let at = rng.ms(500, end_ms.saturating_sub(2000));
        let fault = if rng.chance(0.5) {
            IsrWriteFault::Lost
        } else {
            IsrWriteFault::Unanswered
        };
        let cut_for = rng.ms(500, 3000);
        let also = rng.chance(0.5).then(|| 1 + rng.below(2) as usize);
        out.push((
            at,
            Action::Aim(Aim {
                fault,
                cut_for,
                also,
            }),
        ));
    }
    out.sort_by_key(|(at, _)| *at);
    out
}

fn apply(sim: &mut turmoil::Sim<'_>, w: &World, action: &Action) {
    w.runner_at(sim.elapsed());
    w.event(format!("fault {action:?}"));
    match *action {
        Action::Partition(a, b) => sim.partition(a, b),
        Action::Repair(a, b) => sim.repair(a, b),
        Action::Hold(a, b) => sim.hold(a, b),
        Action::Release(a, b) => sim.release(a, b),
        Action::Crash(n) => {
            if w.record().running[n] {
                sim.crash(HOSTS[n]);
                w.set_running(n, false);
                // A power cut: what was not synced is gone now, and so is leadership.
                w.logs[n].mem.crash();
            }
        }
        Action::Bounce(n) => {
            if !sim.is_host_running(HOSTS[n]) {
                sim.bounce(HOSTS[n]);
            }
        }
        Action::Latency(d) => sim.set_max_message_latency(d),
        Action::Aim(aim) => w.aimed.arm(aim),
    }
}

/// The aimed faults that fired in the last step: each writer cut off from etcd (and from
/// the node `also` names) now, the links repaired later (inserted into `plan`, which stays
/// in time order).
fn aimed_fired(sim: &mut turmoil::Sim<'_>, w: &World, plan: &mut VecDeque<(Duration, Action)>) {
    for (writer, aim) in w.aimed.take_fired() {
        let Some(n) = (0..NODES).find(|n| HOSTS[*n] == writer) else {
            w.violation(format!(
                "an in-sync set written by an unknown node {writer:?}"
            ));
            continue;
        };
        let mut cut = vec![(HOSTS[n], "etcd")];
        if let Some(k) = aim.also {
            cut.push((HOSTS[n], HOSTS[(n + k) % NODES]));
        }
        let at = sim.elapsed() + aim.cut_for;
        for (a, b) in cut {
            apply(sim, w, &Action::Partition(a, b));
            let k = plan.partition_point(|(t, _)| *t <= at);
            plan.insert(k, (at, Action::Repair(a, b)));
        }
    }
}

/// Runs one seed (see the module doc).
pub fn run(cfg: Config) -> Outcome {
    let mut rng = Rng::new(cfg.seed);
    let world = Arc::new(World::new(cfg.clone(), NODES));
    let base_latency = rng.ms(2, 30);
    let mut b = turmoil::Builder::new();
    b.rng_seed(cfg.seed)
        .tick_duration(Duration::from_millis(1))
        .simulation_duration(cfg.duration + Duration::from_secs(3600))
        .min_message_latency(rng.ms(0, 2))
        .max_message_latency(base_latency)
        .tcp_capacity(1 << 16);
    if rng.chance(0.3) {
        b.fail_rate(0.0005 + rng.unit() * 0.002).repair_rate(0.05);
    }
    let mut sim = b.build();
    let store = Arc::clone(&world.store);
    let aimed = Arc::clone(&world.aimed);
    sim.host("etcd", move || {
        etcd::serve(Arc::clone(&store), Arc::clone(&aimed))
    });
    for (i, host) in HOSTS.iter().enumerate().take(NODES) {
        let w = Arc::clone(&world);
        let node_rng = rng.fork();
        let skew = if rng.chance(0.5) {
            rng.unit() * 0.2
        } else {
            0.0
        };
        w.event(format!("n{i} clock skew {skew:.3}"));
        sim.host(*host, move || {
            node_main(Arc::clone(&w), i, node_rng.clone(), skew)
        });
    }
    let plan = plan(&cfg, &mut rng, base_latency);
    let steps = drive(&mut sim, &world, plan);
    finish(&mut sim, &world, steps)
}

/// Steps through the faults until the run's duration or a violation.
fn drive(sim: &mut turmoil::Sim<'_>, w: &World, plan: Vec<(Duration, Action)>) -> u64 {
    let mut plan = VecDeque::from(plan);
    let mut steps = 0;
    while sim.elapsed() < w.cfg.duration {
        while plan.front().is_some_and(|(at, _)| *at <= sim.elapsed()) {
            if let Some((_, action)) = plan.pop_front() {
                apply(sim, w, &action);
            }
        }
        if let Err(e) = sim.step() {
            w.violation(format!("a host failed: {e}"));
        }
        aimed_fired(sim, w, &mut plan);
        steps += 1;
        w.runner_at(sim.elapsed());
        if steps % CHECK_EVERY == 0 {
            check_logs(w);
        }
        if !w.record().violations.is_empty() {
            break;
        }
    }
    steps
}

/// Heals the network, restarts crashed nodes, lets the cluster settle, checks, then stops
/// every node: each must stop within the bound (EveryStopStops).
fn finish(sim: &mut turmoil::Sim<'_>, w: &World, mut steps: u64) -> Outcome {
    if w.record().violations.is_empty() {
        w.aimed.disarm();
        for a in HOSTS {
            for b in HOSTS {
                if a < b {
                    sim.repair(a, b);
                    sim.release(a, b);
                }
            }
        }
        for (n, host) in HOSTS.iter().enumerate().take(NODES) {
            if !sim.is_host_running(*host) {
                apply(sim, w, &Action::Bounce(n));
            }
        }
        steps += step_for(sim, w, Duration::from_secs(3), || false);
        check_logs(w);
        w.event("stop");
        w.stop.send_replace(true);
        let bound = w.cfg.stop_bound;
        steps += step_for(sim, w, bound, || !w.record().running.iter().any(|r| *r));
        let running: Vec<&String> = (0..NODES)
            .filter(|&n| w.record().running[n])
            .map(|n| &w.names[n])
            .collect();
        if !running.is_empty() {
            w.violation(format!(
                "EveryStopStops: {running:?} still running {bound:?} after stop"
            ));
        }
    }
    outcome(w, steps)
}

/// Steps for `d` of simulated time or until `done`.
fn step_for(sim: &mut turmoil::Sim<'_>, w: &World, d: Duration, done: impl Fn() -> bool) -> u64 {
    let until = sim.elapsed() + d;
    let mut steps = 0;
    while sim.elapsed() < until && !done() {
        if let Err(e) = sim.step() {
            w.violation(format!("a host failed: {e}"));
            break;
        }
        steps += 1;
        w.runner_at(sim.elapsed());
        if steps % CHECK_EVERY == 0 {
            check_logs(w);
        }
    }
    steps
}

fn outcome(w: &World, steps: u64) -> Outcome {
    for (i, l) in w.logs.iter().enumerate() {
        let entries: Vec<String> = l
            .mem
            .entries()
            .iter()
            .map(|e| {
                format!(
                    "{}/{}/{}",
                    e.lsn,
                    e.epoch,
                    String::from_utf8_lossy(&e.payload)
                )
            })
            .collect();
        w.event_at(
            Duration::ZERO,
            &format!("n{i} log {entries:?} hw {}", l.mem.hw()),
        );
    }
    let r = w.record();
    Outcome {
        seed: w.cfg.seed,
        hash: r.hash,
        violations: r.violations.clone(),
        answers: r.answers.len(),
        elections: r.elections,
        steps,
        tail: r.tail.iter().cloned().collect(),
    }
}
