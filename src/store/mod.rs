//! The only module that names redb. A `Store` owns one redb database file; `ReadTxn` and
//! `WriteTxn` are the only ways in, so every change the filesystem makes is one redb
//! transaction that commits whole or not at all.
//!
//! Invariant kept here: the `meta` counters (`next_ino`, `next_blob`, content bytes, file and
//! directory counts) change in the same transaction as the records they count.

#[doc(hidden)]
pub mod disk;
pub mod fault;
mod redo;
pub mod schema;
#[doc(hidden)]
pub mod sim;
pub mod wal;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use redo::{redo_del, redo_put, replay};
use schema::*;
pub use schema::{CHUNK_SIZE, FORMAT_VERSION, HistoryRecord, Inode, Kind, ROOT_INO, Undo};

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
    Checksum { ino: u64, idx: u64, blob: u64 },
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
            StoreError::Checksum { ino, idx, blob } => write!(
                f,
                "chunk {idx} of inode {ino} (blob {blob}) does not match its checksum: the store file is damaged; run `redbfs check` on it and restore from a snapshot"
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
}

/// Counts kept in `meta`, for status, statfs and quotas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub files: u64,
    pub dirs: u64,
    pub content_bytes: u64,
}

const META_FILES: &str = "files";
const META_DIRS: &str = "dirs";
const META_CONTENT_BYTES: &str = "content_bytes";
const META_LAST_COMMIT: &str = "last_commit";

/// Below this much free disk, history is dropped after each commit: current content first.
const SHED_HISTORY_BELOW: u64 = 4 * 1024 * 1024;
/// Room a content commit leaves on the disk, so removals can still commit.
const ROOM_RESERVE: u64 = 1024 * 1024;
/// Room a commit without content needs (copy-on-write of a few tree pages).
const ROOM_FOR_METADATA: u64 = 128 * 1024;
/// Above this much free disk the exact check is skipped.
const ROOM_CHECK_ABOVE: u64 = 64 * 1024 * 1024;

/// redb's page cache. Directory entries and inode records of a 100,000-file store fit; file
/// content is also cached by the kernel's page cache above the mount.
const CACHE_BYTES: usize = 32 * 1024 * 1024;

/// An open store file.
pub struct Store {
    db: Database,
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
    /// Process names by pid, for history records (read from /proc once per burst).
    comms: Mutex<HashMap<u32, (String, std::time::Instant)>>,
    /// redb refused a write transaction after an I/O error (it asks to be reopened).
    failed: std::sync::atomic::AtomicBool,
}

impl Store {
    /// Opens the store at `path`, creating it (with an empty root directory owned by
    /// `root_owner`) when the file does not exist.
    pub fn open_or_create(path: &Path, root_owner: (u32, u32)) -> Result<Store, StoreError> {
        Store::open_on(disk::Disk::Host, path, root_owner)
    }

    /// `open_or_create` on `disk`: the power-cut tests open stores on a simulated disk.
    #[doc(hidden)]
    pub fn open_on(
        disk: disk::Disk,
        path: &Path,
        root_owner: (u32, u32),
    ) -> Result<Store, StoreError> {
        crate::private::check_store_dir(path).map_err(StoreError::Refused)?;
        let exists = disk.exists(path);
        let mut builder = Database::builder();
        // Bounds the daemon's memory: the store's hot pages, not the whole file.
        builder.set_cache_size(CACHE_BYTES);
        let repaired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = repaired.clone();
        builder.set_repair_callback(move |_| flag.store(true, Ordering::Relaxed));
        let faults = (std::env::var("REDBFS_FAULT_INJECTION").as_deref() == Ok("1"))
            .then(|| std::sync::Arc::new(fault::FaultPlan::default()));
        let db = if let disk::Disk::Sim(sim) = &disk {
            let file = sim
                .open(path, true)
                .map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?;
            builder.create_with_backend(sim::SimBackend(file))
        } else if let Some(plan) = &faults {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?;
            let inner = redb::backends::FileBackend::new(file).map_err(map_err)?;
            builder.create_with_backend(fault::FaultyBackend {
                inner,
                plan: plan.clone(),
            })
        } else if exists {
            builder.open(path)
        } else {
            // Created here, mode 0600 and O_EXCL|O_NOFOLLOW, so the file is private from its
            // first byte whatever the umask; redb then formats it.
            let file = crate::private::create_new(path)
                .map_err(|e| StoreError::Refused(crate::private::describe(path, e)))?;
            redb::backends::FileBackend::new(file).and_then(|b| builder.create_with_backend(b))
        }
        .map_err(|e| match map_err(e) {
            StoreError::AlreadyOpen(_) => StoreError::AlreadyOpen(path.to_path_buf()),
            other => other,
        })?;
        if repaired.load(Ordering::Relaxed) {
            tracing::warn!(
                store = %path.display(),
                "the store was not closed cleanly (a crash or a kill): redb verified it and rolled back to its last durable commit"
            );
        }
        let store = Store {
            db,
            faults,
            disk,
            path: path.to_path_buf(),
            commits: AtomicU64::new(0),
            wal: OnceLock::new(),
            keep_history_ns: AtomicU64::new(0),
            disk_free: AtomicU64::new(u64::MAX),
            comms: Mutex::new(HashMap::new()),
            failed: std::sync::atomic::AtomicBool::new(false),
        };
        // Before anything commits: the first commit starts a new log.
        store.recover()?;
        store.init_or_verify(root_owner)?;
        Ok(store)
    }

    /// Opens an existing store; refuses a missing file.
    pub fn open_existing(path: &Path) -> Result<Store, StoreError> {
        Store::open_existing_on(disk::Disk::Host, path)
    }

    /// `open_existing` on `disk` (see `open_on`).
    #[doc(hidden)]
    pub fn open_existing_on(disk: disk::Disk, path: &Path) -> Result<Store, StoreError> {
        if !disk.exists(path) {
            return Err(StoreError::Io(format!("{}: no such store", path.display())));
        }
        Store::open_on(disk, path, (0, 0))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Migrates a format-2 store: every blob gets its checksum, in one durable transaction.
    fn add_checksums(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        let mut n = 0u64;
        {
            let mut blobs = w.tx.open_table(BLOBS).map_err(map_err)?;
            let ids: Vec<u64> = blobs
                .iter()
                .map_err(map_err)?
                .map(|item| item.map(|(k, _)| k.value()).map_err(map_err))
                .collect::<Result<_, _>>()?;
            for id in ids {
                let raw = match blobs.get(id).map_err(map_err)? {
                    // Redacted blobs stay empty.
                    Some(v) if !v.value().is_empty() => schema::encode_blob(v.value()),
                    _ => continue,
                };
                blobs.insert(id, raw.as_slice()).map_err(map_err)?;
                n += 1;
            }
        }
        w.put_meta(META_FORMAT, &(FORMAT_VERSION as u64).to_le_bytes())?;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), chunks = n, "store format 2 migrated to 3: every content chunk now has a checksum");
        Ok(())
    }

    fn init_or_verify(&self, root_owner: (u32, u32)) -> Result<(), StoreError> {
        let r = self.read()?;
        match r.meta_u64(META_FORMAT)? {
            Some(v) if v == FORMAT_VERSION as u64 => {
                let keep = r.meta_u64(META_KEEP_HISTORY)?.unwrap_or(0);
                self.keep_history_ns.store(keep, Ordering::Relaxed);
                return Ok(());
            }
            Some(v) if v == schema::FORMAT_WITHOUT_CHECKSUMS as u64 => {
                drop(r);
                self.add_checksums()?;
                return self.init_or_verify(root_owner);
            }
            Some(v) => {
                return Err(StoreError::UnknownFormat {
                    path: self.path.clone(),
                    found: v as u32,
                });
            }
            None => {}
        }
        drop(r);
        let mut w = self.write()?;
        if w.table_len_inodes()? != 0 {
            return Err(StoreError::Corrupt(
                "inodes exist but no format version is recorded".into(),
            ));
        }
        let now = now_ns();
        for (key, value) in [
            (META_FORMAT, FORMAT_VERSION as u64),
            (META_NEXT_INO, ROOT_INO + 1),
            (META_NEXT_BLOB, 1),
            (META_CREATED, now as u64),
            (META_HISTORY_NEXT, 1),
        ] {
            w.put_meta(key, &value.to_le_bytes())?;
        }
        {
            let tx = &w.tx;
            // Create every table so read transactions never meet a missing one.
            tx.open_table(DIRENTS).map_err(map_err)?;
            tx.open_table(FILEMAP).map_err(map_err)?;
            tx.open_table(BLOBS).map_err(map_err)?;
            tx.open_table(ORPHANS).map_err(map_err)?;
            tx.open_table(BLOBREFS).map_err(map_err)?;
            tx.open_table(HISTORY).map_err(map_err)?;
            tx.open_table(MARKS).map_err(map_err)?;
            tx.open_table(REDACTED).map_err(map_err)?;
        }
        w.put_inode(&Inode {
            ino: ROOT_INO,
            kind: Kind::Dir,
            perm: 0o755,
            uid: root_owner.0,
            gid: root_owner.1,
            size: 0,
            nlink: 2,
            parent: ROOT_INO,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            name: String::new(),
        })?;
        w.commit(Sync::Durable)
    }

    /// Begins a read transaction: a consistent snapshot that never waits for a writer.
    pub fn read(&self) -> Result<ReadTxn, StoreError> {
        Ok(ReadTxn {
            tx: self.db.begin_read().map_err(map_err)?,
        })
    }

    /// Begins a write transaction, waiting for any other writer to finish.
    pub fn write(&self) -> Result<WriteTxn<'_>, StoreError> {
        let tx = self.db.begin_write().map_err(|e| {
            let e = map_err(e);
            // An I/O error inside an earlier transaction (not only at its commit: redb may
            // write and sync pages while a large one runs) leaves redb refusing every write.
            if matches!(e, StoreError::Io(_)) && !self.failed.swap(true, Ordering::AcqRel) {
                tracing::error!(error = %e, "the store refuses writes after an I/O error; restart the daemon (redbfs unmount, then mount)");
            }
            e
        })?;
        Ok(WriteTxn {
            tx,
            store: self,
            redo: RefCell::new(Some(Vec::new())),
            usage: UsageDelta::default(),
            capture: self.history_on().then(Capture::default),
            info: None,
            written: 0,
            ref_deltas: BTreeMap::new(),
            new_blobs: Vec::new(),
        })
    }

    /// Whether writes are refused for good after an I/O error: redb's, or the log's.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
            || matches!(self.wal.get(), Some(Some(w)) if !w.healthy())
    }

    /// Arms an injected I/O fault; refused unless the daemon runs with fault injection.
    pub fn inject_fault(&self, on: fault::FaultOn, nth: u64) -> Result<(), StoreError> {
        match &self.faults {
            Some(plan) => {
                plan.arm(on, nth);
                Ok(())
            }
            None => Err(StoreError::Io(
                "fault injection is off (the daemon runs without REDBFS_FAULT_INJECTION=1)".into(),
            )),
        }
    }

    /// Test-only: makes the next commit that reaches `at` panic there (fault injection on).
    pub fn inject_panic(&self, at: fault::PanicAt) -> Result<(), StoreError> {
        match &self.faults {
            Some(plan) => {
                plan.arm_panic(at);
                Ok(())
            }
            None => Err(StoreError::Io(
                "fault injection is off (the daemon runs without REDBFS_FAULT_INJECTION=1)".into(),
            )),
        }
    }

    fn injected_panic(&self, at: fault::PanicAt) {
        if let Some(plan) = &self.faults
            && plan.take_panic(at)
        {
            panic!("injected panic in a commit at {at:?}");
        }
    }

    /// Whether operations append history records.
    pub fn history_on(&self) -> bool {
        self.keep_history_ns.load(Ordering::Relaxed) > 0
    }

    /// Sets history retention (0 turns history off) and records it in the store.
    pub fn set_keep_history(&self, keep_ns: u64) -> Result<(), StoreError> {
        self.keep_history_ns.store(0, Ordering::Relaxed);
        let w = self.write()?;
        w.put_meta(META_KEEP_HISTORY, &keep_ns.to_le_bytes())?;
        w.commit(Sync::Durable)?;
        self.keep_history_ns.store(keep_ns, Ordering::Relaxed);
        Ok(())
    }

    /// The name of process `pid`, cached for a second (a burst of commits from one process
    /// reads /proc once).
    fn process_name(&self, pid: u32) -> String {
        let mut cache = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((name, at)) = cache.get(&pid)
            && at.elapsed() < std::time::Duration::from_secs(1)
        {
            return name.clone();
        }
        if cache.len() > 1024 {
            cache.clear();
        }
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default();
        cache.insert(pid, (name.clone(), std::time::Instant::now()));
        name
    }

    /// Drops every history record to make room on a full disk: current content comes first.
    pub fn shed_history(&self) -> Result<(), StoreError> {
        if self.read()?.first_seq()?.is_none() {
            return Ok(());
        }
        let mut w = self.write()?;
        w.without_history();
        let n = w.history_after(0)?.len();
        if n == 0 {
            return Ok(());
        }
        w.truncate_history_after(0)?;
        // Removal only: it fits in the reserve that content commits leave. redb hands the
        // freed pages out again after the next commit, so one more follows.
        w.commit(Sync::Durable)?;
        self.write()?.commit(Sync::Durable)?;
        tracing::warn!(
            records = n,
            "the disk is full: dropped the store's history to make room"
        );
        Ok(())
    }

    /// Whether the disk under the store is nearly full, so history should give way.
    pub fn disk_nearly_full(&self) -> bool {
        self.disk_free.load(Ordering::Relaxed) < SHED_HISTORY_BELOW
    }

    /// Makes every commit so far durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.sync_to(self.commits.load(Ordering::Acquire))
    }

    /// Makes commit number `seq` durable, with every commit before it. Callers that arrive
    /// while a sync runs wait for it and are covered by it, or by the next one, which one of
    /// them runs for all: one fdatasync of the log for many commits.
    pub fn sync_to(&self, seq: u64) -> Result<(), StoreError> {
        match self.wal.get() {
            Some(Some(wal)) => wal.sync_to(seq),
            // No log: every commit was a durable redb commit.
            _ => Ok(()),
        }
    }

    /// Applies what the log holds beyond the store's last durable commit (after a crash or a
    /// kill), durably, and removes the log.
    fn recover(&self) -> Result<(), StoreError> {
        let path = wal::path_of(&self.path);
        let r = self.read()?;
        let last = r.meta_u64(META_LOG_SEQ)?.unwrap_or(0);
        let id = r.meta_u64(META_LOG_ID)?.unwrap_or(0);
        drop(r);
        self.commits.store(last, Ordering::Release);
        if !self.disk.exists(&path) {
            return Ok(());
        }
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            let e = std::io::Error::from_raw_os_error(libc::ELOOP);
            return Err(StoreError::Refused(crate::private::describe(&path, e)));
        }
        let todo: Vec<(u64, Vec<u8>)> = if id == 0 {
            Vec::new()
        } else {
            wal::read(&self.disk, &path, id)?
                .into_iter()
                .filter(|(seq, _)| *seq > last)
                .collect()
        };
        if let Some((first, _)) = todo.first()
            && *first != last + 1
        {
            return Err(StoreError::Corrupt(format!(
                "{} begins at commit {first}, but the store's last durable commit is {last}",
                path.display()
            )));
        }
        if let Some((upto, _)) = todo.last() {
            let mut tx = self.db.begin_write().map_err(map_err)?;
            for (_, payload) in &todo {
                replay(&tx, payload)?;
            }
            tx.open_table(META)
                .map_err(map_err)?
                .insert(META_LOG_SEQ, upto.to_le_bytes().as_slice())
                .map_err(map_err)?;
            tx.set_durability(redb::Durability::Immediate)
                .map_err(|e| StoreError::Io(e.to_string()))?;
            tx.commit().map_err(map_err)?;
            self.commits.store(*upto, Ordering::Release);
            tracing::warn!(
                store = %self.path.display(),
                commits = todo.len(),
                "recovery: applied the commits the write-ahead log holds beyond the last checkpoint"
            );
        }
        // Every record is in the store now (or belongs to another session): the log is done.
        self.disk
            .remove(&path)
            .map_err(|e| StoreError::Io(format!("removing {}: {e}", path.display())))
    }

    /// Makes every commit durable in the store file itself and removes the log, so the file
    /// is complete on its own. Only when the store closes: later commits would go to the
    /// removed file.
    fn close_log(&self) -> Result<(), StoreError> {
        let Some(Some(wal)) = self.wal.get() else {
            return Ok(());
        };
        wal.check()?;
        let mut w = self.write()?;
        w.without_history();
        w.commit_checkpoint()?;
        wal.remove(&self.disk)
    }

    /// The number of the last commit, and the bytes of write-ahead log records since the
    /// last checkpoint (what a crash now would have to apply at the next open).
    pub fn log_state(&self) -> (u64, u64) {
        let used = match self.wal.get() {
            Some(Some(wal)) => wal.used(),
            _ => 0,
        };
        (self.commits.load(Ordering::Acquire), used)
    }

    /// Bytes the store file occupies on disk.
    pub fn file_bytes(&self) -> u64 {
        self.disk.len(&self.path)
    }

    /// Rewrites the file to release free space (the store must not be in use).
    pub fn compact(&mut self) -> Result<bool, StoreError> {
        self.db.compact().map_err(|e| StoreError::Io(e.to_string()))
    }

    /// Runs redb's own integrity check (page checksums and tree structure).
    pub fn check_integrity(&mut self) -> Result<bool, StoreError> {
        self.db.check_integrity().map_err(map_err)
    }
}

/// Whether the file at `path` is a store (redb's magic number) or a write-ahead log (a record
/// magic at its start): what no tool may write over.
pub fn is_store_file(path: &Path) -> bool {
    use std::io::Read;
    const REDB: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
    let mut head = [0u8; 9];
    match crate::private::open_read(path).and_then(|mut f| f.read_exact(&mut head)) {
        Ok(()) => head == REDB || head[..4] == *b"RWAL",
        Err(_) => false,
    }
}

/// A store opened only to read it: nothing is ever written to its file or beside it. The file
/// is opened read-only (redb's `ReadOnlyDatabase`), so a store or snapshot without write
/// permission opens; a store that needs recovery (a write-ahead log beside it, or a file not
/// closed cleanly) is read from a private copy of both in a temporary directory instead.
pub struct ReadOnlyStore {
    db: ReadOnlySource,
    path: PathBuf,
}

enum ReadOnlySource {
    File(redb::ReadOnlyDatabase),
    /// A recovered copy, and the private directory that holds it (removed on drop).
    Copy {
        store: Box<Store>,
        _dir: tempfile::TempDir,
    },
}

impl ReadOnlyStore {
    /// Opens the store at `path` without writing a byte to it or its log.
    pub fn open(path: &Path) -> Result<ReadOnlyStore, StoreError> {
        let file = crate::private::open_read(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StoreError::Io(format!("{}: no such store", path.display()))
            } else {
                StoreError::Io(crate::private::describe(path, e))
            }
        })?;
        let log = wal::path_of(path);
        let db = if std::fs::symlink_metadata(&log).is_ok() {
            None
        } else {
            let mut builder = Database::builder();
            builder.set_cache_size(CACHE_BYTES);
            let backend = redb::backends::FileBackend::new(file).map_err(map_err)?;
            match builder.open_read_only_with_backend(backend) {
                Ok(db) => Some(db),
                Err(redb::DatabaseError::RepairAborted) => None,
                Err(e) => {
                    return Err(match map_err(e) {
                        StoreError::AlreadyOpen(_) => StoreError::AlreadyOpen(path.to_path_buf()),
                        other => other,
                    });
                }
            }
        };
        let db = match db {
            Some(db) => ReadOnlySource::File(db),
            None => {
                let (copy, dir) = Store::private_copy(path)?;
                ReadOnlySource::Copy {
                    store: Box::new(copy),
                    _dir: dir,
                }
            }
        };
        let store = ReadOnlyStore {
            db,
            path: path.to_path_buf(),
        };
        match store.read()?.meta_u64(META_FORMAT)? {
            Some(v) if v == FORMAT_VERSION as u64 => Ok(store),
            Some(v) => Err(StoreError::UnknownFormat {
                path: path.to_path_buf(),
                found: v as u32,
            }),
            None => Err(StoreError::Corrupt(format!(
                "{}: no store format version recorded",
                path.display()
            ))),
        }
    }

    pub fn read(&self) -> Result<ReadTxn, StoreError> {
        let tx = match &self.db {
            ReadOnlySource::File(db) => db.begin_read().map_err(map_err)?,
            ReadOnlySource::Copy { store, .. } => return store.read(),
        };
        Ok(ReadTxn { tx })
    }

    /// Bytes the store file occupies on disk.
    pub fn file_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// redb's integrity check (which may repair what it checks), on a private copy.
    pub fn check_integrity(&mut self) -> Result<bool, StoreError> {
        if let ReadOnlySource::File(_) = self.db {
            let (copy, dir) = Store::private_copy(&self.path)?;
            self.db = ReadOnlySource::Copy {
                store: Box::new(copy),
                _dir: dir,
            };
        }
        match &mut self.db {
            ReadOnlySource::Copy { store, .. } => store.check_integrity(),
            ReadOnlySource::File(_) => unreachable!("replaced by a copy above"),
        }
    }
}

impl Store {
    /// Copies the store at `path` and its write-ahead log, if any, into a new private
    /// directory and opens the copy (applying the log there): the original is only read.
    pub fn private_copy(path: &Path) -> Result<(Store, tempfile::TempDir), StoreError> {
        let io = |p: &Path, e: std::io::Error| StoreError::Io(crate::private::describe(p, e));
        let dir = tempfile::Builder::new()
            .prefix("redbfs-read-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| StoreError::Io(format!("temporary directory: {e}")))?;
        let copy = dir.path().join("store.redb");
        for (from, to) in [
            (path.to_path_buf(), copy.clone()),
            (wal::path_of(path), wal::path_of(&copy)),
        ] {
            let mut src = match crate::private::open_read(&from) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && from != path => continue,
                Err(e) => return Err(io(&from, e)),
            };
            let mut dst = crate::private::create_new(&to).map_err(|e| io(&to, e))?;
            std::io::copy(&mut src, &mut dst).map_err(|e| io(&from, e))?;
        }
        Ok((Store::open_existing(&copy)?, dir))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // After any failure the log stays: it is removed only by a checkpoint that succeeds,
        // so a page the kernel dropped after a failed fsync can be rebuilt from it.
        let healthy = matches!(self.wal.get(), Some(Some(_))) && !self.is_failed();
        if healthy && let Err(e) = self.close_log() {
            tracing::error!(error = %e, "the final checkpoint failed; the log stays and is applied at the next open");
        }
    }
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

// Reads shared by read and write transactions, over whichever table handle they hold.

fn get_inode_in(
    t: &impl ReadableTable<u64, &'static [u8]>,
    ino: u64,
) -> Result<Option<Inode>, StoreError> {
    match t.get(ino).map_err(map_err)? {
        None => Ok(None),
        Some(v) => Inode::decode(ino, v.value())
            .map(Some)
            .ok_or_else(|| corrupt("record", ino)),
    }
}

fn lookup_in(
    t: &impl ReadableTable<(u64, &'static str), (u64, u8)>,
    parent: u64,
    name: &str,
) -> Result<Option<(u64, Kind)>, StoreError> {
    match t.get((parent, name)).map_err(map_err)? {
        None => Ok(None),
        Some(v) => {
            let (ino, k) = v.value();
            Kind::from_byte(k)
                .map(|k| Some((ino, k)))
                .ok_or_else(|| corrupt("dirent kind", ino))
        }
    }
}

/// One directory entry as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub ino: u64,
    pub kind: Kind,
}

fn list_in(
    t: &impl ReadableTable<(u64, &'static str), (u64, u8)>,
    parent: u64,
    limit: usize,
) -> Result<Vec<DirEntry>, StoreError> {
    let mut out = Vec::new();
    for item in t.range((parent, "")..(parent + 1, "")).map_err(map_err)? {
        let (k, v) = item.map_err(map_err)?;
        let (ino, kind) = v.value();
        out.push(DirEntry {
            name: k.value().1.to_string(),
            ino,
            kind: Kind::from_byte(kind).ok_or_else(|| corrupt("dirent kind", ino))?,
        });
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

fn chunk_in(
    map: &impl ReadableTable<(u64, u64), u64>,
    blobs: &impl ReadableTable<u64, &'static [u8]>,
    ino: u64,
    idx: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(blob) = map.get((ino, idx)).map_err(map_err)?.map(|v| v.value()) else {
        return Ok(None);
    };
    match blobs.get(blob).map_err(map_err)? {
        Some(v) => match schema::decode_blob(v.value()) {
            Some(data) => Ok(Some(data.to_vec())),
            None => Err(StoreError::Checksum { ino, idx, blob }),
        },
        None => Err(StoreError::Corrupt(format!(
            "chunk {idx} of inode {ino} points to missing blob {blob}"
        ))),
    }
}

fn meta_u64_in(
    t: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> Result<Option<u64>, StoreError> {
    match t.get(key).map_err(map_err)? {
        None => Ok(None),
        Some(v) => {
            let b: [u8; 8] = v
                .value()
                .try_into()
                .map_err(|_| StoreError::Corrupt(format!("meta {key} is not a u64")))?;
            Ok(Some(u64::from_le_bytes(b)))
        }
    }
}

fn orphans_in(t: &impl ReadableTable<u64, ()>) -> Result<Vec<u64>, StoreError> {
    let mut out = Vec::new();
    for item in t.iter().map_err(map_err)? {
        out.push(item.map_err(map_err)?.0.value());
    }
    Ok(out)
}

/// A read-only snapshot of the store.
pub struct ReadTxn {
    tx: redb::ReadTransaction,
}

/// What a copy wrote.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CopyStats {
    /// Records copied, over all tables.
    pub entries: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
}

fn copy_table<K, V>(
    from: &redb::ReadTransaction,
    to: &redb::WriteTransaction,
    def: redb::TableDefinition<K, V>,
    stats: &mut CopyStats,
    progress: &mut dyn FnMut(u64),
) -> Result<(), StoreError>
where
    K: redb::Key + 'static,
    V: redb::Value + 'static,
{
    let src = from.open_table(def).map_err(map_err)?;
    let mut dst = to.open_table(def).map_err(map_err)?;
    for item in src.iter().map_err(map_err)? {
        let (k, v) = item.map_err(map_err)?;
        stats.entries += 1;
        stats.bytes += (K::as_bytes(&k.value()).as_ref().len()
            + V::as_bytes(&v.value()).as_ref().len()) as u64;
        dst.insert(k.value(), v.value()).map_err(map_err)?;
        progress(stats.entries);
    }
    Ok(())
}

impl ReadTxn {
    /// Writes everything this snapshot sees into a new store file at `out` (which must not
    /// exist), committed durably. `progress` is called with the records copied so far.
    pub fn copy_to(
        &self,
        out: &Path,
        progress: &mut dyn FnMut(u64),
    ) -> Result<CopyStats, StoreError> {
        let file = crate::private::create_new(out)
            .map_err(|e| StoreError::Refused(crate::private::describe(out, e)))?;
        let backend = redb::backends::FileBackend::new(file).map_err(map_err)?;
        let db = Database::builder()
            .create_with_backend(backend)
            .map_err(map_err)?;
        let mut tx = db.begin_write().map_err(map_err)?;
        let mut stats = CopyStats::default();
        copy_table(&self.tx, &tx, META, &mut stats, progress)?;
        copy_table(&self.tx, &tx, INODES, &mut stats, progress)?;
        copy_table(&self.tx, &tx, DIRENTS, &mut stats, progress)?;
        copy_table(&self.tx, &tx, FILEMAP, &mut stats, progress)?;
        copy_table(&self.tx, &tx, BLOBS, &mut stats, progress)?;
        copy_table(&self.tx, &tx, ORPHANS, &mut stats, progress)?;
        copy_table(&self.tx, &tx, BLOBREFS, &mut stats, progress)?;
        copy_table(&self.tx, &tx, HISTORY, &mut stats, progress)?;
        copy_table(&self.tx, &tx, MARKS, &mut stats, progress)?;
        copy_table(&self.tx, &tx, REDACTED, &mut stats, progress)?;
        // The copy is complete in itself: no log belongs to it, and none ever matches it.
        tx.open_table(META)
            .map_err(map_err)?
            .remove(META_LOG_ID)
            .map_err(map_err)?;
        tx.set_durability(redb::Durability::Immediate)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        tx.commit().map_err(map_err)?;
        drop(db);
        Ok(stats)
    }

    /// History records, newest first, with seq in `range`.
    pub fn history(
        &self,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.range(range).map_err(map_err)?.rev() {
            let (k, v) = item.map_err(map_err)?;
            out.push(
                HistoryRecord::decode(k.value(), v.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?,
            );
        }
        Ok(out)
    }

    /// The seq of the newest history record (0 when there is none yet).
    pub fn last_seq(&self) -> Result<u64, StoreError> {
        Ok(self
            .meta_u64(META_HISTORY_NEXT)?
            .unwrap_or(1)
            .saturating_sub(1))
    }

    /// The seq of the oldest history record still kept.
    pub fn first_seq(&self) -> Result<Option<u64>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        Ok(t.first().map_err(map_err)?.map(|(k, _)| k.value()))
    }

    pub fn mark(&self, name: &str) -> Result<Option<u64>, StoreError> {
        let t = self.tx.open_table(MARKS).map_err(map_err)?;
        Ok(t.get(name).map_err(map_err)?.map(|v| v.value()))
    }

    pub fn marks(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let t = self.tx.open_table(MARKS).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            out.push((k.value().to_string(), v.value()));
        }
        Ok(out)
    }

    /// Whether `redact` erased any blob of `ino`'s current content.
    pub fn content_redacted(&self, ino: u64) -> Result<bool, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let red = self.tx.open_table(REDACTED).map_err(map_err)?;
        for item in map.range((ino, 0)..=(ino, u64::MAX)).map_err(map_err)? {
            if red
                .get(item.map_err(map_err)?.1.value())
                .map_err(map_err)?
                .is_some()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Every blob's reference count, and the blob ids that exist (for check).
    pub fn blob_accounting(&self) -> Result<(HashMap<u64, u64>, Vec<u64>), StoreError> {
        let refs = self.tx.open_table(BLOBREFS).map_err(map_err)?;
        let mut counts = HashMap::new();
        for item in refs.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            counts.insert(k.value(), v.value());
        }
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        let mut ids = Vec::new();
        for item in blobs.iter().map_err(map_err)? {
            ids.push(item.map_err(map_err)?.0.value());
        }
        Ok((counts, ids))
    }

    /// Every (ino, chunk index, blob id) of current content (for check).
    pub fn all_filemap(&self) -> Result<Vec<(u64, u64, u64)>, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let mut out = Vec::new();
        for item in map.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (ino, idx) = k.value();
            out.push((ino, idx, v.value()));
        }
        Ok(out)
    }

    /// Fails unless every record after `seq` is still kept (older ones expire).
    pub fn check_reachable(&self, seq: u64) -> Result<(), StoreError> {
        let last = self.last_seq()?;
        if seq >= last {
            return Ok(());
        }
        match self.first_seq()? {
            Some(first) if first <= seq + 1 => Ok(()),
            Some(first) => Err(StoreError::Io(format!(
                "history before record {first} has expired (--keep-history); the oldest point is {}",
                first - 1
            ))),
            None => Err(StoreError::Io(
                "no history is kept (history off, or expired)".to_string(),
            )),
        }
    }

    /// Writes the store as it was at history point `seq` into a new store file at `out`: a
    /// copy of this snapshot with the records after `seq` undone and dropped.
    pub fn materialize_at(&self, seq: u64, out: &Path) -> Result<(), StoreError> {
        self.check_reachable(seq)?;
        self.copy_to(out, &mut |_| {})?;
        let s = Store::open_existing(out)?;
        let mut w = s.write()?;
        w.without_history();
        for rec in w.history_after(seq)? {
            w.apply_undo(&rec.undo)?;
        }
        w.truncate_history_after(seq)?;
        w.commit(Sync::Durable)
    }

    /// Runs `f` on the store as it was at history point `seq`, from a scratch copy in a
    /// temporary directory that goes away afterwards.
    pub fn at_point<T>(
        &self,
        seq: u64,
        f: impl FnOnce(&ReadTxn) -> Result<T, String>,
    ) -> Result<T, String> {
        let dir = tempfile::Builder::new()
            .prefix("redbfs-at-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| e.to_string())?;
        let path = dir.path().join("at.redb");
        self.materialize_at(seq, &path).map_err(|e| e.to_string())?;
        let s = Store::open_existing(&path).map_err(|e| e.to_string())?;
        let r = s.read().map_err(|e| e.to_string())?;
        f(&r)
    }

    /// History records, newest first, for the whole store or for `path` (following it back
    /// through renames of it or of a directory above it), no older than `since_ns`.
    pub fn history_of(
        &self,
        path: Option<&str>,
        since_ns: Option<i64>,
        limit: usize,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let mut tracked = path.map(|p| {
            let p = format!("/{}", p.trim_matches('/'));
            if p == "/" {
                p
            } else {
                p.trim_end_matches('/').to_string()
            }
        });
        let mut out = Vec::new();
        let within =
            |p: &str, base: &str| base == "/" || p == base || p.starts_with(&format!("{base}/"));
        for rec in self.history(0..=u64::MAX)? {
            if since_ns.is_some_and(|s| rec.time < s) || out.len() >= limit {
                break;
            }
            let keep = match &tracked {
                None => true,
                Some(t) => rec.paths.iter().any(|p| within(p, t) || within(t, p)),
            };
            if let (Some(t), true) = (&mut tracked, rec.op == "rename" || rec.op == "exchange")
                && let [from, to] = rec.paths.as_slice()
                && within(t, to)
            {
                // Older records knew the tracked path under its name before the rename.
                *t = format!("{from}{}", &t[to.len()..]);
            }
            if keep {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// (chunk index, blob id) of `ino`'s content.
    pub fn filemap_of(&self, ino: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let mut v = Vec::new();
        for item in map.range((ino, 0)..=(ino, u64::MAX)).map_err(map_err)? {
            let (k, b) = item.map_err(map_err)?;
            v.push((k.value().1, b.value()));
        }
        Ok(v)
    }

    /// When the last transaction committed, ns since the epoch.
    pub fn last_commit(&self) -> Result<Option<i64>, StoreError> {
        Ok(self.meta_u64(META_LAST_COMMIT)?.map(|v| v as i64))
    }

    pub fn inode(&self, ino: u64) -> Result<Option<Inode>, StoreError> {
        get_inode_in(&self.tx.open_table(INODES).map_err(map_err)?, ino)
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Option<(u64, Kind)>, StoreError> {
        lookup_in(&self.tx.open_table(DIRENTS).map_err(map_err)?, parent, name)
    }

    /// The entries of directory `parent`, in name order.
    pub fn list(&self, parent: u64) -> Result<Vec<DirEntry>, StoreError> {
        list_in(
            &self.tx.open_table(DIRENTS).map_err(map_err)?,
            parent,
            usize::MAX,
        )
    }

    /// Reads chunks `first..first+count` of `ino`; a hole is `None`.
    pub fn chunks(
        &self,
        ino: u64,
        first: u64,
        count: u64,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        (first..first + count)
            .map(|i| chunk_in(&map, &blobs, ino, i))
            .collect()
    }

    pub fn meta_u64(&self, key: &str) -> Result<Option<u64>, StoreError> {
        match self.tx.open_table(META) {
            Ok(t) => meta_u64_in(&t, key),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }

    pub fn meta_bytes(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let t = self.tx.open_table(META).map_err(map_err)?;
        Ok(t.get(key).map_err(map_err)?.map(|v| v.value().to_vec()))
    }

    pub fn usage(&self) -> Result<Usage, StoreError> {
        Ok(Usage {
            files: self.meta_u64(META_FILES)?.unwrap_or(0),
            dirs: self.meta_u64(META_DIRS)?.unwrap_or(0),
            content_bytes: self.meta_u64(META_CONTENT_BYTES)?.unwrap_or(0),
        })
    }

    pub fn orphans(&self) -> Result<Vec<u64>, StoreError> {
        orphans_in(&self.tx.open_table(ORPHANS).map_err(map_err)?)
    }

    /// Every inode record, in inode order (for check and tools).
    pub fn all_inodes(&self) -> Result<Vec<Inode>, StoreError> {
        let t = self.tx.open_table(INODES).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let ino = k.value();
            out.push(Inode::decode(ino, v.value()).ok_or_else(|| corrupt("record", ino))?);
        }
        Ok(out)
    }

    /// Every dirent as (parent, entry), in key order (for check and tools).
    pub fn all_dirents(&self) -> Result<Vec<(u64, DirEntry)>, StoreError> {
        let t = self.tx.open_table(DIRENTS).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (parent, name) = k.value();
            let (ino, kind) = v.value();
            out.push((
                parent,
                DirEntry {
                    name: name.to_string(),
                    ino,
                    kind: Kind::from_byte(kind).ok_or_else(|| corrupt("dirent kind", ino))?,
                },
            ));
        }
        Ok(out)
    }

    /// Blobs whose content does not match its checksum (for check).
    pub fn damaged_blobs(&self) -> Result<Vec<u64>, StoreError> {
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        let mut out = Vec::new();
        for item in blobs.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            if schema::decode_blob(v.value()).is_none() {
                out.push(k.value());
            }
        }
        Ok(out)
    }

    /// Every (ino, chunk index, blob length) in key order (for check and tools).
    pub fn all_chunks(&self) -> Result<Vec<(u64, u64, u64)>, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        let mut out = Vec::new();
        for item in map.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (ino, idx) = k.value();
            let len = blobs
                .get(v.value())
                .map_err(map_err)?
                .map(|b| b.value().len().saturating_sub(4) as u64)
                .ok_or_else(|| corrupt("blob", ino))?;
            out.push((ino, idx, len));
        }
        Ok(out)
    }
}

#[derive(Default)]
struct UsageDelta {
    files: i64,
    dirs: i64,
    content_bytes: i64,
}

/// What the operation being committed was and who did it, for its history record.
#[derive(Clone, Debug, Default)]
pub struct OpInfo {
    pub op: &'static str,
    pub paths: Vec<String>,
    pub ino: u64,
    pub size_before: u64,
    pub size_after: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// A lost update this operation made or was refused for (see `fs::conflicts`).
    pub conflict: Option<String>,
}

/// Before-images captured while history is on.
#[derive(Default)]
struct Capture {
    undo: Vec<Undo>,
    seen: std::collections::HashSet<(u8, u64, u64, String)>,
}

/// A write transaction. Dropping it without `commit` rolls everything back.
///
/// Every change goes through four primitives (`set_inode`, `set_dirent`, `set_filemap`,
/// `set_orphan`); with history on, each captures the key's value before the transaction's
/// first change to it, and the record of those before-images is appended at commit.
pub struct WriteTxn<'s> {
    tx: redb::WriteTransaction,
    store: &'s Store,
    /// Every put and remove so far, encoded for the write-ahead log (`redo_put`); None once
    /// it outgrew a log record (the commit is then a checkpoint).
    redo: RefCell<Option<Vec<u8>>>,
    usage: UsageDelta,
    capture: Option<Capture>,
    info: Option<OpInfo>,
    /// Content bytes this transaction adds, for the free-space check at commit.
    written: u64,
    /// Net change of each blob's reference count, written once at commit: a change that
    /// takes a reference and gives one back (a rewrite or unlink whose old blob history keeps)
    /// leaves the blobrefs table untouched, and that is pages an fsync need not write.
    ref_deltas: BTreeMap<u64, i64>,
    /// Blobs created by this transaction (their count starts at 0, not at the implicit 1).
    new_blobs: Vec<std::ops::Range<u64>>,
}

impl WriteTxn<'_> {
    fn table_len_inodes(&self) -> Result<u64, StoreError> {
        self.tx
            .open_table(INODES)
            .map_err(map_err)?
            .len()
            .map_err(map_err)
    }

    /// Stops recording before-images: for transactions that are not user operations
    /// (applying history to a scratch copy, dropping expired history).
    pub fn without_history(&mut self) {
        self.capture = None;
    }

    /// Names the operation for its history record.
    pub fn describe(&mut self, info: OpInfo) {
        self.info = Some(info);
    }

    /// Notes a lost update on the operation `describe` named (kept only with history on).
    pub fn note_conflict(&mut self, note: String) {
        if let Some(i) = &mut self.info {
            i.conflict = Some(note);
        }
    }

    fn first_touch(&mut self, tag: u8, a: u64, b: u64, name: &str) -> bool {
        match &mut self.capture {
            Some(c) => c.seen.insert((tag, a, b, name.to_string())),
            None => false,
        }
    }

    pub fn inode(&self, ino: u64) -> Result<Option<Inode>, StoreError> {
        get_inode_in(&self.tx.open_table(INODES).map_err(map_err)?, ino)
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Option<(u64, Kind)>, StoreError> {
        lookup_in(&self.tx.open_table(DIRENTS).map_err(map_err)?, parent, name)
    }

    /// Up to `limit` entries of directory `parent`, in name order.
    pub fn list(&self, parent: u64, limit: usize) -> Result<Vec<DirEntry>, StoreError> {
        list_in(
            &self.tx.open_table(DIRENTS).map_err(map_err)?,
            parent,
            limit,
        )
    }

    pub fn chunk(&self, ino: u64, idx: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        chunk_in(&map, &blobs, ino, idx)
    }

    fn next_counter(&self, key: &str) -> Result<u64, StoreError> {
        self.next_counters(key, 1)
    }

    /// Takes `count` consecutive values of the counter `key`; returns the first.
    fn next_counters(&self, key: &str, count: u64) -> Result<u64, StoreError> {
        let mut meta = self.tx.open_table(META).map_err(map_err)?;
        let n = meta_u64_in(&meta, key)?
            .ok_or_else(|| StoreError::Corrupt(format!("meta {key} missing")))?;
        let bytes = (n + count).to_le_bytes();
        meta.insert(key, bytes.as_slice()).map_err(map_err)?;
        redo_put(&self.redo, META, &key, &bytes.as_slice());
        Ok(n)
    }

    /// A fresh inode number, never used before in this store.
    pub fn alloc_ino(&self) -> Result<u64, StoreError> {
        self.next_counter(META_NEXT_INO)
    }

    // ---- blob reference counts ----

    fn blob_ref(&mut self, blob: u64) {
        *self.ref_deltas.entry(blob).or_default() += 1;
    }

    fn blob_unref(&mut self, blob: u64) {
        *self.ref_deltas.entry(blob).or_default() -= 1;
    }

    /// Writes the net reference changes: a blobrefs entry only for counts of 2 or more (a
    /// blob without one has exactly one reference), and a blob that reaches 0 is deleted.
    fn apply_ref_deltas(&mut self) -> Result<(), StoreError> {
        let deltas = std::mem::take(&mut self.ref_deltas);
        if deltas.values().all(|&d| d == 0) {
            return Ok(());
        }
        let mut refs = self.tx.open_table(BLOBREFS).map_err(map_err)?;
        let mut gone = Vec::new();
        for (blob, d) in deltas {
            if d == 0 {
                continue;
            }
            let stored = refs.get(blob).map_err(map_err)?.map(|v| v.value());
            let base = match stored {
                Some(n) => n as i64,
                None if self.new_blobs.iter().any(|r| r.contains(&blob)) => 0,
                None => 1,
            };
            match base + d {
                n if n <= 0 => {
                    if n < 0 {
                        return Err(StoreError::Corrupt(format!(
                            "blob {blob} would have {n} references"
                        )));
                    }
                    if stored.is_some() {
                        refs.remove(blob).map_err(map_err)?;
                        redo_del(&self.redo, BLOBREFS, &blob);
                    }
                    gone.push(blob);
                }
                1 => {
                    if stored.is_some() {
                        refs.remove(blob).map_err(map_err)?;
                        redo_del(&self.redo, BLOBREFS, &blob);
                    }
                }
                n => {
                    refs.insert(blob, n as u64).map_err(map_err)?;
                    redo_put(&self.redo, BLOBREFS, &blob, &(n as u64));
                }
            }
        }
        drop(refs);
        if !gone.is_empty() {
            let mut blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
            let mut redacted = self.tx.open_table(REDACTED).map_err(map_err)?;
            for blob in gone {
                blobs.remove(blob).map_err(map_err)?;
                redacted.remove(blob).map_err(map_err)?;
                redo_del(&self.redo, BLOBS, &blob);
                redo_del(&self.redo, REDACTED, &blob);
            }
        }
        Ok(())
    }

    // ---- the four primitives ----

    /// Sets or removes an inode record, keeping the usage counters in step.
    pub fn set_inode(&mut self, ino: u64, new: Option<&Inode>) -> Result<(), StoreError> {
        let mut t = self.tx.open_table(INODES).map_err(map_err)?;
        let old_bytes = t.get(ino).map_err(map_err)?.map(|v| v.value().to_vec());
        let old = match &old_bytes {
            Some(b) => Some(Inode::decode(ino, b).ok_or_else(|| corrupt("record", ino))?),
            None => None,
        };
        match new {
            Some(n) => {
                let bytes = n.encode();
                t.insert(ino, bytes.as_slice()).map_err(map_err)?;
                redo_put(&self.redo, INODES, &ino, &bytes.as_slice());
            }
            None => {
                t.remove(ino).map_err(map_err)?;
                redo_del(&self.redo, INODES, &ino);
            }
        }
        drop(t);
        for (i, sign) in [(old.as_ref(), -1i64), (new, 1)] {
            if let Some(i) = i {
                match i.kind {
                    Kind::File => self.usage.files += sign,
                    Kind::Dir => self.usage.dirs += sign,
                }
                self.usage.content_bytes += sign * i.size as i64;
            }
        }
        if self.first_touch(1, ino, 0, "") {
            self.push_undo(Undo::Inode {
                ino,
                old: old_bytes,
            });
        }
        Ok(())
    }

    /// Sets or removes a directory entry.
    pub fn set_dirent(
        &mut self,
        parent: u64,
        name: &str,
        new: Option<(u64, Kind)>,
    ) -> Result<(), StoreError> {
        let mut t = self.tx.open_table(DIRENTS).map_err(map_err)?;
        let old = match new {
            Some((ino, kind)) => {
                redo_put(&self.redo, DIRENTS, &(parent, name), &(ino, kind.to_byte()));
                t.insert((parent, name), (ino, kind.to_byte()))
            }
            None => {
                redo_del(&self.redo, DIRENTS, &(parent, name));
                t.remove((parent, name))
            }
        }
        .map_err(map_err)?
        .map(|v| v.value());
        drop(t);
        if self.first_touch(2, parent, 0, name) {
            self.push_undo(Undo::Dirent {
                parent,
                name: name.to_string(),
                old,
            });
        }
        Ok(())
    }

    /// Points chunk `idx` of `ino` at `new` (or makes it a hole), adjusting blob references.
    pub fn set_filemap(&mut self, ino: u64, idx: u64, new: Option<u64>) -> Result<(), StoreError> {
        let mut t = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let old = match new {
            Some(b) => {
                redo_put(&self.redo, FILEMAP, &(ino, idx), &b);
                t.insert((ino, idx), b)
            }
            None => {
                redo_del(&self.redo, FILEMAP, &(ino, idx));
                t.remove((ino, idx))
            }
        }
        .map_err(map_err)?
        .map(|v| v.value());
        drop(t);
        if old == new {
            return Ok(());
        }
        if self.first_touch(3, ino, idx, "") {
            // The history record keeps the old blob alive.
            if let Some(o) = old {
                self.blob_ref(o);
            }
            self.push_undo(Undo::Filemap { ino, idx, old });
        }
        if let Some(n) = new {
            self.blob_ref(n);
        }
        if let Some(o) = old {
            self.blob_unref(o);
        }
        Ok(())
    }

    /// Marks or unmarks `ino` as an orphan.
    pub fn set_orphan(&mut self, ino: u64, present: bool) -> Result<(), StoreError> {
        let mut t = self.tx.open_table(ORPHANS).map_err(map_err)?;
        let was = if present {
            redo_put(&self.redo, ORPHANS, &ino, &());
            t.insert(ino, ())
        } else {
            redo_del(&self.redo, ORPHANS, &ino);
            t.remove(ino)
        }
        .map_err(map_err)?
        .is_some();
        drop(t);
        if was != present && self.first_touch(4, ino, 0, "") {
            self.push_undo(Undo::Orphan { ino, present: was });
        }
        Ok(())
    }

    fn push_undo(&mut self, u: Undo) {
        if let Some(c) = &mut self.capture {
            c.undo.push(u);
        }
    }

    // ---- operations built on the primitives ----

    /// Writes an inode record.
    pub fn put_inode(&mut self, inode: &Inode) -> Result<(), StoreError> {
        self.set_inode(inode.ino, Some(inode))
    }

    /// Deletes an inode record with all its content and any orphan mark.
    pub fn delete_inode(&mut self, ino: u64) -> Result<(), StoreError> {
        self.set_inode(ino, None)?;
        self.remove_chunks_from(ino, 0)?;
        self.set_orphan(ino, false)
    }

    pub fn put_dirent(
        &mut self,
        parent: u64,
        name: &str,
        ino: u64,
        kind: Kind,
    ) -> Result<(), StoreError> {
        self.set_dirent(parent, name, Some((ino, kind)))
    }

    pub fn remove_dirent(&mut self, parent: u64, name: &str) -> Result<(), StoreError> {
        self.set_dirent(parent, name, None)
    }

    /// Stores `data` as chunk `idx` of `ino` in a new blob; the blob it replaces is released
    /// (or kept by history).
    pub fn put_chunk(&mut self, ino: u64, idx: u64, data: &[u8]) -> Result<(), StoreError> {
        self.put_chunks(ino, [(idx, data)])
    }

    /// Stores chunks of `ino` (index, content) as new blobs: one range of blob ids and one
    /// open of the blob table for all of them.
    pub fn put_chunks<'d>(
        &mut self,
        ino: u64,
        chunks: impl IntoIterator<Item = (u64, &'d [u8])> + Clone,
    ) -> Result<(), StoreError> {
        let n = chunks.clone().into_iter().count() as u64;
        if n == 0 {
            return Ok(());
        }
        let first = self.next_counters(META_NEXT_BLOB, n)?;
        self.new_blobs.push(first..first + n);
        {
            let mut blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
            for (blob, (_, data)) in (first..).zip(chunks.clone()) {
                self.written += data.len() as u64;
                let raw = schema::encode_blob(data);
                blobs.insert(blob, raw.as_slice()).map_err(map_err)?;
                redo_put(&self.redo, BLOBS, &blob, &raw.as_slice());
            }
        }
        for (blob, (idx, _)) in (first..).zip(chunks) {
            self.set_filemap(ino, idx, Some(blob))?;
        }
        Ok(())
    }

    /// Removes chunks `first..` of `ino`.
    pub fn remove_chunks_from(&mut self, ino: u64, first: u64) -> Result<(), StoreError> {
        let idxs: Vec<u64> = {
            let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
            let mut v = Vec::new();
            for item in map.range((ino, first)..=(ino, u64::MAX)).map_err(map_err)? {
                v.push(item.map_err(map_err)?.0.value().1);
            }
            v
        };
        for idx in idxs {
            self.set_filemap(ino, idx, None)?;
        }
        Ok(())
    }

    pub fn add_orphan(&mut self, ino: u64) -> Result<(), StoreError> {
        self.set_orphan(ino, true)
    }

    pub fn orphans(&self) -> Result<Vec<u64>, StoreError> {
        orphans_in(&self.tx.open_table(ORPHANS).map_err(map_err)?)
    }

    pub fn put_meta(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.tx
            .open_table(META)
            .map_err(map_err)?
            .insert(key, value)
            .map_err(map_err)?;
        redo_put(&self.redo, META, &key, &value);
        Ok(())
    }

    pub fn usage(&self) -> Result<Usage, StoreError> {
        let meta = self.tx.open_table(META).map_err(map_err)?;
        let get = |k| meta_u64_in(&meta, k).map(|v| v.unwrap_or(0));
        let apply = |base: u64, d: i64| base.saturating_add_signed(d);
        Ok(Usage {
            files: apply(get(META_FILES)?, self.usage.files),
            dirs: apply(get(META_DIRS)?, self.usage.dirs),
            content_bytes: apply(get(META_CONTENT_BYTES)?, self.usage.content_bytes),
        })
    }

    // ---- history ----

    /// Restores the before-images of `undo`, newest change first. With history on, this is
    /// itself captured, so undoing can be undone.
    pub fn apply_undo(&mut self, undo: &[Undo]) -> Result<(), StoreError> {
        for u in undo.iter().rev() {
            match u {
                Undo::Inode { ino, old } => {
                    let old = match old {
                        Some(b) => Some(
                            Inode::decode(*ino, b)
                                .ok_or_else(|| corrupt("history record", *ino))?,
                        ),
                        None => None,
                    };
                    self.set_inode(*ino, old.as_ref())?;
                }
                Undo::Dirent { parent, name, old } => {
                    let old = match old {
                        Some((ino, k)) => Some((
                            *ino,
                            Kind::from_byte(*k).ok_or_else(|| corrupt("history dirent", *ino))?,
                        )),
                        None => None,
                    };
                    self.set_dirent(*parent, name, old)?;
                }
                Undo::Filemap { ino, idx, old } => {
                    if let Some(b) = old
                        && !self.blob_exists(*b)?
                    {
                        return Err(StoreError::Corrupt(format!(
                            "history refers to missing blob {b}"
                        )));
                    }
                    self.set_filemap(*ino, *idx, *old)?;
                }
                Undo::Orphan { ino, present } => self.set_orphan(*ino, *present)?,
            }
        }
        Ok(())
    }

    /// History records with seq above `after`, newest first.
    pub fn history_after(&self, after: u64) -> Result<Vec<HistoryRecord>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.range(after + 1..).map_err(map_err)?.rev() {
            let (k, v) = item.map_err(map_err)?;
            out.push(
                HistoryRecord::decode(k.value(), v.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?,
            );
        }
        Ok(out)
    }

    /// Removes history records with seq above `after`, releasing what they kept alive.
    pub fn truncate_history_after(&mut self, after: u64) -> Result<(), StoreError> {
        for r in self.history_after(after)? {
            self.drop_record(&r)?;
        }
        Ok(())
    }

    fn drop_record(&mut self, r: &HistoryRecord) -> Result<(), StoreError> {
        for u in &r.undo {
            if let Undo::Filemap { old: Some(b), .. } = u {
                self.blob_unref(*b);
            }
        }
        self.tx
            .open_table(HISTORY)
            .map_err(map_err)?
            .remove(r.seq)
            .map_err(map_err)?;
        redo_del(&self.redo, HISTORY, &r.seq);
        Ok(())
    }

    /// Drops up to `max` records older than `cutoff` (ns since the epoch).
    fn expire_history(&mut self, cutoff: i64, max: usize) -> Result<(), StoreError> {
        let old: Vec<HistoryRecord> = {
            let t = self.tx.open_table(HISTORY).map_err(map_err)?;
            let mut v = Vec::new();
            for item in t.iter().map_err(map_err)?.take(max) {
                let (k, val) = item.map_err(map_err)?;
                let r = HistoryRecord::decode(k.value(), val.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?;
                if r.time >= cutoff {
                    break;
                }
                v.push(r);
            }
            v
        };
        for r in &old {
            self.drop_record(r)?;
        }
        Ok(())
    }

    /// Rewrites one history record (redaction).
    pub fn put_record(&mut self, r: &HistoryRecord) -> Result<(), StoreError> {
        let bytes = r.encode();
        self.tx
            .open_table(HISTORY)
            .map_err(map_err)?
            .insert(r.seq, bytes.as_slice())
            .map_err(map_err)?;
        redo_put(&self.redo, HISTORY, &r.seq, &bytes.as_slice());
        Ok(())
    }

    /// Erases a blob's bytes, keeping its id so records and references stay valid.
    pub fn redact_blob(&mut self, blob: u64) -> Result<bool, StoreError> {
        let mut blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        if blobs.get(blob).map_err(map_err)?.is_none() {
            return Ok(false);
        }
        blobs.insert(blob, [].as_slice()).map_err(map_err)?;
        self.tx
            .open_table(REDACTED)
            .map_err(map_err)?
            .insert(blob, ())
            .map_err(map_err)?;
        redo_put(&self.redo, BLOBS, &blob, &[].as_slice());
        redo_put(&self.redo, REDACTED, &blob, &());
        Ok(true)
    }

    /// Whether blob `blob` exists.
    pub fn blob_exists(&self, blob: u64) -> Result<bool, StoreError> {
        Ok(self
            .tx
            .open_table(BLOBS)
            .map_err(map_err)?
            .get(blob)
            .map_err(map_err)?
            .is_some())
    }

    /// Directory entries and inodes this transaction has changed so far (history on only).
    pub fn touched(&self) -> (Vec<(u64, String)>, Vec<u64>) {
        let mut dirents = Vec::new();
        let mut inodes = Vec::new();
        for u in self.capture.iter().flat_map(|c| &c.undo) {
            match u {
                Undo::Dirent { parent, name, .. } => dirents.push((*parent, name.clone())),
                Undo::Inode { ino, .. } => inodes.push(*ino),
                Undo::Filemap { ino, .. } => inodes.push(*ino),
                Undo::Orphan { .. } => {}
            }
        }
        inodes.sort_unstable();
        inodes.dedup();
        (dirents, inodes)
    }

    pub fn set_mark(&self, name: &str, seq: u64) -> Result<(), StoreError> {
        self.tx
            .open_table(MARKS)
            .map_err(map_err)?
            .insert(name, seq)
            .map_err(map_err)?;
        redo_put(&self.redo, MARKS, &name, &seq);
        Ok(())
    }

    /// Whether the disk lacks room for this transaction. A write that fails for lack of
    /// space inside redb leaves it refusing every write until reopened, so a transaction that
    /// might not fit is refused before it commits. Content keeps a reserve back, so removals
    /// (which make room) still fit on a disk that refused content.
    fn lacks_room(&self) -> Result<bool, StoreError> {
        let need = if self.written > 0 {
            self.written.saturating_mul(2) + ROOM_RESERVE
        } else {
            ROOM_FOR_METADATA
        };
        let free = self.store.disk.available(&self.store.path);
        self.store.disk_free.store(free, Ordering::Relaxed);
        if free >= need.saturating_add(ROOM_CHECK_ABOVE) {
            return Ok(false);
        }
        // Close to full: count the free pages inside the file too.
        let stats = self.tx.stats().map_err(map_err)?;
        let used = stats.allocated_pages() * stats.page_size() as u64;
        // Pages of the file that are backed by disk blocks but free; redb grows the file sparse,
        // so its length overstates them.
        let backed = std::fs::metadata(&self.store.path).map_or(0, |m| {
            use std::os::unix::fs::MetadataExt;
            m.blocks() * 512
        });
        let inside = backed.saturating_sub(used);
        Ok(free + inside < need)
    }

    /// Commits everything written in this transaction, with its history record.
    pub fn commit(self, sync: Sync) -> Result<(), StoreError> {
        self.commit_numbered(sync).map(drop)
    }

    /// Commits; returns the commit's number, which `Store::sync_to` takes.
    pub fn commit_numbered(mut self, sync: Sync) -> Result<u64, StoreError> {
        let now = now_ns();
        if self.lacks_room()? {
            return Err(StoreError::NoRoom);
        }
        // A refused replace changes nothing but is recorded all the same.
        let noted = self.info.as_ref().is_some_and(|i| i.conflict.is_some());
        if let Some(c) = self.capture.take()
            && (!c.undo.is_empty() || noted)
        {
            let seq = self.next_counter(META_HISTORY_NEXT)?;
            let info = self.info.take().unwrap_or(OpInfo {
                op: "change",
                ..OpInfo::default()
            });
            let record = HistoryRecord {
                seq,
                time: now,
                op: info.op.to_string(),
                paths: info.paths,
                ino: info.ino,
                size_before: info.size_before,
                size_after: info.size_after,
                uid: info.uid,
                gid: info.gid,
                pid: info.pid,
                comm: if info.pid != 0 {
                    self.store.process_name(info.pid)
                } else {
                    String::new()
                },
                redacted: false,
                undo: c.undo,
                conflict: info.conflict,
            };
            self.put_record(&record)?;
            let keep = self.store.keep_history_ns.load(Ordering::Relaxed);
            if keep > 0 {
                // A bounded batch per commit keeps every commit cheap; the rest follow.
                self.expire_history(now.saturating_sub(keep as i64), 16)?;
            }
        }
        self.apply_ref_deltas()?;
        let usage = self.usage()?;
        {
            let mut meta = self.tx.open_table(META).map_err(map_err)?;
            for (k, v) in [
                (META_FILES, usage.files),
                (META_DIRS, usage.dirs),
                (META_CONTENT_BYTES, usage.content_bytes),
                (META_LAST_COMMIT, now as u64),
            ] {
                let bytes = v.to_le_bytes();
                meta.insert(k, bytes.as_slice()).map_err(map_err)?;
                redo_put(&self.redo, META, &k, &bytes.as_slice());
            }
        }
        self.finish(sync, false)
    }

    /// Commits as a checkpoint: durable in the store file itself, covering every commit
    /// before it, after which the log starts again.
    fn commit_checkpoint(mut self) -> Result<u64, StoreError> {
        self.apply_ref_deltas()?;
        self.finish(Sync::Durable, true)
    }

    /// Numbers the commit, logs it and commits it in redb; waits for the log when durable.
    fn finish(self, sync: Sync, checkpoint: bool) -> Result<u64, StoreError> {
        // Numbered while this transaction holds redb's write lock, so numbers follow commit
        // order and the log's records follow them too. Taken, not just read: the next
        // writer may start the moment redb's commit returns, before this one could record it.
        let seq = self.store.commits.fetch_add(1, Ordering::AcqRel) + 1;
        self.finish_as(seq, sync, checkpoint)
    }

    /// Commits numbered `seq`. The number is spent whatever happens, so whatever leaves this
    /// early, an error or a panic unwinding, fails the log (no later record may follow the
    /// gap), and does so before redb's write lock goes: the guard is dropped before `self`,
    /// and a failure of redb's own commit, which lets go of the lock, happens under the
    /// log's pending lock, which the next writer must take and check first.
    fn finish_as(mut self, seq: u64, sync: Sync, checkpoint: bool) -> Result<u64, StoreError> {
        let store = self.store;
        let mut gap = GapGuard { store, armed: true };
        store.injected_panic(fault::PanicAt::Numbered);
        let mut meta = self.tx.open_table(META).map_err(map_err)?;
        meta.insert(META_LOG_SEQ, seq.to_le_bytes().as_slice())
            .map_err(map_err)?;
        let wal = match store.wal.get() {
            Some(w) => w.as_ref(),
            None => {
                // The first commit since the store opened starts a log under a new id, and
                // is a checkpoint, so the store names the log it must be read with.
                let id = fresh_id();
                meta.insert(META_LOG_ID, id.to_le_bytes().as_slice())
                    .map_err(map_err)?;
                let started = match wal::Wal::start(
                    &store.disk,
                    &store.path,
                    id,
                    seq,
                    store.faults.clone(),
                ) {
                    Ok(w) => Some(w),
                    // A symlink planted at the log's name: refuse, rather than carry on.
                    Err(e @ StoreError::Refused(_)) => return Err(e),
                    Err(e) => {
                        tracing::warn!(error = %e, "no write-ahead log: every commit writes the store file and fsyncs it");
                        None
                    }
                };
                drop(meta);
                let _ = store.wal.set(started);
                let wal = store.wal.get().and_then(|w| w.as_ref());
                let pending = wal.map(|w| w.pending()).transpose()?;
                let result = self.commit_durably(seq);
                if let (Err(_), Some(w)) = (&result, wal) {
                    w.fail();
                }
                drop(pending);
                gap.armed = result.is_err();
                return result;
            }
        };
        drop(meta);
        let Some(wal) = wal else {
            let result = self.commit_durably(seq);
            gap.armed = result.is_err();
            return result;
        };
        let redo = self.redo.take();
        let mut pending = wal.pending()?;
        let fits = redo.as_ref().is_some_and(|r| pending.fits(r.len()));
        // Near a full disk, pages freed by commits that are not durable in redb are not handed
        // out again, so each commit is a checkpoint there.
        let near_full = store.disk_free.load(Ordering::Relaxed) < ROOM_CHECK_ABOVE;
        if checkpoint || near_full || !fits {
            if let Err(e) = self.commit_durably(seq) {
                wal.fail();
                return Err(e);
            }
            pending.checkpointed(seq);
            gap.armed = false;
            return Ok(seq);
        }
        let mark = pending.push(seq, redo.as_deref().unwrap_or_default());
        store.injected_panic(fault::PanicAt::Appended);
        let committed = self
            .tx
            .set_durability(redb::Durability::None)
            .map_err(|e| StoreError::Io(e.to_string()))
            .and_then(|()| self.tx.commit().map_err(map_err));
        if let Err(e) = committed {
            pending.unpush(mark);
            wal.fail();
            return Err(e);
        }
        drop(pending);
        store.injected_panic(fault::PanicAt::Committed);
        if sync == Sync::Durable {
            wal.sync_to(seq)?;
        }
        gap.armed = false;
        Ok(seq)
    }

    /// A durable redb commit: a checkpoint, the log's first commit, or any commit without a
    /// log.
    fn commit_durably(self, seq: u64) -> Result<u64, StoreError> {
        self.store.injected_panic(fault::PanicAt::Checkpoint);
        let mut tx = self.tx;
        tx.set_durability(redb::Durability::Immediate)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        tx.commit().map_err(map_err)?;
        Ok(seq)
    }
}

/// Fails the store's log when dropped armed: see `WriteTxn::finish_as`.
struct GapGuard<'a> {
    store: &'a Store,
    armed: bool,
}

impl Drop for GapGuard<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Some(Some(wal)) = self.store.wal.get()
        {
            wal.fail();
        }
    }
}

/// A random, nonzero id for a new log.
fn fresh_id() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let id = if n == 8 {
        u64::from_le_bytes(b)
    } else {
        now_ns() as u64 ^ ((std::process::id() as u64) << 32)
    };
    id.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of format 2 (content stored without checksums) is migrated when opened: every
    /// chunk gets its checksum and reads as before.
    #[test]
    fn a_format_2_store_gets_checksums_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        {
            let store = Store::open_or_create(&path, (0, 0)).unwrap();
            let mut w = store.write().unwrap();
            w.put_chunks(7, [(0, &data[..60_000]), (1, &data[60_000..])])
                .unwrap();
            w.commit(Sync::Durable).unwrap();
            // Back to format 2: the blobs hold their content alone.
            let w = store.write().unwrap();
            {
                let mut blobs = w.tx.open_table(BLOBS).unwrap();
                let raw: Vec<(u64, Vec<u8>)> = blobs
                    .iter()
                    .unwrap()
                    .map(|i| {
                        let (k, v) = i.unwrap();
                        (k.value(), schema::decode_blob(v.value()).unwrap().to_vec())
                    })
                    .collect();
                for (k, v) in raw {
                    blobs.insert(k, v.as_slice()).unwrap();
                }
            }
            w.put_meta(META_FORMAT, &2u64.to_le_bytes()).unwrap();
            w.commit(Sync::Durable).unwrap();
        }
        let store = Store::open_or_create(&path, (0, 0)).unwrap();
        let r = store.read().unwrap();
        assert_eq!(
            r.meta_u64(META_FORMAT).unwrap(),
            Some(FORMAT_VERSION as u64)
        );
        assert!(r.damaged_blobs().unwrap().is_empty());
        let got: Vec<u8> = r
            .chunks(7, 0, 2)
            .unwrap()
            .into_iter()
            .flat_map(|c| c.unwrap())
            .collect();
        assert_eq!(got, data);
    }
}
