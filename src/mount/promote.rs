//! Promoting a live follower to the writer of the replica it follows (`redbfs promote MNT`),
//! without unmounting: the kernel mount turns read-write, the follower stops after what it
//! has verified and applied, the store takes the replica's next epoch from that commit (the
//! previous writer is fenced at its next upload), unfreezes and ships to the URL.
//!
//! Invariant kept here: until the epoch is taken the store stays frozen, so no change reaches
//! it that the replica's history does not hold; a promotion that fails before then leaves
//! the mount a follower (following again, read-only), and one made through fusermount3,
//! which cannot remount, changes nothing.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::control::Daemon;
use crate::replica::follow::{Followed, Follower};
use crate::replica::{ReplicaOverrides, Replication, Settings, epoch};

/// Serves `{"op":"promote","replica_interval_ns":N?}` on a follower's daemon: the replica
/// URL, the epoch taken and the commit the new writer continues from.
pub fn promote(daemon: &Daemon, req: &Value) -> Result<Value, String> {
    let _one = daemon.promoting.lock().unwrap_or_else(|p| p.into_inner());
    let interval_ns = match &req["replica_interval_ns"] {
        Value::Null => None,
        v => Some(
            v.as_u64()
                .filter(|&n| n > 0)
                .ok_or("replica_interval_ns must be a number of nanoseconds above 0")?,
        ),
    };
    let fs = daemon.fs()?;
    let follower = daemon
        .follower_handle()
        .ok_or("this mount follows no replica: only a follower is promoted")?;
    let url = Followed::of(fs.store())
        .ok_or("the store records no replica it follows")?
        .url;
    let mp = &daemon.mountpoint;
    let by_hand = format!(
        "promote it by hand: `redbfs unmount {mp}`, then `redbfs mount {mp} --store {store} \
         --replica {url} --takeover`",
        mp = mp.display(),
        store = daemon.store.display(),
        url = crate::replica::redact(&url),
    );
    // First the kernel mount: a mount that cannot be remounted changes nothing; meanwhile the
    // store, still frozen, refuses every change.
    super::device::remount(mp, false)
        .map_err(|e| format!("{e}; the mount stays a follower: {by_hand}"))?;
    follower.stop();
    daemon.set_follower(None);
    let followed = Followed::of(fs.store()).ok_or("the store records no replica it follows")?;
    let cut = Followed::cut_for(fs.store(), &url);
    let roles = epoch::acquire_all(
        std::slice::from_ref(&url),
        fs.store(),
        true,
        cut.map(|c| (url.as_str(), c)),
    );
    let roles = match roles {
        Ok(r) => r,
        Err(e) => {
            // Back to following: read-only again, from where it stood.
            let _ = super::device::remount(mp, true);
            match Follower::start(&fs, &url, follower.interval) {
                Ok(f) => daemon.set_follower(Some(Arc::new(f))),
                Err(e) => tracing::error!("{e}; not following"),
            }
            return Err(format!("{e}; the mount stays a follower"));
        }
    };
    let taken = roles.iter().flatten().map(|r| r.epoch()).max();
    // Open files keep the version they opened as copies: once it takes changes, a read
    // transaction they held would keep the store from reusing what they free.
    fs.settle_pins(&[], true);
    fs.store().unfreeze();
    let overrides = ReplicaOverrides {
        urls: Some(vec![url.clone()]),
        interval_ns,
        ..ReplicaOverrides::default()
    };
    let made_writer = crate::replica::config::remember(fs.store(), &overrides, false, mp)
        .and_then(|_| {
            epoch::Fenced::forget(fs.store(), std::slice::from_ref(&url));
            // The store is a writer's now: a later takeover must not go back to this point.
            Followed::forget(fs.store()).map_err(|e| e.to_string())
        })
        .and_then(|()| Replication::start(&fs, &Settings::stored(fs.store()), roles));
    let replication = made_writer.map_err(|e| {
        format!(
            "{e}: the mount took the writer role at epoch {} but does not ship; unmount it and \
             mount its store with --replica {} --takeover",
            taken.unwrap_or_default(),
            crate::replica::redact(&url)
        )
    })?;
    daemon.set_replication(replication.map(Arc::new));
    tracing::info!(replica = %crate::replica::redact(&url), commit = followed.commit, epoch = taken, "promoted: this mount is the replica's writer");
    Ok(json!({
        "url": crate::replica::redact(&url),
        "commit": followed.commit,
        "epoch": taken,
    }))
}
