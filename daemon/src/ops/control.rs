//! The control socket (a Unix stream socket, mode 0660, in `$RUNTIME_DIRECTORY` or the data
//! directory) behind `roost status`, and the Prometheus text format. The protocol is one
//! request line, one answer, then the server closes: `status` answers JSON, `metrics`
//! answers Prometheus text. The JSON shape is a public contract: fields are only added.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tracing::{debug, warn};

use crate::cluster::Cluster;
use crate::config::Config;
use crate::pipeline::{now_ms, Engine};

/// `$RUNTIME_DIRECTORY/roost.sock` under systemd, else `<data-dir>/roost.sock`; the config's
/// `control_socket` overrides both.
pub fn socket_path(cfg: &Config) -> PathBuf {
    runtime_socket(cfg.control_socket.as_deref(), "roost.sock", &cfg.data_dir)
}

/// Where one of roost's client sockets lives: `configured` if set, else `NAME` in
/// `$RUNTIME_DIRECTORY` (its first entry) under systemd, else in the data directory.
pub fn runtime_socket(configured: Option<&Path>, name: &str, data_dir: &Path) -> PathBuf {
    if let Some(p) = configured {
        return p.to_path_buf();
    }
    match std::env::var_os("RUNTIME_DIRECTORY") {
        Some(v) if !v.is_empty() => {
            let s = v.to_string_lossy().into_owned();
            PathBuf::from(s.split(':').next().unwrap_or(".")).join(name)
        }
        _ => data_dir.join(name),
    }
}

/// Binds one of roost's client sockets (the control socket, the stream socket): a stale one
/// removed first (the data directory lock guarantees no other daemon owns it), then mode
/// 0660 (the daemon's group; the umask never widens it). Call from within the runtime.
pub fn bind_socket(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// [`status_json`] with the `cluster` object of a cluster node.
pub fn status_with(engine: &Engine, cluster: Option<&Cluster>) -> serde_json::Value {
    let mut v = status_json(engine);
    if let (Some(c), Some(obj)) = (cluster, v.as_object_mut()) {
        obj.insert("cluster".into(), c.status_json(engine));
    }
    v
}

/// [`metrics_text`] with a cluster node's figures.
pub fn metrics_with(engine: &Engine, cluster: Option<&Cluster>) -> String {
    let mut out = metrics_text(engine);
    if let Some(c) = cluster {
        write_unlabelled(&mut out, cluster_samples(engine, c));
    }
    out
}

/// A cluster node's figures (issue 27).
fn cluster_samples(
    engine: &Engine,
    c: &Cluster,
) -> [(&'static str, &'static str, &'static str, u64); 8] {
    let v = c.view();
    let s = &engine.stats;
    [
        (
            "roost_cluster_leading",
            "gauge",
            "1 while this node leads the cluster (etcd names it and its lease is renewed).",
            u64::from(v.leading()),
        ),
        (
            "roost_cluster_epoch",
            "gauge",
            "The highest leader epoch this node knows.",
            u64::from(engine.epoch()),
        ),
        (
            "roost_cluster_lease_left_milliseconds",
            "gauge",
            "While leading: how long this node may still answer without renewing its lease.",
            v.lease_left_ms().unwrap_or(0),
        ),
        (
            "roost_cluster_isr_members",
            "gauge",
            "Nodes in the in-sync set etcd holds (they alone may be elected).",
            v.isr.as_ref().map_or(0, |i| i.members.len() as u64),
        ),
        (
            "roost_cluster_forwarded_in_total",
            "counter",
            "Batches other members forwarded to this leader, answered.",
            s.forwarded_in.load(Ordering::Relaxed),
        ),
        (
            "roost_cluster_forwarded_out_total",
            "counter",
            "Batches this standby forwarded to the leader and answered.",
            s.forwarded_out.load(Ordering::Relaxed),
        ),
        (
            "roost_cluster_elections_won_total",
            "counter",
            "Elections this node won since start.",
            c.elections_won.load(Ordering::Relaxed),
        ),
        (
            "roost_cluster_fenced_total",
            "counter",
            "Times this leader fenced itself since start.",
            c.fenced.load(Ordering::Relaxed),
        ),
    ]
}

/// Everything `roost status --json` shows.
pub fn status_json(engine: &Engine) -> serde_json::Value {
    let s = &engine.stats;
    let (appends, syncs) = engine.wal_stats();
    let (rounds, published) = engine.publish_stats();
    let committed = s.committed.load(Ordering::Relaxed);
    let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let rec = engine.recovery_report();
    let mut latency = serde_json::Map::new();
    for (phase, h) in s.latency.phases() {
        // Bucket upper bounds in ms; null before the first batch or past the last bound.
        let q = |x: f64| {
            h.quantile_us(x)
                .filter(|u| *u != u64::MAX)
                .map(|u| u as f64 / 1e3)
        };
        latency.insert(phase.into(), json!({"p50": q(0.5), "p99": q(0.99)}));
    }
    json!({
        "epoch": engine.epoch().max(1),
        "replication": replication_json(engine),
        "last_lsn": engine.last_lsn(),
        "in_flight": s.in_flight.load(Ordering::Relaxed),
        "committed": committed,
        "rejected": s.rejected.load(Ordering::Relaxed),
        "invalid": s.invalid.load(Ordering::Relaxed),
        "conflict": s.conflict.load(Ordering::Relaxed),
        "duplicate": s.duplicate.load(Ordering::Relaxed),
        "wal_appends": appends,
        "wal_syncs": syncs,
        "wal_records_per_sync": per(appends, syncs),
        "wal_batches_per_sync": per(committed, syncs),
        "result_rounds": rounds,
        "results_published": published,
        "results_per_round": per(published, rounds),
        "shard_txns": s.shard_txns.load(Ordering::Relaxed),
        "shard_flushes": s.shard_flushes.load(Ordering::Relaxed),
        "healthy": !engine.is_failed(),
        "intake": intake_json(engine),
        "stream": stream_json(engine),
        "bulk": bulk_json(engine),
        "file_groups": s.file_groups.load(Ordering::Relaxed),
        "files_in_groups": s.files_in_groups.load(Ordering::Relaxed),
        "checkpoint": checkpoint_json(engine),
        "live_keys": engine.live_keys(),
        "memory": memory_json(engine),
        "key_index": key_index_json(engine),
        "shard_limit": {
            "shards": engine.shards_known(),
            "open": engine.shards_open(),
            "shards_max": engine.config().shards_max,
            "shard_threads": engine.config().shard_threads,
            "shard_idle_close_ms": engine.config().shard_idle_close_ms,
            "idle_closes": engine.stats.shard_idle_closes.load(Ordering::Relaxed),
            "reopens": engine.stats.shard_reopens.load(Ordering::Relaxed),
        },
        "shard_compaction": engine.shard_compaction().into_iter().map(|(k, c)| (k, json!({
            "compactions": c.compactions,
            "reclaimed_bytes": c.reclaimed_bytes,
            "dead_bytes": c.dead_bytes,
            "segments": c.segments,
            "in_progress": c.in_progress,
        }))).collect::<serde_json::Map<_, _>>(),
        "disk_bytes": engine.disk_bytes().into_iter().map(|(k, v)| (k.to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "uptime_ms": engine.uptime_ms(),
        "shards": engine.shard_counts(),
        "latency_ms": latency,
        "recovery": {
            "duration_ms": rec.duration.as_millis() as u64,
            "records_replayed": rec.wal_records,
            "batches_finished": rec.batches_finished,
            "bytes_truncated": rec.wal_torn_bytes + rec.audit_torn_bytes,
        },
    })
}

/// Memory by part (issue 25): the budget, the key index's filters and fences, the key
/// cache, the shard indexes, the resident set and the rest.
fn memory_json(engine: &Engine) -> serde_json::Value {
    let m = engine.memory();
    json!({
        "budget_bytes": m.budget_bytes,
        "key_filter_bytes": m.key_filter_bytes,
        "key_fence_bytes": m.key_fence_bytes,
        "key_cache_keys": m.key_cache_keys,
        "key_cache_bytes": m.key_cache_bytes,
        "shard_index_records": m.shard_index_records,
        "shard_index_bytes": m.shard_index_bytes,
        "rss_bytes": m.rss_bytes,
        "other_bytes": m.other_bytes,
    })
}

/// The request-key index on disk: runs, keys they hold, bytes, merges, keys read through it.
fn key_index_json(engine: &Engine) -> serde_json::Value {
    let ix = engine.key_index_stats();
    json!({
        "runs": ix.runs,
        "keys": ix.entries,
        "disk_bytes": ix.disk_bytes,
        "merges": ix.merges,
        "reads": engine.stats.key_index_reads.load(Ordering::Relaxed),
    })
}

/// `{"state": "open"}`, or `"paused"` with why: the part without room for its next segment,
/// the file, the bytes it needs, the error and how long intake has waited.
fn intake_json(engine: &Engine) -> serde_json::Value {
    let pauses = engine.stats.intake_pauses.load(Ordering::Relaxed);
    let role = engine.role();
    if role != crate::pipeline::Role::Primary {
        let reason = format!("this node is the {}: its spool is closed", role.name());
        return json!({"state": "closed", "reason": reason, "pauses": pauses});
    }
    let claims = engine.deferred_claims();
    if claims > 0 {
        let reason = "claims from before the start are finished first (under ack = \"standby\" they wait for a standby)";
        return json!({"state": "finishing_claims", "claims": claims, "reason": reason, "pauses": pauses});
    }
    match engine.paused() {
        None => json!({"state": "open", "pauses": pauses}),
        Some(p) => json!({
            "state": "paused",
            "reason": "no room for the next segment",
            "part": p.part,
            "file": p.why.path.display().to_string(),
            "needed_bytes": p.why.needed_bytes,
            "error": p.why.error,
            "paused_ms": p.since.elapsed().as_millis() as u64,
            "pauses": pauses,
        }),
    }
}

/// The streaming intake: connections open, accepted and refused since start, answer lines
/// sent (of which `unavailable`).
fn stream_json(engine: &Engine) -> serde_json::Value {
    let s = &engine.stats.stream;
    json!({
        "connections": s.connections.load(Ordering::Relaxed),
        "connections_total": s.connections_total.load(Ordering::Relaxed),
        "refused": s.refused.load(Ordering::Relaxed),
        "answers": s.answers.load(Ordering::Relaxed),
        "unavailable": s.unavailable.load(Ordering::Relaxed),
    })
}

/// Bulk files: worked on now, answered since start (and their lines), left for later.
fn bulk_json(engine: &Engine) -> serde_json::Value {
    let b = &engine.stats.bulk;
    json!({
        "in_flight": b.in_flight.load(Ordering::Relaxed),
        "files": b.files.load(Ordering::Relaxed),
        "lines": b.lines.load(Ordering::Relaxed),
        "deferred": b.deferred.load(Ordering::Relaxed),
    })
}

/// Bulk files' figures in Prometheus text.
fn write_bulk(out: &mut String, engine: &Engine) {
    let b = &engine.stats.bulk;
    let figures = [
        (
            "roost_bulk_files_in_flight",
            "gauge",
            "Bulk files worked on now.",
            &b.in_flight,
        ),
        (
            "roost_bulk_files_total",
            "counter",
            "Bulk files whose result was published since start.",
            &b.files,
        ),
        (
            "roost_bulk_lines_total",
            "counter",
            "Result lines of those bulk files.",
            &b.lines,
        ),
        (
            "roost_bulk_deferred_total",
            "counter",
            "Bulk files left in new/ for later (not taken now, or a stop).",
            &b.deferred,
        ),
        (
            "roost_file_groups_total",
            "counter",
            "Groups of spool files run together (one planner pass, one WAL sync, one out/ round).",
            &engine.stats.file_groups,
        ),
        (
            "roost_files_in_groups_total",
            "counter",
            "Spool files answered in those groups.",
            &engine.stats.files_in_groups,
        ),
    ];
    write_unlabelled(
        out,
        figures.map(|(n, k, h, v)| (n, k, h, v.load(Ordering::Relaxed))),
    );
}

/// The streaming intake's figures in Prometheus text.
fn write_stream(out: &mut String, engine: &Engine) {
    let s = &engine.stats.stream;
    let figures = [
        (
            "roost_stream_connections",
            "gauge",
            "Stream connections open now.",
            &s.connections,
        ),
        (
            "roost_stream_connections_total",
            "counter",
            "Stream connections accepted since start.",
            &s.connections_total,
        ),
        (
            "roost_stream_refused_total",
            "counter",
            "Stream connections refused over stream_connections_max since start.",
            &s.refused,
        ),
        (
            "roost_stream_answers_total",
            "counter",
            "Answer lines sent on stream connections since start.",
            &s.answers,
        ),
        (
            "roost_stream_unavailable_total",
            "counter",
            "Stream answers 'unavailable' (not taken now; retry under the same key).",
            &s.unavailable,
        ),
    ];
    write_unlabelled(
        out,
        figures.map(|(n, k, h, v)| (n, k, h, v.load(Ordering::Relaxed))),
    );
}

/// Metrics without labels, one sample each: (name, type, help, value).
fn write_unlabelled<const N: usize>(out: &mut String, figures: [(&str, &str, &str, u64); N]) {
    for (name, kind, help, value) in figures {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {value}");
    }
}

/// The last checkpoint: where recovery starts, its age; `null` before the first.
fn checkpoint_json(engine: &Engine) -> serde_json::Value {
    match engine.last_checkpoint() {
        None => serde_json::Value::Null,
        Some(c) => json!({
            "wal_from": c.wal_from,
            "keys_through": c.keys_through,
            "age_ms": now_ms().saturating_sub(c.at_ms),
        }),
    }
}

/// Prometheus text exposition format.
pub fn metrics_text(engine: &Engine) -> String {
    let s = &engine.stats;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP roost_batches_total Batches by final status since start."
    );
    let _ = writeln!(out, "# TYPE roost_batches_total counter");
    for (status, v) in [
        ("committed", &s.committed),
        ("rejected", &s.rejected),
        ("invalid", &s.invalid),
        ("conflict", &s.conflict),
        ("duplicate", &s.duplicate),
    ] {
        let _ = writeln!(
            out,
            "roost_batches_total{{status=\"{status}\"}} {}",
            v.load(Ordering::Relaxed)
        );
    }
    write_unlabelled(&mut out, samples(engine));
    let _ = writeln!(
        out,
        "# HELP roost_disk_bytes Bytes on disk per part (preallocated)."
    );
    let _ = writeln!(out, "# TYPE roost_disk_bytes gauge");
    for (part, n) in engine.disk_bytes() {
        let _ = writeln!(out, "roost_disk_bytes{{part=\"{part}\"}} {n}");
    }
    write_compaction(&mut out, engine);
    write_stream(&mut out, engine);
    write_bulk(&mut out, engine);
    write_replication(&mut out, engine);
    let _ = writeln!(out, "# HELP roost_shard_records Live records per shard.");
    let _ = writeln!(out, "# TYPE roost_shard_records gauge");
    for (name, n) in engine.shard_counts() {
        let _ = writeln!(out, "roost_shard_records{{shard=\"{name}\"}} {n}");
    }
    s.latency.write_prometheus(&mut out);
    out
}

/// The replication figures: epoch, hw, the largest standby lag, answers given alone,
/// whether answers wait for a standby, and the role as a labelled gauge.
fn write_replication(out: &mut String, engine: &Engine) {
    let end = engine.durable_end();
    let lag = engine
        .standbys()
        .iter()
        .map(|(_, s)| end.saturating_sub(s.acked))
        .max()
        .unwrap_or(0);
    let figures = [
        (
            "roost_replication_epoch",
            "gauge",
            "The leader epoch this node knows.",
            u64::from(engine.epoch()),
        ),
        (
            "roost_replication_hw",
            "gauge",
            "The high watermark: every lsn below it is durable here and on a standby.",
            engine.high_watermark().saturating_sub(1),
        ),
        (
            "roost_replication_standby_lag_lsns",
            "gauge",
            "The largest lag of a standby behind this primary's durable end, in records.",
            lag,
        ),
        (
            "roost_replication_published_alone_total",
            "counter",
            "Results published with no standby in sync (when_standby_lost = alone).",
            engine.published_alone(),
        ),
        (
            "roost_replication_waiting_for_standby",
            "gauge",
            "1 while results wait for a standby (ack = standby, none in sync).",
            u64::from(engine.waiting_for_standby()),
        ),
        (
            "roost_replication_insecure",
            "gauge",
            "1 when replication runs over plain TCP, no peer authenticated (no TLS).",
            u64::from(engine.config().replication.unauthenticated()),
        ),
    ];
    write_unlabelled(out, figures);
    let _ = writeln!(out, "# HELP roost_replication_role 1 for this node's role.");
    let _ = writeln!(out, "# TYPE roost_replication_role gauge");
    let _ = writeln!(
        out,
        "roost_replication_role{{role=\"{}\"}} 1",
        engine.role().name()
    );
}

/// (name, type, help, the figure).
type CompactionMetric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&roost_shards::CompactionStats) -> u64,
);

/// Per-shard compaction figures, one metric each with a `shard` label.
fn write_compaction(out: &mut String, engine: &Engine) {
    let figures = engine.shard_compaction();
    let metrics: [CompactionMetric; 3] = [
        (
            "roost_shard_compactions_total",
            "counter",
            "Shard segment compactions since start.",
            |c| c.compactions,
        ),
        (
            "roost_shard_reclaimed_bytes_total",
            "counter",
            "Bytes compaction gave back since start.",
            |c| c.reclaimed_bytes,
        ),
        (
            "roost_shard_dead_bytes",
            "gauge",
            "Bytes in sealed segments that compaction would drop.",
            |c| c.dead_bytes,
        ),
    ];
    for (name, kind, help, get) in metrics {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (shard, c) in &figures {
            let _ = writeln!(out, "{name}{{shard=\"{shard}\"}} {}", get(c));
        }
    }
}

/// One sample per metric without labels: (name, type, help, value).
fn samples(engine: &Engine) -> [(&'static str, &'static str, &'static str, u64); 23] {
    let s = &engine.stats;
    let (appends, syncs) = engine.wal_stats();
    let (rounds, published) = engine.publish_stats();
    let (_, audit_syncs) = engine.audit_stats();
    let paused = engine.paused();
    let mem = engine.memory();
    [
        (
            "roost_batches_in_flight",
            "gauge",
            "Batches between intake and result.",
            s.in_flight.load(Ordering::Relaxed),
        ),
        (
            "roost_wal_appends_total",
            "counter",
            "WAL records appended since start.",
            appends,
        ),
        (
            "roost_wal_syncs_total",
            "counter",
            "WAL fdatasyncs (group commits) since start.",
            syncs,
        ),
        (
            "roost_audit_syncs_total",
            "counter",
            "Audit log fdatasyncs (group commits) since start.",
            audit_syncs,
        ),
        (
            "roost_shard_txns_total",
            "counter",
            "Shard transactions applied since start.",
            s.shard_txns.load(Ordering::Relaxed),
        ),
        (
            "roost_shard_flushes_total",
            "counter",
            "Shard flushes (one msync each, grouped per owner round) since start.",
            s.shard_flushes.load(Ordering::Relaxed),
        ),
        (
            "roost_shards_open",
            "gauge",
            "Shards open now (maps, file descriptors, lock held); the others are closed.",
            s.shards_open.load(Ordering::Relaxed),
        ),
        (
            "roost_shard_idle_closes_total",
            "counter",
            "Shards closed after shard_idle_close_ms idle since start.",
            s.shard_idle_closes.load(Ordering::Relaxed),
        ),
        (
            "roost_shard_reopens_total",
            "counter",
            "Closed shards opened again by a message since start.",
            s.shard_reopens.load(Ordering::Relaxed),
        ),
        (
            "roost_result_rounds_total",
            "counter",
            "Rounds that published result files (one fsync of out/ each) since start.",
            rounds,
        ),
        (
            "roost_results_published_total",
            "counter",
            "Result files published since start.",
            published,
        ),
        (
            "roost_last_lsn",
            "gauge",
            "The last lsn written to the WAL.",
            engine.last_lsn(),
        ),
        (
            "roost_intake_paused",
            "gauge",
            "1 while intake waits for disk space (a log has no room for its next segment).",
            u64::from(paused.is_some()),
        ),
        (
            "roost_intake_paused_needed_bytes",
            "gauge",
            "Bytes the next segment needs while intake is paused (0 when open).",
            paused.as_ref().map_or(0, |p| p.why.needed_bytes),
        ),
        (
            "roost_live_request_keys",
            "gauge",
            "Request keys remembered now (inside the window or not yet checkpointed).",
            engine.live_keys() as u64,
        ),
        (
            "roost_memory_key_filter_bytes",
            "gauge",
            "Bytes of the request-key index's filters in memory (within memory_budget_bytes).",
            mem.key_filter_bytes,
        ),
        (
            "roost_memory_key_cache_bytes",
            "gauge",
            "Estimated bytes of the keys not yet checkpointed, held in memory.",
            mem.key_cache_bytes,
        ),
        (
            "roost_memory_shard_index_bytes",
            "gauge",
            "Estimated bytes of the shards' in-memory indexes (20 per record).",
            mem.shard_index_bytes,
        ),
        (
            "roost_memory_resident_bytes",
            "gauge",
            "The daemon's resident set size.",
            mem.rss_bytes,
        ),
        (
            "roost_key_index_runs",
            "gauge",
            "Sorted runs of the request-key index on disk.",
            engine.key_index_stats().runs,
        ),
        (
            "roost_checkpoint_wal_from",
            "gauge",
            "Where recovery starts: the last checkpoint's lsn (0 before the first).",
            engine.last_checkpoint().map_or(0, |c| c.wal_from),
        ),
        (
            "roost_checkpoint_age_seconds",
            "gauge",
            "Seconds since the last checkpoint (0 before the first).",
            engine
                .last_checkpoint()
                .map_or(0, |c| now_ms().saturating_sub(c.at_ms) / 1000),
        ),
        (
            "roost_intake_pauses_total",
            "counter",
            "Times intake paused for want of disk space since start.",
            s.intake_pauses.load(Ordering::Relaxed),
        ),
    ]
}

/// Binds the control socket ([`bind_socket`]) and answers requests until the task is
/// dropped.
pub async fn serve_socket(
    path: PathBuf,
    engine: Arc<Engine>,
    cluster: Option<Arc<Cluster>>,
) -> std::io::Result<()> {
    let listener = bind_socket(&path)?;
    loop {
        let (stream, _) = listener.accept().await?;
        let (engine, cluster) = (engine.clone(), cluster.clone());
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(r, 256));
            let answer = match tokio::time::timeout(
                Duration::from_secs(5),
                reader.read_line(&mut line),
            )
            .await
            {
                Ok(Ok(_)) => match line.trim() {
                    "status" => format!("{}\n", status_with(&engine, cluster.as_deref())),
                    "metrics" => metrics_with(&engine, cluster.as_deref()),
                    "promote" if cluster.is_some() => format!(
                        "{}\n",
                        json!({"promoted": false, "error": "this node is in a [cluster]: etcd elects the leader (stop the leader, or let its lease run out)"})
                    ),
                    "promote" => format!("{}\n", promote(&engine).await),
                    other => format!(
                        "{}\n",
                        json!({"error": format!("unknown request {other:?}: try status, metrics or promote")})
                    ),
                },
                _ => return,
            };
            if let Err(e) = w.write_all(answer.as_bytes()).await {
                debug!(error = %e, "control client went away");
            }
        });
    }
}

/// `promote`: this standby becomes the primary of a new epoch (`Engine::promote`); the
/// serve loop then stops following, finishes the claims it holds and opens the spool.
async fn promote(engine: &Arc<Engine>) -> serde_json::Value {
    let e = engine.clone();
    match tokio::task::spawn_blocking(move || e.promote()).await {
        Ok(Ok(epoch)) => {
            json!({"promoted": true, "epoch": epoch, "next_lsn": engine.last_lsn() + 1})
        }
        Ok(Err(e)) => json!({"promoted": false, "error": e.to_string()}),
        Err(e) => json!({"promoted": false, "error": e.to_string()}),
    }
}

/// The replication part of the status: role, epoch, high watermark, the standbys this
/// primary serves (lag in lsns), or the primary this standby follows.
fn replication_json(engine: &Engine) -> serde_json::Value {
    let r = &engine.config().replication;
    let end = engine.durable_end();
    let standbys: Vec<serde_json::Value> = engine
        .standbys()
        .into_iter()
        .map(|(name, s)| {
            json!({
                "name": name,
                "acked_lsn": s.acked.saturating_sub(1),
                "lag_lsns": end.saturating_sub(s.acked),
                "lag_bytes": engine.standby_lag_bytes(s.acked),
                "connected": s.connected,
                "last_fetch_ms": s.last_fetch.elapsed().as_millis() as u64,
            })
        })
        .collect();
    let follow = engine.follow_status().map(|f| {
        json!({
            "leader": f.leader,
            "connected": f.connected,
            "leader_epoch": f.leader_epoch,
            "leader_hw": f.leader_hw,
            "lag_lsns": f.leader_hw.saturating_sub(end),
            "records_received": f.records,
            "bytes_received": f.bytes,
        })
    });
    json!({
        "role": engine.role().name(),
        "epoch": engine.epoch(),
        "hw": engine.high_watermark().saturating_sub(1),
        "durable_lsn": end.saturating_sub(1),
        "ack": if r.ack == crate::config::Ack::Standby { "standby" } else { "local" },
        "when_standby_lost": if r.when_standby_lost == crate::config::StandbyLost::Alone { "alone" } else { "wait" },
        "listen": r.listen,
        "security": if r.tls() { "mutual_tls" } else { "plain" },
        "insecure": r.unauthenticated(),
        "members": r.members,
        "standbys": standbys,
        "standby_connected": engine.standbys().iter().any(|(_, s)| s.connected),
        "waiting_for_standby": engine.waiting_for_standby(),
        "published_alone": engine.published_alone(),
        "claims_to_finish": engine.deferred_claims(),
        "follow": follow,
    })
}

/// Serves the Prometheus text on a loopback TCP address (`metrics_listen`, off by default),
/// answering any HTTP request with the metrics.
pub async fn serve_metrics_tcp(
    addr: std::net::SocketAddr,
    engine: Arc<Engine>,
    cluster: Option<Arc<Cluster>>,
) -> std::io::Result<()> {
    if !addr.ip().is_loopback() {
        warn!(%addr, "metrics_listen is not a loopback address; refusing to expose metrics");
        return Ok(());
    }
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let (engine, cluster) = (engine.clone(), cluster.clone());
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(r, 8192));
            let mut line = String::new();
            // Read the request head up to the blank line, bounded.
            loop {
                line.clear();
                match tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line))
                    .await
                {
                    Ok(Ok(n)) if n > 0 && line.trim() != "" => continue,
                    _ => break,
                }
            }
            let body = metrics_with(&engine, cluster.as_deref());
            let resp = format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = w.write_all(resp.as_bytes()).await;
        });
    }
}

/// The client side: one request, the whole answer.
pub fn request(path: &Path, what: &str) -> std::io::Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{what}\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
