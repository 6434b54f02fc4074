//! The stand-in for etcd: a lease store (`Store`, pure, its time given by the caller), the
//! host that serves it over the simulated network (one JSON line per request and answer),
//! and the client the nodes call it with, every call bounded in time. What it keeps of
//! etcd's semantics is what the agent (engine/src/cluster/agent.rs) relies on: leases with
//! a TTL that a keepalive restarts from when etcd receives it, keys attached to a lease
//! deleted when it expires, a revision counter, and transactions that compare create and
//! mod revisions (`Equal`) and then put or delete. Watches, ranges and compaction are not
//! modelled: the agent uses none. `tests/tests/etcd_standin.rs` pins it: the agent's calls
//! run against this store and the real etcd, every answer compared.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Where the stand-in listens.
pub const ETCD_ADDR: &str = "etcd:2379";

/// One key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kv {
    pub value: String,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub lease: Option<i64>,
}

/// A comparison of a transaction (etcd's `Compare`, `Equal` only; a missing key's
/// revisions are 0).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Cmp {
    CreateRevision(String, i64),
    ModRevision(String, i64),
}

/// An operation of a transaction's success branch.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Op {
    Put {
        key: String,
        value: String,
        lease: Option<i64>,
    },
    Delete(String),
}

/// A request to the store.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Req {
    Grant { ttl_ms: u64 },
    KeepAlive { id: i64 },
    Revoke { id: i64 },
    Get { key: String },
    Txn { compare: Vec<Cmp>, success: Vec<Op> },
}

/// The store's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Resp {
    Granted {
        id: i64,
        ttl_ms: u64,
    },
    /// The lease's TTL, or `None` once it expired (or never was).
    Alive(Option<u64>),
    Revoked,
    Got(Option<Kv>),
    Txn {
        succeeded: bool,
        revision: i64,
    },
    Error(String),
}

/// The store: keys, leases (deadline in simulated time, TTL), the revision.
#[derive(Debug, Default)]
pub struct Store {
    revision: i64,
    next_lease: i64,
    leases: BTreeMap<i64, (Duration, u64)>,
    kv: BTreeMap<String, Kv>,
}

impl Store {
    /// Answers `req` at simulated time `now`; expired leases go first, with their keys.
    pub fn apply(&mut self, req: Req, now: Duration) -> Resp {
        self.expire(now);
        match req {
            Req::Grant { ttl_ms } => {
                self.next_lease += 1;
                let id = self.next_lease;
                self.leases
                    .insert(id, (now + Duration::from_millis(ttl_ms), ttl_ms));
                Resp::Granted { id, ttl_ms }
            }
            Req::KeepAlive { id } => Resp::Alive(self.leases.get_mut(&id).map(|l| {
                l.0 = now + Duration::from_millis(l.1);
                l.1
            })),
            Req::Revoke { id } => {
                self.drop_lease(id);
                Resp::Revoked
            }
            Req::Get { key } => Resp::Got(self.kv.get(&key).cloned()),
            Req::Txn { compare, success } => self.txn(&compare, success),
        }
    }

    fn txn(&mut self, compare: &[Cmp], success: Vec<Op>) -> Resp {
        let holds = compare.iter().all(|c| match c {
            Cmp::CreateRevision(k, r) => self.kv.get(k).map_or(0, |kv| kv.create_revision) == *r,
            Cmp::ModRevision(k, r) => self.kv.get(k).map_or(0, |kv| kv.mod_revision) == *r,
        });
        if !holds {
            return Resp::Txn {
                succeeded: false,
                revision: self.revision,
            };
        }
        let missing = success.iter().find_map(|op| match op {
            Op::Put { lease: Some(l), .. } if !self.leases.contains_key(l) => Some(*l),
            _ => None,
        });
        if let Some(l) = missing {
            return Resp::Error(format!("etcdserver: requested lease not found ({l})"));
        }
        self.revision += 1;
        let rev = self.revision;
        for op in success {
            match op {
                Op::Put { key, value, lease } => {
                    let create = self.kv.get(&key).map_or(rev, |kv| kv.create_revision);
                    let kv = Kv {
                        value,
                        create_revision: create,
                        mod_revision: rev,
                        lease,
                    };
                    self.kv.insert(key, kv);
                }
                Op::Delete(key) => {
                    self.kv.remove(&key);
                }
            }
        }
        Resp::Txn {
            succeeded: true,
            revision: rev,
        }
    }

    fn expire(&mut self, now: Duration) {
        let gone: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, (deadline, _))| *deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.drop_lease(id);
        }
    }

    fn drop_lease(&mut self, id: i64) {
        if self.leases.remove(&id).is_none() {
            return;
        }
        let before = self.kv.len();
        self.kv.retain(|_, kv| kv.lease != Some(id));
        if self.kv.len() != before {
            self.revision += 1;
        }
    }

    /// The key `key` as a read at `now` would see it (leases past their deadline count as
    /// expired even before a request collects them): the checker's omniscient view.
    pub fn get_at(&self, key: &str, now: Duration) -> Option<&Kv> {
        let kv = self.kv.get(key)?;
        match kv.lease {
            Some(l) => match self.leases.get(&l) {
                Some((deadline, _)) if *deadline > now => Some(kv),
                _ => None,
            },
            None => Some(kv),
        }
    }
}

/// The store shared by its host and the checker.
pub type SharedStore = Arc<Mutex<Store>>;

fn lock(store: &SharedStore) -> std::sync::MutexGuard<'_, Store> {
    store.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The simulated time, as the hosts and the checker share it.
pub fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// A fault aimed at one step of the protocol (issue 45): the next write of the in-sync set
/// that etcd receives is lost before it applies (`Lost`) or after (`Unanswered`: applied,
/// its answer never sent), and its writer is then cut off from etcd for a while. Such a
/// write is the only moment where the order of the in-sync set's two copies (the leader's
/// memory and etcd) decides whether an answered batch can be lost; random partitions hit
/// that moment of one round trip rarely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsrWriteFault {
    Lost,
    Unanswered,
}

/// An armed fault: what happens to the write, how long its writer is cut off from etcd,
/// and `also`: a node (by its distance from the writer, 1 or 2) the writer is cut off from
/// for as long, so that a standby the write named can fall behind while it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aim {
    pub fault: IsrWriteFault,
    pub cut_for: Duration,
    pub also: Option<usize>,
}

/// The aimed faults armed by the runner, and those that fired (the writer to cut off, and
/// for how long), for the runner to act on after its step.
#[derive(Debug, Default)]
pub struct Aimed {
    armed: Mutex<Option<Aim>>,
    fired: Mutex<Vec<(String, Aim)>>,
}

impl Aimed {
    /// Arms `fault` for the next in-sync-set write (replacing one armed before).
    pub fn arm(&self, aim: Aim) {
        *self.armed.lock().unwrap_or_else(PoisonError::into_inner) = Some(aim);
    }

    /// Nothing armed, nothing fired (the run heals at its end).
    pub fn disarm(&self) {
        self.armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        self.take_fired();
    }

    /// The faults that fired since the last call, each with its writer.
    pub fn take_fired(&self) -> Vec<(String, Aim)> {
        std::mem::take(&mut *self.fired.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The armed fault, taken, when `req` writes the in-sync set (its writer recorded).
    fn strike(&self, req: &Req) -> Option<IsrWriteFault> {
        let Req::Txn { success, .. } = req else {
            return None;
        };
        let writer = success.iter().find_map(|op| match op {
            Op::Put { key, value, .. } if key == crate::keys::KEY_ISR => {
                crate::keys::decode::<crate::keys::IsrVal>(value).ok()
            }
            _ => None,
        })?;
        let aim = self
            .armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        let mut fired = self.fired.lock().unwrap_or_else(PoisonError::into_inner);
        fired.push((writer.leader, aim));
        Some(aim.fault)
    }
}

/// The etcd host: serves the store until the simulation ends.
pub async fn serve(store: SharedStore, aimed: Arc<Aimed>) -> turmoil::Result {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", 2379)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let store = Arc::clone(&store);
        let aimed = Arc::clone(&aimed);
        tokio::task::spawn_local(async move {
            let _ = serve_conn(stream, store, aimed).await;
        });
    }
}

async fn serve_conn(
    stream: turmoil::net::TcpStream,
    store: SharedStore,
    aimed: Arc<Aimed>,
) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    while let Some(line) = lines.next_line().await? {
        let resp = match serde_json::from_str::<Req>(&line) {
            Ok(req) => match aimed.strike(&req) {
                Some(fault) => {
                    if fault == IsrWriteFault::Unanswered {
                        lock(&store).apply(req, now());
                    }
                    // Silent from here on, as a cut link is: the caller times out.
                    while lines.next_line().await?.is_some() {}
                    return Ok(());
                }
                None => lock(&store).apply(req, now()),
            },
            Err(e) => Resp::Error(format!("bad request: {e}")),
        };
        let mut out = serde_json::to_string(&resp).map_err(std::io::Error::other)?;
        out.push('\n');
        w.write_all(out.as_bytes()).await?;
    }
    Ok(())
}

/// A node's client: one connection per call, each call within `limit`.
#[derive(Clone, Debug)]
pub struct Client {
    pub limit: Duration,
}

impl Client {
    pub async fn call(&self, req: &Req) -> Result<Resp, String> {
        match tokio::time::timeout(self.limit, call_once(req)).await {
            Ok(Ok(Resp::Error(e))) => Err(e),
            Ok(r) => r,
            Err(_) => Err("etcd: timed out".into()),
        }
    }

    pub async fn grant(&self, ttl_ms: u64) -> Result<(i64, u64), String> {
        match self.call(&Req::Grant { ttl_ms }).await? {
            Resp::Granted { id, ttl_ms } => Ok((id, ttl_ms)),
            other => Err(format!("etcd: grant answered {other:?}")),
        }
    }

    pub async fn keepalive(&self, id: i64) -> Result<Option<u64>, String> {
        match self.call(&Req::KeepAlive { id }).await? {
            Resp::Alive(ttl) => Ok(ttl),
            other => Err(format!("etcd: keepalive answered {other:?}")),
        }
    }

    pub async fn revoke(&self, id: i64) -> Result<(), String> {
        self.call(&Req::Revoke { id }).await.map(|_| ())
    }

    pub async fn get(&self, key: &str) -> Result<Option<Kv>, String> {
        match self.call(&Req::Get { key: key.into() }).await? {
            Resp::Got(kv) => Ok(kv),
            other => Err(format!("etcd: get answered {other:?}")),
        }
    }

    /// `Some(revision)` when the comparisons held and the operations applied.
    pub async fn txn(&self, compare: Vec<Cmp>, success: Vec<Op>) -> Result<Option<i64>, String> {
        match self.call(&Req::Txn { compare, success }).await? {
            Resp::Txn {
                succeeded,
                revision,
            } => Ok(succeeded.then_some(revision)),
            other => Err(format!("etcd: txn answered {other:?}")),
        }
    }
}

async fn call_once(req: &Req) -> Result<Resp, String> {
    let stream = turmoil::net::TcpStream::connect(ETCD_ADDR)
        .await
        .map_err(|e| format!("etcd: connect: {e}"))?;
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_string(req).map_err(|e| e.to_string())?;
    line.push('\n');
    w.write_all(line.as_bytes())
        .await
        .map_err(|e| format!("etcd: write: {e}"))?;
    let mut lines = BufReader::new(r).lines();
    match lines.next_line().await {
        Ok(Some(l)) => serde_json::from_str(&l).map_err(|e| format!("etcd: bad answer: {e}")),
        Ok(None) => Err("etcd: closed".into()),
        Err(e) => Err(format!("etcd: read: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A transaction putting the leader key (under `lease`) if it does not exist, at `at`.
    fn win(s: &mut Store, lease: Option<i64>, at: u64) -> Resp {
        let put = Op::Put {
            key: "leader".into(),
            value: "a".into(),
            lease,
        };
        let compare = vec![Cmp::CreateRevision("leader".into(), 0)];
        s.apply(
            Req::Txn {
                compare,
                success: vec![put],
            },
            ms(at),
        )
    }

    fn grant(s: &mut Store) -> i64 {
        match s.apply(Req::Grant { ttl_ms: 100 }, ms(0)) {
            Resp::Granted { id, .. } => id,
            other => panic!("grant answered {other:?}"),
        }
    }

    fn isr_write(leader: &str) -> Req {
        let isr = crate::keys::IsrVal {
            epoch: 3,
            leader: leader.into(),
            members: vec![leader.into()],
        };
        Req::Txn {
            compare: vec![],
            success: vec![Op::Put {
                key: crate::keys::KEY_ISR.into(),
                value: crate::keys::encode(&isr),
                lease: None,
            }],
        }
    }

    /// Goal: an aimed fault strikes the first write of the in-sync set after it is armed,
    /// once, and names its writer; other requests pass it by.
    #[test]
    fn an_aimed_fault_strikes_the_next_isr_write_once() {
        let a = Aimed::default();
        assert_eq!(a.strike(&isr_write("n1")), None, "nothing armed");
        let aim = Aim {
            fault: IsrWriteFault::Unanswered,
            cut_for: ms(700),
            also: Some(2),
        };
        a.arm(aim);
        assert_eq!(
            a.strike(&Req::Get {
                key: "roost/isr".into()
            }),
            None
        );
        assert_eq!(a.strike(&Req::Grant { ttl_ms: 5 }), None);
        assert_eq!(a.strike(&isr_write("n2")), Some(IsrWriteFault::Unanswered));
        assert_eq!(a.strike(&isr_write("n2")), None, "it strikes once");
        assert_eq!(a.take_fired(), vec![("n2".to_string(), aim)]);
        assert!(a.take_fired().is_empty());
        a.arm(aim);
        a.disarm();
        assert_eq!(a.strike(&isr_write("n0")), None, "disarmed");
    }

    /// Goal: a transaction applies only when every revision compares equal: the first
    /// winner's put holds, a second one's does not.
    #[test]
    fn a_txn_applies_only_when_its_revisions_compare_equal() {
        let mut s = Store::default();
        let id = grant(&mut s);
        let r = win(&mut s, Some(id), 10);
        assert!(
            matches!(
                r,
                Resp::Txn {
                    succeeded: true,
                    revision: 1
                }
            ),
            "{r:?}"
        );
        let r = win(&mut s, None, 20);
        assert!(
            matches!(
                r,
                Resp::Txn {
                    succeeded: false,
                    ..
                }
            ),
            "{r:?}"
        );
    }

    /// Goal: a key under a lease goes when the lease expires, counted from the last
    /// keepalive etcd received; a put under an expired lease fails.
    #[test]
    fn leases_expire_with_their_keys() {
        let mut s = Store::default();
        let id = grant(&mut s);
        assert!(matches!(
            win(&mut s, Some(id), 10),
            Resp::Txn {
                succeeded: true,
                ..
            }
        ));
        let alive = s.apply(Req::KeepAlive { id }, ms(90));
        assert!(matches!(alive, Resp::Alive(Some(100))), "{alive:?}");
        assert!(s.get_at("leader", ms(189)).is_some());
        let gone = s.get_at("leader", ms(190));
        assert!(gone.is_none(), "the deadline counts from the keepalive");
        let alive = s.apply(Req::KeepAlive { id }, ms(190));
        assert!(matches!(alive, Resp::Alive(None)), "{alive:?}");
        let got = s.apply(
            Req::Get {
                key: "leader".into(),
            },
            ms(191),
        );
        assert!(matches!(got, Resp::Got(None)), "{got:?}");
        let r = win(&mut s, Some(id), 200);
        assert!(
            matches!(r, Resp::Error(_)),
            "a put under an expired lease fails: {r:?}"
        );
    }
}
