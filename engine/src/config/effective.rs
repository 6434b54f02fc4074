//! `roost config check --print`: the effective configuration as TOML, every key of every
//! section (walked from the structs' own field lists, `keys.rs`), each line saying where its
//! value came from: the embedded `default` (with how a derived default is derived), the
//! configuration `file`, the `env`ironment systemd sets (`STATE_DIRECTORY`,
//! `RUNTIME_DIRECTORY`), or a command-line `flag`. A key whose value is unset is printed
//! commented out. Reads nothing but what it is given (and the environment); never changes
//! the configuration.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::key_names::Keys;
use super::Config;

/// Where the values came from besides the defaults.
pub struct Origin<'a> {
    /// The configuration file and its keys as written.
    pub file: Option<(&'a Path, toml::Table)>,
    /// Keys a command-line flag set, with the flag (`("data_dir", "--data-dir")`).
    pub flags: Vec<(&'static str, &'static str)>,
}

/// Where one value came from.
enum Source {
    Default,
    /// A default derived from other values or the host, and how.
    Derived(&'static str),
    File,
    Env(&'static str),
    Flag(&'static str),
}

/// The effective configuration `cfg`, which `origin` describes, as commented TOML.
pub fn render(cfg: &Config, origin: &Origin) -> String {
    let json = serde_json::to_value(cfg).unwrap_or(Value::Null);
    let keys = Keys::of_config();
    let mut out = String::from(
        "# The effective configuration: every key, and after it where its value came from\n# (default, file, env, flag). Unset keys are commented out.\n",
    );
    let sections = ["replication", "cluster", "shards"];
    for key in keys.top.iter().filter(|k| !sections.contains(k)) {
        let (value, source) = top_value(cfg, origin, key, json.get(*key));
        line(&mut out, origin, key, value, source);
    }
    out += "\n[replication]\n";
    for key in keys.replication {
        let (value, source) = replication_value(cfg, origin, key, &json["replication"]);
        line(&mut out, origin, key, value, source);
    }
    out += "\n";
    match &cfg.cluster {
        None => out += "# [cluster] is unset: no automatic failover   # default\n",
        Some(_) => {
            out += "[cluster]\n";
            for key in keys.cluster {
                let v = json["cluster"].get(*key).cloned();
                let source = in_file(origin, &["cluster", key]);
                line(&mut out, origin, key, v, source);
            }
        }
    }
    shards(&mut out, cfg, origin, keys.shard, &json["shards"]);
    out
}

/// `[shards.NAME]` tables, or a line saying none is declared.
fn shards(out: &mut String, cfg: &Config, origin: &Origin, keys: &[&str], json: &Value) {
    if cfg.shards.is_empty() {
        *out +=
            "\n# [shards.NAME] none declared: any valid name is created on first use   # default\n";
    }
    for name in cfg.shards.keys() {
        let _ = writeln!(out, "\n[shards.{name}]");
        for key in keys {
            let v = json[name].get(*key).cloned();
            let source = in_file(origin, &["shards", name, key]);
            line(out, origin, key, v, source);
        }
    }
}

/// A top-level key's value and source; derived defaults resolved.
fn top_value(
    cfg: &Config,
    origin: &Origin,
    key: &str,
    v: Option<&Value>,
) -> (Option<Value>, Source) {
    if let Some((_, flag)) = origin.flags.iter().find(|(k, _)| *k == key) {
        return (v.cloned(), Source::Flag(flag));
    }
    if let Source::File = in_file(origin, &[key]) {
        return (v.cloned(), Source::File);
    }
    let path = |p: &Path| Some(Value::String(p.display().to_string()));
    let number = |n: u64| Some(Value::from(n));
    let runtime = std::env::var_os("RUNTIME_DIRECTORY").is_some_and(|v| !v.is_empty());
    let socket = |name: &str, how: &'static str| {
        let p = super::runtime_socket(None, name, &cfg.data_dir);
        let source = if runtime {
            Source::Env("RUNTIME_DIRECTORY")
        } else {
            Source::Derived(how)
        };
        (path(&p), source)
    };
    match key {
        "data_dir" if std::env::var_os("STATE_DIRECTORY").is_some_and(|v| !v.is_empty()) => {
            (v.cloned(), Source::Env("STATE_DIRECTORY"))
        }
        "spool_dir" => (path(&cfg.spool_dir()), Source::Derived("<data_dir>/spool")),
        "control_socket" => socket("roost.sock", "<data_dir>/roost.sock"),
        "stream_socket" => socket("stream.sock", "<data_dir>/stream.sock"),
        "bulk_line_bytes_max" => (
            number(cfg.bulk_line_bytes()),
            Source::Derived("spool_file_bytes_max"),
        ),
        "stream_line_bytes_max" => (
            number(cfg.stream_line_bytes() as u64),
            Source::Derived("spool_file_bytes_max"),
        ),
        "stream_batches_running_max" => (
            number(cfg.stream_batches_running() as u64),
            Source::Derived("4 x batches_in_flight_max"),
        ),
        _ => (v.cloned(), Source::Default),
    }
}

/// A `[replication]` key's value and source; the name and node id resolved.
fn replication_value(
    cfg: &Config,
    origin: &Origin,
    key: &str,
    json: &Value,
) -> (Option<Value>, Source) {
    let v = json.get(key).cloned();
    if let Source::File = in_file(origin, &["replication", key]) {
        return (v, Source::File);
    }
    let r = &cfg.replication;
    match key {
        "name" if in_file(origin, &["cluster", "name"]).is_file() => {
            (v, Source::Derived("cluster.name"))
        }
        "name" => (
            Some(Value::String(r.node_name())),
            Source::Derived("the host name"),
        ),
        "node_id" => (Some(Value::from(r.node_id())), Source::Derived("from name")),
        _ => (v, Source::Default),
    }
}

impl Source {
    fn is_file(&self) -> bool {
        matches!(self, Source::File)
    }
}

/// `File` when the configuration file sets the key at `path`, else `Default`.
fn in_file(origin: &Origin, path: &[&str]) -> Source {
    let Some((_, table)) = &origin.file else {
        return Source::Default;
    };
    let mut item = table.get(path[0]);
    for p in &path[1..] {
        item = item.and_then(|i| i.get(*p));
    }
    match item {
        Some(_) => Source::File,
        None => Source::Default,
    }
}

/// `key = value   # source`, or the key commented out when unset.
fn line(out: &mut String, origin: &Origin, key: &str, value: Option<Value>, source: Source) {
    let source = match source {
        Source::Default => "default".to_owned(),
        Source::Derived(how) => format!("default: {how}"),
        Source::File => match &origin.file {
            Some((p, _)) => format!("file {}", p.display()),
            None => "file".to_owned(),
        },
        Source::Env(name) => format!("env {name}"),
        Source::Flag(flag) => format!("flag {flag}"),
    };
    let text = match value {
        None | Some(Value::Null) => format!("# {key} is unset"),
        Some(Value::Number(n)) if key == "umask" => {
            format!("{key} = 0o{:03o}", n.as_u64().unwrap_or(0))
        }
        Some(v) => format!("{key} = {}", toml_value(&v)),
    };
    let _ = writeln!(out, "{text:<44} # {source}");
}

/// A JSON value as a TOML value (strings keep JSON's escapes, which TOML's basic strings
/// share).
fn toml_value(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(toml_value).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k} = {}", toml_value(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: each source is named where it applies: a flag over the file, the file's keys,
    /// a derived default, an unset key commented out, the umask in octal, a declared shard
    /// from the file; the printed text parses back to the same configuration.
    #[test]
    fn each_value_says_where_it_came_from() {
        let text = "batch_ops_max = 7\ndata_dir = \"/from/file\"\numask = 0o022\n[replication]\nname = \"a\"\n[shards.users]\nrecord_bytes_max = 512\n";
        let table: toml::Table = toml::from_str(text).expect("table");
        let mut cfg: Config = toml::from_str(text).expect("config");
        cfg.data_dir = "/from/flag".into();
        let origin = Origin {
            file: Some((Path::new("/etc/roost/roost.toml"), table)),
            flags: vec![("data_dir", "--data-dir")],
        };
        let out = render(&cfg, &origin);
        let has = |l: &str| {
            out.lines().any(|x| {
                x.split_whitespace().collect::<Vec<_>>() == l.split_whitespace().collect::<Vec<_>>()
            })
        };
        for l in [
            "data_dir = \"/from/flag\" # flag --data-dir",
            "batch_ops_max = 7 # file /etc/roost/roost.toml",
            "batches_in_flight_max = 64 # default",
            "spool_dir = \"/from/flag/spool\" # default: <data_dir>/spool",
            "umask = 0o022 # file /etc/roost/roost.toml",
            "# audit_retain_bytes is unset # default",
            "name = \"a\" # file /etc/roost/roost.toml",
            "record_bytes_max = 512 # file /etc/roost/roost.toml",
            "trigger_timeout_ms = 5000 # default",
            "# [cluster] is unset: no automatic failover # default",
        ] {
            assert!(has(l), "no line {l:?} in\n{out}");
        }
        let back: Config = toml::from_str(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
        assert_eq!(back.data_dir, cfg.data_dir);
        assert_eq!((back.batch_ops_max, back.umask), (7, 0o022));
        assert_eq!(back.shards, cfg.shards);
        assert_eq!(back.replication.name.as_deref(), Some("a"));
        assert_eq!(back.replication.node_id(), cfg.replication.node_id());
    }
}
