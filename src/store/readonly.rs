//! Opening a store only to read it, and telling a store file from any other file.
//!
//! Invariant kept here: nothing is ever written to the store read or beside it: a store that
//! needs recovery is read from a private copy in a temporary directory.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase};

use super::read::ReadTxn;
use super::schema::*;
use super::{CACHE_BYTES, Store, StoreError, map_err, wal};

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
