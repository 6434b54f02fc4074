//! [`ServeChild`]: `roost serve` as a child process, for the drill and for black-box tests.
//! It starts the daemon with its log on a file, waits until the log says it serves
//! (recovery done), and kills it when dropped, so a failing caller never leaks a daemon that
//! holds the data directory. It never reads the daemon's files.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A running `roost serve`. Dropping it sends SIGKILL and reaps the process.
pub struct ServeChild {
    child: Child,
    /// The daemon's stderr (its log, `ROOST_LOG=info`).
    log: PathBuf,
    started: Instant,
}

impl ServeChild {
    /// Starts `BIN serve --data-dir DATA`, logging at info level to `log`, stdin and stdout
    /// closed. `configure` adds arguments and environment (`ROOST_CRASH_AT` is removed first,
    /// so a crash point is set only where the caller sets it).
    pub fn spawn(
        bin: &Path,
        data_dir: &Path,
        log: &Path,
        configure: impl FnOnce(&mut Command),
    ) -> anyhow::Result<ServeChild> {
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .env("ROOST_LOG", "info")
            .env_remove("ROOST_CRASH_AT");
        configure(&mut cmd);
        let stderr = std::fs::File::create(log)
            .with_context(|| format!("creating the log {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let child = cmd.spawn().context("starting roost serve")?;
        Ok(ServeChild {
            child,
            log: log.to_path_buf(),
            started: Instant::now(),
        })
    }

    /// Waits for the "serving" line (recovery done); returns the time since spawn.
    pub fn ready(&mut self, limit: Duration) -> anyhow::Result<Duration> {
        self.wait_log("serving", limit)?;
        Ok(self.started.elapsed())
    }

    /// Waits until the log contains `needle`; an error if the daemon exits first or `limit`
    /// passes, with the log's last lines.
    pub fn wait_log(&mut self, needle: &str, limit: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + limit;
        loop {
            let text = self.log_text();
            if text.contains(needle) {
                return Ok(());
            }
            if let Some(st) = self.child.try_wait()? {
                bail!(
                    "roost serve exited ({st}) before logging {needle:?}; log {}:\n{}",
                    self.log.display(),
                    tail(&text)
                );
            }
            if Instant::now() > until {
                bail!(
                    "roost serve did not log {needle:?} within {limit:?}; log {}:\n{}",
                    self.log.display(),
                    tail(&text)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `None` while it runs; once it has exited, how, with the last lines of its log (for a
    /// failure's report: a daemon that died by itself says why there).
    pub fn exit_report(&mut self) -> std::io::Result<Option<String>> {
        Ok(self.child.try_wait()?.map(|st| {
            format!(
                "exited ({st}); log {}:\n{}",
                self.log.display(),
                tail(&self.log_text())
            )
        }))
    }

    /// The log so far (empty if it cannot be read).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the daemon has exited, without waiting.
    pub fn exited(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Waits up to `limit` for the daemon to die by itself (a crash point); true if it did.
    pub fn died_within(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// SIGKILL and reap (nothing if it already exited).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (a graceful shutdown) and its exit status; an error if it does not exit
    /// within `limit`.
    pub fn stop(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(st) = self.child.try_wait()? {
            return Ok(st);
        }
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
            .context("sending SIGTERM to roost serve")?;
        let until = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > until {
                bail!("roost serve did not stop within {limit:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last lines of a log, for an error message.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
