//! A client of roost's stream socket for `--intake`: connections that each send their share
//! of the batches (a writer thread) while a reader takes the answers, which come in request
//! order; and an open loop at a fixed rate for latency.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};

/// Sends `lines` over `conns` connections to `socket` (each its share, as fast as the
/// socket takes them) and reads every answer. Checks each answer is committed. Returns
/// batches per second.
pub fn burst(socket: &Path, lines: &[Vec<u8>], conns: usize) -> anyhow::Result<f64> {
    let per = lines.len().div_ceil(conns.max(1)).max(1);
    let start = Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = lines
            .chunks(per)
            .map(|chunk| s.spawn(move || one_connection(socket, chunk, None)))
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a stream client thread panicked"))??;
        }
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(lines.len() as f64 / start.elapsed().as_secs_f64())
}

/// One connection sending `lines` at `rate` per second: the latency of every answer, from
/// its line's send to its answer's arrival. (p50, p99) in ms.
pub fn open_loop(socket: &Path, lines: &[Vec<u8>], rate: f64) -> anyhow::Result<(f64, f64)> {
    let mut lat = one_connection(socket, lines, Some(rate))?;
    lat.sort_by(f64::total_cmp);
    let at = |q: f64| {
        lat.get(((lat.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok((at(0.5), at(0.99)))
}

/// Writes every line (paced at `rate` if given) while reading the answers; returns each
/// answer's latency in ms.
fn one_connection(socket: &Path, lines: &[Vec<u8>], rate: Option<f64>) -> anyhow::Result<Vec<f64>> {
    let stream =
        UnixStream::connect(socket).with_context(|| format!("connect to {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut w = stream.try_clone()?;
    let start = Instant::now();
    let (sent, got) = std::thread::scope(|s| {
        let writer = s.spawn(move || -> anyhow::Result<Vec<Instant>> {
            let mut sent = Vec::with_capacity(lines.len());
            for (i, l) in lines.iter().enumerate() {
                if let Some(r) = rate {
                    let due = start + Duration::from_secs_f64(i as f64 / r);
                    std::thread::sleep(due.saturating_duration_since(Instant::now()));
                }
                sent.push(Instant::now());
                w.write_all(l)?;
                w.write_all(b"\n")?;
            }
            Ok(sent)
        });
        let got = read_answers(&stream, lines.len());
        let sent = writer
            .join()
            .map_err(|_| anyhow::anyhow!("the stream writer panicked"))?;
        Ok::<_, anyhow::Error>((sent?, got?))
    })?;
    Ok(sent
        .iter()
        .zip(&got)
        .map(|(s, g)| g.saturating_duration_since(*s).as_secs_f64() * 1e3)
        .collect())
}

/// `n` answer lines, each committed; when each arrived.
fn read_answers(stream: &UnixStream, n: usize) -> anyhow::Result<Vec<Instant>> {
    let mut r = BufReader::new(stream);
    let mut at = Vec::with_capacity(n);
    let mut line = String::new();
    for i in 0..n {
        line.clear();
        let got = r.read_line(&mut line).context("read an answer")?;
        ensure!(got > 0, "the stream closed after {i} of {n} answers");
        at.push(Instant::now());
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("answer {i}: {line}"))?;
        ensure!(v["status"] == "committed", "answer {i}: {line}");
    }
    Ok(at)
}
