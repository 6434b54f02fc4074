//! What an operator uses beside the pipeline: the control socket with `status` and
//! Prometheus metrics (`control`), the systemd notify protocol (`notify`), the offline
//! invariant check (`verify`) and the crash-recovery drill (`drill`).

pub mod control;
pub mod drill;
pub mod notify;
pub mod verify;
