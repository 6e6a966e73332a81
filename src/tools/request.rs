//! The JSON requests the control socket and the CLI share: `query` (read-only: inspection,
//! `check`, history, `unused`) and `history_change`. This is the one module that dispatches
//! to several families; no family imports it.

use std::path::Path;

use super::backup::{snapshot, snapshot_subtree};
use super::common::{Result, err, tree};
use super::history::{LogQuery, at_point, diff, log_page, resolve_point, show_at};
use super::inspection::{cat, du, ls, quotas, stats};
use super::maintenance::unused_since;
use crate::store::ReadTxn;

/// Answers a read-only request (`ls`, `cat`, `tree`, `du`, `stats`, `check`, `unused`) from
/// one read transaction. The daemon answers these for a mounted store and the CLI for an
/// unmounted one, so both print the same.
pub fn query(r: &ReadTxn, store_bytes: u64, req: &serde_json::Value) -> Result<serde_json::Value> {
    use serde_json::{Value, json};
    let path = req.get("path").and_then(Value::as_str).unwrap_or("/");
    let v = match req.get("op").and_then(Value::as_str).unwrap_or("") {
        "ls" => json!({"entries": ls(r, path)?}),
        "cat" => content_json(cat(r, path)?),
        "tree" => {
            let t: Vec<Value> = tree(r, path)?
                .into_iter()
                .map(|(depth, e)| json!({"depth": depth, "entry": e}))
                .collect();
            json!({"tree": t})
        }
        "du" => json!({"du": du(r, path)?}),
        "stats" => json!({"stats": stats(r, store_bytes)?}),
        "quotas" => json!({"quotas": quotas(r)?}),
        "check" => json!({"findings": crate::check::invariants(r).map_err(err)?}),
        "log" => {
            let q: LogQuery =
                serde_json::from_value(req.clone()).map_err(|e| format!("log: {e}"))?;
            serde_json::to_value(log_page(r, &q)?).map_err(err)?
        }
        "show" => {
            let seq = resolve_point(
                r,
                req.get("at")
                    .and_then(Value::as_str)
                    .ok_or("show needs \"at\"")?,
            )?;
            content_json(show_at(r, path, seq)?)
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
        "unused" => {
            let cutoff = req
                .get("cutoff_ns")
                .and_then(Value::as_i64)
                .ok_or("unused needs cutoff_ns")?;
            json!({"files": unused_since(r, path, cutoff)?})
        }
        other => return Err(format!("unknown query {other:?}")),
    };
    Ok(v)
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
