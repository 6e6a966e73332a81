//! Removing a last name: unlink and rmdir. An inode the kernel still references or a handle
//! holds becomes an orphan; otherwise it is deleted in the same transaction.

use super::*;

impl Fs {
    /// Decides what removing the last name of `ino` (a file or a directory) does; see
    /// `Removal`.
    pub(super) fn claim_removal(&self, ino: u64) -> Removal {
        // Short locks only: this runs under the store's write lock, so it must never wait for
        // a content lock (a commit holds that while it waits for the write lock).
        let files = lock(&self.files);
        let open = self.is_open(&files, ino);
        match self.lifetimes.claim(ino, open) {
            Claim::Orphan => Removal::Orphan,
            Claim::Delete => Removal::Delete,
        }
    }

    /// Stages the removal in `w`: an orphan mark (nlink 0, as ext4 shows an unlinked open
    /// file), or deletion.
    pub(super) fn stage_removal(w: &mut WriteTxn<'_>, ino: u64, removal: &Removal) -> Result<()> {
        match removal {
            Removal::Orphan => {
                let mut inode = w.inode(ino)?.ok_or(Error::NotFound)?;
                inode.nlink = 0;
                inode.ctime = now_ns();
                w.put_inode(&inode)?;
                w.add_orphan(ino)?;
            }
            Removal::Delete => w.delete_inode(ino)?,
        }
        Ok(())
    }

    /// After the removal's transaction (`committed`: its commit's number, None if it did not
    /// commit): undoes the claim if it did not commit. Once it did, the open file (if any) is
    /// marked unlinked, so its content is committed no more, and a close or fsync of it
    /// waits for the removal's sync (`FileSlot::durable_with`); an orphan whose last
    /// reference went meanwhile is reclaimed now. Marked only now: a removal staged but not
    /// yet committed (a batch's commit is later than its staging) may still fail, and until
    /// it commits an fsync of the file must commit its content.
    pub(super) fn finish_removal(&self, ino: u64, removal: Removal, committed: Option<u64>) {
        match removal {
            Removal::Orphan => {
                if let Some(seq) = committed {
                    if let Some(f) = lock(&self.files).get(&ino) {
                        f.durable_with.fetch_max(seq, Ordering::AcqRel);
                        f.unlinked.store(true, Ordering::Release);
                    }
                    self.reclaim_if_unused(ino);
                } else {
                    self.lifetimes.unclaim(ino);
                }
            }
            Removal::Delete => {
                self.lifetimes.deleted(ino, committed.is_some());
                if committed.is_some() {
                    self.tracker.deleted(ino);
                }
            }
        }
    }

    pub fn unlink(&self, caller: Caller, parent: u64, raw_name: &[u8]) -> Result<()> {
        self.writable()?;
        let name = self.parse_name(raw_name)?;
        self.joinable(|join| {
            let mut w = self.write_for(join, caller.pid, None)?;
            let p = Self::parent_dir(&w, parent)?;
            let (ino, kind) = w.lookup(parent, name.as_str())?.ok_or(Error::NotFound)?;
            if kind == Kind::Dir {
                return Err(Error::IsDir);
            }
            let size = w.inode(ino)?.map_or(0, |i| i.size);
            self.describe(
                &mut w,
                caller,
                "unlink",
                ino,
                |w| vec![self.path_in(w, parent, name.as_str())],
                size,
                0,
            );
            self.remove_last_name(w, p, &name, ino)
        })
    }

    pub fn rmdir(&self, caller: Caller, parent: u64, raw_name: &[u8]) -> Result<()> {
        self.writable()?;
        let name = self.parse_name(raw_name)?;
        self.joinable(|join| {
            let mut w = self.write_for(join, caller.pid, None)?;
            let mut p = Self::parent_dir(&w, parent)?;
            let (ino, kind) = w.lookup(parent, name.as_str())?.ok_or(Error::NotFound)?;
            if kind != Kind::Dir {
                return Err(Error::NotDir);
            }
            if !w.list(ino, 1)?.is_empty() {
                return Err(Error::NotEmpty);
            }
            self.describe(
                &mut w,
                caller,
                "rmdir",
                ino,
                |w| vec![self.path_in(w, parent, name.as_str())],
                0,
                0,
            );
            p.nlink -= 1;
            self.remove_last_name(w, p, &name, ino)
        })
    }

    /// Removes `name` from directory `p` (its record as it is to be written, times aside) and
    /// the last name of `ino` with it, in `w`, durably: the inode is deleted or becomes an
    /// orphan (`claim_removal`).
    fn remove_last_name(
        &self,
        mut w: WriteTxn<'_>,
        mut p: Inode,
        name: &Name,
        ino: u64,
    ) -> Result<()> {
        let removal = self.claim_removal(ino);
        let staged = (|| {
            w.remove_dirent(p.ino, name.as_str())?;
            Self::stage_removal(&mut w, ino, &removal)?;
            let now = now_ns();
            p.mtime = now;
            p.ctime = now;
            w.put_inode(&p)?;
            Ok(())
        })();
        let res = staged.and_then(|()| self.commit_numbered(w, Sync::Durable));
        self.finish_removal(ino, removal, res.as_ref().ok().copied());
        res.map(drop)
    }
}
