//! A follower: a live read-only copy of a replica's newest generation on any host
//! (`redbfs mount MNT --follow URL`). It restores the generation into a private local store,
//! then polls the replica every interval and applies each new segment's records, verified as
//! `restore --from` verifies them, in one transaction per segment; after each, the kernel is
//! told exactly which entries and inodes changed. When a newer generation appears (the writer
//! restarted, was restored or replaced), the store becomes its snapshot in one transaction,
//! without unmounting. A follower mounted again on its store goes on from the commit it
//! holds while that still stands in the replica's newest generation (`prepare`).
//!
//! Invariant kept here: the follower's store is always the replica's state at some commit
//! of the generation it follows (a reader sees a batch whole or not at all), it changes only
//! through this module (the store is frozen against everything else), and only what the
//! epochs let stand is applied (never a fenced writer's segments).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::epoch::Cut;
use super::restore::{Point, walk};
use super::{Manifest, Target, runtime};
use crate::fs::{Fs, Name, NameRules};
use crate::store::schema::META_FOLLOWED;
use crate::store::{Store, now_ns};

/// What a follower's store records of what it follows (`meta` "followed"): the replica, the
/// generation and the commit it holds. A takeover continues from there (`epoch::Cut`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Followed {
    pub url: String,
    pub generation: String,
    pub commit: u64,
}

impl Followed {
    /// What `store` records, if it is (or was) a follower's.
    pub fn of(store: &Store) -> Option<Followed> {
        let bytes = store.read().ok()?.meta_bytes(META_FOLLOWED).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Where a takeover from this store continues the history of `url`.
    pub fn cut_for(store: &Store, url: &str) -> Option<Cut> {
        Followed::of(store).filter(|f| f.url == url).map(|f| Cut {
            generation: f.generation,
            commit: f.commit,
        })
    }

    /// Forgets what the store followed (a takeover made it a writer's), in a commit of its
    /// own.
    pub fn forget(store: &Store) -> Result<(), crate::store::StoreError> {
        let mut w = store.write()?;
        w.without_history();
        if w.remove_meta(META_FOLLOWED)? {
            w.commit(crate::store::Sync::Durable)?;
        }
        Ok(())
    }

    fn meta(&self) -> Vec<(&'static str, Vec<u8>)> {
        vec![(META_FOLLOWED, serde_json::to_vec(self).unwrap_or_default())]
    }
}

/// The reason a follower's store refuses changes, as `status` and a refused tool show it.
fn frozen_reason(url: &str) -> String {
    format!(
        "this mount follows {url} read-only: it changes only as the writer's commits arrive \
         (promote it with `redbfs promote MNT`)"
    )
}

/// Makes `store` a follower's copy of the replica at `url`: its newest generation restored
/// into it (a store already there is replaced only when it is a follower's of this URL), the
/// store then opened and frozen. Before the mount, so a replica that cannot be read refuses it.
///
/// A follower's store of this URL that still holds a point of the replica's newest
/// generation (its commit the snapshot's, or the end of a segment that stands, the chain up to
/// it verifying) is resumed as it is: the follower then applies only what follows.
pub fn prepare(url: &str, path: &Path) -> Result<Store, String> {
    let mut existing = None;
    if std::fs::symlink_metadata(path).is_ok() {
        existing = match Store::open_existing(path) {
            Ok(s) => Some(s).filter(|s| Followed::of(s).is_some_and(|f| f.url == url)),
            Err(e @ crate::store::StoreError::AlreadyOpen(_)) => return Err(e.to_string()),
            Err(_) => None,
        };
        if existing.is_none() {
            return Err(format!(
                "{} holds a store that is not a follower's copy of {url}; a follower keeps a \
                 private store of its own: give it another --store",
                path.display()
            ));
        }
    }
    let target = Target::open_existing(url)?;
    if let Some(store) = existing {
        let followed = Followed::of(&store).filter(|f| f.url == url);
        match followed {
            Some(f) if runtime()?.block_on(resumable(&target, &f))? => {
                store.freeze(frozen_reason(url));
                tracing::info!(replica = %super::redact(url), generation = %f.generation, commit = f.commit, "following the replica from the commit the store holds");
                return Ok(store);
            }
            _ => drop(store),
        }
    }
    // Rebuilt beside the store and renamed over it: the store is exactly the replica's state
    // (a `restore` would also make it disown the writer's generation, in a commit of its own).
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let scratch =
        crate::private::parent_dir(path).join(format!(".{name}.follow-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&scratch);
    let rebuilt = runtime()?.block_on(super::restore::rebuild(
        &target,
        Point::Latest,
        None,
        &scratch,
        false,
    ));
    // Checked as `restore --from` checks what it puts in place (redb's integrity check and
    // every invariant, each name through the normaliser), before it becomes the store.
    let checked = rebuilt.and_then(|r| {
        checked_store(
            &scratch,
            &format!(
                "generation {} at commit {}",
                r.manifest.generation, r.commit
            ),
        )?;
        Ok(r)
    });
    let (m, commit) = match checked {
        Ok(r) => (r.manifest, r.commit),
        Err(e) => {
            let _ = std::fs::remove_file(&scratch);
            return Err(format!("following {url}: {e}"));
        }
    };
    std::fs::rename(&scratch, path).map_err(|e| {
        let _ = std::fs::remove_file(&scratch);
        format!("{}: {e}", path.display())
    })?;
    let store = Store::open_existing(path).map_err(|e| e.to_string())?;
    let followed = Followed {
        url: url.to_string(),
        generation: m.generation,
        commit,
    };
    store
        .apply_shipped(&[], &followed.meta(), &|_, _| None)
        .map_err(|e| e.to_string())?;
    store.freeze(frozen_reason(url));
    tracing::info!(replica = %super::redact(url), generation = %followed.generation, commit = followed.commit, "following the replica");
    Ok(store)
}

/// Checks the store file at `path` (what the replica holds as `what`) as `restore` checks a
/// store before it puts it in place: redb's integrity check, then every invariant of
/// `check`. The first finding, named for the replica's generation rather than the scratch
/// file.
fn checked_store(path: &Path, what: &str) -> Result<(), String> {
    crate::tools::verify(path).map_err(|e| {
        let e = e.replace(&format!("{}: ", path.display()), "");
        format!("{what} does not pass the store's checks, so it is not followed: {e}")
    })
}

/// The rule each name a follower applies passes: the normaliser the mount uses, under the
/// store's `--names` rules.
fn name_rule(rules: NameRules) -> impl Fn(u64, &str) -> Option<String> {
    move |parent, name| {
        crate::check::entry_name_finding(parent, name).or_else(|| match rules {
            NameRules::Linux => None,
            NameRules::Portable => Name::parse(name.as_bytes(), rules)
                .err()
                .map(|e| format!("entry {name:?} in {parent}: {e}")),
        })
    }
}

/// Whether a follower's store at `f` can go on from there: `f`'s generation is the newest
/// that stands, and `f.commit` is its snapshot's commit or the end of a segment that stands,
/// the chain from the snapshot up to it verifying (its segments are read, not the snapshot).
async fn resumable(target: &Target, f: &Followed) -> Result<bool, String> {
    target.load_fence().await?;
    let mut newest = None;
    for name in target.generation_names().await?.iter().rev() {
        if let Some(m) = target.manifest(name).await? {
            newest = Some(m);
            break;
        }
    }
    let Some(m) = newest.filter(|m| m.generation == f.generation) else {
        return Ok(false);
    };
    if f.commit == m.commit {
        return Ok(true);
    }
    let segments = target.segments(&m.generation).await?;
    if f.commit < m.commit || !segments.iter().any(|l| l.last == f.commit) {
        return Ok(false);
    }
    // The walk ends at the segment that ends at `f.commit`, or before it at a break.
    let (to, mut reached) = (f.commit, m.commit);
    walk(
        target,
        &m,
        &segments,
        (m.commit, m.commit_time_ns),
        &mut |records| {
            reached = records.last().map_or(reached, |r| r.seq());
            Ok(reached < to)
        },
    )
    .await?;
    Ok(reached == to)
}

/// What `status` shows of a follower.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FollowState {
    pub url: String,
    pub generation: Option<String>,
    /// The last commit the replica holds (of the generation followed), as last polled.
    pub writer_commit: u64,
    /// The last commit this follower applied.
    pub follower_commit: u64,
    /// When the last commit the follower applied committed on the writer, ns.
    pub follower_commit_time_ns: Option<i64>,
    /// When the replica was last polled, ns.
    pub last_poll_ns: Option<i64>,
    /// Batches (segments) and records applied, generations switched to.
    pub batches: u64,
    pub records: u64,
    pub generations: u64,
    /// Time spent applying batches (the transaction and the kernel's invalidations), s.
    pub apply_seconds: f64,
    /// Why the last poll failed, while it fails.
    pub error: Option<String>,
    /// What the replica holds next that does not pass the store's rules (the commit and the
    /// rule), while it is refused: the follower stays at its last good commit.
    pub refused: Option<String>,
    /// Since when (ns) the follower has been behind the replica, while it is.
    #[serde(skip)]
    behind_since: Option<i64>,
}

#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

/// A running follower: its polling thread and what it has applied.
pub struct Follower {
    pub interval: Duration,
    state: Arc<Mutex<FollowState>>,
    stop: Arc<Stop>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Follower {
    /// Starts following `url` into `fs` (prepared by `prepare`), polling every `interval`.
    pub fn start(fs: &Arc<Fs>, url: &str, interval: Duration) -> Result<Follower, String> {
        let target = Target::open_existing(url)?;
        let followed = Followed::of(fs.store()).ok_or("the store is not a follower's")?;
        let time = fs
            .store()
            .read()
            .and_then(|r| r.last_commit())
            .ok()
            .flatten();
        let state = Arc::new(Mutex::new(FollowState {
            url: url.to_string(),
            generation: Some(followed.generation.clone()),
            writer_commit: followed.commit,
            follower_commit: followed.commit,
            follower_commit_time_ns: time,
            ..FollowState::default()
        }));
        let stop = Arc::new(Stop::default());
        let mut poller = Poller {
            fs: fs.clone(),
            target,
            followed,
            current: None,
            state: state.clone(),
            scratch: scratch_path(fs.store().path()),
            failing: false,
        };
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("follower".into())
            .spawn(move || {
                let rt = match runtime() {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!("{e}; not following");
                        return;
                    }
                };
                loop {
                    let result = rt.block_on(poller.poll());
                    poller.report(result);
                    if stopping.wait(interval) {
                        break;
                    }
                }
                let _ = std::fs::remove_file(&poller.scratch);
            })
            .map_err(|e| format!("starting the follower thread: {e}"))?;
        Ok(Follower {
            interval,
            state,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops polling; returns once the thread has ended (a batch being applied completes).
    pub fn stop(&self) {
        *lock(&self.stop.stopped) = true;
        self.stop.wake.notify_all();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    /// The follower's state, with its lag in commits and seconds.
    pub fn status(&self) -> Value {
        let s = lock(&self.state).clone();
        let behind = s.writer_commit.saturating_sub(s.follower_commit);
        let seconds = match s.behind_since {
            Some(t) if behind > 0 => (now_ns() - t).max(0) as f64 / 1e9,
            _ => 0.0,
        };
        let mut v = serde_json::to_value(&s).unwrap_or_default();
        v["commits_behind"] = serde_json::json!(behind);
        v["seconds_behind"] = serde_json::json!((seconds * 10.0).round() / 10.0);
        v
    }
}

impl Stop {
    /// Waits up to `d`; whether the follower is stopping.
    fn wait(&self, d: Duration) -> bool {
        let guard = lock(&self.stopped);
        let (guard, _) = self
            .wake
            .wait_timeout_while(guard, d, |stopped| !*stopped)
            .unwrap_or_else(|p| p.into_inner());
        *guard
    }
}

/// A private scratch file beside the store for a new generation's snapshot.
fn scratch_path(store: &Path) -> PathBuf {
    let name = store
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    crate::private::parent_dir(store).join(format!(".{name}.follow-{}.tmp", std::process::id()))
}

/// Why a poll did not bring the follower up to the replica.
enum Stalled {
    /// The replica could not be read, or its chain breaks: tried again every interval.
    Failing(String),
    /// What the replica holds next does not pass the store's rules (the commit and the
    /// rule): nothing of it applied, the follower held at its last good commit.
    Refused(String),
}

impl From<String> for Stalled {
    fn from(e: String) -> Stalled {
        Stalled::Failing(e)
    }
}

impl From<super::ReadError> for Stalled {
    fn from(e: super::ReadError) -> Stalled {
        Stalled::Failing(e.into())
    }
}

/// The follower's thread.
struct Poller {
    fs: Arc<Fs>,
    target: Target,
    followed: Followed,
    /// The followed generation's manifest (read once).
    current: Option<Manifest>,
    state: Arc<Mutex<FollowState>>,
    scratch: PathBuf,
    failing: bool,
}

impl Poller {
    /// One warning when polling starts failing, one line when it works again; one error line
    /// for each refusal (the commit and the rule).
    fn report(&mut self, result: Result<(), Stalled>) {
        let mut s = lock(&self.state);
        s.last_poll_ns = Some(now_ns());
        match result {
            Ok(()) => {
                if self.failing || s.refused.is_some() {
                    tracing::info!(replica = %self.target.shown(), commit = s.follower_commit, "the replica answers again; following");
                }
                self.failing = false;
                s.error = None;
                s.refused = None;
            }
            Err(Stalled::Refused(e)) => {
                if s.refused.as_ref() != Some(&e) {
                    tracing::error!(replica = %self.target.shown(), commit = s.follower_commit, "refused what the replica holds next: {e}; the follower stays at commit {} (`redbfs status` shows this until the replica holds something that passes)", s.follower_commit);
                }
                self.failing = false;
                s.error = Some(e.clone());
                s.refused = Some(e);
            }
            Err(Stalled::Failing(e)) => {
                s.refused = None;
                if !self.failing {
                    tracing::warn!(replica = %self.target.shown(), error = %e, "cannot follow the replica for now; the mount serves what it has and catches up once the replica answers (`redbfs status` shows how far behind it is)");
                }
                self.failing = true;
                s.error = Some(e);
            }
        }
    }

    /// One poll: a newer generation is switched to; the segments that follow what the store
    /// holds are applied, one transaction each.
    async fn poll(&mut self) -> Result<(), Stalled> {
        self.target.load_fence().await?;
        let newest = self
            .newest_generation()
            .await?
            .ok_or_else(|| "the replica holds no complete generation".to_string())?;
        if newest.generation != self.followed.generation {
            self.switch_to(&newest).await?;
        }
        let generation = self.followed.generation.clone();
        let mut segments = self.target.segments(&generation).await?;
        // The store must be at the snapshot's commit or at the end of a segment that stands:
        // otherwise it applied what a fenced writer shipped before its successor's cut was
        // known, and starts again from the snapshot.
        let at = self.followed.commit;
        if at != newest.commit && !segments.iter().any(|l| l.last == at) {
            tracing::warn!(replica = %self.target.shown(), generation = %generation, commit = at, "this follower applied commits a fenced writer shipped; starting again from the generation's snapshot");
            self.switch_to(&newest).await?;
            segments = self.target.segments(&generation).await?;
        }
        let reach = segments.iter().map(|l| l.last).max().unwrap_or(at);
        {
            let mut s = lock(&self.state);
            s.writer_commit = reach.max(s.follower_commit);
            if reach > self.followed.commit && s.behind_since.is_none() {
                s.behind_since = Some(now_ns());
            }
        }
        // Each segment's verified records in one transaction, as `restore --from` applies
        // them; the walk stops at a gap or a segment that does not verify.
        let (fs, state) = (self.fs.clone(), self.state.clone());
        let names = name_rule(fs.limits().names);
        let mut refused = None;
        let mut followed = self.followed.clone();
        let from = (followed.commit, 0);
        let walked = walk(&self.target, &newest, &segments, from, &mut |records| {
            let Some(last) = records.last().map(|r| r.seq()) else {
                return Ok(true);
            };
            let next = Followed {
                commit: last,
                ..followed.clone()
            };
            let started = std::time::Instant::now();
            let first = records.first().map_or(last, |r| r.seq());
            let changed = match fs.store().apply_shipped(&records, &next.meta(), &names) {
                Ok(c) => c,
                Err(crate::store::StoreError::Refused(e)) => {
                    let e = format!("generation {generation}, commits {first}..={last}: {e}");
                    refused = Some(e.clone());
                    return Err(e);
                }
                Err(e) => {
                    return Err(format!(
                        "applying commits up to {last} of {generation}: {e}"
                    ));
                }
            };
            fs.changed_outside(changed);
            followed = next;
            let mut s = lock(&state);
            s.apply_seconds += started.elapsed().as_secs_f64();
            s.follower_commit = last;
            if let Some(t) = records.iter().rev().find_map(|r| r.time()) {
                s.follower_commit_time_ns = Some(t);
            }
            s.batches += 1;
            s.records += records.len() as u64;
            Ok(true)
        })
        .await;
        self.followed = followed;
        if let Some(e) = refused {
            return Err(Stalled::Refused(e));
        }
        let walked = walked?;
        if let Some(b) = walked.broken {
            return Err(Stalled::Failing(format!(
                "generation {generation}: {b}; the follower stays at commit {}",
                self.followed.commit
            )));
        }
        let mut s = lock(&self.state);
        if s.follower_commit >= s.writer_commit {
            s.behind_since = None;
        }
        Ok(())
    }

    /// The newest generation that stands and has a manifest (the one followed from its
    /// manifest read before, while it still stands).
    async fn newest_generation(&mut self) -> Result<Option<Manifest>, String> {
        for name in self.target.generation_names().await?.iter().rev() {
            if let Some(m) = &self.current
                && m.generation == *name
                && self
                    .target
                    .stands(name, super::epoch_of_generation(name), m.commit)
            {
                return Ok(Some(m.clone()));
            }
            if let Some(m) = self.target.manifest(name).await? {
                if m.generation == self.followed.generation {
                    self.current = Some(m.clone());
                }
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    /// The store becomes generation `m`'s snapshot, in one transaction, once it passed the
    /// checks `restore --from` runs.
    async fn switch_to(&mut self, m: &Manifest) -> Result<(), Stalled> {
        let _ = std::fs::remove_file(&self.scratch);
        {
            let mut f = crate::private::create_new(&self.scratch)
                .map_err(|e| crate::private::describe(&self.scratch, e))?;
            let at = self.target.gen_path(&m.generation, "snapshot.redb");
            let got = self.target.get_to_file(&at, &mut f, m.snapshot_bytes).await;
            got.inspect_err(|_| {
                let _ = std::fs::remove_file(&self.scratch);
            })?;
        }
        let what = format!(
            "generation {}'s snapshot (commit {})",
            m.generation, m.commit
        );
        if let Err(e) = checked_store(&self.scratch, &what) {
            let _ = std::fs::remove_file(&self.scratch);
            return Err(Stalled::Refused(e));
        }
        let next = Followed {
            url: self.followed.url.clone(),
            generation: m.generation.clone(),
            commit: m.commit,
        };
        let changed = self
            .fs
            .store()
            .become_snapshot(&self.scratch, m.commit, &next.meta())
            .map_err(|e| format!("switching to generation {}: {e}", m.generation));
        let _ = std::fs::remove_file(&self.scratch);
        self.fs.changed_outside(changed?);
        tracing::info!(replica = %self.target.shown(), generation = %m.generation, commit = m.commit, "following a new generation");
        self.followed = next;
        self.current = Some(m.clone());
        let mut s = lock(&self.state);
        s.generation = Some(m.generation.clone());
        s.follower_commit = m.commit;
        s.writer_commit = s.writer_commit.max(m.commit);
        s.follower_commit_time_ns = Some(m.commit_time_ns);
        s.generations += 1;
        Ok(())
    }
}
