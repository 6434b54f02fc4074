//! The test oracle: the parse the one-pass one replaced, kept as it was (a UTF-8 pass, a
//! duplicate-key pass, each record a `serde_json::Map` re-serialised with `to_vec`), and the
//! test that the two agree over a corpus: the same batches (record bytes identical, so the
//! same fingerprints), the same refusals with the same messages, and the top-level keys of
//! each record those the old parse listed.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::object_keys::{KeyStr, Seen};
use super::{checked, invalid, located, Batch, Invalid, RawOp};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatch {
    request_key: String,
    ops: Vec<OldRawOp>,
}

#[derive(Debug)]
enum OldRawOp {
    Create {
        shard: String,
        record: Map<String, Value>,
    },
    Delete {
        shard: String,
        id: u64,
    },
}

/// The old `parse_at`, and each create's record's keys as the old `fields` listed them.
pub(super) fn parse_at(
    bytes: &[u8],
    batch_ops_max: u32,
    first_line: u64,
) -> Result<(Batch, Vec<Vec<String>>), Invalid> {
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
        .map_err(|e| invalid(None, format!("invalid JSON: {}", located(&e, first_line))))?;
    let raw: RawBatch = serde_json::from_str(text).map_err(|e| {
        let key = serde_json::from_str::<Value>(text).ok().and_then(|v| {
            v.get("request_key")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
        invalid(
            key.as_deref(),
            format!("invalid batch: {}", located(&e, first_line)),
        )
    })?;
    let mut fields = Vec::new();
    let ops = raw.ops.into_iter().map(|op| match op {
        OldRawOp::Create { shard, record } => {
            fields.push(record.keys().cloned().collect());
            let record = serde_json::to_vec(&record).expect("a Map serialises");
            RawOp::Create { shard, record }
        }
        OldRawOp::Delete { shard, id } => RawOp::Delete { shard, id },
    });
    let raw = super::RawBatch {
        request_key: raw.request_key,
        ops: ops.collect(),
    };
    Ok((checked(raw, batch_ops_max)?, fields))
}

fn check_no_duplicate_keys(bytes: &[u8]) -> Result<(), serde_json::Error> {
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
            let mut seen = Seen::default();
            while let Some(k) = a.next_key_seed(KeyStr)? {
                if !seen.insert(k.clone()) {
                    return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
                }
                a.next_value_seed(Dedup)?;
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde::de::DeserializeSeed::deserialize(Dedup, &mut de)?;
    de.end()
}

const VARIANTS: &[&str] = &["create", "delete"];
const CREATE_FIELDS: &[&str] = &["shard", "record"];
const DELETE_FIELDS: &[&str] = &["shard", "id"];

#[derive(Default)]
struct Fields {
    op: Option<String>,
    shard: Option<String>,
    record: Option<Value>,
    id: Option<Value>,
    unknown: Option<String>,
}

impl<'de> Deserialize<'de> for OldRawOp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<OldRawOp, D::Error> {
        d.deserialize_map(OpVisitor)
    }
}

struct OpVisitor;

impl<'de> Visitor<'de> for OpVisitor {
    type Value = OldRawOp;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an op object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OldRawOp, A::Error> {
        let mut f = Fields::default();
        while let Some(key) = map.next_key_seed(KeyStr)? {
            match key.as_ref() {
                "op" => f.op = Some(map.next_value()?),
                "shard" => f.shard = Some(map.next_value()?),
                "record" => f.record = Some(map.next_value()?),
                "id" => f.id = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    f.unknown.get_or_insert_with(|| key.into_owned());
                }
            }
        }
        f.into_op()
    }
}

impl Fields {
    fn into_op<E: de::Error>(self) -> Result<OldRawOp, E> {
        let op = self.op.ok_or_else(|| E::missing_field("op"))?;
        let (fields, extra) = match op.as_str() {
            "create" => (CREATE_FIELDS, self.id.as_ref().map(|_| "id")),
            "delete" => (DELETE_FIELDS, self.record.as_ref().map(|_| "record")),
            other => return Err(E::unknown_variant(other, VARIANTS)),
        };
        if let Some(name) = self.unknown.as_deref().or(extra) {
            return Err(E::unknown_field(name, fields));
        }
        let shard = self.shard.ok_or_else(|| E::missing_field("shard"))?;
        if op == "create" {
            let record = match self.record.ok_or_else(|| E::missing_field("record"))? {
                Value::Object(m) => m,
                other => Map::deserialize(other).map_err(E::custom)?,
            };
            return Ok(OldRawOp::Create { shard, record });
        }
        let id = self.id.ok_or_else(|| E::missing_field("id"))?;
        let id = u64::deserialize(id).map_err(E::custom)?;
        Ok(OldRawOp::Delete { shard, id })
    }
}

#[cfg(test)]
mod tests;
