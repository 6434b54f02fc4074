//! Bulk spool files (issue 16): `new/NAME.jsonl` holds one batch per line, each answered as
//! a batch file of its own would be (its own request key, plan, claim and result), and its
//! result `out/NAME.jsonl` holds one result line per batch line, in line order. This module
//! is the part that needs no engine: which names are bulk files, the file's lines and their
//! limits, each line's parse, a line's claim source, and a result line's bytes. It never
//! plans or writes anything; the serve worker (`intake/bulk_files.rs`) runs the lines through the
//! engine.
//!
//! Lines end at `\n` (a `\r` before it is JSON whitespace). A line of only whitespace is
//! skipped: it gets no result line, but it is counted, for line numbers and for
//! `bulk_lines_max`. The line limit is checked on the whole file before any line is looked
//! at; the byte limit and the parse are per line, so a bad line answers `invalid` for itself
//! and the others go on.

use std::borrow::Cow;

use crate::batch::{self, Batch, BatchResult, Invalid, ResultFile};
use crate::config::Config;

/// A spool name ending in this is a bulk file.
pub const BULK_SUFFIX: &str = ".jsonl";

/// Whether `new/NAME` is a bulk file (one batch per line) rather than one batch.
pub fn is_bulk_name(name: &str) -> bool {
    name.len() > BULK_SUFFIX.len() && name.ends_with(BULK_SUFFIX)
}

/// The limits a bulk file is held to (from the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// `bulk_lines_max`: lines in one file, blank ones included.
    pub lines_max: u64,
    /// `bulk_line_bytes_max`: bytes in one line, its newline excluded.
    pub line_bytes_max: u64,
    /// `batch_ops_max`, as for any batch.
    pub batch_ops_max: u32,
}

impl Limits {
    pub fn of(cfg: &Config) -> Limits {
        Limits {
            lines_max: cfg.bulk_lines_max,
            line_bytes_max: cfg.bulk_line_bytes(),
            batch_ops_max: cfg.batch_ops_max,
        }
    }
}

/// One line of a bulk file that holds a batch (is not blank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line<'a> {
    /// 1-based.
    pub number: u64,
    /// Where the line starts in the file.
    pub offset: u64,
    /// Without its newline.
    pub bytes: &'a [u8],
}

/// The lines of a bulk file that hold a batch, or why the file as a whole is refused: more
/// lines than `lines_max` (counted before any line is looked at), or no batch at all.
pub fn lines<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Vec<Line<'a>>, String> {
    let count = line_count(bytes);
    if count > limits.lines_max {
        return Err(format!(
            "bulk file has {count} lines, over bulk_lines_max {}",
            limits.lines_max
        ));
    }
    let mut out = Vec::new();
    let mut start = 0usize;
    let ends = memchr::memchr_iter(b'\n', bytes).chain(std::iter::once(bytes.len()));
    for (i, end) in ends.enumerate() {
        let raw = bytes.get(start..end).unwrap_or_default();
        if !raw.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')) {
            out.push(Line {
                number: i as u64 + 1,
                offset: start as u64,
                bytes: raw,
            });
        }
        start = end + 1;
    }
    if out.is_empty() {
        return Err(format!("bulk file has no batch in its {count} lines"));
    }
    Ok(out)
}

/// Lines in `bytes`: one per newline, plus a last one without a newline.
fn line_count(bytes: &[u8]) -> u64 {
    let newlines = memchr::memchr_iter(b'\n', bytes).count() as u64;
    newlines + u64::from(bytes.last().is_some_and(|b| *b != b'\n'))
}

/// The batch on `line`, or why it is not one: too long (checked before it is parsed), not
/// UTF-8 (with the column and the file offset of the first bad byte), or any reason a batch
/// file is invalid (JSON errors name the file's line and the column in it).
pub fn parse_line(line: &Line<'_>, limits: &Limits) -> Result<Batch, Invalid> {
    let n = line.number;
    let len = line.bytes.len() as u64;
    if len > limits.line_bytes_max {
        return Err(Invalid {
            request_key: None,
            error: format!(
                "line {n} is {len} bytes, over bulk_line_bytes_max {}",
                limits.line_bytes_max
            ),
        });
    }
    // `parse_at` is `Ok` only for UTF-8, so the bytes are checked only when it fails (one
    // pass less over each line); the UTF-8 error then comes first, as when it was checked
    // first.
    batch::parse_at(line.bytes, limits.batch_ops_max, n).map_err(|invalid| {
        let Err(e) = std::str::from_utf8(line.bytes) else {
            return invalid;
        };
        let at = e.valid_up_to();
        Invalid {
            request_key: None,
            error: format!(
                "not UTF-8: invalid byte at line {n} column {} (file offset {})",
                at + 1,
                line.offset + at as u64
            ),
        }
    })
}

/// For each line, the position (in `lines`) of the last earlier line with the same request
/// key, if any: a line waits for that one's answer before it is planned, so lines that share
/// a key are planned in line order (the first commits, a later one with the same batch is a
/// duplicate with its ids, one with another batch a conflict) however many are in flight.
/// A line whose key cannot be read (malformed, too long) depends on nothing; it is invalid.
pub fn same_key_before(lines: &[Line<'_>], limits: &Limits) -> Vec<Option<usize>> {
    #[derive(serde::Deserialize)]
    struct KeyOnly {
        request_key: String,
    }
    let mut last: std::collections::HashMap<Cow<'_, str>, usize> = std::collections::HashMap::new();
    let mut before = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let key = (line.bytes.len() as u64 <= limits.line_bytes_max)
            .then(|| {
                leading_key(line.bytes).map(Cow::Borrowed).or_else(|| {
                    let k = serde_json::from_slice::<KeyOnly>(line.bytes).ok()?;
                    Some(Cow::Owned(k.request_key))
                })
            })
            .flatten();
        before.push(key.and_then(|k| last.insert(k, i)));
    }
    before
}

/// The request key of a line that starts `{"request_key":"KEY"` with no escape in KEY (as
/// most writers put it), read without parsing the rest: the key serde would read there. A
/// line that goes wrong later (a duplicate key, bad JSON) is invalid whatever it waits for.
fn leading_key(line: &[u8]) -> Option<&str> {
    const HEAD: &[u8] = br#"{"request_key":""#;
    let rest = line.strip_prefix(HEAD)?;
    let end = memchr::memchr2(b'"', b'\\', rest)?;
    if rest[end] != b'"' {
        return None;
    }
    std::str::from_utf8(&rest[..end]).ok()
}

/// The claim source of line `number` of bulk file `name` (what the WAL and the logs show).
/// It contains a `/`, which no spool name does: the engine never takes it for a file.
pub fn source(name: &str, number: u64) -> String {
    format!("bulk/{name}/{number}")
}

/// Line `number`'s result line: the result file's JSON with `"line": number`, and a newline.
pub fn result_line(number: u64, r: &BatchResult) -> Vec<u8> {
    let mut f = ResultFile::from(r.clone());
    f.line = Some(number);
    let mut v = serde_json::to_vec(&f).unwrap_or_default();
    v.push(b'\n');
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        lines_max: 5,
        line_bytes_max: 200,
        batch_ops_max: 10,
    };

    fn line(n: u64) -> String {
        format!(r#"{{"request_key":"k{n}","ops":[{{"op":"create","shard":"s","record":{{}}}}]}}"#)
    }

    #[test]
    fn names_ending_in_jsonl_are_bulk_files() {
        assert!(is_bulk_name("load-1.jsonl"));
        assert!(!is_bulk_name(".jsonl"));
        assert!(!is_bulk_name("load.json"));
        assert!(!is_bulk_name("load.jsonl.tmp"));
    }

    /// Goal: blank lines are skipped but counted, a last line without a newline counts, and
    /// each line knows its number and offset.
    #[test]
    fn lines_are_numbered_and_blank_ones_skipped() {
        let text = format!("{}\n\n  \r\n{}", line(1), line(4));
        let got = lines(text.as_bytes(), &LIMITS).expect("lines");
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].number, got[0].offset), (1, 0));
        assert_eq!(got[1].number, 4);
        assert_eq!(got[1].offset as usize, text.len() - line(4).len());
        assert_eq!(got[1].bytes, line(4).as_bytes());
        let e = lines(b"\n \n", &LIMITS).expect_err("no batch");
        assert!(e.contains("no batch in its 2 lines"), "{e}");
    }

    #[test]
    fn too_many_lines_refuse_the_whole_file() {
        let five = "x\n".repeat(5);
        assert!(lines(five.as_bytes(), &LIMITS).is_ok());
        let six = format!("{five}x");
        let e = lines(six.as_bytes(), &LIMITS).expect_err("six lines");
        assert!(e.contains("6 lines, over bulk_lines_max 5"), "{e}");
    }

    /// Goal: a bad line says which line and column, and the reason; a good one parses.
    #[test]
    fn a_bad_line_says_where() {
        let bad = |bytes: &[u8], n| {
            let l = Line {
                number: n,
                offset: 100,
                bytes,
            };
            parse_line(&l, &LIMITS).expect_err("bad line").error
        };
        let e = bad(br#"{"request_key":"k","ops":[}"#, 7);
        assert!(e.contains("line 7 column 27"), "{e}");
        let e = bad(b"{\"request_key\":\"k\xff\"}", 3);
        assert!(
            e.contains("line 3 column 18") && e.contains("file offset 117"),
            "{e}"
        );
        let e = bad(&[b' '; 201], 2);
        assert!(
            e.contains("line 2 is 201 bytes, over bulk_line_bytes_max 200"),
            "{e}"
        );
        let e = bad(br#"{"request_key":"k","request_key":"j","ops":[]}"#, 9);
        assert!(
            e.contains("duplicate key") && e.contains("line 9 column"),
            "{e}"
        );
        let ok = line(1);
        let l = Line {
            number: 1,
            offset: 0,
            bytes: ok.as_bytes(),
        };
        assert_eq!(parse_line(&l, &LIMITS).expect("good").request_key, "k1");
    }

    #[test]
    fn lines_that_share_a_key_know_the_one_before() {
        let text = format!("{}\n{}\n{{bad\n{}\n{}", line(1), line(2), line(1), line(1));
        let got = lines(text.as_bytes(), &LIMITS).expect("lines");
        assert_eq!(
            same_key_before(&got, &LIMITS),
            [None, None, None, Some(0), Some(3)]
        );
        // The key first (read without a parse), elsewhere, escaped: the same dependencies.
        let text = [
            r#"{"request_key":"a","ops":[]}"#,
            r#"{"ops":[],"request_key":"a"}"#,
            r#"{"request_key":"\u0061","ops":[]}"#,
            r#"{"request_key":"a\"b","ops":[]}"#,
            r#"{"ops":[],"request_key":"a\"b"}"#,
        ]
        .join("\n");
        let got = lines(text.as_bytes(), &LIMITS).expect("lines");
        let before = same_key_before(&got, &LIMITS);
        assert_eq!(before, [None, Some(0), Some(1), None, Some(3)]);
        assert_eq!(leading_key(br#"{"request_key":"k7","ops":[]}"#), Some("k7"));
        assert_eq!(leading_key(br#"{"request_key":"k\7"}"#), None);
        assert_eq!(leading_key(br#"{"ops":[],"request_key":"k"}"#), None);
        assert_eq!(leading_key(br#"{"request_key":"unterminated"#), None);
    }

    #[test]
    fn result_lines_carry_their_line_number() {
        let r = BatchResult::Rejected {
            request_key: "k".into(),
            op_index: 0,
            reason: "no".into(),
        };
        assert_eq!(
            String::from_utf8(result_line(12, &r)).expect("utf-8"),
            "{\"request_key\":\"k\",\"status\":\"rejected\",\"line\":12,\"op_index\":0,\"reason\":\"no\"}\n"
        );
        assert_eq!(source("a.jsonl", 3), "bulk/a.jsonl/3");
    }
}
