//! The kernel's mount table as redbfs reads it (which mount is a redbfs mount, of which store,
//! decided by the store file's identity), stale mounts of a dead daemon, and unmounting
//! (mount(2) as root, fusermount3 for users).

use std::path::{Path, PathBuf};
use std::process::Command;

use nix::errno::Errno;
use nix::mount::MntFlags;

/// One line of /proc/self/mountinfo that matters here.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
}

pub(super) fn unescape_mountinfo(s: &str) -> String {
    // mountinfo writes space, tab, newline and backslash as \ooo octal escapes.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|o| o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(o)) => {
                out.push((o[0] - b'0') * 64 + (o[1] - b'0') * 8 + (o[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every mount in this mount namespace.
pub fn mounts() -> Vec<MountEntry> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mp = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let fstype = r.next()?;
            let source = r.next()?;
            Some(MountEntry {
                mountpoint: PathBuf::from(unescape_mountinfo(mp)),
                fstype: fstype.to_string(),
                source: unescape_mountinfo(source),
            })
        })
        .collect()
}

/// The redbfs mount at `mountpoint`, if any, and the store behind it.
pub fn redbfs_mount_at(mountpoint: &Path) -> Option<PathBuf> {
    mounts()
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == mountpoint && m.fstype == "fuse.redbfs")
        .and_then(|m| m.source.strip_prefix("redbfs:").map(PathBuf::from))
}

/// Where the store at `store` is mounted, if it is.
pub fn mountpoint_of_store(store: &Path) -> Option<PathBuf> {
    // The same file, not the same spelling: a symlink to the store, a symlinked directory or
    // a hard link reaches the live file too. Identity is the device and inode (stat follows
    // symlinks, as opening the path would).
    let identity = |p: &Path| {
        std::fs::metadata(p).ok().map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        })
    };
    let wanted = identity(store)?;
    mounts()
        .into_iter()
        .filter(|m| m.fstype == "fuse.redbfs")
        .find(|m| {
            m.source
                .strip_prefix("redbfs:")
                .is_some_and(|s| identity(Path::new(s)) == Some(wanted))
        })
        .map(|m| m.mountpoint)
}

/// Whether a FUSE mount at `mountpoint` has lost its daemon. statfs always reaches the daemon
/// (stat may be answered from the kernel's attribute cache), so it is the probe.
pub(super) fn is_stale(mountpoint: &Path) -> bool {
    matches!(nix::sys::statfs::statfs(mountpoint), Err(Errno::ENOTCONN))
}

/// Detaches a mount whose daemon is gone.
pub(super) fn clear_stale(mountpoint: &Path) -> Result<(), String> {
    let r = if nix::unistd::geteuid().is_root() {
        nix::mount::umount2(mountpoint, MntFlags::MNT_DETACH).map_err(|e| e.to_string())
    } else {
        fusermount_unmount(mountpoint)
    };
    r.map_err(|e| {
        format!(
            "{}: could not clear the stale mount: {e}",
            mountpoint.display()
        )
    })
}

pub(super) fn fusermount_unmount(mountpoint: &Path) -> Result<(), String> {
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(mountpoint)
        .output()
        .map_err(|e| format!("fusermount3: {e} (install the fuse3 package)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Unmounts a live mount: a plain unmount, or a lazy one if files are still open.
pub fn kernel_unmount(mountpoint: &Path) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return fusermount_unmount(mountpoint);
    }
    match nix::mount::umount(mountpoint) {
        Ok(()) => Ok(()),
        Err(Errno::EBUSY) => {
            tracing::warn!(mountpoint = %mountpoint.display(), "busy: detaching lazily; the daemon exits when the last open file closes");
            nix::mount::umount2(mountpoint, MntFlags::MNT_DETACH).map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}
