//! Filesystem semantics over a `Store`, free of FUSE: every operation takes plain values and
//! returns `Result<_, Error>`, so tests drive it directly without a mount.
//!
//! Invariants kept here:
//! - every namespace change is one store transaction; mkdir, unlink, rmdir, rename and setattr
//!   commit durably before they return; a create commits deferred and becomes durable with the
//!   next durable commit;
//! - file content is buffered per inode (`OpenFile`) from open until flush, fsync or the last
//!   release, and committed durably in one transaction;
//! - lock order is `files` map, then one `OpenFile`; no code holds an `OpenFile` lock while
//!   taking the map lock.

pub mod conflicts;
pub mod content;
pub mod error;
pub mod history;
pub mod lifetime;
pub mod name;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::store::{
    self, DirEntry, Inode, Kind, OpInfo, ROOT_INO, Store, StoreError, Sync, WriteTxn, now_ns,
};
pub use conflicts::LostUpdates;
use conflicts::{Conflict, Tracker};
use content::{FileSlot, OpenFile};
pub use error::{Error, Result};
use lifetime::{Claim, Lifetimes, Pin};
pub use name::{Name, NameError, NameRules};

/// The inode at `path` ("/", "/memories/notes.md" or "memories/notes.md") as `r` sees it, and
/// the path in canonical (NFC) form.
pub fn resolve_path(
    r: &store::ReadTxn,
    path: &str,
) -> std::result::Result<(Inode, String), String> {
    let mut ino = ROOT_INO;
    let mut canon = String::new();
    for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        let name =
            Name::parse(part.as_bytes(), NameRules::Linux).map_err(|e| format!("{path}: {e}"))?;
        let (child, _) = r
            .lookup(ino, name.as_str())
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{path}: no such file or directory in the store"))?;
        ino = child;
        canon.push('/');
        canon.push_str(name.as_str());
    }
    let inode = r
        .inode(ino)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{path}: missing inode {ino}"))?;
    Ok((
        inode,
        if canon.is_empty() {
            "/".to_string()
        } else {
            canon
        },
    ))
}

/// The path of inode `ino` from the root as `r` sees it, for reports; `<inode N>` when it
/// has no name (an orphan) or its parents are broken.
pub fn path_of_inode(r: &store::ReadTxn, ino: u64) -> String {
    let mut parts = Vec::new();
    let mut cur = ino;
    // Deeper than any path a store allows is a broken chain.
    for _ in 0..4096 {
        if cur == ROOT_INO {
            parts.reverse();
            return format!("/{}", parts.join("/"));
        }
        match r.inode(cur) {
            Ok(Some(i)) if i.nlink > 0 => {
                parts.push(i.name);
                cur = i.parent;
            }
            _ => break,
        }
    }
    format!("<inode {ino}>")
}

/// Limits set at mount and kept in the store, so a restart keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest file in bytes (EFBIG beyond).
    pub max_file_bytes: u64,
    /// Total content bytes (ENOSPC beyond); 0 means no quota.
    pub quota_bytes: u64,
    /// Files plus directories (ENOSPC beyond).
    pub max_files: u64,
    /// Bytes of a path from the mount root (ENAMETOOLONG beyond).
    pub max_path_bytes: usize,
    /// Levels of a path from the mount root (ELOOP beyond).
    pub max_depth: usize,
    pub names: NameRules,
    /// What a replace that would lose another process's edit does.
    #[serde(default)]
    pub lost_updates: LostUpdates,
    /// Content all open files may hold in memory before a writer's buffer moves to a
    /// private temporary file (see `content::OpenFile::spill`).
    #[serde(default = "default_max_buffer")]
    pub max_buffer_bytes: u64,
}

/// Four files at the default size cap may be buffered in memory at once.
fn default_max_buffer() -> u64 {
    1 << 30
}

impl Limits {
    /// The limits a store recorded at its last mount, or the defaults.
    pub fn stored(store: &Store) -> Limits {
        store
            .read()
            .and_then(|r| r.meta_bytes(crate::store::schema::META_LIMITS))
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Far above any memory a model writes, and room for a person's PDFs and images;
            // content is buffered in memory until close, so this also bounds daemon memory.
            max_file_bytes: 256 * 1024 * 1024,
            quota_bytes: 0,
            max_files: 1_000_000,
            max_path_bytes: 1024,
            max_depth: 32,
            names: NameRules::Linux,
            lost_updates: LostUpdates::Record,
            max_buffer_bytes: default_max_buffer(),
        }
    }
}

/// Who is asking: the uid, gid and pid of the calling process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A time to set with setattr.
#[derive(Clone, Copy, Debug)]
pub enum TimeSet {
    Now,
    At(i64),
}

/// The attribute changes of one setattr.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The handle an ftruncate came through.
    pub fh: Option<u64>,
}

/// How a file is opened.
#[derive(Clone, Copy, Debug, Default)]
pub struct OpenMode {
    pub read: bool,
    pub write: bool,
    pub append: bool,
    pub truncate: bool,
}

impl OpenMode {
    pub fn from_flags(flags: i32) -> OpenMode {
        let acc = flags & libc::O_ACCMODE;
        OpenMode {
            read: acc == libc::O_RDONLY || acc == libc::O_RDWR,
            write: acc == libc::O_WRONLY || acc == libc::O_RDWR,
            append: flags & libc::O_APPEND != 0,
            truncate: flags & libc::O_TRUNC != 0,
        }
    }
}

/// What statfs reports.
#[derive(Clone, Copy, Debug)]
pub struct FsStats {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// How stale an access time may get before an open refreshes it. Reads keep atime within an
/// hour of the truth (what `redbfs expire` needs) at the cost of at most one deferred commit
/// per file per hour.
pub const ATIME_INTERVAL_NS: i64 = 3600 * 1_000_000_000;

/// Block size reported by statfs and used for st_blocks.
pub const BLOCK_SIZE: u32 = 4096;

struct Handle {
    file: Arc<FileSlot>,
    mode: OpenMode,
}

struct DirHandle {
    ino: u64,
    entries: Option<Arc<Vec<DirEntry>>>,
}

/// What removing an inode's last name does, decided before its transaction commits.
enum Removal {
    /// Referenced by the kernel or open: it becomes an orphan, reclaimed when the last
    /// reference and handle are gone (`lifetime`). The slot is the file's, if open.
    Orphan(Option<Arc<FileSlot>>),
    /// Unreferenced: deleted in the same transaction.
    Delete,
}

/// `.` and `..`: listed by readdir, never counted as kernel references (the kernel does not
/// take one for them).
pub fn is_dot(name: &str) -> bool {
    name == "." || name == ".."
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock must not take the whole mount down with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The filesystem.
pub struct Fs {
    store: Store,
    limits: Limits,
    files: Mutex<HashMap<u64, Arc<FileSlot>>>,
    handles: Mutex<HashMap<u64, Handle>>,
    dirs: Mutex<HashMap<u64, DirHandle>>,
    next_fh: AtomicU64,
    poisoned: AtomicBool,
    invalidator: Mutex<Option<history::SharedInvalidator>>,
    lifetimes: Lifetimes,
    tracker: Tracker,
    /// Bytes open files have buffered beyond their committed size, counted against the quota.
    reserved: AtomicU64,
    /// Bytes of memory open files' buffers hold, kept under `--max-buffer`.
    buffered: AtomicU64,
}

/// A commit that frees at least this much buffered content hands the memory back to the
/// system: the chunks are 64 KiB heap blocks spread over the threads' malloc arenas, which
/// glibc keeps otherwise (three 64 MiB writes left the daemon at 170 MB resident).
const RETURN_MEMORY_AFTER: usize = 4 << 20;

fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Fs {
    /// Wraps an open store, reclaiming the orphans a crash left behind.
    pub fn new(store: Store, limits: Limits) -> Result<Fs> {
        let fs = Fs {
            store,
            tracker: Tracker::new(limits.lost_updates),
            limits,
            files: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            poisoned: AtomicBool::new(false),
            invalidator: Mutex::new(None),
            lifetimes: Lifetimes::default(),
            reserved: AtomicU64::new(0),
            buffered: AtomicU64::new(0),
        };
        fs.reclaim_orphans()?;
        Ok(fs)
    }

    /// Deletes every orphan: at open, those a crash left; at unmount, those the kernel still
    /// referenced when it let go of the mount.
    pub fn reclaim_orphans(&self) -> Result<()> {
        let fs = self;
        let mut w = fs.store.write()?;
        let orphans = w.orphans()?;
        if !orphans.is_empty() {
            for ino in &orphans {
                w.delete_inode(*ino)?;
            }
            fs.describe(
                &mut w,
                Caller::default(),
                "reclaim",
                0,
                |_| Vec::new(),
                0,
                0,
            );
            fs.commit(w, Sync::Durable)?;
            tracing::info!(
                count = orphans.len(),
                "reclaimed files unlinked while open or still referenced by the kernel"
            );
        }
        Ok(())
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire) || self.store.is_failed()
    }

    fn writable(&self) -> Result<()> {
        if self.is_poisoned() {
            Err(Error::Poisoned)
        } else {
            Ok(())
        }
    }

    fn commit(&self, w: WriteTxn<'_>, sync: Sync) -> Result<()> {
        self.commit_numbered(w, sync).map(drop)
    }

    /// Commits `w`; returns the commit's number (for `Store::sync_to`).
    fn commit_numbered(&self, w: WriteTxn<'_>, sync: Sync) -> Result<u64> {
        match w.commit_numbered(sync) {
            Ok(seq) => {
                if self.store.history_on()
                    && self.store.disk_nearly_full()
                    && let Err(e) = self.store.shed_history()
                {
                    crate::warn_limited!(error = %e, "could not drop history to make room");
                }
                Ok(seq)
            }
            Err(StoreError::NoRoom) => {
                // Nothing was written. History gives way to current content.
                if self.store.history_on()
                    && let Err(e) = self.store.shed_history()
                {
                    crate::warn_limited!(error = %e, "could not drop history to make room");
                }
                Err(Error::Store(StoreError::NoRoom))
            }
            Err(e) => {
                if !self.poisoned.swap(true, Ordering::AcqRel) {
                    tracing::error!(error = %e, "commit failed: the store now refuses writes; restart the daemon (redbfs unmount, then mount)");
                }
                Err(Error::Store(e))
            }
        }
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    fn parse_name(&self, raw: &[u8]) -> Result<Name> {
        Ok(Name::parse(raw, self.limits.names)?)
    }

    /// Reports buffered size and times for a file that is open.
    fn overlay(&self, mut inode: Inode) -> Inode {
        if inode.kind == Kind::File {
            let f = lock(&self.files).get(&inode.ino).cloned();
            if let Some(f) = f {
                let g = lock(&f.content);
                inode.size = g.size;
                if let Some(t) = g.pending_mtime {
                    inode.mtime = t;
                }
                if let Some(t) = g.pending_ctime {
                    inode.ctime = t;
                }
            }
        }
        inode
    }

    // ---- lookups and attributes ----

    /// The entry `raw_name` in `parent`, counted as one kernel reference (an entry reply):
    /// the inode stays valid, with or without a name, until `forget` returns it.
    pub fn lookup(&self, parent: u64, raw_name: &[u8]) -> Result<Inode> {
        let name = self.parse_name(raw_name)?;
        loop {
            let epoch = self.lifetimes.epoch();
            let r = self.store.read()?;
            let p = r.inode(parent)?.ok_or(Error::NotFound)?;
            if p.kind != Kind::Dir {
                return Err(Error::NotDir);
            }
            let (ino, _) = r.lookup(parent, name.as_str())?.ok_or(Error::NotFound)?;
            let inode = r.inode(ino)?.ok_or_else(|| {
                Error::Store(StoreError::Corrupt(format!(
                    "dirent {name:?} points to missing inode {ino}"
                )))
            })?;
            drop(r);
            if self.pin(ino, epoch)? {
                return Ok(self.overlay(inode));
            }
            // Deleted between the read and the pin (its name went first): read again.
            std::thread::yield_now();
        }
    }

    /// Counts a kernel reference to `ino`, read at `epoch`; false when the inode is gone or
    /// going (nothing counted).
    fn pin(&self, ino: u64, epoch: u64) -> Result<bool> {
        match self.lifetimes.pin(ino, epoch) {
            Pin::Held => Ok(true),
            Pin::Deleting => Ok(false),
            Pin::Unsure => {
                if self.store.read()?.inode(ino)?.is_some() {
                    Ok(true)
                } else {
                    self.lifetimes.forget(ino, 1);
                    Ok(false)
                }
            }
        }
    }

    /// The kernel returns `n` references to `ino` (FORGET); an orphan left without any is
    /// reclaimed unless a handle holds it.
    pub fn forget(&self, ino: u64, n: u64) {
        if self.lifetimes.forget(ino, n) {
            self.reclaim_if_unused(ino);
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Inode> {
        let inode = self.store.read()?.inode(ino)?.ok_or(Error::NotFound)?;
        Ok(self.overlay(inode))
    }

    /// The path of `ino` from the mount root, for logs and tools ("/" for the root).
    pub fn path_of(&self, ino: u64) -> String {
        let path = self
            .store
            .read()
            .ok()
            .and_then(|r| self.walk_up(Vec::new(), ino, |i| r.inode(i).ok().flatten()));
        path.unwrap_or_else(|| format!("<inode {ino}>"))
    }

    /// The path of `name` under `parent` from the mount root, as `w` sees it.
    fn path_in(&self, w: &WriteTxn<'_>, parent: u64, name: &str) -> String {
        self.walk_up(vec![name.to_string()], parent, |i| {
            w.inode(i).ok().flatten()
        })
        .unwrap_or_else(|| format!("<inode {parent}>/{name}"))
    }

    /// Completes a path, `tail` being its last components, by following parents from `dir`
    /// to the root; None when a parent is missing or the chain is deeper than any path may be.
    fn walk_up(
        &self,
        mut tail: Vec<String>,
        dir: u64,
        inode: impl Fn(u64) -> Option<Inode>,
    ) -> Option<String> {
        let mut cur = dir;
        for _ in 0..=self.limits.max_depth + 1 {
            if cur == ROOT_INO {
                tail.reverse();
                return Some(format!("/{}", tail.join("/")));
            }
            let i = inode(cur)?;
            tail.push(i.name);
            cur = i.parent;
        }
        None
    }

    /// The path of inode `ino` as `w` sees it.
    fn ino_path_in(&self, w: &WriteTxn<'_>, ino: u64) -> String {
        match w.inode(ino) {
            Ok(Some(i)) if ino != ROOT_INO => self.path_in(w, i.parent, &i.name),
            _ => "/".to_string(),
        }
    }

    /// Names the operation in `w` for its history record (only when history is on).
    #[allow(clippy::too_many_arguments)]
    fn describe(
        &self,
        w: &mut WriteTxn<'_>,
        caller: Caller,
        op: &'static str,
        ino: u64,
        paths: impl FnOnce(&WriteTxn<'_>) -> Vec<String>,
        size_before: u64,
        size_after: u64,
    ) {
        if self.store.history_on() {
            let paths = paths(w);
            w.describe(OpInfo {
                op,
                paths,
                ino,
                size_before,
                size_after,
                uid: caller.uid,
                gid: caller.gid,
                pid: caller.pid,
                conflict: None,
            });
        }
    }

    pub fn setattr(&self, caller: Caller, ino: u64, a: SetAttr) -> Result<Inode> {
        self.writable()?;
        let now = now_ns();
        if let Some(size) = a.size {
            let inode = self.getattr(ino)?;
            if inode.kind == Kind::Dir {
                return Err(Error::IsDir);
            }
            self.check_file_size(size)?;
            let f = self.acquire(ino)?;
            let res = {
                let mut g = lock(&f.content);
                g.last_writer = caller;
                let r = self
                    .reserve(&mut g, size)
                    .and_then(|()| g.truncate(&self.store, size, now))
                    .and_then(|()| self.account(&mut g));
                // Through a handle (ftruncate, O_TRUNC) the change is buffered with the rest of
                // that handle's writes; a truncate(2) of a file nobody has open commits now.
                if r.is_ok() && a.fh.is_none() && f.handles.load(Ordering::Acquire) == 1 {
                    self.commit_file(&f, &mut g)
                } else {
                    r
                }
            };
            self.release_file(&f);
            res?;
        }
        let touches_attrs = a.mode.is_some()
            || a.uid.is_some()
            || a.gid.is_some()
            || a.atime.is_some()
            || a.mtime.is_some();
        if touches_attrs {
            let resolve = |t: TimeSet| match t {
                TimeSet::Now => now,
                TimeSet::At(ns) => ns,
            };
            // The content lock of an open file is held across the commit: a close or fsync
            // through another descriptor (a forked child's, say) must not commit the earlier
            // write's times over these ones in between.
            let open = lock(&self.files).get(&ino).cloned();
            let mut content = open.as_ref().map(|f| lock(&f.content));
            let mut w = self.store.write()?;
            let mut inode = w.inode(ino)?.ok_or(Error::NotFound)?;
            if let Some(m) = a.mode {
                inode.perm = m & 0o7777;
            }
            if let Some(u) = a.uid {
                inode.uid = u;
            }
            if let Some(g) = a.gid {
                inode.gid = g;
            }
            if let Some(t) = a.atime {
                inode.atime = resolve(t);
            }
            if let Some(t) = a.mtime {
                inode.mtime = resolve(t);
            }
            inode.ctime = now;
            w.put_inode(&inode)?;
            let size = inode.size;
            self.describe(
                &mut w,
                caller,
                "setattr",
                ino,
                |w| vec![self.ino_path_in(w, ino)],
                size,
                size,
            );
            self.commit(w, Sync::Durable)?;
            // Buffered writes commit their times later; these are newer.
            if let Some(g) = content.as_mut() {
                if let Some(t) = a.mtime
                    && g.pending_mtime.is_some()
                {
                    g.pending_mtime = Some(resolve(t));
                }
                if g.pending_ctime.is_some() {
                    g.pending_ctime = Some(now);
                }
            }
        }
        self.getattr(ino)
    }

    // ---- limits ----

    fn check_file_size(&self, size: u64) -> Result<()> {
        if size > self.limits.max_file_bytes {
            return Err(Error::FileTooBig {
                limit: self.limits.max_file_bytes,
            });
        }
        Ok(())
    }

    /// Counts an open file growing to `new_size` against `--quota`, before the growth is
    /// accepted: committed content plus what every open file has buffered beyond its
    /// committed size (five files open at once each took 900 KB under a 1 MB quota when only
    /// committed bytes counted). The file's share is held in `g.reserved` until its commit.
    fn reserve(&self, g: &mut OpenFile, new_size: u64) -> Result<()> {
        let limit = self.limits.quota_bytes;
        let extra = new_size
            .saturating_sub(g.committed_size)
            .saturating_sub(g.reserved);
        if limit == 0 || extra == 0 {
            return Ok(());
        }
        let total = self.reserved.fetch_add(extra, Ordering::AcqRel) + extra;
        let used = match self.store.read().and_then(|r| r.usage()) {
            Ok(u) => u.content_bytes,
            Err(e) => {
                self.reserved.fetch_sub(extra, Ordering::AcqRel);
                return Err(e.into());
            }
        };
        if used.saturating_add(total) > limit {
            self.reserved.fetch_sub(extra, Ordering::AcqRel);
            return Err(Error::QuotaExceeded { limit });
        }
        g.reserved += extra;
        Ok(())
    }

    /// Counts `g`'s buffer memory after a change; past `--max-buffer` for all open files
    /// together, this file's buffer moves to its spill file (the writer that crosses the
    /// bound pays, so memory stays within the bound plus one write).
    fn account(&self, g: &mut OpenFile) -> Result<()> {
        let now = g.buffered_bytes() as u64;
        let before = g.accounted as u64;
        let total = if now >= before {
            self.buffered.fetch_add(now - before, Ordering::AcqRel) + (now - before)
        } else {
            self.buffered.fetch_sub(before - now, Ordering::AcqRel) - (before - now)
        };
        g.accounted = now as usize;
        if total > self.limits.max_buffer_bytes {
            let dir = self
                .store
                .path()
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."))
                .to_path_buf();
            g.spill(&dir)?;
            self.buffered.fetch_sub(now, Ordering::AcqRel);
            g.accounted = 0;
        }
        Ok(())
    }

    /// Gives back an open file's share of the quota: its content is committed (and counted
    /// in the store's usage) or dropped.
    fn unreserve(&self, g: &mut OpenFile) {
        if g.reserved > 0 {
            self.reserved.fetch_sub(g.reserved, Ordering::AcqRel);
            g.reserved = 0;
        }
    }

    /// Checks that a new entry `name` under `parent` keeps within the path limits and, for a
    /// new inode (`moving` is None), that the store may hold one more; `moving` is the inode a
    /// rename brings there, which may differ from its old name only in case.
    fn check_new_entry(
        &self,
        w: &WriteTxn<'_>,
        parent: u64,
        name: &Name,
        moving: Option<u64>,
    ) -> Result<()> {
        let (bytes, depth) = self.path_cost(w, parent, name.as_str())?;
        self.check_path(bytes, depth)?;
        if self.limits.names == NameRules::Portable {
            let folded = name.fold_case();
            let clash = w.list(parent, usize::MAX)?.into_iter().any(|e| {
                Some(e.ino) != moving
                    && e.name != name.as_str()
                    && name::fold_case(&e.name) == folded
            });
            if clash {
                return Err(Error::Name(NameError::PortableCaseClash));
            }
        }
        if moving.is_none() {
            let u = w.usage()?;
            if u.files + u.dirs >= self.limits.max_files {
                return Err(Error::TooManyFiles {
                    limit: self.limits.max_files,
                });
            }
        }
        Ok(())
    }

    /// Bytes ("/a/b" is 4) and levels of the path of `name` under `parent`; the walk up
    /// stops one level past the depth limit (a deeper chain is refused anyway).
    fn path_cost(&self, w: &WriteTxn<'_>, parent: u64, name: &str) -> Result<(usize, usize)> {
        let mut bytes = name.len() + 1;
        let mut depth = 1;
        let mut cur = parent;
        while cur != ROOT_INO && depth <= self.limits.max_depth {
            let i = w.inode(cur)?.ok_or(Error::NotFound)?;
            bytes += i.name.len() + 1;
            depth += 1;
            cur = i.parent;
        }
        Ok((bytes, depth))
    }

    fn check_path(&self, bytes: usize, depth: usize) -> Result<()> {
        if depth > self.limits.max_depth {
            return Err(Error::TooDeep {
                depth,
                limit: self.limits.max_depth,
            });
        }
        if bytes > self.limits.max_path_bytes {
            return Err(Error::PathTooLong {
                bytes,
                limit: self.limits.max_path_bytes,
            });
        }
        Ok(())
    }

    /// A directory moving from (`old_bytes`, `old_depth`) to a longer or deeper place: every
    /// entry under it must stay within the path limits there. A walk of the subtree, done
    /// only when the move goes deeper or longer (a subtree that was within the limits stays
    /// within them otherwise), iterative, and bounded by the store's entries.
    fn check_moved_subtree(
        &self,
        w: &WriteTxn<'_>,
        dir: u64,
        (old_bytes, old_depth): (usize, usize),
        (new_bytes, new_depth): (usize, usize),
    ) -> Result<()> {
        if new_bytes <= old_bytes && new_depth <= old_depth {
            return Ok(());
        }
        let mut stack = vec![(dir, new_bytes, new_depth)];
        while let Some((ino, bytes, depth)) = stack.pop() {
            for e in w.list(ino, usize::MAX)? {
                let (b, d) = (bytes + e.name.len() + 1, depth + 1);
                self.check_path(b, d)?;
                if e.kind == Kind::Dir {
                    stack.push((e.ino, b, d));
                }
            }
        }
        Ok(())
    }

    // ---- creating ----

    fn parent_dir(w: &WriteTxn<'_>, parent: u64) -> Result<Inode> {
        let p = w.inode(parent)?.ok_or(Error::NotFound)?;
        if p.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        Ok(p)
    }

    fn new_inode(
        &self,
        w: &mut WriteTxn<'_>,
        caller: Caller,
        parent: &mut Inode,
        name: &Name,
        kind: Kind,
        perm: u32,
    ) -> Result<Inode> {
        if w.lookup(parent.ino, name.as_str())?.is_some() {
            return Err(Error::Exists);
        }
        self.check_new_entry(w, parent.ino, name, None)?;
        let now = now_ns();
        let setgid_parent = parent.perm & libc::S_ISGID != 0;
        let mut perm = perm & 0o7777;
        if setgid_parent && kind == Kind::Dir {
            perm |= libc::S_ISGID;
        }
        let inode = Inode {
            ino: w.alloc_ino()?,
            kind,
            perm,
            uid: caller.uid,
            gid: if setgid_parent {
                parent.gid
            } else {
                caller.gid
            },
            size: 0,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            parent: parent.ino,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            name: name.as_str().to_string(),
        };
        w.put_inode(&inode)?;
        w.put_dirent(parent.ino, name.as_str(), inode.ino, kind)?;
        if kind == Kind::Dir {
            parent.nlink += 1;
        }
        parent.mtime = now;
        parent.ctime = now;
        w.put_inode(parent)?;
        Ok(inode)
    }

    pub fn mkdir(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Inode> {
        Ok(self
            .make_entry(
                caller,
                parent,
                raw_name,
                Kind::Dir,
                mode & !umask,
                Sync::Durable,
            )?
            .0)
    }

    /// Creates a regular file (mknod of S_IFREG), durably: nothing closes or fsyncs it later.
    pub fn mknod(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Inode> {
        Ok(self
            .new_file(caller, parent, raw_name, mode, umask, Sync::Durable)?
            .0)
    }

    /// A new regular file; returns it and the number of the commit that made it.
    fn new_file(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        mode: u32,
        umask: u32,
        sync: Sync,
    ) -> Result<(Inode, u64)> {
        if mode & libc::S_IFMT != libc::S_IFREG && mode & libc::S_IFMT != 0 {
            return Err(Error::NotPermitted(match mode & libc::S_IFMT {
                libc::S_IFIFO => "mknod of a FIFO",
                libc::S_IFSOCK => "mknod of a socket",
                libc::S_IFCHR | libc::S_IFBLK => "mknod of a device",
                _ => "mknod of a special file",
            }));
        }
        self.make_entry(caller, parent, raw_name, Kind::File, mode & !umask, sync)
    }

    /// mkdir, mknod and create: a new entry in one transaction; returns it and the commit's
    /// number.
    fn make_entry(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        kind: Kind,
        perm: u32,
        sync: Sync,
    ) -> Result<(Inode, u64)> {
        self.writable()?;
        let name = self.parse_name(raw_name)?;
        let mut w = self.store.write()?;
        let mut p = Self::parent_dir(&w, parent)?;
        let inode = self.new_inode(&mut w, caller, &mut p, &name, kind, perm)?;
        let op = match kind {
            Kind::Dir => "mkdir",
            Kind::File => "create",
        };
        self.describe(
            &mut w,
            caller,
            op,
            inode.ino,
            |w| vec![self.path_in(w, parent, name.as_str())],
            0,
            0,
        );
        // The reply names the inode: counted before anyone else can see it.
        self.lifetimes.pin_new(inode.ino);
        match self.commit_numbered(w, sync) {
            Ok(seq) => Ok((inode, seq)),
            Err(e) => {
                self.lifetimes.forget(inode.ino, 1);
                Err(e)
            }
        }
    }

    /// Creates and opens a regular file.
    pub fn create(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Inode, u64)> {
        // Durable with this file's close or fsync, which follow.
        let (inode, seq) = self.new_file(
            caller,
            parent,
            raw_name,
            (mode & 0o7777) | libc::S_IFREG,
            umask,
            Sync::Deferred,
        )?;
        let mut open_mode = OpenMode::from_flags(flags);
        open_mode.truncate = false;
        let fh = match self.open(caller, inode.ino, open_mode) {
            Ok(fh) => fh,
            Err(e) => {
                // The kernel gets no entry, so it will never forget this reference.
                self.forget(inode.ino, 1);
                return Err(e);
            }
        };
        if let Ok((f, _)) = self.handle(fh) {
            f.created_in.fetch_max(seq, Ordering::AcqRel);
        }
        Ok((inode, fh))
    }

    // ---- open files ----

    /// Registers one more user of `ino`'s buffered content.
    fn acquire(&self, ino: u64) -> Result<Arc<FileSlot>> {
        let mut map = lock(&self.files);
        let f = match map.get(&ino) {
            Some(f) => f.clone(),
            None => {
                // A deletion is decided under the map lock: one staged now is not committed
                // yet, and the store would still show the inode.
                if self.lifetimes.is_deleting(ino) {
                    return Err(Error::NotFound);
                }
                let inode = self.store.read()?.inode(ino)?.ok_or(Error::NotFound)?;
                if inode.kind == Kind::Dir {
                    return Err(Error::IsDir);
                }
                let f = Arc::new(FileSlot::new(ino, inode.size));
                // An orphan the kernel still references (opened through a held dentry).
                f.unlinked.store(inode.nlink == 0, Ordering::Release);
                map.insert(ino, f.clone());
                f
            }
        };
        f.handles.fetch_add(1, Ordering::AcqRel);
        Ok(f)
    }

    /// Drops one user of an open file: the last one commits what is buffered and leaves, and
    /// the last release of an unlinked file reclaims its space.
    fn release_file(&self, f: &Arc<FileSlot>) {
        loop {
            let res = if f.handles.load(Ordering::Acquire) == 1 {
                self.commit_file(f, &mut lock(&f.content))
            } else {
                Ok(())
            };
            if let Err(e) = &res {
                tracing::error!(ino = f.ino, error = %e, "content could not be committed at release");
            }
            let mut map = lock(&self.files);
            if f.handles.load(Ordering::Acquire) > 1 {
                f.handles.fetch_sub(1, Ordering::AcqRel);
                return;
            }
            // The last user leaves only with nothing buffered, or the next open would read the
            // store without it. The content lock is only tried: it is never awaited under the
            // map lock.
            let settled = match f.content.try_lock() {
                Ok(g) => !g.changed || res.is_err() || f.unlinked.load(Ordering::Acquire),
                Err(std::sync::TryLockError::Poisoned(_)) => true,
                Err(std::sync::TryLockError::WouldBlock) => false,
            };
            if !settled {
                // A write slipped in meanwhile: commit again.
                drop(map);
                std::thread::yield_now();
                continue;
            }
            f.handles.store(0, Ordering::Release);
            if map.get(&f.ino).is_some_and(|g| Arc::ptr_eq(g, f)) {
                map.remove(&f.ino);
            }
            drop(map);
            // What the buffer still holds (an unlinked file's, or one whose commit failed)
            // goes with the slot: its memory and quota share are given back.
            {
                let mut g = lock(&f.content);
                self.unreserve(&mut g);
                self.buffered
                    .fetch_sub(g.accounted as u64, Ordering::AcqRel);
                g.accounted = 0;
            }
            if f.unlinked.load(Ordering::Acquire) {
                self.reclaim_if_unused(f.ino);
            }
            return;
        }
    }

    /// Whether a handle holds `ino` open. Called with the files map locked.
    fn is_open(&self, files: &HashMap<u64, Arc<FileSlot>>, ino: u64) -> bool {
        files.contains_key(&ino) || lock(&self.dirs).values().any(|d| d.ino == ino)
    }

    /// Deletes an orphan once neither a kernel reference nor a handle holds it: at its last
    /// FORGET, release or releasedir. Not durable by itself: a crash before the next durable
    /// commit leaves the orphan mark, and the next mount reclaims it.
    fn reclaim_if_unused(&self, ino: u64) {
        let go = {
            let files = lock(&self.files);
            let open = self.is_open(&files, ino);
            self.lifetimes.start_reclaim(ino, open)
        };
        if !go {
            return;
        }
        let r = self.writable().and_then(|()| {
            let mut w = self.store.write()?;
            let Some(inode) = w.inode(ino)?.filter(|i| i.nlink == 0) else {
                // The removal that made it an orphan did not commit.
                return Ok(false);
            };
            // Named by the path the inode had, so that path's history (redact, log PATH)
            // finds the content this record keeps for rollback.
            self.describe(
                &mut w,
                Caller::default(),
                "reclaim",
                ino,
                |w| vec![self.path_in(w, inode.parent, &inode.name)],
                inode.size,
                0,
            );
            w.delete_inode(ino)?;
            self.commit(w, Sync::Deferred)?;
            Ok(true)
        });
        if let Err(e) = &r {
            tracing::error!(ino, error = %e, "could not reclaim an unlinked inode; the next mount will");
        }
        let deleted = r.unwrap_or(false);
        self.lifetimes.deleted(ino, deleted);
        if deleted {
            self.tracker.deleted(ino);
        }
    }

    /// Commits an open file's buffered content durably. Lock order: the content lock (held
    /// by the caller) before the store's write lock.
    fn commit_file(&self, f: &FileSlot, g: &mut OpenFile) -> Result<()> {
        if !g.changed || f.unlinked.load(Ordering::Acquire) {
            return Ok(());
        }
        self.writable()?;
        let mut w = self.store.write()?;
        self.describe(
            &mut w,
            g.last_writer,
            "write",
            g.ino,
            |w| vec![self.ino_path_in(w, g.ino)],
            g.committed_size,
            g.size,
        );
        let large = g.buffered_bytes() >= RETURN_MEMORY_AFTER;
        g.stage(&mut w)?;
        // Under the write lock, so a replace checked after this commit sees it.
        if let Some(i) = w.inode(g.ino)? {
            self.tracker
                .wrote(g.last_writer.pid, g.ino, i.parent, &i.name);
        }
        self.commit(w, Sync::Durable)?;
        g.committed();
        self.unreserve(g);
        self.account(g)?;
        if large {
            return_freed_memory();
        }
        Ok(())
    }

    pub fn open(&self, caller: Caller, ino: u64, mode: OpenMode) -> Result<u64> {
        if mode.write || mode.truncate {
            self.writable()?;
        }
        let f = self.acquire(ino)?;
        let stored = match self.store.read().and_then(|r| r.inode(ino)) {
            Ok(i) => i,
            Err(e) => {
                self.release_file(&f);
                return Err(e.into());
            }
        };
        if let Some(i) = &stored {
            if mode.truncate
                && let Some(c) = self.tracker.check(caller.pid, ino, i.parent, &i.name)
                && let Err(e) = self.lost_update(caller, "truncate", i.parent, &i.name, &c, None)
            {
                self.release_file(&f);
                return Err(e);
            }
            if mode.read {
                self.tracker.read(caller.pid, ino, i.parent, &i.name);
            }
        }
        // Linux truncates on O_TRUNC even with O_RDONLY (the kernel checked write permission).
        if mode.truncate {
            let mut g = lock(&f.content);
            g.last_writer = caller;
            if g.size != 0
                && let Err(e) = g
                    .truncate(&self.store, 0, now_ns())
                    .and_then(|()| self.account(&mut g))
            {
                drop(g);
                self.release_file(&f);
                return Err(e);
            }
        }
        let fh = self.new_fh();
        lock(&self.handles).insert(fh, Handle { file: f, mode });
        if let Some(i) = stored
            && let Err(e) = self.refresh_atime(i)
        {
            crate::warn_limited!(ino, error = %e, "could not update the access time");
        }
        Ok(fh)
    }

    /// A replace (`op`) of `name` in `parent` by `caller` would lose another process's edit:
    /// one warn line, the count, and the history record (`w`, the replace's own transaction,
    /// in `record` mode; a record of its own when refused or when the replace has none).
    /// Err(LostUpdate) when the mode is `refuse`.
    fn lost_update(
        &self,
        caller: Caller,
        op: &'static str,
        parent: u64,
        name: &str,
        c: &Conflict,
        w: Option<&mut WriteTxn<'_>>,
    ) -> Result<()> {
        let refuse = self.tracker.mode() == LostUpdates::Refuse;
        self.tracker.counted();
        let path = self.path_of(parent);
        let path = format!("{}/{name}", path.trim_end_matches('/'));
        let note = format!(
            "conflict: {}{}",
            c.describe(),
            if refuse { " (refused)" } else { "" }
        );
        tracing::warn!(
            op,
            path,
            replacer = c.replacer,
            maker = c.maker,
            refused = refuse,
            "lost update: {}",
            c.describe()
        );
        match w {
            Some(w) if !refuse => {
                w.note_conflict(note);
            }
            _ if self.store.history_on() => {
                let r = self.store.write().map_err(Error::from).and_then(|mut w| {
                    self.describe(&mut w, caller, op, 0, |_| vec![path.clone()], 0, 0);
                    w.note_conflict(note);
                    self.commit(w, Sync::Deferred)
                });
                if let Err(e) = r {
                    tracing::warn!(error = %e, "could not record the conflict in the history");
                }
            }
            _ => {}
        }
        if refuse {
            Err(Error::LostUpdate { maker: c.maker })
        } else {
            Ok(())
        }
    }

    /// Conflicts (lost updates recorded or refused) since mount, for status.
    pub fn conflicts(&self) -> u64 {
        self.tracker.conflicts()
    }

    /// Moves atime to now if it is more than `ATIME_INTERVAL_NS` old (deferred commit).
    fn refresh_atime(&self, stored: Inode) -> Result<()> {
        let now = now_ns();
        let stale = |i: &Inode| now - i.atime > ATIME_INTERVAL_NS;
        if self.is_poisoned() || !stale(&stored) {
            return Ok(());
        }
        let mut w = self.store.write()?;
        // Access times are not history: they would bury the changes that matter.
        w.without_history();
        if let Some(mut i) = w.inode(stored.ino)?.filter(stale) {
            i.atime = now;
            w.put_inode(&i)?;
            self.commit(w, Sync::Deferred)?;
        }
        Ok(())
    }

    fn handle(&self, fh: u64) -> Result<(Arc<FileSlot>, OpenMode)> {
        lock(&self.handles)
            .get(&fh)
            .map(|h| (h.file.clone(), h.mode))
            .ok_or(Error::BadHandle)
    }

    pub fn read(&self, fh: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let (f, _) = self.handle(fh)?;
        let g = lock(&f.content);
        g.read(&self.store, offset, len)
    }

    pub fn write(&self, caller: Caller, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.writable()?;
        let (f, mode) = self.handle(fh)?;
        if !mode.write {
            return Err(Error::BadHandle);
        }
        let mut g = lock(&f.content);
        let offset = if mode.append { g.size } else { offset };
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(Error::FileTooBig {
                limit: self.limits.max_file_bytes,
            })?;
        self.check_file_size(end)?;
        if end > g.size {
            self.reserve(&mut g, end)?;
        }
        g.last_writer = caller;
        g.write(&self.store, offset, data, now_ns())?;
        self.account(&mut g)?;
        Ok(data.len() as u32)
    }

    /// close(2) of one descriptor: commits the file's buffered content durably.
    pub fn flush(&self, fh: u64) -> Result<()> {
        let (f, _) = self.handle(fh)?;
        let mut g = lock(&f.content);
        self.commit_file(&f, &mut g)?;
        drop(g);
        // A file created and closed without a write (even one created O_RDONLY) becomes
        // durable here.
        self.sync_creation(&f)
    }

    pub fn fsync(&self, fh: u64) -> Result<()> {
        let (f, _) = self.handle(fh)?;
        let mut g = lock(&f.content);
        self.commit_file(&f, &mut g)?;
        drop(g);
        self.sync_creation(&f)
    }

    /// Makes the commit that created `f` durable, if it is not yet: only that one, so a
    /// close does not pay an fsync for what other processes committed meanwhile.
    fn sync_creation(&self, f: &FileSlot) -> Result<()> {
        let seq = f.created_in.load(Ordering::Acquire);
        if seq != 0 {
            self.store.sync_to(seq)?;
        }
        Ok(())
    }

    pub fn release(&self, fh: u64) -> Result<()> {
        let h = lock(&self.handles).remove(&fh).ok_or(Error::BadHandle)?;
        self.release_file(&h.file);
        Ok(())
    }

    /// fsync of a directory: every namespace change is durable already, except creates.
    pub fn fsyncdir(&self) -> Result<()> {
        Ok(self.store.sync()?)
    }

    // ---- removing ----

    /// Decides what removing the last name of `ino` (a file or a directory) does; see
    /// `Removal`.
    fn claim_removal(&self, ino: u64) -> Removal {
        // Short locks only: this runs under the store's write lock, so it must never wait for
        // a content lock (a commit holds that while it waits for the write lock).
        let files = lock(&self.files);
        let open = self.is_open(&files, ino);
        match self.lifetimes.claim(ino, open) {
            Claim::Orphan => {
                let slot = files.get(&ino).cloned();
                if let Some(f) = &slot {
                    f.unlinked.store(true, Ordering::Release);
                }
                Removal::Orphan(slot)
            }
            Claim::Delete => Removal::Delete,
        }
    }

    /// Stages the removal in `w`: an orphan mark (nlink 0, as ext4 shows an unlinked open
    /// file), or deletion.
    fn stage_removal(w: &mut WriteTxn<'_>, ino: u64, removal: &Removal) -> Result<()> {
        match removal {
            Removal::Orphan(_) => {
                let mut inode = w.inode(ino)?.ok_or(Error::NotFound)?;
                inode.nlink = 0;
                inode.ctime = now_ns();
                w.put_inode(&inode)?;
                w.add_orphan(ino)?;
            }
            Removal::Delete => w.delete_inode(ino)?,
        }
        Ok(())
    }

    /// After the removal's transaction: undoes the claim if it did not commit; an orphan
    /// whose last reference went meanwhile is reclaimed now.
    fn finish_removal(&self, ino: u64, removal: Removal, committed: bool) {
        match removal {
            Removal::Orphan(slot) => {
                if committed {
                    self.reclaim_if_unused(ino);
                } else {
                    if let Some(f) = slot {
                        f.unlinked.store(false, Ordering::Release);
                    }
                    self.lifetimes.unclaim(ino);
                }
            }
            Removal::Delete => {
                self.lifetimes.deleted(ino, committed);
                if committed {
                    self.tracker.deleted(ino);
                }
            }
        }
    }

    pub fn unlink(&self, caller: Caller, parent: u64, raw_name: &[u8]) -> Result<()> {
        self.writable()?;
        let name = self.parse_name(raw_name)?;
        let mut w = self.store.write()?;
        let mut p = Self::parent_dir(&w, parent)?;
        let (ino, kind) = w.lookup(parent, name.as_str())?.ok_or(Error::NotFound)?;
        if kind == Kind::Dir {
            return Err(Error::IsDir);
        }
        let size = w.inode(ino)?.map_or(0, |i| i.size);
        self.describe(
            &mut w,
            caller,
            "unlink",
            ino,
            |w| vec![self.path_in(w, parent, name.as_str())],
            size,
            0,
        );
        let removal = self.claim_removal(ino);
        let staged = (|| {
            w.remove_dirent(parent, name.as_str())?;
            Self::stage_removal(&mut w, ino, &removal)?;
            let now = now_ns();
            p.mtime = now;
            p.ctime = now;
            w.put_inode(&p)?;
            Ok(())
        })();
        let res = staged.and_then(|()| self.commit(w, Sync::Durable));
        self.finish_removal(ino, removal, res.is_ok());
        res
    }

    pub fn rmdir(&self, caller: Caller, parent: u64, raw_name: &[u8]) -> Result<()> {
        self.writable()?;
        let name = self.parse_name(raw_name)?;
        let mut w = self.store.write()?;
        let mut p = Self::parent_dir(&w, parent)?;
        let (ino, kind) = w.lookup(parent, name.as_str())?.ok_or(Error::NotFound)?;
        if kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        if !w.list(ino, 1)?.is_empty() {
            return Err(Error::NotEmpty);
        }
        self.describe(
            &mut w,
            caller,
            "rmdir",
            ino,
            |w| vec![self.path_in(w, parent, name.as_str())],
            0,
            0,
        );
        let removal = self.claim_removal(ino);
        let staged = (|| {
            w.remove_dirent(parent, name.as_str())?;
            Self::stage_removal(&mut w, ino, &removal)?;
            let now = now_ns();
            p.nlink -= 1;
            p.mtime = now;
            p.ctime = now;
            w.put_inode(&p)?;
            Ok(())
        })();
        let res = staged.and_then(|()| self.commit(w, Sync::Durable));
        self.finish_removal(ino, removal, res.is_ok());
        res
    }

    // ---- rename ----

    /// Whether `ino` is `dir` or lies below it.
    fn is_within(w: &WriteTxn<'_>, ino: u64, dir: u64) -> Result<bool> {
        let mut cur = ino;
        loop {
            if cur == dir {
                return Ok(true);
            }
            if cur == ROOT_INO {
                return Ok(false);
            }
            cur = w.inode(cur)?.ok_or(Error::NotFound)?.parent;
        }
    }

    pub fn rename(
        &self,
        caller: Caller,
        parent: u64,
        raw_name: &[u8],
        new_parent: u64,
        raw_new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.writable()?;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 || (noreplace && exchange)
        {
            return Err(Error::Invalid("unsupported rename flags"));
        }
        let name = self.parse_name(raw_name)?;
        let new_name = self.parse_name(raw_new_name)?;
        let mut w = self.store.write()?;
        Self::parent_dir(&w, parent)?;
        Self::parent_dir(&w, new_parent)?;
        let (src, src_kind) = w.lookup(parent, name.as_str())?.ok_or(Error::NotFound)?;
        let dst = w.lookup(new_parent, new_name.as_str())?;
        let size = w.inode(src)?.map_or(0, |i| i.size);
        let op = if exchange { "exchange" } else { "rename" };
        self.describe(
            &mut w,
            caller,
            op,
            src,
            |w| {
                vec![
                    self.path_in(w, parent, name.as_str()),
                    self.path_in(w, new_parent, new_name.as_str()),
                ]
            },
            size,
            size,
        );
        if exchange {
            let (dst, dst_kind) = dst.ok_or(Error::NotFound)?;
            return self.exchange(
                w,
                (parent, &name, src, src_kind),
                (new_parent, &new_name, dst, dst_kind),
            );
        }
        if dst.is_some() && noreplace {
            return Err(Error::Exists);
        }
        if dst.is_some_and(|(d, _)| d == src) {
            return Ok(());
        }
        if src_kind == Kind::Dir && Self::is_within(&w, new_parent, src)? {
            return Err(Error::Invalid(
                "a directory cannot move into its own subtree",
            ));
        }
        self.check_new_entry(&w, new_parent, &new_name, Some(src))?;
        if src_kind == Kind::Dir {
            self.check_moved_subtree(
                &w,
                src,
                self.path_cost(&w, parent, name.as_str())?,
                self.path_cost(&w, new_parent, new_name.as_str())?,
            )?;
        }
        let mut removal = None;
        if let Some((d, dk)) = dst {
            match (src_kind, dk) {
                (Kind::Dir, Kind::File) => return Err(Error::NotDir),
                (Kind::File, Kind::Dir) => return Err(Error::IsDir),
                (Kind::Dir, Kind::Dir) => {
                    if !w.list(d, 1)?.is_empty() {
                        return Err(Error::NotEmpty);
                    }
                }
                (Kind::File, Kind::File) => {}
            }
            if src_kind == Kind::File
                && let Some(c) = self
                    .tracker
                    .check(caller.pid, d, new_parent, new_name.as_str())
            {
                if self.tracker.mode() == LostUpdates::Refuse {
                    // Nothing changes; the refusal gets a record of its own.
                    drop(w);
                    return self.lost_update(
                        caller,
                        "rename",
                        new_parent,
                        new_name.as_str(),
                        &c,
                        None,
                    );
                }
                self.lost_update(
                    caller,
                    "rename",
                    new_parent,
                    new_name.as_str(),
                    &c,
                    Some(&mut w),
                )?;
            }
            removal = Some((d, self.claim_removal(d)));
        }
        let staged = (|| -> Result<()> {
            let now = now_ns();
            if let Some((d, dk)) = dst {
                if let Some((_, r)) = &removal {
                    Self::stage_removal(&mut w, d, r)?;
                }
                if dk == Kind::Dir {
                    let mut np = w.inode(new_parent)?.ok_or(Error::NotFound)?;
                    np.nlink -= 1;
                    w.put_inode(&np)?;
                }
            }
            w.remove_dirent(parent, name.as_str())?;
            w.put_dirent(new_parent, new_name.as_str(), src, src_kind)?;
            let mut s = w.inode(src)?.ok_or(Error::NotFound)?;
            s.parent = new_parent;
            s.name = new_name.as_str().to_string();
            s.ctime = now;
            w.put_inode(&s)?;
            let mut p = w.inode(parent)?.ok_or(Error::NotFound)?;
            p.mtime = now;
            p.ctime = now;
            if parent != new_parent {
                if src_kind == Kind::Dir {
                    p.nlink -= 1;
                }
                w.put_inode(&p)?;
                let mut np = w.inode(new_parent)?.ok_or(Error::NotFound)?;
                if src_kind == Kind::Dir {
                    np.nlink += 1;
                }
                np.mtime = now;
                np.ctime = now;
                w.put_inode(&np)?;
            } else {
                w.put_inode(&p)?;
            }
            Ok(())
        })();
        let res = staged.and_then(|()| self.commit(w, Sync::Durable));
        if let Some((d, r)) = removal {
            self.finish_removal(d, r, res.is_ok());
        }
        if res.is_ok() && src_kind == Kind::File {
            self.tracker
                .renamed(caller.pid, src, new_parent, new_name.as_str());
        }
        res
    }

    /// RENAME_EXCHANGE: both names swap inodes in one transaction.
    fn exchange(
        &self,
        mut w: WriteTxn<'_>,
        a: (u64, &Name, u64, Kind),
        b: (u64, &Name, u64, Kind),
    ) -> Result<()> {
        let (pa, na, ia, ka) = a;
        let (pb, nb, ib, kb) = b;
        if ia == ib {
            return Ok(());
        }
        if (ka == Kind::Dir && Self::is_within(&w, pb, ia)?)
            || (kb == Kind::Dir && Self::is_within(&w, pa, ib)?)
        {
            return Err(Error::Invalid(
                "a directory cannot move into its own subtree",
            ));
        }
        // Each side takes the other's place: both must fit the path limits there.
        for (ino, kind, from, to) in [(ia, ka, (pa, na), (pb, nb)), (ib, kb, (pb, nb), (pa, na))] {
            let new_cost = self.path_cost(&w, to.0, to.1.as_str())?;
            self.check_path(new_cost.0, new_cost.1)?;
            if kind == Kind::Dir {
                let old_cost = self.path_cost(&w, from.0, from.1.as_str())?;
                self.check_moved_subtree(&w, ino, old_cost, new_cost)?;
            }
        }
        let now = now_ns();
        w.put_dirent(pa, na.as_str(), ib, kb)?;
        w.put_dirent(pb, nb.as_str(), ia, ka)?;
        for (ino, parent, name) in [(ia, pb, nb), (ib, pa, na)] {
            let mut i = w.inode(ino)?.ok_or(Error::NotFound)?;
            i.parent = parent;
            i.name = name.as_str().to_string();
            i.ctime = now;
            w.put_inode(&i)?;
        }
        let dirs = |k: Kind| i64::from(k == Kind::Dir);
        let shift = dirs(kb) - dirs(ka); // change of subdirectories under pa
        for (p, delta) in [(pa, shift), (pb, -shift)] {
            let mut pi = w.inode(p)?.ok_or(Error::NotFound)?;
            if pa != pb {
                pi.nlink = (pi.nlink as i64 + delta) as u32;
            }
            pi.mtime = now;
            pi.ctime = now;
            w.put_inode(&pi)?;
        }
        self.commit(w, Sync::Durable)
    }

    // ---- directories ----

    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let inode = self.store.read()?.inode(ino)?.ok_or(Error::NotFound)?;
        if inode.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let fh = self.new_fh();
        lock(&self.dirs).insert(fh, DirHandle { ino, entries: None });
        Ok(fh)
    }

    /// The entries of an open directory, `.` and `..` first; an entry's offset is its index
    /// plus one. The listing is taken when reading starts at offset 0 and kept for the
    /// handle, so offsets stay valid while the directory changes.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<Arc<Vec<DirEntry>>> {
        let ino = {
            let dirs = lock(&self.dirs);
            let d = dirs.get(&fh).ok_or(Error::BadHandle)?;
            if offset != 0
                && let Some(e) = &d.entries
            {
                return Ok(e.clone());
            }
            d.ino
        };
        let r = self.store.read()?;
        let me = r.inode(ino)?.ok_or(Error::NotFound)?;
        let mut entries = vec![
            DirEntry {
                name: ".".into(),
                ino,
                kind: Kind::Dir,
            },
            DirEntry {
                name: "..".into(),
                ino: me.parent,
                kind: Kind::Dir,
            },
        ];
        entries.extend(r.list(ino)?);
        let entries = Arc::new(entries);
        if let Some(d) = lock(&self.dirs).get_mut(&fh) {
            d.entries = Some(entries.clone());
        }
        Ok(entries)
    }

    /// Attributes for a batch of entries, in one read transaction, each but `.` and `..`
    /// counted as a kernel reference (readdirplus); None for an entry gone since the listing.
    /// The caller `forget`s those it does not send.
    pub fn attrs(&self, entries: &[DirEntry]) -> Result<Vec<Option<Inode>>> {
        let epoch = self.lifetimes.epoch();
        let found: Vec<Option<Inode>> = {
            let r = self.store.read()?;
            entries
                .iter()
                .map(|e| r.inode(e.ino))
                .collect::<std::result::Result<_, _>>()?
        };
        let mut out = Vec::with_capacity(found.len());
        for (e, i) in entries.iter().zip(found) {
            out.push(match i {
                Some(i) if is_dot(&e.name) || self.pin(i.ino, epoch)? => Some(self.overlay(i)),
                _ => None,
            });
        }
        Ok(out)
    }

    /// Kernel references to inodes, for status.
    pub fn referenced(&self) -> usize {
        self.lifetimes.referenced()
    }

    pub fn releasedir(&self, fh: u64) -> Result<()> {
        let d = lock(&self.dirs).remove(&fh).ok_or(Error::BadHandle)?;
        // The last descriptor of a removed directory that the kernel no longer references.
        self.reclaim_if_unused(d.ino);
        Ok(())
    }

    // ---- the whole store ----

    pub fn statfs(&self) -> Result<FsStats> {
        let usage = self.store.read()?.usage()?;
        let bs = BLOCK_SIZE as u64;
        let (blocks, free) = if self.limits.quota_bytes > 0 {
            let total = self.limits.quota_bytes.div_ceil(bs);
            (
                total,
                total.saturating_sub(usage.content_bytes.div_ceil(bs)),
            )
        } else {
            let used = self.store.file_bytes().div_ceil(bs);
            let avail = store::disk_available(self.store.path()) / bs;
            (used + avail, avail)
        };
        let inodes = usage.files + usage.dirs;
        Ok(FsStats {
            block_size: BLOCK_SIZE,
            blocks,
            blocks_free: free,
            files: self.limits.max_files.max(inodes),
            files_free: self.limits.max_files.saturating_sub(inodes),
            name_max: name::MAX_NAME_BYTES as u32,
        })
    }

    /// Open handles and buffered bytes, for status.
    pub fn open_counts(&self) -> (usize, usize) {
        let files: Vec<_> = lock(&self.files).values().cloned().collect();
        let buffered = files
            .iter()
            .map(|f| lock(&f.content).buffered_bytes())
            .sum();
        (lock(&self.handles).len(), buffered)
    }

    /// Commits everything still buffered (at unmount).
    pub fn flush_all(&self) {
        let files: Vec<_> = lock(&self.files).values().cloned().collect();
        for f in files {
            let mut g = lock(&f.content);
            if let Err(e) = self.commit_file(&f, &mut g) {
                tracing::error!(ino = g.ino, error = %e, "content could not be committed at unmount");
            }
        }
        if let Err(e) = self.store.sync() {
            tracing::error!(error = %e, "final sync failed");
        }
    }
}
