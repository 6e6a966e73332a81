//! Operations on a store file, outside the filesystem's request path: inspection (ls, cat,
//! tree, du, stats), snapshot and restore, export and import, expiry and repair. The CLI runs
//! them on an unmounted store directly and the daemon runs the read-only ones for a mounted
//! store, so both give the same answers.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, fchmod, fstat, fstatat, futimens, mkdirat};
use nix::sys::time::TimeSpec;
use nix::unistd::fchown;

use serde::Serialize;

use crate::fs::{Limits, Name};
use crate::store::{
    CHUNK_SIZE, CopyStats, HistoryRecord, Inode, Kind, ROOT_INO, ReadTxn, Store, Sync, WriteTxn,
    now_ns,
};

type Result<T> = std::result::Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One entry as the inspection commands report it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct EntryInfo {
    pub path: String,
    pub name: String,
    pub kind: &'static str,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    pub atime_ns: i64,
    pub ino: u64,
}

fn kind_str(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Dir => "dir",
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

fn info(path: String, i: &Inode) -> EntryInfo {
    EntryInfo {
        name: if i.ino == ROOT_INO {
            "/".into()
        } else {
            i.name.clone()
        },
        path,
        kind: kind_str(i.kind),
        size: i.size,
        mode: i.perm,
        uid: i.uid,
        gid: i.gid,
        mtime_ns: i.mtime,
        atime_ns: i.atime,
        ino: i.ino,
    }
}

pub use crate::fs::resolve_path as lookup_path;

/// `ls`: a directory's entries, or the file itself.
pub fn ls(r: &ReadTxn, path: &str) -> Result<Vec<EntryInfo>> {
    let (inode, canon) = lookup_path(r, path)?;
    if inode.kind == Kind::File {
        return Ok(vec![info(canon, &inode)]);
    }
    let mut out = Vec::new();
    for e in r.list(inode.ino).map_err(err)? {
        let i = r
            .inode(e.ino)
            .map_err(err)?
            .ok_or_else(|| format!("missing inode {}", e.ino))?;
        out.push(info(join(&canon, &e.name), &i));
    }
    Ok(out)
}

/// A file's content.
pub fn read_content(r: &ReadTxn, inode: &Inode) -> Result<Vec<u8>> {
    let mut out = vec![0u8; inode.size as usize];
    let chunks = r
        .chunks(inode.ino, 0, inode.size.div_ceil(CHUNK_SIZE))
        .map_err(err)?;
    for (idx, c) in chunks.into_iter().enumerate() {
        if let Some(c) = c {
            let start = idx * CHUNK_SIZE as usize;
            let end = (start + c.len()).min(out.len());
            out[start..end].copy_from_slice(&c[..end - start]);
        }
    }
    Ok(out)
}

/// `cat`: one file's content.
pub fn cat(r: &ReadTxn, path: &str) -> Result<Vec<u8>> {
    let (inode, canon) = lookup_path(r, path)?;
    if inode.kind != Kind::File {
        return Err(format!("{canon}: is a directory"));
    }
    read_content(r, &inode)
}

/// `tree`: every entry below `path`, depth first in name order, with its depth.
pub fn tree(r: &ReadTxn, path: &str) -> Result<Vec<(usize, EntryInfo)>> {
    let (inode, canon) = lookup_path(r, path)?;
    let mut out = vec![(0, info(canon.clone(), &inode))];
    if inode.kind != Kind::Dir {
        return Ok(out);
    }
    // Iterative: a store's depth is bounded by its limits, not by this thread's stack.
    let mut stack = vec![(canon, 1usize, r.list(inode.ino).map_err(err)?.into_iter())];
    while let Some((path, depth, entries)) = stack.last_mut() {
        let Some(e) = entries.next() else {
            stack.pop();
            continue;
        };
        let i = r
            .inode(e.ino)
            .map_err(err)?
            .ok_or_else(|| format!("missing inode {}", e.ino))?;
        let (p, depth) = (join(path, &e.name), *depth);
        out.push((depth, info(p.clone(), &i)));
        if i.kind == Kind::Dir {
            stack.push((p, depth + 1, r.list(i.ino).map_err(err)?.into_iter()));
        }
    }
    Ok(out)
}

/// What `du` reports.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct DuInfo {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
}

/// `du`: files, directories and content bytes at and below `path`.
pub fn du(r: &ReadTxn, path: &str) -> Result<DuInfo> {
    let mut d = DuInfo::default();
    for (_, e) in tree(r, path)? {
        match e.kind {
            "file" => {
                d.files += 1;
                d.bytes += e.size;
            }
            _ => d.dirs += 1,
        }
    }
    Ok(d)
}

/// What `stats` reports.
#[derive(Clone, Debug, Serialize)]
pub struct StatsInfo {
    pub files: u64,
    pub dirs: u64,
    pub content_bytes: u64,
    pub store_bytes: u64,
    pub largest: Vec<(String, u64)>,
    pub last_commit_ns: Option<i64>,
}

/// `stats`: counts, the largest files, the store file's size and the last commit time.
pub fn stats(r: &ReadTxn, store_bytes: u64) -> Result<StatsInfo> {
    let usage = r.usage().map_err(err)?;
    let mut files: Vec<Inode> = r
        .all_inodes()
        .map_err(err)?
        .into_iter()
        .filter(|i| i.kind == Kind::File && i.nlink > 0)
        .collect();
    files.sort_by(|a, b| b.size.cmp(&a.size).then(a.ino.cmp(&b.ino)));
    files.truncate(10);
    let paths = PathIndex::new(r)?;
    Ok(StatsInfo {
        files: usage.files,
        dirs: usage.dirs,
        content_bytes: usage.content_bytes,
        store_bytes,
        largest: files.iter().map(|i| (paths.path(i.ino), i.size)).collect(),
        last_commit_ns: r.last_commit().map_err(err)?,
    })
}

/// Paths of inodes, from their parent pointers.
struct PathIndex {
    inodes: HashMap<u64, (u64, String)>,
}

impl PathIndex {
    fn new(r: &ReadTxn) -> Result<PathIndex> {
        Ok(PathIndex {
            inodes: r
                .all_inodes()
                .map_err(err)?
                .into_iter()
                .map(|i| (i.ino, (i.parent, i.name)))
                .collect(),
        })
    }

    fn path(&self, ino: u64) -> String {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO && parts.len() <= self.inodes.len() {
            match self.inodes.get(&cur) {
                Some((p, n)) => {
                    parts.push(n.as_str());
                    cur = *p;
                }
                None => break,
            }
        }
        parts.reverse();
        format!("/{}", parts.join("/"))
    }
}

/// What `snapshot` reports.
#[derive(Clone, Debug, Serialize)]
pub struct SnapshotInfo {
    pub out: PathBuf,
    pub entries: u64,
    pub bytes: u64,
    pub file_bytes: u64,
    pub seconds: f64,
}

fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("{}: {e}", dir.display()))
}

use crate::private::parent_dir;
use crate::store::disk::Disk;

/// Opens a store file and checks it: redb's integrity check plus every invariant.
pub fn verify(path: &Path) -> Result<()> {
    verify_on(&Disk::Host, path)
}

fn verify_on(disk: &Disk, path: &Path) -> Result<()> {
    let mut s = Store::open_existing_on(disk.clone(), path).map_err(err)?;
    if !s.check_integrity().map_err(err)? {
        return Err(format!("{}: redb had to repair the file", path.display()));
    }
    let findings = crate::check::invariants(&s.read().map_err(err)?).map_err(err)?;
    if let Some(f) = findings.first() {
        return Err(format!(
            "{}: {f} ({} findings)",
            path.display(),
            findings.len()
        ));
    }
    Ok(())
}

/// `snapshot`: a consistent copy of what `r` sees, written to a temporary name, fsynced,
/// renamed into place with mode 0600, then opened and checked. `progress` hears the records
/// copied so far.
pub fn snapshot(r: &ReadTxn, out: &Path, progress: &mut dyn FnMut(u64)) -> Result<SnapshotInfo> {
    let started = std::time::Instant::now();
    if out.exists() {
        return Err(format!(
            "{}: already exists; snapshot writes a new file",
            out.display()
        ));
    }
    crate::private::check_store_dir(out)?;
    let dir = parent_dir(out);
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        out.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let copied: std::result::Result<CopyStats, String> = r.copy_to(&tmp, progress).map_err(err);
    let stats = match copied {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    // `copy_to` created the temporary file 0600 and O_EXCL|O_NOFOLLOW, and synced it.
    let finish = || -> Result<()> {
        verify(&tmp)?;
        // Never replaces what appeared at `out` meanwhile.
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            &tmp,
            nix::fcntl::AT_FDCWD,
            out,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(|e| format!("{}: {e}", out.display()))?;
        fsync_dir(&dir)
    };
    if let Err(e) = finish() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(SnapshotInfo {
        out: out.to_path_buf(),
        entries: stats.entries,
        bytes: stats.bytes,
        file_bytes: std::fs::metadata(out).map(|m| m.len()).unwrap_or(0),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// `restore`: checks the snapshot, then replaces `store` with a copy of it in one rename; the
/// replaced file stays as `STORE.before-restore-<unix seconds>` unless `discard_current`.
pub fn restore(
    snapshot_path: &Path,
    store: &Path,
    discard_current: bool,
) -> Result<Option<PathBuf>> {
    restore_on(&Disk::Host, snapshot_path, store, discard_current)
}

/// `restore` on `disk` (the power-cut tests run it on a simulated disk).
#[doc(hidden)]
pub fn restore_on(
    disk: &Disk,
    snapshot_path: &Path,
    store: &Path,
    discard_current: bool,
) -> Result<Option<PathBuf>> {
    crate::private::check_store_dir(store)?;
    let dir = parent_dir(store);
    let tmp = dir.join(format!(".restore-tmp-{}", std::process::id()));
    let _ = disk.remove(&tmp);
    // The snapshot is only read: it is copied first, and the copy is what is checked (redb's
    // check may write to the file it checks) and then put in place.
    let copied = disk.copy_new(snapshot_path, &tmp).and_then(|()| {
        verify_on(disk, &tmp).map_err(|e| {
            e.replace(
                &tmp.display().to_string(),
                &snapshot_path.display().to_string(),
            )
        })
    });
    if let Err(e) = copied {
        let _ = disk.remove(&tmp);
        return Err(e);
    }
    // A store left by a crash may hold commits only in its log: opening it applies them, so
    // the file kept below is complete. A log that cannot be applied goes with the old file.
    let log = crate::store::wal::path_of(store);
    if disk.exists(&log) {
        drop(Store::open_existing_on(disk.clone(), store));
    }
    let mut kept = None;
    if disk.exists(store) && !discard_current {
        let secs = now_ns() / 1_000_000_000;
        let mut k = store.as_os_str().to_owned();
        k.push(format!(".before-restore-{secs}"));
        let k = PathBuf::from(k);
        disk.hard_link(store, &k)
            .map_err(|e| format!("keeping {}: {e}", store.display()))?;
        kept = Some(k);
    }
    if disk.exists(&log) {
        let moved = match &kept {
            Some(k) => disk.rename(&log, &crate::store::wal::path_of(k)),
            None => disk.remove(&log),
        };
        moved.map_err(|e| format!("{}: {e}", log.display()))?;
    }
    disk.rename(&tmp, store)
        .map_err(|e| format!("{}: {e}", store.display()))?;
    disk.sync_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(kept)
}

/// What `import` did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ImportReport {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// (path, reason) of everything left out.
    pub skipped: Vec<(String, String)>,
}

fn time_ns(secs: i64, nsec: i64) -> i64 {
    secs.saturating_mul(1_000_000_000).saturating_add(nsec)
}

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
/// escaped (`private::escape`).
pub fn import(
    store: &Store,
    limits: &Limits,
    src: &Path,
    into: &str,
    strict: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<ImportReport> {
    let (target, canon) = lookup_path(&store.read().map_err(err)?, into)?;
    if target.kind != Kind::Dir {
        return Err(format!("{into}: not a directory in the store"));
    }
    // The top directory is the caller's own argument: it may be reached through a symlink.
    let root = nix::fcntl::open(
        src,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", shown(src)))?;
    let mut report = ImportReport::default();
    let base = if canon == "/" {
        (0, 0)
    } else {
        (canon.matches('/').count(), canon.len())
    };
    let staged = stage_tree(limits, root, src, base, &mut report, progress)?;
    let strict_error = |report: &ImportReport| {
        let (p, why) = &report.skipped[0];
        format!(
            "--strict: {p}: {why} ({} entries would be skipped)",
            report.skipped.len()
        )
    };
    if strict && !report.skipped.is_empty() {
        return Err(strict_error(&report));
    }
    let mut w = store.write().map_err(err)?;
    commit_staged(&mut w, limits, &staged, target.ino, &mut report)?;
    if strict && !report.skipped.is_empty() {
        return Err(strict_error(&report));
    }
    w.commit(Sync::Durable).map_err(err)?;
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

/// One entry read from the source, waiting for the commit.
struct Staged {
    /// Its parent among the staged entries; None: the import's target directory.
    parent: Option<usize>,
    name: String,
    /// Shown in the skip list.
    path: String,
    kind: Kind,
    perm: u32,
    uid: u32,
    gid: u32,
    atime: i64,
    mtime: i64,
    /// Where its content lies in the staging file, and how long it is.
    content: (u64, u64),
}

/// The content of staged files: an anonymous temporary file, gone when dropped.
struct Staging {
    file: Option<std::fs::File>,
    len: u64,
}

impl Staging {
    fn put(&mut self, data: &[u8]) -> Result<(u64, u64)> {
        if self.file.is_none() {
            self.file = Some(tempfile::tempfile().map_err(|e| format!("staging file: {e}"))?);
        }
        let f = self.file.as_mut().expect("just made");
        f.write_all(data)
            .map_err(|e| format!("staging file: {e}"))?;
        let at = self.len;
        self.len += data.len() as u64;
        Ok((at, data.len() as u64))
    }

    fn get(&self, (at, len): (u64, u64)) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut data = vec![0u8; len as usize];
        if len > 0 {
            self.file
                .as_ref()
                .ok_or("staging file missing")?
                .read_exact_at(&mut data, at)
                .map_err(|e| format!("staging file: {e}"))?;
        }
        Ok(data)
    }
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
        libc::S_IFLNK => Some("symlink: only regular files and directories exist in a store"),
        _ => Some("special file: only regular files and directories exist in a store"),
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
    let mut staging = Staging { file: None, len: 0 };
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
        let at = (top.depth + 1, top.bytes + 1 + raw.len());
        let parent = top.index;
        if let Some((fd, entry)) =
            stage_entry(limits, &top.fd, &raw, &path, at, &mut staging, report)?
        {
            let (kind, bytes) = (entry.kind, at.1 - raw.len() + entry.name.len());
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

/// Looks at one entry of the source and stages it, or lists it as skipped (None).
fn stage_entry(
    limits: &Limits,
    dir: &OwnedFd,
    raw: &OsStr,
    path: &Path,
    (depth, bytes): (usize, usize),
    staging: &mut Staging,
    report: &mut ImportReport,
) -> Result<Option<(OwnedFd, Staged)>> {
    let mut skip = |why: &str| {
        report.skipped.push((shown(path), why.to_string()));
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
    let name = match Name::parse(raw.as_bytes(), limits.names) {
        Ok(n) => n,
        Err(e) => return skip(&e.to_string()),
    };
    // The same limits as an entry made through the mount: never deeper, never longer.
    if depth > limits.max_depth {
        return skip(&format!(
            "would be {depth} levels deep, over --max-depth {}",
            limits.max_depth
        ));
    }
    let bytes = bytes - raw.len() + name.as_str().len();
    if bytes > limits.max_path_bytes {
        return skip(&format!(
            "path would be {bytes} bytes, over --max-path-bytes {}",
            limits.max_path_bytes
        ));
    }
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
        Err(Errno::ELOOP) => return skip(refused_kind(libc::S_IFLNK).unwrap_or(CHANGED)),
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
    let over = format!("over --max-file-bytes {}", limits.max_file_bytes);
    if !is_dir && st.st_size as u64 > limits.max_file_bytes {
        return skip(&over);
    }
    let mut entry = Staged {
        parent: None,
        name: name.as_str().to_string(),
        path: shown(path),
        kind: if is_dir { Kind::Dir } else { Kind::File },
        perm: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
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
        .take(limits.max_file_bytes.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| format!("{}: {e}", shown(path)))?;
    if data.len() as u64 > limits.max_file_bytes {
        return skip(&over);
    }
    entry.content = staging.put(&data)?;
    Ok(Some((OwnedFd::from(f), entry)))
}

/// Writes the staged entries below `target` in `w`. A directory that already exists takes the
/// staged one's entries; any other name that exists is skipped with what was staged below it.
///
/// `--max-files` and `--quota` hold here, counting what the store holds already: an entry that
/// would take the store past either is skipped and listed (a directory with all below it).
fn commit_staged(
    w: &mut WriteTxn<'_>,
    limits: &Limits,
    (staged, staging): &(Vec<Staged>, Staging),
    target: u64,
    report: &mut ImportReport,
) -> Result<()> {
    // The inode each staged directory became (None: skipped, and so is everything below it).
    let mut made: Vec<Option<u64>> = Vec::with_capacity(staged.len());
    let now = now_ns();
    let usage = w.usage().map_err(err)?;
    let mut entries = usage.files + usage.dirs;
    let mut content = usage.content_bytes;
    for e in staged {
        let parent = match e.parent {
            None => Some(target),
            Some(i) => made[i],
        };
        let Some(parent) = parent else {
            made.push(None);
            continue;
        };
        match w.lookup(parent, &e.name).map_err(err)? {
            Some((ino, Kind::Dir)) if e.kind == Kind::Dir => {
                made.push(Some(ino));
                continue;
            }
            Some(_) => {
                report
                    .skipped
                    .push((e.path.clone(), "already exists in the store".into()));
                made.push(None);
                continue;
            }
            None => {}
        }
        if entries >= limits.max_files {
            report.skipped.push((
                e.path.clone(),
                format!("over --max-files {}", limits.max_files),
            ));
            made.push(None);
            continue;
        }
        // A staged file's content is (offset, length) in the staging file.
        let size = if e.kind == Kind::File { e.content.1 } else { 0 };
        if limits.quota_bytes > 0 && content + size > limits.quota_bytes {
            report.skipped.push((
                e.path.clone(),
                format!("over --quota {} content bytes", limits.quota_bytes),
            ));
            made.push(None);
            continue;
        }
        entries += 1;
        content += size;
        let is_dir = e.kind == Kind::Dir;
        let mut inode = Inode {
            ino: w.alloc_ino().map_err(err)?,
            kind: e.kind,
            perm: e.perm,
            uid: e.uid,
            gid: e.gid,
            size: 0,
            nlink: if is_dir { 2 } else { 1 },
            parent,
            atime: e.atime,
            mtime: e.mtime,
            ctime: now,
            crtime: now,
            name: e.name.clone(),
        };
        if is_dir {
            w.put_inode(&inode).map_err(err)?;
            w.put_dirent(parent, &e.name, inode.ino, e.kind)
                .map_err(err)?;
            let mut p = w.inode(parent).map_err(err)?.ok_or("parent vanished")?;
            p.nlink += 1;
            w.put_inode(&p).map_err(err)?;
            report.dirs += 1;
            made.push(Some(inode.ino));
            continue;
        }
        let data = staging.get(e.content)?;
        inode.size = data.len() as u64;
        for (idx, chunk) in data.chunks(CHUNK_SIZE as usize).enumerate() {
            w.put_chunk(inode.ino, idx as u64, chunk).map_err(err)?;
        }
        w.put_inode(&inode).map_err(err)?;
        w.put_dirent(parent, &e.name, inode.ino, e.kind)
            .map_err(err)?;
        report.files += 1;
        report.bytes += inode.size;
        made.push(None);
    }
    Ok(())
}

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
    let entries = match tree(r, path) {
        Ok(entries) => entries,
        Err(e) => {
            remove_made(&root, &[], dest, created);
            return Err(e);
        }
    };
    let base = entries[0].1.path.clone();
    let target = |e: &EntryInfo| dest.join(e.path[base.len()..].trim_start_matches('/'));
    let refused = |e: &EntryInfo, x: nix::Error| match x {
        Errno::EEXIST | Errno::ELOOP | Errno::ENOTDIR => format!(
            "{}: something else is there (a symlink or a file put there during the export); \
             export never writes through one",
            target(e).display()
        ),
        x => format!("{}: {x}", target(e).display()),
    };
    // What the export made directly in `dest`: removed again if it fails.
    let mut tops: Vec<String> = Vec::new();
    let keep = root
        .try_clone()
        .map_err(|x| format!("{}: {x}", dest.display()))?;
    let written = (|| -> Result<ExportReport> {
        let mut report = ExportReport::default();
        // The directories from `dest` down to the one being written, each open; a directory gets
        // its mode and times once its last entry is written, so they do not move its mtime.
        let mut open: Vec<OpenDir> = Vec::new();
        let top_is_dir = entries[0].1.kind == "dir";
        open.push((root, top_is_dir.then_some(&entries[0].1), created));
        let close = |(fd, e, mode): OpenDir| match e {
            Some(e) => finish_entry(&fd, e, opts, mode),
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
                    .map_err(|x| refused(e, x))?;
                let fd = openat(parent, e.name.as_str(), DIR_FLAGS, Mode::empty())
                    .map_err(|x| refused(e, x))?;
                open.push((fd, Some(e), true));
                report.dirs += 1;
            } else {
                let fd = openat(
                    parent,
                    e.name.as_str(),
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(|x| refused(e, x))?;
                let (inode, _) = lookup_path(r, &e.path)?;
                let data = read_content(r, &inode)?;
                let mut f = std::fs::File::from(fd);
                f.write_all(&data)
                    .map_err(|x| format!("{}: {x}", target(e).display()))?;
                finish_entry(&OwnedFd::from(f), e, opts, true)?;
                report.files += 1;
                report.bytes += data.len() as u64;
            }
            progress(report.files + report.dirs);
        }
        while let Some(d) = open.pop() {
            close(d)?;
        }
        Ok(report)
    })();
    if written.is_err() {
        remove_made(&keep, &tops, dest, created);
    }
    written
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

/// `export --tar`: the tree under `path` as a POSIX (pax) tar stream with modes and mtimes.
pub fn export_tar(r: &ReadTxn, path: &str, out: &mut dyn Write) -> Result<ExportReport> {
    let entries = tree(r, path)?;
    let base = entries[0].1.path.clone();
    let mut report = ExportReport::default();
    for (depth, e) in &entries {
        if *depth == 0 && e.kind == "dir" {
            continue;
        }
        let rel = e.path[base.len()..].trim_start_matches('/');
        let rel = if rel.is_empty() {
            e.name.clone()
        } else {
            rel.to_string()
        };
        if e.kind == "dir" {
            crate::tar::write_entry(out, &format!("{rel}/"), e, &[]).map_err(err)?;
            report.dirs += 1;
        } else {
            let (inode, _) = lookup_path(r, &e.path)?;
            let data = read_content(r, &inode)?;
            crate::tar::write_entry(out, &rel, e, &data).map_err(err)?;
            report.files += 1;
            report.bytes += data.len() as u64;
        }
    }
    crate::tar::finish(out).map_err(err)?;
    Ok(report)
}

/// Files neither read nor written since `cutoff_ns` (atime is kept within an hour, see
/// SEMANTICS.md), as (path, last use).
pub fn unused_since(r: &ReadTxn, path: &str, cutoff_ns: i64) -> Result<Vec<(String, i64)>> {
    Ok(tree(r, path)?
        .into_iter()
        .filter(|(_, e)| e.kind == "file" && e.atime_ns.max(e.mtime_ns) < cutoff_ns)
        .map(|(_, e)| (e.path, e.atime_ns.max(e.mtime_ns)))
        .collect())
}

/// `expire` on an unmounted store: removes the given files in one transaction.
pub fn remove_files(store: &Store, paths: &[String]) -> Result<u64> {
    let r = store.read().map_err(err)?;
    let mut w = store.write().map_err(err)?;
    let now = now_ns();
    for p in paths {
        let (inode, _) = lookup_path(&r, p)?;
        if inode.kind != Kind::File {
            continue;
        }
        w.remove_dirent(inode.parent, &inode.name).map_err(err)?;
        w.delete_inode(inode.ino).map_err(err)?;
        let mut parent = w
            .inode(inode.parent)
            .map_err(err)?
            .ok_or("parent vanished")?;
        parent.mtime = now;
        parent.ctime = now;
        w.put_inode(&parent).map_err(err)?;
    }
    w.commit(Sync::Durable).map_err(err)?;
    Ok(paths.len() as u64)
}

/// `check --repair`: reclaims orphans and unreachable inodes, drops entries that point to
/// nothing, and recomputes directory link counts. Never removes a reachable file.
pub fn repair(store: &Store) -> Result<Vec<String>> {
    let r = store.read().map_err(err)?;
    let inodes: HashMap<u64, Inode> = r
        .all_inodes()
        .map_err(err)?
        .into_iter()
        .map(|i| (i.ino, i))
        .collect();
    let dirents = r.all_dirents().map_err(err)?;
    let orphans: HashSet<u64> = r.orphans().map_err(err)?.into_iter().collect();
    drop(r);
    let mut w = store.write().map_err(err)?;
    let mut fixes = Vec::new();
    // Reachability from the root through entries that point to live inodes.
    let mut children: HashMap<u64, Vec<(String, u64)>> = HashMap::new();
    for (parent, e) in &dirents {
        if inodes.contains_key(&e.ino) {
            children
                .entry(*parent)
                .or_default()
                .push((e.name.clone(), e.ino));
        } else {
            w.remove_dirent(*parent, &e.name).map_err(err)?;
            fixes.push(format!(
                "removed entry {:?} in {parent}, which pointed to missing inode {}",
                e.name, e.ino
            ));
        }
    }
    let mut reachable = HashSet::from([ROOT_INO]);
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        for (_, c) in children.get(&d).into_iter().flatten() {
            if reachable.insert(*c) && inodes.get(c).is_some_and(|i| i.kind == Kind::Dir) {
                stack.push(*c);
            }
        }
    }
    for ino in inodes.keys() {
        if !reachable.contains(ino) {
            w.delete_inode(*ino).map_err(err)?;
            fixes.push(if orphans.contains(ino) {
                format!("reclaimed orphan {ino}")
            } else {
                format!("reclaimed unreachable inode {ino}")
            });
        }
    }
    for (ino, i) in &inodes {
        if i.kind == Kind::Dir && reachable.contains(ino) {
            let subdirs = children
                .get(ino)
                .into_iter()
                .flatten()
                .filter(|(_, c)| inodes.get(c).is_some_and(|x| x.kind == Kind::Dir))
                .count() as u32;
            if i.nlink != 2 + subdirs {
                let mut fixed = i.clone();
                fixed.nlink = 2 + subdirs;
                w.put_inode(&fixed).map_err(err)?;
                fixes.push(format!(
                    "directory {ino}: nlink {} -> {}",
                    i.nlink,
                    2 + subdirs
                ));
            }
        }
    }
    w.commit(Sync::Durable).map_err(err)?;
    Ok(fixes)
}

/// Parses `30d`, `12h`, `90m`, `45s` or `2w` into nanoseconds.
pub fn parse_duration(s: &str) -> Result<i64> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 30d, 12h, 90m)"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" | "" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(format!("{s:?}: unknown unit (use s, m, h, d or w)")),
    };
    Ok(n.saturating_mul(secs).saturating_mul(1_000_000_000))
}

/// Parses `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM[:SS][Z]` (UTC) into ns since the epoch.
pub fn parse_date(s: &str) -> Result<i64> {
    let bad = || format!("{s:?} is not a date (examples: 2026-01-31, 2026-01-31T08:00:00Z)");
    let s2 = s.trim().trim_end_matches('Z');
    let (date, time) = s2.split_once(['T', ' ']).unwrap_or((s2, "00:00:00"));
    let d: Vec<i64> = date
        .split('-')
        .map(|x| x.parse().map_err(|_| bad()))
        .collect::<Result<_>>()?;
    let t: Vec<i64> = time
        .split(':')
        .map(|x| x.parse().map_err(|_| bad()))
        .collect::<Result<_>>()?;
    if d.len() != 3
        || t.len() < 2
        || t.len() > 3
        || !(1..=12).contains(&d[1])
        || !(1..=31).contains(&d[2])
    {
        return Err(bad());
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m, day) = (if d[1] <= 2 { d[0] - 1 } else { d[0] }, d[1], d[2]);
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + t[0] * 3600 + t[1] * 60 + t.get(2).copied().unwrap_or(0);
    Ok(secs * 1_000_000_000)
}

/// Answers a read-only request (`ls`, `cat`, `tree`, `du`, `stats`, `check`, `unused`) from
/// one read transaction. The daemon answers these for a mounted store and the CLI for an
/// unmounted one, so both print the same.
pub fn query(r: &ReadTxn, store_bytes: u64, req: &serde_json::Value) -> Result<serde_json::Value> {
    use serde_json::{Value, json};
    let path = req.get("path").and_then(Value::as_str).unwrap_or("/");
    let v = match req.get("op").and_then(Value::as_str).unwrap_or("") {
        "ls" => json!({"entries": ls(r, path)?}),
        "cat" => content_json(cat(r, path)?),
        "tree" => {
            let t: Vec<Value> = tree(r, path)?
                .into_iter()
                .map(|(depth, e)| json!({"depth": depth, "entry": e}))
                .collect();
            json!({"tree": t})
        }
        "du" => json!({"du": du(r, path)?}),
        "stats" => json!({"stats": stats(r, store_bytes)?}),
        "check" => json!({"findings": crate::check::invariants(r).map_err(err)?}),
        "log" => {
            let since = match req.get("since").and_then(Value::as_str) {
                Some(spec) => Some(point_time(r, spec)?),
                None => None,
            };
            let limit = req.get("limit").and_then(Value::as_u64).unwrap_or(u64::MAX) as usize;
            let recs = log(r, req.get("path").and_then(Value::as_str), since, limit)?;
            json!({"records": recs, "last_seq": r.last_seq().map_err(err)?})
        }
        "show" => {
            let seq = resolve_point(
                r,
                req.get("at")
                    .and_then(Value::as_str)
                    .ok_or("show needs \"at\"")?,
            )?;
            content_json(show_at(r, path, seq)?)
        }
        "diff" => {
            let from = resolve_point(
                r,
                req.get("from")
                    .and_then(Value::as_str)
                    .ok_or("diff needs \"from\"")?,
            )?;
            let to = match req.get("to").and_then(Value::as_str) {
                Some(spec) => Some(resolve_point(r, spec)?),
                None => None,
            };
            json!({"diff": diff(r, path, from, to)?})
        }
        "marks" => json!({"marks": r.marks().map_err(err)?}),
        "unused" => {
            let cutoff = req
                .get("cutoff_ns")
                .and_then(Value::as_i64)
                .ok_or("unused needs cutoff_ns")?;
            json!({"files": unused_since(r, path, cutoff)?})
        }
        other => return Err(format!("unknown query {other:?}")),
    };
    Ok(v)
}

/// Content as JSON: a string when it is UTF-8, hex otherwise.
fn content_json(data: Vec<u8>) -> serde_json::Value {
    match String::from_utf8(data) {
        Ok(s) => serde_json::json!({"content": s}),
        Err(e) => {
            let hex: String = e.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
            serde_json::json!({"content_hex": hex})
        }
    }
}

/// The time of a point given as a time, or of the record a seq or mark names.
fn point_time(r: &ReadTxn, spec: &str) -> Result<i64> {
    if let Ok(ago) = parse_duration(spec)
        && spec.ends_with(|c: char| c.is_ascii_alphabetic())
    {
        return Ok(now_ns() - ago);
    }
    if let Ok(t) = parse_date(spec) {
        return Ok(t);
    }
    let seq = resolve_point(r, spec)?;
    Ok(r.history(seq..=seq)
        .map_err(err)?
        .first()
        .map_or(0, |rec| rec.time))
}

/// Runs a history request that changes the store (`mark`, `rollback`, `revert`, `redact`,
/// `snapshot_at`) on `fs`: the daemon's for a mounted store, a fresh one otherwise.
pub fn history_change(fs: &crate::fs::Fs, req: &serde_json::Value) -> Result<serde_json::Value> {
    use serde_json::{Value, json};
    let caller = crate::fs::Caller {
        uid: req.get("uid").and_then(Value::as_u64).unwrap_or(0) as u32,
        gid: req.get("gid").and_then(Value::as_u64).unwrap_or(0) as u32,
        pid: req.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32,
    };
    let path = req.get("path").and_then(Value::as_str).unwrap_or("/");
    let point = |key: &str| -> Result<u64> {
        let spec = req
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("needs \"{key}\""))?;
        resolve_point(&fs.store().read().map_err(err)?, spec)
    };
    let v = match req.get("op").and_then(Value::as_str).unwrap_or("") {
        "mark" => {
            let name = req
                .get("name")
                .and_then(Value::as_str)
                .ok_or("mark needs \"name\"")?;
            json!({"seq": fs.mark(name).map_err(err)?})
        }
        "rollback" => {
            let seq = point("to")?;
            json!({"to": seq, "undone": fs.rollback(caller, seq).map_err(err)?})
        }
        "revert" => {
            let seq = point("to")?;
            fs.revert(caller, path, seq).map_err(err)?;
            json!({"to": seq})
        }
        "redact" => {
            let at = match req.get("at").and_then(Value::as_str) {
                Some(_) => Some(point("at")?),
                None => None,
            };
            json!({"erased_chunks": fs.redact(path, at).map_err(err)?})
        }
        "snapshot_at" => {
            let seq = point("at")?;
            let out = req
                .get("out")
                .and_then(Value::as_str)
                .ok_or("needs \"out\"")?;
            let r = fs.store().read().map_err(err)?;
            let info = at_point(&r, seq, |t| snapshot(t, Path::new(out), &mut |_| {}))?;
            json!({"snapshot": info, "at": seq})
        }
        other => return Err(format!("unknown history request {other:?}")),
    };
    Ok(v)
}

/// Decodes the content of a `cat` answer.
pub fn content_of(v: &serde_json::Value) -> Vec<u8> {
    if let Some(s) = v.get("content").and_then(serde_json::Value::as_str) {
        return s.as_bytes().to_vec();
    }
    let hex = v
        .get("content_hex")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}

// ---- history ----

/// Resolves a point in history: a seq number (`42` or `@42`), a mark name, or a time
/// (`2026-01-31`, `2026-01-31T08:00:00Z`, or `30m` / `2h` / `1d` ago). The point is the state
/// after that record committed; 0 is the empty store before any record.
pub fn resolve_point(r: &ReadTxn, spec: &str) -> Result<u64> {
    let spec = spec.trim();
    let digits = spec.trim_start_matches('@');
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let seq: u64 = digits.parse().map_err(err)?;
        let last = r.last_seq().map_err(err)?;
        if seq > last {
            return Err(format!(
                "history has no record {seq} yet (the newest is {last})"
            ));
        }
        return Ok(seq);
    }
    if let Some(seq) = r
        .mark(spec.strip_prefix("mark:").unwrap_or(spec))
        .map_err(err)?
    {
        return Ok(seq);
    }
    let at = match parse_duration(spec) {
        Ok(ago) if spec.ends_with(|c: char| c.is_ascii_alphabetic()) => now_ns() - ago,
        _ => parse_date(spec).map_err(|_| {
            format!(
                "{spec:?} is neither a history seq, a mark, a date nor a duration ago (30m, 2h, 1d)"
            )
        })?,
    };
    // The newest record at or before that time.
    for rec in r.history(0..=u64::MAX).map_err(err)? {
        if rec.time <= at {
            return Ok(rec.seq);
        }
    }
    Ok(0)
}

/// Runs `f` on the store as it was at `seq` (see `ReadTxn::at_point`).
pub fn at_point<T>(r: &ReadTxn, seq: u64, f: impl FnOnce(&ReadTxn) -> Result<T>) -> Result<T> {
    r.at_point(seq, f)
}

/// `log`: history records, newest first, for the whole store or for `path` (following it
/// back through renames), no older than `since_ns`.
pub fn log(
    r: &ReadTxn,
    path: Option<&str>,
    since_ns: Option<i64>,
    limit: usize,
) -> Result<Vec<HistoryRecord>> {
    r.history_of(path, since_ns, limit).map_err(err)
}

/// `show`: a file's content at a point.
pub fn show_at(r: &ReadTxn, path: &str, seq: u64) -> Result<Vec<u8>> {
    at_point(r, seq, |r| {
        let (inode, canon) = lookup_path(r, path).map_err(|e| format!("at {seq}: {e}"))?;
        if inode.kind != Kind::File {
            return Err(format!("{canon}: is a directory"));
        }
        if r.content_redacted(inode.ino).map_err(err)? {
            return Err(format!(
                "{canon} at {seq}: this version's content was redacted"
            ));
        }
        read_content(r, &inode)
    })
}

/// A file's text at a point, or None where it did not exist.
fn text_at(r: &ReadTxn, path: &str, seq: Option<u64>) -> Result<Option<String>> {
    let get = |r: &ReadTxn| -> Result<Option<String>> {
        match lookup_path(r, path) {
            Ok((inode, _)) if inode.kind == Kind::File => Ok(Some(
                String::from_utf8_lossy(&read_content(r, &inode)?).into_owned(),
            )),
            Ok((_, canon)) => Err(format!("{canon}: is a directory")),
            Err(_) => Ok(None),
        }
    };
    match seq {
        Some(s) => at_point(r, s, get),
        None => get(r),
    }
}

/// `diff`: a unified diff of a file between two points (`to` None: now).
pub fn diff(r: &ReadTxn, path: &str, from: u64, to: Option<u64>) -> Result<String> {
    let a = text_at(r, path, Some(from))?;
    let b = text_at(r, path, to)?;
    let label = |s: Option<u64>| s.map_or("now".to_string(), |s| format!("@{s}"));
    Ok(crate::diff::unified(
        a.as_deref().unwrap_or(""),
        b.as_deref().unwrap_or(""),
        &format!(
            "{path} ({})",
            if a.is_some() {
                label(Some(from))
            } else {
                "absent".into()
            }
        ),
        &format!(
            "{path} ({})",
            if b.is_some() {
                label(to)
            } else {
                "absent".into()
            }
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_dates() {
        assert_eq!(parse_duration("30d").unwrap(), 30 * 86_400 * 1_000_000_000);
        assert_eq!(parse_duration("90m").unwrap(), 90 * 60 * 1_000_000_000);
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_date("1970-01-01").unwrap(), 0);
        assert_eq!(
            parse_date("2000-03-01T00:00:00Z").unwrap(),
            951_868_800 * 1_000_000_000
        );
        assert_eq!(
            parse_date("2026-11-29T12:30").unwrap(),
            1_795_955_400 * 1_000_000_000
        );
        assert!(parse_date("2026-13-01").is_err());
    }
}
