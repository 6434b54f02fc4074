//! The quarantine's bookkeeping: `failed/` keeps at most `failed_files_max` entries and
//! `failed_bytes_max` bytes of disk blocks, the oldest removed first, so a flood of bad files
//! cannot fill the disk. It reads `failed/` with `std::fs` (quarantined files are outside what
//! recovery relies on) and removes through the storage seam.

use tracing::warn;

/// The quarantine's bookkeeping: oldest first, so a flood of bad files cannot fill the disk.
pub struct FailedDir {
    storage: std::sync::Arc<dyn roost_storage::Storage>,
    dir: std::path::PathBuf,
    /// `out/`: an evicted file's `invalid` result goes with it, so results of invalid files
    /// are bounded like `failed/` (a result of a later batch under the name stays).
    out: std::path::PathBuf,
    entries: std::collections::VecDeque<(String, u64)>,
    bytes: u64,
}

/// Disk space an entry takes (allocated blocks, so a sparse file counts for what it uses).
fn entry_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

impl FailedDir {
    /// Reads what `failed/` already holds, oldest first by modification time.
    pub fn load(
        storage: std::sync::Arc<dyn roost_storage::Storage>,
        dir: &std::path::Path,
        out: &std::path::Path,
    ) -> FailedDir {
        let mut found: Vec<(std::time::SystemTime, String, u64)> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        let m = e.path().symlink_metadata().ok()?;
                        Some((
                            m.modified().ok()?,
                            e.file_name().to_str()?.to_owned(),
                            entry_bytes(&e.path()),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        let bytes = found.iter().map(|f| f.2).sum();
        FailedDir {
            storage,
            dir: dir.to_path_buf(),
            out: out.to_path_buf(),
            entries: found.into_iter().map(|(_, n, b)| (n, b)).collect(),
            bytes,
        }
    }

    /// Records `name` as just quarantined, then removes the oldest entries past the limits.
    pub fn add(&mut self, name: &str, files_max: usize, bytes_max: u64) {
        if let Some(i) = self.entries.iter().position(|(n, _)| n == name) {
            if let Some((_, b)) = self.entries.remove(i) {
                self.bytes -= b;
            }
        }
        let b = entry_bytes(&self.dir.join(name));
        self.entries.push_back((name.to_owned(), b));
        self.bytes += b;
        // Oldest first; a single entry larger than the whole budget goes too (it cannot be
        // kept within it), rather than evicting everything else.
        while self.entries.len() > files_max || self.bytes > bytes_max {
            let Some((old, b)) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= b;
            let path = self.dir.join(&old);
            let r = match std::fs::symlink_metadata(&path) {
                Ok(_) => self.storage.remove_all(&path),
                Err(e) => Err(e),
            };
            match r {
                Ok(()) => {
                    let result = self.remove_invalid_result(&old);
                    warn!(file = %old, bytes = b, files_max, bytes_max, result_removed = result,
                        "failed/ over its limits: removed the oldest quarantined file")
                }
                Err(e) => {
                    warn!(file = %old, error = %e, "failed/ over its limits: cannot remove the oldest quarantined file")
                }
            }
        }
    }
}

impl FailedDir {
    /// Removes `out/NAME` if it is an `invalid` result (the evicted file's); true if it did.
    fn remove_invalid_result(&self, name: &str) -> bool {
        let path = self.out.join(name);
        let invalid = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<crate::batch::BatchResult>(&b).ok())
            .is_some_and(|r| r.status() == crate::batch::Status::Invalid);
        invalid && self.storage.remove(&path).is_ok()
    }
}
