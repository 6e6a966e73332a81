//! History: resolving a point (a seq, a mark, a date or a duration ago), `log` a page at a
//! time, and `show` and `diff` of what the store held at a point.
//!
//! Invariant kept here: a page of `log` is read from one read transaction and answers where
//! the next page starts, so a whole log is any number of short transactions, each ended
//! before its page is printed or sent.

use serde::{Deserialize, Serialize};
use similar::TextDiff;

use super::common::{
    ContentSink, Result, err, lookup_path, parse_date, parse_duration, read_content, stream_content,
};
use crate::store::{HistoryRecord, Kind, LogCursor, ReadTxn, TreeView, now_ns};

/// The most records one page of `log` holds, whatever it asks for: the memory a page takes
/// (in the daemon and in its answer) stays bounded however long the history.
pub const LOG_PAGE_MAX: u64 = 10_000;

/// A `log` request (`{"op":"log", ...}` on the control socket): the whole store's log or
/// `path`'s, records no older than `since` (a point, resolved by the first page) or
/// `since_ns` (resolved already), at most `limit` of them, from `cursor` (None: the newest).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LogQuery {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub since: Option<String>,
    #[serde(default)]
    pub since_ns: Option<i64>,
    #[serde(default)]
    pub limit: Option<u64>,
    #[serde(default)]
    pub cursor: Option<LogCursor>,
}

/// One page of `log`: records newest first; where the next page starts (None: the log is
/// complete); the `since` bound as the first page resolved it, which later pages reuse so a
/// duration ago (`1h`) names one instant for the whole log; and the newest seq.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LogPage {
    pub records: Vec<HistoryRecord>,
    pub cursor: Option<LogCursor>,
    pub since_ns: Option<i64>,
    pub last_seq: u64,
}

impl LogQuery {
    /// The query that reads the page after `page`, with `limit` records at most.
    pub fn after(&self, page: &LogPage, limit: u64) -> LogQuery {
        LogQuery {
            since_ns: page.since_ns,
            cursor: page.cursor.clone(),
            limit: Some(limit),
            ..self.clone()
        }
    }
}

/// Records in the first page of a whole log (its first line comes at once); each later page
/// holds ten times more, up to `LOG_PAGE_MAX`.
const LOG_PAGE_FIRST: u64 = 100;

/// Reads the log `q` asks for page by page: `read` reads the page a query names (each in a
/// read transaction of its own on the daemon), `on_page` hears it, with whether it is the
/// last, and says whether to go on.
pub fn log_pages(
    q: &LogQuery,
    mut read: impl FnMut(&LogQuery) -> Result<LogPage>,
    mut on_page: impl FnMut(&LogPage, bool) -> Result<bool>,
) -> Result<()> {
    let mut left = q.limit.unwrap_or(u64::MAX);
    let mut size = LOG_PAGE_FIRST;
    let mut q = LogQuery {
        limit: Some(size.min(left)),
        ..q.clone()
    };
    loop {
        let page = read(&q)?;
        left = left.saturating_sub(page.records.len() as u64);
        let last = page.cursor.is_none() || left == 0;
        if !on_page(&page, last)? || last {
            return Ok(());
        }
        size = (size * 10).min(LOG_PAGE_MAX);
        q = q.after(&page, size.min(left));
    }
}

/// One page of `log` (at most `LOG_PAGE_MAX` records) from one read transaction.
pub fn log_page(r: &ReadTxn, q: &LogQuery) -> Result<LogPage> {
    let since_ns = match (q.since_ns, q.since.as_deref()) {
        (Some(ns), _) => Some(ns),
        (None, Some(spec)) => Some(point_time(r, spec)?),
        (None, None) => None,
    };
    let cursor = match &q.cursor {
        Some(c) => c.clone(),
        None => LogCursor::start(q.path.as_deref()),
    };
    let limit = q.limit.unwrap_or(LOG_PAGE_MAX).min(LOG_PAGE_MAX) as usize;
    let (records, cursor) = r.history_page(&cursor, since_ns, limit).map_err(err)?;
    Ok(LogPage {
        records,
        cursor,
        since_ns,
        last_seq: r.last_seq().map_err(err)?,
    })
}

/// Resolves a point in history: a seq number (`42` or `@42`), a mark name, or a time
/// (`2026-01-31`, `2026-01-31T08:00:00Z`, or `30m` / `2h` / `1d` ago). The point is the state
/// after that record committed; 0 is the empty store before any record.
pub fn resolve_point(r: &ReadTxn, spec: &str) -> Result<u64> {
    let spec = spec.trim();
    let digits = spec.trim_start_matches('@');
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        let seq: u64 = digits.parse().map_err(err)?;
        let last = r.last_seq().map_err(err)?;
        if seq > last {
            return Err(format!(
                "history has no record {seq} yet (the newest is {last})"
            ));
        }
        return Ok(seq);
    }
    if let Some(seq) = r
        .mark(spec.strip_prefix("mark:").unwrap_or(spec))
        .map_err(err)?
    {
        return Ok(seq);
    }
    let at = match parse_duration(spec) {
        Ok(ago) if spec.ends_with(|c: char| c.is_ascii_alphabetic()) => now_ns() - ago,
        _ => parse_date(spec).map_err(|_| {
            format!(
                "{spec:?} is neither a history seq, a mark, a date nor a duration ago (30m, 2h, 1d)"
            )
        })?,
    };
    // The newest record at or before that time.
    r.seq_at_time(at).map_err(err)
}

/// Runs `f` on the store as it was at `seq` (see `ReadTxn::at_point`).
pub fn at_point<T>(r: &ReadTxn, seq: u64, f: impl FnOnce(&ReadTxn) -> Result<T>) -> Result<T> {
    r.at_point(seq, f)
}

/// `show`: a file's content at a point, whole (see `stream_show`).
pub fn show_at(r: &ReadTxn, path: &str, seq: u64) -> Result<Vec<u8>> {
    let mut whole = Vec::new();
    stream_show(r, path, seq, &mut whole)?;
    Ok(whole)
}

/// `show`: a file's content at a point, into `sink` a chunk at a time (a chunk of a past
/// version is rebuilt from its own deltas: the whole version is never held).
pub fn stream_show(r: &ReadTxn, path: &str, seq: u64, sink: &mut dyn ContentSink) -> Result<()> {
    let then = r.past(seq).map_err(err)?;
    let (inode, canon) = lookup_path(&then, path).map_err(|e| format!("at {seq}: {e}"))?;
    if inode.kind != Kind::File {
        return Err(format!("{canon}: is a directory"));
    }
    if then.content_redacted(inode.ino).map_err(err)? {
        return Err(format!(
            "{canon} at {seq}: this version's content was redacted"
        ));
    }
    sink.start(inode.size)?;
    stream_content(&then, &inode, sink)
}

/// The largest version `diff` compares. A diff holds both versions whole, their diff and its
/// answer line (in the daemon, for a mounted store), so it is bounded where `cat` and `show`
/// stream: two 256 MiB versions would have taken the daemon well over a GiB.
/// At 2 MiB, 16 connections diffing at once hold at most about 0.4 GiB; a memory is a few KB.
pub const DIFF_MAX_BYTES: u64 = 2 * 1024 * 1024;

/// A file's text at a point, or None where it did not exist; refused over `DIFF_MAX_BYTES`
/// before a byte of it is read.
fn text_at(r: &ReadTxn, path: &str, seq: Option<u64>) -> Result<Option<String>> {
    fn get(r: &impl TreeView, path: &str, when: &str) -> Result<Option<String>> {
        let inode = match lookup_path(r, path) {
            Ok((inode, _)) if inode.kind == Kind::File => inode,
            Ok((_, canon)) => return Err(format!("{canon}: is a directory")),
            Err(_) => return Ok(None),
        };
        if inode.size > DIFF_MAX_BYTES {
            return Err(format!(
                "{path} is {} bytes {when}: diff compares versions of at most {DIFF_MAX_BYTES} \
                 bytes; write each with `redbfs show --at` (or `cat`) and compare them with \
                 diff(1)",
                inode.size
            ));
        }
        let bytes = read_content(r, &inode)?;
        Ok(Some(String::from_utf8(bytes).unwrap_or_else(|e| {
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        })))
    }
    match seq {
        Some(s) => get(&r.past(s).map_err(err)?, path, &format!("at @{s}")),
        None => get(r, path, "now"),
    }
}

/// `diff`: a unified diff of a file between two points (`to` None: now). A version with a
/// NUL byte is binary: as diff(1) does, the answer says only whether the two differ (a
/// sparse file's zeros, escaped in the answer, made it six times the file).
pub fn diff(r: &ReadTxn, path: &str, from: u64, to: Option<u64>) -> Result<String> {
    let a = text_at(r, path, Some(from))?;
    let b = text_at(r, path, to)?;
    let label = |text: &Option<String>, s: Option<u64>| match (text, s) {
        (None, _) => format!("{path} (absent)"),
        (Some(_), None) => format!("{path} (now)"),
        (Some(_), Some(s)) => format!("{path} (@{s})"),
    };
    let binary = |t: &Option<String>| t.as_deref().is_some_and(|t| t.contains('\0'));
    if binary(&a) || binary(&b) {
        return Ok(if a == b {
            String::new()
        } else {
            format!(
                "Binary files {} and {} differ\n",
                label(&a, Some(from)),
                label(&b, to)
            )
        });
    }
    Ok(unified(
        a.as_deref().unwrap_or(""),
        b.as_deref().unwrap_or(""),
        &label(&a, Some(from)),
        &label(&b, to),
    ))
}

/// How long `diff` looks for the smallest diff before it settles for a larger one.
const DIFF_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// The unified diff of `a` and `b` with three lines of context; empty when they are equal.
fn unified(a: &str, b: &str, a_label: &str, b_label: &str) -> String {
    if a == b {
        return String::new();
    }
    // Myers' diff costs the product of the lengths at worst (a 2 MB file rewritten took two
    // minutes of the daemon's time, a read transaction held): past the deadline it finishes
    // with a coarser diff, still a correct one.
    TextDiff::configure()
        .timeout(DIFF_DEADLINE)
        .diff_lines(a, b)
        .unified_diff()
        .context_radius(3)
        .header(a_label, b_label)
        .to_string()
}

/// The time of a point given as a time, or of the record a seq or mark names.
fn point_time(r: &ReadTxn, spec: &str) -> Result<i64> {
    if let Ok(ago) = parse_duration(spec)
        && spec.ends_with(|c: char| c.is_ascii_alphabetic())
    {
        return Ok(now_ns() - ago);
    }
    if let Ok(t) = parse_date(spec) {
        return Ok(t);
    }
    let seq = resolve_point(r, spec)?;
    Ok(r.history(seq..=seq)
        .map_err(err)?
        .first()
        .map_or(0, |rec| rec.time))
}

#[cfg(test)]
mod tests {
    use super::unified;

    /// Two texts with no line in common are the diff's worst case (its cost the product of
    /// their lengths): past its deadline it still gives a correct diff, every line of one
    /// removed and every line of the other added.
    #[test]
    fn a_diff_past_its_deadline_is_still_whole() {
        let a: String = (0..20_000).map(|i| format!("a{i}\n")).collect();
        let b: String = (0..20_000).map(|i| format!("b{i}\n")).collect();
        let d = unified(&a, &b, "x", "y");
        let count = |c: char, not: &str| {
            d.lines()
                .filter(|l| l.starts_with(c) && !l.starts_with(not))
                .count()
        };
        assert_eq!(count('-', "---"), 20_000);
        assert_eq!(count('+', "+++"), 20_000);
    }

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified("a\nb\n", "a\nb\n", "x", "y"), "");
    }

    #[test]
    fn one_changed_line() {
        let d = unified("a\nb\nc\n", "a\nB\nc\n", "old", "new");
        assert_eq!(d, "--- old\n+++ new\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n");
    }

    #[test]
    fn from_nothing() {
        assert_eq!(
            unified("", "x\n", "old", "new"),
            "--- old\n+++ new\n@@ -0,0 +1 @@\n+x\n"
        );
    }

    #[test]
    fn a_missing_final_newline_is_said() {
        assert_eq!(
            unified("x\n", "x", "old", "new"),
            "--- old\n+++ new\n@@ -1 +1 @@\n-x\n+x\n\\ No newline at end of file\n"
        );
    }
}
