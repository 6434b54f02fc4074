//! An object's keys while a batch is read: `KeyStr` (a key borrowed from the input when it
//! has no escapes) and `Seen` (the keys met so far, for duplicates). Shared by the one-pass
//! reader (`raw_op.rs`), the canonical writer (`canon.rs`) and the tests' oracle.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, Visitor};

/// An object key, borrowed from the input when it has no escapes (no allocation per key).
/// Also an op's `op`, with the message of a `String` that is not one.
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
    /// The keys `keys`, all distinct, seen.
    pub(super) fn of<'k>(keys: impl Iterator<Item = &'k Cow<'de, str>>) -> Seen<'de>
    where
        'de: 'k,
    {
        let mut seen = Seen::default();
        for k in keys {
            seen.insert(k.clone());
        }
        seen
    }

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
