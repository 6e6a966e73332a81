//! File content: chunks stored as immutable blobs, the filemap that points at them, their
//! reference counts, redaction, and the content checks `check` runs. A file's chunk 0 of at
//! most `INLINE_MAX` bytes lives in its inode record instead (no blob, no filemap row).
//!
//! Invariants kept here: chunk 0 is in the record or in a blob, never both; a blob's content
//! never changes (it is only redacted to empty), though a version history alone keeps may be
//! re-encoded as a delta against a later, full one (`delta_replaced_chunks`), which moves it
//! from `blobs` to `blob_deltas` under the same id (never in both); a blob's count
//! is its filemap entries plus the history before-images that name it plus the deltas based
//! on it, written once per commit as a net change, and the blob is deleted when that count
//! reaches 0; every delta has a `deltas` row under its base, and no run of deltas is longer
//! than `MAX_DELTA_RUN`.

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
    blobs: &Blobs<impl BlobTable, impl BlobTable>,
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
    chunk_content(blobs, ino, idx, blob, "").map(Some)
}

/// Chunk `idx` of `ino`, held in `blob`, with a failure said as a read of that chunk
/// (`when` names the point of history it was read at, if any).
pub(super) fn chunk_content(
    blobs: &Blobs<impl BlobTable, impl BlobTable>,
    ino: u64,
    idx: u64,
    blob: u64,
    when: &str,
) -> Result<Vec<u8>, StoreError> {
    match blob_content(blobs, blob)? {
        Ok(data) => Ok(data),
        Err(BlobFault::Damaged(_)) => Err(StoreError::Checksum {
            ino,
            idx,
            blob: Some(blob),
        }),
        Err(BlobFault::Missing(b)) if b == blob => Err(StoreError::Corrupt(format!(
            "chunk {idx} of inode {ino}{when} points to missing blob {blob}"
        ))),
        Err(BlobFault::Missing(b)) => Err(StoreError::Corrupt(format!(
            "chunk {idx} of inode {ino}{when} is blob {blob}, a delta whose base blob {b} is missing"
        ))),
        Err(BlobFault::TooLong) => Err(StoreError::Corrupt(format!(
            "chunk {idx} of inode {ino}{when} is blob {blob}, a run of deltas too long to be real"
        ))),
    }
}

/// A table of blob values: a read transaction's, or one a write transaction lends out.
pub(super) trait BlobTable {
    type Table: ReadableTable<u64, &'static [u8]>;
    fn table(&self) -> &Self::Table;
}

impl BlobTable for redb::ReadOnlyTable<u64, &'static [u8]> {
    type Table = Self;
    fn table(&self) -> &Self {
        self
    }
}

impl BlobTable for std::cell::RefMut<'_, redb::Table<'static, u64, &'static [u8]>> {
    type Table = redb::Table<'static, u64, &'static [u8]>;
    fn table(&self) -> &Self::Table {
        self
    }
}

/// The two tables a blob's value may be in: `blobs` (full or redacted) and `blob_deltas`
/// (a store before format 6 has no such table).
pub(super) struct Blobs<F, D> {
    pub(super) full: F,
    pub(super) deltas: Option<D>,
}

type ReadBlobs =
    Blobs<redb::ReadOnlyTable<u64, &'static [u8]>, redb::ReadOnlyTable<u64, &'static [u8]>>;
type WriteBlobs<'t> = Blobs<
    std::cell::RefMut<'t, redb::Table<'static, u64, &'static [u8]>>,
    std::cell::RefMut<'t, redb::Table<'static, u64, &'static [u8]>>,
>;

impl<F: BlobTable, D: BlobTable> Blobs<F, D> {
    /// Blob `id`'s stored value, in whichever table holds it.
    pub(super) fn get(
        &self,
        id: u64,
    ) -> Result<Option<redb::AccessGuard<'_, &'static [u8]>>, StoreError> {
        if let Some(v) = self.full.table().get(id).map_err(map_err)? {
            return Ok(Some(v));
        }
        match &self.deltas {
            Some(d) => d.table().get(id).map_err(map_err),
            None => Ok(None),
        }
    }

    /// The bytes of blob `id`'s stored value (0 when there is none).
    pub(super) fn stored_len(&self, id: u64) -> Result<u64, StoreError> {
        Ok(self.get(id)?.map_or(0, |v| v.value().len() as u64))
    }

    /// Every blob's id and stored value: full ones, then deltas.
    fn for_each(
        &self,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        for item in self.full.table().iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            f(k.value(), v.value())?;
        }
        if let Some(d) = &self.deltas {
            for item in d.table().iter().map_err(map_err)? {
                let (k, v) = item.map_err(map_err)?;
                f(k.value(), v.value())?;
            }
        }
        Ok(())
    }
}

/// Why a blob's content cannot be read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BlobFault {
    /// This blob (the one asked for, or a base it is a delta against) does not exist.
    Missing(u64),
    /// This blob's value, or the content a delta rebuilds, does not match its checksum.
    Damaged(u64),
    /// More bases than any store this build writes holds: a loop, or damage.
    TooLong,
}

/// Bases followed before a run of deltas is taken for damage (`check` holds runs to
/// `MAX_DELTA_RUN`; older builds' bounds may differ, so reading is more lenient).
const READ_RUN_LIMIT: usize = 4 * MAX_DELTA_RUN as usize;

/// The content of blob `id`: a full blob's bytes, or a delta applied to its base's content,
/// each step checked against its checksum. A redacted blob reads as empty.
pub(super) fn blob_content(
    blobs: &Blobs<impl BlobTable, impl BlobTable>,
    id: u64,
) -> Result<Result<Vec<u8>, BlobFault>, StoreError> {
    // The deltas from `id` down to the first full blob, applied on the way back up.
    let mut run: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut at = id;
    let mut content = loop {
        let Some(raw) = blobs.get(at)? else {
            return Ok(Err(BlobFault::Missing(at)));
        };
        match schema::decode_blob_value(raw.value()) {
            None => return Ok(Err(BlobFault::Damaged(at))),
            Some(BlobValue::Full(data)) => break data.to_vec(),
            Some(BlobValue::Delta { base, delta, .. }) => {
                if run.len() >= READ_RUN_LIMIT {
                    return Ok(Err(BlobFault::TooLong));
                }
                run.push((at, delta.to_vec()));
                at = base;
            }
        }
    };
    while let Some((blob, delta)) = run.pop() {
        content = match super::delta::apply(&delta, &content) {
            Ok(c) => c,
            Err(_) => return Ok(Err(BlobFault::Damaged(blob))),
        };
    }
    Ok(Ok(content))
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
        let blobs = self.blobs()?;
        (first..first + count)
            .map(|i| chunk_in(&inodes, &map, &blobs, ino, i))
            .collect()
    }

    /// The tables blobs are in (`blob_deltas` only from format 6 on).
    pub(super) fn blobs(&self) -> Result<ReadBlobs, StoreError> {
        Ok(Blobs {
            full: self.tx.open_table(BLOBS).map_err(map_err)?,
            deltas: match self.tx.open_table(BLOB_DELTAS) {
                Ok(t) => Some(t),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(map_err(e)),
            },
        })
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

    /// Calls `f` on every (ino, chunk index, blob id, the blob's content length or None
    /// when the blob is missing), in key order, one at a time (for check; with `sums`, the
    /// chunk map's sum is taken on the way).
    pub fn for_each_chunk(
        &self,
        sums: Option<&mut super::TableSums>,
        mut f: impl FnMut(u64, u64, u64, Option<u64>) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let blobs = self.blobs()?;
        self.scan_raw(FILEMAP, sums, |k, v| {
            let (ino, idx) = <(u64, u64) as redb::Value>::from_bytes(k);
            let b = <u64 as redb::Value>::from_bytes(v);
            let len = blobs
                .get(b)?
                .map(|v| match schema::decode_blob_value(v.value()) {
                    Some(BlobValue::Delta { delta, .. }) => {
                        super::delta::target_len(delta).unwrap_or(0)
                    }
                    _ => v.value().len().saturating_sub(4) as u64,
                });
            f(ino, idx, b, len)
        })
    }

    /// Every blob's reference count entry, the blob ids that exist (full and delta) and
    /// those whose content does not match its checksum (a delta's once rebuilt: see
    /// `damaged_blobs`), for check (with `sums`, the reference counts' sum is taken on the
    /// way).
    #[allow(clippy::type_complexity)]
    pub fn blob_census(
        &self,
        sums: Option<&mut super::TableSums>,
    ) -> Result<(HashMap<u64, u64>, Vec<u64>, Vec<u64>), StoreError> {
        let mut counts = HashMap::new();
        self.scan_raw(BLOBREFS, sums, |k, v| {
            counts.insert(
                <u64 as redb::Value>::from_bytes(k),
                <u64 as redb::Value>::from_bytes(v),
            );
            Ok(())
        })?;
        let mut ids = Vec::new();
        self.blobs()?.for_each(|id, _| {
            ids.push(id);
            Ok(())
        })?;
        Ok((counts, ids, self.damaged_blobs()?))
    }

    /// Blobs whose content does not match its checksum, a delta's once rebuilt from its
    /// base included (for check; a delta whose base is missing, or that is in a loop, is
    /// `delta_survey`'s). Each delta is applied once, to its base's content, walking down
    /// from every full blob: linear in the content, however long the runs.
    pub fn damaged_blobs(&self) -> Result<Vec<u64>, StoreError> {
        let blobs = self.blobs()?;
        let mut out = Vec::new();
        let mut below: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut delta_ids = std::collections::HashSet::new();
        blobs.for_each(|id, v| {
            match schema::decode_blob_value(v) {
                None => out.push(id),
                Some(BlobValue::Full(_)) => {}
                Some(BlobValue::Delta { base, .. }) => {
                    delta_ids.insert(id);
                    below.entry(base).or_default().push(id);
                }
            }
            Ok(())
        })?;
        let damaged_values: std::collections::HashSet<u64> = out.iter().copied().collect();
        for (&top, _) in below.iter().filter(|(b, _)| !delta_ids.contains(b)) {
            let content = match blobs.get(top)? {
                Some(v) => match schema::decode_blob_value(v.value()) {
                    Some(BlobValue::Full(d)) => Some(d.to_vec()),
                    _ => None,
                },
                // Missing: `delta_survey` names the deltas against it.
                None => continue,
            };
            // (blob, the content of its base; None when that did not rebuild).
            let mut stack: Vec<(u64, std::rc::Rc<Option<Vec<u8>>>)> = Vec::new();
            let content = std::rc::Rc::new(content);
            for d in &below[&top] {
                stack.push((*d, content.clone()));
            }
            while let Some((blob, base)) = stack.pop() {
                if damaged_values.contains(&blob) {
                    continue;
                }
                let rebuilt = match (&*base, blobs.get(blob)?) {
                    (Some(base), Some(v)) => match schema::decode_blob_value(v.value()) {
                        Some(BlobValue::Delta { delta, .. }) => {
                            super::delta::apply(delta, base).ok()
                        }
                        _ => None,
                    },
                    _ => None,
                };
                if rebuilt.is_none() {
                    out.push(blob);
                }
                if let Some(next) = below.get(&blob) {
                    let rebuilt = std::rc::Rc::new(rebuilt);
                    for d in next {
                        stack.push((*d, rebuilt.clone()));
                    }
                }
            }
        }
        Ok(out)
    }

    /// How many blobs there are and the bytes of their stored values (deltas at their
    /// stored size): what content and its history take before redb's own overhead.
    pub fn blob_bytes(&self) -> Result<(u64, u64), StoreError> {
        let (mut n, mut bytes) = (0, 0);
        self.blobs()?.for_each(|_, v| {
            n += 1;
            bytes += v.len() as u64;
            Ok(())
        })?;
        Ok((n, bytes))
    }

    /// Whether the store has the index of delta blobs (format 6).
    pub(super) fn has_deltas_table(&self) -> Result<bool, StoreError> {
        match self.tx.open_table(DELTAS) {
            Ok(_) => Ok(true),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Every delta blob as (blob, base), from the blobs' values, and every row of the
    /// `deltas` index as (base, blob) (for check; a store before format 6 has neither).
    #[allow(clippy::type_complexity)]
    pub fn delta_survey(&self) -> Result<(Vec<(u64, u64)>, Vec<(u64, u64)>), StoreError> {
        let mut deltas = Vec::new();
        self.blobs()?.for_each(|id, v| {
            if let Some(BlobValue::Delta { base, .. }) = schema::decode_blob_value(v) {
                deltas.push((id, base));
            }
            Ok(())
        })?;
        let mut rows = Vec::new();
        match self.tx.open_table(DELTAS) {
            Ok(t) => {
                for item in t.iter().map_err(map_err)? {
                    rows.push(item.map_err(map_err)?.0.value());
                }
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(map_err(e)),
        }
        Ok((deltas, rows))
    }

    /// Every chunk 0 held in an inode record (for check): (ino, its content's length, or
    /// None when the content does not match its checksum).
    pub fn all_inline(&self) -> Result<Vec<(u64, Option<u64>)>, StoreError> {
        let inodes = self.tx.open_table(INODES).map_err(map_err)?;
        let mut out = Vec::new();
        for item in inodes.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let len = match schema::inline_chunk(v.value()) {
                None => continue,
                Some(InlineChunk::Content(d)) => Some(d.len() as u64),
                Some(InlineChunk::Redacted) => Some(0),
                Some(InlineChunk::Damaged) => None,
            };
            out.push((k.value(), len));
        }
        Ok(out)
    }

    /// Every (ino, chunk index, blob length) in key order (for check and tools).
    pub fn all_chunks(&self) -> Result<Vec<(u64, u64, u64)>, StoreError> {
        let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
        let blobs = self.blobs()?;
        let mut out = Vec::new();
        for item in map.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let (ino, idx) = k.value();
            let len = blobs
                .get(v.value())?
                .map(|b| schema::blob_content_len(b.value()))
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
        let blobs = self.blobs()?;
        chunk_in(&*inodes, &*map, &blobs, ino, idx)
    }

    /// The tables blobs are in, open for writing (no other open of them may overlap).
    pub(super) fn blobs(&self) -> Result<WriteBlobs<'_>, StoreError> {
        Ok(Blobs {
            full: self.tx.open_table(BLOBS).map_err(map_err)?,
            deltas: Some(self.tx.open_table(BLOB_DELTAS).map_err(map_err)?),
        })
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

    /// Writes `inode`'s record and its changed `chunks` (as `put_chunks`), for an existing
    /// inode. A chunk 0 that goes inline is encoded into the record with the new fields, so
    /// the record is written once, not once for the chunk and again for the fields (a small
    /// file's commit otherwise puts its content in the table and the log twice).
    pub fn put_inode_and_chunks<'d>(
        &mut self,
        inode: &Inode,
        chunks: impl IntoIterator<Item = (u64, &'d [u8])> + Clone,
    ) -> Result<(), StoreError> {
        let inline = chunks
            .clone()
            .into_iter()
            .find(|&(idx, d)| idx == 0 && d.len() <= INLINE_MAX);
        let Some((_, data)) = inline else {
            self.put_chunks(inode.ino, chunks)?;
            return self.put_inode(inode);
        };
        self.written += data.len() as u64;
        self.set_filemap(inode.ino, 0, None)?;
        let bytes = inode.encode_with(Some(&encode_inline(data)));
        self.set_inode_record(inode.ino, Some(InodeRecord::Encoded(&bytes)))?;
        // The rest go to blobs.
        let rest: Vec<(u64, &[u8])> = chunks.into_iter().filter(|&(idx, _)| idx != 0).collect();
        if rest.is_empty() {
            return Ok(());
        }
        self.put_chunks(inode.ino, rest.iter().copied())
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
    /// blob without one has exactly one reference), and a blob that reaches 0 is deleted; a
    /// delta deleted gives back its reference to its base, which may go in turn. One pass
    /// over the changes in blob order (and one more per such run of deltas): linear in the
    /// transaction's size.
    pub(super) fn apply_ref_deltas(&mut self) -> Result<(), StoreError> {
        let mut deltas = std::mem::take(&mut self.ref_deltas);
        let new_blobs = std::mem::take(&mut self.new_blobs);
        // Blobs whose count an earlier pass wrote: a missing entry now means 1 for them.
        let mut settled = std::collections::HashSet::new();
        loop {
            self.step(deltas.len() as u64);
            if deltas.values().all(|&d| d == 0) {
                return Ok(());
            }
            let mut refs = self.tx.open_table(BLOBREFS).map_err(map_err)?;
            let mut gone = Vec::new();
            for (&blob, &d) in &deltas {
                if d == 0 {
                    continue;
                }
                let i = new_blobs.partition_point(|r| r.end <= blob);
                let created =
                    !settled.contains(&blob) && new_blobs.get(i).is_some_and(|r| r.contains(&blob));
                let stored = refs.get(blob).map_err(map_err)?.map(|v| v.value());
                let base = match stored {
                    Some(n) => n as i64,
                    None if created => 0,
                    None => 1,
                };
                settled.insert(blob);
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
            let mut next = std::collections::BTreeMap::new();
            if !gone.is_empty() {
                let mut blobs = self.blobs()?;
                let deltas = blobs.deltas.as_mut().expect("opened for writing");
                let mut redacted = self.tx.open_table(REDACTED).map_err(map_err)?;
                let mut index = self.tx.open_table(DELTAS).map_err(map_err)?;
                for blob in gone {
                    if blobs.full.remove(blob).map_err(map_err)?.is_some() {
                        redo_del(&self.redo, BLOBS, &blob);
                        if redacted.remove(blob).map_err(map_err)?.is_some() {
                            redo_del(&self.redo, REDACTED, &blob);
                        }
                        continue;
                    }
                    let old = deltas.remove(blob).map_err(map_err)?;
                    let base = match old
                        .as_ref()
                        .and_then(|v| schema::decode_blob_value(v.value()))
                    {
                        Some(BlobValue::Delta { base, .. }) => Some(base),
                        _ => None,
                    };
                    if old.is_some() {
                        redo_del(&self.redo, BLOB_DELTAS, &blob);
                    }
                    drop(old);
                    if let Some(base) = base {
                        index.remove((base, blob)).map_err(map_err)?;
                        redo_del(&self.redo, DELTAS, &(base, blob));
                        *next.entry(base).or_default() -= 1;
                    }
                }
            }
            if next.is_empty() {
                return Ok(());
            }
            deltas = next;
        }
    }

    /// Makes the chunks this transaction left to history deltas against what replaced them
    /// (see "Delta blobs" in `schema`): a chunk whose slot now holds another blob, or of a
    /// file deleted while another file now has its name (a write to a temporary file renamed
    /// over it, deleted at once or at its last release). Called at commit, before the
    /// history record takes the before-images.
    pub(super) fn delta_replaced_chunks(&mut self) -> Result<(), StoreError> {
        let Some(c) = &self.capture else {
            return Ok(());
        };
        let mut left = Vec::new();
        let mut named = HashMap::new();
        for u in &c.undo {
            match u {
                Undo::Filemap {
                    ino,
                    idx,
                    old: Some(b),
                } => left.push((*ino, *idx, *b)),
                Undo::Inode { ino, old: Some(b) } => {
                    if let Some(i) = Inode::decode(*ino, b) {
                        named.insert(*ino, (i.parent, i.name));
                    }
                }
                _ => {}
            }
        }
        for (ino, idx, old) in left {
            let slot = |w: &Self, ino: u64| -> Result<Option<u64>, StoreError> {
                let map = w.tx.open_table(FILEMAP).map_err(map_err)?;
                Ok(map.get((ino, idx)).map_err(map_err)?.map(|v| v.value()))
            };
            let base = match slot(self, ino)? {
                Some(now) => Some(now),
                None if self.inode(ino)?.is_none() => match named.get(&ino) {
                    Some((parent, name)) => match self.lookup(*parent, name)? {
                        Some((other, Kind::File)) if other != ino => slot(self, other)?,
                        _ => None,
                    },
                    None => None,
                },
                None => None,
            };
            if let Some(base) = base {
                self.make_delta(old, base)?;
            }
        }
        Ok(())
    }

    /// The longest run of deltas that reads through blob `blob` (0 when none does).
    fn run_behind(&self, blob: u64) -> Result<usize, StoreError> {
        let index = self.tx.open_table(DELTAS).map_err(map_err)?;
        let blobs = self.blobs()?;
        let mut run = 0;
        for item in index.range((blob, 0)..=(blob, u64::MAX)).map_err(map_err)? {
            let d = item.map_err(map_err)?.0.value().1;
            let behind = match blobs.get(d)? {
                Some(v) => match schema::decode_blob_value(v.value()) {
                    Some(BlobValue::Delta { behind, .. }) => behind,
                    _ => 0,
                },
                None => 0,
            };
            run = run.max(behind as usize + 1);
        }
        Ok(run)
    }

    /// Stores blob `blob` as a delta against blob `base` when both are full, the run of
    /// deltas through `blob` stays within `MAX_DELTA_RUN`, and the delta is at most half the
    /// blob's size; whether it did.
    fn make_delta(&mut self, blob: u64, base: u64) -> Result<bool, StoreError> {
        if blob == base {
            return Ok(false);
        }
        let (value, old_len) = {
            let blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
            let full = |id: u64| -> Result<Option<Vec<u8>>, StoreError> {
                Ok(blobs.get(id).map_err(map_err)?.and_then(|v| {
                    match schema::decode_blob_value(v.value()) {
                        // Empty: redacted, never a base nor worth a delta.
                        Some(BlobValue::Full(d)) if !v.value().is_empty() => Some(d.to_vec()),
                        _ => None,
                    }
                }))
            };
            let (Some(old), Some(new)) = (full(blob)?, full(base)?) else {
                return Ok(false);
            };
            self.step(1);
            drop(blobs);
            let behind = self.run_behind(blob)?;
            if behind >= MAX_DELTA_RUN as usize {
                return Ok(false);
            }
            let delta = super::delta::diff(&old, &new);
            (
                schema::encode_delta_blob(base, behind as u8, &delta),
                4 + old.len(),
            )
        };
        if value.len() * 2 > old_len {
            return Ok(false);
        }
        // Moved to the table of deltas, where small values share pages: rewritten in place,
        // each would keep a page of its own.
        let mut blobs = self.blobs()?;
        blobs.full.remove(blob).map_err(map_err)?;
        redo_del(&self.redo, BLOBS, &blob);
        let deltas = blobs.deltas.as_mut().expect("opened for writing");
        deltas.insert(blob, value.as_slice()).map_err(map_err)?;
        redo_put(&self.redo, BLOB_DELTAS, &blob, &value.as_slice());
        drop(blobs);
        self.tx
            .open_table(DELTAS)
            .map_err(map_err)?
            .insert((base, blob), ())
            .map_err(map_err)?;
        redo_put(&self.redo, DELTAS, &(base, blob), &());
        self.blob_ref(base);
        Ok(true)
    }

    /// Stores delta blob `blob` as a full blob again, giving back its base's reference (its
    /// base is about to be erased). A delta that does not rebuild stays as it is, for
    /// `check` to report.
    fn materialise(&mut self, blob: u64) -> Result<(), StoreError> {
        let blobs = self.blobs()?;
        let base = match blobs.get(blob)? {
            Some(v) => match schema::decode_blob_value(v.value()) {
                Some(BlobValue::Delta { base, .. }) => base,
                _ => return Ok(()),
            },
            None => return Ok(()),
        };
        let Ok(content) = blob_content(&blobs, blob)? else {
            return Ok(());
        };
        let raw = schema::encode_blob(&content);
        drop(blobs);
        self.drop_delta(blob, base)?;
        self.tx
            .open_table(BLOBS)
            .map_err(map_err)?
            .insert(blob, raw.as_slice())
            .map_err(map_err)?;
        redo_put(&self.redo, BLOBS, &blob, &raw.as_slice());
        Ok(())
    }

    /// Removes delta blob `blob` (a delta against `base`) and its row in the delta index,
    /// giving back its base's reference; the caller stores the blob again, full or erased.
    fn drop_delta(&mut self, blob: u64, base: u64) -> Result<(), StoreError> {
        self.tx
            .open_table(BLOB_DELTAS)
            .map_err(map_err)?
            .remove(blob)
            .map_err(map_err)?;
        redo_del(&self.redo, BLOB_DELTAS, &blob);
        self.tx
            .open_table(DELTAS)
            .map_err(map_err)?
            .remove((base, blob))
            .map_err(map_err)?;
        redo_del(&self.redo, DELTAS, &(base, blob));
        self.blob_unref(base);
        Ok(())
    }

    /// Erases a blob's bytes, keeping its id so records and references stay valid. The
    /// deltas against it are rebuilt as full blobs first (erasing one version never takes
    /// another with it), and a delta gives back its base's reference.
    pub fn redact_blob(&mut self, blob: u64) -> Result<bool, StoreError> {
        let base = {
            let blobs = self.blobs()?;
            let Some(v) = blobs.get(blob)? else {
                return Ok(false);
            };
            match schema::decode_blob_value(v.value()) {
                Some(BlobValue::Delta { base, .. }) => Some(base),
                _ => None,
            }
        };
        let dependants: Vec<u64> = {
            let index = self.tx.open_table(DELTAS).map_err(map_err)?;
            let mut v = Vec::new();
            for item in index.range((blob, 0)..=(blob, u64::MAX)).map_err(map_err)? {
                v.push(item.map_err(map_err)?.0.value().1);
            }
            v
        };
        for d in dependants {
            self.materialise(d)?;
        }
        if let Some(base) = base {
            self.drop_delta(blob, base)?;
        }
        let mut blobs = self.tx.open_table(BLOBS).map_err(map_err)?;
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
        Ok(self.blobs()?.get(blob)?.is_some())
    }
}
