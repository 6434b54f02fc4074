//! `roost cluster list [--json]` (issue 42): the cluster's members as etcd sees them, one line
//! each, as `patronictl list` prints them: name, advertise address, role (leader, standby,
//! or unknown for a member with no key in etcd: not running), whether etcd's in-sync set
//! names it, its epoch, the leader's lease left (etcd's `timetolive` of the leader key's
//! lease, whole seconds), and the lag per standby when the daemon on this configuration
//! knows it (its `roost status`: a leader knows every standby's, a standby its own).
//!
//! It only reads: etcd's keys (docs/cluster.md, "The keys in etcd") and this node's control
//! socket. Each read is separate, so a list taken during an election may mix two moments.
//! Exit 0 when etcd answered, 1 when it did not (or holds a value roost cannot read), 78
//! without `[cluster]`.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use roost_etcd::Etcd;
use serde_json::{json, Value};

use crate::cluster::etcd_keys::{self, IsrValue, Keys, LeaderValue, MemberValue};
use crate::cluster::unclean::place;
use crate::config::{ClusterConfig, Config};
use crate::error::{CommandError, ErrorClass, EXIT_OK};

/// How long the command waits for etcd per call (a one-shot command: no fencing margin).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// What etcd holds for the cluster now.
struct Found {
    leader: Option<LeaderValue>,
    /// Seconds left on the leader key's lease (`None`: no leader, or etcd forgot the lease).
    lease_left_secs: Option<i64>,
    isr: Option<IsrValue>,
    /// etcd's epoch counter: the last epoch won.
    epoch: Option<u64>,
    members: Vec<MemberValue>,
}

/// One member's line.
struct Row {
    name: String,
    advertise: Option<String>,
    role: &'static str,
    running: bool,
    in_sync: bool,
    epoch: Option<u64>,
    lease_left_secs: Option<i64>,
    lag_lsns: Option<u64>,
    lag_bytes: Option<u64>,
}

pub(crate) fn list(cfg: &Config, json: bool) -> anyhow::Result<i32> {
    let c = cfg.cluster.as_ref().ok_or_else(|| CommandError {
        class: ErrorClass::Config,
        message: "`roost cluster list` needs the cluster's configuration: a [cluster] section \
                  (its etcd endpoints and prefix)"
            .into(),
    })?;
    let found = read(c).map_err(|e| CommandError::failed(format!("{}: {e}", place(c))))?;
    let (status, lag_note) = local_status(cfg);
    let rows = rows(cfg, &found, status.as_ref());
    let text = match json {
        true => format!(
            "{}\n",
            as_json(c, &found, &rows, status.as_ref(), &lag_note)
        ),
        false => as_text(c, &found, &rows, &lag_note),
    };
    super::super::output::out(&text)?;
    Ok(EXIT_OK)
}

/// The etcd client of `[cluster]` (the daemon's: the same endpoints and TLS files).
fn client(c: &ClusterConfig) -> Result<Etcd, String> {
    crate::cluster::handle::etcd_client(c)
        .map(|e| e.with_timeout(CALL_TIMEOUT))
        .map_err(|e| e.to_string())
}

/// Reads the leader key (and its lease's time left), the in-sync set, the epoch counter and
/// every member key.
fn read(c: &ClusterConfig) -> Result<Found, String> {
    let etcd = client(c)?;
    let keys = Keys::new(&c.prefix);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    rt.block_on(async {
        let e = |e: roost_etcd::EtcdError| e.to_string();
        let (leader_kv, _) = etcd.get(&keys.leader).await.map_err(e)?;
        let (isr_kv, _) = etcd.get(&keys.isr).await.map_err(e)?;
        let (epoch_kv, _) = etcd.get(&keys.epoch).await.map_err(e)?;
        let (member_kvs, _) = etcd.get_prefix(&keys.members).await.map_err(e)?;
        let lease_left_secs = match leader_kv.as_ref().map(|kv| kv.lease) {
            Some(lease) if lease != 0 => etcd.time_to_live(lease).await.map_err(e)?,
            _ => None,
        };
        Ok(Found {
            leader: leader_kv
                .map(|kv| etcd_keys::decode(&kv.key, &kv.value))
                .transpose()?,
            lease_left_secs,
            isr: isr_kv
                .map(|kv| etcd_keys::decode(&kv.key, &kv.value))
                .transpose()?,
            epoch: epoch_kv.and_then(|kv| String::from_utf8_lossy(&kv.value).trim().parse().ok()),
            members: member_kvs
                .iter()
                .map(|kv| etcd_keys::decode(&kv.key, &kv.value))
                .collect::<Result<_, _>>()?,
        })
    })
}

/// The status of the daemon on this configuration (its control socket), and a sentence on
/// where the lag comes from or why it is unknown.
fn local_status(cfg: &Config) -> (Option<Value>, String) {
    let path = crate::control::socket::socket_path(cfg);
    let answer = crate::control::socket::request(&path, "status")
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string()));
    match answer {
        Ok(v) if v["cluster"].is_object() => {
            let c = &v["cluster"];
            let name = c["name"].as_str().unwrap_or("?");
            let what = match c["leading"] == true {
                true => "the leader: every standby's lag",
                false => "a standby: its own lag only",
            };
            let note = format!("lag from {name}'s status ({what})");
            (Some(v), note)
        }
        Ok(_) => (
            None,
            "lag unknown: the local daemon is not a cluster node".into(),
        ),
        Err(e) => (
            None,
            format!(
                "lag unknown: no daemon answers on {} ({e}); run this on a node",
                path.display()
            ),
        ),
    }
}

/// Every member: those `[replication] members` names, those with a key in etcd, the leader
/// and those the in-sync set names; in name order.
fn rows(cfg: &Config, f: &Found, status: Option<&Value>) -> Vec<Row> {
    let mut names: BTreeSet<String> = cfg.replication.members.iter().cloned().collect();
    names.extend(f.members.iter().map(|m| m.name.clone()));
    names.extend(f.leader.iter().map(|l| l.name.clone()));
    names.extend(f.isr.iter().flat_map(|i| i.members.iter().cloned()));
    names.into_iter().map(|n| row(cfg, f, status, n)).collect()
}

fn row(cfg: &Config, f: &Found, status: Option<&Value>, name: String) -> Row {
    let member = f.members.iter().find(|m| m.name == name);
    let leader = f.leader.as_ref().filter(|l| l.name == name);
    let me = status.filter(|s| s["cluster"]["name"] == name.as_str());
    let advertise = member
        .map(|m| m.advertise.clone())
        .or_else(|| leader.map(|l| l.advertise.clone()))
        .or_else(|| {
            let c = cfg.cluster.as_ref()?;
            (cfg.replication.node_name() == name).then(|| c.advertise.clone())
        });
    let role = match (leader, member) {
        (Some(_), _) => "leader",
        (None, Some(_)) => "standby",
        (None, None) => "unknown",
    };
    let (lag_lsns, lag_bytes) = lag(status, &name, leader.is_some());
    Row {
        in_sync: f.isr.as_ref().is_some_and(|i| i.members.contains(&name)),
        epoch: leader
            .map(|l| u64::from(l.epoch))
            .or_else(|| me.and_then(|s| s["cluster"]["epoch"].as_u64())),
        lease_left_secs: leader.and(f.lease_left_secs),
        running: member.is_some(),
        name,
        advertise,
        role,
        lag_lsns,
        lag_bytes,
    }
}

/// `name`'s lag in lsns and bytes, when the local status knows it: the leader's (0), a
/// standby's as the leader last saw it, or this standby's own (in lsns only).
fn lag(status: Option<&Value>, name: &str, is_leader: bool) -> (Option<u64>, Option<u64>) {
    let Some(s) = status else {
        return (None, None);
    };
    if is_leader {
        return (Some(0), Some(0));
    }
    if s["cluster"]["leading"] == true {
        let standbys = s["replication"]["standbys"].as_array();
        let entry = standbys.and_then(|v| v.iter().find(|e| e["name"] == name));
        return entry.map_or((None, None), |e| {
            (e["lag_lsns"].as_u64(), e["lag_bytes"].as_u64())
        });
    }
    if s["cluster"]["name"] == name {
        return (s["replication"]["follow"]["lag_lsns"].as_u64(), None);
    }
    (None, None)
}

fn as_json(
    c: &ClusterConfig,
    f: &Found,
    rows: &[Row],
    status: Option<&Value>,
    lag_note: &str,
) -> Value {
    let members: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "advertise": r.advertise,
                "role": r.role,
                "running": r.running,
                "in_sync": r.in_sync,
                "epoch": r.epoch,
                "lease_left_secs": r.lease_left_secs,
                "lag_lsns": r.lag_lsns,
                "lag_bytes": r.lag_bytes,
            })
        })
        .collect();
    json!({
        "etcd": c.etcd,
        "prefix": c.prefix,
        "leader": f.leader.as_ref().map(|l| l.name.clone()),
        "epoch": f.epoch,
        "isr": f.isr.as_ref().map(|i| i.members.clone()),
        "lag_from": status.and_then(|s| s["cluster"]["name"].as_str()),
        "lag_note": lag_note,
        "members": members,
    })
}

fn as_text(c: &ClusterConfig, f: &Found, rows: &[Row], lag_note: &str) -> String {
    let mut out = String::new();
    let leader = f.leader.as_ref().map_or("NONE", |l| l.name.as_str());
    let isr = f
        .isr
        .as_ref()
        .map_or("none yet".into(), |i| i.members.join(", "));
    let epoch = f.epoch.map_or("-".into(), |e| e.to_string());
    let _ = writeln!(
        out,
        "cluster {}: leader {leader}, epoch {epoch}, in-sync set [{isr}]",
        place(c)
    );
    let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let mut table = vec![[
        "MEMBER",
        "ADVERTISE",
        "ROLE",
        "RUNNING",
        "IN_SYNC",
        "EPOCH",
        "LEASE_LEFT",
        "LAG_LSNS",
        "LAG_BYTES",
    ]
    .map(String::from)];
    let yes = |b: bool| if b { "yes" } else { "no" }.to_owned();
    for r in rows {
        table.push([
            r.name.clone(),
            dash(r.advertise.clone()),
            r.role.to_owned(),
            yes(r.running),
            yes(r.in_sync),
            dash(r.epoch.map(|e| e.to_string())),
            dash(r.lease_left_secs.map(|s| format!("{s} s"))),
            dash(r.lag_lsns.map(|l| l.to_string())),
            dash(r.lag_bytes.map(|l| l.to_string())),
        ]);
    }
    let widths: Vec<usize> = (0..9)
        .map(|i| table.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    for r in &table {
        let cells: Vec<String> = (0..9)
            .map(|i| format!("{:w$}", r[i], w = widths[i]))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    let _ = writeln!(out, "({lag_note})");
    out
}
