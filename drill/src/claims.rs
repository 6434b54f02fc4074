//! The one-node drill's comparison of answers with the WAL: read with the daemon dead after
//! each check, every claim the WAL still holds (checkpoints retire older ones) must belong
//! to one request key only, and the committed answer the drill saw for that key (a batch
//! file's, a streamed batch's or a bulk-file line's) must name the claim's lsn and its ops'
//! ids, in order; a key with a claim was not answered otherwise. So an id a bulk result
//! names, which has no earlier visible answer, is checked against what was claimed.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use roost_wal::{Wal, WalOptions};

use super::batches::Sent;
use crate::batch::BatchResult;
use crate::layout::WAL_DIR;
use crate::pipeline::records::{read_wal, ClaimRecord, WalEntry};

/// Every claim in the WAL under `data`, with its lsn (read-only, without a lock: the daemon
/// is dead or idle; a frame being written is a torn tail and left out).
pub(super) fn read(data: &Path) -> anyhow::Result<Vec<(u64, ClaimRecord)>> {
    let dir = data.join(WAL_DIR);
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let opts = WalOptions {
        read_only: true,
        payload_bytes_max: 128 << 20,
        segment_bytes: 256 << 20,
        ..WalOptions::default()
    };
    let wal = Wal::open(&dir, opts).with_context(|| format!("opening {}", dir.display()))?;
    let mut claims = Vec::new();
    for entry in read_wal(&wal, 1) {
        let (lsn, entry) = entry.with_context(|| format!("reading the wal {}", dir.display()))?;
        if let WalEntry::Claim(c) = entry {
            claims.push((lsn, c));
        }
    }
    Ok(claims)
}

/// `claims` against the drill's `answers`: how many claims were compared with an answer, and
/// each violation (a key claimed twice, a committed answer whose lsn or ids are not its
/// claim's, a claimed key answered as not committed).
pub(super) fn against_answers(
    claims: &[(u64, ClaimRecord)],
    answers: &[(&Sent, &BatchResult)],
) -> (usize, Vec<String>) {
    let mut by_key: BTreeMap<&str, (&Sent, &BatchResult)> = BTreeMap::new();
    for (s, r) in answers {
        by_key.entry(s.key.as_str()).or_insert((s, r));
    }
    let mut first: BTreeMap<&str, u64> = BTreeMap::new();
    let mut compared = 0;
    let mut out = Vec::new();
    for (lsn, c) in claims {
        if let Some(before) = first.insert(&c.request_key, *lsn) {
            out.push(format!(
                "wal: key {} claimed twice, at lsn {before} and {lsn}",
                c.request_key
            ));
        }
        let Some((s, r)) = by_key.get(c.request_key.as_str()) else {
            continue;
        };
        compared += 1;
        let claimed: Vec<(&str, &str, u64)> = c
            .ops
            .iter()
            .map(|o| (o.kind().as_str(), o.shard(), o.id()))
            .collect();
        let answered: Vec<(&str, &str, u64)> = r
            .ops()
            .iter()
            .map(|o| (o.op.as_str(), o.shard.as_str(), o.id))
            .collect();
        if r.lsn() != Some(*lsn) || !matches!(r, BatchResult::Committed { .. }) {
            out.push(format!(
                "{}: claimed at lsn {lsn}, answered {}",
                s.name,
                super::verdict::describe(r)
            ));
        } else if claimed != answered {
            out.push(format!(
                "{}: claimed at lsn {lsn} as {claimed:?}, answered {answered:?}",
                s.name
            ));
        }
    }
    (compared, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::OpResult;
    use crate::pipeline::records::PlannedOp;

    fn claim(key: &str, id: u64) -> ClaimRecord {
        ClaimRecord {
            request_key: key.into(),
            source: format!("bulk/x.jsonl/{id}"),
            fingerprint: 0,
            ops: vec![PlannedOp::Create {
                shard: "d0".into(),
                id,
                record: b"{}".to_vec(),
            }],
        }
    }

    fn sent(key: &str) -> Sent {
        Sent {
            name: format!("x.jsonl:{key}"),
            key: key.into(),
            retry_of: None,
            expect_rejected: false,
        }
    }

    fn committed(key: &str, lsn: u64, id: u64) -> BatchResult {
        BatchResult::Committed {
            request_key: key.into(),
            lsn,
            ops: vec![OpResult {
                op: "create".into(),
                shard: "d0".into(),
                id,
            }],
        }
    }

    /// Goal: an answer that names another id or lsn than its claim, a claimed key answered as
    /// rejected and a key claimed twice are found; matching answers, and claims of keys the
    /// drill has no answer for, are not violations.
    #[test]
    fn fabricated_disagreements_with_the_wal_are_found() {
        let claims = vec![
            (3, claim("a", 10)),
            (4, claim("b", 11)),
            (5, claim("c", 12)),
            (6, claim("d", 13)),
            (7, claim("unknown", 14)),
        ];
        let (sa, sb, sc, sd) = (sent("a"), sent("b"), sent("c"), sent("d"));
        let (ra, rb, rd) = (
            committed("a", 3, 10),
            committed("b", 4, 99),
            committed("d", 6, 13),
        );
        let rc = BatchResult::Rejected {
            request_key: "c".into(),
            op_index: 0,
            reason: "x".into(),
        };
        let answers = vec![(&sa, &ra), (&sb, &rb), (&sc, &rc), (&sd, &rd)];
        let (compared, found) = against_answers(&claims, &answers);
        assert_eq!(compared, 4);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("x.jsonl:b"), "{found:?}");
        assert!(found[1].contains("x.jsonl:c"), "{found:?}");
        let mut twice = claims.clone();
        twice.push((8, claim("a", 10)));
        let (_, found) = against_answers(&twice, &answers);
        assert!(
            found.iter().any(|v| v.contains("claimed twice")),
            "{found:?}"
        );
    }
}
