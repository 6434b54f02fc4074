//! `roost config check [--print]`: load the configuration as `serve` would (the file, the
//! flags, the environment), check what `serve` checks before it opens anything (the values,
//! the metrics listener's web configuration and TLS files, replication's TLS files), and
//! with `--print` show the effective configuration, each value with where it came from
//! (`config/effective.rs`). A bad configuration exits 78, as `serve` would.

use crate::config::effective::{render, Origin};
use crate::config::{Config, ConfigError};
use crate::error::EXIT_OK;

/// What the command line said: the `--config` file, and whether `--data-dir` and
/// `--spool-dir` were given (their values are in `cfg` already).
pub(super) struct Given<'a> {
    pub config: Option<&'a std::path::Path>,
    pub data_dir: bool,
    pub spool_dir: bool,
}

pub(super) fn check(cli: &Given<'_>, cfg: &Config, print: bool) -> anyhow::Result<i32> {
    crate::control::http::web::Web::load(cfg)?;
    crate::replica::transport::transport(&cfg.replication)?;
    if !print {
        let from = match &cli.config {
            Some(p) => format!("{}", p.display()),
            None => "the embedded default (no --config)".to_owned(),
        };
        super::output::out(&format!("configuration ok: {from}\n"))?;
        return Ok(EXIT_OK);
    }
    let file = match &cli.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.to_path_buf(),
                source,
            })?;
            let table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: p.to_path_buf(),
                detail: e.to_string(),
            })?;
            Some((*p, table))
        }
        None => None,
    };
    let mut flags = Vec::new();
    if cli.data_dir {
        flags.push(("data_dir", "--data-dir"));
    }
    if cli.spool_dir {
        flags.push(("spool_dir", "--spool-dir"));
    }
    super::output::out(&render(cfg, &Origin { file, flags }))?;
    Ok(EXIT_OK)
}
