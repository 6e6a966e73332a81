//! Mounting like any other filesystem: `mount -t fuse.redbfs` (what an fstab line does),
//! `umount` by anyone, and read-only mounts.
//!
//! mount(8) hands a `fuse.redbfs` mount to mount.fuse3 (package fuse3), which runs `redbfs
//! STORE MOUNTPOINT -o OPTIONS` from the standard PATH: the test puts a symlink to the built
//! binary at /usr/local/bin/redbfs for its run (and removes it), so it needs root, as CI has.

mod common;

use std::path::Path;
use std::process::Command;

use common::{TestMount, fuse_available, redbfs, redbfs_bin};

/// Removes the /usr/local/bin/redbfs symlink this test made.
struct OnPath;

impl OnPath {
    fn install() -> OnPath {
        let link = Path::new("/usr/local/bin/redbfs");
        if let Ok(target) = std::fs::read_link(link) {
            assert!(
                target.to_string_lossy().contains("/target/"),
                "/usr/local/bin/redbfs is an installed redbfs ({}): this test would shadow it",
                target.display()
            );
            std::fs::remove_file(link).unwrap();
        }
        assert!(
            !link.exists(),
            "/usr/local/bin/redbfs exists and is not a build's symlink"
        );
        std::os::unix::fs::symlink(redbfs_bin(), link).unwrap();
        OnPath
    }
}

impl Drop for OnPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file("/usr/local/bin/redbfs");
    }
}

fn status(target: &Path) -> serde_json::Value {
    let out = redbfs(&["status", "--json", target.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn mount_t_fuse_redbfs_with_options_and_umount_by_anyone() {
    if !fuse_available() {
        return;
    }
    assert!(
        Path::new("/sbin/mount.fuse3").exists() || Path::new("/usr/sbin/mount.fuse3").exists(),
        "mount.fuse3 is missing: install the fuse3 package (.ci/run does)"
    );
    let _on_path = OnPath::install();
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt) = (dir.path().join("s.redb"), dir.path().join("m"));
    std::fs::create_dir(&mnt).unwrap();
    let mount = |opts: &str| {
        Command::new("mount")
            .args(["-t", "fuse.redbfs"])
            .arg(&store)
            .arg(&mnt)
            .args(["-o", opts])
            .output()
            .unwrap()
    };
    // The standard options mount(8) and systemd pass, and redbfs's own as options.
    let out = mount(
        "rw,nosuid,nodev,noauto,_netdev,x-systemd.automount,quota=1M,lost_updates=refuse,max_depth=8",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(mnt.join("a.md"), "kept").unwrap();
    let s = status(&mnt);
    assert_eq!(s["limits"]["quota_bytes"], 1 << 20, "{s}");
    assert_eq!(s["limits"]["lost_updates"], "refuse", "{s}");
    assert_eq!(s["limits"]["max_depth"], 8, "{s}");
    let pid = s["pid"].as_u64().unwrap();
    // A plain umount, not redbfs unmount: the daemon commits, checkpoints, closes and exits.
    let out = Command::new("umount").arg(&mnt).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for _ in 0..400 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the daemon exited"
    );
    assert!(
        !redbfs::store::wal::path_of(&store).exists(),
        "the store was closed: its log folded in and removed"
    );
    let out = redbfs(&["cat", store.to_str().unwrap(), "/a.md"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept");
    // An unknown option is refused by name; `ro` mounts read-only.
    let out = mount("rw,bogus=1");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`bogus=1`"));
    let out = mount("ro");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = std::fs::write(mnt.join("b.md"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(std::fs::read_to_string(mnt.join("a.md")).unwrap(), "kept");
    let out = Command::new("umount").arg(&mnt).output().unwrap();
    assert!(out.status.success());
    // `noexec` holds (it was accepted and dropped: a script on the mount ran); `sync`, which
    // redbfs does not offer, is refused by name.
    let out = mount("sync");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`sync`"));
    let out = mount("rw,noexec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = mnt.join("run.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let e = Command::new(&script).output().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    let out = Command::new("umount").arg(&mnt).output().unwrap();
    assert!(out.status.success());
}

/// The store's bytes and modification time, to show nothing wrote to it.
fn file_state(p: &Path) -> (Vec<u8>, std::time::SystemTime) {
    let m = std::fs::metadata(p).unwrap();
    (std::fs::read(p).unwrap(), m.modified().unwrap())
}

/// The daemon's pid, from `redbfs status`.
fn daemon_pid(mountpoint: &Path) -> i32 {
    status(mountpoint)["pid"]
        .as_i64()
        .expect("status names the daemon's pid") as i32
}

#[test]
fn a_read_only_mount_refuses_every_change_and_still_browses() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    std::fs::create_dir(m.path("memories")).unwrap();
    std::fs::write(m.path("memories/notes.md"), "remember this").unwrap();
    m.unmount();
    // A store its owner may only read (as a snapshot often is) mounts read-only.
    std::fs::set_permissions(
        &m.store,
        std::os::unix::fs::PermissionsExt::from_mode(0o400),
    )
    .unwrap();
    let before = file_state(&m.store);
    m.mount_with(&["--read-only"]);
    let mut ro = m;
    let p = |rel: &str| ro.path(rel);
    let erofs = |what: &str, r: std::io::Result<()>| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs("create", std::fs::write(p("memories/new.md"), "x"));
    erofs("overwrite", std::fs::write(p("memories/notes.md"), "x"));
    erofs("mkdir", std::fs::create_dir(p("memories/d")));
    erofs("unlink", std::fs::remove_file(p("memories/notes.md")));
    erofs(
        "rename",
        std::fs::rename(p("memories/notes.md"), p("memories/n.md")),
    );
    erofs(
        "chmod",
        std::fs::set_permissions(
            p("memories/notes.md"),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        ),
    );
    assert_eq!(
        std::fs::read_to_string(p("memories/notes.md")).unwrap(),
        "remember this"
    );
    assert_eq!(status(&ro.mountpoint)["read_only"], true);
    let snap = ro.dir.path().join("snap.redb");
    let out = redbfs(&[
        "snapshot",
        ro.mountpoint.to_str().unwrap(),
        snap.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = redbfs(&["log", ro.mountpoint.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("/memories/notes.md"));
    // A history change through the daemon is refused too.
    let out = redbfs(&["mark", ro.mountpoint.to_str().unwrap(), "x"]);
    assert!(!out.status.success());
    assert!(
        !ro.store.with_extension("redb.wal").exists(),
        "a read-only mount started a write-ahead log"
    );
    ro.unmount();
    // The file was opened read-only: not a byte of it changed, nor its modification time.
    assert!(
        file_state(&ro.store) == before,
        "a read-only mount wrote to the store file"
    );
}

#[test]
fn a_second_mount_of_a_mounted_store_is_refused_with_the_reason() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    std::fs::write(m.path("a.md"), "a").unwrap();
    let (base, store) = (m.dir.path().to_path_buf(), m.store.clone());
    let mount_at = |name: &str, args: &[&str]| {
        let other = base.join(name);
        let mut argv = vec![
            "mount",
            other.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ];
        argv.extend_from_slice(args);
        let out = redbfs(&argv);
        assert!(
            !out.status.success(),
            "a second daemon mounted a mounted store ({args:?})"
        );
        assert!(!other.exists(), "the refused mount left its mountpoint");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Beside a read-write daemon: redb gives it the file to itself.
    let err = mount_at("second", &["--read-only"]);
    assert!(
        err.contains("already opened") && err.contains("read-only"),
        "{err}"
    );
    m.unmount();
    // Beside a read-only daemon: redb would share the file with another reader, but one
    // daemon serves a store (its control socket), and a writer is kept out by redb.
    m.mount_with(&["--read-only"]);
    let err = mount_at("third", &["--read-only"]);
    assert!(
        err.contains("already mounted at") && err.contains(m.mountpoint.to_str().unwrap()),
        "{err}"
    );
    let err = mount_at("fourth", &[]);
    assert!(err.contains("already opened"), "{err}");
    assert_eq!(std::fs::read_to_string(m.path("a.md")).unwrap(), "a");
}

#[test]
fn a_read_only_mount_of_a_store_that_needs_writing_is_refused_and_leaves_it_alone() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A store that does not exist is not created.
    let missing = dir.path().join("missing.redb");
    let mp = dir.path().join("mp");
    let out = redbfs(&[
        "mount",
        mp.to_str().unwrap(),
        "--store",
        missing.to_str().unwrap(),
        "--read-only",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no such store"), "{err}");
    assert!(!missing.exists() && !mp.exists());

    // A daemon killed with commits only in its write-ahead log.
    let mut m = TestMount::new();
    std::fs::write(m.path("kept.md"), "in the log only").unwrap();
    let pid = daemon_pid(&m.mountpoint);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let gone = std::time::Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(gone.elapsed().as_secs() < 30, "the daemon did not die");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = nix::mount::umount2(&m.mountpoint, nix::mount::MntFlags::MNT_DETACH);
    let wal = m.store.with_extension("redb.wal");
    assert!(wal.exists(), "the killed daemon left no log");
    let before = (file_state(&m.store), file_state(&wal));
    let out = redbfs(&[
        "mount",
        mp.to_str().unwrap(),
        "--store",
        m.store.to_str().unwrap(),
        "--read-only",
    ]);
    assert!(!out.status.success(), "a read-only mount recovered a store");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not closed cleanly") && err.contains("mount it read-write once"),
        "{err}"
    );
    assert!(
        (file_state(&m.store), file_state(&wal)) == before,
        "the refused read-only mount wrote to the store or its log"
    );
    // The tools read a recovered private copy; a read-write mount recovers it in place.
    let out = redbfs(&["cat", m.store.to_str().unwrap(), "kept.md"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "in the log only");
    m.mount_after_crash();
    m.remount();
    m.unmount();
    m.mount_with(&["--read-only"]);
    assert_eq!(
        std::fs::read_to_string(m.path("kept.md")).unwrap(),
        "in the log only"
    );
}
