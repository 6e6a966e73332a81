//! Maintenance: `expire` (files unused since a time) and `compact` (space given back to the
//! disk). Repair is `check --repair`, with the inspection commands.

use serde_json::json;

use super::args::{Compact, Expire};
use super::output::{self, Format};
use super::target::Target;
use super::time;

pub(super) fn expire(a: Expire) -> Result<i32, String> {
    let f = Format::of(a.json);
    let t = Target::resolve(&a.store)?;
    let cutoff = match (&a.unused_for, &a.before) {
        (Some(d), _) => crate::store::now_ns() - time::duration_ns(d)?,
        (None, Some(d)) => time::date_ns(d)?,
        (None, None) => return Err("give --unused-for or --before".into()),
    };
    // Streamed by the daemon of a mounted store; the list is gathered here (this process's
    // memory), since the removal names every file in one request.
    let mut files: Vec<(String, i64)> = Vec::new();
    t.listing(
        json!({"op": "unused", "path": a.path, "cutoff_ns": cutoff}),
        &mut |f| {
            files.push(serde_json::from_value(f).map_err(|e| e.to_string())?);
            Ok(())
        },
    )?;
    if !a.dry_run {
        let paths: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
        // One transaction, by the daemon on a mounted store (it tells the kernel what went),
        // recorded in history; a file used since the cutoff (written or replaced since it was
        // chosen) is passed over.
        let v = t.change(json!({"op": "expire", "paths": paths, "cutoff_ns": cutoff}))?;
        let removed: std::collections::HashSet<String> =
            serde_json::from_value(v["removed"].clone()).map_err(|e| e.to_string())?;
        files.retain(|(p, _)| removed.contains(p));
    }
    output::expired(&files, a.dry_run, f);
    Ok(0)
}

pub(super) fn compact(a: Compact) -> Result<i32, String> {
    let t = Target::resolve(&a.store)?;
    t.refuse_mounted("compact")?;
    let size = || std::fs::metadata(&t.store).map(|m| m.len()).unwrap_or(0);
    let before = size();
    let mut s = t.open_existing()?;
    s.compact().map_err(|e| e.to_string())?;
    drop(s);
    output::compacted(&t.store, before, size());
    Ok(0)
}
