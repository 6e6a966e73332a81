//! `cat` and `show` of a mounted store, which go through the daemon's control socket.
//!
//! The daemon used to answer them with one JSON line holding the whole file (as a string, or
//! hex): a 250 MB file took it to about 1.5 GB, six times the file, and sixteen clients at once
//! could take it far past that. The content now streams in pieces of a chunk from one read
//! transaction, so the daemon holds about a MiB of a file at a time, whatever its size; the
//! client writes each piece as it comes, gets one version of a file rewritten meanwhile, and
//! fails (never exit 0) when the stream is cut short.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{Rng, TestMount, fuse_available, ok, redbfs, redbfs_bin};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `len` bytes from `seed`: no two seeds' contents agree anywhere, and none is UTF-8 (so
/// `--json` gives hex).
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    if let Some(b) = out.first_mut() {
        *b = 0xff;
    }
    out
}

fn daemon_pid(m: &TestMount) -> u32 {
    common::daemon_pid(&m.mountpoint)
}

/// The daemon's peak over `f`, above its RSS when `f` started, in kB.
fn daemon_growth(pid: u32, f: impl FnOnce()) -> u64 {
    common::peak_growth(pid, f).1
}

const MIB: usize = 1024 * 1024;

fn stderr(out: &Output) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&out.stderr)
}

/// 64 MiB through `cat` and through `show --at` of a mounted store: the bytes come out
/// whole, and the daemon's peak grows by far less than the file (by six times the file when
/// the answer was one line).
#[test]
fn cat_and_show_hold_a_bounded_part_of_a_large_file() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let (old, new) = (content(1, 64 * MIB), content(2, 64 * MIB));
    std::fs::write(m.path("big.bin"), &old).unwrap();
    let pid = daemon_pid(&m);
    let store = s(&m.store);
    // The first read fills redb's page cache (32 MiB), a bound of its own; what is measured
    // is the stream's part.
    let warm = redbfs(&["cat", store, "/big.bin"]);
    assert!(warm.status.success(), "{}", stderr(&warm));
    assert!(warm.stdout == old, "cat gave other bytes");
    drop(warm);
    let mut cat = None;
    let grew = daemon_growth(pid, || cat = Some(redbfs(&["cat", store, "/big.bin"])));
    let cat = cat.unwrap();
    assert!(cat.status.success(), "{}", stderr(&cat));
    assert!(cat.stdout == old, "cat gave other bytes");
    assert!(
        grew < 16 * 1024,
        "the daemon's peak grew by {grew} kB while cat read a 64 MiB file"
    );
    drop(cat);

    ok(redbfs(&["mark", store, "before"]));
    std::fs::write(m.path("big.bin"), &new).unwrap();
    let mut show = None;
    let grew = daemon_growth(pid, || {
        show = Some(redbfs(&["show", store, "/big.bin", "--at", "before"]))
    });
    let show = show.unwrap();
    assert!(show.status.success(), "{}", stderr(&show));
    assert!(show.stdout == old, "show --at gave other bytes");
    assert!(
        grew < 16 * 1024,
        "the daemon's peak grew by {grew} kB while show read a 64 MiB version"
    );
}

/// A file rewritten while `cat` streams it comes out as one version, never a mix: the
/// stream reads from one read transaction. First deterministically (the client stopped
/// mid-stream while a new version commits), then with a writer rewriting the file in a loop
/// (versions of two sizes) while `cat` runs again and again.
#[test]
fn cat_of_a_file_rewritten_meanwhile_gives_one_version() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    let store = s(&m.store);
    let path = m.path("f.bin");
    let (a, b) = (content(3, 32 * MIB), content(4, 32 * MIB));
    std::fs::write(&path, &a).unwrap();

    let mut child = Command::new(redbfs_bin())
        .args(["cat", store, "/f.bin"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut got = vec![0u8; 4096];
    stdout.read_exact(&mut got).unwrap();
    let client = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(client, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The daemon is mid-stream, its client stopped: a new version commits meanwhile.
    std::fs::write(&path, &b).unwrap();
    assert!(
        redbfs(&["cat", store, "/f.bin"]).stdout == b,
        "the new version committed"
    );
    nix::sys::signal::kill(client, nix::sys::signal::Signal::SIGCONT).unwrap();
    stdout.read_to_end(&mut got).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(got == a, "cat mixed two versions ({} bytes)", got.len());

    let versions = [content(5, 8 * MIB), content(6, 5 * MIB + 12_345)];
    std::fs::write(&path, &versions[0]).unwrap();
    let writer = Rewriter::start(m.dir.path(), &path, &versions);
    for i in 0..12 {
        let r = redbfs(&["cat", store, "/f.bin"]);
        assert!(r.status.success(), "{}", stderr(&r));
        assert!(
            versions.contains(&r.stdout),
            "cat {i} gave {} bytes that are neither version",
            r.stdout.len()
        );
    }
    let rewrites = writer.stop();
    assert!(
        rewrites >= 2,
        "the writer rewrote the file {rewrites} times"
    );
}

/// A process rewriting a file in place (open with O_TRUNC, write, close), with each of two
/// versions in turn, until stopped (or dropped, so a failed test leaves none running). A
/// process of its own: a descriptor this process held open on the mount would be closed,
/// and so flushed (committed) half-written, by every child spawned meanwhile.
struct Rewriter {
    child: Option<std::process::Child>,
    done: std::path::PathBuf,
}

impl Rewriter {
    fn start(dir: &Path, file: &Path, versions: &[Vec<u8>; 2]) -> Rewriter {
        let (a, b, done) = (dir.join("va"), dir.join("vb"), dir.join("done"));
        std::fs::write(&a, &versions[0]).unwrap();
        std::fs::write(&b, &versions[1]).unwrap();
        let script =
            r#"n=0; while [ ! -e "$4" ]; do cp "$2" "$1"; cp "$3" "$1"; n=$((n+2)); done; echo $n"#;
        let child = Command::new("sh")
            .args(["-c", script, "sh"])
            .args([file, &a, &b, &done])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Rewriter {
            child: Some(child),
            done,
        }
    }

    /// Stops it, once its current rewrite is whole; how many rewrites it made.
    fn stop(mut self) -> u64 {
        std::fs::write(&self.done, "").unwrap();
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for Rewriter {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let _ = std::fs::write(&self.done, "");
            let _ = child.wait_with_output();
        }
    }
}

/// A stream that ends before its end line (the daemon killed mid-file) fails the command,
/// saying the output is not the whole file; what it wrote is a prefix of the file. A server
/// put at the control socket's path plays the daemon that dies, on a real mount.
#[test]
fn a_stream_cut_short_fails_the_command() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::write(m.path("f.md"), "0123456789").unwrap();
    let (stand_in, listener) = common::StandIn::new(&m);
    let server = std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        let (conn, _) = listener.accept().unwrap();
        let mut req = String::new();
        std::io::BufReader::new(&conn).read_line(&mut req).unwrap();
        let mut w = &conn;
        w.write_all(b"{\"ok\":true,\"streamed\":true,\"size\":10}\n{\"piece\":4}\n0123")
            .unwrap();
        req
    });
    let out = redbfs(&["cat", s(&m.store), "/f.md"]);
    let req = server.join().unwrap();
    drop(stand_in);
    assert!(req.contains("\"stream\":true"), "{req}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("after 4 of the file's 10 bytes: what was written is not the whole file"),
        "{stderr}"
    );
    assert_eq!(out.stdout, b"0123");
    // The real daemon serves again.
    assert_eq!(ok(redbfs(&["cat", s(&m.store), "/f.md"])), "0123456789");
}

/// What reaches the daemon without asking for a stream (a client of an earlier release) is
/// answered in one line only for a small file; `diff`, which holds both versions whole, is
/// refused over 2 MiB before either is read. `cat --json` prints what it printed when the
/// content came in one line, mounted or not.
#[test]
fn whole_answers_are_bounded_and_json_is_unchanged() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    let text = "caf\u{e9} \"quoted\"\n\ttab \u{1}\n";
    let binary = content(7, 100_000);
    std::fs::write(m.path("t.md"), text).unwrap();
    std::fs::write(m.path("b.bin"), &binary).unwrap();
    std::fs::write(m.path("big.bin"), content(8, 9 * MIB)).unwrap();
    let store = s(&m.store).to_string();

    let ask = |req: &str| -> serde_json::Value {
        use std::io::{BufRead, Write};
        let conn = std::os::unix::net::UnixStream::connect(format!("{store}.sock")).unwrap();
        (&conn).write_all(format!("{req}\n").as_bytes()).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(&conn).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    let small = ask(r#"{"op":"cat","path":"/t.md"}"#);
    assert_eq!(small["content"], text);
    let large = ask(r#"{"op":"cat","path":"/big.bin"}"#);
    assert_eq!(large["ok"], false, "{large}");
    assert!(
        large["error"].as_str().unwrap().contains("only streamed"),
        "{large}"
    );

    ok(redbfs(&["mark", &store, "one"]));
    std::fs::write(m.path("big.bin"), content(9, 9 * MIB)).unwrap();
    let diff = redbfs(&["diff", &store, "/big.bin", "--from", "one"]);
    let stderr = String::from_utf8_lossy(&diff.stderr);
    assert!(
        stderr.contains("diff compares versions of at most 2097152 bytes"),
        "{stderr}"
    );
    assert!(diff.stdout.is_empty());
    // A version with a NUL byte is binary: only whether the two differ.
    std::fs::write(m.path("z.bin"), b"zeros\0\0\0 one").unwrap();
    ok(redbfs(&["mark", &store, "two"]));
    std::fs::write(m.path("z.bin"), b"zeros\0\0\0 two").unwrap();
    // As diff(1), exit 1 when they differ.
    let out = redbfs(&["diff", &store, "/z.bin", "--from", "two"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("Binary files /z.bin (@") && said.ends_with("differ\n"),
        "{said}"
    );

    let json_text = format!("{{\"content\":{}}}\n", serde_json::to_string(text).unwrap());
    let hex: String = binary.iter().map(|b| format!("{b:02x}")).collect();
    let json_binary = format!("{{\"content_hex\":\"{hex}\"}}\n");
    for mounted in [true, false] {
        if !mounted {
            m.unmount();
        }
        assert_eq!(
            ok(redbfs(&["cat", &store, "/t.md", "--json"])),
            json_text,
            "mounted: {mounted}"
        );
        assert_eq!(
            ok(redbfs(&["cat", &store, "/b.bin", "--json"])),
            json_binary,
            "mounted: {mounted}"
        );
        let plain = redbfs(&["cat", &store, "/b.bin"]);
        assert!(plain.status.success() && plain.stdout == binary);
    }
}
