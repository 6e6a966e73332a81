//! History: the before-images a write transaction captures, the record appended at commit,
//! expiry, marks, and the queries over history (`history_of`, `at_point`).
//!
//! Invariant kept here: a history record is appended in the same transaction as the changes
//! it undoes, and every blob a record names keeps a reference until the record is dropped.

use std::path::Path;
use std::sync::atomic::Ordering;

use redb::ReadableTable;

use super::read::ReadTxn;
use super::redo::{redo_del, redo_put};
use super::schema::*;
use super::write::WriteTxn;
use super::{Store, StoreError, Sync, corrupt, map_err};

/// What the operation being committed was and who did it, for its history record.
#[derive(Clone, Debug, Default)]
pub struct OpInfo {
    pub op: &'static str,
    pub paths: Vec<String>,
    pub ino: u64,
    pub size_before: u64,
    pub size_after: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// A lost update this operation made or was refused for (see `fs::conflicts`).
    pub conflict: Option<String>,
}

/// Before-images captured while history is on.
#[derive(Default)]
pub(super) struct Capture {
    pub(super) undo: Vec<Undo>,
    pub(super) seen: std::collections::HashSet<(u8, u64, u64, String)>,
}

impl Store {
    /// Whether operations append history records.
    pub fn history_on(&self) -> bool {
        self.keep_history_ns.load(Ordering::Relaxed) > 0
    }

    /// Sets history retention (0 turns history off) and records it in the store.
    pub fn set_keep_history(&self, keep_ns: u64) -> Result<(), StoreError> {
        self.keep_history_ns.store(0, Ordering::Relaxed);
        let w = self.write()?;
        w.put_meta(META_KEEP_HISTORY, &keep_ns.to_le_bytes())?;
        w.commit(Sync::Durable)?;
        self.keep_history_ns.store(keep_ns, Ordering::Relaxed);
        Ok(())
    }

    /// The name of process `pid` now, from the same read of /proc that gives its start
    /// time: never a name cached for the pid, which a new process may have been handed since.
    fn process_name(&self, pid: u32) -> String {
        crate::process::stat(pid)
            .map(|s| s.name)
            .unwrap_or_default()
    }

    /// Drops every history record to make room on a full disk: current content comes first.
    pub fn shed_history(&self) -> Result<(), StoreError> {
        if self.read()?.first_seq()?.is_none() {
            return Ok(());
        }
        let mut w = self.write()?;
        w.without_history();
        let n = w.history_after(0)?.len();
        if n == 0 {
            return Ok(());
        }
        w.truncate_history_after(0)?;
        // Removal only: it fits in the reserve that content commits leave. redb hands the
        // freed pages out again after the next commit, so one more follows.
        w.commit(Sync::Durable)?;
        self.write()?.commit(Sync::Durable)?;
        tracing::warn!(
            records = n,
            "the disk is full: dropped the store's history to make room"
        );
        Ok(())
    }
}

impl ReadTxn {
    /// History records, newest first, with seq in `range`.
    pub fn history(
        &self,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.range(range).map_err(map_err)?.rev() {
            let (k, v) = item.map_err(map_err)?;
            out.push(
                HistoryRecord::decode(k.value(), v.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?,
            );
        }
        Ok(out)
    }

    /// The seq of the newest history record (0 when there is none yet).
    pub fn last_seq(&self) -> Result<u64, StoreError> {
        Ok(self
            .meta_u64(META_HISTORY_NEXT)?
            .unwrap_or(1)
            .saturating_sub(1))
    }

    /// The seq of the oldest history record still kept.
    pub fn first_seq(&self) -> Result<Option<u64>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        Ok(t.first().map_err(map_err)?.map(|(k, _)| k.value()))
    }

    pub fn mark(&self, name: &str) -> Result<Option<u64>, StoreError> {
        let t = self.tx.open_table(MARKS).map_err(map_err)?;
        Ok(t.get(name).map_err(map_err)?.map(|v| v.value()))
    }

    pub fn marks(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let t = self.tx.open_table(MARKS).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            out.push((k.value().to_string(), v.value()));
        }
        Ok(out)
    }

    /// Fails unless every record after `seq` is still kept (older ones expire).
    pub fn check_reachable(&self, seq: u64) -> Result<(), StoreError> {
        let last = self.last_seq()?;
        if seq >= last {
            return Ok(());
        }
        match self.first_seq()? {
            Some(first) if first <= seq + 1 => Ok(()),
            Some(first) => Err(StoreError::Io(format!(
                "history before record {first} has expired (--keep-history); the oldest point is {}",
                first - 1
            ))),
            None => Err(StoreError::Io(
                "no history is kept (history off, or expired)".to_string(),
            )),
        }
    }

    /// Writes the store as it was at history point `seq` into a new store file at `out`: a
    /// copy of this snapshot with the records after `seq` undone and dropped.
    pub fn materialize_at(&self, seq: u64, out: &Path) -> Result<(), StoreError> {
        self.check_reachable(seq)?;
        self.copy_to(out, &mut |_| {})?;
        let s = Store::open_existing(out)?;
        let mut w = s.write()?;
        w.without_history();
        w.without_quotas();
        for rec in w.history_after(seq)? {
            w.apply_undo(&rec.undo)?;
        }
        w.truncate_history_after(seq)?;
        w.commit(Sync::Durable)
    }

    /// Runs `f` on the store as it was at history point `seq`, from a scratch copy in a
    /// temporary directory that goes away afterwards.
    pub fn at_point<T>(
        &self,
        seq: u64,
        f: impl FnOnce(&ReadTxn) -> Result<T, String>,
    ) -> Result<T, String> {
        let dir = tempfile::Builder::new()
            .prefix("redbfs-at-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|e| e.to_string())?;
        let path = dir.path().join("at.redb");
        self.materialize_at(seq, &path).map_err(|e| e.to_string())?;
        let s = Store::open_existing(&path).map_err(|e| e.to_string())?;
        let r = s.read().map_err(|e| e.to_string())?;
        f(&r)
    }

    /// History records, newest first, for the whole store or for `path` (following it back
    /// through renames of it or of a directory above it), no older than `since_ns`.
    pub fn history_of(
        &self,
        path: Option<&str>,
        since_ns: Option<i64>,
        limit: usize,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let mut tracked = path.map(|p| {
            let p = format!("/{}", p.trim_matches('/'));
            if p == "/" {
                p
            } else {
                p.trim_end_matches('/').to_string()
            }
        });
        let mut out = Vec::new();
        let within =
            |p: &str, base: &str| base == "/" || p == base || p.starts_with(&format!("{base}/"));
        for rec in self.history(0..=u64::MAX)? {
            if since_ns.is_some_and(|s| rec.time < s) || out.len() >= limit {
                break;
            }
            let keep = match &tracked {
                None => true,
                Some(t) => rec.paths.iter().any(|p| within(p, t) || within(t, p)),
            };
            if let (Some(t), true) = (&mut tracked, rec.op == "rename" || rec.op == "exchange")
                && let [from, to] = rec.paths.as_slice()
                && within(t, to)
            {
                // Older records knew the tracked path under its name before the rename.
                *t = format!("{from}{}", &t[to.len()..]);
            }
            if keep {
                out.push(rec);
            }
        }
        Ok(out)
    }
}

impl WriteTxn<'_> {
    /// Stops recording before-images: for transactions that are not user operations
    /// (applying history to a scratch copy, dropping expired history).
    pub fn without_history(&mut self) {
        self.capture = None;
    }

    /// Names the operation for its history record.
    pub fn describe(&mut self, info: OpInfo) {
        self.info = Some(info);
    }

    /// Notes a lost update on the operation `describe` named (kept only with history on).
    pub fn note_conflict(&mut self, note: String) {
        if let Some(i) = &mut self.info {
            i.conflict = Some(note);
        }
    }

    /// Directory entries and inodes this transaction has changed so far (history on only).
    pub fn touched(&self) -> (Vec<(u64, String)>, Vec<u64>) {
        let mut dirents = Vec::new();
        let mut inodes = Vec::new();
        for u in self.capture.iter().flat_map(|c| &c.undo) {
            match u {
                Undo::Dirent { parent, name, .. } => dirents.push((*parent, name.clone())),
                Undo::Inode { ino, .. } => inodes.push(*ino),
                Undo::Filemap { ino, .. } => inodes.push(*ino),
                Undo::Orphan { .. } => {}
            }
        }
        inodes.sort_unstable();
        inodes.dedup();
        (dirents, inodes)
    }

    /// Appends the history record of this transaction's before-images (if it changed
    /// anything, or noted a conflict), and expires a bounded batch of old records.
    pub(super) fn record_history(&mut self, now: i64) -> Result<(), StoreError> {
        // A refused replace changes nothing but is recorded all the same.
        let noted = self.info.as_ref().is_some_and(|i| i.conflict.is_some());
        if let Some(c) = self.capture.take()
            && (!c.undo.is_empty() || noted)
        {
            let seq = self.next_counter(META_HISTORY_NEXT)?;
            let info = self.info.take().unwrap_or(OpInfo {
                op: "change",
                ..OpInfo::default()
            });
            let record = HistoryRecord {
                seq,
                time: now,
                op: info.op.to_string(),
                paths: info.paths,
                ino: info.ino,
                size_before: info.size_before,
                size_after: info.size_after,
                uid: info.uid,
                gid: info.gid,
                pid: info.pid,
                comm: if info.pid != 0 {
                    self.store.process_name(info.pid)
                } else {
                    String::new()
                },
                redacted: false,
                undo: c.undo,
                conflict: info.conflict,
            };
            self.put_record(&record)?;
            let keep = self.store.keep_history_ns.load(Ordering::Relaxed);
            if keep > 0 {
                // A bounded batch per commit keeps every commit cheap; the rest follow.
                self.expire_history(now.saturating_sub(keep as i64), 16)?;
            }
        }
        Ok(())
    }

    /// Restores the before-images of `undo`, newest change first. With history on, this is
    /// itself captured, so undoing can be undone.
    pub fn apply_undo(&mut self, undo: &[Undo]) -> Result<(), StoreError> {
        for u in undo.iter().rev() {
            match u {
                Undo::Inode { ino, old } => {
                    let old = match old {
                        Some(b) => Some(
                            Inode::decode(*ino, b)
                                .ok_or_else(|| corrupt("history record", *ino))?,
                        ),
                        None => None,
                    };
                    self.set_inode(*ino, old.as_ref())?;
                }
                Undo::Dirent { parent, name, old } => {
                    let old = match old {
                        Some((ino, k)) => Some((
                            *ino,
                            Kind::from_byte(*k).ok_or_else(|| corrupt("history dirent", *ino))?,
                        )),
                        None => None,
                    };
                    self.set_dirent(*parent, name, old)?;
                }
                Undo::Filemap { ino, idx, old } => {
                    if let Some(b) = old
                        && !self.blob_exists(*b)?
                    {
                        return Err(StoreError::Corrupt(format!(
                            "history refers to missing blob {b}"
                        )));
                    }
                    self.set_filemap(*ino, *idx, *old)?;
                }
                Undo::Orphan { ino, present } => self.set_orphan(*ino, *present)?,
            }
        }
        Ok(())
    }

    /// History records with seq above `after`, newest first.
    pub fn history_after(&self, after: u64) -> Result<Vec<HistoryRecord>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.range(after + 1..).map_err(map_err)?.rev() {
            let (k, v) = item.map_err(map_err)?;
            out.push(
                HistoryRecord::decode(k.value(), v.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?,
            );
        }
        Ok(out)
    }

    /// Removes history records with seq above `after`, releasing what they kept alive.
    pub fn truncate_history_after(&mut self, after: u64) -> Result<(), StoreError> {
        for r in self.history_after(after)? {
            self.drop_record(&r)?;
        }
        Ok(())
    }

    fn drop_record(&mut self, r: &HistoryRecord) -> Result<(), StoreError> {
        for u in &r.undo {
            if let Undo::Filemap { old: Some(b), .. } = u {
                self.blob_unref(*b);
            }
        }
        self.tx
            .open_table(HISTORY)
            .map_err(map_err)?
            .remove(r.seq)
            .map_err(map_err)?;
        redo_del(&self.redo, HISTORY, &r.seq);
        Ok(())
    }

    /// Drops up to `max` records older than `cutoff` (ns since the epoch).
    fn expire_history(&mut self, cutoff: i64, max: usize) -> Result<(), StoreError> {
        let old: Vec<HistoryRecord> = {
            let t = self.tx.open_table(HISTORY).map_err(map_err)?;
            let mut v = Vec::new();
            for item in t.iter().map_err(map_err)?.take(max) {
                let (k, val) = item.map_err(map_err)?;
                let r = HistoryRecord::decode(k.value(), val.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?;
                if r.time >= cutoff {
                    break;
                }
                v.push(r);
            }
            v
        };
        for r in &old {
            self.drop_record(r)?;
        }
        Ok(())
    }

    /// Rewrites one history record (redaction).
    pub fn put_record(&mut self, r: &HistoryRecord) -> Result<(), StoreError> {
        let bytes = r.encode();
        self.tx
            .open_table(HISTORY)
            .map_err(map_err)?
            .insert(r.seq, bytes.as_slice())
            .map_err(map_err)?;
        redo_put(&self.redo, HISTORY, &r.seq, &bytes.as_slice());
        Ok(())
    }

    pub fn set_mark(&self, name: &str, seq: u64) -> Result<(), StoreError> {
        self.tx
            .open_table(MARKS)
            .map_err(map_err)?
            .insert(name, seq)
            .map_err(map_err)?;
        redo_put(&self.redo, MARKS, &name, &seq);
        Ok(())
    }
}
