//! What a store keeps about its replicas, in its `meta` table like the limits: the URLs and the
//! schedule, so a plain `redbfs mount` after a restart replicates as before, and the
//! generation each URL holds this store's commits in, so a restart can continue it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::schema::{META_REPLICA_GENERATIONS, META_REPLICAS};
use crate::store::{Store, StoreError, Sync};

const SECOND_NS: u64 = 1_000_000_000;

/// Where a store replicates to, and how often.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    pub urls: Vec<String>,
    /// New records are shipped at least this often while commits happen, ns.
    pub interval_ns: u64,
    /// A new generation (a full snapshot) this often, so a restore replays a bounded log, ns.
    pub snapshot_every_ns: u64,
    /// Generations replaced longer ago than this are removed, ns.
    pub keep_ns: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            urls: Vec::new(),
            interval_ns: SECOND_NS,
            snapshot_every_ns: 86_400 * SECOND_NS,
            keep_ns: 7 * 86_400 * SECOND_NS,
        }
    }
}

impl Settings {
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.interval_ns.max(10_000_000))
    }

    /// What `store` keeps (the defaults when it keeps nothing).
    pub fn stored(store: &Store) -> Settings {
        store
            .read()
            .and_then(|r| r.meta_bytes(META_REPLICAS))
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }
}

/// What `redbfs mount` was given; None keeps what the store recorded.
#[derive(Clone, Debug, Default)]
pub struct ReplicaOverrides {
    /// `--replica` (repeatable); `none` alone stops replicating.
    pub urls: Option<Vec<String>>,
    pub interval_ns: Option<u64>,
    pub snapshot_every_ns: Option<u64>,
    pub keep_ns: Option<u64>,
}

impl ReplicaOverrides {
    fn apply(&self, mut s: Settings) -> Settings {
        if let Some(urls) = &self.urls {
            s.urls = urls.iter().filter(|u| *u != "none").cloned().collect();
        }
        if let Some(v) = self.interval_ns {
            s.interval_ns = v;
        }
        if let Some(v) = self.snapshot_every_ns {
            s.snapshot_every_ns = v;
        }
        if let Some(v) = self.keep_ns {
            s.keep_ns = v;
        }
        s
    }
}

/// The replica settings of a mount: what the store keeps with `o` applied, every URL checked
/// (its form, no credentials in it, not inside `mountpoint`; nothing is contacted), and
/// recorded in the store when they changed (never by a
/// read-only mount). Called right after the store opens: the replicas' feeds start here,
/// before the session's first commit, so a mount can tell whether the store is still where
/// a replica's generation ends (a commit made at mount, such as this one or a reclaim after a
/// crash, then reaches the replica like any other).
pub fn remember(
    store: &Store,
    o: &ReplicaOverrides,
    read_only: bool,
    mountpoint: &std::path::Path,
) -> Result<Settings, String> {
    let stored = Settings::stored(store);
    let settings = o.apply(stored.clone());
    if !read_only {
        refuse_inside_mount(&settings.urls, mountpoint)?;
    }
    for url in &settings.urls {
        super::check_url(url).map_err(|e| {
            format!("{e} (the store keeps this URL: mount with --replica none to drop it)")
        })?;
        super::Target::check(url)?;
    }
    if settings.interval_ns == 0 {
        return Err("--replica-interval must be more than 0".into());
    }
    if !read_only
        && !settings.urls.is_empty()
        && let Err(e) = store.attach_feeds(settings.urls.len())
    {
        tracing::warn!(error = %e, "cannot start the replicas' feeds yet");
    }
    if !read_only && settings != stored {
        let json = serde_json::to_vec(&settings).map_err(|e| e.to_string())?;
        let w = store.write().map_err(|e| e.to_string())?;
        w.put_meta(META_REPLICAS, &json)
            .map_err(|e| e.to_string())?;
        w.commit(Sync::Durable).map_err(|e| e.to_string())?;
    }
    Ok(settings)
}

/// The generation each replica URL holds this store's commits in (`META_REPLICA_GENERATIONS`).
fn generations(bytes: Option<Vec<u8>>) -> BTreeMap<String, String> {
    bytes
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// The generation the store at `url` ships to, as the store recorded it.
pub fn recorded_generation(store: &Store, url: &str) -> Option<String> {
    let bytes = store
        .read()
        .and_then(|r| r.meta_bytes(META_REPLICA_GENERATIONS))
        .ok()?;
    generations(bytes).remove(url)
}

/// Records (or with None forgets) the generation the store ships to at `url`, in a commit of
/// its own (shipped like any other).
pub fn record_generation(
    store: &Store,
    url: &str,
    generation: Option<&str>,
) -> Result<(), StoreError> {
    let mut w = store.write()?;
    w.without_history();
    let mut all = generations(w.meta_bytes(META_REPLICA_GENERATIONS)?);
    let changed = match generation {
        Some(g) => all.insert(url.to_string(), g.to_string()).as_deref() != Some(g),
        None => all.remove(url).is_some(),
    };
    if !changed {
        return Ok(());
    }
    let json = serde_json::to_vec(&all).map_err(|e| StoreError::Io(e.to_string()))?;
    w.put_meta(META_REPLICA_GENERATIONS, &json)?;
    w.commit(Sync::Deferred)
}

/// A restored store ships nowhere until its owner says so (it may be a copy of someone
/// else's store, whose replicas are not this owner's to write), and claims no replica's
/// generation: its first replicated mount starts new ones, never appending to the chain of
/// the store it was copied from. Returns the URLs it dropped.
pub fn disown(store: &Store) -> Result<Vec<String>, StoreError> {
    let mut w = store.write()?;
    w.without_history();
    let urls = w
        .meta_bytes(META_REPLICAS)?
        .and_then(|b| serde_json::from_slice::<Settings>(&b).ok())
        .map(|s| s.urls)
        .unwrap_or_default();
    let settings = w.remove_meta(META_REPLICAS)?;
    if w.remove_meta(META_REPLICA_GENERATIONS)? || settings {
        w.commit(Sync::Durable)?;
    }
    Ok(urls)
}

/// The replica URLs a store keeps (shown redacted), for `status` on an unmounted store.
pub fn stored_urls(r: &crate::store::ReadTxn) -> Vec<String> {
    r.meta_bytes(META_REPLICAS)
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice::<Settings>(&b).ok())
        .map(|s| s.urls.iter().map(|u| super::redact(u)).collect())
        .unwrap_or_default()
}

/// Refuses a `file://` replica inside the mountpoint `mp` (or reached through it): shipping
/// there would write through the mount being served, and the daemon would wait on itself.
/// Decided by device and inode of the nearest existing ancestor of the replica's directory
/// and of its ancestors, so a symlink or a bind mount leading into `mp` counts too.
pub fn refuse_inside_mount(urls: &[String], mp: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mp) else {
        return Ok(());
    };
    let mp_id = (m.dev(), m.ino());
    for url in urls {
        let Some(dir) = url::Url::parse(url)
            .ok()
            .filter(|u| u.scheme() == "file")
            .and_then(|u| u.to_file_path().ok())
        else {
            continue;
        };
        let mut at = dir.as_path();
        while std::fs::metadata(at).is_err() {
            match at.parent() {
                Some(p) => at = p,
                None => break,
            }
        }
        let real = std::fs::canonicalize(at).unwrap_or_else(|_| at.to_path_buf());
        let inside = real
            .ancestors()
            .any(|a| std::fs::metadata(a).is_ok_and(|m| (m.dev(), m.ino()) == mp_id));
        if inside {
            return Err(format!(
                "replica {}: it is inside the mountpoint {}; a replica must live outside the \
                 mount it copies (mount with --replica none to drop it)",
                super::redact(url),
                mp.display()
            ));
        }
    }
    Ok(())
}
