//! The client-facing JSON: batch files in, result files out. This is a public contract
//! (docs/contract.md "Batch and result"): fields are only ever added, never renamed.
//!
//! Parsing is strict: unknown fields are refused (a typo like `reqest_key` must not be
//! silently ignored), duplicate keys in one object are refused, and nesting is bounded by
//! serde_json's recursion limit (128), so hostile input is an `invalid` result, not a crash.
//!
//! A batch is read in one pass over its bytes (`batch/raw_op.rs`), each record transcoded
//! to its canonical bytes as it is read (`batch/canon.rs`): no JSON tree is built. Those
//! bytes are the contract of the shards and of the fingerprint (they are stored, and hashed
//! into the WAL and the key table): they are what `serde_json::to_vec` of the record parsed
//! as a `serde_json::Map` printed, which `batch/oracle.rs` checks.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg(test)]
mod bench;
mod canon;
mod object_keys;
#[cfg(test)]
mod oracle;
mod raw_op;
use raw_op::{RawBatch, RawOp};

pub const REQUEST_KEY_BYTES_MAX: usize = 255;
pub const SHARD_NAME_BYTES_MAX: usize = 64;

/// `[a-z0-9][a-z0-9_-]{0,63}`
pub fn valid_shard_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// One op of a parsed, well-formed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOp {
    /// `record` is the canonical JSON (an object, keys sorted, no whitespace).
    Create {
        shard: String,
        record: Vec<u8>,
    },
    Delete {
        shard: String,
        id: u64,
    },
}

impl BatchOp {
    pub fn shard(&self) -> &str {
        match self {
            BatchOp::Create { shard, .. } | BatchOp::Delete { shard, .. } => shard,
        }
    }
}

/// The first of `names` that is not a top-level key of `record`, a canonical record (a
/// shard's `required_fields`: the record's keys are read only when there are some).
pub fn missing_field<'n>(record: &[u8], names: &'n [String]) -> Option<&'n str> {
    if names.is_empty() {
        return None;
    }
    let keys = canon::top_level_keys(record);
    names
        .iter()
        .map(String::as_str)
        .find(|n| !keys.iter().any(|k| k == n))
}

/// A well-formed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub request_key: String,
    pub ops: Vec<BatchOp>,
}

impl Batch {
    /// The batch as a batch file's JSON (records in their canonical bytes): what a standby
    /// forwards to the leader, which parses it into this same batch (same fingerprint).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.ops.len() * 64);
        out.extend_from_slice(b"{\"request_key\":");
        out.extend_from_slice(&serde_json::to_vec(&self.request_key).unwrap_or_default());
        out.extend_from_slice(b",\"ops\":[");
        for (i, op) in self.ops.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let shard = serde_json::to_vec(op.shard()).unwrap_or_default();
            out.extend_from_slice(b"{\"shard\":");
            out.extend_from_slice(&shard);
            match op {
                BatchOp::Create { record, .. } => {
                    out.extend_from_slice(b",\"op\":\"create\",\"record\":");
                    out.extend_from_slice(record);
                }
                BatchOp::Delete { id, .. } => {
                    out.extend_from_slice(format!(",\"op\":\"delete\",\"id\":{id}").as_bytes());
                }
            }
            out.push(b'}');
        }
        out.extend_from_slice(b"]}");
        out
    }
}

/// Why a file is not a valid batch. `request_key` when it could be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub request_key: Option<String>,
    pub error: String,
}

fn invalid(key: Option<&str>, error: impl Into<String>) -> Invalid {
    Invalid {
        request_key: key.map(str::to_owned),
        error: error.into(),
    }
}

/// A JSON error's text with its position counted from `first_line`, the line of the file
/// where the parsed bytes start (1 for a batch file, N for line N of a bulk file).
fn located(e: &serde_json::Error, first_line: u64) -> String {
    let text = e.to_string();
    if e.line() == 0 {
        return text;
    }
    let what = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(w, _)| w);
    let line = first_line + e.line() as u64 - 1;
    format!("{what} at line {line} column {}", e.column())
}

/// Parses and checks a batch file's bytes. Shard-specific rules (declared shards, record
/// size, required fields, triggers) are the planner's; this checks only what the file alone
/// decides.
pub fn parse(bytes: &[u8], batch_ops_max: u32) -> Result<Batch, Invalid> {
    parse_at(bytes, batch_ops_max, 1)
}

/// [`parse`] for bytes that start at line `first_line` of their file (a bulk file's line):
/// JSON errors name the file's line and the column in it. `Ok` only if `bytes` are UTF-8.
pub fn parse_at(bytes: &[u8], batch_ops_max: u32, first_line: u64) -> Result<Batch, Invalid> {
    if bytes.is_empty() {
        return Err(invalid(None, "empty file"));
    }
    let raw = raw_op::read(bytes).map_err(|e| why_not(bytes, &e, first_line))?;
    checked(raw, batch_ops_max)
}

/// The batch read, if the rules of its key, its size and its ops' shard names hold.
fn checked(raw: RawBatch, batch_ops_max: u32) -> Result<Batch, Invalid> {
    check_key_and_size(&raw, batch_ops_max)?;
    let RawBatch { request_key, ops } = raw;
    let ops = ops
        .into_iter()
        .enumerate()
        .map(|(i, op)| checked_op(&request_key, i, op))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Batch { request_key, ops })
}

/// Why `bytes` are not a batch, `e` the error of the one pass. The checks the pass folds
/// together answer in the order they had when they were passes of their own, so a client
/// sees the same error as before: bytes that are not UTF-8 anywhere, else the first JSON
/// error (syntax, or a duplicate key) anywhere, else `e`, the batch's own (a cold path: the
/// bytes are read again).
fn why_not(bytes: &[u8], e: &serde_json::Error, first_line: u64) -> Invalid {
    if let Err(u) = std::str::from_utf8(bytes) {
        let at = u.valid_up_to();
        return invalid(None, format!("not UTF-8: invalid byte at offset {at}"));
    }
    if let Some(json) = canon::first_json_error(bytes) {
        return invalid(
            None,
            format!("invalid JSON: {}", located(&json, first_line)),
        );
    }
    // Salvage the key, when there is one, so the client can match the result.
    let key = serde_json::from_slice::<Value>(bytes).ok().and_then(|v| {
        v.get("request_key")
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    invalid(
        key.as_deref(),
        format!("invalid batch: {}", located(e, first_line)),
    )
}

/// The request key's rules and the op count, before any op is looked at.
fn check_key_and_size(raw: &RawBatch, batch_ops_max: u32) -> Result<(), Invalid> {
    let key = raw.request_key.as_str();
    if key.is_empty() {
        return Err(invalid(Some(key), "request_key is empty"));
    }
    if key.len() > REQUEST_KEY_BYTES_MAX {
        let len = key.len();
        return Err(invalid(
            None,
            format!("request_key is {len} bytes, over {REQUEST_KEY_BYTES_MAX}"),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(invalid(None, "request_key contains control characters"));
    }
    if raw.ops.is_empty() {
        return Err(invalid(Some(key), "batch has no ops"));
    }
    if raw.ops.len() > batch_ops_max as usize {
        let n = raw.ops.len();
        return Err(invalid(
            Some(key),
            format!("batch has {n} ops, over batch_ops_max {batch_ops_max}"),
        ));
    }
    Ok(())
}

/// Op `i` checked (its shard name; its record is canonical already).
fn checked_op(key: &str, i: usize, op: RawOp) -> Result<BatchOp, Invalid> {
    let shard = match &op {
        RawOp::Create { shard, .. } | RawOp::Delete { shard, .. } => shard,
    };
    if !valid_shard_name(shard) {
        return Err(invalid(
            Some(key),
            format!("op {i}: shard name {shard:?} must match [a-z0-9][a-z0-9_-]{{0,63}}"),
        ));
    }
    Ok(match op {
        RawOp::Create { shard, record } => BatchOp::Create { shard, record },
        RawOp::Delete { shard, id } => BatchOp::Delete { shard, id },
    })
}

/// FNV-1a 64 over the canonical batch: request key, then each op's kind, shard and record or
/// id, length-prefixed. Two batches with the same key and the same content have the same
/// fingerprint whatever their whitespace or key order.
pub fn fingerprint(b: &Batch) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for x in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            h ^= *x as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(b.request_key.as_bytes());
    for op in &b.ops {
        match op {
            BatchOp::Create { shard, record, .. } => {
                eat(b"create");
                eat(shard.as_bytes());
                eat(record);
            }
            BatchOp::Delete { shard, id } => {
                eat(b"delete");
                eat(shard.as_bytes());
                eat(&id.to_le_bytes());
            }
        }
    }
    h
}

/// `status` of a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Committed,
    Rejected,
    Invalid,
    Conflict,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpResult {
    pub op: String,
    pub shard: String,
    pub id: u64,
}

/// The result of one batch (`out/NAME`): what its status implies, and nothing else.
/// Serialised through [`ResultFile`], so the JSON is the documented flat object
/// (`{"request_key":..,"status":"committed","lsn":..,"ops":[..]}`) with the fields in that
/// order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ResultFile", try_from = "ResultFile")]
pub enum BatchResult {
    Committed {
        request_key: String,
        lsn: u64,
        ops: Vec<OpResult>,
    },
    /// Op `op_index` was rejected when the batch was planned; nothing was written.
    Rejected {
        request_key: String,
        op_index: u32,
        reason: String,
    },
    /// Not a valid batch (the request key, if it could be read).
    Invalid {
        request_key: Option<String>,
        error: String,
    },
    /// The key was used at `lsn` with a different batch.
    Conflict {
        request_key: String,
        lsn: u64,
        reason: String,
    },
}

impl BatchResult {
    pub fn invalid(inv: &Invalid) -> BatchResult {
        BatchResult::Invalid {
            request_key: inv.request_key.clone(),
            error: inv.error.clone(),
        }
    }

    pub fn status(&self) -> Status {
        match self {
            BatchResult::Committed { .. } => Status::Committed,
            BatchResult::Rejected { .. } => Status::Rejected,
            BatchResult::Invalid { .. } => Status::Invalid,
            BatchResult::Conflict { .. } => Status::Conflict,
        }
    }

    pub fn request_key(&self) -> Option<&str> {
        match self {
            BatchResult::Committed { request_key, .. }
            | BatchResult::Rejected { request_key, .. }
            | BatchResult::Conflict { request_key, .. } => Some(request_key),
            BatchResult::Invalid { request_key, .. } => request_key.as_deref(),
        }
    }

    /// The claim's lsn (committed), or the lsn of the batch the key belongs to (conflict).
    pub fn lsn(&self) -> Option<u64> {
        match self {
            BatchResult::Committed { lsn, .. } | BatchResult::Conflict { lsn, .. } => Some(*lsn),
            _ => None,
        }
    }

    /// The ops with their ids (committed); empty otherwise.
    pub fn ops(&self) -> &[OpResult] {
        match self {
            BatchResult::Committed { ops, .. } => ops,
            _ => &[],
        }
    }

    /// Why not committed: the rejection or conflict reason, or the invalid file's error.
    pub fn reason(&self) -> Option<&str> {
        match self {
            BatchResult::Committed { .. } => None,
            BatchResult::Rejected { reason, .. } | BatchResult::Conflict { reason, .. } => {
                Some(reason)
            }
            BatchResult::Invalid { error, .. } => Some(error),
        }
    }

    pub fn to_json_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

/// The result file's JSON shape (a public contract): one flat object whose optional fields
/// depend on `status`. Only [`BatchResult`] is used in code; this is its wire form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultFile {
    pub request_key: Option<String>,
    pub status: Status,
    /// A bulk file's result line: the line of the batch it answers (1-based). Absent in a
    /// result file of its own, and in a bulk file's result about the whole file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<Vec<OpResult>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<BatchResult> for ResultFile {
    fn from(r: BatchResult) -> ResultFile {
        let status = r.status();
        let mut f = ResultFile {
            request_key: None,
            status,
            line: None,
            lsn: None,
            ops: None,
            op_index: None,
            reason: None,
            error: None,
        };
        match r {
            BatchResult::Committed {
                request_key,
                lsn,
                ops,
            } => {
                (f.request_key, f.lsn, f.ops) = (Some(request_key), Some(lsn), Some(ops));
            }
            BatchResult::Rejected {
                request_key,
                op_index,
                reason,
            } => {
                (f.request_key, f.op_index, f.reason) =
                    (Some(request_key), Some(op_index), Some(reason));
            }
            BatchResult::Invalid { request_key, error } => {
                (f.request_key, f.error) = (request_key, Some(error));
            }
            BatchResult::Conflict {
                request_key,
                lsn,
                reason,
            } => {
                (f.request_key, f.lsn, f.reason) = (Some(request_key), Some(lsn), Some(reason));
            }
        }
        f
    }
}

impl TryFrom<ResultFile> for BatchResult {
    type Error = String;

    /// A result file whose fields do not fit its status is an error, not a guess.
    fn try_from(f: ResultFile) -> Result<BatchResult, String> {
        let missing = |what: &str| format!("a {:?} result without {what}", f.status);
        let key = || f.request_key.clone().ok_or_else(|| missing("request_key"));
        Ok(match f.status {
            Status::Committed => BatchResult::Committed {
                request_key: key()?,
                lsn: f.lsn.ok_or_else(|| missing("lsn"))?,
                ops: f.ops.clone().ok_or_else(|| missing("ops"))?,
            },
            Status::Rejected => BatchResult::Rejected {
                request_key: key()?,
                op_index: f.op_index.ok_or_else(|| missing("op_index"))?,
                reason: f.reason.clone().ok_or_else(|| missing("reason"))?,
            },
            Status::Invalid => BatchResult::Invalid {
                request_key: f.request_key.clone(),
                error: f.error.clone().ok_or_else(|| missing("error"))?,
            },
            Status::Conflict => BatchResult::Conflict {
                request_key: key()?,
                lsn: f.lsn.ok_or_else(|| missing("lsn"))?,
                reason: f.reason.clone().ok_or_else(|| missing("reason"))?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the typed result serialises to exactly the documented JSON, field order
    /// included, and a file whose fields do not fit its status does not parse.
    #[test]
    fn results_keep_the_documented_json() {
        let c = BatchResult::Committed {
            request_key: "order-17".into(),
            lsn: 42,
            ops: vec![OpResult {
                op: "create".into(),
                shard: "users".into(),
                id: 1001,
            }],
        };
        let text = String::from_utf8(c.to_json_line()).unwrap();
        assert_eq!(
            text,
            "{\"request_key\":\"order-17\",\"status\":\"committed\",\"lsn\":42,\"ops\":[{\"op\":\"create\",\"shard\":\"users\",\"id\":1001}]}\n"
        );
        assert_eq!(serde_json::from_str::<BatchResult>(&text).unwrap(), c);
        let r = BatchResult::Rejected {
            request_key: "k".into(),
            op_index: 1,
            reason: "no".into(),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"request_key":"k","status":"rejected","op_index":1,"reason":"no"}"#
        );
        let i = BatchResult::Invalid {
            request_key: None,
            error: "bad".into(),
        };
        assert_eq!(
            serde_json::to_string(&i).unwrap(),
            r#"{"request_key":null,"status":"invalid","error":"bad"}"#
        );
        for bad in [
            r#"{"request_key":"k","status":"committed","lsn":1}"#,
            r#"{"request_key":"k","status":"conflict","lsn":1}"#,
            r#"{"request_key":null,"status":"rejected","op_index":0,"reason":"x"}"#,
        ] {
            assert!(serde_json::from_str::<BatchResult>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_the_documented_example() {
        let b = parse(br#"{"request_key": "order-17", "ops": [{"op": "create", "shard": "users", "record": {"name": "ada"}}, {"op": "delete", "shard": "users", "id": 17}]}"#, 10).unwrap();
        assert_eq!(b.request_key, "order-17");
        assert_eq!(
            b.ops[1],
            BatchOp::Delete {
                shard: "users".into(),
                id: 17
            }
        );
    }

    #[test]
    fn a_batch_forwarded_as_json_parses_into_itself() {
        let text = br#"{"request_key": "k\u00e9-1", "ops": [
            {"op": "create", "shard": "users", "record": {"b": [1, 2.5, "x\n"], "a": {"z": null}}},
            {"op": "delete", "shard": "orders", "id": 42}]}"#;
        let b = parse(text, 100).expect("valid");
        let again = parse(&b.to_json(), 100).expect("its JSON parses");
        assert_eq!(again, b);
        assert_eq!(fingerprint(&again), fingerprint(&b));
    }

    #[test]
    fn fingerprint_ignores_whitespace_and_key_order() {
        let a = parse(
            br#"{"request_key":"k","ops":[{"op":"create","shard":"s","record":{"a":1,"b":2}}]}"#,
            10,
        )
        .unwrap();
        let b = parse(b"{ \"ops\": [ {\"record\": {\"b\":2, \"a\":1}, \"shard\":\"s\", \"op\":\"create\"} ], \"request_key\": \"k\" }", 10).unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let c = parse(
            br#"{"request_key":"k","ops":[{"op":"create","shard":"s","record":{"a":1,"b":3}}]}"#,
            10,
        )
        .unwrap();
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }

    #[test]
    fn rejects_what_it_must() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"{", "EOF"),
            (b"\xff\xfe", "UTF-8"),
            (br#"{"request_key":"k","ops":[]}"#, "no ops"),
            (br#"{"request_key":"","ops":[{"op":"delete","shard":"s","id":1}]}"#, "empty"),
            (br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":-1}]}"#, "invalid"),
            (br#"{"request_key":"k","ops":[{"op":"delete","shard":"s","id":1.5}]}"#, "invalid"),
            (br#"{"request_key":"k","ops":[{"op":"delete","shard":"../x","id":1}]}"#, "shard name"),
            (br#"{"request_key":"k","extra":1,"ops":[{"op":"delete","shard":"s","id":1}]}"#, "unknown field"),
            (br#"{"request_key":"k","request_key":"j","ops":[{"op":"delete","shard":"s","id":1}]}"#, "duplicate key"),
            (br#"{"request_key":"a\u0001","ops":[{"op":"delete","shard":"s","id":1}]}"#, "control"),
        ];
        for (input, want) in cases {
            let e = parse(input, 10).expect_err(std::str::from_utf8(input).unwrap_or("bytes"));
            assert!(
                e.error.contains(want),
                "{:?}: {}",
                String::from_utf8_lossy(input),
                e.error
            );
        }
        let op_cases: &[(&str, &str)] = &[
            (r#"{"shard":"s","id":1}"#, "missing field `op`"),
            (
                r#"{"op":"update","shard":"s","id":1}"#,
                "unknown variant `update`, expected `create` or `delete`",
            ),
            (r#"{"op":"delete","id":1}"#, "missing field `shard`"),
            (r#"{"op":"delete","shard":"s"}"#, "missing field `id`"),
            (r#"{"op":"create","shard":"s"}"#, "missing field `record`"),
            (
                r#"{"op":"delete","shard":"s","id":1,"force":true}"#,
                "unknown field `force`, expected `shard` or `id`",
            ),
            (
                r#"{"force":true,"op":"create","shard":"s","record":{}}"#,
                "unknown field `force`, expected `shard` or `record`",
            ),
            (
                r#"{"op":"create","shard":"s","record":{},"id":3}"#,
                "unknown field `id`, expected `shard` or `record`",
            ),
            (
                r#"{"op":"delete","shard":"s","id":3,"record":{}}"#,
                "unknown field `record`, expected `shard` or `id`",
            ),
            (
                r#"{"op":"create","shard":"s","record":[1]}"#,
                "invalid type: sequence, expected a map",
            ),
            (
                r#"{"op":"create","shard":"s","record":null}"#,
                "invalid type: null, expected a map",
            ),
            (
                r#"{"op":"delete","shard":"s","id":"7"}"#,
                "invalid type: string \"7\", expected u64",
            ),
            (
                r#"{"op":"delete","shard":"s","id":-3}"#,
                "invalid value: integer `-3`, expected u64",
            ),
            (
                r#"{"op":"delete","shard":"s","id":1e30}"#,
                "invalid type: floating point",
            ),
            (
                r#""create""#,
                "invalid type: string \"create\", expected an op object",
            ),
        ];
        for (op, want) in op_cases {
            let input = format!(r#"{{"request_key":"k","ops":[{op}]}}"#);
            let e = parse(input.as_bytes(), 10).expect_err(op);
            assert!(e.error.contains(want), "{op}: {}", e.error);
        }
        // Duplicate keys: spelled with an escape, and past the short list (the 20th of 40).
        let escaped = r#"{"request_key":"k","ops":[{"op":"create","shard":"s","record":{"aA":1,"a\u0041":2}}]}"#;
        let e = parse(escaped.as_bytes(), 10).expect_err("escaped duplicate");
        assert!(e.error.contains(r#"duplicate key "aA""#), "{}", e.error);
        let mut fields: Vec<String> = (0..40).map(|i| format!(r#""f{i}":{i}"#)).collect();
        fields[20] = r#""f3":0"#.to_owned();
        let wide = format!(
            r#"{{"request_key":"k","ops":[{{"op":"create","shard":"s","record":{{{}}}}}]}}"#,
            fields.join(",")
        );
        let e = parse(wide.as_bytes(), 10).expect_err("wide duplicate");
        assert!(e.error.contains(r#"duplicate key "f3""#), "{}", e.error);
        fields[20] = r#""f20":0"#.to_owned();
        let wide = format!(
            r#"{{"request_key":"k","ops":[{{"op":"create","shard":"s","record":{{{}}}}}]}}"#,
            fields.join(",")
        );
        parse(wide.as_bytes(), 10).expect("forty distinct keys");
        // Fields in any order, the tag last.
        let b = parse(br#"{"ops":[{"record":{"b":1,"a":2},"shard":"s","op":"create"},{"id":4,"shard":"t","op":"delete"}],"request_key":"k"}"#, 10)
            .expect("any order");
        assert_eq!(
            b.ops[1],
            BatchOp::Delete {
                shard: "t".into(),
                id: 4
            }
        );
        assert!(
            matches!(&b.ops[0], BatchOp::Create { record, .. } if record == br#"{"a":2,"b":1}"#)
        );
        let deep = format!("{{\"request_key\":\"k\",\"ops\":[{{\"op\":\"create\",\"shard\":\"s\",\"record\":{{\"a\":{}{}}}}}]}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(deep.as_bytes(), 10)
            .unwrap_err()
            .error
            .contains("recursion"));
    }
}
