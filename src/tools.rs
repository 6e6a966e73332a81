//! Operations on a store file, outside the filesystem's request path: inspection (ls, cat,
//! tree, du, stats), snapshot and restore, export and import, expiry and repair. The CLI runs
//! them on an unmounted store directly and the daemon runs the read-only ones for a mounted
//! store, so both give the same answers.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

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
    fn walk(
        r: &ReadTxn,
        dir: u64,
        path: &str,
        depth: usize,
        out: &mut Vec<(usize, EntryInfo)>,
    ) -> Result<()> {
        for e in r.list(dir).map_err(err)? {
            let i = r
                .inode(e.ino)
                .map_err(err)?
                .ok_or_else(|| format!("missing inode {}", e.ino))?;
            let p = join(path, &e.name);
            out.push((depth, info(p.clone(), &i)));
            if i.kind == Kind::Dir {
                walk(r, i.ino, &p, depth + 1, out)?;
            }
        }
        Ok(())
    }
    if inode.kind == Kind::Dir {
        walk(r, inode.ino, &canon, 1, &mut out)?;
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

fn parent_dir(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Opens a store file and checks it: redb's integrity check plus every invariant.
pub fn verify(path: &Path) -> Result<()> {
    let mut s = Store::open_existing(path).map_err(err)?;
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
    let finish = || -> Result<()> {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(err)?;
        verify(&tmp)?;
        std::fs::rename(&tmp, out).map_err(|e| format!("{}: {e}", out.display()))?;
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
    verify(snapshot_path)?;
    let dir = parent_dir(store);
    let tmp = dir.join(format!(".restore-tmp-{}", std::process::id()));
    std::fs::copy(snapshot_path, &tmp)
        .map_err(|e| format!("copying {}: {e}", snapshot_path.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(err)?;
    // A store left by a crash may hold commits only in its log: opening it applies them, so
    // the file kept below is complete. A log that cannot be applied goes with the old file.
    let log = crate::store::wal::path_of(store);
    if log.exists() {
        drop(Store::open_existing(store));
    }
    let mut kept = None;
    if store.exists() && !discard_current {
        let secs = now_ns() / 1_000_000_000;
        let mut k = store.as_os_str().to_owned();
        k.push(format!(".before-restore-{secs}"));
        let k = PathBuf::from(k);
        std::fs::hard_link(store, &k).map_err(|e| format!("keeping {}: {e}", store.display()))?;
        kept = Some(k);
    }
    if log.exists() {
        let moved = match &kept {
            Some(k) => std::fs::rename(&log, crate::store::wal::path_of(k)),
            None => std::fs::remove_file(&log),
        };
        moved.map_err(|e| format!("{}: {e}", log.display()))?;
    }
    std::fs::rename(&tmp, store).map_err(|e| format!("{}: {e}", store.display()))?;
    fsync_dir(&dir)?;
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
/// Names the normaliser refuses, symlinks, special files, files over the size limit and names
/// that already exist are listed and skipped, or fail the whole import when `strict`.
/// `progress` hears the entries imported so far.
pub fn import(
    store: &Store,
    limits: &Limits,
    src: &Path,
    into: &str,
    strict: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<ImportReport> {
    let (target, _) = lookup_path(&store.read().map_err(err)?, into)?;
    if target.kind != Kind::Dir {
        return Err(format!("{into}: not a directory in the store"));
    }
    let mut w = store.write().map_err(err)?;
    let mut report = ImportReport::default();
    import_dir(&mut w, limits, src, target.ino, &mut report, progress)?;
    if strict && !report.skipped.is_empty() {
        let (p, why) = &report.skipped[0];
        return Err(format!(
            "--strict: {p}: {why} ({} entries would be skipped)",
            report.skipped.len()
        ));
    }
    w.commit(Sync::Durable).map_err(err)?;
    Ok(report)
}

fn import_dir(
    w: &mut WriteTxn<'_>,
    limits: &Limits,
    src: &Path,
    parent: u64,
    report: &mut ImportReport,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .map_err(|e| format!("{}: {e}", src.display()))?
        .collect::<std::io::Result<_>>()
        .map_err(|e| format!("{}: {e}", src.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let shown = path.display().to_string();
        let md = std::fs::symlink_metadata(&path).map_err(|e| format!("{shown}: {e}"))?;
        let ft = md.file_type();
        if ft.is_symlink() {
            report.skipped.push((
                shown,
                "symlink: only regular files and directories exist in a store".into(),
            ));
            continue;
        }
        if !ft.is_file() && !ft.is_dir() {
            report.skipped.push((
                shown,
                "special file: only regular files and directories exist in a store".into(),
            ));
            continue;
        }
        let raw = std::os::unix::ffi::OsStrExt::as_bytes(entry.file_name().as_os_str()).to_vec();
        let name = match Name::parse(&raw, limits.names) {
            Ok(n) => n,
            Err(e) => {
                report.skipped.push((shown, e.to_string()));
                continue;
            }
        };
        if let Some((existing, kind)) = w.lookup(parent, name.as_str()).map_err(err)? {
            if ft.is_dir() && kind == Kind::Dir {
                import_dir(w, limits, &path, existing, report, progress)?;
            } else {
                report
                    .skipped
                    .push((shown, "already exists in the store".into()));
            }
            continue;
        }
        if ft.is_file() && md.len() > limits.max_file_bytes {
            report.skipped.push((
                shown,
                format!("over --max-file-bytes {}", limits.max_file_bytes),
            ));
            continue;
        }
        let now = now_ns();
        let kind = if ft.is_dir() { Kind::Dir } else { Kind::File };
        let inode = Inode {
            ino: w.alloc_ino().map_err(err)?,
            kind,
            perm: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
            size: if ft.is_file() { md.len() } else { 0 },
            nlink: if ft.is_dir() { 2 } else { 1 },
            parent,
            atime: time_ns(md.atime(), md.atime_nsec()),
            mtime: time_ns(md.mtime(), md.mtime_nsec()),
            ctime: now,
            crtime: now,
            name: name.as_str().to_string(),
        };
        if ft.is_file() {
            let data = std::fs::read(&path).map_err(|e| format!("{shown}: {e}"))?;
            let mut inode = inode;
            inode.size = data.len() as u64;
            for (idx, chunk) in data.chunks(CHUNK_SIZE as usize).enumerate() {
                w.put_chunk(inode.ino, idx as u64, chunk).map_err(err)?;
            }
            w.put_inode(&inode).map_err(err)?;
            w.put_dirent(parent, name.as_str(), inode.ino, kind)
                .map_err(err)?;
            report.files += 1;
            report.bytes += inode.size;
        } else {
            w.put_inode(&inode).map_err(err)?;
            w.put_dirent(parent, name.as_str(), inode.ino, kind)
                .map_err(err)?;
            let mut p = w.inode(parent).map_err(err)?.ok_or("parent vanished")?;
            p.nlink += 1;
            w.put_inode(&p).map_err(err)?;
            report.dirs += 1;
            import_dir(w, limits, &path, inode.ino, report, progress)?;
        }
        progress(report.files + report.dirs);
    }
    Ok(())
}

fn set_times(path: &Path, atime: i64, mtime: i64) -> Result<()> {
    let ts = |ns: i64| libc::timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000),
    };
    let times = [ts(atime), ts(mtime)];
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
        .map_err(err)?;
    // SAFETY: a valid C string and a two-element timespec array.
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    if r != 0 {
        return Err(format!(
            "{}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// What `export` wrote.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ExportReport {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
}

/// `export` to a directory: the tree under `path` with modes and mtimes, into `dest` (created;
/// must be empty if it exists). `progress` hears the entries written so far.
pub fn export_dir(
    r: &ReadTxn,
    path: &str,
    dest: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<ExportReport> {
    if dest.exists() && std::fs::read_dir(dest).map_err(err)?.next().is_some() {
        return Err(format!(
            "{}: not empty; export writes into a new or empty directory",
            dest.display()
        ));
    }
    std::fs::create_dir_all(dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let entries = tree(r, path)?;
    let base = entries[0].1.path.clone();
    let mut report = ExportReport::default();
    let mut dirs = Vec::new();
    for (depth, e) in &entries {
        let rel = e.path[base.len()..].trim_start_matches('/');
        let target = if rel.is_empty() {
            dest.to_path_buf()
        } else {
            dest.join(rel)
        };
        if e.kind == "dir" {
            if *depth > 0 {
                std::fs::create_dir(&target).map_err(|x| format!("{}: {x}", target.display()))?;
                report.dirs += 1;
            }
            dirs.push((target, e.clone()));
        } else {
            let (inode, _) = lookup_path(r, &e.path)?;
            let data = read_content(r, &inode)?;
            std::fs::write(&target, &data).map_err(|x| format!("{}: {x}", target.display()))?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(e.mode))
                .map_err(err)?;
            set_times(&target, e.atime_ns, e.mtime_ns)?;
            report.files += 1;
            report.bytes += data.len() as u64;
        }
        progress(report.files + report.dirs);
    }
    // Directories last, deepest first, so writing their children does not move their mtimes.
    for (target, e) in dirs.iter().rev() {
        if target != dest {
            std::fs::set_permissions(target, std::fs::Permissions::from_mode(e.mode))
                .map_err(err)?;
        }
        set_times(target, e.atime_ns, e.mtime_ns)?;
    }
    Ok(report)
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
