//! The configuration's keys as the structs define them: serde's derive hands every field name
//! of a struct to `deserialize_struct` (its `FIELDS`), and [`fields`] reads them there with a
//! deserializer that records them and stops. What is derived from the structs cannot drift
//! from them: `roost config check --print` walks these lists, and a test holds
//! `examples/roost.toml` to them (a field added without its line in the example fails it).

use serde::de::{self, Deserialize, Deserializer, Visitor};

use super::{ClusterConfig, Config, ReplicationConfig, ShardConfig};

/// Every section's keys: the top level, `[replication]`, `[cluster]`, `[shards.NAME]`.
pub struct Keys {
    pub top: &'static [&'static str],
    pub replication: &'static [&'static str],
    pub cluster: &'static [&'static str],
    pub shard: &'static [&'static str],
}

impl Keys {
    pub fn of_config() -> Keys {
        Keys {
            top: fields::<Config>(),
            replication: fields::<ReplicationConfig>(),
            cluster: fields::<ClusterConfig>(),
            shard: fields::<ShardConfig>(),
        }
    }
}

/// The field names of `T`'s derived `Deserialize`, in declaration order (empty for a type
/// that is not a struct).
pub fn fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut probe = Probe(None);
    // The probe always fails (it never produces a value): only the names it kept matter.
    let _ = T::deserialize(&mut probe);
    probe.0.unwrap_or(&[])
}

struct Probe(Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for &mut Probe {
    type Error = de::value::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(fields);
        Err(de::Error::custom("field names read"))
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    /// The keys an example file names, uncommented or commented out (`# key = value`), by
    /// section (`""`, `replication`, `cluster`, `shards.*`), and the file with every such
    /// line uncommented (so each commented key must also parse as a real key and value).
    fn example_keys(text: &str) -> (BTreeSet<(String, String)>, String) {
        let mut keys = BTreeSet::new();
        let mut uncommented = String::new();
        let (mut section, mut header) = (String::new(), String::new());
        let mut seen = BTreeSet::new();
        for line in text.lines() {
            let bare = line.strip_prefix('#').map_or(line, str::trim_start);
            let is_key = |l: &str| {
                l.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
            };
            if bare.starts_with('[') && bare.ends_with(']') {
                header = bare.trim_matches(['[', ']']).to_owned();
                section = header.clone();
                if section.starts_with("shards.") {
                    section = "shards.*".into();
                }
                uncommented += &format!("{bare}\n");
            } else if is_key(bare) {
                let key = bare.split_once(" = ").map_or("", |(k, _)| k);
                let fresh = seen.insert((header.clone(), key.to_owned()));
                assert!(fresh, "{header}.{key} is in the example twice");
                keys.insert((section.clone(), key.to_owned()));
                uncommented += &format!("{bare}\n");
            }
        }
        (keys, uncommented)
    }

    fn struct_keys() -> BTreeSet<(String, String)> {
        let k = Keys::of_config();
        let sections = ["replication", "cluster", "shards"];
        let top = k
            .top
            .iter()
            .filter(|f| !sections.contains(f))
            .map(|f| ("", *f));
        let nested = [
            ("replication", k.replication),
            ("cluster", k.cluster),
            ("shards.*", k.shard),
        ];
        let nested = nested
            .into_iter()
            .flat_map(|(s, fs)| fs.iter().map(move |f| (s, *f)));
        top.chain(nested)
            .map(|(s, f)| (s.to_owned(), f.to_owned()))
            .collect()
    }

    /// Goal: `examples/roost.toml`, the configuration reference, names every key of the
    /// config structs and no other, each with a value that parses (commented-out lines
    /// included). A field added to a struct without its line in the example fails here.
    #[test]
    fn the_example_names_every_key_of_the_structs() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/roost.toml");
        let text = std::fs::read_to_string(&path).expect("examples/roost.toml");
        let (example, uncommented) = example_keys(&text);
        let structs = struct_keys();
        let missing: Vec<_> = structs.difference(&example).collect();
        let unknown: Vec<_> = example.difference(&structs).collect();
        assert!(
            missing.is_empty(),
            "keys not in examples/roost.toml: {missing:?}"
        );
        assert!(
            unknown.is_empty(),
            "keys in examples/roost.toml that are no field: {unknown:?}"
        );
        toml::from_str::<Config>(&uncommented).unwrap_or_else(|e| {
            panic!("the example with every key uncommented: {e}\n{uncommented}")
        });
    }

    /// Goal: the comparison above can fail: a key missing from a text, a key no struct has.
    #[test]
    fn the_key_comparison_sees_a_missing_and_an_unknown_key() {
        assert!(fields::<Config>().contains(&"metrics_listen"));
        assert!(fields::<ShardConfig>().contains(&"record_bytes_max"));
        assert_eq!(fields::<u64>(), &[] as &[&str]);
        let (keys, _) = example_keys("# [replication]\n# listen = \"x:1\"\nnot_a_field = 1\n");
        assert!(keys.contains(&("replication".into(), "listen".into())));
        assert!(keys.contains(&("replication".into(), "not_a_field".into())));
        assert!(!struct_keys().contains(&("replication".into(), "not_a_field".into())));
        assert!(struct_keys().contains(&("".into(), "umask".into())));
    }
}
