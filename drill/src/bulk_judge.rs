//! The drill's bulk files (issue 16): in each round of the one-node drill, beside the batch
//! files and the stream, one or more `spool/new/NAME.jsonl` files of 50 to 200 lines (at
//! least a quarter as many lines as the round's batch files); the first is dropped just
//! before the batch file after which a random-kill round's kill is due (at the start of a
//! round that dies at a crash point), the others at random moments of the round, so kills
//! land mid-file. A line is a new batch (creates, deletes, now and then
//! a delete of an id that never existed, so the line must be rejected), one time in ten a
//! batch file's batch sent again, and each file holds one line that repeats an earlier line of
//! the file (same key, same content: it must get that line's answer).
//!
//! After every restart, once each file's result is published and its input gone: the result
//! has one line per input line, in line order, each naming its line and its batch's key; a
//! result published before a kill is the same after it (a file processed again answers by
//! its lines' keys); and every line's answer joins the files' and the stream's in the checks
//! (committed creates present once with the ids the result names, retries equal to their
//! originals, `claims`' comparison with the WAL).

use anyhow::Context;

use super::batches::{Batches, Sent};
use crate::batch::{BatchResult, ResultFile, Status};
use crate::pipeline::records::ClaimRecord;
use crate::spool::SpoolPaths;

/// The fewest lines of a bulk file, and the most a file is drawn with.
const LINES_MIN: usize = 50;
const LINES_MAX: usize = 200;

/// One bulk file: its name, its lines (`Sent::name` is `NAME:LINE`), its bytes until it is
/// dropped, and the result first seen published.
pub(super) struct BulkFile {
    pub name: String,
    pub lines: Vec<Sent>,
    body: Option<Vec<u8>>,
    published: Option<Vec<u8>>,
}

impl BulkFile {
    pub fn dropped(&self) -> bool {
        self.body.is_none()
    }
}

/// Every bulk file of the drill, and what the restarts saw of them.
#[derive(Default)]
pub(super) struct Bulk {
    pub files: Vec<BulkFile>,
    /// Files a kill left in `new/` without a result, and how many of those had lines claimed
    /// already (the kill landed mid-file).
    pub unfinished_at_kills: usize,
    pub mid_file_kills: usize,
    /// Lines committed, at the last check.
    pub committed: usize,
}

impl Bulk {
    pub fn lines(&self) -> usize {
        self.files.iter().map(|f| f.lines.len()).sum()
    }

    /// Builds round `round`'s bulk files (a round of `quota` batch files): at least a quarter
    /// as many lines, and never fewer than [`LINES_MIN`]. Returns each new file's index in
    /// `files` and the batch file before which it is dropped: the first file before batch
    /// file `first_at` (where the round's kill is due), the others at random.
    pub fn plan_round(
        &mut self,
        b: &mut Batches,
        (round, quota, first_at): (usize, usize, usize),
    ) -> anyhow::Result<Vec<(usize, usize)>> {
        let mut left = quota.div_ceil(4).max(LINES_MIN);
        let mut planned = Vec::new();
        while left > 0 {
            let span = (LINES_MAX - LINES_MIN + 1) as u64;
            let mut n = (LINES_MIN + b.rng.below(span) as usize).min(left);
            if left - n < LINES_MIN {
                n = left;
            }
            left -= n;
            let name = format!("bulk-r{round}-{}.jsonl", planned.len());
            let (lines, body) = build_file(b, &name, n)?;
            let at = match planned.len() {
                0 => first_at,
                _ => b.rng.below(quota.max(1) as u64) as usize,
            };
            planned.push((self.files.len(), at));
            self.files.push(BulkFile {
                name,
                lines,
                body: Some(body),
                published: None,
            });
        }
        Ok(planned)
    }

    /// Drops file `k` into the spool (written under a dot-name in `tmp/`, renamed into
    /// `new/`), unless it was dropped already.
    pub fn drop_file(&mut self, sp: &SpoolPaths, k: usize) -> anyhow::Result<()> {
        let Some(f) = self.files.get_mut(k) else {
            anyhow::bail!("no bulk file {k}");
        };
        if let Some(body) = f.body.take() {
            crate::spool::deliver(sp, &f.name, &body)
                .with_context(|| format!("dropping the bulk file {}", f.name))?;
        }
        Ok(())
    }

    /// True once every dropped file has its result and its input is gone.
    pub fn drained(&self, sp: &SpoolPaths) -> bool {
        self.files
            .iter()
            .filter(|f| f.dropped())
            .all(|f| sp.out.join(&f.name).exists() && !sp.new.join(&f.name).exists())
    }

    /// With the daemon dead, before its restart: counts the files it left unanswered in
    /// `new/`, and those with lines claimed in the WAL (`claims`), killed mid-file.
    pub fn note_kill(&mut self, sp: &SpoolPaths, claims: &[(u64, ClaimRecord)]) {
        for f in self.files.iter().filter(|f| f.dropped()) {
            if sp.out.join(&f.name).exists() || !sp.new.join(&f.name).exists() {
                continue;
            }
            self.unfinished_at_kills += 1;
            let prefix = format!("bulk/{}/", f.name);
            if claims.iter().any(|(_, c)| c.source.starts_with(&prefix)) {
                self.mid_file_kills += 1;
            }
        }
    }

    /// After a restart, every file drained: each dropped file's result against its lines
    /// and against the result seen before; returns every line with its answer.
    pub fn judge(
        &mut self,
        sp: &SpoolPaths,
        violations: &mut Vec<String>,
    ) -> Vec<(Sent, BatchResult)> {
        let mut out = Vec::new();
        for f in self.files.iter_mut().filter(|f| f.body.is_none()) {
            let bytes = match std::fs::read(sp.out.join(&f.name)) {
                Ok(b) => b,
                Err(e) => {
                    violations.push(format!("{}: no result: {e}", f.name));
                    continue;
                }
            };
            match &f.published {
                Some(before) if *before != bytes => violations.push(format!(
                    "{}: the result published before a restart changed after it",
                    f.name
                )),
                Some(_) => {}
                None => f.published = Some(bytes.clone()),
            }
            let (answers, found) = judge_lines(&f.name, &f.lines, &bytes);
            violations.extend(found);
            out.extend(answers.into_iter().map(|(k, r)| (f.lines[k].clone(), r)));
        }
        self.committed = out
            .iter()
            .filter(|(_, r)| r.status() == Status::Committed)
            .count();
        out
    }
}

/// A bulk file of `n` lines named `name`: its lines and its bytes. One line (after the
/// first) repeats an earlier line; of the others, one in ten sends a batch file's batch
/// again, the rest are new batches.
fn build_file(b: &mut Batches, name: &str, n: usize) -> anyhow::Result<(Vec<Sent>, Vec<u8>)> {
    let repeat_at = 1 + b.rng.below(n.saturating_sub(1).max(1) as u64) as usize;
    let mut lines: Vec<Sent> = Vec::with_capacity(n);
    let mut body = Vec::new();
    for k in 0..n {
        let line_name = format!("{name}:{}", k + 1);
        let (key, json, retry_of, expect_rejected) = if k == repeat_at {
            let orig = b.rng.below(k as u64) as usize;
            let o = &lines[orig];
            let json = line_of(&body, orig).to_vec();
            (o.key.clone(), json, Some(o.name.clone()), o.expect_rejected)
        } else if let Some((key, json, orig)) =
            (b.rng.below(10) == 0).then(|| b.pick_retry()).flatten()
        {
            (key, json, orig, false)
        } else {
            let tag = format!("{}l{}", name.trim_end_matches(".jsonl"), k + 1);
            let (key, json, rejected) = b.fresh(&tag)?;
            (key, json, None, rejected)
        };
        body.extend_from_slice(&json);
        body.push(b'\n');
        lines.push(Sent {
            name: line_name,
            key,
            retry_of,
            expect_rejected,
        });
    }
    Ok((lines, body))
}

/// Line `k` (0-based) of `body`, without its newline.
fn line_of(body: &[u8], k: usize) -> &[u8] {
    body.split(|c| *c == b'\n').nth(k).unwrap_or_default()
}

/// A bulk file's published result (`bytes`) against its input `lines`: one result line per
/// input line, in line order, each with `"line": N` and the line's request key. Returns the
/// answers that parse, by input line index, and every violation.
pub(super) fn judge_lines(
    name: &str,
    lines: &[Sent],
    bytes: &[u8],
) -> (Vec<(usize, BatchResult)>, Vec<String>) {
    let mut answers = Vec::new();
    let mut violations = Vec::new();
    let text = String::from_utf8_lossy(bytes);
    let results: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if results.len() != lines.len() {
        violations.push(format!(
            "{name}: {} result lines for {} input lines",
            results.len(),
            lines.len()
        ));
    }
    for (k, (text, sent)) in results.iter().zip(lines).enumerate() {
        let parsed = serde_json::from_str::<ResultFile>(text)
            .map_err(|e| e.to_string())
            .and_then(|f| Ok((f.line, BatchResult::try_from(f)?)));
        let (line, r) = match parsed {
            Ok(p) => p,
            Err(e) => {
                violations.push(format!("{name}: result line {} ({e}): {text}", k + 1));
                continue;
            }
        };
        if line != Some(k as u64 + 1) {
            violations.push(format!("{name}: result line {} names line {line:?}", k + 1));
        }
        if r.request_key() != Some(sent.key.as_str()) {
            violations.push(format!(
                "{name}: line {} is {}'s, answered for {:?}",
                k + 1,
                sent.key,
                r.request_key()
            ));
        }
        answers.push((k, r));
    }
    (answers, violations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::OpResult;

    fn line(k: u64, key: &str) -> Vec<u8> {
        let r = BatchResult::Committed {
            request_key: key.into(),
            lsn: k,
            ops: vec![OpResult {
                op: "create".into(),
                shard: "d0".into(),
                id: k,
            }],
        };
        crate::intake::bulk_lines::result_line(k, &r)
    }

    fn sent(key: &str) -> Sent {
        Sent {
            name: format!("f.jsonl:{key}"),
            key: key.into(),
            retry_of: None,
            expect_rejected: false,
        }
    }

    /// Goal: a bulk result with a line missing, lines out of order, a line answered for
    /// another key or one that is not a result is found; the right result is no violation
    /// and gives every line's answer.
    #[test]
    fn fabricated_bulk_results_are_judged() {
        let lines = vec![sent("a"), sent("b"), sent("c")];
        let good = [line(1, "a"), line(2, "b"), line(3, "c")].concat();
        let (answers, found) = judge_lines("f.jsonl", &lines, &good);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(answers.len(), 3);
        let dropped = [line(1, "a"), line(2, "b")].concat();
        let (_, found) = judge_lines("f.jsonl", &lines, &dropped);
        assert_eq!(found.len(), 1, "{found:?}");
        let swapped = [line(2, "b"), line(1, "a"), line(3, "c")].concat();
        let (_, found) = judge_lines("f.jsonl", &lines, &swapped);
        assert_eq!(found.len(), 4, "{found:?}");
        let garbled = [
            line(1, "a"),
            b"{\"status\":\"committed\"}\n".to_vec(),
            line(3, "c"),
        ];
        let (answers, found) = judge_lines("f.jsonl", &lines, &garbled.concat());
        assert_eq!((answers.len(), found.len()), (2, 1), "{found:?}");
    }
}
