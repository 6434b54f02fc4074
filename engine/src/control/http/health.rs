//! The health checks on `metrics_listen` (issue 42), as Patroni's REST API offers them to a
//! load balancer: `GET /health`, `/leader` and `/replica` answer 200 or 503 and a small JSON
//! body saying why. They only read what the engine and the cluster agent already keep (the
//! role, the intake's state, the agent's view of etcd); they never ask etcd nor change
//! anything, so a check costs a few uncontended locks and never waits.
//!
//! | check | 200 when | 503 otherwise |
//! |---|---|---|
//! | `/health` | the daemon serves: a primary whose intake is open (in a cluster: it leads), a cluster standby that knows the leader (it forwards), a standby by hand (`follow`) | its I/O failed (latched), intake paused or finishing claims, stepped down, draining (a stop began), a cluster standby with no leader known |
//! | `/leader` | this node may take and answer batches: a primary with its intake open, in a cluster leading (etcd names it, its lease not lapsed) | every other node |
//! | `/replica` | a standby in sync: in a cluster, etcd's in-sync set names it and it follows a leader; by hand, it is connected to its primary | every other node |
//!
//! Every check is also 503 once the engine failed (a latched write or sync error), and from
//! the moment a stop (SIGTERM) or a rejoin begins to drain the node (`intake`:
//! `draining`): a load balancer moves clients away while in-flight batches finish, before
//! the listener closes (then the port refuses).

use serde_json::json;

use crate::cluster::Cluster;
use crate::pipeline::{Engine, Role};
use crate::replica::Node;

/// The three checks, by path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Health,
    Leader,
    Replica,
}

impl Check {
    /// The check a request path names (a trailing `/` allowed); `None` for any other path
    /// (the metrics, as the endpoint always answered).
    pub fn of_path(path: &str) -> Option<Check> {
        match path.strip_suffix('/').unwrap_or(path) {
            "/health" => Some(Check::Health),
            "/leader" => Some(Check::Leader),
            "/replica" => Some(Check::Replica),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Check::Health => "health",
            Check::Leader => "leader",
            Check::Replica => "replica",
        }
    }
}

/// What the checks look at, read once per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// The engine's role (`primary`, `standby`, `stepped_down`).
    pub role: Role,
    /// `open`, `paused`, `finishing_claims` or `closed`, as `roost status` says.
    pub intake: &'static str,
    /// The engine latched a failed write or sync: it takes nothing more.
    pub failed: bool,
    /// A `[cluster]` node.
    pub cluster: bool,
    /// A cluster node: etcd names it leader and its lease has not lapsed (outside a
    /// cluster: the primary).
    pub leading: bool,
    /// A cluster node: etcd's in-sync set names it. Outside a cluster: the primary, or a
    /// standby connected to its primary.
    pub in_sync: bool,
    /// A standby that has a leader to follow (cluster: etcd names one; by hand: connected).
    pub following: bool,
    pub epoch: u32,
    /// The leader's name, when a cluster node knows it.
    pub leader: Option<String>,
}

impl Health {
    /// Reads the engine's and the cluster agent's state now.
    pub fn read(node: &Node, cluster: Option<&Cluster>) -> Health {
        let (engine, repl) = (&*node.engine, &node.repl);
        let role = engine.role();
        let draining = repl.draining();
        let mut h = Health {
            role,
            intake: if draining {
                "draining"
            } else {
                intake(engine, role)
            },
            failed: engine.is_failed(),
            cluster: cluster.is_some(),
            leading: role == Role::Primary,
            in_sync: role == Role::Primary,
            following: false,
            epoch: repl.epoch(),
            leader: None,
        };
        match cluster {
            Some(c) => {
                let v = c.view();
                h.leading = role == Role::Primary && v.leading();
                h.in_sync = v
                    .isr
                    .as_ref()
                    .is_some_and(|i| i.members.iter().any(|m| m == c.name()));
                h.following = role == Role::Standby && v.leader.is_some();
                h.leader = match (h.leading, v.leader) {
                    (true, _) => Some(c.name().to_owned()),
                    (false, l) => l.map(|l| l.name),
                };
            }
            None => {
                let connected = repl.follow_status().is_some_and(|f| f.connected);
                h.following = role == Role::Standby && connected;
                h.in_sync = h.in_sync || h.following;
            }
        }
        h
    }

    /// This node takes batches and answers them itself.
    fn takes(&self) -> bool {
        self.role == Role::Primary && self.intake == "open" && self.leading
    }

    /// Whether `check` passes (200) or not (503).
    pub fn passes(&self, check: Check) -> bool {
        if self.failed || self.intake == "draining" {
            return false;
        }
        let standby = self.role == Role::Standby;
        match check {
            // A standby by hand serves its role (it follows, its spool closed by design); a
            // cluster standby serves its spool only while it has a leader to forward to.
            Check::Health => self.takes() || (standby && (self.following || !self.cluster)),
            Check::Leader => self.takes(),
            Check::Replica => standby && self.following && self.in_sync,
        }
    }

    /// The answer's body.
    pub fn json(&self, check: Check) -> serde_json::Value {
        json!({
            "check": check.name(),
            "ok": self.passes(check),
            "role": self.role.name(),
            "leading": self.leading,
            "in_sync": self.in_sync,
            "epoch": self.epoch,
            "leader": self.leader,
            "intake": self.intake,
            "failed": self.failed,
        })
    }
}

/// The intake's state as `roost status` names it (`control/status_json.rs`).
fn intake(engine: &Engine, role: Role) -> &'static str {
    if role != Role::Primary {
        "closed"
    } else if engine.standby().deferred_claims() > 0 {
        "finishing_claims"
    } else if engine.room().paused().is_some() {
        "paused"
    } else {
        "open"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(role: Role, cluster: bool) -> Health {
        Health {
            role,
            intake: if role == Role::Primary {
                "open"
            } else {
                "closed"
            },
            failed: false,
            cluster,
            leading: role == Role::Primary,
            in_sync: true,
            following: role == Role::Standby,
            epoch: 3,
            leader: None,
        }
    }

    fn answers(h: &Health) -> [bool; 3] {
        [Check::Health, Check::Leader, Check::Replica].map(|c| h.passes(c))
    }

    /// Goal: each check's table (module doc) row by row: a leader, an in-sync standby, a
    /// standby out of the set or without a leader, a lapsed lease, a paused intake, a
    /// failed node, a node stepped down, a node draining (a stop began).
    #[test]
    fn each_check_passes_only_where_its_table_says() {
        for cluster in [false, true] {
            assert_eq!(answers(&node(Role::Primary, cluster)), [true, true, false]);
            assert_eq!(answers(&node(Role::Standby, cluster)), [true, false, true]);
            let out = Health {
                in_sync: false,
                ..node(Role::Standby, cluster)
            };
            assert_eq!(answers(&out), [true, false, false]);
            let paused = Health {
                intake: "paused",
                ..node(Role::Primary, cluster)
            };
            assert_eq!(answers(&paused), [false, false, false]);
            for broken in [
                Health {
                    failed: true,
                    ..node(Role::Primary, cluster)
                },
                Health {
                    failed: true,
                    ..node(Role::Standby, cluster)
                },
                node(Role::SteppedDown { epoch: 3 }, cluster),
                Health {
                    intake: "draining",
                    ..node(Role::Primary, cluster)
                },
                Health {
                    intake: "draining",
                    ..node(Role::Standby, cluster)
                },
            ] {
                assert_eq!(answers(&broken), [false; 3], "{broken:?}");
            }
        }
        let lapsed = Health {
            leading: false,
            ..node(Role::Primary, true)
        };
        assert_eq!(answers(&lapsed), [false, false, false]);
        let no_leader = Health {
            following: false,
            ..node(Role::Standby, true)
        };
        assert_eq!(answers(&no_leader), [false, false, false]);
        let disconnected = Health {
            following: false,
            ..node(Role::Standby, false)
        };
        assert_eq!(answers(&disconnected), [true, false, false]);
    }

    #[test]
    fn paths_name_their_checks() {
        assert_eq!(Check::of_path("/leader"), Some(Check::Leader));
        assert_eq!(Check::of_path("/replica/"), Some(Check::Replica));
        assert_eq!(Check::of_path("/health"), Some(Check::Health));
        assert_eq!(Check::of_path("/metrics"), None);
        assert_eq!(Check::of_path("/"), None);
    }
}
