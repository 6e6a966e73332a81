//! What an open handle on a follower reads: the version of its file it opened, whatever later
//! batches change, as an open file on a local disk keeps a replaced inode.
//!
//! At open a handle pins a read transaction of the store (shared by the handles opened at
//! the same batch). After each batch the applier settles every pin older than that batch
//! (`Fs::settle_pins`): a file the batch left alone is pinned again to the store as it is
//! now; one it changed or removed is copied out of the pinned version (into memory when
//! small, else into a private spill file beside the store), once for all the handles that
//! opened that version, and the pin goes. A read transaction keeps every page freed after
//! it from reuse, so one held across batches would grow the follower's store with all of its
//! writer's churn; settled this way, handles pin at most the store as it is and as it was
//! before the last batch (which the store keeps anyway, `Store::before_last_batch`), and hold
//! beyond that at most a copy of each version of a file they opened.
//!
//! Invariant: settling never changes what a handle reads. It swaps in a new `Pinned` that
//! reads the same bytes; a read that took the old one finishes on it.

use std::os::unix::fs::FileExt;

use super::*;
use crate::store::{CHUNK_SIZE, ReadTxn};

/// A file this small that a batch changes under an open handle is copied into memory...
const COPY_IN_MEMORY: u64 = 256 << 10;

/// ...while such copies hold at most this much memory together; past it, and for a larger
/// file, the copy goes to a spill file.
const COPIES_IN_MEMORY: u64 = 16 << 20;

/// Chunks read from the store at a time while a file is copied to its spill file.
const COPY_CHUNKS: u64 = 16;

/// The version of its file an open handle on a follower reads.
pub(super) struct Pinned {
    /// The file's record in that version (its size, and what fstat answers once a batch
    /// removed it).
    pub inode: Inode,
    /// The batch (`Store::read_batch`) the version is at least as new as.
    batch: u64,
    source: Source,
}

enum Source {
    /// The whole store at that version.
    Store(Arc<ReadTxn>),
    /// The file's content, copied out of it.
    Copy(Arc<Copy>),
}

/// A file's content copied out of a pinned version; memory it holds is counted in
/// `Fs::pin_copies` until it is dropped.
struct Copy {
    data: CopyData,
    counted: u64,
    held: Arc<AtomicU64>,
}

enum CopyData {
    Memory(Vec<u8>),
    /// An anonymous file (created 0600 and unlinked from the start), the content at its own
    /// offsets; holes are holes.
    Spilled(std::fs::File),
}

impl Drop for Copy {
    fn drop(&mut self) {
        self.held.fetch_sub(self.counted, Ordering::AcqRel);
    }
}

fn copy_error(e: std::io::Error) -> Error {
    Error::Store(StoreError::Io(format!(
        "a follower's copy of an open file: {e}"
    )))
}

impl Pinned {
    /// Reads up to `len` bytes at `offset` of the file as this version holds it; holes read
    /// as zeros.
    pub fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>> {
        let size = self.inode.size;
        if offset >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(offset.saturating_add(len as u64));
        match &self.source {
            Source::Store(txn) => read_txn(txn, self.inode.ino, offset, end),
            Source::Copy(c) => match &c.data {
                CopyData::Memory(d) => Ok(d[offset as usize..end as usize].to_vec()),
                CopyData::Spilled(f) => {
                    let mut out = vec![0u8; (end - offset) as usize];
                    f.read_exact_at(&mut out, offset).map_err(copy_error)?;
                    Ok(out)
                }
            },
        }
    }

    /// Whether this still pins a version of the whole store.
    pub fn pins_store(&self) -> bool {
        matches!(self.source, Source::Store(_))
    }
}

/// Bytes `offset..end` of `ino` as `txn` holds them; holes read as zeros.
fn read_txn(txn: &ReadTxn, ino: u64, offset: u64, end: u64) -> Result<Vec<u8>> {
    let mut out = vec![0u8; (end - offset) as usize];
    let first = offset / CHUNK_SIZE;
    let last = (end - 1) / CHUNK_SIZE;
    let chunks = txn.chunks(ino, first, last - first + 1)?;
    for (idx, data) in (first..).zip(chunks) {
        let Some(data) = data else {
            continue;
        };
        let chunk_start = idx * CHUNK_SIZE;
        let from = offset.max(chunk_start);
        let to = end.min(chunk_start + data.len() as u64);
        if from < to {
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - chunk_start) as usize..(to - chunk_start) as usize]);
        }
    }
    Ok(out)
}

impl Fs {
    /// On a frozen store (a follower's, which changes only by whole batches from its
    /// writer): the store as it is now, for a handle to read `ino` from; or, when the last
    /// batch took the inode after the kernel looked it up, the store before that batch (what
    /// the lookup found, as a local disk keeps a replaced inode for its holder). Stale when
    /// neither holds it (several batches since the lookup): the kernel looks the path up again.
    pub(super) fn pin_version(&self, ino: u64) -> Result<Option<Arc<Pinned>>> {
        if self.store.frozen().is_none() {
            return Ok(None);
        }
        let (now, batch, exact) = self.store.read_batch()?;
        let (txn, batch, inode) = match now.inode(ino)? {
            Some(i) => (self.shared_pin(now, batch, exact), batch, i),
            None => {
                let before = self.store.before_last_batch().ok_or(Error::Stale)?;
                let i = before.inode(ino)?.ok_or(Error::Stale)?;
                // The store before the last batch, or before the one that came after `batch`.
                (before, batch.saturating_sub(1), i)
            }
        };
        if inode.kind == Kind::Dir {
            return Err(Error::IsDir);
        }
        Ok(Some(Arc::new(Pinned {
            inode,
            batch,
            source: Source::Store(txn),
        })))
    }

    /// `now`, read at `batch` (exactly, or at least), as handles share it: one read
    /// transaction for every handle opened at one batch, so they share one copy when a
    /// batch changes their file.
    fn shared_pin(&self, now: ReadTxn, batch: u64, exact: bool) -> Arc<ReadTxn> {
        if !exact {
            return Arc::new(now);
        }
        let mut shared = lock(&self.pin_now);
        match &*shared {
            Some((b, txn)) if *b == batch => txn.clone(),
            // A batch came since: this open's version is not the one to share.
            Some((b, _)) if *b > batch => Arc::new(now),
            _ => {
                let txn = Arc::new(now);
                *shared = Some((batch, txn.clone()));
                txn
            }
        }
    }

    /// `ino` as an open handle's pinned version holds it (see `pin_version`).
    pub(super) fn pinned_inode(&self, ino: u64) -> Option<Inode> {
        lock(&self.handles)
            .values()
            .filter_map(|h| h.pinned.as_ref())
            .find(|p| p.inode.ino == ino)
            .map(|p| p.inode.clone())
    }

    /// After the applier's batch (which changed the inodes `changed` names), or with `all`
    /// before a follower is promoted: every handle that pins a version of the store older
    /// than that batch is pinned to the store as it is now, when its file is one the batch
    /// left alone, or reads a copy of its file from now on, so no read transaction older
    /// than the version before the last batch stays pinned. A copy that fails (a full disk)
    /// leaves that pin as it is, with one warn line; the next batch tries again.
    pub fn settle_pins(&self, changed: &[u64], all: bool) {
        let batch = if all {
            u64::MAX
        } else {
            self.store.batches_applied()
        };
        let stale: Vec<(u64, Arc<Pinned>)> = lock(&self.handles)
            .iter()
            .filter_map(|(&fh, h)| {
                let p = h.pinned.as_ref()?;
                (p.pins_store() && p.batch < batch).then(|| (fh, p.clone()))
            })
            .collect();
        {
            let mut shared = lock(&self.pin_now);
            if shared.as_ref().is_some_and(|(b, _)| *b < batch) {
                *shared = None;
            }
        }
        if stale.is_empty() {
            return;
        }
        let now = if all {
            None
        } else {
            match self.store.read() {
                Ok(r) => Some(Arc::new(r)),
                Err(e) => {
                    crate::warn_limited!(error = %e, "could not read the store to settle open files' versions");
                    return;
                }
            }
        };
        // One new version per file and pinned transaction: handles that opened one version
        // of a file share its copy.
        let mut settled: HashMap<(u64, usize), Arc<Pinned>> = HashMap::new();
        for (_, p) in &stale {
            let Source::Store(txn) = &p.source else {
                continue;
            };
            let ino = p.inode.ino;
            let key = (ino, Arc::as_ptr(txn) as usize);
            if settled.contains_key(&key) {
                continue;
            }
            let unchanged = p.batch + 1 == batch && changed.binary_search(&ino).is_err();
            let source = match &now {
                Some(now) if unchanged => Source::Store(now.clone()),
                _ => match self.copy_out(txn, &p.inode) {
                    Ok(c) => Source::Copy(Arc::new(c)),
                    Err(e) => {
                        crate::warn_limited!(ino, error = %e, "could not copy the version an open file reads; it keeps its read transaction, and the store's file may grow until it is closed");
                        continue;
                    }
                },
            };
            let next = Pinned {
                inode: p.inode.clone(),
                batch,
                source,
            };
            settled.insert(key, Arc::new(next));
        }
        if let Some(now) = now {
            let mut shared = lock(&self.pin_now);
            if shared.is_none() {
                *shared = Some((batch, now));
            }
        }
        let mut handles = lock(&self.handles);
        for (fh, p) in stale {
            let Source::Store(txn) = &p.source else {
                continue;
            };
            let Some(next) = settled.get(&(p.inode.ino, Arc::as_ptr(txn) as usize)) else {
                continue;
            };
            // Unless the handle was released (and its number handed out again) meanwhile.
            if let Some(h) = handles.get_mut(&fh)
                && h.pinned.as_ref().is_some_and(|q| Arc::ptr_eq(q, &p))
            {
                h.pinned = Some(next.clone());
            }
        }
    }

    /// `inode`'s content as `txn` holds it, copied: into memory when it is small and the
    /// copies' memory allows, else into a private spill file beside the store.
    fn copy_out(&self, txn: &ReadTxn, inode: &Inode) -> Result<Copy> {
        let size = inode.size;
        let held = self.pin_copies.clone();
        if size <= COPY_IN_MEMORY
            && held.fetch_add(size, Ordering::AcqRel) + size <= COPIES_IN_MEMORY
        {
            // Counted from here: a failed copy gives it back as it drops.
            let mut c = Copy {
                data: CopyData::Memory(Vec::new()),
                counted: size,
                held,
            };
            if size > 0 {
                c.data = CopyData::Memory(read_txn(txn, inode.ino, 0, size)?);
            }
            return Ok(c);
        }
        if size <= COPY_IN_MEMORY {
            held.fetch_sub(size, Ordering::AcqRel);
        }
        let dir = self.spill_dir();
        let file = tempfile::tempfile_in(&dir).map_err(|e| {
            copy_error(std::io::Error::new(
                e.kind(),
                format!("creating a spill file in {}: {e}", dir.display()),
            ))
        })?;
        file.set_len(size).map_err(copy_error)?;
        let chunks = size.div_ceil(CHUNK_SIZE);
        let mut first = 0;
        while first < chunks {
            let n = COPY_CHUNKS.min(chunks - first);
            for (idx, data) in (first..).zip(txn.chunks(inode.ino, first, n)?) {
                if let Some(data) = data {
                    file.write_all_at(&data, idx * CHUNK_SIZE)
                        .map_err(copy_error)?;
                }
            }
            first += n;
        }
        Ok(Copy {
            data: CopyData::Spilled(file),
            counted: 0,
            held,
        })
    }
}
