//! Copies of a store: every table of one read snapshot written into a new store file.
//!
//! Invariant kept here: a copy is complete in itself, written in one transaction and synced
//! to disk once it is whole, with no write-ahead log belonging to it. Tables are copied as
//! their stored bytes, in key order: nothing is decoded or encoded on the way. What each
//! table held as it was read is summed up in a `TableDigest`, which `table_digests` computes
//! again from the copy: equal digests mean the copy holds what was read, table by table.

use std::path::Path;

use redb::{Database, ReadableTable};

use super::read::ReadTxn;
use super::schema::*;
use super::{StoreError, map_err, return_freed_memory};

/// What a copy wrote.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CopyStats {
    /// Records copied, over all tables.
    pub entries: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
    /// What each table copied held, in the order copied (empty for a copy made otherwise).
    #[serde(skip)]
    pub tables: Vec<TableDigest>,
}

/// What one table holds, as stored: its entries, their bytes, and a CRC-32C of them in key
/// order (each key and each value preceded by its length, 4 bytes little-endian).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableDigest {
    pub name: String,
    pub entries: u64,
    pub bytes: u64,
    pub crc: u32,
}

impl TableDigest {
    fn new(name: &str) -> TableDigest {
        TableDigest {
            name: name.to_string(),
            entries: 0,
            bytes: 0,
            crc: 0,
        }
    }

    fn add(&mut self, k: &[u8], v: &[u8]) {
        self.entries += 1;
        self.bytes += (k.len() + v.len()) as u64;
        let mut crc = crc32c::crc32c_append(self.crc, &(k.len() as u32).to_le_bytes());
        crc = crc32c::crc32c_append(crc, k);
        crc = crc32c::crc32c_append(crc, &(v.len() as u32).to_le_bytes());
        self.crc = crc32c::crc32c_append(crc, v);
    }

    /// `name:entries:bytes:crc`, one argument of `verify-copy`.
    pub fn to_arg(&self) -> String {
        format!(
            "{}:{}:{}:{:08x}",
            self.name, self.entries, self.bytes, self.crc
        )
    }

    /// The inverse of `to_arg`.
    pub fn from_arg(arg: &str) -> Option<TableDigest> {
        let mut it = arg.rsplitn(4, ':');
        let crc = u32::from_str_radix(it.next()?, 16).ok()?;
        let bytes = it.next()?.parse().ok()?;
        let entries = it.next()?.parse().ok()?;
        let name = it.next()?.to_string();
        Some(TableDigest {
            name,
            entries,
            bytes,
            crc,
        })
    }
}

/// redb's cache for the file a copy writes (its write buffer is half of it). The copy is
/// written once, in key order: only the right edge of each table is written again, a few
/// pages deep, so 1 MiB costs no more CPU than 8 did and keeps 7 MiB out of the daemon's
/// peak during a snapshot.
pub(super) const COPY_CACHE_BYTES: usize = 1024 * 1024;

/// A copy hands the heap's free pages back to the system after each this many bytes copied.
/// Reading a store through its cache replaces the cached pages as it goes; when the pages
/// change size (the 4 KiB leaves of the tree tables, then the 64 KiB parts of history
/// records), glibc keeps the freed ones resident beside the new ones: at a million files the
/// daemon grew by 21 MiB while `history_undo` was copied. One `malloc_trim` per MiB bounds
/// that to about a MiB, for some 250 calls over a 300 MB store.
const RETURN_MEMORY_EVERY: u64 = 1 << 20;

/// A copy inserts through a cursor at the end of each table, closed and opened again after
/// this many bytes of keys and values: redb buffers a cursor's inserts until it holds a MiB
/// of them (with the buffer's own growth, two), which a snapshot would add to the daemon's
/// peak. A quarter of that costs a few more updates of the tree's right edge per MiB.
const COPY_RUN_BYTES: usize = 256 * 1024;

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

/// The tables of a store, in the order a copy writes them, each with its type: what a copy
/// writes and what `table_digests` reads back go through the same list.
trait TableVisitor {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError>;

    /// A table the source lacks and the copy gets empty (history's parts, in a format-5
    /// store read as it is).
    fn empty<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError>;
}

/// Calls `v` on every table of the snapshot `r` that a copy holds.
fn visit_tables(r: &ReadTxn, v: &mut impl TableVisitor) -> Result<(), StoreError> {
    v.table(META)?;
    v.table(INODES)?;
    v.table(DIRENTS)?;
    v.table(FILEMAP)?;
    v.table(BLOBS)?;
    v.table(ORPHANS)?;
    v.table(BLOBREFS)?;
    v.table(HISTORY)?;
    // A format-5 store read as it is has no parts table (its records are whole): the copy
    // gets an empty one.
    match r.tx.open_table(HISTORY_UNDO) {
        Err(redb::TableError::TableDoesNotExist(_)) => v.empty(HISTORY_UNDO)?,
        _ => v.table(HISTORY_UNDO)?,
    }
    v.table(MARKS)?;
    v.table(REDACTED)?;
    if r.has_deltas_table()? {
        v.table(DELTAS)?;
        v.table(BLOB_DELTAS)?;
    }
    v.table(HISTORY_KEYS)?;
    v.table(HISTORY_PATHS)?;
    v.table(HISTORY_TIMES)?;
    if r.subtree_current()? {
        v.table(SUBTREE)?;
    }
    if r.has_quota_index()? {
        v.table(QUOTAS)?;
    }
    Ok(())
}

/// Copies each table as stored bytes, in key order, through a cursor at the end of the new
/// table: redb buffers ascending inserts there and packs them into full leaves, one update
/// of the tree per MiB buffered, where `insert` walked the tree down for every entry.
struct Copier<'a> {
    from: &'a redb::ReadTransaction,
    to: &'a redb::WriteTransaction,
    stats: CopyStats,
    progress: &'a mut dyn FnMut(u64),
}

impl TableVisitor for Copier<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        let raw = redb::TableDefinition::<Raw<K>, Raw<V>>::new(def.name());
        let src = self.from.open_table(raw).map_err(map_err)?;
        let mut dst = self.to.open_table(raw).map_err(map_err)?;
        let mut digest = TableDigest::new(def.name());
        // The copy is complete in itself: no log belongs to it, and none ever matches it.
        let skip = (def.name() == META.name()).then_some(META_LOG_ID.as_bytes());
        let mut rows = src.iter().map_err(map_err)?;
        let mut more = true;
        while more {
            let mut run = dst
                .upper_bound_mut(std::ops::Bound::<&[u8]>::Unbounded)
                .map_err(map_err)?;
            let mut run_bytes = 0;
            while run_bytes < COPY_RUN_BYTES {
                let Some(item) = rows.next() else {
                    more = false;
                    break;
                };
                let (k, v) = item.map_err(map_err)?;
                let (k, v) = (k.value(), v.value());
                if skip == Some(k) {
                    continue;
                }
                let before = self.stats.bytes;
                self.stats.entries += 1;
                self.stats.bytes += (k.len() + v.len()) as u64;
                run_bytes += k.len() + v.len();
                digest.add(k, v);
                run.insert_before(k, v).map_err(map_err)?;
                if before / RETURN_MEMORY_EVERY != self.stats.bytes / RETURN_MEMORY_EVERY {
                    return_freed_memory();
                }
                (self.progress)(self.stats.entries);
            }
            run.close().map_err(map_err)?;
        }
        self.stats.tables.push(digest);
        Ok(())
    }

    fn empty<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        self.to.open_table(def).map_err(map_err)?;
        self.stats.tables.push(TableDigest::new(def.name()));
        Ok(())
    }
}

/// Reads each table back as stored bytes and sums it up as `Copier` did.
struct Digester<'a> {
    tx: &'a redb::ReadTransaction,
    tables: Vec<TableDigest>,
}

impl TableVisitor for Digester<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        let raw = redb::TableDefinition::<Raw<K>, Raw<V>>::new(def.name());
        let t = self.tx.open_table(raw).map_err(map_err)?;
        let mut digest = TableDigest::new(def.name());
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            digest.add(k.value(), v.value());
        }
        self.tables.push(digest);
        Ok(())
    }

    fn empty<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        self.table(def)
    }
}

impl ReadTxn {
    /// What each table a copy holds holds, read in key order as stored bytes, in the order
    /// `copy_to` copies them; plus the number of tables in the store (a copy holds no
    /// others).
    pub fn table_digests(&self) -> Result<(Vec<TableDigest>, usize), StoreError> {
        let mut d = Digester {
            tx: &self.tx,
            tables: Vec::new(),
        };
        visit_tables(self, &mut d)?;
        let all = self.tx.list_tables().map_err(map_err)?.count();
        Ok((d.tables, all))
    }

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
        let mut copier = Copier {
            from: &self.tx,
            to: &tx,
            stats: CopyStats::default(),
            progress,
        };
        visit_tables(self, &mut copier)?;
        let stats = copier.stats;
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
