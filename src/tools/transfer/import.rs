//! `import` of a directory: the source tree walked relative to directory descriptors, never
//! through a symlink and never waiting on a FIFO, each entry staged for the one commit.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fstat, fstatat};

use super::super::common::Result;
use super::staging::{
    ImportReport, Importer, SPECIAL, SYMLINK, Staged, Staging, admit, commit, file_cap, target,
    time_ns,
};
use crate::fs::Limits;
use crate::store::{Kind, Store};

/// `import`: copies the tree under `src` into the store below `into` in one transaction.
/// Names the normaliser refuses, symlinks, special files, files over the size limit, entries
/// deeper than `--max-depth` or with a path over `--max-path-bytes`, and names that already
/// exist are listed and skipped, or fail the whole import when `strict`. `progress` hears the
/// entries read so far.
///
/// Two phases: the source is read and staged first (file content in an anonymous temporary
/// file), with no transaction open, and then committed in one write transaction that reads
/// nothing but the staged copy. So a source on the same mount (its reads served by the daemon
/// that runs the import) or a slow source never holds up the store's writers.
///
/// Safe on a tree another user is changing, run as root: every entry is opened relative to
/// its parent directory's descriptor with `O_NOFOLLOW|O_NONBLOCK`, checked with `fstat` on
/// that descriptor, and read only through it, so a name swapped for a symlink or a FIFO is
/// skipped, never followed or waited on. The walk is iterative and goes no deeper than the
/// store's `--max-depth`, holding one descriptor per level. Paths in the skip list are
/// escaped (`private::escape`). Owners and modes: see `Importer`.
pub fn import(
    store: &Store,
    limits: &Limits,
    src: &Path,
    into: &str,
    strict: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<ImportReport> {
    let target = target(store, into)?;
    // The top directory is the caller's own argument: it may be reached through a symlink.
    let root = nix::fcntl::open(
        src,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", shown(src)))?;
    let mut report = ImportReport::default();
    let at = (target.depth, target.bytes);
    let staged = stage_tree(limits, root, src, at, &mut report, progress)?;
    commit(store, limits, &staged, &target, strict, &mut report)?;
    Ok(report)
}

/// A path of the source tree as the skip list and errors show it.
fn shown(p: &Path) -> String {
    crate::private::escape(p.as_os_str().as_bytes())
}

/// A directory of the source tree being read: its descriptor, its path (for messages), its
/// index among the staged entries (None: the import's target), its depth and path bytes in
/// the store, and the names still to read, last first.
struct SourceDir {
    fd: OwnedFd,
    path: PathBuf,
    index: Option<usize>,
    depth: usize,
    bytes: usize,
    names: Vec<OsString>,
}

/// The names in the directory open at `fd` (read through a duplicate of it), sorted, last
/// first.
fn names_in(fd: &OwnedFd, path: &Path) -> Result<Vec<OsString>> {
    let e = |x: nix::Error| format!("{}: {x}", shown(path));
    let dup = fd
        .try_clone()
        .map_err(|x| format!("{}: {x}", shown(path)))?;
    let mut dir = nix::dir::Dir::from_fd(dup).map_err(e)?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let name = entry.map_err(e)?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name));
        }
    }
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

/// Why an entry of this `st_mode` has no place in a store, if it has none.
fn refused_kind(mode: u32) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG | libc::S_IFDIR => None,
        libc::S_IFLNK => Some(SYMLINK),
        _ => Some(SPECIAL),
    }
}

const CHANGED: &str = "changed while importing: no longer the file or directory it was";

/// Reads the source tree into `Staged` entries, depth first in name order, parents before
/// their children. Iterative (a hostile tree may be deeper than any stack): one `SourceDir`
/// per directory from the top down to the one being read, never deeper than the limit.
fn stage_tree(
    limits: &Limits,
    root: OwnedFd,
    src: &Path,
    (depth, bytes): (usize, usize),
    report: &mut ImportReport,
    progress: &mut dyn FnMut(u64),
) -> Result<(Vec<Staged>, Staging)> {
    let mut staged = Vec::new();
    let mut staging = Staging::default();
    let mut stack = vec![SourceDir {
        names: names_in(&root, src)?,
        fd: root,
        path: src.to_path_buf(),
        index: None,
        depth,
        bytes,
    }];
    while let Some(top) = stack.last_mut() {
        let Some(raw) = top.names.pop() else {
            stack.pop();
            continue;
        };
        let path = top.path.join(&raw);
        let at = (top.depth + 1, top.bytes);
        let parent = top.index;
        let stage = (&mut staging, staged.len() + 1);
        if let Some((fd, entry)) = stage_entry(limits, &top.fd, &raw, &path, at, stage, report)? {
            let (kind, bytes) = (entry.kind, at.1 + 1 + entry.name.len());
            staged.push(Staged { parent, ..entry });
            if kind == Kind::Dir {
                let names = names_in(&fd, &path)?;
                stack.push(SourceDir {
                    fd,
                    path,
                    index: Some(staged.len() - 1),
                    depth: at.0,
                    bytes,
                    names,
                });
            }
            progress(staged.len() as u64);
        }
    }
    Ok((staged, staging))
}

/// Looks at one entry of the source, `depth` levels deep below a directory of `parent_bytes`
/// path bytes in the store, and stages it as the `entries`th, or lists it as skipped (None).
fn stage_entry(
    limits: &Limits,
    dir: &OwnedFd,
    raw: &OsStr,
    path: &Path,
    (depth, parent_bytes): (usize, usize),
    (staging, entries): (&mut Staging, usize),
    report: &mut ImportReport,
) -> Result<Option<(OwnedFd, Staged)>> {
    let mut skip = |why: &str| {
        report.skip(shown(path), why);
        Ok(None)
    };
    // A first look without opening: what is not a file or directory is never opened.
    let first = match fstatat(dir, raw, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return skip("vanished while importing"),
        Err(e) => return Err(format!("{}: {e}", shown(path))),
    };
    if let Some(why) = refused_kind(first.st_mode) {
        return skip(why);
    }
    let is_dir = first.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let name = match admit(limits, raw.as_bytes(), depth, parent_bytes) {
        Ok(n) => n,
        Err(why) => return skip(&why),
    };
    // Open it, never through a symlink and never waiting (a FIFO swapped in), and look again
    // at what was opened: only that descriptor is read.
    let mut flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    if is_dir {
        flags |= OFlag::O_DIRECTORY;
    }
    let fd = match openat(dir, raw, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) => return skip(SYMLINK),
        Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ENXIO) => return skip(CHANGED),
        Err(e) => return Err(format!("{}: {e}", shown(path))),
    };
    let st = fstat(&fd).map_err(|e| format!("{}: {e}", shown(path)))?;
    if let Some(why) = refused_kind(st.st_mode) {
        return skip(why);
    }
    if (st.st_mode & libc::S_IFMT == libc::S_IFDIR) != is_dir {
        return skip(CHANGED);
    }
    let (max, over) = file_cap(limits);
    if !is_dir && st.st_size as u64 > max {
        return skip(&over);
    }
    let size = if is_dir { 0 } else { st.st_size as u64 };
    if let Some(why) = staging.refuse(limits, entries, size) {
        return skip(&why);
    }
    let (perm, uid, gid) = Importer::current().owns(st.st_mode, || Ok((st.st_uid, st.st_gid)))?;
    let mut entry = Staged {
        parent: None,
        name: name.as_str().to_string(),
        path: shown(path),
        kind: if is_dir { Kind::Dir } else { Kind::File },
        perm,
        uid,
        gid,
        atime: time_ns(st.st_atime, st.st_atime_nsec),
        mtime: time_ns(st.st_mtime, st.st_mtime_nsec),
        content: (0, 0),
    };
    if is_dir {
        return Ok(Some((fd, entry)));
    }
    // Read through the descriptor, no further than the limit: the file may be growing.
    let mut data = Vec::new();
    let mut f = std::fs::File::from(fd);
    (&mut f)
        .take(max.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| format!("{}: {e}", shown(path)))?;
    if data.len() as u64 > max {
        return skip(&over);
    }
    if let Some(why) = staging.over_quota(limits, data.len() as u64) {
        return skip(&why);
    }
    entry.content = staging.put(&data)?;
    Ok(Some((OwnedFd::from(f), entry)))
}
