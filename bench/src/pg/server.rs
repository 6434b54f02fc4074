//! A PostgreSQL 15 server for `--pg`, started by the bench on a directory of its own (Debian's
//! binaries in [`PG_BIN`], never the package's service) and stopped by its pid at drop, with a
//! bounded wait; the schema and the one server-side function per batch that the clients call.
//!
//! The server runs as the `postgres` user when the bench is root (PostgreSQL refuses root),
//! with `fsync` and `synchronous_commit` on, `shared_buffers = 256MB`, no TCP
//! (`listen_addresses = ''`) and its unix socket in a directory under /tmp (a socket path is
//! limited to 107 bytes; the bench directory's may be longer).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};

use crate::loopfs::{is_root, sh};

/// Debian's PostgreSQL 15 binaries (the `postgresql` package).
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
/// The role the bench connects as (made by `initdb -U`).
const ROLE: &str = "roost";
/// How long the server may take to accept connections, and to stop.
const START_WAIT: Duration = Duration::from_secs(60);
const STOP_WAIT: Duration = Duration::from_secs(30);

/// The schema and `apply_batch(body)`: the idempotency-key pattern in one call. The body is
/// the batch line roost takes (`{"request_key": K, "ops": [{"op","shard","record"}...]}`):
/// look K up and return its stored answer if present; else insert each record with an id
/// from a sequence and an audit row for it, store the answer under K and return it.
const SCHEMA: &str = r#"
CREATE SEQUENCE record_ids;
CREATE TABLE records (id bigint PRIMARY KEY, shard text NOT NULL, body jsonb NOT NULL);
CREATE TABLE audit (seq bigserial PRIMARY KEY, request_key text NOT NULL,
                    record_id bigint NOT NULL, op text NOT NULL,
                    at timestamptz NOT NULL DEFAULT now());
CREATE TABLE requests (request_key text PRIMARY KEY, answer jsonb NOT NULL);
CREATE FUNCTION apply_batch(batch jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    k text := batch->>'request_key';
    prior jsonb;
    op jsonb;
    rid bigint;
    ids bigint[] := '{}';
    ans jsonb;
BEGIN
    SELECT answer INTO prior FROM requests WHERE request_key = k;
    IF FOUND THEN
        RETURN prior;
    END IF;
    FOR op IN SELECT jsonb_array_elements(batch->'ops') LOOP
        rid := nextval('record_ids');
        INSERT INTO records (id, shard, body) VALUES (rid, op->>'shard', op->'record');
        INSERT INTO audit (request_key, record_id, op) VALUES (k, rid, op->>'op');
        ids := ids || rid;
    END LOOP;
    ans := jsonb_build_object('request_key', k, 'status', 'committed', 'ids', to_jsonb(ids));
    INSERT INTO requests (request_key, answer) VALUES (k, ans);
    RETURN ans;
END
$$;
"#;

/// The call each client makes per batch (the body passed as text, cast on the server).
pub const CALL: &str = "SELECT apply_batch($1::text::jsonb)::text";

/// A running server; stopped (fast shutdown, then immediate, then killed) at drop.
pub struct PgServer {
    child: Option<Child>,
    data: PathBuf,
    socket_dir: PathBuf,
}

/// `cmd` as the `postgres` user when root, else as this user.
fn as_pg_user(cmd: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", cmd]);
        c
    } else {
        Command::new(cmd)
    }
}

/// Runs `c` to completion; an error with its stderr if it fails.
fn run(mut c: Command, what: &str) -> anyhow::Result<()> {
    let out = c.output().with_context(|| format!("run {what}"))?;
    ensure!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl PgServer {
    /// `initdb` in `dir/pgdata` (created, owned by `postgres` when root), then the server,
    /// then the schema. Fails naming what to install if the binaries are missing.
    pub fn start(dir: &Path) -> anyhow::Result<PgServer> {
        let initdb = format!("{PG_BIN}/initdb");
        if !Path::new(&initdb).exists() {
            bail!("{initdb} is missing: install PostgreSQL 15 (apt-get install postgresql)");
        }
        let data = dir.join("pgdata");
        std::fs::create_dir_all(&data).with_context(|| format!("create {}", data.display()))?;
        let socket_dir = std::env::temp_dir().join(format!("roost-pg-{}", std::process::id()));
        std::fs::create_dir_all(&socket_dir)
            .with_context(|| format!("create {}", socket_dir.display()))?;
        if is_root() {
            for d in [&data, &socket_dir] {
                sh("chown", &["postgres:postgres", &d.to_string_lossy()])?;
            }
        }
        let mut c = as_pg_user(&initdb);
        c.args(["-D", &data.to_string_lossy(), "-U", ROLE, "-A", "trust"])
            .args(["--no-sync", "-E", "UTF8", "--locale=C"]);
        run(c, "initdb")?;
        let mut s = PgServer {
            child: None,
            data,
            socket_dir,
        };
        s.spawn()?;
        s.wait_ready()?;
        let mut client = s.connect()?;
        client.batch_execute(SCHEMA).context("create the schema")?;
        Ok(s)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let log = self.data.join("server.log");
        let log =
            std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut c = as_pg_user(&format!("{PG_BIN}/postgres"));
        c.args(["-D", &self.data.to_string_lossy()]);
        for setting in [
            "fsync=on".to_owned(),
            "synchronous_commit=on".to_owned(),
            "shared_buffers=256MB".to_owned(),
            "max_connections=100".to_owned(),
            "listen_addresses=".to_owned(),
            format!("unix_socket_directories={}", self.socket_dir.display()),
        ] {
            c.args(["-c", &setting]);
        }
        c.stdin(Stdio::null())
            .stdout(log.try_clone().context("the server log")?)
            .stderr(log);
        self.child = Some(c.spawn().context("start postgres")?);
        Ok(())
    }

    /// Until a connection succeeds (bounded); fails early if the server exited.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(st) = child.try_wait().context("wait for postgres")? {
                    bail!("postgres exited ({st}) at start: {}", self.log_tail());
                }
            }
            match self.connect() {
                Ok(_) => return Ok(()),
                Err(e) if start.elapsed() > START_WAIT => {
                    return Err(e.context(format!("postgres not ready: {}", self.log_tail())))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.data.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// A new connection over the unix socket.
    pub fn connect(&self) -> anyhow::Result<postgres::Client> {
        postgres::Config::new()
            .host_path(&self.socket_dir)
            .user(ROLE)
            .dbname("postgres")
            .connect(postgres::NoTls)
            .with_context(|| format!("connect to postgres in {}", self.socket_dir.display()))
    }

    /// The postmaster's pid: the first line of `postmaster.pid`.
    fn pid(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        text.lines().next().map(|l| l.trim().to_owned())
    }

    /// Signal `sig` to the postmaster, then wait for the child (at most `wait`): whether it
    /// exited.
    fn signal_and_wait(&mut self, sig: &str, wait: Duration) -> bool {
        if let Some(pid) = self.pid() {
            let _ = sh("kill", &[sig, &pid]);
        }
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        let start = Instant::now();
        while start.elapsed() < wait {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for PgServer {
    /// Fast shutdown (SIGINT), then immediate (SIGQUIT), then SIGKILL of the child, each
    /// waited for a bounded time; the socket directory removed.
    fn drop(&mut self) {
        if self.child.is_some()
            && !self.signal_and_wait("-INT", STOP_WAIT)
            && !self.signal_and_wait("-QUIT", Duration::from_secs(5))
        {
            eprintln!(
                "postgres in {} did not stop; killing it",
                self.data.display()
            );
            let _ = self.signal_and_wait("-KILL", Duration::from_secs(5));
            if let Some(c) = self.child.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.socket_dir);
    }
}
