//! Processes as the daemon tells them apart, and what the CLI prints about them.
//!
//! - A process is its pid and its start time. pid_max is often 32,768, so pids come back: a
//!   process that reads `f.md` and exits, then another that replaces it, then a third handed
//!   the first one's pid (`clone3` with `set_tid`, as root), which never read the file: its
//!   replace goes through under `--lost-updates refuse`. The same for a reading thread's tid
//!   handed to a new process. A process that did read the old version is still refused, and
//!   the history note names it and the process whose edit it would have lost.
//! - A writer whose process name holds terminal escapes (`prctl(PR_SET_NAME)`) is shown by
//!   `redbfs log` with them escaped (`\x1b`), never raw, as `--json` escapes them.
//! - A command whose reader went away (`redbfs log STORE | head -1`) ends quietly (SIGPIPE's
//!   status), never with a panic.

mod common;

use std::ffi::{CString, OsStr};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{TestMount, fuse_available, redbfs_bin};

/// `struct clone_args` of clone3(2), up to `set_tid_size` (version 1, 88 bytes with cgroup).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Runs `sh -c SCRIPT ARGS...` as a new process whose pid is `pid` (clone3 with set_tid,
/// which needs root); its exit status, or the errno clone3 gave (EEXIST: the pid is taken).
fn sh_at_pid(pid: u32, script: &str, args: &[&OsStr]) -> Result<i32, i32> {
    let mut argv: Vec<CString> = vec![c"sh".into(), c"-c".into(), CString::new(script).unwrap()];
    argv.push(c"sh".into());
    for a in args {
        argv.push(CString::new(a.as_bytes()).unwrap());
    }
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let tids = [pid as libc::pid_t];
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tids.as_ptr() as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    // SAFETY: clone3 without CLONE_VM forks this process; the child only calls execv (with
    // pointers prepared before the fork) and _exit, both async-signal-safe.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    if r == 0 {
        unsafe {
            libc::execv(c"/bin/sh".as_ptr(), ptrs.as_ptr());
            libc::_exit(127);
        }
    }
    assert_eq!(r as u32, pid, "clone3 gave another pid");
    let mut status = 0;
    // SAFETY: waiting for the child just made.
    let waited = unsafe { libc::waitpid(r as libc::pid_t, &mut status, 0) };
    assert_eq!(waited, r as libc::pid_t);
    Ok(libc::WEXITSTATUS(status))
}

/// Replaces `dir/f.md` the way the memory tools do (a temporary file renamed over it), in
/// one process: sh writes the temporary file, then becomes mv.
const REPLACE: &str = r#"printf '%s' "$2" > "$1/.tmp-$$" && exec mv -f "$1/.tmp-$$" "$1/f.md""#;

fn replace(dir: &Path, content: &str) -> std::process::Output {
    Command::new("sh")
        .args(["-c", REPLACE, "sh"])
        .arg(dir)
        .arg(content)
        .output()
        .unwrap()
}

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests start processes at chosen pids (clone3 with set_tid): run them as root"
    );
}

/// Runs `sh -c REPLACE dir content` at `pid`; `None` if clone3 says the pid is taken (another
/// process on the machine got it meanwhile: the caller then starts over with another).
fn replace_at_pid(pid: u32, dir: &Path, content: &str) -> Option<i32> {
    // A joined thread's tid is free only once the kernel has released the task, a moment
    // after the join: EEXIST is retried briefly before the pid counts as taken.
    for _ in 0..100 {
        match sh_at_pid(pid, REPLACE, &[dir.as_os_str(), OsStr::new(content)]) {
            Ok(status) => return Some(status),
            Err(libc::EEXIST) => std::thread::sleep(std::time::Duration::from_millis(2)),
            Err(e) => panic!("clone3 with set_tid {pid}: errno {e}"),
        }
    }
    None
}

#[test]
fn a_process_handed_an_old_pid_or_tid_has_read_nothing() {
    if !fuse_available() {
        return;
    }
    require_root();
    let m = TestMount::with_args(&["--lost-updates", "refuse"]);
    let dir = m.path("memories");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("f.md"), "v0").unwrap();
    let read_in_sh = |dir: &Path| {
        let mut c = Command::new("sh")
            .args(["-c", r#"read -r x < "$1/f.md" || :"#, "sh"])
            .arg(dir)
            .spawn()
            .unwrap();
        let pid = c.id();
        assert!(c.wait().unwrap().success());
        pid
    };
    // A reading thread of this process, gone before its tid is handed out again.
    let read_in_thread = |dir: &Path| {
        let f = dir.join("f.md");
        std::thread::spawn(move || {
            std::fs::read(&f).unwrap();
            nix::unistd::gettid().as_raw() as u32
        })
        .join()
        .unwrap()
    };
    for (what, reader) in [
        ("pid", &read_in_sh as &dyn Fn(&Path) -> u32),
        ("tid", &read_in_thread),
    ] {
        let mut outcome = None;
        for attempt in 0..5 {
            // The reader, then another process's replace it never saw.
            let old = reader(&dir);
            let out = replace(&dir, &format!("{what}-other-{attempt}"));
            assert!(out.status.success(), "{out:?}");
            // A new process at the reader's number: it never read f.md. Start times count
            // clock ticks (10 ms): a pid comes back in the wild only after the whole pid space
            // has cycled, never within a tick, so the new process starts a tick later here.
            std::thread::sleep(std::time::Duration::from_millis(20));
            let mine = format!("{what}-new-{attempt}");
            if let Some(status) = replace_at_pid(old, &dir, &mine) {
                outcome = Some((status, mine));
                break;
            }
        }
        let (status, mine) = outcome.expect("clone3 found every chosen pid taken");
        assert_eq!(
            status,
            0,
            "a new process handed an old {what} was refused as the old one; log:\n{}",
            m.log_text()
        );
        assert_eq!(std::fs::read_to_string(dir.join("f.md")).unwrap(), mine);
    }

    // A process that did read the old version is still refused, and named.
    let mut d = Command::new("sh")
        .args([
            "-c",
            r#"read -r x < "$1/f.md"; echo read; read -r go; printf mine > "$1/.tmp-$$" && exec mv -f "$1/.tmp-$$" "$1/f.md""#,
            "sh",
        ])
        .arg(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let d_pid = d.id();
    let mut said = String::new();
    BufReader::new(d.stdout.as_mut().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert_eq!(said, "read\n");
    let b = Command::new("sh")
        .args([
            "-c",
            r#"printf other > "$1/.tmp-$$" && exec mv -f "$1/.tmp-$$" "$1/f.md""#,
            "sh",
        ])
        .arg(&dir)
        .spawn()
        .unwrap();
    let b_pid = b.id();
    assert!(b.wait_with_output().unwrap().status.success());
    d.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = d.wait_with_output().unwrap();
    assert!(!out.status.success(), "the lost update went through");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Resource temporarily unavailable"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.join("f.md")).unwrap(), "other");
    let log = Command::new(redbfs_bin())
        .arg("log")
        .arg(&m.mountpoint)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&log.stdout);
    let note = format!("pid {d_pid} replaced what pid {b_pid} wrote after pid {d_pid} last read");
    assert!(log.contains(&note), "no `{note}` in:\n{log}");
}

#[test]
fn process_names_are_printed_escaped_and_a_closed_pipe_ends_quietly() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let name = "\x1b[2K\x1b]0;X\x07";
    let f = m.path("evil.md");
    std::thread::spawn(move || {
        let n = CString::new(name).unwrap();
        // SAFETY: PR_SET_NAME with a NUL-terminated string of at most 16 bytes.
        assert_eq!(unsafe { libc::prctl(libc::PR_SET_NAME, n.as_ptr()) }, 0);
        std::fs::write(&f, "written under an escaping name").unwrap();
    })
    .join()
    .unwrap();
    let out = Command::new(redbfs_bin())
        .arg("log")
        .arg(&m.mountpoint)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.stdout.iter().any(|b| *b == 0x1b || *b == 0x07),
        "raw escapes printed:\n{text:?}"
    );
    assert!(text.contains(r"\x1b[2K\x1b]0;X\x07"), "{text}");
    let json = Command::new(redbfs_bin())
        .args(["log", "--json"])
        .arg(&m.mountpoint)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&json.stdout).contains(r"\u001b[2K"));

    // Enough records that the output outlasts any pipe buffer, then readers that go away.
    for i in 0..40 {
        std::fs::write(m.path(&format!("n{i}.md")), "x").unwrap();
    }
    for args in [
        vec!["log".into(), m.mountpoint.clone().into_os_string()],
        vec!["ls".into(), m.mountpoint.clone().into_os_string()],
        vec![
            "cat".into(),
            m.mountpoint.clone().into_os_string(),
            "/n1.md".into(),
        ],
        vec!["man".into()],
    ] {
        let (rd, wr) = nix::unistd::pipe().unwrap();
        drop(rd);
        let out = Command::new(redbfs_bin())
            .args(&args)
            .stdout(Stdio::from(wr))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.signal() == Some(libc::SIGPIPE)
                || matches!(out.status.code(), Some(0 | 141)),
            "{args:?} into a closed pipe: {:?}, {err}",
            out.status
        );
        assert!(err.is_empty(), "{args:?} into a closed pipe said: {err}");
    }
}

/// `redbfs status --json`'s daemon pid.
fn daemon_pid(m: &TestMount) -> u32 {
    let out = Command::new(redbfs_bin())
        .args(["status", "--json"])
        .arg(&m.mountpoint)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["pid"].as_u64().expect("the daemon's pid") as u32
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

#[test]
fn unmount_without_the_daemons_answer_leaves_the_mount_alone() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    std::fs::write(m.path("kept.md"), "still served").unwrap();
    let pid = daemon_pid(&m);
    let unmount_as = |uid: Option<u32>| {
        let mut c = Command::new(redbfs_bin());
        c.arg("unmount").arg(&m.mountpoint);
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            c.uid(uid).gid(uid).current_dir("/");
        }
        c.output().unwrap()
    };

    // Another user meets root's socket (mode 0600): permission, not a stale mount.
    let out = unmount_as(Some(65534));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains("left as it is"), "{err}");

    // The control socket gone: the daemon still serves the mount and holds the store.
    let mut socket = m.store.clone().into_os_string();
    socket.push(".sock");
    std::fs::remove_file(&socket).unwrap();
    let out = unmount_as(None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not answer on the control socket"),
        "{err}"
    );
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    assert!(err.contains(&format!("kill -TERM {pid}")), "{err}");
    assert!(running(pid), "the daemon was stopped");
    assert_eq!(
        std::fs::read_to_string(m.path("kept.md")).unwrap(),
        "still served",
        "the mount was detached"
    );

    // What the message says to do unmounts and closes the store.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    for _ in 0..2000 {
        if !running(pid) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!running(pid), "the daemon did not stop on SIGTERM");
    let out = unmount_as(None);
    assert!(!out.status.success(), "nothing is mounted any more");
    m.mount_after_crash();
    assert_eq!(
        std::fs::read_to_string(m.path("kept.md")).unwrap(),
        "still served"
    );
}
