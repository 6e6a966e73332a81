//! Lookups and attributes: `lookup` (which counts the kernel's reference, see `lifetime`),
//! `forget`, `getattr` and `setattr`.

use super::*;

impl Fs {
    /// The entry `raw_name` in `parent`, counted as one kernel reference (an entry reply):
    /// the inode stays valid, with or without a name, until `forget` returns it.
    pub fn lookup(&self, parent: u64, raw_name: &[u8]) -> Result<Inode> {
        let name = self.parse_name(raw_name)?;
        loop {
            let epoch = self.lifetimes.epoch();
            let r = self.store.read()?;
            let p = r.inode(parent)?.ok_or(Error::NotFound)?;
            if p.kind != Kind::Dir {
                return Err(Error::NotDir);
            }
            let (ino, _) = r.lookup(parent, name.as_str())?.ok_or(Error::NotFound)?;
            let inode = r.inode(ino)?.ok_or_else(|| {
                Error::Store(StoreError::Corrupt(format!(
                    "dirent {name:?} points to missing inode {ino}"
                )))
            })?;
            drop(r);
            if self.pin(ino, epoch)? {
                return Ok(self.overlay(inode));
            }
            // Deleted between the read and the pin (its name went first): read again.
            std::thread::yield_now();
        }
    }

    /// Counts a kernel reference to `ino`, read at `epoch`; false when the inode is gone or
    /// going (nothing counted).
    pub(super) fn pin(&self, ino: u64, epoch: u64) -> Result<bool> {
        match self.lifetimes.pin(ino, epoch) {
            Pin::Held => Ok(true),
            Pin::Deleting => Ok(false),
            Pin::Unsure => {
                if self.store.read()?.inode(ino)?.is_some() {
                    Ok(true)
                } else {
                    self.lifetimes.forget(ino, 1);
                    Ok(false)
                }
            }
        }
    }

    /// The kernel returns `n` references to `ino` (FORGET); an orphan left without any is
    /// reclaimed unless a handle holds it.
    pub fn forget(&self, ino: u64, n: u64) {
        if self.lifetimes.forget(ino, n) {
            self.reclaim_if_unused(ino);
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Inode> {
        let inode = match self.store.read()?.inode(ino)? {
            Some(i) => i,
            // A follower's batch took it: an open handle still reads the version it opened
            // (fstat answers from it), and a lookup made just before the last batch finds
            // what it looked up; otherwise the kernel looks the path up again.
            None if self.store.frozen().is_some() => {
                let held = match self.pinned_inode(ino) {
                    Some(i) => Some(i),
                    None => match self.store.before_last_batch() {
                        Some(before) => before.inode(ino)?,
                        None => None,
                    },
                };
                return held.ok_or(Error::Stale);
            }
            None => return Err(Error::NotFound),
        };
        Ok(self.overlay(inode))
    }

    /// The path of `ino` from the mount root, for logs and tools ("/" for the root).
    pub fn path_of(&self, ino: u64) -> String {
        let path = self
            .store
            .read()
            .ok()
            .and_then(|r| self.walk_up(Vec::new(), ino, |i| r.inode(i).ok().flatten()));
        path.unwrap_or_else(|| format!("<inode {ino}>"))
    }

    /// The path of `name` under `parent` from the mount root, as `w` sees it.
    pub(super) fn path_in(&self, w: &WriteTxn<'_>, parent: u64, name: &str) -> String {
        w.with_inodes(|inode| self.walk_up(vec![name.to_string()], parent, inode))
            .ok()
            .flatten()
            .unwrap_or_else(|| format!("<inode {parent}>/{name}"))
    }

    /// Completes a path, `tail` being its last components, by following parents from `dir`
    /// to the root; None when a parent is missing or the chain is deeper than any path may be.
    pub(super) fn walk_up(
        &self,
        mut tail: Vec<String>,
        dir: u64,
        inode: impl Fn(u64) -> Option<Inode>,
    ) -> Option<String> {
        let mut cur = dir;
        for _ in 0..=self.limits.max_depth + 1 {
            if cur == ROOT_INO {
                tail.reverse();
                return Some(format!("/{}", tail.join("/")));
            }
            let i = inode(cur)?;
            tail.push(i.name);
            cur = i.parent;
        }
        None
    }

    /// The path of inode `ino` as `w` sees it.
    pub(super) fn ino_path_in(&self, w: &WriteTxn<'_>, ino: u64) -> String {
        let path = w.with_inodes(|inode| match inode(ino) {
            Some(i) if ino != ROOT_INO => Some(
                self.walk_up(vec![i.name.clone()], i.parent, inode)
                    .unwrap_or_else(|| format!("<inode {}>/{}", i.parent, i.name)),
            ),
            _ => None,
        });
        path.ok().flatten().unwrap_or_else(|| "/".to_string())
    }

    /// Names the operation in `w` for its history record (only when history is on).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn describe(
        &self,
        w: &mut WriteTxn<'_>,
        caller: Caller,
        op: &'static str,
        ino: u64,
        paths: impl FnOnce(&WriteTxn<'_>) -> Vec<String>,
        size_before: u64,
        size_after: u64,
    ) {
        if self.store.history_on() {
            let paths = paths(w);
            w.describe(OpInfo {
                op,
                paths,
                ino,
                size_before,
                size_after,
                uid: caller.uid,
                gid: caller.gid,
                pid: caller.pid,
                conflict: None,
            });
        }
    }

    pub fn setattr(&self, caller: Caller, ino: u64, a: SetAttr) -> Result<Inode> {
        self.writable()?;
        let now = now_ns();
        if let Some(size) = a.size {
            let inode = self.getattr(ino)?;
            if inode.kind == Kind::Dir {
                return Err(Error::IsDir);
            }
            self.check_file_size(size)?;
            let f = self.acquire(ino)?;
            let res = {
                let mut g = lock(&f.content);
                self.note_writer(&mut g, caller, a.fh);
                let r = self
                    .reserve(&mut g, size)
                    .and_then(|()| g.truncate(&self.store, size, now))
                    .and_then(|()| self.account(&mut g));
                // Through a handle (ftruncate, O_TRUNC) the change is buffered with the rest of
                // that handle's writes; a truncate(2) of a file nobody has open commits now.
                if r.is_ok() && a.fh.is_none() && f.handles.load(Ordering::Acquire) == 1 {
                    self.commit_file(&f, &mut g)
                } else {
                    r
                }
            };
            self.release_file(&f);
            res?;
        }
        let touches_attrs = a.mode.is_some()
            || a.uid.is_some()
            || a.gid.is_some()
            || a.atime.is_some()
            || a.mtime.is_some();
        if touches_attrs {
            let resolve = |t: TimeSet| match t {
                TimeSet::Now => now,
                TimeSet::At(ns) => ns,
            };
            // The content lock of an open file is held across the commit: a close or fsync
            // through another descriptor (a forked child's, say) must not commit the earlier
            // write's times over these ones in between.
            let open = lock(&self.files).get(&ino).cloned();
            let mut content = open.as_ref().map(|f| lock(&f.content));
            self.joinable(|join| {
                let mut w = self.write_for(join, caller.pid, None)?;
                let mut inode = w.inode(ino)?.ok_or(Error::NotFound)?;
                if let Some(m) = a.mode {
                    inode.perm = m & 0o7777;
                }
                if let Some(u) = a.uid {
                    inode.uid = u;
                }
                if let Some(g) = a.gid {
                    inode.gid = g;
                }
                if let Some(t) = a.atime {
                    inode.atime = resolve(t);
                }
                if let Some(t) = a.mtime {
                    inode.mtime = resolve(t);
                }
                inode.ctime = now;
                w.put_inode(&inode)?;
                let size = inode.size;
                self.describe(
                    &mut w,
                    caller,
                    "setattr",
                    ino,
                    |w| vec![self.ino_path_in(w, ino)],
                    size,
                    size,
                );
                self.commit(w, Sync::Durable)
            })?;
            // Buffered writes commit their times later; these are newer.
            if let Some(g) = content.as_mut() {
                if let Some(t) = a.mtime
                    && g.pending_mtime.is_some()
                {
                    g.pending_mtime = Some(resolve(t));
                }
                if g.pending_ctime.is_some() {
                    g.pending_ctime = Some(now);
                }
            }
        }
        self.getattr(ino)
    }
}
