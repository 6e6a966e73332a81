//! `mount` and `unmount`: the daemon's arguments turned into a mount request, and where the
//! daemon logs (set up here, before the mount answers, so a failure can still be reported).

use std::path::{Path, PathBuf};

use super::args::{LostUpdatesArg, Mount, Names, Promote, Unmount};
use super::output;
use crate::fs::{LostUpdates, NameRules};
use crate::mount::{self, Created, LimitOverrides, MountRequest};

pub(super) fn mount(a: Mount) -> Result<i32, String> {
    // Only the daemon in the foreground is a service's main process; no one else inherits it.
    crate::notify::init(a.foreground && a.notify_fd.is_none());
    let store_path = a
        .store
        .clone()
        .unwrap_or_else(|| mount::default_store(&a.mountpoint));
    let background_log = a.log_file.clone().unwrap_or_else(|| {
        let mut p = store_path.clone().into_os_string();
        p.push(".log");
        PathBuf::from(p)
    });
    let mut created = Created::default();
    if a.foreground || a.notify_fd.is_some() {
        // This process is the daemon.
        let log = match (&a.log_file, a.notify_fd) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(_)) => Some(background_log),
            (None, None) => None,
        };
        // Until the mount answers, a failure is reported on the notify descriptor and what
        // this attempt created (the log, the store's directory) is removed.
        if let Err(e) = start_logging(&a, log.as_deref(), &mut created) {
            mount::startup_failed(a.notify_fd, &e, &mut created);
            return Err(e);
        }
    } else {
        refuse_background_log(&store_path, &background_log)?;
    }
    // Refused here, before the URL reaches the daemon's command line (`ps`).
    for u in &a.replica {
        crate::replica::check_url(u)?;
    }
    let daemon_here = a.foreground || a.notify_fd.is_some();
    let (mountpoint, store) = (a.mountpoint.clone(), a.store.clone());
    let limits = LimitOverrides {
        max_file_bytes: a.max_file_bytes,
        max_buffer_bytes: a.max_buffer,
        quota_bytes: a.quota,
        max_history_bytes: a.max_history_bytes,
        max_files: a.max_files,
        max_path_bytes: a.max_path_bytes,
        max_depth: a.max_depth,
        names: a.names.map(|n| match n {
            Names::Linux => NameRules::Linux,
            Names::Portable => NameRules::Portable,
        }),
        lost_updates: a.lost_updates.map(|l| match l {
            LostUpdatesArg::Record => LostUpdates::Record,
            LostUpdatesArg::Refuse => LostUpdates::Refuse,
            LostUpdatesArg::Off => LostUpdates::Off,
        }),
    };
    mount::mount(MountRequest {
        mountpoint: a.mountpoint,
        store: a.store,
        foreground: a.foreground,
        allow_other: a.allow_other,
        threads: a.threads,
        limits,
        argv: std::env::args().skip(1).collect(),
        notify_fd: a.notify_fd,
        read_only: a.read_only,
        noexec: a.noexec,
        keep_history: a.keep_history,
        replica: crate::replica::ReplicaOverrides {
            urls: (!a.replica.is_empty()).then_some(a.replica),
            interval_ns: a.replica_interval,
            snapshot_every_ns: a.replica_snapshot_every,
            keep_ns: a.replica_keep,
        },
        follow: a.follow.map(|url| mount::FollowRequest {
            url,
            interval: std::time::Duration::from_nanos(
                a.follow_interval.unwrap_or(1_000_000_000).max(10_000_000),
            ),
        }),
        takeover: a.takeover,
        created,
    })?;
    if !daemon_here {
        replicating_to(&mountpoint, store.as_deref());
    }
    Ok(0)
}

/// Says where a mount just made ships its commits (from its daemon's status).
fn replicating_to(mountpoint: &Path, store: Option<&Path>) {
    let Ok(t) = super::target::Target::resolve(store.unwrap_or(mountpoint)) else {
        return;
    };
    let Ok(v) = t.run(serde_json::json!({"op": "status"}), |_| Err(String::new())) else {
        return;
    };
    output::replicating(&v);
}

/// Exit 1 when a replica was left without commits (the mount is gone either way).
pub(super) fn unmount(a: Unmount) -> Result<i32, String> {
    // What the replicas still miss: the daemon makes one bounded last upload, then says what
    // each replica holds.
    let mut replicating = false;
    if let Ok(t) = super::target::Target::resolve(&a.mountpoint)
        && t.is_mounted()
        && let Ok(v) = t.run(serde_json::json!({"op": "status"}), |_| Err(String::new()))
    {
        output::replicas_before_unmount(&v);
        replicating = v["replicas"].as_array().is_some_and(|r| !r.is_empty());
    }
    let done = mount::unmount(&a.mountpoint)?;
    output::unmounted(&done.message);
    Ok(match done.replicas {
        Some(list) => i32::from(!output::replicas_after_unmount(&list)),
        None if replicating => {
            output::replicas_unreported();
            1
        }
        None => 0,
    })
}

/// `promote`: asks the follower's daemon to become the replica's writer in place.
pub(super) fn promote(a: Promote) -> Result<i32, String> {
    let t = super::target::Target::resolve(&a.mountpoint)?;
    if !t.is_mounted() {
        return Err(format!(
            "{} is not mounted: mount the follower's store with --replica URL --takeover instead",
            a.mountpoint.display()
        ));
    }
    let v = t.run(
        serde_json::json!({"op": "promote", "replica_interval_ns": a.replica_interval}),
        |_| Err(String::new()),
    )?;
    output::promoted(&a.mountpoint, &v);
    Ok(0)
}

/// The daemon's log: `log` (made beside the store unless named with --log-file), or stderr.
fn start_logging(a: &Mount, log: Option<&Path>, created: &mut Created) -> Result<(), String> {
    if a.log_file.is_none()
        && let Some(p) = log
    {
        // The log goes beside the store, whose directory the mount creates.
        let dir = crate::private::parent_dir(p);
        created
            .create_dir_all(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let new_log = log.filter(|p| std::fs::symlink_metadata(p).is_err());
    init_logging(a.verbose, log)?;
    if let Some(p) = new_log {
        created.record(p);
    }
    Ok(())
}

/// The daemon started in the background logs there: refuse here, where the reason can be
/// printed, what it would refuse (a symlink at the log's name).
fn refuse_background_log(store: &Path, log: &Path) -> Result<(), String> {
    crate::private::check_store_dir(store)?;
    if std::fs::symlink_metadata(log).is_ok_and(|m| m.is_symlink()) {
        let e = std::io::Error::from_raw_os_error(libc::ELOOP);
        return Err(format!("log file {}", crate::private::describe(log, e)));
    }
    Ok(())
}

fn init_logging(verbose: u8, log_file: Option<&Path>) -> Result<(), String> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = super::log_filter(&format!("redbfs={level},fuser=warn"));
    let layer = tracing_subscriber::fmt::layer().with_target(false);
    match log_file {
        Some(p) => {
            // Mode 0600 when created; a symlink planted at the log's name is never followed.
            // Past its size the log moves to LOG.1 and starts anew (`logfile`).
            let f = crate::logfile::LogFile::open(p)
                .map_err(|e| format!("log file {}", crate::private::describe(p, e)))?;
            tracing_subscriber::registry()
                .with(filter)
                .with(layer.with_ansi(false).with_writer(f))
                .init();
        }
        None => tracing_subscriber::registry()
            .with(filter)
            .with(layer.with_writer(std::io::stderr))
            .init(),
    }
    // fuser logs through the `log` crate, a debug line per request. `log` checks its own
    // maximum level before anything else, so it is set to the most verbose level any target
    // is logged at: a line no target wants costs one comparison, not a trip through the
    // subscriber's filter on every request.
    use tracing_log::AsLog;
    let max = tracing::level_filters::LevelFilter::current().as_log();
    let _ = tracing_log::LogTracer::builder().with_max_level(max).init();
    Ok(())
}
