//! The peer: what a user would build instead of roost, a small SQLite-backed spool consumer
//! at the same durability. WAL mode, synchronous=FULL, one transaction per batch holding the
//! idempotency-key row, the records and the audit rows; a result file per batch written the
//! same way roost writes it (temporary, fsync, rename, fsync of out/); the input removed.
//! Four worker threads with their own connections (SQLite serialises the writes; the result
//! files' fsyncs overlap), fed by one dispatcher that rescans `new/`.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

pub struct Peer {
    pub spool: PathBuf,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

fn connect(db: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open(db)?;
    c.busy_timeout(Duration::from_secs(30))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(None, "synchronous", "FULL")?;
    Ok(c)
}

impl Peer {
    pub fn start(dir: &Path) -> anyhow::Result<Peer> {
        let spool = dir.join("spool");
        for d in ["tmp", "new", "out"] {
            std::fs::create_dir_all(spool.join(d))?;
        }
        let db = dir.join("peer.db");
        drop(create(dir)?);
        let stop = Arc::new(AtomicBool::new(false));
        let inflight: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(HashSet::new()));
        let (tx, rx) = mpsc::sync_channel::<String>(256);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::new();
        for _ in 0..4 {
            let (rx, spool, db, inflight) =
                (rx.clone(), spool.clone(), db.clone(), inflight.clone());
            threads.push(std::thread::spawn(move || {
                let Ok(mut conn) = connect(&db) else { return };
                loop {
                    let name = match rx.lock().map(|r| r.recv()) {
                        Ok(Ok(n)) => n,
                        _ => return,
                    };
                    if let Err(e) = process(&mut conn, &spool, &name) {
                        eprintln!("peer: {name}: {e}");
                    }
                    if let Ok(mut s) = inflight.lock() {
                        s.remove(&name);
                    }
                }
            }));
        }
        let (st, sp) = (stop.clone(), spool.clone());
        threads.push(std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let names: Vec<String> = std::fs::read_dir(sp.join("new"))
                    .map(|rd| {
                        rd.flatten()
                            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut sent = 0;
                for n in names {
                    if n.starts_with('.') || !inflight.lock().is_ok_and(|mut s| s.insert(n.clone()))
                    {
                        continue;
                    }
                    if tx.send(n).is_err() {
                        return;
                    }
                    sent += 1;
                }
                if sent == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }));
        Ok(Peer {
            spool,
            stop,
            threads,
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The dispatcher exits and drops the sender; the workers then see the channel close.
        for t in self.threads.drain(..).rev() {
            let _ = t.join();
        }
    }
}

fn process(conn: &mut Connection, spool: &Path, name: &str) -> anyhow::Result<()> {
    let path = spool.join("new").join(name);
    let Ok(bytes) = std::fs::read(&path) else {
        return Ok(());
    };
    let v = answer(conn, &bytes)?;
    finish(spool, name, &v)
}

/// One batch in one transaction (`synchronous=FULL`): its answer, as roost would give it.
fn answer(conn: &mut Connection, bytes: &[u8]) -> anyhow::Result<serde_json::Value> {
    let b = match roost::batch::parse(bytes, 1000) {
        Err(inv) => {
            return Ok(
                serde_json::json!({"request_key": inv.request_key, "status": "invalid", "error": inv.error}),
            )
        }
        Ok(b) => b,
    };
    let fp = roost::batch::fingerprint(&b) as i64;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let prior: Option<(i64, String)> = tx
        .query_row(
            "SELECT fingerprint, result FROM requests WHERE key = ?1",
            params![b.request_key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    match prior {
        Some((f, r)) if f == fp => return Ok(serde_json::from_str(&r)?),
        Some(_) => {
            return Ok(serde_json::json!({"request_key": b.request_key, "status": "conflict"}))
        }
        None => {}
    }
    match apply_ops(&tx, &b)? {
        Err(i) => {
            tx.rollback()?;
            Ok(
                serde_json::json!({"request_key": b.request_key, "status": "rejected", "op_index": i}),
            )
        }
        Ok(ops) => {
            let v = serde_json::json!({"request_key": b.request_key, "status": "committed", "ops": ops});
            tx.execute(
                "INSERT INTO requests (key, fingerprint, result) VALUES (?1, ?2, ?3)",
                params![b.request_key, fp, v.to_string()],
            )?;
            tx.commit()?;
            Ok(v)
        }
    }
}

/// The ops with their audit rows; `Err(i)` when op `i` is rejected (a missing id).
fn apply_ops(
    tx: &rusqlite::Transaction<'_>,
    b: &roost::batch::Batch,
) -> anyhow::Result<Result<Vec<serde_json::Value>, usize>> {
    let mut ops = Vec::new();
    for (i, op) in b.ops.iter().enumerate() {
        match op {
            roost::batch::BatchOp::Create { shard, record, .. } => {
                tx.execute(
                    "INSERT INTO records (shard, body) VALUES (?1, ?2)",
                    params![shard, record],
                )?;
                let id = tx.last_insert_rowid();
                tx.execute("INSERT INTO audit (key, op_index, op, shard, rid) VALUES (?1, ?2, 'create', ?3, ?4)", params![b.request_key, i as i64, shard, id])?;
                ops.push(serde_json::json!({"op": "create", "shard": shard, "id": id}));
            }
            roost::batch::BatchOp::Delete { shard, id } => {
                let n = tx.execute(
                    "DELETE FROM records WHERE id = ?1 AND shard = ?2",
                    params![*id as i64, shard],
                )?;
                if n == 0 {
                    return Ok(Err(i));
                }
                tx.execute("INSERT INTO audit (key, op_index, op, shard, rid) VALUES (?1, ?2, 'delete', ?3, ?4)", params![b.request_key, i as i64, shard, *id as i64])?;
                ops.push(serde_json::json!({"op": "delete", "shard": shard, "id": id}));
            }
        }
    }
    Ok(Ok(ops))
}

/// The peer fed bulk files: each file's lines, one transaction per line (as a line of a
/// roost bulk file is its own batch), then the file's results written as one `.jsonl`
/// result file the way roost writes a result (temporary, fsync, rename, fsync of `out/`).
/// Returns batches per second.
pub fn bulk(dir: &Path, files: &[(String, Vec<Vec<u8>>)]) -> anyhow::Result<f64> {
    let out = dir.join("spool").join("out");
    std::fs::create_dir_all(&out)?;
    let mut conn = create(dir)?;
    let start = std::time::Instant::now();
    let mut n = 0usize;
    for (name, lines) in files {
        let mut text = String::new();
        for line in lines {
            text.push_str(&answer(&mut conn, line)?.to_string());
            text.push('\n');
            n += 1;
        }
        write_result(&out, name, text.as_bytes())?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// The database at `dir/peer.db` with its tables.
fn create(dir: &Path) -> anyhow::Result<Connection> {
    std::fs::create_dir_all(dir)?;
    let c = connect(&dir.join("peer.db"))?;
    c.execute_batch(SCHEMA)?;
    Ok(c)
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS requests (key TEXT PRIMARY KEY, fingerprint INTEGER NOT NULL, result TEXT NOT NULL);
     CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY AUTOINCREMENT, shard TEXT NOT NULL, body BLOB NOT NULL);
     CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, key TEXT NOT NULL, op_index INTEGER NOT NULL, op TEXT NOT NULL, shard TEXT NOT NULL, rid INTEGER NOT NULL);";

/// `out/NAME` durably: a temporary, fsync, rename, fsync of `out/`.
fn write_result(out: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = out.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_data()?;
    std::fs::rename(&tmp, out.join(name))?;
    std::fs::File::open(out)?.sync_all()?;
    Ok(())
}

/// The result file, as roost writes it, then the input removed.
fn finish(spool: &Path, name: &str, v: &serde_json::Value) -> anyhow::Result<()> {
    write_result(&spool.join("out"), name, format!("{v}\n").as_bytes())?;
    // Another worker may have taken the same name from a stale listing and finished first
    // (the request key makes the second run a duplicate with the same result).
    match std::fs::remove_file(spool.join("new").join(name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

/// The peer fed the lines a stream carries: `conns` threads, each with its own connection,
/// one transaction per line (the answers go nowhere, as a stream's go to its socket).
/// Returns batches per second.
pub fn stream(dir: &Path, lines: &[Vec<u8>], conns: usize) -> anyhow::Result<f64> {
    drop(create(dir)?);
    let db = dir.join("peer.db");
    let per = lines.len().div_ceil(conns.max(1));
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        let handles: Vec<_> = lines
            .chunks(per.max(1))
            .map(|chunk| {
                let db = db.clone();
                s.spawn(move || -> anyhow::Result<()> {
                    let mut conn = connect(&db)?;
                    for l in chunk {
                        answer(&mut conn, l)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("a peer stream thread panicked"))??;
        }
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(lines.len() as f64 / start.elapsed().as_secs_f64())
}
