//! Before-triggers: a configured program run for an op, with the op as JSON on stdin, no
//! shell, under a time limit. Exit 0 accepts the op; anything else rejects it with the
//! (bounded) stderr as the reason. A trigger that hangs is killed at the limit, by the
//! storage's clock (on the simulated disk, once the test has moved it past the limit); one
//! that cannot be started rejects the op with the reason.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use roost_storage::Clock;

/// At most this much of a trigger's stderr is kept (the rest is drained and dropped).
pub const TRIGGER_STDERR_BYTES_MAX: usize = 4096;

/// `Ok(())` accepts; `Err(reason)` rejects. `timeout` runs by `clock`.
pub fn run(argv: &[String], input: &[u8], timeout: Duration, clock: &Clock) -> Result<(), String> {
    let Some((prog, args)) = argv.split_first() else {
        return Err("before_trigger is empty".into());
    };
    let mut child = Command::new(prog)
        .args(args)
        .process_group(0)
        // A trigger must never speak to systemd for us.
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("before_trigger {prog:?} could not start: {e}"))?;
    let (writer, stderr_rx) = feed_and_drain(&mut child, input);
    let status = wait_until(&mut child, prog, (timeout, clock));
    // A grandchild may still hold the pipes open: never wait on it for long.
    let stderr = stderr_rx
        .recv_timeout(Duration::from_millis(200))
        .unwrap_or_default();
    drop(writer);
    let status = status?;
    if status.success() {
        Ok(())
    } else {
        let text = String::from_utf8_lossy(&stderr).trim().to_owned();
        Err(if text.is_empty() {
            format!("before_trigger {prog:?} rejected the op ({status})")
        } else {
            text
        })
    }
}

/// Feeds stdin and drains stderr on helper threads so a trigger that ignores its input or
/// prints megabytes can never block us; both end when the child's pipes close. Keeps at most
/// `TRIGGER_STDERR_BYTES_MAX` of stderr, sent on the returned channel.
fn feed_and_drain(
    child: &mut std::process::Child,
    input: &[u8],
) -> (std::thread::JoinHandle<()>, mpsc::Receiver<Vec<u8>>) {
    let mut stdin = child.stdin.take();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(&input);
        }
    });
    let mut stderr = child.stderr.take();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        if let Some(s) = stderr.as_mut() {
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let room = TRIGGER_STDERR_BYTES_MAX.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
        let _ = tx.send(kept);
    });
    (writer, rx)
}

/// Waits for the trigger until `timeout` has passed by `clock`, then kills its whole process
/// group (a trigger's own children die with it). The sleeps between looks are counted too:
/// they take at least their length of real time, so a trigger (a real process) is killed
/// in time even on a simulated disk whose clock stands still.
fn wait_until(
    child: &mut std::process::Child,
    prog: &str,
    (timeout, clock): (Duration, &Clock),
) -> Result<std::process::ExitStatus, String> {
    let deadline = clock.now() + timeout;
    let step = Duration::from_millis(2);
    let mut slept = Duration::ZERO;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Ok(st),
            Ok(None) if clock.now() >= deadline || slept >= timeout => {
                if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
                }
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "before_trigger {prog:?} killed after {} ms time limit",
                    timeout.as_millis()
                ));
            }
            Ok(None) => {
                std::thread::sleep(step);
                slept += step;
            }
            Err(e) => return Err(format!("before_trigger {prog:?}: wait failed: {e}")),
        }
    }
}
