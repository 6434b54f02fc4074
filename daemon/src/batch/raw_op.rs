//! `RawOp`'s deserializer: one pass over the op object, fields in any order, and the
//! messages serde's derive would give (`missing field`, `unknown field`, `unknown variant`,
//! the type errors of `u64` and of a map), with no intermediate tree.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::RawOp;

const VARIANTS: &[&str] = &["create", "delete"];
const CREATE_FIELDS: &[&str] = &["shard", "record"];
const DELETE_FIELDS: &[&str] = &["shard", "id"];

/// The fields of one op object as read; which ones belong is decided by `op` at the end.
#[derive(Default)]
struct Fields {
    op: Option<String>,
    shard: Option<String>,
    record: Option<Value>,
    id: Option<Value>,
    /// The first field that belongs to no op.
    unknown: Option<String>,
}

impl<'de> Deserialize<'de> for RawOp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawOp, D::Error> {
        d.deserialize_map(OpVisitor)
    }
}

struct OpVisitor;

impl<'de> Visitor<'de> for OpVisitor {
    type Value = RawOp;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an op object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawOp, A::Error> {
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
    fn into_op<E: de::Error>(self) -> Result<RawOp, E> {
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
            return Ok(RawOp::Create { shard, record });
        }
        let id = self.id.ok_or_else(|| E::missing_field("id"))?;
        let id = u64::deserialize(id).map_err(E::custom)?;
        Ok(RawOp::Delete { shard, id })
    }
}

/// An object key, borrowed from the input when it has no escapes (no allocation per key).
pub(super) struct KeyStr;

impl<'de> DeserializeSeed<'de> for KeyStr {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyStr {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// The keys of one object seen so far: a short list while the object is small (no hashing,
/// no allocation beyond the list), a set once it is not (a hostile object of many keys must
/// not cost a quadratic scan).
#[derive(Default)]
pub(super) struct Seen<'de> {
    few: Vec<Cow<'de, str>>,
    many: HashSet<Cow<'de, str>>,
}

/// Past this many keys, [`Seen`] hashes.
const FEW_KEYS: usize = 16;

impl<'de> Seen<'de> {
    /// False when `k` was seen before.
    pub(super) fn insert(&mut self, k: Cow<'de, str>) -> bool {
        if !self.many.is_empty() {
            return self.many.insert(k);
        }
        if self.few.contains(&k) {
            return false;
        }
        self.few.push(k);
        if self.few.len() > FEW_KEYS {
            self.many.extend(self.few.drain(..));
        }
        true
    }
}
