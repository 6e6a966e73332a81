//! Open files: handles over per-inode buffered content, committed whole at flush, fsync or the
//! last release; lost-update checks on open and replace; reclaiming an unused orphan.

use super::*;

impl Fs {
    /// Registers one more user of `ino`'s buffered content.
    pub(super) fn acquire(&self, ino: u64) -> Result<Arc<FileSlot>> {
        self.acquire_or(ino, None).map(|(f, _)| f)
    }

    /// `acquire`, or, for an inode the store no longer holds, a slot made from `pinned` (a
    /// follower's earlier version that a handle will read from).
    /// Also the inode as the store holds it when this read it to open the file's slot (an
    /// open's own read of it, taken under the map lock), `None` when the slot was open.
    fn acquire_or(
        &self,
        ino: u64,
        pinned: Option<&super::pinned::Pinned>,
    ) -> Result<(Arc<FileSlot>, Option<Inode>)> {
        let mut map = lock(&self.files);
        let mut stored = None;
        let f = match map.get(&ino) {
            Some(f) => f.clone(),
            None => {
                // A deletion is decided under the map lock: one staged now is not committed
                // yet, and the store would still show the inode.
                if self.lifetimes.is_deleting(ino) {
                    return Err(Error::NotFound);
                }
                let inode = match (self.store.read()?.inode(ino)?, pinned) {
                    (Some(i), _) => {
                        stored = Some(i.clone());
                        i
                    }
                    (None, Some(p)) => p.inode.clone(),
                    (None, None) => return Err(Error::NotFound),
                };
                if inode.kind == Kind::Dir {
                    return Err(Error::IsDir);
                }
                let f = Arc::new(FileSlot::new(ino, inode.size));
                // An orphan the kernel still references (opened through a held dentry).
                f.unlinked.store(inode.nlink == 0, Ordering::Release);
                map.insert(ino, f.clone());
                f
            }
        };
        f.handles.fetch_add(1, Ordering::AcqRel);
        Ok((f, stored))
    }

    /// Drops one user of an open file: the last one commits what is buffered and leaves, and
    /// the last release of an unlinked file reclaims its space.
    pub(super) fn release_file(&self, f: &Arc<FileSlot>) {
        loop {
            let res = if f.handles.load(Ordering::Acquire) == 1 {
                self.commit_file(f, &mut lock(&f.content))
            } else {
                Ok(())
            };
            if let Err(e) = &res {
                tracing::error!(ino = f.ino, error = %e, "content could not be committed at release");
            }
            let mut map = lock(&self.files);
            if f.handles.load(Ordering::Acquire) > 1 {
                f.handles.fetch_sub(1, Ordering::AcqRel);
                return;
            }
            // The last user leaves only with nothing buffered, or the next open would read the
            // store without it. The content lock is only tried: it is never awaited under the
            // map lock.
            let settled = match f.content.try_lock() {
                Ok(g) => !g.changed || res.is_err() || f.unlinked.load(Ordering::Acquire),
                Err(std::sync::TryLockError::Poisoned(_)) => true,
                Err(std::sync::TryLockError::WouldBlock) => false,
            };
            if !settled {
                // A write slipped in meanwhile: commit again.
                drop(map);
                std::thread::yield_now();
                continue;
            }
            f.handles.store(0, Ordering::Release);
            if map.get(&f.ino).is_some_and(|g| Arc::ptr_eq(g, f)) {
                map.remove(&f.ino);
            }
            drop(map);
            // What the buffer still holds (an unlinked file's, or one whose commit failed)
            // goes with the slot: its memory and quota share are given back.
            {
                let mut g = lock(&f.content);
                self.unreserve(&mut g);
                self.buffered
                    .fetch_sub(g.accounted as u64, Ordering::AcqRel);
                g.accounted = 0;
            }
            if f.unlinked.load(Ordering::Acquire) {
                self.reclaim_if_unused(f.ino);
            }
            return;
        }
    }

    /// Whether a handle holds `ino` open. Called with the files map locked.
    pub(super) fn is_open(&self, files: &HashMap<u64, Arc<FileSlot>>, ino: u64) -> bool {
        files.contains_key(&ino) || lock(&self.dirs).open.values().any(|d| d.ino == ino)
    }

    /// An orphan may have lost its last reference or handle (its last FORGET, release or
    /// releasedir): it is reclaimed with the next batch. Past `RECLAIM_BATCH` queued, on a
    /// nearly full disk, or under a quota (where the next write needs the room at once: an
    /// orphan's content still counts), the caller reclaims the batch itself; otherwise the daemon's reclaimer does within `RECLAIM_INTERVAL` (so
    /// a burst of unlinks costs one more commit, not one each).
    pub(super) fn reclaim_if_unused(&self, ino: u64) {
        let full = self.reclaims.push(ino) >= RECLAIM_BATCH;
        if full || self.limits.quota_bytes > 0 || self.store.disk_nearly_full() {
            self.reclaim_queued();
        }
    }

    /// Deletes the queued orphans that neither a kernel reference nor a handle holds, in one
    /// transaction. Not durable by itself: a crash before the next durable commit leaves the
    /// orphan marks, and the next mount reclaims them.
    pub fn reclaim_queued(&self) {
        let queued = self.reclaims.take();
        let chosen: Vec<u64> = {
            let files = lock(&self.files);
            queued
                .into_iter()
                .filter(|&ino| {
                    let open = self.is_open(&files, ino);
                    self.lifetimes.start_reclaim(ino, open)
                })
                .collect()
        };
        if chosen.is_empty() {
            return;
        }
        let r = self.writable().and_then(|()| {
            let mut w = self.store.write()?;
            let (mut done, mut paths, mut size) = (Vec::new(), Vec::new(), 0);
            for &ino in &chosen {
                // Not an orphan: the removal that would have made it one did not commit.
                let Some(inode) = w.inode(ino)?.filter(|i| i.nlink == 0) else {
                    continue;
                };
                // Named by the path each inode had, so that path's history (redact, log
                // PATH) finds the content this record keeps for rollback.
                paths.push(self.path_in(&w, inode.parent, &inode.name));
                size += inode.size;
                w.delete_inode(ino)?;
                done.push(ino);
            }
            if !done.is_empty() {
                let ino = if done.len() == 1 { done[0] } else { 0 };
                self.describe(
                    &mut w,
                    Caller::default(),
                    "reclaim",
                    ino,
                    |_| paths,
                    size,
                    0,
                );
                self.commit(w, Sync::Deferred)?;
            }
            Ok(done)
        });
        let done = r.unwrap_or_else(|e| {
            tracing::error!(count = chosen.len(), error = %e, "could not reclaim unlinked inodes; the next mount will");
            Vec::new()
        });
        for ino in chosen {
            let deleted = done.contains(&ino);
            self.lifetimes.deleted(ino, deleted);
            if deleted {
                self.tracker.deleted(ino);
            }
        }
    }

    /// Commits an open file's buffered content durably, and notes the commit in
    /// `f.durable_with` (under the content lock, before the buffer reads as clean). Lock
    /// order: the content lock (held by the caller) before the store's write lock.
    pub(super) fn commit_file(&self, f: &FileSlot, g: &mut OpenFile) -> Result<()> {
        if !g.changed || f.unlinked.load(Ordering::Acquire) {
            return Ok(());
        }
        self.writable()?;
        let large = g.buffered_bytes() >= RETURN_MEMORY_AFTER;
        let staged = self.joinable(|join| {
            let mut w = self.write_for(join, g.last_writer.pid, g.writer_name.clone())?;
            let Some(inode) = w.inode(g.ino)?.filter(|i| i.nlink > 0) else {
                // The last name went after the check above: its removal is staged earlier
                // in the batch this write joined (which may yet fail, so this runs again
                // alone, after it), or committed.
                if join.0 {
                    return Err(Error::Store(StoreError::Retry));
                }
                return Ok(None);
            };
            let (parent, name) = (inode.parent, inode.name.clone());
            self.describe(
                &mut w,
                g.last_writer,
                "write",
                g.ino,
                |w| vec![self.ino_path_in(w, g.ino)],
                g.committed_size,
                g.size,
            );
            g.stage(&mut w, inode)?;
            // Under the write lock, so a replace checked after this commit sees it.
            self.tracker.wrote(g.writer, g.ino, parent, &name);
            self.commit_numbered(w, Sync::Durable).map(Some)
        })?;
        let Some(seq) = staged else {
            // Unlinked: nothing of the content is kept, once the removal is durable.
            f.unlinked.store(true, Ordering::Release);
            return Ok(self.store.sync()?);
        };
        // Before the buffer reads as clean: a close through another handle that finds nothing
        // to commit waits for this commit's sync all the same.
        f.durable_with.fetch_max(seq, Ordering::AcqRel);
        g.committed();
        self.unreserve(g);
        self.account(g)?;
        if large {
            store::return_freed_memory();
        }
        Ok(())
    }

    pub fn open(&self, caller: Caller, ino: u64, mode: OpenMode) -> Result<u64> {
        if mode.write || mode.truncate {
            self.writable()?;
        }
        let pinned = self.pin_version(ino)?;
        let (f, read) = self.acquire_or(ino, pinned.as_deref())?;
        // A slot just opened read the inode already, in this request: one read transaction.
        let stored = match read {
            Some(i) => Some(i),
            None => match self.store.read().and_then(|r| r.inode(ino)) {
                Ok(i) => i,
                Err(e) => {
                    self.release_file(&f);
                    return Err(e.into());
                }
            },
        };
        if let Some(i) = &stored {
            if mode.truncate
                && let Some(c) = self.tracker.check(caller.pid, ino, i.parent, &i.name)
                && let Err(e) = self.lost_update(caller, "truncate", i.parent, &i.name, &c)
            {
                self.release_file(&f);
                return Err(e);
            }
            if mode.read {
                self.tracker.read(caller.pid, ino, i.parent, &i.name);
            }
        }
        // The handle's number first: a truncation is this handle's first change.
        let fh = self.new_fh();
        // Linux truncates on O_TRUNC even with O_RDONLY (the kernel checked write permission),
        // and an empty file too: its mtime and ctime change (`: > file`).
        if mode.truncate {
            let mut g = lock(&f.content);
            self.note_writer(&mut g, caller, Some(fh));
            if let Err(e) = g
                .truncate(&self.store, 0, now_ns())
                .and_then(|()| self.account(&mut g))
            {
                drop(g);
                self.release_file(&f);
                return Err(e);
            }
        }
        lock(&self.handles).insert(
            fh,
            Handle {
                file: f,
                mode,
                pinned,
            },
        );
        if let Some(i) = stored
            && let Err(e) = self.refresh_atime(i)
        {
            crate::warn_limited!(ino, error = %e, "could not update the access time");
        }
        Ok(fh)
    }

    /// A replace (`op`) of `name` in `parent` by `caller` would lose another process's edit,
    /// and the replace has no record to carry the note (a truncation, or any refused
    /// replace): one warn line, the count, and a history record of its own. Err(LostUpdate)
    /// when the mode is `refuse`. (A rename in `record` mode notes it on its own record:
    /// `check_lost_update`.)
    pub(super) fn lost_update(
        &self,
        caller: Caller,
        op: &'static str,
        parent: u64,
        name: &str,
        c: &Conflict,
    ) -> Result<()> {
        let refuse = self.tracker.mode() == LostUpdates::Refuse;
        let path = self.report_lost_update(op, parent, name, c);
        if self.store.history_on() {
            let note = Self::conflict_note(c, refuse);
            let r = self.store.write().map_err(Error::from).and_then(|mut w| {
                self.describe(&mut w, caller, op, 0, |_| vec![path.clone()], 0, 0);
                w.note_conflict(note);
                self.commit(w, Sync::Deferred)
            });
            if let Err(e) = r {
                tracing::warn!(error = %e, "could not record the conflict in the history");
            }
        }
        if refuse {
            Err(Error::LostUpdate {
                maker: c.maker_pid(),
            })
        } else {
            Ok(())
        }
    }

    /// The history record's note of a lost update.
    pub(super) fn conflict_note(c: &Conflict, refused: bool) -> String {
        format!(
            "conflict: {}{}",
            c.describe(),
            if refused { " (refused)" } else { "" }
        )
    }

    /// Counts a lost update of `name` in `parent` by `op` and logs its one warn line;
    /// returns its path.
    pub(super) fn report_lost_update(
        &self,
        op: &'static str,
        parent: u64,
        name: &str,
        c: &Conflict,
    ) -> String {
        let refused = self.tracker.mode() == LostUpdates::Refuse;
        self.tracker.counted();
        let path = self.path_of(parent);
        let path = format!("{}/{name}", path.trim_end_matches('/'));
        tracing::warn!(
            op,
            path,
            replacer = c.replacer.pid,
            maker = c.maker_pid(),
            refused,
            "lost update: {}",
            c.describe()
        );
        path
    }

    /// `caller` changes `g`'s content through handle `fh` (`None`: by path): its commit is
    /// attributed to it, and to its process, told now, while the caller waits for this
    /// request (it may exit before the commit). The same read of /proc gives the name the
    /// commit's history record takes, so a commit after a write reads /proc no more.
    ///
    /// A later write by the same tid through the same handle is taken as the same process
    /// without asking again, as every write would otherwise read /proc. A tid comes back once
    /// its thread exits, and the thread that holds it next may be another process's: that
    /// process writes through a handle of its own (its open told afresh here), so a write
    /// through another handle, or none, is told afresh. What is left is a thread of another
    /// process holding the tid and sharing the very handle (inherited or passed), after the
    /// whole tid space came round while the file stayed open with nothing told between.
    pub(super) fn note_writer(&self, g: &mut OpenFile, caller: Caller, fh: Option<u64>) {
        if g.last_writer.pid != caller.pid
            || g.writer.is_none()
            || fh.is_none()
            || g.writer_fh != fh
        {
            let told = self.tracker.identify_named(caller.pid);
            g.writer = told.as_ref().map(|t| t.0);
            g.writer_name = told.map(|t| t.1);
            g.writer_fh = fh;
        }
        g.last_writer = caller;
    }

    /// Conflicts (lost updates recorded or refused) since mount, for status.
    pub fn conflicts(&self) -> u64 {
        self.tracker.conflicts()
    }

    /// Moves atime to now if it is more than `ATIME_INTERVAL_NS` old (deferred commit).
    pub(super) fn refresh_atime(&self, stored: Inode) -> Result<()> {
        let now = now_ns();
        let stale = |i: &Inode| now - i.atime > ATIME_INTERVAL_NS;
        if self.is_read_only() || self.is_poisoned() || !stale(&stored) {
            return Ok(());
        }
        let mut w = self.store.write()?;
        // Access times are not history: they would bury the changes that matter.
        w.without_history();
        if let Some(mut i) = w.inode(stored.ino)?.filter(stale) {
            i.atime = now;
            w.put_inode(&i)?;
            self.commit(w, Sync::Deferred)?;
        }
        Ok(())
    }

    pub(super) fn handle(&self, fh: u64) -> Result<(Arc<FileSlot>, OpenMode)> {
        lock(&self.handles)
            .get(&fh)
            .map(|h| (h.file.clone(), h.mode))
            .ok_or(Error::BadHandle)
    }

    pub fn read(&self, fh: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let pinned = lock(&self.handles).get(&fh).and_then(|h| h.pinned.clone());
        if let Some(p) = pinned {
            return p.read(offset, len);
        }
        let (f, _) = self.handle(fh)?;
        let g = lock(&f.content);
        g.read(&self.store, offset, len)
    }

    /// write(2) through handle `fh`: at `offset`, or at the end for a handle opened O_APPEND.
    pub fn write(&self, caller: Caller, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_at(caller, fh, offset, false, data)
    }

    /// A page of a shared mapping written back through handle `fh`: at `offset`, where the page
    /// is, whatever the handle's O_APPEND (the kernel writes a mapping back through any
    /// writable handle of the file).
    pub fn write_page(&self, caller: Caller, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_at(caller, fh, offset, true, data)
    }

    fn write_at(
        &self,
        caller: Caller,
        fh: u64,
        offset: u64,
        page: bool,
        data: &[u8],
    ) -> Result<u32> {
        self.writable()?;
        let (f, mode) = self.handle(fh)?;
        if !mode.write {
            return Err(Error::BadHandle);
        }
        let mut g = lock(&f.content);
        let offset = if mode.append && !page { g.size } else { offset };
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(Error::FileTooBig {
                limit: self.limits.max_file_bytes,
            })?;
        self.check_file_size(end)?;
        if end > g.size {
            self.reserve(&mut g, end)?;
        }
        self.note_writer(&mut g, caller, Some(fh));
        g.write(&self.store, offset, data, now_ns())?;
        self.account(&mut g)?;
        Ok(data.len() as u32)
    }

    /// close(2) of one descriptor: commits the file's buffered content durably.
    pub fn flush(&self, fh: u64) -> Result<()> {
        let (f, _) = self.handle(fh)?;
        let mut g = lock(&f.content);
        self.commit_file(&f, &mut g)?;
        drop(g);
        // A file created and closed without a write (even one created O_RDONLY) becomes
        // durable here, and so does content another handle's close or fsync committed.
        self.sync_file(&f)
    }

    pub fn fsync(&self, fh: u64) -> Result<()> {
        let (f, _) = self.handle(fh)?;
        let mut g = lock(&f.content);
        self.commit_file(&f, &mut g)?;
        drop(g);
        self.sync_file(&f)
    }

    /// Makes `f.durable_with` durable, if it is not yet: only that commit, so a close does not
    /// pay an fsync for what other processes committed meanwhile. A commit whose sync failed
    /// fails this too (the log refuses every sync after a failed one), so every close and
    /// fsync of the file reports the failure, not only the one that was waiting for it.
    pub(super) fn sync_file(&self, f: &FileSlot) -> Result<()> {
        let seq = f.durable_with.load(Ordering::Acquire);
        if seq != 0 && !super::durable::sync_later(seq) {
            self.store.sync_to(seq)?;
        }
        Ok(())
    }

    pub fn release(&self, fh: u64) -> Result<()> {
        let h = lock(&self.handles).remove(&fh).ok_or(Error::BadHandle)?;
        self.release_file(&h.file);
        Ok(())
    }

    /// fsync of a directory: every namespace change is durable already, except creates.
    pub fn fsyncdir(&self) -> Result<()> {
        Ok(self.store.sync()?)
    }
}
