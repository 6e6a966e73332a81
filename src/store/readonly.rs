//! Opening a store only to read it (a read-only mount, the tools), and telling a store file
//! from any other file.
//!
//! Invariant kept here: nothing is ever written to the store read or beside it: the file is
//! opened with redb's read-only handle, and a store that must be written first (recovered or
//! migrated) is refused, or (the tools) read from a private copy in a temporary directory.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use redb::Database;

use super::read::ReadTxn;
use super::schema::*;
use super::{CACHE_BYTES, Engine, Store, StoreError, disk, map_err, wal};

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

impl Store {
    /// Opens the store at `path` with redb's read-only handle: not a byte is written to the
    /// file or beside it, so a store without write permission opens too, and `write` refuses
    /// with `StoreError::ReadOnly`. Refused with `NeedsWriting` when the store must first be
    /// written: recovered (a write-ahead log beside it, or a file not closed cleanly) or
    /// migrated to this format. Refused with `AlreadyOpen` while a read-write process holds it.
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        let file = crate::private::open_read(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StoreError::Io(format!("{}: no such store", path.display()))
            } else {
                StoreError::Io(crate::private::describe(path, e))
            }
        })?;
        let needs = |why| StoreError::NeedsWriting {
            path: path.to_path_buf(),
            why,
        };
        let mut builder = Database::builder();
        builder.set_cache_size(CACHE_BYTES);
        let backend = redb::backends::FileBackend::new(file).map_err(map_err)?;
        let db = builder
            .open_read_only_with_backend(backend)
            .map_err(|e| match e {
                redb::DatabaseError::RepairAborted => needs(NOT_CLOSED),
                e => match map_err(e) {
                    StoreError::AlreadyOpen(_) => StoreError::AlreadyOpen(path.to_path_buf()),
                    other => other,
                },
            })?;
        // Checked with the file held: a daemon that had it open has closed it, so a log
        // beside it now is a crashed session's, with commits the file does not hold yet.
        if std::fs::symlink_metadata(wal::path_of(path)).is_ok() {
            return Err(needs(NOT_CLOSED));
        }
        let store = Store::over(Engine::ReadOnly(db), None, disk::Disk::Host, path);
        let r = store.read()?;
        match r.meta_u64(META_FORMAT)? {
            Some(v) if v == FORMAT_VERSION as u64 => {}
            Some(v) if v == FORMAT_WITHOUT_CHECKSUMS as u64 => {
                return Err(needs("is of store format 2 and must be migrated"));
            }
            Some(v) if v == FORMAT_WITHOUT_HISTORY_INDEXES as u64 => {
                return Err(needs("is of store format 3 and must be migrated"));
            }
            Some(v) => {
                return Err(StoreError::UnknownFormat {
                    path: path.to_path_buf(),
                    found: v as u32,
                });
            }
            None => {
                return Err(StoreError::Corrupt(format!(
                    "{}: no store format version recorded",
                    path.display()
                )));
            }
        }
        store.commits.store(r.commit_number()?, Ordering::Release);
        let keep = r.meta_u64(META_KEEP_HISTORY)?.unwrap_or(0);
        store.keep_history_ns.store(keep, Ordering::Relaxed);
        drop(r);
        Ok(store)
    }
}

const NOT_CLOSED: &str = "was not closed cleanly (a crash or a kill) and must be recovered";

/// A store opened only to read it, for the tools: nothing is ever written to its file or
/// beside it. The file is opened read-only (`Store::open_read_only`); a store that must be
/// written first (recovered or migrated) is read from a private copy of it and its log in a
/// temporary directory instead.
pub struct ReadOnlyStore {
    store: Store,
    path: PathBuf,
    /// The private directory holding the copy `store` is, if it is one (removed on drop).
    copy: Option<tempfile::TempDir>,
}

impl ReadOnlyStore {
    /// Opens the store at `path` without writing a byte to it or its log.
    pub fn open(path: &Path) -> Result<ReadOnlyStore, StoreError> {
        let (store, copy) = match Store::open_read_only(path) {
            Ok(store) => (store, None),
            Err(StoreError::NeedsWriting { .. }) => {
                let (store, dir) = Store::private_copy(path)?;
                (store, Some(dir))
            }
            Err(e) => return Err(e),
        };
        Ok(ReadOnlyStore {
            store,
            path: path.to_path_buf(),
            copy,
        })
    }

    pub fn read(&self) -> Result<ReadTxn, StoreError> {
        self.store.read()
    }

    /// Bytes the store file occupies on disk.
    pub fn file_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// redb's integrity check (which may repair what it checks), on a private copy.
    pub fn check_integrity(&mut self) -> Result<bool, StoreError> {
        if self.copy.is_none() {
            let (store, dir) = Store::private_copy(&self.path)?;
            self.store = store;
            self.copy = Some(dir);
        }
        self.store.check_integrity()
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
