//! Durability beyond kills:
//!
//! - `fsync_reaches_the_disk`: the daemon runs in the foreground under strace; every
//!   acknowledged fsync (and every close that committed content) must have an fsync or
//!   fdatasync of the store file issued while the call was in progress.
//! - `disk_full_on_tmpfs` / `disk_full_on_quota`: the store on an 8 MiB tmpfs (or a `--quota`),
//!   filled through the mount until ENOSPC; nothing written before is lost, reads work, the
//!   daemon keeps answering, and once files are deleted writes succeed again.
//! - `concurrency_soak`: 8 writers (half through the stock SDK tool), 2 directory renamers and 4
//!   readers walking the tree like the SDK's view, for REDBFS_SOAK_SECS (default 60): no
//!   deadlock (no request hangs 30 s), no panic, and the final tree equals the model built
//!   from the acknowledged operations.
//! - `io_fault_on_sync` / `io_fault_on_write` (item 5): the daemon's fault-injection backend
//!   fails the next write or sync; the store poisons itself, and a restart finds everything
//!   committed before the fault intact.
//!
//! Run: `cargo test --test durability`; a longer soak:
//! `REDBFS_SOAK_SECS=600 cargo test --test durability concurrency_soak -- --nocapture`.

mod common;
#[path = "crash/support.rs"]
mod support;

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{TestMount, fuse_available};
use serde_json::Value;
use support::*;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn errno_of(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{} ({e})", nix::errno::Errno::from_raw(n)),
        None => e.to_string(),
    }
}

fn status(target: &Path) -> Result<Value, String> {
    let out = common::redbfs(&["status", target.to_str().unwrap(), "--json"]);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).to_string());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

fn is_mounted(mp: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mp = mp.to_str().unwrap();
    text.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.len() > 4 && f[4] == mp && l.contains(" - fuse.redbfs ")
    })
}

// ---------------------------------------------------------------------------------------------
// fsync reaches the disk

/// One acknowledgement that must have a sync of the store file behind it.
struct Ack {
    what: String,
    start: f64,
    end: f64,
}

#[test]
fn fsync_reaches_the_disk() {
    if !fuse_available() {
        return;
    }
    assert!(
        Path::new("/usr/bin/strace").exists(),
        "strace is missing: apt-get install strace"
    );
    let dir = tempfile::Builder::new()
        .prefix("redbfs-strace-")
        .tempdir()
        .unwrap();
    let mp = dir.path().join("mnt");
    let store = dir.path().join("mnt.redb");
    let trace = dir.path().join("strace.txt");
    let log = dir.path().join("daemon.log");
    let mut child = Command::new("/usr/bin/strace")
        .args([
            "-f",
            "-ttt",
            "-y",
            "-qq",
            "-e",
            "trace=fsync,fdatasync",
            "-o",
        ])
        .arg(&trace)
        .arg(common::redbfs_bin())
        .arg("mount")
        .arg(&mp)
        .arg("--store")
        .arg(&store)
        .arg("--log-file")
        .arg(&log)
        .arg("--foreground")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn strace");
    struct Guard<'a>(&'a Path);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            if is_mounted(self.0) {
                let _ = common::redbfs(&["unmount", self.0.to_str().unwrap()]);
            }
        }
    }
    let _guard = Guard(&mp);
    let end = Instant::now() + Duration::from_secs(60);
    while !(is_mounted(&mp) && std::fs::metadata(&mp).is_ok()) {
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "redbfs mount --foreground under strace exited ({st}); log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < end,
            "the mount did not appear under strace"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = daemon_pid(&mp);

    const N: usize = 30;
    let mut acks = Vec::new();
    let mut timed = |what: String, f: &mut dyn FnMut() -> std::io::Result<()>| {
        let start = now();
        f().unwrap_or_else(|e| panic!("{what}: {e}"));
        acks.push(Ack {
            what,
            start,
            end: now(),
        });
    };
    for i in 0..N {
        // The SDK's create: O_EXCL, write, fsync (the acknowledgement), close.
        let p = mp.join(format!("created-{i}.md"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
            .unwrap();
        f.write_all(&content(&format!("fsync{i}"), 1000 + 700 * i as u64, 0))
            .unwrap();
        timed(format!("fsync after writing {}", p.display()), &mut || {
            f.sync_all()
        });
        drop(f);

        // A created file without content, fsynced: the create itself must become durable.
        let p = mp.join(format!("empty-{i}.md"));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        timed(
            format!("fsync of the new empty {}", p.display()),
            &mut || f.sync_all(),
        );
        drop(f);

        // Content committed by close(2) alone.
        let p = mp.join(format!("closed-{i}.md"));
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&content(&format!("close{i}"), 3000, 0))
            .unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
        timed(format!("close after writing {}", p.display()), &mut || {
            // SAFETY: closing the descriptor taken from the File just above, once.
            match unsafe { libc::close(fd) } {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });

        // A file created read-only (open(O_RDONLY|O_CREAT)): its close makes it durable too.
        let p = mp.join(format!("readonly-created-{i}.md"));
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; the descriptor is closed just below, once.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )
        };
        assert!(
            fd >= 0,
            "open O_RDONLY|O_CREAT {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
        timed(
            format!("close of the new read-only {}", p.display()),
            &mut || {
                // SAFETY: closing the descriptor opened just above, once.
                match unsafe { libc::close(fd) } {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            },
        );

        // An overwrite through O_TRUNC, fsynced.
        let p = mp.join(format!("created-{i}.md"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.write_all(&content(&format!("again{i}"), 500, 0)).unwrap();
        timed(
            format!("fsync after overwriting {}", p.display()),
            &mut || f.sync_all(),
        );
        drop(f);
    }

    // SIGTERM unmounts cleanly; strace exits with the daemon.
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let end = Instant::now() + Duration::from_secs(60);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("the daemon did not exit within 60 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "strace/daemon exit status {st}");
    assert!(!is_mounted(&mp), "still mounted after SIGTERM");

    // Syncs of the store file or its log, by the time strace saw them begin.
    let text = std::fs::read_to_string(&trace).unwrap();
    let store_s = store.to_str().unwrap();
    let mut syncs = Vec::new();
    let mut failed = Vec::new();
    for l in text.lines() {
        // "PID  SECONDS.MICROS fdatasync(4</path/to/store>) = 0"
        let Some((_pid, rest)) = l.trim().split_once(char::is_whitespace) else {
            continue;
        };
        let Some((ts, call)) = rest.trim_start().split_once(char::is_whitespace) else {
            continue;
        };
        if !(call.starts_with("fsync(") || call.starts_with("fdatasync(")) {
            continue;
        }
        // The store file, or its write-ahead log (where a durable commit's record goes).
        if !call.contains(&format!("<{store_s}>")) && !call.contains(&format!("<{store_s}.wal>")) {
            continue;
        }
        syncs.push(ts.parse::<f64>().unwrap());
        if call.contains("= -1") {
            failed.push(l.to_string());
        }
    }
    assert!(
        failed.is_empty(),
        "syncs of the store failed:\n{}",
        failed.join("\n")
    );
    let mut missing = Vec::new();
    for a in &acks {
        let n = syncs
            .iter()
            .filter(|&&t| t >= a.start && t <= a.end)
            .count();
        if n == 0 {
            missing.push(format!(
                "{} ({:.6}..{:.6}): acknowledged with no fsync/fdatasync of the store in between",
                a.what, a.start, a.end
            ));
        }
    }
    let first = acks.first().unwrap().start;
    let last = acks.last().unwrap().end;
    let during = syncs.iter().filter(|&&t| t >= first && t <= last).count();
    println!(
        "{} acknowledged fsyncs/closes, {during} syncs of the store file while they ran ({} in the whole trace)",
        acks.len(),
        syncs.len()
    );
    assert!(
        missing.is_empty(),
        "{} of {} acknowledgements had no sync behind them:\n{}",
        missing.len(),
        acks.len(),
        missing.join("\n")
    );
    assert!(
        during >= acks.len(),
        "{during} syncs for {} acknowledged fsyncs",
        acks.len()
    );

    // And what they acknowledged is there.
    check_store(&store).unwrap();
    let mut tm_out = common::redbfs(&[
        "mount",
        mp.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--log-file",
        log.to_str().unwrap(),
    ]);
    assert!(tm_out.status.success(), "remount: {:?}", tm_out);
    for i in 0..N {
        assert_eq!(
            std::fs::read(mp.join(format!("created-{i}.md"))).unwrap(),
            content(&format!("again{i}"), 500, 0)
        );
        assert_eq!(
            std::fs::read(mp.join(format!("closed-{i}.md"))).unwrap(),
            content(&format!("close{i}"), 3000, 0)
        );
        assert_eq!(
            std::fs::metadata(mp.join(format!("empty-{i}.md")))
                .unwrap()
                .len(),
            0
        );
    }
    tm_out = common::redbfs(&["unmount", mp.to_str().unwrap()]);
    assert!(tm_out.status.success());
    let problems = log_problems(&std::fs::read_to_string(&log).unwrap_or_default());
    assert!(problems.is_empty(), "daemon log: {problems:?}");
}

// ---------------------------------------------------------------------------------------------
// Disk full

/// A tmpfs of `size` mounted on a fresh directory; unmounted on drop.
struct Tmpfs {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("redbfs-tmpfs-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("fs");
        std::fs::create_dir(&path).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &path,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .unwrap_or_else(|e| panic!("mount -t tmpfs -o size={size}: {e} (the test needs root)"));
        Tmpfs { _dir: dir, path }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// How writing one file went.
#[derive(Debug)]
enum Outcome {
    Saved,
    Failed { at: &'static str, errno: String },
}

/// The SDK's create: O_EXCL, write, fsync, close; where it failed, if it did.
fn sdk_create(path: &Path, data: &[u8]) -> Outcome {
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => {
            return Outcome::Failed {
                at: "open",
                errno: errno_of(&e),
            };
        }
    };
    if let Err(e) = f.write_all(data) {
        return Outcome::Failed {
            at: "write",
            errno: errno_of(&e),
        };
    }
    if let Err(e) = f.sync_all() {
        return Outcome::Failed {
            at: "fsync",
            errno: errno_of(&e),
        };
    }
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: closing the descriptor taken from the File just above, once.
    if unsafe { libc::close(fd) } != 0 {
        return Outcome::Failed {
            at: "close",
            errno: errno_of(&std::io::Error::last_os_error()),
        };
    }
    Outcome::Saved
}

/// Fills the mount until a write fails, then checks the full-disk promises: the
/// failure is ENOSPC at write, close or fsync; the daemon keeps answering; everything saved
/// before reads back whole; deleting files succeeds and frees room, after which writes succeed
/// again; all of it survives a remount and the store checks clean. Every broken promise is
/// collected (going on where possible, with a restart to see what a restart mends) and the
/// test fails with the full account.
fn fill_and_recover(tm: &mut TestMount, file_size: u64, what: &str) {
    let tag = what.replace(' ', "_");
    let mut broken: Vec<String> = Vec::new();
    let mut saved: Vec<(String, Vec<u8>)> = Vec::new();
    let mut first_failure = None;
    for i in 0..400 {
        let name = format!("fill-{i:03}.md");
        let data = content(&format!("{tag}.{i}"), file_size, 0);
        match sdk_create(&tm.path(&name), &data) {
            Outcome::Saved => saved.push((name, data)),
            Outcome::Failed { at, errno } => {
                first_failure = Some((name, at, errno));
                break;
            }
        }
    }
    let (failed_name, at, errno) =
        first_failure.unwrap_or_else(|| panic!("{what}: 400 files written and never ENOSPC"));
    println!(
        "{what}: {} files of {file_size} bytes saved, then {failed_name} failed at {at} with {errno}",
        saved.len()
    );
    if !errno.starts_with("ENOSPC") {
        broken.push(format!(
            "a full disk must fail with ENOSPC at write, close or fsync; {failed_name} got {errno} at {at}"
        ));
    }
    // More small attempts while full: each fails cleanly or succeeds whole.
    let mut late = Vec::new();
    for j in 0..5 {
        let name = format!("late-{j}.md");
        let data = content(&format!("{tag}.late.{j}"), 2_000, 0);
        match sdk_create(&tm.path(&name), &data) {
            Outcome::Saved => saved.push((name, data)),
            Outcome::Failed { at, errno } => {
                if !errno.starts_with("ENOSPC") {
                    broken.push(format!(
                        "while full, creating {name} failed at {at} with {errno}, not ENOSPC"
                    ));
                }
                late.push(format!("{name}: {at} {errno}"));
            }
        }
    }
    println!("{what}: small writes while full: {late:?}");

    // The daemon answers, and everything saved reads back whole.
    match status(&tm.mountpoint) {
        Ok(st) => {
            println!(
                "{what}: status while full: poisoned {}, {} files, {} content bytes",
                st["poisoned"], st["files"], st["content_bytes"]
            );
        }
        Err(e) => broken.push(format!("the daemon does not answer status: {e}")),
    }
    let read_back = |tm: &TestMount, saved: &[(String, Vec<u8>)]| -> Vec<String> {
        let mut damaged = Vec::new();
        for (name, data) in saved {
            match std::fs::read(tm.path(name)) {
                Ok(got) if got == *data => {}
                Ok(got) => damaged.push(format!("{name}: {}", describe_bytes(&got))),
                Err(e) => damaged.push(format!("{name}: {}", errno_of(&e))),
            }
        }
        damaged
    };
    let damaged = read_back(tm, &saved);
    if !damaged.is_empty() {
        broken.push(format!(
            "files saved before the disk filled are damaged or unreadable: {damaged:?}"
        ));
    }
    // The failed file was never acknowledged: absent, empty or whole, never mixed.
    if let Ok(got) = std::fs::read(tm.path(&failed_name))
        && let Some(why) = check_prefix(&got)
    {
        broken.push(format!("{failed_name} holds mixed content: {why}"));
    }

    // Deleting files frees space; then writes succeed again.
    let _ = std::fs::remove_file(tm.path(&failed_name));
    let half = saved.len() / 2;
    let mut removed = Vec::new();
    let mut unlink_errors = Vec::new();
    let mut kept = Vec::new();
    for (i, (name, data)) in saved.drain(..).enumerate() {
        if i >= half {
            kept.push((name, data));
            continue;
        }
        match std::fs::remove_file(tm.path(&name)) {
            Ok(()) => removed.push(name),
            Err(e) => {
                unlink_errors.push(format!("{name}: {}", errno_of(&e)));
                kept.push((name, data));
            }
        }
    }
    let mut saved = kept;
    if !unlink_errors.is_empty() {
        broken.push(format!(
            "deleting files on the full store failed ({} of {half}), so room can never be made: {}",
            unlink_errors.len(),
            unlink_errors.first().unwrap()
        ));
    }
    let write_after =
        |tm: &TestMount, round: &str, saved: &mut Vec<(String, Vec<u8>)>| -> Vec<String> {
            let mut errs = Vec::new();
            for j in 0..3 {
                let name = format!("{round}-{j}.md");
                let data = content(&format!("{tag}.{round}.{j}"), file_size, 0);
                match sdk_create(&tm.path(&name), &data) {
                    Outcome::Saved => saved.push((name, data)),
                    Outcome::Failed { at, errno } => errs.push(format!("{name}: {at} {errno}")),
                }
            }
            errs
        };
    let errs = write_after(tm, "after", &mut saved);
    if !errs.is_empty() {
        broken.push(format!("writes still fail after deleting files: {errs:?}"));
    }
    if !broken.is_empty() {
        let st = status(&tm.mountpoint);
        broken.push(format!(
            "status now: {}",
            st.map(|v| format!("poisoned {}, {} files", v["poisoned"], v["files"]))
                .unwrap_or_else(|e| e)
        ));
        broken.push(format!("daemon log:\n{}", tail(&tm.log_text(), 2500)));
    }

    // A restart: everything saved is intact; see what it mends.
    tm.unmount();
    if let Err(e) = check_store(&tm.store) {
        broken.push(format!("after the disk filled: {e}"));
    }
    tm.mount();
    let damaged = read_back(tm, &saved);
    if !damaged.is_empty() {
        broken.push(format!(
            "after a restart, saved files are damaged or unreadable: {damaged:?}"
        ));
    }
    for name in &removed {
        if tm.path(name).exists() {
            broken.push(format!("after a restart, deleted {name} is back"));
        }
    }
    if !unlink_errors.is_empty() {
        // Only to describe what a restart does for the failure above.
        let mut after_restart = Vec::new();
        let mut i = 0;
        while i < saved.len() && after_restart.len() < half {
            let name = saved[i].0.clone();
            match std::fs::remove_file(tm.path(&name)) {
                Ok(()) => {
                    saved.remove(i);
                    after_restart.push(format!("{name}: ok"));
                }
                Err(e) => {
                    after_restart.push(format!("{name}: {}", errno_of(&e)));
                    i += 1;
                }
            }
        }
        let errs = write_after(tm, "restarted", &mut saved);
        let failures: Vec<_> = after_restart
            .iter()
            .filter(|s| !s.ends_with(": ok"))
            .collect();
        broken.push(format!(
            "after a restart: deleting {} files: {}; then writing 3 files of {file_size} bytes: {}",
            after_restart.len(),
            if failures.is_empty() {
                "all ok".to_string()
            } else {
                format!("{failures:?}")
            },
            if errs.is_empty() {
                "all saved".to_string()
            } else {
                format!("{errs:?}")
            }
        ));
        broken.push(format!(
            "the store file after that: {} bytes; the filesystem under it: {} bytes free",
            std::fs::metadata(&tm.store).map(|m| m.len()).unwrap_or(0),
            nix::sys::statvfs::statvfs(tm.store.parent().unwrap())
                .map(|s| s.blocks_available() * s.fragment_size())
                .unwrap_or(0)
        ));
    }
    tm.unmount();
    if let Err(e) = check_store(&tm.store) {
        broken.push(format!("at the end: {e}"));
    }
    let panics: Vec<_> = log_problems(&tm.log_text())
        .into_iter()
        .filter(|l| l.contains("panicked"))
        .collect();
    if !panics.is_empty() {
        broken.push(format!("the daemon panicked: {panics:?}"));
    }
    assert!(
        broken.is_empty(),
        "{what}: the store broke promises of a full disk:\n- {}",
        broken.join("\n- ")
    );
}

#[test]
fn disk_full_on_tmpfs() {
    if !fuse_available() {
        return;
    }
    let fs = Tmpfs::new("8m");
    let dir = tempfile::Builder::new()
        .prefix("redbfs-full-")
        .tempdir()
        .unwrap();
    let mut tm = test_mount_at(dir, fs.path.join("store.redb"));
    fill_and_recover(&mut tm, 256 * 1024, "tmpfs 8m");
    drop(tm);
    drop(fs);
}

#[test]
fn disk_full_on_quota() {
    if !fuse_available() {
        return;
    }
    let mut tm = TestMount::with_args(&["--quota", "3M"]);
    fill_and_recover(&mut tm, 200 * 1024, "quota 3M");
}

/// A `TestMount` (unmounted on drop) over a store the test placed itself: the harness has no
/// constructor for that, so one is made with its defaults, unmounted and pointed elsewhere.
fn test_mount_at(dir: tempfile::TempDir, store: PathBuf) -> TestMount {
    let mut t = TestMount::new();
    t.unmount();
    t.mountpoint = dir.path().join("mnt");
    t.log = dir.path().join("daemon.log");
    t.dir = dir;
    t.store = store;
    t.mount();
    t
}

// ---------------------------------------------------------------------------------------------
// Concurrency soak

#[test]
fn concurrency_soak() {
    if !fuse_available() {
        return;
    }
    become_subreaper();
    let secs = env_u64("REDBFS_SOAK_SECS", 60);
    let seed = mix(base_seed(), hash_str("concurrency_soak"));
    let base = std::env::var("REDBFS_SEED").unwrap_or_default();
    println!(
        "concurrency_soak: {secs} s, seed {seed}{}, SDK tool {}",
        if base.is_empty() {
            String::new()
        } else {
            format!(" (REDBFS_SEED={base})")
        },
        if sdk_available() {
            "@anthropic-ai/sdk (node)"
        } else {
            "NOT INSTALLED: Python workers do the SDK's system calls instead (run tests/clients/setup.sh)"
        }
    );
    let mut tm = TestMount::new();
    let mut model = Model::new();
    put_dir(&tm.mountpoint, &mut model, "memories");
    let mut specs = Vec::new();
    for i in 0..4 {
        specs.push(Spec::new(
            Lang::Sdk,
            "soak-writer",
            &format!("memories/m{i}"),
        ));
        specs.push(Spec::new(
            Lang::Python,
            "soak-writer",
            &format!("memories/p{i}"),
        ));
    }
    for i in 0..2 {
        specs.push(
            Spec::new(Lang::Python, "soak-renamer", &format!("memories/r{i}"))
                .extra(serde_json::json!({"files": 100})),
        );
    }
    for i in 0..2 {
        let mut s = Spec::new(Lang::Sdk, "soak-reader", "memories");
        s.label = format!("sdk:soak-reader:{i}");
        specs.push(s);
        let mut s = Spec::new(Lang::Python, "soak-reader", "memories");
        s.label = format!("py:soak-reader:{i}");
        specs.push(s);
    }
    let dir = tm.dir.path().join("soak");
    let started = Instant::now();
    let mut workers = Workers::spawn(
        &specs,
        &tm.mountpoint,
        &dir,
        seed,
        "soak",
        Some(secs as f64),
    );
    workers
        .wait_ready(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));

    // The daemon must keep answering its control socket throughout.
    let deadline = Instant::now() + Duration::from_secs(secs + 120);
    let mut status_max = Duration::ZERO;
    loop {
        let all_done = workers.procs.iter_mut().all(|p| {
            p.child
                .as_mut()
                .is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
        });
        if all_done {
            break;
        }
        if Instant::now() > deadline {
            let st = status(&tm.mountpoint);
            let hung: Vec<String> = workers
                .procs
                .iter_mut()
                .filter_map(|p| {
                    let running = p
                        .child
                        .as_mut()
                        .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
                    running.then_some(p)
                })
                .map(|p| {
                    format!(
                        "{} (journal tail: {:?})",
                        p.spec.label,
                        read_journal(&p.journal)
                            .iter()
                            .rev()
                            .take(3)
                            .collect::<Vec<_>>()
                    )
                })
                .collect();
            panic!(
                "deadlock suspected: workers still running {} s after the soak ended: {hung:#?}\nstatus: {st:?}\nlog:\n{}",
                120,
                tail(&tm.log_text(), 3000)
            );
        }
        let t = Instant::now();
        let st = status(&tm.mountpoint);
        status_max = status_max.max(t.elapsed());
        assert!(st.is_ok(), "the daemon stopped answering status: {st:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let killed = workers.wait_exit(Duration::from_secs(1));
    assert!(killed.is_empty());
    println!(
        "concurrency_soak: workers finished after {:?}",
        started.elapsed()
    );

    let mut m = model.clone();
    let mut problems = Vec::new();
    let mut total_ops = 0;
    for p in &workers.procs {
        let lines = read_journal(&p.journal);
        let r = replay(&p.spec.label, &lines, &mut m).unwrap_or_else(|e| panic!("{e}"));
        problems.extend(r.problems.clone());
        if !r.done || !p.status.is_some_and(|s| s.success()) {
            problems.push(format!(
                "{} did not finish cleanly ({:?}); output:\n{}",
                p.spec.label,
                p.status,
                tail(
                    &std::fs::read_to_string(&p.output).unwrap_or_default(),
                    2000
                )
            ));
        }
        if let Some(pd) = &r.pending {
            problems.push(format!(
                "{}: operation never returned: {:?}",
                p.spec.label, pd.op
            ));
        }
        let ops = lines
            .iter()
            .find(|v| v.get("done").is_some())
            .and_then(|v| v["ops"].as_u64())
            .unwrap_or(0);
        total_ops += ops;
        println!(
            "  {:28} {:6} operations, slowest {:7.1} ms",
            p.spec.label, ops, r.max_ms
        );
    }
    println!("concurrency_soak: {total_ops} operations; slowest status answer {status_max:?}");
    assert!(
        problems.is_empty(),
        "concurrency soak (seed {seed}):\n{}",
        problems.join("\n")
    );
    let st = status(&tm.mountpoint).unwrap();
    assert_eq!(
        st["open_handles"], 0,
        "handles left open after every worker exited: {st}"
    );

    // The final tree equals the model: on this mount, and after a clean remount.
    let mut rd = Reader::new(&tm.mountpoint);
    let actual = read_tree(&tm.mountpoint).unwrap();
    verify_all(&m, &actual, &mut rd, &[]).unwrap_or_else(|e| panic!("live tree vs model: {e}"));
    tm.unmount();
    check_store(&tm.store).unwrap();
    tm.mount();
    let mut rd = Reader::new(&tm.mountpoint);
    let actual = read_tree(&tm.mountpoint).unwrap();
    verify_all(&m, &actual, &mut rd, &[])
        .unwrap_or_else(|e| panic!("tree after remount vs model: {e}"));
    println!(
        "concurrency_soak: final tree equals the model ({} KiB compared)",
        rd.bytes_read / 1024
    );
    let problems = log_problems(&tm.log_text());
    assert!(problems.is_empty(), "daemon log:\n{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// I/O errors
//
// Uses the daemon's test-only hook (src/store/fault.rs): with REDBFS_FAULT_INJECTION=1 in the
// environment of `redbfs mount`, the store is opened over a StorageBackend wrapping redb's
// FileBackend, and the control socket takes
//     {"op": "fault", "on": "write" | "sync", "nth": N}
// after which the N-th call (1 = the next one) to the backend's `write` or `sync_data` fails
// once with EIO; the answer is {"ok": true}. Without the variable the op is refused.
// Run with `cargo test --test durability io_fault`.

fn control(store: &Path, req: Value) -> Result<Value, String> {
    use std::io::{BufRead, BufReader};
    let mut sock = std::path::PathBuf::from(store).into_os_string();
    sock.push(".sock");
    let s = std::os::unix::net::UnixStream::connect(&sock).map_err(|e| e.to_string())?;
    writeln!(&s, "{req}").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(&s)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&line).map_err(|e| format!("{e}: {line:?}"))
}

/// An injected I/O error at the `nth` next `on` ("write" or "sync") of the store or its log,
/// hit by a create of `doomed_len` bytes (over 512 KiB: a checkpoint, a durable commit of the
/// store file itself, rather than a log record).
fn io_fault(on: &str, nth: u64, doomed_len: u64) {
    // SAFETY: set before any thread of this test spawns a process that reads it; the variable
    // only matters to the daemon `redbfs mount` starts (it inherits the environment).
    unsafe { std::env::set_var("REDBFS_FAULT_INJECTION", "1") };
    let mut tm = TestMount::new();
    let before: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| {
            (
                format!("kept-{i}.md"),
                content(&format!("kept{i}"), 3_000 + 40_000 * i, 0),
            )
        })
        .collect();
    std::fs::create_dir(tm.path("dir")).unwrap();
    for (name, data) in &before {
        assert!(matches!(sdk_create(&tm.path(name), data), Outcome::Saved));
    }
    let armed = control(
        &tm.store,
        serde_json::json!({"op": "fault", "on": on, "nth": nth}),
    )
    .unwrap_or_else(|e| panic!("control socket: {e}"));
    assert_eq!(
        armed["ok"], true,
        "the daemon has no fault-injection hook (see the comment above io_fault): {armed}"
    );
    // The next durable commit hits the fault.
    let doomed = content("doomed", doomed_len, 0);
    let outcome = sdk_create(&tm.path("doomed.md"), &doomed);
    let Outcome::Failed { at, errno } = &outcome else {
        panic!("the commit under an injected {on} fault was acknowledged");
    };
    println!("io fault on {on} #{nth}: doomed.md failed at {at} with {errno}");
    assert!(errno.starts_with("EIO"), "{at}: {errno}");

    // Poisoned: writes refused with EIO, reads served, status says so.
    let st = status(&tm.mountpoint).expect("the daemon answers after an I/O error");
    assert_eq!(st["poisoned"], true, "{st}\n{}", tm.log_text());
    let shown = common::redbfs(&["status", tm.mountpoint.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("failed:") && shown.contains("EIO"),
        "{shown}"
    );
    for (what, r) in [
        ("mkdir", std::fs::create_dir(tm.path("newdir"))),
        ("unlink", std::fs::remove_file(tm.path("kept-0.md"))),
        (
            "rename",
            std::fs::rename(tm.path("kept-1.md"), tm.path("moved.md")),
        ),
        ("rmdir", std::fs::remove_dir(tm.path("dir"))),
    ] {
        let e = r.expect_err(&format!("{what} on a poisoned store must fail"));
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}");
    }
    assert!(matches!(
        sdk_create(&tm.path("late.md"), b"late"),
        Outcome::Failed { .. }
    ));
    for (name, data) in &before {
        assert!(
            std::fs::read(tm.path(name)).unwrap() == *data,
            "{name} read while poisoned"
        );
    }
    assert!(
        tm.log_text().contains("restart"),
        "the log says a restart is needed:\n{}",
        tm.log_text()
    );

    // After a restart everything committed before the fault is intact. The log stays until
    // a checkpoint succeeds: after a failed fsync of the store file, a page the kernel
    // dropped can only be rebuilt from it.
    tm.unmount();
    assert!(
        redbfs::store::wal::path_of(&tm.store).exists(),
        "the log was removed after a failed commit"
    );
    check_store(&tm.store).unwrap();
    tm.mount();
    for (name, data) in &before {
        assert!(
            std::fs::read(tm.path(name)).unwrap() == *data,
            "{name} after restart"
        );
    }
    assert!(tm.path("dir").is_dir());
    match std::fs::read(tm.path("doomed.md")) {
        Err(_) => {}
        Ok(got) => assert!(
            got.is_empty() || got == doomed,
            "doomed.md: {}",
            describe_bytes(&got)
        ),
    }
    assert!(matches!(
        sdk_create(&tm.path("after.md"), b"after"),
        Outcome::Saved
    ));
    tm.unmount();
    check_store(&tm.store).unwrap();
}

#[test]
fn io_fault_on_sync() {
    if fuse_available() {
        io_fault("sync", 1, 100_000);
    }
}

#[test]
fn io_fault_on_write() {
    if fuse_available() {
        io_fault("write", 1, 100_000);
    }
}

#[test]
fn io_fault_on_a_checkpoints_sync() {
    if fuse_available() {
        io_fault("sync", 1, 700_000);
    }
}

/// The log's sync fails under one handle's fsync, which committed what another handle of the
/// same file had written. Every later fsync and close of that file fails too: its content
/// never reached the disk, and a close that found nothing left to commit used to answer OK.
#[test]
fn every_fsync_and_close_of_a_file_whose_sync_failed_fails() {
    if !fuse_available() {
        return;
    }
    // SAFETY: as in `io_fault`.
    unsafe { std::env::set_var("REDBFS_FAULT_INJECTION", "1") };
    let tm = TestMount::new();
    let path = tm.path("f.md");
    std::fs::write(&path, b"old").unwrap();
    let open = || std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let (mine, mut theirs) = (open(), open());
    theirs.write_all(b"their new content").unwrap();
    let armed = control(
        &tm.store,
        serde_json::json!({"op": "fault", "on": "sync", "nth": 1}),
    )
    .unwrap_or_else(|e| panic!("control socket: {e}"));
    assert_eq!(armed["ok"], true, "{armed}");
    let eio = |what: &str, r: std::io::Result<()>| {
        let e = r.expect_err(&format!("{what} answered OK after the failed sync"));
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}");
    };
    eio("the fsync whose sync failed", mine.sync_all());
    eio("a second fsync", mine.sync_all());
    eio("the other handle's fsync", theirs.sync_all());
    use std::os::fd::IntoRawFd;
    for (what, f) in [("the other handle's close", theirs), ("the close", mine)] {
        let rc = unsafe { libc::close(f.into_raw_fd()) };
        eio(
            what,
            if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            },
        );
    }
}

/// A bit flipped in a file's stored content was served by the mount and by `cat` with exit
/// 0; only `check` noticed. Each chunk now carries a checksum verified on every read: the
/// read fails with EIO and one error line names the file, the chunk and `redbfs check`.
#[test]
fn a_flipped_bit_in_stored_content_is_an_error_not_data() {
    if !fuse_available() {
        return;
    }
    let mut tm = TestMount::new();
    let pattern: Vec<u8> = b"checksum-guarded-memory-"
        .iter()
        .cycle()
        .take(20_000)
        .copied()
        .collect();
    std::fs::write(tm.path("notes.md"), &pattern).unwrap();
    std::fs::write(tm.path("other.md"), b"untouched").unwrap();
    tm.unmount();
    // Flip one bit in the middle of the content, where it lies in the store file.
    let mut bytes = std::fs::read(&tm.store).unwrap();
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern.as_slice())
        .expect("the content is in the store file")
        + 10_000;
    bytes[at] ^= 0x04;
    std::fs::write(&tm.store, &bytes).unwrap();

    let out = common::redbfs(&["cat", tm.store.to_str().unwrap(), "/notes.md"]);
    assert!(!out.status.success(), "cat served damaged content");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("checksum") && err.contains("redbfs check"),
        "{err}"
    );
    let out = common::redbfs(&["check", tm.store.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "check called it clean: {text}");
    assert!(
        text.contains("/notes.md: chunk 0") && text.contains("checksum"),
        "{text}"
    );

    tm.mount();
    let e = std::fs::read(tm.path("notes.md")).expect_err("the mount served damaged content");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(std::fs::read(tm.path("other.md")).unwrap(), b"untouched");
    let log = tm.log_text();
    let lines: Vec<_> = log
        .lines()
        .filter(|l| l.contains("does not match its checksum"))
        .collect();
    assert!(!lines.is_empty(), "no error line:\n{log}");
    assert!(
        lines[0].contains("/notes.md")
            && lines[0].contains("chunk 0")
            && lines[0].contains("redbfs check"),
        "{}",
        lines[0]
    );
}
