//! What runs beside the serve loop: the control socket (`roost status`), the optional
//! Prometheus endpoint, and the systemd STATUS=/WATCHDOG= ticker.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::warn;

use crate::config::Config;
use crate::control::{http, notify, socket};
use crate::pipeline::Engine;
use crate::replica::Node;

pub(super) struct Sidecars {
    pub socket: PathBuf,
    control: JoinHandle<()>,
    metrics: Option<JoinHandle<()>>,
    ticker: JoinHandle<()>,
}

impl Sidecars {
    /// Starts the control socket and metrics endpoint, says READY=1, then starts the ticker
    /// (READY=1 first: the ticker's first WATCHDOG=1 must not overtake it).
    pub fn start(
        cfg: &Config,
        node: &Node,
        cluster: Option<Arc<crate::cluster::Cluster>>,
    ) -> Sidecars {
        let socket = socket::socket_path(cfg);
        // Bound here, not in the task: `serving` and READY=1 come after this returns, and
        // a client that trusts them must find the socket (a task may run later).
        let bound = socket::bind_socket(&socket);
        let control = tokio::spawn({
            let (sock, node, cluster) = (socket.clone(), node.clone(), cluster.clone());
            async move {
                let served = match bound {
                    Ok(listener) => socket::serve_socket(listener, node, cluster).await,
                    Err(e) => Err(e),
                };
                if let Err(e) = served {
                    warn!(socket = %sock.display(), error = %e, "control socket unavailable; `roost status` will not work");
                }
            }
        });
        let metrics = cfg
            .metrics_listen
            .and_then(|addr| start_metrics(cfg, addr, node, cluster));
        notify::ready();
        let ticker = tokio::spawn(notify_loop(node.engine.clone()));
        Sidecars {
            socket,
            control,
            metrics,
            ticker,
        }
    }

    pub fn stop(self) {
        self.ticker.abort();
        self.control.abort();
        if let Some(m) = self.metrics {
            m.abort();
        }
        let _ = roost_storage::Storage::remove(&roost_storage::RealStorage, &self.socket);
    }
}

/// The metrics listener on `addr`, secured as `metrics_web_config` says. The file was
/// checked when `serve` started (a bad one exits 78 there); read again here for each life, a
/// file broken since, or a port another process holds, leaves the daemon serving without
/// the endpoint, with a warning.
fn start_metrics(
    cfg: &Config,
    addr: std::net::SocketAddr,
    node: &Node,
    cluster: Option<Arc<crate::cluster::Cluster>>,
) -> Option<JoinHandle<()>> {
    let web = match http::web::Web::load(cfg) {
        Ok(w) => Arc::new(w),
        Err(e) => {
            warn!(%addr, error = %e, "metrics endpoint unavailable");
            return None;
        }
    };
    let listener = match http::bind_metrics(addr) {
        Ok(l) => l,
        Err(e) => {
            warn!(%addr, error = %e, "metrics endpoint unavailable");
            return None;
        }
    };
    // The bound address (the port the kernel picked, for port 0).
    web.log_listening(listener.local_addr().unwrap_or(addr));
    let node = node.clone();
    Some(tokio::spawn(async move {
        if let Err(e) = http::serve_metrics_tcp(listener, web, node, cluster).await {
            warn!(%addr, error = %e, "metrics endpoint unavailable");
        }
    }))
}

/// Every second: STATUS= with the pipeline's state; WATCHDOG=1 at half the watchdog interval
/// but only while the pipeline is healthy (no batch stuck longer than the interval), so a
/// wedged shard or disk makes systemd restart us.
async fn notify_loop(engine: Arc<Engine>) {
    let watchdog = notify::watchdog_interval();
    let period = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 2).min(Duration::from_secs(1))
    });
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        let s = &engine.stats;
        notify::status(&format!(
            "serving, {} batches in flight, {} committed, last lsn {}",
            s.in_flight.load(Ordering::Relaxed),
            s.committed.load(Ordering::Relaxed),
            engine.last_lsn()
        ));
        if let Some(w) = watchdog {
            if engine.healthy(w) {
                notify::watchdog();
            } else {
                warn!("pipeline not healthy: withholding the watchdog ping");
            }
        }
    }
}
