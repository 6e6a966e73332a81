//! Shipping: one thread per replica of a mount, beside the commit path and never in its way.
//! Each continues the replica's newest generation when that is provably this store's own
//! unbroken chain (the store recorded it as its generation there, and the commit the store
//! was at when its feed started is the last one the generation's segments reach), and starts
//! a new generation (a snapshot of the store) otherwise; then, at least every interval while
//! commits happen, it uploads the records its feed holds as one segment following the last. A
//! new generation starts on the snapshot schedule and whenever the feed's chain breaks. An
//! upload that fails is tried again at the next interval with everything that has committed
//! since: an unreachable replica costs the mount nothing but memory for the records (up to the
//! feed's bound, then a snapshot carries on), and logs one warning per outage.
//!
//! The shipper also checks, cheaply, that its generation can still be restored from (its
//! manifest and snapshot there, its segments listed without a gap up to what it shipped):
//! every ten intervals (at most a minute apart) and after every failed request. A generation
//! that cannot (its directory deleted, an object removed) is never reported as up to date: a
//! warning says what happened and a new generation starts. Every request is bounded
//! (`io_timeout`); stopping makes at most one bounded last upload and says what it left
//! unshipped, and never waits for a request stuck in the kernel.
//!
//! Each shipper holds its replica's writer role (`epoch`), taken before the mount: before
//! the uploads of each round it checks that no newer writer took the role over; once one did,
//! the mount is fenced: it ships nothing more, refuses every change (EROFS) and says so once.
//! A clean stop releases the role after the last upload.
//!
//! Invariant kept here: a segment is uploaded only after the one before it (or the snapshot)
//! was uploaded whole, and records leave the feed only once uploaded.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use object_store::{ObjectStoreExt, WriteMultipart};
use serde::Serialize;
use serde_json::{Value, json};

use super::config::{record_generation, recorded_generation};
use super::epoch::{self, EpochRecord, Refusal, Role};
use super::{
    Manifest, Settings, Target, generation_name, io_timeout, runtime, segment_name, started_of,
};
use crate::fs::Fs;
use crate::store::{Batch, Feed, Record, SEGMENT_BYTES, encode_segment, now_ns};
/// A snapshot up to this size goes up in one request; larger ones in parts of this size.
const PART_BYTES: usize = 16 * 1024 * 1024;
/// How often old generations are looked for (and after each new generation).
const PRUNE_EVERY: Duration = Duration::from_secs(600);
/// Why a generation is dropped when its manifest went away.
const GENERATION_GONE: &str = "its manifest is gone";
/// The generation's health is checked at least this often (and every ten intervals).
const CHECK_EVERY: Duration = Duration::from_secs(60);

/// What one replica holds once the mount's replication has stopped: what `redbfs unmount`
/// prints. The URL is redacted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Unshipped {
    pub url: String,
    /// The last commit the replica holds.
    pub shipped_commit: u64,
    /// The last commit the store made.
    pub commits: u64,
    /// A newer writer took the role over: what the replica lacks stays in this store only.
    #[serde(default)]
    pub fenced: bool,
}

impl Unshipped {
    /// The commits the replica was left without, if any.
    pub fn missing(&self) -> Option<std::ops::RangeInclusive<u64>> {
        (self.shipped_commit < self.commits).then(|| self.shipped_commit + 1..=self.commits)
    }
}

/// What a replica has shipped, for `redbfs status`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Lag {
    pub url: String,
    pub generation: Option<String>,
    /// The last commit the replica holds.
    pub shipped_commit: u64,
    /// When an upload last succeeded, ns since the epoch.
    pub last_upload_ns: Option<i64>,
    /// Why the last attempt failed, while the replica is out of reach.
    pub error: Option<String>,
    pub snapshots: u64,
    pub snapshot_bytes: u64,
    pub segments: u64,
    /// Bytes of segments uploaded, and of the log records they hold.
    pub segment_bytes: u64,
    pub record_bytes: u64,
    pub records: u64,
    /// Why the generation last shipped to could not be restored from, when the shipper found
    /// out (a new generation then started).
    pub problem: Option<String>,
    /// The writer role's epoch this mount holds (None until it took it).
    pub epoch: Option<u64>,
    /// Set once a newer writer took the role over: why this mount ships nothing more.
    pub fenced: Option<String>,
}

#[derive(Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Stop {
    /// Waits up to `d`; whether the replication is stopping.
    fn wait(&self, d: Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(|p| p.into_inner());
        let (guard, _) = self
            .wake
            .wait_timeout_while(guard, d, |stopped| !*stopped)
            .unwrap_or_else(|p| p.into_inner());
        *guard
    }
}

/// The replication of a mount: its shipping threads and what each has shipped.
pub struct Replication {
    fs: Arc<Fs>,
    stop: Arc<Stop>,
    /// Taken by `stop`; each thread's end is also said on `ended`.
    threads: Mutex<Vec<JoinHandle<()>>>,
    ended: Mutex<std::sync::mpsc::Receiver<()>>,
    lags: Vec<(Arc<Mutex<Lag>>, Arc<Feed>)>,
}

fn lock(m: &Mutex<Lag>) -> MutexGuard<'_, Lag> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Replication {
    /// Starts shipping `fs`'s commits to each replica of `settings`, holding the writer roles
    /// `roles` (one per URL, in order; None: taken once the replica answers); None when
    /// there is no replica.
    pub fn start(
        fs: &Arc<Fs>,
        settings: &Settings,
        mut roles: Vec<Option<Role>>,
    ) -> Result<Option<Replication>, String> {
        if settings.urls.is_empty() || fs.is_read_only() {
            return Ok(None);
        }
        // Each URL's form was checked when the store opened; a `file://` directory is made
        // and opened on the shipper's own thread, so a hung share never holds the mount.
        let urls = settings.urls.clone();
        // Attached when the store opened (`config::remember`), so `at` is where it was then.
        let at = fs
            .store()
            .attach_feeds(urls.len())
            .map_err(|e| format!("starting the replicas' feeds: {e}"))?;
        if at.feeds.len() != urls.len() {
            return Err("the replicas changed since the store opened".into());
        }
        let stop = Arc::new(Stop::default());
        let (ended_tx, ended) = std::sync::mpsc::channel();
        let mut r = Replication {
            fs: fs.clone(),
            stop: stop.clone(),
            threads: Mutex::new(Vec::new()),
            ended: Mutex::new(ended),
            lags: Vec::new(),
        };
        roles.resize(urls.len(), None);
        for (i, ((url, feed), role)) in urls
            .into_iter()
            .zip(at.feeds.clone())
            .zip(roles)
            .enumerate()
        {
            let lag = Arc::new(Mutex::new(Lag {
                url: url.clone(),
                epoch: role.as_ref().map(Role::epoch),
                ..Lag::default()
            }));
            r.lags.push((lag.clone(), feed.clone()));
            tracing::info!(replica = %super::redact(&url), "replicating to");
            let (fs, settings, stop, ended) =
                (fs.clone(), settings.clone(), stop.clone(), ended_tx.clone());
            let from = (at.from, at.from_time);
            let t = std::thread::Builder::new()
                .name(format!("replica-{i}"))
                .spawn(move || {
                    if let Some(target) = open_target(&url, &lag, &settings, &stop) {
                        let scratch = scratch_path(fs.store().path(), i);
                        let shipper = Shipper {
                            fs,
                            target,
                            feed,
                            from,
                            settings,
                            lag,
                            generation: None,
                            pruned: None,
                            checked: None,
                            outage: false,
                            scratch,
                            role,
                            fence_read: false,
                            role_checked: false,
                            fenced: false,
                        };
                        shipper.run(&stop);
                    }
                    let _ = ended.send(());
                })
                .map_err(|e| format!("starting the replica thread: {e}"))?;
            r.threads
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .push(t);
        }
        Ok(Some(r))
    }

    /// Ships what is left (one bounded attempt, skipped for a replica out of reach) and
    /// stops; returns once every shipping thread has ended, or after a bounded wait for one
    /// still in a request (it is left behind: the process exits without it). Then says, per
    /// replica, what was left unshipped. A checkpoint first, so closing the store adds no
    /// commit the replicas never see and the next mount can continue their generations. Takes
    /// `&self`: a status request still holding the replication cannot keep it from shipping.
    pub fn stop(&self) -> Vec<Unshipped> {
        if !self.fs.store().is_failed()
            && let Err(e) = self.fs.store().checkpoint()
        {
            tracing::warn!(error = %e, "the checkpoint before the replicas' last upload failed");
        }
        *self.stop.stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.stop.wake.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        // A thread may be in the middle of a step (a new generation's snapshot) when asked:
        // its requests are bounded, the step as a whole gets this long.
        let deadline = Instant::now() + io_timeout() * 3 + Duration::from_secs(5);
        let ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        let mut left = threads.len();
        while left > 0 {
            let wait = deadline.saturating_duration_since(Instant::now());
            match ended.recv_timeout(wait) {
                Ok(()) => left -= 1,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!("a replica's last upload did not end in time; it is abandoned");
                    break;
                }
                // Every thread has ended (one without saying so: see below).
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        for t in threads {
            if t.is_finished() && t.join().is_err() {
                tracing::error!("a replica's shipping thread failed");
            }
        }
        let commits = self.fs.store().log_state().0;
        let mut summary = Vec::with_capacity(self.lags.len());
        for (lag, _) in &self.lags {
            let l = lock(lag);
            let left = Unshipped {
                url: super::redact(&l.url),
                shipped_commit: l.shipped_commit,
                commits,
                fenced: l.fenced.is_some(),
            };
            if left.fenced {
                tracing::warn!(replica = %left.url, shipped = l.shipped_commit, "the replica was taken over by another writer; it goes on without this store");
            } else if let Some(r) = left.missing() {
                tracing::warn!(replica = %left.url, shipped = l.shipped_commit, "the replica was left without commits {}..={} (the next mount starts a new generation)", r.start(), r.end());
            } else {
                tracing::info!(replica = %left.url, commit = l.shipped_commit, "the replica holds every commit");
            }
            summary.push(left);
        }
        summary
    }

    /// Each replica's state, with how far behind commit `commits` it is.
    pub fn status(&self, commits: u64) -> Value {
        let now = now_ns();
        let list: Vec<Value> = self
            .lags
            .iter()
            .map(|(lag, feed)| {
                let l = lock(lag).clone();
                let behind = commits.saturating_sub(l.shipped_commit);
                let since = feed
                    .oldest_after(l.shipped_commit)
                    .or(l.last_upload_ns)
                    .unwrap_or(now);
                let seconds = if behind == 0 {
                    0.0
                } else {
                    (now - since).max(0) as f64 / 1e9
                };
                let mut v = serde_json::to_value(&l).unwrap_or_default();
                v["url"] = json!(super::redact(&l.url));
                v["commits_behind"] = json!(behind);
                v["seconds_behind"] = json!((seconds * 10.0).round() / 10.0);
                v
            })
            .collect();
        Value::Array(list)
    }
}

/// Opens the replica at `url` (making a `file://` directory), trying again every interval
/// while it fails (the error shows in `status`, and is logged once); None once stopping.
fn open_target(url: &str, lag: &Mutex<Lag>, settings: &Settings, stop: &Stop) -> Option<Target> {
    let mut logged = false;
    loop {
        match Target::open(url) {
            Ok(t) => {
                lock(lag).error = None;
                return Some(t);
            }
            Err(e) => {
                if !logged {
                    tracing::warn!(replica = %super::redact(url), error = %e, "cannot open the replica; trying again every interval");
                    logged = true;
                }
                lock(lag).error = Some(e);
            }
        }
        if stop.wait(settings.interval()) {
            return None;
        }
    }
}

/// A private scratch file beside the store for the snapshot of a new generation.
fn scratch_path(store: &std::path::Path, i: usize) -> PathBuf {
    let name = store
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    crate::private::parent_dir(store)
        .join(format!(".{name}.replica-{}-{i}.tmp", std::process::id()))
}

struct Generation {
    name: String,
    log_id: u64,
    /// The last commit uploaded (the snapshot's, then each segment's last).
    shipped: u64,
    /// When the generation started (its snapshot), ns since the epoch.
    started_ns: i64,
}

/// One replica's shipping thread.
struct Shipper {
    fs: Arc<Fs>,
    target: Target,
    feed: Arc<Feed>,
    /// The feed holds every commit after this one; the second, when the last commit that
    /// records its time committed then (see `Attached`).
    from: (u64, i64),
    settings: Settings,
    lag: Arc<Mutex<Lag>>,
    generation: Option<Generation>,
    pruned: Option<Instant>,
    /// When the generation's health was last checked (None: due).
    checked: Option<Instant>,
    outage: bool,
    scratch: PathBuf,
    /// The writer role (None until taken: the replica was out of reach at mount).
    role: Option<Role>,
    /// Whether the epochs were read (once, at the first round).
    fence_read: bool,
    /// Whether this round has checked the role yet (once per round with uploads).
    role_checked: bool,
    /// A newer writer took the role: nothing more is shipped.
    fenced: bool,
}

impl Shipper {
    fn run(mut self, stop: &Stop) {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(replica = %self.target.shown(), "{e}; not replicating");
                return;
            }
        };
        let mut stopping = false;
        loop {
            self.role_checked = false;
            if stopping {
                // The last upload: what the feed holds, bounded as a whole; no new generation.
                if !self.outage && !self.fenced && self.generation.is_some() {
                    // The timer is made inside the runtime, which it needs.
                    // A writer taken over while it sat idle learns it here, before it
                    // would call the replica whole and release a role no longer its own.
                    let last = async {
                        if self.may_upload().await? {
                            self.ship_pending().await
                        } else {
                            Ok(())
                        }
                    };
                    let result = rt
                        .block_on(async { tokio::time::timeout(io_timeout(), last).await })
                        .unwrap_or_else(|_| Err("the last upload took too long".into()));
                    self.report(result);
                }
                break;
            }
            let result = rt.block_on(self.step());
            self.report(result);
            if self.fenced {
                break;
            }
            stopping = stop.wait(self.settings.interval());
        }
        if stopping
            && !self.fenced
            && !self.outage
            && let Some(role) = &self.role
        {
            let released = rt
                .block_on(async {
                    tokio::time::timeout(io_timeout(), role.release(&self.target)).await
                })
                .unwrap_or_else(|_| Err("releasing took too long".into()));
            match released {
                Ok(()) => {
                    tracing::info!(replica = %self.target.shown(), epoch = role.epoch(), "released the replica's writer role")
                }
                Err(e) => {
                    tracing::warn!(replica = %self.target.shown(), error = %e, "could not release the replica's writer role; the next writer must take it over (--takeover), or this store takes it again at its next mount")
                }
            }
        }
        drop(rt);
        let _ = std::fs::remove_file(&self.scratch);
    }

    /// Whether this mount may upload: it holds the writer role (taken now if the replica was
    /// out of reach at mount) and no newer writer took it over. Once one did, fences the mount.
    async fn may_upload(&mut self) -> Result<bool, String> {
        if self.fenced {
            return Ok(false);
        }
        if self.role_checked {
            return Ok(true);
        }
        let store = self.fs.store().path().display().to_string();
        let newer = match &self.role {
            None => match epoch::acquire(
                &self.target,
                &store,
                false,
                None,
                epoch::Roles::held(self.fs.store(), &self.target.url),
            )
            .await
            {
                Ok(role) => {
                    lock(&self.lag).epoch = Some(role.epoch());
                    epoch::Roles::note(self.fs.store(), &self.target.url, role.epoch());
                    self.role = Some(role);
                    None
                }
                Err(Refusal::Held(h) | Refusal::TakenOver(h)) => Some(h),
                Err(Refusal::Unreachable(e)) => return Err(e),
            },
            Some(role) => role.superseded(&self.target).await?,
        };
        if let Some(newer) = newer {
            self.fence(&newer);
            return Ok(false);
        }
        self.role_checked = true;
        Ok(true)
    }

    /// A newer writer holds the role: this mount ships nothing more and refuses changes.
    fn fence(&mut self, newer: &EpochRecord) {
        let shipped = lock(&self.lag).shipped_commit;
        let held = newer
            .after
            .as_ref()
            .map_or(shipped, |c| c.commit.min(shipped));
        let msg = format!(
            "fenced: replica {} was taken over by {} (epoch {}); this mount is read-only from \
             now on and ships nothing more. The replica holds this store's commits up to {}; \
             later ones stay in this store only",
            self.target.shown(),
            newer.holder(),
            newer.epoch,
            held
        );
        tracing::error!("{msg}");
        // Status says so before the first change is refused: whoever meets EROFS and asks
        // why finds the replica that fenced the mount.
        let mut lag = lock(&self.lag);
        lag.fenced = Some(msg.clone());
        lag.shipped_commit = held;
        drop(lag);
        self.fs.store().freeze(msg.clone());
        epoch::Fenced::note(self.fs.store(), &self.target.url, &msg);
        self.fenced = true;
    }

    /// One warning when the replica goes out of reach, one line when it is back.
    fn report(&mut self, result: Result<(), String>) {
        let mut lag = lock(&self.lag);
        match result {
            Ok(()) => {
                if self.outage {
                    tracing::info!(replica = %self.target.shown(), commit = lag.shipped_commit, "the replica is reachable again and has caught up");
                }
                self.outage = false;
                lag.error = None;
            }
            Err(e) => {
                if !self.outage {
                    tracing::warn!(replica = %self.target.shown(), error = %e, "cannot reach the replica; the mount carries on, and the replica catches up once it is back (`redbfs status` shows how far behind it is)");
                }
                self.outage = true;
                lag.error = Some(e);
                // Whatever failed may have been the generation going away: check it next.
                self.checked = None;
            }
        }
    }

    async fn step(&mut self) -> Result<(), String> {
        if self.fenced {
            return Ok(());
        }
        if !self.fence_read {
            self.target.load_fence().await?;
            self.fence_read = true;
        }
        if self.generation.is_none() && !self.feed.is_broken() {
            self.resume().await;
        }
        let due = match &self.generation {
            None => true,
            Some(g) => {
                now_ns().saturating_sub(g.started_ns) >= self.settings.snapshot_every_ns as i64
            }
        };
        if due || self.feed.is_broken() {
            self.start_generation().await?;
        }
        let check_every = (self.settings.interval() * 10).min(CHECK_EVERY);
        if self.checked.is_none_or(|t| t.elapsed() >= check_every) {
            // An idle writer learns of a takeover too, not only at its next upload.
            if !self.may_upload().await? {
                return Ok(());
            }
            if let Some(problem) = self.check_generation().await? {
                let g = self
                    .generation
                    .as_ref()
                    .map_or(String::new(), |g| g.name.clone());
                tracing::warn!(replica = %self.target.shown(), generation = %g, "the replica's generation can no longer be restored from ({problem}); starting a new generation");
                lock(&self.lag).problem = Some(format!("generation {g}: {problem}"));
                self.start_generation().await?;
                // Without its manifest nothing of it can be restored: what this shipper put
                // there meanwhile goes (a generation still holding its manifest stays, as it
                // restores up to its gap).
                if problem == GENERATION_GONE
                    && let Err(e) = self.target.remove_generation(&g).await
                {
                    tracing::info!(replica = %self.target.shown(), generation = %g, error = %e, "cannot remove what is left of the generation; pruning will");
                }
            }
            self.checked = Some(Instant::now());
        }
        self.ship_pending().await?;
        if self.pruned.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            self.prune().await?;
            self.pruned = Some(Instant::now());
        }
        Ok(())
    }

    /// Uploads what the feed holds, as segments following the last one shipped (a new
    /// generation first when the chain broke).
    async fn ship_pending(&mut self) -> Result<(), String> {
        loop {
            if self.fenced {
                return Ok(());
            }
            let after = self.generation.as_ref().map_or(0, |g| g.shipped);
            match self.feed.take(after, SEGMENT_BYTES) {
                Batch::Broken => self.start_generation().await?,
                Batch::Records(r) if r.is_empty() => return Ok(()),
                Batch::Records(r) => self.ship(r).await?,
            }
        }
    }

    /// Whether the current generation can still be restored from, by what the replica lists
    /// (no segment read): its manifest, its snapshot at its size, and segments reaching what
    /// was shipped without a gap. Why not, when it cannot; an error when the replica cannot
    /// be read.
    async fn check_generation(&self) -> Result<Option<String>, String> {
        let Some(g) = &self.generation else {
            return Ok(None);
        };
        let Some(m) = self.target.manifest(&g.name).await? else {
            return Ok(Some(GENERATION_GONE.into()));
        };
        let snapshot = self
            .target
            .size_of(&self.target.gen_path(&g.name, "snapshot.redb"))
            .await?;
        if snapshot != Some(m.snapshot_bytes) {
            return Ok(Some("its snapshot is gone or changed".into()));
        }
        let mut at = m.commit;
        for l in self.target.segments(&g.name).await? {
            if l.first > at + 1 || at >= g.shipped {
                break;
            }
            at = at.max(l.last);
        }
        if at < g.shipped {
            return Ok(Some(format!(
                "commits {}..={} are missing from its segments",
                at + 1,
                g.shipped
            )));
        }
        Ok(None)
    }

    /// Continues the generation the store recorded for this replica when it is the replica's
    /// newest and its segments reach, without a gap, exactly the commit the feed starts after.
    /// Otherwise (or when the replica cannot be read) the store forgets it, so no later mount
    /// appends to a chain this store may have diverged from; a new generation follows.
    async fn resume(&mut self) {
        let store = self.fs.store();
        let Some(recorded) = recorded_generation(store, &self.target.url) else {
            return;
        };
        match self.resumable(&recorded).await {
            Ok(Some(g)) => {
                tracing::info!(replica = %self.target.shown(), generation = %g.name, commit = g.shipped, "replica: continuing the generation");
                let mut lag = lock(&self.lag);
                lag.generation = Some(g.name.clone());
                lag.shipped_commit = g.shipped;
                lag.last_upload_ns = Some(now_ns());
                drop(lag);
                self.feed.restart(g.shipped);
                self.generation = Some(g);
                return;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::info!(replica = %self.target.shown(), error = %e, "replica: cannot read the generation to continue; starting a new one");
            }
        }
        if let Err(e) = record_generation(store, &self.target.url, None) {
            tracing::warn!(replica = %self.target.shown(), error = %e, "replica: cannot forget the generation the store recorded");
        }
    }

    /// The generation `name` to continue, if it is the newest restorable one and ends
    /// exactly where the store was when its feed started: the same last commit, made at the
    /// same time (a number alone may have been taken again after a crash lost the commit the
    /// replica holds).
    async fn resumable(&self, name: &str) -> Result<Option<Generation>, String> {
        let mut newest = None;
        for n in self.target.generation_names().await?.iter().rev() {
            if let Some(m) = self.target.manifest(n).await? {
                newest = Some((n.clone(), m));
                break;
            }
        }
        let Some((newest, m)) = newest else {
            return Ok(None);
        };
        if newest != name {
            return Ok(None);
        }
        let (commit, time, whole) = super::restore::reach(&self.target, &m).await?;
        if m.generation != newest || !whole || (commit, time) != self.from {
            return Ok(None);
        }
        Ok(Some(Generation {
            name: newest,
            log_id: m.log_id,
            shipped: self.from.0,
            started_ns: m.started_ns,
        }))
    }

    /// Uploads one segment following the last one shipped.
    async fn ship(&mut self, records: Vec<(u64, Record)>) -> Result<(), String> {
        if !self.may_upload().await? {
            return Ok(());
        }
        let epoch = self.role.as_ref().map_or(0, Role::epoch);
        let g = self.generation.as_mut().ok_or("no generation")?;
        let (first, last) = (records[0].0, records[records.len() - 1].0);
        let bytes = encode_segment(g.log_id, records.iter().map(|r| (r.0, r.1.as_slice())));
        let size = bytes.len() as u64;
        let path = self
            .target
            .gen_path(&g.name, &segment_name(first, last, epoch));
        self.target.put(&path, bytes).await?;
        g.shipped = last;
        self.feed.release(last);
        let mut lag = lock(&self.lag);
        lag.shipped_commit = last;
        lag.last_upload_ns = Some(now_ns());
        lag.segments += 1;
        lag.segment_bytes += size;
        lag.records += records.len() as u64;
        lag.record_bytes += records.iter().map(|r| r.1.len() as u64).sum::<u64>();
        Ok(())
    }

    /// A new generation: a snapshot of the store now, uploaded whole, then its manifest.
    async fn start_generation(&mut self) -> Result<(), String> {
        if !self.may_upload().await? {
            return Ok(());
        }
        let epoch = self.role.as_ref().map_or(0, Role::epoch);
        let _ = std::fs::remove_file(&self.scratch);
        let taken = (|| {
            let r = self.fs.store().read()?;
            let commit = r.commit_number()?;
            let time = r.last_commit()?.unwrap_or(0);
            r.copy_to(&self.scratch, &mut |_| {})?;
            Ok::<_, crate::store::StoreError>((commit, time))
        })();
        let (commit, commit_time_ns) = taken.map_err(|e| {
            let _ = std::fs::remove_file(&self.scratch);
            format!("taking a snapshot for the replica: {e}")
        })?;
        let started_ns = now_ns();
        let name = generation_name(epoch, started_ns, random() as u32);
        let uploaded = self.upload_snapshot(&name).await;
        let _ = std::fs::remove_file(&self.scratch);
        let snapshot_bytes = uploaded?;
        let manifest = Manifest {
            version: 1,
            generation: name.clone(),
            log_id: random(),
            commit,
            commit_time_ns,
            started_ns,
            snapshot_bytes,
        };
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| e.to_string())?;
        let at = self.target.gen_path(&name, "manifest.json");
        self.target.put(&at, json).await?;
        let whole = self.feed.restart(commit);
        tracing::info!(replica = %self.target.shown(), generation = %name, commit, bytes = snapshot_bytes, "replica: new generation");
        if !whole {
            tracing::warn!(replica = %self.target.shown(), generation = %name, commit, "the replica's feed let go of commits after this snapshot while it uploaded; another snapshot follows");
        }
        // The store says which generation it ships to, in a commit this generation ships.
        if let Err(e) = record_generation(self.fs.store(), &self.target.url, Some(&name)) {
            tracing::warn!(replica = %self.target.shown(), error = %e, "replica: cannot record the generation in the store; the next mount starts a new one");
        }
        self.generation = Some(Generation {
            name,
            log_id: manifest.log_id,
            shipped: commit,
            started_ns,
        });
        self.checked = Some(Instant::now());
        let mut lag = lock(&self.lag);
        lag.generation = Some(manifest.generation);
        lag.shipped_commit = commit;
        lag.last_upload_ns = Some(now_ns());
        lag.snapshots += 1;
        lag.snapshot_bytes += snapshot_bytes;
        drop(lag);
        // A new generation may let an old one go.
        self.pruned = None;
        Ok(())
    }

    /// Uploads the scratch snapshot as the generation's `snapshot.redb`; its size.
    async fn upload_snapshot(&self, generation: &str) -> Result<u64, String> {
        use std::io::Read;
        let path = self.target.gen_path(generation, "snapshot.redb");
        let mut file = std::fs::File::open(&self.scratch).map_err(|e| e.to_string())?;
        let size = file.metadata().map_err(|e| e.to_string())?.len();
        if size as usize <= PART_BYTES {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
            self.target.put(&path, bytes).await?;
            return Ok(size);
        }
        let what = format!("uploading {path}");
        let upload = super::bounded(&what, async {
            self.target
                .store
                .put_multipart(&path)
                .await
                .map_err(super::err)
        })
        .await?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buf = vec![0u8; PART_BYTES];
        loop {
            let n = file.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            super::bounded(&what, async {
                w.wait_for_capacity(4).await.map_err(super::err)
            })
            .await?;
            w.write(&buf[..n]);
        }
        super::bounded(&what, async { w.finish().await.map_err(super::err) }).await?;
        Ok(size)
    }

    /// Removes the generations no point of the last `keep` needs: every one older than a
    /// restorable generation that itself started more than `keep` ago. Never the current one.
    async fn prune(&self) -> Result<(), String> {
        let cutoff = now_ns().saturating_sub(self.settings.keep_ns as i64);
        let current = self.generation.as_ref().map(|g| g.name.as_str());
        let mut covered = false;
        for name in self.target.generation_names().await?.iter().rev() {
            if Some(name.as_str()) == current {
                // Everything older than the current generation may go only by `keep`.
            } else if covered {
                self.target.remove_generation(name).await?;
                tracing::info!(replica = %self.target.shown(), generation = %name, "replica: removed an old generation");
                continue;
            }
            let old = started_of(name).is_some_and(|t| t < cutoff);
            if old && self.target.manifest(name).await?.is_some() {
                covered = true;
            }
        }
        // Every mount takes an epoch: those older than every generation left judge nothing
        // any more (a generation's segments are of its epoch or later).
        let names = self.target.generation_names().await?;
        if let Some(oldest) = names.iter().map(|n| super::epoch_of_generation(n)).min() {
            epoch::prune(&self.target, oldest).await?;
        }
        Ok(())
    }
}

/// A random u64 (nonzero).
fn random() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let v = if n == 8 {
        u64::from_le_bytes(b)
    } else {
        now_ns() as u64 ^ ((std::process::id() as u64) << 32)
    };
    v.max(1)
}
