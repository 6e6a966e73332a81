//! Copies of a store: every table of one read snapshot written into a new store file.
//!
//! Invariant kept here: a copy is complete in itself, made durable by one commit once it is
//! whole (the commits before it, one per part, are not durable: nothing reads the file
//! before the last) and synced to disk then, with no write-ahead log belonging to it. Tables are copied as
//! their stored bytes, in key order: nothing is decoded or encoded on the way. What each
//! table held as it was read is summed up in a `TableDigest`, which `table_digests` computes
//! again from the copy: equal digests mean the copy holds what was read, table by table.
//! A copy runs on two threads: one reads the snapshot, the other writes the copy.

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

    /// One row, its CRC taken on its own: what `count` and `add_rows` of the rows `put_row`
    /// writes give, batch by batch (the same number: the CRC runs over the same bytes).
    #[cfg(test)]
    fn add(&mut self, k: &[u8], v: &[u8]) {
        self.count(k, v);
        let mut crc = crc32c::crc32c_append(self.crc, &(k.len() as u32).to_le_bytes());
        crc = crc32c::crc32c_append(crc, k);
        crc = crc32c::crc32c_append(crc, &(v.len() as u32).to_le_bytes());
        self.crc = crc32c::crc32c_append(crc, v);
    }

    /// Counts one row; its bytes enter the CRC with its batch (`add_rows`).
    fn count(&mut self, k: &[u8], v: &[u8]) {
        self.entries += 1;
        self.bytes += (k.len() + v.len()) as u64;
    }

    /// Adds to the CRC a batch of rows as `put_row` writes them, counted one by one.
    fn add_rows(&mut self, rows: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, rows);
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

/// A `TableDigest` taken row by row, its CRC over batches of `DIGEST_BATCH_BYTES` (one call
/// per batch where a row took four).
pub(super) struct DigestRows {
    digest: TableDigest,
    rows: Vec<u8>,
}

const DIGEST_BATCH_BYTES: usize = 64 * 1024;

impl DigestRows {
    pub(super) fn new(name: &str) -> DigestRows {
        DigestRows {
            digest: TableDigest::new(name),
            rows: Vec::new(),
        }
    }

    pub(super) fn add(&mut self, k: &[u8], v: &[u8]) {
        self.digest.count(k, v);
        put_row(&mut self.rows, k, v);
        if self.rows.len() >= DIGEST_BATCH_BYTES {
            self.digest.add_rows(&self.rows);
            self.rows.clear();
        }
    }

    pub(super) fn finish(mut self) -> TableDigest {
        self.digest.add_rows(&self.rows);
        self.digest
    }
}

/// The sums of the tables a check's scans read whole, in key order (`ReadTxn::scan_raw`),
/// kept for the check of a copy: `table_digests` takes a table's sum from here instead of
/// reading the table again. Only the check of a copy makes one and hands it to its scans;
/// every other read scans without one and sums nothing.
#[derive(Debug, Default)]
pub struct TableSums(Vec<TableDigest>);

impl TableSums {
    pub fn new() -> TableSums {
        TableSums::default()
    }

    /// The sums taken, in the order their scans finished.
    pub fn tables(&self) -> &[TableDigest] {
        &self.0
    }

    /// The sum a scan took of table `name`, if one did.
    pub(super) fn taken(&self, name: &str) -> Option<&TableDigest> {
        self.0.iter().find(|d| d.name == name)
    }

    /// A sum to take of table `name` as it is scanned: none when one was taken already.
    pub(super) fn start(&self, name: &str) -> Option<DigestRows> {
        self.taken(name).is_none().then(|| DigestRows::new(name))
    }

    /// A scan read the whole table: its sum is kept.
    pub(super) fn keep(&mut self, sum: DigestRows) {
        self.0.push(sum.finish());
    }
}

/// redb's cache for the file a copy writes (its write buffer is half of it). The copy is
/// written once, in key order: only the right edge of each table is written again, a few
/// pages deep, so 1 MiB costs no more CPU than 8 did and keeps 7 MiB out of the daemon's
/// peak during a snapshot.
pub(super) const COPY_CACHE_BYTES: usize = 1024 * 1024;

/// A copy commits (not durably: see `Writer::commit_part`) after each this many row bytes,
/// so that a transaction's new pages stay in the write buffer (half of `COPY_CACHE_BYTES`)
/// until its commit takes their checksums.
const COPY_COMMIT_BYTES: usize = COPY_CACHE_BYTES / 4;

/// A copy hands the heap's free pages back to the system after each this many bytes copied.
/// Reading a store through its cache replaces the cached pages as it goes; when the pages
/// change size (the 4 KiB leaves of the tree tables, then the 64 KiB parts of history
/// records), glibc keeps the freed ones resident beside the new ones: at a million files the
/// daemon grew by 21 MiB while `history_undo` was copied. One `malloc_trim` per MiB bounds
/// that to about a MiB, for some 250 calls over a 300 MB store.
const RETURN_MEMORY_EVERY: u64 = 1 << 20;

/// The bytes of a `T` as stored, under `T`'s name and order: a table opened through it is
/// the same table, read and written without decoding or encoding a key or value.
pub(super) struct Raw<T>(std::marker::PhantomData<T>);

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
///
/// A copy of up to `IMAGE_MAX` bytes is written in memory and to the file in one call when
/// the database closes: redb writes each page of each commit with a call of its own (a
/// hundred calls for a store of 2,000 files, each longer in the kernel than the copy of
/// its page). A copy that grows past it is written out then, and from then on page by page.
#[derive(Debug)]
struct SyncedOnce {
    file: redb::backends::FileBackend,
    /// The file's bytes, while it is held in memory.
    image: std::sync::Mutex<Option<Vec<u8>>>,
}

/// The largest copy `SyncedOnce` holds in memory: the copy's cache, so that a small
/// snapshot adds no more than that again to a daemon's memory.
const IMAGE_MAX: u64 = COPY_CACHE_BYTES as u64;

impl SyncedOnce {
    fn new(file: redb::backends::FileBackend) -> SyncedOnce {
        SyncedOnce {
            file,
            image: std::sync::Mutex::new(Some(Vec::new())),
        }
    }

    fn image(&self) -> std::sync::MutexGuard<'_, Option<Vec<u8>>> {
        self.image.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the image held in `held` to the file, which from then on is written directly.
    fn write_out(&self, held: &mut Option<Vec<u8>>) -> Result<(), std::io::Error> {
        use redb::StorageBackend;
        if let Some(image) = held.take() {
            self.file.set_len(image.len() as u64)?;
            self.file.write(0, &image)?;
        }
        Ok(())
    }
}

/// Sets `image`'s length to `len`, new bytes zero, copied from a block of zeros (its
/// capacity grown by doubling): `Vec::resize` wrote them one byte at a time.
fn resize_zeroed(image: &mut Vec<u8>, len: usize) {
    const ZEROS: [u8; 4096] = [0; 4096];
    if len <= image.len() {
        image.truncate(len);
        return;
    }
    image.reserve(len - image.len());
    while image.len() < len {
        let n = (len - image.len()).min(ZEROS.len());
        image.extend_from_slice(&ZEROS[..n]);
    }
}

impl redb::StorageBackend for SyncedOnce {
    fn len(&self) -> Result<u64, std::io::Error> {
        match &*self.image() {
            Some(image) => Ok(image.len() as u64),
            None => self.file.len(),
        }
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        match &*self.image() {
            Some(image) => {
                let from = usize::try_from(offset).unwrap_or(usize::MAX);
                let bytes = from
                    .checked_add(out.len())
                    .and_then(|end| image.get(from..end))
                    .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
                out.copy_from_slice(bytes);
                Ok(())
            }
            None => self.file.read(offset, out),
        }
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut held = self.image();
        match &mut *held {
            Some(image) if len <= IMAGE_MAX => {
                resize_zeroed(image, len as usize);
                Ok(())
            }
            Some(_) => {
                self.write_out(&mut held)?;
                self.file.set_len(len)
            }
            None => self.file.set_len(len),
        }
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut held = self.image();
        let end = offset.saturating_add(data.len() as u64);
        match &mut *held {
            Some(image) if end <= IMAGE_MAX => {
                let (from, end) = (offset as usize, end as usize);
                if image.len() < end {
                    resize_zeroed(image, end);
                }
                image[from..end].copy_from_slice(data);
                Ok(())
            }
            Some(_) => {
                self.write_out(&mut held)?;
                self.file.write(offset, data)
            }
            None => self.file.write(offset, data),
        }
    }

    fn close(&self) -> Result<(), std::io::Error> {
        let written = self.write_out(&mut self.image());
        let closed = self.file.close();
        written.and(closed)
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
    if r.subtree_current()? {
        v.table(SUBTREE)?;
    }
    if r.has_quota_index()? {
        v.table(QUOTAS)?;
    }
    Ok(())
}

/// The rows of a table travel from the thread that reads the snapshot to the one that writes
/// the copy in batches of about this many bytes (each key and value after its length, 4 bytes
/// little-endian), at most `COPY_BATCHES` of them allocated: what a copy holds in flight
/// stays near a MiB however large the store.
const COPY_BATCH_BYTES: usize = 256 * 1024;
const COPY_BATCHES: usize = 3;

/// What the reading thread sends: rows of the table being copied, or the end of it.
enum Batch {
    Rows(Vec<u8>),
    End,
}

fn put_row(buf: &mut Vec<u8>, k: &[u8], v: &[u8]) {
    buf.extend_from_slice(&(k.len() as u32).to_le_bytes());
    buf.extend_from_slice(k);
    buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
    buf.extend_from_slice(v);
}

/// The rows `put_row` wrote into `buf`, in order.
fn rows(buf: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let mut field = || {
            let len = u32::from_le_bytes(buf.get(at..at + 4)?.try_into().ok()?) as usize;
            let bytes = buf.get(at + 4..at + 4 + len)?;
            at += 4 + len;
            Some(bytes)
        };
        Some((field()?, field()?))
    })
}

/// The reading half of a copy: reads each table of the snapshot in key order, sums it up,
/// and sends its rows in batches, while the calling thread inserts the previous batch.
struct Reader<'a> {
    from: &'a redb::ReadTransaction,
    send: std::sync::mpsc::SyncSender<Batch>,
    /// Batches the writing half is done with.
    spare: std::sync::mpsc::Receiver<Vec<u8>>,
    allocated: usize,
    /// A batch taken and not sent (a table's rows ended at a batch's end).
    unsent: Option<Vec<u8>>,
    tables: Vec<TableDigest>,
}

/// The writing half stopped (it failed, and says why).
fn writer_gone() -> StoreError {
    StoreError::Io("the copy's writer stopped".to_string())
}

const READER_GONE: &str = "the copy's reader stopped";

impl Reader<'_> {
    fn batch(&mut self) -> Result<Vec<u8>, StoreError> {
        if let Some(b) = self.unsent.take() {
            return Ok(b);
        }
        if let Ok(b) = self.spare.try_recv() {
            return Ok(b);
        }
        if self.allocated < COPY_BATCHES {
            self.allocated += 1;
            return Ok(Vec::with_capacity(COPY_BATCH_BYTES + COPY_BATCH_BYTES / 4));
        }
        self.spare.recv().map_err(|_| writer_gone())
    }
}

impl TableVisitor for Reader<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        let raw = redb::TableDefinition::<Raw<K>, Raw<V>>::new(def.name());
        let src = self.from.open_table(raw).map_err(map_err)?;
        let mut digest = TableDigest::new(def.name());
        // The copy is complete in itself: no log belongs to it, and none ever matches it.
        let skip = (def.name() == META.name()).then_some(META_LOG_ID.as_bytes());
        let mut buf = self.batch()?;
        for item in src.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (k, v) = (k.value(), v.value());
            if skip == Some(k) {
                continue;
            }
            digest.count(k, v);
            put_row(&mut buf, k, v);
            if buf.len() >= COPY_BATCH_BYTES {
                digest.add_rows(&buf);
                self.send
                    .send(Batch::Rows(buf))
                    .map_err(|_| writer_gone())?;
                buf = self.batch()?;
            }
        }
        if buf.is_empty() {
            self.unsent = Some(buf);
        } else {
            digest.add_rows(&buf);
            self.send
                .send(Batch::Rows(buf))
                .map_err(|_| writer_gone())?;
        }
        self.send.send(Batch::End).map_err(|_| writer_gone())?;
        self.tables.push(digest);
        Ok(())
    }

    fn empty<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        self.tables.push(TableDigest::new(def.name()));
        Ok(())
    }
}

/// The writing half of a copy: inserts each batch through a cursor at the end of its table,
/// which redb fills as one run packed into full leaves (one update of the tree's right edge
/// per batch, where `insert` walked the tree down for every entry).
struct Writer<'a> {
    db: &'a Database,
    /// The transaction being written (taken while a table is written).
    tx: Option<redb::WriteTransaction>,
    /// Row bytes inserted since `tx` began.
    since_commit: usize,
    recv: std::sync::mpsc::Receiver<Batch>,
    spare: std::sync::mpsc::SyncSender<Vec<u8>>,
    stats: CopyStats,
    progress: &'a mut dyn FnMut(u64),
}

/// The reading half stopped (it failed, and says why).
fn reader_gone() -> StoreError {
    StoreError::Io(READER_GONE.to_string())
}

impl TableVisitor for Writer<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        let raw = redb::TableDefinition::<Raw<K>, Raw<V>>::new(def.name());
        let mut tx = self.tx.take().ok_or_else(writer_lost_its_transaction)?;
        loop {
            let mut dst = tx.open_table(raw).map_err(map_err)?;
            loop {
                let mut buf = match self.recv.recv().map_err(|_| reader_gone())? {
                    Batch::Rows(buf) => buf,
                    Batch::End => {
                        drop(dst);
                        self.tx = Some(tx);
                        return Ok(());
                    }
                };
                let mut run = dst
                    .upper_bound_mut(std::ops::Bound::<&[u8]>::Unbounded)
                    .map_err(map_err)?;
                let before = self.stats.bytes;
                for (k, v) in rows(&buf) {
                    self.stats.entries += 1;
                    self.stats.bytes += (k.len() + v.len()) as u64;
                    run.insert_before(k, v).map_err(map_err)?;
                }
                run.close().map_err(map_err)?;
                if before / RETURN_MEMORY_EVERY != self.stats.bytes / RETURN_MEMORY_EVERY {
                    return_freed_memory();
                }
                (self.progress)(self.stats.entries);
                self.since_commit += buf.len();
                buf.clear();
                // Back to the reader for its next batch: no more than `COPY_BATCHES` exist,
                // so there is room; this fails only when the reader is gone.
                let _ = self.spare.try_send(buf);
                if self.since_commit >= COPY_COMMIT_BYTES {
                    break;
                }
            }
            drop(dst);
            tx = self.commit_part(tx)?;
        }
    }

    fn empty<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        let tx = self.tx.as_ref().ok_or_else(writer_lost_its_transaction)?;
        tx.open_table(def).map_err(map_err)?;
        Ok(())
    }
}

impl Writer<'_> {
    /// Commits what `tx` wrote without making it durable and begins the next transaction:
    /// redb takes the checksums of a transaction's new pages at its commit, so a page the
    /// write buffer had already written out (once more than half the cache was new pages)
    /// was read back, changed and written again. A part small enough stays in the buffer
    /// until its commit. Only the last commit is durable; until then the file is under a
    /// temporary name and nothing reads it.
    fn commit_part(
        &mut self,
        tx: redb::WriteTransaction,
    ) -> Result<redb::WriteTransaction, StoreError> {
        super::commit_as(tx, redb::Durability::None)?;
        self.since_commit = 0;
        self.db.begin_write().map_err(map_err)
    }
}

fn writer_lost_its_transaction() -> StoreError {
    StoreError::Io("the copy's writer has no transaction".to_string())
}

/// Reads each table back as stored bytes and sums it up as `Reader` did (but for the
/// tables a scan summed up already, in `taken`).
struct Digester<'a> {
    tx: &'a redb::ReadTransaction,
    taken: &'a TableSums,
    tables: Vec<TableDigest>,
}

impl TableVisitor for Digester<'_> {
    fn table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &mut self,
        def: redb::TableDefinition<K, V>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        if let Some(sum) = self.taken.taken(def.name()) {
            self.tables.push(sum.clone());
            return Ok(());
        }
        let raw = redb::TableDefinition::<Raw<K>, Raw<V>>::new(def.name());
        let t = self.tx.open_table(raw).map_err(map_err)?;
        let mut digest = DigestRows::new(def.name());
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            digest.add(k.value(), v.value());
        }
        self.tables.push(digest.finish());
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
    /// others). A table whose sum a scan took already (in `taken`) is not read again.
    pub fn table_digests(
        &self,
        taken: &TableSums,
    ) -> Result<(Vec<TableDigest>, usize), StoreError> {
        let mut d = Digester {
            tx: &self.tx,
            taken,
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
        let (stats, file) = self.copy_to_unsynced(out, progress)?;
        file.sync_all()
            .map_err(|e| StoreError::Io(crate::private::describe(out, e)))?;
        Ok(stats)
    }

    /// `copy_to`, but the finished file is not synced yet: the caller syncs the file handed
    /// back (a snapshot does while the copy is checked) before anything relies on the copy
    /// being on disk.
    pub fn copy_to_unsynced(
        &self,
        out: &Path,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(CopyStats, std::fs::File), StoreError> {
        let file = crate::private::create_new(out)
            .map_err(|e| StoreError::Refused(crate::private::describe(out, e)))?;
        let synced = file
            .try_clone()
            .map_err(|e| StoreError::Io(crate::private::describe(out, e)))?;
        let backend = SyncedOnce::new(redb::backends::FileBackend::new(file).map_err(map_err)?);
        // The copy's pages are written once, so a small cache serves: it bounds what a
        // snapshot adds to the daemon's memory (redb's default, 1 GiB, let the RSS grow by
        // the whole store during one; the store's own 32 MiB still added as much again).
        let db = Database::builder()
            .set_cache_size(COPY_CACHE_BYTES)
            .create_with_backend(backend)
            .map_err(map_err)?;
        let tx = db.begin_write().map_err(map_err)?;
        // Two threads, as the machine has two cores: this one inserts a batch while the
        // other reads the next. Both walk the same list of tables (`visit_tables`).
        let (send, recv) = std::sync::mpsc::sync_channel(COPY_BATCHES);
        let (spare_send, spare) = std::sync::mpsc::sync_channel(COPY_BATCHES);
        let (read, written) = std::thread::scope(|scope| {
            let reader = std::thread::Builder::new()
                .name("copy-reader".to_string())
                .spawn_scoped(scope, move || {
                    let mut r = Reader {
                        from: &self.tx,
                        send,
                        spare,
                        allocated: 0,
                        unsent: None,
                        tables: Vec::new(),
                    };
                    visit_tables(self, &mut r).map(|()| r.tables)
                });
            let reader = match reader {
                Ok(h) => h,
                Err(e) => return (Err(StoreError::Io(e.to_string())), Err(reader_gone())),
            };
            let mut w = Writer {
                db: &db,
                tx: Some(tx),
                since_commit: 0,
                recv,
                spare: spare_send,
                stats: CopyStats::default(),
                progress,
            };
            let written = visit_tables(self, &mut w)
                .and_then(|()| w.tx.take().ok_or_else(writer_lost_its_transaction))
                .map(|tx| (tx, std::mem::take(&mut w.stats)));
            // The reader sees the writer gone (its batches refused) and stops.
            drop(w);
            let read = reader
                .join()
                .unwrap_or_else(|_| Err(StoreError::Io("the copy's reader panicked".into())));
            (read, written)
        });
        // A half that failed says why; the other only that it stopped.
        let (tables, (tx, mut stats)) = match (read, written) {
            (Ok(t), Ok(s)) => (t, s),
            (Err(e), Err(StoreError::Io(m))) if m == READER_GONE => return Err(e),
            (_, Err(e)) | (Err(e), Ok(_)) => return Err(e),
        };
        stats.tables = tables;
        // The last part is committed like the others; closing the database then makes it
        // durable in the commit that records the allocator state (which every close writes,
        // so that the next opening needs no repair): one durable commit where a durable
        // last part and the close's made two. A close that fails is the copy's failure.
        super::commit_as(tx, redb::Durability::None)?;
        db.close().map_err(map_err)?;
        // A copy smaller than `RETURN_MEMORY_EVERY` leaves less than that freed, which the
        // next one reuses: handing it back would only have it faulted in again.
        if stats.bytes >= RETURN_MEMORY_EVERY {
            return_freed_memory();
        }
        Ok((stats, synced))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table's digest is the same number whether its CRC is taken row by row or over the
    /// batches a copy sends and a check reads back, wherever the batches break.
    #[test]
    fn a_digest_taken_per_batch_equals_one_taken_per_row() {
        let mut seed = 7u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let rows: Vec<(Vec<u8>, Vec<u8>)> = (0..5000)
            .map(|i| {
                let k = (i as u64).to_be_bytes().to_vec();
                let v = vec![(next() % 251) as u8; (next() % 300) as usize];
                (k, v)
            })
            .collect();
        let mut per_row = TableDigest::new("t");
        let mut batched = DigestRows::new("t");
        for (k, v) in &rows {
            per_row.add(k, v);
            batched.add(k, v);
        }
        assert_eq!(batched.finish(), per_row);
        // Batches as a copy cuts them, at arbitrary sizes.
        for cut in [1, 17, 4096, COPY_BATCH_BYTES] {
            let mut d = TableDigest::new("t");
            let mut buf = Vec::new();
            for (k, v) in &rows {
                d.count(k, v);
                put_row(&mut buf, k, v);
                if buf.len() >= cut {
                    d.add_rows(&buf);
                    buf.clear();
                }
            }
            d.add_rows(&buf);
            assert_eq!(d, per_row, "batches of {cut} bytes");
        }
        let empty = DigestRows::new("t").finish();
        assert_eq!(empty, TableDigest::new("t"));
    }
}
