//! Buffered content of one open file. Writes and truncations collect here, per inode and shared
//! by every handle, until `flush`, `fsync` or the last `release` commits them in one durable
//! transaction; until then the store keeps the old content, so a crash leaves either the old
//! file or a completed one, never a mix.
//!
//! Invariant: no chunk (buffered or stored) holds bytes at or beyond `size`, so growing a file
//! only moves `size` and the new range reads as zeros.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};

use crate::store::{CHUNK_SIZE, Inode, Store, WriteTxn};

use super::error::{Error, Result};

/// One open inode. Who holds it and whether its name is gone are atomics, readable without
/// the content lock, so removing a name never waits for a commit of the content (which holds
/// the content lock while it waits for the store's write lock).
#[derive(Debug)]
pub struct FileSlot {
    pub ino: u64,
    /// Open handles (and in-flight truncates) on this inode.
    pub handles: AtomicU32,
    /// The name is gone; content lives until the last release.
    pub unlinked: AtomicBool,
    /// The newest commit a close or fsync of this file answers for (0: none): the one that
    /// created it, the last commit of its content (whichever handle's close or fsync made
    /// it), or the removal of its last name. Another handle's close that finds nothing left
    /// to commit still returns only once this is durable; syncing to it, not to the newest
    /// commit, keeps one close from paying an fsync for other files' commits.
    pub durable_with: AtomicU64,
    pub content: Mutex<OpenFile>,
}

impl FileSlot {
    pub fn new(ino: u64, size: u64) -> FileSlot {
        FileSlot {
            ino,
            handles: AtomicU32::new(0),
            unlinked: AtomicBool::new(false),
            durable_with: AtomicU64::new(0),
            content: Mutex::new(OpenFile::new(ino, size)),
        }
    }
}

#[derive(Debug)]
pub struct OpenFile {
    pub ino: u64,
    /// The size every reader sees now, including buffered writes.
    pub size: u64,
    /// Size in the store, for quota accounting.
    pub committed_size: u64,
    /// mtime and ctime of the last buffered change, written at commit.
    pub pending_mtime: Option<i64>,
    pub pending_ctime: Option<i64>,
    /// Buffered chunks, each holding bytes from the start of the chunk.
    dirty: BTreeMap<u64, Vec<u8>>,
    /// Buffered chunks moved out of memory (see `spill`).
    spilled: Option<Spill>,
    /// Bytes of memory this file's buffer is counted for in `Fs`'s total.
    pub accounted: usize,
    /// Chunks from this index on are void in the store (truncated away).
    drop_from: Option<u64>,
    /// Something is buffered that the store does not have yet.
    pub changed: bool,
    /// Who changed the content last, for the history record of its commit.
    pub last_writer: super::Caller,
    /// That caller's process, told when it wrote (it may have exited by the commit), for
    /// the lost-update tracker.
    pub writer: Option<crate::process::ProcessId>,
    /// The name of the last writer's thread, from the same read of /proc that told
    /// `writer`, for the history record (`None`: the commit reads it).
    pub writer_name: Option<String>,
    /// The handle the last writer was told through (`None`: not through a handle).
    pub writer_fh: Option<u64>,
    /// Bytes of `--quota` this file holds for its buffered growth (see `Fs::reserve`).
    pub reserved: u64,
    /// The same growth held against each directory quota above the file: (directory, bytes).
    pub dir_reserved: Vec<(u64, u64)>,
}

impl OpenFile {
    pub fn new(ino: u64, size: u64) -> OpenFile {
        OpenFile {
            ino,
            size,
            committed_size: size,
            pending_mtime: None,
            pending_ctime: None,
            dirty: BTreeMap::new(),
            drop_from: None,
            changed: false,
            last_writer: super::Caller::default(),
            writer: None,
            writer_name: None,
            writer_fh: None,
            reserved: 0,
            dir_reserved: Vec::new(),
            spilled: None,
            accounted: 0,
        }
    }

    fn voided(&self, idx: u64) -> bool {
        self.drop_from.is_some_and(|d| idx >= d)
    }

    /// The buffered chunk `idx`, loading it from the store on first touch.
    fn chunk_mut(&mut self, store: &Store, idx: u64) -> Result<&mut Vec<u8>> {
        if let Some(data) = self
            .spilled
            .as_mut()
            .map(|s| s.take(idx))
            .transpose()?
            .flatten()
        {
            self.dirty.insert(idx, data);
        }
        if !self.dirty.contains_key(&idx) {
            // No stored chunk lies at or beyond the stored size, so appending never reads.
            let data = if self.voided(idx) || idx * CHUNK_SIZE >= self.committed_size {
                Vec::new()
            } else {
                store
                    .read()?
                    .chunks(self.ino, idx, 1)?
                    .pop()
                    .flatten()
                    .unwrap_or_default()
            };
            self.dirty.insert(idx, data);
        }
        Ok(self.dirty.get_mut(&idx).expect("inserted above"))
    }

    /// Reads up to `len` bytes at `offset`; holes read as zeros.
    pub fn read(&self, store: &Store, offset: u64, len: u32) -> Result<Vec<u8>> {
        if offset >= self.size {
            return Ok(Vec::new());
        }
        let end = self.size.min(offset.saturating_add(len as u64));
        let mut out = vec![0u8; (end - offset) as usize];
        let first = offset / CHUNK_SIZE;
        let last = (end - 1) / CHUNK_SIZE;
        // Chunks that must come from the store, fetched in one read transaction.
        let need_store = (first..=last).any(|i| {
            !self.dirty.contains_key(&i)
                && !self.voided(i)
                && !self.spilled.as_ref().is_some_and(|s| s.has(i))
        });
        let stored = if need_store {
            store.read()?.chunks(self.ino, first, last - first + 1)?
        } else {
            Vec::new()
        };
        for idx in first..=last {
            let from_spill = match &self.spilled {
                Some(sp) if !self.dirty.contains_key(&idx) => sp.read(idx)?,
                _ => None,
            };
            let data: &[u8] = if let Some(d) = self.dirty.get(&idx) {
                d
            } else if let Some(d) = &from_spill {
                d
            } else if self.voided(idx) {
                continue;
            } else {
                match stored.get((idx - first) as usize) {
                    Some(Some(d)) => d,
                    _ => continue,
                }
            };
            let chunk_start = idx * CHUNK_SIZE;
            let from = offset.max(chunk_start);
            let to = end.min(chunk_start + data.len() as u64);
            if from < to {
                let src = &data[(from - chunk_start) as usize..(to - chunk_start) as usize];
                out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(src);
            }
        }
        Ok(out)
    }

    /// Buffers `data` at `offset`.
    pub fn write(&mut self, store: &Store, offset: u64, data: &[u8], now: i64) -> Result<()> {
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let idx = pos / CHUNK_SIZE;
            let within = (pos % CHUNK_SIZE) as usize;
            let n = rest.len().min(CHUNK_SIZE as usize - within);
            let chunk = self.chunk_mut(store, idx)?;
            // Grown as a Vec grows, but never past a chunk: doubling a chunk written in two
            // parts could take twice its size (and an mmap of its own from the allocator).
            let need = within + n;
            if need > chunk.capacity() {
                let target = need.max((2 * chunk.capacity()).min(CHUNK_SIZE as usize));
                chunk.reserve_exact(target - chunk.len());
            }
            if chunk.len() < within {
                chunk.resize(within, 0);
            }
            // Overwrite what the chunk holds, append the rest: no zero-fill of appended bytes.
            let overlap = (chunk.len() - within).min(n);
            chunk[within..within + overlap].copy_from_slice(&rest[..overlap]);
            chunk.extend_from_slice(&rest[overlap..n]);
            rest = &rest[n..];
            pos += n as u64;
        }
        self.size = self.size.max(offset + data.len() as u64);
        self.touch(now);
        Ok(())
    }

    /// Buffers a change of size.
    pub fn truncate(&mut self, store: &Store, new_size: u64, now: i64) -> Result<()> {
        if new_size < self.size {
            let keep = new_size.div_ceil(CHUNK_SIZE);
            self.dirty.retain(|&i, _| i < keep);
            if let Some(sp) = &mut self.spilled {
                sp.chunks.retain(|&i, _| i < keep);
            }
            self.drop_from = Some(self.drop_from.map_or(keep, |d| d.min(keep)));
            let within = (new_size % CHUNK_SIZE) as usize;
            if within != 0 {
                let chunk = self.chunk_mut(store, new_size / CHUNK_SIZE)?;
                chunk.truncate(within);
            }
        }
        self.size = new_size;
        self.touch(now);
        Ok(())
    }

    fn touch(&mut self, now: i64) {
        self.pending_mtime = Some(now);
        self.pending_ctime = Some(now);
        self.changed = true;
    }

    /// Writes the buffered content into `w` over `inode` (this file's record as `w` holds
    /// it); the caller commits and then calls `committed`.
    pub fn stage(&self, w: &mut WriteTxn<'_>, mut inode: Inode) -> Result<()> {
        if let Some(d) = self.drop_from {
            w.remove_chunks_from(self.ino, d)?;
        }
        inode.size = self.size;
        if let Some(t) = self.pending_mtime {
            inode.mtime = t;
        }
        if let Some(t) = self.pending_ctime {
            inode.ctime = t;
        }
        let dirty = self.dirty.iter().map(|(&i, d)| (i, d.as_slice()));
        if self.spilled.is_none() {
            // The record once, with a small file's content in it.
            return w.put_inode_and_chunks(&inode, dirty).map_err(Error::from);
        }
        w.put_chunks(self.ino, dirty)?;
        if let Some(sp) = &self.spilled {
            // One chunk in memory at a time.
            for &idx in sp.chunks.keys() {
                if let Some(data) = sp.read(idx)? {
                    w.put_chunks(self.ino, std::iter::once((idx, data.as_slice())))?;
                }
            }
        }
        w.put_inode(&inode).map_err(Error::from)
    }

    /// Marks everything staged as in the store.
    pub fn committed(&mut self) {
        self.dirty.clear();
        self.spilled = None;
        self.drop_from = None;
        self.pending_mtime = None;
        self.pending_ctime = None;
        self.committed_size = self.size;
        self.changed = false;
    }

    /// Bytes buffered in memory.
    pub fn buffered_bytes(&self) -> usize {
        self.dirty.values().map(|c| c.capacity()).sum()
    }

    /// Moves every buffered chunk out of memory into a private temporary file beside the
    /// store (created 0600 and unlinked from the start); reads, later writes and the commit
    /// take them from there. Visibility and durability are unchanged: the content is still
    /// committed whole at close or fsync.
    pub fn spill(&mut self, dir: &Path) -> Result<()> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        if self.spilled.is_none() {
            let file = tempfile::tempfile_in(dir).map_err(|e| {
                Error::Store(crate::store::StoreError::Io(format!(
                    "spilling buffered content to {}: {e}",
                    dir.display()
                )))
            })?;
            self.spilled = Some(Spill {
                file,
                chunks: BTreeMap::new(),
            });
        }
        let sp = self.spilled.as_mut().expect("set above");
        for (idx, data) in std::mem::take(&mut self.dirty) {
            sp.put(idx, &data)?;
        }
        Ok(())
    }
}

/// Buffered chunks of one open file kept in an anonymous temporary file, each at its own
/// offset (chunk index times the chunk size), with its length.
#[derive(Debug)]
struct Spill {
    file: std::fs::File,
    chunks: BTreeMap<u64, usize>,
}

fn spill_error(e: std::io::Error) -> Error {
    Error::Store(crate::store::StoreError::Io(format!(
        "spilled content: {e}"
    )))
}

impl Spill {
    fn has(&self, idx: u64) -> bool {
        self.chunks.contains_key(&idx)
    }

    fn put(&mut self, idx: u64, data: &[u8]) -> Result<()> {
        self.file
            .write_all_at(data, idx * CHUNK_SIZE)
            .map_err(spill_error)?;
        self.chunks.insert(idx, data.len());
        Ok(())
    }

    fn read(&self, idx: u64) -> Result<Option<Vec<u8>>> {
        let Some(&len) = self.chunks.get(&idx) else {
            return Ok(None);
        };
        let mut data = vec![0u8; len];
        self.file
            .read_exact_at(&mut data, idx * CHUNK_SIZE)
            .map_err(spill_error)?;
        Ok(Some(data))
    }

    /// Chunk `idx` back in memory, forgotten here.
    fn take(&mut self, idx: u64) -> Result<Option<Vec<u8>>> {
        let data = self.read(idx)?;
        self.chunks.remove(&idx);
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequential writes that straddle chunk boundaries fill each chunk in two parts: the
    /// buffer holds at most a chunk's worth of memory per chunk, so `--max-buffer` counts
    /// what the content needs rather than what a doubling allocator reserved.
    #[test]
    fn a_chunk_written_in_parts_holds_no_more_than_a_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        let mut f = OpenFile::new(2, 0);
        // 48 KiB writes: a chunk's first part is often more than half of it.
        let block = vec![7u8; 48 << 10];
        for i in 0..64u64 {
            f.write(&store, i * (48 << 10), &block, 1).unwrap();
        }
        let chunks = (64u64 * (48 << 10)).div_ceil(CHUNK_SIZE) as usize;
        assert_eq!(f.dirty.len(), chunks);
        for c in f.dirty.values() {
            assert!(c.capacity() <= CHUNK_SIZE as usize, "{}", c.capacity());
        }
        assert!(f.buffered_bytes() <= chunks * CHUNK_SIZE as usize);
        assert_eq!(f.read(&store, (1 << 20) - 5, 10).unwrap(), vec![7u8; 10]);
    }
}
