//! `roost config check [--print]` (issue 43): the configuration checked as `serve` checks it,
//! and shown with where each value came from; a bad metrics web configuration stops `serve`
//! and `config check` with exit 78, naming the file and the key.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Output};

/// `roost ARGS` with `env` set and systemd's directories unset unless `env` sets them.
fn roost(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("STATE_DIRECTORY")
        .env_remove("RUNTIME_DIRECTORY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run roost")
}

/// The printed line for `key`: its value and its source (the text after `#`), spaces
/// squeezed.
fn entry(out: &str, key: &str) -> String {
    out.lines()
        .find(|l| {
            l.starts_with(&format!("{key} = ")) || l.starts_with(&format!("# {key} is unset"))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| panic!("no line for {key} in\n{out}"))
}

/// `config check --print` of a file setting `batch_ops_max`, `spool_dir` and
/// `replication.ack`, with `--spool-dir` and systemd's `STATE_DIRECTORY` and
/// `RUNTIME_DIRECTORY`: its output and the file's path.
fn printed_with_sources(dir: &Path) -> (String, String) {
    let cfg = dir.join("roost.toml");
    let text = "batch_ops_max = 7\nspool_dir = \"/from/file\"\n[replication]\nack = \"local\"\n";
    std::fs::write(&cfg, text).expect("config");
    let c = cfg.to_str().expect("utf-8").to_owned();
    let env = [
        ("STATE_DIRECTORY", "/var/lib/roost"),
        ("RUNTIME_DIRECTORY", "/run/roost"),
    ];
    let args = [
        "config",
        "check",
        "--print",
        "--config",
        &c,
        "--spool-dir",
        "/from/flag",
    ];
    let out = roost(&args, &env);
    assert!(out.status.success(), "{out:?}");
    (String::from_utf8(out.stdout).expect("utf-8"), c)
}

/// Goal: each value says where it came from: the file, a flag over the file, the
/// environment systemd sets, a default and a derived default; the printed text is itself a
/// configuration `roost` accepts.
/// Method: a file setting two keys, `--spool-dir` over its `spool_dir`, `STATE_DIRECTORY`
/// for `data_dir`, `RUNTIME_DIRECTORY` for the sockets; then the output fed back as --config.
#[test]
fn config_check_print_says_where_each_value_came_from() {
    let t = tempfile::tempdir().expect("tempdir");
    let (text, c) = printed_with_sources(t.path());
    let file = |rest: &str| format!("{rest} # file {c}");
    let expected = [
        ("batch_ops_max", file("batch_ops_max = 7")),
        (
            "spool_dir",
            "spool_dir = \"/from/flag\" # flag --spool-dir".into(),
        ),
        (
            "data_dir",
            "data_dir = \"/var/lib/roost\" # env STATE_DIRECTORY".into(),
        ),
        (
            "control_socket",
            "control_socket = \"/run/roost/roost.sock\" # env RUNTIME_DIRECTORY".into(),
        ),
        (
            "batches_in_flight_max",
            "batches_in_flight_max = 64 # default".into(),
        ),
        (
            "stream_batches_running_max",
            "stream_batches_running_max = 256 # default: 4 x batches_in_flight_max".into(),
        ),
        (
            "metrics_listen",
            "# metrics_listen is unset # default".into(),
        ),
        ("ack", file("ack = \"local\"")),
    ];
    for (key, line) in expected {
        assert_eq!(entry(&text, key), line, "in\n{text}");
    }
    let printed = t.path().join("printed.toml");
    std::fs::write(&printed, &text).expect("write");
    let again = roost(
        &[
            "config",
            "check",
            "--config",
            printed.to_str().expect("utf-8"),
        ],
        &[],
    );
    assert!(
        again.status.success(),
        "the printed configuration is refused: {again:?}\n{text}"
    );
    let plain = roost(&["config", "check"], &[]);
    assert!(
        String::from_utf8_lossy(&plain.stdout).contains("configuration ok: the embedded default"),
        "{plain:?}"
    );
}

/// Goal: a metrics web configuration that cannot be used is a configuration error (exit 78)
/// naming the file and what is wrong, for `config check` and for `serve` before it opens
/// the data directory; so is a web configuration without a listener.
#[test]
fn a_bad_metrics_web_config_exits_78() {
    let t = tempfile::tempdir().expect("tempdir");
    let web = t.path().join("web.yml");
    let cfg = t.path().join("roost.toml");
    let c = cfg.to_str().expect("utf-8");
    let data = t.path().join("data");
    let listen = "metrics_listen = \"127.0.0.1:1\"\n";
    for (yml, toml, needle) in [
        (
            "tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n",
            listen,
            "missing.pem",
        ),
        (
            "basic_auth_users:\n  prometheus: plaintext\n",
            listen,
            "not a bcrypt hash",
        ),
        (
            "http_server_config:\n  http2: true\n",
            listen,
            "http_server_config: not supported",
        ),
        ("", "", "without metrics_listen"),
    ] {
        std::fs::write(&web, yml).expect("web.yml");
        std::fs::write(
            &cfg,
            format!("{toml}metrics_web_config = \"{}\"\n", web.display()),
        )
        .expect("config");
        for args in [
            vec!["config", "check", "--config", c],
            vec!["serve", "--config", c],
        ] {
            let out = roost_at(&data, &args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(78), "{args:?} {needle}: {err}");
            assert!(err.contains(needle), "{args:?}: {needle:?} not in {err}");
        }
        assert!(
            !Path::new(&data).join("wal").exists(),
            "serve opened the data directory"
        );
    }
}
