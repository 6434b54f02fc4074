//! The client's side of the spool, in one place: how a batch file is delivered so that the
//! daemon never sees half of it and a power loss never loses an acknowledged delivery.
//! Used by `roost submit` and the tests; it never waits for a result and never picks a name.

use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::SpoolPaths;

/// Temporaries made by this process so far: with the pid, a temporary name no other
/// delivery (another thread, another process) is using.
static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Delivers `bytes` as `new/NAME`: write `tmp/.NAME.PID.N`, fsync it, rename it into `new/`,
/// fsync `new/`. The daemon ignores dot-files, and the rename is atomic, so it sees the whole
/// file or none; once this returns the file survives a power loss. An existing `new/NAME`
/// is replaced (pick a free name first). Errors name the file and the step.
pub fn deliver(spool: &SpoolPaths, name: &str, bytes: &[u8]) -> io::Result<()> {
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = spool
        .tmp
        .join(format!(".{name}.{}.{seq}", std::process::id()));
    let target = spool.new.join(name);
    let written = write_synced(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, &target).map_err(named("renaming into", &target)));
    if let Err(e) = written {
        // Best effort: a stray dot-file in tmp/ is harmless, but not worth leaving.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(&spool.new)
        .and_then(|d| d.sync_all())
        .map_err(named("syncing", &spool.new))
}

/// Creates `path` (never over an existing file), writes `bytes` and fsyncs them.
fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(named("creating", path))?;
    f.write_all(bytes).map_err(named("writing", path))?;
    f.sync_all().map_err(named("syncing", path))
}

/// The same error kind, with the step and the path in front of the message.
fn named<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> io::Error + 'a {
    move |e| io::Error::new(e.kind(), format!("{step} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a delivered file is in `new/` whole, nothing is left in `tmp/`, and a missing
    /// spool fails with the path in the message.
    #[test]
    fn delivers_whole_file_and_names_failures() {
        let t = tempfile::tempdir().unwrap();
        let sp = SpoolPaths::new(t.path());
        std::fs::create_dir_all(&sp.tmp).unwrap();
        std::fs::create_dir_all(&sp.new).unwrap();
        deliver(&sp, "a.json", b"{}").unwrap();
        assert_eq!(std::fs::read(sp.new.join("a.json")).unwrap(), b"{}");
        assert_eq!(std::fs::read_dir(&sp.tmp).unwrap().count(), 0);
        let missing = SpoolPaths::new(&t.path().join("nope"));
        let e = deliver(&missing, "a.json", b"{}").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("nope/tmp"), "{e}");
    }
}
