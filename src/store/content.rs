//! File content: chunks stored as immutable blobs, the filemap that points at them, their
//! reference counts, redaction, and the content checks `check` runs. A file's chunk 0 of at
//! most `INLINE_MAX` bytes lives in its inode record instead (no blob, no filemap row).
//!
//! Invariants kept here: chunk 0 is in the record or in a blob, never both; a blob is never
//! rewritten (only redacted to empty); a blob's count is its filemap entries plus the history
//! before-images that name it, written once per commit as a net change, and the blob is
//! deleted when that count reaches 0.

use std::collections::HashMap;

use redb::ReadableTable;

use super::read::ReadTxn;
use super::redo::{put_entry_len, redo_del, redo_put};
use super::schema::*;
use super::write::{InodeRecord, WriteTxn};
use super::{StoreError, corrupt, map_err, schema};

fn chunk_in(
    inodes: &impl ReadableTable<u64, &'static [u8]>,
    map: &impl ReadableTable<(u64, u64), u64>,
    blobs: &impl ReadableTable<u64, &'static [u8]>,
    ino: u64,
    idx: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    if idx == 0
        && let Some(record) = inodes.get(ino).map_err(map_err)?
        && let Some(inline) = schema::inline_chunk(record.value())
    {
        return inline_content(ino, inline).map(Some);
    }
    let Some(blob) = map.get((ino, idx)).map_err(map_err)?.map(|v| v.value()) else {
        return Ok(None);
    };
    match blobs.get(blob).map_err(map_err)? {
        Some(v) => match schema::decode_blob(v.value()) {
            Some(data) => Ok(Some(data.to_vec())),
            None => Err(StoreError::Checksum {
                ino,
                idx,
                blob: Some(blob),
            }),
        },
        None => Err(StoreError::Corrupt(format!(
            "chunk {idx} of inode {ino} points to missing blob {blob}"
        ))),
    }
}

/// The content of chunk 0 held in `ino`'s record; a redacted version reads as empty.
pub(super) fn inline_content(ino: u64, inline: InlineChunk<'_>) -> Result<Vec<u8>, StoreError> {
    match inline {
        InlineChunk::Content(d) => Ok(d.to_vec()),
        InlineChunk::Redacted => Ok(Vec::new()),
        InlineChunk::Damaged => Err(StoreError::Checksum {
            ino,
            idx: 0,
            blob: None,
        }),
    }
}

impl ReadTxn {
    /// Reads chunks `first..first+count` of `ino`; a hole is `None`.
    pub fn chunks(
        &self,
        ino: u64,
        first: u64,
        count: u64,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let inodes = self.tx.open_table(INODES).map_err(map_err)?;
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        (first..first + count)
            .map(|i| chunk_in(&inodes, &map, &blobs, ino, i))
            .collect()
    }

    /// (chunk index, blob id) of `ino`'s content.
    pub fn filemap_of(&self, ino: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let mut v = Vec::new();
        for item in map.range((ino, 0)..=(ino, u64::MAX)).map_err(map_err)? {
            let (k, b) = item.map_err(map_err)?;
            v.push((k.value().1, b.value()));
        }
        Ok(v)
    }

    /// Whether `redact` erased any chunk of `ino`'s current content (a version made current
    /// again by a revert).
    pub fn content_redacted(&self, ino: u64) -> Result<bool, StoreError> {
        let inodes = self.tx.open_table(INODES).map_err(map_err)?;
        if let Some(record) = inodes.get(ino).map_err(map_err)?
            && schema::inline_chunk(record.value()) == Some(InlineChunk::Redacted)
        {
            return Ok(true);
        }
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let red = self.tx.open_table(REDACTED).map_err(map_err)?;
        for item in map.range((ino, 0)..=(ino, u64::MAX)).map_err(map_err)? {
            if red
                .get(item.map_err(map_err)?.1.value())
                .map_err(map_err)?
                .is_some()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Blobs whose content does not match its checksum (for check).
    pub fn damaged_blobs(&self) -> Result<Vec<u64>, StoreError> {
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        let mut out = Vec::new();
        for item in blobs.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            if schema::decode_blob(v.value()).is_none() {
                out.push(k.value());
            }
        }
        Ok(out)
    }

    /// Calls `f` on every (ino, chunk index, blob id, the blob's content length or None
    /// when the blob is missing), in key order, one at a time (for check).
    pub fn for_each_chunk(
        &self,
        mut f: impl FnMut(u64, u64, u64, Option<u64>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        for item in map.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (ino, idx) = k.value();
            let b = v.value();
            let len = blobs
                .get(b)
                .map_err(map_err)?
                .map(|b| b.value().len().saturating_sub(4) as u64);
            f(ino, idx, b, len)?;
        }
        Ok(())
    }

    /// Every blob's reference count entry, the blob ids that exist and those whose content
    /// does not match its checksum, in one scan of the blobs (for check).
    #[allow(clippy::type_complexity)]
    pub fn blob_census(&self) -> Result<(HashMap<u64, u64>, Vec<u64>, Vec<u64>), StoreError> {
        let refs = self.tx.open_table(BLOBREFS).map_err(map_err)?;
        let mut counts = HashMap::new();
        for item in refs.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            counts.insert(k.value(), v.value());
        }
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        let (mut ids, mut damaged) = (Vec::new(), Vec::new());
        for item in blobs.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            ids.push(k.value());
            if schema::decode_blob(v.value()).is_none() {
                damaged.push(k.value());
            }
        }
        Ok((counts, ids, damaged))
    }

    /// Every (ino, chunk index, blob length) in key order (for check and tools).
    pub fn all_chunks(&self) -> Result<Vec<(u64, u64, u64)>, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        let mut out = Vec::new();
        for item in map.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (ino, idx) = k.value();
            let len = blobs
                .get(v.value())
                .map_err(map_err)?
                .map(|b| b.value().len().saturating_sub(4) as u64)
                .ok_or_else(|| corrupt("blob", ino))?;
            out.push((ino, idx, len));
        }
        Ok(out)
    }
}

impl WriteTxn<'_> {
    pub fn chunk(&self, ino: u64, idx: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let inodes = self.tx.open_table(INODES).map_err(map_err)?;
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        chunk_in(&inodes, &map, &blobs, ino, idx)
    }

    /// Stores `data` as chunk `idx` of `ino` (in its record or a new blob: see
    /// `put_chunks`); the blob it replaces is released (or kept by history).
    pub fn put_chunk(&mut self, ino: u64, idx: u64, data: &[u8]) -> Result<(), StoreError> {
        self.put_chunks(ino, [(idx, data)])
    }

    /// Stores chunks of `ino` (index, content): a chunk 0 of at most `INLINE_MAX` bytes in
    /// the inode record (when it exists already), every other chunk as a new blob, with one range of
    /// blob ids and one open of the blob table for all of them.
    pub fn put_chunks<'d>(
        &mut self,
        ino: u64,
        chunks: impl IntoIterator<Item = (u64, &'d [u8])> + Clone,
    ) -> Result<(), StoreError> {
        // A chunk written before its inode's record exists goes to a blob.
        let has_record = chunks.clone().into_iter().any(|(idx, _)| idx == 0)
            && self
                .tx
                .open_table(INODES)
                .map_err(map_err)?
                .get(ino)
                .map_err(map_err)?
                .is_some();
        let inline = |&(idx, d): &(u64, &[u8])| has_record && idx == 0 && d.len() <= INLINE_MAX;
        if let Some((_, data)) = chunks.clone().into_iter().find(inline) {
            self.written += data.len() as u64;
            self.set_filemap(ino, 0, None)?;
            self.set_inline(ino, Some(data))?;
        }
        let blob_chunks = || chunks.clone().into_iter().filter(|c| !inline(c));
        let n = blob_chunks().count() as u64;
        if n == 0 {
            return Ok(());
        }
        // The blobs' redo entries (a checksum before each chunk's content), sized up front.
        let redo_bytes: usize = blob_chunks()
            .map(|(_, d)| put_entry_len(redb::TableHandle::name(&BLOBS), 4 + d.len()))
            .sum();
        self.redo.expect(redo_bytes);
        let first = self.next_counters(META_NEXT_BLOB, n)?;
        // Blob ids only grow, so the ranges stay ascending; consecutive writes extend one.
        match self.new_blobs.last_mut() {
            Some(last) if last.end == first => last.end = first + n,
            _ => self.new_blobs.push(first..first + n),
        }
        self.step(n);
        {
            let mut blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
            for (blob, (_, data)) in (first..).zip(blob_chunks()) {
                self.written += data.len() as u64;
                let raw = schema::encode_blob(data);
                blobs.insert(blob, raw.as_slice()).map_err(map_err)?;
                redo_put(&self.redo, BLOBS, &blob, &raw.as_slice());
            }
        }
        for (blob, (idx, _)) in (first..).zip(blob_chunks()) {
            if idx == 0 {
                self.set_inline(ino, None)?;
            }
            self.set_filemap(ino, idx, Some(blob))?;
        }
        Ok(())
    }

    /// Moves every chunk 0 of at most `INLINE_MAX` bytes that no history record names (by
    /// its filemap key or its inode's record) from its blob into its inode record (the
    /// format-4 migration); how many moved.
    pub(super) fn inline_small_chunks(&mut self) -> Result<u64, StoreError> {
        let candidates: Vec<(u64, u64)> = {
            let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
            let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
            let red = self.tx.open_table(REDACTED).map_err(map_err)?;
            let keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
            let named = |key: Vec<u8>| -> Result<bool, StoreError> {
                Ok(keys
                    .range((key.as_slice(), 0)..=(key.as_slice(), u64::MAX))
                    .map_err(map_err)?
                    .next()
                    .is_some())
            };
            let mut out = Vec::new();
            for item in map.iter().map_err(map_err)? {
                let (k, v) = item.map_err(map_err)?;
                let ((ino, idx), blob) = (k.value(), v.value());
                if idx != 0 || red.get(blob).map_err(map_err)?.is_some() {
                    continue;
                }
                let small = blobs
                    .get(blob)
                    .map_err(map_err)?
                    .is_some_and(|raw| raw.value().len() <= 4 + INLINE_MAX);
                if small && !named(undo_key(1, &[ino], ""))? && !named(undo_key(3, &[ino, 0], ""))?
                {
                    out.push((ino, blob));
                }
            }
            out
        };
        let mut moved = 0;
        for (ino, blob) in candidates {
            let data = {
                let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
                let raw = blobs.get(blob).map_err(map_err)?;
                match raw.as_ref().and_then(|r| schema::decode_blob(r.value())) {
                    Some(d) => d.to_vec(),
                    // Damaged content stays where `check` reports it.
                    None => continue,
                }
            };
            if self.inode(ino)?.is_none_or(|i| i.kind != Kind::File) {
                continue;
            }
            self.set_filemap(ino, 0, None)?;
            self.set_inline(ino, Some(&data))?;
            moved += 1;
        }
        Ok(moved)
    }

    /// Writes `inode`'s record holding `inline` (an encoded inline chunk, as
    /// `TreeView::inline_part_of` gives it), or no inline chunk.
    pub fn put_inode_with_inline(
        &mut self,
        inode: &Inode,
        inline: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let bytes = inode.encode_with(inline);
        self.set_inode_record(inode.ino, Some(InodeRecord::Encoded(&bytes)))
    }

    /// Writes a new file's record with its whole content: one record for a file whose
    /// content fits inline, the record and its chunks otherwise.
    pub fn put_file(&mut self, inode: &Inode, content: &[u8]) -> Result<(), StoreError> {
        if !content.is_empty() && content.len() <= INLINE_MAX {
            self.written += content.len() as u64;
            let bytes = inode.encode_with(Some(&encode_inline(content)));
            return self.set_inode_record(inode.ino, Some(InodeRecord::Encoded(&bytes)));
        }
        self.put_inode(inode)?;
        let chunks = content.chunks(CHUNK_SIZE as usize);
        self.put_chunks(inode.ino, (0u64..).zip(chunks))
    }

    /// Removes chunks `first..` of `ino`.
    pub fn remove_chunks_from(&mut self, ino: u64, first: u64) -> Result<(), StoreError> {
        let idxs: Vec<u64> = {
            let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
            let mut v = Vec::new();
            for item in map.range((ino, first)..=(ino, u64::MAX)).map_err(map_err)? {
                v.push(item.map_err(map_err)?.0.value().1);
            }
            v
        };
        for idx in idxs {
            self.set_filemap(ino, idx, None)?;
        }
        if first == 0 {
            self.set_inline(ino, None)?;
        }
        Ok(())
    }

    pub(super) fn blob_ref(&mut self, blob: u64) {
        *self.ref_deltas.entry(blob).or_default() += 1;
    }

    pub(super) fn blob_unref(&mut self, blob: u64) {
        *self.ref_deltas.entry(blob).or_default() -= 1;
    }

    /// Writes the net reference changes: a blobrefs entry only for counts of 2 or more (a
    /// blob without one has exactly one reference), and a blob that reaches 0 is deleted.
    /// One pass over the changes in blob order, walking the (ascending) new-blob ranges
    /// alongside: linear in the transaction's size.
    pub(super) fn apply_ref_deltas(&mut self) -> Result<(), StoreError> {
        let deltas = std::mem::take(&mut self.ref_deltas);
        let new_blobs = std::mem::take(&mut self.new_blobs);
        self.step(deltas.len() as u64);
        if deltas.values().all(|&d| d == 0) {
            return Ok(());
        }
        let mut refs = self.tx.open_table(BLOBREFS).map_err(map_err)?;
        let mut gone = Vec::new();
        let mut ranges = new_blobs.iter().peekable();
        for (blob, d) in deltas {
            if d == 0 {
                continue;
            }
            while ranges.next_if(|r| r.end <= blob).is_some() {
                self.step(1);
            }
            let created = ranges.peek().is_some_and(|r| r.contains(&blob));
            let stored = refs.get(blob).map_err(map_err)?.map(|v| v.value());
            let base = match stored {
                Some(n) => n as i64,
                None if created => 0,
                None => 1,
            };
            match base + d {
                n if n <= 0 => {
                    if n < 0 {
                        return Err(StoreError::Corrupt(format!(
                            "blob {blob} would have {n} references"
                        )));
                    }
                    if stored.is_some() {
                        refs.remove(blob).map_err(map_err)?;
                        redo_del(&self.redo, BLOBREFS, &blob);
                    }
                    gone.push(blob);
                }
                1 => {
                    if stored.is_some() {
                        refs.remove(blob).map_err(map_err)?;
                        redo_del(&self.redo, BLOBREFS, &blob);
                    }
                }
                n => {
                    refs.insert(blob, n as u64).map_err(map_err)?;
                    redo_put(&self.redo, BLOBREFS, &blob, &(n as u64));
                }
            }
        }
        drop(refs);
        if !gone.is_empty() {
            let mut blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
            let mut redacted = self.tx.open_table(REDACTED).map_err(map_err)?;
            for blob in gone {
                blobs.remove(blob).map_err(map_err)?;
                redacted.remove(blob).map_err(map_err)?;
                redo_del(&self.redo, BLOBS, &blob);
                redo_del(&self.redo, REDACTED, &blob);
            }
        }
        Ok(())
    }

    /// Erases a blob's bytes, keeping its id so records and references stay valid.
    pub fn redact_blob(&mut self, blob: u64) -> Result<bool, StoreError> {
        let mut blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
        if blobs.get(blob).map_err(map_err)?.is_none() {
            return Ok(false);
        }
        blobs.insert(blob, [].as_slice()).map_err(map_err)?;
        self.tx
            .open_table(REDACTED)
            .map_err(map_err)?
            .insert(blob, ())
            .map_err(map_err)?;
        redo_put(&self.redo, BLOBS, &blob, &[].as_slice());
        redo_put(&self.redo, REDACTED, &blob, &());
        Ok(true)
    }

    /// Whether blob `blob` exists.
    pub fn blob_exists(&self, blob: u64) -> Result<bool, StoreError> {
        Ok(self
            .tx
            .open_table(BLOBS)
            .map_err(map_err)?
            .get(blob)
            .map_err(map_err)?
            .is_some())
    }
}
