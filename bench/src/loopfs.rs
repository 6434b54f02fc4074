//! [`LoopMount`]: a fresh journaled ext4 file system in an image file, loop-mounted for one
//! benchmark run and torn down at drop (unmounted, the loop device detached, the image
//! removed), whatever path the run leaves by. The development machine's own ext4 has no
//! journal (docs/benchmarks.md, "Ceiling"); a server's has one, and the two differ in what a
//! sync costs and in how the inode allocator behaves under a busy spool, so benchmarks that
//! mean to say something about a server run on one of these. Needs root, `mkfs.ext4`,
//! `losetup` and `mount`. It never touches anything outside `base`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context};

/// A fresh journaled ext4 image, loop-mounted at `<base>/mnt`; unmounted, detached and
/// removed at drop.
pub(crate) struct LoopMount {
    pub(crate) dir: PathBuf,
    /// The loop device; `None` until `losetup` has attached one.
    dev: Option<String>,
    mounted: bool,
    image: PathBuf,
}

/// Runs `cmd args`, returns its stdout; an error naming the command and its stderr if it fails.
pub(crate) fn sh(cmd: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("run {cmd}"))?;
    ensure!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Whether this process runs as root (`Uid:` in /proc/self/status; the bench crate has no
/// `unsafe` for `geteuid`).
pub(crate) fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Unmounts and detaches what an interrupted run (SIGINT: no destructors) left under `base`:
/// every mount point below it (lazily), then every loop device backed by an image below it.
/// Called before a benchmark clears its directory, so a rerun starts clean.
pub(crate) fn clear_stale(base: &Path) {
    let Ok(base) = base.canonicalize() else {
        return;
    };
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for point in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
        if Path::new(point).starts_with(&base) {
            eprintln!("unmounting {point}, left by an earlier run");
            let _ = sh("umount", &["-l", point]);
        }
    }
    let devices = sh(
        "losetup",
        &["--list", "--noheadings", "--output", "NAME,BACK-FILE"],
    )
    .unwrap_or_default();
    for l in devices.lines() {
        let mut f = l.split_whitespace();
        if let (Some(dev), Some(file)) = (f.next(), f.next()) {
            if Path::new(file).starts_with(&base) {
                eprintln!("detaching {dev} ({file}), left by an earlier run");
                let _ = sh("losetup", &["-d", dev]);
            }
        }
    }
}

impl LoopMount {
    /// `mkfs.ext4 -q -F -j` (the default journal) on a sparse image of `bytes`, lazily
    /// initialised (the kernel zeroes inode tables in the background after the mount): what
    /// the soak and the replication bench have always used.
    pub(crate) fn new(base: &Path, bytes: u64) -> anyhow::Result<LoopMount> {
        let m = LoopMount::make(base, bytes, &[])?;
        println!(
            "loop-mounted ext4 image {} on {}",
            m.device(),
            m.dir.display()
        );
        Ok(m)
    }

    /// As [`LoopMount::new`], but with the inode tables and the journal written by `mkfs`
    /// (`lazy_itable_init=0,lazy_journal_init=0`), so no background zeroing competes with a
    /// short measurement.
    pub(crate) fn eager(base: &Path, bytes: u64) -> anyhow::Result<LoopMount> {
        LoopMount::make(
            base,
            bytes,
            &["-E", "lazy_itable_init=0,lazy_journal_init=0"],
        )
    }

    fn make(base: &Path, bytes: u64, mkfs_extra: &[&str]) -> anyhow::Result<LoopMount> {
        std::fs::create_dir_all(base).with_context(|| format!("create {}", base.display()))?;
        // From here on, Drop undoes whatever was done, on every error path below.
        let mut m = LoopMount {
            dir: base.join("mnt"),
            dev: None,
            mounted: false,
            image: base.join("fs.img"),
        };
        let f = std::fs::File::create(&m.image)
            .with_context(|| format!("create {}", m.image.display()))?;
        f.set_len(bytes)
            .with_context(|| format!("size {}", m.image.display()))?;
        drop(f);
        let img = m.image.to_string_lossy().into_owned();
        let mut args = vec!["-q", "-F", "-j"];
        args.extend_from_slice(mkfs_extra);
        args.push(&img);
        sh("mkfs.ext4", &args)?;
        m.dev = Some(sh("losetup", &["--find", "--show", &img])?);
        std::fs::create_dir_all(&m.dir).with_context(|| format!("create {}", m.dir.display()))?;
        let dev = m.dev.clone().unwrap_or_default();
        sh("mount", &[&dev, &m.dir.to_string_lossy()])?;
        m.mounted = true;
        Ok(m)
    }

    /// Flush requests the loop device has completed so far (`/sys/block/loopN/stat`, its
    /// 16th field, Linux 5.5 and later): each is a cache flush the image's backing file pays
    /// for. `None` where the kernel does not count them.
    pub(crate) fn flush_requests(&self) -> Option<u64> {
        let dev = self.dev.as_deref()?.rsplit('/').next()?;
        let stat = std::fs::read_to_string(format!("/sys/block/{dev}/stat")).ok()?;
        stat.split_whitespace().nth(15)?.parse().ok()
    }

    /// The loop device, for messages.
    pub(crate) fn device(&self) -> &str {
        self.dev.as_deref().unwrap_or("(none)")
    }
}

impl Drop for LoopMount {
    /// Unmounts (retried while something still holds a file open, then lazily, so nothing is
    /// ever left mounted), detaches the device and removes the image.
    fn drop(&mut self) {
        let dir = self.dir.to_string_lossy().into_owned();
        if self.mounted {
            let mut done = false;
            for _ in 0..20 {
                if sh("umount", &[&dir]).is_ok() {
                    done = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            if !done {
                eprintln!("umount {dir} kept failing; detaching it lazily (umount -l)");
                let _ = sh("umount", &["-l", &dir]);
            }
        }
        if let Some(dev) = &self.dev {
            let _ = sh("losetup", &["-d", dev]);
        }
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.dir);
    }
}
