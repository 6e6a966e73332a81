//! Opening a store: creating it, verifying (or migrating) its format, applying what its
//! write-ahead log holds beyond the last checkpoint, and closing it with a final checkpoint.
//!
//! Invariant kept here: nothing commits before recovery has applied the log, and the log is
//! removed only after a checkpoint that covers every record in it succeeded.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use redb::{Database, ReadableTable};

use super::redo::replay;
use super::schema::*;
use super::{
    CACHE_BYTES, Engine, Store, StoreError, Sync, disk, fault, map_err, now_ns, schema, sim, wal,
};

impl Store {
    /// Opens the store at `path`, creating it (with an empty root directory owned by
    /// `root_owner`) when the file does not exist.
    pub fn open_or_create(path: &Path, root_owner: (u32, u32)) -> Result<Store, StoreError> {
        Store::open_on(disk::Disk::Host, path, root_owner)
    }

    /// `open_or_create` for a store that is written once and closed (`snapshot --path`'s):
    /// with the small cache of a copy (`COPY_CACHE_BYTES`), not a mounted store's, so
    /// writing it inside the daemon adds about a MiB to the daemon's memory, not 32.
    pub fn create_for_copy(path: &Path, root_owner: (u32, u32)) -> Result<Store, StoreError> {
        Store::open_with_cache(
            disk::Disk::Host,
            path,
            root_owner,
            super::copy::COPY_CACHE_BYTES,
        )
    }

    /// `open_or_create` on `disk`: the power-cut tests open stores on a simulated disk.
    #[doc(hidden)]
    pub fn open_on(
        disk: disk::Disk,
        path: &Path,
        root_owner: (u32, u32),
    ) -> Result<Store, StoreError> {
        // Bounds the daemon's memory: the store's hot pages, not the whole file.
        Store::open_with_cache(disk, path, root_owner, CACHE_BYTES)
    }

    fn open_with_cache(
        disk: disk::Disk,
        path: &Path,
        root_owner: (u32, u32),
        cache_bytes: usize,
    ) -> Result<Store, StoreError> {
        crate::private::check_store_dir(path).map_err(StoreError::Refused)?;
        let exists = disk.exists(path);
        let mut builder = Database::builder();
        builder.set_cache_size(cache_bytes);
        let repaired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = repaired.clone();
        builder.set_repair_callback(move |_| flag.store(true, Ordering::Relaxed));
        let faults = (std::env::var("REDBFS_FAULT_INJECTION").as_deref() == Ok("1"))
            .then(|| std::sync::Arc::new(fault::FaultPlan::default()));
        let db = Store::open_db(&builder, &disk, path, exists, faults.as_ref())?;
        if repaired.load(Ordering::Relaxed) {
            tracing::warn!(
                store = %path.display(),
                "the store was not closed cleanly (a crash or a kill): redb verified it and rolled back to its last durable commit"
            );
        }
        let store = Store::over(Engine::Writable(db), faults, disk, path);
        // Before anything commits: the first commit starts a new log.
        store.recover()?;
        // Judged before a migration or the formatting of a new store commits.
        let stale = store.subtree_stale()?;
        store.init_or_verify(root_owner)?;
        if stale {
            store.build_subtree()?;
        }
        Ok(store)
    }

    /// A store over an opened database, before recovery and the format check.
    pub(super) fn over(
        db: Engine,
        faults: Option<std::sync::Arc<fault::FaultPlan>>,
        disk: disk::Disk,
        path: &Path,
    ) -> Store {
        Store {
            db,
            faults,
            disk,
            path: path.to_path_buf(),
            commits: AtomicU64::new(0),
            wal: OnceLock::new(),
            keep_history_ns: AtomicU64::new(0),
            disk_free: AtomicU64::new(u64::MAX),
            history_budget: AtomicU64::new(0),
            history_estimate: AtomicU64::new(0),
            history_measure_above: AtomicU64::new(0),
            history_oldest: std::sync::atomic::AtomicI64::new(i64::MIN),
            commit_steps: AtomicU64::new(0),
            durable_commits: AtomicU64::new(0),
            preflush: OnceLock::new(),
            preflushing: Default::default(),
            failed: std::sync::atomic::AtomicBool::new(false),
            feeds: OnceLock::new(),
            frozen: Mutex::new(None),
            before_batch: Mutex::new(None),
            batch_seq: AtomicU64::new(0),
            subtree_work: AtomicU64::new(0),
            batches: Default::default(),
            numbered_commits: AtomicU64::new(0),
            redb_commits: AtomicU64::new(0),
            quota_held: AtomicU64::new(0),
            writer_busy_ns: Default::default(),
            opened: std::time::Instant::now(),
        }
    }

    /// Opens the redb database at `path`: on the simulated disk, through the backend that
    /// injects faults, or as a plain file (created private when it does not exist yet).
    fn open_db(
        builder: &redb::Builder,
        disk: &disk::Disk,
        path: &Path,
        exists: bool,
        faults: Option<&std::sync::Arc<fault::FaultPlan>>,
    ) -> Result<Database, StoreError> {
        let opened = if let disk::Disk::Sim(sim) = disk {
            let file = sim
                .open(path, true)
                .map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?;
            builder.create_with_backend(sim::SimBackend(file))
        } else if let Some(plan) = faults {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?;
            let inner = redb::backends::FileBackend::new(file).map_err(map_err)?;
            builder.create_with_backend(fault::FaultyBackend {
                inner,
                plan: plan.clone(),
            })
        } else if exists {
            builder.open(path)
        } else {
            // Created here, mode 0600 and O_EXCL|O_NOFOLLOW, so the file is private from its
            // first byte whatever the umask; redb then formats it.
            let file = crate::private::create_new(path)
                .map_err(|e| StoreError::Refused(crate::private::describe(path, e)))?;
            redb::backends::FileBackend::new(file).and_then(|b| builder.create_with_backend(b))
        };
        opened.map_err(|e| match map_err(e) {
            StoreError::AlreadyOpen(_) => StoreError::AlreadyOpen(path.to_path_buf()),
            other => other,
        })
    }

    /// Opens an existing store; refuses a missing file.
    pub fn open_existing(path: &Path) -> Result<Store, StoreError> {
        Store::open_existing_on(disk::Disk::Host, path)
    }

    /// `open_existing` on `disk` (see `open_on`).
    #[doc(hidden)]
    pub fn open_existing_on(disk: disk::Disk, path: &Path) -> Result<Store, StoreError> {
        if !disk.exists(path) {
            return Err(StoreError::Io(format!("{}: no such store", path.display())));
        }
        Store::open_on(disk, path, (0, 0))
    }

    /// Migrates a format-2 store: every blob gets its checksum, in one durable transaction.
    fn add_checksums(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        let mut n = 0u64;
        {
            let mut blobs = w.tx.open_table(BLOBS).map_err(map_err)?;
            let ids: Vec<u64> = blobs
                .iter()
                .map_err(map_err)?
                .map(|item| item.map(|(k, _)| k.value()).map_err(map_err))
                .collect::<Result<_, _>>()?;
            for id in ids {
                let raw = match blobs.get(id).map_err(map_err)? {
                    // Redacted blobs stay empty.
                    Some(v) if !v.value().is_empty() => schema::encode_blob(v.value()),
                    _ => continue,
                };
                blobs.insert(id, raw.as_slice()).map_err(map_err)?;
                n += 1;
            }
        }
        w.put_meta(
            META_FORMAT,
            &(schema::FORMAT_WITHOUT_HISTORY_INDEXES as u64).to_le_bytes(),
        )?;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), chunks = n, "store format 2 migrated to 3: every content chunk now has a checksum");
        Ok(())
    }

    /// Migrates a format-3 store: history's indexes are built from the history table, in
    /// one durable transaction (linear in the records).
    fn build_history_indexes(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        let n = w.index_all_history()?;
        w.put_meta(
            META_FORMAT,
            &(schema::FORMAT_WITHOUT_INLINE as u64).to_le_bytes(),
        )?;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), records = n, "store format 3 migrated to 4: history is indexed by key, path and time");
        Ok(())
    }

    /// Migrates a format-4 store: every file whose chunk 0 fits `INLINE_MAX` gets it in its
    /// inode record and its blob released, in one durable transaction (linear in the files).
    /// A file whose record or chunk 0 history holds before-images of keeps its blob: a point
    /// of history reads a key's value now when no record after it changed the key, so moving
    /// content under a key some record names could show a past without it.
    fn inline_small_files(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        // A follower's store stays as its writer's records build it: a record that repoints
        // a chunk 0 its writer keeps in a blob must not meet the same chunk held inline.
        let n = if w.meta_bytes(META_FOLLOWED)?.is_some() {
            0
        } else {
            w.inline_small_chunks()?
        };
        w.put_meta(META_FORMAT, &(schema::FORMAT_5 as u64).to_le_bytes())?;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), files = n, "store format 4 migrated to 5: small files' content moved into their inode records");
        Ok(())
    }

    /// Migrates a format-5 store: the (empty) tables of delta blobs and of history records'
    /// undo parts are made. Every blob stays full until history keeps a later version of it,
    /// and the records already kept stay whole (version 1, read as they are); new ones are
    /// split.
    fn add_format_6_tables(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        w.tx.open_table(DELTAS).map_err(map_err)?;
        w.tx.open_table(BLOB_DELTAS).map_err(map_err)?;
        w.tx.open_table(HISTORY_UNDO).map_err(map_err)?;
        w.put_meta(META_FORMAT, &(schema::FORMAT_6 as u64).to_le_bytes())?;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), "store format 5 migrated to 6: earlier versions may be kept as deltas, and new history records keep their undo entries in parts of bounded size");
        Ok(())
    }

    /// Migrates a format-6 store: only its number changes (see `schema::FORMAT_6`).
    fn stamp_format_7(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        // The marks there are, summed up once (`META_MARKED`).
        if let Some(m) = w.marked()? {
            w.put_meta(META_MARKED, &m.to_le_bytes())?;
        }
        w.put_meta(META_FORMAT, &(schema::FORMAT_7 as u64).to_le_bytes())?;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), "store format 6 migrated to 7: new history records are written compactly, which earlier releases cannot read");
        Ok(())
    }

    /// Migrates a format-7 store: only its number changes (see `schema::FORMAT_7`).
    fn stamp_format_8(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        w.put_meta(META_FORMAT, &(schema::FORMAT_8 as u64).to_le_bytes())?;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), "store format 7 migrated to 8: inode and directory usage records are written compactly, which earlier releases cannot read");
        Ok(())
    }

    /// Migrates a format-8 store: the rows of `history_paths` and `history_times` move into
    /// `history_keys` (see `schema::FORMAT_8`), in one durable transaction (linear in the
    /// records): a crash leaves the store as it was, or migrated.
    fn merge_history_indexes(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        let n = w.merge_history_indexes()?;
        w.put_meta(META_FORMAT, &(FORMAT_VERSION as u64).to_le_bytes())?;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), rows = n, "store format 8 migrated to 9: history's path and time indexes are kept in its key index, so a commit writes one index table instead of three");
        Ok(())
    }

    fn init_or_verify(&self, root_owner: (u32, u32)) -> Result<(), StoreError> {
        let r = self.read()?;
        match r.meta_u64(META_FORMAT)? {
            Some(v) if v == FORMAT_VERSION as u64 => {
                let keep = r.meta_u64(META_KEEP_HISTORY)?.unwrap_or(0);
                self.keep_history_ns.store(keep, Ordering::Relaxed);
                return Ok(());
            }
            Some(v) if v == schema::FORMAT_WITHOUT_CHECKSUMS as u64 => {
                drop(r);
                self.add_checksums()?;
                return self.init_or_verify(root_owner);
            }
            Some(v) if v == schema::FORMAT_WITHOUT_HISTORY_INDEXES as u64 => {
                drop(r);
                self.build_history_indexes()?;
                return self.init_or_verify(root_owner);
            }
            Some(v) if v == schema::FORMAT_WITHOUT_INLINE as u64 => {
                drop(r);
                self.inline_small_files()?;
                return self.init_or_verify(root_owner);
            }
            Some(v) if v == schema::FORMAT_5 as u64 => {
                drop(r);
                self.add_format_6_tables()?;
                return self.init_or_verify(root_owner);
            }
            Some(v) if v == schema::FORMAT_6 as u64 => {
                drop(r);
                self.stamp_format_7()?;
                return self.init_or_verify(root_owner);
            }
            Some(v) if v == schema::FORMAT_7 as u64 => {
                drop(r);
                self.stamp_format_8()?;
                return self.init_or_verify(root_owner);
            }
            Some(v) if v == schema::FORMAT_8 as u64 => {
                drop(r);
                self.merge_history_indexes()?;
                return self.init_or_verify(root_owner);
            }
            Some(v) => {
                return Err(StoreError::UnknownFormat {
                    path: self.path.clone(),
                    found: v as u32,
                });
            }
            None => {}
        }
        drop(r);
        self.format(root_owner)
    }

    /// Formats a new store: the meta counters, every table, and the root directory.
    fn format(&self, root_owner: (u32, u32)) -> Result<(), StoreError> {
        let mut w = self.write()?;
        if w.table_len_inodes()? != 0 {
            return Err(StoreError::Corrupt(
                "inodes exist but no format version is recorded".into(),
            ));
        }
        let now = now_ns();
        for (key, value) in [
            (META_FORMAT, FORMAT_VERSION as u64),
            (META_NEXT_INO, ROOT_INO + 1),
            (META_NEXT_BLOB, 1),
            (META_CREATED, now as u64),
            (META_HISTORY_NEXT, 1),
        ] {
            w.put_meta(key, &value.to_le_bytes())?;
        }
        {
            let tx = &w.tx;
            // Create every table so read transactions never meet a missing one.
            tx.open_table(DIRENTS).map_err(map_err)?;
            tx.open_table(FILEMAP).map_err(map_err)?;
            tx.open_table(BLOBS).map_err(map_err)?;
            tx.open_table(ORPHANS).map_err(map_err)?;
            tx.open_table(BLOBREFS).map_err(map_err)?;
            tx.open_table(HISTORY).map_err(map_err)?;
            tx.open_table(HISTORY_UNDO).map_err(map_err)?;
            tx.open_table(MARKS).map_err(map_err)?;
            tx.open_table(REDACTED).map_err(map_err)?;
            tx.open_table(HISTORY_KEYS).map_err(map_err)?;
            tx.open_table(SUBTREE).map_err(map_err)?;
            tx.open_table(QUOTAS).map_err(map_err)?;
            tx.open_table(DELTAS).map_err(map_err)?;
            tx.open_table(BLOB_DELTAS).map_err(map_err)?;
        }
        w.put_inode(&Inode {
            ino: ROOT_INO,
            kind: Kind::Dir,
            perm: 0o755,
            uid: root_owner.0,
            gid: root_owner.1,
            size: 0,
            nlink: 2,
            parent: ROOT_INO,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            name: String::new(),
        })?;
        w.commit(Sync::Durable)
    }

    /// Applies what the log holds beyond the store's last durable commit (after a crash or a
    /// kill), durably, and removes the log.
    fn recover(&self) -> Result<(), StoreError> {
        let path = wal::path_of(&self.path);
        let r = self.read()?;
        let last = r.meta_u64(META_LOG_SEQ)?.unwrap_or(0);
        let id = r.meta_u64(META_LOG_ID)?.unwrap_or(0);
        drop(r);
        self.commits.store(last, Ordering::Release);
        if !self.disk.exists(&path) {
            return Ok(());
        }
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            let e = std::io::Error::from_raw_os_error(libc::ELOOP);
            return Err(StoreError::Refused(crate::private::describe(&path, e)));
        }
        let todo: Vec<(u64, Vec<u8>)> = if id == 0 {
            Vec::new()
        } else {
            wal::read(&self.disk, &path, id)?
                .into_iter()
                .filter(|(seq, _)| *seq > last)
                .collect()
        };
        if let Some((first, _)) = todo.first()
            && *first != last + 1
        {
            return Err(StoreError::Corrupt(format!(
                "{} begins at commit {first}, but the store's last durable commit is {last}",
                path.display()
            )));
        }
        if let Some((upto, _)) = todo.last() {
            let tx = self.writable_db()?.begin_write().map_err(map_err)?;
            for (_, payload) in &todo {
                replay(&tx, payload)?;
            }
            tx.open_table(META)
                .map_err(map_err)?
                .insert(META_LOG_SEQ, upto.to_le_bytes().as_slice())
                .map_err(map_err)?;
            super::commit_as(tx, redb::Durability::Immediate)?;
            self.commits.store(*upto, Ordering::Release);
            tracing::warn!(
                store = %self.path.display(),
                commits = todo.len(),
                "recovery: applied the commits the write-ahead log holds beyond the last checkpoint"
            );
        }
        // Every record is in the store now (or belongs to another session): the log is done.
        self.disk
            .remove(&path)
            .map_err(|e| StoreError::Io(format!("removing {}: {e}", path.display())))
    }

    /// Makes every commit durable in the store file itself and removes the log, so the file
    /// is complete on its own. Only when the store closes: later commits would go to the
    /// removed file.
    fn close_log(&self) -> Result<(), StoreError> {
        let Some(Some(wal)) = self.wal.get() else {
            return Ok(());
        };
        wal.check()?;
        if !self.checkpoint_is_last() {
            let mut w = self.write_any()?;
            w.without_history();
            w.commit_checkpoint()?;
        }
        wal.remove(&self.disk)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // After any failure the log stays: it is removed only by a checkpoint that succeeds,
        // so a page the kernel dropped after a failed fsync can be rebuilt from it.
        let healthy = matches!(self.wal.get(), Some(Some(_))) && !self.is_failed();
        if healthy && let Err(e) = self.close_log() {
            tracing::error!(error = %e, "the final checkpoint failed; the log stays and is applied at the next open");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of format 2 (content stored without checksums) is migrated when opened: every
    /// chunk gets its checksum and reads as before.
    #[test]
    fn a_format_2_store_gets_checksums_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        {
            let store = Store::open_or_create(&path, (0, 0)).unwrap();
            let mut w = store.write().unwrap();
            w.put_chunks(7, [(0, &data[..60_000]), (1, &data[60_000..])])
                .unwrap();
            w.commit(Sync::Durable).unwrap();
            // Back to format 2: the blobs hold their content alone.
            let w = store.write().unwrap();
            {
                let mut blobs = w.tx.open_table(BLOBS).unwrap();
                let raw: Vec<(u64, Vec<u8>)> = blobs
                    .iter()
                    .unwrap()
                    .map(|i| {
                        let (k, v) = i.unwrap();
                        (k.value(), schema::decode_blob(v.value()).unwrap().to_vec())
                    })
                    .collect();
                for (k, v) in raw {
                    blobs.insert(k, v.as_slice()).unwrap();
                }
            }
            w.put_meta(META_FORMAT, &2u64.to_le_bytes()).unwrap();
            w.commit(Sync::Durable).unwrap();
        }
        let store = Store::open_or_create(&path, (0, 0)).unwrap();
        let r = store.read().unwrap();
        assert_eq!(
            r.meta_u64(META_FORMAT).unwrap(),
            Some(FORMAT_VERSION as u64)
        );
        assert!(r.damaged_blobs().unwrap().is_empty());
        let got: Vec<u8> = r
            .chunks(7, 0, 2)
            .unwrap()
            .into_iter()
            .flat_map(|c| c.unwrap())
            .collect();
        assert_eq!(got, data);
    }

    /// A store of format 3 (history without its indexes) gets them built when opened: the
    /// indexes then agree with every record, and a past point reads through them.
    #[test]
    fn a_format_3_store_gets_history_indexes_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        {
            let store = Store::open_or_create(&path, (0, 0)).unwrap();
            store.set_keep_history(86_400 * 1_000_000_000).unwrap();
            for (i, text) in ["one", "two", "three"].iter().enumerate() {
                let mut w = store.write().unwrap();
                w.put_chunk(7, 0, text.as_bytes()).unwrap();
                w.describe(crate::store::OpInfo {
                    op: "write",
                    paths: vec![format!("/f{i}")],
                    ..Default::default()
                });
                w.commit(Sync::Durable).unwrap();
            }
            // Back to format 3: no indexes.
            let mut w = store.write().unwrap();
            w.without_history();
            w.tx.delete_table(HISTORY_TIMES).unwrap();
            w.tx.delete_table(HISTORY_PATHS).unwrap();
            w.tx.delete_table(HISTORY_KEYS).unwrap();
            w.put_meta(META_FORMAT, &3u64.to_le_bytes()).unwrap();
            w.commit(Sync::Durable).unwrap();
        }
        let store = Store::open_or_create(&path, (0, 0)).unwrap();
        let r = store.read().unwrap();
        assert_eq!(
            r.meta_u64(META_FORMAT).unwrap(),
            Some(FORMAT_VERSION as u64)
        );
        assert_eq!(r.history_index_findings().unwrap(), Vec::<String>::new());
        assert_eq!(r.last_seq().unwrap(), 3);
        let past = r.past(1).unwrap();
        let got = crate::store::TreeView::chunks(&past, 7, 0, 1).unwrap();
        assert_eq!(got[0].as_deref(), Some(&b"one"[..]));
        let log = r.history_of(Some("/f1"), None, usize::MAX).unwrap();
        assert_eq!(log.iter().map(|h| h.seq).collect::<Vec<_>>(), vec![2]);
    }

    /// A store of format 6 is stamped 7 at open and reads as it was; read-only, it is
    /// refused (its history's indexes must be moved first).
    /// The highest seq its marks name is kept in `meta`, and a later mark raises it.
    #[test]
    fn a_format_6_store_is_stamped_7_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        {
            let store = Store::open_or_create(&path, (0, 0)).unwrap();
            let mut w = store.write().unwrap();
            w.put_chunk(7, 0, b"kept").unwrap();
            // Marks as a format-6 store holds them: no summary beside them.
            for (name, seq) in [("a", 5u64), ("b", 3)] {
                w.tx.open_table(MARKS).unwrap().insert(name, seq).unwrap();
            }
            w.put_meta(META_FORMAT, &6u64.to_le_bytes()).unwrap();
            w.commit(Sync::Durable).unwrap();
        }
        assert!(matches!(
            crate::store::Store::open_read_only(&path),
            Err(StoreError::NeedsWriting { .. })
        ));
        let store = Store::open_or_create(&path, (0, 0)).unwrap();
        let r = store.read().unwrap();
        assert_eq!(
            r.meta_u64(META_FORMAT).unwrap(),
            Some(FORMAT_VERSION as u64)
        );
        let got = r.chunks(7, 0, 1).unwrap();
        assert_eq!(got[0].as_deref(), Some(&b"kept"[..]));
        assert_eq!(r.meta_u64(META_MARKED).unwrap(), Some(5));
        drop(r);
        let mut w = store.write().unwrap();
        w.without_history();
        w.set_mark("c", 4).unwrap();
        assert_eq!(w.marked().unwrap(), Some(5), "a lower mark leaves it");
        w.set_mark("d", 9).unwrap();
        w.commit(Sync::Durable).unwrap();
        let r = store.read().unwrap();
        assert_eq!(r.meta_u64(META_MARKED).unwrap(), Some(9));
    }

    /// Moves history's path and time rows out of `history_keys` into the tables of their
    /// own that formats 4 to 8 kept them in.
    fn split_history_indexes(store: &Store) {
        let mut w = store.write().unwrap();
        w.without_history();
        {
            let mut keys = w.tx.open_table(HISTORY_KEYS).unwrap();
            let rows: Vec<(Vec<u8>, u64)> = keys
                .range((&[PATH_INDEX_TAG][..], 0)..)
                .unwrap()
                .map(|i| {
                    let (k, _) = i.unwrap();
                    let (k, seq) = k.value();
                    (k.to_vec(), seq)
                })
                .collect();
            let mut paths = w.tx.open_table(HISTORY_PATHS).unwrap();
            let mut times = w.tx.open_table(HISTORY_TIMES).unwrap();
            for (k, seq) in rows {
                keys.remove((k.as_slice(), seq)).unwrap();
                match time_of_index_key(&k) {
                    Some(t) => drop(times.insert((t, seq), ()).unwrap()),
                    None => {
                        let p = std::str::from_utf8(&k[1..]).unwrap();
                        drop(paths.insert((p, seq), ()).unwrap());
                    }
                }
            }
        }
        w.commit(Sync::Durable).unwrap();
    }

    /// Rewrites every inode record and subtree row as format 7 wrote them (inode record
    /// version 2, subtree record version 1), history's indexes as it kept them, and stamps
    /// the store 7.
    fn back_to_format_7(store: &Store) {
        split_history_indexes(store);
        let mut w = store.write().unwrap();
        w.without_history();
        {
            let mut t = w.tx.open_table(INODES).unwrap();
            let all: Vec<(u64, Vec<u8>)> = t
                .iter()
                .unwrap()
                .map(|i| {
                    let (k, v) = i.unwrap();
                    (k.value(), v.value().to_vec())
                })
                .collect();
            for (ino, b) in all {
                let old = Inode::decode(ino, &b)
                    .unwrap()
                    .encode_version_2(inline_part(&b));
                t.insert(ino, old.as_slice()).unwrap();
            }
            let mut t = w.tx.open_table(SUBTREE).unwrap();
            let all: Vec<(u64, SubtreeRecord)> = t
                .iter()
                .unwrap()
                .map(|i| {
                    let (k, v) = i.unwrap();
                    (k.value(), SubtreeRecord::decode(v.value()).unwrap())
                })
                .collect();
            assert!(!all.is_empty());
            for (dir, row) in all {
                t.insert(dir, row.encode_version_1().as_slice()).unwrap();
            }
        }
        w.put_meta(META_FORMAT, &7u64.to_le_bytes()).unwrap();
        w.commit(Sync::Durable).unwrap();
    }

    /// The record versions of every inode record and every subtree row.
    fn versions(r: &crate::store::ReadTxn) -> (Vec<u8>, Vec<u8>) {
        let first = |v: &[u8]| v[0];
        let inodes = r.tx.open_table(INODES).unwrap();
        let rows = r.tx.open_table(SUBTREE).unwrap();
        let mut a: Vec<u8> = inodes
            .iter()
            .unwrap()
            .map(|i| first(i.unwrap().1.value()))
            .collect();
        let mut b: Vec<u8> = rows
            .iter()
            .unwrap()
            .map(|i| first(i.unwrap().1.value()))
            .collect();
        a.dedup();
        b.dedup();
        (a, b)
    }

    /// A store of format 7 (inode records of version 2, subtree rows of version 1, and
    /// history's before-images of such records) is stamped 8 at open, nothing rewritten; its
    /// files and their earlier versions read as before, `check` finds nothing, and a record
    /// changed after is written in the new form.
    #[test]
    fn a_format_7_store_is_stamped_8_at_open_and_keeps_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let (f, first_point) = {
            let store = Store::open_or_create(&path, (1000, 1000)).unwrap();
            store.set_keep_history(86_400 * 1_000_000_000).unwrap();
            let mut w = store.write().unwrap();
            let mut root = w.inode(ROOT_INO).unwrap().unwrap();
            let d = Inode {
                ino: w.alloc_ino().unwrap(),
                kind: Kind::Dir,
                perm: 0o755,
                nlink: 2,
                parent: ROOT_INO,
                name: "d".into(),
                ..root.clone()
            };
            w.put_inode(&d).unwrap();
            w.put_dirent(ROOT_INO, "d", d.ino, Kind::Dir).unwrap();
            root.nlink += 1;
            w.put_inode(&root).unwrap();
            let f = Inode {
                ino: w.alloc_ino().unwrap(),
                kind: Kind::File,
                perm: 0o600,
                nlink: 1,
                size: 3,
                parent: d.ino,
                name: "f.md".into(),
                ..root.clone()
            };
            w.put_file(&f, b"one").unwrap();
            w.put_dirent(d.ino, "f.md", f.ino, Kind::File).unwrap();
            w.describe(crate::store::OpInfo {
                op: "create",
                paths: vec!["/d/f.md".into()],
                ..Default::default()
            });
            w.commit(Sync::Durable).unwrap();
            let first_point = store.read().unwrap().last_seq().unwrap();
            back_to_format_7(&store);
            // History's before-image of the file is a version-2 record.
            let mut w = store.write().unwrap();
            let mut g = w.inode(f.ino).unwrap().unwrap();
            g.size = 7;
            w.put_inode_and_chunks(&g, [(0, &b"one two"[..])]).unwrap();
            w.describe(crate::store::OpInfo {
                op: "write",
                paths: vec!["/d/f.md".into()],
                ..Default::default()
            });
            w.commit(Sync::Durable).unwrap();
            back_to_format_7(&store);
            (f.ino, first_point)
        };
        let content = |r: &crate::store::ReadTxn| r.chunks(f, 0, 1).unwrap()[0].clone().unwrap();
        let earlier = |r: &crate::store::ReadTxn| {
            let past = r.past(first_point).unwrap();
            crate::store::TreeView::chunks(&past, f, 0, 1).unwrap()[0]
                .clone()
                .unwrap()
        };
        // Read-only, it must be migrated first (`a_format_8_store_..._read_only`).
        assert!(matches!(
            crate::store::Store::open_read_only(&path),
            Err(StoreError::NeedsWriting { .. })
        ));
        let store = Store::open_or_create(&path, (0, 0)).unwrap();
        let r = store.read().unwrap();
        assert_eq!(
            r.meta_u64(META_FORMAT).unwrap(),
            Some(FORMAT_VERSION as u64)
        );
        assert_eq!(versions(&r), (vec![2], vec![1]), "nothing is rewritten");
        assert_eq!(content(&r), b"one two");
        assert_eq!(earlier(&r), b"one");
        assert_eq!(r.inode(f).unwrap().unwrap().perm, 0o600);
        assert_eq!(crate::check::invariants(&r).unwrap(), Vec::<String>::new());
        let second_point = r.last_seq().unwrap();
        drop(r);
        // The file changes again: its record and its directory's row take the new forms,
        // and the version before reads from its version-2 before-image.
        let mut w = store.write().unwrap();
        let mut g = w.inode(f).unwrap().unwrap();
        g.size = 5;
        w.put_inode_and_chunks(&g, [(0, &b"three"[..])]).unwrap();
        w.describe(crate::store::OpInfo {
            op: "write",
            paths: vec!["/d/f.md".into()],
            ..Default::default()
        });
        w.commit(Sync::Durable).unwrap();
        let r = store.read().unwrap();
        let raw = r.tx.open_table(INODES).unwrap().get(f).unwrap().unwrap();
        assert_eq!(raw.value()[0], 3);
        assert_eq!(content(&r), b"three");
        assert_eq!(earlier(&r), b"one");
        let past = r.past(second_point).unwrap();
        let got = crate::store::TreeView::chunks(&past, f, 0, 1).unwrap();
        assert_eq!(got[0].as_deref(), Some(&b"one two"[..]));
        assert_eq!(crate::check::invariants(&r).unwrap(), Vec::<String>::new());
    }

    /// Every answer of history's queries about the store `r` reads: the whole log, each
    /// of `paths`' logs, the log since each record's time, the point at each record's time
    /// (and just before it), and the whole tree at every point, with each file's content.
    fn history_answers(r: &crate::store::ReadTxn, paths: &[&str]) -> Vec<String> {
        use crate::store::TreeView;
        fn tree(t: &dyn TreeView, dir: u64, at: &str, out: &mut Vec<String>) {
            for e in t.list(dir).unwrap() {
                let path = format!("{at}/{}", e.name);
                match e.kind {
                    Kind::Dir => {
                        out.push(format!("{path}/"));
                        tree(t, e.ino, &path, out);
                    }
                    Kind::File => {
                        let size = t.inode(e.ino).unwrap().unwrap().size;
                        let chunks = t.chunks(e.ino, 0, size.div_ceil(65536).max(1)).unwrap();
                        out.push(format!("{path} {size} {chunks:?}"));
                    }
                }
            }
        }
        let summary = |log: Vec<HistoryRecord>| -> String {
            let v: Vec<_> = log
                .iter()
                .map(|h| (h.seq, &h.op, &h.paths, h.time))
                .collect();
            format!("{v:?}")
        };
        let all = r.history_of(None, None, usize::MAX).unwrap();
        assert!(all.len() > 10, "{}", all.len());
        let mut out = vec![summary(all.clone())];
        for p in paths {
            out.push(summary(r.history_of(Some(p), None, usize::MAX).unwrap()));
        }
        for h in &all {
            out.push(summary(
                r.history_of(None, Some(h.time), usize::MAX).unwrap(),
            ));
            out.push(summary(
                r.history_of(Some(paths[0]), Some(h.time), usize::MAX)
                    .unwrap(),
            ));
            out.push(format!(
                "{} {}",
                r.seq_at_time(h.time).unwrap(),
                r.seq_at_time(h.time - 1).unwrap()
            ));
            let mut t = Vec::new();
            tree(&r.past(h.seq - 1).unwrap(), ROOT_INO, "", &mut t);
            out.push(t.join("\n"));
        }
        out
    }

    /// A store with a history of creates, writes, a directory's rename and removals.
    fn store_with_history(path: &std::path::Path) {
        use crate::fs::{Caller, Fs, Limits, OpenMode};
        const ME: Caller = Caller {
            uid: 0,
            gid: 0,
            pid: 1,
        };
        let store = Store::open_or_create(path, (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let write = |parent: u64, name: &str, text: &str| {
            let fh = match fs.lookup(parent, name.as_bytes()) {
                Ok(i) => {
                    let mode = OpenMode {
                        write: true,
                        truncate: true,
                        ..OpenMode::default()
                    };
                    fs.open(ME, i.ino, mode).unwrap()
                }
                Err(_) => {
                    fs.create(ME, parent, name.as_bytes(), 0o644, 0, libc::O_WRONLY)
                        .unwrap()
                        .1
                }
            };
            fs.write(ME, fh, 0, text.as_bytes()).unwrap();
            fs.release(fh).unwrap();
        };
        let d = fs.mkdir(ME, ROOT_INO, b"d", 0o755, 0).unwrap().ino;
        for i in 0..12 {
            write(d, &format!("f{}.md", i % 5), &format!("version {i}"));
            write(ROOT_INO, "top.md", &"x".repeat(100 * i));
        }
        fs.rename(ME, ROOT_INO, b"d", ROOT_INO, b"e", 0).unwrap();
        write(d, "f1.md", "after the rename");
        fs.unlink(ME, d, b"f2.md").unwrap();
        fs.unlink(ME, ROOT_INO, b"top.md").unwrap();
    }

    /// A store of format 8 (history's path and time indexes in tables of their own) has
    /// them moved into `history_keys` at open: the old tables are gone, and every query of
    /// history answers as before the migration, `check` finding nothing. Read-only, the
    /// store is refused until a writable opening has migrated it.
    #[test]
    fn a_format_8_store_has_its_history_indexes_merged_at_open_and_answers_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        store_with_history(&path);
        let paths = ["/e/f1.md", "/e", "/d/f1.md", "/top.md", "/e/f2.md"];
        let before = {
            let store = Store::open_existing(&path).unwrap();
            let r = store.read().unwrap();
            history_answers(&r, &paths)
        };
        {
            let store = Store::open_existing(&path).unwrap();
            split_history_indexes(&store);
            let mut w = store.write().unwrap();
            w.without_history();
            w.put_meta(META_FORMAT, &8u64.to_le_bytes()).unwrap();
            w.commit(Sync::Durable).unwrap();
            let r = store.read().unwrap();
            let keys = r.tx.open_table(HISTORY_KEYS).unwrap();
            assert!(
                keys.range((&[PATH_INDEX_TAG][..], 0)..)
                    .unwrap()
                    .next()
                    .is_none()
            );
            let paths = r.tx.open_table(HISTORY_PATHS).unwrap();
            assert!(paths.iter().unwrap().next().is_some());
        }
        let e = crate::store::Store::open_read_only(&path).err().unwrap();
        assert!(matches!(e, StoreError::NeedsWriting { .. }), "{e}");
        assert!(e.to_string().contains("store format (4 to 8)"), "{e}");
        let store = Store::open_existing(&path).unwrap();
        let r = store.read().unwrap();
        assert_eq!(
            r.meta_u64(META_FORMAT).unwrap(),
            Some(FORMAT_VERSION as u64)
        );
        use redb::TableHandle;
        for gone in [HISTORY_PATHS.name(), HISTORY_TIMES.name()] {
            let held = r.tx.list_tables().unwrap().any(|t| t.name() == gone);
            assert!(!held, "{gone} is still there");
        }
        assert_eq!(history_answers(&r, &paths), before);
        assert_eq!(r.history_index_findings().unwrap(), Vec::<String>::new());
        assert_eq!(crate::check::invariants(&r).unwrap(), Vec::<String>::new());
        drop(r);
        drop(store);
        let store = crate::store::Store::open_read_only(&path).unwrap();
        assert_eq!(history_answers(&store.read().unwrap(), &paths), before);
    }

    /// The format-8 migration is one transaction: stopped before its commit (a crash), it
    /// leaves the store as it was, of format 8 with its tables, and the next opening
    /// migrates it.
    #[test]
    fn a_format_8_migration_stopped_before_its_commit_leaves_the_store_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        store_with_history(&path);
        let paths = ["/e/f1.md", "/top.md"];
        let before = {
            let store = Store::open_existing(&path).unwrap();
            let answers = history_answers(&store.read().unwrap(), &paths);
            split_history_indexes(&store);
            let mut w = store.write().unwrap();
            w.without_history();
            w.put_meta(META_FORMAT, &8u64.to_le_bytes()).unwrap();
            w.commit(Sync::Durable).unwrap();
            // The migration's work, then no commit.
            let mut w = store.write().unwrap();
            w.without_history();
            assert!(w.merge_history_indexes().unwrap() > 0);
            w.put_meta(META_FORMAT, &(FORMAT_VERSION as u64).to_le_bytes())
                .unwrap();
            drop(w);
            let r = store.read().unwrap();
            assert_eq!(r.meta_u64(META_FORMAT).unwrap(), Some(8));
            use redb::ReadableTableMetadata;
            let held = r.tx.open_table(HISTORY_PATHS).unwrap().len().unwrap();
            assert!(held > 0);
            answers
        };
        let store = Store::open_existing(&path).unwrap();
        let r = store.read().unwrap();
        assert_eq!(
            r.meta_u64(META_FORMAT).unwrap(),
            Some(FORMAT_VERSION as u64)
        );
        assert_eq!(history_answers(&r, &paths), before);
        assert_eq!(crate::check::invariants(&r).unwrap(), Vec::<String>::new());
    }
}
