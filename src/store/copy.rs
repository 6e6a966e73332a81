//! Copies of a store: every table of one read snapshot written into a new store file.
//!
//! Invariant kept here: a copy is complete in itself, written in one transaction and synced
//! to disk once it is whole, with no write-ahead log belonging to it. Tables are copied as
//! their stored bytes, in key order: nothing is decoded or encoded on the way.

use std::path::Path;

use redb::{Database, ReadableTable};

use super::read::ReadTxn;
use super::schema::*;
use super::{StoreError, map_err, return_freed_memory};

/// What a copy wrote.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CopyStats {
    /// Records copied, over all tables.
    pub entries: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
}

/// redb's cache for the file a copy writes (its write buffer is half of it). The copy is
/// written once, in key order: only the right edge of each table is written again, a few
/// pages deep, so 1 MiB costs no more CPU than 8 did and keeps 7 MiB out of the daemon's
/// peak during a snapshot.
const COPY_CACHE_BYTES: usize = 1024 * 1024;

/// A copy hands the heap's free pages back to the system after each this many bytes copied.
/// Reading a store through its cache replaces the cached pages as it goes; when the pages
/// change size (the 4 KiB leaves of the tree tables, then the 64 KiB parts of history
/// records), glibc keeps the freed ones resident beside the new ones: at a million files the
/// daemon grew by 21 MiB while `history_undo` was copied. One `malloc_trim` per MiB bounds
/// that to about a MiB, for some 250 calls over a 300 MB store.
const RETURN_MEMORY_EVERY: u64 = 1 << 20;

/// The bytes of a `T` as stored, under `T`'s name and order: a table opened through it is
/// the same table, read and written without decoding or encoding a key or value.
struct Raw<T>(std::marker::PhantomData<T>);

impl<T> std::fmt::Debug for Raw<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Raw")
    }
}

impl<T: redb::Value + 'static> redb::Value for Raw<T> {
    type SelfType<'a>
        = &'a [u8]
    where
        Self: 'a;
    type AsBytes<'a>
        = &'a [u8]
    where
        Self: 'a;

    const NICHE: Option<&'static [u8]> = T::NICHE;

    fn fixed_width() -> Option<usize> {
        T::fixed_width()
    }

    fn from_bytes<'a>(data: &'a [u8]) -> &'a [u8]
    where
        Self: 'a,
    {
        data
    }

    fn as_bytes<'a, 'b: 'a>(value: &'a &'b [u8]) -> &'a [u8]
    where
        Self: 'b,
    {
        value
    }

    fn type_name() -> redb::TypeName {
        T::type_name()
    }
}

impl<T: redb::Key + 'static> redb::Key for Raw<T> {
    fn compare(data1: &[u8], data2: &[u8]) -> std::cmp::Ordering {
        T::compare(data1, data2)
    }

    fn separator<'a>(left: &'a [u8], right: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        T::separator(left, right)
    }

    fn min_encoded_key() -> Option<std::borrow::Cow<'static, [u8]>> {
        T::min_encoded_key()
    }
}

/// The file a copy writes, with redb's syncs left out: redb syncs a new file a dozen times
/// between its creation and its close (headers, the commit, the clean shutdown), each a
/// disk flush of its own; `copy_to` syncs the finished file once instead. Nothing sees the
/// file before then: it has a temporary name until the caller renames it into place.
#[derive(Debug)]
struct SyncedOnce(redb::backends::FileBackend);

impl redb::StorageBackend for SyncedOnce {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.0.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.0.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.0.write(offset, data)
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.0.close()
    }
}

/// Copies one table as stored bytes, in key order.
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
    use redb::TableHandle;
    let raw = redb::TableDefinition::<Raw<K>, Raw<V>>::new(def.name());
    let src = from.open_table(raw).map_err(map_err)?;
    let mut dst = to.open_table(raw).map_err(map_err)?;
    for item in src.iter().map_err(map_err)? {
        let (k, v) = item.map_err(map_err)?;
        let (k, v) = (k.value(), v.value());
        let before = stats.bytes;
        stats.entries += 1;
        stats.bytes += (k.len() + v.len()) as u64;
        dst.insert(k, v).map_err(map_err)?;
        if before / RETURN_MEMORY_EVERY != stats.bytes / RETURN_MEMORY_EVERY {
            return_freed_memory();
        }
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
        let synced = file
            .try_clone()
            .map_err(|e| StoreError::Io(crate::private::describe(out, e)))?;
        let backend = SyncedOnce(redb::backends::FileBackend::new(file).map_err(map_err)?);
        // The copy's pages are written once, so a small cache serves: it bounds what a
        // snapshot adds to the daemon's memory (redb's default, 1 GiB, let the RSS grow by
        // the whole store during one; the store's own 32 MiB still added as much again).
        let db = Database::builder()
            .set_cache_size(COPY_CACHE_BYTES)
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
        // A format-5 store read as it is has no parts table (its records are whole): the
        // copy gets an empty one.
        match self.tx.open_table(HISTORY_UNDO) {
            Err(redb::TableError::TableDoesNotExist(_)) => {
                tx.open_table(HISTORY_UNDO).map_err(map_err)?;
            }
            _ => copy_table(&self.tx, &tx, HISTORY_UNDO, &mut stats, progress)?,
        }
        copy_table(&self.tx, &tx, MARKS, &mut stats, progress)?;
        copy_table(&self.tx, &tx, REDACTED, &mut stats, progress)?;
        if self.has_deltas_table()? {
            copy_table(&self.tx, &tx, DELTAS, &mut stats, progress)?;
            copy_table(&self.tx, &tx, BLOB_DELTAS, &mut stats, progress)?;
        }
        copy_table(&self.tx, &tx, HISTORY_KEYS, &mut stats, progress)?;
        copy_table(&self.tx, &tx, HISTORY_PATHS, &mut stats, progress)?;
        copy_table(&self.tx, &tx, HISTORY_TIMES, &mut stats, progress)?;
        if self.subtree_current()? {
            copy_table(&self.tx, &tx, SUBTREE, &mut stats, progress)?;
        }
        if self.has_quota_index()? {
            copy_table(&self.tx, &tx, QUOTAS, &mut stats, progress)?;
        }
        // The copy is complete in itself: no log belongs to it, and none ever matches it.
        tx.open_table(META)
            .map_err(map_err)?
            .remove(META_LOG_ID)
            .map_err(map_err)?;
        tx.set_durability(redb::Durability::Immediate)
            .map_err(|e| StoreError::Io(e.to_string()))?;
        tx.commit().map_err(map_err)?;
        drop(db);
        return_freed_memory();
        synced
            .sync_all()
            .map_err(|e| StoreError::Io(crate::private::describe(out, e)))?;
        Ok(stats)
    }
}
