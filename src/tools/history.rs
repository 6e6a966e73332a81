//! History: resolving a point (a seq, a mark, a date or a duration ago), and `log`, `show`
//! and `diff` of what the store held at a point.

use similar::TextDiff;

use super::common::{Result, err, lookup_path, parse_date, parse_duration, read_content};
use crate::store::{Kind, ReadTxn, TreeView, now_ns};

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

/// `show`: a file's content at a point.
pub fn show_at(r: &ReadTxn, path: &str, seq: u64) -> Result<Vec<u8>> {
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
    read_content(&then, &inode)
}

/// A file's text at a point, or None where it did not exist.
fn text_at(r: &ReadTxn, path: &str, seq: Option<u64>) -> Result<Option<String>> {
    fn get(r: &impl TreeView, path: &str) -> Result<Option<String>> {
        match lookup_path(r, path) {
            Ok((inode, _)) if inode.kind == Kind::File => Ok(Some(
                String::from_utf8_lossy(&read_content(r, &inode)?).into_owned(),
            )),
            Ok((_, canon)) => Err(format!("{canon}: is a directory")),
            Err(_) => Ok(None),
        }
    }
    match seq {
        Some(s) => get(&r.past(s).map_err(err)?, path),
        None => get(r, path),
    }
}

/// `diff`: a unified diff of a file between two points (`to` None: now).
pub fn diff(r: &ReadTxn, path: &str, from: u64, to: Option<u64>) -> Result<String> {
    let a = text_at(r, path, Some(from))?;
    let b = text_at(r, path, to)?;
    let label = |text: &Option<String>, s: Option<u64>| match (text, s) {
        (None, _) => format!("{path} (absent)"),
        (Some(_), None) => format!("{path} (now)"),
        (Some(_), Some(s)) => format!("{path} (@{s})"),
    };
    Ok(unified(
        a.as_deref().unwrap_or(""),
        b.as_deref().unwrap_or(""),
        &label(&a, Some(from)),
        &label(&b, to),
    ))
}

/// The unified diff of `a` and `b` with three lines of context; empty when they are equal.
fn unified(a: &str, b: &str, a_label: &str, b_label: &str) -> String {
    if a == b {
        return String::new();
    }
    TextDiff::from_lines(a, b)
        .unified_diff()
        .context_radius(3)
        .header(a_label, b_label)
        .to_string()
}

/// The time of a point given as a time, or of the record a seq or mark names.
pub(super) fn point_time(r: &ReadTxn, spec: &str) -> Result<i64> {
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
