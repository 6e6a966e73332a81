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
        Store::open_read_only_with_cache(path, CACHE_BYTES)
    }

    fn open_read_only_with_cache(path: &Path, cache_bytes: usize) -> Result<Store, StoreError> {
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
            format: None,
        };
        let migrate = |format: u64, why| StoreError::NeedsWriting {
            path: path.to_path_buf(),
            why,
            format: Some(format),
        };
        let mut builder = Database::builder();
        builder.set_cache_size(cache_bytes);
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
            // Formats 4 to 8 keep history's path and time indexes in tables this build no
            // longer reads: one writable opening moves them (`schema::FORMAT_8`).
            Some(v)
                if v == FORMAT_8 as u64
                    || v == FORMAT_7 as u64
                    || v == FORMAT_6 as u64
                    || v == FORMAT_5 as u64
                    || v == FORMAT_WITHOUT_INLINE as u64 =>
            {
                return Err(migrate(
                    v,
                    "is of an earlier store format (4 to 8) and must be migrated",
                ));
            }
            Some(v) if v == FORMAT_WITHOUT_CHECKSUMS as u64 => {
                return Err(migrate(v, "is of store format 2 and must be migrated"));
            }
            Some(v) if v == FORMAT_WITHOUT_HISTORY_INDEXES as u64 => {
                return Err(migrate(v, "is of store format 3 and must be migrated"));
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
    /// The format the file itself is stamped with, when the copy is read because the file
    /// is of an earlier one (the copy is migrated).
    file_format: Option<u64>,
}

/// The most a check's opening of a store caches (`check_cache_bytes`).
const CHECK_CACHE_MAX: u64 = 64 * 1024 * 1024;

/// redb's cache for an opening that reads the whole store file more than once (a check:
/// redb's integrity check, which verifies every page then walks them all again, then the
/// invariants and the tables' sums through the same opening): the whole file up to
/// `CHECK_CACHE_MAX`, and never less than a mounted store's. A file that fits is read from
/// the kernel twice (redb's check empties the cache when done, so the invariants read it
/// again), where a cache smaller than the file evicted each page before the second walk of
/// the check came back to it. A daemon checks a copy with a cache capped much lower
/// (`check_integrity_then_read_within`, `tools::backup`); `restore` and `check` are
/// short-lived, so the memory goes with them.
fn check_cache_bytes(path: &Path) -> usize {
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    (len + len / 8).clamp(CACHE_BYTES as u64, CHECK_CACHE_MAX) as usize
}

impl ReadOnlyStore {
    /// Opens the store at `path` without writing a byte to it or its log.
    pub fn open(path: &Path) -> Result<ReadOnlyStore, StoreError> {
        ReadOnlyStore::open_with_cache(path, CACHE_BYTES)
    }

    fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<ReadOnlyStore, StoreError> {
        let (store, copy, file_format) = match Store::open_read_only_with_cache(path, cache_bytes) {
            Ok(store) => (store, None, None),
            Err(StoreError::NeedsWriting { format, .. }) => {
                let (store, dir) = Store::private_copy(path)?;
                (store, Some(dir), format)
            }
            Err(e) => return Err(e),
        };
        Ok(ReadOnlyStore {
            store,
            path: path.to_path_buf(),
            copy,
            file_format,
        })
    }

    pub fn read(&self) -> Result<ReadTxn, StoreError> {
        self.store.read()
    }

    /// Whether this reads a private copy (the store had to be written first: recovered,
    /// migrated or its aggregates built), not the file itself.
    pub fn is_private_copy(&self) -> bool {
        self.copy.is_some()
    }

    /// The format the store file is stamped with: that of the store read, unless it is a
    /// private copy migrated from an earlier format, whose number this gives.
    pub fn file_format(&self) -> Result<Option<u64>, StoreError> {
        match self.file_format {
            Some(f) => Ok(Some(f)),
            None => self.store.read()?.meta_u64(META_FORMAT),
        }
    }

    /// Bytes the store file occupies on disk.
    pub fn file_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// redb's integrity check (which commits, and may repair what it checks): on the
    /// private copy when there is one, else on the file itself through an overlay that keeps
    /// whatever the check writes in memory, so the file is read once and never written or
    /// copied. The read-only handle this store holds keeps a daemon out meanwhile.
    pub fn check_integrity(&mut self) -> Result<bool, StoreError> {
        if self.copy.is_some() {
            return self.store.check_integrity();
        }
        check_integrity_in_place(&self.path)
    }
}

/// redb's integrity check of the store file at `path`, read in place through an overlay
/// that keeps whatever the check writes in memory: the file is read once and never written.
/// It opens the file apart from any other opening.
pub fn check_integrity_in_place(path: &Path) -> Result<bool, StoreError> {
    check_integrity_then_read(path).map(|c| c.clean)
}

/// A store file after redb's integrity check, read through the same opening: the check reads
/// every page into a cache that holds the whole file (up to `CHECK_CACHE_MAX`), so what
/// reads it next (the invariants, the tables' sums) is served from that cache, where a
/// second opening read the file from the kernel again.
pub struct IntegrityChecked {
    db: redb::Database,
    /// What redb's check said: true when it found nothing to repair.
    pub clean: bool,
}

impl IntegrityChecked {
    /// A read transaction on the file as checked (repaired in memory, if redb repaired it).
    pub fn read(&self) -> Result<ReadTxn, StoreError> {
        use redb::ReadableDatabase;
        Ok(ReadTxn::new(self.db.begin_read().map_err(map_err)?))
    }
}

/// redb's integrity check of the store file at `path` as `check_integrity_in_place` runs it,
/// keeping the opening (and its cache) for what reads the file next.
pub fn check_integrity_then_read(path: &Path) -> Result<IntegrityChecked, StoreError> {
    check_integrity_then_read_within(path, CHECK_CACHE_MAX)
}

/// `check_integrity_then_read` with a cache of at most `cache_max` bytes (a daemon checking
/// a copy in its own process). redb's check reads every page twice (their checksums, then
/// the trees again to rebuild the allocator state) and empties its cache when done, so what
/// reads the file next reads it from the kernel again whatever the cache: a cache smaller
/// than the file costs one more read of it from the kernel's page cache, and no more memory
/// than the cap.
pub fn check_integrity_then_read_within(
    path: &Path,
    cache_max: u64,
) -> Result<IntegrityChecked, StoreError> {
    let file = crate::private::open_read(path)
        .map_err(|e| StoreError::Io(crate::private::describe(path, e)))?;
    let overlay = Overlay::new(file).map_err(map_err)?;
    let mut builder = redb::Database::builder();
    builder.set_cache_size(check_cache_bytes(path).min(cache_max as usize));
    let mut db = builder.create_with_backend(overlay).map_err(map_err)?;
    let clean = db.check_integrity().map_err(map_err)?;
    Ok(IntegrityChecked { db, clean })
}

/// A file read in place, with every write kept in memory (in blocks of `OVERLAY_BLOCK`
/// bytes): what `check_integrity` runs redb on so that the store file is never written.
#[derive(Debug)]
struct Overlay {
    file: std::fs::File,
    state: std::sync::Mutex<OverlayState>,
}

#[derive(Debug)]
struct OverlayState {
    /// The length redb sees.
    len: u64,
    /// The file's length: bytes at or beyond it read as zeros unless written.
    file_len: u64,
    blocks: std::collections::BTreeMap<u64, Box<[u8]>>,
}

const OVERLAY_BLOCK: u64 = 4096;

impl Overlay {
    fn new(file: std::fs::File) -> std::io::Result<Overlay> {
        let len = file.metadata()?.len();
        Ok(Overlay {
            file,
            state: std::sync::Mutex::new(OverlayState {
                len,
                file_len: len,
                blocks: Default::default(),
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, OverlayState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads `out.len()` bytes at `offset` from the file, zeros past its end.
    fn read_file(&self, file_len: u64, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let from_file = file_len.saturating_sub(offset).min(out.len() as u64) as usize;
        self.file.read_exact_at(&mut out[..from_file], offset)?;
        out[from_file..].fill(0);
        Ok(())
    }
}

impl redb::StorageBackend for Overlay {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.state().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let st = self.state();
        if offset + out.len() as u64 > st.len {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        let mut at = 0usize;
        while at < out.len() {
            let pos = offset + at as u64;
            let block = pos / OVERLAY_BLOCK;
            let within = (pos % OVERLAY_BLOCK) as usize;
            let n = (OVERLAY_BLOCK as usize - within).min(out.len() - at);
            match st.blocks.get(&block) {
                Some(b) => out[at..at + n].copy_from_slice(&b[within..within + n]),
                None => {
                    // Up to the next written block, straight from the file in one read.
                    let next = st
                        .blocks
                        .range(block..)
                        .next()
                        .map_or(u64::MAX, |(k, _)| k * OVERLAY_BLOCK);
                    let n = ((next - pos).min((out.len() - at) as u64)) as usize;
                    self.read_file(st.file_len, pos, &mut out[at..at + n])?;
                    at += n;
                    continue;
                }
            }
            at += n;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut st = self.state();
        if len < st.len {
            // Bytes cut off read as zeros if the length grows again.
            let first_gone = len.div_ceil(OVERLAY_BLOCK);
            st.blocks.split_off(&first_gone);
            if !len.is_multiple_of(OVERLAY_BLOCK)
                && let Some(b) = st.blocks.get_mut(&(len / OVERLAY_BLOCK))
            {
                b[(len % OVERLAY_BLOCK) as usize..].fill(0);
            }
            st.file_len = st.file_len.min(len);
        }
        st.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut st = self.state();
        let mut at = 0usize;
        while at < data.len() {
            let pos = offset + at as u64;
            let block = pos / OVERLAY_BLOCK;
            let within = (pos % OVERLAY_BLOCK) as usize;
            let n = (OVERLAY_BLOCK as usize - within).min(data.len() - at);
            if !st.blocks.contains_key(&block) {
                let mut b = vec![0u8; OVERLAY_BLOCK as usize].into_boxed_slice();
                self.read_file(st.file_len, block * OVERLAY_BLOCK, &mut b)?;
                st.blocks.insert(block, b);
            }
            let b = st.blocks.get_mut(&block).expect("just inserted");
            b[within..within + n].copy_from_slice(&data[at..at + n]);
            at += n;
        }
        st.len = st.len.max(offset + data.len() as u64);
        Ok(())
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

#[cfg(test)]
mod overlay_tests {
    use super::*;

    /// redb's integrity check runs on the store file in place and leaves every byte of it as
    /// it was; a flipped bit in a page is still found.
    #[test]
    fn the_integrity_check_reads_the_file_in_place_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        {
            let store = Store::open_or_create(&path, (0, 0)).unwrap();
            let mut w = store.write().unwrap();
            for ino in 10..400u64 {
                w.put_chunk(ino, 0, format!("content of {ino}").as_bytes())
                    .unwrap();
            }
            w.commit(crate::store::Sync::Durable).unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let mut ro = ReadOnlyStore::open(&path).unwrap();
        assert!(ro.check_integrity().unwrap(), "a clean store checks clean");
        assert!(ro.copy.is_none(), "no private copy was made");
        drop(ro);
        assert_eq!(std::fs::read(&path).unwrap(), before, "not a byte written");

        // Damage a byte of every copy of one chunk's content (inside a B-tree leaf).
        let mut bad = before.clone();
        let needle = b"content of 200";
        let hits: Vec<usize> = (0..bad.len() - needle.len())
            .filter(|&i| &bad[i..i + needle.len()] == needle)
            .collect();
        assert!(!hits.is_empty());
        for at in hits {
            bad[at] ^= 0x40;
        }
        std::fs::write(&path, &bad).unwrap();
        let mut ro = ReadOnlyStore::open(&path).unwrap();
        let clean = ro.check_integrity();
        assert!(
            !matches!(clean, Ok(true)),
            "a damaged page is found: {clean:?}"
        );
        drop(ro);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bad,
            "still not a byte written"
        );
    }
}
