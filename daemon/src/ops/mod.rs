//! What an operator uses beside the pipeline: the control socket with `status` and
//! Prometheus metrics (`control`), the systemd notify protocol (`notify`), the offline
//! invariant check (`verify`), the crash-recovery drill (`drill`) and `roost serve` as a child
//! process (`child`: the drill's, public so black-box tests can start the daemon the same way),
//! the streaming intake's protocol (`stream`: socket, line framing, answer shapes), and the
//! certificates of a test cluster's mutual TLS (`certs`, behind `roost certs`).

pub mod certs;
pub mod child;
pub mod control;
pub mod drill;
pub mod notify;
pub mod stream;
pub mod verify;
