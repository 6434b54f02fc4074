//! The metrics endpoint of a live `roost serve` (issue 28, docs/metrics.md): scraped over
//! HTTP after spool files and a stream batch, its Prometheus text 0.0.4 must pass
//! `promtool check metrics` (Debian's package `prometheus`; the test fails, never skips,
//! without it), its OpenMetrics text must have one family per name, samples only with their
//! family's suffixes, and units at the end of the names; and the endpoint keeps its bounds.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::stream::{batch_line, connect, read_answer};
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// A loopback port kept from the kernel's own picks while the reservation lives (the
/// daemon binds it a moment later; `roost_etcd::testing::ReservedPort`).
fn free_addr() -> (roost_etcd::testing::ReservedPort, SocketAddr) {
    let r = roost_etcd::testing::ReservedPort::new().expect("reserve a port");
    let addr = SocketAddr::from(([127, 0, 0, 1], r.port()));
    (r, addr)
}

/// `roost serve` with `metrics_listen = ADDR`.
fn serve_with_metrics(dir: &Path, addr: SocketAddr) -> roost::drill::child::ServeChild {
    let cfg = dir.join("roost.toml");
    std::fs::write(&cfg, format!("metrics_listen = \"{addr}\"\n")).expect("write config");
    let args = ["--config", cfg.to_str().expect("utf-8 path")];
    serve_ready(&dir.join("data"), &dir.join("serve.log"), &args)
}

/// Sends `request` as is and returns the whole answer (the server closes after one).
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to metrics_listen");
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    s.write_all(request).expect("send the request");
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => {}
        // A server that closes with our request unread resets the connection.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("reading the answer: {e}"),
    }
    String::from_utf8(out).expect("a UTF-8 answer")
}

/// `GET /metrics` with `accept` (if any): (status line, content type, body).
fn scrape(addr: SocketAddr, accept: Option<&str>) -> (String, String, String) {
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    let req = format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{accept}\r\n");
    let answer = exchange(addr, req.as_bytes());
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {answer:?}"));
    let status = head.lines().next().unwrap_or_default().to_owned();
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("content-type: "))
        .unwrap_or_default()
        .to_owned();
    (status, content_type, body.to_owned())
}

/// The suffixes a sample may add to its family's name, by type (OpenMetrics 1.0).
fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "histogram" => &["_bucket", "_sum", "_count", "_created"],
        _ => &[""],
    }
}

/// OpenMetrics' rules this exporter can break: a family named twice, a sample that is not
/// its family's (a colliding name), a unit that is not the name's last part, `_total` on a
/// family that is not a counter, no `# EOF` at the end. Returns every problem.
fn openmetrics_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut families: BTreeMap<String, String> = BTreeMap::new();
    let mut current = (String::new(), String::new());
    for line in text.lines() {
        let words: Vec<&str> = line.splitn(4, ' ').collect();
        match words.as_slice() {
            ["#", "TYPE", name, kind] => {
                if families
                    .insert(name.to_string(), kind.to_string())
                    .is_some()
                {
                    problems.push(format!("family {name} declared twice"));
                }
                if name.ends_with("_total") {
                    problems.push(format!("{kind} {name} ends in _total"));
                }
                current = (name.to_string(), kind.to_string());
            }
            ["#", "UNIT", name, unit] if !name.ends_with(&format!("_{unit}")) => {
                problems.push(format!("{name}: unit {unit} is not its last part"))
            }
            ["#", ..] => {}
            _ => {
                let sample = line.split(['{', ' ']).next().unwrap_or_default();
                let (family, kind) = &current;
                let ok = suffixes(kind)
                    .iter()
                    .any(|s| sample == format!("{family}{s}"));
                if !ok {
                    problems.push(format!(
                        "sample {sample} is not of family {family} ({kind})"
                    ));
                }
            }
        }
    }
    let names: BTreeSet<&String> = families.keys().collect();
    for (name, kind) in &families {
        for s in suffixes(kind).iter().filter(|s| !s.is_empty()) {
            if names.contains(&format!("{name}{s}")) {
                problems.push(format!("family {name}{s} collides with {kind} {name}"));
            }
        }
    }
    if !text.ends_with("# EOF\n") {
        problems.push("no # EOF at the end".into());
    }
    problems
}

/// Goal: a live daemon's metrics, with counters and histograms that have values and a
/// stream connection open, pass `promtool check metrics` (0.0.4) and OpenMetrics' naming
/// rules; the renamed metrics are there under their new names only (docs/metrics.md).
/// Method: `roost serve` with `metrics_listen`; two spool batches, one stream batch on a
/// connection kept open; scrape in both formats; promtool and the checker above.
#[test]
fn a_live_daemons_metrics_pass_promtool() {
    let t = tempfile::tempdir().expect("tempdir");
    let (_reserved, addr) = free_addr();
    let _d = serve_with_metrics(t.path(), addr);
    let data = t.path().join("data");
    for key in ["m1", "m2"] {
        drop_and_wait(&data.join("spool"), key, Duration::from_secs(30));
    }
    let conn = connect(&data, Duration::from_secs(30));
    let mut w = conn.try_clone().expect("clone the stream connection");
    w.write_all(batch_line("s1", "s", 2).as_bytes())
        .expect("send a stream batch");
    let answer = read_answer(&mut BufReader::new(conn));
    assert_eq!(answer["status"], "committed", "{answer}");
    let text = plain_text_passes_promtool(addr);
    let om = openmetrics_is_well_formed(addr);
    for (text, line) in [
        (&text, "roost_stream_connections_open 1\n"),
        (&text, "# TYPE roost_batch_seconds histogram\n"),
        (&om, "# TYPE roost_stream_connections counter\n"),
        (&om, "roost_stream_connections_total 1\n"),
        (&om, "roost_stream_connections_open 1\n"),
        (&om, "# UNIT roost_batch_seconds seconds\n"),
        (&om, "# UNIT roost_disk_bytes bytes\n"),
        (&om, "roost_phase_seconds_count{phase=\"commit\"} 3\n"),
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
    assert!(!om.contains("roost_batch_seconds_count 0\n"), "{om}");
    only_new_names(&om);
}

/// The 0.0.4 text, once it counts the three batches, through promtool.
fn plain_text_passes_promtool(addr: SocketAddr) -> String {
    // A stream answer is handed over before the batch's tail counts it: wait for the count.
    let plain = Some("text/plain; version=0.0.4");
    let committed = "roost_batches_total{status=\"committed\"} 3\n";
    let (mut status, mut ct, mut text) = Default::default();
    wait_for(
        "three committed batches in the metrics",
        Duration::from_secs(10),
        || {
            (status, ct, text) = scrape(addr, plain);
            text.contains(committed)
        },
    );
    assert_eq!(status, "HTTP/1.1 200 OK", "{text}");
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    if let Err(e) = promtool(&text) {
        panic!("{e}\n--- the metrics:\n{text}");
    }
    text
}

/// The OpenMetrics text (Prometheus' own `Accept`), checked by [`openmetrics_problems`];
/// no `Accept` still gets the 0.0.4 text the endpoint always served.
fn openmetrics_is_well_formed(addr: SocketAddr) -> String {
    let (_, ct, _) = scrape(addr, None);
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let prometheus = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let (status, ct, om) = scrape(addr, Some(prometheus));
    assert_eq!(status, "HTTP/1.1 200 OK", "{om}");
    let openmetrics = "application/openmetrics-text; version=1.0.0";
    assert!(ct.starts_with(openmetrics), "{ct}");
    let problems = openmetrics_problems(&om);
    let all = problems.join("\n");
    assert!(problems.is_empty(), "{all}\n--- the metrics:\n{om}");
    om
}

/// The renamed metrics are there under their new names only: the old names are served
/// only with `metrics_legacy_names = true` (`metrics_tls.rs` scrapes them so).
fn only_new_names(om: &str) {
    for (old, new) in [
        (
            "roost_replication_hw",
            "roost_replication_high_watermark_lsn",
        ),
        ("roost_checkpoint_wal_from", "roost_checkpoint_wal_from_lsn"),
    ] {
        assert!(om.contains(&format!("\n{new} ")), "no {new} in\n{om}");
        assert!(
            !om.contains(&format!("\n{old} ")),
            "{old} served by default:\n{om}"
        );
    }
}

/// Goal: `metrics_listen` takes any address (issue 43: `0.0.0.0:9187` used to start with a
/// warning and serve nothing). Method: `0.0.0.0:PORT` without a web configuration: the log
/// says the listener is up (TLS off) and warns, once, that it is unauthenticated; a scrape
/// through loopback (which 0.0.0.0 covers) gets the metrics.
#[test]
fn any_address_is_served_and_an_open_one_is_warned_about() {
    let t = tempfile::tempdir().expect("tempdir");
    let (reserved, _) = free_addr();
    let any = SocketAddr::from(([0, 0, 0, 0], reserved.port()));
    let d = serve_with_metrics(t.path(), any);
    let (status, _, text) = scrape(SocketAddr::from(([127, 0, 0, 1], reserved.port())), None);
    assert_eq!(status, "HTTP/1.1 200 OK", "{text}");
    assert!(
        text.contains("# TYPE roost_batches_total counter"),
        "{text}"
    );
    let log = d.log_text();
    assert!(
        log.contains("metrics listener up") && log.contains("tls=false"),
        "{log}"
    );
    let warned = log
        .matches("metrics_listen is not a loopback address")
        .count();
    assert_eq!(warned, 1, "{log}");
    assert!(log.contains("unauthenticated"), "{log}");
}

/// Goal: the checks above can fail: a gauge beside a counter of the same family (the
/// `roost_stream_connections` collision this exporter had), `_total` on a gauge and a unit
/// not at the end are each reported; promtool rejects a counter without `_total` and a
/// unit it does not take (milliseconds).
#[test]
fn the_checks_catch_a_collision_and_a_bad_unit() {
    let collision = "# TYPE roost_stream_connections gauge\nroost_stream_connections 1\n\
        # TYPE roost_stream_connections counter\nroost_stream_connections_total 2\n# EOF\n";
    let p = openmetrics_problems(collision);
    assert!(p.iter().any(|p| p.contains("declared twice")), "{p:?}");
    let gauge_total = "# TYPE roost_x_total gauge\nroost_x_total 1\n# EOF\n";
    assert!(!openmetrics_problems(gauge_total).is_empty());
    let unit = "# TYPE roost_age gauge\n# UNIT roost_age seconds\nroost_age 1\n# EOF\n";
    assert!(!openmetrics_problems(unit).is_empty());
    assert!(
        !openmetrics_problems("# TYPE a gauge\na 1\n").is_empty(),
        "no # EOF"
    );
    let ms = "# HELP roost_lease_left_milliseconds x\n# TYPE roost_lease_left_milliseconds gauge\nroost_lease_left_milliseconds 1\n";
    assert!(promtool(ms).is_err(), "promtool took milliseconds");
    let counter = "# HELP roost_x x\n# TYPE roost_x counter\nroost_x 1\n";
    assert!(
        promtool(counter).is_err(),
        "promtool took a counter without _total"
    );
}

/// Goal: the endpoint keeps its bounds: only `GET`/`HEAD` (405 otherwise; any path), a request
/// head over 8 KiB refused (431, or reset), at most 16 connections at once (one more is
/// closed unanswered or reset), and an idle connection closed after the 5 s head timeout,
/// freeing its place.
#[test]
fn the_endpoint_is_bounded() {
    let t = tempfile::tempdir().expect("tempdir");
    let (_reserved, addr) = free_addr();
    let _d = serve_with_metrics(t.path(), addr);
    let post = exchange(
        addr,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    // Any path answers, as the endpoint always did.
    let other = exchange(addr, b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");
    assert!(
        other.contains("# TYPE roost_batches_total counter"),
        "{other}"
    );
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(10_000)
    );
    let big = exchange(addr, big.as_bytes());
    // 431, or a reset that beat it (the rest of the head was left unread): never served.
    assert!(big.is_empty() || big.starts_with("HTTP/1.1 431"), "{big}");
    // A connection's task gives its place back just after the socket closes: under load
    // (seen with this binary's other daemons running) the last one's place could still be
    // taken when the idle ones arrive, and the 17th would find it free.
    std::thread::sleep(Duration::from_millis(300));

    let idle: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(addr).expect("an idle connection"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let over = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(over, "", "the 17th connection was answered");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf);
        assert!(
            text.is_empty() || text.starts_with("HTTP/1.1 408"),
            "{text}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
    wait_for("a free place", Duration::from_secs(5), || {
        scrape(addr, None).0 == "HTTP/1.1 200 OK"
    });
}
