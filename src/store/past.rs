//! The store's tree as it was at a point of history, read through history's key index
//! (`history_keys`) without replaying anything: the cost of a lookup is one index seek,
//! however long the history and however large the store.
//!
//! Invariant kept here: the value of a key at point S is the before-image of the first record
//! after S that changed it, or its value now when no record after S did. That holds as long
//! as every record after S is kept, which `ReadTxn::past` checks first.

use std::collections::BTreeMap;

use super::read::{DirEntry, ReadTxn};
use super::schema::*;
use super::{StoreError, corrupt, map_err};

/// A view of the store's tree: the present (`ReadTxn`) or a point of history (`Past`). What
/// `show`, `diff`, `revert` and the path tools read through.
pub trait TreeView {
    fn inode(&self, ino: u64) -> Result<Option<Inode>, StoreError>;
    fn lookup(&self, parent: u64, name: &str) -> Result<Option<(u64, Kind)>, StoreError>;
    /// Every entry of directory `parent`, in name order.
    fn list(&self, parent: u64) -> Result<Vec<DirEntry>, StoreError>;
    /// At most `limit` entries of directory `parent` after the name `after`, in name order.
    /// A view that cannot seek lists the directory and skips to there.
    fn list_after(
        &self,
        parent: u64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DirEntry>, StoreError> {
        Ok(self
            .list(parent)?
            .into_iter()
            .filter(|e| after.is_none_or(|a| e.name.as_str() > a))
            .take(limit)
            .collect())
    }
    /// (chunk index, blob id) of `ino`'s content, in index order.
    fn filemap_of(&self, ino: u64) -> Result<Vec<(u64, u64)>, StoreError>;
    /// Chunks `first..first+count` of `ino`; a hole is `None`.
    fn chunks(&self, ino: u64, first: u64, count: u64) -> Result<Vec<Option<Vec<u8>>>, StoreError>;
    /// Whether `redact` erased any chunk of `ino`'s content in this view.
    fn content_redacted(&self, ino: u64) -> Result<bool, StoreError>;
    /// The chunk 0 `ino`'s record holds, encoded as the record holds it (see
    /// `schema::encode_inline`); None when its content is all in blobs.
    fn inline_part_of(&self, ino: u64) -> Result<Option<Vec<u8>>, StoreError>;
}

impl TreeView for ReadTxn {
    fn inode(&self, ino: u64) -> Result<Option<Inode>, StoreError> {
        ReadTxn::inode(self, ino)
    }
    fn lookup(&self, parent: u64, name: &str) -> Result<Option<(u64, Kind)>, StoreError> {
        ReadTxn::lookup(self, parent, name)
    }
    fn list(&self, parent: u64) -> Result<Vec<DirEntry>, StoreError> {
        ReadTxn::list(self, parent)
    }
    fn list_after(
        &self,
        parent: u64,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<DirEntry>, StoreError> {
        ReadTxn::list_after(self, parent, after, limit)
    }
    fn filemap_of(&self, ino: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        ReadTxn::filemap_of(self, ino)
    }
    fn chunks(&self, ino: u64, first: u64, count: u64) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        ReadTxn::chunks(self, ino, first, count)
    }
    fn content_redacted(&self, ino: u64) -> Result<bool, StoreError> {
        ReadTxn::content_redacted(self, ino)
    }
    fn inline_part_of(&self, ino: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let t = self.tx.open_table(INODES).map_err(map_err)?;
        Ok(t.get(ino)
            .map_err(map_err)?
            .and_then(|v| inline_part(v.value()).map(<[u8]>::to_vec)))
    }
}

/// An inode record as a point of history sees it: the history record whose before-image it
/// is (None: the record now), and its bytes.
type InodeImage = (Option<u64>, Vec<u8>);

/// The tree as it was at history point `seq` (after record `seq` committed).
pub struct Past<'r> {
    now: &'r ReadTxn,
    seq: u64,
}

impl ReadTxn {
    /// The tree at history point `seq`; refused when records after it have expired.
    pub fn past(&self, seq: u64) -> Result<Past<'_>, StoreError> {
        self.check_reachable(seq)?;
        Ok(Past { now: self, seq })
    }
}

impl ReadTxn {
    /// Before-image `image` of `ino` in record `seq`, whole: one kept as another version
    /// (`schema::delta_form`) rebuilt, any other as it is.
    pub fn whole_image(&self, seq: u64, ino: u64, image: &[u8]) -> Result<Vec<u8>, StoreError> {
        if !content_kept(image) {
            return Ok(image.to_vec());
        }
        Past { now: self, seq }.kept_content(ino, Some(seq), image.to_vec())
    }
}

impl Past<'_> {
    /// The point this view shows.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The before-image of `key` in the first record after this point that changed it, as
    /// history's key index keeps it, with that record's seq.
    fn changed_after(&self, key: &[u8]) -> Result<Option<Undo>, StoreError> {
        Ok(self.changed_after_in(key)?.map(|(_, u)| u))
    }

    fn changed_after_in(&self, key: &[u8]) -> Result<Option<(u64, Undo)>, StoreError> {
        let t = self.now.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        let Some(first) = self.seq.checked_add(1) else {
            return Ok(None);
        };
        let mut range = t.range((key, first)..=(key, u64::MAX)).map_err(map_err)?;
        match range.next() {
            None => Ok(None),
            Some(item) => {
                let (k, v) = item.map_err(map_err)?;
                let seq = k.value().1;
                self.indexed(key, seq, v.value()).map(|u| Some((seq, u)))
            }
        }
    }

    /// The before-image of `key` that record `seq` indexes with `value`: the value itself,
    /// or when it is empty (by reference), the record's first entry for the key.
    fn indexed(&self, key: &[u8], seq: u64, value: &[u8]) -> Result<Undo, StoreError> {
        let found = match value.is_empty() {
            false => Undo::decode(value),
            true => self.now.find_undo(seq, |u| (u.key() == key).then_some(u))?,
        };
        found.ok_or_else(|| corrupt("history index entry", seq))
    }

    /// The blob at chunk `idx` of `ino` at this point.
    fn blob_at(&self, ino: u64, idx: u64) -> Result<Option<u64>, StoreError> {
        match self.changed_after(&undo_key(3, &[ino, idx], ""))? {
            Some(Undo::Filemap { old, .. }) => Ok(old),
            Some(_) => Err(corrupt("history index entry", ino)),
            None => {
                let t = self.now.tx.open_table(FILEMAP).map_err(map_err)?;
                Ok(t.get((ino, idx)).map_err(map_err)?.map(|v| v.value()))
            }
        }
    }
}

impl Past<'_> {
    /// The encoded record of `ino` at this point, its fields at least: an inline chunk's
    /// content may be left in the history record (see `inode_record`).
    fn inode_image(&self, ino: u64) -> Result<Option<InodeImage>, StoreError> {
        match self.changed_after_in(&undo_key(1, &[ino], ""))? {
            Some((seq, Undo::Inode { old, .. })) => Ok(old.map(|b| (Some(seq), b))),
            Some(_) => Err(corrupt("history index entry", ino)),
            None => {
                let t = self.now.tx.open_table(INODES).map_err(map_err)?;
                Ok(t.get(ino)
                    .map_err(map_err)?
                    .map(|v| (None, v.value().to_vec())))
            }
        }
    }

    /// The encoded record of `ino` at this point, whole (with its inline chunk, if any): read
    /// from the history record the index entry names when the index left the content there.
    pub(super) fn inode_record(&self, ino: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let Some((seq, image)) = self.inode_image(ino)? else {
            return Ok(None);
        };
        if content_kept(&image) {
            return self.kept_content(ino, seq, image).map(Some);
        }
        let Some(seq) = seq.filter(|_| content_in_record(&image)) else {
            return Ok(Some(image));
        };
        // The record's parts are read in order until the entry turns up.
        self.now
            .find_undo(seq, |u| match u {
                Undo::Inode { ino: i, old } if i == ino => Some(old),
                _ => None,
            })?
            .ok_or_else(|| corrupt("history record", seq))
    }
}

impl Past<'_> {
    /// Before-image `image` of `ino`, kept by record `seq` without its content or as a
    /// delta, whole: the content is its base inode's at the point after that record,
    /// followed through later records that kept that one the same way (a loop, not a
    /// recursion), then each delta applied back, newest first. A run of deltas is at most
    /// `MAX_IMAGE_RUN` long; the images an earlier build kept without a run may be more.
    pub(super) fn kept_content(
        &self,
        ino: u64,
        seq: Option<u64>,
        image: Vec<u8>,
    ) -> Result<Vec<u8>, StoreError> {
        let mut at = seq.ok_or_else(|| corrupt("history record", ino))?;
        let mut base = kept_base(ino, &image);
        let mut chain = vec![image];
        let mut whole = loop {
            let later = Past {
                now: self.now,
                seq: at,
            };
            let (next, record) = later
                .inode_image(base)?
                .ok_or_else(|| corrupt("history record", ino))?;
            if content_kept(&record) {
                at = next.ok_or_else(|| corrupt("history record", ino))?;
                base = kept_base(base, &record);
                chain.push(record);
                continue;
            }
            break match next.filter(|_| content_in_record(&record)) {
                Some(_) => later
                    .inode_record(base)?
                    .ok_or_else(|| corrupt("history record", ino))?,
                None => record,
            };
        };
        for image in chain.iter().rev() {
            whole =
                with_kept_content(image, &whole).ok_or_else(|| corrupt("history record", ino))?;
        }
        Ok(whole)
    }
}

impl TreeView for Past<'_> {
    fn inode(&self, ino: u64) -> Result<Option<Inode>, StoreError> {
        match self.inode_image(ino)? {
            None => Ok(None),
            Some((_, b)) => Inode::decode(ino, &b)
                .map(Some)
                .ok_or_else(|| corrupt("history record", ino)),
        }
    }

    fn lookup(&self, parent: u64, name: &str) -> Result<Option<(u64, Kind)>, StoreError> {
        match self.changed_after(&undo_key(2, &[parent], name))? {
            Some(Undo::Dirent { old: None, .. }) => Ok(None),
            Some(Undo::Dirent {
                old: Some((ino, k)),
                ..
            }) => Kind::from_byte(k)
                .map(|k| Some((ino, k)))
                .ok_or_else(|| corrupt("history dirent", ino)),
            Some(_) => Err(corrupt("history index entry", parent)),
            None => self.now.lookup(parent, name),
        }
    }

    fn list(&self, parent: u64) -> Result<Vec<DirEntry>, StoreError> {
        let mut entries: BTreeMap<String, (u64, Kind)> = self
            .now
            .list(parent)?
            .into_iter()
            .map(|e| (e.name, (e.ino, e.kind)))
            .collect();
        // Every entry of `parent` changed after this point takes its before-image: the keys
        // of one directory are adjacent in the index, each key's records in seq order.
        let t = self.now.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        let lo = undo_key(2, &[parent], "");
        // The last directory's entries end where the next tag's keys start.
        let hi = parent
            .checked_add(1)
            .map_or_else(|| vec![3], |p| undo_key(2, &[p], ""));
        let range = t
            .range((lo.as_slice(), 0)..(hi.as_slice(), 0))
            .map_err(map_err)?;
        let mut done: Option<Vec<u8>> = None;
        for item in range {
            let (k, v) = item.map_err(map_err)?;
            let (key, seq) = k.value();
            if seq <= self.seq || done.as_deref() == Some(key) {
                continue;
            }
            done = Some(key.to_vec());
            match self.indexed(key, seq, v.value()).ok() {
                Some(Undo::Dirent { name, old, .. }) => match old {
                    Some((ino, k)) => {
                        let kind =
                            Kind::from_byte(k).ok_or_else(|| corrupt("history dirent", ino))?;
                        entries.insert(name, (ino, kind));
                    }
                    None => {
                        entries.remove(&name);
                    }
                },
                _ => return Err(corrupt("history index entry", parent)),
            }
        }
        Ok(entries
            .into_iter()
            .map(|(name, (ino, kind))| DirEntry { name, ino, kind })
            .collect())
    }

    fn filemap_of(&self, ino: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        // A file's chunks lie below its size (`check` holds every store to it).
        let size = self.inode(ino)?.map_or(0, |i| i.size);
        let mut out = Vec::new();
        for idx in 0..size.div_ceil(CHUNK_SIZE) {
            if let Some(b) = self.blob_at(ino, idx)? {
                out.push((idx, b));
            }
        }
        Ok(out)
    }

    fn chunks(&self, ino: u64, first: u64, count: u64) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let blobs = self.now.blobs()?;
        (first..first.saturating_add(count))
            .map(|idx| {
                if idx == 0
                    && let Some(record) = self.inode_record(ino)?
                    && let Some(inline) = inline_chunk(&record)
                {
                    return super::content::inline_content(ino, inline).map(Some);
                }
                let Some(blob) = self.blob_at(ino, idx)? else {
                    return Ok(None);
                };
                let when = format!(" at history point {}", self.seq);
                super::content::chunk_content(&blobs, ino, idx, blob, &when).map(Some)
            })
            .collect()
    }

    fn content_redacted(&self, ino: u64) -> Result<bool, StoreError> {
        if let Some(record) = self.inode_record(ino)?
            && inline_chunk(&record) == Some(InlineChunk::Redacted)
        {
            return Ok(true);
        }
        let red = self.now.tx.open_table(REDACTED).map_err(map_err)?;
        for (_, blob) in self.filemap_of(ino)? {
            if red.get(blob).map_err(map_err)?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn inline_part_of(&self, ino: u64) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .inode_record(ino)?
            .and_then(|b| inline_part(&b).map(<[u8]>::to_vec)))
    }
}
