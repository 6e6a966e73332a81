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
use super::write::{OpInfo, WriteTxn};
use super::{Store, StoreError, Sync, corrupt, map_err};

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

    /// The name of process `pid` now, from /proc: never a name cached for the pid, which a
    /// new process may have been handed since.
    pub(super) fn process_name(&self, pid: u32) -> String {
        crate::process::name(pid).unwrap_or_default()
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

    /// Calls `f` on every history record, oldest first, one at a time (memory stays flat
    /// however long the history).
    pub fn for_each_record(
        &self,
        mut f: impl FnMut(HistoryRecord) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            f(HistoryRecord::decode(k.value(), v.value())
                .ok_or_else(|| corrupt("history record", k.value()))?)?;
        }
        Ok(())
    }

    /// Where history's indexes disagree with the records (for check): each record's keys,
    /// paths and time indexed, with its before-images, and nothing else indexed.
    ///
    /// Each index is checked by a merge, not a lookup per entry: what the records say it
    /// must hold, sorted as the index is, against one ordered scan of it. The records are
    /// taken in batches of at most `INDEX_CHECK_BATCH` wanted entries, each merged with the
    /// stretch of the index between its first and last entry, so memory stays bounded
    /// however long the history. Before-images are compared by a hash keyed afresh in each
    /// process.
    pub fn history_index_findings(&self) -> Result<Vec<String>, StoreError> {
        self.index_findings_in_batches(INDEX_CHECK_BATCH)
    }

    fn index_findings_in_batches(&self, batch: usize) -> Result<Vec<String>, StoreError> {
        let keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        let paths = self.tx.open_table(HISTORY_PATHS).map_err(map_err)?;
        let times = self.tx.open_table(HISTORY_TIMES).map_err(map_err)?;
        let mut check = IndexCheck {
            hasher: std::collections::hash_map::RandomState::new(),
            ..IndexCheck::default()
        };
        self.for_each_record(|r| {
            for (key, value, required) in index_entries(&r, |_| true) {
                let value = std::hash::BuildHasher::hash_one(&check.hasher, value.as_slice());
                check.keys.push((key, r.seq, value, required));
            }
            let mut rp: Vec<&str> = r.paths.iter().map(String::as_str).collect();
            rp.sort_unstable();
            rp.dedup();
            check
                .paths
                .extend(rp.into_iter().map(|p| (p.to_string(), r.seq)));
            check.times.push((r.time, r.seq));
            if check.keys.len() + check.paths.len() + check.times.len() >= batch {
                check.merge(&keys, &paths, &times)?;
            }
            Ok(())
        })?;
        check.merge(&keys, &paths, &times)?;
        let mut findings = check.findings;
        use redb::ReadableTableMetadata;
        for (table, want, got) in [
            ("history_keys", check.n_keys, keys.len().map_err(map_err)?),
            (
                "history_paths",
                check.n_paths,
                paths.len().map_err(map_err)?,
            ),
            (
                "history_times",
                check.n_times,
                times.len().map_err(map_err)?,
            ),
        ] {
            if want != got {
                findings.push(format!(
                    "{table} holds {got} entries but the history records account for {want}"
                ));
            }
        }
        Ok(findings)
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
    /// through renames of it or of a directory above it), no older than `since_ns`; whole,
    /// with their undo entries.
    pub fn history_of(
        &self,
        path: Option<&str>,
        since_ns: Option<i64>,
        limit: usize,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let mut out = Vec::new();
        let mut cursor = LogCursor::start(path);
        while out.len() < limit {
            let (page, next) = self.page(&cursor, since_ns, (limit - out.len()).min(4096), true)?;
            out.extend(page);
            match next {
                Some(c) => cursor = c,
                None => break,
            }
        }
        Ok(out)
    }

    /// Up to `limit` history records, newest first, from where `cursor` stands, and where the
    /// next page starts (None when there is no more). A page costs what it returns: the
    /// whole store's log walks `history` back from the cursor (down to the first record at or
    /// after `since_ns`, found in `history_times`); a path's log merges, from
    /// `history_paths`, the records that name the path, a directory above it or a path
    /// below it, and follows the path back through renames.
    /// The records come without their undo entries (`HistoryRecord::decode_summary`).
    pub fn history_page(
        &self,
        cursor: &LogCursor,
        since_ns: Option<i64>,
        limit: usize,
    ) -> Result<(Vec<HistoryRecord>, Option<LogCursor>), StoreError> {
        self.page(cursor, since_ns, limit, false)
    }

    /// `history_page`, with the records' undo entries when `undo`.
    fn page(
        &self,
        cursor: &LogCursor,
        since_ns: Option<i64>,
        limit: usize,
        undo: bool,
    ) -> Result<(Vec<HistoryRecord>, Option<LogCursor>), StoreError> {
        let decode = if undo {
            HistoryRecord::decode
        } else {
            HistoryRecord::decode_summary
        };
        let stop = match since_ns {
            None => 0,
            Some(since) => {
                let times = self.tx.open_table(HISTORY_TIMES).map_err(map_err)?;
                match times.range((since, 0)..).map_err(map_err)?.next() {
                    Some(item) => item.map_err(map_err)?.0.value().1,
                    None => return Ok((Vec::new(), None)),
                }
            }
        };
        let hist = self.tx.open_table(HISTORY).map_err(map_err)?;
        let get = |seq: u64| -> Result<Option<HistoryRecord>, StoreError> {
            match hist.get(seq).map_err(map_err)? {
                None => Ok(None),
                Some(v) => decode(seq, v.value())
                    .map(Some)
                    .ok_or_else(|| corrupt("history record", seq)),
            }
        };
        let recent = |r: &HistoryRecord| since_ns.is_none_or(|s| r.time >= s);
        let mut out = Vec::new();
        let Some(tracked) = cursor.tracked.as_deref().filter(|t| *t != "/") else {
            // The whole store.
            for item in hist.range(stop..cursor.before).map_err(map_err)?.rev() {
                if out.len() >= limit {
                    let before = out.last().map_or(cursor.before, |r: &HistoryRecord| r.seq);
                    let next = LogCursor {
                        before,
                        tracked: cursor.tracked.clone(),
                    };
                    return Ok((out, Some(next)));
                }
                let (k, v) = item.map_err(map_err)?;
                let r = decode(k.value(), v.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?;
                if recent(&r) {
                    out.push(r);
                }
            }
            return Ok((out, None));
        };
        let paths = self.tx.open_table(HISTORY_PATHS).map_err(map_err)?;
        let newest_below = |p: &str, before: u64| -> Result<Option<u64>, StoreError> {
            match paths
                .range((p, 0)..(p, before))
                .map_err(map_err)?
                .next_back()
            {
                Some(item) => Ok(Some(item.map_err(map_err)?.0.value().1)),
                None => Ok(None),
            }
        };
        // Records naming a path below `t`, before `before`: ascending, so the newest is last.
        let below = |t: &str, before: u64| -> Result<Vec<u64>, StoreError> {
            let (lo, hi) = (format!("{t}/"), format!("{t}0"));
            let mut v = Vec::new();
            for item in paths
                .range((lo.as_str(), 0)..(hi.as_str(), 0))
                .map_err(map_err)?
            {
                let seq = item.map_err(map_err)?.0.value().1;
                if seq < before {
                    v.push(seq);
                }
            }
            v.sort_unstable();
            v.dedup();
            Ok(v)
        };
        let mut t = tracked.to_string();
        let mut before = cursor.before;
        let mut under = below(&t, before)?;
        loop {
            if out.len() >= limit {
                let next = LogCursor {
                    before,
                    tracked: Some(t),
                };
                return Ok((out, Some(next)));
            }
            let mut newest = under.last().copied();
            for p in self_and_above(&t) {
                newest = newest.max(newest_below(p, before)?);
            }
            let Some(seq) = newest.filter(|s| *s >= stop) else {
                return Ok((out, None));
            };
            while under.last() == Some(&seq) {
                under.pop();
            }
            before = seq;
            let Some(rec) = get(seq)? else { continue };
            if (rec.op == "rename" || rec.op == "exchange")
                && let [from, to] = rec.paths.as_slice()
                && within(&t, to)
            {
                // Older records knew the tracked path under its name before the rename.
                t = format!("{from}{}", &t[to.len()..]);
                under = below(&t, before)?;
            }
            if recent(&rec) {
                out.push(rec);
            }
        }
    }

    /// The newest record committed at or before `at` (ns since the epoch), from
    /// `history_times`; 0 (the point before any record) when there is none.
    pub fn seq_at_time(&self, at: i64) -> Result<u64, StoreError> {
        let times = self.tx.open_table(HISTORY_TIMES).map_err(map_err)?;
        match times.range(..=(at, u64::MAX)).map_err(map_err)?.next_back() {
            Some(item) => Ok(item.map_err(map_err)?.0.value().1),
            None => Ok(0),
        }
    }
}

/// Wanted entries of history's indexes checked in one merge (about 60 bytes each).
const INDEX_CHECK_BATCH: usize = 1 << 18;

/// A batch of what history's indexes must hold, by the records read so far, and what the
/// merges found.
#[derive(Default)]
struct IndexCheck {
    hasher: std::collections::hash_map::RandomState,
    /// (key, seq, hash of the before-image, whether the index must hold it)
    keys: Vec<(Vec<u8>, u64, u64, bool)>,
    paths: Vec<(String, u64)>,
    times: Vec<(i64, u64)>,
    /// Wanted entries found in the index (a key's, whatever its before-image).
    n_keys: u64,
    n_paths: u64,
    n_times: u64,
    findings: Vec<String>,
}

impl IndexCheck {
    /// Checks the batch against the indexes and empties it: by a merge with an ordered scan
    /// of each index between the batch's first and last entry, or, where that stretch may
    /// hold many times more entries than the batch (a long history checked in several
    /// batches), by a lookup per entry, in order.
    fn merge(
        &mut self,
        keys: &redb::ReadOnlyTable<(&[u8], u64), &[u8]>,
        paths: &redb::ReadOnlyTable<(&str, u64), ()>,
        times: &redb::ReadOnlyTable<(i64, u64), ()>,
    ) -> Result<(), StoreError> {
        use redb::ReadableTableMetadata;
        use std::cmp::Ordering::{Equal, Greater, Less};
        // A scanned entry costs a fraction of a lookup: scan unless the index is this much
        // larger than the batch.
        const SCAN_UP_TO: u64 = 8;
        let scan = |index_len: u64, batch: usize| index_len <= SCAN_UP_TO * batch as u64;
        let hash = |hasher: &std::collections::hash_map::RandomState, v: &[u8]| {
            std::hash::BuildHasher::hash_one(hasher, v)
        };
        self.keys
            .sort_unstable_by(|a, b| (a.0.as_slice(), a.1).cmp(&(b.0.as_slice(), b.1)));
        if let (Some(lo), Some(hi)) = (self.keys.first(), self.keys.last()) {
            let mut index = match scan(keys.len().map_err(map_err)?, self.keys.len()) {
                true => Some(
                    keys.range((lo.0.as_slice(), lo.1)..=(hi.0.as_slice(), hi.1))
                        .map_err(map_err)?,
                ),
                false => None,
            };
            let mut held = match &mut index {
                Some(index) => index.next().transpose().map_err(map_err)?,
                None => None,
            };
            for (key, seq, value, required) in std::mem::take(&mut self.keys) {
                let mut found = None;
                match &mut index {
                    None => {
                        if let Some(v) = keys.get((key.as_slice(), seq)).map_err(map_err)? {
                            found = Some(hash(&self.hasher, v.value()));
                        }
                    }
                    Some(index) => {
                        while let Some((k, v)) = &held {
                            match k.value().cmp(&(key.as_slice(), seq)) {
                                Less => {}
                                Equal => found = Some(hash(&self.hasher, v.value())),
                                Greater => break,
                            }
                            held = index.next().transpose().map_err(map_err)?;
                            if found.is_some() {
                                break;
                            }
                        }
                    }
                }
                if found.is_some() {
                    self.n_keys += 1;
                }
                if found != Some(value) && (required || found.is_some()) {
                    self.findings.push(format!(
                        "history record {seq} changed a key its index does not hold as it was"
                    ));
                }
            }
        }
        self.paths.sort_unstable();
        if let (Some(lo), Some(hi)) = (self.paths.first(), self.paths.last()) {
            let mut index = match scan(paths.len().map_err(map_err)?, self.paths.len()) {
                true => Some(
                    paths
                        .range((lo.0.as_str(), lo.1)..=(hi.0.as_str(), hi.1))
                        .map_err(map_err)?,
                ),
                false => None,
            };
            let mut held = match &mut index {
                Some(index) => index.next().transpose().map_err(map_err)?,
                None => None,
            };
            for (path, seq) in std::mem::take(&mut self.paths) {
                let mut found = false;
                match &mut index {
                    None => found = paths.get((path.as_str(), seq)).map_err(map_err)?.is_some(),
                    Some(index) => {
                        while let Some((k, _)) = &held {
                            match k.value().cmp(&(path.as_str(), seq)) {
                                Less => {}
                                Equal => found = true,
                                Greater => break,
                            }
                            held = index.next().transpose().map_err(map_err)?;
                            if found {
                                break;
                            }
                        }
                    }
                }
                if !found {
                    self.findings.push(format!(
                        "history record {seq} names {path:?}, which its path index lacks"
                    ));
                }
                self.n_paths += 1;
            }
        }
        self.times.sort_unstable();
        if let (Some(lo), Some(hi)) = (self.times.first(), self.times.last()) {
            let mut index = match scan(times.len().map_err(map_err)?, self.times.len()) {
                true => Some(times.range(*lo..=*hi).map_err(map_err)?),
                false => None,
            };
            let mut held = match &mut index {
                Some(index) => index.next().transpose().map_err(map_err)?,
                None => None,
            };
            for (time, seq) in std::mem::take(&mut self.times) {
                let mut found = false;
                match &mut index {
                    None => found = times.get((time, seq)).map_err(map_err)?.is_some(),
                    Some(index) => {
                        while let Some((k, _)) = &held {
                            match k.value().cmp(&(time, seq)) {
                                Less => {}
                                Equal => found = true,
                                Greater => break,
                            }
                            held = index.next().transpose().map_err(map_err)?;
                            if found {
                                break;
                            }
                        }
                    }
                }
                if !found {
                    self.findings.push(format!(
                        "history record {seq} is missing from the time index"
                    ));
                }
                self.n_times += 1;
            }
        }
        Ok(())
    }
}

/// Where a paged `log` goes on from: the next record is older than `before`; a path's log
/// follows the path under the name older records knew it by (`tracked`; None or "/" for the
/// whole store).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogCursor {
    pub before: u64,
    pub tracked: Option<String>,
}

impl LogCursor {
    /// The newest record of the whole store's log, or of `path`'s.
    pub fn start(path: Option<&str>) -> LogCursor {
        LogCursor {
            before: u64::MAX,
            tracked: path.map(|p| {
                let p = format!("/{}", p.trim_matches('/'));
                if p == "/" {
                    p
                } else {
                    p.trim_end_matches('/').to_string()
                }
            }),
        }
    }
}

/// Whether `p` is `base` or below it.
fn within(p: &str, base: &str) -> bool {
    base == "/" || p == base || (p.starts_with(base) && p.as_bytes().get(base.len()) == Some(&b'/'))
}

/// `path` and every directory above it, up to "/".
fn self_and_above(path: &str) -> impl Iterator<Item = &str> {
    let mut next = Some(path);
    std::iter::from_fn(move || {
        let cur = next?;
        next = match cur.rfind('/') {
            _ if cur == "/" => None,
            Some(0) => Some("/"),
            Some(i) => Some(&cur[..i]),
            None => None,
        };
        Some(cur)
    })
}

/// The `history_keys` entries of record `r`: (key, before-image, required), each key once
/// with its first (oldest) before-image. The inode and chunk keys of an inode the operation
/// created may be left out (`fresh` says which inodes it handed out; the writer passes the
/// inode numbers it allocated, `check`, which cannot know, every inode absent before the
/// record): inode numbers are never handed out twice, so at no point before the operation
/// does a directory entry name that inode, and no view of the past asks for its keys. An
/// import of N files then indexes N directory entries, not 3N keys. An inode a revert brings
/// back under its old number is not fresh: its keys are indexed. Stores indexed before this
/// hold such entries with the right before-image, and they are accepted.
pub(crate) fn index_entries(
    r: &HistoryRecord,
    fresh: impl Fn(u64) -> bool,
) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
    let mut created = std::collections::HashSet::new();
    let mut named = std::collections::HashSet::new();
    for u in &r.undo {
        if let Undo::Inode { ino, old } = u
            && named.insert(*ino)
            && old.is_none()
            && fresh(*ino)
        {
            created.insert(*ino);
        }
    }
    // Each key's first entry: a stable sort by key puts it first among its equals (a sort,
    // not a hash set of keys: an import's record holds an entry per file).
    let keys: Vec<Vec<u8>> = r.undo.iter().map(Undo::key).collect();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    let mut first = vec![false; keys.len()];
    for (n, &i) in order.iter().enumerate() {
        first[i] = n == 0 || keys[order[n - 1]] != keys[i];
    }
    r.undo
        .iter()
        .zip(keys)
        .zip(first)
        .filter(|(_, first)| *first)
        .map(|((u, key), _)| {
            let required = match u {
                Undo::Inode { ino, .. } | Undo::Filemap { ino, .. } => !created.contains(ino),
                Undo::Dirent { .. } | Undo::Orphan { .. } => true,
            };
            (key, index_value(u), required)
        })
        .collect()
}

/// What history's key index keeps of an undo entry: the entry, with a small file's content
/// left in the record (`schema::index_form`).
pub(crate) fn index_value(u: &Undo) -> Vec<u8> {
    match u {
        Undo::Inode { ino, old: Some(b) } => match index_form(b) {
            Some(cut) => Undo::Inode {
                ino: *ino,
                old: Some(cut),
            }
            .encode(),
            None => u.encode(),
        },
        _ => u.encode(),
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
            self.step(c.undo.len() as u64);
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
                comm: match self.comm.take() {
                    Some((pid, name)) if pid == info.pid => name,
                    _ if info.pid != 0 => self.store.process_name(info.pid),
                    _ => String::new(),
                },
                redacted: false,
                undo: c.undo,
                conflict: info.conflict,
            };
            self.put_record(&record)?;
            self.index_record(&record)?;
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
                    // The record whole: its fields and the inline chunk it held.
                    if let Some(b) = old
                        && Inode::decode(*ino, b).is_none()
                    {
                        return Err(corrupt("history record", *ino));
                    }
                    let old = old.as_deref().map(super::write::InodeRecord::Encoded);
                    self.set_inode_record(*ino, old)?;
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
        self.unindex_record(r)?;
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
        // Every commit asks, so the question goes to the time index, whose keys are small:
        // the oldest record itself may be an import's of many megabytes, and reading it at
        // each commit made every commit cost (and allocate) its size.
        // Counted as work: one step for the look, and each record read at its size.
        self.step(1);
        // Nothing expires before the cutoff passes the oldest record's time, which the last
        // look that found nothing remembered: records only get newer (each new one is
        // stamped now; dropping, redacting and rolling back remove or keep old ones), so
        // until then the look is skipped. Wrong only the safe way: a record stamped earlier
        // by a clock set back expires once the cutoff passes the remembered time.
        if cutoff <= self.store.history_oldest.load(Ordering::Relaxed) {
            return Ok(());
        }
        let expired: Vec<u64> = {
            let times = self.tx.open_table(HISTORY_TIMES).map_err(map_err)?;
            let mut v = Vec::new();
            for item in times.range(..(cutoff, 0)).map_err(map_err)?.take(max) {
                v.push(item.map_err(map_err)?.0.value().1);
            }
            if v.is_empty() {
                // This transaction's own record is in the index, so there is a first.
                if let Some(first) = times.first().map_err(map_err)? {
                    self.store
                        .history_oldest
                        .fetch_max(first.0.value().0, Ordering::Relaxed);
                }
            }
            v
        };
        if expired.is_empty() {
            return Ok(());
        }
        let old: Vec<HistoryRecord> = {
            let t = self.tx.open_table(HISTORY).map_err(map_err)?;
            let mut v = Vec::with_capacity(expired.len());
            for seq in expired {
                let val = t
                    .get(seq)
                    .map_err(map_err)?
                    .ok_or_else(|| corrupt("history time index entry", seq))?;
                let r = HistoryRecord::decode(seq, val.value())
                    .ok_or_else(|| corrupt("history record", seq))?;
                self.step(r.undo.len() as u64);
                v.push(r);
            }
            v
        };
        for r in &old {
            self.drop_record(r)?;
        }
        Ok(())
    }

    /// Erases, in every history record and in history's key index, the inode before-images
    /// whose inline chunk is one of `parts` (encoded, as `TreeView::inline_part_of` gives
    /// them), and marks those records redacted. Returns the parts found and erased. Reads
    /// every record: redaction is rare, and a version's bytes may sit in any record that
    /// changed that inode (a rollback's too), as a blob may be named by any.
    pub fn redact_inline_everywhere(
        &mut self,
        parts: &std::collections::HashSet<Vec<u8>>,
    ) -> Result<usize, StoreError> {
        if parts.is_empty() {
            return Ok(0);
        }
        let holds = |u: &Undo| match u {
            Undo::Inode { old: Some(b), .. } => inline_part(b).is_some_and(|p| parts.contains(p)),
            _ => false,
        };
        let mut hit = Vec::new();
        {
            let t = self.tx.open_table(HISTORY).map_err(map_err)?;
            for item in t.iter().map_err(map_err)? {
                let (k, v) = item.map_err(map_err)?;
                let r = HistoryRecord::decode(k.value(), v.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?;
                if r.undo.iter().any(holds) {
                    hit.push(r);
                }
            }
        }
        let mut erased = std::collections::HashSet::new();
        for mut r in hit {
            let mut keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
            for u in &mut r.undo {
                if !holds(u) {
                    continue;
                }
                let Undo::Inode { old: Some(b), .. } = u else {
                    continue;
                };
                erased.insert(inline_part(b).map(<[u8]>::to_vec));
                *b = redact_inline(b);
                let k = u.key();
                if keys.get((k.as_slice(), r.seq)).map_err(map_err)?.is_some() {
                    let v = index_value(u);
                    keys.insert((k.as_slice(), r.seq), v.as_slice())
                        .map_err(map_err)?;
                    redo_put(
                        &self.redo,
                        HISTORY_KEYS,
                        &(k.as_slice(), r.seq),
                        &v.as_slice(),
                    );
                }
            }
            drop(keys);
            r.redacted = true;
            self.put_record(&r)?;
        }
        Ok(erased.len())
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

    /// Adds `r` to history's indexes (by key, path and time; see `schema`).
    pub(super) fn index_record(&self, r: &HistoryRecord) -> Result<(), StoreError> {
        self.step(1 + r.undo.len() as u64 + r.paths.len() as u64);
        let mut keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        let from = self.new_inos_from.get().unwrap_or(u64::MAX);
        for (k, v, _) in index_entries(r, |ino| ino >= from)
            .into_iter()
            .filter(|e| e.2)
        {
            keys.insert((k.as_slice(), r.seq), v.as_slice())
                .map_err(map_err)?;
            redo_put(
                &self.redo,
                HISTORY_KEYS,
                &(k.as_slice(), r.seq),
                &v.as_slice(),
            );
        }
        let mut paths = self.tx.open_table(HISTORY_PATHS).map_err(map_err)?;
        for p in &r.paths {
            paths.insert((p.as_str(), r.seq), ()).map_err(map_err)?;
            redo_put(&self.redo, HISTORY_PATHS, &(p.as_str(), r.seq), &());
        }
        let mut times = self.tx.open_table(HISTORY_TIMES).map_err(map_err)?;
        times.insert((r.time, r.seq), ()).map_err(map_err)?;
        redo_put(&self.redo, HISTORY_TIMES, &(r.time, r.seq), &());
        Ok(())
    }

    /// Removes `r` from history's indexes.
    fn unindex_record(&self, r: &HistoryRecord) -> Result<(), StoreError> {
        self.step(1 + r.undo.len() as u64 + r.paths.len() as u64);
        let mut keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        for u in &r.undo {
            let k = u.key();
            keys.remove((k.as_slice(), r.seq)).map_err(map_err)?;
            redo_del(&self.redo, HISTORY_KEYS, &(k.as_slice(), r.seq));
        }
        let mut paths = self.tx.open_table(HISTORY_PATHS).map_err(map_err)?;
        for p in &r.paths {
            paths.remove((p.as_str(), r.seq)).map_err(map_err)?;
            redo_del(&self.redo, HISTORY_PATHS, &(p.as_str(), r.seq));
        }
        let mut times = self.tx.open_table(HISTORY_TIMES).map_err(map_err)?;
        times.remove((r.time, r.seq)).map_err(map_err)?;
        redo_del(&self.redo, HISTORY_TIMES, &(r.time, r.seq));
        Ok(())
    }

    /// Indexes every history record (the format-3 migration); how many there were.
    pub(super) fn index_all_history(&mut self) -> Result<u64, StoreError> {
        let mut n = 0;
        let mut after = 0;
        loop {
            // In batches, so memory stays bounded however long the history is.
            let batch: Vec<HistoryRecord> = {
                let t = self.tx.open_table(HISTORY).map_err(map_err)?;
                let mut v = Vec::new();
                for item in t.range(after + 1..).map_err(map_err)?.take(4096) {
                    let (k, val) = item.map_err(map_err)?;
                    v.push(
                        HistoryRecord::decode(k.value(), val.value())
                            .ok_or_else(|| corrupt("history record", k.value()))?,
                    );
                }
                v
            };
            let Some(last) = batch.last() else {
                return Ok(n);
            };
            after = last.seq;
            for r in &batch {
                self.index_record(r)?;
                n += 1;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::{Caller, Fs, Limits, OpenMode};
    use crate::store::TreeView;

    const ME: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 1,
    };

    fn write(fs: &Fs, parent: u64, name: &str, text: &str) {
        let fh = match fs.lookup(parent, name.as_bytes()) {
            Ok(i) => {
                let mode = OpenMode {
                    write: true,
                    truncate: true,
                    ..OpenMode::default()
                };
                fs.open(ME, i.ino, mode).unwrap()
            }
            Err(_) => {
                fs.create(ME, parent, name.as_bytes(), 0o644, 0, libc::O_WRONLY)
                    .unwrap()
                    .1
            }
        };
        fs.write(ME, fh, 0, text.as_bytes()).unwrap();
        fs.release(fh).unwrap();
    }

    /// The index check merges what the records want with ordered scans of the indexes (it
    /// looked each entry up, which was most of `check`'s time on a long history): a changed
    /// before-image, a path or a time missing, and an entry no record accounts for are each
    /// still found, across several batches as in one.
    #[test]
    fn the_index_check_finds_what_is_changed_missing_or_extra() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        for i in 0..40 {
            write(&fs, ROOT_INO, &format!("f{}.md", i % 7), &format!("v{i}"));
        }
        let findings = |batch: usize| {
            let r = fs.store().read().unwrap();
            let mut found = r.index_findings_in_batches(batch).unwrap();
            found.sort();
            found
        };
        assert_eq!(findings(INDEX_CHECK_BATCH), Vec::<String>::new());
        assert_eq!(findings(5), Vec::<String>::new());
        let (changed, path, path_seq, time_seq) = {
            let mut w = fs.store().write().unwrap();
            w.without_history();
            let mut keys = w.tx.open_table(HISTORY_KEYS).unwrap();
            let (k, seq) = {
                let last = keys.last().unwrap().unwrap();
                let (k, seq) = last.0.value();
                (k.to_vec(), seq)
            };
            keys.insert((k.as_slice(), seq), b"changed".as_slice())
                .unwrap();
            keys.insert((b"\xffno record".as_slice(), 1), b"x".as_slice())
                .unwrap();
            drop(keys);
            let mut paths = w.tx.open_table(HISTORY_PATHS).unwrap();
            let (path, path_seq) = {
                let first = paths.first().unwrap().unwrap();
                let (p, seq) = first.0.value();
                (p.to_string(), seq)
            };
            paths.remove((path.as_str(), path_seq)).unwrap();
            drop(paths);
            let mut times = w.tx.open_table(HISTORY_TIMES).unwrap();
            let first = times.first().unwrap().unwrap().0.value();
            times.remove(first).unwrap();
            drop(times);
            w.commit(Sync::Durable).unwrap();
            (seq, path, path_seq, first.1)
        };
        let found = findings(INDEX_CHECK_BATCH);
        assert_eq!(findings(5), found, "batches of 5 find what one batch finds");
        for want in [
            format!("history record {changed} changed a key its index does not hold as it was"),
            format!("history record {path_seq} names {path:?}, which its path index lacks"),
            format!("history record {time_seq} is missing from the time index"),
        ] {
            assert!(found.contains(&want), "{want:?} not in {found:?}");
        }
        for table in ["history_keys", "history_paths", "history_times"] {
            assert!(
                found
                    .iter()
                    .any(|f| f.starts_with(&format!("{table} holds "))),
                "{table}: {found:?}"
            );
        }
        assert_eq!(found.len(), 6, "{found:?}");
    }

    /// An import indexes the directory entries it makes, not the inode and chunk keys of the
    /// inodes it handed out: they have nothing to go back to. The past still reads right
    /// before and after the import, and after a later edit of an imported file.
    #[test]
    fn an_import_indexes_its_directory_entries_only() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("m")).unwrap();
        for i in 0..20 {
            std::fs::write(src.join(format!("m/f{i}.md")), format!("first {i}")).unwrap();
        }
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let limits = Limits::default();
        crate::tools::import(&store, &limits, &src, "/", true, &mut |_| {}).unwrap();
        let fs = Fs::new(store, limits).unwrap();
        let created = fs.store().read().unwrap().last_seq().unwrap();
        let m = fs.lookup(ROOT_INO, b"m").unwrap().ino;
        write(&fs, m, "f0.md", "second");
        let f1 = fs.lookup(m, b"f1.md").unwrap().ino;

        let r = fs.store().read().unwrap();
        let keys = r.tx.open_table(HISTORY_KEYS).unwrap();
        let mut dirents = 0;
        for item in keys.iter().unwrap() {
            let (k, _) = item.unwrap();
            let key = k.value().0;
            match key[0] {
                1 | 3 => {
                    let ino = u64::from_be_bytes(key[1..9].try_into().unwrap());
                    assert_ne!(ino, f1, "a key of an inode only created is indexed");
                }
                2 if key[1..9] == m.to_be_bytes() => dirents += 1,
                _ => {}
            }
        }
        assert!(dirents >= 20, "each creation indexes its entry: {dirents}");
        assert_eq!(r.history_index_findings().unwrap(), Vec::<String>::new());

        let read = |seq: u64, name: &str| {
            let past = r.past(seq).unwrap();
            past.lookup(m, name).unwrap().map(|(ino, _)| {
                let size = past.inode(ino).unwrap().unwrap().size;
                let c = past.chunks(ino, 0, size.div_ceil(CHUNK_SIZE)).unwrap();
                String::from_utf8(c.into_iter().flatten().flatten().collect()).unwrap()
            })
        };
        assert_eq!(read(created - 1, "f0.md"), None);
        assert_eq!(read(created - 1, "f1.md"), None);
        assert_eq!(read(created, "f0.md").as_deref(), Some("first 0"));
        assert_eq!(read(created, "f1.md").as_deref(), Some("first 1"));
        assert_eq!(read(created, "f0.md").as_deref(), Some("first 0"));
        let edited = r.last_seq().unwrap();
        assert_eq!(read(edited, "f0.md").as_deref(), Some("second"));
        assert_eq!(read(edited, "f1.md").as_deref(), Some("first 1"));
    }

    /// A small file's earlier versions live in the history records (the inode's before-image
    /// carries its content); the key index keeps only their fields and checksums, so each
    /// version is stored once. The past still reads every version whole.
    #[test]
    fn the_key_index_leaves_a_small_file_s_content_in_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let versions: Vec<String> = (0..5)
            .map(|i| format!("version-{i}-").repeat(100))
            .collect();
        let mut points = Vec::new();
        for v in &versions {
            write(&fs, ROOT_INO, "f.md", v);
            points.push(fs.store().read().unwrap().last_seq().unwrap());
        }
        let r = fs.store().read().unwrap();
        let keys = r.tx.open_table(HISTORY_KEYS).unwrap();
        let mut inode_entries = 0;
        for item in keys.iter().unwrap() {
            let (k, v) = item.unwrap();
            if k.value().0[0] == 1 {
                inode_entries += 1;
                assert!(
                    !v.value().windows(10).any(|w| w == b"-version-"),
                    "an index entry holds content"
                );
            }
        }
        assert!(inode_entries >= 4, "{inode_entries}");
        assert_eq!(r.history_index_findings().unwrap(), Vec::<String>::new());
        let ino = fs.lookup(ROOT_INO, b"f.md").unwrap().ino;
        for (v, &seq) in versions.iter().zip(&points) {
            let past = r.past(seq).unwrap();
            let c = past.chunks(ino, 0, 1).unwrap();
            assert_eq!(c, vec![Some(v.as_bytes().to_vec())], "@{seq}");
            let part = past.inline_part_of(ino).unwrap().unwrap();
            assert!(part.ends_with(v.as_bytes()));
        }
    }
}
