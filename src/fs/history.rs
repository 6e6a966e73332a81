//! Changing the store from its history: rollback of the whole store, revert of one path,
//! marks and redaction. Rollback and revert are each one new transaction, recorded like any
//! other operation, so they can be undone in turn. On a mounted store they run in the daemon:
//! buffered content is committed first, open files pick up what changed, and the kernel is
//! told to drop what it cached of every entry and inode they touched.

use std::sync::Arc;

use super::{Caller, Error, Fs, Result, lock};
use crate::store::{Kind, Past, ROOT_INO, Sync, TreeView, WriteTxn};

/// What the kernel must forget after a change made outside a kernel request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalidation {
    Entry { parent: u64, name: String },
    Inode(u64),
}

/// Receives invalidations (the FUSE layer forwards them to the kernel).
pub type Invalidator = Box<dyn Fn(Invalidation) + Send + std::marker::Sync>;

/// An invalidator shared with whoever commits out of band.
pub(super) type SharedInvalidator = Arc<dyn Fn(Invalidation) + Send + std::marker::Sync>;

fn invalid(msg: String) -> Error {
    Error::History(msg)
}

impl Fs {
    /// Where changes that bypass the kernel are reported.
    pub fn set_invalidator(&self, f: Invalidator) {
        *lock(&self.invalidator) = Some(Arc::from(f));
    }

    fn require_history(&self) -> Result<()> {
        if self.store().history_on() {
            Ok(())
        } else {
            Err(invalid(
                "history is off for this store (mounted with --keep-history 0)".into(),
            ))
        }
    }

    /// After a commit that bypassed the kernel: open files reload what changed, and the
    /// kernel forgets the touched entries and inodes.
    fn after_out_of_band(&self, dirents: Vec<(u64, String)>, inodes: Vec<u64>) {
        let r = self.store().read();
        for ino in &inodes {
            let f = lock(&self.files).get(ino).cloned();
            if let Some(f) = f {
                let mut g = lock(&f.content);
                match r.as_ref().ok().and_then(|r| r.inode(*ino).ok().flatten()) {
                    Some(i) => {
                        g.committed();
                        g.size = i.size;
                        g.committed_size = i.size;
                    }
                    None => f.unlinked.store(true, std::sync::atomic::Ordering::Release),
                }
            }
        }
        self.invalidate(dirents, inodes);
    }

    /// Tells the kernel to forget these entries and inodes (a directory's inode: its cached
    /// listing too).
    pub fn invalidate(&self, dirents: Vec<(u64, String)>, inodes: Vec<u64>) {
        let inval = lock(&self.invalidator).clone();
        if let Some(inval) = inval {
            for (parent, name) in dirents {
                inval(Invalidation::Entry { parent, name });
            }
            for ino in inodes {
                inval(Invalidation::Inode(ino));
            }
        }
    }

    /// Commits `w` durably and tells open files and the kernel what it changed.
    fn commit_out_of_band(&self, w: WriteTxn<'_>) -> Result<u64> {
        let (dirents, inodes) = w.touched();
        let seq = self.commit_numbered(w, Sync::Durable)?;
        self.after_out_of_band(dirents, inodes);
        Ok(seq)
    }

    /// Brings the whole store back to history point `seq`, in one new transaction. Returns
    /// how many records it undid.
    pub fn rollback(&self, caller: Caller, seq: u64) -> Result<usize> {
        self.writable()?;
        self.require_history()?;
        self.flush_all();
        self.store()
            .read()?
            .check_reachable(seq)
            .map_err(|e| invalid(e.to_string()))?;
        let mut w = self.store().write()?;
        let before = w.usage()?;
        // Newest record first, each a part at a time.
        let records = w.undo_after(seq)?;
        self.check_brought_back(&mut w, &before, None)?;
        self.describe(
            &mut w,
            caller,
            "rollback",
            0,
            |_| vec![format!("@{seq}")],
            0,
            0,
        );
        self.commit_out_of_band(w)?;
        Ok(records)
    }

    /// Brings one file or directory tree back to its state at history point `seq`, in one
    /// new transaction: what is there now is removed, what was there then comes back (with
    /// its content blobs shared, not copied).
    pub fn revert(&self, caller: Caller, path: &str, seq: u64) -> Result<()> {
        self.writable()?;
        self.require_history()?;
        self.flush_all();
        let parts: Vec<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .map(|p| {
                self.parse_name(p.as_bytes())
                    .map(|n| n.as_str().to_string())
            })
            .collect::<Result<_>>()?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(invalid(
                "revert of / is a rollback: use `redbfs rollback`".into(),
            ));
        };
        // The tree at `seq`, read through history's index from a snapshot taken before the
        // write lock: records after `seq` are immutable, so the snapshot is the past's.
        let now = self.store().read()?;
        let then = now.past(seq).map_err(|e| invalid(e.to_string()))?;
        let walk = |get: &dyn Fn(u64, &str) -> Result<Option<u64>>| -> Result<Option<u64>> {
            let mut cur = ROOT_INO;
            for p in parents {
                match get(cur, p)? {
                    Some(i) => cur = i,
                    None => return Ok(None),
                }
            }
            Ok(Some(cur))
        };
        let then_parent = walk(&|d, n| Ok(then.lookup(d, n)?.map(|x| x.0)))?;
        let then_ino = match then_parent {
            Some(p) => then.lookup(p, name)?.map(|x| x.0),
            None => None,
        };

        let mut w = self.store().write()?;
        let parent = walk(&|d, n| Ok(w.lookup(d, n)?.filter(|x| x.1 == Kind::Dir).map(|x| x.0)))?
            .ok_or_else(|| {
            invalid(format!(
                "{path}: its directory does not exist now; revert the directory"
            ))
        })?;
        let mut removals = Vec::new();
        let res = self.revert_in(&mut w, &then, (parent, name), then_ino, &mut removals);
        let res = res.and_then(|()| {
            self.describe(
                &mut w,
                caller,
                "revert",
                then_ino.unwrap_or(0),
                |_| vec![format!("/{}", parts.join("/")), format!("@{seq}")],
                0,
                0,
            );
            self.commit_out_of_band(w)
        });
        // Staged removals end with the transaction, committed or given up.
        for (ino, r) in removals {
            self.finish_removal(ino, r, res.as_ref().ok().copied());
        }
        res.map(drop)
    }

    /// A revert's changes in `w`: the tree at `name` under `parent` removed, the one inode
    /// `then_ino` headed in `then` restored there, within the limits (`check_brought_back`).
    fn revert_in(
        &self,
        w: &mut WriteTxn<'_>,
        then: &Past<'_>,
        (parent, name): (u64, &str),
        then_ino: Option<u64>,
        removals: &mut Vec<(u64, super::Removal)>,
    ) -> Result<()> {
        let before = w.usage()?;
        let mut quota = None;
        if let Some((now_ino, kind)) = w.lookup(parent, name)? {
            if kind == Kind::Dir {
                quota = Some(w.subtree(now_ino)?).filter(|q| q.has_quota());
            }
            self.remove_tree(w, parent, name, now_ino, kind, removals)?;
        }
        if let Some(ino) = then_ino {
            self.restore_tree(w, then, ino, parent, name)?;
        }
        let top = self.parse_name(name.as_bytes())?;
        let restored = w.lookup(parent, name)?;
        self.check_brought_back(w, &before, restored.map(|(i, k)| (parent, &top, i, k)))?;
        // A quota belongs to the directory at that path now, whatever inode it gets back.
        if let (Some(q), Some((ino, Kind::Dir))) = (quota, restored) {
            w.set_quota(ino, q.quota_bytes, q.quota_files)?;
        }
        let now = crate::store::now_ns();
        let mut p = w.inode(parent)?.ok_or(Error::NotFound)?;
        p.mtime = now;
        p.ctime = now;
        w.put_inode(&p)?;
        Ok(())
    }

    /// Removes the files at `paths` (what `expire` chose) in one durable transaction: a
    /// file the kernel references or a handle holds becomes an orphan, as with unlink; the
    /// kernel is told to drop the names. A path that is gone or not a file is passed over,
    /// and so, with `cutoff` (ns), is a file read or written since then: the file at the path
    /// may have been written, or replaced, after `expire` chose it. Returns the paths removed.
    pub fn remove_files(
        &self,
        caller: Caller,
        paths: &[String],
        cutoff: Option<i64>,
    ) -> Result<Vec<String>> {
        self.writable()?;
        self.flush_all();
        let mut w = self.store().write()?;
        let mut removals = Vec::new();
        let mut removed = Vec::new();
        // What the kernel must drop, whether or not history names it.
        let (mut names, mut inodes) = (Vec::new(), Vec::new());
        let now = crate::store::now_ns();
        for p in paths {
            let (parent, name) = match p.trim_end_matches('/').rsplit_once('/') {
                Some((dir, name)) if !name.is_empty() => (dir, name),
                _ => continue,
            };
            let mut dir = ROOT_INO;
            let mut found = true;
            for part in parent.split('/').filter(|s| !s.is_empty()) {
                let part = self.parse_name(part.as_bytes())?;
                match w.lookup(dir, part.as_str())? {
                    Some((ino, Kind::Dir)) => dir = ino,
                    _ => {
                        found = false;
                        break;
                    }
                }
            }
            let name = self.parse_name(name.as_bytes())?;
            let Some((ino, Kind::File)) = w.lookup(dir, name.as_str())?.filter(|_| found) else {
                continue;
            };
            if let Some(cutoff) = cutoff {
                let i = self.overlay(w.inode(ino)?.ok_or(Error::NotFound)?);
                if i.atime.max(i.mtime) >= cutoff {
                    continue;
                }
            }
            let r = self.claim_removal(ino);
            Self::stage_removal(&mut w, ino, &r)?;
            removals.push((ino, r));
            w.remove_dirent(dir, name.as_str())?;
            let mut d = w.inode(dir)?.ok_or(Error::NotFound)?;
            d.mtime = now;
            d.ctime = now;
            w.put_inode(&d)?;
            removed.push(p.clone());
            names.push((dir, name.as_str().to_string()));
            // The directory's times changed; an open file's buffer is left alone.
            inodes.push(dir);
        }
        self.describe(&mut w, caller, "expire", 0, |_| removed.clone(), 0, 0);
        let res = self.commit_numbered(w, Sync::Durable);
        if res.is_ok() {
            inodes.sort_unstable();
            inodes.dedup();
            self.after_out_of_band(names, inodes);
        }
        for (ino, r) in removals {
            self.finish_removal(ino, r, res.as_ref().ok().copied());
        }
        res.map(|_| removed)
    }

    /// Removes the tree at `name` under `parent` in `w` (what the kernel references or a handle
    /// holds becomes an orphan). Walked with a stack of its own, not by recursion: a deep tree
    /// cannot exhaust the thread's stack.
    fn remove_tree(
        &self,
        w: &mut WriteTxn<'_>,
        parent: u64,
        name: &str,
        ino: u64,
        kind: Kind,
        removals: &mut Vec<(u64, super::Removal)>,
    ) -> Result<()> {
        // Each entry is removed after everything below it: (parent, name, inode, kind,
        // whether its entries are already on the stack).
        let mut stack = vec![(parent, name.to_string(), ino, kind, false)];
        while let Some((parent, name, ino, kind, opened)) = stack.pop() {
            if kind == Kind::Dir && !opened {
                stack.push((parent, name, ino, kind, true));
                for e in w.list(ino, usize::MAX)? {
                    stack.push((ino, e.name, e.ino, e.kind, false));
                }
                continue;
            }
            if kind == Kind::Dir {
                let mut p = w.inode(parent)?.ok_or(Error::NotFound)?;
                p.nlink -= 1;
                w.put_inode(&p)?;
            }
            let r = self.claim_removal(ino);
            Self::stage_removal(w, ino, &r)?;
            removals.push((ino, r));
            w.remove_dirent(parent, &name)?;
        }
        Ok(())
    }

    /// Recreates, under `parent` as `name`, the tree that inode `ino` heads in `then`, with a
    /// stack of its own (no recursion).
    fn restore_tree(
        &self,
        w: &mut WriteTxn<'_>,
        then: &Past<'_>,
        ino: u64,
        parent: u64,
        name: &str,
    ) -> Result<()> {
        let mut stack = vec![(ino, parent, name.to_string())];
        while let Some((ino, parent, name)) = stack.pop() {
            let mut inode = then.inode(ino)?.ok_or(Error::NotFound)?;
            // Keep the inode number where it is free; a file now living elsewhere keeps its
            // own.
            inode.ino = if w.inode(ino)?.is_none() {
                ino
            } else {
                w.alloc_ino()?
            };
            inode.parent = parent;
            inode.name = name.clone();
            inode.ctime = crate::store::now_ns();
            if inode.kind == Kind::Dir {
                inode.nlink = 2;
            }
            // A file's chunk 0 may live in its record: it comes back with it.
            w.put_inode_with_inline(&inode, then.inline_part_of(ino)?.as_deref())?;
            w.put_dirent(parent, &name, inode.ino, inode.kind)?;
            if inode.kind == Kind::Dir {
                let mut p = w.inode(parent)?.ok_or(Error::NotFound)?;
                p.nlink += 1;
                w.put_inode(&p)?;
                for e in then.list(ino)? {
                    stack.push((e.ino, inode.ino, e.name));
                }
            } else {
                for (idx, blob) in then.filemap_of(ino)? {
                    if !w.blob_exists(blob)? {
                        return Err(invalid(format!(
                            "{name}: the content at that point has expired"
                        )));
                    }
                    w.set_filemap(inode.ino, idx, Some(blob))?;
                }
            }
        }
        Ok(())
    }

    /// Labels the current point of history.
    pub fn mark(&self, name: &str) -> Result<u64> {
        self.writable()?;
        self.require_history()?;
        self.flush_all();
        if name.is_empty() || name.bytes().all(|b| b.is_ascii_digit()) || name.starts_with('@') {
            return Err(invalid(format!(
                "{name:?}: a mark needs a name that is not a number"
            )));
        }
        // Read under the write lock: the newest record cannot then take in a write first.
        let mut w = self.store().write()?;
        w.without_history();
        let seq = w.last_seq()?;
        w.set_mark(name, seq)?;
        self.commit(w, Sync::Durable)?;
        Ok(seq)
    }

    /// Erases the content of past versions of `path` (all of them, or only the version seen
    /// at `at`), keeping the records that they existed; the current content stays. Returns the
    /// number of content chunks erased. The bytes leave the file at the next `compact`.
    pub fn redact(&self, path: &str, at: Option<u64>) -> Result<usize> {
        self.writable()?;
        self.flush_all();
        let r = self.store().read()?;
        let records = r.history_of(Some(path), None, usize::MAX)?;
        let mut inline_version = None;
        let mut blobs: Vec<u64> = match at {
            Some(seq) => {
                let then = r.past(seq).map_err(|e| invalid(e.to_string()))?;
                let (inode, _) = super::resolve_path(&then, path).map_err(invalid)?;
                inline_version = then.inline_part_of(inode.ino)?;
                TreeView::filemap_of(&then, inode.ino)?
                    .into_iter()
                    .map(|(_, b)| b)
                    .collect()
            }
            None => records
                .iter()
                .flat_map(|rec| &rec.undo)
                .filter_map(|u| match u {
                    crate::store::Undo::Filemap { old: Some(b), .. } => Some(*b),
                    _ => None,
                })
                .collect(),
        };
        // The current content is not history: of the file at `path`, or of every file below
        // the directory at `path` (a revert may have made an old version current again).
        let mut current_files = Vec::new();
        if let Ok((now, _)) = super::resolve_path(&r, path) {
            let mut current = std::collections::HashSet::new();
            let mut stack = vec![(now.ino, now.kind)];
            while let Some((ino, kind)) = stack.pop() {
                match kind {
                    Kind::File => {
                        current_files.push(ino);
                        current.extend(r.filemap_of(ino)?.into_iter().map(|(_, b)| b));
                    }
                    Kind::Dir => stack.extend(r.list(ino)?.into_iter().map(|e| (e.ino, e.kind))),
                }
            }
            blobs.retain(|b| !current.contains(b));
        }
        blobs.sort_unstable();
        blobs.dedup();
        // The path's before-images kept as another version, whole: each is written whole,
        // so that erasing the version it was kept against leaves it.
        let mut wholes = std::collections::HashMap::new();
        for rec in &records {
            for u in &rec.undo {
                if let crate::store::Undo::Inode { ino, old: Some(b) } = u
                    && crate::store::content_kept(b)
                    && let Ok(w) = r.whole_image(rec.seq, *ino, b)
                {
                    wholes.insert((rec.seq, *ino), w);
                }
            }
        }
        // Chunks held in inode records: the version's, or every one the path's records hold;
        // never one the current content holds (a revert may have made it current again).
        let mut inline_parts: std::collections::HashSet<Vec<u8>> = match at {
            Some(_) => inline_version.into_iter().collect(),
            None => records
                .iter()
                .flat_map(|rec| rec.undo.iter().map(move |u| (rec.seq, u)))
                .filter_map(|(seq, u)| match u {
                    crate::store::Undo::Inode { ino, old: Some(b) } => {
                        let b = wholes.get(&(seq, *ino)).unwrap_or(b);
                        crate::store::inline_part(b).map(<[u8]>::to_vec)
                    }
                    _ => None,
                })
                .collect(),
        };
        for ino in &current_files {
            if let Some(p) = r.inline_part_of(*ino)? {
                inline_parts.remove(&p);
            }
        }
        // A version kept as a delta in a record the path's log does not list (before a
        // rename into the path): every record's delta image with the checksum of a version
        // to erase is rebuilt, and erased when it is that version.
        let sums: std::collections::HashSet<&[u8]> =
            inline_parts.iter().filter_map(|p| p.get(1..5)).collect();
        r.for_each_undo(|seq, u| {
            if let crate::store::Undo::Inode { ino, old: Some(b) } = u
                && crate::store::content_kept(b)
                && !wholes.contains_key(&(seq, *ino))
                && crate::store::inline_part(b)
                    .and_then(|p| p.get(1..5))
                    .is_some_and(|s| sums.contains(s))
                && let Ok(w) = r.whole_image(seq, *ino, b)
                && crate::store::inline_part(&w).is_some_and(|p| inline_parts.contains(p))
            {
                wholes.insert((seq, *ino), w);
            }
            Ok(())
        })?;
        drop(r);
        let mut w = self.store().write()?;
        // Redaction is not undoable: that is its point.
        w.without_history();
        let mut erased = 0;
        for b in &blobs {
            if w.redact_blob(*b)? {
                erased += 1;
            }
        }
        let inline_erased = w.redact_inline_everywhere(&inline_parts, &wholes)?;
        for mut rec in records {
            let touches = rec.undo.iter().any(|u| matches!(u, crate::store::Undo::Filemap { old: Some(b), .. } if blobs.contains(b)));
            if touches && !rec.redacted {
                rec.redacted = true;
                w.put_record(&rec)?;
            }
        }
        self.commit(w, Sync::Durable)?;
        Ok(erased + inline_erased)
    }
}
