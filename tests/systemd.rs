//! Running under systemd. A `Type=notify` service waits for `READY=1` on `$NOTIFY_SOCKET`
//! before it counts as started, and `STOPPING=1` tells it the daemon is going away; without
//! them systemd would call the service started before the mount answered, and kill it after
//! its start timeout. These tests bind a real Unix datagram socket (a path, and an abstract
//! name), run `redbfs mount --foreground` with `NOTIFY_SOCKET` set, and check that `READY=1`
//! comes once the mount answers and `STOPPING=1` when it ends, however it ends: `redbfs
//! unmount`, a signal (systemd's stop), or a `umount` by anyone.
//!
//! The example units under `contrib/systemd/` are checked with `systemd-analyze verify`,
//! which parses them, resolves their specifiers and checks that their commands exist; any
//! warning it prints fails the test. It needs the `systemd` package and fails loudly without
//! it.

mod common;

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{fuse_available, redbfs, redbfs_bin};

/// A foreground daemon started by a test; unmounted and reaped when dropped.
struct Foreground {
    child: Child,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl Foreground {
    fn start(dir: &Path, notify_socket: &str) -> Foreground {
        let mountpoint = dir.join("mnt");
        let log = dir.join("daemon.log");
        let child = Command::new(redbfs_bin())
            .arg("mount")
            .arg("--foreground")
            .arg(&mountpoint)
            .arg("--log-file")
            .arg(&log)
            .env("NOTIFY_SOCKET", notify_socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redbfs mount --foreground");
        Foreground {
            child,
            mountpoint,
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the daemon to exit; its exit status must be success.
    fn exits_cleanly(&mut self) {
        for _ in 0..3000 {
            if let Some(st) = self.child.try_wait().expect("wait") {
                assert!(st.success(), "daemon exited with {st}\n{}", self.log_text());
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the daemon did not exit\n{}", self.log_text());
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = redbfs(&["unmount", self.mountpoint.to_str().unwrap()]);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The next datagram on `sock`, as text; `None` after `timeout`.
fn receive(sock: &UnixDatagram, timeout: Duration) -> Option<String> {
    sock.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 4096];
    match sock.recv(&mut buf) {
        Ok(n) => Some(String::from_utf8(buf[..n].to_vec()).expect("a notification is text")),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("recv: {e}"),
    }
}

/// Whether `message` holds the line `line` (a notification is `KEY=VALUE` lines).
fn has_line(message: &str, line: &str) -> bool {
    message.lines().any(|l| l == line)
}

/// The mount at `mp` answers: a stat reaches the filesystem's root, not the directory under it.
fn answers(mp: &Path) -> bool {
    let parent = std::fs::metadata(mp.parent().unwrap()).unwrap();
    std::fs::metadata(mp).is_ok_and(|m| m.dev() != parent.dev() && m.is_dir())
}

enum Stop {
    RedbfsUnmount,
    Sigterm,
    Umount,
}

/// Mounts in the foreground with `NOTIFY_SOCKET` naming `sock` (bound at `address`), checks
/// READY=1 then STOPPING=1 around a stop of kind `stop`.
fn ready_then_stopping(dir: &Path, sock: &UnixDatagram, address: &str, stop: Stop) {
    let mut d = Foreground::start(dir, address);
    let ready = receive(sock, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no READY=1 within 60 s\n{}", d.log_text()));
    assert!(has_line(&ready, "READY=1"), "first message {ready:?}");
    assert!(
        answers(&d.mountpoint),
        "READY=1 came before the mount answered\n{}",
        d.log_text()
    );
    assert_eq!(
        receive(sock, Duration::from_millis(200)),
        None,
        "nothing more while mounted"
    );
    std::fs::create_dir(d.mountpoint.join("memories")).unwrap();
    std::fs::write(d.mountpoint.join("memories/notes.md"), "kept\n").unwrap();

    match stop {
        Stop::RedbfsUnmount => {
            let out = redbfs(&["unmount", d.mountpoint.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Stop::Sigterm => {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(d.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
        }
        Stop::Umount => {
            let out = Command::new("umount").arg(&d.mountpoint).output().unwrap();
            assert!(
                out.status.success(),
                "umount: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let stopping = receive(sock, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no STOPPING=1 within 60 s\n{}", d.log_text()));
    assert!(has_line(&stopping, "STOPPING=1"), "message {stopping:?}");
    d.exits_cleanly();
    assert_eq!(receive(sock, Duration::from_millis(100)), None);

    // What was written before the stop is in the store.
    let store = dir.join("mnt.redb");
    let out = redbfs(&["cat", store.to_str().unwrap(), "/memories/notes.md"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n");
}

#[test]
fn ready_and_stopping_on_a_socket_path_with_redbfs_unmount() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    ready_then_stopping(
        dir.path(),
        &sock,
        path.to_str().unwrap(),
        Stop::RedbfsUnmount,
    );
}

#[test]
fn ready_and_stopping_on_an_abstract_socket_with_sigterm() {
    use std::os::linux::net::SocketAddrExt;
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let name = format!("redbfs-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let sock = UnixDatagram::bind_addr(&addr).unwrap();
    ready_then_stopping(dir.path(), &sock, &format!("@{name}"), Stop::Sigterm);
}

#[test]
fn stopping_when_anyone_runs_umount() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    ready_then_stopping(dir.path(), &sock, path.to_str().unwrap(), Stop::Umount);
}

/// `redbfs mount` without `--foreground` is not a service's main process (it exits once the
/// mount answers): neither it nor the daemon it starts speaks on the socket.
#[test]
fn a_background_mount_sends_nothing() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let mp = dir.path().join("mnt");
    let out = Command::new(redbfs_bin())
        .arg("mount")
        .arg(&mp)
        .env("NOTIFY_SOCKET", &path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unmounted = redbfs(&["unmount", mp.to_str().unwrap()]);
    assert!(unmounted.status.success());
    assert_eq!(receive(&sock, Duration::from_millis(200)), None);
}

/// Every unit under `contrib/systemd/` parses, with its specifiers resolved and its commands
/// found: templates are checked as an instance (`srv-agent-memory`), and the binary's path in
/// them is replaced by the one just built (verify checks that each command exists).
#[test]
fn example_units_pass_systemd_analyze_verify() {
    let found = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "systemd-analyze is missing: install the systemd package (apt-get install systemd)"
    );
    let contrib = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    let bin = redbfs_bin();
    let bin = bin.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let runtime = tmp.path().join("runtime");
    std::fs::create_dir(&runtime).unwrap();

    let mut checked = Vec::new();
    for (sub, user) in [("", false), ("user", true)] {
        let out_dir = tmp.path().join(if user { "user" } else { "system" });
        std::fs::create_dir(&out_dir).unwrap();
        let mut units = Vec::new();
        for e in std::fs::read_dir(contrib.join(sub)).unwrap() {
            let p = e.unwrap().path();
            if !p.is_file() {
                continue;
            }
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            let text = std::fs::read_to_string(&p).unwrap();
            let binary = if user {
                "%h/.cargo/bin/redbfs"
            } else {
                "/usr/local/bin/redbfs"
            };
            assert!(
                name.ends_with(".timer") || text.contains(binary),
                "{name} does not run {binary}"
            );
            let instance = name.replace("@.", "@srv-agent-memory.");
            let copy = out_dir.join(&instance);
            std::fs::write(&copy, text.replace(binary, bin)).unwrap();
            units.push(copy);
            checked.push(name);
        }
        let mut cmd = Command::new("systemd-analyze");
        if user {
            // A --user manager needs a runtime directory; root has none here.
            cmd.arg("--user").env("XDG_RUNTIME_DIR", &runtime);
        }
        let out = cmd
            .arg("verify")
            .arg("--man=no")
            .args(&units)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "systemd-analyze verify {units:?}:\n{said}"
        );
    }
    checked.sort();
    assert_eq!(
        checked,
        [
            "redbfs-memory.service",
            "redbfs-snapshot@.service",
            "redbfs-snapshot@.timer",
            "redbfs@.service"
        ]
    );
}

/// What each unit must say for the setup the README describes: a notify service that mounts
/// in the foreground and unmounts on stop, and an hourly snapshot.
#[test]
fn example_units_say_what_the_readme_promises() {
    let contrib = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd");
    let read = |p: &str| std::fs::read_to_string(contrib.join(p)).unwrap();
    for service in ["redbfs@.service", "user/redbfs-memory.service"] {
        let t = read(service);
        for needed in [
            "Type=notify",
            "redbfs mount --foreground ",
            "redbfs unmount ",
        ] {
            assert!(t.contains(needed), "{service} lacks {needed:?}");
        }
        for namespacing in [
            "PrivateTmp=",
            "ProtectSystem=",
            "ProtectHome=",
            "PrivateMounts=",
        ] {
            // A private mount namespace would hide the mount from everyone else.
            assert!(
                !t.lines().any(|l| l.starts_with(namespacing)),
                "{service} sets {namespacing}"
            );
        }
    }
    let snap = read("redbfs-snapshot@.service");
    assert!(snap.contains("Type=oneshot") && snap.contains("redbfs snapshot "));
    assert!(read("redbfs-snapshot@.timer").contains("OnCalendar=hourly"));
}
