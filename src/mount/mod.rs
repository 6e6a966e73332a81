//! Daemon lifecycle: checks before mounting, stale-mount recovery, mounting as
//! `fuse.redbfs`, running in the background, signals, and unmounting.
//!
//! The background daemon is this same binary run again with `--foreground` and a pipe on
//! which it reports `ready` or the reason it could not mount; the parent exits only when the
//! mount answers a stat.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

mod created;
mod device;
pub mod promote;
mod table;

pub use created::Created;
use device::{Access, check_allow_other, fusermount_mount, kernel_mount, open_fuse_device};
pub use table::{
    Dev, MountEntry, OwnMount, kernel_unmount, mountpoint_of_store, mounts, redbfs_mount_at,
};
use table::{clear_stale, detach_own, find_own, is_stale, mount_ids};

use crate::control::{self, Daemon};
use crate::fs::{Fs, Limits};
use crate::process::ProcessId;
use crate::store::{Store, StoreError};

/// Everything `redbfs mount` was asked.
#[derive(Clone, Debug)]
pub struct MountRequest {
    pub mountpoint: PathBuf,
    pub store: Option<PathBuf>,
    pub foreground: bool,
    pub allow_other: bool,
    pub threads: usize,
    /// Limits given on the command line; `None` keeps what the store recorded.
    pub limits: LimitOverrides,
    /// Arguments to pass again to the background daemon.
    pub argv: Vec<String>,
    /// Set in the background daemon: where to report readiness.
    pub notify_fd: Option<i32>,
    /// Mount read-only: every change is refused with EROFS (by the kernel and the daemon).
    pub read_only: bool,
    /// No file on the mount may be executed (`noexec`).
    pub noexec: bool,
    /// History retention in ns (0 = off); `None` keeps what the store recorded.
    pub keep_history: Option<u64>,
    /// Replicas and their schedule; `None` fields keep what the store recorded.
    pub replica: crate::replica::ReplicaOverrides,
    /// Follow this replica read-only instead of mounting the store as it is (`--follow`).
    pub follow: Option<FollowRequest>,
    /// Take the replicas' writer role over from whoever holds it (`--takeover`).
    pub takeover: bool,
    /// What this attempt has created so far (the daemon's log, directories): removed again if
    /// it fails before the mount answers.
    pub created: Created,
}

/// `--follow URL`: the replica, and how often to poll it.
#[derive(Clone, Debug)]
pub struct FollowRequest {
    pub url: String,
    pub interval: Duration,
}

/// History retention of a new store: 30 days.
pub const DEFAULT_KEEP_HISTORY_NS: u64 = 30 * 86_400 * 1_000_000_000;

#[derive(Clone, Debug, Default)]
pub struct LimitOverrides {
    pub max_file_bytes: Option<u64>,
    pub max_buffer_bytes: Option<u64>,
    pub quota_bytes: Option<u64>,
    pub max_files: Option<u64>,
    pub max_path_bytes: Option<usize>,
    pub max_depth: Option<usize>,
    pub names: Option<crate::fs::NameRules>,
    pub lost_updates: Option<crate::fs::LostUpdates>,
    pub max_history_bytes: Option<u64>,
}

impl LimitOverrides {
    fn apply(&self, mut l: Limits) -> Limits {
        if let Some(v) = self.max_file_bytes {
            l.max_file_bytes = v;
        }
        if let Some(v) = self.max_buffer_bytes {
            l.max_buffer_bytes = v;
        }
        if let Some(v) = self.quota_bytes {
            l.quota_bytes = v;
        }
        if let Some(v) = self.max_files {
            l.max_files = v;
        }
        if let Some(v) = self.max_path_bytes {
            l.max_path_bytes = v;
        }
        if let Some(v) = self.max_depth {
            l.max_depth = v;
        }
        if let Some(v) = self.names {
            l.names = v;
        }
        if let Some(v) = self.lost_updates {
            l.lost_updates = v;
        }
        if let Some(v) = self.max_history_bytes {
            l.max_history_bytes = v;
        }
        l
    }
}

/// An absolute path, without resolving the last component (which may be a dead mount).
pub fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// The default store beside a mountpoint: `<mountpoint>.redb`.
pub fn default_store(mountpoint: &Path) -> PathBuf {
    let mut s = mountpoint.as_os_str().to_owned();
    s.push(".redb");
    PathBuf::from(s)
}

/// Prepares the mountpoint: clears a stale mount, refuses a live one or one holding files.
fn prepare_mountpoint(mp: &Path, created: &mut Created) -> Result<(), String> {
    if is_stale(mp) {
        clear_stale(mp)?;
        tracing::warn!(mountpoint = %mp.display(), "cleared a stale mount left by a daemon that died");
    }
    match std::fs::metadata(mp) {
        Ok(m) if !m.is_dir() => return Err(format!("{}: not a directory", mp.display())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            created
                .create_dir_all(mp)
                .map_err(|e| format!("{}: cannot create: {e}", mp.display()))?;
        }
        Err(e) => return Err(format!("{}: {e}", mp.display())),
    }
    if let Some(m) = mounts().into_iter().rev().find(|m| m.mountpoint == mp) {
        return Err(format!(
            "{} is already a live mount ({} from {}); run `redbfs unmount {}` first",
            mp.display(),
            m.fstype,
            m.source,
            mp.display()
        ));
    }
    let holds_files = std::fs::read_dir(mp)
        .map_err(|e| format!("{}: {e}", mp.display()))?
        .next()
        .is_some();
    if holds_files {
        return Err(format!(
            "{} holds files; redbfs mounts only on an empty directory. To bring those files into a \
             store: move them aside, then `redbfs import <dir> <store>` and mount",
            mp.display()
        ));
    }
    Ok(())
}

/// How long a mount waits for a store another process holds while no mount serves it: a
/// daemon whose mount was just unmounted is still committing and closing it (`umount` returns
/// before the daemon exits, so `umount; mount` in a script met a store still open), or a tool
/// (`check`, an unmounted `snapshot`) is reading it.
const CLOSED_WITHIN: Duration = Duration::from_secs(30);

/// `open`, tried again while the store is open in another process that no mount serves, for
/// at most `CLOSED_WITHIN`; a store a live mount serves is refused at once.
fn once_closed(
    store_path: &Path,
    open: impl Fn() -> Result<Store, StoreError>,
) -> Result<Store, StoreError> {
    let until = Instant::now() + CLOSED_WITHIN;
    loop {
        match open() {
            Err(StoreError::AlreadyOpen(_))
                if Instant::now() < until && mountpoint_of_store(store_path).is_none() =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

fn open_store(
    store_path: &Path,
    overrides: &LimitOverrides,
    read_only: bool,
    created: &mut Created,
) -> Result<(Store, Limits), String> {
    let already_open = |e: StoreError| match e {
        StoreError::AlreadyOpen(_) => match mountpoint_of_store(store_path) {
            Some(mp) => format!(
                "store {} is already opened by another redbfs daemon, mounted at {} (redb gives \
                 a read-write daemon the file to itself, and a read-only one shares it only \
                 with other readers: browse the mounted one, or `redbfs snapshot` it and mount \
                 the snapshot)",
                store_path.display(),
                mp.display()
            ),
            None => format!(
                "store {} is already opened by another process (waited {} s for it to close)",
                store_path.display(),
                CLOSED_WITHIN.as_secs()
            ),
        },
        other => other.to_string(),
    };
    if read_only {
        // Opened with redb's read-only handle: nothing is created, recovered or migrated.
        let store =
            once_closed(store_path, || Store::open_read_only(store_path)).map_err(already_open)?;
        let limits = overrides.apply(Limits::stored(&store));
        return Ok((store, limits));
    }
    if let Some(parent) = store_path.parent() {
        created
            .create_dir_all(parent)
            .map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let existed = std::fs::symlink_metadata(store_path).is_ok();
    let owner = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    let store = once_closed(store_path, || Store::open_or_create(store_path, owner))
        .map_err(already_open)?;
    if !existed {
        created.record(store_path);
    }
    let stored = Limits::stored(&store);
    let limits = overrides.apply(stored.clone());
    let recorded = store
        .read()
        .and_then(|r| r.meta_bytes(crate::store::schema::META_LIMITS))
        .ok()
        .flatten()
        .is_some();
    if limits != stored || !recorded {
        let json = serde_json::to_vec(&limits).map_err(|e| e.to_string())?;
        let w = store.write().map_err(|e| e.to_string())?;
        w.put_meta(crate::store::schema::META_LIMITS, &json)
            .map_err(|e| e.to_string())?;
        w.commit(crate::store::Sync::Durable)
            .map_err(|e| e.to_string())?;
    }
    Ok((store, limits))
}

/// `redbfs mount`: in the background unless asked otherwise.
pub fn mount(req: MountRequest) -> Result<(), String> {
    // Before the daemon creates its log beside the store.
    let mp = absolute(&req.mountpoint)?;
    crate::private::check_store_dir(&absolute(
        req.store.as_deref().unwrap_or(&default_store(&mp)),
    )?)?;
    if req.foreground || req.notify_fd.is_some() {
        return run_daemon(req);
    }
    spawn_daemon(&req)
}

fn spawn_daemon(req: &MountRequest) -> Result<(), String> {
    let mp = absolute(&req.mountpoint)?;
    let (rd, wr) = nix::unistd::pipe().map_err(|e| format!("pipe: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(&req.argv)
        .arg("--notify-fd")
        .arg(wr.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let wr_raw = wr.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls: setsid and fcntl.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            let flags = libc::fcntl(wr_raw, libc::F_GETFD);
            libc::fcntl(wr_raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    drop(wr);
    let msg = match read_within(File::from(rd), READY_WITHIN) {
        Some(msg) => msg,
        None => {
            // The pipe is closed now: a daemon that has not mounted sees it and does not; one
            // that mounts meanwhile finds no one to tell and unmounts; the signal says the same
            // to one that is busy.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            reap_soon(child);
            return Err(format!(
                "the daemon did not mount {} within {} s; it was told to stop (its log says \
                 where it was)",
                mp.display(),
                READY_WITHIN.as_secs()
            ));
        }
    };
    let msg = msg.trim();
    if msg != "ready" {
        let status = child.wait();
        return Err(match (msg.is_empty(), status) {
            (false, _) => msg.to_string(),
            // Every failure the daemon can name it writes here; this is one it could not (a
            // signal, an abort).
            (true, Ok(st)) => format!("the daemon ended before mounting ({st})"),
            (true, Err(e)) => format!("the daemon ended before mounting ({e})"),
        });
    }
    // Exit only once the mount answers.
    for _ in 0..200 {
        if std::fs::metadata(&mp).is_ok() && redbfs_mount_at(&mp).is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err(format!(
        "{} was mounted but does not answer a stat",
        mp.display()
    ))
}

/// How long `redbfs mount` waits for its daemon to mount. Opening a store that needs recovery,
/// or restoring a follower's replica, can take minutes; a daemon stuck past this (on a lock,
/// a replica that never answers) makes the command fail instead of hang, and never mounts.
const READY_WITHIN: Duration = Duration::from_secs(300);

/// Reads `pipe` to its end (the daemon's one message, or nothing if it died), or None when
/// `within` passed first (the pipe is closed on return either way).
fn read_within(mut pipe: File, within: Duration) -> Option<String> {
    let deadline = std::time::Instant::now() + within;
    let mut bytes = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        let mut p = libc::pollfd {
            fd: pipe.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
        // SAFETY: one pollfd, valid for the call.
        if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match pipe.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&bytes).into_owned()),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Some(String::from_utf8_lossy(&bytes).into_owned()),
        }
    }
}

/// Waits a little for a daemon told to stop, so it leaves no zombie; one that takes longer is
/// left to init.
fn reap_soon(mut child: std::process::Child) {
    for _ in 0..200 {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The descriptor on which the daemon reports `ready` or why it could not mount (-1 once used):
/// one message per attempt.
static NOTIFY_FD: AtomicI32 = AtomicI32::new(-1);

/// The message of a panic in the daemon before it mounted, for the `redbfs mount` that waits.
static PANIC: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Whether the `redbfs mount` waiting on the notify pipe took a message.
#[derive(PartialEq, Eq)]
enum Heard {
    Yes,
    /// It closed its end: it gave up waiting, and told its user the mount failed.
    GaveUp,
    /// No one waits (`--foreground`), or the message went already.
    NoOne,
}

fn notify(msg: &str) -> Heard {
    let fd = NOTIFY_FD.swap(-1, Ordering::AcqRel);
    if fd < 0 {
        return Heard::NoOne;
    }
    // SAFETY: the fd was handed to us by the parent for exactly this message, and the swap
    // above makes this the only owner.
    let mut f = unsafe { File::from_raw_fd(fd) };
    // One line: the parent prints it as it is. Rust ignores SIGPIPE: a closed pipe is EPIPE.
    match writeln!(f, "{}", msg.replace('\n', " ")) {
        Ok(()) => Heard::Yes,
        Err(_) => Heard::GaveUp,
    }
}

/// A daemon that fails before the mount answers: removes what this attempt created, then
/// tells the `redbfs mount` that started it why, in one line.
pub fn startup_failed(notify_fd: Option<i32>, msg: &str, created: &mut Created) {
    if let Some(fd) = notify_fd {
        let _ = NOTIFY_FD.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire);
    }
    created.remove_all();
    let _ = notify(msg);
}

fn run_daemon(mut req: MountRequest) -> Result<(), String> {
    if let Some(fd) = req.notify_fd {
        NOTIFY_FD.store(fd, Ordering::Release);
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        *PANIC.lock().unwrap_or_else(|p| p.into_inner()) = Some(info.to_string());
        previous(info);
    }));
    let mut created = std::mem::take(&mut req.created);
    let ready = Arc::new(AtomicBool::new(false));
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_daemon_inner(&req, &mut created, &ready)
    }))
    .unwrap_or_else(|_| {
        let what = PANIC.lock().unwrap_or_else(|p| p.into_inner()).take();
        Err(format!(
            "the daemon failed: {}",
            what.unwrap_or_else(|| "panic".into())
        ))
    });
    if let Err(e) = &res {
        tracing::error!("{e}");
        if !ready.load(Ordering::Acquire) {
            startup_failed(None, e, &mut created);
        }
    }
    res
}

/// The daemon's life from checks to a closed store: checks and opens what it needs, serves
/// the control socket, mounts, serves the session until unmount, then closes the store.
fn run_daemon_inner(
    req: &MountRequest,
    created: &mut Created,
    ready: &Arc<AtomicBool>,
) -> Result<(), String> {
    // Before any thread starts (the reclaimer, a replica's shipper, redb's): every thread
    // inherits the mask, so only the signal thread takes SIGTERM and unmounts cleanly.
    let sigs = block_signals()?;
    // Also before any thread: one heap arena for all of them (see `one_heap_arena`).
    crate::store::one_heap_arena();
    let mp = absolute(&req.mountpoint)?;
    let store_path = absolute(req.store.as_deref().unwrap_or(&default_store(&mp)))?;
    prepare_mountpoint(&mp, created)?;
    check_allow_other(req.allow_other)?;
    let fuse_device = open_fuse_device()?;
    let (fs, roles) = match &req.follow {
        Some(f) => (open_follower(f, &store_path, created)?, Vec::new()),
        None => {
            let fs = open_fs(req, &store_path, created)?;
            let roles = take_writer_roles(req, &fs)?;
            (fs, roles)
        }
    };
    reclaim_in_batches(&fs).map_err(|e| format!("reclaimer thread: {e}"))?;
    // A snapshot's check holds the whole copy's tree: not in the daemon's memory, but for
    // a small copy's.
    crate::tools::check_copies_apart();
    // This daemon's mount once made (the only one it ever unmounts), and whether it was told
    // to stop (a signal, or the `redbfs mount` that started it gave up) before that.
    let own: Arc<OnceLock<OwnMount>> = Arc::new(OnceLock::new());
    let stop = Arc::new(AtomicBool::new(false));
    let (daemon, socket) = serve_control(&fs, &mp, &store_path, &own, created)?;
    // From here the control thread holds the filesystem: a failure gives it back, so the store
    // closes (and its write-ahead log goes) before what this attempt created is removed.
    let give_back = |e: String| {
        let _ = std::fs::remove_file(&socket);
        drop(daemon.take_fs());
        e
    };
    unmount_on_signal(sigs, own.clone(), stop.clone()).map_err(|e| give_back(e.to_string()))?;

    let source = format!("redbfs:{}", store_path.display());
    // A follower's mount is read-only in the kernel too: only its follower changes the store.
    let access = Access {
        allow_other: req.allow_other,
        read_only: req.read_only || req.follow.is_some(),
        noexec: req.noexec,
    };
    let before = mount_ids();
    let mounted = match stopped(&stop) {
        Some(why) => Err(why),
        None => match kernel_mount(&mp, &source, access, fuse_device) {
            Ok(Some(fd)) => Ok(fd),
            Ok(None) => fusermount_mount(&mp, &source, access),
            Err(e) => Err(e),
        },
    };
    let fd = mounted.and_then(|fd| {
        // The mount as the kernel knows it, by its device: a path can be made to lead
        // elsewhere by whoever owns a directory on it.
        let Some(mine) = find_own(&mp, &source, &before) else {
            // Closing the device ends the connection: a stale mount, cleared by the next
            // mount or unmount.
            drop(fd);
            return Err(format!(
                "{} was mounted, but not found in the mount table; its connection was ended",
                mp.display()
            ));
        };
        let _ = own.set(mine.clone());
        // A stop asked while it was being mounted: the signal thread found nothing to
        // unmount yet, so this one does.
        if let Some(why) = stopped(&stop) {
            let _ = detach_own(&mine);
            return Err(why);
        }
        Ok(fd)
    });
    let fd = match fd {
        Ok(fd) => fd,
        Err(e) => {
            let e = give_back(e);
            close_store(fs);
            return Err(e);
        }
    };
    let on_ready = announce_ready(mp.clone(), store_path, ready.clone(), own.clone());
    let served = serve_session(req, &fs, &daemon, roles, fd, on_ready);
    if served.is_err()
        && !ready.load(Ordering::Acquire)
        && let Some(mine) = own.get()
    {
        // Mounted, but the session never started: nothing can have used the mount.
        let _ = detach_own(mine);
    }
    if ready.load(Ordering::Acquire) {
        crate::notify::stopping("unmounted; closing the store");
    }
    close_after_session(fs, &daemon, &socket);
    served.map_err(|e| format!("serving the mount failed: {e}"))?;
    tracing::info!("unmounted; store closed");
    Ok(())
}

/// The control socket beside the store, served by its own thread, which holds the filesystem
/// from now on; the socket is recorded in `created`. A second daemon for the same store is
/// refused here, naming the mount that has it.
fn serve_control(
    fs: &Arc<Fs>,
    mp: &Path,
    store_path: &Path,
    own: &Arc<OnceLock<OwnMount>>,
    created: &mut Created,
) -> Result<(Arc<Daemon>, PathBuf), String> {
    let own = own.clone();
    let daemon = Arc::new(Daemon::new(
        fs.clone(),
        mp.to_path_buf(),
        store_path.to_path_buf(),
        Box::new(move || match own.get() {
            Some(mine) => kernel_unmount(mine),
            None => Err("not mounted yet".into()),
        }),
    ));
    let socket = control::listen(daemon.clone()).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => match mountpoint_of_store(store_path) {
            Some(at) => format!(
                "store {} is already mounted at {} (one daemon serves a store; browse that \
                 mount)",
                store_path.display(),
                at.display()
            ),
            None => format!("store {}: {e}", store_path.display()),
        },
        _ => format!("control socket: {e}"),
    })?;
    created.record(&socket);
    Ok((daemon, socket))
}

/// What runs once the mount answers: the log line, the readiness flag, the `redbfs mount`
/// waiting on the notify descriptor, and systemd.
fn announce_ready(
    mp: PathBuf,
    store_path: PathBuf,
    ready: Arc<AtomicBool>,
    own: Arc<OnceLock<OwnMount>>,
) -> impl FnOnce() + Send + 'static {
    move || {
        tracing::info!(mountpoint = %mp.display(), store = %store_path.display(), "mounted");
        ready.store(true, Ordering::Release);
        if notify("ready") == Heard::GaveUp {
            // The command failed, so the mount must not outlive it. From another thread: this
            // one serves the session the unmount needs.
            tracing::error!(
                "the `redbfs mount` that started this daemon gave up waiting; unmounting"
            );
            let _ = std::thread::Builder::new()
                .name("unmount".into())
                .spawn(move || {
                    if let Some(mine) = own.get()
                        && let Err(e) = kernel_unmount(mine)
                    {
                        tracing::error!("unmount failed: {e}");
                    }
                });
            return;
        }
        crate::notify::ready_once_answering(mp);
    }
}

/// Serves the FUSE session on `fd` until it ends, with the store's replicas shipping (or its
/// follower applying what the replica it follows holds) meanwhile; then what the session
/// committed last goes up before the replicas stop.
fn serve_session(
    req: &MountRequest,
    fs: &Arc<Fs>,
    daemon: &Daemon,
    roles: Vec<Option<crate::replica::epoch::Role>>,
    fd: std::os::fd::OwnedFd,
    on_ready: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    let follower = match &req.follow {
        Some(f) => crate::replica::Follower::start(fs, &f.url, f.interval)
            .map_err(|e| tracing::error!("{e}; not following"))
            .ok()
            .map(Arc::new),
        None => None,
    };
    daemon.set_follower(follower.clone());
    let settings = crate::replica::Settings::stored(fs.store());
    let replication = if req.follow.is_some() {
        None
    } else {
        crate::replica::Replication::start(fs, &settings, roles)
            .map_err(|e| tracing::error!("{e}; not replicating"))
            .ok()
            .flatten()
            .map(Arc::new)
    };
    daemon.set_replication(replication.clone());
    let served = crate::fuse::serve_fd(fs.clone(), fd, req.allow_other, req.threads, on_ready);
    daemon.set_follower(None);
    if let Some(f) = follower {
        f.stop();
    }
    // What the session committed last goes up before the store closes, the orphans the kernel
    // let go of too (nothing references them once the session ended).
    fs.flush_all();
    if let Err(e) = fs.reclaim_orphans() {
        tracing::warn!(error = %e, "could not reclaim unlinked inodes; the next mount will");
    }
    // The replication started with the session, or by a promotion during it.
    drop(replication);
    if let Some(r) = daemon.take_replication() {
        daemon.report_unshipped(&r.stop());
    }
    served
}

/// The session has ended (the kernel sent DESTROY): everything is flushed, what the kernel
/// kept alive without a name goes, the socket goes, and the store closes.
fn close_after_session(fs: Arc<Fs>, daemon: &Daemon, socket: &Path) {
    fs.flush_all();
    if let Err(e) = fs.reclaim_orphans() {
        tracing::warn!(error = %e, "could not reclaim unlinked inodes; the next mount will");
    }
    let _ = std::fs::remove_file(socket);
    drop(daemon.take_fs());
    close_store(fs);
}

/// Opens the store (recording what it creates) with the history retention asked for or
/// recorded, and the filesystem over it.
fn open_fs(
    req: &MountRequest,
    store_path: &Path,
    created: &mut Created,
) -> Result<Arc<Fs>, String> {
    let (store, limits) = open_store(store_path, &req.limits, req.read_only, created)?;
    let mp = absolute(&req.mountpoint)?;
    crate::replica::config::remember(&store, &req.replica, req.read_only, &mp)?;
    // The session's write-ahead log (the first commit made it): closing the store removes it,
    // and so does a failed attempt. A read-only mount has none.
    if !req.read_only {
        created.record(&crate::store::wal::path_of(store_path));
    }
    let recorded = store
        .read()
        .and_then(|r| r.meta_u64("keep_history"))
        .map_err(|e| e.to_string())?;
    match (req.keep_history, recorded) {
        _ if req.read_only => {}
        (Some(k), _) => store.set_keep_history(k).map_err(|e| e.to_string())?,
        (None, None) => store
            .set_keep_history(DEFAULT_KEEP_HISTORY_NS)
            .map_err(|e| e.to_string())?,
        (None, Some(_)) => {}
    }
    Ok(Arc::new(Fs::new(store, limits).map_err(|e| e.to_string())?))
}

/// A thread that reclaims the orphans the kernel and every handle let go of, in one
/// transaction `RECLAIM_INTERVAL` after the first of a batch is queued; it sleeps while none
/// is, and ends when the filesystem does.
fn reclaim_in_batches(fs: &Arc<Fs>) -> std::io::Result<()> {
    let queue = fs.reclaim_queue();
    let fs = Arc::downgrade(fs);
    std::thread::Builder::new()
        .name("reclaimer".into())
        .spawn(move || {
            while queue.wait() {
                std::thread::sleep(crate::fs::RECLAIM_INTERVAL);
                match fs.upgrade() {
                    Some(fs) => fs.reclaim_queued(),
                    None => return,
                }
            }
        })
        .map(drop)
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread, and so in every thread started after
/// it: one thread takes them (`unmount_on_signal`).
fn block_signals() -> Result<nix::sys::signal::SigSet, String> {
    let mut sigs = nix::sys::signal::SigSet::empty();
    for s in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        sigs.add(s);
    }
    sigs.thread_block().map_err(|e| format!("sigmask: {e}"))?;
    Ok(sigs)
}

/// A thread that unmounts this daemon's mount when one of `sigs` arrives, or, before it is
/// mounted, sets `stop` so that it never is.
fn unmount_on_signal(
    sigs: nix::sys::signal::SigSet,
    own: Arc<OnceLock<OwnMount>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(sig) = sigs.wait() {
                stop.store(true, Ordering::SeqCst);
                let Some(mine) = own.get() else {
                    tracing::info!(?sig, "stopping on signal before mounting");
                    return;
                };
                tracing::info!(?sig, "unmounting on signal");
                if let Err(e) = kernel_unmount(mine) {
                    tracing::error!("unmount on signal failed: {e}");
                }
            }
        })
        .map(drop)
}

/// Why the daemon must not mount (or stay mounted) now: a signal asked it to stop, or the
/// `redbfs mount` waiting for it gave up (it closed its end of the notify pipe).
fn stopped(stop: &AtomicBool) -> Option<String> {
    if stop.load(Ordering::SeqCst) {
        return Some("stopped by a signal before mounting".into());
    }
    let fd = NOTIFY_FD.load(Ordering::Acquire);
    if fd < 0 {
        return None;
    }
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call; a zero timeout only looks.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    (n > 0 && p.revents & libc::POLLERR != 0).then(|| {
        "the `redbfs mount` that started this daemon gave up waiting for it; not mounting".into()
    })
}

/// Drops the last reference to the filesystem so redb closes the file cleanly; otherwise the
/// next open must verify every page as after a crash. Waits for control requests in flight.
fn close_store(mut fs: Arc<Fs>) {
    for _ in 0..6000 {
        match Arc::try_unwrap(fs) {
            Ok(fs) => {
                drop(fs);
                return;
            }
            Err(still_shared) => fs = still_shared,
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    tracing::warn!(
        "a control request still holds the store; it will be recovered at the next mount"
    );
}

/// Whether daemon process `d` still runs: the same process (its pid and start time), with a
/// thread that is not a zombie. A zombie thread has closed its files, but the leader can turn
/// zombie while other threads are still exiting and still hold the store, so every thread
/// counts.
fn daemon_running(d: ProcessId) -> bool {
    if !d.alive() {
        return false;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", d.pid)) else {
        return false;
    };
    tasks.filter_map(|t| t.ok()).any(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        matches!(state, Some(s) if s != "Z" && s != "X")
    })
}

/// Refuses at once, as umount(8) does, to unmount a mount that this command's working
/// directory, or its parent's (the shell that ran it), is inside: the kernel would keep the
/// mount busy until that process left it, and the daemon with it.
fn refuse_if_inside(mp: &Path) -> Result<(), String> {
    let Ok(mount) = std::fs::metadata(mp) else {
        return Ok(());
    };
    let parent = nix::unistd::getppid();
    for (proc_dir, who) in [
        ("self".to_string(), "this command's working directory"),
        (
            parent.to_string(),
            "the working directory of the shell that ran it",
        ),
    ] {
        let inside = std::fs::metadata(format!("/proc/{proc_dir}/cwd"))
            .is_ok_and(|cwd| cwd.dev() == mount.dev());
        if inside {
            return Err(format!(
                "{}: target is busy: {who} is inside the mount; `cd` out of it, then run \
                 `redbfs unmount {}` again",
                mp.display(),
                mp.display()
            ));
        }
    }
    Ok(())
}

/// What `unmount` did: a line for a person, and what each replica holds after the daemon's
/// last upload (None when no daemon said so: a stale mount cleared, or a daemon that ended
/// without leaving it).
pub struct Unmounted {
    pub message: String,
    pub replicas: Option<Vec<crate::replica::ship::Unshipped>>,
}

/// `redbfs unmount`: asks the daemon to unmount and waits until it has closed the store.
/// Succeeds only then, or when the mount's daemon is gone (a stale mount, cleared); a live
/// mount whose daemon does not answer is left alone, with what was found.
pub fn unmount(mountpoint: &Path) -> Result<Unmounted, String> {
    let cleared = |message| Unmounted {
        message,
        replicas: None,
    };
    let mp = absolute(mountpoint)?;
    let Some(store) = redbfs_mount_at(&mp) else {
        if is_stale(&mp) {
            clear_stale(&mp)?;
            return Ok(cleared(format!(
                "cleared a stale mount at {}",
                mp.display()
            )));
        }
        // Another user's mount: said as such, not as no mount at all.
        if let Some(m) = mounts()
            .into_iter()
            .rev()
            .find(|m| m.mountpoint == mp && m.fstype == "fuse.redbfs")
        {
            let who = m
                .user_id
                .map_or("an unknown user".into(), |u| format!("uid {u}"));
            return Err(format!(
                "{} is a redbfs mount of {who}, not of this user: permission denied; left as it is",
                mp.display()
            ));
        }
        return Err(format!("{} is not a redbfs mount", mp.display()));
    };
    refuse_if_inside(&mp)?;
    let mut c = match control::Client::connect(&store) {
        Ok(c) => c,
        Err(e) => return no_answer(&mp, &store, e).map(cleared),
    };
    // What an earlier unmount left unread is not this one's.
    let report = control::unshipped_path(&store);
    let _ = std::fs::remove_file(&report);
    let pid = c
        .call(&serde_json::json!({"op": "status"}))?
        .get("pid")
        .and_then(serde_json::Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .ok_or("the daemon did not say its pid")?;
    // The daemon as a process, not a number another process may be handed once it exits.
    let daemon = crate::process::stat(pid).map(|s| ProcessId {
        pid,
        start: s.start,
    });
    match c.call(&serde_json::json!({"op": "unmount"})) {
        Ok(_) => {}
        // The daemon may exit before its answer is written; the mount being gone is the
        // answer then.
        Err(_) if redbfs_mount_at(&mp).is_none() => {}
        Err(e) => return Err(e),
    }
    // Returns once the daemon process has exited, which is when the store is closed.
    for _ in 0..60_000 {
        if !daemon.is_some_and(daemon_running) {
            return Ok(Unmounted {
                message: format!("unmounted {}", mp.display()),
                replicas: read_unshipped(&report),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err(format!(
        "{} was unmounted but the daemon (pid {pid}) has not exited",
        mp.display()
    ))
}

/// What the daemon left at `path` for this unmount (then removed): never followed through a
/// symlink, at most 1 MiB, None if absent or not what a daemon writes.
fn read_unshipped(path: &Path) -> Option<Vec<crate::replica::ship::Unshipped>> {
    use std::io::Read;
    let f = crate::private::open_read(path).ok();
    let _ = std::fs::remove_file(path);
    let mut bytes = Vec::new();
    f?.take(1 << 20).read_to_end(&mut bytes).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// `unmount` of a mount whose daemon did not take the control connection (`e`). A mount that
/// no longer answers lost its daemon and is cleared; any other is left as it is, with why:
/// the socket belongs to another user, or a live daemon does not answer on it.
fn no_answer(mp: &Path, store: &Path, e: std::io::Error) -> Result<String, String> {
    if is_stale(mp) {
        clear_stale(mp)?;
        return Ok(format!(
            "cleared a stale mount at {} (its daemon had exited)",
            mp.display()
        ));
    }
    let socket = control::socket_path(store);
    if e.kind() == std::io::ErrorKind::PermissionDenied && e.get_ref().is_some() {
        // The client's own refusal: another user answers on the socket.
        return Err(format!("{}: {e}. The mount is left as it is", mp.display()));
    }
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        let owner = std::fs::metadata(&socket)
            .map(|m| format!("uid {}", m.uid()))
            .unwrap_or_else(|_| "another user".into());
        return Err(format!(
            "{}: permission denied on its daemon's control socket {} ({owner}): only the user \
             who mounted it, or root, can unmount it. The mount is left as it is",
            mp.display(),
            socket.display()
        ));
    }
    let holders = processes_holding(store);
    let found = if holders.is_empty() {
        format!(
            "no process of this user holds its store {}",
            store.display()
        )
    } else {
        let pids: Vec<String> = holders.iter().map(u32::to_string).collect();
        format!(
            "its daemon, pid {}, still holds the store {}; `kill -TERM {}` makes it unmount \
             and close the store",
            pids.join(", "),
            store.display(),
            pids.join(" ")
        )
    };
    Err(format!(
        "{}: the mount answers but its daemon does not answer on the control socket {} ({e}): \
         {found}. The mount is left as it is",
        mp.display(),
        socket.display()
    ))
}

/// The processes (of those /proc shows this user) with `store` open, by the file's identity.
fn processes_holding(store: &Path) -> Vec<u32> {
    let Ok(want) = std::fs::metadata(store).map(|m| (m.dev(), m.ino())) else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .filter_map(|fd| fd.ok())
                .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| (m.dev(), m.ino()) == want))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// A follower's filesystem: the replica's newest generation restored into the store at
/// `store_path` (a follower's own, or a new one), frozen against every change but the
/// follower's.
fn open_follower(
    f: &FollowRequest,
    store_path: &Path,
    created: &mut Created,
) -> Result<Arc<Fs>, String> {
    if let Some(parent) = store_path.parent() {
        created
            .create_dir_all(parent)
            .map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let existed = std::fs::symlink_metadata(store_path).is_ok();
    let store = crate::replica::follow::prepare(&f.url, store_path)?;
    if !existed {
        created.record(store_path);
    }
    let limits = Limits::stored(&store);
    Ok(Arc::new(Fs::new(store, limits).map_err(|e| e.to_string())?))
}

/// Takes the writer role of every replica the store ships to, before the mount (a role
/// another writer holds refuses it). With `--takeover`, a follower's store continues the
/// history where it stands (the commit it followed to); the mark goes in a commit of its own.
fn take_writer_roles(
    req: &MountRequest,
    fs: &Arc<Fs>,
) -> Result<Vec<Option<crate::replica::epoch::Role>>, String> {
    let settings = crate::replica::Settings::stored(fs.store());
    if req.takeover && settings.urls.is_empty() {
        return Err("--takeover takes a replica's writer role: give --replica URL".into());
    }
    if settings.urls.is_empty() || fs.is_read_only() {
        return Ok(Vec::new());
    }
    let fenced = crate::replica::epoch::Fenced::of(fs.store());
    if !req.takeover
        && let Some((url, msg)) = fenced
            .by_url
            .iter()
            .find(|(u, _)| settings.urls.contains(u))
    {
        return Err(format!(
            "this store was fenced at replica {url} and takes no writer role there again \
             without --takeover ({msg}). Mount it with --replica none (or --read-only) to \
             recover its own changes, or follow the replica instead"
        ));
    }
    let followed = crate::replica::follow::Followed::of(fs.store());
    let after = followed.as_ref().and_then(|f| {
        crate::replica::follow::Followed::cut_for(fs.store(), &f.url).map(|c| (f.url.as_str(), c))
    });
    let after = if req.takeover { after } else { None };
    let roles =
        crate::replica::epoch::acquire_all(&settings.urls, fs.store(), req.takeover, after)?;
    if req.takeover {
        crate::replica::epoch::Fenced::forget(fs.store(), &settings.urls);
    }
    if followed.is_some() && req.takeover {
        // The store is a writer's now: a later takeover must not go back to this point.
        crate::replica::follow::Followed::forget(fs.store()).map_err(|e| e.to_string())?;
    }
    Ok(roles)
}
