//! Security of the files redbfs keeps and of the store tools run as root on a hostile tree:
//! every file it creates is private whatever the umask; a symlink planted beside the store is
//! never followed; a store is refused in a directory other users can write in; `export` drops
//! setuid bits and never writes through a symlink; `import` never reads through one, never
//! waits on a FIFO, and shows hostile names escaped.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{fuse_available, redbfs, redbfs_bin, run_within};
use redbfs::store::Store;
use redbfs::tools;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn refused(out: Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "should fail; stderr: {err}");
    assert!(err.contains(needle), "message {err:?} lacks {needle:?}");
    err
}

/// Runs `redbfs ARGS...` under umask 0, as a careless shell or service manager would.
fn redbfs_umask0(args: &[&str]) -> Output {
    let mut cmd = Command::new(redbfs_bin());
    cmd.args(args);
    // SAFETY: umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    cmd.output().expect("run redbfs")
}

fn perm(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

fn beside(store: &Path, suffix: &str) -> PathBuf {
    let mut p = store.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// Unmounts on drop, so a failed assertion leaves no mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = redbfs(&["unmount", s(&self.0)]);
    }
}

#[test]
fn every_file_redbfs_creates_is_private_under_umask_0() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let store = dir.path().join("mnt.redb");
    ok(redbfs_umask0(&["mount", s(&mnt)]));
    let mounted = Mounted(mnt.clone());
    std::fs::create_dir(mnt.join("memories")).unwrap();
    std::fs::write(mnt.join("memories/secret.md"), "the launch code").unwrap();
    // While mounted: the store, its write-ahead log, the daemon's log and the socket.
    for (path, what) in [
        (store.clone(), "store"),
        (beside(&store, ".wal"), "write-ahead log"),
        (beside(&store, ".log"), "daemon log"),
        (beside(&store, ".sock"), "control socket"),
    ] {
        assert_eq!(perm(&path), 0o600, "{what} {}", path.display());
    }
    let snap = dir.path().join("snap.redb");
    ok(redbfs_umask0(&["snapshot", s(&mnt), s(&snap)]));
    assert_eq!(perm(&snap), 0o600, "snapshot");
    let tar = dir.path().join("out.tar");
    ok(redbfs_umask0(&["export", s(&mnt), "--tar", s(&tar)]));
    assert_eq!(perm(&tar), 0o600, "export tar");
    drop(mounted);

    // Unmounted: a store made by import, a snapshot of it, and a restore.
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.md"), "a").unwrap();
    let other = dir.path().join("other.redb");
    ok(redbfs_umask0(&["import", s(&src), s(&other)]));
    assert_eq!(perm(&other), 0o600, "store made by import");
    let snap2 = dir.path().join("snap2.redb");
    ok(redbfs_umask0(&["snapshot", s(&other), s(&snap2)]));
    assert_eq!(perm(&snap2), 0o600, "snapshot of an unmounted store");
    let restored = dir.path().join("restored.redb");
    ok(redbfs_umask0(&["restore", s(&snap2), s(&restored)]));
    assert_eq!(perm(&restored), 0o600, "restored store");
}

/// A snapshot's temporary file is the copy's own store file: created 0600 from its first byte.
#[test]
fn a_copy_of_a_store_is_private_from_its_first_byte() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    let out = dir.path().join("copy.redb");
    let r = store.read().unwrap();
    let mut seen = None;
    r.copy_to(&out, &mut |_| {
        seen.get_or_insert_with(|| perm(&out));
    })
    .unwrap();
    assert_eq!(seen, Some(0o600), "mode while the copy is written");
    assert_eq!(perm(&out), 0o600);
    // A copy never goes through a symlink at its name.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let link = dir.path().join("link.redb");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    assert!(r.copy_to(&link, &mut |_| {}).is_err());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
}

#[test]
fn a_symlink_at_the_stores_write_ahead_log_is_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.md"), "a").unwrap();
    let store = dir.path().join("s.redb");
    ok(redbfs(&["import", s(&src), s(&store)]));
    let wal = beside(&store, ".wal");

    // Dangling: following it would create the target, 4 MiB of log.
    let target = dir.path().join("root-only-file");
    std::os::unix::fs::symlink(&target, &wal).unwrap();
    std::fs::write(src.join("b.md"), "b").unwrap();
    refused(
        redbfs(&["import", s(&src), s(&store)]),
        "never follows a symlink",
    );
    assert!(!target.exists(), "the log was written through the symlink");

    // To an existing file: it is neither read as a log nor overwritten.
    std::fs::write(&target, "root's secrets").unwrap();
    refused(
        redbfs(&["import", s(&src), s(&store)]),
        "never follows a symlink",
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "root's secrets");
    assert!(std::fs::symlink_metadata(&wal).unwrap().is_symlink());
    std::fs::remove_file(&wal).unwrap();
    ok(redbfs(&["import", s(&src), s(&store)]));
    assert!(!wal.exists(), "the log is removed when the store closes");
}

#[test]
fn a_symlink_at_the_daemons_log_or_write_ahead_log_refuses_the_mount() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let store = dir.path().join("mnt.redb");
    let victim = dir.path().join("root-only-file");
    std::fs::write(&victim, "root's secrets").unwrap();
    std::os::unix::fs::symlink(&victim, beside(&store, ".log")).unwrap();
    let out = redbfs(&["mount", s(&mnt)]);
    let _guard = out.status.success().then(|| Mounted(mnt.clone()));
    refused(out, "never follows a symlink");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's secrets");
    std::fs::remove_file(beside(&store, ".log")).unwrap();

    std::os::unix::fs::symlink(&victim, beside(&store, ".wal")).unwrap();
    let out = redbfs(&["mount", s(&mnt)]);
    let _guard = out.status.success().then(|| Mounted(mnt.clone()));
    refused(out, "never follows a symlink");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's secrets");
}

#[test]
fn a_store_in_a_directory_others_can_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.md"), "a").unwrap();
    let store = shared.join("s.redb");
    let rule = "writable by others without the sticky bit";
    refused(redbfs(&["import", s(&src), s(&store)]), rule);
    assert!(!store.exists());
    refused(redbfs(&["mount", s(&shared.join("mnt"))]), rule);
    assert!(!shared.join("mnt.redb").exists());
    assert!(!shared.join("mnt.redb.log").exists());
    let elsewhere = dir.path().join("s.redb");
    ok(redbfs(&["import", s(&src), s(&elsewhere)]));
    refused(
        redbfs(&["snapshot", s(&elsewhere), s(&shared.join("snap.redb"))]),
        rule,
    );
    // With the sticky bit (as /tmp), no one can remove or replace another user's file there.
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    ok(redbfs(&["import", s(&src), s(&store)]));
}

/// (mode, uid) of a path, not following a symlink.
fn mode_uid(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.mode() & 0o7777, m.uid())
}

#[test]
fn export_drops_setuid_and_setgid_unless_it_restores_the_owner() {
    let root = nix::unistd::geteuid().is_root();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("team")).unwrap();
    std::fs::write(src.join("id"), "#!/bin/sh\nid\n").unwrap();
    if root {
        // Before the mode: a change of owner clears setuid.
        std::os::unix::fs::chown(src.join("id"), Some(1000), Some(1000)).unwrap();
    }
    std::fs::set_permissions(src.join("id"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::set_permissions(src.join("team"), std::fs::Permissions::from_mode(0o2775)).unwrap();
    let store = dir.path().join("s.redb");
    ok(redbfs(&["import", s(&src), s(&store)]));

    let out = dir.path().join("out");
    ok(redbfs(&["export", s(&store), s(&out)]));
    let me = nix::unistd::geteuid().as_raw();
    assert_eq!(mode_uid(&out.join("id")), (0o755, me), "setuid dropped");
    assert_eq!(mode_uid(&out.join("team")).0, 0o775, "setgid dropped");

    let same = dir.path().join("same");
    if root {
        ok(redbfs(&["export", s(&store), s(&same), "--same-owner"]));
        assert_eq!(
            mode_uid(&same.join("id")),
            (0o4755, 1000),
            "owner and setuid kept"
        );
        assert_eq!(mode_uid(&same.join("team")).0, 0o2775);
    } else {
        refused(
            redbfs(&["export", s(&store), s(&same), "--same-owner"]),
            "only root",
        );
    }
}

/// A store holding /a/f.md, /a/b/g.md and /z.md.
fn small_store(path: &Path) {
    let src = path.with_extension("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("a/f.md"), "f").unwrap();
    std::fs::write(src.join("a/b/g.md"), "g").unwrap();
    std::fs::write(src.join("z.md"), "z").unwrap();
    ok(redbfs(&["import", s(&src), s(path)]));
}

/// The names in `dir` and its mode: what an export must leave alone.
fn untouched(dir: &Path) -> (Vec<String>, u32) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    (names, perm(dir))
}

#[test]
fn export_never_writes_through_a_directory_swapped_for_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("s.redb");
    small_store(&store_path);
    let outside = dir.path().join("root-only");
    std::fs::create_dir(&outside).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
    let before = untouched(&outside);

    // The destination's owner swaps `a` for a symlink as soon as export has made it.
    let dest = dir.path().join("dest");
    let store = Store::open_existing(&store_path).unwrap();
    let r = store.read().unwrap();
    let mut swapped = false;
    let result = tools::export_dir(&r, "/", &dest, Default::default(), &mut |_| {
        let a = dest.join("a");
        if !swapped && a.is_dir() {
            std::fs::rename(&a, dest.join("a-moved")).unwrap();
            std::os::unix::fs::symlink(&outside, &a).unwrap();
            swapped = true;
        }
    });
    assert!(swapped);
    assert_eq!(
        untouched(&outside),
        before,
        "export wrote outside: {result:?}"
    );
    // What export wrote of `a` stayed in the directory it made.
    assert_eq!(
        std::fs::read_to_string(dest.join("a-moved/f.md")).unwrap(),
        "f"
    );

    // A symlink already where a directory goes, or at the destination itself: refused.
    let dest2 = dir.path().join("dest2");
    let e = tools::export_dir(&r, "/", &dest2, Default::default(), &mut |_| {
        let _ = std::os::unix::fs::symlink(outside.join("planted"), dest2.join("z.md"));
    });
    assert!(e.is_err(), "export wrote through a planted symlink");
    assert_eq!(untouched(&outside), before);
    drop(r);
    drop(store);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let out = redbfs(&["export", s(&store_path), s(&link)]);
    refused(out, "symbolic link");
    assert_eq!(untouched(&outside), before);
}

#[test]
fn export_tar_never_follows_or_replaces_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.redb");
    small_store(&store);
    let existing = dir.path().join("existing.tar");
    std::fs::write(&existing, "keep me").unwrap();
    refused(
        redbfs(&["export", s(&store), "--tar", s(&existing)]),
        "already exists",
    );
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");

    let victim = dir.path().join("root-only-file");
    std::fs::write(&victim, "root's secrets").unwrap();
    let link = dir.path().join("link.tar");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    refused(
        redbfs(&["export", s(&store), "--tar", s(&link)]),
        "already exists",
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's secrets");

    // --force replaces the symlink itself, never what it points to.
    ok(redbfs(&["export", s(&store), "--tar", s(&link), "--force"]));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's secrets");
    let m = std::fs::symlink_metadata(&link).unwrap();
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o777, 0o600);
    ok(redbfs(&[
        "export",
        s(&store),
        "--tar",
        s(&existing),
        "--force",
    ]));
    assert!(std::fs::metadata(&existing).unwrap().len() > 1024);
}

/// Runs `redbfs ARGS...`, failing the test if it has not finished within `limit`.
fn redbfs_within(args: &[&str], limit: Duration) -> Output {
    let mut cmd = Command::new(redbfs_bin());
    cmd.args(args);
    run_within(cmd, limit)
}

#[test]
fn import_skips_symlinks_and_fifos_and_shows_hostile_names_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("notes")).unwrap();
    std::fs::write(src.join("notes/good.md"), "ok").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("notes/link.md")).unwrap();
    nix::unistd::mkfifo(
        &src.join("notes/pipe.md"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    std::fs::write(src.join("notes/rtl\u{202e}dm.exe"), "x").unwrap();
    std::fs::write(src.join("notes/esc\x1b[2Jclear.md"), "x").unwrap();
    let store = dir.path().join("s.redb");
    let out = redbfs_within(&["import", s(&src), s(&store)], Duration::from_secs(60));
    let err = ok(out);
    assert!(err.contains("link.md: symlink"), "{err}");
    assert!(err.contains("pipe.md: special file"), "{err}");
    assert!(err.contains("rtl\\u{202e}dm.exe"), "{err}");
    assert!(err.contains("esc\\x1b[2Jclear.md"), "{err}");
    assert!(
        !err.contains('\u{202e}') && !err.contains('\x1b'),
        "raw control or format characters printed: {err:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&redbfs(&["ls", s(&store), "/notes"]).stdout),
        "good.md\n"
    );
    // The JSON report names them the same way.
    let store2 = dir.path().join("s2.redb");
    let out = redbfs_within(
        &["import", s(&src), s(&store2), "--json"],
        Duration::from_secs(60),
    );
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let skipped = report["skipped"].to_string();
    assert!(skipped.contains("rtl\\\\u{202e}dm.exe"), "{skipped}");
}

/// The race of a user who swaps `a.md` between a file and a symlink to a root-only file while
/// root imports the tree: what is imported is the file or nothing, never the secret.
#[test]
fn import_never_reads_through_an_entry_swapped_for_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("shadow");
    std::fs::write(&secret, "root:SECRET").unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.md"), "public").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, src, secret) = (stop.clone(), src.clone(), secret.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::write(src.join(".file"), "public");
                let _ = std::fs::rename(src.join(".file"), src.join("a.md"));
                let _ = std::os::unix::fs::symlink(&secret, src.join(".link"));
                let _ = std::fs::rename(src.join(".link"), src.join("a.md"));
            }
        })
    };
    let limits = redbfs::fs::Limits::default();
    let started = Instant::now();
    let mut imported = 0;
    for i in 0..400 {
        if started.elapsed() > Duration::from_secs(8) {
            break;
        }
        let store = Store::open_or_create(&dir.path().join(format!("s{i}.redb")), (0, 0)).unwrap();
        let report = tools::import(&store, &limits, &src, "/", false, &mut |_| {}).unwrap();
        let r = store.read().unwrap();
        if let Ok(content) = tools::cat(&r, "/a.md") {
            assert_eq!(content, b"public", "round {i}: {report:?}");
            imported += 1;
        }
        drop(r);
        drop(store);
        let _ = std::fs::remove_file(dir.path().join(format!("s{i}.redb")));
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(imported > 0, "the file itself was never imported");
}

/// A tmpfs mounted at `path` with a process working inside it (so it is busy: a plain umount
/// fails, a lazy one would detach it); both undone on drop.
struct BusyTmpfs {
    path: PathBuf,
    inside: std::process::Child,
}

impl BusyTmpfs {
    fn at(path: &Path) -> BusyTmpfs {
        std::fs::create_dir(path).unwrap();
        nix::mount::mount(
            Some("redbfs-test"),
            path,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        let inside = Command::new("sleep")
            .arg("1000")
            .current_dir(path)
            .spawn()
            .unwrap();
        BusyTmpfs {
            path: path.to_path_buf(),
            inside,
        }
    }

    fn mounted(&self) -> bool {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        table.lines().any(|l| {
            l.split(' ').nth(4) == Some(s(&self.path)) && l.contains(" - tmpfs redbfs-test ")
        })
    }
}

impl Drop for BusyTmpfs {
    fn drop(&mut self) {
        let _ = self.inside.kill();
        let _ = self.inside.wait();
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn is_mountpoint(p: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    table.lines().any(|l| l.split(' ').nth(4) == Some(s(p)))
}

/// A root daemon unmounted whatever its mountpoint's path led to at unmount time: a user who
/// owns a directory on that path moved it away and put a symlink to a busy tmpfs of root's
/// where the mountpoint was; `unmount` of the real mount then had the daemon umount(2) the
/// path (following the symlink), get EBUSY and lazily detach root's tmpfs, while the redbfs
/// mount stayed and the command hung. The daemon now unmounts only its own mount, known by
/// its device number: found where the mount table has it now, and the tmpfs is untouched.
#[test]
fn a_daemon_unmounts_only_its_own_mount_whatever_its_path_leads_to_now() {
    if !fuse_available() || !nix::unistd::geteuid().is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tmpfs = BusyTmpfs::at(&dir.path().join("x"));
    let boxed = dir.path().join("box");
    std::fs::create_dir(&boxed).unwrap();
    let mnt = boxed.join("mnt");
    let store = dir.path().join("s.redb");
    ok(redbfs(&["mount", s(&mnt), "--store", s(&store)]));
    let moved = dir.path().join("box.old");
    let _mounted = Mounted(moved.join("mnt"));
    std::fs::rename(&boxed, &moved).unwrap();
    std::fs::create_dir(&boxed).unwrap();
    std::os::unix::fs::symlink(&tmpfs.path, &mnt).unwrap();

    let out = redbfs_within(
        &["unmount", s(&moved.join("mnt"))],
        Duration::from_secs(120),
    );
    assert!(tmpfs.mounted(), "root's busy tmpfs was detached");
    ok(out);
    assert!(
        !is_mountpoint(&moved.join("mnt")),
        "the redbfs mount stayed"
    );
    let log = std::fs::read_to_string(dir.path().join("s.redb.log")).unwrap();
    assert!(
        log.contains("no longer leads to this mount") && log.contains(s(&moved.join("mnt"))),
        "the daemon's log does not say where it unmounted: {log}"
    );
}

/// The look at the control socket and its bind are serialised by a lock a daemon takes; it
/// was a blocking lock on the store's directory, which anyone who can read that directory
/// could hold forever. It is now `STORE.lock`, the owner's own file (0600, not followed
/// through a symlink), tried for a bounded time: a holder makes the mount fail, naming it.
#[test]
fn a_held_store_lock_refuses_the_mount_naming_it() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let lock = dir.path().join("mnt.redb.lock");
    let mut holder = Command::new("flock")
        .arg(&lock)
        .args(["sh", "-c", "echo held; exec sleep 1000"])
        .stdout(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut said,
    )
    .unwrap();
    assert_eq!(said.trim(), "held");
    let out = redbfs_within(&["mount", s(&mnt)], Duration::from_secs(120));
    // flock and the sleep that inherited its lock, by their group.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(holder.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = holder.wait();
    let _mounted = Mounted(mnt.clone());
    let err = refused(out, "another process holds a lock on it");
    assert!(err.contains(s(&lock)), "{err}");
    assert!(!is_mountpoint(&mnt), "mounted although refused");
}
