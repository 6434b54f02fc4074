//! systemd's notify protocol through the sd-notify crate: READY=1 after recovery, STATUS=
//! lines, STOPPING=1, WATCHDOG=1. Every call is a no-op without `NOTIFY_SOCKET`, and a
//! failure to notify is logged, never fatal.

use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

pub fn status(msg: &str) {
    send(&[NotifyState::Status(msg)]);
}

pub fn ready() {
    send(&[NotifyState::Ready, NotifyState::Status("serving")]);
}

pub fn stopping(msg: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(msg)]);
}

pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// The watchdog interval systemd asked for (`WATCHDOG_USEC`), if any.
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0;
    sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec))
}
