//! Directories: opendir, readdir (offsets that mean the same in every handle), readdirplus's
//! attributes (each a kernel reference) and releasedir.

use std::hash::BuildHasher;

use super::*;

/// An entry as readdir hands it out, with its offset: where a listing resumes after it.
#[derive(Clone, Debug)]
pub struct Listed {
    pub off: u64,
    pub entry: DirEntry,
}

impl std::ops::Deref for Listed {
    type Target = DirEntry;
    fn deref(&self) -> &DirEntry {
        &self.entry
    }
}

/// Where a listing resumes after `offset`: the index of its first entry past it.
pub fn resume_at(listing: &[Listed], offset: u64) -> usize {
    listing.partition_point(|l| l.off <= offset)
}

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

    /// The readdir offset of `name`: a keyed hash of it, the same in every handle and every
    /// listing for the mount's life (as ext4's are a hash of the name), above 1 and 2 (`.` and
    /// `..`) and within the kernel's signed offsets. The key is the daemon's own, so no client
    /// can choose names that share an offset.
    fn cookie(&self, name: &str) -> u64 {
        3 + (self.cookies.hash_one(name) >> 2)
    }

    /// The entries of an open directory, `.` and `..` first (offsets 1 and 2), then in the
    /// order of their offsets (`cookie`); `resume_at` finds where a read at an offset starts.
    /// An offset names the same point in any listing of the directory, whichever handle took
    /// it and whenever: the kernel's readdir cache continues one handle's listing with
    /// another's, and then still lists each entry that stays exactly once. The listing is taken
    /// when reading starts at offset 0 (or a handle's first read is past it) and kept for the
    /// handle.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<Arc<Vec<Listed>>> {
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
        let dot = |off, name: &str, ino| Listed {
            off,
            entry: DirEntry {
                name: name.into(),
                ino,
                kind: Kind::Dir,
            },
        };
        let mut entries = vec![dot(1, ".", ino), dot(2, "..", me.parent)];
        let mut named: Vec<Listed> = r
            .list(ino)?
            .into_iter()
            .map(|entry| Listed {
                off: self.cookie(&entry.name),
                entry,
            })
            .collect();
        named.sort_unstable_by(|a, b| (a.off, &a.name).cmp(&(b.off, &b.name)));
        entries.extend(named);
        let entries = Arc::new(entries);
        if let Some(d) = lock(&self.dirs).get_mut(&fh) {
            d.entries = Some(entries.clone());
        }
        Ok(entries)
    }

    /// Attributes for a batch of entries, in one read transaction, each but `.` and `..`
    /// counted as a kernel reference (readdirplus); None for an entry gone since the listing.
    /// The caller `forget`s those it does not send.
    pub fn attrs(&self, entries: &[Listed]) -> Result<Vec<Option<Inode>>> {
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
