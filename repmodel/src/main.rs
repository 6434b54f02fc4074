//! `roost-repmodel [--replicas 2|3] [--variant hw|kip101|kip279|kip320|all] [--no-traces]`:
//! explores the chosen variants (default all) at the chosen sizes (default 2 and 3) with the
//! models' constants (LogSize 2, MaxRecords 2, MaxLeaderEpoch 2; `--log-size`,
//! `--max-records`, `--max-leader-epoch` change them) and prints the table and every shortest
//! counterexample. Exit status 0 whatever the verdicts; 64 for a usage error.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use roost_repmodel::{check, print, Config, Variant};

struct Args {
    replicas: Vec<u8>,
    variants: Vec<Variant>,
    constants: [u8; 3],
    traces: bool,
}

const USAGE: &str = "usage: roost-repmodel [--replicas N] [--variant hw|kip101|kip279|kip320|all] \
[--log-size N] [--max-records N] [--max-leader-epoch N] [--no-traces]";

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
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("roost-repmodel: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(64);
        }
    };
    let mut reports = Vec::new();
    for &n in &args.replicas {
        let [log_size, max_records, max_leader_epoch] = args.constants;
        let cfg = match Config::new(n, log_size, max_records, max_leader_epoch) {
            Ok(cfg) => cfg,
            Err(e) => {
                eprintln!("roost-repmodel: {e}");
                return ExitCode::from(64);
            }
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
