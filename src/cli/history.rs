//! History: `log`, `show`, `diff`, `mark`, `revert`, `rollback` and `redact`. Points of
//! history (`--since`, `--at`, `--from`, `--to`) are read by `time::point`.

use serde_json::json;

use super::args::{Diff, Log, Mark, Redact, Revert, Rollback, Show};
use super::output::{self, Format};
use super::target::Target;
use super::time::point;

pub(super) fn log(a: Log) -> Result<i32, String> {
    let q = crate::tools::LogQuery {
        path: a.path.clone(),
        since: a.since.as_deref().map(point),
        limit: a.limit,
        ..Default::default()
    };
    let mut out = output::LogWriter::new(Format::of(a.json));
    // false ends the log: the reader went away (a closed pipe), nothing more to say.
    Target::resolve(&a.store)?.log(&q, &mut |page| out.records(&page.records))?;
    out.finish()?;
    Ok(0)
}

pub(super) fn show(a: Show) -> Result<i32, String> {
    let req = json!({"op": "show", "path": a.path, "at": point(&a.at)});
    Target::resolve(&a.store)?.content(req, &mut output::data)?;
    Ok(0)
}

/// Exit 1 when the two points differ, as diff(1) does.
pub(super) fn diff(a: Diff) -> Result<i32, String> {
    let to = a.to.as_deref().map(point);
    let req = json!({"op": "diff", "path": a.path, "from": point(&a.from), "to": to});
    let v = Target::resolve(&a.store)?.ask(req)?;
    let d = v["diff"].as_str().unwrap_or("");
    output::data(d.as_bytes())?;
    Ok(if d.is_empty() { 0 } else { 1 })
}

pub(super) fn mark(a: Mark) -> Result<i32, String> {
    let v = Target::resolve(&a.store)?.change(json!({"op": "mark", "name": a.name}))?;
    output::done(&format!("marked @{} as {}", v["seq"], a.name));
    Ok(0)
}

pub(super) fn revert(a: Revert) -> Result<i32, String> {
    let req = json!({"op": "revert", "path": a.path, "to": point(&a.to)});
    let v = Target::resolve(&a.store)?.change(req)?;
    output::done(&format!("reverted {} to @{}", a.path, v["to"]));
    Ok(0)
}

pub(super) fn rollback(a: Rollback) -> Result<i32, String> {
    if let Some(path) = a
        .path
        .as_deref()
        .filter(|p| !p.trim_matches('/').is_empty())
    {
        let req = json!({"op": "rollback", "path": path, "to": point(&a.to)});
        let v = Target::resolve(&a.store)?.change(req)?;
        output::done(&format!(
            "rolled {path} back to @{} (the rest of the store untouched)",
            v["to"]
        ));
        return Ok(0);
    }
    let v = Target::resolve(&a.store)?.change(json!({"op": "rollback", "to": point(&a.to)}))?;
    output::done(&format!(
        "rolled back to @{} ({} records undone)",
        v["to"], v["undone"]
    ));
    Ok(0)
}

pub(super) fn redact(a: Redact) -> Result<i32, String> {
    let at = a.at.as_deref().map(point);
    let req = json!({"op": "redact", "path": a.path, "at": at});
    let v = Target::resolve(&a.store)?.change(req)?;
    output::done(&format!(
        "erased {} content chunks of past versions of {}; run `redbfs compact` on the \
         unmounted store to drop the bytes from the file",
        v["erased_chunks"], a.path
    ));
    Ok(0)
}
