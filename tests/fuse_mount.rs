//! Real mounts: the daemon's lifecycle (refusals, stale-mount recovery, persistence), how the
//! mount shows in the mount table, and the operations that only a kernel mount exercises
//! (special files, xattrs, statfs, open-unlinked files, attributes the SDK reads).

mod common;

use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{TestMount, fuse_available, ok, redbfs};

fn errno_of(r: std::io::Result<impl Sized>) -> i32 {
    r.err().and_then(|e| e.raw_os_error()).unwrap_or(0)
}

fn mountinfo_line(mp: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .find(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
        .map(str::to_string)
}

/// SIGKILLs the daemon `st` (a `status --json`) names and waits until the process is gone.
fn kill_daemon(st: &serde_json::Value) {
    let pid = st["pid"].as_i64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    while Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn status(m: &TestMount) -> serde_json::Value {
    let out = redbfs(&["status", m.mountpoint.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn mount_shows_as_fuse_redbfs_with_its_store() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let line = mountinfo_line(&m.mountpoint).expect("mounted");
    let (left, right) = line.split_once(" - ").unwrap();
    let mut r = right.split(' ');
    assert_eq!(r.next(), Some("fuse.redbfs"));
    assert_eq!(
        r.next(),
        Some(format!("redbfs:{}", m.store.display()).as_str())
    );
    let opts = left.split(' ').nth(5).unwrap();
    assert!(opts.contains("nosuid") && opts.contains("nodev"), "{opts}");
    assert!(r.next().unwrap().contains("default_permissions"));
    // The control socket sits beside the store, readable by its owner only.
    let sock = std::fs::metadata(format!("{}.sock", m.store.display())).unwrap();
    assert_eq!(sock.permissions().mode() & 0o777, 0o600);
}

#[test]
fn refuses_live_mount_busy_store_and_mountpoint_with_files() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let mp = m.mountpoint.to_str().unwrap();
    let out = redbfs(&[
        "mount",
        mp,
        "--store",
        m.dir.path().join("other.redb").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already a live mount"));

    let mp2 = m.dir.path().join("mnt2");
    let out = redbfs(&[
        "mount",
        mp2.to_str().unwrap(),
        "--store",
        m.store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already opened by another redbfs daemon"),
        "{err}"
    );
    assert!(err.contains(mp), "names the mountpoint: {err}");

    let full = m.dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), "1").unwrap();
    let out = redbfs(&["mount", full.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("redbfs import"));
}

#[test]
fn unknown_store_format_is_refused() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    m.unmount();
    // A store from a future release: same tables, newer format number.
    {
        let store = redbfs::store::Store::open_existing(&m.store).unwrap();
        let w = store.write().unwrap();
        w.put_meta("format", &99u64.to_le_bytes()).unwrap();
        w.commit(redbfs::store::Sync::Durable).unwrap();
    }
    let out = redbfs(&[
        "mount",
        m.mountpoint.to_str().unwrap(),
        "--store",
        m.store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("format version 99"));
}

/// Every durable answer given to several threads at once survives a killed daemon: fsync,
/// close, rename, unlink and rmdir are answered by the daemon's syncer only once the log's
/// sync covers them. (A SIGKILL keeps the page cache, but a commit's record reaches the log
/// file only when a sync writes it, so an answer given before its sync would be lost here.)
#[test]
fn durable_answers_to_concurrent_threads_survive_a_killed_daemon() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    std::fs::create_dir(m.path("t")).unwrap();
    const THREADS: usize = 6;
    const FILES: usize = 40;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let root = m.path(&format!("t/{t}"));
            std::thread::spawn(move || {
                std::fs::create_dir(&root).unwrap();
                for i in 0..FILES {
                    let p = root.join(format!("f{i}.md"));
                    let mut f = std::fs::File::create(&p).unwrap();
                    f.write_all(format!("{t}/{i}").as_bytes()).unwrap();
                    f.sync_all().unwrap();
                    drop(f);
                    match i % 4 {
                        1 => std::fs::rename(&p, root.join(format!("r{i}.md"))).unwrap(),
                        2 => std::fs::remove_file(&p).unwrap(),
                        _ => {}
                    }
                }
                std::fs::create_dir(root.join("sub")).unwrap();
                std::fs::remove_dir(root.join("sub")).unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let st = status(&m);
    let durable = st["commit_stats"]["durable_commits"].as_u64().unwrap();
    let syncs = st["commit_stats"]["log_syncs"].as_u64().unwrap();
    assert!(
        durable >= (THREADS * FILES) as u64 && syncs > 0 && syncs <= durable,
        "every fsync, rename and unlink is a durable commit: {st}"
    );
    kill_daemon(&st);
    m.mount_after_crash();
    for t in 0..THREADS {
        let root = m.path(&format!("t/{t}"));
        for i in 0..FILES {
            let (kept, gone) = match i % 4 {
                1 => (Some(format!("r{i}.md")), format!("f{i}.md")),
                2 => (None, format!("f{i}.md")),
                _ => (Some(format!("f{i}.md")), format!("r{i}.md")),
            };
            if let Some(k) = kept {
                assert_eq!(
                    std::fs::read_to_string(root.join(&k)).unwrap(),
                    format!("{t}/{i}"),
                    "t/{t}/{k}"
                );
            }
            assert!(!root.join(&gone).exists(), "t/{t}/{gone}");
        }
        assert!(!root.join("sub").exists(), "t/{t}/sub");
    }
}

#[test]
fn content_survives_unmount_and_a_killed_daemon() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    std::fs::create_dir_all(m.path("memories/deep")).unwrap();
    std::fs::write(m.path("memories/deep/a.md"), "alpha").unwrap();
    m.remount();
    assert_eq!(
        std::fs::read_to_string(m.path("memories/deep/a.md")).unwrap(),
        "alpha"
    );

    // fsync acknowledged, then SIGKILL: the content must be there after recovery.
    let mut f = std::fs::File::create(m.path("memories/b.md")).unwrap();
    f.write_all(b"bravo").unwrap();
    f.sync_all().unwrap();
    let st = status(&m);
    assert!(
        st["log_bytes"].as_u64().unwrap() > 0 && st["commits"].as_u64().unwrap() > 0,
        "b.md's content commit is in the write-ahead log: {st}"
    );
    // The fsync waited for the log: status counts the commit and the sync that covered it.
    let (durable, syncs) = (
        st["commit_stats"]["durable_commits"].as_u64().unwrap(),
        st["commit_stats"]["log_syncs"].as_u64().unwrap(),
    );
    assert!(
        durable > 0 && syncs > 0 && syncs <= durable,
        "commit counts: {st}"
    );
    // Those commits held the one write transaction for a while, within the mount's life.
    let (busy, open) = (
        st["commit_stats"]["writer_busy_ns"].as_u64().unwrap(),
        st["commit_stats"]["open_ns"].as_u64().unwrap(),
    );
    assert!(busy > 0 && busy <= open, "writer time: {st}");
    let shown = redbfs(&["status", m.mountpoint.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains("writer:     the one write transaction held"),
        "{shown}"
    );
    // The process gone, the stale mount must be cleared by mount.
    kill_daemon(&st);
    drop(f);
    assert_eq!(
        nix::sys::statfs::statfs(&m.mountpoint).err(),
        Some(nix::errno::Errno::ENOTCONN)
    );
    m.mount_after_crash();
    let unclean = "was not closed cleanly";
    assert_eq!(
        m.log_text().matches(unclean).count(),
        1,
        "the killed daemon's store is verified"
    );
    assert_eq!(
        m.log_text().matches("recovery: applied").count(),
        1,
        "what only the write-ahead log held (b.md) was applied"
    );
    assert_eq!(
        std::fs::read_to_string(m.path("memories/b.md")).unwrap(),
        "bravo"
    );
    // A clean unmount closes the store: the next mount has nothing to verify.
    m.remount();
    assert_eq!(
        m.log_text().matches(unclean).count(),
        1,
        "a clean unmount closes the store"
    );
    assert_eq!(
        std::fs::read_to_string(m.path("memories/deep/a.md")).unwrap(),
        "alpha"
    );
}

#[test]
fn only_files_and_directories_exist() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::write(m.path("f"), "x").unwrap();
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("/etc/passwd", m.path("link"))),
        libc::EPERM
    );
    assert_eq!(
        errno_of(std::fs::hard_link(m.path("f"), m.path("hard"))),
        libc::EPERM
    );
    let fifo = CString::new(m.path("fifo").to_str().unwrap()).unwrap();
    // SAFETY: a valid C string path.
    let r = unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
    let r = unsafe { libc::mknod(fifo.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EPERM)
    );
    // mknod of a regular file is a create.
    let reg = CString::new(m.path("reg").to_str().unwrap()).unwrap();
    assert_eq!(
        unsafe { libc::mknod(reg.as_ptr(), libc::S_IFREG | 0o640, 0) },
        0
    );
    assert!(m.path("reg").is_file());
    assert!(m.log_text().contains("symlink"), "the refusal is logged");
}

#[test]
fn xattrs_are_not_supported_and_cp_a_still_works() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::write(m.path("f"), "x").unwrap();
    let p = CString::new(m.path("f").to_str().unwrap()).unwrap();
    let name = CString::new("user.test").unwrap();
    // SAFETY: valid C strings and a valid buffer.
    let r = unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTSUP)
    );
    // Twice: the daemon answers the first with ENOSYS, and the kernel then answers ENOTSUP
    // itself, without a round trip (it asks before every write(2)).
    for round in 0..2 {
        let mut buf = [0u8; 64];
        // SAFETY: valid C strings and a buffer of the length given.
        let r = unsafe {
            libc::getxattr(
                p.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let e = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((r, e), (-1, Some(libc::ENOTSUP)), "getxattr, round {round}");
        // SAFETY: as above.
        let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        let e = std::io::Error::last_os_error().raw_os_error();
        assert_eq!(
            (r, e),
            (-1, Some(libc::ENOTSUP)),
            "listxattr, round {round}"
        );
    }
    let src = m.dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.md"), "copied").unwrap();
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(m.path("copy"))
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        std::fs::read_to_string(m.path("copy/a.md")).unwrap(),
        "copied"
    );
}

#[test]
fn unlinked_open_file_stays_readable_and_writable() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("tmp"))
        .unwrap();
    f.write_all(b"before").unwrap();
    std::fs::remove_file(m.path("tmp")).unwrap();
    assert!(!m.path("tmp").exists());
    f.write_all(b" after").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "before after");
    assert_eq!(f.metadata().unwrap().len(), 12);
    drop(f);
    // The kernel sends RELEASE after close(2) returns, without waiting for it: poll.
    let files = (0..500)
        .map(|_| {
            let status = redbfs(&["status", m.mountpoint.to_str().unwrap(), "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(10));
            v["files"].as_u64().unwrap()
        })
        .find(|&n| n == 0);
    assert_eq!(files, Some(0), "space reclaimed at the last release");
}

/// Context switches of every thread of process `pid` so far: each is a wake-up or a
/// preemption.
fn context_switches(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|t| std::fs::read_to_string(t.unwrap().path().join("status")).unwrap_or_default())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .map(|l| l.split_whitespace().last().unwrap().parse::<u64>().unwrap())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// An idle daemon sleeps: no thread of it polls (its reclaimer woke 20 times a second,
/// whether or not an orphan waited), and an orphan is still reclaimed once one is queued.
#[test]
fn an_idle_daemon_does_not_wake() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let mnt = m.mountpoint.to_str().unwrap();
    let status = || -> serde_json::Value {
        serde_json::from_slice(&redbfs(&["status", mnt, "--json"]).stdout).unwrap()
    };
    let pid = common::daemon_pid(&m.mountpoint);
    // Something for the reclaimer first: a file unlinked while open, then closed.
    let f = std::fs::File::create(m.path("gone")).unwrap();
    std::fs::remove_file(m.path("gone")).unwrap();
    drop(f);
    let reclaimed = (0..500).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        status()["files"].as_u64() == Some(0)
    });
    assert!(reclaimed, "the orphan was never reclaimed: {}", status());
    // Let the last answers and the reclaim settle, then count over two seconds.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = context_switches(pid);
    std::thread::sleep(std::time::Duration::from_secs(2));
    let woke = context_switches(pid) - before;
    assert!(
        woke <= 4,
        "the idle daemon's threads switched {woke} times in 2 s: something polls"
    );
}

/// A mount waits for a store another process holds while no mount serves it (a daemon whose
/// mount was just unmounted, still closing it; here, this test), instead of failing at once:
/// `umount; mount` in a script met the store still open.
#[test]
fn a_mount_waits_for_a_store_another_process_is_closing() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt) = (dir.path().join("s.redb"), dir.path().join("m"));
    std::fs::create_dir(&mnt).unwrap();
    let held = redbfs::store::Store::open_or_create(&store, (0, 0)).unwrap();
    let mount = std::process::Command::new(common::redbfs_bin())
        .arg("mount")
        .arg(&mnt)
        .arg("--store")
        .arg(&store)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The mount is waiting on the store; the holder closes it.
    std::thread::sleep(std::time::Duration::from_millis(500));
    drop(held);
    let out = mount.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(mnt.join("a.md"), "after").unwrap();
    ok(redbfs(&["unmount", mnt.to_str().unwrap()]));
    assert_eq!(
        ok(redbfs(&["cat", store.to_str().unwrap(), "/a.md"])),
        "after"
    );
}

/// A process holding many descriptors of a large directory, each read a page into (and the
/// directory changed between, so the kernel's cached listing is dropped each time), does not
/// grow the daemon past its listings' budget: each handle kept its own whole listing (4.7 MB
/// for 60,000 names), 40 descriptors 190 MB. Each then reads on to the end and lists every
/// name once.
#[test]
fn many_descriptors_of_a_large_directory_hold_bounded_memory() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let tree = m.dir.path().join("tree");
    std::fs::create_dir_all(tree.join("big")).unwrap();
    let names = 60_000;
    for i in 0..names {
        std::fs::File::create(tree.join(format!("big/memory-note-{i:07}.md"))).unwrap();
    }
    let mnt = m.mountpoint.to_str().unwrap();
    ok(redbfs(&["import", tree.to_str().unwrap(), mnt]));
    let pid = common::daemon_pid(&m.mountpoint);
    let big = m.path("big");
    let mut open = vec![std::fs::read_dir(&big).unwrap()];
    open[0].next().unwrap().unwrap();
    let base = common::proc_kb(pid, "VmRSS:");
    for k in 0..40 {
        std::fs::File::create(big.join(format!("added-{k}"))).unwrap();
        let mut d = std::fs::read_dir(&big).unwrap();
        d.next().unwrap().unwrap();
        open.push(d);
    }
    let grew = common::proc_kb(pid, "VmRSS:").saturating_sub(base) / 1024;
    assert!(
        grew < 100,
        "the daemon grew by {grew} MiB for 41 descriptors of one directory"
    );
    for d in open.iter_mut().rev().take(3) {
        let rest: Vec<_> = d.map(|e| e.unwrap().file_name()).collect();
        let mut unique = rest.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), rest.len(), "a name listed twice");
        assert!(
            rest.len() >= names - 1,
            "{} names after the first",
            rest.len()
        );
    }
}

#[test]
fn attributes_match_what_the_sdk_prints() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::create_dir(m.path("d/sub")).unwrap();
    std::fs::write(m.path("d/f"), vec![1u8; 5000]).unwrap();
    let d = std::fs::metadata(m.path("d")).unwrap();
    assert_eq!(d.len(), 4096);
    assert_eq!(d.nlink(), 3);
    let f = std::fs::metadata(m.path("d/f")).unwrap();
    assert_eq!(f.len(), 5000);
    assert_eq!(f.blocks(), 10);
    assert_eq!(f.uid(), nix::unistd::getuid().as_raw());
    // Inode numbers are stable across remounts.
    let ino = f.ino();
    let mut m = m;
    m.remount();
    assert_eq!(std::fs::metadata(m.path("d/f")).unwrap().ino(), ino);
}

#[test]
fn statfs_reports_the_store() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::with_args(&["--quota", "10M"]);
    std::fs::write(m.path("f"), vec![1u8; 1 << 20]).unwrap();
    let s = nix::sys::statvfs::statvfs(&m.mountpoint).unwrap();
    assert_eq!(s.block_size(), 4096);
    assert_eq!(s.blocks(), 2560);
    assert_eq!(s.blocks_free(), 2560 - 256);
    assert_eq!(s.name_max(), 255);
    let out = std::process::Command::new("df")
        .arg(&m.mountpoint)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("redbfs:"));
}

#[test]
fn unmount_of_a_path_that_is_not_mounted_says_so() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = redbfs(&["unmount", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a redbfs mount"));
}

#[test]
fn foreground_daemon_unmounts_on_sigterm() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    let mut child = std::process::Command::new(common::redbfs_bin())
        .args(["mount", mp.to_str().unwrap(), "--foreground"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut mounted = false;
    for _ in 0..400 {
        if mountinfo_line(&mp).is_some() {
            mounted = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(mounted, "foreground mount appeared");
    std::fs::write(mp.join("x"), "1").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success());
    assert!(mountinfo_line(&mp).is_none());
    let out = redbfs(&["check", dir.path().join("mnt.redb").to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `redbfs ARGS...` in a mount namespace of its own where `/dev/fuse` is `/dev/null`: opening
/// the device works, mount(2) refuses it.
fn redbfs_without_fuse(args: &[&str]) -> std::process::Output {
    std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind /dev/null /dev/fuse && exec "$0" "$@""#)
        .arg(common::redbfs_bin())
        .args(args)
        .output()
        .expect("run unshare (util-linux)")
}

/// Regression: a mount refused for a mountpoint holding files left the daemon's log
/// beside the store; one that failed at mount(2) left a 4 MiB write-ahead log, a socket and a
/// new store. A refused or failed mount now leaves nothing it created, and an existing store
/// keeps its content.
#[test]
fn a_refused_or_failed_mount_leaves_nothing_behind() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), "1").unwrap();
    let out = redbfs(&["mount", full.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(names_in(dir.path()), ["full"], "refused for files");

    // mount(2) fails after the store, its log, the socket and the mountpoint were made.
    let mp = dir.path().join("new/mnt");
    let store = dir.path().join("new/store.redb");
    let out = redbfs_without_fuse(&[
        "mount",
        mp.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("mount "), "says why: {err}");
    assert_eq!(names_in(dir.path()), ["full"], "mount(2) failed: {err}");

    // An existing store stays, with its content; nothing is left beside it.
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("kept.md"), "kept").unwrap();
    let store = dir.path().join("old.redb");
    let out = redbfs(&["import", src.to_str().unwrap(), store.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&src).unwrap();
    let out = redbfs_without_fuse(&[
        "mount",
        dir.path().join("mnt").to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert_eq!(names_in(dir.path()), ["full", "old.redb"]);
    let out = redbfs(&["cat", store.to_str().unwrap(), "/kept.md"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept");
}

/// Regression: `redbfs mount x/m --store x/s.redb` with no `x` said only "the daemon
/// exited before mounting (see its log)", and no log could exist: the daemon died opening its
/// log beside a store whose directory it had not made yet. The directory is made now, and
/// every reason a daemon gives up before the mount answers reaches the terminal in one line.
#[test]
fn startup_errors_reach_the_terminal() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("x/m");
    let out = redbfs(&[
        "mount",
        mp.to_str().unwrap(),
        "--store",
        dir.path().join("x/s.redb").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(mp.join("a"), "1").unwrap();
    let out = redbfs(&["unmount", mp.to_str().unwrap()]);
    assert!(out.status.success());

    // A log the daemon cannot open: the reason, in one line.
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let out = redbfs(&[
        "mount",
        dir.path().join("m2").to_str().unwrap(),
        "--log-file",
        file.join("log").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("log file") && err.contains("Not a directory"),
        "{err}"
    );
    assert!(!dir.path().join("m2.redb").exists());

    // Refused at mount(2): the reason, in one line.
    let out = redbfs_without_fuse(&["mount", dir.path().join("m3").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("Invalid argument"), "{err}");
}

/// Runs `redbfs ARGS...` in `cwd`, killed after `secs`: (output, whether it finished).
fn redbfs_within(args: &[&str], cwd: &Path, secs: u64) -> (std::process::Output, bool) {
    let mut child = std::process::Command::new(common::redbfs_bin())
        .args(args)
        .current_dir(cwd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut finished = true;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            finished = false;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    (child.wait_with_output().unwrap(), finished)
}

/// Makes `levels` nested directories `d` below `top` (relative to descriptors: the path is
/// longer than PATH_MAX), with a file at the bottom.
fn deep_tree(top: &Path, levels: usize) {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::{Mode, mkdirat};
    let mut fd = open(top, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty()).unwrap();
    for _ in 0..levels {
        mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
        fd = openat(
            &fd,
            "d",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .unwrap();
    }
    let f = openat(
        &fd,
        "bottom.md",
        OFlag::O_CREAT | OFlag::O_WRONLY,
        Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    std::fs::File::from(f).write_all(b"deep").unwrap();
}

/// Regression: importing a tree 2,030 levels deep into a mounted store overflowed the
/// daemon's control thread and killed it, and nothing kept the store within `--max-depth`.
/// The walk is iterative and stops at the store's depth limit, listing what it skips; `du` and
/// `tree` walk iteratively too.
#[test]
fn import_of_a_very_deep_tree_keeps_the_depth_limit_and_the_daemon() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let src = m.dir.path().join("deep");
    std::fs::create_dir(&src).unwrap();
    deep_tree(&src, 2030);
    let mp = m.mountpoint.to_str().unwrap();
    let (out, finished) = redbfs_within(
        &["import", src.to_str().unwrap(), mp, "--into", "/"],
        m.dir.path(),
        120,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(finished && out.status.success(), "{err}");
    assert!(err.contains("over --max-depth 32"), "{err}");
    let st = status(&m);
    assert_eq!(st["dirs"], 33, "the root and 32 levels: {st}");
    for cmd in ["du", "tree"] {
        let out = redbfs(&[cmd, mp]);
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::write(m.path("after"), "still serving").unwrap();
    // rm walks a tree deeper than PATH_MAX.
    let _ = std::process::Command::new("rm")
        .arg("-rf")
        .arg(&src)
        .status();
}

/// Regression: `redbfs import` held the store's write transaction while it read the
/// source, so importing from the mount itself deadlocked every writer. The source is read and
/// staged first; the commit reads only the staged copy.
#[test]
fn import_from_inside_the_same_mount_works() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::create_dir_all(m.path("memories/sub")).unwrap();
    std::fs::write(m.path("memories/a.md"), "alpha").unwrap();
    std::fs::write(m.path("memories/sub/b.md"), "beta").unwrap();
    std::fs::create_dir(m.path("copy")).unwrap();
    let (out, finished) = redbfs_within(
        &[
            "import",
            m.path("memories").to_str().unwrap(),
            m.mountpoint.to_str().unwrap(),
            "--into",
            "/copy",
        ],
        m.dir.path(),
        60,
    );
    assert!(finished, "the import from the mount into itself hung");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(m.path("copy/a.md")).unwrap(),
        "alpha"
    );
    assert_eq!(
        std::fs::read_to_string(m.path("copy/sub/b.md")).unwrap(),
        "beta"
    );
    std::fs::write(m.path("memories/c.md"), "writers carry on").unwrap();
}

/// Regression: the control socket had no limits (a 100 MB line grew the daemon by
/// 119 MB; 2,000 idle connections made 2,000 threads). A line is at most 1 MiB, a line that
/// is not UTF-8 gets an error, at most 16 connections are served at once (the next one gets an
/// error line), and a connection idle for 30 s is closed.
#[test]
fn the_control_socket_has_limits() {
    if !fuse_available() {
        return;
    }
    use std::io::BufRead;
    use std::os::unix::net::UnixStream;
    let m = TestMount::new();
    let sock = format!("{}.sock", m.store.display());
    let answer = |s: &UnixStream| {
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        line
    };

    {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.write_all(b"{\"op\":\"status\",\"x\":\"\xff\"}\n")
            .unwrap();
        assert!(answer(&s).contains("not UTF-8"));
        // The connection still serves.
        s.write_all(b"{\"op\":\"status\"}\n").unwrap();
        assert!(answer(&s).contains("\"ok\":true"));
    }
    {
        let mut s = UnixStream::connect(&sock).unwrap();
        let long = vec![b'x'; 2 << 20];
        let _ = s.write_all(&long);
        let a = answer(&s);
        assert!(a.contains("request longer than"), "{a}");
    }
    std::thread::sleep(std::time::Duration::from_millis(300));

    let idle: Vec<UnixStream> = (0..16)
        .map(|_| UnixStream::connect(&sock).unwrap())
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let s = UnixStream::connect(&sock).unwrap();
    let a = answer(&s);
    assert!(a.contains("16 control connections"), "{a}");
    // Half of them send a byte of a request line every 2 s: 30 s is for the whole line, not
    // for each read (they used to hold their connections for as long as they trickled).
    let trickling: Vec<UnixStream> = idle[8..].iter().map(|c| c.try_clone().unwrap()).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for mut c in &trickling {
                    let _ = c.write_all(b" ");
                }
                std::thread::sleep(std::time::Duration::from_secs(2));
            }
        })
    };
    // The idle ones are closed after 30 s; then a request is served again.
    std::thread::sleep(std::time::Duration::from_secs(32));
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(b"{\"op\":\"status\"}\n").unwrap();
    let a = answer(&s);
    assert!(a.contains("\"ok\":true"), "{a}");
    for c in &idle {
        let mut buf = [0u8; 1];
        c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        assert_eq!((&*c).read(&mut buf).unwrap(), 0, "closed by the daemon");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    trickle.join().unwrap();
}

/// Regression: `redbfs unmount .` from inside the mount detached it lazily and then
/// waited 5 minutes for a daemon that could not exit. It says at once that the mount is busy.
#[test]
fn unmount_from_inside_the_mount_says_busy_at_once() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::create_dir(m.path("memories")).unwrap();
    let (out, finished) = redbfs_within(&["unmount", "."], &m.mountpoint, 20);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(finished, "unmount from inside hung");
    assert!(!out.status.success());
    assert!(err.contains("target is busy"), "{err}");
    assert!(mountinfo_line(&m.mountpoint).is_some(), "still mounted");
    std::fs::write(m.path("memories/x"), "1").unwrap();
}

/// Regression: near a full disk the daemon wrote a warn line for every refused write
/// (13,800 lines). The same refusal is logged once per interval, with the count it left out.
#[test]
fn repeated_refusals_are_logged_once_per_interval() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::with_args(&["--quota", "64K"]);
    let big = vec![7u8; 100 * 1024];
    for i in 0..300 {
        assert!(std::fs::write(m.path(&format!("f{i}")), &big).is_err());
    }
    let log = m.log_text();
    let lines = log
        .lines()
        .filter(|l| l.contains("refused: ") && l.contains("--quota"))
        .count();
    assert!((1..=3).contains(&lines), "{lines} lines:\n{log}");
}

/// A shared mapping made through a handle opened O_APPEND writes its pages where they are,
/// as on ext4: the kernel writes a mapping's dirty pages back through a writable handle, and
/// the daemon put every write on an O_APPEND handle at the end, so `m[0..5] = "HELLO"`
/// appended a whole page to the file and left its first bytes unchanged. A write(2) through
/// the same handle still goes to the end.
#[test]
fn a_shared_mapping_through_an_append_handle_writes_where_its_pages_are() {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let p = m.path("mapped");
    std::fs::write(&p, vec![b'A'; 10_000]).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .custom_flags(0)
        .open(&p)
        .unwrap();
    unsafe {
        let len = 10_000;
        let at = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(at, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        std::ptr::copy_nonoverlapping(b"HELLO".as_ptr(), at.cast::<u8>(), 5);
        assert_eq!(libc::msync(at, len, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(at, len), 0);
    }
    (&f).write_all(b"tail").unwrap();
    drop(f);
    let got = std::fs::read(&p).unwrap();
    assert_eq!(got.len(), 10_004);
    assert_eq!(&got[..8], b"HELLOAAA");
    assert_eq!(&got[10_000..], b"tail");
}

/// open(O_TRUNC) of an empty file changes its mtime and ctime, as on ext4 (`: > file` relies
/// on it): an empty file was left as it was, times included.
#[test]
fn truncating_an_empty_file_at_open_changes_its_times() {
    use std::os::unix::fs::OpenOptionsExt;
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let p = m.path("empty");
    let f = std::fs::File::create(&p).unwrap();
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(946_684_800); // 2000
    f.set_times(
        std::fs::FileTimes::new()
            .set_modified(old)
            .set_accessed(old),
    )
    .unwrap();
    drop(f);
    let before = std::fs::metadata(&p).unwrap();
    assert_eq!(before.mtime(), 946_684_800);
    drop(
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_TRUNC)
            .open(&p)
            .unwrap(),
    );
    let after = std::fs::metadata(&p).unwrap();
    assert!(after.mtime() > 946_684_800, "mtime unchanged");
    assert!(
        (after.ctime(), after.ctime_nsec()) > (before.ctime(), before.ctime_nsec()),
        "ctime unchanged"
    );
    assert_eq!(after.len(), 0);
}

/// A time a store cannot hold (64-bit nanoseconds: 1677-09-21 to 2262-04-11) is clamped to
/// the nearest one it can, as the kernel clamps a time to a filesystem's range: `touch -d
/// 2300-01-01` was kept as 1715-06-13 (the nanoseconds wrapped), which `expire` then took
/// for a file unused for centuries.
#[test]
fn a_time_out_of_the_stores_range_is_clamped_not_wrapped() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let p = m.path("timely");
    let f = std::fs::File::create(&p).unwrap();
    let year = 365 * 24 * 3600;
    let y2300 = std::time::UNIX_EPOCH + std::time::Duration::from_secs(330 * year);
    let y1000 = std::time::UNIX_EPOCH - std::time::Duration::from_secs(970 * year);
    f.set_times(
        std::fs::FileTimes::new()
            .set_modified(y2300)
            .set_accessed(y1000),
    )
    .unwrap();
    drop(f);
    let st = std::fs::metadata(&p).unwrap();
    assert_eq!(
        st.mtime(),
        i64::MAX / 1_000_000_000,
        "2262-04-11, the latest"
    );
    assert_eq!(
        st.atime(),
        i64::MIN / 1_000_000_000 - 1,
        "1677-09-21, the earliest"
    );
}

/// What `import` adds through the daemon is listed at once, as SEMANTICS promises: the kernel
/// kept the target directory's listing (and a lookup that found a new name missing) for a
/// minute, so `ls` left the new entries out for 60 to 80 s.
#[test]
fn an_import_through_the_daemon_is_listed_at_once() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::create_dir(m.path("memories")).unwrap();
    std::fs::write(m.path("memories/old.md"), "old").unwrap();
    let names = |p: &Path| -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        n.sort();
        n
    };
    // The kernel caches the listing and the missing names now.
    assert_eq!(names(&m.path("memories")), ["old.md"]);
    assert!(std::fs::metadata(m.path("memories/new.md")).is_err());
    assert!(std::fs::metadata(m.path("top")).is_err());
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("memories")).unwrap();
    std::fs::write(src.path().join("memories/new.md"), "new").unwrap();
    std::fs::create_dir(src.path().join("top")).unwrap();
    std::fs::write(src.path().join("top/inner.md"), "inner").unwrap();
    let out = redbfs(&[
        "import",
        src.path().to_str().unwrap(),
        m.mountpoint.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(names(&m.path("memories")), ["new.md", "old.md"]);
    assert!(names(&m.mountpoint).contains(&"top".to_string()));
    assert_eq!(
        std::fs::read_to_string(m.path("memories/new.md")).unwrap(),
        "new"
    );
    assert_eq!(
        std::fs::read_to_string(m.path("top/inner.md")).unwrap(),
        "inner"
    );
}
