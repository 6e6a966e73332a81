//! Getting a mounted `/dev/fuse`: mount(2) on a descriptor this process opened (root), or
//! fusermount3, which is setuid and hands the descriptor back (a user, a container without
//! CAP_SYS_ADMIN).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use nix::errno::Errno;
use nix::mount::MsFlags;

/// Opens `/dev/fuse`, before the store is opened, so that a missing device leaves the store
/// untouched.
/// `/dev/fuse`, opened by this process; `None` when it may not open it (mode 0600 and not
/// root: fusermount3, which is setuid, opens it and mounts instead).
pub(super) fn open_fuse_device() -> Result<Option<OwnedFd>, String> {
    match nix::fcntl::open(
        "/dev/fuse",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::EACCES | Errno::EPERM) => {
            need_fusermount()?;
            Ok(None)
        }
        Err(e) => Err(format!(
            "/dev/fuse: {e} (is the fuse module loaded? try `modprobe fuse`)"
        )),
    }
}

/// Checks, before anything is created, that fusermount3 can mount for this user.
pub(super) fn need_fusermount() -> Result<(), String> {
    let found = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| d.join("fusermount3").is_file())
    });
    if found {
        Ok(())
    } else {
        Err("this user may not open /dev/fuse and fusermount3 is not installed: install the fuse3 package (it mounts for users), or mount as root".into())
    }
}

/// `--allow-other` as a user other than root: fusermount3 allows it only with
/// `user_allow_other` in /etc/fuse.conf, and says so less clearly.
pub(super) fn check_allow_other(allow_other: bool) -> Result<(), String> {
    if !allow_other || nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    let allowed = conf
        .lines()
        .any(|l| l.split('#').next().unwrap_or("").trim() == "user_allow_other");
    if allowed {
        Ok(())
    } else {
        Err(
            "--allow-other as a user other than root needs `user_allow_other` in /etc/fuse.conf"
                .into(),
        )
    }
}

/// Who may do what on a mount: its options beyond the ones every mount has (`nosuid`,
/// `nodev`, `default_permissions`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Access {
    pub allow_other: bool,
    pub read_only: bool,
    pub noexec: bool,
}

/// Mounts with mount(2) as `fuse.redbfs` on the `/dev/fuse` descriptor `fd`, returning it;
/// `None` when this process may not mount (not root), so fusermount3 must.
pub(super) fn kernel_mount(
    mp: &Path,
    source: &str,
    Access {
        allow_other,
        read_only,
        noexec,
    }: Access,
    fd: Option<OwnedFd>,
) -> Result<Option<OwnedFd>, String> {
    let Some(fd) = fd else {
        return Ok(None);
    };
    let mut opts = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions",
        fd.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    if allow_other {
        opts.push_str(",allow_other");
    }
    let r = nix::mount::mount(
        Some(source),
        mp,
        Some("fuse.redbfs"),
        MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | if read_only {
                MsFlags::MS_RDONLY
            } else {
                MsFlags::empty()
            }
            | if noexec {
                MsFlags::MS_NOEXEC
            } else {
                MsFlags::empty()
            },
        Some(opts.as_str()),
    );
    match r {
        Ok(()) => Ok(Some(fd)),
        // Not allowed to call mount(2) (a user, or a container without CAP_SYS_ADMIN):
        // fusermount3 mounts instead.
        Err(Errno::EPERM | Errno::EACCES) => {
            need_fusermount()?;
            Ok(None)
        }
        Err(e) => Err(format!("mount {}: {e}", mp.display())),
    }
}

/// Mounts through fusermount3, which is setuid root: it opens `/dev/fuse`, mounts it at `mp`
/// and hands the descriptor back over a Unix socket named by `_FUSE_COMMFD` (libfuse's
/// protocol), for a user who may not do either.
pub(super) fn fusermount_mount(
    mp: &Path,
    source: &str,
    Access {
        allow_other,
        read_only,
        noexec,
    }: Access,
) -> Result<OwnedFd, String> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let (ours, theirs) =
        std::os::unix::net::UnixStream::pair().map_err(|e| format!("fusermount3: socket: {e}"))?;
    // The child inherits its end; ours stays close-on-exec.
    nix::fcntl::fcntl(
        &theirs,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(|e| format!("fusermount3: socket: {e}"))?;
    // fusermount3 splits options at commas: one in the store's path is escaped.
    let mut opts = format!(
        "fsname={},subtype=redbfs,default_permissions,nosuid,nodev",
        source.replace('\\', "\\\\").replace(',', "\\,")
    );
    if allow_other {
        opts.push_str(",allow_other");
    }
    if read_only {
        opts.push_str(",ro");
    }
    if noexec {
        opts.push_str(",noexec");
    }
    let out = Command::new("fusermount3")
        .arg("-o")
        .arg(&opts)
        .arg("--")
        .arg(mp)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("fusermount3: {e} (install the fuse3 package)"))?;
    drop(theirs);
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let hint = if said.contains("failed to open /dev/fuse") {
            " (fusermount3 opens /dev/fuse as the user: distributions make it mode 0666; here it is not)"
        } else {
            ""
        };
        return Err(format!(
            "fusermount3 could not mount {}: {}{hint}",
            mp.display(),
            said.trim()
        ));
    }
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(std::os::fd::RawFd);
    let msg = recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| format!("fusermount3: receiving the descriptor: {e}"))?;
    for cmsg in msg.cmsgs().map_err(|e| format!("fusermount3: {e}"))? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg
            && let Some(&fd) = fds.first()
        {
            // SAFETY: the kernel just gave this process this descriptor; nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    Err("fusermount3 mounted but passed no descriptor".into())
}

/// Turns the read-only FUSE mount at `mp` read-write in place (a follower promoted), or back
/// (`read_only`, a promotion that failed): mount(2) with `MS_REMOUNT` without `MS_RDONLY`, once for the superblock (FUSE's reconfigure accepts
/// it and ignores the options) and once with `MS_BIND` for the mount itself, which a
/// read-only mount(2) also marked read-only. Open files and readers carry on. Takes
/// CAP_SYS_ADMIN: a mount made through fusermount3 cannot be remounted (fusermount3 has no
/// remount), which the error says.
pub(super) fn remount(mp: &Path, read_only: bool) -> Result<(), String> {
    let mut keep = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if read_only {
        keep |= MsFlags::MS_RDONLY;
    }
    // The bind remount sets every per-mount flag: a `noexec` mount stays one.
    let flags = nix::sys::statvfs::statvfs(mp)
        .map_err(|e| format!("remounting {}: {e}", mp.display()))?
        .flags();
    if flags.contains(nix::sys::statvfs::FsFlags::ST_NOEXEC) {
        keep |= MsFlags::MS_NOEXEC;
    }
    let remount = |extra: MsFlags| {
        nix::mount::mount(
            None::<&str>,
            mp,
            None::<&str>,
            MsFlags::MS_REMOUNT | keep | extra,
            None::<&str>,
        )
    };
    match remount(MsFlags::empty()).and_then(|()| remount(MsFlags::MS_BIND)) {
        Ok(()) => Ok(()),
        Err(e @ (Errno::EPERM | Errno::EACCES)) => Err(format!(
            "remounting {} takes root (mount(2) with MS_REMOUNT: {e}); a mount made \
             as a user goes through fusermount3, which cannot remount",
            mp.display()
        )),
        Err(e) => Err(format!("remounting {}: {e}", mp.display())),
    }
}
