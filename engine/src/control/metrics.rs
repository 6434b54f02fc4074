//! Every metric roost exports, read from the engine at scrape time and written by the
//! `prometheus-client` encoders: OpenMetrics text (over HTTP when the `Accept` header asks, as
//! Prometheus does) or the Prometheus text format 0.0.4 (the control socket, and HTTP otherwise). The names
//! are a public contract (docs/metrics.md): a counter is registered without `_total` (the
//! encoder adds it, and only to counters), a unit is a `Unit` (the encoder appends it and
//! writes `# UNIT`), and a renamed metric's old name is exported beside the new one only with
//! `metrics_legacy_names = true` (docs/metrics.md, "Renamed"). Never changes the engine.

use roost_storage::Clock;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::cluster::Cluster;
use crate::pipeline::Engine;
use crate::replica::{Node, Replication};

/// The two text formats roost writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text: `# UNIT`, counters' family names without `_total`, `# EOF`.
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (what `promtool check metrics` reads).
    Text004,
}

/// OpenMetrics' media type, as the OpenMetrics 1.0 specification names it.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl Format {
    /// The format an HTTP client asks for: OpenMetrics when its `Accept` names it (Prometheus
    /// does); the Prometheus text 0.0.4 otherwise, also with no header or `*/*`, as the
    /// endpoint has always answered (`curl` and scripts keep what they read).
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text004,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::Text004 => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// Every metric of `engine` (and of a cluster node) in `format`.
pub fn render(
    node: &Node,
    cluster: Option<&Arc<Cluster>>,
    format: Format,
) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Figures {
        engine: node.engine.clone(),
        repl: node.repl.clone(),
        cluster: cluster.cloned(),
    }));
    let mut out = String::new();
    match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &registry)?,
        Format::Text004 => {
            prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?
        }
    }
    Ok(out)
}

/// The collector: reads the engine's figures on every scrape.
struct Figures {
    engine: Arc<Engine>,
    repl: Arc<Replication>,
    cluster: Option<Arc<Cluster>>,
}

/// `Collector` asks for `Debug`; the engine has none worth printing.
impl fmt::Debug for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Figures")
            .field("cluster", &self.cluster.is_some())
            .finish_non_exhaustive()
    }
}

impl Collector for Figures {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let e = &self.engine;
        batches(&mut enc, e)?;
        write_all(&mut enc, pipeline_figures(e))?;
        write_all(&mut enc, durability_figures(e))?;
        write_all(&mut enc, intake_figures(e))?;
        write_all(&mut enc, file_figures(e))?;
        write_all(&mut enc, memory_figures(e))?;
        write_all(&mut enc, replication_figures(e, &self.repl))?;
        per_shard(&mut enc, e)?;
        per_part(&mut enc, e)?;
        role(&mut enc, e)?;
        latency(&mut enc, e)?;
        if let Some(c) = &self.cluster {
            write_all(&mut enc, cluster_figures(e, &self.repl, c))?;
        }
        if e.config().metrics_legacy_names {
            write_all(&mut enc, legacy_figures(e, &self.repl))?;
        }
        Ok(())
    }
}

/// The old names of renamed metrics, only with `metrics_legacy_names = true`
/// (docs/metrics.md, "Renamed"): the same values as their new names.
fn legacy_figures(engine: &Engine, repl: &Replication) -> Vec<Figure> {
    let out = vec![
        gauge(
            "roost_checkpoint_wal_from",
            "Deprecated: the old name of roost_checkpoint_wal_from_lsn (docs/metrics.md).",
            checkpoint_lsn(&engine.figures()),
        ),
        gauge(
            "roost_replication_hw",
            "Deprecated: the old name of roost_replication_high_watermark_lsn (docs/metrics.md).",
            repl.high_watermark().saturating_sub(1),
        ),
    ];
    out
}

/// One metric without labels.
struct Figure {
    /// The name without unit and without `_total`.
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    value: Value,
}

enum Value {
    Counter(u64),
    Gauge(u64),
    GaugeF(f64),
}

fn counter(name: &'static str, help: &'static str, v: u64) -> Figure {
    Figure {
        name,
        help,
        unit: None,
        value: Value::Counter(v),
    }
}

fn gauge(name: &'static str, help: &'static str, v: u64) -> Figure {
    Figure {
        name,
        help,
        unit: None,
        value: Value::Gauge(v),
    }
}

impl Figure {
    fn bytes(mut self) -> Figure {
        self.unit = Some(Unit::Bytes);
        self
    }
}

fn seconds(name: &'static str, help: &'static str, v: f64) -> Figure {
    Figure {
        name,
        help,
        unit: Some(Unit::Seconds),
        value: Value::GaugeF(v),
    }
}

fn write_all(
    enc: &mut DescriptorEncoder,
    figures: impl IntoIterator<Item = Figure>,
) -> fmt::Result {
    for f in figures {
        let unit = f.unit.as_ref();
        match f.value {
            Value::Counter(v) => one(enc, f.name, f.help, unit, ConstCounter::new(v))?,
            Value::Gauge(v) => one(enc, f.name, f.help, unit, ConstGauge::new(v))?,
            Value::GaugeF(v) => one(enc, f.name, f.help, unit, ConstGauge::new(v))?,
        }
    }
    Ok(())
}

fn one(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: impl EncodeMetric,
) -> fmt::Result {
    let m = enc.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(m)
}

/// A metric with one label, one sample per `(label value, value)`.
fn labelled<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    (name, help, unit, kind): (&str, &str, Option<&Unit>, MetricType),
    label: &str,
    rows: impl IntoIterator<Item = (String, M)>,
) -> fmt::Result {
    let mut family = enc.encode_descriptor(name, help, unit, kind)?;
    for (value, metric) in rows {
        let labels = [(label, value.as_str())];
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// `roost_batches_total{status}`.
fn batches(enc: &mut DescriptorEncoder, engine: &Engine) -> fmt::Result {
    let s = &engine.stats;
    let rows = [
        ("committed", &s.committed),
        ("rejected", &s.rejected),
        ("invalid", &s.invalid),
        ("conflict", &s.conflict),
        ("duplicate", &s.duplicate),
    ]
    .map(|(status, v)| (status.to_owned(), ConstCounter::new(load(v))));
    let head = (
        "roost_batches",
        "Batches by final status since start.",
        None,
        MetricType::Counter,
    );
    labelled(enc, head, "status", rows)
}

/// The WAL, the audit log and the shards.
fn pipeline_figures(engine: &Engine) -> Vec<Figure> {
    let s = &engine.stats;
    let f = engine.figures();
    let (appends, syncs, audit_syncs) = (f.wal_appends, f.wal_syncs, f.audit_syncs);
    vec![
        gauge(
            "roost_batches_in_flight",
            "Batches between intake and result.",
            load(&s.in_flight),
        ),
        counter(
            "roost_wal_appends",
            "WAL records appended since start.",
            appends,
        ),
        counter(
            "roost_wal_syncs",
            "WAL fdatasyncs (group commits) since start.",
            syncs,
        ),
        counter(
            "roost_audit_syncs",
            "Audit log fdatasyncs (group commits) since start.",
            audit_syncs,
        ),
        counter(
            "roost_shard_txns",
            "Shard transactions applied since start.",
            load(&s.shard_txns),
        ),
        counter(
            "roost_shard_flushes",
            "Shard flushes (one msync each, grouped per owner round) since start.",
            load(&s.shard_flushes),
        ),
        counter(
            "roost_tail_rounds",
            "Durability rounds (shard flushes, audit sync, done records for every batch answered since the last) since start.",
            load(&s.tail_rounds),
        ),
        counter(
            "roost_tail_batches_settled",
            "Answered batches whose durability round has run since start.",
            load(&s.tail_settled),
        ),
        gauge(
            "roost_tail_batches_waiting",
            "Answered batches waiting for their durability round now.",
            load(&s.tail_waiting),
        ),
        gauge(
            "roost_shards_open",
            "Shards open now (maps, file descriptors, lock held); the others are closed.",
            load(&s.shards_open),
        ),
        counter(
            "roost_shard_idle_closes",
            "Shards closed after shard_idle_close_ms idle since start.",
            load(&s.shard_idle_closes),
        ),
        counter(
            "roost_shard_reopens",
            "Closed shards opened again by a message since start.",
            load(&s.shard_reopens),
        ),
    ]
}

/// Result rounds, the last lsn and the last checkpoint.
fn durability_figures(engine: &Engine) -> Vec<Figure> {
    let f = engine.figures();
    let (rounds, published) = (f.result_rounds, f.results_published);
    vec![
        counter(
            "roost_result_rounds",
            "Rounds that published result files (one fsync of out/ each) since start.",
            rounds,
        ),
        counter(
            "roost_results_published",
            "Result files published since start.",
            published,
        ),
        gauge(
            "roost_last_lsn",
            "The last lsn written to the WAL.",
            engine.last_lsn(),
        ),
        gauge(
            "roost_checkpoint_wal_from_lsn",
            "Where recovery starts: the last checkpoint's lsn (0 before the first).",
            checkpoint_lsn(&f),
        ),
        seconds(
            "roost_checkpoint_age",
            "Time since the last checkpoint (0 before the first).",
            checkpoint_age_seconds(&f, Clock::of(engine.storage().clone()).unix_ms()),
        ),
    ]
}

fn checkpoint_lsn(f: &crate::pipeline::Figures) -> u64 {
    f.last_checkpoint.as_ref().map_or(0, |c| c.wal_from)
}

/// The last checkpoint's age at `now_ms` (the engine's clock), in seconds.
fn checkpoint_age_seconds(f: &crate::pipeline::Figures, now_ms: u64) -> f64 {
    f.last_checkpoint
        .as_ref()
        .map_or(0.0, |c| now_ms.saturating_sub(c.at_ms) as f64 / 1e3)
}

/// Intake: disk-full pauses, the stream socket.
fn intake_figures(engine: &Engine) -> Vec<Figure> {
    let s = &engine.stats;
    let st = &s.stream;
    let paused = engine.room().paused();
    vec![
        gauge(
            "roost_intake_paused",
            "1 while intake waits for disk space (a log has no room for its next segment).",
            u64::from(paused.is_some()),
        ),
        gauge(
            "roost_intake_paused_needed",
            "Bytes the next segment needs while intake is paused (0 when open).",
            paused.as_ref().map_or(0, |p| p.why.needed_bytes),
        )
        .bytes(),
        counter(
            "roost_intake_pauses",
            "Times intake paused for want of disk space since start.",
            load(&s.intake_pauses),
        ),
        gauge(
            "roost_stream_connections_open",
            "Stream connections open now.",
            load(&st.connections),
        ),
        counter(
            "roost_stream_connections",
            "Stream connections accepted since start.",
            load(&st.connections_total),
        ),
        counter(
            "roost_stream_refused",
            "Stream connections refused over stream_connections_max since start.",
            load(&st.refused),
        ),
        counter(
            "roost_stream_answers",
            "Answer lines sent on stream connections since start.",
            load(&st.answers),
        ),
        counter(
            "roost_stream_unavailable",
            "Stream answers 'unavailable' (not taken now; retry under the same key).",
            load(&st.unavailable),
        ),
        counter(
            "roost_stream_groups",
            "Groups the streamed batches ran in (all connections together) since start.",
            load(&st.groups),
        ),
        counter(
            "roost_stream_batches_in_groups",
            "Streamed batches run in those groups since start.",
            load(&st.batches_in_groups),
        ),
        counter(
            "roost_stream_stalled",
            "Times the running stream groups had all stalled (a standby not acknowledging) and the waiting batches ran at once, each connection's on its own.",
            load(&st.stalled),
        ),
    ]
}

/// Bulk files and spool files run in groups.
fn file_figures(engine: &Engine) -> Vec<Figure> {
    let s = &engine.stats;
    let b = &s.bulk;
    vec![
        gauge(
            "roost_bulk_files_in_flight",
            "Bulk files worked on now.",
            load(&b.in_flight),
        ),
        counter(
            "roost_bulk_files",
            "Bulk files whose result was published since start.",
            load(&b.files),
        ),
        counter(
            "roost_bulk_lines",
            "Result lines of those bulk files.",
            load(&b.lines),
        ),
        counter(
            "roost_bulk_deferred",
            "Bulk files left in new/ for later (not taken now, or a stop).",
            load(&b.deferred),
        ),
        counter(
            "roost_file_groups",
            "Groups of spool files run together (one planner pass, one WAL sync, one out/ round).",
            load(&s.file_groups),
        ),
        counter(
            "roost_files_in_groups",
            "Spool files answered in those groups.",
            load(&s.files_in_groups),
        ),
    ]
}

/// Memory by part and the request keys.
fn memory_figures(engine: &Engine) -> Vec<Figure> {
    let mem = engine.memory();
    let f = engine.figures();
    vec![
        gauge(
            "roost_live_request_keys",
            "Request keys remembered now (inside the window or not yet checkpointed).",
            f.live_keys() as u64,
        ),
        gauge(
            "roost_key_index_runs",
            "Sorted runs of the request-key index on disk.",
            f.key_index.runs,
        ),
        gauge(
            "roost_memory_key_filter",
            "Bytes of the request-key index's filters in memory (within memory_budget_bytes).",
            mem.key_filter_bytes,
        )
        .bytes(),
        gauge(
            "roost_memory_key_cache",
            "Estimated bytes of the keys not yet checkpointed, held in memory.",
            mem.key_cache_bytes,
        )
        .bytes(),
        gauge(
            "roost_memory_shard_index",
            "Estimated bytes of the shards' in-memory indexes (20 per record).",
            mem.shard_index_bytes,
        )
        .bytes(),
        gauge(
            "roost_memory_resident",
            "The daemon's resident set size.",
            mem.rss_bytes,
        )
        .bytes(),
    ]
}

/// The replication figures: epoch, high watermark, the largest standby lag, answers given
/// alone, whether answers wait for a standby, plain TCP.
fn replication_figures(engine: &Engine, repl: &Replication) -> Vec<Figure> {
    let end = repl.durable_end();
    let lag = repl
        .standbys()
        .iter()
        .map(|(_, s)| end.saturating_sub(s.acked))
        .max()
        .unwrap_or(0);
    let hw = repl.high_watermark().saturating_sub(1);
    vec![
        gauge(
            "roost_replication_epoch",
            "The leader epoch this node knows.",
            u64::from(repl.epoch()),
        ),
        gauge(
            "roost_replication_high_watermark_lsn",
            "The high watermark: every lsn up to it is durable here and on a standby.",
            hw,
        ),
        gauge(
            "roost_replication_standby_lag_lsns",
            "The largest lag of a standby behind this primary's durable end, in records.",
            lag,
        ),
        counter(
            "roost_replication_published_alone",
            "Results published with no standby in sync (when_standby_lost = alone).",
            repl.published_alone(),
        ),
        gauge(
            "roost_replication_waiting_for_standby",
            "1 while results wait for a standby (ack = standby, none in sync).",
            u64::from(repl.waiting_for_standby()),
        ),
        gauge(
            "roost_replication_insecure",
            "1 when replication runs over plain TCP, no peer authenticated (no TLS).",
            u64::from(engine.config().replication.unauthenticated()),
        ),
    ]
}

/// `roost_replication_role{role}`: 1 for this node's role.
fn role(enc: &mut DescriptorEncoder, engine: &Engine) -> fmt::Result {
    let head = (
        "roost_replication_role",
        "1 for this node's role.",
        None,
        MetricType::Gauge,
    );
    let rows = [(engine.role().name().to_owned(), ConstGauge::new(1u64))];
    labelled(enc, head, "role", rows)
}

/// Per shard: live records and compaction.
fn per_shard(enc: &mut DescriptorEncoder, engine: &Engine) -> fmt::Result {
    let records = engine
        .shards()
        .figures()
        .into_iter()
        .map(|(name, f)| (name, ConstGauge::new(f.records as u64)));
    let head = (
        "roost_shard_records",
        "Live records per shard.",
        None,
        MetricType::Gauge,
    );
    labelled(enc, head, "shard", records)?;
    let compaction = engine.shards().compaction();
    let rows = |f: fn(&roost_shards::CompactionStats) -> u64| {
        compaction
            .iter()
            .map(move |(k, c)| (k.clone(), f(c)))
            .collect::<Vec<_>>()
    };
    let bytes = Unit::Bytes;
    let counters =
        |rows: Vec<(String, u64)>| rows.into_iter().map(|(k, v)| (k, ConstCounter::new(v)));
    let head = (
        "roost_shard_compactions",
        "Shard segment compactions since start.",
        None,
        MetricType::Counter,
    );
    labelled(enc, head, "shard", counters(rows(|c| c.compactions)))?;
    let head = (
        "roost_shard_reclaimed",
        "Bytes compaction gave back since start.",
        Some(&bytes),
        MetricType::Counter,
    );
    labelled(enc, head, "shard", counters(rows(|c| c.reclaimed_bytes)))?;
    let dead = rows(|c| c.dead_bytes)
        .into_iter()
        .map(|(k, v)| (k, ConstGauge::new(v)));
    let head = (
        "roost_shard_dead",
        "Bytes in sealed segments that compaction would drop.",
        Some(&bytes),
        MetricType::Gauge,
    );
    labelled(enc, head, "shard", dead)
}

/// `roost_disk_bytes{part}`.
fn per_part(enc: &mut DescriptorEncoder, engine: &Engine) -> fmt::Result {
    let bytes = Unit::Bytes;
    let head = (
        "roost_disk",
        "Bytes on disk per part (preallocated).",
        Some(&bytes),
        MetricType::Gauge,
    );
    let rows = engine
        .disk_bytes()
        .into_iter()
        .map(|(part, n)| (part.to_owned(), ConstGauge::new(n)));
    labelled(enc, head, "part", rows)
}

/// The latency histograms: `roost_phase_seconds{phase}` and `roost_batch_seconds`.
fn latency(enc: &mut DescriptorEncoder, engine: &Engine) -> fmt::Result {
    let secs = Unit::Seconds;
    let phases = engine.stats.latency.phases();
    let head = (
        "roost_phase",
        "Time per batch in each pipeline phase: plan (checks, triggers, state checks), claim (claim append and its sync), commit (shard transactions applied, not yet flushed), finish (audit rows, result, shard flushes, audit sync, done record), replicate (waiting for a standby, ack = standby).",
        Some(&secs),
        MetricType::Histogram,
    );
    let rows = phases
        .iter()
        .filter(|(p, _)| *p != "batch")
        .map(|(p, h)| ((*p).to_owned(), Histogram(h.snapshot())));
    labelled(enc, head, "phase", rows)?;
    let batch = Histogram(engine.stats.latency.batch.snapshot());
    one(
        enc,
        "roost_batch",
        "Time from planning to the result file.",
        Some(&secs),
        batch,
    )
}

/// A histogram of the engine's (`pipeline/stats.rs`), read once.
struct Histogram(crate::pipeline::stats::Snapshot);

impl EncodeMetric for Histogram {
    fn encode(&self, mut m: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
        let s = &self.0;
        m.encode_histogram::<NoLabelSet>(s.sum_seconds, s.count, &s.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// A cluster node's figures (issue 27).
fn cluster_figures(engine: &Engine, repl: &Replication, c: &Cluster) -> Vec<Figure> {
    let v = c.view();
    let s = &engine.stats;
    let lease_left = v.lease_left_ms().unwrap_or(0) as f64 / 1e3;
    vec![
        gauge(
            "roost_cluster_leading",
            "1 while this node leads the cluster (etcd names it and its lease is renewed).",
            u64::from(v.leading()),
        ),
        gauge(
            "roost_cluster_epoch",
            "The highest leader epoch this node knows.",
            u64::from(repl.epoch()),
        ),
        seconds(
            "roost_cluster_lease_left",
            "While leading: how long this node may still answer without renewing its lease.",
            lease_left,
        ),
        gauge(
            "roost_cluster_isr_members",
            "Nodes in the in-sync set etcd holds (they alone may be elected).",
            v.isr.as_ref().map_or(0, |i| i.members.len() as u64),
        ),
        counter(
            "roost_cluster_forwarded_in",
            "Batches other members forwarded to this leader, answered.",
            load(&s.forwarded_in),
        ),
        counter(
            "roost_cluster_forwarded_out",
            "Batches this standby forwarded to the leader and answered.",
            load(&s.forwarded_out),
        ),
        counter(
            "roost_cluster_elections_won",
            "Elections this node won since start.",
            load(&c.elections_won),
        ),
        counter(
            "roost_cluster_fenced",
            "Times this leader fenced itself since start.",
            load(&c.fenced),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a scraper that asks for OpenMetrics (Prometheus itself) gets it; one that asks
    /// for text/plain, for anything or for nothing gets the 0.0.4 text it always got.
    #[test]
    fn the_accept_header_picks_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::from_accept(None), Format::Text004);
        assert_eq!(Format::from_accept(Some("*/*")), Format::Text004);
        let plain = Some("text/plain; version=0.0.4");
        assert_eq!(Format::from_accept(plain), Format::Text004);
        assert!(Format::Text004.content_type().contains("version=0.0.4"));
        assert!(Format::OpenMetrics
            .content_type()
            .starts_with("application/openmetrics-text"));
    }
}
