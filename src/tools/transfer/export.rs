//! `export` to a directory: the store's tree made relative to directory descriptors, every
//! entry private from its first byte and given its mode, owner and times through its own
//! descriptor, never through a path another user could swap.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, fchmod, fstat, futimens, mkdirat};
use nix::sys::time::TimeSpec;
use nix::unistd::fchown;
use serde::Serialize;

use super::super::common::{EntryInfo, Result, lookup_path, read_content, tree};
use crate::store::ReadTxn;

fn timespec(ns: i64) -> TimeSpec {
    TimeSpec::new(ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

/// What `export` wrote.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ExportReport {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
}

/// How `export` writes a tree to a directory.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExportOptions {
    /// Give every file and directory its recorded owner (root only). Only then are setuid and
    /// setgid bits written: without it the exporting user owns everything, and a bit another
    /// user set would make a program run as the exporter.
    pub same_owner: bool,
}

/// The flags of a directory export writes into: never reached through a symlink.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Gives an exported entry its owner (with `same_owner`), mode (when `mode`) and times
/// through its own descriptor, never through its path.
fn finish_entry(fd: &OwnedFd, e: &EntryInfo, opts: ExportOptions, mode: bool) -> Result<()> {
    let x = |what: &str, x: nix::Error| format!("{what} {}: {x}", e.path);
    if mode {
        if opts.same_owner {
            // Before the mode: a change of owner clears setuid and setgid.
            fchown(
                fd,
                Some(nix::unistd::Uid::from_raw(e.uid)),
                Some(nix::unistd::Gid::from_raw(e.gid)),
            )
            .map_err(|y| x("chown", y))?;
        }
        let keep = if opts.same_owner { 0o7777 } else { 0o1777 };
        fchmod(fd, Mode::from_bits_truncate(e.mode & keep)).map_err(|y| x("chmod", y))?;
    }
    futimens(fd, &timespec(e.atime_ns), &timespec(e.mtime_ns)).map_err(|y| x("utimens", y))
}

fn dir_is_empty(fd: &OwnedFd, dest: &Path) -> Result<bool> {
    let e = |x: nix::Error| format!("{}: {x}", dest.display());
    let dup = fd
        .try_clone()
        .map_err(|x| format!("{}: {x}", dest.display()))?;
    let mut dir = nix::dir::Dir::from_fd(dup).map_err(e)?;
    for entry in dir.iter() {
        let name = entry.map_err(e)?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            return Ok(false);
        }
    }
    Ok(true)
}

/// An open directory of an export: its descriptor, its entry (None for a `dest` that takes
/// nothing from the store), and whether its mode is ours to set.
type OpenDir<'a> = (OwnedFd, Option<&'a EntryInfo>, bool);

/// `export` to a directory: the tree under `path` with modes and mtimes, into `dest` (created;
/// must be empty if it exists). `progress` hears the entries written so far.
///
/// Safe into a destination another user can change, run as root: `dest` is opened once with
/// `O_NOFOLLOW`, and every entry is made relative to its parent's descriptor (`mkdirat`,
/// `openat` with `O_EXCL|O_NOFOLLOW`), created 0700 or 0600 and given its mode and times
/// through its own descriptor once written; setuid and setgid are dropped unless
/// `opts.same_owner`. A symlink or a file where an entry goes refuses the export.
pub fn export_dir(
    r: &ReadTxn,
    path: &str,
    dest: &Path,
    opts: ExportOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<ExportReport> {
    if opts.same_owner && !nix::unistd::geteuid().is_root() {
        return Err("--same-owner: only root can give exported files their owners".into());
    }
    let (root, created) = open_dest(dest)?;
    let entries = match tree(r, path) {
        Ok(entries) => entries,
        Err(e) => {
            remove_made(&root, &[], dest, created);
            return Err(e);
        }
    };
    // What the export made directly in `dest`: removed again if it fails.
    let mut tops: Vec<String> = Vec::new();
    let keep = root
        .try_clone()
        .map_err(|x| format!("{}: {x}", dest.display()))?;
    let out = Destination {
        r,
        dest,
        base: &entries[0].1.path,
        opts,
    };
    let written = out.write(&entries, (root, created), &mut tops, progress);
    if written.is_err() {
        remove_made(&keep, &tops, dest, created);
    }
    written
}

/// Opens `dest` never through a symlink, creating it 0700 when missing (true); an existing
/// one must be an empty directory.
fn open_dest(dest: &Path) -> Result<(OwnedFd, bool)> {
    let created = match std::fs::symlink_metadata(dest) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(format!(
                "{}: is a symbolic link; export never writes through one (give the directory \
                 itself)",
                dest.display()
            ));
        }
        Ok(m) if !m.is_dir() => return Err(format!("{}: not a directory", dest.display())),
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dest)
                .map_err(|e| format!("{}: {e}", dest.display()))?;
            true
        }
        Err(e) => return Err(format!("{}: {e}", dest.display())),
    };
    let root = nix::fcntl::open(dest, DIR_FLAGS, Mode::empty())
        .map_err(|e| format!("{}: {e}", dest.display()))?;
    if !created && !dir_is_empty(&root, dest)? {
        return Err(format!(
            "{}: not empty; export writes into a new or empty directory",
            dest.display()
        ));
    }
    Ok((root, created))
}

/// Where an export writes: the store it reads, `dest`, the store path that becomes `dest`,
/// and the options.
struct Destination<'a> {
    r: &'a ReadTxn,
    dest: &'a Path,
    base: &'a str,
    opts: ExportOptions,
}

impl Destination<'_> {
    /// Where `e` goes on the host.
    fn target(&self, e: &EntryInfo) -> PathBuf {
        self.dest
            .join(e.path[self.base.len()..].trim_start_matches('/'))
    }

    /// The message for a failure to make `e`.
    fn refused(&self, e: &EntryInfo, x: nix::Error) -> String {
        match x {
            Errno::EEXIST | Errno::ELOOP | Errno::ENOTDIR => format!(
                "{}: something else is there (a symlink or a file put there during the export); \
                 export never writes through one",
                self.target(e).display()
            ),
            x => format!("{}: {x}", self.target(e).display()),
        }
    }

    /// Writes `entries` (from `tree`) into `root`, the open `dest`, listing in `tops` what it
    /// makes directly there.
    fn write(
        &self,
        entries: &[(usize, EntryInfo)],
        (root, created): (OwnedFd, bool),
        tops: &mut Vec<String>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ExportReport> {
        let mut report = ExportReport::default();
        // The directories from `dest` down to the one being written, each open; a directory
        // gets its mode and times once its last entry is written, so they do not move its mtime.
        let mut open: Vec<OpenDir> = Vec::new();
        let top_is_dir = entries[0].1.kind == "dir";
        open.push((root, top_is_dir.then_some(&entries[0].1), created));
        let close = |(fd, e, mode): OpenDir| match e {
            Some(e) => finish_entry(&fd, e, self.opts, mode),
            None => Ok(()),
        };
        for (depth, e) in entries.iter().skip(usize::from(top_is_dir)) {
            // A file exported on its own goes into `dest`, as if at depth 1.
            while open.len() > (*depth).max(1) {
                close(open.pop().expect("not empty"))?;
            }
            let parent = &open.last().expect("dest stays open").0;
            if open.len() == 1 {
                tops.push(e.name.clone());
            }
            if e.kind == "dir" {
                mkdirat(parent, e.name.as_str(), Mode::from_bits_truncate(0o700))
                    .map_err(|x| self.refused(e, x))?;
                let fd = openat(parent, e.name.as_str(), DIR_FLAGS, Mode::empty())
                    .map_err(|x| self.refused(e, x))?;
                open.push((fd, Some(e), true));
                report.dirs += 1;
            } else {
                report.bytes += self.write_file(parent, e)?;
                report.files += 1;
            }
            progress(report.files + report.dirs);
        }
        while let Some(d) = open.pop() {
            close(d)?;
        }
        Ok(report)
    }

    /// Writes the file `e` into the directory open at `parent`; its length.
    fn write_file(&self, parent: &OwnedFd, e: &EntryInfo) -> Result<u64> {
        let fd = openat(
            parent,
            e.name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|x| self.refused(e, x))?;
        let (inode, _) = lookup_path(self.r, &e.path)?;
        let data = read_content(self.r, &inode)?;
        let mut f = std::fs::File::from(fd);
        f.write_all(&data)
            .map_err(|x| format!("{}: {x}", self.target(e).display()))?;
        finish_entry(&OwnedFd::from(f), e, self.opts, true)?;
        Ok(data.len() as u64)
    }
}

/// Removes what a failed export made: `names` directly in the directory open at `dir`
/// (reached through that descriptor, never through a path another user could swap), then
/// `dest` itself when the export created it and it is still that directory.
fn remove_made(dir: &OwnedFd, names: &[String], dest: &Path, created: bool) {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let base = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    for n in names {
        let p = base.join(n);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => drop(std::fs::remove_dir_all(&p)),
            Ok(_) => drop(std::fs::remove_file(&p)),
            Err(_) => {}
        }
    }
    if created
        && let (Ok(st), Ok(m)) = (fstat(dir), std::fs::symlink_metadata(dest))
        && m.dev() == st.st_dev
        && m.ino() == st.st_ino
    {
        let _ = std::fs::remove_dir(dest);
    }
}
