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
    let text =
        crate::control::socket::request(&path, what).map_err(|e| not_answered(cfg, &path, &e))?;
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
    let text = crate::control::socket::request(&path, "promote")
        .map_err(|e| not_answered(cfg, &path, &e))?;
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

/// Why no daemon answered on the control socket `path`: which socket and data directory were
/// tried, and whether that means no daemon runs there (no socket, or nobody listening on a
/// socket a stopped daemon left) or that one may run but cannot be asked.
fn not_answered(cfg: &Config, path: &std::path::Path, e: &std::io::Error) -> CommandError {
    use std::io::ErrorKind;
    let (socket, data) = (path.display(), cfg.data_dir.display());
    let tried = format!("control socket {socket}, data directory {data}");
    let hint = "start it with `roost serve`, or name the daemon's own with --config or --data-dir";
    CommandError::failed(match e.kind() {
        ErrorKind::NotFound => {
            format!("not running: no roost daemon is serving here ({tried}: the socket does not exist); {hint}")
        }
        ErrorKind::ConnectionRefused => format!(
            "not running: no roost daemon is serving here ({tried}: nothing listens on the socket, left by a daemon that stopped); {hint}"
        ),
        ErrorKind::PermissionDenied => format!(
            "cannot ask the daemon ({tried}): permission denied; run as the daemon's user or as root"
        ),
        _ => format!("cannot ask the daemon ({tried}): {e}"),
    })
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
    replication_text(&mut out, &v["replication"], v["cluster"].is_object());
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
    let _ = writeln!(out, "{}", latency_text(&v["latency_ms"]));
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

/// The phases' latency since start: per phase its mean (a measurement) and the buckets that
/// hold its p50 and p99 (shown as bounds, `<=`, never as if measured); a phase that has seen
/// no batch says so rather than showing a bound.
fn latency_text(l: &serde_json::Value) -> String {
    const PHASES: [(&str, &str); 5] = [
        ("plan", "plan"),
        ("claim", "claim"),
        ("commit", "commit"),
        ("finish", "finish"),
        ("batch", "to result"),
    ];
    let bound = |x: &serde_json::Value| x.as_f64().map_or("?".to_owned(), |b| format!("<={b}"));
    let phases: Vec<String> = PHASES
        .iter()
        .map(|(key, label)| {
            let p = &l[*key];
            let bounds = format!("{}/{}", bound(&p["p50"]), bound(&p["p99"]));
            match (p["count"].as_u64(), p["mean_ms"].as_f64()) {
                (Some(n), Some(mean)) if n > 0 => {
                    format!("{label} {mean:.1} ({bounds}, {n} batches)")
                }
                // A daemon from before the count was shown: its bounds alone, as bounds.
                (None, _) if p["p50"].is_number() => format!("{label} ({bounds})"),
                _ => format!("{label} no samples"),
            }
        })
        .collect();
    format!(
        "  latency since start, ms (mean, then p50/p99 bucket bounds): {}",
        phases.join(", ")
    )
}

/// ", N batches in M groups" of the stream's figures; nothing from a daemon that keeps no
/// such figures (one from before 7 December 2026).
fn stream_groups(st: &serde_json::Value) -> String {
    match (st["batches_in_groups"].as_u64(), st["groups"].as_u64()) {
        (Some(b), Some(g)) => format!(", {b} batches in {g} groups"),
        _ => String::new(),
    }
}

/// The intakes beside single files: the stream socket, bulk files, groups of files.
fn intake_text(out: &mut String, v: &serde_json::Value) {
    let st = &v["stream"];
    let _ = writeln!(
        out,
        "  stream: {} connections open ({} since start, {} refused), {} answers ({} unavailable){}",
        st["connections"],
        st["connections_total"],
        st["refused"],
        st["answers"],
        st["unavailable"],
        stream_groups(st)
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
/// A node that neither listens for standbys, follows a primary nor belongs to a cluster says
/// it is a single node, rather than showing an empty link to a leader it never had.
fn replication_text(out: &mut String, r: &serde_json::Value, clustered: bool) {
    let role = r["role"].as_str().unwrap_or("?");
    if single_node(r, clustered) {
        let _ = writeln!(
            out,
            "  single node (no replication, not in a cluster), hw {}",
            r["hw"]
        );
        return;
    }
    let known = if role == "standby" {
        " (the leader's, as last heard)"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "  role {role}, hw {}{known}, ack {}",
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
        let leader = match f["leader"].as_str() {
            Some(l) if !l.is_empty() => l,
            _ => "no leader known yet",
        };
        let _ = writeln!(
            out,
            "  following {leader}: {}, leader epoch {}, lag {} lsns",
            if f["connected"] == true {
                "connected"
            } else {
                "disconnected"
            },
            f["leader_epoch"],
            f["lag_lsns"]
        );
    }
}

/// A primary with no `listen`, no link to a primary, no standby and no `[cluster]`.
fn single_node(r: &serde_json::Value, clustered: bool) -> bool {
    r["role"] == "primary"
        && r["listen"].is_null()
        && r["follow"].is_null()
        && r["standbys"].as_array().is_none_or(|s| s.is_empty())
        && !clustered
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

    /// Goal (issue 43): a single node says so (its text read "following : disconnected,
    /// leader epoch 0, leader hw 0"); a standby shows the leader's hw as the one it knows
    /// and names whom it follows; a primary with standbys lists them.
    #[test]
    fn the_replication_lines_name_a_single_node_and_a_standby_s_hw() {
        let text = |r: serde_json::Value, clustered: bool| {
            let mut out = String::new();
            replication_text(&mut out, &r, clustered);
            out
        };
        let single = json!({"role": "primary", "hw": 3, "ack": "local", "listen": null,
            "standbys": [], "follow": null});
        let one = text(single.clone(), false);
        assert!(one.contains("single node") && one.contains("hw 3"), "{one}");
        assert!(!one.contains("following"), "{one}");
        let member = text(single, true);
        assert!(
            member.contains("role primary"),
            "a cluster member is no single node: {member}"
        );
        let standby = text(
            json!({"role": "standby", "hw": 6, "ack": "standby", "listen": "127.0.0.1:7402",
            "standbys": [], "follow": {"leader": "127.0.0.1:7401", "connected": true,
            "leader_epoch": 257, "leader_hw": 7, "lag_lsns": 0}}),
            false,
        );
        assert!(
            standby.contains("role standby, hw 6 (the leader's"),
            "{standby}"
        );
        assert!(
            standby.contains("following 127.0.0.1:7401: connected, leader epoch 257, lag 0"),
            "{standby}"
        );
        let primary = text(
            json!({"role": "primary", "hw": 6, "ack": "standby", "listen": "127.0.0.1:7401",
            "follow": null, "standbys": [{"name": "b", "connected": true, "acked_lsn": 6,
            "lag_lsns": 0}]}),
            false,
        );
        assert!(
            primary.contains("role primary, hw 6, ack standby"),
            "{primary}"
        );
        assert!(primary.contains("standby b: connected"), "{primary}");
    }

    /// Goal (issue 43): a phase without a sample says "no samples" (an idle daemon showed
    /// "finish 250/250"); one with samples shows its measured mean and its p50/p99 as the
    /// bucket bounds they are ("<=").
    #[test]
    fn latency_shows_means_and_bounds_never_a_bound_as_a_measurement() {
        let idle = latency_text(&json!({
            "plan": {"p50": null, "p99": null, "count": 0, "mean_ms": null},
            "finish": {"p50": 250.0, "p99": 250.0, "count": 0, "mean_ms": null},
        }));
        assert!(idle.contains("plan no samples"), "{idle}");
        assert!(idle.contains("finish no samples"), "{idle}");
        assert!(!idle.contains("250"), "{idle}");
        let busy = latency_text(&json!({
            "finish": {"p50": 100.0, "p99": 250.0, "count": 12, "mean_ms": 101.0},
        }));
        assert!(
            busy.contains("finish 101.0 (<=100/<=250, 12 batches)"),
            "{busy}"
        );
        let older = latency_text(&json!({"claim": {"p50": 2.5, "p99": 5.0}}));
        assert!(older.contains("claim (<=2.5/<=5)"), "{older}");
    }

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
