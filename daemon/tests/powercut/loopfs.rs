//! Loop-mounted ext4 images for the power-cut harness: make an image, attach and mount it
//! with a long journal commit interval (so only an fsync makes anything durable), copy a set
//! of images at a moment when none of their loop devices has a write in flight (that copy is
//! the disk after a power cut), and always unmount and detach, also when a test panics.
//! Nothing here knows roost.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs a command; `Err` carries the command line and its stderr.
fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The effective uid, from `/proc/self/status` (no `unsafe`, no extra crate).
pub fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Says that `test` cannot run here (no root, no loop devices) and why, on stdout and stderr,
/// and fails unless `ROOST_ALLOW_NO_ROOT=1` allows it: never a silent skip.
pub fn skip_or_fail(test: &str, why: &str) {
    let line = format!("SKIPPED: {test} needs root (loop mounts)");
    println!("{line}: {why}");
    eprintln!("{line}: {why}");
    assert!(
        std::env::var("ROOST_ALLOW_NO_ROOT").as_deref() == Ok("1"),
        "{line} ({why}); set ROOST_ALLOW_NO_ROOT=1 to allow this"
    );
}

/// A fresh journaled ext4 file system on a sparse file of `bytes`, with an inode per 4 KiB
/// (a spool holds many small files: the default ratio ran out of inodes after ~12,000
/// results on a 96 MiB image).
pub fn make_image(path: &Path, bytes: u64) -> Result<(), String> {
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.set_len(bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    drop(f);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-i", "4096"])
        .arg(path))
    .map(|_| ())
}

/// Copies an image file keeping its holes (the images are mostly empty).
pub fn copy_image(from: &Path, to: &Path) -> Result<(), String> {
    run(Command::new("cp").arg("--sparse=always").arg(from).arg(to)).map(|_| ())
}

/// One image attached to a loop device and mounted. Dropping it unmounts and detaches.
pub struct Mount {
    /// `/dev/loopN`; empty once detached.
    dev: String,
    pub dir: PathBuf,
    pub img: PathBuf,
    mounted: bool,
}

/// Why a mount failed: not allowed here (no root, no loop devices), or anything else.
pub enum MountError {
    NotPermitted(String),
    Other(String),
}

impl Mount {
    /// `losetup -f --show IMG`, then `mount -t ext4 -o commit=600 DEV DIR`: a journal commit
    /// every ten minutes, so within a test only fsync (and the kernel's write-back, which a
    /// disk may receive at any time anyway) puts anything on the image.
    pub fn attach(img: &Path, dir: &Path) -> Result<Mount, MountError> {
        std::fs::create_dir_all(dir).map_err(|e| MountError::Other(e.to_string()))?;
        let dev = run(Command::new("losetup").args(["-f", "--show"]).arg(img)).map_err(classify)?;
        let mut m = Mount {
            dev,
            dir: dir.to_path_buf(),
            img: img.to_path_buf(),
            mounted: false,
        };
        run(Command::new("mount")
            .args(["-t", "ext4", "-o", "commit=600", &m.dev])
            .arg(dir))
        .map_err(classify)?;
        m.mounted = true;
        Ok(m)
    }

    /// The block layer's counters for the loop device (`/sys/block/loopN/stat`).
    fn stat(&self) -> Result<Vec<u64>, String> {
        let name = self.dev.trim_start_matches("/dev/");
        let p = format!("/sys/block/{name}/stat");
        let text = std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))?;
        Ok(text
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect())
    }

    /// Writes (and discards and flushes) completed so far and requests in flight: fields 5,
    /// 12 and 16 (counts) and 9 (in flight) of the stat file. Time fields are left out.
    fn writes(&self) -> Result<(Vec<u64>, u64), String> {
        let s = self.stat()?;
        let pick = |i: usize| s.get(i).copied().unwrap_or(0);
        Ok((vec![pick(4), pick(11), pick(15)], pick(8)))
    }

    /// Unmounts (retrying while busy, then lazily) and detaches; never panics.
    pub fn release(&mut self) {
        if self.mounted {
            let mut ok = false;
            for _ in 0..50 {
                if run(Command::new("umount").arg(&self.dir)).is_ok() {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !ok {
                let _ = run(Command::new("umount").arg("-l").arg(&self.dir));
            }
            self.mounted = false;
        }
        if !self.dev.is_empty() {
            let _ = run(Command::new("losetup").arg("-d").arg(&self.dev));
            self.dev.clear();
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.release();
    }
}

fn classify(e: String) -> MountError {
    let l = e.to_lowercase();
    if l.contains("permission denied")
        || l.contains("not permitted")
        || l.contains("must be superuser")
        || l.contains("no such file or directory")
    {
        MountError::NotPermitted(e)
    } else {
        MountError::Other(e)
    }
}

/// Copies every mount's image to its destination at one moment when no loop device has a
/// write in flight, and checks that no write completed while copying (else tries again, up
/// to 20 times). The loop device completes a write only once it is in the backing file (the
/// host's page cache), which `cp` reads: so the copy holds exactly the writes the virtual
/// disks completed, and nothing the guest file system still holds only in its own page
/// cache. Returns the attempts it took.
pub fn copy_quiescent(pairs: &[(&Mount, PathBuf)]) -> Result<u32, String> {
    let until = Instant::now() + Duration::from_secs(30);
    for attempt in 1..=20 {
        let before = wait_idle(pairs, until)?;
        for (m, to) in pairs {
            copy_image(&m.img, to)?;
        }
        let after: Vec<_> = pairs
            .iter()
            .map(|(m, _)| m.writes())
            .collect::<Result<_, _>>()?;
        if after.iter().all(|(_, inflight)| *inflight == 0) && after == before {
            return Ok(attempt);
        }
    }
    Err("the loop devices kept writing while their images were copied".into())
}

/// Waits until no device has a request in flight and the counters stay put for 30 ms.
fn wait_idle(pairs: &[(&Mount, PathBuf)], until: Instant) -> Result<Vec<(Vec<u64>, u64)>, String> {
    loop {
        let a: Vec<_> = pairs
            .iter()
            .map(|(m, _)| m.writes())
            .collect::<Result<_, _>>()?;
        std::thread::sleep(Duration::from_millis(30));
        let b: Vec<_> = pairs
            .iter()
            .map(|(m, _)| m.writes())
            .collect::<Result<_, _>>()?;
        if a == b && b.iter().all(|(_, inflight)| *inflight == 0) {
            return Ok(b);
        }
        if Instant::now() > until {
            return Err("the loop devices never went idle".into());
        }
    }
}
