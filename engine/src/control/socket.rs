//! The control socket (a Unix stream socket, mode 0660, in `$RUNTIME_DIRECTORY` or the data
//! directory) behind `roost status` and `roost promote`, and the places of roost's client
//! sockets. The protocol is one request line, one answer, then the server closes: `status`
//! answers JSON (`status.rs`), `metrics` answers the Prometheus text format 0.0.4
//! (`metrics.rs`, as `roost status --metrics` always printed), `promote` promotes a standby.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tracing::debug;

use super::metrics::{render, Format};
use super::status_json::status_with;
use crate::cluster::Cluster;
use crate::config::Config;
use crate::pipeline::{Engine, Lead};
use crate::replica::Node;

/// `$RUNTIME_DIRECTORY/roost.sock` under systemd, else `<data-dir>/roost.sock`; the config's
/// `control_socket` overrides both.
pub fn socket_path(cfg: &Config) -> PathBuf {
    runtime_socket(cfg.control_socket.as_deref(), "roost.sock", &cfg.data_dir)
}

pub use crate::config::runtime_socket;

/// Binds one of roost's client sockets (the control socket, the stream socket): a stale one
/// removed first (the data directory lock guarantees no other daemon owns it), then mode
/// 0660 (the daemon's group; the umask never widens it). Call from within the runtime.
pub fn bind_socket(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = roost_storage::Storage::remove(&roost_storage::RealStorage, path);
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// Answers requests on the control socket (bound by [`bind_socket`] before `serving` is
/// logged and READY=1 sent, so that `roost status` works as soon as they say so) until the
/// task is dropped: a request line of at most 256 bytes, read within 5 s.
pub async fn serve_socket(
    listener: tokio::net::UnixListener,
    node: Node,
    cluster: Option<Arc<Cluster>>,
) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let (node, cluster) = (node.clone(), cluster.clone());
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(tokio::io::AsyncReadExt::take(r, 256));
            let read = tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line));
            if !matches!(read.await, Ok(Ok(_))) {
                return;
            }
            let text = answer(line.trim(), &node, cluster.as_ref()).await;
            if let Err(e) = w.write_all(text.as_bytes()).await {
                debug!(error = %e, "control client went away");
            }
        });
    }
}

/// The answer to one request line.
async fn answer(request: &str, node: &Node, cluster: Option<&Arc<Cluster>>) -> String {
    match request {
        "status" => format!("{}\n", status_with(node, cluster.map(|c| &**c))),
        "metrics" => render(node, cluster, Format::Text004)
            .unwrap_or_else(|e| format!("# metrics could not be rendered: {e}\n")),
        "promote" if cluster.is_some() => format!(
            "{}\n",
            json!({"promoted": false, "error": "this node is in a [cluster]: etcd elects the leader (stop the leader, or let its lease run out)"})
        ),
        "promote" => format!("{}\n", promote(&node.engine).await),
        other => format!(
            "{}\n",
            json!({"error": format!("unknown request {other:?}: try status, metrics or promote")})
        ),
    }
}

/// `promote`: this standby becomes the primary of a new epoch (`Standby::promote`); the
/// serve loop then stops following, finishes the claims it holds and opens the spool.
async fn promote(engine: &Arc<Engine>) -> serde_json::Value {
    let e = engine.clone();
    match tokio::task::spawn_blocking(move || e.standby().promote(Lead::Next)).await {
        Ok(Ok(epoch)) => {
            json!({"promoted": true, "epoch": epoch, "next_lsn": engine.last_lsn() + 1})
        }
        Ok(Err(e)) => json!({"promoted": false, "error": e.to_string()}),
        Err(e) => json!({"promoted": false, "error": e.to_string()}),
    }
}

/// The client side: one request, the whole answer.
pub fn request(path: &Path, what: &str) -> std::io::Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{what}\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}
