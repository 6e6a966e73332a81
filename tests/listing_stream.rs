//! `ls`, `tree`, `expire`'s choice (`unused`) and `stats` of a mounted store, which go
//! through the daemon's control socket.
//!
//! The daemon used to gather a listing whole, turn it into one JSON value and send it as one
//! line: `ls` of a directory of 200,000 files took it to 351 MB, `tree /` to 789 MB (about
//! 3.9 KB an entry), three `tree /` at once past 2 GB, and `stats` loaded every inode twice to
//! name ten files. A listing now streams in pages from a walk with a bounded state, so the
//! daemon's peak does not follow the store's size; the client prints each entry as it comes,
//! the same bytes as before, mounted or not, and fails (never exit 0) when the stream is cut
//! short. A client that asks for no stream (an earlier release) gets the one-line answer only
//! for a short listing.

mod common;

use std::path::Path;
use std::process::Output;

use common::{TestMount, fuse_available, ok, redbfs};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn daemon_pid(m: &TestMount) -> u32 {
    common::daemon_pid(&m.mountpoint)
}

/// Runs `args`, and returns its output with the daemon's peak RSS over it above its RSS when
/// it started (kB), the peak reset first.
fn measured(pid: u32, args: &[&str]) -> (Output, u64) {
    common::peak_growth(pid, || redbfs(args))
}

fn stderr(out: &Output) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&out.stderr)
}

const FILES: usize = 100_000;
/// What the daemon's peak may grow by while it answers one listing of `FILES` entries: redb's
/// page cache (32 MiB) fills on the way, plus a page and the walk. The whole answer took
/// about 175 MB for `ls` and 390 MB for `tree` of this store.
const GROWTH_MAX_KB: u64 = 48 * 1024;

fn name(i: usize) -> String {
    format!("memory-note-{i:06}-with-a-longish-name.md")
}

/// A store of `FILES` empty files in `/big`, and a few files with content in `/small`
/// (the largest `stats` names), made by an import.
fn large_store(m: &mut TestMount) {
    m.unmount();
    std::fs::remove_file(&m.store).unwrap();
    let src = m.dir.path().join("src");
    std::fs::create_dir_all(src.join("big")).unwrap();
    std::fs::create_dir_all(src.join("small/deeper")).unwrap();
    for i in 0..FILES {
        std::fs::File::create(src.join("big").join(name(i))).unwrap();
    }
    for i in 0..12 {
        std::fs::write(
            src.join(format!("small/deeper/f{i:02}")),
            vec![b'x'; 100 + i],
        )
        .unwrap();
    }
    ok(redbfs(&["import", s(&src), s(&m.store)]));
    std::fs::remove_dir_all(&src).unwrap();
    m.mount();
}

/// `ls` and `tree` of a directory of 100,000 files through the daemon list every name, the
/// same bytes as the store file read directly, while the daemon's peak grows by a bounded
/// amount; `stats` names the largest files without loading every inode; a client that asks
/// for no stream is refused a listing this long, with a message to upgrade.
#[test]
fn listings_of_a_large_directory_stream_from_a_bounded_daemon() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    large_store(&mut m);
    let pid = daemon_pid(&m);
    let store = s(&m.store).to_string();
    let mut mounted = Vec::new();
    for args in [
        &["tree", &store, "/"][..],
        &["ls", &store, "/big"],
        &["ls", &store, "/big", "--json"],
        &["tree", &store, "/", "--json"],
        &["stats", &store, "--json"],
    ] {
        let (out, grew) = measured(pid, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(
            grew < GROWTH_MAX_KB,
            "the daemon's peak grew by {grew} kB while it answered {args:?} over {FILES} files"
        );
        mounted.push(out.stdout);
    }

    let tree = String::from_utf8(mounted[0].clone()).unwrap();
    let lines: Vec<&str> = tree.lines().collect();
    // The root, big/ and its files, small/, deeper/ and its 12 files.
    assert_eq!(lines.len(), 1 + 1 + FILES + 2 + 12);
    assert_eq!(&lines[..3], ["/", "  big/", &format!("    {}", name(0))]);
    assert_eq!(lines[2 + 54_321], format!("    {}", name(54_321)));
    assert_eq!(lines[1 + FILES], format!("    {}", name(FILES - 1)));
    assert_eq!(lines[2 + FILES], "  small/");
    let ls = String::from_utf8(mounted[1].clone()).unwrap();
    let names: Vec<&str> = ls.lines().collect();
    assert_eq!(names.len(), FILES);
    assert!(
        names.iter().enumerate().all(|(i, n)| *n == name(i)),
        "ls /big lists other names"
    );
    let json: Vec<serde_json::Value> = serde_json::from_slice(&mounted[2]).unwrap();
    assert_eq!(json.len(), FILES);
    assert_eq!(json[777]["path"], format!("/big/{}", name(777)));
    let stats: serde_json::Value = serde_json::from_slice(&mounted[4]).unwrap();
    assert_eq!(
        stats["largest"][0],
        serde_json::json!(["/small/deeper/f11", 111])
    );
    assert_eq!(
        stats["largest"][9],
        serde_json::json!(["/small/deeper/f02", 102])
    );
    assert_eq!(stats["largest"].as_array().unwrap().len(), 10);

    // A client of an earlier release (no "stream"): a short listing in one line, a long one
    // refused before the daemon holds it.
    let ask = |req: &str| -> serde_json::Value {
        use std::io::{BufRead, Write};
        let conn = std::os::unix::net::UnixStream::connect(format!("{store}.sock")).unwrap();
        (&conn).write_all(format!("{req}\n").as_bytes()).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(&conn).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    let small = ask(r#"{"op":"ls","path":"/small/deeper"}"#);
    assert_eq!(
        small["entries"].as_array().map(Vec::len),
        Some(12),
        "{small}"
    );
    for req in [
        r#"{"op":"ls","path":"/big"}"#,
        r#"{"op":"tree","path":"/"}"#,
        r#"{"op":"unused","path":"/","cutoff_ns":9000000000000000000}"#,
    ] {
        let (v, grew) = common::peak_growth(pid, || ask(req));
        assert_eq!(v["ok"], false, "{req}");
        let e = v["error"].as_str().unwrap();
        assert!(e.contains("only streamed") && e.contains("upgrade"), "{e}");
        assert!(grew < GROWTH_MAX_KB, "{req}: the daemon grew by {grew} kB");
    }

    // The store file read directly prints the same bytes.
    m.unmount();
    for (i, args) in [
        &["tree", &store, "/"][..],
        &["ls", &store, "/big"],
        &["ls", &store, "/big", "--json"],
        &["tree", &store, "/", "--json"],
    ]
    .iter()
    .enumerate()
    {
        let out = redbfs(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(out.stdout == mounted[i], "{args:?} differs mounted and not");
    }
    let unmounted: serde_json::Value =
        serde_json::from_str(&ok(redbfs(&["stats", &store, "--json"]))).unwrap();
    assert_eq!(unmounted["largest"], stats["largest"]);
}

/// A listing whose stream ends before its end line (the daemon died, or dropped this client)
/// fails the command with exit 1, saying what was listed is not the whole listing. A server
/// put at the control socket's path plays the daemon that dies, on a real mount.
#[test]
fn a_listing_cut_short_fails_the_command() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::write(m.path("a.md"), "a").unwrap();
    let (stand_in, listener) = common::StandIn::new(&m);
    let server = std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        let mut reqs = Vec::new();
        for page in [
            &br#"{"ok":true,"streamed":true,"entries":[{"name":"a.md","path":"/a.md","kind":"file","size":1,"mode":420,"uid":0,"gid":0,"mtime_ns":0,"atime_ns":0,"ino":2}]}"#[..],
            br#"{"ok":true,"streamed":true,"tree":[{"depth":0,"entry":{"name":"/","path":"/","kind":"dir","size":0,"mode":493,"uid":0,"gid":0,"mtime_ns":0,"atime_ns":0,"ino":1}}]}"#,
        ] {
            let (conn, _) = listener.accept().unwrap();
            let mut req = String::new();
            std::io::BufReader::new(&conn).read_line(&mut req).unwrap();
            let mut w = &conn;
            w.write_all(page).unwrap();
            w.write_all(b"\n").unwrap();
            reqs.push(req);
        }
        reqs
    });
    let ls = redbfs(&["ls", s(&m.store), "/"]);
    let tree = redbfs(&["tree", s(&m.store), "/"]);
    let reqs = server.join().unwrap();
    drop(stand_in);
    for req in &reqs {
        assert!(req.contains("\"stream\":true"), "{req}");
    }
    for (out, printed) in [(&ls, "a.md\n"), (&tree, "/\n")] {
        assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
        assert!(
            stderr(out).contains("after 1 entries: what was listed is not the whole listing"),
            "{}",
            stderr(out)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), printed);
    }
    // The real daemon serves again.
    assert!(
        ok(redbfs(&["ls", s(&m.store), "/"]))
            .lines()
            .any(|l| l == "a.md")
    );
}
