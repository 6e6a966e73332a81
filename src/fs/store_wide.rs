//! The whole store: statfs, what status shows of open files, and flushing everything.

use super::*;

impl Fs {
    pub fn statfs(&self) -> Result<FsStats> {
        let usage = self.store.read()?.usage()?;
        let bs = BLOCK_SIZE as u64;
        let (blocks, free) = if self.limits.quota_bytes > 0 {
            let total = self.limits.quota_bytes.div_ceil(bs);
            (
                total,
                total.saturating_sub(usage.content_bytes.div_ceil(bs)),
            )
        } else {
            let used = self.store.file_bytes().div_ceil(bs);
            let avail = store::disk_available(self.store.path()) / bs;
            (used + avail, avail)
        };
        let inodes = usage.files + usage.dirs;
        Ok(FsStats {
            block_size: BLOCK_SIZE,
            blocks,
            blocks_free: free,
            files: self.limits.max_files.max(inodes),
            files_free: self.limits.max_files.saturating_sub(inodes),
            name_max: name::MAX_NAME_BYTES as u32,
        })
    }

    /// Open handles and buffered bytes, for status.
    pub fn open_counts(&self) -> (usize, usize) {
        let files: Vec<_> = lock(&self.files).values().cloned().collect();
        let buffered = files
            .iter()
            .map(|f| lock(&f.content).buffered_bytes())
            .sum();
        (lock(&self.handles).len(), buffered)
    }

    /// Commits everything still buffered (at unmount).
    pub fn flush_all(&self) {
        // Orphans nothing holds any more go first: a history change (redact, say) then sees
        // their content in the history, not in a file without a name.
        self.reclaim_queued();
        let files: Vec<_> = lock(&self.files).values().cloned().collect();
        for f in files {
            let mut g = lock(&f.content);
            if let Err(e) = self.commit_file(&f, &mut g) {
                tracing::error!(ino = g.ino, error = %e, "content could not be committed at unmount");
            }
        }
        if let Err(e) = self.store.sync() {
            tracing::error!(error = %e, "final sync failed");
        }
    }

    /// After a transaction applied to a frozen store from outside every request (a
    /// follower's batch from its replica): the kernel forgets the entries and inodes it
    /// changed, and nothing else. Open handles keep reading the version they opened, as an
    /// open file on a local disk keeps a replaced inode: those whose file it changed read a
    /// copy of it from now on, the others the store as it is now (see `pinned`).
    pub fn changed_outside(&self, changed: crate::store::Changed) {
        self.settle_pins(&changed.inodes, false);
        self.invalidate(changed.dirents, changed.inodes);
    }
}
