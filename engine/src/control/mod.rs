//! What an operator asks the running daemon, and how it tells systemd: the control socket
//! (`socket`: `roost status`, `--metrics`, `promote`), the status JSON (`status_json`), the
//! metrics (`metrics`: every figure through the `prometheus-client` encoders, OpenMetrics or
//! Prometheus text 0.0.4), the HTTP endpoint that serves them on `metrics_listen` (`http`),
//! and the systemd notify protocol (`notify`). It reads the engine's figures (`Stats`, kept
//! by `pipeline/stats.rs`) and never changes the engine, except `promote` on request.

pub mod http;
pub mod metrics;
pub mod notify;
pub mod socket;
pub mod status_json;
