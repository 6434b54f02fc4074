//! The checks: `roost verify` (offline, every checksum and the spec's invariants) and
//! `roost drill` (crash-recovery drill on a scratch directory). Both answer with exit 0 when
//! everything holds and 1 on any violation; the checking itself lives in `ops`.

use std::path::{Path, PathBuf};

use roost_storage::RealStorage;

use crate::config::Config;
use crate::error::{EXIT_FAILED, EXIT_OK};

pub(super) fn verify(cfg: &Config) -> anyhow::Result<i32> {
    let report = crate::ops::verify::verify(RealStorage::shared(), &cfg.data_dir);
    let mut text = format!("roost verify {}\n", cfg.data_dir.display());
    for line in &report.checked {
        text += &format!("  checked {line}\n");
    }
    for v in &report.violations {
        text += &format!("  VIOLATION {v}\n");
    }
    text += if report.ok() {
        "all invariants hold\n"
    } else {
        "FAILED\n"
    };
    super::output::out(&text)?;
    Ok(if report.ok() { EXIT_OK } else { EXIT_FAILED })
}

/// The drill on `data_dir` (its daemon gets `<dir>/data`; the replicated drill's nodes
/// `<dir>/a` and `<dir>/b`), else on a fresh scratch directory.
/// Which drill `roost drill` runs.
pub(super) enum DrillKind {
    One,
    Replicated,
    /// `--cluster`: strikes on the leader, a rolling restart or a quiet run (`mode`).
    Cluster(crate::drill::ClusterRun),
}

pub(super) fn drill(
    data_dir: Option<&Path>,
    mut opts: crate::drill::DrillOptions,
    kind: DrillKind,
) -> anyhow::Result<i32> {
    opts.data_dir = match data_dir {
        Some(d) => d.to_path_buf(),
        None => scratch_dir()?,
    };
    let violations = match kind {
        DrillKind::One => crate::drill::run(&opts)?,
        DrillKind::Replicated => crate::drill::run_replicated(&opts)?,
        DrillKind::Cluster(run) => crate::drill::run_cluster(&opts, &run)?,
    };
    super::output::out(&format!("drill directory: {}\n", opts.data_dir.display()))?;
    Ok(if violations == 0 {
        EXIT_OK
    } else {
        EXIT_FAILED
    })
}

/// A fresh scratch directory under the system temporary directory.
fn scratch_dir() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    for n in 0..1000u32 {
        let d = base.join(format!("roost-drill-{}-{n}", std::process::id()));
        if std::fs::create_dir(&d).is_ok() {
            return Ok(d);
        }
    }
    anyhow::bail!("cannot create a scratch directory in {}", base.display())
}
