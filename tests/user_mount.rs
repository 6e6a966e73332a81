//! Mounting as a user other than root. `redbfs mount` failed for a user with "EACCES ... is
//! the fuse module loaded?" instead of mounting through fusermount3, which is setuid and opens
//! the device and mounts for users. This test creates a real unprivileged user and runs the
//! whole flow as that user: mount, both stock SDKs' scripted sessions, a snapshot, a kill of
//! the daemon and a remount (fusermount3 clears the stale mount), and unmount.
//!
//! fusermount3 opens `/dev/fuse` with the user's own file-system uid (libfuse drops its
//! privileges for that open on purpose: the device's mode is the administrator's say in who
//! may mount), so a user needs the access distributions give the device (0666, from udev);
//! this machine's is 0600, which no user can mount through, with redbfs or any other FUSE
//! program. The test first checks that the refusal names that cause, then grants the test
//! user alone read and write on the device with a POSIX ACL (`setfacl -m u:USER:rw`, as an
//! administrator would) for its run and takes the grant back. It needs root (to make the user
//! and grant the device), fusermount3 and setfacl (`.ci/run` installs fuse3 and acl), and
//! fails loudly without them.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{fuse_available, redbfs_bin};

const USER: &str = "redbfs-test-user";

/// Detaches the user's mount if the test ends early (a failed assertion), so no mount
/// outlives the test.
struct Unmounted(PathBuf);

impl Drop for Unmounted {
    fn drop(&mut self) {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        if mounts.contains(self.0.to_str().unwrap_or("")) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Held by each test that looks at or changes the test user's access to `/dev/fuse`: the
/// tests of this file run on threads at once, and one taking its grant back took it from
/// another that was mounting.
static DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn device_to_ourselves() -> std::sync::MutexGuard<'static, ()> {
    DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes the test user's grant on `/dev/fuse` back when dropped, then lets the next test at
/// the device.
struct DeviceGrant {
    _device: std::sync::MutexGuard<'static, ()>,
}

impl DeviceGrant {
    fn give(device: std::sync::MutexGuard<'static, ()>) -> DeviceGrant {
        let out = Command::new("setfacl")
            .args(["-m", &format!("u:{USER}:rw"), "/dev/fuse"])
            .output()
            .expect("run setfacl (package acl: scripts/prereqs installs it)");
        assert!(
            out.status.success(),
            "setfacl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        DeviceGrant { _device: device }
    }
}

impl Drop for DeviceGrant {
    fn drop(&mut self) {
        let _ = Command::new("setfacl")
            .args(["-x", &format!("u:{USER}"), "/dev/fuse"])
            .output();
    }
}

fn user_ids() -> (u32, u32) {
    if Command::new("id")
        .arg(USER)
        .output()
        .is_ok_and(|o| o.status.success())
    {
        // exists
    } else {
        let out = Command::new("useradd")
            .args(["-m", "-s", "/bin/sh", USER])
            .output()
            .expect("run useradd");
        assert!(
            out.status.success(),
            "useradd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let id = |flag: &str| -> u32 {
        let out = Command::new("id").args([flag, USER]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    (id("-u"), id("-g"))
}

/// Runs `program args` as the test user, in `dir`, with a plain environment.
/// A fresh directory the test user owns (0755), removed when dropped.
fn user_home(ids: (u32, u32)) -> tempfile::TempDir {
    let home = tempfile::Builder::new()
        .prefix("redbfs-user-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    nix::unistd::chown(
        home.path(),
        Some(nix::unistd::Uid::from_raw(ids.0)),
        Some(nix::unistd::Gid::from_raw(ids.1)),
    )
    .unwrap();
    home
}

fn as_user(ids: (u32, u32), dir: &Path, program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir)
        .env(
            "PYTHONPATH",
            clients().join(".venv/lib/python3.11/site-packages"),
        )
        .uid(ids.0)
        .gid(ids.1)
        .output()
        .expect("run as the test user")
}

fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

fn ok(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what} as {USER} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every entry under `root` with its owner and, for a file, a hash of its content, read as
/// the user (root may not enter a mount made without `--allow-other`).
fn tree(ids: (u32, u32), dir: &Path, root: &Path) -> Vec<String> {
    const WALK: &str = r#"
import hashlib, os, sys
for d, dirs, files in os.walk(sys.argv[1]):
    dirs.sort()
    for n in sorted(dirs + files):
        p = os.path.join(d, n)
        st = os.lstat(p)
        h = hashlib.sha256(open(p, 'rb').read()).hexdigest() if n in files else 'dir'
        print(os.path.relpath(p, sys.argv[1]), st.st_uid, h)
"#;
    let out = ok(
        "walking the mount",
        as_user(
            ids,
            dir,
            Path::new("/usr/bin/python3"),
            &["-c", WALK, root.to_str().unwrap()],
        ),
    );
    out.lines().map(str::to_string).collect()
}

#[test]
fn a_user_mounts_through_fusermount3_and_runs_both_sdks() {
    if !fuse_available() {
        return;
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a user and sets /dev/fuse's mode: run it as root (CI does)"
    );
    assert!(
        Path::new("/usr/bin/fusermount3").exists(),
        "fusermount3 is missing: install the fuse3 package (.ci/run does)"
    );
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "/usr/bin/python3 is missing: the user runs the Python SDK with the system Python 3.11"
    );
    let ids = user_ids();

    let home = user_home(ids);
    let dir = home.path();
    let bin = redbfs_bin();
    let mnt = dir.join("memory-store");
    let _unmounted = Unmounted(mnt.clone());
    // Without access to the device, the refusal names the cause and leaves nothing behind.
    let device = device_to_ourselves();
    let mode = std::fs::metadata("/dev/fuse").unwrap().mode() & 0o7777;
    let can_open = || {
        let probe = as_user(ids, dir, Path::new("/usr/bin/test"), &["-w", "/dev/fuse"]);
        probe.status.success()
    };
    if !can_open() {
        let out = as_user(ids, dir, &bin, &["mount", "memory-store"]);
        assert!(!out.status.success(), "mounted without access to /dev/fuse");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("/dev/fuse") && err.contains("0666"),
            "the refusal does not name the device's mode ({mode:o}): {err}"
        );
        assert!(!mnt.exists(), "the refused mount left its mountpoint");
    }
    let _grant = DeviceGrant::give(device);
    assert!(can_open(), "the ACL did not grant {USER} the device");
    ok(
        "redbfs mount",
        as_user(ids, dir, &bin, &["mount", "memory-store"]),
    );
    let source = std::fs::read_to_string("/proc/mounts").unwrap();
    let line = source
        .lines()
        .find(|l| l.contains(mnt.to_str().unwrap()))
        .expect("mounted");
    assert!(line.contains(&format!("user_id={}", ids.0)), "{line}");

    // Both stock SDKs' sessions, as the user.
    let session = clients().join("session.json");
    let node = Path::new("/usr/bin/node");
    ok(
        "the Node SDK session",
        as_user(
            ids,
            dir,
            node,
            &[
                clients().join("run_session.mjs").to_str().unwrap(),
                mnt.to_str().unwrap(),
                session.to_str().unwrap(),
            ],
        ),
    );
    ok(
        "mkdir",
        as_user(
            ids,
            dir,
            Path::new("/bin/mkdir"),
            &["-p", "memory-store/py"],
        ),
    );
    ok(
        "the Python SDK session",
        as_user(
            ids,
            dir,
            Path::new("/usr/bin/python3"),
            &[
                clients().join("run_session.py").to_str().unwrap(),
                mnt.join("py").to_str().unwrap(),
                session.to_str().unwrap(),
            ],
        ),
    );
    let before = tree(ids, dir, &mnt);
    assert!(before.len() > 5, "the sessions wrote memories: {before:?}");
    for entry in &before {
        // "PATH UID HASH"; a path may hold spaces.
        let uid: u32 = entry.rsplit(' ').nth(1).unwrap().parse().unwrap();
        assert_eq!(uid, ids.0, "{entry}: belongs to the user");
    }

    // A snapshot, private to the user.
    ok(
        "redbfs snapshot",
        as_user(ids, dir, &bin, &["snapshot", "memory-store", "backup.redb"]),
    );
    let snap = std::fs::metadata(dir.join("backup.redb")).unwrap();
    assert_eq!((snap.uid(), snap.mode() & 0o777), (ids.0, 0o600));

    // The daemon killed; the user mounts again (fusermount3 clears the stale mount).
    let status = ok(
        "redbfs status",
        as_user(ids, dir, &bin, &["status", "memory-store", "--json"]),
    );
    let pid = serde_json::from_str::<serde_json::Value>(&status).unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for _ in 0..200 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    ok(
        "redbfs mount after a kill",
        as_user(ids, dir, &bin, &["mount", "memory-store"]),
    );
    assert_eq!(
        tree(ids, dir, &mnt),
        before,
        "everything acknowledged survived the kill"
    );
    ok(
        "redbfs unmount",
        as_user(ids, dir, &bin, &["unmount", "memory-store"]),
    );
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(mnt.to_str().unwrap()),
        "still mounted:\n{mounts}"
    );

    // --allow-other needs user_allow_other in /etc/fuse.conf; without it, the reason.
    let conf = std::fs::read_to_string("/etc/fuse.conf").unwrap_or_default();
    if !conf.lines().any(|l| l.trim() == "user_allow_other") {
        let out = as_user(ids, dir, &bin, &["mount", "memory-store", "--allow-other"]);
        assert!(
            !out.status.success(),
            "--allow-other mounted without user_allow_other"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("user_allow_other"), "{err}");
    }
}

/// Run by a user who is not root, `import` of a directory makes what the user owns, with
/// setuid and setgid bits dropped, as `import --tar` and the mount do: a root-owned setuid
/// file in the source becomes the user's, mode 0755.
#[test]
fn what_a_user_imports_is_theirs_without_setuid_bits() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a user: run it as root (CI does)"
    );
    let ids = user_ids();
    let home = user_home(ids);
    let src = home.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(src.join("tool"), "x").unwrap();
    std::fs::set_permissions(src.join("tool"), std::fs::Permissions::from_mode(0o6755)).unwrap();
    let bin = redbfs_bin();
    ok(
        "import",
        as_user(ids, home.path(), &bin, &["import", "src", "s.redb"]),
    );
    let listed = ok(
        "ls",
        as_user(ids, home.path(), &bin, &["ls", "s.redb", "/", "--json"]),
    );
    let entries: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let tool = entries
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "tool")
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(tool["uid"], ids.0, "{tool}");
    assert_eq!(tool["gid"], ids.1, "{tool}");
    assert_eq!(tool["mode"], 0o755, "{tool}");
}

/// Spawns `program args` as the test user in `dir`, in a process group of its own, and waits
/// for its first line on stdout (it says it is ready). Killed, with its group, on drop.
struct UserProcess(std::process::Child);

impl UserProcess {
    fn start(ids: (u32, u32), dir: &Path, program: &str, args: &[&str]) -> UserProcess {
        let mut child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .uid(ids.0)
            .gid(ids.1)
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start a process as the test user");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready", "{program} {args:?}");
        UserProcess(child)
    }
}

impl Drop for UserProcess {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.0.wait();
    }
}

fn root_runs(args: &[&str]) -> Output {
    let mut cmd = Command::new(redbfs_bin());
    cmd.args(args);
    common::run_within(cmd, std::time::Duration::from_secs(120))
}

fn ps(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Any mount of type fuse.redbfs was believed, whoever made it, and the store it names was
/// found by resolving its path: a user mounted her own store `d/mnt.redb`, then replaced `d`
/// by a symlink to root's directory, and root's `ls` of root's own (unmounted) store there
/// went to "her daemon" and failed (`snapshot`, `restore` likewise). A mount made by another
/// user (its `user_id=`) is now never taken for a store of root's.
#[test]
fn another_users_mount_never_passes_for_a_store_of_roots() {
    if !fuse_available() {
        return;
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a user: run it as root (CI does)"
    );
    let ids = user_ids();
    let home = user_home(ids);
    let dir = home.path();
    let _grant = DeviceGrant::give(device_to_ourselves());
    let bin = redbfs_bin();
    ok("mkdir", as_user(ids, dir, Path::new("/bin/mkdir"), &["d"]));
    ok("redbfs mount", as_user(ids, dir, &bin, &["mount", "d/mnt"]));
    let _unmounted = (
        Unmounted(dir.join("d.real/mnt")),
        Unmounted(dir.join("d/mnt")),
    );

    let victim = tempfile::tempdir().unwrap();
    let src = victim.path().join("src");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("mine.md"), "root's").unwrap();
    let store = victim.path().join("mnt.redb");
    common::ok(root_runs(&["import", ps(&src), ps(&store)]));
    ok(
        "mv",
        as_user(ids, dir, Path::new("/bin/mv"), &["d", "d.real"]),
    );
    ok(
        "ln -s",
        as_user(
            ids,
            dir,
            Path::new("/bin/ln"),
            &["-s", ps(victim.path()), "d"],
        ),
    );

    let listed = common::ok(root_runs(&["ls", ps(&store), "/"]));
    assert!(listed.contains("mine.md"), "{listed}");
    let snap = victim.path().join("snap.redb");
    common::ok(root_runs(&["snapshot", ps(&store), ps(&snap)]));
    // Her store back where her daemon has it, she unmounts.
    ok("rm", as_user(ids, dir, Path::new("/bin/rm"), &["d"]));
    ok(
        "mv",
        as_user(ids, dir, Path::new("/bin/mv"), &["d.real", "d"]),
    );
    ok(
        "redbfs unmount",
        as_user(ids, dir, &bin, &["unmount", "d/mnt"]),
    );
}

/// Nothing checked who answered on a control socket: with a server of another user's at the
/// socket path of root's mounted store, root's `cat` sent it the request and printed what it
/// said (`snapshot` wrote its bytes, `check` printed its verdict, `import` sent it root's
/// path). The peer's uid (SO_PEERCRED) must be root's, or the store owner's: anyone else is
/// refused before a byte is sent, with a message naming the uid.
#[test]
fn a_control_socket_served_by_another_user_is_never_talked_to() {
    if !fuse_available() {
        return;
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a user: run it as root (CI does)"
    );
    let ids = user_ids();
    let home = user_home(ids);
    // A directory anyone may create in (sticky, as /tmp): where the user's server can bind.
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mnt = shared.path().join("mnt");
    let store = shared.path().join("mnt.redb");
    common::ok(root_runs(&["mount", ps(&mnt)]));
    let _unmounted = Unmounted(mnt.clone());
    std::fs::write(mnt.join("f.md"), "root's text").unwrap();
    let status: serde_json::Value =
        serde_json::from_str(&common::ok(root_runs(&["status", ps(&mnt), "--json"]))).unwrap();
    let daemon = nix::unistd::Pid::from_raw(status["pid"].as_i64().unwrap() as i32);

    // The daemon's socket gone, another user's server answers at its path.
    let socket = shared.path().join("mnt.redb.sock");
    std::fs::remove_file(&socket).unwrap();
    let heard = home.path().join("heard");
    const SERVER: &str = r#"
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    f = c.makefile("rwb")
    line = f.readline()
    with open(sys.argv[2], "ab") as h:
        h.write(line)
    f.write(b'{"ok":true,"content":"attacker text","pid":1}\n')
    f.flush()
    c.close()
"#;
    let _server = UserProcess::start(
        ids,
        home.path(),
        "/usr/bin/python3",
        &["-c", SERVER, ps(&socket), ps(&heard)],
    );

    let out = root_runs(&["cat", ps(&store), "/f.md"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "cat talked to the user's server: {err}"
    );
    assert!(
        err.contains(&format!("served by uid {}", ids.0)),
        "the refusal does not name the uid: {err}"
    );
    let out = root_runs(&["unmount", ps(&mnt)]);
    assert!(!out.status.success());
    assert!(
        std::fs::read(&heard).unwrap_or_default().is_empty(),
        "requests reached the user's server: {}",
        String::from_utf8_lossy(&std::fs::read(&heard).unwrap_or_default())
    );

    // The real daemon unmounts on SIGTERM.
    nix::sys::signal::kill(daemon, nix::sys::signal::Signal::SIGTERM).unwrap();
    for _ in 0..2000 {
        if !Path::new(&format!("/proc/{daemon}")).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(ps(&mnt)), "still mounted");
}

/// A daemon took a blocking lock on the store's directory, which any user who may read the
/// directory can hold (`flock DIR sleep ...`): `redbfs mount` then hung for as long as the
/// other user wanted. The lock is now the store owner's own file, which others cannot open.
#[test]
fn a_lock_another_user_holds_on_the_store_directory_does_not_hold_up_a_mount() {
    if !fuse_available() {
        return;
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a user: run it as root (CI does)"
    );
    let ids = user_ids();
    let home = user_home(ids);
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let _holder = UserProcess::start(
        ids,
        home.path(),
        "/usr/bin/flock",
        &[ps(dir.path()), "sh", "-c", "echo ready; exec sleep 1000"],
    );
    let mnt = dir.path().join("mnt");
    let mut cmd = Command::new(redbfs_bin());
    cmd.args(["mount", ps(&mnt)]);
    let _unmounted = Unmounted(mnt.clone());
    common::ok(common::run_within(cmd, std::time::Duration::from_secs(30)));
    common::ok(root_runs(&["unmount", ps(&mnt)]));
}
