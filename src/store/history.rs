//! History: the before-images a write transaction captures, the record appended at commit,
//! expiry, marks, and the queries over history (`history_of`, `at_point`).
//!
//! Invariant kept here: a history record is appended in the same transaction as the changes
//! it undoes, and every blob a record names keeps a reference until the record is dropped.
//! A record's undo entries are written in parts of at most `UNDO_PART_BYTES` with it and
//! removed with it, and everything that reads them (rollback, expiry, redact, the past,
//! check) takes them a part at a time.

use std::collections::HashMap;
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
        let n = w.history_seqs_after(0)?.len();
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
    /// History records, newest first, with seq in `range`, without their undo entries.
    pub fn history(
        &self,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<Vec<HistoryRecord>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.range(range).map_err(map_err)?.rev() {
            let (k, v) = item.map_err(map_err)?;
            out.push(
                HistoryRecord::decode_summary(k.value(), v.value())
                    .ok_or_else(|| corrupt("history record", k.value()))?,
            );
        }
        Ok(out)
    }

    /// The table of undo parts; None in a format-5 store read as it is (its records hold
    /// their entries).
    fn undo_table(&self) -> Result<Option<UndoTable>, StoreError> {
        match self.tx.open_table(HISTORY_UNDO) {
            Ok(t) => Ok(Some(t)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(map_err(e)),
        }
    }

    /// Calls `f` on every history record, oldest first, one at a time, whole (with its undo
    /// entries): memory stays flat however long the history, but holds the largest record.
    pub fn for_each_record(
        &self,
        mut f: impl FnMut(HistoryRecord) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let parts = self.undo_table()?;
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let mut r = HistoryRecord::decode(k.value(), v.value())
                .ok_or_else(|| corrupt("history record", k.value()))?;
            fill_undo(parts.as_ref(), &mut r)?;
            f(r)?;
        }
        Ok(())
    }

    /// Calls `f` on every undo entry of every history record with that record's seq, oldest
    /// record first, in each record's order, one part at a time: memory stays flat however
    /// large a record.
    pub fn for_each_undo(
        &self,
        mut f: impl FnMut(u64, &Undo) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let parts = self.undo_table()?;
        for item in t.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let r = HistoryRecord::decode(k.value(), v.value())
                .ok_or_else(|| corrupt("history record", k.value()))?;
            each_undo(parts.as_ref(), &r, &mut |u| f(r.seq, u))?;
        }
        Ok(())
    }

    /// The first of record `seq`'s undo entries (in its order) for which `find` gives
    /// something, read part by part until found.
    pub(super) fn find_undo<T>(
        &self,
        seq: u64,
        mut find: impl FnMut(Undo) -> Option<T>,
    ) -> Result<Option<T>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let r = t
            .get(seq)
            .map_err(map_err)?
            .and_then(|v| HistoryRecord::decode(seq, v.value()))
            .ok_or_else(|| corrupt("history record", seq))?;
        if r.undo_parts.is_none() {
            return Ok(r.undo.into_iter().find_map(find));
        }
        let parts = self.undo_table()?;
        for p in 0..r.undo_parts.unwrap_or(0) {
            let found = read_part(parts.as_ref(), seq, p)?
                .into_iter()
                .find_map(&mut find);
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Where history's undo parts disagree with the records (for check): every version-2
    /// record's parts 0..n present, each decoding whole and within `UNDO_PART_BYTES`, with
    /// the number of entries its header gives; no part without its record. One merge of
    /// both tables in key order, a part at a time.
    pub fn undo_part_findings(&self) -> Result<Vec<String>, StoreError> {
        let mut findings = Vec::new();
        let hist = self.tx.open_table(HISTORY).map_err(map_err)?;
        let Some(parts) = self.undo_table()? else {
            return Ok(findings);
        };
        let mut rows = parts.iter().map_err(map_err)?;
        // The next row: (seq, part, bytes).
        let mut next_row = || -> Result<Option<(u64, u32, Vec<u8>)>, StoreError> {
            match rows.next() {
                None => Ok(None),
                Some(item) => {
                    let (k, v) = item.map_err(map_err)?;
                    let (seq, part) = k.value();
                    Ok(Some((seq, part, v.value().to_vec())))
                }
            }
        };
        let mut pending = next_row()?;
        for item in hist.iter().map_err(map_err)? {
            let (k, v) = item.map_err(map_err)?;
            let seq = k.value();
            let Some(r) = HistoryRecord::decode_summary(seq, v.value()) else {
                findings.push(format!("history record {seq} does not decode"));
                continue;
            };
            // Parts of records that do not exist, before this one.
            while let Some((s, p, _)) = &pending
                && *s < seq
            {
                findings.push(format!(
                    "history_undo holds part {p} of record {s}, which does not exist"
                ));
                pending = next_row()?;
            }
            let want = r.undo_parts.unwrap_or(0);
            let mut entries = 0u64;
            let mut next = 0u32;
            // Whether a part is missing or undecodable (the entry count then says nothing).
            let mut broken = false;
            while let Some((s, p, bytes)) = &pending
                && *s == seq
            {
                if *p >= want {
                    findings.push(format!(
                        "history_undo holds part {p} of record {seq}, which has {want} parts"
                    ));
                } else if *p != next {
                    findings.push(format!(
                        "history record {seq} lacks part {next} of its undo entries"
                    ));
                    broken = true;
                    next = *p + 1;
                } else {
                    next += 1;
                }
                if bytes.len() > UNDO_PART_BYTES {
                    findings.push(format!(
                        "part {p} of history record {seq} is {} bytes, over the bound of {UNDO_PART_BYTES}",
                        bytes.len()
                    ));
                }
                match decode_undo_part(bytes) {
                    Some(u) => entries += u.len() as u64,
                    None => {
                        broken = true;
                        findings.push(format!("part {p} of history record {seq} does not decode"));
                    }
                }
                pending = next_row()?;
            }
            if r.undo_parts.is_some() {
                if next < want {
                    findings.push(format!(
                        "history record {seq} lacks part {next} of its undo entries"
                    ));
                } else if !broken && entries != r.undo_len {
                    findings.push(format!(
                        "history record {seq} has {} undo entries but its parts hold {entries}",
                        r.undo_len
                    ));
                }
            }
        }
        while let Some((s, p, _)) = &pending {
            findings.push(format!(
                "history_undo holds part {p} of record {s}, which does not exist"
            ));
            pending = next_row()?;
        }
        Ok(findings)
    }

    /// Before-images kept without their content (`schema::keep_form`, `schema::delta_form`)
    /// whose content the base inode's record after their record does not give back (for
    /// check): a later version with another checksum, or none.
    ///
    /// One scan of the records, newest first, holding each inode's whole record as of the
    /// point being passed: a kept image is rebuilt from its base's held record, and then
    /// its own inode's record is the image. Each image is rebuilt once, with no index seek.
    /// A base not held (never changed by a later record, or let go) is read as `show`
    /// reads it, through history's key index. At most `HELD_RECORDS_MAX` records are held
    /// (each at most a record with `INLINE_MAX` bytes of content), so memory stays bounded
    /// however long the history.
    pub fn kept_content_findings(&self) -> Result<Vec<String>, StoreError> {
        self.kept_content_findings_holding(HELD_RECORDS_MAX)
    }

    fn kept_content_findings_holding(&self, max: usize) -> Result<Vec<String>, StoreError> {
        let mut findings = Vec::new();
        // ino -> its whole record at the point after the record being passed.
        let mut held: HashMap<u64, Vec<u8>> = HashMap::new();
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let parts = self.undo_table()?;
        for item in t.iter().map_err(map_err)?.rev() {
            let (k, v) = item.map_err(map_err)?;
            let r = HistoryRecord::decode(k.value(), v.value())
                .ok_or_else(|| corrupt("history record", k.value()))?;
            let seq = r.seq;
            // Each inode's record before this one (its first image here), applied once all
            // of this record's images are rebuilt against the point after it; None when
            // there are more than can be held (everything held is then let go).
            let mut before: Option<HashMap<u64, Option<Vec<u8>>>> = Some(HashMap::new());
            each_undo(parts.as_ref(), &r, &mut |u| {
                let Undo::Inode { ino, old } = u else {
                    return Ok(());
                };
                let whole = match old {
                    Some(b) if content_kept(b) => {
                        let base = kept_base(*ino, b);
                        let whole = match held.get(&base) {
                            Some(later) => with_kept_content(b, later),
                            None => self
                                .past(seq)?
                                .inode_record(base)
                                .ok()
                                .flatten()
                                .and_then(|later| with_kept_content(b, &later)),
                        };
                        match whole {
                            Some(whole) => Some(whole),
                            None => {
                                findings.push(format!(
                                    "history record {seq} keeps inode {ino}'s content as the version after it, which does not match its checksum"
                                ));
                                None
                            }
                        }
                    }
                    other => other.clone(),
                };
                if let Some(m) = &mut before {
                    if m.len() >= max {
                        before = None;
                    } else {
                        m.entry(*ino).or_insert(whole);
                    }
                }
                Ok(())
            })?;
            let Some(before) = before else {
                held.clear();
                continue;
            };
            for (ino, whole) in before {
                match whole {
                    Some(whole) => {
                        if held.len() >= max {
                            held.clear();
                        }
                        held.insert(ino, whole);
                    }
                    None => {
                        held.remove(&ino);
                    }
                }
            }
        }
        Ok(findings)
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
        let mut check = IndexCheck {
            hasher: std::collections::hash_map::RandomState::new(),
            ..IndexCheck::default()
        };
        self.for_each_record(|r| {
            check.findings.extend(fold_findings(&r));
            // A record held in one value may be indexed by reference (an empty value).
            let by_reference = r.undo_parts.is_none();
            for (key, value, required) in index_entries(&r, |_| true) {
                let value = std::hash::BuildHasher::hash_one(&check.hasher, value.as_slice());
                check.keys.push((key, r.seq, value, required, by_reference));
            }
            let mut rp: Vec<&str> = r.paths.iter().map(String::as_str).collect();
            rp.sort_unstable();
            rp.dedup();
            check
                .paths
                .extend(rp.into_iter().map(|p| (path_index_key(p), r.seq)));
            check.times.push((time_index_key(r.time), r.seq));
            if check.keys.len() + check.paths.len() + check.times.len() >= batch {
                check.merge(&keys)?;
            }
            Ok(())
        })?;
        check.merge(&keys)?;
        let mut findings = check.findings;
        // Every wanted row found and the table no longer: nothing else is in it (its length
        // is known without a scan). Otherwise each index, a range of the one table, is
        // counted on its own to say which holds what no record accounts for.
        use redb::ReadableTableMetadata;
        let wanted = check.n_keys + check.n_paths + check.n_times;
        if findings.is_empty() && keys.len().map_err(map_err)? == wanted {
            return Ok(findings);
        }
        let count = |lo: &[u8], hi: Option<&[u8]>| -> Result<u64, StoreError> {
            let range = match hi {
                Some(hi) => keys.range((lo, 0)..(hi, 0)),
                None => keys.range((lo, 0)..),
            };
            let mut n = 0u64;
            for item in range.map_err(map_err)? {
                item.map_err(map_err)?;
                n += 1;
            }
            Ok(n)
        };
        let (path_tag, time_tag) = ([PATH_INDEX_TAG], [TIME_INDEX_TAG]);
        for (index, want, got) in [
            ("history_keys", check.n_keys, count(&[], Some(&path_tag))?),
            (
                "history's path index",
                check.n_paths,
                count(&path_tag, Some(&time_tag))?,
            ),
            (
                "history's time index",
                check.n_times,
                count(&time_tag, Some(&[TIME_INDEX_TAG + 1]))?,
            ),
        ] {
            if want != got {
                findings.push(format!(
                    "{index} holds {got} entries but the history records account for {want}"
                ));
            }
        }
        let other = count(&[TIME_INDEX_TAG + 1], None)?;
        if other != 0 {
            findings.push(format!(
                "history_keys holds {other} rows of no index (a tag above {TIME_INDEX_TAG})"
            ));
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
                "history before record {first} is no longer kept (--keep-history, \
                 --max-history-bytes); the oldest point is {}",
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
        w.undo_after(seq)?;
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
    /// after `since_ns`, found in the time index); a path's log merges, from the path index
    /// (both rows of `history_keys`), the records that name the path, a directory above it
    /// or a path below it, and follows the path back through renames.
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
        let parts = if undo { self.undo_table()? } else { None };
        let decode = |seq: u64, b: &[u8]| -> Result<HistoryRecord, StoreError> {
            let mut r = match undo {
                true => HistoryRecord::decode(seq, b),
                false => HistoryRecord::decode_summary(seq, b),
            }
            .ok_or_else(|| corrupt("history record", seq))?;
            if undo {
                fill_undo(parts.as_ref(), &mut r)?;
            }
            Ok(r)
        };
        let stop = match since_ns {
            None => 0,
            Some(since) => {
                let times = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
                let from = time_index_key(since);
                match times.range((from.as_slice(), 0)..).map_err(map_err)?.next() {
                    Some(item) => match item.map_err(map_err)?.0.value() {
                        (k, seq) if time_of_index_key(k).is_some() => seq,
                        _ => return Ok((Vec::new(), None)),
                    },
                    None => return Ok((Vec::new(), None)),
                }
            }
        };
        let hist = self.tx.open_table(HISTORY).map_err(map_err)?;
        let get = |seq: u64| -> Result<Option<HistoryRecord>, StoreError> {
            match hist.get(seq).map_err(map_err)? {
                None => Ok(None),
                Some(v) => decode(seq, v.value()).map(Some),
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
                let r = decode(k.value(), v.value())?;
                if recent(&r) {
                    out.push(r);
                }
            }
            return Ok((out, None));
        };
        let paths = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        let newest_below = |p: &str, before: u64| -> Result<Option<u64>, StoreError> {
            let p = path_index_key(p);
            match paths
                .range((p.as_slice(), 0)..(p.as_slice(), before))
                .map_err(map_err)?
                .next_back()
            {
                Some(item) => Ok(Some(item.map_err(map_err)?.0.value().1)),
                None => Ok(None),
            }
        };
        // Records naming a path below `t`, before `before`: ascending, so the newest is last.
        let below = |t: &str, before: u64| -> Result<Vec<u64>, StoreError> {
            let (lo, hi) = (
                path_index_key(&format!("{t}/")),
                path_index_key(&format!("{t}0")),
            );
            let mut v = Vec::new();
            for item in paths
                .range((lo.as_slice(), 0)..(hi.as_slice(), 0))
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
    /// the time index; 0 (the point before any record) when there is none.
    pub fn seq_at_time(&self, at: i64) -> Result<u64, StoreError> {
        let times = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        let (lo, at) = (time_index_key(i64::MIN), time_index_key(at));
        match times
            .range((lo.as_slice(), 0)..=(at.as_slice(), u64::MAX))
            .map_err(map_err)?
            .next_back()
        {
            Some(item) => Ok(item.map_err(map_err)?.0.value().1),
            None => Ok(0),
        }
    }
}

/// The fewest entries a `Undo::Created` entry replaces (`WriteTxn::compact_created`): an
/// operation that creates a file or two keeps its entries as they are.
const COMPACT_MIN: usize = 16;
/// How long before a rename the records of its source's create and writes may be folded
/// into its record (see `WriteTxn::foldable`): the SDK's edit takes milliseconds.
const FOLD_WINDOW_NS: i64 = 10_000_000_000;
/// At most this many records are folded into one: a create and its writes.
const FOLD_MAX_RECORDS: usize = 16;

/// Records a rename's record folds in: their seqs, newest first, and their operations,
/// oldest first.
#[derive(Default)]
struct Fold {
    seqs: Vec<u64>,
    ops: Vec<String>,
}

/// Wanted entries of history's indexes checked in one merge (about 60 bytes each).
const INDEX_CHECK_BATCH: usize = 1 << 18;

/// The most inode records `kept_content_findings` holds while it passes the history.
const HELD_RECORDS_MAX: usize = 4096;

/// A batch of what history's indexes must hold, by the records read so far, and what the
/// merges found.
#[derive(Default)]
struct IndexCheck {
    hasher: std::collections::hash_map::RandomState,
    /// (key, seq, hash of the before-image, whether the index must hold it, whether it may
    /// hold it by reference)
    keys: Vec<(Vec<u8>, u64, u64, bool, bool)>,
    /// (`path_index_key`, seq)
    paths: Vec<(Vec<u8>, u64)>,
    /// (`time_index_key`, seq)
    times: Vec<([u8; 9], u64)>,
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
    fn merge(&mut self, keys: &redb::ReadOnlyTable<(&[u8], u64), &[u8]>) -> Result<(), StoreError> {
        let hasher = &self.hasher;
        let (findings, n_keys) = (&mut self.findings, &mut self.n_keys);
        self.keys
            .sort_unstable_by(|a, b| (a.0.as_slice(), a.1).cmp(&(b.0.as_slice(), b.1)));
        merge_index(
            keys,
            std::mem::take(&mut self.keys),
            |w| (w.0.as_slice(), w.1),
            |(_, seq, value, required, by_reference), held| {
                let found = held.map(|v| match v.is_empty() && by_reference {
                    // By reference: the record's own entry, the one wanted.
                    true => value,
                    false => std::hash::BuildHasher::hash_one(hasher, v),
                });
                if found.is_some() {
                    *n_keys += 1;
                }
                if found != Some(value) && (required || found.is_some()) {
                    findings.push(format!(
                        "history record {seq} changed a key its index does not hold as it was"
                    ));
                }
            },
        )?;
        self.paths.sort_unstable();
        let n_paths = &mut self.n_paths;
        merge_index(
            keys,
            std::mem::take(&mut self.paths),
            |w| (w.0.as_slice(), w.1),
            |(key, seq), held| {
                if held.is_none() {
                    let path = String::from_utf8_lossy(&key[1..]);
                    findings.push(format!(
                        "history record {seq} names {path:?}, which its path index lacks"
                    ));
                }
                *n_paths += 1;
            },
        )?;
        self.times.sort_unstable();
        let n_times = &mut self.n_times;
        merge_index(
            keys,
            std::mem::take(&mut self.times),
            |w| (w.0.as_slice(), w.1),
            |(_, seq), held| {
                if held.is_none() {
                    findings.push(format!(
                        "history record {seq} is missing from the time index"
                    ));
                }
                *n_times += 1;
            },
        )
    }
}

/// What is wrong with record `r` as one that folds in others (nothing for any other
/// record): a rename folding its source's create and writes, or a create folding the
/// writes of the file it made; its first entry for that file says the file did not exist,
/// and no key has two entries (each keeps its first before-image).
fn fold_findings(r: &HistoryRecord) -> Vec<String> {
    let mut out = Vec::new();
    if r.folded.is_empty() {
        return out;
    }
    let seq = r.seq;
    let writes = |ops: &[String]| ops.iter().all(|o| o == "write");
    let fits = match r.op.as_str() {
        "rename" => {
            r.folded.first().map(String::as_str) == Some("create") && writes(&r.folded[1..])
        }
        "create" => r.folded == ["write"],
        _ => false,
    };
    if !fits {
        out.push(format!(
            "history record {seq} folds {:?} into a {:?}: only a rename folds its source's create and writes, and a create its file's writes",
            r.folded, r.op
        ));
    }
    let made = r.undo.iter().find_map(|u| match u {
        Undo::Inode { ino, old } if *ino == r.ino => Some(old.is_none()),
        _ => None,
    });
    if made != Some(true) {
        out.push(format!(
            "history record {seq} folds the creation of inode {} but does not undo it",
            r.ino
        ));
    }
    let mut keys = std::collections::HashSet::new();
    if r.undo.iter().any(|u| !keys.insert(u.key())) {
        out.push(format!(
            "history record {seq} folds records but holds two entries for one key"
        ));
    }
    out
}

/// Whether records were made by the process of thread `caller`, whose operation would fold
/// them in, as /proc tells now: a FUSE request names the calling thread, and a process's
/// create, write and rename may come from different threads of it (Node's thread pool).
///
/// A tid is handed out again once its thread has exited, so equal tids, or a thread group
/// read now, say nothing alone: the thread that holds a record's tid now made the record only
/// if it already ran when the record was made (its start time, `process::started_before`).
/// The caller's request came after the create it folds into was answered (a write needs the
/// file, a rename its name), so the thread holding the caller's tid now is the caller when it
/// too started before the create's record (`since`). Either started later, or /proc cannot
/// tell: the records stay apart, which costs only a record of its own. With equal tids one
/// read (`/proc/TID/stat`); otherwise the maker's group and both threads' start times as
/// threads of it (`/proc/TGID/task/TID/stat`), each read once per fold.
struct SameProcess {
    caller: u32,
    since: i64,
    /// Per maker tid: its start time and the caller's, as threads of the maker's process.
    read: Vec<(u32, Option<(u64, u64)>)>,
}

impl SameProcess {
    fn new(caller: u32, since: i64) -> SameProcess {
        SameProcess {
            caller,
            since,
            read: Vec::new(),
        }
    }

    /// Whether thread `maker` made its record at wall-clock time `made` in the caller's
    /// process.
    fn made(&mut self, maker: u32, made: i64) -> bool {
        let caller = self.caller;
        let starts = match self.read.iter().find(|(t, _)| *t == maker) {
            Some((_, s)) => *s,
            None => {
                let s = if maker == caller {
                    crate::process::start(maker).map(|s| (s, s))
                } else {
                    crate::process::thread_group(maker).and_then(|g| {
                        let m = crate::process::task_stat(g, maker)?.start;
                        Some((m, crate::process::task_stat(g, caller)?.start))
                    })
                };
                self.read.push((maker, s));
                s
            }
        };
        starts.is_some_and(|(m, c)| {
            crate::process::started_before(m, made)
                && (maker == caller || crate::process::started_before(c, self.since))
        })
    }
}

/// Merges `wanted` (sorted as `index` orders its keys) with `index`: `visit` gets each
/// wanted entry, in order, with the index's value at its key (None: absent). One ordered
/// pass over the index that steps over up to `STEP_OVER` entries to reach the next wanted
/// key and seeks past longer gaps: a batch of a long history wants, for each key, a run of
/// adjacent entries (its records in the batch's span), with the other batches' entries
/// between the runs, so each run costs one seek and the gaps are never read.
fn merge_index<W>(
    index: &redb::ReadOnlyTable<(&'static [u8], u64), &'static [u8]>,
    wanted: Vec<W>,
    key: impl Fn(&W) -> (&[u8], u64),
    mut visit: impl FnMut(W, Option<&[u8]>),
) -> Result<(), StoreError> {
    use std::cmp::Ordering::{Equal, Less};
    type Entry<'a> = (
        redb::AccessGuard<'a, (&'static [u8], u64)>,
        redb::AccessGuard<'a, &'static [u8]>,
    );
    type Scan<'a> = redb::Range<'a, (&'static [u8], u64), &'static [u8]>;
    /// The next entry of the index's scan (None: ended, or none started).
    fn next<'a>(scan: &mut Option<Scan<'a>>) -> Result<Option<Entry<'a>>, StoreError> {
        match scan.as_mut() {
            Some(s) => s.next().transpose().map_err(map_err),
            None => Ok(None),
        }
    }
    /// A scanned entry costs a fraction of a seek: step over gaps up to this long.
    const STEP_OVER: usize = 8;
    let mut scan: Option<Scan<'_>> = None;
    let mut held: Option<Entry<'_>> = None;
    // The index's order, (bytes, seq) as a tuple orders them, compared as read: no copy.
    let order =
        |held: &Option<Entry<'_>>, w: &W| held.as_ref().map(|(k, _)| k.value().cmp(&key(w)));
    for w in wanted {
        let mut steps = 0;
        while order(&held, &w) == Some(Less) && steps < STEP_OVER {
            held = next(&mut scan)?;
            steps += 1;
        }
        // Nothing read yet, or the wanted key lies past a long gap: seek to it.
        if scan.is_none() || order(&held, &w) == Some(Less) {
            let mut s = index.range(key(&w)..).map_err(map_err)?;
            held = s.next().transpose().map_err(map_err)?;
            scan = Some(s);
        }
        match &held {
            Some((_, v)) if order(&held, &w) == Some(Equal) => {
                visit(w, Some(v.value()));
                held = next(&mut scan)?;
            }
            _ => visit(w, None),
        }
    }
    Ok(())
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

/// `history_undo`, read.
type UndoTable = redb::ReadOnlyTable<(u64, u32), &'static [u8]>;

/// Part `part` of record `seq`'s undo entries, decoded.
fn read_part<T: ReadableTable<(u64, u32), &'static [u8]>>(
    parts: Option<&T>,
    seq: u64,
    part: u32,
) -> Result<Vec<Undo>, StoreError> {
    let bad = || {
        StoreError::Corrupt(format!(
            "part {part} of history record {seq} is missing or does not decode"
        ))
    };
    let t = parts.ok_or_else(bad)?;
    let v = t.get((seq, part)).map_err(map_err)?.ok_or_else(bad)?;
    decode_undo_part(v.value()).ok_or_else(bad)
}

/// Reads a version-2 record's undo entries from its parts into `r.undo` (a version-1
/// record's are there already).
fn fill_undo<T: ReadableTable<(u64, u32), &'static [u8]>>(
    parts: Option<&T>,
    r: &mut HistoryRecord,
) -> Result<(), StoreError> {
    let Some(n) = r.undo_parts else {
        return Ok(());
    };
    for p in 0..n {
        let entries = read_part(parts, r.seq, p)?;
        r.undo.extend(entries);
    }
    if r.undo.len() as u64 != r.undo_len {
        return Err(StoreError::Corrupt(format!(
            "history record {} has {} undo entries but its parts hold {}",
            r.seq,
            r.undo_len,
            r.undo.len()
        )));
    }
    Ok(())
}

/// Calls `f` on each of record `r`'s undo entries in order: a version-1 record's from
/// `r.undo`, a version-2 record's read one part at a time.
fn each_undo<T: ReadableTable<(u64, u32), &'static [u8]>>(
    parts: Option<&T>,
    r: &HistoryRecord,
    f: &mut dyn FnMut(&Undo) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let Some(n) = r.undo_parts else {
        return r.undo.iter().try_for_each(f);
    };
    for p in 0..n {
        read_part(parts, r.seq, p)?.iter().try_for_each(&mut *f)?;
    }
    Ok(())
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
    // A `Created` entry names no key: what it stands for is keyed by inodes no point before
    // the record reaches, like the inode and chunk keys of `created`.
    let undo: Vec<&Undo> = r
        .undo
        .iter()
        .filter(|u| !matches!(u, Undo::Created { .. }))
        .collect();
    // Each key's first entry: a stable sort by key puts it first among its equals (a sort,
    // not a hash set of keys: an import's record holds an entry per file).
    let keys: Vec<Vec<u8>> = undo.iter().map(|u| u.key()).collect();
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
    let mut first = vec![false; keys.len()];
    for (n, &i) in order.iter().enumerate() {
        first[i] = n == 0 || keys[order[n - 1]] != keys[i];
    }
    undo.into_iter()
        .zip(keys)
        .zip(first)
        .filter(|(_, first)| *first)
        .map(|((u, key), _)| {
            // An entry of a directory the operation created is reached only through that
            // directory, which no point before the record holds either.
            let required = match u {
                Undo::Inode { ino, .. } | Undo::Filemap { ino, .. } => !created.contains(ino),
                Undo::Dirent { parent, .. } => !created.contains(parent),
                Undo::Orphan { .. } | Undo::Created { .. } => true,
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

/// An upper bound of the bytes record `r`, whose stored values take `stored` bytes, keeps in
/// the store: its values, its index rows (which hold its before-images again) and their keys,
/// and a whole chunk for every chunk it names (see `budget`).
fn history_bound(r: &HistoryRecord, stored: u64) -> u64 {
    let chunks = r
        .undo
        .iter()
        .filter(|u| matches!(u, Undo::Filemap { old: Some(_), .. }))
        .count() as u64;
    let rows = (r.undo.len() + r.paths.len() + 1) as u64 * 64;
    stored
        .saturating_mul(3)
        .saturating_add(rows)
        .saturating_add(chunks.saturating_mul(CHUNK_SIZE + 64))
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
                Undo::Orphan { .. } | Undo::Created { .. } => {}
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
            let info = self.info.take().unwrap_or(OpInfo {
                op: "change",
                ..OpInfo::default()
            });
            if self.fold_into_create(&info, &c.undo, now)? {
                self.expire_some(now)?;
                return Ok(());
            }
            let mut undo = self.compact_created(c.undo)?;
            let seq = self.next_counter(META_HISTORY_NEXT)?;
            let mut folded = Vec::new();
            let mut source = None;
            if let Some(fold) = self.foldable(&info, now)? {
                undo = self.fold(fold.seqs.iter().rev().copied(), undo)?;
                folded = fold.ops;
                source = Some(info.ino);
            }
            self.keep_content(&mut undo, &info.paths)?;
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
                undo_len: undo.len() as u64,
                undo_parts: None,
                undo,
                conflict: info.conflict,
                folded,
            };
            let (inline, bytes) = self.put_record_whole(&record)?;
            self.store.history_grew(history_bound(&record, bytes));
            let from = self.new_inos_from.get().unwrap_or(u64::MAX);
            self.index_record_with(&record, inline, |ino| ino >= from || Some(ino) == source)?;
            self.expire_some(now)?;
        }
        Ok(())
    }

    /// Expires a bounded batch of records older than the retention: a batch per commit
    /// keeps every commit cheap; the rest follow.
    fn expire_some(&mut self, now: i64) -> Result<(), StoreError> {
        let keep = self.store.keep_history_ns.load(Ordering::Relaxed);
        if keep > 0 {
            self.expire_history(now.saturating_sub(keep as i64), 16)?;
        }
        Ok(())
    }

    /// Takes the write described by `info`, whose before-images are `undo`, into the record
    /// of the file's create in place of a record of its own, when that create is the
    /// store's newest record and point, has taken in no write yet (a later edit of the
    /// file is a version of its own), was made by the writing process (any of its threads,
    /// told by `SameProcess`) within `FOLD_WINDOW_NS` of `now` and within the retention,
    /// names the same one path, notes no lost update, has nothing redacted, is held in one
    /// value, and no mark names its point; and every before-image of the write is either of
    /// a key the create's record already restores (its first image wins: the file did not
    /// exist, its directories were as before) or of a chunk of the new file that held
    /// nothing before. The create's record keeps its seq and time, so its index entries stay
    /// as they are: only its size after, its entries for the new chunks and its `folded`
    /// note ("write") change. Whether it did. The SDK's create: a file made with `O_EXCL`, written,
    /// fsynced and closed, one record.
    fn fold_into_create(
        &mut self,
        info: &OpInfo,
        undo: &[Undo],
        now: i64,
    ) -> Result<bool, StoreError> {
        if info.op != "write" || info.conflict.is_some() || info.paths.len() != 1 {
            return Ok(false);
        }
        let newest = {
            let hist = self.tx.open_table(HISTORY).map_err(map_err)?;
            let Some((k, v)) = hist.last().map_err(map_err)? else {
                return Ok(false);
            };
            HistoryRecord::decode(k.value(), v.value())
        };
        let Some(mut r) = newest else {
            return Ok(false);
        };
        let fits = r.op == "create"
            && r.ino == info.ino
            && r.paths == info.paths
            && r.conflict.is_none()
            && !r.redacted
            && r.undo_parts.is_none()
            && r.folded.is_empty()
            && r.time <= now
            && now - r.time <= FOLD_WINDOW_NS
            // Not a record this commit's expiry would drop.
            && ((now - r.time) as u64) < self.store.keep_history_ns.load(Ordering::Relaxed)
            && r.undo
                .iter()
                .any(|u| matches!(u, Undo::Inode { ino, old: None } if *ino == r.ino));
        if !fits || self.last_seq()? != r.seq {
            return Ok(false);
        }
        // A mark names the point after the create: it would name the file written.
        if self.marked()?.is_some_and(|m| m >= r.seq) {
            return Ok(false);
        }
        let mut keys: std::collections::HashSet<Vec<u8>> = r.undo.iter().map(Undo::key).collect();
        let mut added = Vec::new();
        for u in undo {
            match u {
                // A chunk replaced keeps a blob alive: the records stay apart.
                Undo::Filemap { old: Some(_), .. } => return Ok(false),
                _ if keys.contains(&u.key()) => {}
                Undo::Filemap { ino, old: None, .. } if *ino == r.ino => {
                    keys.insert(u.key());
                    added.push(u.clone());
                }
                _ => return Ok(false),
            }
        }
        r.undo.extend(added);
        r.undo_len = r.undo.len() as u64;
        r.size_after = info.size_after;
        r.folded.push("write".to_string());
        let inline = r.encode_inline();
        // Last, as the one check that reads /proc.
        if inline.len() > RECORD_INLINE_BYTES
            || !SameProcess::new(info.pid, r.time).made(r.pid, r.time)
        {
            return Ok(false);
        }
        self.put_history_value(r.seq, &inline)?;
        Ok(true)
    }

    /// The newest records to fold into the record of this rename (`info`), newest first:
    /// the source's "write" records and, before them, its "create", when all of them are
    /// the store's newest records, made by the renaming process (any of its threads, told
    /// by `SameProcess`) within `FOLD_WINDOW_NS` of `now`, naming only the source's old
    /// path, with no lost update noted, nothing redacted and no blob kept, and no mark names
    /// a point among them. The SDK's edit:
    /// a temporary file created, written, fsynced and renamed over the memory.
    fn foldable(&self, info: &OpInfo, now: i64) -> Result<Option<Fold>, StoreError> {
        if info.op != "rename" || info.conflict.is_some() || info.paths.len() != 2 {
            return Ok(None);
        }
        let from = &info.paths[0];
        let hist = self.tx.open_table(HISTORY).map_err(map_err)?;
        let mut fold = Fold::default();
        let mut created = false;
        // Each record's maker and time, told apart from the caller once all else fits.
        let mut makers = Vec::new();
        let newest = hist.iter().map_err(map_err)?.rev().take(FOLD_MAX_RECORDS);
        for item in newest {
            let (k, v) = item.map_err(map_err)?;
            let Some(r) = HistoryRecord::decode(k.value(), v.value()) else {
                return Ok(None);
            };
            let fits = r.ino == info.ino
                && r.paths.len() == 1
                && &r.paths[0] == from
                && r.conflict.is_none()
                && !r.redacted
                && (r.folded.is_empty()
                    || r.op == "create" && r.folded.iter().all(|o| o == "write"))
                && r.time <= now
                && now - r.time <= FOLD_WINDOW_NS
                && matches!(r.op.as_str(), "create" | "write");
            if !fits {
                return Ok(None);
            }
            makers.push((r.pid, r.time));
            fold.seqs.push(r.seq);
            // Newest first, reversed below: a create's own folded writes follow it.
            fold.ops.extend(r.folded.iter().rev().cloned());
            fold.ops.push(r.op.clone());
            if r.op == "create" {
                created = true;
                break;
            }
        }
        drop(hist);
        let Some(&oldest) = fold.seqs.last() else {
            return Ok(None);
        };
        if !created {
            return Ok(None);
        }
        fold.ops.reverse();
        // A mark names the point after a record: one among the folded ones would vanish.
        if self.marked()?.is_some_and(|m| m >= oldest) {
            return Ok(None);
        }
        // The create made the source: its first entry says it did not exist. No entry
        // keeps a blob (a fresh file's chunks had none before).
        let mut made = false;
        let mut blob = false;
        for &seq in &fold.seqs {
            for u in self.record_undo(seq)? {
                match u {
                    Undo::Inode { ino, old: None } if ino == info.ino && seq == oldest => {
                        made = true
                    }
                    Undo::Filemap { old: Some(_), .. } => blob = true,
                    _ => {}
                }
            }
        }
        if !made || blob {
            return Ok(None);
        }
        // Last, as the one check that reads /proc. The create is the oldest: the caller's
        // request came after it was answered.
        let mut same = SameProcess::new(info.pid, makers.last().map_or(0, |m| m.1));
        Ok(makers
            .iter()
            .all(|&(pid, time)| same.made(pid, time))
            .then_some(fold))
    }

    /// Drops records `seqs` (oldest first) and returns their undo entries followed by
    /// `undo`, each key's first (oldest) before-image only: undoing them restores the store
    /// to the point before the oldest. A directory entry absent before and after is left
    /// out (its undo changes nothing).
    fn fold(
        &mut self,
        seqs: impl Iterator<Item = u64>,
        undo: Vec<Undo>,
    ) -> Result<Vec<Undo>, StoreError> {
        let mut all = Vec::new();
        for seq in seqs {
            all.extend(self.record_undo(seq)?);
            self.drop_record(seq)?;
        }
        all.extend(undo);
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(all.len());
        for u in all {
            if !seen.insert(u.key()) {
                // A later before-image of a key already restored: not needed. One that kept
                // a blob gives its reference back.
                if let Undo::Filemap { old: Some(b), .. } = u {
                    self.blob_unref(b);
                }
                continue;
            }
            if let Undo::Dirent {
                parent,
                name,
                old: None,
            } = &u
                && self.lookup(*parent, name)?.is_none()
            {
                continue;
            }
            out.push(u);
        }
        Ok(out)
    }

    /// Before-images of inodes whose inline chunk holds content keep it as a delta
    /// (`schema::delta_form`) against the content after the transaction: the inode's own,
    /// or, when the transaction removed the inode, the file's now at its name (an SDK's
    /// write to a temporary file renamed over). A rename or a change of mode keeps an empty
    /// delta. Each image's run is one more than that of the images kept against its content
    /// before (`run_against`); one that would pass `MAX_IMAGE_RUN`, or whose delta is not
    /// smaller, stays whole.
    fn keep_content(&self, undo: &mut [Undo], paths: &[String]) -> Result<(), StoreError> {
        // Undoing applies one part at a time: an image kept against another inode is only
        // written in a record of one part, whose entries rollback resolves before applying
        // any (`apply_undo`).
        let one_part = undo
            .iter()
            .try_fold(0usize, |n, u| {
                let n = n + u.encode().len();
                (n <= UNDO_PART_BYTES).then_some(n)
            })
            .is_some();
        let t = self.tx.open_table(INODES).map_err(map_err)?;
        for u in undo.iter_mut() {
            let Undo::Inode { ino, old: Some(b) } = u else {
                continue;
            };
            if !matches!(inline_chunk(b), Some(InlineChunk::Content(_))) {
                continue;
            }
            let after = match t.get(*ino).map_err(map_err)? {
                Some(v) => Some((*ino, v.value().to_vec())),
                None if one_part => match Inode::decode(*ino, b) {
                    Some(i) => match self.lookup(i.parent, &i.name)? {
                        Some((other, Kind::File)) => t
                            .get(other)
                            .map_err(map_err)?
                            .map(|v| (other, v.value().to_vec())),
                        _ => None,
                    },
                    None => None,
                },
                None => None,
            };
            let Some((base_ino, after)) = after else {
                continue;
            };
            let Some(InlineChunk::Content(base)) = inline_chunk(&after) else {
                continue;
            };
            let Some(run) = self.run_against(*ino, paths)? else {
                continue;
            };
            if let Some(d) = delta_form(b, base_ino, base, run.saturating_add(1)) {
                *b = d;
            }
        }
        Ok(())
    }

    /// The longest run of delta images kept against inode `ino`'s content now (each would
    /// grow by one if that content became a delta): those of the newest record naming one
    /// of `paths` and of the newest record that changed the inode, which a later edit of the
    /// file meets first. None when one of them cannot say (a `keep_form` image, or a record
    /// too large to read here): the new image is then kept whole.
    fn run_against(&self, ino: u64, paths: &[String]) -> Result<Option<u8>, StoreError> {
        /// A record of more entries than this is not read for its runs.
        const READ_AT_MOST: u64 = 256;
        let mut seqs = Vec::new();
        {
            let keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
            for p in paths {
                let p = path_index_key(p);
                let last = keys
                    .range((p.as_slice(), 0)..=(p.as_slice(), u64::MAX))
                    .map_err(map_err)?
                    .next_back();
                if let Some(item) = last {
                    seqs.push(item.map_err(map_err)?.0.value().1);
                }
            }
            let key = undo_key(1, &[ino], "");
            let last = keys
                .range((key.as_slice(), 0)..=(key.as_slice(), u64::MAX))
                .map_err(map_err)?
                .next_back();
            if let Some(item) = last {
                seqs.push(item.map_err(map_err)?.0.value().1);
            }
        }
        seqs.sort_unstable();
        seqs.dedup();
        let mut run = 0u8;
        for seq in seqs {
            let Some(r) = self.record_header(seq)? else {
                continue;
            };
            if r.undo_len > READ_AT_MOST {
                return Ok(None);
            }
            for u in self.record_undo(seq)? {
                if let Undo::Inode {
                    ino: i,
                    old: Some(b),
                } = &u
                    && content_kept(b)
                    && kept_base(*i, b) == ino
                {
                    match image_run(b) {
                        Some(n) => run = run.max(n),
                        None => return Ok(None),
                    }
                }
            }
        }
        Ok(Some(run))
    }

    /// Restores the before-images of `undo`, newest change first. With history on, this is
    /// itself captured, so undoing can be undone.
    pub fn apply_undo(&mut self, undo: &[Undo]) -> Result<(), StoreError> {
        // A content kept as, or against, the record after: the base inode's now (undoing
        // newest first), read before any entry is applied, since an entry of the same
        // record may restore the base.
        let mut wholes = Vec::with_capacity(undo.len());
        {
            let t = self.tx.open_table(INODES).map_err(map_err)?;
            for u in undo {
                wholes.push(match u {
                    Undo::Inode { ino, old: Some(b) } if content_kept(b) => {
                        let now = t
                            .get(kept_base(*ino, b))
                            .map_err(map_err)?
                            .map(|v| v.value().to_vec());
                        let whole = now.and_then(|n| with_kept_content(b, &n));
                        Some(whole.ok_or_else(|| corrupt("history record", *ino))?)
                    }
                    _ => None,
                });
            }
        }
        for (u, whole) in undo.iter().zip(wholes).rev() {
            match u {
                Undo::Inode { ino, old } => {
                    // The record whole: its fields and the inline chunk it held.
                    if let Some(b) = old
                        && Inode::decode(*ino, b).is_none()
                    {
                        return Err(corrupt("history record", *ino));
                    }
                    let old = whole
                        .as_deref()
                        .or(old.as_deref())
                        .map(super::write::InodeRecord::Encoded);
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
                Undo::Created { from, to } => self.remove_created(*from, *to)?,
            }
        }
        Ok(())
    }

    /// Undoes a `Undo::Created` entry: removes every inode numbered `from..to` with its
    /// content and, for a directory, its entries, highest number first (children before
    /// parents: `compact_created` holds the operation to numbering parents first), then the
    /// range's orphan marks.
    /// Each goes through the primitives, so usage, aggregates and blob references follow,
    /// and a capturing transaction (a rollback with history on) records what it removed.
    fn remove_created(&mut self, from: u64, to: u64) -> Result<(), StoreError> {
        if from >= to {
            return Err(corrupt("history created range", from));
        }
        let mut below = to;
        loop {
            // A batch of inodes, highest first, with a directory's entry names and a file's
            // chunk indexes, read over one opening of each table before any is removed.
            type Doomed = (u64, Vec<String>, Vec<u64>);
            let batch: Vec<Doomed> = {
                let inodes = self.tx.open_table(INODES).map_err(map_err)?;
                let dirents = self.tx.open_table(DIRENTS).map_err(map_err)?;
                let map = self.tx.open_table(FILEMAP).map_err(map_err)?;
                let mut v = Vec::new();
                for item in inodes.range(from..below).map_err(map_err)?.rev().take(1024) {
                    let (k, rec) = item.map_err(map_err)?;
                    let ino = k.value();
                    let kind = Inode::decode(ino, rec.value())
                        .ok_or_else(|| corrupt("record", ino))?
                        .kind;
                    let (mut names, mut idxs) = (Vec::new(), Vec::new());
                    match kind {
                        Kind::Dir => {
                            for e in dirents.range((ino, "")..(ino + 1, "")).map_err(map_err)? {
                                names.push(e.map_err(map_err)?.0.value().1.to_string());
                            }
                        }
                        Kind::File => {
                            for c in map.range((ino, 0)..=(ino, u64::MAX)).map_err(map_err)? {
                                idxs.push(c.map_err(map_err)?.0.value().1);
                            }
                        }
                    }
                    v.push((ino, names, idxs));
                }
                v
            };
            let Some(&(last, _, _)) = batch.last() else {
                break;
            };
            for (ino, names, idxs) in batch {
                for name in names {
                    self.set_dirent(ino, &name, None)?;
                }
                self.set_inode_record(ino, None)?;
                for idx in idxs {
                    self.set_filemap(ino, idx, None)?;
                }
            }
            below = last;
        }
        // Orphan marks of the range (an inode made and unlinked while open by the operation).
        let orphans: Vec<u64> = {
            let t = self.tx.open_table(ORPHANS).map_err(map_err)?;
            let mut v = Vec::new();
            for item in t.range(from..to).map_err(map_err)? {
                v.push(item.map_err(map_err)?.0.value());
            }
            v
        };
        for ino in orphans {
            self.set_orphan(ino, false)?;
        }
        Ok(())
    }

    /// An operation's undo entries with those keyed by the inodes it handed out replaced by
    /// one `Undo::Created` entry, when that is exact and worth it: at least `COMPACT_MIN`
    /// entries go; every one of them held no value before (the inodes are new); no entry
    /// anywhere names a directory entry that held a value (nothing was moved or replaced,
    /// so nothing older can sit below a new directory); and every new inode's parent is
    /// numbered below it (children removed first undo it); no older inode is made again (it
    /// could be placed below a new directory). Otherwise `undo` as it is. A bulk
    /// create (an import, a tar import) then records its new tree in 17 bytes, and the
    /// entries naming it from outside (the new top-level entries, the changed parents).
    pub(super) fn compact_created(&self, undo: Vec<Undo>) -> Result<Vec<Undo>, StoreError> {
        let Some(from) = self.new_inos_from.get() else {
            return Ok(undo);
        };
        let inside = |u: &Undo| match u {
            Undo::Inode { ino, .. } | Undo::Filemap { ino, .. } | Undo::Orphan { ino, .. } => {
                *ino >= from
            }
            Undo::Dirent { parent, .. } => *parent >= from,
            Undo::Created { .. } => false,
        };
        let mut n = 0usize;
        for u in &undo {
            let fresh = match u {
                Undo::Inode { old, .. } => old.is_none(),
                Undo::Dirent { old, .. } => old.is_none(),
                Undo::Filemap { old, .. } => old.is_none(),
                Undo::Orphan { present, .. } => !present,
                Undo::Created { .. } => return Ok(undo),
            };
            // An old inode made again (a revert's) could sit below a new directory.
            let remade = fresh && matches!(u, Undo::Inode { .. }) && !inside(u);
            if remade || (!fresh && (inside(u) || matches!(u, Undo::Dirent { .. }))) {
                return Ok(undo);
            }
            n += usize::from(inside(u));
        }
        if n < COMPACT_MIN {
            return Ok(undo);
        }
        let to = self
            .meta_bytes(META_NEXT_INO)?
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| StoreError::Corrupt(format!("meta {META_NEXT_INO} missing")))?;
        {
            let t = self.tx.open_table(INODES).map_err(map_err)?;
            for item in t.range(from..to).map_err(map_err)? {
                let (k, v) = item.map_err(map_err)?;
                let ino = k.value();
                let i = Inode::decode(ino, v.value()).ok_or_else(|| corrupt("record", ino))?;
                if i.parent >= ino {
                    return Ok(undo);
                }
            }
        }
        self.step(to - from);
        let mut out: Vec<Undo> = undo.into_iter().filter(|u| !inside(u)).collect();
        out.push(Undo::Created { from, to });
        Ok(out)
    }

    /// The seqs of history records above `after`, newest first (their headers only are read).
    pub fn history_seqs_after(&self, after: u64) -> Result<Vec<u64>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let mut out = Vec::new();
        for item in t.range(after + 1..).map_err(map_err)?.rev() {
            out.push(item.map_err(map_err)?.0.value());
        }
        Ok(out)
    }

    /// Record `seq`'s header (a version-1 record's undo entries with it), if it is kept.
    fn record_header(&self, seq: u64) -> Result<Option<HistoryRecord>, StoreError> {
        let t = self.tx.open_table(HISTORY).map_err(map_err)?;
        let Some(v) = t.get(seq).map_err(map_err)? else {
            return Ok(None);
        };
        HistoryRecord::decode(seq, v.value())
            .map(Some)
            .ok_or_else(|| corrupt("history record", seq))
    }

    /// Every undo entry of record `seq`, in order (a record folded into another is small).
    fn record_undo(&self, seq: u64) -> Result<Vec<Undo>, StoreError> {
        let mut r = self
            .record_header(seq)?
            .ok_or_else(|| corrupt("history record", seq))?;
        for p in 0..r.undo_parts.unwrap_or(0) {
            r.undo.extend(self.undo_part(seq, p)?);
        }
        Ok(r.undo)
    }

    /// Part `part` of record `seq`'s undo entries.
    fn undo_part(&self, seq: u64, part: u32) -> Result<Vec<Undo>, StoreError> {
        let t = self.tx.open_table(HISTORY_UNDO).map_err(map_err)?;
        read_part(Some(&*t), seq, part)
    }

    /// Applies the undo entries of every record above `after`, newest record and newest
    /// change first, one part at a time (the store goes back to point `after`); how many
    /// records that was. The records stay: see `truncate_history_after`.
    pub fn undo_after(&mut self, after: u64) -> Result<usize, StoreError> {
        let seqs = self.history_seqs_after(after)?;
        for &seq in &seqs {
            let r = self
                .record_header(seq)?
                .ok_or_else(|| corrupt("history record", seq))?;
            match r.undo_parts {
                None => self.apply_undo(&r.undo)?,
                Some(n) => {
                    for p in (0..n).rev() {
                        let entries = self.undo_part(seq, p)?;
                        self.apply_undo(&entries)?;
                    }
                }
            }
        }
        Ok(seqs.len())
    }

    /// Removes history records with seq above `after`, releasing what they kept alive.
    pub fn truncate_history_after(&mut self, after: u64) -> Result<(), StoreError> {
        for seq in self.history_seqs_after(after)? {
            self.drop_record(seq)?;
        }
        Ok(())
    }

    /// Removes record `seq`, its parts and its index entries, releasing the blobs its
    /// before-images kept alive: one part at a time. Returns about the bytes that frees, for
    /// history's budget (`budget`): the record's stored values twice over (its index rows
    /// hold its before-images again) and the stored bytes of every blob it named (an upper
    /// bound: another record or the current content may still hold one).
    pub(super) fn drop_record(&mut self, seq: u64) -> Result<u64, StoreError> {
        let r = self
            .record_header(seq)?
            .ok_or_else(|| corrupt("history record", seq))?;
        self.step(1 + r.undo_len + r.paths.len() as u64);
        let release = |w: &mut Self, undo: &[Undo]| -> Result<u64, StoreError> {
            let mut blob_bytes = 0u64;
            let blobs = w.blobs()?;
            for u in undo {
                if let Undo::Filemap { old: Some(b), .. } = u {
                    blob_bytes += blobs.stored_len(*b)?;
                }
            }
            drop(blobs);
            for u in undo {
                if let Undo::Filemap { old: Some(b), .. } = u {
                    w.blob_unref(*b);
                }
            }
            w.unindex_entries(seq, undo)?;
            Ok(blob_bytes)
        };
        let mut freed = 0u64;
        match r.undo_parts {
            None => freed += release(self, &r.undo)?,
            Some(n) => {
                for p in 0..n {
                    let entries = self.undo_part(seq, p)?;
                    freed += release(self, &entries)?;
                    let gone = self
                        .tx
                        .open_table(HISTORY_UNDO)
                        .map_err(map_err)?
                        .remove((seq, p))
                        .map_err(map_err)?
                        .map_or(0, |v| v.value().len() as u64);
                    freed += 2 * gone;
                    redo_del(&self.redo, HISTORY_UNDO, &(seq, p));
                }
            }
        }
        self.unindex_header(&r)?;
        let gone = self
            .tx
            .open_table(HISTORY)
            .map_err(map_err)?
            .remove(seq)
            .map_err(map_err)?
            .map_or(0, |v| v.value().len() as u64);
        freed += 2 * gone;
        redo_del(&self.redo, HISTORY, &seq);
        Ok(freed)
    }

    /// Drops up to `max` records older than `cutoff` (ns since the epoch).
    fn expire_history(&mut self, cutoff: i64, max: usize) -> Result<(), StoreError> {
        // Every commit asks, so the question goes to the time index, whose keys are small:
        // the oldest record may be an import's with many parts, dropped a part at a time.
        // Counted as work: one step for the look, and each record at its entries.
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
            let times = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
            let (lo, cut) = (time_index_key(i64::MIN), time_index_key(cutoff));
            let mut v = Vec::new();
            for item in times
                .range((lo.as_slice(), 0)..(cut.as_slice(), 0))
                .map_err(map_err)?
                .take(max)
            {
                v.push(item.map_err(map_err)?.0.value().1);
            }
            if v.is_empty() {
                // This transaction's own record is in the index, so there is a first.
                let first = times.range((lo.as_slice(), 0)..).map_err(map_err)?.next();
                if let Some(item) = first {
                    let (k, _) = item.map_err(map_err)?;
                    if let Some(t) = time_of_index_key(k.value().0) {
                        self.store.history_oldest.fetch_max(t, Ordering::Relaxed);
                    }
                }
            }
            v
        };
        for seq in expired {
            self.drop_record(seq)?;
        }
        Ok(())
    }

    /// Erases, in every history record and in history's key index, the inode before-images
    /// whose inline chunk is one of `parts` (encoded, as `TreeView::inline_part_of` gives
    /// them), and marks those records redacted. Returns the parts found and erased. Reads
    /// every record: redaction is rare, and a version's bytes may sit in any record that
    /// changed that inode (a rollback's too), as a blob may be named by any.
    /// `wholes` gives, by (record seq, ino), before-images kept as another version
    /// (`schema::delta_form`) whole: each is written whole first, so that erasing its base
    /// leaves it, and is erased when it is one of `parts`.
    pub fn redact_inline_everywhere(
        &mut self,
        parts: &std::collections::HashSet<Vec<u8>>,
        wholes: &std::collections::HashMap<(u64, u64), Vec<u8>>,
    ) -> Result<usize, StoreError> {
        if parts.is_empty() {
            return Ok(0);
        }
        let holds = |u: &Undo| match u {
            Undo::Inode { old: Some(b), .. } => inline_part(b).is_some_and(|p| parts.contains(p)),
            _ => false,
        };
        let mut erased = std::collections::HashSet::new();
        // Writes in `undo` the whole images `wholes` gives (when `whole`), erases what
        // `holds`, and both in the key index; whether anything changed and whether anything
        // was erased.
        let mut erase = |w: &Self,
                         seq: u64,
                         undo: &mut [Undo],
                         whole: bool|
         -> Result<(bool, bool), StoreError> {
            let mut keys = w.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
            let (mut changed, mut hit) = (false, false);
            for u in undo.iter_mut() {
                let Undo::Inode { ino, old: Some(b) } = u else {
                    continue;
                };
                let mut this = false;
                if whole
                    && content_kept(b)
                    && let Some(w) = wholes.get(&(seq, *ino))
                {
                    *b = w.clone();
                    this = true;
                }
                if holds(u) {
                    let Undo::Inode { old: Some(b), .. } = u else {
                        continue;
                    };
                    hit = true;
                    this = true;
                    erased.insert(inline_part(b).map(<[u8]>::to_vec));
                    *b = redact_inline(b);
                }
                if !this {
                    continue;
                }
                changed = true;
                let k = u.key();
                // An entry by reference reads the record, which is rewritten.
                let held = keys
                    .get((k.as_slice(), seq))
                    .map_err(map_err)?
                    .map(|v| v.value().is_empty());
                if held == Some(false) {
                    let v = index_value(u);
                    keys.insert((k.as_slice(), seq), v.as_slice())
                        .map_err(map_err)?;
                    redo_put(&w.redo, HISTORY_KEYS, &(k.as_slice(), seq), &v.as_slice());
                }
            }
            Ok((changed, hit))
        };
        for seq in self.history_seqs_after(0)? {
            let Some(mut r) = self.record_header(seq)? else {
                continue;
            };
            let hit = match r.undo_parts {
                // A version-1 record is written again split, whole.
                None => {
                    let mut undo = std::mem::take(&mut r.undo);
                    let (changed, hit) = erase(self, seq, &mut undo, true)?;
                    r.undo = undo;
                    if changed {
                        r.redacted |= hit;
                        self.put_record(&r)?;
                    }
                    false
                }
                // A version-2 record: only the parts that held a version, one at a time.
                Some(n) => {
                    let mut hit = false;
                    for p in 0..n {
                        let mut b = Vec::new();
                        let mut put = |undo: &[Undo]| {
                            undo_parts::<StoreError>(undo, |_, part| {
                                b = part.to_vec();
                                Ok(())
                            })
                        };
                        let mut undo = self.undo_part(seq, p)?;
                        let (mut changed, mut this) = erase(self, seq, &mut undo, true)?;
                        // Whole images may not fit the part: then the deltas stay.
                        if changed && put(&undo)? > 1 {
                            undo = self.undo_part(seq, p)?;
                            (changed, this) = erase(self, seq, &mut undo, false)?;
                            // An entry only shrinks: the part still fits in one.
                            let one = put(&undo)?;
                            debug_assert!(one <= 1);
                        }
                        if changed {
                            hit |= this;
                            self.put_part(seq, p, &b)?;
                        }
                    }
                    hit
                }
            };
            if hit {
                r.redacted = true;
                self.put_header(&r)?;
            }
        }
        Ok(erased.len())
    }

    /// Writes record `r` whole (its undo entries in `r.undo`): in one value of `history` when
    /// it takes at most `RECORD_INLINE_BYTES` (version 3, inline), else its header in
    /// `history` and its entries in `history_undo` parts, each encoded and put as it fills.
    pub fn put_record(&mut self, r: &HistoryRecord) -> Result<(), StoreError> {
        self.put_record_whole(r).map(|_| ())
    }

    /// `put_record`; whether the record went in one value (inline), and the bytes of its
    /// stored values.
    fn put_record_whole(&mut self, r: &HistoryRecord) -> Result<(bool, u64), StoreError> {
        let inline = r.encode_inline();
        if inline.len() <= RECORD_INLINE_BYTES {
            self.put_history_value(r.seq, &inline)?;
            return Ok((true, inline.len() as u64));
        }
        let mut stored = 0u64;
        let n = undo_parts::<StoreError>(&r.undo, |p, bytes| {
            stored += bytes.len() as u64;
            self.put_part(r.seq, p, bytes)
        })?;
        let bytes = r.encode_header_v2(r.undo.len() as u64, n);
        self.put_history_value(r.seq, &bytes)?;
        Ok((false, stored + bytes.len() as u64))
    }

    /// Rewrites a version-2 record's header (its parts unchanged).
    fn put_header(&mut self, r: &HistoryRecord) -> Result<(), StoreError> {
        let bytes = r.encode_header_v2(r.undo_len, r.undo_parts.unwrap_or(0));
        self.put_history_value(r.seq, &bytes)
    }

    fn put_history_value(&mut self, seq: u64, bytes: &[u8]) -> Result<(), StoreError> {
        self.tx
            .open_table(HISTORY)
            .map_err(map_err)?
            .insert(seq, bytes)
            .map_err(map_err)?;
        redo_put(&self.redo, HISTORY, &seq, &bytes);
        Ok(())
    }

    fn put_part(&self, seq: u64, part: u32, bytes: &[u8]) -> Result<(), StoreError> {
        self.tx
            .open_table(HISTORY_UNDO)
            .map_err(map_err)?
            .insert((seq, part), bytes)
            .map_err(map_err)?;
        redo_put(&self.redo, HISTORY_UNDO, &(seq, part), &bytes);
        Ok(())
    }

    /// Adds `r` to history's indexes (by key, path and time; see `schema`).
    pub(super) fn index_record(&self, r: &HistoryRecord) -> Result<(), StoreError> {
        let from = self.new_inos_from.get().unwrap_or(u64::MAX);
        self.index_record_with(r, false, |ino| ino >= from)
    }

    /// `index_record`, where `fresh` says which inodes the record's operation handed out;
    /// `by_reference` (a record held in one value) indexes each key with an empty value: the
    /// before-image is the record's first entry for the key, one read of a small value away.
    fn index_record_with(
        &self,
        r: &HistoryRecord,
        by_reference: bool,
        fresh: impl Fn(u64) -> bool,
    ) -> Result<(), StoreError> {
        self.step(1 + r.undo.len() as u64 + r.paths.len() as u64);
        let mut keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        for (k, mut v, _) in index_entries(r, fresh).into_iter().filter(|e| e.2) {
            if by_reference {
                v.clear();
            }
            keys.insert((k.as_slice(), r.seq), v.as_slice())
                .map_err(map_err)?;
            redo_put(
                &self.redo,
                HISTORY_KEYS,
                &(k.as_slice(), r.seq),
                &v.as_slice(),
            );
        }
        let none: &[u8] = &[];
        for p in &r.paths {
            let k = path_index_key(p);
            keys.insert((k.as_slice(), r.seq), none).map_err(map_err)?;
            redo_put(&self.redo, HISTORY_KEYS, &(k.as_slice(), r.seq), &none);
        }
        let k = time_index_key(r.time);
        keys.insert((k.as_slice(), r.seq), none).map_err(map_err)?;
        redo_put(&self.redo, HISTORY_KEYS, &(k.as_slice(), r.seq), &none);
        Ok(())
    }

    /// Removes the key index entries of record `seq`'s undo entries `undo`.
    fn unindex_entries(&self, seq: u64, undo: &[Undo]) -> Result<(), StoreError> {
        let mut keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        for u in undo.iter().filter(|u| !matches!(u, Undo::Created { .. })) {
            let k = u.key();
            keys.remove((k.as_slice(), seq)).map_err(map_err)?;
            redo_del(&self.redo, HISTORY_KEYS, &(k.as_slice(), seq));
        }
        Ok(())
    }

    /// Removes record `r` from the path and time indexes.
    fn unindex_header(&self, r: &HistoryRecord) -> Result<(), StoreError> {
        let mut keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
        for p in &r.paths {
            let k = path_index_key(p);
            keys.remove((k.as_slice(), r.seq)).map_err(map_err)?;
            redo_del(&self.redo, HISTORY_KEYS, &(k.as_slice(), r.seq));
        }
        let k = time_index_key(r.time);
        keys.remove((k.as_slice(), r.seq)).map_err(map_err)?;
        redo_del(&self.redo, HISTORY_KEYS, &(k.as_slice(), r.seq));
        Ok(())
    }

    /// Moves the rows of the separate `history_paths` and `history_times` tables into
    /// `history_keys` and deletes those tables (the format-8 migration); how many rows moved.
    /// A table that is missing (a store indexed by this build) moves nothing.
    pub(super) fn merge_history_indexes(&mut self) -> Result<u64, StoreError> {
        let n = {
            let mut keys = self.tx.open_table(HISTORY_KEYS).map_err(map_err)?;
            let paths = self.tx.open_table(HISTORY_PATHS).map_err(map_err)?;
            let times = self.tx.open_table(HISTORY_TIMES).map_err(map_err)?;
            put_path_and_time_rows(&mut keys, Some(&*paths), Some(&*times))?
        };
        self.tx.delete_table(HISTORY_PATHS).map_err(map_err)?;
        self.tx.delete_table(HISTORY_TIMES).map_err(map_err)?;
        Ok(n)
    }

    /// Indexes every history record (the format-3 migration); how many there were.
    pub(super) fn index_all_history(&mut self) -> Result<u64, StoreError> {
        let mut n = 0;
        let mut after = 0;
        loop {
            // In batches, so memory stays bounded however long the history is.
            let batch: Vec<HistoryRecord> = {
                let t = self.tx.open_table(HISTORY).map_err(map_err)?;
                let parts = self.tx.open_table(HISTORY_UNDO).map_err(map_err)?;
                let mut v = Vec::new();
                for item in t.range(after + 1..).map_err(map_err)?.take(4096) {
                    let (k, val) = item.map_err(map_err)?;
                    let mut r = HistoryRecord::decode(k.value(), val.value())
                        .ok_or_else(|| corrupt("history record", k.value()))?;
                    fill_undo(Some(&*parts), &mut r)?;
                    v.push(r);
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

    /// The seq of the newest history record (0 when there is none yet), as this
    /// transaction sees it: a mark set in the same transaction names it exactly, since no
    /// later commit can take a write into that record first.
    pub fn last_seq(&self) -> Result<u64, StoreError> {
        let meta = self.tx.open_table(META).map_err(map_err)?;
        Ok(super::read::meta_u64_in(&*meta, META_HISTORY_NEXT)?
            .unwrap_or(1)
            .saturating_sub(1))
    }

    pub fn set_mark(&self, name: &str, seq: u64) -> Result<(), StoreError> {
        self.tx
            .open_table(MARKS)
            .map_err(map_err)?
            .insert(name, seq)
            .map_err(map_err)?;
        redo_put(&self.redo, MARKS, &name, &seq);
        if self.marked()?.is_none_or(|m| seq > m) {
            self.put_meta(META_MARKED, &seq.to_le_bytes())?;
        }
        Ok(())
    }

    /// The highest seq a mark names, or was given (`META_MARKED`); without that key, read
    /// from the marks themselves (there are none in a store that never had the key set).
    pub(super) fn marked(&self) -> Result<Option<u64>, StoreError> {
        if let Some(b) = self.meta_bytes(META_MARKED)? {
            let b: [u8; 8] = b
                .try_into()
                .map_err(|_| StoreError::Corrupt("meta \"marked\" is not 8 bytes".into()))?;
            return Ok(Some(u64::from_le_bytes(b)));
        }
        let marks = self.tx.open_table(MARKS).map_err(map_err)?;
        let mut top = None;
        for item in marks.iter().map_err(map_err)? {
            top = top.max(Some(item.map_err(map_err)?.1.value()));
        }
        Ok(top)
    }
}

/// Puts the rows of the separate path and time index tables of format 8 and before
/// (`paths`, `times`; `None` where a store has none) into `keys`, the key index's table,
/// where this format keeps them as tagged ranges; how many rows it put.
pub(super) fn put_path_and_time_rows(
    keys: &mut redb::Table<'_, (&'static [u8], u64), &'static [u8]>,
    paths: Option<&impl ReadableTable<(&'static str, u64), ()>>,
    times: Option<&impl ReadableTable<(i64, u64), ()>>,
) -> Result<u64, StoreError> {
    let none: &[u8] = &[];
    let mut n = 0;
    for item in paths
        .map(|t| t.iter())
        .transpose()
        .map_err(map_err)?
        .into_iter()
        .flatten()
    {
        let (k, _) = item.map_err(map_err)?;
        let (p, seq) = k.value();
        let k = path_index_key(p);
        keys.insert((k.as_slice(), seq), none).map_err(map_err)?;
        n += 1;
    }
    for item in times
        .map(|t| t.iter())
        .transpose()
        .map_err(map_err)?
        .into_iter()
        .flatten()
    {
        let (k, _) = item.map_err(map_err)?;
        let (time, seq) = k.value();
        let k = time_index_key(time);
        keys.insert((k.as_slice(), seq), none).map_err(map_err)?;
        n += 1;
    }
    Ok(n)
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
                // The last key of the undo index: the path and time rows follow it.
                let mut below = keys.range(..(&[PATH_INDEX_TAG][..], 0)).unwrap();
                let last = below.next_back().unwrap().unwrap();
                let (k, seq) = last.0.value();
                (k.to_vec(), seq)
            };
            keys.insert((k.as_slice(), seq), b"changed".as_slice())
                .unwrap();
            keys.insert((b"\x05no record".as_slice(), 1), b"x".as_slice())
                .unwrap();
            keys.insert((b"\xffno index".as_slice(), 1), b"".as_slice())
                .unwrap();
            let first_of = |tag: u8| {
                let first = keys.range((&[tag][..], 0)..).unwrap().next().unwrap();
                let row = first.unwrap();
                let (k, seq) = row.0.value();
                (k.to_vec(), seq)
            };
            let (path_key, path_seq) = first_of(PATH_INDEX_TAG);
            let (time_key, time_seq) = first_of(TIME_INDEX_TAG);
            keys.remove((path_key.as_slice(), path_seq)).unwrap();
            keys.remove((time_key.as_slice(), time_seq)).unwrap();
            drop(keys);
            w.commit(Sync::Durable).unwrap();
            let path = String::from_utf8(path_key[1..].to_vec()).unwrap();
            (seq, path, path_seq, time_seq)
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
        for prefix in [
            "history's path index holds ",
            "history's time index holds ",
            "history_keys holds 1 rows of no index",
        ] {
            assert!(
                found.iter().any(|f| f.starts_with(prefix)),
                "{prefix}: {found:?}"
            );
        }
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("history_keys holds ") && f.contains("account for")),
            "{found:?}"
        );
        assert_eq!(found.len(), 7, "{found:?}");
    }

    /// The check of kept images passes the history once, newest first, rebuilding each
    /// image from the base record it holds: it finds what rebuilding each image through the
    /// key index (as `show` does) finds, with every record held or none (each base then
    /// read through the index), with a link in the middle of a run damaged and with a
    /// file renamed over another (a delta against another inode).
    #[test]
    fn the_kept_image_check_finds_what_each_images_own_rebuild_finds() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let text = |v: usize| format!("{}{v:06}{}", "a".repeat(300), "b".repeat(300));
        // Written and let go by the kernel, so a file renamed over is removed at once.
        let put = |name: &str, v: usize| {
            write(&fs, ROOT_INO, name, &text(v));
            let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
            fs.forget(ino, 2);
        };
        for v in 0..30 {
            put(&format!("f{}.md", v % 3), v);
            if v % 10 == 9 {
                put(".tmp", v + 1000);
                fs.rename(ME, ROOT_INO, b".tmp", ROOT_INO, b"f0.md", 0)
                    .unwrap();
            }
        }
        let kept = |fs: &Fs| -> Vec<(u64, u64, Vec<u8>)> {
            let r = fs.store().read().unwrap();
            let mut out = Vec::new();
            r.for_each_undo(|seq, u| {
                if let Undo::Inode { ino, old: Some(b) } = u
                    && content_kept(b)
                {
                    out.push((seq, *ino, b.clone()));
                }
                Ok(())
            })
            .unwrap();
            out
        };
        let findings = |max: usize| {
            let r = fs.store().read().unwrap();
            let mut found = r.kept_content_findings_holding(max).unwrap();
            found.sort();
            found
        };
        let before = kept(&fs);
        assert!(before.len() >= 20, "{} kept images", before.len());
        assert!(
            before.iter().any(|(_, ino, b)| kept_base(*ino, b) != *ino),
            "a rename over keeps an image against another inode"
        );
        assert_eq!(findings(HELD_RECORDS_MAX), Vec::<String>::new());
        assert_eq!(findings(1), Vec::<String>::new());
        // Damage the kept image in the middle of the history.
        let (seq, ino, _) = before[before.len() / 2].clone();
        let mut record = None;
        fs.store()
            .read()
            .unwrap()
            .for_each_record(|r| {
                if r.seq == seq {
                    record = Some(r);
                }
                Ok(())
            })
            .unwrap();
        let mut record = record.unwrap();
        for u in &mut record.undo {
            if let Undo::Inode {
                ino: i,
                old: Some(b),
            } = u
                && *i == ino
            {
                let n = b.len();
                b[n - 1] ^= 0xff;
            }
        }
        let mut w = fs.store().write().unwrap();
        w.without_history();
        w.put_record(&record).unwrap();
        w.commit(Sync::Durable).unwrap();
        let want: Vec<String> = {
            let r = fs.store().read().unwrap();
            let mut want: Vec<String> = kept(&fs)
                .into_iter()
                .filter(|(seq, ino, b)| r.whole_image(*seq, *ino, b).is_err())
                .map(|(seq, ino, _)| format!(
                    "history record {seq} keeps inode {ino}'s content as the version after it, which does not match its checksum"
                ))
                .collect();
            want.sort();
            want
        };
        assert!(
            want.iter()
                .any(|f| f.starts_with(&format!("history record {seq} ")))
        );
        assert_eq!(findings(HELD_RECORDS_MAX), want);
        assert_eq!(findings(1), want);
    }

    /// The merge of wanted entries with an index finds each one's value, or its absence,
    /// whether the wanted keys are dense, in runs with long gaps between (where it seeks),
    /// before the first entry, past the last, or the index is empty.
    #[test]
    fn the_index_merge_finds_each_wanted_entry_across_gaps_and_runs() {
        const T: redb::TableDefinition<(&[u8], u64), &[u8]> = redb::TableDefinition::new("t");
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("t.redb")).unwrap();
        let mut held = std::collections::BTreeMap::new();
        {
            let w = db.begin_write().unwrap();
            let mut t = w.open_table(T).unwrap();
            for k in 0..20u8 {
                for seq in (0..200u64).step_by(usize::from(k % 3) + 1) {
                    let value = format!("{k}:{seq}");
                    t.insert((&[b'k', k][..], seq), value.as_bytes()).unwrap();
                    held.insert((vec![b'k', k], seq), value.into_bytes());
                }
            }
            drop(t);
            w.commit().unwrap();
        }
        let r = redb::ReadableDatabase::begin_read(&db).unwrap();
        let t = r.open_table(T).unwrap();
        let merged = |wanted: Vec<(Vec<u8>, u64)>| {
            let mut got = Vec::new();
            merge_index(
                &t,
                wanted.clone(),
                |w| (w.0.as_slice(), w.1),
                |w, v| {
                    got.push((w, v.map(<[u8]>::to_vec)));
                },
            )
            .unwrap();
            let want: Vec<_> = wanted
                .into_iter()
                .map(|w| {
                    let v = held.get(&w).cloned();
                    (w, v)
                })
                .collect();
            assert_eq!(got, want);
        };
        // Every entry, and absent ones between them.
        let mut all: Vec<(Vec<u8>, u64)> = (0..21u8)
            .flat_map(|k| (0..201u64).map(move |seq| (vec![b'k', k], seq)))
            .collect();
        all.insert(0, (b"a".to_vec(), 0));
        all.push((b"z".to_vec(), 0));
        merged(all.clone());
        // Runs of a few seqs per key, with the rest of each key's entries between them.
        merged(
            all.iter()
                .filter(|(_, seq)| (90..96).contains(seq))
                .cloned()
                .collect(),
        );
        // Sparse: every 37th.
        merged(all.iter().step_by(37).cloned().collect());
        // Only past the end, only before the start, nothing.
        merged(vec![(b"z".to_vec(), 1)]);
        merged(vec![(b"a".to_vec(), 1)]);
        merged(Vec::new());
    }

    /// An import indexes the directory entries it makes where there was a directory before
    /// it, not the inode and chunk keys of the inodes it handed out nor the entries of the
    /// directories it made: no point before it reaches them. The past still reads right
    /// before and after the import, and after a later edit of an imported file.
    #[test]
    fn an_import_indexes_its_top_entries_only() {
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
        let (mut dirents, mut top) = (0, 0);
        for item in keys.iter().unwrap() {
            let (k, _) = item.unwrap();
            let (key, seq) = k.value();
            match key[0] {
                1 | 3 => {
                    let ino = u64::from_be_bytes(key[1..9].try_into().unwrap());
                    assert_ne!(ino, f1, "a key of an inode only created is indexed");
                }
                2 if key[1..9] == m.to_be_bytes() && seq == created => dirents += 1,
                2 if key[1..9] == ROOT_INO.to_be_bytes() && seq == created => top += 1,
                _ => {}
            }
        }
        assert_eq!(
            dirents, 0,
            "an entry of a directory the import made is indexed"
        );
        assert_eq!(top, 1, "the import's entry in the root is indexed");
        assert_eq!(r.history_index_findings().unwrap(), Vec::<String>::new());

        let read = |seq: u64, name: &str| {
            let past = r.past(seq).unwrap();
            past.lookup(m, name).unwrap().map(|(ino, _)| {
                let size = past.inode(ino).unwrap().unwrap().size;
                let c = past.chunks(ino, 0, size.div_ceil(CHUNK_SIZE)).unwrap();
                String::from_utf8(c.into_iter().flatten().flatten().collect()).unwrap()
            })
        };
        // Before the import its directory is not there, so nothing below it is reached.
        let past = r.past(created - 1).unwrap();
        assert_eq!(past.lookup(ROOT_INO, "m").unwrap(), None);
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

    /// Every value in `table`, with its key's seq.
    fn values_of<K: redb::Key + 'static>(
        r: &ReadTxn,
        def: redb::TableDefinition<K, &[u8]>,
    ) -> Vec<usize> {
        let t = r.tx.open_table(def).unwrap();
        t.iter()
            .unwrap()
            .map(|item| item.unwrap().1.value().len())
            .collect()
    }

    fn parts_of(r: &ReadTxn, seq: u64) -> Vec<u32> {
        let t = r.tx.open_table(HISTORY_UNDO).unwrap();
        t.range((seq, 0)..=(seq, u32::MAX))
            .unwrap()
            .map(|item| item.unwrap().0.value().1)
            .collect()
    }

    /// A history record held its whole undo list in one value: an import of a million files
    /// made one of 85 MB, which a snapshot copied whole and the next commit read whole. Now
    /// a record's entries are in parts of bounded size. Here an import and a rollback of
    /// 5,000 files (blobs and all) each make a record of several parts: no value in
    /// `history` or `history_undo` exceeds the bound; rolling back and forth restores the
    /// tree exactly; `check` passes, and finds a part deleted, damaged or orphaned; expiry
    /// drops every part and every blob reference the records kept.
    #[test]
    fn large_records_are_kept_in_bounded_parts() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let mut want = std::collections::BTreeMap::new();
        for d in 0..50 {
            std::fs::create_dir_all(src.join(format!("d{d:02}"))).unwrap();
            for f in 0..100 {
                let path = format!("d{d:02}/f{f:03}.md");
                let text = format!("{path} ").repeat(300);
                std::fs::write(src.join(&path), &text).unwrap();
                want.insert(path, text);
            }
        }
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let limits = Limits::default();
        crate::tools::import(&store, &limits, &src, "/", true, &mut |_| {}).unwrap();
        let fs = Fs::new(store, limits).unwrap();
        let imported = fs.store().read().unwrap().last_seq().unwrap();
        let tree = |fs: &Fs| {
            let mut got = std::collections::BTreeMap::new();
            let r = fs.store().read().unwrap();
            for d in r.list(ROOT_INO).unwrap() {
                if d.kind != Kind::Dir {
                    continue;
                }
                for f in r.list(d.ino).unwrap() {
                    let size = r.inode(f.ino).unwrap().unwrap().size;
                    let c = r.chunks(f.ino, 0, size.div_ceil(CHUNK_SIZE)).unwrap();
                    let text = String::from_utf8(c.into_iter().flatten().flatten().collect());
                    got.insert(format!("{}/{}", d.name, f.name), text.unwrap());
                }
            }
            got
        };
        let check = |fs: &Fs| crate::check::invariants(&fs.store().read().unwrap()).unwrap();
        assert_eq!(tree(&fs), want);

        fs.rollback(ME, 0).unwrap();
        let rolled = fs.store().read().unwrap().last_seq().unwrap();
        assert!(tree(&fs).is_empty());
        fs.rollback(ME, imported).unwrap();
        assert_eq!(
            tree(&fs),
            want,
            "rolled forward again, the tree is as imported"
        );
        let back = fs.store().read().unwrap().last_seq().unwrap();
        {
            let r = fs.store().read().unwrap();
            // The import only created: its tree is one `Created` entry, small enough to be
            // held in the record's own value (no part).
            assert_eq!(parts_of(&r, imported), Vec::<u32>::new());
            for seq in [rolled, back] {
                let n = parts_of(&r, seq).len();
                assert!(n >= 2, "record {seq} has {n} parts");
                assert_eq!(parts_of(&r, seq), (0..n as u32).collect::<Vec<_>>());
            }
            let parts = values_of(&r, HISTORY_UNDO);
            let headers = values_of(&r, HISTORY);
            assert!(parts.iter().all(|&n| n <= UNDO_PART_BYTES), "{parts:?}");
            assert!(headers.iter().all(|&n| n <= 1024), "{headers:?}");
            // The rollback's record keeps the blobs of the files it removed.
            let blob_refs = r
                .history_of(None, None, usize::MAX)
                .unwrap()
                .into_iter()
                .find(|h| h.seq == rolled)
                .unwrap()
                .undo
                .iter()
                .filter(|u| matches!(u, Undo::Filemap { old: Some(_), .. }))
                .count();
            assert_eq!(blob_refs, want.len());
        }
        assert_eq!(check(&fs), Vec::<String>::new());

        // A part deleted, damaged, or left without its record: check says which.
        let saved = {
            let r = fs.store().read().unwrap();
            let t = r.tx.open_table(HISTORY_UNDO).unwrap();
            t.get((rolled, 1)).unwrap().unwrap().value().to_vec()
        };
        type Parts<'t> = redb::Table<'t, (u64, u32), &'static [u8]>;
        let change = |f: &dyn Fn(&mut Parts<'_>)| {
            let mut w = fs.store().write().unwrap();
            w.without_history();
            f(&mut w.tx.open_table(HISTORY_UNDO).unwrap());
            w.commit(Sync::Durable).unwrap();
        };
        change(&|t| {
            t.remove((rolled, 1)).unwrap();
        });
        assert_eq!(
            check(&fs),
            vec![format!(
                "history record {rolled} lacks part 1 of its undo entries"
            )]
        );
        change(&|t| {
            t.insert((rolled, 1), &saved[..saved.len() - 3]).unwrap();
        });
        assert_eq!(
            check(&fs),
            vec![format!("part 1 of history record {rolled} does not decode")]
        );
        change(&|t| {
            t.insert((rolled, 1), saved.as_slice()).unwrap();
            t.insert((back + 100, 0), saved.as_slice()).unwrap();
        });
        assert_eq!(
            check(&fs),
            vec![format!(
                "history_undo holds part 0 of record {}, which does not exist",
                back + 100
            )]
        );
        change(&|t| {
            t.remove((back + 100, 0)).unwrap();
        });
        assert_eq!(check(&fs), Vec::<String>::new());

        // Expiry drops the records, their parts, and the blob references they held.
        fs.store().set_keep_history(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        write(&fs, ROOT_INO, "late.md", "late");
        let r = fs.store().read().unwrap();
        for seq in [imported, rolled, back] {
            assert_eq!(parts_of(&r, seq), Vec::<u32>::new(), "record {seq}");
        }
        assert!(r.history(0..=back).unwrap().is_empty());
        assert_eq!(crate::check::invariants(&r).unwrap(), Vec::<String>::new());
        drop(r);
        assert_eq!(tree(&fs), want);
    }

    /// A format-5 store's records hold their undo lists whole (version 1), and are read as
    /// they are: the past, `check`, a rollback and expiry work on them as on records kept in
    /// parts, side by side.
    #[test]
    fn whole_records_of_format_5_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let versions: Vec<String> = (0..4).map(|i| format!("v{i} ").repeat(1000)).collect();
        let mut points = Vec::new();
        for v in &versions {
            write(&fs, ROOT_INO, "f.md", v);
            write(&fs, ROOT_INO, "small.md", &v[..10]);
            points.push(fs.store().read().unwrap().last_seq().unwrap());
        }
        // Every record as a format-5 build wrote it: whole, no parts.
        {
            let records = fs
                .store()
                .read()
                .unwrap()
                .history_of(None, None, usize::MAX)
                .unwrap();
            let mut w = fs.store().write().unwrap();
            w.without_history();
            for r in &records {
                w.put_history_value(r.seq, &r.encode_whole()).unwrap();
                let mut t = w.tx.open_table(HISTORY_UNDO).unwrap();
                for p in 0..r.undo_parts.unwrap_or(0) {
                    t.remove((r.seq, p)).unwrap();
                }
            }
            w.commit(Sync::Durable).unwrap();
        }
        let check = |fs: &Fs| crate::check::invariants(&fs.store().read().unwrap()).unwrap();
        {
            let r = fs.store().read().unwrap();
            use redb::ReadableTableMetadata;
            assert_eq!(r.tx.open_table(HISTORY_UNDO).unwrap().len().unwrap(), 0);
            let ino = fs.lookup(ROOT_INO, b"small.md").unwrap().ino;
            for (v, &seq) in versions.iter().zip(&points) {
                let past = r.past(seq).unwrap();
                let c = past.chunks(ino, 0, 1).unwrap();
                assert_eq!(c, vec![Some(v.as_bytes()[..10].to_vec())], "@{seq}");
            }
        }
        assert_eq!(check(&fs), Vec::<String>::new());
        fs.rollback(ME, points[0]).unwrap();
        let read = |name: &[u8]| {
            let ino = fs.lookup(ROOT_INO, name).unwrap().ino;
            let r = fs.store().read().unwrap();
            let size = r.inode(ino).unwrap().unwrap().size;
            let c = r.chunks(ino, 0, size.div_ceil(CHUNK_SIZE)).unwrap();
            String::from_utf8(c.into_iter().flatten().flatten().collect()).unwrap()
        };
        assert_eq!(read(b"f.md"), versions[0]);
        assert_eq!(read(b"small.md"), versions[0][..10]);
        assert_eq!(check(&fs), Vec::<String>::new());
        fs.store().set_keep_history(1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        write(&fs, ROOT_INO, "late.md", "late");
        assert_eq!(check(&fs), Vec::<String>::new());
        let r = fs.store().read().unwrap();
        assert_eq!(r.first_seq().unwrap(), Some(r.last_seq().unwrap()));
    }

    /// The tree below `/` as (path, kind, content) rows, for comparing whole stores.
    fn tree_rows(r: &ReadTxn) -> Vec<(String, bool, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT_INO, String::new())];
        while let Some((dir, path)) = stack.pop() {
            for e in r.list(dir).unwrap() {
                let p = format!("{path}/{}", e.name);
                let i = r.inode(e.ino).unwrap().unwrap();
                let content = match e.kind {
                    Kind::Dir => {
                        stack.push((e.ino, p.clone()));
                        Vec::new()
                    }
                    Kind::File => r
                        .chunks(e.ino, 0, i.size.div_ceil(CHUNK_SIZE))
                        .unwrap()
                        .into_iter()
                        .flatten()
                        .flatten()
                        .collect(),
                };
                out.push((
                    format!("{p} {:o} {}", i.perm, i.nlink),
                    e.kind == Kind::Dir,
                    content,
                ));
            }
        }
        out.sort();
        out
    }

    /// A source tree of `dirs` directories with `files` files each (one of them larger than
    /// a chunk, so it has blobs), and a nested directory.
    fn source_tree(root: &Path, dirs: usize, files: usize) {
        for d in 0..dirs {
            let dir = root.join(format!("d{d}"));
            std::fs::create_dir_all(dir.join("deeper")).unwrap();
            std::fs::write(dir.join("deeper/leaf.md"), format!("leaf {d}")).unwrap();
            for f in 0..files {
                std::fs::write(dir.join(format!("f{f}.md")), format!("file {d}/{f}")).unwrap();
            }
        }
        std::fs::write(
            root.join("d0/big.bin"),
            vec![7u8; CHUNK_SIZE as usize * 2 + 5],
        )
        .unwrap();
    }

    /// An import that only creates records its new tree as one `Created` entry, plus the
    /// entries naming it from outside: rolling back to before it brings back exactly the
    /// tree before it (what was there already untouched, usage and aggregates as they
    /// were), `check` finds nothing at each step, and rolling back the
    /// rollback brings the import back whole.
    #[test]
    fn an_import_records_its_tree_compactly_and_rolls_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        source_tree(&src, 5, 10);
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let limits = Limits::default();
        let fs = Fs::new(store, limits.clone()).unwrap();
        // What was there before: a file at the top and one in a directory the import
        // adds to.
        let d0 = fs.mkdir(ME, ROOT_INO, b"d0", 0o755, 0).unwrap().ino;
        write(&fs, d0, "old.md", "old");
        write(&fs, ROOT_INO, "top.md", "top");
        let check = |fs: &Fs| {
            let r = fs.store().read().unwrap();
            let mut f = crate::check::invariants(&r).unwrap();
            f.extend(r.history_index_findings().unwrap());
            f.extend(r.undo_part_findings().unwrap());
            f
        };
        let before = fs.store().read().unwrap().last_seq().unwrap();
        let rows_before = tree_rows(&fs.store().read().unwrap());
        let usage_before = fs.store().read().unwrap().usage().unwrap();
        crate::tools::import(fs.store(), &limits, &src, "/", true, &mut |_| {}).unwrap();
        let imported = fs.store().read().unwrap().last_seq().unwrap();
        let rows_after = tree_rows(&fs.store().read().unwrap());
        assert_eq!(check(&fs), Vec::<String>::new());
        {
            let r = fs.store().read().unwrap();
            let rec = r.history(imported..=imported).unwrap().remove(0);
            let mut undo = Vec::new();
            r.for_each_undo(|seq, u| {
                if seq == imported {
                    undo.push(u.clone());
                }
                Ok(())
            })
            .unwrap();
            assert_eq!(rec.undo_len, undo.len() as u64);
            assert_eq!(
                undo.iter()
                    .filter(|u| matches!(u, Undo::Created { .. }))
                    .count(),
                1,
                "{undo:?}"
            );
            // 4 new top entries (d1..d4) and d0's entries made in an old directory (10
            // files, deeper, big.bin), the two directories' records, and the range.
            assert!(undo.len() < 24, "{} entries: {undo:?}", undo.len());
        }
        fs.rollback(ME, before).unwrap();
        assert_eq!(tree_rows(&fs.store().read().unwrap()), rows_before);
        assert_eq!(fs.store().read().unwrap().usage().unwrap(), usage_before);
        assert_eq!(check(&fs), Vec::<String>::new());
        fs.rollback(ME, imported).unwrap();
        assert_eq!(tree_rows(&fs.store().read().unwrap()), rows_after);
        assert_eq!(check(&fs), Vec::<String>::new());
        // And the import's own record still undoes right after more history on top.
        write(&fs, ROOT_INO, "later.md", "later");
        fs.rollback(ME, before).unwrap();
        assert_eq!(tree_rows(&fs.store().read().unwrap()), rows_before);
        assert_eq!(check(&fs), Vec::<String>::new());
    }

    /// The past at a path a compactly recorded import created: absent before it, its
    /// content right after it, and a later edit seen from then on; `log` of the path lists
    /// the import; `revert` of a created
    /// directory to before the import removes it, and of a file to the import's point
    /// brings its imported content back.
    #[test]
    fn the_past_of_a_path_a_compact_import_created() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        source_tree(&src, 3, 20);
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let limits = Limits::default();
        let fs = Fs::new(store, limits.clone()).unwrap();
        write(&fs, ROOT_INO, "top.md", "top");
        let before = fs.store().read().unwrap().last_seq().unwrap();
        crate::tools::import(fs.store(), &limits, &src, "/", true, &mut |_| {}).unwrap();
        let imported = fs.store().read().unwrap().last_seq().unwrap();
        let d1 = fs.lookup(ROOT_INO, b"d1").unwrap().ino;
        let deeper = fs.lookup(d1, b"deeper").unwrap().ino;
        write(&fs, d1, "f3.md", "edited");
        let edited = fs.store().read().unwrap().last_seq().unwrap();
        let r = fs.store().read().unwrap();
        let read = |seq: u64, parent: u64, name: &str| {
            let past = r.past(seq).unwrap();
            past.lookup(parent, name).unwrap().map(|(ino, _)| {
                let size = past.inode(ino).unwrap().unwrap().size;
                let c = past.chunks(ino, 0, size.div_ceil(CHUNK_SIZE)).unwrap();
                String::from_utf8(c.into_iter().flatten().flatten().collect()).unwrap()
            })
        };
        assert_eq!(
            r.past(before).unwrap().lookup(ROOT_INO, "d1").unwrap(),
            None
        );
        assert_eq!(read(imported, d1, "f3.md").as_deref(), Some("file 1/3"));
        assert_eq!(read(imported, deeper, "leaf.md").as_deref(), Some("leaf 1"));
        assert_eq!(read(edited, d1, "f3.md").as_deref(), Some("edited"));
        let names: Vec<String> = r
            .past(imported)
            .unwrap()
            .list(d1)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names.len(), 21, "{names:?}");
        // `log PATH` of a path it made finds the import, by the directory it went below.
        let log: Vec<(u64, String)> = r
            .history_of(Some("/d1/deeper/leaf.md"), None, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|h| (h.seq, h.op))
            .collect();
        assert!(log.contains(&(imported, "import".to_string())), "{log:?}");
        drop(r);
        fs.revert(ME, "/d1/f3.md", imported).unwrap();
        let f3 = fs.lookup(d1, b"f3.md").unwrap().ino;
        let r = fs.store().read().unwrap();
        let c = r.chunks(f3, 0, 1).unwrap();
        assert_eq!(c, vec![Some(b"file 1/3".to_vec())]);
        drop(r);
        fs.revert(ME, "/d2", before).unwrap();
        assert!(fs.lookup(ROOT_INO, b"d2").is_err());
        let r = fs.store().read().unwrap();
        assert_eq!(crate::check::invariants(&r).unwrap(), Vec::<String>::new());
        assert_eq!(r.history_index_findings().unwrap(), Vec::<String>::new());
    }

    /// `check` reports a `Created` entry naming inodes the counter has not handed out (the
    /// only thing such an entry says that the store can contradict).
    #[test]
    fn check_reports_a_created_range_beyond_the_inode_counter() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
        store.set_keep_history(86_400 * 1_000_000_000).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        write(&fs, ROOT_INO, "f.md", "x");
        let seq = fs.store().read().unwrap().last_seq().unwrap();
        {
            let r = fs.store().read().unwrap();
            let mut rec = r.history(seq..=seq).unwrap().remove(0);
            r.for_each_undo(|s, u| {
                if s == seq {
                    rec.undo.push(u.clone());
                }
                Ok(())
            })
            .unwrap();
            drop(r);
            rec.undo.push(Undo::Created {
                from: 5,
                to: 1 << 40,
            });
            let mut w = fs.store().write().unwrap();
            w.without_history();
            w.put_record(&rec).unwrap();
            w.commit(Sync::Durable).unwrap();
        }
        let r = fs.store().read().unwrap();
        let findings = crate::check::invariants(&r).unwrap();
        assert!(
            findings
                .iter()
                .any(|f| f.contains("created inodes 5..1099511627776")),
            "{findings:?}"
        );
    }
}
