//! The only module that names redb. A `Store` owns one redb database file; `ReadTxn` and
//! `WriteTxn` are the only ways in, so every change the filesystem makes is one redb
//! transaction that commits whole or not at all.
//!
//! Invariant kept here: the `meta` counters (`next_ino`, `next_blob`, content bytes, file and
//! directory counts) and the per-directory counts change in the same transaction as the
//! records they count.
//!
//! This file holds what every room shares: the error, the `Store` handle and its state. The
//! rooms: `schema` says what is on disk (every table, key and record layout); `open` opens,
//! migrates and recovers a store and closes it; `read` and `write` are the two transactions
//! with the schema's accessors (`tables`: the tables a write transaction keeps open until it
//! commits); `content` stores file content in blobs and counts their
//! references; `history` captures before-images, keeps history's indexes and answers history
//! queries; `past` reads the tree as it was at a point of history through those indexes;
//! `subtree` keeps what every directory carries (the counts below it, bounds of its paths, its
//! quota) along its parents in each commit; `commit` is the
//! commit path (room on the disk, the write-ahead log, group commit, checkpoints); `batch`
//! lets operations of several threads share one redb transaction and commit; `copy`
//! writes a snapshot into a new store file; `replica` hands each commit's record to
//! replication and applies shipped records at restore; `readonly` opens a store without writing to it.
//! `wal` and `redo` are the log's file and records, `disk` and `sim` the disk under them,
//! `fault` the failures the tests inject.

mod batch;
mod budget;
mod commit;
mod content;
mod copy;
mod delta;
#[doc(hidden)]
pub mod disk;
pub mod fault;
mod follow;
mod history;
mod open;
mod past;
mod read;
mod readonly;
mod redo;
mod replica;
pub mod schema;
#[doc(hidden)]
pub mod sim;
mod subtree;
mod tables;
pub mod wal;
mod write;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use redb::Database;

pub use copy::{CopyStats, TableDigest, TableSums};
pub use follow::{Changed, NameRule};
pub use history::LogCursor;
pub use past::{Past, TreeView};
pub use read::{DirEntry, ReadTxn};
pub use readonly::{
    IntegrityChecked, ReadOnlyStore, check_integrity_in_place, check_integrity_then_read,
    check_integrity_then_read_within, is_store_file,
};
pub use replica::{
    Attached, Batch, Feed, MAX_SEGMENT_BYTES, MAX_SHIPPED_RECORD, Rebuild, Record, SEGMENT_BYTES,
    SegmentFault, VerifiedRecord, apply_records, apply_verified, decode_segment, encode_segment,
    record_time,
};
pub use schema::{
    CHUNK_SIZE, FORMAT_VERSION, HistoryRecord, INLINE_MAX, Inode, Kind, ROOT_INO, SubtreeRecord,
    Undo, content_kept, inline_is_damaged, inline_part,
};
pub use write::{OpInfo, WriteTxn};

/// Why the store could not do what was asked.
#[derive(Debug)]
pub enum StoreError {
    /// Another process (normally a running daemon) holds the file.
    AlreadyOpen(PathBuf),
    /// The file is a store of a format this build does not know.
    UnknownFormat { path: PathBuf, found: u32 },
    /// The file is not a redbfs store, or a record in it does not decode.
    Corrupt(String),
    /// The disk (or the filesystem under the store file) filled up during a commit; redb
    /// refuses writes until the store is opened again.
    Full,
    /// Refused before committing: the disk has too little room left for this transaction.
    /// Nothing was written; the store stays usable.
    NoRoom,
    /// Any other failure of the storage engine or the disk under it.
    Io(String),
    /// Refused before touching anything, for the reason given (a symlink beside the store, a
    /// directory other users can write in).
    Refused(String),
    /// A content chunk read from the store does not match its checksum.
    /// `blob` is None for a chunk held in the inode record.
    Checksum {
        ino: u64,
        idx: u64,
        blob: Option<u64>,
    },
    /// A change asked of a store opened read-only; nothing was written.
    ReadOnly,
    /// The store must be written before it can be read as it is (recovered after a crash,
    /// or migrated), which a read-only open never does.
    NeedsWriting {
        path: PathBuf,
        why: &'static str,
        /// The format the file is stamped with, when that was read (a store to migrate).
        format: Option<u64>,
    },
    /// Refused before committing: the transaction grows directory `dir` past its quota of
    /// `limit` content bytes (or, when `files`, files and directories). Nothing was written.
    DirQuota { dir: u64, files: bool, limit: u64 },
    /// A joined write's batch was abandoned because another operation in it failed: nothing
    /// of this operation was committed, and it must run again with a write of its own (see
    /// `Store::write_joined_by`).
    Retry,
}

impl StoreError {
    /// The failure, as a fixed text: what these are rate-limited by in the daemon's log
    /// (the message names inodes, paths or the engine's words).
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::AlreadyOpen(_) => "store-already-open",
            StoreError::UnknownFormat { .. } => "store-unknown-format",
            StoreError::Corrupt(_) => "store-corrupt",
            StoreError::Full => "store-full",
            StoreError::NoRoom => "store-no-room",
            StoreError::Io(_) => "store-io",
            StoreError::Refused(_) => "store-refused",
            StoreError::Checksum { .. } => "store-checksum",
            StoreError::ReadOnly => "store-read-only",
            StoreError::NeedsWriting { .. } => "store-needs-writing",
            StoreError::DirQuota { .. } => "store-dir-quota",
            StoreError::Retry => "store-retry",
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::AlreadyOpen(p) => write!(
                f,
                "{} is already open in another process (is it mounted? see `redbfs status`)",
                p.display()
            ),
            StoreError::UnknownFormat { path, found } => write!(
                f,
                "{} has store format version {found}, but this redbfs reads version {FORMAT_VERSION}; \
                 use a redbfs release that knows it",
                path.display()
            ),
            StoreError::Corrupt(m) => write!(f, "the store is damaged: {m}; run `redbfs check`"),
            StoreError::Full => write!(
                f,
                "the disk that holds the store filled up during a commit; restart the daemon once there is room"
            ),
            StoreError::NoRoom => write!(f, "no space left on the disk that holds the store"),
            StoreError::Io(m) => write!(f, "store I/O error: {m}"),
            StoreError::Refused(m) => write!(f, "{m}"),
            StoreError::ReadOnly => write!(f, "the store is open read-only; nothing was written"),
            StoreError::NeedsWriting { path, why, .. } => write!(
                f,
                "{} {why}, which writes it: mount it read-write once (or `redbfs snapshot` it, \
                 which reads a recovered private copy) before opening it read-only",
                path.display()
            ),
            StoreError::Retry => write!(
                f,
                "another operation committed with this one failed; nothing was written"
            ),
            StoreError::DirQuota { dir, files, limit } => write!(
                f,
                "directory inode {dir} would exceed its quota of {limit} {}",
                if *files {
                    "files and directories"
                } else {
                    "content bytes"
                }
            ),
            StoreError::Checksum { ino, idx, blob } => write!(
                f,
                "chunk {idx} of inode {ino} ({}) does not match its checksum: the store file is damaged; run `redbfs check` on it and restore from a snapshot",
                match blob {
                    Some(b) => format!("blob {b}"),
                    None => "held in its inode record".to_string(),
                }
            ),
        }
    }
}

impl std::error::Error for StoreError {}

fn map_err(e: impl Into<redb::Error>) -> StoreError {
    let e: redb::Error = e.into();
    match e {
        redb::Error::DatabaseAlreadyOpen => StoreError::AlreadyOpen(PathBuf::new()),
        redb::Error::Corrupted(m) => StoreError::Corrupt(m),
        redb::Error::Io(io) if io.raw_os_error() == Some(libc::ENOSPC) => StoreError::Full,
        redb::Error::Io(io) if io.raw_os_error() == Some(libc::EDQUOT) => StoreError::Full,
        other => StoreError::Io(other.to_string()),
    }
}

/// Commits redb transaction `tx` with durability `d`.
fn commit_as(mut tx: redb::WriteTransaction, d: redb::Durability) -> Result<(), StoreError> {
    tx.set_durability(d)
        .map_err(|e| StoreError::Io(e.to_string()))?;
    tx.commit().map_err(map_err)
}

fn corrupt(what: &str, ino: u64) -> StoreError {
    StoreError::Corrupt(format!("{what} of inode {ino} does not decode"))
}

/// How a write transaction reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sync {
    /// On disk before `commit` returns (one fdatasync of the log, shared by the commits that
    /// queue meanwhile).
    Durable,
    /// Visible at once, on disk with the next durable commit; lost if the process dies first.
    Deferred,
    /// Durable before its caller answers, which makes it so itself (`Store::sync_to` with the
    /// commit's number) rather than waiting inside `commit`: counted as a durable commit.
    ByCaller,
}

/// How commits reached the disk since the store opened (`Store::commit_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CommitStats {
    /// Commits through the write-ahead log whose caller waited for them to be durable.
    pub durable_commits: u64,
    /// fdatasyncs of the log: each makes every record appended before it durable, so
    /// concurrent durable commits share one.
    pub log_syncs: u64,
    /// Numbered commits (each operation's own) since the store opened.
    pub commits: u64,
    /// redb commits that made them: each batch of operations that shared a redb
    /// transaction commits once.
    pub redb_commits: u64,
    /// Nanoseconds redb's one write transaction was held since the store opened, from its
    /// begin to its commit or abort (a batch's from its first operation's begin to its
    /// commit): beside `open_ns`, how much of the time the store's single writer was busy.
    pub writer_busy_ns: u64,
    /// Nanoseconds since the store opened.
    pub open_ns: u64,
}

/// Counts kept in `meta`, for status, statfs and quotas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub files: u64,
    pub dirs: u64,
    pub content_bytes: u64,
}

/// redb's page cache. An inode record holds a small file's content, so the records of about
/// 20,000 memories of a KiB fit, not a 100,000-file store's (a stat of each of those fills
/// the cache); file content is also cached by the kernel's page cache above the mount. A
/// repeated stat of 8,000 such files took half as much daemon CPU again at 16 MiB as here.
const CACHE_BYTES: usize = 32 * 1024 * 1024;

/// The redb database under a `Store`.
enum Engine {
    Writable(Database),
    /// Opened with redb's read-only handle (a read-only mount): the file is never written,
    /// and `write` refuses with `StoreError::ReadOnly`.
    ReadOnly(redb::ReadOnlyDatabase),
}

/// An open store file.
pub struct Store {
    db: Engine,
    /// Armed by the I/O-error tests (`REDBFS_FAULT_INJECTION=1`); None otherwise.
    faults: Option<std::sync::Arc<fault::FaultPlan>>,
    /// The host's filesystem, or (power-cut tests only) a simulated disk.
    disk: disk::Disk,
    path: PathBuf,
    /// The number of the last commit (persistent: `meta` keeps it, and each log record
    /// carries its own). A commit takes its number while it holds the write lock.
    commits: AtomicU64,
    /// The write-ahead log (see `wal`), started by the first commit after opening; None
    /// inside when it could not be created (then every commit is a durable redb commit).
    wal: OnceLock<Option<wal::Wal>>,
    /// History retention in ns; 0 = history off.
    keep_history_ns: AtomicU64,
    /// Free bytes on the disk under the store, as the last commit saw them.
    disk_free: AtomicU64,
    /// The bytes history may keep (0: no bound), what it keeps as far as this daemon knows
    /// (see `budget`), and the estimate above which a commit measures it.
    history_budget: AtomicU64,
    history_estimate: AtomicU64,
    history_measure_above: AtomicU64,
    /// No history record is older than this (ns since the epoch), as the last look for
    /// expired records found: each commit's expiry skips its look while its cutoff has not
    /// passed it (see `WriteTxn::expire_history`).
    history_oldest: std::sync::atomic::AtomicI64,
    /// Bookkeeping steps of every committed write transaction (see `Store::commit_work`).
    commit_steps: AtomicU64,
    /// Commits through the log that waited for it (see `Store::commit_stats`).
    durable_commits: AtomicU64,
    /// The store file, opened to flush it ahead of checkpoints (see `Store::preflush`), and
    /// whether a flush runs now.
    preflush: OnceLock<Option<std::sync::Arc<std::fs::File>>>,
    preflushing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// redb refused a write transaction after an I/O error (it asks to be reopened).
    failed: std::sync::atomic::AtomicBool,
    /// The replicas' queues of committed records (see `replica`) and where the store was
    /// when they started; set once, when a replicated mount opens the store.
    feeds: OnceLock<replica::Attached>,
    /// Why `write` refuses although the file is writable (a follower's store, which only its
    /// follower changes; a writer fenced by a newer one): see `Store::freeze`.
    frozen: Mutex<Option<String>>,
    /// A follower's store as it stood before its last batch, kept until the next one (see
    /// `Store::before_last_batch`).
    before_batch: Mutex<Option<Arc<ReadTxn>>>,
    /// Twice the batches applied to a follower's store since it opened, plus one while a
    /// batch commits: tells which batch a read transaction sees (see `Store::read_batch`).
    batch_seq: AtomicU64,
    /// Operations the per-directory aggregates did (see `subtree`).
    subtree_work: AtomicU64,
    /// The batch a joined write joins (see `batch`).
    batches: batch::Slot,
    /// Numbered commits since the store opened, and the redb commits that made them: fewer
    /// redb commits means operations shared one (see `batch`).
    numbered_commits: AtomicU64,
    redb_commits: AtomicU64,
    /// Nanoseconds redb's write transaction was held (begun to committed or dropped), and
    /// when the store opened: how busy its one writer is (see `Store::commit_stats`).
    writer_busy_ns: Arc<AtomicU64>,
    opened: std::time::Instant,
    /// Content bytes promised beyond what the store holds, counted against `--quota` by
    /// every path in: what open files of the mount have buffered beyond their committed size
    /// (`Fs::reserve`), and an import's files while it commits (see `Store::hold_quota`).
    quota_held: AtomicU64,
}

impl Store {
    /// Counts `bytes` more as promised against the quota (`quota_held`); the total promised
    /// now, these included. Each caller adds its share before it compares the store's
    /// content plus the total with the quota, so of two that race, the later sees the
    /// other's share.
    pub fn hold_quota(&self, bytes: u64) -> u64 {
        self.quota_held.fetch_add(bytes, Ordering::AcqRel) + bytes
    }

    /// Gives back `bytes` of a `hold_quota` (its commit counts them now, or it failed).
    pub fn release_quota(&self, bytes: u64) {
        self.quota_held.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// The bytes promised against the quota now (see `hold_quota`).
    pub fn quota_held(&self) -> u64 {
        self.quota_held.load(Ordering::Acquire)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes the store file occupies on disk.
    pub fn file_bytes(&self) -> u64 {
        self.disk.len(&self.path)
    }

    /// Rewrites the file to release free space (the store must not be in use). Checkpointed
    /// first, so the close has no commit left to make: one made after the compaction would
    /// find no free page and grow the file again, where redb's trim at close cannot reach.
    pub fn compact(&mut self) -> Result<bool, StoreError> {
        self.checkpoint()?;
        self.writable_db_mut()?
            .compact()
            .map_err(|e| StoreError::Io(e.to_string()))
    }

    /// Runs redb's own integrity check (page checksums and tree structure), which may repair
    /// what it checks: not on a store opened read-only.
    pub fn check_integrity(&mut self) -> Result<bool, StoreError> {
        self.writable_db_mut()?.check_integrity().map_err(map_err)
    }

    /// Whether the store refuses changes: opened read-only (`Store::open_read_only`), or
    /// frozen (`Store::freeze`).
    pub fn is_read_only(&self) -> bool {
        matches!(self.db, Engine::ReadOnly(_)) || self.frozen().is_some()
    }

    fn writable_db(&self) -> Result<&Database, StoreError> {
        match &self.db {
            Engine::Writable(db) => Ok(db),
            Engine::ReadOnly(_) => Err(StoreError::ReadOnly),
        }
    }

    fn writable_db_mut(&mut self) -> Result<&mut Database, StoreError> {
        match &mut self.db {
            Engine::Writable(db) => Ok(db),
            Engine::ReadOnly(_) => Err(StoreError::ReadOnly),
        }
    }
}

/// Hands the heap's free pages back to the system. glibc keeps freed memory inside its heap
/// and arenas; when what is allocated changes size (a cache of 4 KiB pages refilled with 64
/// KiB ones), the new blocks fit few of the old holes and the process grows by both.
pub(crate) fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps the daemon's heap in one glibc arena. glibc gives each thread that meets a busy
/// arena one of its own (up to 8 per core), and each keeps its freed blocks: redb's cache
/// pages are read in by whichever FUSE thread asks and evicted by another, so after a scan
/// of a store larger than the cache every arena held its own share of holes (about 9 MiB
/// over a 32 MiB cache at 100,000 files). Small allocations stay per thread in glibc's
/// thread cache, so the single lock is met only by larger ones; a scan's daemon CPU was
/// the same. A `MALLOC_ARENA_MAX` in the environment is left to decide. Called before any
/// thread starts; says whether glibc took the limit.
pub(crate) fn one_heap_arena() -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets a tunable of the allocator; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// Bytes available to unprivileged users on the filesystem that holds `path`.
pub fn disk_available(path: &Path) -> u64 {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0)
}

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    #[test]
    fn one_heap_arena_is_taken_unless_the_environment_says() {
        let set = std::env::var_os("MALLOC_ARENA_MAX").is_some();
        assert_eq!(super::one_heap_arena(), !set);
    }
}
