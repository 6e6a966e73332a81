//! Backup: `snapshot` (a consistent, checked copy of a store), `restore` (a checked copy put
//! in place in one rename, keeping the replaced store) and `verify`, which both rely on.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use super::common::lookup_path;
use super::common::{Result, err};
use crate::private::parent_dir;
use crate::store::disk::Disk;
use crate::store::schema::{META_LIMITS, META_REPLICA_GENERATIONS, META_REPLICAS};
use crate::store::{
    CHUNK_SIZE, CopyStats, Inode, Kind, ROOT_INO, ReadTxn, Store, Sync, TableDigest, TableSums,
    now_ns,
};

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

/// Checks a store file without writing to it: redb's integrity check (through an overlay
/// that keeps its writes in memory) plus every invariant. The file is opened read-only, so
/// a snapshot's copy is left exactly as it was written and synced.
pub fn verify(path: &Path) -> Result<()> {
    let mut s = crate::store::ReadOnlyStore::open(path).map_err(err)?;
    after_integrity(&mut s, path, None, |r| no_findings(r, path))
}

/// Runs redb's integrity check of the store file at `path` (every page's checksum, the
/// allocator state rebuilt from the trees and compared), then `check` of the file read
/// through the same opening, whose cache the integrity check filled: the file is read from
/// the kernel once. (Run side by side on two openings, each read the whole file into a
/// cache of its own: more CPU than the overlap saved in time on two cores.) The file is
/// good only if both say so;
/// redb's finding is the one reported when it finds something, and `check` then does not
/// run. A panic in `check` is a failure, never a pass. A store read from a private copy
/// (one that had to be recovered or migrated) is checked on that copy. `cache_max` caps
/// the opening's cache (a daemon's check; see `check_integrity_then_read_within`).
fn after_integrity<T>(
    s: &mut crate::store::ReadOnlyStore,
    path: &Path,
    cache_max: Option<u64>,
    check: impl FnOnce(&ReadTxn) -> Result<T>,
) -> Result<T> {
    let repaired = || format!("{}: redb had to repair the file", path.display());
    if s.is_private_copy() {
        if !s.check_integrity().map_err(err)? {
            return Err(repaired());
        }
        return check(&s.read().map_err(err)?);
    }
    checked_in_place(path, cache_max, check)
}

/// `after_integrity` of a store file read in place (not a private copy).
fn checked_in_place<T>(
    path: &Path,
    cache_max: Option<u64>,
    check: impl FnOnce(&ReadTxn) -> Result<T>,
) -> Result<T> {
    let repaired = || format!("{}: redb had to repair the file", path.display());
    let checked = match cache_max {
        Some(max) => crate::store::check_integrity_then_read_within(path, max),
        None => crate::store::check_integrity_then_read(path),
    }
    .map_err(err)?;
    if !checked.clean {
        return Err(repaired());
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check(&checked.read().map_err(err)?)
    }))
    .unwrap_or_else(|_| Err(format!("{}: the check of the file failed", path.display())))
}

/// Checks a copy `copy_to` just wrote against what it read (`tables`, in the order copied):
/// redb's integrity check (every page's checksum, the file opened read-only), then every
/// table found to hold the same entries, bytes and CRC-32C as the snapshot it was copied
/// from, and no other table, and the invariants but for the re-derivation of history's
/// indexes (see `check::invariants_of_copy`), whose scans of the tables they read whole
/// take those tables' sums. A copy made otherwise (`tables` empty) gets all of `verify`.
/// `cache_max` caps the cache of the opening that checks it (a daemon's check).
fn verify_copy_here(path: &Path, tables: &[TableDigest], cache_max: Option<u64>) -> Result<()> {
    if tables.is_empty() {
        return verify(path);
    }
    // One opening: a byte copy this process just wrote under a private name needs no
    // read-only opening beside the check's to keep a daemon out or to find it must be
    // recovered or migrated (a copy redb would have to repair is refused as such).
    checked_in_place(path, cache_max, |r| {
        // The invariants' scans of the tables they read whole sum those tables up as they
        // read them: the sums below read only the other tables. The sums are compared
        // first, whatever the invariants found.
        let mut sums = TableSums::new();
        let findings = crate::check::invariants_of_copy(r, &mut sums);
        let (found, all) = r.table_digests(&sums).map_err(err)?;
        for (want, got) in tables.iter().zip(&found) {
            if want != got {
                return Err(format!(
                    "{}: table {} of the copy holds {} entries, {} bytes (CRC-32C {:08x}) where {} entries, {} bytes ({:08x}) were copied; the copy is damaged",
                    path.display(),
                    want.name,
                    got.entries,
                    got.bytes,
                    got.crc,
                    want.entries,
                    want.bytes,
                    want.crc
                ));
            }
        }
        if found.len() != tables.len() || all != tables.len() {
            return Err(format!(
                "{}: the copy holds {all} tables where {} were copied; the copy is damaged",
                path.display(),
                tables.len()
            ));
        }
        first_finding(findings.map_err(err)?, path)
    })
}

/// `redbfs verify-copy PATH --table D...`: `verify_copy_here` in the child a daemon starts.
pub fn verify_copy_args(path: &Path, tables: &[String]) -> Result<()> {
    let tables = tables
        .iter()
        .map(|t| TableDigest::from_arg(t).ok_or_else(|| format!("{t}: not a table digest")))
        .collect::<Result<Vec<_>>>()?;
    verify_copy_here(path, &tables, None)
}

/// The check of a byte copy as a daemon runs it in its own process (`verify_copy_here`,
/// its cache capped at `COPY_CHECK_CACHE_MAX`): whatever the copy holds, a failure of the
/// check (a panic included) is an error, never a pass and never the daemon's end; the heap's
/// freed pages go back to the system when it is done, but for a copy within the cache's cap.
pub fn verify_copy_capped(path: &Path, tables: &[TableDigest]) -> Result<()> {
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        verify_copy_here(path, tables, Some(COPY_CHECK_CACHE_MAX))
    }))
    .unwrap_or_else(|_| {
        tracing::error!(path = %path.display(), "the check of a copy panicked; the copy is refused");
        Err(format!("{}: the check of the copy failed", path.display()))
    });
    // A copy within the cache's cap left at most about twice its size freed (the cache, the
    // file read whole), which the next check reuses: handing that back would only have it
    // faulted in again.
    let small = std::fs::metadata(path).is_ok_and(|m| m.len() <= COPY_CHECK_CACHE_MAX);
    if !small {
        crate::store::return_freed_memory();
    }
    checked
}

/// Set once a process serves a mount: see `verify_copy`.
static COPIES_CHECKED_APART: AtomicBool = AtomicBool::new(false);

/// From now on this process (a daemon) checks a byte copy it writes of up to
/// `CHECKED_HERE_MAX_INODES` inodes with its cache capped (`verify_copy_capped`), and a
/// larger one, or a copy made otherwise, in a child process. The full check
/// (`verify`: a copy that is not a byte copy, `snapshot --path`) decodes each history
/// record whole (an import's record of a million files takes hundreds of megabytes); a
/// daemon that did it in its own address space kept that high-water mark, and much of the
/// memory, for the rest of its life.
pub fn check_copies_apart() {
    COPIES_CHECKED_APART.store(true, Ordering::Relaxed);
}

/// The cache of a daemon's check of a byte copy, whatever the copy's size. redb's check
/// reads the file twice and empties its cache when done, so a cache smaller than the file
/// costs one more read of it from the kernel's page cache, where a child process cost a
/// process start, a second load of the program and a cache the size of the file faulted in
/// (more time, at 200,000 files, than that read). Beside it the check holds 14 bytes per
/// inode (2.8 MiB at 200,000 files), briefly, and hands the memory back when done.
pub const COPY_CHECK_CACHE_MAX: u64 = 1024 * 1024;

/// The most inodes a byte copy may hold for a daemon to check it in its own process: the
/// check's 14 bytes per inode stay within 4.2 MiB. A larger copy is checked in a child
/// process, whose memory goes with it.
pub const CHECKED_HERE_MAX_INODES: u64 = 300_000;

/// The hidden command a child runs to check a copy (`redbfs verify-copy PATH`).
const VERIFY_COPY_COMMAND: &str = "verify-copy";

/// Checks a copy this process just wrote (`verify_copy_here`). Once `check_copies_apart`
/// was called (a daemon), a byte copy of up to `CHECKED_HERE_MAX_INODES` inodes is checked
/// here with its cache capped, and a larger one, or a copy made otherwise (whose full check
/// decodes history records whole), in a child process of this same program. A child that cannot be started (no `/proc`, say) leaves the check to this
/// process, as before.
fn verify_copy(path: &Path, tables: &[TableDigest]) -> Result<()> {
    if !COPIES_CHECKED_APART.load(Ordering::Relaxed) {
        return verify_copy_here(path, tables, None);
    }
    let inodes = tables
        .iter()
        .find(|t| t.name == "inodes")
        .map(|t| t.entries);
    if inodes.is_some_and(|n| n <= CHECKED_HERE_MAX_INODES) {
        return verify_copy_capped(path, tables);
    }
    let child = std::process::Command::new("/proc/self/exe")
        .arg(VERIFY_COPY_COMMAND)
        .arg(path)
        .args(
            tables
                .iter()
                .flat_map(|t| ["--table".to_string(), t.to_arg()]),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output();
    match child {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stderr);
            let said = said.trim().trim_start_matches("redbfs: ");
            Err(if said.is_empty() {
                format!(
                    "{}: the check of the copy failed ({})",
                    path.display(),
                    out.status
                )
            } else {
                said.to_string()
            })
        }
        Err(e) => {
            tracing::warn!(error = %e, "no process to check the copy in; checking it here");
            verify_copy_here(path, tables, None)
        }
    }
}

/// `verify`, then `disown` (a restore's copy). On the host, a copy that needs no writing
/// (no migration, no replica settings to drop) is checked read-only and never opened for
/// writing: each writable opening costs several syncs of the file.
fn verify_and_disown_on(disk: &Disk, path: &Path) -> Result<Vec<String>> {
    if let Disk::Host = disk {
        let mut ro = crate::store::ReadOnlyStore::open(path).map_err(err)?;
        if !ro.is_private_copy() {
            let owned = after_integrity(&mut ro, path, None, |r| {
                no_findings(r, path)?;
                [META_REPLICAS, META_REPLICA_GENERATIONS]
                    .iter()
                    .map(|k| r.meta_bytes(k).map(|v| v.is_some()))
                    .collect::<std::result::Result<Vec<bool>, _>>()
                    .map_err(err)
            })?;
            drop(ro);
            if !owned.contains(&true) {
                return Ok(Vec::new());
            }
            let s = Store::open_existing_on(disk.clone(), path).map_err(err)?;
            return crate::replica::config::disown(&s).map_err(err);
        }
    }
    let mut s = Store::open_existing_on(disk.clone(), path).map_err(err)?;
    verify_open(&mut s, path)?;
    crate::replica::config::disown(&s).map_err(err)
}

fn verify_open(s: &mut Store, path: &Path) -> Result<()> {
    if !s.check_integrity().map_err(err)? {
        return Err(format!("{}: redb had to repair the file", path.display()));
    }
    no_findings(&s.read().map_err(err)?, path)
}

fn no_findings(r: &ReadTxn, path: &Path) -> Result<()> {
    first_finding(crate::check::invariants(r).map_err(err)?, path)
}

/// Refuses what `check` found, naming the first finding and how many there are.
fn first_finding(findings: Vec<String>, path: &Path) -> Result<()> {
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
    write_snapshot(out, |tmp| {
        r.copy_to_unsynced(tmp, progress)
            .map(|(stats, file)| (stats, Some(file)))
            .map_err(err)
    })
}

/// `snapshot --path`: a store holding only the directory at `path` as `r` sees it, as its
/// root (with its mode, owner and times, and the limits the store records), and
/// everything below it, content included; no history. Written, checked and put in place as
/// `snapshot` does.
pub fn snapshot_subtree(
    r: &ReadTxn,
    path: &str,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<SnapshotInfo> {
    let (top, _) = lookup_path(r, path)?;
    if top.kind != Kind::Dir {
        return Err(format!(
            "{path}: not a directory; snapshot --path takes a directory"
        ));
    }
    // `Store::create_for_copy` makes the file 0600 and O_EXCL|O_NOFOLLOW.
    write_snapshot(out, |tmp| {
        copy_subtree(r, &top, tmp, progress).map(|stats| (stats, None))
    })
}

/// Copies the tree under `top` into a new store at `out`, in one durable transaction.
fn copy_subtree(
    r: &ReadTxn,
    top: &Inode,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<CopyStats> {
    // The copy is written once: the small cache of a copy, not a mounted store's.
    let s = Store::create_for_copy(out, (top.uid, top.gid)).map_err(err)?;
    let mut w = s.write().map_err(err)?;
    w.without_history();
    if let Some(limits) = r.meta_bytes(META_LIMITS).map_err(err)? {
        w.put_meta(META_LIMITS, &limits).map_err(err)?;
    }
    let mut stats = CopyStats::default();
    let mut root = w
        .inode(ROOT_INO)
        .map_err(err)?
        .ok_or("the new store has no root")?;
    root.perm = top.perm;
    root.atime = top.atime;
    root.mtime = top.mtime;
    root.ctime = top.ctime;
    root.crtime = top.crtime;
    w.put_inode(&root).map_err(err)?;
    // (inode in `r`, inode in the copy) of each directory still to copy.
    let mut stack = vec![(top.ino, ROOT_INO)];
    while let Some((from, to)) = stack.pop() {
        let mut subdirs = 0;
        for e in r.list(from).map_err(err)? {
            let mut i = r
                .inode(e.ino)
                .map_err(err)?
                .ok_or_else(|| format!("missing inode {}", e.ino))?;
            let ino = w.alloc_ino().map_err(err)?;
            i.ino = ino;
            i.parent = to;
            w.put_inode(&i).map_err(err)?;
            w.put_dirent(to, &e.name, ino, i.kind).map_err(err)?;
            stats.entries += 1;
            match i.kind {
                Kind::Dir => {
                    subdirs += 1;
                    stack.push((e.ino, ino));
                }
                Kind::File => {
                    let n = i.size.div_ceil(CHUNK_SIZE);
                    // One chunk in memory at a time.
                    for idx in 0..n {
                        if let Some(Some(data)) = r.chunks(e.ino, idx, 1).map_err(err)?.pop() {
                            stats.bytes += data.len() as u64;
                            w.put_chunks(ino, std::iter::once((idx, data.as_slice())))
                                .map_err(err)?;
                        }
                    }
                }
            }
            progress(stats.entries);
        }
        let mut d = w
            .inode(to)
            .map_err(err)?
            .ok_or("a copied directory went missing")?;
        d.nlink = 2 + subdirs;
        w.put_inode(&d).map_err(err)?;
    }
    w.commit(Sync::Durable).map_err(err)?;
    drop(s);
    Ok(stats)
}

/// Writes a snapshot through `copy` (which creates the file it is given, and hands it back
/// when it is still to be synced) at a temporary name, checks it while it is synced, and
/// renames it into place.
fn write_snapshot(
    out: &Path,
    copy: impl FnOnce(&Path) -> Result<(CopyStats, Option<std::fs::File>)>,
) -> Result<SnapshotInfo> {
    let started = std::time::Instant::now();
    if out.exists() {
        return Err(format!(
            "{}: already exists; snapshot writes a new file",
            out.display()
        ));
    }
    crate::private::check_store_dir(out)?;
    let dir = parent_dir(out);
    // The daemon serves several snapshots at once: each its own temporary name (two to one
    // path shared one, and each removed the other's copy).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.tmp-{}-{}",
        out.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&tmp);
    let copied = copy(&tmp);
    let (stats, unsynced) = match copied {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    // `copy_to` created the temporary file 0600 and O_EXCL|O_NOFOLLOW.
    let finish = || -> Result<()> {
        checked_while_synced(&tmp, unsynced, || verify_copy(&tmp, &stats.tables))?;
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

/// Runs `check` of the file at `path` while `file` (the same file, just written) is synced on
/// a thread of its own: the check reads what the file holds as the sync writes it out, and
/// neither waits for the other. Both must succeed before anything relies on the file; with
/// no thread to sync on, the sync comes first.
fn checked_while_synced(
    path: &Path,
    file: Option<std::fs::File>,
    check: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let Some(file) = file else {
        return check();
    };
    let sync = move || {
        file.sync_all()
            .map_err(|e| crate::private::describe(path, e))
    };
    std::thread::scope(|scope| {
        let (checked, synced) = match std::thread::Builder::new()
            .name("sync-copy".to_string())
            .spawn_scoped(scope, sync)
        {
            Ok(h) => {
                let checked = check();
                let synced = h
                    .join()
                    .unwrap_or_else(|_| Err(format!("{}: the sync failed", path.display())));
                (checked, synced)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no thread to sync the copy on; syncing it first");
                let synced = std::fs::OpenOptions::new()
                    .read(true)
                    .open(path)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| crate::private::describe(path, e));
                (synced.clone().and_then(|()| check()), synced)
            }
        };
        checked.and(synced)
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

/// `restore`, also returning the replica URLs the restored store had and no longer ships to.
pub fn restore_dropping(
    snapshot_path: &Path,
    store: &Path,
    discard_current: bool,
) -> Result<(Option<PathBuf>, Vec<String>)> {
    restore_dropping_on(&Disk::Host, snapshot_path, store, discard_current)
}

/// `restore` on `disk` (the power-cut tests run it on a simulated disk).
#[doc(hidden)]
pub fn restore_on(
    disk: &Disk,
    snapshot_path: &Path,
    store: &Path,
    discard_current: bool,
) -> Result<Option<PathBuf>> {
    restore_dropping_on(disk, snapshot_path, store, discard_current).map(|r| r.0)
}

fn restore_dropping_on(
    disk: &Disk,
    snapshot_path: &Path,
    store: &Path,
    discard_current: bool,
) -> Result<(Option<PathBuf>, Vec<String>)> {
    crate::private::check_store_dir(store)?;
    let dir = parent_dir(store);
    let tmp = dir.join(format!(".restore-tmp-{}", std::process::id()));
    let _ = disk.remove(&tmp);
    // The snapshot is only read: it is copied first, and the copy is what is checked (redb's
    // check may write to the file it checks) and then put in place.
    let mut dropped = Vec::new();
    let copied = disk
        .copy_new_unsynced(snapshot_path, &tmp)
        .and_then(|unsynced| {
            checked_while_synced(&tmp, unsynced, || {
                verify_and_disown_on(disk, &tmp)
                    .map(|urls| dropped = urls)
                    .map_err(|e| {
                        e.replace(
                            &tmp.display().to_string(),
                            &snapshot_path.display().to_string(),
                        )
                    })
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
    Ok((kept, dropped))
}
