//! `RawBatch`'s and `RawOp`'s deserializers: one pass over the batch, fields in any order,
//! each record transcoded to its canonical bytes as it is read (`canon.rs`), a duplicate key
//! refused where it is met, and the messages serde's derive would give (`missing field`,
//! `unknown field`, `unknown variant`, `invalid length`, the type errors of a string, a
//! sequence, a `u64` and of a map), with no intermediate tree.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::canon::{Canon, Scratch, Shape};
use super::object_keys::{KeyStr, Seen};

/// A batch as written: `{"request_key":..,"ops":[..]}`, nothing else. Read by hand
/// (below), with the messages serde's derive (`deny_unknown_fields`) gave.
#[derive(Debug)]
pub(super) struct RawBatch {
    pub(super) request_key: String,
    pub(super) ops: Vec<RawOp>,
}

/// One op as written: `{"op":"create","shard":..,"record":{..}}` or
/// `{"op":"delete","shard":..,"id":N}`, fields in any order, nothing else. Deserialized by
/// hand (below) rather than as serde's internally tagged enum, which buffers every op
/// (its record included) into an intermediate tree before reading it again: a fifth of the
/// CPU of a bulk file's run went to parsing (issue 16). The messages are serde's own.
#[derive(Debug)]
pub(super) enum RawOp {
    /// `record` already canonical.
    Create {
        shard: String,
        record: Vec<u8>,
    },
    Delete {
        shard: String,
        id: u64,
    },
}

const BATCH_FIELDS: &[&str] = &["request_key", "ops"];
const VARIANTS: &[&str] = &["create", "delete"];
const CREATE_FIELDS: &[&str] = &["shard", "record"];
const DELETE_FIELDS: &[&str] = &["shard", "id"];

/// The batch in `bytes` (nothing after it but whitespace), in one pass. `Ok` only if `bytes`
/// are UTF-8: every string is read, and checked, and JSON outside strings is ASCII.
pub(super) fn read(bytes: &[u8]) -> Result<RawBatch, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let raw = de.deserialize_struct("RawBatch", BATCH_FIELDS, BatchVisitor)?;
    de.end()?;
    Ok(raw)
}

fn duplicate<E: de::Error>(key: &str) -> E {
    E::custom(format!("duplicate key {key:?}"))
}

/// `{"request_key":..,"ops":[..]}`, or the two in a sequence as serde's derive of a struct
/// reads one (so did the parse before this one).
struct BatchVisitor;

impl<'de> Visitor<'de> for BatchVisitor {
    type Value = RawBatch;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct RawBatch")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawBatch, A::Error> {
        let length = |n| de::Error::invalid_length(n, &"struct RawBatch with 2 elements");
        let request_key = seq.next_element::<String>()?.ok_or_else(|| length(0))?;
        let mut scratch = Scratch::default();
        let ops = seq.next_element_seed(Ops(&mut scratch))?;
        let ops = ops.ok_or_else(|| length(1))?;
        Ok(RawBatch { request_key, ops })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawBatch, A::Error> {
        let mut scratch = Scratch::default();
        let (mut request_key, mut ops) = (None, None);
        while let Some(key) = map.next_key_seed(KeyStr)? {
            match key.as_ref() {
                "request_key" if request_key.is_none() => request_key = Some(map.next_value()?),
                "ops" if ops.is_none() => ops = Some(map.next_value_seed(Ops(&mut scratch))?),
                "request_key" | "ops" => return Err(duplicate(&key)),
                other => return Err(de::Error::unknown_field(other, BATCH_FIELDS)),
            }
        }
        let request_key = request_key.ok_or_else(|| de::Error::missing_field("request_key"))?;
        let ops = ops.ok_or_else(|| de::Error::missing_field("ops"))?;
        Ok(RawBatch { request_key, ops })
    }
}

/// The `ops` sequence, its ops sharing one [`Scratch`].
struct Ops<'a, 'de>(&'a mut Scratch<'de>);

impl<'de> DeserializeSeed<'de> for Ops<'_, 'de> {
    type Value = Vec<RawOp>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<RawOp>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Ops<'_, 'de> {
    type Value = Vec<RawOp>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<RawOp>, A::Error> {
        let mut ops = Vec::new();
        while let Some(op) = seq.next_element_seed(OpSeed(&mut *self.0))? {
            ops.push(op);
        }
        Ok(ops)
    }
}

/// One op: `{"op":"create","shard":..,"record":{..}}` or `{"op":"delete","shard":..,"id":N}`.
struct OpSeed<'a, 'de>(&'a mut Scratch<'de>);

impl<'de> DeserializeSeed<'de> for OpSeed<'_, 'de> {
    type Value = RawOp;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<RawOp, D::Error> {
        d.deserialize_map(self)
    }
}

/// The fields of one op object as read; which ones belong is decided by `op` at the end.
#[derive(Default)]
struct Fields<'de> {
    op: Option<Cow<'de, str>>,
    shard: Option<String>,
    /// The canonical bytes of a map, or what stands in for anything else (its type error).
    record: Option<Result<Vec<u8>, Value>>,
    id: Option<Value>,
    /// The first field that belongs to no op.
    unknown: Option<String>,
    /// The fields that belong to no op (only to refuse one twice).
    others: Seen<'de>,
}

impl<'de> Visitor<'de> for OpSeed<'_, 'de> {
    type Value = RawOp;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an op object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawOp, A::Error> {
        let s = self.0;
        let mut f = Fields::default();
        while let Some(key) = map.next_key_seed(KeyStr)? {
            match key.as_ref() {
                "op" if f.op.is_none() => f.op = Some(map.next_value_seed(KeyStr)?),
                "shard" if f.shard.is_none() => f.shard = Some(map.next_value()?),
                "record" if f.record.is_none() => {
                    let shape = value(&mut map, s)?;
                    f.record = Some(match shape {
                        Shape::Map => Ok(s.out.clone()),
                        other => Err(other.stand_in(&s.out)),
                    });
                }
                "id" if f.id.is_none() => f.id = Some(value(&mut map, s)?.stand_in(&s.out)),
                "op" | "shard" | "record" | "id" => return Err(duplicate(&key)),
                _ => {
                    if !f.others.insert(key.clone()) {
                        return Err(duplicate(&key));
                    }
                    value(&mut map, s)?;
                    f.unknown.get_or_insert_with(|| key.into_owned());
                }
            }
        }
        f.into_op()
    }
}

/// The next value of `map`, its canonical bytes in `s.out` (alone), and its shape.
fn value<'de, A: MapAccess<'de>>(map: &mut A, s: &mut Scratch<'de>) -> Result<Shape, A::Error> {
    s.out.clear();
    map.next_value_seed(Canon(s))
}

impl Fields<'_> {
    fn into_op<E: de::Error>(self) -> Result<RawOp, E> {
        let op = self.op.ok_or_else(|| E::missing_field("op"))?;
        let (fields, extra) = match op.as_ref() {
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
                Ok(record) => record,
                // serde's message for a record that is not a map (what stands in is not one).
                Err(v) => {
                    let e = Map::deserialize(v).err();
                    return Err(e.map_or_else(|| E::custom("a record must be a map"), E::custom));
                }
            };
            return Ok(RawOp::Create { shard, record });
        }
        let id = self.id.ok_or_else(|| E::missing_field("id"))?;
        let id = u64::deserialize(id).map_err(E::custom)?;
        Ok(RawOp::Delete { shard, id })
    }
}
