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
}

impl ReadTxn {
    pub(super) fn new(tx: redb::ReadTransaction) -> ReadTxn {
        ReadTxn { tx }
    }

    /// Calls `f` on the stored bytes of every entry of `def`, in key order; with `sums` (the
    /// check of a copy), the table is summed up on the way unless it was already. A scan that
    /// stops early (an error) leaves no sum.
    pub(super) fn scan_raw<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: redb::TableDefinition<K, V>,
        sums: Option<&mut super::TableSums>,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        use redb::TableHandle;
        let raw =
            redb::TableDefinition::<super::copy::Raw<K>, super::copy::Raw<V>>::new(def.name());
        let t = self.tx.open_table(raw).map_err(map_err)?;
        let mut sum = sums.as_ref().and_then(|s| s.start(def.name()));
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (k, v) = (k.value(), v.value());
            if let Some(sum) = &mut sum {
                sum.add(k, v);
            }
            f(k, v)?;
        }
        if let (Some(sum), Some(sums)) = (sum, sums) {
            sums.keep(sum);
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

    /// At most `limit` entries of directory `parent` after the name `after` (from its first
    /// with None), in name order: a listing read a page at a time, whatever its length.
    pub fn list_after(
        &self,
        parent: u64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DirEntry>, StoreError> {
        use std::ops::Bound;
        let t = self.tx.open_table(DIRENTS).map_err(map_err)?;
        let from = match after {
            Some(name) => Bound::Excluded((parent, name)),
            None => Bound::Included((parent, "")),
        };
        let mut out = Vec::new();
        for item in t
            .range::<(u64, &str)>((from, Bound::Excluded((parent + 1, ""))))
            .map_err(map_err)?
        {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item.map_err(map_err)?;
            let (ino, kind) = v.value();
            out.push(DirEntry {
                name: k.value().1.to_string(),
                ino,
                kind: Kind::from_byte(kind).ok_or_else(|| corrupt("dirent kind", ino))?,
            });
        }
        Ok(out)
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

    /// `orphans`, read as `scan_raw` reads (for check, summed up with `sums`).
    pub fn orphans_summed(
        &self,
        sums: Option<&mut super::TableSums>,
    ) -> Result<Vec<u64>, StoreError> {
        let mut out = Vec::new();
        self.scan_raw(ORPHANS, sums, |k, _| {
            out.push(<u64 as redb::Value>::from_bytes(k));
            Ok(())
        })?;
        Ok(out)
    }

    /// How many inode records the store holds (redb keeps the count: nothing is read).
    pub fn inode_count(&self) -> Result<u64, StoreError> {
        use redb::ReadableTableMetadata;
        self.tx
            .open_table(INODES)
            .map_err(map_err)?
            .len()
            .map_err(map_err)
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
    /// it does not match its checksum, else `Some(Some(length))` (0 when redacted). With
    /// `sums`, the table's sum is taken on the way (`scan_raw`).
    pub fn for_each_inode(
        &self,
        sums: Option<&mut super::TableSums>,
        mut f: impl FnMut(Inode, &str, Option<Option<u64>>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.scan_raw(INODES, sums, |k, raw| {
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
    /// (for check; with `sums`, the table's sum is taken on the way).
    pub fn for_each_dirent(
        &self,
        sums: Option<&mut super::TableSums>,
        mut f: impl FnMut(u64, &str, u64, Kind) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        self.scan_raw(DIRENTS, sums, |k, v| {
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
