//! The gateway's JSON (proto3 JSON of etcd's `etcdserverpb` messages): requests built here,
//! answers decoded here. Keys and values are base64; int64 fields are written as strings
//! and read from a string or a number; a field with its default value is absent, so every
//! field but `header` defaults (`kvs` to none, `succeeded` to false, `TTL` to 0).

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::de::{self, Deserializer, IgnoredAny, Visitor};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::types::{CmpOp, Compare, Kv, Op, Target, Txn};

pub(crate) fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// `/v3/kv/range` for one key, or for `[key, range_end)` with at most `limit` keys.
pub(crate) fn range(key: &[u8], range_end: Option<&[u8]>, limit: Option<i64>) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), b64(key).into());
    if let Some(end) = range_end {
        m.insert("range_end".into(), b64(end).into());
    }
    if let Some(limit) = limit {
        m.insert("limit".into(), limit.to_string().into());
    }
    Value::Object(m)
}

pub(crate) fn put(key: &str, value: &[u8], lease: Option<i64>) -> Value {
    let mut v = json!({ "key": b64(key.as_bytes()), "value": b64(value) });
    if let Some(lease) = lease {
        v["lease"] = lease.to_string().into();
    }
    v
}

pub(crate) fn delete(key: &str) -> Value {
    json!({ "key": b64(key.as_bytes()) })
}

pub(crate) fn lease_id(id: i64) -> Value {
    json!({ "ID": id.to_string() })
}

pub(crate) fn grant(ttl_secs: i64) -> Value {
    json!({ "TTL": ttl_secs.to_string() })
}

pub(crate) fn txn(t: &Txn) -> Value {
    let ops = |ops: &[Op]| ops.iter().map(request_op).collect::<Vec<_>>();
    json!({
        "compare": t.compare.iter().map(compare).collect::<Vec<_>>(),
        "success": ops(&t.success),
        "failure": ops(&t.failure),
    })
}

fn request_op(op: &Op) -> Value {
    match op {
        Op::Put { key, value, lease } => json!({ "request_put": put(key, value, *lease) }),
        Op::Get { key } => json!({ "request_range": range(key.as_bytes(), None, None) }),
        Op::Delete { key } => json!({ "request_delete_range": delete(key) }),
    }
}

fn compare(c: &Compare) -> Value {
    let result = match c.op {
        CmpOp::Equal => "EQUAL",
        CmpOp::Greater => "GREATER",
        CmpOp::Less => "LESS",
        CmpOp::NotEqual => "NOT_EQUAL",
    };
    let mut v = json!({ "key": b64(c.key.as_bytes()), "result": result });
    let (target, field, operand): (&str, &str, Value) = match &c.target {
        Target::CreateRevision(r) => ("CREATE", "create_revision", r.to_string().into()),
        Target::ModRevision(r) => ("MOD", "mod_revision", r.to_string().into()),
        Target::Version(n) => ("VERSION", "version", n.to_string().into()),
        Target::Value(bytes) => ("VALUE", "value", b64(bytes).into()),
    };
    v["target"] = target.into();
    v[field] = operand;
    v
}

/// An int64 as proto3 JSON writes it (a string) or as a number.
fn int<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    struct IntVisitor;
    impl Visitor<'_> for IntVisitor {
        type Value = i64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an int64 as a string or a number")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<i64, E> {
            s.parse()
                .map_err(|_| E::custom(format!("{s:?} is not an int64")))
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<i64, E> {
            Ok(n)
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<i64, E> {
            i64::try_from(n).map_err(|_| E::custom(format!("{n} is not an int64")))
        }
    }
    d.deserialize_any(IntVisitor)
}

#[derive(Debug, Deserialize)]
pub(crate) struct Header {
    #[serde(default, deserialize_with = "int")]
    pub revision: i64,
}

#[derive(Debug, Deserialize)]
pub(crate) struct KvJson {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, deserialize_with = "int")]
    create_revision: i64,
    #[serde(default, deserialize_with = "int")]
    mod_revision: i64,
    #[serde(default, deserialize_with = "int")]
    version: i64,
    #[serde(default, deserialize_with = "int")]
    lease: i64,
}

impl KvJson {
    /// The pair decoded; a key that is not base64 of UTF-8 text is an error (roost's keys are
    /// text, and a lossy key could not be written back to the same key).
    pub(crate) fn decode(self) -> Result<Kv, String> {
        let key = B64
            .decode(&self.key)
            .map_err(|e| format!("key {:?} is not base64: {e}", self.key))?;
        let key = String::from_utf8(key)
            .map_err(|e| format!("key {:?} is not UTF-8: {e}", e.as_bytes()))?;
        let value = B64
            .decode(&self.value)
            .map_err(|e| format!("value of key {key:?} is not base64: {e}"))?;
        Ok(Kv {
            key,
            value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            lease: self.lease,
        })
    }
}

pub(crate) fn decode_kvs(kvs: Vec<KvJson>) -> Result<Vec<Kv>, String> {
    kvs.into_iter().map(KvJson::decode).collect()
}

#[derive(Debug, Deserialize)]
pub(crate) struct RangeJson {
    pub header: Option<Header>,
    #[serde(default)]
    pub kvs: Vec<KvJson>,
    #[serde(default)]
    pub more: bool,
}

#[derive(Debug, Deserialize)]
pub(crate) struct PutJson {
    pub header: Option<Header>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct DeleteJson {
    pub header: Option<Header>,
    #[serde(default, deserialize_with = "int")]
    pub deleted: i64,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TxnJson {
    pub header: Option<Header>,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<ResponseOpJson>,
}

/// One of the fields is set (a oneof); `response_txn` (nested txns) is never asked for.
#[derive(Debug, Deserialize)]
pub(crate) struct ResponseOpJson {
    pub response_range: Option<RangeJson>,
    pub response_put: Option<IgnoredAny>,
    pub response_delete_range: Option<DeleteJson>,
}

/// `/v3/lease/grant`, `/v3/lease/timetolive` and a keepalive's `result`.
#[derive(Debug, Deserialize)]
pub(crate) struct LeaseJson {
    #[serde(rename = "ID", default, deserialize_with = "int")]
    pub id: i64,
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub ttl: i64,
    /// Grant only: a refusal the server put in the answer instead of an error status.
    #[serde(default)]
    pub error: String,
}

/// `/v3/lease/keepalive` is a gRPC stream behind the gateway: each message comes wrapped
/// as `{"result": ...}`, and an error in the stream as `{"error": {...}}` under HTTP 200.
#[derive(Debug, Deserialize)]
pub(crate) struct KeepAliveJson {
    pub result: Option<LeaseJson>,
    pub error: Option<StreamError>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StreamError {
    #[serde(default)]
    pub http_code: Option<u16>,
    #[serde(default)]
    pub message: String,
}

/// The end of `[prefix, end)` holding every key that starts with `prefix`: the prefix with
/// its last byte below 0xff incremented and what follows dropped; `\0` (no upper bound)
/// for an empty prefix or one of 0xff bytes only. etcd's own `GetPrefixRangeEnd`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => vec![0],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_follows_etcd() {
        assert_eq!(prefix_end(b"roost/"), b"roost0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn absent_fields_default_and_int64_reads_both_forms() {
        let r: RangeJson = serde_json::from_str(r#"{"header":{"revision":"7"}}"#).unwrap();
        assert_eq!(r.header.unwrap().revision, 7);
        assert!(r.kvs.is_empty() && !r.more);
        let kv: KvJson = serde_json::from_str(r#"{"key":"YQ==","version":2}"#).unwrap();
        let kv = kv.decode().unwrap();
        assert_eq!((kv.key.as_str(), kv.value.len(), kv.version), ("a", 0, 2));
        let bad = serde_json::from_str::<Header>(r#"{"revision":"x"}"#);
        assert!(bad.is_err());
    }

    #[test]
    fn txn_request_names_target_and_operand() {
        let t = Txn {
            compare: vec![Compare::create_revision("k", CmpOp::Equal, 0)],
            success: vec![Op::Put {
                key: "k".into(),
                value: b"v".to_vec(),
                lease: Some(5),
            }],
            failure: vec![Op::Get { key: "k".into() }],
        };
        let v = txn(&t);
        assert_eq!(v["compare"][0]["target"], "CREATE");
        assert_eq!(v["compare"][0]["create_revision"], "0");
        assert_eq!(v["success"][0]["request_put"]["lease"], "5");
        assert_eq!(v["failure"][0]["request_range"]["key"], "aw==");
    }
}
