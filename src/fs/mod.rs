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

mod attr;
pub mod conflicts;
pub mod content;
mod create;
mod dir;
pub use dir::{Listed, resume_at};
mod durable;
pub mod error;
pub mod history;
pub mod lifetime;
mod limits;
pub mod name;
mod open;
mod pinned;
mod quota;
mod remove;
mod rename;
mod store_wide;

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
pub use quota::{QuotaInfo, quotas};

/// The inode at `path` ("/", "/memories/notes.md" or "memories/notes.md") as `r` sees it, and
/// the path in canonical (NFC) form.
pub fn resolve_path(
    r: &impl store::TreeView,
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
    /// Bytes history may keep before its oldest records are shed; 0: the default
    /// (`Limits::history_budget`).
    #[serde(default)]
    pub max_history_bytes: u64,
}

/// History's budget without a quota: far above what a memory store's history takes in its
/// 30 days (an edit of a 20 KB memory keeps about 600 bytes: 1 GiB is over a million edits),
/// and a bound on a runaway that rewrites large files in a loop.
pub const DEFAULT_MAX_HISTORY_BYTES: u64 = 1 << 30;

/// History's budget at the least under a quota: a quota of a few KiB (as a test or a tight
/// per-agent limit sets) would otherwise leave history a few edits deep.
pub const MIN_QUOTA_HISTORY_BYTES: u64 = 16 << 20;

/// Four files at the default size cap may be buffered in memory at once.
fn default_max_buffer() -> u64 {
    1 << 30
}

impl Limits {
    /// The bytes history may keep: `--max-history-bytes` when set; else the quota (at least
    /// `MIN_QUOTA_HISTORY_BYTES`), so that the store file stays within about twice the quota
    /// (content and its history) and a client held by the quota cannot fill the disk through
    /// history; else `DEFAULT_MAX_HISTORY_BYTES`.
    pub fn history_budget(&self) -> u64 {
        match (self.max_history_bytes, self.quota_bytes) {
            (0, 0) => DEFAULT_MAX_HISTORY_BYTES,
            (0, q) => q.max(MIN_QUOTA_HISTORY_BYTES),
            (m, _) => m,
        }
    }

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
            max_history_bytes: 0,
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
    /// On a frozen store (a follower's): the version of the file it opened, so it reads
    /// that, whole, whatever later batches change (see `pinned`).
    pinned: Option<Arc<pinned::Pinned>>,
}

struct DirHandle {
    ino: u64,
    entries: Option<Arc<Vec<Listed>>>,
    /// What `entries` holds in memory, about (see `dir::listing_bytes`).
    bytes: usize,
    /// When the handle last read its listing, in `DirHandles::clock` ticks.
    used: u64,
}

/// The open directory handles and what their listings hold in memory together: at most
/// `DirHandles::budget` bytes beside the listing being read (see `Fs::readdir`).
struct DirHandles {
    open: HashMap<u64, DirHandle>,
    held: usize,
    clock: u64,
    budget: usize,
}

/// What removing an inode's last name does, decided before its transaction commits.
enum Removal {
    /// Referenced by the kernel or open: it becomes an orphan, reclaimed when the last
    /// reference and handle are gone (`lifetime`).
    Orphan,
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
    dirs: Mutex<DirHandles>,
    /// Keys the readdir offsets of names (`dir::Listed`): fixed for the mount's life.
    cookies: std::hash::RandomState,
    next_fh: AtomicU64,
    poisoned: AtomicBool,
    invalidator: Mutex<Option<history::SharedInvalidator>>,
    lifetimes: Lifetimes,
    tracker: Tracker,
    /// Bytes of memory open files' buffers hold, kept under `--max-buffer`.
    buffered: AtomicU64,
    /// Bytes open files have buffered beyond their committed size, per directory with a
    /// byte quota above them (see `Fs::reserve`).
    dir_reserved: Mutex<HashMap<u64, u64>>,
    /// Whether any directory has a quota: without one, writes skip the walk up.
    any_quota: AtomicBool,
    /// Orphans that may have lost their last reference or handle, to reclaim in a batch.
    reclaims: Arc<ReclaimQueue>,
    /// On a follower: the read transaction handles opened at one batch share, and that batch
    /// (see `pinned`).
    pin_now: Mutex<Option<(u64, Arc<store::ReadTxn>)>>,
    /// Bytes of memory the copies of files open handles read hold (see `pinned`).
    pin_copies: Arc<AtomicU64>,
}

/// The orphans waiting for the daemon's reclaimer (`Fs::reclaimer`), and what wakes it: it
/// sleeps until one is queued, so an idle daemon does not wake at all.
#[derive(Default)]
pub struct ReclaimQueue {
    queued: Mutex<Vec<u64>>,
    wake: std::sync::Condvar,
    /// Set when the filesystem is dropped: the reclaimer ends.
    closed: AtomicBool,
}

impl ReclaimQueue {
    /// Queues `ino`; returns how many are queued now. The first one wakes the reclaimer.
    fn push(&self, ino: u64) -> usize {
        let mut q = lock(&self.queued);
        q.push(ino);
        if q.len() == 1 {
            self.wake.notify_one();
        }
        q.len()
    }

    fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *lock(&self.queued))
    }

    /// Blocks until an orphan is queued (true) or the filesystem is gone (false).
    pub fn wait(&self) -> bool {
        let mut q = lock(&self.queued);
        while q.is_empty() && !self.closed.load(Ordering::Acquire) {
            q = self.wake.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        !self.closed.load(Ordering::Acquire)
    }

    fn close(&self) {
        let _q = lock(&self.queued);
        self.closed.store(true, Ordering::Release);
        self.wake.notify_all();
    }
}

impl Fs {
    /// The queue the daemon's reclaimer waits on (see `ReclaimQueue::wait`).
    pub fn reclaim_queue(&self) -> Arc<ReclaimQueue> {
        Arc::clone(&self.reclaims)
    }
}

impl Drop for Fs {
    fn drop(&mut self) {
        self.reclaims.close();
    }
}

/// Orphans reclaimed in one transaction at most; a full batch is reclaimed at once.
const RECLAIM_BATCH: usize = 64;

/// How often the daemon reclaims what is queued: orphans wait at most this long.
pub const RECLAIM_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// A commit that frees at least this much buffered content hands the memory back to the
/// system: the chunks are 64 KiB heap blocks spread over the threads' malloc arenas, which
/// glibc keeps otherwise (three 64 MiB writes left the daemon at 170 MB resident).
const RETURN_MEMORY_AFTER: usize = 4 << 20;

/// Whether an operation's write may join other threads' (see `Fs::joinable`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Join(bool);

impl Fs {
    /// Wraps an open store, reclaiming the orphans a crash left behind. Over a store opened
    /// read-only (a read-only mount) every change is refused with EROFS and nothing is
    /// committed, not even access times or the reclaiming of orphans.
    pub fn new(store: Store, limits: Limits) -> Result<Fs> {
        let fs = Fs {
            reclaims: Arc::default(),
            store,
            tracker: Tracker::new(limits.lost_updates),
            limits,
            files: Mutex::new(HashMap::new()),
            handles: Mutex::new(HashMap::new()),
            dirs: Mutex::new(DirHandles {
                open: HashMap::new(),
                held: 0,
                clock: 0,
                budget: dir::LISTINGS_HELD,
            }),
            cookies: std::hash::RandomState::new(),
            next_fh: AtomicU64::new(1),
            poisoned: AtomicBool::new(false),
            invalidator: Mutex::new(None),
            lifetimes: Lifetimes::default(),
            buffered: AtomicU64::new(0),
            dir_reserved: Mutex::new(HashMap::new()),
            any_quota: AtomicBool::new(false),
            pin_now: Mutex::new(None),
            pin_copies: Arc::default(),
        };
        fs.store.set_history_budget(fs.limits.history_budget());
        let quotas = fs.store.read()?.quota_rows()?;
        fs.any_quota.store(!quotas.is_empty(), Ordering::Release);
        fs.reclaim_orphans()?;
        Ok(fs)
    }

    pub fn is_read_only(&self) -> bool {
        self.store.is_read_only()
    }

    /// Deletes every orphan: at open, those a crash left; at unmount, those the kernel still
    /// referenced when it let go of the mount.
    pub fn reclaim_orphans(&self) -> Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
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

    pub(super) fn writable(&self) -> Result<()> {
        if self.is_read_only() {
            Err(Error::ReadOnly)
        } else if self.is_poisoned() {
            Err(Error::Poisoned)
        } else {
            Ok(())
        }
    }

    pub(super) fn commit(&self, w: WriteTxn<'_>, sync: Sync) -> Result<()> {
        self.commit_numbered(w, sync).map(drop)
    }

    /// Runs `op`, whose write (`Fs::write_for`) may share a redb transaction and commit with
    /// other threads' operations, and runs it once more from the beginning with a write of
    /// its own when its batch was abandoned: its commit answered `StoreError::Retry` (another
    /// operation of the batch failed), or it failed itself after earlier operations of the
    /// batch (what it saw of theirs was never committed). Nothing of the first run was
    /// committed, and every call site undoes its own bookkeeping on any error, as it must
    /// for any failed commit.
    pub(super) fn joinable<T>(&self, mut op: impl FnMut(Join) -> Result<T>) -> Result<T> {
        Store::take_abandoned();
        match op(Join(true)) {
            Err(Error::Store(StoreError::Retry)) => op(Join(false)),
            r if Store::take_abandoned() => {
                drop(r);
                op(Join(false))
            }
            r => r,
        }
    }

    /// A write for an operation of process `pid` (its name, when already read): joined to
    /// other threads' operations (`Store::write_joined_by`) when `join` says so.
    pub(super) fn write_for(
        &self,
        join: Join,
        pid: u32,
        name: Option<String>,
    ) -> Result<WriteTxn<'_>> {
        Ok(if join.0 {
            self.store.write_joined_by(pid, name)?
        } else {
            self.store.write_by_named(pid, name)?
        })
    }

    /// Commits `w`; returns the commit's number (for `Store::sync_to`).
    pub(super) fn commit_numbered(&self, w: WriteTxn<'_>, sync: Sync) -> Result<u64> {
        let sync = durable::commit_sync(sync);
        match w.commit_numbered(sync) {
            Ok(seq) => {
                if sync == Sync::ByCaller {
                    durable::sync_later(seq);
                }
                if self.store.history_on()
                    && self.store.disk_nearly_full()
                    && let Err(e) = self.store.shed_history()
                {
                    crate::warn_limited!(error = %e, "could not drop history to make room");
                }
                if self.store.history_maybe_over_budget() {
                    self.shed_history_to_budget();
                }
                Ok(seq)
            }
            Err(StoreError::DirQuota { dir, files, limit }) => {
                // Nothing was written: a refusal, not a failure.
                Err(Error::DirQuota {
                    root: self.path_of(dir),
                    files,
                    limit,
                })
            }
            // Nothing of it was committed; it runs again (`Fs::joinable`).
            Err(StoreError::Retry) => Err(Error::Store(StoreError::Retry)),
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

    /// Brings history back within its budget after a commit (`Store::shed_history_to_budget`):
    /// best effort, like dropping history on a full disk; the commit stands either way.
    fn shed_history_to_budget(&self) {
        match self.store.shed_history_to_budget() {
            Ok((0, _, _)) => {}
            Ok((records, before, after)) => crate::warn_limited!(
                records,
                history_bytes_before = before,
                history_bytes = after,
                budget = self.store.history_budget(),
                "history took more than its budget (--max-history-bytes): dropped its oldest records"
            ),
            Err(e) => {
                crate::warn_limited!(error = %e, "could not drop history over its budget")
            }
        }
    }

    pub(super) fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    pub(super) fn parse_name(&self, raw: &[u8]) -> Result<Name> {
        Ok(Name::parse(raw, self.limits.names)?)
    }

    /// Reports buffered size and times for a file that is open.
    pub(super) fn overlay(&self, mut inode: Inode) -> Inode {
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
}
