//! Write transactions: the four primitives every change goes through (`set_inode_record`,
//! `set_dirent`, `set_filemap`, `set_orphan`) and the accessors built on them.
//!
//! Invariant kept here: each primitive records its change for the write-ahead log, keeps the
//! usage counts in step, and (history on) captures the key's value before the transaction's
//! first change to it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use redb::{ReadableTable, ReadableTableMetadata};

use super::read::{DirEntry, get_inode_in, list_in, lookup_in, meta_u64_in, orphans_in};
use super::redo::{Redo, redo_del, redo_put};
use super::schema::*;
use super::{Store, StoreError, Usage, corrupt, map_err};

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

/// What `set_inode_record` writes.
pub(super) enum InodeRecord<'a> {
    /// These fields, with the inline chunk the stored record holds (if any).
    Fields(&'a Inode),
    /// This encoded record, whole (a before-image restored, an inline chunk changed).
    Encoded(&'a [u8]),
}

/// Before-images captured while history is on (the history record is built from them).
#[derive(Default)]
pub(super) struct Capture {
    pub(super) undo: Vec<Undo>,
    pub(super) seen: std::collections::HashSet<(u8, u64, u64, String)>,
}

/// The net change this transaction makes to the usage counts, added to `meta` at commit.
#[derive(Default)]
pub(super) struct UsageDelta {
    pub(super) files: i64,
    pub(super) dirs: i64,
    pub(super) content_bytes: i64,
}

/// A write transaction. Dropping it without `commit` rolls everything back.
///
/// Every change goes through four primitives (`set_inode`, `set_dirent`, `set_filemap`,
/// `set_orphan`); with history on, each captures the key's value before the transaction's
/// first change to it, and the record of those before-images is appended at commit.
pub struct WriteTxn<'s> {
    /// Its place in a batch, for a joined write (`Store::write_joined_by`). Declared before
    /// `tx`, so dropping the transaction abandons the batch before redb's write lock goes.
    pub(super) joined: Option<super::batch::Joined<'s>>,
    /// The redb transaction, with the tables it has opened (each once).
    pub(super) tx: super::tables::Tx,
    pub(super) store: &'s Store,
    /// Every put and remove so far, encoded for the write-ahead log (`redo_put`), until it
    /// outgrows `Store::record_limit` (the commit is then a checkpoint).
    pub(super) redo: Redo,
    pub(super) usage: UsageDelta,
    pub(super) capture: Option<Capture>,
    pub(super) info: Option<OpInfo>,
    /// Content bytes this transaction adds, for the free-space check at commit.
    pub(super) written: u64,
    /// Net change of each blob's reference count, written once at commit: a change that
    /// takes a reference and gives one back (a rewrite or unlink whose old blob history keeps)
    /// leaves the blobrefs table untouched, and that is pages an fsync need not write.
    pub(super) ref_deltas: BTreeMap<u64, i64>,
    /// Blobs created by this transaction (their count starts at 0, not at the implicit 1):
    /// ascending, disjoint ranges, adjacent ones merged.
    pub(super) new_blobs: Vec<std::ops::Range<u64>>,
    /// Bookkeeping steps taken so far (see `Store::commit_work`).
    pub(super) steps: std::cell::Cell<u64>,
    /// The per-directory rows this transaction changed (see `subtree`).
    pub(super) agg: super::subtree::Pending,
    /// The first inode number this transaction handed out: inodes from it on did not exist
    /// before, and history's index leaves their keys out (see `history::index_entries`).
    pub(super) new_inos_from: std::cell::Cell<Option<u64>>,
    /// The name of a process read before the transaction began (`Store::write_by`): (pid,
    /// name), taken by the history record of an operation of that pid.
    pub(super) comm: Option<(u32, String)>,
}

impl Store {
    /// Begins a write transaction, waiting for any other writer to finish. Refused on a
    /// store opened read-only or frozen.
    pub fn write(&self) -> Result<WriteTxn<'_>, StoreError> {
        if self.frozen().is_some() {
            return Err(StoreError::ReadOnly);
        }
        self.write_any()
    }

    /// `write`, for an operation of process `pid`: with history on, the process's name for
    /// the history record is read from /proc before the write lock is taken, not while every
    /// other writer waits for it.
    pub fn write_by(&self, pid: u32) -> Result<WriteTxn<'_>, StoreError> {
        self.write_by_named(pid, None)
    }

    /// `write_by`, with the process's name when the caller already read it from /proc (in
    /// the same request or an earlier one of that pid, while it waited for the reply); only
    /// `None` reads it.
    pub fn write_by_named(
        &self,
        pid: u32,
        name: Option<String>,
    ) -> Result<WriteTxn<'_>, StoreError> {
        let comm = (pid != 0 && self.history_on())
            .then(|| (pid, name.unwrap_or_else(|| self.process_name(pid))));
        let mut w = self.write()?;
        w.comm = comm;
        Ok(w)
    }

    /// `write_by_named`, for an operation that may share its redb transaction and commit
    /// with operations of other threads (see `batch`): it joins the batch left open for it,
    /// or begins one. Its commit may fail with `StoreError::Retry` (another operation of the
    /// batch failed; nothing of it was committed), when the operation must run again with a
    /// write of its own (`write_by_named`). Before the write-ahead log runs, the same as
    /// `write_by_named`.
    pub fn write_joined_by(
        &self,
        pid: u32,
        name: Option<String>,
    ) -> Result<WriteTxn<'_>, StoreError> {
        if !matches!(self.wal.get(), Some(Some(_))) {
            return self.write_by_named(pid, name);
        }
        if self.frozen().is_some() {
            return Err(StoreError::ReadOnly);
        }
        let comm = (pid != 0 && self.history_on())
            .then(|| (pid, name.unwrap_or_else(|| self.process_name(pid))));
        let (tx, joined) = self.join()?;
        let mut w = self.write_over(tx);
        w.joined = Some(joined);
        w.comm = comm;
        Ok(w)
    }

    /// `write`, on a frozen store too: a checkpoint changes nothing the store holds.
    pub(super) fn write_any(&self) -> Result<WriteTxn<'_>, StoreError> {
        let tx = self.begin_tx()?;
        Ok(self.write_over(tx))
    }

    /// Counts the time from now until it is dropped as time the write transaction was held
    /// (`CommitStats::writer_busy_ns`): made just after a redb transaction's begin, dropped
    /// after its commit (`begin_tx`'s, through `Tx`; a follower's batches, directly).
    pub(super) fn writer_held(&self) -> super::tables::Held {
        super::tables::Held::new(self.writer_busy_ns.clone())
    }

    /// A redb write transaction, waiting for any other writer to finish.
    pub(super) fn begin_tx(&self) -> Result<super::tables::Tx, StoreError> {
        let tx = self.writable_db()?.begin_write().map_err(|e| {
            let e = map_err(e);
            // An I/O error inside an earlier transaction (not only at its commit: redb may
            // write and sync pages while a large one runs) leaves redb refusing every write.
            if matches!(e, StoreError::Io(_)) && !self.failed.swap(true, Ordering::AcqRel) {
                tracing::error!(error = %e, "the store refuses writes after an I/O error; restart the daemon (redbfs unmount, then mount)");
            }
            e
        })?;
        Ok(super::tables::Tx::timed(tx, self.writer_held()))
    }

    /// A write transaction of this store over `tx`, with nothing done yet.
    fn write_over(&self, tx: super::tables::Tx) -> WriteTxn<'_> {
        WriteTxn {
            joined: None,
            tx,
            store: self,
            redo: Redo::new(self.record_limit()),
            usage: UsageDelta::default(),
            capture: self.history_on().then(Capture::default),
            info: None,
            written: 0,
            ref_deltas: BTreeMap::new(),
            new_blobs: Vec::new(),
            steps: std::cell::Cell::new(0),
            agg: Default::default(),
            new_inos_from: std::cell::Cell::new(None),
            comm: None,
        }
    }

    /// Bookkeeping steps every committed write transaction took, in total: one per table
    /// read or write and per step of the loops that run over a transaction's changes at
    /// commit. Tests compare it across transaction sizes to show the work per entry stays
    /// flat as a transaction grows.
    pub fn commit_work(&self) -> u64 {
        self.commit_steps.load(Ordering::Relaxed)
    }
}

impl WriteTxn<'_> {
    /// Counts `n` bookkeeping steps (see `Store::commit_work`).
    pub(super) fn step(&self, n: u64) {
        self.steps.set(self.steps.get() + n);
    }

    pub(super) fn table_len_inodes(&self) -> Result<u64, StoreError> {
        self.tx
            .open_table(INODES)
            .map_err(map_err)?
            .len()
            .map_err(map_err)
    }

    fn first_touch(&mut self, tag: u8, a: u64, b: u64, name: &str) -> bool {
        match &mut self.capture {
            Some(c) => c.seen.insert((tag, a, b, name.to_string())),
            None => false,
        }
    }

    pub fn inode(&self, ino: u64) -> Result<Option<Inode>, StoreError> {
        get_inode_in(&*self.tx.open_table(INODES).map_err(map_err)?, ino)
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Result<Option<(u64, Kind)>, StoreError> {
        lookup_in(
            &*self.tx.open_table(DIRENTS).map_err(map_err)?,
            parent,
            name,
        )
    }

    /// Calls `f` with a reader of inode records (`None` for a missing or unreadable one) over
    /// one opening of the table, for walks that read many: a path up to the root reads an
    /// inode per level, and each `inode` call opens the table afresh.
    pub fn with_inodes<R>(
        &self,
        f: impl FnOnce(&dyn Fn(u64) -> Option<Inode>) -> R,
    ) -> Result<R, StoreError> {
        let t = self.tx.open_table(INODES).map_err(map_err)?;
        Ok(f(&|ino| get_inode_in(&*t, ino).ok().flatten()))
    }

    /// Up to `limit` entries of directory `parent`, in name order.
    pub fn list(&self, parent: u64, limit: usize) -> Result<Vec<DirEntry>, StoreError> {
        list_in(
            &*self.tx.open_table(DIRENTS).map_err(map_err)?,
            parent,
            limit,
        )
    }

    pub(super) fn next_counter(&self, key: &str) -> Result<u64, StoreError> {
        self.next_counters(key, 1)
    }

    /// Takes `count` consecutive values of the counter `key`; returns the first.
    pub(super) fn next_counters(&self, key: &str, count: u64) -> Result<u64, StoreError> {
        let mut meta = self.tx.open_table(META).map_err(map_err)?;
        let n = meta_u64_in(&*meta, key)?
            .ok_or_else(|| StoreError::Corrupt(format!("meta {key} missing")))?;
        let bytes = (n + count).to_le_bytes();
        meta.insert(key, bytes.as_slice()).map_err(map_err)?;
        redo_put(&self.redo, META, &key, &bytes.as_slice());
        Ok(n)
    }

    /// A fresh inode number, never used before in this store.
    pub fn alloc_ino(&self) -> Result<u64, StoreError> {
        let ino = self.next_counter(META_NEXT_INO)?;
        if self.new_inos_from.get().is_none() {
            self.new_inos_from.set(Some(ino));
        }
        Ok(ino)
    }

    // ---- the four primitives ----

    /// Sets or removes an inode record, keeping the usage counters in step. The file's chunk
    /// 0, when its record holds it (`set_inline`), stays there.
    pub fn set_inode(&mut self, ino: u64, new: Option<&Inode>) -> Result<(), StoreError> {
        self.set_inode_record(ino, new.map(InodeRecord::Fields))
    }

    /// Sets or removes an inode record: the one primitive every inode change goes through.
    pub(super) fn set_inode_record(
        &mut self,
        ino: u64,
        new: Option<InodeRecord<'_>>,
    ) -> Result<(), StoreError> {
        self.step(1);
        let mut t = self.tx.open_table(INODES).map_err(map_err)?;
        let old_bytes = t.get(ino).map_err(map_err)?.map(|v| v.value().to_vec());
        let old = match &old_bytes {
            Some(b) => Some(Inode::decode(ino, b).ok_or_else(|| corrupt("record", ino))?),
            None => None,
        };
        let new_bytes = match new {
            Some(InodeRecord::Fields(n)) => {
                Some(n.encode_with(old_bytes.as_deref().and_then(inline_part)))
            }
            Some(InodeRecord::Encoded(b)) => Some(b.to_vec()),
            None => None,
        };
        let new = match &new_bytes {
            Some(b) => Some(Inode::decode(ino, b).ok_or_else(|| corrupt("record", ino))?),
            None => None,
        };
        match &new_bytes {
            Some(bytes) => {
                t.insert(ino, bytes.as_slice()).map_err(map_err)?;
                redo_put(&self.redo, INODES, &ino, &bytes.as_slice());
            }
            None => {
                t.remove(ino).map_err(map_err)?;
                redo_del(&self.redo, INODES, &ino);
            }
        }
        drop(t);
        self.track_inode(ino, old.as_ref(), new.as_ref())?;
        for (i, sign) in [(old.as_ref(), -1i64), (new.as_ref(), 1)] {
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

    /// Puts chunk 0 of file `ino` in its inode record (`data` at most `INLINE_MAX` bytes), or
    /// takes it out (None); whether the record changed. The inode must exist.
    pub(super) fn set_inline(&mut self, ino: u64, data: Option<&[u8]>) -> Result<bool, StoreError> {
        let old_bytes = {
            let t = self.tx.open_table(INODES).map_err(map_err)?;
            t.get(ino).map_err(map_err)?.map(|v| v.value().to_vec())
        };
        let Some(old_bytes) = old_bytes else {
            if data.is_none() {
                return Ok(false);
            }
            return Err(StoreError::Corrupt(format!(
                "content written to missing inode {ino}"
            )));
        };
        let inode = Inode::decode(ino, &old_bytes).ok_or_else(|| corrupt("record", ino))?;
        if data.is_none() && inline_part(&old_bytes).is_none() {
            return Ok(false);
        }
        let bytes = inode.encode_with(data.map(encode_inline).as_deref());
        if bytes == old_bytes {
            return Ok(false);
        }
        self.set_inode_record(ino, Some(InodeRecord::Encoded(&bytes)))?;
        Ok(true)
    }

    /// Sets or removes a directory entry.
    pub fn set_dirent(
        &mut self,
        parent: u64,
        name: &str,
        new: Option<(u64, Kind)>,
    ) -> Result<(), StoreError> {
        self.step(1);
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
        self.step(1);
        let mut t = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let old = match new {
            Some(b) => t.insert((ino, idx), b),
            None => t.remove((ino, idx)),
        }
        .map_err(map_err)?
        .map(|v| v.value());
        drop(t);
        if old == new {
            // Nothing changed (a small file's content going inline removes a row that was
            // never there): nothing for the log to replay.
            return Ok(());
        }
        match new {
            Some(b) => redo_put(&self.redo, FILEMAP, &(ino, idx), &b),
            None => redo_del(&self.redo, FILEMAP, &(ino, idx)),
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
        self.step(1);
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

    pub fn add_orphan(&mut self, ino: u64) -> Result<(), StoreError> {
        self.set_orphan(ino, true)
    }

    pub fn orphans(&self) -> Result<Vec<u64>, StoreError> {
        orphans_in(&*self.tx.open_table(ORPHANS).map_err(map_err)?)
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

    /// A `meta` value as this transaction sees it.
    pub fn meta_bytes(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let t = self.tx.open_table(META).map_err(map_err)?;
        Ok(t.get(key).map_err(map_err)?.map(|v| v.value().to_vec()))
    }

    /// Removes a `meta` key; whether it was there.
    pub fn remove_meta(&self, key: &str) -> Result<bool, StoreError> {
        let mut t = self.tx.open_table(META).map_err(map_err)?;
        let was = t.remove(key).map_err(map_err)?.is_some();
        if was {
            redo_del(&self.redo, META, &key);
        }
        Ok(was)
    }

    pub fn usage(&self) -> Result<Usage, StoreError> {
        let meta = self.tx.open_table(META).map_err(map_err)?;
        let get = |k| meta_u64_in(&*meta, k).map(|v| v.unwrap_or(0));
        let apply = |base: u64, d: i64| base.saturating_add_signed(d);
        Ok(Usage {
            files: apply(get(META_FILES)?, self.usage.files),
            dirs: apply(get(META_DIRS)?, self.usage.dirs),
            content_bytes: apply(get(META_CONTENT_BYTES)?, self.usage.content_bytes),
        })
    }
}
