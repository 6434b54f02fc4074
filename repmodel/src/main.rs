//! `roost-repmodel [--replicas 2|3] [--variant hw|kip101|kip279|kip320|all] [--no-traces]`:
//! explores the chosen variants (default all) at the chosen sizes (default 2 and 3) with the
//! models' constants (LogSize 2, MaxRecords 2, MaxLeaderEpoch 2; `--log-size`,
//! `--max-records`, `--max-leader-epoch` change them) and prints the table and every shortest
//! counterexample. Exit status 0 whatever the verdicts; 64 for a usage error.
//!
//! `roost-repmodel election [options]`: the election through a lease store (issue 27). With
//! no option, every row of its results table; with options, one configuration (two or three
//! nodes' sizes, then whatever the options change).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use roost_repmodel::election::{self, Ack, Flaw};
use roost_repmodel::{check, print, Config, Variant};

struct Args {
    replicas: Vec<u8>,
    variants: Vec<Variant>,
    constants: [u8; 3],
    traces: bool,
}

const USAGE: &str = "usage: roost-repmodel [--replicas N] [--variant hw|kip101|kip279|kip320|all] \
[--log-size N] [--max-records N] [--max-leader-epoch N] [--no-traces]
       roost-repmodel election [--nodes N] [--ack local|standby] [--no-gap] [--handover] [--crash] [--ship-written] [--fetch-before-sync] [--lost-win] [--flaw NAME]... \
[--ttl N] [--margin N] [--skew N] [--max-epoch N] [--batches N] [--no-traces]";

/// The election's command line: the configurations to explore, and whether to print traces.
fn parse_election(
    mut argv: impl Iterator<Item = String>,
) -> Result<(Vec<election::Config>, bool), String> {
    let mut cfg: Option<election::Config> = None;
    let mut traces = true;
    let start = |c: &mut Option<election::Config>| {
        *c.get_or_insert(election::Config::two_nodes(Ack::Standby))
    };
    while let Some(flag) = argv.next() {
        if flag == "--no-traces" {
            traces = false;
            continue;
        }
        let mut c = start(&mut cfg);
        match flag.as_str() {
            "--nodes" => {
                let n = number(argv.next(), "--nodes")?;
                let base = if n >= 3 {
                    election::Config::three_nodes(c.ack)
                } else {
                    election::Config::two_nodes(c.ack)
                };
                c = election::Config {
                    nodes: n,
                    gap: c.gap,
                    handover: c.handover,
                    crash: c.crash,
                    ship_written: c.ship_written,
                    fetch_before_sync: c.fetch_before_sync,
                    lost_win: c.lost_win,
                    flaws: c.flaws,
                    ..base
                };
            }
            "--ack" => {
                c.ack = match argv.next().as_deref() {
                    Some("local") => Ack::Local,
                    Some("standby") => Ack::Standby,
                    other => return Err(format!("--ack: local or standby, not {other:?}")),
                }
            }
            "--no-gap" => c.gap = false,
            "--handover" => c.handover = true,
            "--crash" => c.crash = true,
            "--ship-written" => c.ship_written = true,
            "--fetch-before-sync" => c.fetch_before_sync = true,
            "--lost-win" => c.lost_win = true,
            "--flaw" => {
                let key = argv.next().ok_or("--flaw needs a value")?;
                c = c.with(Flaw::parse(&key).ok_or_else(|| format!("unknown flaw {key}"))?);
            }
            "--ttl" => c.ttl = number(argv.next(), "--ttl")?,
            "--margin" => c.margin = number(argv.next(), "--margin")?,
            "--skew" => c.skew = number(argv.next(), "--skew")?,
            "--max-epoch" => c.max_epoch = number(argv.next(), "--max-epoch")?,
            "--batches" => c.batches = number(argv.next(), "--batches")?,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
        cfg = Some(c);
    }
    Ok((cfg.map_or_else(election::rows, |c| vec![c]), traces))
}

fn usage(message: &str) -> ExitCode {
    if !message.is_empty() {
        eprintln!("roost-repmodel: {message}");
    }
    eprintln!("{USAGE}");
    ExitCode::from(64)
}

/// `roost-repmodel election ...`.
fn election_main(argv: impl Iterator<Item = String>) -> ExitCode {
    let (configs, traces) = match parse_election(argv) {
        Ok(parsed) => parsed,
        Err(message) => return usage(&message),
    };
    let mut reports = Vec::new();
    for cfg in &configs {
        match election::check(cfg) {
            Ok(report) => {
                eprintln!(
                    "election ({}) N={}: {} states in {:.2?}",
                    election::print::describe(cfg),
                    cfg.nodes,
                    report.distinct,
                    report.elapsed
                );
                reports.push(report);
            }
            Err(e) => return usage(&e.to_string()),
        }
    }
    let text = if traces {
        election::print::full(&reports)
    } else {
        election::print::table(&reports)
    };
    println!("{text}");
    ExitCode::SUCCESS
}

fn number(value: Option<String>, flag: &str) -> Result<u8, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    value
        .parse()
        .map_err(|_| format!("{flag}: not a small number: {value}"))
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        replicas: vec![2, 3],
        variants: Variant::ALL.to_vec(),
        constants: [2, 2, 2],
        traces: true,
    };
    while let Some(flag) = argv.next() {
        match flag.as_str() {
            "--replicas" => args.replicas = vec![number(argv.next(), "--replicas")?],
            "--variant" => {
                let key = argv.next().ok_or("--variant needs a value")?;
                args.variants = match key.as_str() {
                    "all" => Variant::ALL.to_vec(),
                    _ => {
                        vec![Variant::parse(&key).ok_or_else(|| format!("unknown variant {key}"))?]
                    }
                };
            }
            "--log-size" => args.constants[0] = number(argv.next(), "--log-size")?,
            "--max-records" => args.constants[1] = number(argv.next(), "--max-records")?,
            "--max-leader-epoch" => args.constants[2] = number(argv.next(), "--max-leader-epoch")?,
            "--no-traces" => args.traces = false,
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1).peekable();
    if argv.peek().map(String::as_str) == Some("election") {
        return election_main(argv.skip(1));
    }
    let args = match parse(argv) {
        Ok(args) => args,
        Err(message) => return usage(&message),
    };
    let mut reports = Vec::new();
    for &n in &args.replicas {
        let [log_size, max_records, max_leader_epoch] = args.constants;
        let cfg = match Config::new(n, log_size, max_records, max_leader_epoch) {
            Ok(cfg) => cfg,
            Err(e) => return usage(&e.to_string()),
        };
        for &variant in &args.variants {
            let report = check(variant, &cfg);
            eprintln!(
                "{} N={}: {} states in {:.2?}",
                variant.module(),
                n,
                report.distinct,
                report.elapsed
            );
            reports.push(report);
        }
    }
    let text = if args.traces {
        print::full(&reports)
    } else {
        print::table(&reports)
    };
    println!("{text}");
    ExitCode::SUCCESS
}
