//! A JSON value transcoded, as it is parsed, into its canonical bytes: what
//! `serde_json::to_vec` of the `serde_json::Value` it would parse into prints (objects'
//! keys sorted by their bytes, recursively, as serde_json's `Map`, a `BTreeMap`, orders
//! them; no whitespace), without building that tree. Duplicate keys are refused in every
//! object, at the key, with the message and position the old separate pass gave.
//!
//! Byte-identical by construction: numbers are printed by serde_json's own serializer from
//! exactly the `u64`, `i64` or `f64` that `Value` would have stored, and strings from the
//! `&str` it would have stored, by that serializer or, when they hold no byte it escapes,
//! copied as it would write them (a test compares with the old `Map` parse over a generated
//! corpus, `oracle.rs`). Nesting goes through `deserialize_any`, so serde_json's recursion
//! limit bounds it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::{Map, Value};

use super::object_keys::{KeyStr, Seen};

/// What one parse shares across its values: the canonical bytes being written, the entries
/// of the objects open at the moment (a stack: an object's above its parent's), and room to
/// reorder an object whose keys came unsorted.
#[derive(Default)]
pub(super) struct Scratch<'de> {
    pub(super) out: Vec<u8>,
    entries: Vec<Entry<'de>>,
    tmp: Vec<u8>,
}

/// One written `"key":value` of an open object: its key and where its bytes are in `out`.
struct Entry<'de> {
    key: Cow<'de, str>,
    start: usize,
    end: usize,
}

/// What a transcoded value was, for the type errors of a record or an id that is not what
/// it must be: [`Shape::stand_in`] is the `Value` serde would have seen, or one that gives
/// the same message.
pub(super) enum Shape {
    Map,
    Seq,
    Str,
    Scalar(Value),
}

impl Shape {
    /// A value with this shape's type error: a map's or a sequence's does not show its
    /// content; a string is read back from its canonical bytes `canon` (exact: JSON escapes
    /// round-trip); a scalar is itself.
    pub(super) fn stand_in(self, canon: &[u8]) -> Value {
        match self {
            Shape::Map => Value::Object(Map::new()),
            Shape::Seq => Value::Array(Vec::new()),
            Shape::Str => serde_json::from_slice(canon).unwrap_or(Value::Null),
            Shape::Scalar(v) => v,
        }
    }
}

/// The seed: appends the canonical bytes of one value to `scratch.out`.
pub(super) struct Canon<'a, 'de>(pub(super) &'a mut Scratch<'de>);

impl<'de> DeserializeSeed<'de> for Canon<'_, 'de> {
    type Value = Shape;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Shape, D::Error> {
        d.deserialize_any(self)
    }
}

/// `v` printed by serde_json's serializer (its escaping, its integers, its floats).
fn print<T: Serialize + ?Sized, E: de::Error>(out: &mut Vec<u8>, v: &T) -> Result<(), E> {
    serde_json::to_writer(out, v).map_err(E::custom)
}

impl<'de> Visitor<'de> for Canon<'_, 'de> {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Shape, E> {
        self.0
            .out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(Shape::Scalar(Value::Bool(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Shape, E> {
        print(&mut self.0.out, &v)?;
        Ok(Shape::Scalar(Value::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Shape, E> {
        print(&mut self.0.out, &v)?;
        Ok(Shape::Scalar(Value::from(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Shape, E> {
        print(&mut self.0.out, &v)?;
        // As `Value` does: a float that is not finite is null (serde_json parses none).
        Ok(Shape::Scalar(Value::from(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Shape, E> {
        write_str(&mut self.0.out, v)?;
        Ok(Shape::Str)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Shape, E> {
        self.0.out.extend_from_slice(b"null");
        Ok(Shape::Scalar(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        let s = self.0;
        s.out.push(b'[');
        let body = s.out.len();
        while seq.next_element_seed(Canon(&mut *s))?.is_some() {
            s.out.push(b',');
        }
        if s.out.len() > body {
            s.out.pop(); // the last element's comma
        }
        s.out.push(b']');
        Ok(Shape::Seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        let s = self.0;
        let base = s.entries.len();
        s.out.push(b'{');
        let body = s.out.len();
        // While the keys come in increasing order, none can repeat an earlier one; past the
        // first that does not, every key is checked against all before it.
        let mut seen: Option<Seen<'de>> = None;
        while let Some(key) = map.next_key_seed(KeyStr)? {
            let entries = &s.entries[base..];
            if seen.is_some() || entries.last().is_some_and(|e| key <= e.key) {
                let seen = seen.get_or_insert_with(|| Seen::of(entries.iter().map(|e| &e.key)));
                if !seen.insert(key.clone()) {
                    return Err(de::Error::custom(format!("duplicate key {key:?}")));
                }
            }
            if s.out.len() > body {
                s.out.push(b',');
            }
            let start = s.out.len();
            write_str(&mut s.out, &key)?;
            s.out.push(b':');
            map.next_value_seed(Canon(&mut *s))?;
            let end = s.out.len();
            s.entries.push(Entry { key, start, end });
        }
        if seen.is_some() {
            s.sort_entries(base, body);
        }
        s.entries.truncate(base);
        s.out.push(b'}');
        Ok(Shape::Map)
    }
}

/// `v` as serde_json writes a string. It escapes only `"`, `\` and the bytes below 0x20
/// (its `ESCAPE` table), so a string with none of them (most strings, and every one written
/// without an escape in the input) is copied between quotes rather than escaped byte by byte:
/// the same bytes, and a 4 KiB value costs a tenth as much. The check has no branch per byte.
fn write_str<E: de::Error>(out: &mut Vec<u8>, v: &str) -> Result<(), E> {
    let as_is = v
        .bytes()
        .fold(true, |ok, b| ok & (b >= 0x20) & (b != b'"') & (b != b'\\'));
    if !as_is {
        return print(out, v);
    }
    out.reserve(v.len() + 2);
    out.push(b'"');
    out.extend_from_slice(v.as_bytes());
    out.push(b'"');
    Ok(())
}

impl Scratch<'_> {
    /// Rewrites the object whose entries are `entries[base..]` and whose body starts at
    /// `out[body]` with its entries in key order (`String`'s order, that of serde_json's
    /// `Map`).
    fn sort_entries(&mut self, base: usize, body: usize) {
        let entries = &mut self.entries[base..];
        entries.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        self.tmp.clear();
        self.tmp.extend_from_slice(&self.out[body..]);
        self.out.truncate(body);
        for (i, e) in entries.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out
                .extend_from_slice(&self.tmp[e.start - body..e.end - body]);
        }
    }
}

/// The first JSON error of `bytes` in document order, a syntax error or a duplicate key, as
/// the old separate pass found it (the batch's own errors then come second; see
/// `super::parse_at`).
pub(super) fn first_json_error(bytes: &[u8]) -> Option<serde_json::Error> {
    let mut scratch = Scratch::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Canon(&mut scratch)
        .deserialize(&mut de)
        .and_then(|_| de.end())
        .err()
}

/// The top-level keys of `record`, a canonical record (none if it is not an object).
pub(super) fn top_level_keys(record: &[u8]) -> Vec<Cow<'_, str>> {
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Vec<Cow<'de, str>>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a record")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut keys = Vec::new();
            while let Some(k) = map.next_key_seed(KeyStr)? {
                map.next_value::<de::IgnoredAny>()?;
                keys.push(k);
            }
            Ok(keys)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(record);
    de.deserialize_map(Keys).unwrap_or_default()
}
