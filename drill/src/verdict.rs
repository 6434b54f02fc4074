//! The replicated drill's verdicts, as pure functions over what the drill saw (the answers
//! the clients got, the answers to their retries, the shard contents and WAL records read
//! from both nodes), so that each check can be shown to fail on fabricated input: a lost
//! acknowledged batch, a retry answered differently, a create missing from the shards, two
//! nodes that hold different records at one lsn.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

use super::batches::Sent;
use crate::batch::{BatchResult, Status};

/// A shard's records by id: `(shard, record)`.
pub(super) type Records = HashMap<u64, (&'static str, Value)>;

/// The answer as one short line: status, lsn and ids.
pub(super) fn describe(r: &BatchResult) -> String {
    serde_json::to_string(r).unwrap_or_else(|_| format!("{r:?}"))
}

/// Every acknowledged batch (`acked`: file name -> the answer the client saw) against the
/// new primary's answer to a retry of the same file (`retried`: file name -> the answer, or
/// `None` if the retry got none in time). Each difference is a lost (or changed)
/// acknowledged batch.
pub(super) fn lost_acknowledged(
    acked: &BTreeMap<String, BatchResult>,
    retried: &BTreeMap<String, Option<BatchResult>>,
) -> Vec<String> {
    let mut lost = Vec::new();
    for (name, orig) in acked {
        match retried.get(name) {
            None => lost.push(format!("{name}: acknowledged, never retried")),
            Some(None) => lost.push(format!(
                "{name}: acknowledged as {}, its retry got no answer",
                describe(orig)
            )),
            Some(Some(again)) if again != orig => lost.push(format!(
                "{name}: acknowledged as {}, its retry answered {}",
                describe(orig),
                describe(again)
            )),
            Some(Some(_)) => {}
        }
    }
    lost
}

/// The expectations on every answered file: a batch meant to be rejected was not committed;
/// a file sent again under an earlier file's key got that file's answer.
pub(super) fn unexpected_answers(
    sent: &[Sent],
    answers: &BTreeMap<String, BatchResult>,
) -> Vec<String> {
    let mut out = Vec::new();
    for s in sent {
        let Some(r) = answers.get(&s.name) else {
            continue;
        };
        if s.expect_rejected && r.status() == Status::Committed {
            out.push(format!("{}: expected a rejection, got committed", s.name));
        }
        let orig = s.retry_of.as_deref();
        if let Some((o, orig)) = orig.and_then(|n| answers.get(n).map(|o| (o, n))) {
            if o != r {
                out.push(format!(
                    "{}: sent again under {orig}'s key, answered {} (the original: {})",
                    s.name,
                    describe(r),
                    describe(o)
                ));
            }
        }
    }
    out
}

/// The ids every committed answer created and no committed answer deleted, with their shard
/// and key: what must be in the shards, and what later batches may delete.
pub(super) fn live_creates(
    answers: &BTreeMap<String, BatchResult>,
) -> BTreeMap<u64, (String, String)> {
    let committed = || answers.values().filter(|r| r.status() == Status::Committed);
    let deleted: HashSet<u64> = committed()
        .flat_map(|r| r.ops().iter().filter(|o| o.op == "delete").map(|o| o.id))
        .collect();
    let mut live = BTreeMap::new();
    for r in committed() {
        let key = match r {
            BatchResult::Committed { request_key, .. } => request_key.clone(),
            _ => String::new(),
        };
        for o in r.ops().iter().filter(|o| o.op == "create") {
            if !deleted.contains(&o.id) {
                live.insert(o.id, (o.shard.clone(), key.clone()));
            }
        }
    }
    live
}

/// Committed creates missing from a node's shards, or holding another batch's record.
pub(super) fn missing_creates(
    node: &str,
    live: &BTreeMap<u64, (String, String)>,
    records: &Records,
) -> Vec<String> {
    let mut out = Vec::new();
    for (id, (shard, key)) in live {
        match records.get(id) {
            None => out.push(format!(
                "{node}: committed create {id} on {shard} ({key}) is missing"
            )),
            Some((s, v)) if s != shard || v["drill"] != key.as_str() => out.push(format!(
                "{node}: id {id} holds {v} on {s}, not {key}'s on {shard}"
            )),
            Some(_) => {}
        }
    }
    out
}

/// The ids whose records differ between two nodes' shards (present on one only, or
/// different), at most `max` of them named.
pub(super) fn shard_divergences(a: &Records, b: &Records, max: usize) -> Vec<String> {
    let mut ids: Vec<u64> = a.keys().chain(b.keys()).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    let differ: Vec<u64> = ids
        .into_iter()
        .filter(|id| a.get(id) != b.get(id))
        .collect();
    let mut out: Vec<String> = differ
        .iter()
        .take(max)
        .map(|id| format!("id {id}: {:?} against {:?}", a.get(id), b.get(id)))
        .collect();
    if differ.len() > max {
        out.push(format!("... {} ids differ in all", differ.len()));
    }
    out
}

/// The WAL records two nodes hold at the same lsn (as `roost wal dump --json` prints them):
/// how many lsns both hold, and each lsn where they differ.
pub(super) fn wal_divergences(
    a: &BTreeMap<u64, Value>,
    b: &BTreeMap<u64, Value>,
) -> (usize, Vec<String>) {
    let mut common = 0;
    let mut out = Vec::new();
    for (lsn, ra) in a {
        if let Some(rb) = b.get(lsn) {
            common += 1;
            if ra != rb {
                out.push(format!("lsn {lsn}: {ra} against {rb}"));
            }
        }
    }
    (common, out)
}

/// Creates a node holds twice (the same record under two ids).
pub(super) fn doubled_creates(node: &str, records: &Records) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (_, v) in records.values() {
        *seen.entry(v.to_string()).or_default() += 1;
    }
    let mut out: Vec<String> = seen
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(v, n)| format!("{node}: a create produced {n} records: {v}"))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::OpResult;
    use serde_json::json;

    fn committed(key: &str, lsn: u64, ids: &[(&str, u64)]) -> BatchResult {
        BatchResult::Committed {
            request_key: key.into(),
            lsn,
            ops: ids
                .iter()
                .map(|(op, id)| OpResult {
                    op: (*op).into(),
                    shard: "d0".into(),
                    id: *id,
                })
                .collect(),
        }
    }

    /// Goal: the checker finds a lost acknowledged batch: a retry that mints new ids (the
    /// claim was gone from the new primary), one answered with another status, one never
    /// answered; an equal answer is no violation.
    #[test]
    fn a_fabricated_lost_batch_is_found() {
        let mut acked = BTreeMap::new();
        acked.insert("kept".to_owned(), committed("k1", 3, &[("create", 1)]));
        acked.insert("minted".to_owned(), committed("k2", 5, &[("create", 2)]));
        acked.insert("rejected".to_owned(), committed("k3", 7, &[("create", 3)]));
        acked.insert("silent".to_owned(), committed("k4", 9, &[("create", 4)]));
        let mut retried = BTreeMap::new();
        retried.insert(
            "kept".to_owned(),
            Some(committed("k1", 3, &[("create", 1)])),
        );
        retried.insert(
            "minted".to_owned(),
            Some(committed("k2", 11, &[("create", 9)])),
        );
        let refused = BatchResult::Rejected {
            request_key: "k3".into(),
            op_index: 0,
            reason: "x".into(),
        };
        retried.insert("rejected".to_owned(), Some(refused));
        retried.insert("silent".to_owned(), None);
        let lost = lost_acknowledged(&acked, &retried);
        assert_eq!(lost.len(), 3, "{lost:?}");
        assert!(lost[0].starts_with("minted:"), "{lost:?}");
        assert!(lost[1].starts_with("rejected:"), "{lost:?}");
        assert!(lost[2].contains("no answer"), "{lost:?}");
        retried.remove("kept");
        assert_eq!(lost_acknowledged(&acked, &retried).len(), 4);
    }

    /// Goal: a committed create missing from the shards (or deleted only by an answer that was
    /// not committed) is found; a create a committed batch deleted is not expected.
    #[test]
    fn a_fabricated_missing_create_is_found() {
        let mut answers = BTreeMap::new();
        answers.insert(
            "a".to_owned(),
            committed("ka", 1, &[("create", 1), ("create", 2)]),
        );
        answers.insert("b".to_owned(), committed("kb", 2, &[("delete", 2)]));
        let live = live_creates(&answers);
        assert_eq!(live.keys().copied().collect::<Vec<_>>(), vec![1]);
        let mut records = Records::new();
        assert_eq!(missing_creates("n", &live, &records).len(), 1);
        records.insert(1, ("d0", json!({"drill": "ka", "op": 0})));
        assert!(missing_creates("n", &live, &records).is_empty());
        records.insert(1, ("d0", json!({"drill": "kb", "op": 0})));
        assert_eq!(missing_creates("n", &live, &records).len(), 1);
    }

    /// Goal: two nodes holding different records at one lsn, or different shard contents, are
    /// divergences; lsns only one node holds are not compared.
    #[test]
    fn fabricated_divergences_are_found() {
        let rec = |lsn: u64, key: &str| (lsn, json!({"lsn": lsn, "epoch": 1, "request_key": key}));
        let a: BTreeMap<u64, Value> = [rec(1, "x"), rec(2, "y"), rec(3, "z")].into();
        let mut b: BTreeMap<u64, Value> = [rec(2, "y"), rec(3, "z"), rec(4, "w")].into();
        assert_eq!(wal_divergences(&a, &b), (2, vec![]));
        b.insert(3, json!({"lsn": 3, "epoch": 2, "request_key": "other"}));
        let (common, diff) = wal_divergences(&a, &b);
        assert_eq!((common, diff.len()), (2, 1), "{diff:?}");
        let mut ra = Records::new();
        ra.insert(1, ("d0", json!({"drill": "k"})));
        let mut rb = ra.clone();
        assert!(shard_divergences(&ra, &rb, 5).is_empty());
        rb.insert(2, ("d1", json!({"drill": "k2"})));
        assert_eq!(shard_divergences(&ra, &rb, 5).len(), 1);
        rb.insert(3, ("d1", json!({"drill": "k2"})));
        assert_eq!(doubled_creates("b", &rb).len(), 1);
    }

    /// Goal: a batch meant to be rejected that committed, and a file sent again under an
    /// earlier key that got another answer, are violations.
    #[test]
    fn fabricated_unexpected_answers_are_found() {
        let sent = vec![
            Sent {
                name: "o".into(),
                key: "k".into(),
                retry_of: None,
                expect_rejected: true,
            },
            Sent {
                name: "r".into(),
                key: "k".into(),
                retry_of: Some("o".into()),
                expect_rejected: false,
            },
        ];
        let mut answers = BTreeMap::new();
        answers.insert("o".to_owned(), committed("k", 1, &[("create", 1)]));
        answers.insert("r".to_owned(), committed("k", 4, &[("create", 5)]));
        assert_eq!(unexpected_answers(&sent, &answers).len(), 2);
    }
}
