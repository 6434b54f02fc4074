//! `sim-run`: runs many seeds of the simulator and prints seeds per second, and every failing
//! seed with the command that replays it.
//!
//!   sim-run [--flaw NAME].. [--until-caught] [--verbose] [--seconds S] SEEDS [FROM]
//!
//! Runs seeds FROM..FROM+SEEDS (FROM defaults to 0), or as many of them as S seconds of wall
//! time allow. `--flaw` runs the agent's port with one
//! of the election model's flaws (repmodel's names: no-margin, campaign-outside-isr,
//! isr-grow-store-first, isr-shrink-memory-first, epoch-from-node); `--until-caught` stops
//! at the first violation and exits 0 then (a mutant hunt), 1 if none was found. Without it
//! the exit is 1 if any seed broke an invariant.

use std::process::ExitCode;
use std::time::Instant;

use roost_repmodel::election::{Flaw, Flaws};
use roost_sim::{run, Config};

/// The flaws the agent's port can be run with.
const SUPPORTED: [Flaw; 5] = [
    Flaw::NoMargin,
    Flaw::CampaignOutsideIsr,
    Flaw::IsrGrowStoreFirst,
    Flaw::IsrShrinkMemoryFirst,
    Flaw::EpochFromNode,
];

struct Args {
    flaws: Flaws,
    until_caught: bool,
    verbose: bool,
    seconds: Option<f64>,
    seeds: u64,
    from: u64,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        flaws: Flaws::NONE,
        until_caught: false,
        verbose: false,
        seconds: None,
        seeds: 0,
        from: 0,
    };
    let mut nums = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--flaw" => {
                let key = it.next().ok_or("--flaw needs a name")?;
                let f = Flaw::parse(&key).filter(|f| SUPPORTED.contains(f));
                a.flaws = a
                    .flaws
                    .with(f.ok_or(format!("unknown or unsupported flaw {key:?}"))?);
            }
            "--until-caught" => a.until_caught = true,
            "--verbose" => a.verbose = true,
            "--seconds" => {
                let s = it.next().ok_or("--seconds needs a number")?;
                a.seconds = Some(s.parse().map_err(|_| format!("not a number: {s:?}"))?);
            }
            n => nums.push(
                n.parse::<u64>()
                    .map_err(|_| format!("not a number: {n:?}"))?,
            ),
        }
    }
    match nums[..] {
        [seeds] => a.seeds = seeds,
        [seeds, from] => (a.seeds, a.from) = (seeds, from),
        _ => return Err("usage: sim-run [--flaw NAME].. [--until-caught] [--verbose] [--seconds S] SEEDS [FROM]".into()),
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sim-run: {e}");
            return ExitCode::from(2);
        }
    };
    let flags: String = args
        .flaws
        .iter()
        .map(|f| format!(" --flaw {}", f.key()))
        .collect();
    let started = Instant::now();
    let (mut ran, mut failed, mut answers) = (0u64, 0u64, 0usize);
    for seed in args.from..args.from.saturating_add(args.seeds) {
        if args
            .seconds
            .is_some_and(|s| started.elapsed().as_secs_f64() >= s)
        {
            break;
        }
        let o = run(Config::new(seed, args.flaws));
        ran += 1;
        answers += o.answers;
        if args.verbose {
            println!(
                "seed {seed}: {} answers, {} elections, hash {:016x}",
                o.answers, o.elections, o.hash
            );
        }
        if !o.violations.is_empty() {
            failed += 1;
            println!("seed {seed} FAILED: {}", o.violations.join("; "));
            for line in &o.tail {
                println!("  | {line}");
            }
            println!("  replay: cargo run -p roost-sim --release --bin sim-run --{flags} 1 {seed}");
            if args.until_caught {
                break;
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "sim-run{flags}: {ran} seeds from {} in {secs:.1} s ({:.2} seeds/s), {answers} answers, {failed} failed",
        args.from,
        ran as f64 / secs.max(1e-9)
    );
    match (args.until_caught, failed) {
        (true, 0) | (false, 1..) => ExitCode::FAILURE,
        _ => ExitCode::SUCCESS,
    }
}
