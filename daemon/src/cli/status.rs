//! `roost status [--json | --metrics]`: ask the running daemon over its control socket.
//! No daemon answering is the command's answer "not running", exit 1 (not an I/O failure:
//! nothing on disk is wrong and there is nothing for a restart of this command to repair).

use std::fmt::Write as _;

use anyhow::Context;

use crate::config::Config;
use crate::error::{CommandError, EXIT_OK};

pub(super) fn status(cfg: &Config, json: bool, metrics: bool) -> anyhow::Result<i32> {
    let path = crate::control::socket::socket_path(cfg);
    let what = if metrics { "metrics" } else { "status" };
    let text = crate::control::socket::request(&path, what).map_err(|e| {
        CommandError::failed(format!(
            "roost is not running, or not on this data directory (control socket {}): {e}",
            path.display()
        ))
    })?;
    if json || metrics {
        super::output::out(&text)?;
    } else {
        let v: serde_json::Value =
            serde_json::from_str(&text).context("reading the status answer")?;
        super::output::out(&status_text(&v))?;
    }
    Ok(EXIT_OK)
}

/// `roost promote`: asks the running standby to become the primary; prints the answer.
/// Exit 0 when promoted, 1 when the node refused (it is not a standby, or failed).
pub(super) fn promote(cfg: &Config) -> anyhow::Result<i32> {
    let path = crate::control::socket::socket_path(cfg);
    let text = crate::control::socket::request(&path, "promote").map_err(|e| {
        CommandError::failed(format!(
            "roost is not running, or not on this data directory (control socket {}): {e}",
            path.display()
        ))
    })?;
    super::output::out(&text)?;
    let v: serde_json::Value = serde_json::from_str(&text).context("reading the answer")?;
    if v["promoted"] == true {
        Ok(EXIT_OK)
    } else {
        Err(CommandError::failed(format!(
            "not promoted: {}",
            v["error"].as_str().unwrap_or("no reason given")
        ))
        .into())
    }
}

/// The status object as a few lines for a person.
fn status_text(v: &serde_json::Value) -> String {
    let mut out = String::new();
    let healthy = if v["healthy"] == true {
        "serving"
    } else {
        "UNHEALTHY"
    };
    let _ = writeln!(out, "roost: {healthy}");
    if v["intake"]["state"] == "paused" {
        let i = &v["intake"];
        let _ = writeln!(
            out,
            "  INTAKE PAUSED for {} ms: {} has no room for its next segment ({} needs {} bytes: {}); new files wait in new/, intake resumes by itself once there is room",
            i["paused_ms"], i["part"].as_str().unwrap_or("?"), i["file"].as_str().unwrap_or("?"),
            i["needed_bytes"], i["error"].as_str().unwrap_or("?")
        );
    }
    let _ = writeln!(
        out,
        "  epoch {}, last lsn {}, {} batches in flight",
        v["epoch"], v["last_lsn"], v["in_flight"]
    );
    replication_text(&mut out, &v["replication"]);
    cluster_text(&mut out, &v["cluster"]);
    let _ = writeln!(
        out,
        "  since start: {} committed, {} rejected, {} invalid, {} conflict, {} duplicate",
        v["committed"], v["rejected"], v["invalid"], v["conflict"], v["duplicate"]
    );
    let _ = writeln!(
        out,
        "  wal: {} appends, {} syncs ({:.1} records, {:.1} batches per sync)",
        v["wal_appends"],
        v["wal_syncs"],
        v["wal_records_per_sync"].as_f64().unwrap_or(0.0),
        v["wal_batches_per_sync"].as_f64().unwrap_or(0.0)
    );
    let _ = writeln!(
        out,
        "  results: {} published in {} rounds ({:.1} per round)",
        v["results_published"],
        v["result_rounds"],
        v["results_per_round"].as_f64().unwrap_or(0.0)
    );
    intake_text(&mut out, v);
    let ms = |phase: &str, q: &str| {
        v["latency_ms"][phase][q]
            .as_f64()
            .map_or("-".to_owned(), |x| format!("{x}"))
    };
    let _ = writeln!(out,
        "  latency p50/p99 (bucket bounds, ms): plan {}/{}, claim {}/{}, commit {}/{}, finish {}/{}, to result {}/{}",
        ms("plan", "p50"), ms("plan", "p99"),
        ms("claim", "p50"), ms("claim", "p99"),
        ms("commit", "p50"), ms("commit", "p99"),
        ms("finish", "p50"), ms("finish", "p99"),
        ms("batch", "p50"), ms("batch", "p99"),
    );
    if let Some(m) = v["shards"].as_object() {
        for (k, n) in m {
            let _ = writeln!(out, "  shard {k}: {n} records");
        }
    }
    let r = &v["recovery"];
    let _ = writeln!(
        out,
        "  last recovery: {} ms, {} records replayed, {} batches finished, {} bytes truncated",
        r["duration_ms"], r["records_replayed"], r["batches_finished"], r["bytes_truncated"]
    );
    out
}

/// The intakes beside single files: the stream socket, bulk files, groups of files.
fn intake_text(out: &mut String, v: &serde_json::Value) {
    let st = &v["stream"];
    let _ = writeln!(
        out,
        "  stream: {} connections open ({} since start, {} refused), {} answers ({} unavailable)",
        st["connections"], st["connections_total"], st["refused"], st["answers"], st["unavailable"]
    );
    let b = &v["bulk"];
    let _ = writeln!(
        out,
        "  bulk: {} files in flight, {} answered ({} lines), {} left for later",
        b["in_flight"], b["files"], b["lines"], b["deferred"]
    );
    let _ = writeln!(
        out,
        "  file groups: {} ({} files answered in groups)",
        v["file_groups"], v["files_in_groups"]
    );
}

/// The replication lines: role, high watermark, each standby's lag, or the primary followed.
fn replication_text(out: &mut String, r: &serde_json::Value) {
    let role = r["role"].as_str().unwrap_or("?");
    let _ = writeln!(
        out,
        "  role {role}, hw {}, ack {}",
        r["hw"],
        r["ack"].as_str().unwrap_or("?")
    );
    if r["insecure"] == true {
        let _ = writeln!(
            out,
            "  INSECURE: replication over plain TCP, no peer authenticated"
        );
    }
    if r["waiting_for_standby"] == true {
        let _ = writeln!(
            out,
            "  RESULTS WAIT: no standby in sync (when_standby_lost = \"wait\")"
        );
    }
    for s in r["standbys"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  standby {}: {}, acked lsn {}, lag {} lsns",
            s["name"].as_str().unwrap_or("?"),
            if s["connected"] == true {
                "connected"
            } else {
                "disconnected"
            },
            s["acked_lsn"],
            s["lag_lsns"]
        );
    }
    if let Some(f) = r["follow"].as_object() {
        let _ = writeln!(
            out,
            "  following {}: {}, leader epoch {}, leader hw {}, lag {} lsns",
            f["leader"].as_str().unwrap_or("?"),
            if f["connected"] == true {
                "connected"
            } else {
                "disconnected"
            },
            f["leader_epoch"],
            f["leader_hw"],
            f["lag_lsns"]
        );
    }
}

/// The cluster lines: who leads (or that no node does, and whether this one may campaign:
/// the daemon's `may_campaign`, from the agent's own rule), etcd's in-sync set, the last
/// etcd failure. Nothing for a node without `[cluster]`.
fn cluster_text(out: &mut String, c: &serde_json::Value) {
    if !c.is_object() {
        return; // not a cluster node
    }
    let name = c["name"].as_str().unwrap_or("?");
    let isr: Vec<&str> = c["isr"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.as_str())
        .collect();
    let set = if c["isr"].is_null() {
        "none yet".to_owned()
    } else {
        format!("{isr:?}")
    };
    let leader = match (c["leading"] == true, c["leader"].as_str()) {
        (true, _) => format!("leading, {} ms of lease left", c["lease_left_ms"]),
        (false, Some(l)) => format!("following {l}"),
        (false, None) if c["may_campaign"] == true => {
            "NO LEADER; this node may campaign".to_owned()
        }
        (false, None) => "NO LEADER; this node may not campaign (if every node the set names \
                          is lost for good: roost cluster unclean-election, docs/cluster.md)"
            .to_owned(),
    };
    let _ = writeln!(out, "  cluster {name}: {leader}; etcd's in-sync set {set}");
    if let Some(e) = c["etcd_error"].as_str() {
        let _ = writeln!(out, "  ETCD: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Goal: the text says who leads, and when no node does, whether this node may campaign
    /// and where the way out is when it may not.
    #[test]
    fn the_cluster_line_says_who_leads_and_who_may_campaign() {
        let text = |c: serde_json::Value| {
            let mut out = String::new();
            cluster_text(&mut out, &c);
            out
        };
        let stuck = text(
            json!({"name": "b", "leading": false, "leader": null, "isr": ["a"], "may_campaign": false}),
        );
        assert!(
            stuck.contains("NO LEADER; this node may not campaign"),
            "{stuck}"
        );
        assert!(
            stuck.contains("unclean-election") && stuck.contains("[\"a\"]"),
            "{stuck}"
        );
        let may = text(
            json!({"name": "b", "leading": false, "leader": null, "isr": ["a", "b"], "may_campaign": true}),
        );
        assert!(may.contains("this node may campaign"), "{may}");
        let fresh = text(
            json!({"name": "b", "leading": false, "leader": null, "isr": null, "may_campaign": true}),
        );
        assert!(
            fresh.contains("may campaign") && fresh.contains("none yet"),
            "{fresh}"
        );
        let follows = text(
            json!({"name": "b", "leading": false, "leader": "a", "isr": ["a"],
            "etcd_error": "etcd http://x: timed out"}),
        );
        assert!(follows.contains("following a"), "{follows}");
        assert!(
            follows.contains("ETCD: etcd http://x: timed out"),
            "{follows}"
        );
        let leads = text(
            json!({"name": "a", "leading": true, "leader": "a", "isr": ["a"],
            "lease_left_ms": 2100}),
        );
        assert!(leads.contains("leading, 2100 ms of lease left"), "{leads}");
        assert_eq!(
            text(serde_json::Value::Null),
            "",
            "a node without [cluster]"
        );
    }
}
