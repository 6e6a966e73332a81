//! The way back from a replica: `replica ls` (its generations and the commits each reaches)
//! and `restore --from` (a generation's snapshot, its segments' records applied up to the
//! point asked for, then checked and put in place as `restore` does).
//!
//! Invariant kept here: only whole segments that verify are applied, in commit order and
//! without a gap; the chain ends at the first segment that is missing or does not verify, so
//! what is restored is always a state the store was in.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Manifest, Target, runtime};
use crate::store::{apply_records, decode_segment, record_time};

/// Which state of the store to restore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    /// The last commit the replica holds.
    Latest,
    /// The state right after this commit.
    Commit(u64),
    /// The state at this time (ns since the epoch): every commit made by then.
    Time(i64),
}

/// One generation as `replica ls` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationInfo {
    pub generation: String,
    pub started_ns: i64,
    /// The snapshot's commit and its time; None for a generation whose upload never finished.
    pub commit: Option<u64>,
    pub commit_time_ns: Option<i64>,
    /// The last commit its segments reach without a gap, and when it committed.
    pub last_commit: Option<u64>,
    pub last_time_ns: Option<i64>,
    pub segments: usize,
    pub bytes: u64,
}

/// What `restore --from` did.
#[derive(Clone, Debug, Serialize)]
pub struct Restored {
    pub store: PathBuf,
    pub url: String,
    pub generation: String,
    pub commit: u64,
    pub commit_time_ns: i64,
    pub records: usize,
    pub kept: Option<PathBuf>,
}

/// The segments that continue a chain from commit `from`, in order: each begins at or before
/// the commit after the last one's end; the first gap ends the chain.
pub(super) fn chain(segments: &[(u64, u64, u64)], from: u64) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut at = from;
    for &s in segments {
        if s.1 <= at {
            continue;
        }
        if s.0 > at + 1 {
            break;
        }
        out.push(s);
        at = s.1;
    }
    out
}

/// The generations of the replica at `url`, oldest first.
pub fn list(url: &str) -> Result<Vec<GenerationInfo>, String> {
    let target = Target::open(url)?;
    runtime()?.block_on(async {
        target.load_fence().await?;
        let mut out = Vec::new();
        for name in target.generation_names().await? {
            out.push(describe(&target, &name).await?);
        }
        Ok(out)
    })
}

async fn describe(target: &Target, name: &str) -> Result<GenerationInfo, String> {
    let manifest = target.manifest(name).await?;
    let segments = target.segments(name).await?;
    let mut info = GenerationInfo {
        generation: name.to_string(),
        started_ns: super::started_of(name).unwrap_or(0),
        commit: manifest.as_ref().map(|m| m.commit),
        commit_time_ns: manifest.as_ref().map(|m| m.commit_time_ns),
        last_commit: None,
        last_time_ns: None,
        segments: segments.len(),
        bytes: segments.iter().map(|s| s.2).sum::<u64>()
            + manifest.as_ref().map_or(0, |m| m.snapshot_bytes),
    };
    let Some(m) = manifest else {
        return Ok(info);
    };
    let (last, time) = tail(target, &m, &chain(&segments, m.commit)).await?;
    info.last_commit = Some(last.unwrap_or(m.commit));
    info.last_time_ns = Some(time);
    Ok(info)
}

/// Where the chain `links` of generation `m` ends: its last commit (None when the last
/// segment does not verify whole, or holds other commits than its name says), and when the
/// last commit that records its time committed. A segment of checkpoints alone (the last
/// upload before an unmount) records no time, so the time may be further back.
async fn tail(
    target: &Target,
    m: &Manifest,
    links: &[(u64, u64, u64)],
) -> Result<(Option<u64>, i64), String> {
    let mut end = links.is_empty().then_some(m.commit);
    let mut time = m.commit_time_ns;
    for (i, &(first, last, _)) in links.iter().enumerate().rev() {
        let bytes = target.segment(&m.generation, first, last).await?;
        let Some(records) = decode_segment(m.log_id, &bytes) else {
            break;
        };
        let (a, b) = (records.first().map(|r| r.0), records.last().map(|r| r.0));
        if i + 1 == links.len() && a == Some(first) && b == Some(last) {
            end = Some(last);
        }
        if let Some(t) = records.iter().rev().find_map(|r| record_time(&r.1)) {
            time = t;
            break;
        }
    }
    Ok((end, time))
}

/// The last commit generation `m` reaches without a gap (its last segment verified whole) and
/// when the last commit that records its time committed; None when that segment does not
/// verify.
pub(super) async fn reach(target: &Target, m: &Manifest) -> Result<Option<(u64, i64)>, String> {
    let links = chain(&target.segments(&m.generation).await?, m.commit);
    let (end, time) = tail(target, m, &links).await?;
    Ok(end.map(|e| (e, time)))
}

/// `restore --from`: rebuilds the store at `point` from the replica at `url` and puts it in
/// place at `store` (not mounted: the caller checks) as `restore` does, keeping the file it
/// replaces unless `discard_current`.
pub fn restore(
    url: &str,
    point: Point,
    store: &Path,
    discard_current: bool,
) -> Result<Restored, String> {
    let target = Target::open(url)?;
    let dir = crate::private::parent_dir(store);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let name = store
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let scratch = dir.join(format!(".{name}.from-replica-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&scratch);
    let rebuilt = runtime()?.block_on(rebuild(&target, point, &scratch));
    let result = rebuilt.and_then(|(m, commit, time, records)| {
        let kept = crate::tools::restore(&scratch, store, discard_current)?;
        Ok(Restored {
            store: store.to_path_buf(),
            url: url.to_string(),
            generation: m.generation,
            commit,
            commit_time_ns: time,
            records,
            kept,
        })
    });
    let _ = std::fs::remove_file(&scratch);
    result
}

/// The newest generation that holds `point`, with the commit its chain reaches.
async fn choose(target: &Target, point: Point) -> Result<(Manifest, Vec<(u64, u64, u64)>), String> {
    let names = target.generation_names().await?;
    let mut reach = Vec::new();
    for name in names.iter().rev() {
        let Some(m) = target.manifest(name).await? else {
            continue;
        };
        let links = chain(&target.segments(name).await?, m.commit);
        let last = links.last().map_or(m.commit, |s| s.1);
        let fits = match point {
            Point::Latest => true,
            Point::Commit(n) => m.commit <= n && n <= last,
            Point::Time(t) => m.commit_time_ns <= t,
        };
        if fits {
            return Ok((m, links));
        }
        reach.push(format!("{name}: commits {}..={last}", m.commit));
    }
    if reach.is_empty() {
        return Err(format!(
            "{}: holds no complete generation to restore from",
            target.url
        ));
    }
    Err(format!(
        "{}: no generation holds that point; it holds {}",
        target.url,
        reach.join(", ")
    ))
}

/// Downloads the chosen generation's snapshot to `scratch` and applies its records up to
/// `point`: (manifest, commit reached, its time, records applied).
pub(super) async fn rebuild(
    target: &Target,
    point: Point,
    scratch: &Path,
) -> Result<(Manifest, u64, i64, usize), String> {
    target.load_fence().await?;
    let (m, links) = choose(target, point).await?;
    let snapshot = target
        .get(&target.gen_path(&m.generation, "snapshot.redb"))
        .await?;
    write_private(scratch, &snapshot)?;
    drop(snapshot);
    let (mut commit, mut time) = (m.commit, m.commit_time_ns);
    let mut todo: Vec<(u64, Vec<u8>)> = Vec::new();
    'segments: for (first, last, _) in links {
        let bytes = target.segment(&m.generation, first, last).await?;
        let Some(records) = decode_segment(m.log_id, &bytes) else {
            tracing::warn!(generation = %m.generation, first, last, "a segment does not verify; the restore stops before it");
            break;
        };
        for (seq, payload) in records {
            if seq <= commit {
                continue;
            }
            let at = record_time(&payload).unwrap_or(time);
            let past = match point {
                Point::Latest => false,
                Point::Commit(n) => seq > n,
                Point::Time(t) => at > t,
            };
            if past {
                break 'segments;
            }
            (commit, time) = (seq, at);
            todo.push((seq, payload));
        }
    }
    if let Point::Commit(n) = point
        && commit != n
    {
        return Err(format!(
            "commit {n} is not in the replica (generation {} reaches commit {commit})",
            m.generation
        ));
    }
    apply_records(scratch, &todo).map_err(|e| e.to_string())?;
    Ok((m, commit, time, todo.len()))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let mut f = crate::private::create_new(path).map_err(|e| crate::private::describe(path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_follows_without_gaps_and_skips_what_it_has() {
        let segs = vec![(6, 9, 0), (6, 7, 0), (10, 12, 0), (11, 14, 0), (16, 20, 0)];
        assert_eq!(chain(&segs, 5), vec![(6, 9, 0), (10, 12, 0), (11, 14, 0)]);
        assert_eq!(chain(&segs, 12), vec![(11, 14, 0)]);
        assert!(chain(&segs, 3).is_empty(), "4 and 5 are missing");
    }
}
