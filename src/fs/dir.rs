//! Directories: opendir, readdir (a listing kept per handle so offsets stay valid),
//! readdirplus's attributes (each a kernel reference) and releasedir.

use super::*;

impl Fs {
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let inode = self.store.read()?.inode(ino)?.ok_or(Error::NotFound)?;
        if inode.kind != Kind::Dir {
            return Err(Error::NotDir);
        }
        let fh = self.new_fh();
        lock(&self.dirs).insert(fh, DirHandle { ino, entries: None });
        Ok(fh)
    }

    /// The entries of an open directory, `.` and `..` first; an entry's offset is its index
    /// plus one. The listing is taken when reading starts at offset 0 and kept for the
    /// handle, so offsets stay valid while the directory changes.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<Arc<Vec<DirEntry>>> {
        let ino = {
            let dirs = lock(&self.dirs);
            let d = dirs.get(&fh).ok_or(Error::BadHandle)?;
            if offset != 0
                && let Some(e) = &d.entries
            {
                return Ok(e.clone());
            }
            d.ino
        };
        let r = self.store.read()?;
        let me = r.inode(ino)?.ok_or(Error::NotFound)?;
        let mut entries = vec![
            DirEntry {
                name: ".".into(),
                ino,
                kind: Kind::Dir,
            },
            DirEntry {
                name: "..".into(),
                ino: me.parent,
                kind: Kind::Dir,
            },
        ];
        entries.extend(r.list(ino)?);
        let entries = Arc::new(entries);
        if let Some(d) = lock(&self.dirs).get_mut(&fh) {
            d.entries = Some(entries.clone());
        }
        Ok(entries)
    }

    /// Attributes for a batch of entries, in one read transaction, each but `.` and `..`
    /// counted as a kernel reference (readdirplus); None for an entry gone since the listing.
    /// The caller `forget`s those it does not send.
    pub fn attrs(&self, entries: &[DirEntry]) -> Result<Vec<Option<Inode>>> {
        let epoch = self.lifetimes.epoch();
        let found: Vec<Option<Inode>> = {
            let r = self.store.read()?;
            entries
                .iter()
                .map(|e| r.inode(e.ino))
                .collect::<std::result::Result<_, _>>()?
        };
        let mut out = Vec::with_capacity(found.len());
        for (e, i) in entries.iter().zip(found) {
            out.push(match i {
                Some(i) if is_dot(&e.name) || self.pin(i.ino, epoch)? => Some(self.overlay(i)),
                _ => None,
            });
        }
        Ok(out)
    }

    /// Kernel references to inodes, for status.
    pub fn referenced(&self) -> usize {
        self.lifetimes.referenced()
    }

    pub fn releasedir(&self, fh: u64) -> Result<()> {
        let d = lock(&self.dirs).remove(&fh).ok_or(Error::BadHandle)?;
        // The last descriptor of a removed directory that the kernel no longer references.
        self.reclaim_if_unused(d.ino);
        Ok(())
    }
}
