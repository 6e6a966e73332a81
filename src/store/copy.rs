//! Copies of a store: every table of one read snapshot written into a new store file.
//!
//! Invariant kept here: a copy is complete in itself, committed durably in one transaction,
//! with no write-ahead log belonging to it.

use std::path::Path;

use redb::{Database, ReadableTable};

use super::read::ReadTxn;
use super::schema::*;
use super::{StoreError, map_err};

/// What a copy wrote.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct CopyStats {
    /// Records copied, over all tables.
    pub entries: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
}

/// redb's cache for the file a copy writes (its write buffer is half of it).
const COPY_CACHE_BYTES: usize = 8 * 1024 * 1024;

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
        Ok(stats)
    }
}
