//! `replica ls`, `replica verify` and `restore --from`: what a replica in object storage
//! holds, whether all of it verifies, and a store rebuilt from it.

use super::args::{Replica, ReplicaCmd, Restore};
use super::output::{self, Format};
use super::target::Target;
use super::time;
use crate::replica::restore::{self, Point};

pub(super) fn run(a: Replica) -> Result<i32, String> {
    match a.cmd {
        ReplicaCmd::Ls(l) => {
            let list = restore::list(&l.url, None)?;
            output::replica_ls(&crate::replica::redact(&l.url), &list, Format::of(l.json));
            Ok(0)
        }
        ReplicaCmd::Verify(v) => {
            let list = restore::list(&v.url, v.generation.as_deref())?;
            let url = crate::replica::redact(&v.url);
            let sound = output::replica_verified(&url, &list, Format::of(v.json));
            Ok(if sound { 0 } else { 1 })
        }
    }
}

/// `--at`: a commit number, a date or time, or a duration ago.
fn point(at: Option<&str>) -> Result<Point, String> {
    let Some(s) = at.map(str::trim) else {
        return Ok(Point::Latest);
    };
    if let Ok(n) = s.trim_start_matches('@').parse::<u64>() {
        return Ok(Point::Commit(n));
    }
    if let Ok(ns) = time::date_ns(s) {
        return Ok(Point::Time(ns));
    }
    match time::duration_ns(s) {
        Ok(d) => Ok(Point::Time(crate::store::now_ns().saturating_sub(d))),
        Err(_) => Err(format!(
            "--at {s:?}: give a commit number, a date or time (2026-01-31T08:00:00Z) or a duration ago (2h)"
        )),
    }
}

pub(super) fn restore_from(a: Restore) -> Result<i32, String> {
    let url = a.from.as_deref().unwrap_or_default();
    let [store] = <[_; 1]>::try_from(a.paths)
        .map_err(|_| "restore --from URL STORE takes one path: the store".to_string())?;
    let store = Target::unmounted(&store, "restoring")?;
    let at = point(a.at.as_deref())?;
    let done = restore::restore(
        url,
        at,
        a.generation.as_deref(),
        &store,
        a.discard_current,
        a.to_last_verified,
    )?;
    output::restored_from(&done, Format::of(a.json));
    Ok(0)
}
