//! Configuration: an embedded default that needs no file, optionally overridden by TOML
//! (`examples/roost.toml` is a commented example) and then by command-line flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod cluster_section;
pub mod effective;
pub mod key_names;
mod replication_section;
pub use cluster_section::{ClusterConfig, LEASE_MS_MAX, LEASE_MS_MIN};
pub use replication_section::{Ack, ReplicationConfig, Reseed, StandbyLost};

/// Limits and policies for one shard, from `[shards.NAME]`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    /// Largest record (canonical JSON bytes) a create may carry.
    #[serde(default = "default_record_bytes_max")]
    pub record_bytes_max: u32,
    /// Top-level fields every created record must have.
    #[serde(default)]
    pub required_fields: Vec<String>,
    /// Program and arguments run for each op with the op as JSON on stdin; no shell.
    #[serde(default)]
    pub before_trigger: Option<Vec<String>>,
    #[serde(default = "default_trigger_timeout_ms")]
    pub trigger_timeout_ms: u64,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            record_bytes_max: default_record_bytes_max(),
            required_fields: Vec::new(),
            before_trigger: None,
            trigger_timeout_ms: default_trigger_timeout_ms(),
        }
    }
}

fn default_record_bytes_max() -> u32 {
    64 << 10
}
fn default_trigger_timeout_ms() -> u64 {
    5_000
}

/// The whole configuration. Every field has a default.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub data_dir: PathBuf,
    /// Defaults to `<data_dir>/spool`.
    pub spool_dir: Option<PathBuf>,
    /// Ops in one batch at most.
    pub batch_ops_max: u32,
    /// A spool file larger than this is refused by its size, before it is read.
    pub spool_file_bytes_max: u64,
    /// Batches between intake and result at once (bounds threads, memory and open files).
    pub batches_in_flight_max: usize,
    /// Spool files found waiting together are run as groups of at most this many (one
    /// planner pass, one WAL fdatasync, their results published in one round:
    /// `Engine::submit`); a file that arrives alone is a group of one.
    pub spool_group_files: usize,
    /// A bulk file (`NAME.jsonl`, one batch per line) larger than this is refused by its size
    /// before it is read (it is read whole: this bounds its worker's memory).
    pub bulk_file_bytes_max: u64,
    /// A bulk file of more lines than this is refused whole, before any line is planned.
    pub bulk_lines_max: u64,
    /// A bulk file's line longer than this (without its newline) is an `invalid` result line
    /// for that line; the others go on [default: `spool_file_bytes_max`, which bounds it].
    pub bulk_line_bytes_max: Option<u64>,
    /// Lines of one bulk file in flight at once, in groups of `bulk_group_lines` (one thread
    /// per group).
    pub bulk_in_flight: usize,
    /// Lines planned and claimed as one group: one planner pass, one WAL fdatasync, one
    /// flush per touched shard and one audit sync for all of them (`pipeline/plan.rs`).
    pub bulk_group_lines: usize,
    /// Bulk files worked on at once (each read whole, with `bulk_in_flight` threads); one
    /// more waits in `new/` for the next rescan.
    pub bulk_files_in_flight_max: usize,
    /// Full rescan of `new/` this often; file-system events are only hints.
    pub rescan_interval_ms: u64,
    /// The WAL's, the audit log's and the key table's segments are at most this size; a new
    /// log's first segment is 1 MiB, and each next segment twice the last
    /// (`WalOptions::first_segment_bytes`).
    pub wal_segment_bytes: u64,
    /// A shard's segments are at most this size; a new shard's first segment and its spare
    /// are 64 KiB, and each next segment twice the last (`ShardOptions::first_segment_bytes`).
    pub shard_segment_bytes: u64,
    /// A shard's segment being written rolls once its index in memory holds this many
    /// entries (creates, frames and deletes; about 20 B each), so each open shard holds at
    /// most that much index in memory, and an open scans at most that many entries; a segment
    /// rolled early is cut to what it holds. 0: segments roll only when full.
    pub shard_index_entries_max: usize,
    /// Zeros written ahead of each log's and shard's end, this many bytes at a time (0:
    /// none): the preallocated space the next appends land in becomes written extents, so
    /// their syncs need no extent conversion (a journal commit on ext4). The logs' bytes
    /// reach the device twice (zeros, then data), as with PostgreSQL's `wal_init_zero`.
    pub zero_ahead_bytes: u64,
    /// `failed/` keeps at most this many quarantined files ...
    pub failed_files_max: usize,
    /// ... and this many bytes; past either, the oldest are removed first (with a log line).
    pub failed_bytes_max: u64,
    /// The process umask for everything `serve` creates (TOML octal: `umask = 0o027`). The
    /// default keeps files and directories from other users; `0o022` makes them
    /// world-readable.
    pub umask: u32,
    /// The control socket for `roost status` [default: $RUNTIME_DIRECTORY/roost.sock, else
    /// <data_dir>/roost.sock].
    pub control_socket: Option<PathBuf>,
    /// Serve Prometheus metrics and the health checks over HTTP on this address (e.g.
    /// "127.0.0.1:9187", or "0.0.0.0:9187" for a Prometheus elsewhere: then secure it with
    /// `metrics_web_config`). Off by default. The metrics are also on the control socket
    /// (`roost status --metrics`).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The metrics listener's TLS and basic auth: a web configuration file in the format
    /// Prometheus exporters read (exporter-toolkit's `web.yml`: `tls_server_config`,
    /// `basic_auth_users`; `control/http/web_config.rs`). Unset: plain HTTP, no password.
    pub metrics_web_config: Option<PathBuf>,
    /// Also export the deprecated metric names beside their new ones (docs/metrics.md,
    /// "Renamed"). Off by default: the old names are no longer served unless asked for.
    pub metrics_legacy_names: bool,
    /// How result files in `out/` are made durable before their inputs are removed; see
    /// [`ResultSync`].
    pub result_sync: ResultSync,
    /// Declared shards; when empty, any valid shard name is created on first use.
    pub shards: BTreeMap<String, ShardConfig>,
    /// Shards that may exist at most (on disk, and created by batches planned so far); a
    /// batch that would create one more is rejected, naming this limit, and writes nothing.
    /// Each shard costs a directory, two small files (its first segment and its spare grow
    /// from 64 KiB) and its owner's turns on the shard pool: 1024 of them take about 200 MiB
    /// of disk and, while in use, 2048 file descriptors (idle ones close:
    /// `shard_idle_close_ms`), far from what exhausts a machine, and far more
    /// than a configuration that declares its shards names (declared shards may not
    /// outnumber it).
    pub shards_max: usize,
    /// Threads shard owners run on, however many shards there are: each shard is still a
    /// single writer (one of these runs its round at a time), and a round never waits for
    /// another shard, so a few threads keep every shard's flushes going.
    pub shard_threads: usize,
    /// A shard idle this long (no message for it, nothing applied and not flushed, no turn
    /// waiting, no compaction under way) is closed by its owner: its maps, segment file
    /// descriptors and directory lock are released until the next message for it reopens it
    /// (recovering its segments, as a first open does). 0: never closed. Checked on the shard
    /// pool's ticks, so a shard closes up to 5 s past it.
    pub shard_idle_close_ms: u64,
    /// An answered batch's durability tail (its shards flushed, the audit log synced, then
    /// its `done` record) runs in a round shared with every batch answered since the last:
    /// a round runs once this many batches wait for one ...
    pub tail_round_claims: usize,
    /// ... or once the oldest has waited this long (checked on a tick of this period, so up
    /// to about twice it), and at once whenever a reused spool name, a checkpoint or a
    /// graceful stop needs one. An answer waits for a round only when its spool name is
    /// reused while the earlier batch under it waits for one.
    pub tail_round_ms: u64,
    /// A checkpoint is taken once this many WAL bytes were appended since the last one ...
    pub checkpoint_wal_bytes: u64,
    /// ... or this long after the last one (if anything was appended), and at a graceful
    /// stop. WAL segments wholly below a checkpoint are removed.
    pub checkpoint_interval_ms: u64,
    /// How long a request key is remembered after its batch was checkpointed: within it, the
    /// same key gets the original answer; after it, the same key is a new batch. A client
    /// that retries later than this must use a new key.
    pub request_key_window_secs: u64,
    /// What roost may hold in memory for what grows with use (issue 25): the request-key
    /// index's filters get half, the cache of keys not yet checkpointed a sixteenth (past it a
    /// checkpoint moves them to disk). Shard indexes and buffers are outside it (see
    /// docs/memory.md).
    pub memory_budget_bytes: u64,
    /// Keep at most this many bytes of audit log segments (the oldest go first, only below
    /// the last checkpoint); unset keeps everything.
    pub audit_retain_bytes: Option<u64>,
    /// Keep audit log segments at most this long (by file age; only below the last
    /// checkpoint); unset keeps everything.
    pub audit_retain_secs: Option<u64>,
    /// A sealed shard segment is rewritten without its deleted records once this fraction of
    /// it is dead (only batches below the last checkpoint are compacted).
    pub shard_compact_dead_fraction: f64,
    /// Compaction reads at most this many bytes per second per shard, and only while the
    /// shard is idle; 0 turns compaction off.
    pub shard_compact_bytes_per_sec: u64,
    /// Replication (`docs/replication.md`): off unless `listen` or `follow` is set.
    pub replication: ReplicationConfig,
    /// Automatic failover through etcd (`docs/cluster.md`): off unless set.
    pub cluster: Option<ClusterConfig>,
    /// The streaming intake's socket (docs/contract.md "Streaming intake") [default:
    /// $RUNTIME_DIRECTORY/stream.sock, else <data_dir>/stream.sock].
    pub stream_socket: Option<PathBuf>,
    /// Batches one stream connection may have between its request line and its answer
    /// line; at that many the daemon stops reading the connection until an answer is
    /// written (back-pressure: a client that does not read its answers stalls only itself).
    /// Two full groups of 64: one is claimed while the other's syncs run.
    pub stream_in_flight_max: usize,
    /// Stream connections open at once; one more is answered `unavailable` and closed.
    pub stream_connections_max: usize,
    /// A request line longer than this is skipped to its newline without being kept and
    /// answered `invalid` [default: `spool_file_bytes_max`].
    pub stream_line_bytes_max: Option<u64>,
    /// Streamed batches run at once or queued for the next group, all connections
    /// together (a connection's buffered lines, and other connections' that wait with
    /// them, go as one group of at most 64, at most four groups at once on a node that
    /// answers on its own, a thread per group) [default: 4 × `batches_in_flight_max`: four
    /// full groups of 64, so one group's syncs overlap the others' work].
    pub stream_batches_running_max: Option<usize>,
    /// Bytes of unanswered input each intake holds in memory at most (issue 44): bulk files
    /// read and not yet answered, all together, and stream lines read and not yet answered,
    /// all connections together (one connection at most its share: this over
    /// `stream_connections_max`, and always one line). A bulk file waits in `new/`, a stream
    /// connection is not read, until its bytes fit [default: 256 MiB, or the largest single
    /// input (`bulk_file_bytes_max`, the stream line limit) if larger].
    pub intake_bytes_max: Option<u64>,
}

/// How a round of result files is made durable (equally durable; they differ in cost and in
/// what else they wait for).
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ResultSync {
    /// One `fdatasync` per result file, issued by the batches' own workers concurrently (the
    /// journal commits them together), then the round's renames and one fsync of `out/`.
    /// Waits for nothing but roost's own files. The default.
    #[default]
    Fsync,
    /// One `syncfs` of the spool's file system per round, whatever the number of results in
    /// it, then the renames and one fsync of `out/`. Fewer syncs under load, but it also
    /// waits for every other unwritten page on that file system (other programs' too, and
    /// roost's own shard pages not yet flushed); measured no faster here (docs/benchmarks.md).
    Syncfs,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: default_data_dir(),
            spool_dir: None,
            batch_ops_max: 1_000,
            spool_file_bytes_max: 16 << 20,
            batches_in_flight_max: 64,
            spool_group_files: 16,
            bulk_file_bytes_max: 64 << 20,
            bulk_lines_max: 100_000,
            bulk_line_bytes_max: None,
            bulk_in_flight: 256,
            bulk_group_lines: 64,
            bulk_files_in_flight_max: 4,
            rescan_interval_ms: 1_000,
            wal_segment_bytes: 64 << 20,
            shard_segment_bytes: 16 << 20,
            shard_index_entries_max: roost_shards::INDEX_ENTRIES_MAX,
            zero_ahead_bytes: 1 << 20,
            failed_files_max: 1_000,
            failed_bytes_max: 256 << 20,
            umask: 0o027,
            control_socket: None,
            metrics_listen: None,
            metrics_web_config: None,
            metrics_legacy_names: false,
            result_sync: ResultSync::default(),
            shards: BTreeMap::new(),
            shards_max: 1024,
            shard_threads: 4,
            shard_idle_close_ms: 60_000,
            tail_round_claims: 64,
            tail_round_ms: 100,
            checkpoint_wal_bytes: 256 << 20,
            checkpoint_interval_ms: 300_000,
            request_key_window_secs: 86_400,
            memory_budget_bytes: 256 << 20,
            audit_retain_bytes: None,
            audit_retain_secs: None,
            shard_compact_dead_fraction: 0.5,
            shard_compact_bytes_per_sec: 64 << 20,
            replication: ReplicationConfig::default(),
            cluster: None,
            stream_socket: None,
            stream_in_flight_max: 128,
            stream_connections_max: 64,
            stream_line_bytes_max: None,
            stream_batches_running_max: None,
            intake_bytes_max: None,
        }
    }
}

/// `$STATE_DIRECTORY` when systemd sets it (first entry), else `./roost-data`.
pub fn default_data_dir() -> PathBuf {
    match std::env::var_os("STATE_DIRECTORY") {
        Some(v) if !v.is_empty() => {
            let s = v.to_string_lossy().into_owned();
            PathBuf::from(s.split(':').next().unwrap_or("roost-data"))
        }
        _ => PathBuf::from("roost-data"),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {}: {detail}", path.display())]
    Parse { path: PathBuf, detail: String },
    #[error("config: {0}")]
    Invalid(String),
}

/// What one key of the in-memory cache costs, measured (docs/memory.md): the map's slot,
/// the key's heap copy and the allocator's rounding, for keys of up to about 40 bytes.
pub const KEY_CACHE_BYTES_PER_KEY: u64 = 160;

/// The most batches a durability round may wait for: what recovery may apply again after a
/// power loss grows with it.
pub const TAIL_ROUND_CLAIMS_MAX: usize = 65_536;

/// The smallest `shard_index_entries_max` other than 0: fewer would roll a segment every few
/// frames.
pub const SHARD_INDEX_ENTRIES_MIN: usize = 64;

/// The shortest `shard_idle_close_ms` other than 0: a shorter one would close and reopen a
/// shard between two batches of a steady trickle, each reopen a scan of its segments.
pub const SHARD_IDLE_CLOSE_MS_MIN: u64 = 100;

impl Config {
    /// The key index's filters' share of `memory_budget_bytes`: half.
    pub fn key_filter_bytes_max(&self) -> u64 {
        self.memory_budget_bytes / 2
    }

    /// Keys not yet checkpointed that the cache may hold before a checkpoint is due: a
    /// sixteenth of `memory_budget_bytes`, at [`KEY_CACHE_BYTES_PER_KEY`] each: it also
    /// bounds the WAL a restart after a crash replays (about 0.5 s at the default).
    pub fn key_cache_keys_max(&self) -> u64 {
        (self.memory_budget_bytes / 16 / KEY_CACHE_BYTES_PER_KEY).max(1024)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text, path)
    }

    /// The configuration `text` holds (read from `path`, which errors name): parsed, named
    /// from `[cluster]`, validated.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
        cfg.name_from_cluster();
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, sc) in &self.shards {
            if !crate::batch::valid_shard_name(name) {
                return Err(ConfigError::Invalid(format!(
                    "shard name {name:?} must match [a-z0-9][a-z0-9_-]{{0,63}}"
                )));
            }
            if let Some(t) = &sc.before_trigger {
                if t.is_empty() {
                    return Err(ConfigError::Invalid(format!(
                        "shards.{name}.before_trigger is empty"
                    )));
                }
            }
        }
        self.validate_shards_max()?;
        if self.umask > 0o777 {
            return Err(ConfigError::Invalid(format!(
                "umask {:o} is not a file mode mask",
                self.umask
            )));
        }
        if self.batch_ops_max == 0 || self.batches_in_flight_max == 0 || self.spool_group_files == 0
        {
            return Err(ConfigError::Invalid(
                "batch_ops_max, batches_in_flight_max and spool_group_files must be > 0".into(),
            ));
        }
        self.validate_bulk()?;
        if self.memory_budget_bytes < 16 << 20 {
            return Err(ConfigError::Invalid(format!(
                "memory_budget_bytes = {} is below the 16 MiB roost needs to run",
                self.memory_budget_bytes
            )));
        }
        if self.stream_in_flight_max == 0
            || self.stream_connections_max == 0
            || self.stream_line_bytes_max == Some(0)
            || self.stream_batches_running_max == Some(0)
        {
            return Err(ConfigError::Invalid(
                "stream_in_flight_max, stream_connections_max, stream_line_bytes_max and stream_batches_running_max must be > 0".into(),
            ));
        }
        if self.metrics_web_config.is_some() && self.metrics_listen.is_none() {
            return Err(ConfigError::Invalid(
                "metrics_web_config is set without metrics_listen: there is no listener to secure"
                    .into(),
            ));
        }
        self.validate_intake_bytes()?;
        self.validate_replication()
    }

    /// One input of each intake must fit in `intake_bytes_max`, or it would wait for ever.
    fn validate_intake_bytes(&self) -> Result<(), ConfigError> {
        let Some(n) = self.intake_bytes_max else {
            return Ok(());
        };
        let line = self.stream_line_bytes() as u64;
        if n < self.bulk_file_bytes_max || n < line {
            return Err(ConfigError::Invalid(format!(
                "intake_bytes_max {n} must be at least bulk_file_bytes_max ({}) and the stream line limit ({line}): one input of each must fit",
                self.bulk_file_bytes_max
            )));
        }
        Ok(())
    }

    fn validate_shards_max(&self) -> Result<(), ConfigError> {
        if self.shards_max == 0 || self.shard_threads == 0 {
            return Err(ConfigError::Invalid(
                "shards_max and shard_threads must be > 0 (no shard could ever be written)".into(),
            ));
        }
        if self.shards.len() > self.shards_max {
            return Err(ConfigError::Invalid(format!(
                "{} shards are declared, more than shards_max = {}",
                self.shards.len(),
                self.shards_max
            )));
        }
        if !(1..=TAIL_ROUND_CLAIMS_MAX).contains(&self.tail_round_claims) || self.tail_round_ms == 0
        {
            return Err(ConfigError::Invalid(format!(
                "tail_round_claims = {} must be 1 to {TAIL_ROUND_CLAIMS_MAX} and tail_round_ms = {} above 0",
                self.tail_round_claims, self.tail_round_ms
            )));
        }
        if (1..SHARD_INDEX_ENTRIES_MIN).contains(&self.shard_index_entries_max) {
            return Err(ConfigError::Invalid(format!(
                "shard_index_entries_max = {} is below {SHARD_INDEX_ENTRIES_MIN} (0: segments roll only when full)",
                self.shard_index_entries_max
            )));
        }
        if (1..SHARD_IDLE_CLOSE_MS_MIN).contains(&self.shard_idle_close_ms) {
            return Err(ConfigError::Invalid(format!(
                "shard_idle_close_ms = {} is below {SHARD_IDLE_CLOSE_MS_MIN} (0 never closes an idle shard)",
                self.shard_idle_close_ms
            )));
        }
        Ok(())
    }

    fn validate_bulk(&self) -> Result<(), ConfigError> {
        if self.bulk_in_flight == 0
            || self.bulk_group_lines == 0
            || self.bulk_lines_max == 0
            || self.bulk_files_in_flight_max == 0
        {
            return Err(ConfigError::Invalid(
                "bulk_in_flight, bulk_group_lines, bulk_lines_max and bulk_files_in_flight_max must be > 0".into(),
            ));
        }
        // A line is a batch: the WAL's claim size bound (`claim_bytes_max`) assumes no batch
        // is longer than a spool file may be.
        if let Some(n) = self.bulk_line_bytes_max {
            if n == 0 || n > self.spool_file_bytes_max {
                return Err(ConfigError::Invalid(format!(
                    "bulk_line_bytes_max {n} must be 1 to spool_file_bytes_max ({})",
                    self.spool_file_bytes_max
                )));
            }
        }
        Ok(())
    }

    /// The longest line a bulk file may hold (`bulk_line_bytes_max`, by default the spool
    /// file limit).
    pub fn bulk_line_bytes(&self) -> u64 {
        self.bulk_line_bytes_max
            .unwrap_or(self.spool_file_bytes_max)
            .min(self.spool_file_bytes_max)
    }

    /// `[cluster] name` is the replication name when `[replication] name` is not set.
    pub fn name_from_cluster(&mut self) {
        if let Some(c) = &self.cluster {
            if self.replication.name.is_none() {
                self.replication.name = c.name.clone();
            }
        }
    }

    /// Whether this node is a member of an etcd-led cluster.
    pub fn clustered(&self) -> bool {
        self.cluster.is_some()
    }

    /// A cluster node serves its peers (`listen`), follows whom etcd names (no `follow`),
    /// and has one name in both sections.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let Some(c) = &self.cluster else {
            return Ok(());
        };
        c.validate()?;
        let r = &self.replication;
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        if r.listen.is_none() {
            return bad("[cluster] needs replication.listen: the other nodes fetch from and forward batches to this node there while it leads");
        }
        if r.follow.is_some() {
            return bad("[cluster] and replication.follow (or serve --follow) exclude each other: etcd says whom to follow");
        }
        match (&c.name, &r.name) {
            (Some(a), Some(b)) if a != b => {
                bad("cluster.name and replication.name differ: set one")
            }
            _ => Ok(()),
        }
    }

    fn validate_replication(&self) -> Result<(), ConfigError> {
        self.validate_cluster()?;
        let r = &self.replication;
        for (key, addr) in [("listen", &r.listen), ("follow", &r.follow)] {
            if let Some(a) = addr {
                if a.is_empty() || !a.contains(':') {
                    return Err(ConfigError::Invalid(format!(
                        "replication.{key} = {a:?} is not HOST:PORT"
                    )));
                }
            }
        }
        if r.node_id == Some(0) {
            return Err(ConfigError::Invalid(
                "replication.node_id must be 1-255".into(),
            ));
        }
        if r.ack == Ack::Standby && r.listen.is_none() && r.follow.is_none() {
            return Err(ConfigError::Invalid(
                "replication.ack = \"standby\" needs replication.listen (a primary's standbys connect there)".into(),
            ));
        }
        r.validate_security()
    }

    pub fn spool_dir(&self) -> PathBuf {
        self.spool_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("spool"))
    }

    /// The longest stream request line taken (`stream_line_bytes_max`, else the spool file
    /// limit: a line is a batch file's JSON).
    pub fn stream_line_bytes(&self) -> usize {
        let n = self
            .stream_line_bytes_max
            .unwrap_or(self.spool_file_bytes_max);
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// Bytes of unanswered input one intake may hold (`intake_bytes_max`, else 256 MiB or
    /// the largest single input if larger).
    pub fn intake_bytes(&self) -> u64 {
        self.intake_bytes_max.unwrap_or_else(|| {
            (256u64 << 20)
                .max(self.bulk_file_bytes_max)
                .max(self.stream_line_bytes() as u64)
        })
    }

    /// Streamed batches run at once (`stream_batches_running_max`, else 4 ×
    /// `batches_in_flight_max`).
    pub fn stream_batches_running(&self) -> usize {
        self.stream_batches_running_max
            .unwrap_or(self.batches_in_flight_max.saturating_mul(4))
    }

    /// How often the serve loop looks for answered batches that waited `tail_round_ms`.
    pub fn tail_round(&self) -> Duration {
        Duration::from_millis(self.tail_round_ms.max(1))
    }

    pub fn rescan_interval(&self) -> Duration {
        Duration::from_millis(self.rescan_interval_ms.max(10))
    }

    /// The shard's policy, or `None` when shards are declared and this one is not.
    pub fn shard(&self, name: &str) -> Option<ShardConfig> {
        if self.shards.is_empty() {
            Some(ShardConfig::default())
        } else {
            self.shards.get(name).cloned()
        }
    }

    /// Largest WAL payload a batch can produce under these limits. A claim holds the
    /// canonical records (never longer than the file they came from) plus fixed-size fields
    /// per op, so the spool file limit bounds it as well as the per-op limits do.
    pub fn claim_bytes_max(&self) -> u64 {
        let rec = self
            .shards
            .values()
            .map(|s| s.record_bytes_max)
            .max()
            .unwrap_or(default_record_bytes_max()) as u64;
        let per_op = 64 + 2 * crate::batch::SHARD_NAME_BYTES_MAX as u64;
        let by_ops = self.batch_ops_max as u64 * (rec + per_op);
        let by_file = self.spool_file_bytes_max + self.batch_ops_max as u64 * per_op;
        1024 + crate::batch::REQUEST_KEY_BYTES_MAX as u64 + by_ops.min(by_file)
    }
}

/// Where one of roost's client sockets lives: `configured` if set, else `NAME` in
/// `$RUNTIME_DIRECTORY` (its first entry) under systemd, else in the data directory.
pub fn runtime_socket(configured: Option<&Path>, name: &str, data_dir: &Path) -> PathBuf {
    if let Some(p) = configured {
        return p.to_path_buf();
    }
    match std::env::var_os("RUNTIME_DIRECTORY") {
        Some(v) if !v.is_empty() => {
            let s = v.to_string_lossy().into_owned();
            PathBuf::from(s.split(':').next().unwrap_or(".")).join(name)
        }
        _ => data_dir.join(name),
    }
}

#[cfg(test)]
mod parse_tests;
