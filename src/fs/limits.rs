//! The limits every path in must keep: file size, the quota (counting what open files have
//! buffered), the daemon's buffer memory, and the path rules of a new or moved entry.

use super::*;

impl Fs {
    pub(super) fn check_file_size(&self, size: u64) -> Result<()> {
        if size > self.limits.max_file_bytes {
            return Err(Error::FileTooBig {
                limit: self.limits.max_file_bytes,
            });
        }
        Ok(())
    }

    /// Counts an open file growing to `new_size` against `--quota` and against the quota of
    /// every directory above it, before the growth is accepted: committed content plus what
    /// every open file has buffered beyond its committed size (five files open at once each
    /// took 900 KB under a 1 MB quota when only committed bytes counted). The file's share is
    /// held in `g.reserved` (and `g.dir_reserved`) until its commit.
    pub(super) fn reserve(&self, g: &mut OpenFile, new_size: u64) -> Result<()> {
        let limit = self.limits.quota_bytes;
        let extra = new_size
            .saturating_sub(g.committed_size)
            .saturating_sub(g.reserved);
        if extra == 0 {
            return Ok(());
        }
        let total = self.store.hold_quota(extra);
        let checked = if limit == 0 {
            Ok(())
        } else {
            match self.store.read().and_then(|r| r.usage()) {
                Ok(u) if u.content_bytes.saturating_add(total) > limit => {
                    Err(Error::QuotaExceeded { limit })
                }
                Ok(_) => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
        .and_then(|()| self.reserve_in_dirs(g, extra));
        if let Err(e) = checked {
            self.store.release_quota(extra);
            return Err(e);
        }
        g.reserved += extra;
        Ok(())
    }

    /// Where content that leaves memory goes (a private temporary file, unlinked from the
    /// start): beside the store, on the disk the store's room is checked on.
    pub(super) fn spill_dir(&self) -> std::path::PathBuf {
        self.store
            .path()
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."))
            .to_path_buf()
    }

    /// Counts `g`'s buffer memory after a change; past `--max-buffer` for all open files
    /// together, this file's buffer moves to its spill file (the writer that crosses the
    /// bound pays, so memory stays within the bound plus one write).
    pub(super) fn account(&self, g: &mut OpenFile) -> Result<()> {
        let now = g.buffered_bytes() as u64;
        let before = g.accounted as u64;
        let total = if now >= before {
            self.buffered.fetch_add(now - before, Ordering::AcqRel) + (now - before)
        } else {
            self.buffered.fetch_sub(before - now, Ordering::AcqRel) - (before - now)
        };
        g.accounted = now as usize;
        if total > self.limits.max_buffer_bytes {
            g.spill(&self.spill_dir())?;
            self.buffered.fetch_sub(now, Ordering::AcqRel);
            g.accounted = 0;
        }
        Ok(())
    }

    /// Gives back an open file's share of the quota: its content is committed (and counted
    /// in the store's usage) or dropped.
    pub(super) fn unreserve(&self, g: &mut OpenFile) {
        if g.reserved > 0 {
            self.store.release_quota(g.reserved);
            g.reserved = 0;
        }
        self.unreserve_in_dirs(g);
    }

    /// Checks that a new entry `name` under `parent` keeps within the path limits and, for a
    /// new inode (`moving` is None), that the store may hold one more; `moving` is the inode a
    /// rename brings there, which may differ from its old name only in case.
    pub(super) fn check_new_entry(
        &self,
        w: &WriteTxn<'_>,
        parent: u64,
        name: &Name,
        moving: Option<u64>,
    ) -> Result<()> {
        let (bytes, depth) = self.path_cost(w, parent, name.as_str())?;
        self.check_path(bytes, depth)?;
        if self.limits.names == NameRules::Portable {
            let folded = name.fold_case();
            let clash = w.list(parent, usize::MAX)?.into_iter().any(|e| {
                Some(e.ino) != moving
                    && e.name != name.as_str()
                    && name::fold_case(&e.name) == folded
            });
            if clash {
                return Err(Error::Name(NameError::PortableCaseClash));
            }
        }
        if moving.is_none() {
            let u = w.usage()?;
            if u.files + u.dirs >= self.limits.max_files {
                return Err(Error::TooManyFiles {
                    limit: self.limits.max_files,
                });
            }
        }
        Ok(())
    }

    /// Bytes ("/a/b" is 4) and levels of the path of `name` under `parent`; the walk up
    /// stops one level past the depth limit (a deeper chain is refused anyway).
    pub(super) fn path_cost(
        &self,
        w: &WriteTxn<'_>,
        parent: u64,
        name: &str,
    ) -> Result<(usize, usize)> {
        let mut bytes = name.len() + 1;
        let mut depth = 1;
        let mut cur = parent;
        while cur != ROOT_INO && depth <= self.limits.max_depth {
            let i = w.inode(cur)?.ok_or(Error::NotFound)?;
            bytes += i.name.len() + 1;
            depth += 1;
            cur = i.parent;
        }
        Ok((bytes, depth))
    }

    pub(super) fn check_path(&self, bytes: usize, depth: usize) -> Result<()> {
        if depth > self.limits.max_depth {
            return Err(Error::TooDeep {
                depth,
                limit: self.limits.max_depth,
            });
        }
        if bytes > self.limits.max_path_bytes {
            return Err(Error::PathTooLong {
                bytes,
                limit: self.limits.max_path_bytes,
            });
        }
        Ok(())
    }

    /// A directory moving from (`old_bytes`, `old_depth`) to a longer or deeper place: every
    /// entry under it must stay within the path limits there. The directory's row bounds its
    /// deepest and longest relative path (see `store::subtree`), so the common case reads one
    /// row whatever the size of the subtree; only when the bound says a limit might be
    /// crossed does an exact walk decide (and tighten the bounds it found loose).
    pub(super) fn check_moved_subtree(
        &self,
        w: &mut WriteTxn<'_>,
        dir: u64,
        (old_bytes, old_depth): (usize, usize),
        (new_bytes, new_depth): (usize, usize),
    ) -> Result<()> {
        if new_bytes <= old_bytes && new_depth <= old_depth {
            return Ok(());
        }
        let within = |(depth, bytes): (u32, u32)| {
            self.check_path(new_bytes + bytes as usize, new_depth + depth as usize)
        };
        let row = w.subtree(dir)?;
        if within((row.depth, row.path_bytes)).is_ok() {
            return Ok(());
        }
        within(w.exact_bounds(dir)?)
    }

    /// What a revert or rollback brings back keeps the limits a change through the mount
    /// keeps: it may not take the store past `--max-files` or `--quota` (counting what open
    /// files have buffered) when it adds entries or content; what was within them at that
    /// point may be over them now that they were lowered, and is then refused, naming the
    /// limit. `top` is a revert's restored entry (parent, name, inode, kind): its name keeps
    /// today's rules (`--names portable` clashes) and its whole tree the path limits.
    pub(super) fn check_brought_back(
        &self,
        w: &mut WriteTxn<'_>,
        before: &crate::store::Usage,
        top: Option<(u64, &Name, u64, Kind)>,
    ) -> Result<()> {
        let after = w.usage()?;
        let entries = |u: &crate::store::Usage| u.files + u.dirs;
        if entries(&after) > self.limits.max_files && entries(&after) > entries(before) {
            return Err(Error::TooManyFiles {
                limit: self.limits.max_files,
            });
        }
        let limit = self.limits.quota_bytes;
        if limit > 0
            && after.content_bytes > before.content_bytes
            && after.content_bytes.saturating_add(self.store.quota_held()) > limit
        {
            return Err(Error::QuotaExceeded { limit });
        }
        if let Some((parent, name, ino, kind)) = top {
            self.check_new_entry(w, parent, name, Some(ino))?;
            if kind == Kind::Dir {
                let (bytes, depth) = self.path_cost(w, parent, name.as_str())?;
                let (below_depth, below_bytes) = w.exact_bounds(ino)?;
                self.check_path(bytes + below_bytes as usize, depth + below_depth as usize)?;
            }
        }
        Ok(())
    }
}
