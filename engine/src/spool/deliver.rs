//! The client's side of the spool, in one place: how a batch file is delivered so that the
//! daemon never sees half of it and a power loss never loses an acknowledged delivery.
//! Used by `roost submit` and the tests; it never waits for a result and never picks a name.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use roost_storage::{replace_file, OpenMode, RealStorage, Storage};

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
    // The temporary is in tmp/, the target in new/ (one file system): `replace_file` syncs
    // new/, the directory the name appears in.
    let written = replace_file(&RealStorage, &tmp, &target, bytes, OpenMode::CreateNew);
    written.map_err(|e| {
        // Best effort: a stray dot-file in tmp/ is harmless, but not worth leaving.
        let _ = RealStorage.remove(&tmp);
        io::Error::new(e.source.kind(), e.to_string())
    })
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
