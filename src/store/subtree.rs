//! Per-directory aggregates: for every directory, the files, directories and content bytes
//! below it, upper bounds of its deepest and longest relative path, and its quota (the
//! `subtree` table; see `schema`). They serve three things with one mechanism: quotas per
//! directory, `du` and `statfs` of a directory without a walk, and the path limits of a
//! directory rename without a walk.
//!
//! Invariant kept here: every change of an inode's place (parent, name, nlink) or size goes
//! through `WriteTxn::set_inode`, which calls `track_inode`; that adds the change to each
//! directory on the way up to the root (O(depth)), and the rows are written once at commit,
//! in the same transaction. A directory's own row is what it carries when it moves, so a
//! move between quota roots costs the same at 10 and 10,000 entries. Counts are exact;
//! bounds only grow (creates and moves in), and `exact_bounds` tightens them by a walk.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use redb::{ReadableTable, ReadableTableMetadata};

use super::read::{ReadTxn, meta_u64_in};
use super::redo::{redo_del, redo_put};
use super::schema::*;
use super::write::WriteTxn;
use super::{Store, StoreError, map_err};

/// Deeper than any path a store allows: a chain of parents this long is a cycle.
const MAX_CHAIN: usize = 4096;

/// The rows a transaction has touched: as stored before it (None: no row) and as they are now.
#[derive(Default)]
pub(super) struct Pending {
    rows: BTreeMap<u64, (Option<SubtreeRecord>, SubtreeRecord)>,
    /// Directory -> (parent, name length), as this transaction knows them: the walk up reads
    /// each inode once.
    chain: HashMap<u64, (u64, u32)>,
    /// Quotas are not checked at commit (see `WriteTxn::without_quotas`).
    unchecked: bool,
    /// Nothing is tracked (see `WriteTxn::without_aggregates`).
    off: bool,
    /// This transaction built every row afresh (`Store::build_subtree`).
    rebuilt: bool,
}

/// A signed change of the three counts.
#[derive(Clone, Copy, Default)]
struct Counts {
    files: i64,
    dirs: i64,
    bytes: i64,
}

impl Counts {
    fn negated(self) -> Counts {
        Counts {
            files: -self.files,
            dirs: -self.dirs,
            bytes: -self.bytes,
        }
    }
}

/// Where an inode counts: under its parent, with its name's length; None for the root and
/// for an orphan (nlink 0: unlinked while open), which count in no directory.
fn placement(i: &Inode) -> Option<(u64, u32)> {
    (i.ino != ROOT_INO && i.nlink > 0).then_some((i.parent, i.name.len() as u32))
}

fn sat32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn decode_row(dir: u64, b: &[u8]) -> Result<SubtreeRecord, StoreError> {
    SubtreeRecord::decode(b)
        .ok_or_else(|| StoreError::Corrupt(format!("the subtree record of {dir} does not decode")))
}

impl Store {
    /// Operations the aggregates have done since the store opened: rows touched, steps up a
    /// chain of parents, entries visited by an exact walk. Tests count work with it.
    pub fn subtree_work(&self) -> u64 {
        self.subtree_work.load(Ordering::Relaxed)
    }

    /// Builds every directory's counts and bounds again from the inode records, in one
    /// transaction (after a repair, which changes a tree whose parents may be broken).
    pub fn rebuild_aggregates(&self) -> Result<(), StoreError> {
        self.build_subtree()
    }

    /// Whether the aggregates must be (re)built: the table is missing, or a commit was made
    /// by a build that does not keep them (see "subtree_seq").
    pub(super) fn subtree_stale(&self) -> Result<bool, StoreError> {
        let r = self.read()?;
        Ok(!r.subtree_current()?)
    }

    /// Builds every directory's row from the inode records in one pass, keeping the quotas
    /// already set, in one durable transaction.
    pub(super) fn build_subtree(&self) -> Result<(), StoreError> {
        let mut w = self.write()?;
        w.without_history();
        let mut rows: HashMap<u64, SubtreeRecord> = HashMap::new();
        {
            let t = w.tx.open_table(SUBTREE).map_err(map_err)?;
            for item in t.iter().map_err(map_err)? {
                let (k, v) = item.map_err(map_err)?;
                let old = decode_row(k.value(), v.value())?;
                if old.has_quota() {
                    rows.insert(
                        k.value(),
                        SubtreeRecord {
                            quota_bytes: old.quota_bytes,
                            quota_files: old.quota_files,
                            ..SubtreeRecord::default()
                        },
                    );
                }
            }
        }
        let inodes: Vec<Inode> = {
            let t = w.tx.open_table(INODES).map_err(map_err)?;
            let mut v = Vec::with_capacity(t.len().map_err(map_err)? as usize);
            for item in t.iter().map_err(map_err)? {
                let (k, val) = item.map_err(map_err)?;
                v.push(
                    Inode::decode(k.value(), val.value())
                        .ok_or_else(|| super::corrupt("record", k.value()))?,
                );
            }
            v
        };
        let dirs: HashMap<u64, (u64, u32)> = inodes
            .iter()
            .filter(|i| i.kind == Kind::Dir)
            .filter_map(|i| placement(i).map(|p| (i.ino, p)))
            .collect();
        for i in &inodes {
            let Some((parent, name_len)) = placement(i) else {
                continue;
            };
            let (files, dirs_n) = match i.kind {
                Kind::File => (1, 0),
                Kind::Dir => (0, 1),
            };
            let (mut depth, mut bytes) = (1u64, name_len as u64 + 1);
            let mut cur = parent;
            for step in 0.. {
                if step > MAX_CHAIN {
                    return Err(StoreError::Corrupt(format!(
                        "the parents of inode {} form a cycle",
                        i.ino
                    )));
                }
                let row = rows.entry(cur).or_default();
                row.files += files;
                row.dirs += dirs_n;
                if i.kind == Kind::File {
                    row.bytes += i.size;
                }
                row.depth = row.depth.max(sat32(depth));
                row.path_bytes = row.path_bytes.max(sat32(bytes));
                if cur == ROOT_INO {
                    break;
                }
                let Some(&(p, nl)) = dirs.get(&cur) else {
                    return Err(StoreError::Corrupt(format!(
                        "inode {} lies under {cur}, which is not a placed directory",
                        i.ino
                    )));
                };
                depth += 1;
                bytes += nl as u64 + 1;
                cur = p;
            }
        }
        {
            let mut q = w.tx.open_table(QUOTAS).map_err(map_err)?;
            for (k, row) in &rows {
                if row.has_quota() {
                    q.insert(*k, ()).map_err(map_err)?;
                    redo_put(&w.redo, QUOTAS, k, &());
                }
            }
        }
        {
            let mut t = w.tx.open_table(SUBTREE).map_err(map_err)?;
            let old: Vec<u64> = t
                .iter()
                .map_err(map_err)?
                .map(|item| item.map(|(k, _)| k.value()).map_err(map_err))
                .collect::<Result<_, _>>()?;
            for k in old {
                if !rows.contains_key(&k) {
                    t.remove(k).map_err(map_err)?;
                    redo_del(&w.redo, SUBTREE, &k);
                }
            }
            for (k, row) in &rows {
                let b = row.encode();
                t.insert(*k, b.as_slice()).map_err(map_err)?;
                redo_put(&w.redo, SUBTREE, k, &b.as_slice());
            }
        }
        w.agg.rebuilt = true;
        w.commit_checkpoint()?;
        tracing::info!(store = %self.path.display(), directories = rows.len(), "built the per-directory usage and path bounds");
        Ok(())
    }
}

impl ReadTxn {
    /// Whether the aggregates in this snapshot are kept up to date (built, and no commit
    /// since by a build that does not keep them).
    pub fn subtree_current(&self) -> Result<bool, StoreError> {
        let exists = match self.tx.open_table(SUBTREE) {
            Ok(_) => true,
            Err(redb::TableError::TableDoesNotExist(_)) => false,
            Err(e) => return Err(map_err(e)),
        };
        Ok(exists && self.meta_u64(META_SUBTREE_SEQ)? == self.meta_u64(META_LOG_SEQ)?)
    }

    /// The stored row of directory `dir` (an empty directory without a quota has none).
    pub fn subtree(&self, dir: u64) -> Result<SubtreeRecord, StoreError> {
        let t = match self.tx.open_table(SUBTREE) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(SubtreeRecord::default()),
            Err(e) => return Err(map_err(e)),
        };
        match t.get(dir).map_err(map_err)? {
            Some(v) => decode_row(dir, v.value()),
            None => Ok(SubtreeRecord::default()),
        }
    }

    /// Whether the store has the index of directories with a quota.
    pub(super) fn has_quota_index(&self) -> Result<bool, StoreError> {
        match self.tx.open_table(QUOTAS) {
            Ok(_) => Ok(true),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
            Err(e) => Err(map_err(e)),
        }
    }

    /// The directories with a quota (those whose directory is gone included), with their rows.
    pub fn quota_rows(&self) -> Result<Vec<(u64, SubtreeRecord)>, StoreError> {
        let t = match self.tx.open_table(QUOTAS) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(map_err(e)),
        };
        let mut out = Vec::new();
        for item in t.iter().map_err(map_err)? {
            let dir = item.map_err(map_err)?.0.value();
            out.push((dir, self.subtree(dir)?));
        }
        Ok(out)
    }

    /// Every stored row, in inode order (for check; with `sums`, the table's sum is taken on
    /// the way).
    pub fn all_subtrees(
        &self,
        sums: Option<&mut super::TableSums>,
    ) -> Result<Vec<(u64, SubtreeRecord)>, StoreError> {
        let len = match self.tx.open_table(SUBTREE) {
            Ok(t) => t.len().map_err(map_err)?,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(map_err(e)),
        };
        let mut out = Vec::with_capacity(len as usize);
        self.scan_raw(SUBTREE, sums, |k, v| {
            let ino = <u64 as redb::Value>::from_bytes(k);
            out.push((ino, decode_row(ino, v)?));
            Ok(())
        })?;
        Ok(out)
    }

    /// The directories with a quota at or above `ino` (itself if a directory, then each
    /// parent up to the root), innermost first, with their rows.
    pub fn quota_roots_above(&self, ino: u64) -> Result<Vec<(u64, SubtreeRecord)>, StoreError> {
        let mut out = Vec::new();
        let mut cur = ino;
        for _ in 0..MAX_CHAIN {
            let Some(i) = self.inode(cur)? else {
                return Ok(out);
            };
            if i.kind == Kind::Dir {
                let row = self.subtree(cur)?;
                if row.has_quota() {
                    out.push((cur, row));
                }
            }
            if cur == ROOT_INO || i.nlink == 0 {
                return Ok(out);
            }
            cur = i.parent;
        }
        Err(StoreError::Corrupt(format!(
            "the parents of inode {ino} form a cycle"
        )))
    }
}

impl WriteTxn<'_> {
    fn work(&self, n: u64) {
        self.store.subtree_work.fetch_add(n, Ordering::Relaxed);
    }

    /// Directory `dir`'s row as this transaction has it.
    fn row_mut(&mut self, dir: u64) -> Result<&mut SubtreeRecord, StoreError> {
        if !self.agg.rows.contains_key(&dir) {
            self.work(1);
            let t = self.tx.open_table(SUBTREE).map_err(map_err)?;
            let stored = match t.get(dir).map_err(map_err)? {
                Some(v) => Some(decode_row(dir, v.value())?),
                None => None,
            };
            drop(t);
            self.agg
                .rows
                .insert(dir, (stored, stored.unwrap_or_default()));
        }
        Ok(&mut self.agg.rows.get_mut(&dir).expect("inserted above").1)
    }

    /// What lies below directory `dir`, as this transaction sees it.
    pub fn subtree(&mut self, dir: u64) -> Result<SubtreeRecord, StoreError> {
        self.row_mut(dir).map(|r| *r)
    }

    /// The directories from `start` up to the root, both included, each with its name's
    /// length (0 for the root). Those this transaction has not met yet are read over one
    /// opening of the inode table, and their rows over one of the subtree table: a walk up
    /// used to open each table once per level.
    fn chain_from(&mut self, start: u64) -> Result<Vec<(u64, u32)>, StoreError> {
        let mut chain = Vec::new();
        let mut cur = start;
        {
            let mut inodes = None;
            loop {
                if chain.len() >= MAX_CHAIN {
                    return Err(StoreError::Corrupt(format!(
                        "the parents of directory {start} form a cycle"
                    )));
                }
                if cur == ROOT_INO {
                    chain.push((cur, 0));
                    break;
                }
                let (parent, name_len) = match self.agg.chain.get(&cur) {
                    Some(&c) => c,
                    None => {
                        self.store.subtree_work.fetch_add(1, Ordering::Relaxed);
                        if inodes.is_none() {
                            inodes = Some(self.tx.open_table(INODES).map_err(map_err)?);
                        }
                        let t = inodes.as_ref().expect("opened above");
                        let i = super::read::get_inode_in(&**t, cur)?.ok_or_else(|| {
                            StoreError::Corrupt(format!(
                                "directory {cur} above a changed entry is missing"
                            ))
                        })?;
                        let c = (i.parent, i.name.len() as u32);
                        self.agg.chain.insert(cur, c);
                        c
                    }
                };
                chain.push((cur, name_len));
                cur = parent;
            }
        }
        let missing: Vec<u64> = chain
            .iter()
            .map(|&(d, _)| d)
            .filter(|d| !self.agg.rows.contains_key(d))
            .collect();
        if !missing.is_empty() {
            self.work(missing.len() as u64);
            let t = self.tx.open_table(SUBTREE).map_err(map_err)?;
            for dir in missing {
                let stored = match t.get(dir).map_err(map_err)? {
                    Some(v) => Some(decode_row(dir, v.value())?),
                    None => None,
                };
                self.agg
                    .rows
                    .insert(dir, (stored, stored.unwrap_or_default()));
            }
        }
        Ok(chain)
    }

    /// Adds `c` to every directory from `start` up to the root; `rel` is the (levels, bytes)
    /// of the deepest and longest path the change brings, relative to `start`.
    fn add_along(
        &mut self,
        start: u64,
        c: Counts,
        mut rel: Option<(u64, u64)>,
    ) -> Result<(), StoreError> {
        for (dir, name_len) in self.chain_from(start)? {
            let row = self.row_mut(dir)?;
            row.files = row.files.saturating_add_signed(c.files);
            row.dirs = row.dirs.saturating_add_signed(c.dirs);
            row.bytes = row.bytes.saturating_add_signed(c.bytes);
            if let Some((d, b)) = rel {
                row.depth = row.depth.max(sat32(d));
                row.path_bytes = row.path_bytes.max(sat32(b));
            }
            rel = rel.map(|(d, b)| (d + 1, b + name_len as u64 + 1));
        }
        Ok(())
    }

    /// What inode `i` adds to its parent: itself, and for a directory everything below it.
    fn contribution(&mut self, i: &Inode) -> Result<(Counts, (u64, u64)), StoreError> {
        let name = i.name.len() as u64 + 1;
        Ok(match i.kind {
            Kind::File => (
                Counts {
                    files: 1,
                    dirs: 0,
                    bytes: i.size as i64,
                },
                (1, name),
            ),
            Kind::Dir => {
                let row = self.subtree(i.ino)?;
                (
                    Counts {
                        files: row.files as i64,
                        dirs: row.dirs as i64 + 1,
                        bytes: row.bytes as i64,
                    },
                    (1 + row.depth as u64, name + row.path_bytes as u64),
                )
            }
        })
    }

    /// Keeps the aggregates in step with one inode record changing from `old` to `new`.
    pub(super) fn track_inode(
        &mut self,
        ino: u64,
        old: Option<&Inode>,
        new: Option<&Inode>,
    ) -> Result<(), StoreError> {
        if self.agg.off {
            return Ok(());
        }
        let was = old.and_then(placement);
        let is = new.and_then(placement);
        if let (Some(o), Some(n)) = (old, new)
            && was.is_some()
            && was == is
            && o.kind == n.kind
        {
            // In place: only a file's size can change what it adds.
            let d = n.size as i64 - o.size as i64;
            if n.kind == Kind::File && d != 0 {
                let parent = n.parent;
                self.add_along(
                    parent,
                    Counts {
                        bytes: d,
                        ..Counts::default()
                    },
                    None,
                )?;
            }
            return Ok(());
        }
        if let (Some((parent, _)), Some(o)) = (was, old) {
            let (c, _) = self.contribution(o)?;
            self.add_along(parent, c.negated(), None)?;
        }
        match new {
            Some(n) if n.kind == Kind::Dir => {
                self.agg.chain.insert(ino, (n.parent, n.name.len() as u32));
            }
            _ => {
                self.agg.chain.remove(&ino);
            }
        }
        if let (Some((parent, _)), Some(n)) = (is, new) {
            let (c, rel) = self.contribution(n)?;
            self.add_along(parent, c, Some(rel))?;
        }
        if new.is_none() && old.is_some_and(|o| o.kind == Kind::Dir) {
            // The directory's row goes with it; a quota stays, for history restoring it.
            let row = self.row_mut(ino)?;
            *row = SubtreeRecord {
                quota_bytes: row.quota_bytes,
                quota_files: row.quota_files,
                ..SubtreeRecord::default()
            };
        }
        Ok(())
    }

    /// The exact (levels, bytes) of the deepest and longest path below directory `dir`, by a
    /// walk of its subtree; the rows of every directory in it are tightened to what the
    /// walk found.
    pub fn exact_bounds(&mut self, dir: u64) -> Result<(u32, u32), StoreError> {
        // Directories in walk order (parents before children), each with its entries as
        // (inode, kind, bytes its name adds to a path).
        type Entries = Vec<(u64, Kind, u64)>;
        let mut order: Vec<(u64, Entries)> = Vec::new();
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            let entries = self.list(d, usize::MAX)?;
            self.work(entries.len() as u64 + 1);
            let children: Entries = entries
                .into_iter()
                .map(|e| (e.ino, e.kind, e.name.len() as u64 + 1))
                .collect();
            stack.extend(children.iter().filter(|c| c.1 == Kind::Dir).map(|c| c.0));
            order.push((d, children));
            if order.len() > 100_000_000 {
                return Err(StoreError::Corrupt("a cycle of directories".into()));
            }
        }
        let mut exact: HashMap<u64, (u64, u64)> = HashMap::new();
        for (d, children) in order.iter().rev() {
            let mut b = (0u64, 0u64);
            for &(ino, kind, name) in children {
                let (cd, cb) = match kind {
                    Kind::File => (0, 0),
                    Kind::Dir => exact.get(&ino).copied().unwrap_or_default(),
                };
                b.0 = b.0.max(1 + cd);
                b.1 = b.1.max(name + cb);
            }
            exact.insert(*d, b);
            let row = self.row_mut(*d)?;
            row.depth = row.depth.min(sat32(b.0));
            row.path_bytes = row.path_bytes.min(sat32(b.1));
        }
        let b = exact.get(&dir).copied().unwrap_or_default();
        Ok((sat32(b.0), sat32(b.1)))
    }

    /// Changes without keeping the aggregates (a repair of a damaged tree): the commit leaves
    /// them marked stale, and `Store::rebuild_aggregates` must follow.
    pub fn without_aggregates(&mut self) {
        self.agg.off = true;
        self.agg.rows.clear();
    }

    /// Commits without refusing growth past a quota: for scratch copies that replay history
    /// (a store as it was at a point), never for a change of a live store.
    pub fn without_quotas(&mut self) {
        self.agg.unchecked = true;
    }

    /// Sets (or with both zero, clears) the quota of directory `dir`.
    pub fn set_quota(&mut self, dir: u64, bytes: u64, files: u64) -> Result<(), StoreError> {
        let row = self.row_mut(dir)?;
        row.quota_bytes = bytes;
        row.quota_files = files;
        let mut t = self.tx.open_table(QUOTAS).map_err(map_err)?;
        if bytes > 0 || files > 0 {
            t.insert(dir, ()).map_err(map_err)?;
            redo_put(&self.redo, QUOTAS, &dir, &());
        } else if t.remove(dir).map_err(map_err)?.is_some() {
            redo_del(&self.redo, QUOTAS, &dir);
        }
        Ok(())
    }

    /// At commit: refuses a transaction that grows a directory past its quota (when
    /// `check`), then writes the rows it changed.
    pub(super) fn settle_subtree(&mut self, check: bool) -> Result<(), StoreError> {
        let rows = std::mem::take(&mut self.agg.rows);
        if check && !self.agg.unchecked {
            for (&dir, (before, now)) in &rows {
                let before = before.unwrap_or_default();
                let over_bytes =
                    now.quota_bytes > 0 && now.bytes > now.quota_bytes && now.bytes > before.bytes;
                let over_files = now.quota_files > 0
                    && now.entries() > now.quota_files
                    && now.entries() > before.entries();
                if over_bytes || over_files {
                    return Err(StoreError::DirQuota {
                        dir,
                        files: over_files,
                        limit: if over_files {
                            now.quota_files
                        } else {
                            now.quota_bytes
                        },
                    });
                }
            }
        }
        let mut t = self.tx.open_table(SUBTREE).map_err(map_err)?;
        for (dir, (before, now)) in rows {
            if before == Some(now) {
                continue;
            }
            if now == SubtreeRecord::default() {
                if before.is_some() {
                    t.remove(dir).map_err(map_err)?;
                    redo_del(&self.redo, SUBTREE, &dir);
                }
                continue;
            }
            let b = now.encode();
            t.insert(dir, b.as_slice()).map_err(map_err)?;
            redo_put(&self.redo, SUBTREE, &dir, &b.as_slice());
        }
        Ok(())
    }

    /// Records that the aggregates are kept up to commit `seq` (see "subtree_seq"): when
    /// they were kept up to the commit before it and this one kept them too, or built them.
    /// Once a commit did not keep them, no later one claims they are kept until a rebuild.
    pub(super) fn mark_subtree_kept(&self, seq: u64) -> Result<(), StoreError> {
        if self.agg.off {
            return Ok(());
        }
        let mut meta = self.tx.open_table(META).map_err(map_err)?;
        if !self.agg.rebuilt
            && meta_u64_in(&*meta, META_SUBTREE_SEQ)? != meta_u64_in(&*meta, META_LOG_SEQ)?
        {
            return Ok(());
        }
        let bytes = seq.to_le_bytes();
        meta.insert(META_SUBTREE_SEQ, bytes.as_slice())
            .map_err(map_err)?;
        redo_put(&self.redo, META, &META_SUBTREE_SEQ, &bytes.as_slice());
        Ok(())
    }
}
