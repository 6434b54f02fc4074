//! `roost status --json`: the daemon's state as one JSON object, built from the engine's
//! figures (and a cluster node's view). The shape is a public contract: fields are only
//! added, never renamed or removed. Never writes anything.

use roost_storage::Clock;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde_json::json;

use crate::cluster::Cluster;
use crate::pipeline::{Engine, Figures};
use crate::replica::{Node, Replication};

/// [`status_json`] with the `cluster` object of a cluster node.
pub fn status_with(node: &Node, cluster: Option<&Cluster>) -> serde_json::Value {
    let mut v = status_json(node);
    if let (Some(c), Some(obj)) = (cluster, v.as_object_mut()) {
        obj.insert("cluster".into(), c.status_json(node));
    }
    v
}

/// Everything `roost status --json` shows.
pub fn status_json(node: &Node) -> serde_json::Value {
    let engine = &*node.engine;
    let s = &engine.stats;
    let f = engine.figures();
    let (appends, syncs) = (f.wal_appends, f.wal_syncs);
    let (rounds, published) = (f.result_rounds, f.results_published);
    let committed = s.committed.load(Ordering::Relaxed);
    let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let rec = &f.recovery;
    json!({
        "epoch": node.repl.epoch_shown(),
        "replication": replication_json(engine, &node.repl),
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
        "tail_rounds": {
            "rounds": s.tail_rounds.load(Ordering::Relaxed),
            "settled": s.tail_settled.load(Ordering::Relaxed),
            "waiting": s.tail_waiting.load(Ordering::Relaxed),
        },
        "healthy": !engine.is_failed(),
        "intake": intake_json(engine),
        "stream": stream_json(engine),
        "bulk": bulk_json(engine),
        "file_groups": s.file_groups.load(Ordering::Relaxed),
        "files_in_groups": s.files_in_groups.load(Ordering::Relaxed),
        "checkpoint": checkpoint_json(&f, Clock::of(engine.storage().clone()).unix_ms()),
        "live_keys": f.live_keys(),
        "memory": memory_json(engine),
        "key_index": key_index_json(engine, &f),
        "shard_limit": shard_limit_json(engine, &f),
        "shard_compaction": compaction_json(engine),
        "disk_bytes": engine.disk_bytes().into_iter().map(|(k, v)| (k.to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "uptime_ms": f.uptime_ms,
        "shards": engine.shards().figures().into_iter().map(|(k, s)| (k, s.records)).collect::<BTreeMap<_, _>>(),
        "latency_ms": latency_json(engine),
        "recovery": {
            "duration_ms": rec.duration.as_millis() as u64,
            "records_replayed": rec.wal_records,
            "batches_finished": rec.batches_finished,
            "bytes_truncated": rec.wal_torn_bytes + rec.audit_torn_bytes,
        },
    })
}

/// Per pipeline phase since start: the bucket upper bounds holding p50 and p99, in ms (null
/// before the first batch or past the last bound), and the count and mean (null without a
/// batch): the count and mean are measurements, the bounds are not.
fn latency_json(engine: &Engine) -> serde_json::Value {
    let mut latency = serde_json::Map::new();
    for (phase, h) in engine.stats.latency.phases() {
        let q = |x: f64| {
            h.quantile_us(x)
                .filter(|u| *u != u64::MAX)
                .map(|u| u as f64 / 1e3)
        };
        let n = h.count();
        let mean = (n > 0).then(|| h.sum_us() as f64 / n as f64 / 1e3);
        latency.insert(
            phase.into(),
            json!({"p50": q(0.5), "p99": q(0.99), "count": n, "mean_ms": mean}),
        );
    }
    serde_json::Value::Object(latency)
}

/// The shards that exist and are open, their limits, idle closes and reopens.
fn shard_limit_json(engine: &Engine, f: &Figures) -> serde_json::Value {
    json!({
        "shards": f.shards_known,
        "open": f.shards_open,
        "shards_max": engine.config().shards_max,
        "shard_threads": engine.config().shard_threads,
        "shard_idle_close_ms": engine.config().shard_idle_close_ms,
        "idle_closes": engine.stats.shard_idle_closes.load(Ordering::Relaxed),
        "reopens": engine.stats.shard_reopens.load(Ordering::Relaxed),
    })
}

/// Compaction per shard.
fn compaction_json(engine: &Engine) -> serde_json::Value {
    let per_shard = engine.shards().compaction().into_iter().map(|(k, c)| {
        let v = json!({
            "compactions": c.compactions,
            "reclaimed_bytes": c.reclaimed_bytes,
            "dead_bytes": c.dead_bytes,
            "segments": c.segments,
            "in_progress": c.in_progress,
        });
        (k, v)
    });
    serde_json::Value::Object(per_shard.collect())
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
        "intake_bulk_bytes": m.intake_bulk_bytes,
        "intake_bulk_bytes_peak": m.intake_bulk_bytes_peak,
        "intake_stream_bytes": m.intake_stream_bytes,
        "intake_stream_bytes_peak": m.intake_stream_bytes_peak,
        "intake_bytes_max": m.intake_bytes_max,
        "intake_waits": m.intake_waits,
        "rss_anon_bytes": m.rss_anon_bytes,
        "rss_file_bytes": m.rss_file_bytes,
        "other_anon_bytes": m.other_anon_bytes,
    })
}

/// The request-key index on disk: runs, keys they hold, bytes, merges, keys read through it.
fn key_index_json(engine: &Engine, f: &Figures) -> serde_json::Value {
    let ix = f.key_index;
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
    let claims = engine.standby().deferred_claims();
    if claims > 0 {
        let reason = "claims from before the start are finished first (under ack = \"standby\" they wait for a standby)";
        return json!({"state": "finishing_claims", "claims": claims, "reason": reason, "pauses": pauses});
    }
    match engine.room().paused() {
        None => json!({"state": "open", "pauses": pauses}),
        Some(p) => json!({
            "state": "paused",
            "reason": "no room for the next segment",
            "part": p.part,
            "file": p.why.path.display().to_string(),
            "needed_bytes": p.why.needed_bytes,
            "error": p.why.error,
            "paused_ms": Clock::of(engine.storage().clone()).since(p.since).as_millis() as u64,
            "pauses": pauses,
        }),
    }
}

/// The streaming intake: connections open, accepted and refused since start, answer lines
/// sent (of which `unavailable`), the groups its batches ran in and their batches.
fn stream_json(engine: &Engine) -> serde_json::Value {
    let s = &engine.stats.stream;
    json!({
        "connections": s.connections.load(Ordering::Relaxed),
        "connections_total": s.connections_total.load(Ordering::Relaxed),
        "refused": s.refused.load(Ordering::Relaxed),
        "answers": s.answers.load(Ordering::Relaxed),
        "unavailable": s.unavailable.load(Ordering::Relaxed),
        "groups": s.groups.load(Ordering::Relaxed),
        "batches_in_groups": s.batches_in_groups.load(Ordering::Relaxed),
        "stalled": s.stalled.load(Ordering::Relaxed),
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

/// The last checkpoint: where recovery starts, its age at `now_ms` (the engine's clock);
/// `null` before the first.
fn checkpoint_json(f: &Figures, now_ms: u64) -> serde_json::Value {
    match &f.last_checkpoint {
        None => serde_json::Value::Null,
        Some(c) => json!({
            "wal_from": c.wal_from,
            "keys_through": c.keys_through,
            "age_ms": now_ms.saturating_sub(c.at_ms),
        }),
    }
}

/// The replication part of the status: role, epoch, high watermark, the standbys this
/// primary serves (lag in lsns), or the primary this standby follows.
fn replication_json(engine: &Engine, repl: &Replication) -> serde_json::Value {
    let r = &engine.config().replication;
    let end = repl.durable_end();
    let standbys: Vec<serde_json::Value> = repl
        .standbys()
        .into_iter()
        .map(|(name, s)| {
            json!({
                "name": name,
                "acked_lsn": s.acked.saturating_sub(1),
                "lag_lsns": end.saturating_sub(s.acked),
                "lag_bytes": repl.standby_lag_bytes(s.acked),
                "connected": s.connected,
                "last_fetch_ms": s.last_fetch.elapsed().as_millis() as u64,
            })
        })
        .collect();
    let follow = repl.follow_status().map(|f| {
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
    // A standby's hw is the leader's, as its last answer said (exclusive there, inclusive
    // here); the formula a leader computes from its own standbys means nothing on a standby.
    let hw = match (engine.role(), repl.follow_status()) {
        (crate::pipeline::Role::Standby, Some(f)) => f.leader_hw,
        (crate::pipeline::Role::Standby, None) => 1,
        _ => repl.high_watermark(),
    };
    json!({
        "role": engine.role().name(),
        "epoch": repl.epoch_shown(),
        "hw": hw.saturating_sub(1),
        "durable_lsn": end.saturating_sub(1),
        "ack": if r.ack == crate::config::Ack::Standby { "standby" } else { "local" },
        "when_standby_lost": if r.when_standby_lost == crate::config::StandbyLost::Alone { "alone" } else { "wait" },
        "listen": r.listen,
        "security": if r.tls() { "mutual_tls" } else { "plain" },
        "insecure": r.unauthenticated(),
        "members": r.members,
        "standbys": standbys,
        "standby_connected": repl.standbys().iter().any(|(_, s)| s.connected),
        "waiting_for_standby": repl.waiting_for_standby(),
        "published_alone": repl.published_alone(),
        "claims_to_finish": engine.standby().deferred_claims(),
        "follow": follow,
    })
}
