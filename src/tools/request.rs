//! The JSON requests the control socket and the CLI share: `query` (read-only: inspection,
//! `check`, history, `unused`) and `history_change`. This is the one module that dispatches
//! to several families; no family imports it.

use std::path::Path;

use super::backup::{snapshot, snapshot_subtree};
use super::common::{ContentSink, EntryInfo, Result, Walk, err};
use super::history::{LogQuery, at_point, diff, log_page, resolve_point, stream_show};
use super::inspection::{du, quotas, stats, stream_cat};
use crate::store::ReadTxn;

/// Answers a read-only request (`ls`, `cat`, `tree`, `du`, `stats`, `check`, `unused`) from
/// one read transaction. The daemon answers these for a mounted store and the CLI for an
/// unmounted one, so both print the same. `cat` and `show` answer here in one line only up
/// to `WHOLE_CONTENT_MAX`, and `ls`, `tree` and `unused` only up to `WHOLE_LISTING_MAX`; the
/// CLI streams them (`content`, `listing`).
pub fn query(r: &ReadTxn, store_bytes: u64, req: &serde_json::Value) -> Result<serde_json::Value> {
    use serde_json::{Value, json};
    let path = req.get("path").and_then(Value::as_str).unwrap_or("/");
    let v = match req.get("op").and_then(Value::as_str).unwrap_or("") {
        "ls" | "tree" | "unused" => whole_listing(r, req)?,
        "cat" | "show" => content_json(whole_content(r, req)?),
        "du" => json!({"du": du(r, path)?}),
        "stats" => json!({"stats": stats(r, store_bytes)?}),
        "quotas" => json!({"quotas": quotas(r)?}),
        "check" => json!({"findings": crate::check::invariants(r).map_err(err)?}),
        "log" => {
            let q: LogQuery =
                serde_json::from_value(req.clone()).map_err(|e| format!("log: {e}"))?;
            serde_json::to_value(log_page(r, &q)?).map_err(err)?
        }
        "diff" => {
            let from = resolve_point(
                r,
                req.get("from")
                    .and_then(Value::as_str)
                    .ok_or("diff needs \"from\"")?,
            )?;
            let to = match req.get("to").and_then(Value::as_str) {
                Some(spec) => Some(resolve_point(r, spec)?),
                None => None,
            };
            json!({"diff": diff(r, path, from, to)?})
        }
        "marks" => json!({"marks": r.marks().map_err(err)?}),
        other => return Err(format!("unknown query {other:?}")),
    };
    Ok(v)
}

/// The key under which the entries of a listing (`ls`, `tree`, `unused`) go, in its one-line
/// answer and in each page of its stream; None for a request that is not a listing.
pub fn listing_key(req: &serde_json::Value) -> Option<&'static str> {
    match req.get("op").and_then(serde_json::Value::as_str)? {
        "ls" => Some("entries"),
        "tree" => Some("tree"),
        "unused" => Some("files"),
        _ => None,
    }
}

/// One entry of `tree`, as its answer holds it.
#[derive(serde::Serialize)]
struct TreeItem<'e> {
    depth: usize,
    entry: &'e EntryInfo,
}

/// Hands the entries of the listing an `ls`, `tree` or `unused` request asks for to `item`,
/// one at a time, each as its JSON (an element of the answer's array), all from `r`: the walk
/// holds a bounded state (`Walk`) and one entry's JSON, whatever the listing's length.
/// `unused` lists the files below `path` used (read or written) last before `cutoff_ns`, each
/// as `[path, last use]`.
pub fn listing(
    r: &ReadTxn,
    req: &serde_json::Value,
    item: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    use serde_json::Value;
    let path = req.get("path").and_then(Value::as_str).unwrap_or("/");
    let mut json = Vec::new();
    let mut give = |json_of: &dyn Fn(&mut Vec<u8>) -> serde_json::Result<()>| -> Result<()> {
        json.clear();
        json_of(&mut json).map_err(err)?;
        item(&json)
    };
    match req.get("op").and_then(Value::as_str).unwrap_or("") {
        "ls" => {
            for e in Walk::dir(r, path)? {
                let (_, entry) = e?;
                give(&|out| serde_json::to_writer(out, &entry))?;
            }
        }
        "tree" => {
            for e in Walk::tree(r, path)? {
                let (depth, entry) = e?;
                give(&|out| {
                    serde_json::to_writer(
                        out,
                        &TreeItem {
                            depth,
                            entry: &entry,
                        },
                    )
                })?;
            }
        }
        "unused" => {
            let cutoff = req
                .get("cutoff_ns")
                .and_then(Value::as_i64)
                .ok_or("unused needs cutoff_ns")?;
            for e in Walk::tree(r, path)? {
                let (_, e) = e?;
                let last = e.atime_ns.max(e.mtime_ns);
                if e.kind == "file" && last < cutoff {
                    give(&|out| serde_json::to_writer(out, &(&e.path, last)))?;
                }
            }
        }
        other => return Err(format!("{other:?} is not a listing")),
    }
    Ok(())
}

/// The most JSON a listing's one-line answer holds, for a client that does not ask for a
/// stream (an older redbfs talking to this daemon): a longer listing is refused as soon as
/// it passes this, so no such request makes the daemon hold a listing whole.
pub const WHOLE_LISTING_MAX: usize = 1024 * 1024;

/// The one-line answer to a listing, up to `WHOLE_LISTING_MAX` bytes of JSON.
fn whole_listing(r: &ReadTxn, req: &serde_json::Value) -> Result<serde_json::Value> {
    let key = listing_key(req).ok_or("not a listing")?;
    let path = req
        .get("path")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("/");
    let mut whole = b"[".to_vec();
    listing(r, req, &mut |item| {
        if whole.len() + item.len() + 2 > WHOLE_LISTING_MAX {
            return Err(format!(
                "the listing of {path} is over {WHOLE_LISTING_MAX} bytes: a listing this long \
                 is only streamed (the redbfs of this daemon's release asks for a stream; an \
                 older one does not: upgrade it)"
            ));
        }
        if whole.len() > 1 {
            whole.push(b',');
        }
        whole.extend_from_slice(item);
        Ok(())
    })?;
    whole.push(b']');
    let entries: serde_json::Value = serde_json::from_slice(&whole).map_err(err)?;
    Ok(serde_json::json!({ key: entries }))
}

/// Streams the content a `cat` or `show` request asks for into `sink`, all of it from `r`: one
/// version of the file, whatever commits while it streams.
pub fn content(r: &ReadTxn, req: &serde_json::Value, sink: &mut dyn ContentSink) -> Result<()> {
    use serde_json::Value;
    let path = req.get("path").and_then(Value::as_str).unwrap_or("/");
    match req.get("op").and_then(Value::as_str).unwrap_or("") {
        "cat" => stream_cat(r, path, sink),
        "show" => {
            let at = req
                .get("at")
                .and_then(Value::as_str)
                .ok_or("show needs \"at\"")?;
            stream_show(r, path, resolve_point(r, at)?, sink)
        }
        other => Err(format!("{other:?} has no content to stream")),
    }
}

/// The most content a `cat` or `show` answers in one line, for a client that does not ask for
/// a stream (an older redbfs talking to this daemon); a larger file is refused before a byte
/// of it is read, so no such request makes the daemon hold a file several times over.
pub const WHOLE_CONTENT_MAX: u64 = 1024 * 1024;

/// The content a `cat` or `show` request asks for, whole, up to `WHOLE_CONTENT_MAX`.
fn whole_content(r: &ReadTxn, req: &serde_json::Value) -> Result<Vec<u8>> {
    struct Whole<'p>(&'p str, Vec<u8>);
    impl ContentSink for Whole<'_> {
        fn start(&mut self, size: u64) -> Result<()> {
            if size > WHOLE_CONTENT_MAX {
                return Err(format!(
                    "{} is {size} bytes: a file over {WHOLE_CONTENT_MAX} bytes is only \
                     streamed (the redbfs of this daemon's release asks for a stream; an older \
                     one does not)",
                    self.0
                ));
            }
            self.1.start(size)
        }
        fn piece(&mut self, bytes: &[u8]) -> Result<()> {
            self.1.piece(bytes)
        }
    }
    let path = req.get("path").and_then(serde_json::Value::as_str);
    let mut whole = Whole(path.unwrap_or("/"), Vec::new());
    content(r, req, &mut whole)?;
    Ok(whole.1)
}

/// Content as JSON: a string when it is UTF-8, hex otherwise.
fn content_json(data: Vec<u8>) -> serde_json::Value {
    match String::from_utf8(data) {
        Ok(s) => serde_json::json!({"content": s}),
        Err(e) => {
            let hex: String = e.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
            serde_json::json!({"content_hex": hex})
        }
    }
}

/// Runs a history request that changes the store (`mark`, `rollback`, `revert`, `redact`,
/// `snapshot_at`) on `fs`: the daemon's for a mounted store, a fresh one otherwise.
pub fn history_change(fs: &crate::fs::Fs, req: &serde_json::Value) -> Result<serde_json::Value> {
    use serde_json::{Value, json};
    let caller = crate::fs::Caller {
        uid: req.get("uid").and_then(Value::as_u64).unwrap_or(0) as u32,
        gid: req.get("gid").and_then(Value::as_u64).unwrap_or(0) as u32,
        pid: req.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32,
    };
    let path = req.get("path").and_then(Value::as_str).unwrap_or("/");
    let point = |key: &str| -> Result<u64> {
        let spec = req
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("needs \"{key}\""))?;
        resolve_point(&fs.store().read().map_err(err)?, spec)
    };
    let v = match req.get("op").and_then(Value::as_str).unwrap_or("") {
        "mark" => {
            let name = req
                .get("name")
                .and_then(Value::as_str)
                .ok_or("mark needs \"name\"")?;
            json!({"seq": fs.mark(name).map_err(err)?})
        }
        "rollback" if path != "/" => {
            // One directory's tree as it was, the rest untouched: a revert of that path.
            let seq = point("to")?;
            fs.revert(caller, path, seq).map_err(err)?;
            json!({"to": seq, "path": path})
        }
        "rollback" => {
            let seq = point("to")?;
            json!({"to": seq, "undone": fs.rollback(caller, seq).map_err(err)?})
        }
        "expire" => {
            let paths: Vec<String> = req
                .get("paths")
                .and_then(Value::as_array)
                .ok_or("expire needs \"paths\"")?
                .iter()
                .filter_map(|p| p.as_str().map(str::to_string))
                .collect();
            let cutoff = req.get("cutoff_ns").and_then(Value::as_i64);
            json!({"removed": fs.remove_files(caller, &paths, cutoff).map_err(err)?})
        }
        "quota" => {
            let get = |k: &str| req.get(k).and_then(Value::as_u64).unwrap_or(0);
            json!({"quota": fs.set_quota(path, get("bytes"), get("files")).map_err(err)?})
        }
        "revert" => {
            let seq = point("to")?;
            fs.revert(caller, path, seq).map_err(err)?;
            json!({"to": seq})
        }
        "redact" => {
            let at = match req.get("at").and_then(Value::as_str) {
                Some(_) => Some(point("at")?),
                None => None,
            };
            json!({"erased_chunks": fs.redact(path, at).map_err(err)?})
        }
        "snapshot_at" => {
            let seq = point("at")?;
            let out = req
                .get("out")
                .and_then(Value::as_str)
                .ok_or("needs \"out\"")?;
            let r = fs.store().read().map_err(err)?;
            let info = match req.get("subtree").and_then(Value::as_str) {
                Some(p) => at_point(&r, seq, |t| {
                    snapshot_subtree(t, p, Path::new(out), &mut |_| {})
                })?,
                None => at_point(&r, seq, |t| snapshot(t, Path::new(out), &mut |_| {}))?,
            };
            json!({"snapshot": info, "at": seq})
        }
        other => return Err(format!("unknown history request {other:?}")),
    };
    Ok(v)
}

/// Decodes the content of a `cat` answer.
pub fn content_of(v: &serde_json::Value) -> Vec<u8> {
    if let Some(s) = v.get("content").and_then(serde_json::Value::as_str) {
        return s.as_bytes().to_vec();
    }
    let hex = v
        .get("content_hex")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect()
}
