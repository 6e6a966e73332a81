//! The writer role of a replica URL: one writing mount at a time, without a lease server.
//!
//! A writer holds epoch N when it created `epochs/<N>.json` with a conditional put
//! (`PutMode::Create`: S3, GCS, Azure and the local filesystem all refuse to overwrite), so of
//! two writers racing for N exactly one wins. A mount takes epoch N+1 when epoch N was
//! released (`epochs/<N>.released`, written at unmount after the last upload), when its holder
//! was this very store on this host and is no longer running (a crash, then a restart), or
//! when asked to take over (`--takeover`). Otherwise the mount is refused with the holder's
//! host, pid and start time.
//!
//! A new epoch records where the history it continues stands (`Cut`: a generation and the
//! last commit of it that counts). Readers (restore, followers, `replica ls`) read the epochs
//! into a `Fence` and use nothing a writer shipped past the cut of the next epoch; the writer
//! itself looks for the next epoch before each upload and, once it exists, is fenced: it stops
//! shipping and its mount refuses changes (see `ship`).
//!
//! Invariant kept here: an epoch object is only ever created, never overwritten, so at most
//! one writer holds each epoch, and a fenced writer's later uploads lie past its cut.

use std::collections::BTreeMap;

use object_store::path::Path as ObjPath;
use object_store::{PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::{ReadError, Target, decimal20, epoch_of_generation, runtime};
use crate::store::now_ns;

/// Where the history an epoch continues stands: the generation, and its last commit that
/// counts. Anything of an older epoch past it is a fenced writer's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    pub generation: String,
    pub commit: u64,
}

/// What `epochs/<N>.json` says.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EpochRecord {
    pub epoch: u64,
    pub host: String,
    pub pid: u32,
    /// When the holder took the role, ns since the epoch.
    pub started_ns: i64,
    /// The holder's store file.
    pub store: String,
    /// Where the history stood when the role was taken (None: the replica held none).
    pub after: Option<Cut>,
    /// Whether the role was taken from a holder that had not released it.
    #[serde(default)]
    pub takeover: bool,
}

impl EpochRecord {
    /// "host H (pid P, since T)", for messages.
    pub fn holder(&self) -> String {
        format!(
            "host {} (pid {}, store {}, since {})",
            self.host,
            self.pid,
            self.store,
            jiff::Timestamp::from_nanosecond(i128::from(self.started_ns)).map_or_else(
                |_| self.started_ns.to_string(),
                |t| t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()
            )
        )
    }
}

/// The epochs of a replica, as readers use them.
#[derive(Clone, Debug, Default)]
pub struct Fence {
    /// Each epoch's cut (None: it continued no history).
    cuts: BTreeMap<u64, Option<Cut>>,
}

impl Fence {
    /// Reads the epochs of `target` (an unreadable or foreign object is skipped); those
    /// `known` already holds are not read again (an epoch object never changes).
    pub(super) async fn read(target: &Target, known: Option<Fence>) -> Result<Fence, String> {
        let known = known.unwrap_or_default();
        let mut fence = Fence::default();
        for n in epoch_numbers(target).await?.0 {
            if let Some(cut) = known.cuts.get(&n) {
                fence.cuts.insert(n, cut.clone());
            } else if let Some(r) = read_record(target, n).await? {
                fence.cuts.insert(n, r.after);
            }
        }
        Ok(fence)
    }

    /// Whether what the writer of `epoch` shipped to `generation` up to `commit` (a snapshot's
    /// commit, or a segment's last) stands: for every later epoch, it lies at or before the
    /// point that epoch continued from.
    pub fn stands(&self, generation: &str, epoch: u64, commit: u64) -> bool {
        self.cuts.range(epoch + 1..).all(|(_, cut)| match cut {
            None => false,
            Some(c) if c.generation == generation => commit <= c.commit,
            // Names sort by epoch, then by age: an older generation's commits all came
            // before the cut; a newer one of this epoch was started after it.
            Some(c) => generation < c.generation.as_str(),
        })
    }

    /// The newest epoch.
    pub fn newest(&self) -> u64 {
        self.cuts.keys().next_back().copied().unwrap_or(0)
    }
}

fn epoch_path(target: &Target, n: u64, ext: &str) -> ObjPath {
    target.path(&format!("epochs/{n:020}.{ext}"))
}

/// The epochs listed (ascending), and which of them were released.
async fn epoch_numbers(target: &Target) -> Result<(Vec<u64>, Vec<u64>), String> {
    let (_, objects, _) = target.list_dir(&target.path("epochs")).await?;
    let (mut held, mut released) = (Vec::new(), Vec::new());
    for (name, _) in &objects {
        if let Some(n) = name.strip_suffix(".json").and_then(decimal20) {
            held.push(n);
        } else if let Some(n) = name.strip_suffix(".released").and_then(decimal20) {
            released.push(n);
        }
    }
    held.sort_unstable();
    Ok((held, released))
}

/// An epoch object is a few hundred bytes; a larger one is not ours and is not read.
const MAX_EPOCH_BYTES: u64 = 64 * 1024;

/// Epoch `n`'s record; None when it is gone, or is not what a writer puts there (too large,
/// not a regular file, not decoding: skipped with a warning).
async fn read_record(target: &Target, n: u64) -> Result<Option<EpochRecord>, String> {
    let path = epoch_path(target, n, "json");
    let bytes = match target.get_bounded(&path, MAX_EPOCH_BYTES, None).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(None),
        Err(ReadError::Bad(e)) => {
            tracing::warn!(replica = %target.shown(), epoch = n, error = %e, "an epoch object is not a writer's; it is skipped");
            return Ok(None);
        }
        Err(ReadError::Unreachable(e)) => return Err(e),
    };
    match serde_json::from_slice::<EpochRecord>(&bytes) {
        Ok(r) if r.epoch == n => Ok(Some(r)),
        _ => {
            tracing::warn!(replica = %target.shown(), epoch = n, "an epoch object does not decode; it is skipped");
            Ok(None)
        }
    }
}

/// Who holds epoch `n` when its record cannot be read: unknown, and never taken as free.
fn unknown_holder(n: u64) -> EpochRecord {
    EpochRecord {
        epoch: n,
        host: "unknown (its epoch object does not read as a writer's)".into(),
        pid: 0,
        started_ns: 0,
        store: String::new(),
        after: None,
        takeover: true,
    }
}

/// Removes the epochs numbered below `below` (their objects and release markers), never the
/// newest: none of them judges a generation that is left (see `ship`'s pruning).
pub(super) async fn prune(target: &Target, below: u64) -> Result<(), String> {
    let (held, released) = epoch_numbers(target).await?;
    let newest = held.last().copied().unwrap_or(0);
    for n in held.iter().chain(&released) {
        if *n < below && *n < newest {
            for ext in ["released", "json"] {
                target.delete(&epoch_path(target, *n, ext)).await?;
            }
        }
    }
    Ok(())
}

/// The writer role of one replica URL, held by this mount.
#[derive(Clone, Debug)]
pub struct Role {
    pub record: EpochRecord,
}

/// Why the role could not be taken.
#[derive(Debug)]
pub enum Refusal {
    /// Another writer holds it.
    Held(EpochRecord),
    /// This store held the role and another writer took it over meanwhile (this one was
    /// killed, or cut off, before it could learn it).
    TakenOver(EpochRecord),
    /// The replica could not be read or written.
    Unreachable(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Held(r) => write!(
                f,
                "the replica's writer role (epoch {}) is held by {}: one writer per replica URL. \
                 Follow it instead (`redbfs mount MNT --follow URL`), or, if that writer is gone \
                 for good, take the role over with --takeover (from a follower's store or one \
                 restored with `restore --from`)",
                r.epoch,
                r.holder()
            ),
            Refusal::TakenOver(r) => write!(
                f,
                "fenced: this store held the replica's writer role until {} took it over \
                 (epoch {}); the replica's history goes on from there without this store's \
                 later commits. Mount this store with --replica none (or --read-only) to \
                 recover its own changes, follow the replica instead, or take the role back \
                 with --takeover",
                r.holder(),
                r.epoch
            ),
            Refusal::Unreachable(e) => write!(f, "cannot read the replica's writer role: {e}"),
        }
    }
}

/// This host's name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Whether process `pid` runs on this host.
fn running(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Takes the writer role of `target` for the store at `store`: the next epoch, when the
/// newest one was released, or was held by this store on this host by a process that is gone,
/// or `takeover` is asked. `after` is where this store's history stands in the replica (a
/// follower's or a restore's last commit); None takes the newest generation's last commit.
pub(super) async fn acquire(
    target: &Target,
    store: &str,
    takeover: bool,
    after: Option<Cut>,
    held_before: Option<u64>,
) -> Result<Role, Refusal> {
    let unreachable = Refusal::Unreachable;
    let (held, released) = epoch_numbers(target).await.map_err(unreachable)?;
    let newest = held.last().copied();
    let host = host_name();
    if let Some(m) = held_before
        && !takeover
        && held.contains(&(m + 1))
        && let Some(next) = read_record(target, m + 1).await.map_err(unreachable)?
        && next.takeover
    {
        return Err(Refusal::TakenOver(next));
    }
    let mut taken_over = false;
    if let Some(n) = newest
        && !released.contains(&n)
    {
        // An epoch whose record does not read is held by someone unknown, never free.
        let h = read_record(target, n)
            .await
            .map_err(unreachable)?
            .unwrap_or_else(|| unknown_holder(n));
        let restarted =
            h.host == host && h.store == store && (h.pid == std::process::id() || !running(h.pid));
        if takeover {
            tracing::warn!(replica = %target.shown(), epoch = n, "taking the writer role over from {}", h.holder());
            taken_over = true;
        } else if restarted {
            tracing::info!(replica = %target.shown(), epoch = n, pid = h.pid, "the writer role was this store's, held by a daemon that is gone; taking it again");
        } else {
            return Err(Refusal::Held(h));
        }
    }
    target.load_fence().await.map_err(unreachable)?;
    let after = match after {
        Some(cut) => Some(cut),
        None => newest_cut(target).await.map_err(unreachable)?,
    };
    let epoch = newest
        .unwrap_or(0)
        .checked_add(1)
        .ok_or_else(|| unreachable(format!("epoch {} is the last there can be", u64::MAX)))?;
    let record = EpochRecord {
        epoch,
        host,
        pid: std::process::id(),
        started_ns: now_ns(),
        store: store.to_string(),
        after,
        takeover: taken_over,
    };
    let json = serde_json::to_vec_pretty(&record).map_err(|e| unreachable(e.to_string()))?;
    let opts = PutOptions {
        mode: PutMode::Create,
        ..PutOptions::default()
    };
    let path = epoch_path(target, record.epoch, "json");
    let created = super::bounded(&format!("creating {path}"), async {
        match target
            .store
            .put_opts(&path, PutPayload::from(json), opts)
            .await
        {
            Ok(_) => Ok(Ok(())),
            Err(e @ object_store::Error::AlreadyExists { .. }) => Ok(Err(e)),
            Err(e) => Err(super::err(e)),
        }
    })
    .await;
    match created.map_err(unreachable)? {
        Ok(()) => {}
        Err(object_store::Error::AlreadyExists { .. }) => {
            // Another writer took this epoch between our listing and our put.
            return Err(match read_record(target, record.epoch).await {
                Ok(Some(other)) => Refusal::Held(other),
                Ok(None) => unreachable(format!("epoch {} was taken meanwhile", record.epoch)),
                Err(e) => unreachable(e),
            });
        }
        Err(e) => return Err(unreachable(super::err(e))),
    }
    // The fence now holds this epoch too: its own cut applies to everything older.
    target.load_fence().await.map_err(unreachable)?;
    tracing::info!(replica = %target.shown(), epoch = record.epoch, after = ?record.after, "holding the replica's writer role");
    Ok(Role { record })
}

/// The newest generation that stands and the last commit its segments reach.
async fn newest_cut(target: &Target) -> Result<Option<Cut>, String> {
    for name in target.generation_names().await?.iter().rev() {
        if let Some(m) = target.manifest(name).await? {
            // Where its chain verifies to: a takeover continues no further.
            let (commit, _, _) = super::restore::reach(target, &m).await?;
            return Ok(Some(Cut {
                generation: name.clone(),
                commit,
            }));
        }
    }
    Ok(None)
}

impl Role {
    pub fn epoch(&self) -> u64 {
        self.record.epoch
    }

    /// The writer that took the role after this one, if one did: any epoch listed above this
    /// one's (the one right after may have been pruned since, or never have read as a
    /// writer's), the lowest of them named.
    pub(super) async fn superseded(&self, target: &Target) -> Result<Option<EpochRecord>, String> {
        let (held, _) = epoch_numbers(target).await?;
        let Some(&next) = held.iter().find(|&&n| n > self.record.epoch) else {
            return Ok(None);
        };
        Ok(Some(
            read_record(target, next)
                .await?
                .unwrap_or_else(|| unknown_holder(next)),
        ))
    }

    /// Lets the role go (after the last upload of an unmount): the next writer may take it.
    pub(super) async fn release(&self, target: &Target) -> Result<(), String> {
        let body = serde_json::json!({"epoch": self.record.epoch, "released_ns": now_ns()});
        target
            .put(
                &epoch_path(target, self.record.epoch, "released"),
                body.to_string().into_bytes(),
            )
            .await
    }
}

/// The role a store took last at each replica URL (`meta` "replica_roles"), with the host
/// and path it was taken from: a copy of the store elsewhere (a snapshot, a follower) never
/// counts as the store that held it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Roles {
    pub by_url: BTreeMap<String, (u64, String, String)>,
}

impl Roles {
    fn of(store: &crate::store::Store) -> Roles {
        store
            .read()
            .ok()
            .and_then(|r| {
                r.meta_bytes(crate::store::schema::META_ROLES)
                    .ok()
                    .flatten()
            })
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// The epoch this very store (this host, this path) held last at `url`.
    pub fn held(store: &crate::store::Store, url: &str) -> Option<u64> {
        let path = store.path().display().to_string();
        Roles::of(store)
            .by_url
            .get(url)
            .filter(|(_, host, p)| *host == host_name() && *p == path)
            .map(|r| r.0)
    }

    /// Notes that this store holds `epoch` at `url` (outside the commits).
    pub fn note(store: &crate::store::Store, url: &str, epoch: u64) {
        let mut r = Roles::of(store);
        let path = store.path().display().to_string();
        r.by_url.insert(url.to_string(), (epoch, host_name(), path));
        let json = serde_json::to_vec(&r).unwrap_or_default();
        if let Err(e) = store.note_locally(crate::store::schema::META_ROLES, &json) {
            tracing::warn!(error = %e, "could not note the writer role in the store");
        }
    }
}

/// The writer roles of a mount's replicas, taken before it mounts: one per URL, in order
/// (None for a replica out of reach now: its shipper takes the role once it answers). A
/// replica whose role another writer holds, or took over from this store, refuses the mount.
pub fn acquire_all(
    urls: &[String],
    store: &crate::store::Store,
    takeover: bool,
    after: Option<(&str, Cut)>,
) -> Result<Vec<Option<Role>>, String> {
    let rt = runtime()?;
    let path = store.path().display().to_string();
    let mut roles = Vec::new();
    for url in urls {
        let target = Target::open(url)?;
        let cut = after
            .as_ref()
            .filter(|(u, _)| u == url)
            .map(|a| a.1.clone());
        let before = Roles::held(store, url);
        match rt.block_on(acquire(&target, &path, takeover, cut, before)) {
            Ok(role) => {
                Roles::note(store, url, role.epoch());
                roles.push(Some(role));
            }
            Err(e @ (Refusal::Held(_) | Refusal::TakenOver(_))) => {
                return Err(format!("replica {url}: {e}"));
            }
            Err(Refusal::Unreachable(e)) if !takeover => {
                tracing::warn!(replica = %url, error = %e, "cannot reach the replica to take its writer role; the mount goes on and takes it once the replica answers");
                roles.push(None);
            }
            Err(e) => return Err(format!("replica {url}: {e}")),
        }
    }
    Ok(roles)
}

/// What a fenced writer's store notes of each replica that fenced it (`meta` "fenced").
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Fenced {
    /// URL -> the message the fenced mount gave.
    pub by_url: BTreeMap<String, String>,
}

impl Fenced {
    pub fn of(store: &crate::store::Store) -> Fenced {
        store
            .read()
            .ok()
            .and_then(|r| {
                r.meta_bytes(crate::store::schema::META_FENCED)
                    .ok()
                    .flatten()
            })
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Notes that `url` fenced this store (outside the commits: it is about this copy).
    pub fn note(store: &crate::store::Store, url: &str, msg: &str) {
        let mut f = Fenced::of(store);
        f.by_url.insert(url.to_string(), msg.to_string());
        let json = serde_json::to_vec(&f).unwrap_or_default();
        if let Err(e) = store.note_locally(crate::store::schema::META_FENCED, &json) {
            tracing::warn!(error = %e, "could not note the fencing in the store");
        }
    }

    /// Forgets the fencing of `urls` (a takeover made this store the writer again).
    pub fn forget(store: &crate::store::Store, urls: &[String]) {
        let mut f = Fenced::of(store);
        let before = f.by_url.len();
        f.by_url.retain(|u, _| !urls.contains(u));
        if f.by_url.len() != before {
            let json = serde_json::to_vec(&f).unwrap_or_default();
            if let Err(e) = store.note_locally(crate::store::schema::META_FENCED, &json) {
                tracing::warn!(error = %e, "could not forget the fencing in the store");
            }
        }
    }
}

/// The epoch of the writer that started `generation` (0 before epochs).
pub fn generation_epoch(generation: &str) -> u64 {
    epoch_of_generation(generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(g: &str, c: u64) -> Option<Cut> {
        Some(Cut {
            generation: g.into(),
            commit: c,
        })
    }

    /// A takeover at commit 10 of generation A: epoch 1's segments of A up to 10 stand, its
    /// later ones and a generation it started after A do not; epoch 2's all stand.
    #[test]
    fn a_fence_keeps_what_came_before_the_cut() {
        let a = "e00000000000000000001-1";
        let later = "e00000000000000000001-2";
        let mine = "e00000000000000000002-0";
        let mut f = Fence::default();
        f.cuts.insert(1, cut("0000-old", 3));
        f.cuts.insert(2, cut(a, 10));
        assert!(f.stands(a, 1, 10));
        assert!(!f.stands(a, 1, 11));
        assert!(!f.stands(later, 1, 5), "started after the cut");
        assert!(f.stands(a, 2, 50));
        assert!(f.stands(mine, 2, 50));
        assert!(
            f.stands("0000-old", 0, 3),
            "an older generation stands whole"
        );
        f.cuts.insert(3, None);
        assert!(!f.stands(mine, 2, 1), "epoch 3 continued nothing");
        assert_eq!(f.newest(), 3);
    }
}
