//! The tests of `config.rs`.

use super::*;

fn parsed(text: &str) -> Result<Config, ConfigError> {
    let mut c: Config = toml::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
    c.name_from_cluster();
    c.validate().map(|()| c)
}

/// Goal: `[cluster]` is checked whole (issue 27): etcd URLs, TLS files all or none and
/// matching the scheme, the lease's range, `advertise`, the prefix; it needs `listen`,
/// excludes `follow`, and its name is the replication name.
#[test]
fn cluster_settings_are_validated() {
    let good = "[replication]\nlisten = \"127.0.0.1:7400\"\n[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nname = \"a\"\nadvertise = \"127.0.0.1:7400\"\n";
    let c = parsed(good).expect("a valid cluster");
    assert_eq!(
        c.replication.node_name(),
        "a",
        "the cluster name is the replication name"
    );
    let cl = c.cluster.as_ref().expect("cluster");
    assert_eq!((cl.lease_ms, cl.prefix.as_str()), (3000, "/roost/default"));
    assert_eq!(cl.margin(), Duration::from_millis(750));
    let bad = [
        (good.replace("listen = \"127.0.0.1:7400\"\n", ""), "listen"),
        (format!("{good}lease_ms = 500\n"), "lease_ms"),
        (good.replace("http://", "ftp://"), "http"),
        (good.replace("http://", "https://"), "etcd_ca"),
        (format!("{good}etcd_cert = \"c.pem\"\n"), "together"),
        (
            good.replace("advertise = \"127.0.0.1:7400\"", "advertise = \"nowhere\""),
            "HOST:PORT",
        ),
        (format!("{good}prefix = \"roost/\"\n"), "prefix"),
        (
            good.replace(
                "[replication]\n",
                "[replication]\nfollow = \"127.0.0.1:1\"\nname = \"b\"\n",
            ),
            "follow",
        ),
        (
            good.replace("[replication]\n", "[replication]\nname = \"b\"\n"),
            "differ",
        ),
    ];
    for (text, needle) in bad {
        match parsed(&text) {
            Err(e) => assert!(e.to_string().contains(needle), "{needle}: {e}"),
            Ok(_) => panic!("accepted ({needle}): {text}"),
        }
    }
}

/// Goal: plain TCP only on loopback unless `insecure`; TLS all three files or none,
/// with members holding this node's name (issue 26).
#[test]
fn replication_security_is_validated() {
    let load = |text: &str| {
        let text = format!("[replication]\nname = \"a\"\n{text}");
        toml::from_str::<Config>(&text).expect("toml").validate()
    };
    for ok in [
        "127.0.0.1:7400",
        "127.9.9.9:1",
        "[::1]:7400",
        "localhost:7400",
        "LOCALHOST:1",
    ] {
        assert!(load(&format!("listen = \"{ok}\"")).is_ok(), "{ok}");
    }
    for public in [
        "0.0.0.0:7400",
        "[::]:7400",
        "10.0.0.1:7400",
        "localhost.example.com:1",
        "db1:7400",
    ] {
        let e = load(&format!("listen = \"{public}\"")).expect_err(public);
        assert!(e.to_string().contains("insecure = true"), "{e}");
        let e = load(&format!("follow = \"{public}\"")).expect_err(public);
        assert!(e.to_string().contains("replication.follow"), "{e}");
        assert!(load(&format!("listen = \"{public}\"\ninsecure = true")).is_ok());
    }
    let tls =
        "listen = \"0.0.0.0:1\"\ntls_cert = \"a.pem\"\ntls_key = \"a.key\"\ntls_ca = \"ca.pem\"";
    assert!(load(&format!("{tls}\nmembers = [\"a\", \"b\"]")).is_ok());
    let e = load(tls).expect_err("TLS without members");
    assert!(e.to_string().contains("members"), "{e}");
    let e = load(&format!("{tls}\nmembers = [\"b\"]")).expect_err("name not a member");
    assert!(
        e.to_string().contains("does not hold this node's name"),
        "{e}"
    );
    let e = load("listen = \"0.0.0.0:1\"\ntls_cert = \"a.pem\"").expect_err("one of three");
    assert!(e.to_string().contains("go together"), "{e}");
}

/// Goal: a bulk line may not be longer than a batch file (the WAL's claim size bound
/// rests on it), and the bulk counts must be positive.
#[test]
fn bulk_limits_are_validated() {
    let load = |text: &str| toml::from_str::<Config>(text).expect("toml").validate();
    assert!(load("").is_ok());
    assert_eq!(Config::default().bulk_line_bytes(), 16 << 20);
    assert!(load("bulk_line_bytes_max = 1024").is_ok());
    let e = load("bulk_line_bytes_max = 16777217").expect_err("over the file limit");
    assert!(e.to_string().contains("spool_file_bytes_max"), "{e}");
    assert!(load("bulk_in_flight = 0").is_err());
    assert!(load("bulk_group_lines = 0").is_err());
    assert!(load("spool_group_files = 0").is_err());
    assert!(load("bulk_lines_max = 0").is_err());
    assert!(load("bulk_files_in_flight_max = 0").is_err());
    let small: Config = toml::from_str("spool_file_bytes_max = 100").expect("toml");
    assert_eq!(
        small.bulk_line_bytes(),
        100,
        "follows the file limit by default"
    );
}

/// Goal: `intake_bytes_max` defaults to 256 MiB or the largest single input, and a bound
/// one bulk file or one stream line would not fit in is refused, naming the limits.
#[test]
fn intake_bytes_max_fits_one_input_of_each() {
    let parse = |text: &str| toml::from_str::<Config>(text).expect("toml");
    assert_eq!(Config::default().intake_bytes(), 256 << 20);
    assert_eq!(
        parse("bulk_file_bytes_max = 1073741824").intake_bytes(),
        1 << 30
    );
    assert_eq!(
        parse("intake_bytes_max = 67108864").intake_bytes(),
        64 << 20
    );
    assert!(parse("intake_bytes_max = 67108864").validate().is_ok());
    let e = parse("intake_bytes_max = 67108863")
        .validate()
        .expect_err("below bulk_file_bytes_max");
    assert!(
        e.to_string().contains("bulk_file_bytes_max (67108864)"),
        "{e}"
    );
    let small = "intake_bytes_max = 65536\nbulk_file_bytes_max = 65536\n";
    let e = parse(small)
        .validate()
        .expect_err("below the stream line limit");
    assert!(
        e.to_string().contains("stream line limit (16777216)"),
        "{e}"
    );
    let fits = format!("{small}stream_line_bytes_max = 65536\n");
    assert!(parse(&fits).validate().is_ok());
}

/// Goal: `shards_max` is positive and at least the number of declared shards.
#[test]
fn shards_max_is_positive_and_covers_the_declared_shards() {
    let load = |text: &str| toml::from_str::<Config>(text).expect("toml").validate();
    assert_eq!(Config::default().shards_max, 1024);
    let e = load("shards_max = 0").expect_err("0 is refused");
    assert!(e.to_string().contains("shards_max"), "{e}");
    assert!(load("shard_threads = 0").is_err());
    assert!(load("shards_max = 2\n[shards.a]\n[shards.b]\n").is_ok());
    assert_eq!(Config::default().shard_idle_close_ms, 60_000);
    assert!(load("shard_idle_close_ms = 0").is_ok(), "0: never closed");
    assert!(load("shard_idle_close_ms = 100").is_ok());
    let e = load("shard_idle_close_ms = 99").expect_err("below the minimum");
    assert!(e.to_string().contains("shard_idle_close_ms = 99"), "{e}");
    let e = load("shards_max = 1\n[shards.a]\n[shards.b]\n").expect_err("2 over 1");
    assert!(e.to_string().contains("shards_max = 1"), "{e}");
}

/// Goal (issue 44): the index a shard holds in memory is bounded by a key, 0 or at least
/// the minimum.
#[test]
fn shard_index_entries_max_is_0_or_at_least_the_minimum() {
    let load = |text: &str| toml::from_str::<Config>(text).expect("toml").validate();
    assert_eq!(Config::default().shard_index_entries_max, 131_072);
    assert!(
        load("shard_index_entries_max = 0").is_ok(),
        "0: roll when full"
    );
    assert!(load("shard_index_entries_max = 64").is_ok());
    let e = load("shard_index_entries_max = 63").expect_err("below the minimum");
    assert!(
        e.to_string().contains("shard_index_entries_max = 63"),
        "{e}"
    );
}

#[test]
fn durability_rounds_are_bounded() {
    let load = |text: &str| toml::from_str::<Config>(text).expect("toml").validate();
    let d = Config::default();
    assert_eq!((d.tail_round_claims, d.tail_round_ms), (64, 100));
    assert!(load("tail_round_claims = 1\ntail_round_ms = 1").is_ok());
    assert!(load("tail_round_claims = 65536").is_ok());
    for bad in [
        "tail_round_claims = 0",
        "tail_round_claims = 65537",
        "tail_round_ms = 0",
    ] {
        let e = load(bad).expect_err(bad);
        assert!(e.to_string().contains("tail_round_claims"), "{bad}: {e}");
    }
}

#[test]
fn streamed_batches_running_follow_batches_in_flight_unless_set() {
    assert_eq!(Config::default().stream_batches_running(), 256);
    let small: Config = toml::from_str("batches_in_flight_max = 8").expect("small");
    assert_eq!(small.stream_batches_running(), 32);
    let set: Config = toml::from_str("stream_batches_running_max = 5").expect("set");
    assert_eq!(set.stream_batches_running(), 5);
    let zero: Config = toml::from_str("stream_batches_running_max = 0").expect("zero");
    let e = zero.validate().expect_err("0 is refused").to_string();
    assert!(e.contains("stream_batches_running_max"), "{e}");
}

#[test]
fn the_commented_example_loads_and_result_sync_parses() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/roost.toml");
    let cfg = Config::load(&example).expect("examples/roost.toml is a valid config");
    assert_eq!(cfg.result_sync, ResultSync::Fsync);
    assert_eq!(Config::default().result_sync, ResultSync::Fsync);
    let cfg: Config = toml::from_str("result_sync = \"syncfs\"").expect("syncfs");
    assert_eq!(cfg.result_sync, ResultSync::Syncfs);
    let e = toml::from_str::<Config>("result_sync = \"sometimes\"")
        .expect_err("an unknown mode is an error")
        .to_string();
    assert!(e.contains("sometimes") && e.contains("fsync"), "{e}");
}
