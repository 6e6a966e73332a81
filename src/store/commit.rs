//! The commit path: the room check, the history record and counts a commit adds, numbering,
//! the write-ahead log and group commit, checkpoints, and the store's failure state.
//!
//! Invariant kept here: commit numbers follow redb's commit order and the log's records follow
//! them, with no gap: a commit that took a number and did not log and commit it fails the
//! log before the next writer can append. A `Sync::Durable` commit returns only once its
//! record (or a checkpoint covering it) is on disk.

use std::sync::atomic::Ordering;

use super::redo::redo_put;
use super::schema::*;
use super::write::WriteTxn;
use super::{CommitStats, Store, StoreError, Sync, fault, map_err, now_ns, wal};

/// Below this much free disk, history is dropped after each commit: current content first.
const SHED_HISTORY_BELOW: u64 = 4 * 1024 * 1024;
/// Room a content commit leaves on the disk, so removals can still commit.
const ROOM_RESERVE: u64 = 1024 * 1024;
/// Room a commit without content needs (copy-on-write of a few tree pages).
const ROOM_FOR_METADATA: u64 = 128 * 1024;
/// Above this much free disk the exact check is skipped.
pub(super) const ROOM_CHECK_ABOVE: u64 = 64 * 1024 * 1024;

impl Store {
    /// Whether writes are refused for good after an I/O error: redb's, or the log's.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
            || matches!(self.wal.get(), Some(Some(w)) if !w.healthy())
    }

    /// Arms an injected I/O fault; refused unless the daemon runs with fault injection.
    pub fn inject_fault(&self, on: fault::FaultOn, nth: u64) -> Result<(), StoreError> {
        match &self.faults {
            Some(plan) => {
                plan.arm(on, nth);
                Ok(())
            }
            None => Err(StoreError::Io(
                "fault injection is off (the daemon runs without REDBFS_FAULT_INJECTION=1)".into(),
            )),
        }
    }

    /// Test-only: makes the next commit that reaches `at` panic there (fault injection on).
    pub fn inject_panic(&self, at: fault::PanicAt) -> Result<(), StoreError> {
        match &self.faults {
            Some(plan) => {
                plan.arm_panic(at);
                Ok(())
            }
            None => Err(StoreError::Io(
                "fault injection is off (the daemon runs without REDBFS_FAULT_INJECTION=1)".into(),
            )),
        }
    }

    pub(super) fn injected_panic(&self, at: fault::PanicAt) {
        if let Some(plan) = &self.faults
            && plan.take_panic(at)
        {
            panic!("injected panic in a commit at {at:?}");
        }
    }

    /// Whether the disk under the store is nearly full, so history should give way.
    pub fn disk_nearly_full(&self) -> bool {
        self.disk_free.load(Ordering::Relaxed) < SHED_HISTORY_BELOW
    }

    /// Makes every commit so far durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.sync_to(self.commits.load(Ordering::Acquire))
    }

    /// Makes commit number `seq` durable, with every commit before it. Callers that arrive
    /// while a sync runs wait for it and are covered by it, or by the next one, which one of
    /// them runs for all: one fdatasync of the log for many commits.
    pub fn sync_to(&self, seq: u64) -> Result<(), StoreError> {
        match self.wal.get() {
            Some(Some(wal)) => wal.sync_to(seq),
            // No log: every commit was a durable redb commit.
            _ => Ok(()),
        }
    }

    /// Whether commit `seq` is durable already (its log record synced, or a checkpoint since).
    pub fn is_durable(&self, seq: u64) -> bool {
        match self.wal.get() {
            Some(Some(wal)) => wal.is_synced(seq),
            // No log: every commit was a durable redb commit.
            _ => true,
        }
    }

    /// Makes every commit so far durable in the store file itself: one checkpoint commit
    /// (a durable redb commit; the log starts again), unless the last commit was one. The
    /// number of the last commit.
    pub fn checkpoint(&self) -> Result<u64, StoreError> {
        if self.checkpoint_is_last() {
            return Ok(self.commits.load(Ordering::Acquire));
        }
        let mut w = self.write_any()?;
        w.without_history();
        w.commit_checkpoint()
    }

    /// Whether the last commit was a checkpoint, so the store file holds every commit and the
    /// final checkpoint at close has nothing to add (and takes no commit number the replicas
    /// never saw).
    pub(super) fn checkpoint_is_last(&self) -> bool {
        match self.wal.get() {
            Some(Some(wal)) => wal.checkpointed() == self.commits.load(Ordering::Acquire),
            _ => true,
        }
    }

    /// Writes the store file's dirty pages to disk on a background thread, holding no lock:
    /// commits between checkpoints leave their pages in the page cache (only the log is
    /// synced), and the checkpoint that ends the log must write them all while it holds the
    /// write lock and the log, so every writer would wait behind that flush. Flushing them
    /// early, each quarter of the log, leaves the checkpoint little to write. Safe at any
    /// moment: it is what the kernel's own writeback does to those pages anyway. One flush at
    /// a time; none on the power-cut tests' simulated disk.
    pub(super) fn preflush(&self) {
        if !matches!(self.disk, super::disk::Disk::Host) {
            return;
        }
        let file = self.preflush.get_or_init(|| {
            crate::private::open_read(&self.path)
                .ok()
                .map(std::sync::Arc::new)
        });
        let Some(file) = file.clone() else { return };
        if self.preflushing.swap(true, Ordering::AcqRel) {
            return;
        }
        let busy = self.preflushing.clone();
        let spawned = std::thread::Builder::new()
            .name("preflush".into())
            .spawn(move || {
                if let Err(e) = file.sync_data() {
                    // The checkpoint's own sync will meet the same error and fail the store.
                    tracing::warn!(error = %e, "flushing the store file ahead of a checkpoint failed");
                }
                busy.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.preflushing.store(false, Ordering::Release);
        }
    }

    /// How commits have reached the disk since the store opened: commits whose caller waited
    /// for the log, and the fdatasyncs of the log that made them durable. Fewer syncs than
    /// such commits means concurrent commits shared syncs (group commit).
    pub fn commit_stats(&self) -> CommitStats {
        CommitStats {
            durable_commits: self.durable_commits.load(Ordering::Relaxed),
            log_syncs: match self.wal.get() {
                Some(Some(wal)) => wal.syncs(),
                _ => 0,
            },
            commits: self.numbered_commits.load(Ordering::Relaxed),
            redb_commits: self.redb_commits.load(Ordering::Relaxed),
            writer_busy_ns: self.writer_busy_ns.load(Ordering::Relaxed),
            open_ns: u64::try_from(self.opened.elapsed().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Counts a redb commit of `ops` numbered commits (see `Store::commit_stats`).
    pub(super) fn counted(&self, ops: u64) {
        self.numbered_commits.fetch_add(ops, Ordering::Relaxed);
        self.redb_commits.fetch_add(1, Ordering::Relaxed);
    }

    /// The number of the last commit, and the bytes of write-ahead log records since the
    /// last checkpoint (what a crash now would have to apply at the next open).
    pub fn log_state(&self) -> (u64, u64) {
        let used = match self.wal.get() {
            Some(Some(wal)) => wal.used(),
            _ => 0,
        };
        (self.commits.load(Ordering::Acquire), used)
    }
}

impl WriteTxn<'_> {
    /// Whether the disk lacks room for this transaction. A write that fails for lack of
    /// space inside redb leaves it refusing every write until reopened, so a transaction that
    /// might not fit is refused before it commits. Content keeps a reserve back, so removals
    /// (which make room) still fit on a disk that refused content.
    fn lacks_room(&self) -> Result<bool, StoreError> {
        let need = if self.written > 0 {
            self.written.saturating_mul(2) + ROOM_RESERVE
        } else {
            ROOM_FOR_METADATA
        };
        let free = self.store.disk.available(&self.store.path);
        self.store.disk_free.store(free, Ordering::Relaxed);
        if free >= need.saturating_add(ROOM_CHECK_ABOVE) {
            return Ok(false);
        }
        // Close to full: count the free pages inside the file too.
        let stats = self.tx.get().stats().map_err(map_err)?;
        let used = stats.allocated_pages() * stats.page_size() as u64;
        // Pages of the file that are backed by disk blocks but free; redb grows the file sparse,
        // so its length overstates them.
        let backed = std::fs::metadata(&self.store.path).map_or(0, |m| {
            use std::os::unix::fs::MetadataExt;
            m.blocks() * 512
        });
        let inside = backed.saturating_sub(used);
        Ok(free + inside < need)
    }

    /// Commits everything written in this transaction, with its history record.
    pub fn commit(self, sync: Sync) -> Result<(), StoreError> {
        self.commit_numbered(sync).map(drop)
    }

    /// Commits; returns the commit's number, which `Store::sync_to` takes.
    pub fn commit_numbered(mut self, sync: Sync) -> Result<u64, StoreError> {
        let now = now_ns();
        if self.lacks_room()? {
            return Err(StoreError::NoRoom);
        }
        self.settle_subtree(true)?;
        self.delta_replaced_chunks()?;
        self.record_history(now)?;
        self.apply_ref_deltas()?;
        self.store_counts(now)?;
        self.count_work();
        self.finish(sync, false)
    }

    /// Adds this transaction's bookkeeping steps to the store's total (`Store::commit_work`).
    fn count_work(&self) {
        self.store
            .commit_steps
            .fetch_add(self.steps.get(), Ordering::Relaxed);
    }

    /// Writes the usage counts this transaction changed and the commit time into `meta`, in
    /// the commit they count (a count it left alone is already right there).
    fn store_counts(&self, now: i64) -> Result<(), StoreError> {
        let usage = self.usage()?;
        let d = &self.usage;
        let mut meta = self.tx.open_table(META).map_err(map_err)?;
        for (k, v) in [
            (META_FILES, (d.files != 0).then_some(usage.files)),
            (META_DIRS, (d.dirs != 0).then_some(usage.dirs)),
            (
                META_CONTENT_BYTES,
                (d.content_bytes != 0).then_some(usage.content_bytes),
            ),
            (META_LAST_COMMIT, Some(now as u64)),
        ] {
            let Some(v) = v else { continue };
            let bytes = v.to_le_bytes();
            meta.insert(k, bytes.as_slice()).map_err(map_err)?;
            redo_put(&self.redo, META, &k, &bytes.as_slice());
        }
        Ok(())
    }

    /// Commits as a checkpoint: durable in the store file itself, covering every commit
    /// before it, after which the log starts again.
    pub(super) fn commit_checkpoint(mut self) -> Result<u64, StoreError> {
        self.settle_subtree(false)?;
        self.apply_ref_deltas()?;
        self.count_work();
        self.finish(Sync::Durable, true)
    }

    /// Numbers the commit, logs it and commits it in redb; waits for the log when durable.
    fn finish(self, sync: Sync, checkpoint: bool) -> Result<u64, StoreError> {
        if self.joined.is_some() && !checkpoint {
            return self.finish_batched(sync);
        }
        // Numbered while this transaction holds redb's write lock, so numbers follow commit
        // order and the log's records follow them too. Taken, not just read: the next
        // writer may start the moment redb's commit returns, before this one could record it.
        let seq = self.store.commits.fetch_add(1, Ordering::AcqRel) + 1;
        self.finish_as(seq, sync, checkpoint)
    }

    /// Commits numbered `seq`. The number is spent whatever happens, so whatever leaves this
    /// early, an error or a panic unwinding, fails the log (no later record may follow the
    /// gap), and does so before redb's write lock goes: the guard is dropped before `self`,
    /// and a failure of redb's own commit, which lets go of the lock, happens under the
    /// log's pending lock, which the next writer must take and check first.
    fn finish_as(self, seq: u64, sync: Sync, checkpoint: bool) -> Result<u64, StoreError> {
        let store = self.store;
        let mut gap = GapGuard { store, armed: true };
        store.injected_panic(fault::PanicAt::Numbered);
        self.mark_subtree_kept(seq)?;
        // What the transaction changed: the log's record, and what replication ships.
        let redo = self.redo.take();
        let mut meta = self.tx.open_table(META).map_err(map_err)?;
        meta.insert(META_LOG_SEQ, seq.to_le_bytes().as_slice())
            .map_err(map_err)?;
        let wal = match store.wal.get() {
            Some(w) => w.as_ref(),
            None => {
                // The first commit since the store opened starts a log under a new id, and
                // is a checkpoint, so the store names the log it must be read with.
                let id = fresh_id();
                meta.insert(META_LOG_ID, id.to_le_bytes().as_slice())
                    .map_err(map_err)?;
                let started = match wal::Wal::start(
                    &store.disk,
                    &store.path,
                    id,
                    seq,
                    store.faults.clone(),
                ) {
                    Ok(w) => Some(w),
                    // A symlink planted at the log's name: refuse, rather than carry on.
                    Err(e @ StoreError::Refused(_)) => return Err(e),
                    Err(e) => {
                        tracing::warn!(error = %e, "no write-ahead log: every commit writes the store file and fsyncs it");
                        None
                    }
                };
                drop(meta);
                let _ = store.wal.set(started);
                let wal = store.wal.get().and_then(|w| w.as_ref());
                let pending = wal.map(|w| w.pending()).transpose()?;
                let result = self.commit_durably(seq);
                match (&result, wal) {
                    (Err(_), Some(w)) => w.fail(),
                    (Ok(_), _) => store.tap(seq, redo),
                    _ => {}
                }
                drop(pending);
                gap.armed = result.is_err();
                return result;
            }
        };
        drop(meta);
        let Some(wal) = wal else {
            let result = self.commit_durably(seq);
            if result.is_ok() {
                store.tap(seq, redo);
            }
            gap.armed = result.is_err();
            return result;
        };
        let mut pending = wal.pending()?;
        let fits = redo.as_ref().is_some_and(|r| pending.fits(r.len()));
        // Near a full disk, pages freed by commits that are not durable in redb are not handed
        // out again, so each commit is a checkpoint there.
        let near_full = store.disk_free.load(Ordering::Relaxed) < ROOM_CHECK_ABOVE;
        if checkpoint || near_full || !fits {
            if let Err(e) = self.commit_durably(seq) {
                wal.fail();
                return Err(e);
            }
            pending.checkpointed(seq);
            wal.covered(seq);
            // The replicas' feeds outside the log's lock, which every committer waits for.
            drop(pending);
            store.tap(seq, redo);
            gap.armed = false;
            return Ok(seq);
        }
        let quarter = |used: u64| used / (wal::LOG_BYTES / 4);
        let before = quarter(pending.used());
        let mark = pending.push(seq, redo.as_deref().unwrap_or_default());
        let crossed = quarter(pending.used()) != before;
        store.injected_panic(fault::PanicAt::Appended);
        let committed = self.tx.commit(redb::Durability::None);
        if let Err(e) = committed {
            pending.unpush(mark);
            wal.fail();
            return Err(e);
        }
        store.counted(1);
        drop(pending);
        store.tap(seq, redo);
        if crossed {
            store.preflush();
        }
        store.injected_panic(fault::PanicAt::Committed);
        if sync != Sync::Deferred {
            store.durable_commits.fetch_add(1, Ordering::Relaxed);
        }
        if sync == Sync::Durable {
            wal.sync_to(seq)?;
        }
        gap.armed = false;
        Ok(seq)
    }

    /// A durable redb commit: a checkpoint, the log's first commit, or any commit without a
    /// log.
    fn commit_durably(self, seq: u64) -> Result<u64, StoreError> {
        self.store.injected_panic(fault::PanicAt::Checkpoint);
        let store = self.store;
        self.tx.commit(redb::Durability::Immediate)?;
        store.counted(1);
        Ok(seq)
    }

    /// `finish` for a joined write: numbered and logged as its own commit, committed in redb
    /// with the rest of its batch (see `batch`).
    fn finish_batched(mut self, sync: Sync) -> Result<u64, StoreError> {
        let store = self.store;
        // Under redb's write lock, which the batch holds: given back if it is abandoned.
        let seq = store.commits.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(j) = &mut self.joined {
            j.numbered = true;
        }
        store.injected_panic(fault::PanicAt::Numbered);
        self.mark_subtree_kept(seq)?;
        let redo = self.redo.take();
        self.tx
            .open_table(META)
            .map_err(map_err)?
            .insert(META_LOG_SEQ, seq.to_le_bytes().as_slice())
            .map_err(map_err)?;
        self.finish_joined(seq, redo)?;
        store.numbered_commits.fetch_add(1, Ordering::Relaxed);
        if sync != Sync::Deferred
            && let Some(Some(wal)) = store.wal.get()
        {
            store.durable_commits.fetch_add(1, Ordering::Relaxed);
            if sync == Sync::Durable {
                wal.sync_to(seq)?;
            }
        }
        Ok(seq)
    }
}

/// Fails the store's log when dropped armed: see `WriteTxn::finish_as`.
struct GapGuard<'a> {
    store: &'a Store,
    armed: bool,
}

impl Drop for GapGuard<'_> {
    fn drop(&mut self) {
        if self.armed
            && let Some(Some(wal)) = self.store.wal.get()
        {
            wal.fail();
        }
    }
}

/// A random, nonzero id for a new log.
fn fresh_id() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let id = if n == 8 {
        u64::from_le_bytes(b)
    } else {
        now_ns() as u64 ^ ((std::process::id() as u64) << 32)
    };
    id.max(1)
}
