//! Timing of [`super::parse_at`] over bulk lines like a load's (`#[ignore]`d; run with
//! `cargo test --release -p roost --lib batch::bench -- --ignored --nocapture`). It prints,
//! it asserts nothing about time.

use std::time::{Duration, Instant};

use super::{fingerprint, parse_at, Batch};

/// `lines` bulk lines of 10 creates over shards s0..s3, each record `{"i":N,"pad":"x.."}`.
fn lines(lines: usize, pad: usize) -> Vec<Vec<u8>> {
    let pad = "x".repeat(pad);
    (0..lines)
        .map(|l| {
            let ops: Vec<String> = (0..10)
                .map(|i| {
                    let s = i % 4;
                    format!(
                        r#"{{"op":"create","shard":"s{s}","record":{{"i":{i},"pad":"{pad}"}}}}"#
                    )
                })
                .collect();
            format!(r#"{{"request_key":"k0-{l}","ops":[{}]}}"#, ops.join(",")).into_bytes()
        })
        .collect()
}

/// The best of `runs` timings of `f` over all of `lines`, in µs per line.
fn best(runs: usize, lines: &[Vec<u8>], mut f: impl FnMut(&[u8])) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..runs {
        let t = Instant::now();
        for l in lines {
            f(l);
        }
        best = best.min(t.elapsed());
    }
    best.as_secs_f64() * 1e6 / lines.len() as f64
}

#[test]
#[ignore = "timing: run in release with --ignored --nocapture"]
fn parse_at_per_line() {
    for (name, n, pad) in [
        ("1.1 KB lines", 20_000, 70),
        ("4 KiB records", 2_000, 4_000),
    ] {
        let input = lines(n, pad);
        let bytes: usize = input.iter().map(Vec::len).sum();
        let parsed: Vec<Batch> = input
            .iter()
            .map(|l| parse_at(l, 1000, 1).expect("a valid line"))
            .collect();
        let parse = best(7, &input, |l| {
            std::hint::black_box(parse_at(l, 1000, 1).ok());
        });
        let utf8 = best(7, &input, |l| {
            std::hint::black_box(std::str::from_utf8(l).is_ok());
        });
        let mut i = 0;
        let fp = best(7, &input, |_| {
            std::hint::black_box(fingerprint(&parsed[i % parsed.len()]));
            i += 1;
        });
        println!(
            "{name}: {n} lines of {} bytes: parse_at {parse:.2} µs/line, from_utf8 {utf8:.3}, fingerprint {fp:.3}",
            bytes / n
        );
    }
}
