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

/// What the listings of all open directory handles may hold in memory together, beside the
/// one being read: past it, the listings read longest ago are let go of, and their handles
/// take a new listing at their next read, resuming at their offset (which means the same in
/// every listing). Each handle kept its own listing whole, so a process holding many
/// descriptors of a large directory, each read a page into, grew the daemon without bound
/// (7.8 MB a descriptor of a 100,000-entry directory).
pub const LISTINGS_HELD: usize = 64 << 20;

/// About what `entries` holds in memory: each entry and its name's heap block.
fn listing_bytes(entries: &[Listed]) -> usize {
    entries
        .iter()
        .map(|l| std::mem::size_of::<Listed>() + l.name.capacity().next_multiple_of(16) + 16)
        .sum()
}

impl DirHandles {
    /// Keeps `entries` as handle `fh`'s listing, letting go of the listings other handles
    /// read longest ago while the total is over the budget.
    fn keep(&mut self, fh: u64, entries: &Arc<Vec<Listed>>) {
        let Some(d) = self.open.get_mut(&fh) else {
            return;
        };
        let bytes = listing_bytes(entries);
        self.held = self.held - d.bytes + bytes;
        d.entries = Some(entries.clone());
        d.bytes = bytes;
        while self.held > self.budget + bytes {
            let oldest = self
                .open
                .iter_mut()
                .filter(|(h, d)| **h != fh && d.entries.is_some())
                .min_by_key(|(_, d)| d.used);
            let Some((_, d)) = oldest else { break };
            d.entries = None;
            self.held -= std::mem::take(&mut d.bytes);
        }
    }

    /// Handle `fh` is being read now.
    fn touch(&mut self, fh: u64) {
        self.clock += 1;
        if let Some(d) = self.open.get_mut(&fh) {
            d.used = self.clock;
        }
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
        lock(&self.dirs).open.insert(
            fh,
            DirHandle {
                ino,
                entries: None,
                bytes: 0,
                used: 0,
            },
        );
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
    /// when reading starts at offset 0 (or a handle's first read is past it, or its listing
    /// was let go of: see `LISTINGS_HELD`) and kept for the handle.
    pub fn readdir(&self, fh: u64, offset: u64) -> Result<Arc<Vec<Listed>>> {
        let ino = {
            let mut dirs = lock(&self.dirs);
            dirs.touch(fh);
            let d = dirs.open.get(&fh).ok_or(Error::BadHandle)?;
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
        lock(&self.dirs).keep(fh, &entries);
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
        let d = {
            let mut dirs = lock(&self.dirs);
            let d = dirs.open.remove(&fh).ok_or(Error::BadHandle)?;
            dirs.held -= d.bytes;
            d
        };
        // The last descriptor of a removed directory that the kernel no longer references.
        self.reclaim_if_unused(d.ino);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{Caller, Limits};
    use crate::store::{ROOT_INO, Store};

    const ME: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 1,
    };

    /// Many handles of a large directory, each read a page into, hold no more than the budget
    /// beside the listing being read; a handle whose listing was let go of goes on where it
    /// was, and lists each name once.
    #[test]
    fn listings_of_open_handles_stay_within_their_budget_and_resume_where_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let d = fs.mkdir(ME, ROOT_INO, b"d", 0o755, 0).unwrap().ino;
        for i in 0..300 {
            let name = format!("memory-{i:04}.md");
            let (_, fh) = fs
                .create(ME, d, name.as_bytes(), 0o644, 0, libc::O_WRONLY)
                .unwrap();
            fs.release(fh).unwrap();
        }
        let first = fs.opendir(d).unwrap();
        let one = listing_bytes(&fs.readdir(first, 0).unwrap());
        lock(&fs.dirs).budget = 2 * one;

        // Ten handles, each read ten entries into.
        let page = 10;
        let mut handles = vec![(first, fs.readdir(first, 0).unwrap()[page - 1].off)];
        for _ in 0..9 {
            let fh = fs.opendir(d).unwrap();
            let listing = fs.readdir(fh, 0).unwrap();
            handles.push((fh, listing[page - 1].off));
            let dirs = lock(&fs.dirs);
            let kept = dirs.open.values().filter(|h| h.entries.is_some()).count();
            assert!(dirs.held <= dirs.budget + one, "{} held", dirs.held);
            assert!(
                kept <= 3,
                "{kept} listings kept, for a budget of two beside one"
            );
        }
        // Each goes on from its offset a page at a time, in turn with the others, so their
        // listings are let go of and taken again.
        let mut going: Vec<(u64, u64, Vec<String>)> = handles
            .into_iter()
            .map(|(fh, off)| (fh, off, Vec::new()))
            .collect();
        while !going.is_empty() {
            going.retain_mut(|(fh, off, seen)| {
                let listing = fs.readdir(*fh, *off).unwrap();
                let rest: Vec<_> = listing[resume_at(&listing, *off)..]
                    .iter()
                    .take(page)
                    .collect();
                let Some(last) = rest.last() else {
                    let mut unique = seen.clone();
                    unique.sort();
                    unique.dedup();
                    assert_eq!(unique.len(), seen.len(), "a name listed twice");
                    assert_eq!(seen.len() + page, 302, "`.`, `..` and 300 names, once each");
                    fs.releasedir(*fh).unwrap();
                    return false;
                };
                *off = last.off;
                seen.extend(rest.iter().map(|l| l.name.clone()));
                true
            });
            let dirs = lock(&fs.dirs);
            assert!(dirs.held <= dirs.budget + one, "{} held", dirs.held);
        }
        assert_eq!(lock(&fs.dirs).held, 0, "released handles hold nothing");
    }
}
