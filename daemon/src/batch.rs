//! The client-facing JSON: batch files in, result files out. This is a public contract
//! (README "Batch and result"): fields are only ever added, never renamed.
//!
//! Parsing is strict: unknown fields are refused (a typo like `reqest_key` must not be
//! silently ignored), duplicate keys in one object are refused, and nesting is bounded by
//! serde_json's recursion limit (128), so hostile input is an `invalid` result, not a crash.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatch {
    request_key: String,
    ops: Vec<RawOp>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum RawOp {
    Create {
        shard: String,
        record: Map<String, Value>,
    },
    Delete {
        shard: String,
        id: u64,
    },
}

/// One op of a parsed, well-formed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOp {
    /// `record` is the canonical JSON (keys sorted, no whitespace).
    Create {
        shard: String,
        record: Vec<u8>,
        fields: Vec<String>,
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

/// A well-formed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub request_key: String,
    pub ops: Vec<BatchOp>,
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

/// Rejects duplicate keys in any object, at any depth, without building the value twice.
fn check_no_duplicate_keys(bytes: &[u8]) -> Result<(), String> {
    struct Dedup;
    impl<'de> serde::de::DeserializeSeed<'de> for Dedup {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> serde::de::Visitor<'de> for Dedup {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
            while a.next_element_seed(Dedup)?.is_some() {}
            Ok(())
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(k) = a.next_key::<String>()? {
                if !seen.insert(k.clone()) {
                    return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
                }
                a.next_value_seed(Dedup)?;
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde::de::DeserializeSeed::deserialize(Dedup, &mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())
}

/// Parses and checks a batch file's bytes. Shard-specific rules (declared shards, record
/// size, required fields, triggers) are the planner's; this checks only what the file alone
/// decides.
pub fn parse(bytes: &[u8], batch_ops_max: u32) -> Result<Batch, Invalid> {
    if bytes.is_empty() {
        return Err(invalid(None, "empty file"));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        invalid(
            None,
            format!("not UTF-8: invalid byte at offset {}", e.valid_up_to()),
        )
    })?;
    check_no_duplicate_keys(text.as_bytes())
        .map_err(|e| invalid(None, format!("invalid JSON: {e}")))?;
    let raw: RawBatch = serde_json::from_str(text).map_err(|e| {
        // Salvage the key, when there is one, so the client can match the result.
        let key = serde_json::from_str::<Value>(text).ok().and_then(|v| {
            v.get("request_key")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        invalid(key.as_deref(), format!("invalid batch: {e}"))
    })?;
    let key = raw.request_key.as_str();
    if key.is_empty() {
        return Err(invalid(Some(key), "request_key is empty"));
    }
    if key.len() > REQUEST_KEY_BYTES_MAX {
        return Err(invalid(
            None,
            format!(
                "request_key is {} bytes, over {REQUEST_KEY_BYTES_MAX}",
                key.len()
            ),
        ));
    }
    if key.chars().any(char::is_control) {
        return Err(invalid(None, "request_key contains control characters"));
    }
    if raw.ops.is_empty() {
        return Err(invalid(Some(key), "batch has no ops"));
    }
    if raw.ops.len() > batch_ops_max as usize {
        return Err(invalid(
            Some(key),
            format!(
                "batch has {} ops, over batch_ops_max {batch_ops_max}",
                raw.ops.len()
            ),
        ));
    }
    let mut ops = Vec::with_capacity(raw.ops.len());
    for (i, op) in raw.ops.into_iter().enumerate() {
        let shard = match &op {
            RawOp::Create { shard, .. } | RawOp::Delete { shard, .. } => shard.clone(),
        };
        if !valid_shard_name(&shard) {
            return Err(invalid(
                Some(key),
                format!("op {i}: shard name {shard:?} must match [a-z0-9][a-z0-9_-]{{0,63}}"),
            ));
        }
        ops.push(match op {
            RawOp::Create { record, .. } => {
                let fields = record.keys().cloned().collect();
                // serde_json's Map is ordered by key: this is the canonical form.
                let record = serde_json::to_vec(&record)
                    .map_err(|e| invalid(Some(key), format!("op {i}: record: {e}")))?;
                BatchOp::Create {
                    shard,
                    record,
                    fields,
                }
            }
            RawOp::Delete { id, .. } => BatchOp::Delete { shard, id },
        });
    }
    Ok(Batch {
        request_key: raw.request_key,
        ops,
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

/// The result file for one batch (`out/NAME`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResult {
    pub request_key: Option<String>,
    pub status: Status,
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

impl BatchResult {
    pub fn invalid(inv: &Invalid) -> BatchResult {
        BatchResult {
            request_key: inv.request_key.clone(),
            status: Status::Invalid,
            lsn: None,
            ops: None,
            op_index: None,
            reason: None,
            error: Some(inv.error.clone()),
        }
    }

    pub fn to_json_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let deep = format!("{{\"request_key\":\"k\",\"ops\":[{{\"op\":\"create\",\"shard\":\"s\",\"record\":{{\"a\":{}{}}}}}]}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(deep.as_bytes(), 10)
            .unwrap_err()
            .error
            .contains("recursion"));
    }
}
