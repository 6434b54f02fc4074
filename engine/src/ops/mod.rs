//! What an operator uses beside the pipeline: the offline invariant check (`verify`) and the
//! certificates of a test cluster's mutual TLS (`tls_certs`, behind `roost certs`). The crash
//! drill is its own folder, `drill/`; the control socket, metrics and the notify protocol are
//! `control/`, the stream protocol `intake/`.

pub mod tls_certs;
pub mod verify;
