//! The way back from a replica: `replica ls` and `replica verify` (each generation's chain
//! and where it stops verifying), and `restore --from` (a generation's snapshot streamed to
//! disk, its segments' verified records applied up to the point asked for, then checked and
//! put in place as `restore` does).
//!
//! `walk` is the one reader of a chain: it takes a generation's listing (sizes checked before
//! anything is read), reads each segment in commit order, verifies it (`Target::read_segment`:
//! every record whole, checksummed, numbered as the name says, its entries of the byte form
//! redb takes) and hands its new records on; it stops at the first gap or segment that does
//! not verify and says where (`Break`). `records_after` builds on it for a reader that keeps
//! up with a generation batch by batch.
//!
//! Invariant kept here: only verified records are applied, in commit order and without a gap,
//! and a restore that would end before what the replica lists fails naming the break unless
//! asked to stop at the last verified commit; what is restored is always a state the store
//! was in.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Link, Manifest, ReadError, Target, runtime};
use crate::store::{Rebuild, VerifiedRecord};

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

/// Where a generation's chain stops verifying, with commits listed past it.
#[derive(Clone, Debug, Serialize)]
pub struct Break {
    /// The segment at fault; None for a gap (a segment missing).
    pub segment: Option<String>,
    /// The last commit that verifies, and when it committed (ns since the epoch).
    pub last_good_commit: u64,
    pub last_good_time_ns: i64,
    /// The last commit the listing names past the break.
    pub listed_commit: u64,
    pub reason: String,
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.segment {
            Some(s) => write!(f, "{s} does not verify ({})", self.reason)?,
            None => write!(f, "{}", self.reason)?,
        }
        write!(
            f,
            "; the chain verifies up to commit {} ({}), the replica lists up to commit {}",
            self.last_good_commit,
            show_time(self.last_good_time_ns),
            self.listed_commit
        )
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC`.
fn show_time(ns: i64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(ns))
        .map(|t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|_| format!("{ns} ns"))
}

/// Where a walk along a chain ended.
#[derive(Clone, Debug)]
pub struct Walked {
    /// The last commit handed on (or the start), and when the last commit that records its
    /// time committed.
    pub commit: u64,
    pub time_ns: i64,
    /// Segments verified.
    pub segments: usize,
    /// Where the chain stops verifying; None when it verified to its listed end (or the walk
    /// was stopped before).
    pub broken: Option<Break>,
}

/// Walks generation `m`'s chain from commit `from` (made at `from_time`, ns) along `links`
/// (its listing): each segment read and verified in turn, its records after the last one
/// handed to `each`, which says whether to go on. Ends at the listing's end, at the first gap
/// or segment that does not verify (`Walked::broken`), or when `each` says stop. An error is
/// a replica out of reach (or `each`'s own), never a damaged one.
pub async fn walk(
    target: &Target,
    m: &Manifest,
    links: &[Link],
    from: (u64, i64),
    each: &mut dyn FnMut(Vec<VerifiedRecord>) -> Result<bool, String>,
) -> Result<Walked, String> {
    let mut w = Walked {
        commit: from.0,
        time_ns: from.1,
        segments: 0,
        broken: None,
    };
    let listed = links.iter().map(|l| l.last).max().unwrap_or(from.0);
    for link in links {
        if link.last <= w.commit {
            continue;
        }
        let fault = |segment: Option<String>, reason: String, w: &Walked| Break {
            segment,
            last_good_commit: w.commit,
            last_good_time_ns: w.time_ns,
            listed_commit: listed,
            reason,
        };
        if link.first > w.commit + 1 {
            let reason = format!(
                "commits {}..={} are missing (no segment holds them)",
                w.commit + 1,
                link.first - 1
            );
            w.broken = Some(fault(None, reason, &w));
            return Ok(w);
        }
        let records = match target.read_segment(m, link).await {
            Ok(r) => r,
            Err(ReadError::Bad(reason)) => {
                let name = format!("{}/{}", m.generation, link.name());
                w.broken = Some(fault(Some(name), reason, &w));
                return Ok(w);
            }
            Err(ReadError::Unreachable(e)) => return Err(e),
        };
        w.segments += 1;
        let fresh: Vec<VerifiedRecord> =
            records.into_iter().filter(|r| r.seq() > w.commit).collect();
        let (last, time) = (
            fresh.last().map(|r| r.seq()),
            fresh.iter().rev().find_map(|r| r.time()),
        );
        if !each(fresh)? {
            return Ok(w);
        }
        w.commit = last.unwrap_or(w.commit);
        w.time_ns = time.unwrap_or(w.time_ns);
    }
    Ok(w)
}

/// A batch of verified records following a reader's position in a generation.
#[derive(Clone, Debug)]
pub struct Followed {
    /// In commit order, the first following the position asked for.
    pub records: Vec<VerifiedRecord>,
    /// Where the chain stopped verifying (the records before it are still good).
    pub broken: Option<Break>,
}

/// The verified records of generation `m` after commit `after`, whole segments of them up to
/// about `max_bytes` (at least one segment when there is one): for a reader that keeps up with
/// a generation, applying each batch in one transaction (`store::apply_verified`).
pub async fn records_after(
    target: &Target,
    m: &Manifest,
    after: u64,
    max_bytes: usize,
) -> Result<Followed, String> {
    let links = target.segments(&m.generation).await?;
    let mut records = Vec::new();
    let mut bytes = 0usize;
    let walked = walk(target, m, &links, (after, 0), &mut |batch| {
        bytes += batch.iter().map(VerifiedRecord::len).sum::<usize>();
        records.extend(batch);
        Ok(bytes < max_bytes)
    })
    .await?;
    Ok(Followed {
        records,
        broken: walked.broken,
    })
}

/// One generation as `replica ls` and `replica verify` show it.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationInfo {
    pub generation: String,
    pub started_ns: i64,
    /// The snapshot's commit and its time; None for a generation whose upload never finished.
    pub commit: Option<u64>,
    pub commit_time_ns: Option<i64>,
    /// The last commit its chain reaches and verifies, and when it committed.
    pub last_commit: Option<u64>,
    pub last_time_ns: Option<i64>,
    pub segments: usize,
    pub bytes: u64,
    /// Where its chain stops verifying, with commits listed past it.
    pub broken: Option<Break>,
    /// Why it cannot be restored from at all (its manifest or snapshot).
    pub problem: Option<String>,
}

impl GenerationInfo {
    /// Whether it never got a manifest (a snapshot upload that did not finish).
    fn is_unfinished(&self) -> bool {
        self.commit.is_none() && self.problem.as_deref() == Some(NO_MANIFEST)
    }
}

const NO_MANIFEST: &str = "no manifest: its upload never finished";

/// What `replica verify` reports for `list` (oldest first): (generation, finding) for every
/// break and every generation that cannot be restored from; an older generation whose upload
/// never finished is left out (a shipper stopped mid-snapshot leaves one; pruning takes it),
/// the newest counts.
pub fn findings(list: &[GenerationInfo]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, g) in list.iter().enumerate() {
        let newest = i + 1 == list.len();
        if let Some(p) = &g.problem
            && (newest || !g.is_unfinished())
        {
            out.push((
                g.generation.clone(),
                format!("cannot be restored from: {p}"),
            ));
        }
        if let Some(b) = &g.broken {
            out.push((g.generation.clone(), b.to_string()));
        }
    }
    out
}

/// The generations of the replica at `url` (or just `only`), oldest first, each verified.
pub fn list(url: &str, only: Option<&str>) -> Result<Vec<GenerationInfo>, String> {
    let target = Target::open_existing(url)?;
    let io = runtime()?;
    io.block_on(async {
        target.load_fence().await?;
        let mut out = Vec::new();
        let names = target.generation_names().await?;
        if let Some(g) = only
            && !names.iter().any(|n| n == g)
        {
            return Err(format!("{}: holds no generation {g}", target.shown()));
        }
        for name in names.iter().filter(|n| only.is_none_or(|g| g == *n)) {
            let described = describe(&target, name).await;
            // Sound, or unfinished from the start: as described.
            if described
                .as_ref()
                .is_ok_and(|g| g.commit.is_none() || (g.broken.is_none() && g.problem.is_none()))
            {
                out.push(described?);
                continue;
            }
            // A mount pruning the generation meanwhile (manifest first) is no damage.
            match target.manifest(name).await {
                Ok(None) => {
                    tracing::info!(generation = %name, "a generation went while being read (pruned)");
                }
                _ => out.push(described?),
            }
        }
        Ok(out)
    })
}

async fn describe(target: &Target, name: &str) -> Result<GenerationInfo, String> {
    let mut info = GenerationInfo {
        generation: name.to_string(),
        started_ns: super::started_of(name).unwrap_or(0),
        commit: None,
        commit_time_ns: None,
        last_commit: None,
        last_time_ns: None,
        segments: 0,
        bytes: 0,
        broken: None,
        problem: None,
    };
    let manifest = match target.manifest(name).await {
        Ok(m) => m,
        Err(ReadError::Unreachable(e)) => return Err(e),
        Err(ReadError::Bad(e)) => {
            info.problem = Some(e);
            return Ok(info);
        }
    };
    let links = target.segments(name).await?;
    info.segments = links.len();
    info.bytes = links.iter().map(|l| l.size).sum();
    let Some(m) = manifest else {
        info.problem = Some(NO_MANIFEST.into());
        return Ok(info);
    };
    info.commit = Some(m.commit);
    info.commit_time_ns = Some(m.commit_time_ns);
    let snapshot = target
        .size_of(&target.gen_path(name, "snapshot.redb"))
        .await?;
    info.bytes += snapshot.unwrap_or(0);
    match snapshot {
        None => info.problem = Some("snapshot.redb is missing".into()),
        Some(n) if n != m.snapshot_bytes => {
            info.problem = Some(format!(
                "snapshot.redb holds {n} bytes, the manifest says {}",
                m.snapshot_bytes
            ));
        }
        Some(_) => {}
    }
    let walked = walk(
        target,
        &m,
        &links,
        (m.commit, m.commit_time_ns),
        &mut |_| Ok(true),
    )
    .await?;
    info.last_commit = Some(walked.commit);
    info.last_time_ns = Some(walked.time_ns);
    info.broken = walked.broken;
    Ok(info)
}

/// The last commit generation `m` reaches and verifies, when the last commit that records its
/// time committed, and whether it verifies to the end of what it lists.
pub(super) async fn reach(target: &Target, m: &Manifest) -> Result<(u64, i64, bool), String> {
    let links = target.segments(&m.generation).await?;
    let w = walk(target, m, &links, (m.commit, m.commit_time_ns), &mut |_| {
        Ok(true)
    })
    .await?;
    Ok((w.commit, w.time_ns, w.broken.is_none()))
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
    /// Where the chain stopped verifying, when restored to the last verified commit.
    pub broken: Option<Break>,
    /// The replica URLs the restored store had, dropped (see `config::disown`).
    pub dropped_replicas: Vec<String>,
}

/// The scratch file of `restore --from` for `store`, made by process `pid`.
fn scratch_name(name: &str, pid: u32) -> String {
    format!(".{name}.from-replica-{pid}.tmp")
}

/// Removes what a killed `restore` or `restore --from` left in `dir` for the store named
/// `name` (its process is gone): the rebuilt scratch file and the checked copy.
pub fn remove_leftovers(dir: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{name}.from-replica-");
    for e in entries.flatten() {
        let n = e.file_name();
        let Some(pid) = n
            .to_str()
            .and_then(|n| {
                n.strip_prefix(&prefix)
                    .and_then(|n| n.strip_suffix(".tmp"))
                    .or_else(|| n.strip_prefix(".restore-tmp-"))
            })
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
        if !alive && std::fs::remove_file(e.path()).is_ok() {
            tracing::info!(file = %e.path().display(), "removed what an interrupted restore left");
        }
    }
}

/// `restore --from`: rebuilds the store at `point` from the replica at `url` (from generation
/// `generation` only, when given) and puts it in place at `store` (not mounted: the caller
/// checks) as `restore` does, keeping the file it replaces unless `discard_current`. A chain
/// that stops verifying before what the replica lists fails, naming the break, unless
/// `to_last_verified`; so does a newer generation whose manifest does not read (`choose`).
pub fn restore(
    url: &str,
    point: Point,
    generation: Option<&str>,
    store: &Path,
    discard_current: bool,
    to_last_verified: bool,
) -> Result<Restored, String> {
    let target = Target::open_existing(url)?;
    let dir = crate::private::parent_dir(store);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let name = store
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    remove_leftovers(&dir, &name);
    let scratch = dir.join(scratch_name(&name, std::process::id()));
    let _ = std::fs::remove_file(&scratch);
    let io = runtime()?;
    let rebuilt = io.block_on(rebuild(
        &target,
        point,
        generation,
        &scratch,
        to_last_verified,
    ));
    drop(io);
    let result = rebuilt.and_then(|r| {
        let (kept, dropped) = crate::tools::restore_dropping(&scratch, store, discard_current)?;
        Ok(Restored {
            store: store.to_path_buf(),
            url: target.shown(),
            generation: r.manifest.generation,
            commit: r.commit,
            commit_time_ns: r.time_ns,
            records: r.records,
            kept,
            broken: r.broken,
            dropped_replicas: dropped.iter().map(|u| super::redact(u)).collect(),
        })
    });
    let _ = std::fs::remove_file(&scratch);
    result
}

/// The newest generation that holds `point` by its listing (only generation `only`, when
/// given), with that listing. A generation without a manifest (its upload never finished,
/// or a fenced writer started it) is passed over; one newer than the generation chosen
/// whose manifest does not read fails the choice, naming it and how to restore an older one
/// explicitly (`--generation`): never a silent fall back to older state. A replica out of
/// reach fails it too.
async fn choose(
    target: &Target,
    point: Point,
    only: Option<&str>,
) -> Result<(Manifest, Vec<Link>), String> {
    let names = target.generation_names().await?;
    if let Some(g) = only
        && !names.iter().any(|n| n == g)
    {
        return Err(format!("{}: holds no generation {g}", target.shown()));
    }
    let mut reach = Vec::new();
    for (at, name) in names.iter().enumerate().rev() {
        if only.is_some_and(|g| g != name) {
            continue;
        }
        let m = match target.manifest(name).await {
            Ok(Some(m)) => m,
            Ok(None) if only.is_some() => {
                return Err(format!(
                    "{}: generation {name} has no manifest a restore may use (its upload \
                     never finished, or a writer taken over started it)",
                    target.shown()
                ));
            }
            Ok(None) => continue,
            Err(ReadError::Unreachable(e)) => return Err(e),
            // A generation no epoch lets stand (a fenced writer's, started after the
            // takeover) is passed over whatever its manifest holds.
            Err(ReadError::Bad(_))
                if only.is_none() && !target.stands(name, super::epoch_of_generation(name), 0) =>
            {
                continue;
            }
            Err(ReadError::Bad(e)) => {
                let older = match names[..at].last() {
                    Some(g) => format!(
                        "; `--generation {g}` restores the generation before it (`redbfs \
                         replica ls` lists them all)"
                    ),
                    None => "; the replica holds no older generation".to_string(),
                };
                return Err(format!(
                    "{}: generation {name} cannot be restored from: {e}. Nothing was \
                     restored{older}",
                    target.shown()
                ));
            }
        };
        let links = target.segments(name).await?;
        let last = links
            .iter()
            .map(|l| l.last)
            .max()
            .unwrap_or(m.commit)
            .max(m.commit);
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
            target.shown()
        ));
    }
    Err(format!(
        "{}: no generation holds that point; it holds {}",
        target.shown(),
        reach.join(", ")
    ))
}

pub(super) struct Rebuilt {
    pub(super) manifest: Manifest,
    pub(super) commit: u64,
    pub(super) time_ns: i64,
    pub(super) records: usize,
    pub(super) broken: Option<Break>,
}

/// Streams the chosen generation's snapshot to `scratch` and applies its verified records up
/// to `point`, segment by segment.
pub(super) async fn rebuild(
    target: &Target,
    point: Point,
    generation: Option<&str>,
    scratch: &Path,
    to_last_verified: bool,
) -> Result<Rebuilt, String> {
    target.load_fence().await?;
    let (m, links) = choose(target, point, generation).await?;
    let snapshot = target.gen_path(&m.generation, "snapshot.redb");
    {
        let mut f = crate::private::create_new(scratch)
            .map_err(|e| crate::private::describe(scratch, e))?;
        target
            .get_to_file(&snapshot, &mut f, m.snapshot_bytes)
            .await?;
        f.sync_all()
            .map_err(|e| format!("{}: {e}", scratch.display()))?;
    }
    let mut rebuild = Rebuild::open(scratch).map_err(|e| {
        format!(
            "{}/snapshot.redb does not open as a store: {e}",
            m.generation
        )
    })?;
    let (mut commit, mut time) = (m.commit, m.commit_time_ns);
    let mut applied = 0usize;
    let mut reached = false;
    let walked = walk(
        target,
        &m,
        &links,
        (m.commit, m.commit_time_ns),
        &mut |records| {
            let mut take = Vec::with_capacity(records.len());
            for r in records {
                let at = r.time().unwrap_or(time);
                let past = match point {
                    Point::Latest => false,
                    Point::Commit(n) => r.seq() > n,
                    Point::Time(t) => at > t,
                };
                if past {
                    reached = true;
                    break;
                }
                (commit, time) = (r.seq(), at);
                take.push(r);
            }
            applied += take.len();
            rebuild.apply(&take).map_err(|e| e.to_string())?;
            Ok(!reached)
        },
    )
    .await?;
    if let Point::Commit(n) = point
        && commit != n
    {
        let why = walked
            .broken
            .as_ref()
            .map_or(String::new(), |b| format!(": {b}"));
        return Err(format!(
            "commit {n} is not in the replica (generation {} reaches commit {commit}){why}",
            m.generation
        ));
    }
    if let Some(b) = &walked.broken
        && !reached
        && !to_last_verified
    {
        return Err(format!(
            "{}: generation {}: {b}. Nothing was restored; `--to-last-verified` restores \
             commit {} and drops the rest",
            target.shown(),
            m.generation,
            b.last_good_commit
        ));
    }
    rebuild.finish().map_err(|e| e.to_string())?;
    Ok(Rebuilt {
        manifest: m,
        commit,
        time_ns: time,
        records: applied,
        broken: walked.broken.filter(|_| !reached),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_name_is_found_as_a_leftover() {
        let dir = tempfile::tempdir().unwrap();
        // A pid that is not running (pid_max is below 2^22 on Linux).
        let dead = dir.path().join(scratch_name("m.redb", 4_194_304 + 7));
        let live = dir.path().join(scratch_name("m.redb", std::process::id()));
        let other = dir.path().join(scratch_name("n.redb", 4_194_304 + 7));
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        remove_leftovers(dir.path(), "m.redb");
        assert!(!dead.exists());
        assert!(live.exists(), "a running restore's file stays");
        assert!(other.exists(), "another store's stays");
    }
}
