//! What an operator uses beside the pipeline: the control socket with `status` and
//! Prometheus metrics (`control`), the systemd notify protocol (`notify`), the offline
//! invariant check (`verify`), the streaming intake's protocol (`stream`: socket, line
//! framing, answer shapes), and the certificates of a test cluster's mutual TLS
//! (`tls_certs`, behind `roost certs`). The crash drill is its own folder, `drill/`.

pub mod control;
pub mod notify;
pub mod tls_certs;
pub mod verify;
