//! Quotas per directory (`redbfs quota`): setting them, holding open files' buffered growth
//! against them, and what statfs reports inside one. The usage they limit is the store's
//! per-directory aggregate (`store::subtree`), kept in every commit; a commit that would grow
//! a directory past its quota is refused whole by the store (`StoreError::DirQuota`), so
//! every path in (writes, creates, renames, history, import) is held by the same rule.
//!
//! Invariant kept here: `dir_reserved` holds, per directory, the sum of the `dir_reserved`
//! shares of every open file, and a share is given back exactly once (at commit or release).

use super::*;
use crate::store::SubtreeRecord;

/// A directory's quota and what lies below it, for `redbfs quota`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QuotaInfo {
    pub path: String,
    pub ino: u64,
    /// Content bytes allowed below (0: no limit).
    pub bytes_limit: u64,
    /// Files and directories allowed below (0: no limit).
    pub files_limit: u64,
    pub bytes: u64,
    /// Files and directories below.
    pub files: u64,
}

impl QuotaInfo {
    pub fn of(path: String, ino: u64, row: &SubtreeRecord) -> QuotaInfo {
        QuotaInfo {
            path,
            ino,
            bytes_limit: row.quota_bytes,
            files_limit: row.quota_files,
            bytes: row.bytes,
            files: row.entries(),
        }
    }
}

/// Every directory with a quota as `r` sees it, by path; a quota whose directory is gone
/// (kept for history restoring it) is left out.
pub fn quotas(r: &store::ReadTxn) -> Result<Vec<QuotaInfo>> {
    let mut out = Vec::new();
    for (ino, row) in r.quota_rows()? {
        let live = r.inode(ino)?.is_some_and(|i| i.nlink > 0);
        if !row.has_quota() || !live {
            continue;
        }
        out.push(QuotaInfo::of(path_of_inode(r, ino), ino, &row));
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

impl Fs {
    /// Sets the quota of the directory at `path` (both limits 0 clears it), in one durable
    /// transaction; a quota below what the directory holds already is kept and refuses
    /// growth from then on.
    pub fn set_quota(&self, path: &str, bytes: u64, files: u64) -> Result<QuotaInfo> {
        self.writable()?;
        let mut w = self.store.write()?;
        let (ino, canon) = {
            let r = self.store.read()?;
            let (inode, canon) = resolve_path(&r, path).map_err(Error::History)?;
            if inode.kind != Kind::Dir {
                return Err(Error::NotDir);
            }
            (inode.ino, canon)
        };
        // The read above may predate a rename: the transaction decides.
        if w.inode(ino)?.is_none_or(|i| i.nlink == 0) {
            return Err(Error::NotFound);
        }
        w.without_history();
        w.set_quota(ino, bytes, files)?;
        let row = w.subtree(ino)?;
        self.commit(w, Sync::Durable)?;
        if bytes > 0 || files > 0 {
            self.any_quota.store(true, Ordering::Release);
        }
        tracing::info!(path = canon, bytes, files, "quota set");
        Ok(QuotaInfo::of(canon, ino, &row))
    }

    /// Holds `extra` bytes of an open file's growth against the byte quota of every
    /// directory above it: refused when committed content below that directory, plus what
    /// open files there hold, plus `extra` would pass the quota.
    pub(super) fn reserve_in_dirs(&self, g: &mut OpenFile, extra: u64) -> Result<()> {
        if !self.any_quota.load(Ordering::Acquire) {
            return Ok(());
        }
        let roots: Vec<(u64, SubtreeRecord)> = self
            .store
            .read()?
            .quota_roots_above(g.ino)?
            .into_iter()
            .filter(|(_, row)| row.quota_bytes > 0)
            .collect();
        if roots.is_empty() {
            return Ok(());
        }
        let mut held = lock(&self.dir_reserved);
        let over = roots.iter().find(|(dir, row)| {
            let open = held.get(dir).copied().unwrap_or(0);
            row.bytes.saturating_add(open).saturating_add(extra) > row.quota_bytes
        });
        if let Some(&(dir, row)) = over {
            drop(held);
            return Err(Error::DirQuota {
                root: self.path_of(dir),
                files: false,
                limit: row.quota_bytes,
            });
        }
        for (dir, _) in roots {
            *held.entry(dir).or_default() += extra;
            match g.dir_reserved.iter_mut().find(|(d, _)| *d == dir) {
                Some((_, n)) => *n += extra,
                None => g.dir_reserved.push((dir, extra)),
            }
        }
        Ok(())
    }

    /// Gives back an open file's shares of directory quotas.
    pub(super) fn unreserve_in_dirs(&self, g: &mut OpenFile) {
        if g.dir_reserved.is_empty() {
            return;
        }
        let mut held = lock(&self.dir_reserved);
        for (dir, n) in g.dir_reserved.drain(..) {
            if let Some(h) = held.get_mut(&dir) {
                *h = h.saturating_sub(n);
                if *h == 0 {
                    held.remove(&dir);
                }
            }
        }
    }

    /// statfs of the directory (or the file's directory) `ino`: inside a directory with a
    /// quota, that quota and its usage (the innermost byte quota for blocks, the innermost
    /// file quota for inodes); the store's own figures otherwise.
    pub fn statfs_at(&self, ino: u64) -> Result<FsStats> {
        let mut s = self.statfs()?;
        if !self.any_quota.load(Ordering::Acquire) {
            return Ok(s);
        }
        let roots = self.store.read()?.quota_roots_above(ino)?;
        let bs = BLOCK_SIZE as u64;
        if let Some((_, row)) = roots.iter().find(|(_, r)| r.quota_bytes > 0) {
            s.blocks = row.quota_bytes.div_ceil(bs);
            s.blocks_free = s.blocks.saturating_sub(row.bytes.div_ceil(bs));
        }
        if let Some((_, row)) = roots.iter().find(|(_, r)| r.quota_files > 0) {
            s.files = row.quota_files.max(row.entries());
            s.files_free = row.quota_files.saturating_sub(row.entries());
        }
        Ok(s)
    }
}
