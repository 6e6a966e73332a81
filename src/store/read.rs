//! Read transactions and the schema's accessors they share with write transactions (inodes,
//! directory entries, orphans, meta counters, usage).
//!
//! Invariant kept here: a `ReadTxn` is one consistent snapshot; it never waits for a writer
//! and never sees part of a commit.

use redb::{ReadableDatabase, ReadableTable};

use super::schema::*;
use super::{Engine, Store, StoreError, Usage, corrupt, map_err};

// Reads shared by read and write transactions, over whichever table handle they hold.

pub(super) fn get_inode_in(
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

pub(super) fn lookup_in(
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

pub(super) fn list_in(
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

pub(super) fn meta_u64_in(
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

pub(super) fn orphans_in(t: &impl ReadableTable<u64, ()>) -> Result<Vec<u64>, StoreError> {
    let mut out = Vec::new();
    for item in t.iter().map_err(map_err)? {
        out.push(item.map_err(map_err)?.0.value());
    }
    Ok(out)
}

/// A read-only snapshot of the store.
pub struct ReadTxn {
    pub(super) tx: redb::ReadTransaction,
    /// The sums (`TableDigest`) of the tables scanned whole so far, once `sum_tables_as_read`
    /// asked for them: `table_digests` takes them from here instead of reading those tables
    /// again.
    pub(super) sums: std::sync::Mutex<Option<Vec<super::TableDigest>>>,
}

impl ReadTxn {
    pub(super) fn new(tx: redb::ReadTransaction) -> ReadTxn {
        ReadTxn {
            tx,
            sums: std::sync::Mutex::new(None),
        }
    }

    /// From now on, the scans that read a table whole in key order (the inodes and the
    /// directory entries, as `check` reads them) sum it up as they go, as `table_digests`
    /// would, which then reads only the tables not summed yet.
    pub fn sum_tables_as_read(&self) {
        *self.sums.lock().unwrap_or_else(|p| p.into_inner()) = Some(Vec::new());
    }

    /// The sum of table `name` taken by a scan, if one was.
    pub(super) fn sum_taken(&self, name: &str) -> Option<super::TableDigest> {
        let sums = self.sums.lock().unwrap_or_else(|p| p.into_inner());
        sums.as_ref()?.iter().find(|d| d.name == name).cloned()
    }

    /// Calls `f` on the stored bytes of every entry of `def`, in key order; summed up on the
    /// way when sums are asked for (`sum_tables_as_read`) and the table has none yet. A scan
    /// that stops early (an error) leaves no sum.
    pub(super) fn scan_raw<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<K, V>,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        let raw =
            redb::TableDefinition::<super::copy::Raw<K>, super::copy::Raw<V>>::new(def.name());
        let t = self.tx.open_table(raw).map_err(map_err)?;
        let summing = self
            .sums
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|s| s.iter().all(|d| d.name != def.name()));
        let mut sum = summing.then(|| super::copy::DigestRows::new(def.name()));
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (k, v) = (k.value(), v.value());
            if let Some(sum) = &mut sum {
                sum.add(k, v);
            }
            f(k, v)?;
        }
        if let Some(sum) = sum
            && let Some(sums) = self.sums.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
        {
            sums.push(sum.finish());
        }
        Ok(())
    }
}

impl Store {
    /// Begins a read transaction: a consistent snapshot that never waits for a writer.
    pub fn read(&self) -> Result<ReadTxn, StoreError> {
        let tx = match &self.db {
            Engine::Writable(db) => db.begin_read(),
            Engine::ReadOnly(db) => db.begin_read(),
        };
        Ok(ReadTxn::new(tx.map_err(map_err)?))
    }
}

impl ReadTxn {
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

    /// Calls `f` on every inode record, in inode order, one at a time (for check), with
    /// its name (the `Inode`'s own is left empty: the record is decoded once, without
    /// allocating) and its inline chunk: None when the record holds none, `Some(None)` when
    /// it does not match its checksum, else `Some(Some(length))` (0 when redacted).
    pub fn for_each_inode(
        &self,
        mut f: impl FnMut(Inode, &str, Option<Option<u64>>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.scan_raw(INODES, |k, raw| {
            let ino = <u64 as redb::Value>::from_bytes(k);
            let (inode, name, inline) =
                decode_with_inline(ino, raw).ok_or_else(|| corrupt("record", ino))?;
            let inline = inline.map(|c| match c {
                InlineChunk::Content(d) => Some(d.len() as u64),
                InlineChunk::Redacted => Some(0),
                InlineChunk::Damaged => None,
            });
            f(inode, name, inline)
        })
    }

    /// Calls `f` on every dirent as (parent, name, child, kind), in key order, one at a time
    /// (for check).
    pub fn for_each_dirent(
        &self,
        mut f: impl FnMut(u64, &str, u64, Kind) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.scan_raw(DIRENTS, |k, v| {
            let (parent, name) = <(u64, &str) as redb::Value>::from_bytes(k);
            let (ino, kind) = <(u64, u8) as redb::Value>::from_bytes(v);
            let kind = Kind::from_byte(kind).ok_or_else(|| corrupt("dirent kind", ino))?;
            f(parent, name, ino, kind)
        })
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
}
