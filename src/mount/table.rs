//! The kernel's mount table as redbfs reads it (which mount is a redbfs mount, of which store,
//! decided by the store file's identity and by who mounted it), stale mounts of a dead daemon,
//! and unmounting (umount2(2) as root, fusermount3 for users).
//!
//! Trust: a `fuse.redbfs` entry is believed only when its `user_id=` (set by the kernel from
//! mount(2), and by fusermount3 to the calling user, who cannot choose it) is this user's, or,
//! run as root, root's or the store file owner's. Anyone can make an entry of that type.
//!
//! Unmounting as root never goes by a path alone: a daemon knows its mount by the device number
//! of its FUSE connection, and unmounts what a path leads to only once that path, looked at
//! through a pinned parent directory and without following a symlink, leads to that device.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::MntFlags;
use nix::sys::stat::Mode;

/// A mount's device number (major, minor), as mountinfo and statx give it; for FUSE the minor
/// names the connection (`/sys/fs/fuse/connections/MINOR`).
pub type Dev = (u32, u32);

/// One line of /proc/self/mountinfo that matters here.
#[derive(Debug, Clone)]
pub struct MountEntry {
    /// The mount's id: unique among the mounts that exist.
    pub id: u64,
    pub dev: Dev,
    pub mountpoint: PathBuf,
    pub fstype: String,
    pub source: String,
    /// A FUSE mount's `user_id=`: who mounted it.
    pub user_id: Option<u32>,
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
    text.lines().filter_map(parse_mountinfo_line).collect()
}

/// `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS`.
fn parse_mountinfo_line(l: &str) -> Option<MountEntry> {
    let (left, right) = l.split_once(" - ")?;
    let mut f = left.split(' ');
    let id = f.next()?.parse().ok()?;
    let (major, minor) = f.nth(1)?.split_once(':')?;
    let mp = f.nth(1)?;
    let mut r = right.split(' ');
    let fstype = r.next()?;
    let source = r.next()?;
    let user_id = r
        .next()
        .unwrap_or("")
        .split(',')
        .find_map(|o| o.strip_prefix("user_id="))
        .and_then(|u| u.parse().ok());
    Some(MountEntry {
        id,
        dev: (major.parse().ok()?, minor.parse().ok()?),
        mountpoint: PathBuf::from(unescape_mountinfo(mp)),
        fstype: fstype.to_string(),
        source: unescape_mountinfo(source),
        user_id,
    })
}

/// Whether this process may believe the redbfs mount `m`: mounted by this user, or, for root,
/// by root or by `store_owner` (the owner of the store file it names). Another user's entry
/// may name any store and answer on any socket it can bind.
fn trusted(m: &MountEntry, store_owner: Option<u32>) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    match m.user_id {
        Some(u) if u == me => true,
        Some(u) if me == 0 => u == 0 || Some(u) == store_owner,
        _ => false,
    }
}

/// (device, inode, owner) of the file at `p`, following symlinks as opening it would.
fn identity(p: &Path) -> Option<(u64, u64, u32)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.uid()))
}

/// The redbfs mount at `mountpoint`, if any this process trusts, and the store behind it.
pub fn redbfs_mount_at(mountpoint: &Path) -> Option<PathBuf> {
    let m = mounts()
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == mountpoint && m.fstype == "fuse.redbfs")?;
    let store = PathBuf::from(m.source.strip_prefix("redbfs:")?);
    let owner = identity(&store).map(|(_, _, uid)| uid);
    trusted(&m, owner).then_some(store)
}

/// Where the store at `store` is mounted, if it is, by a mount this process trusts.
pub fn mountpoint_of_store(store: &Path) -> Option<PathBuf> {
    // The same file, not the same spelling: a symlink to the store, a symlinked directory or
    // a hard link reaches the live file too. Identity is the device and inode; the entry's
    // path is resolved only for an entry of a user trusted with that file (the path goes
    // through that user's directories, which another user may have turned into symlinks).
    let (dev, ino, owner) = identity(store)?;
    mounts()
        .into_iter()
        .filter(|m| m.fstype == "fuse.redbfs" && trusted(m, Some(owner)))
        .find(|m| {
            m.source.strip_prefix("redbfs:").is_some_and(|s| {
                identity(Path::new(s)).is_some_and(|(d, i, _)| (d, i) == (dev, ino))
            })
        })
        .map(|m| m.mountpoint)
}

/// Whether a FUSE mount at `mountpoint` has lost its daemon. statfs always reaches the daemon
/// (stat may be answered from the kernel's attribute cache), so it is the probe.
pub(super) fn is_stale(mountpoint: &Path) -> bool {
    matches!(nix::sys::statfs::statfs(mountpoint), Err(Errno::ENOTCONN))
}

/// Detaches a mount whose daemon is gone. As root, only what `mountpoint` leads to now (not
/// following a last symlink) and only if that answers `ENOTCONN`: the detach goes through the
/// descriptor it was checked on, so a path swapped meanwhile detaches nothing else.
pub(super) fn clear_stale(mountpoint: &Path) -> Result<(), String> {
    let r = if nix::unistd::geteuid().is_root() {
        detach_stale(mountpoint)
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

fn detach_stale(mountpoint: &Path) -> Result<(), String> {
    let (parent, name) = open_parent(mountpoint)?;
    let root = open_beneath(&parent, &name)?;
    match nix::sys::statfs::fstatfs(&root) {
        Err(Errno::ENOTCONN) => {}
        _ => return Err("it is not a mount whose daemon is gone (any more)".into()),
    }
    if !looked_at(&root, None)?.mount_root {
        return Err("not the root of a mount".into());
    }
    detach_through(&root)
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

/// A daemon's own mount: where it was made and the device number of its FUSE connection,
/// read from the mount table right after mounting (see `find_own`).
#[derive(Debug, Clone)]
pub struct OwnMount {
    pub path: PathBuf,
    pub dev: Dev,
}

/// The ids of every mount now, to tell the one about to be made from those already there.
pub(super) fn mount_ids() -> std::collections::HashSet<u64> {
    mounts().into_iter().map(|m| m.id).collect()
}

/// The mount this daemon just made of `source`: a `fuse.redbfs` entry of this user naming the
/// store that was not in `before`.
pub(super) fn find_own(
    mountpoint: &Path,
    source: &str,
    before: &std::collections::HashSet<u64>,
) -> Option<OwnMount> {
    let me = nix::unistd::getuid().as_raw();
    mounts()
        .into_iter()
        .rev()
        .find(|m| {
            m.fstype == "fuse.redbfs"
                && m.source == source
                && m.user_id == Some(me)
                && !before.contains(&m.id)
        })
        .map(|m| OwnMount {
            path: mountpoint.to_path_buf(),
            dev: m.dev,
        })
}

/// Why an unmount by path did not happen.
enum NotDone {
    /// The path does not lead to the mount (what it leads to, for the log).
    NotOurs(String),
    /// It does, and umount2 failed.
    Failed(String),
}

/// What a path leads to, as statx says without asking a FUSE daemon.
struct Looked {
    dev: Dev,
    mount_root: bool,
}

/// The parent directory of `path`, opened `O_PATH` (it pins that directory, wherever it is
/// renamed to), and the last component.
fn open_parent(path: &Path) -> Result<(OwnedFd, OsString), String> {
    let name = path
        .file_name()
        .ok_or_else(|| format!("{}: no last component", path.display()))?;
    let parent = path.parent().unwrap_or(Path::new("/"));
    let fd = nix::fcntl::open(
        parent,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", parent.display()))?;
    Ok((fd, name.to_owned()))
}

/// `name` in `parent`, opened `O_PATH` without following a symlink: a descriptor of exactly
/// what the name leads to now (the root of a mount on it, if one is).
fn open_beneath(parent: &OwnedFd, name: &OsStr) -> Result<OwnedFd, String> {
    nix::fcntl::openat(
        parent,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ENOTDIR | Errno::ELOOP => "a symlink or not a directory".to_string(),
        e => e.to_string(),
    })
}

/// statx of `fd` (with `name`: of that name in directory `fd`, not following a symlink), with
/// `AT_STATX_DONT_SYNC` so that no FUSE daemon (this one, or one that never answers) is asked.
fn looked_at(fd: &OwnedFd, name: Option<&OsStr>) -> Result<Looked, String> {
    let name = CString::new(name.map_or(&[][..], |n| n.as_bytes())).map_err(|e| e.to_string())?;
    let mut flags = libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | libc::AT_STATX_DONT_SYNC;
    if name.as_bytes().is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    // SAFETY: statx writes one `struct statx` into `stx`, which outlives the call; `name` is a
    // NUL-terminated string that outlives it too.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            name.as_ptr(),
            flags,
            libc::STATX_TYPE,
            &mut stx,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let root_bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    Ok(Looked {
        dev: (stx.stx_dev_major, stx.stx_dev_minor),
        // A kernel too old to say (before 5.8) is taken at its word on the device alone.
        mount_root: stx.stx_attributes_mask & root_bit == 0 || stx.stx_attributes & root_bit != 0,
    })
}

/// The path by which the kernel reaches what `fd` is, exactly (a magic link: followed, it
/// is the descriptor's own mount and directory, whatever was renamed or swapped since).
fn through(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Lazily detaches the mount whose root `root` (an `O_PATH` descriptor) is.
fn detach_through(root: &OwnedFd) -> Result<(), String> {
    nix::mount::umount2(&through(root), MntFlags::MNT_DETACH).map_err(|e| e.to_string())
}

/// Unmounts what `path` leads to, if it is the root of the mount with device `dev`: a plain
/// unmount, or, if files are still open, a lazy detach of that same mount.
fn unmount_verified(path: &Path, dev: Dev) -> Result<(), NotDone> {
    let not_ours = |what: String| NotDone::NotOurs(what);
    let (parent, name) = open_parent(path).map_err(not_ours)?;
    let now = looked_at(&parent, Some(&name)).map_err(not_ours)?;
    if now.dev != dev || !now.mount_root {
        return Err(not_ours(format!(
            "it leads to device {}:{}{}",
            now.dev.0,
            now.dev.1,
            if now.mount_root {
                ""
            } else {
                ", not a mount's root"
            }
        )));
    }
    // The name is looked up again in the pinned parent, not followed if a symlink: a
    // mountpoint's name cannot be renamed or replaced while mounted on (EBUSY).
    let mut again = through(&parent).into_os_string();
    again.push("/");
    again.push(&name);
    match nix::mount::umount2(Path::new(&again), MntFlags::UMOUNT_NOFOLLOW) {
        Ok(()) => Ok(()),
        Err(Errno::EBUSY) => {
            // Lazily, only through a descriptor of the very root that was checked.
            let root = open_beneath(&parent, &name).map_err(not_ours)?;
            let looked = looked_at(&root, None).map_err(not_ours)?;
            if looked.dev != dev || !looked.mount_root {
                return Err(not_ours("it changed while it was unmounted".into()));
            }
            tracing::warn!(mountpoint = %path.display(), "busy: detaching lazily; the daemon exits when the last open file closes");
            detach_through(&root).map_err(NotDone::Failed)
        }
        Err(e) => Err(NotDone::Failed(e.to_string())),
    }
}

/// Unmounts this daemon's own mount and nothing else: where it was made if that path still
/// leads to it (not following a symlink), else where the mount table says it is now; and if
/// no path leads to it, aborts its FUSE connection, which ends the session.
pub fn kernel_unmount(own: &OwnMount) -> Result<(), String> {
    let why = match unmount_own_at(own, &own.path) {
        Ok(()) => return Ok(()),
        Err(NotDone::Failed(e)) => return Err(e),
        Err(NotDone::NotOurs(why)) => why,
    };
    let now = mounts()
        .into_iter()
        .rev()
        .find(|m| m.dev == own.dev && m.fstype == "fuse.redbfs")
        .map(|m| m.mountpoint);
    if let Some(now) = now.filter(|p| *p != own.path) {
        match unmount_own_at(own, &now) {
            Ok(()) => {
                tracing::warn!(
                    "{} no longer leads to this mount ({why}); unmounted it where the mount \
                     table has it now, {}",
                    own.path.display(),
                    now.display()
                );
                return Ok(());
            }
            Err(NotDone::Failed(e)) => return Err(e),
            Err(NotDone::NotOurs(_)) => {}
        }
    }
    let abort = format!("/sys/fs/fuse/connections/{}/abort", own.dev.1);
    match std::fs::write(&abort, "1") {
        Ok(()) => {
            tracing::warn!(
                "{} no longer leads to this mount ({why}) and no path to it was found; aborted \
                 its FUSE connection ({abort}): the session ends, and what is left is a stale \
                 mount that `redbfs unmount` or `umount` clears",
                own.path.display()
            );
            Ok(())
        }
        Err(e) => Err(format!(
            "{} no longer leads to this mount ({why}), no path to it was found, and its FUSE \
             connection could not be aborted ({abort}: {e}); nothing was unmounted",
            own.path.display()
        )),
    }
}

/// One attempt at `path`: as root, `unmount_verified`; as a user, fusermount3 (which unmounts
/// only that user's own mounts) once the path is seen to lead to the mount.
fn unmount_own_at(own: &OwnMount, path: &Path) -> Result<(), NotDone> {
    if nix::unistd::geteuid().is_root() {
        return unmount_verified(path, own.dev);
    }
    let (parent, name) = open_parent(path).map_err(NotDone::NotOurs)?;
    let now = looked_at(&parent, Some(&name)).map_err(NotDone::NotOurs)?;
    if now.dev != own.dev {
        return Err(NotDone::NotOurs(format!(
            "it leads to device {}:{}",
            now.dev.0, now.dev.1
        )));
    }
    fusermount_unmount(path).map_err(NotDone::Failed)
}

/// Lazily detaches this daemon's own mount (a session that never started): only through a
/// descriptor of its root, checked to be on its device.
pub(super) fn detach_own(own: &OwnMount) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return kernel_unmount(own);
    }
    let (parent, name) = open_parent(&own.path)?;
    let root = open_beneath(&parent, &name)?;
    if looked_at(&root, None)?.dev != own.dev {
        return kernel_unmount(own);
    }
    detach_through(&root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mountinfo_line_gives_id_device_and_who_mounted_it() {
        let l = "412 30 0:58 / /home/u/my\\040mnt rw,nosuid,nodev,relatime shared:230 - \
                 fuse.redbfs redbfs:/home/u/s.redb rw,user_id=1000,group_id=1000,default_permissions";
        let m = parse_mountinfo_line(l).unwrap();
        assert_eq!((m.id, m.dev), (412, (0, 58)));
        assert_eq!(m.mountpoint, Path::new("/home/u/my mnt"));
        assert_eq!(
            (m.fstype.as_str(), m.source.as_str()),
            ("fuse.redbfs", "redbfs:/home/u/s.redb")
        );
        assert_eq!(m.user_id, Some(1000));
        let tmpfs = parse_mountinfo_line("22 27 0:21 / /tmp rw - tmpfs tmpfs rw").unwrap();
        assert_eq!(tmpfs.user_id, None);
    }
}
