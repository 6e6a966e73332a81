//! History: random operations with time travel against a model (show, snapshot --at and
//! rollback equal the model's state at random past points; rollback of a rollback restores
//! the later state), attribution of the writing process, retention, redaction that leaves no
//! bytes in the file after compact, revert through a mount the kernel has cached, and a kill
//! during a rollback that leaves all-before or all-after.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{Rng, TestMount, fuse_available, ok, redbfs};
use redbfs::fs::{Caller, Fs, Limits, OpenMode};
use redbfs::store::{HistoryRecord, Kind, LogCursor, ROOT_INO, Store, TreeView};

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 1,
};
const THIRTY_DAYS: u64 = 30 * 86_400 * 1_000_000_000;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// path -> None for a directory, Some(content) for a file.
type Tree = BTreeMap<String, Option<Vec<u8>>>;

fn tree_of(r: &impl TreeView) -> Tree {
    let mut out = Tree::new();
    for (_, e) in redbfs::tools::tree(r, "/").unwrap().into_iter().skip(1) {
        let v = if e.kind == "dir" {
            None
        } else {
            let (inode, _) = redbfs::tools::lookup_path(r, &e.path).unwrap();
            Some(redbfs::tools::read_content(r, &inode).unwrap())
        };
        out.insert(e.path, v);
    }
    out
}

/// The log of `path` (newest first) by walking every record, following the path back
/// through renames: what the path index must answer.
fn log_by_walking(newest_first: &[HistoryRecord], path: &str) -> Vec<u64> {
    let within =
        |p: &str, base: &str| base == "/" || p == base || p.starts_with(&format!("{base}/"));
    let mut t = path.to_string();
    let mut out = Vec::new();
    for rec in newest_first {
        if rec.paths.iter().any(|p| within(p, &t) || within(&t, p)) {
            out.push(rec.seq);
        }
        if (rec.op == "rename" || rec.op == "exchange")
            && let [from, to] = rec.paths.as_slice()
            && within(&t, to)
        {
            t = format!("{from}{}", &t[to.len()..]);
        }
    }
    out
}

fn lookup(fs: &Fs, path: &str) -> Option<(u64, Kind)> {
    let mut ino = ROOT_INO;
    let mut kind = Kind::Dir;
    for p in path.split('/').filter(|p| !p.is_empty()) {
        let i = fs.lookup(ino, p.as_bytes()).ok()?;
        ino = i.ino;
        kind = i.kind;
    }
    Some((ino, kind))
}

/// One random operation through `Fs`; failures (EEXIST, ENOTEMPTY...) are part of the game.
fn random_op(fs: &Fs, rng: &mut Rng, step: u64) {
    let dirs = ["", "/a", "/b", "/a/c"];
    let names = ["x.md", "y.md", "c", "z"];
    let dir = dirs[rng.below(4) as usize];
    let name = names[rng.below(4) as usize];
    let Some((parent, Kind::Dir)) = lookup(fs, dir) else {
        return;
    };
    match rng.below(6) {
        0 => {
            let _ = fs.mkdir(ME, parent, name.as_bytes(), 0o755, 0);
        }
        1 | 2 => {
            let data = format!("step {step} {}", "x".repeat(rng.below(100_000) as usize));
            let fh = match fs.lookup(parent, name.as_bytes()) {
                Ok(i) if i.kind == Kind::File => fs
                    .open(
                        ME,
                        i.ino,
                        OpenMode {
                            write: true,
                            truncate: true,
                            ..OpenMode::default()
                        },
                    )
                    .ok(),
                Ok(_) => None,
                Err(_) => fs
                    .create(ME, parent, name.as_bytes(), 0o644, 0, libc::O_WRONLY)
                    .ok()
                    .map(|x| x.1),
            };
            if let Some(fh) = fh {
                fs.write(ME, fh, 0, data.as_bytes()).unwrap();
                fs.release(fh).unwrap();
            }
        }
        3 => {
            let _ = fs.unlink(ME, parent, name.as_bytes());
        }
        4 => {
            let _ = fs.rmdir(ME, parent, name.as_bytes());
        }
        _ => {
            let to = dirs[rng.below(4) as usize];
            if let Some((np, Kind::Dir)) = lookup(fs, to) {
                let _ = fs.rename(
                    ME,
                    parent,
                    name.as_bytes(),
                    np,
                    names[rng.below(4) as usize].as_bytes(),
                    0,
                );
            }
        }
    }
}

#[test]
fn time_travel_matches_the_model_at_random_points() {
    let seed: u64 = std::env::var("REDBFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(11);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = Store::open_or_create(&path, (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    let fs = Fs::new(store, Limits::default()).unwrap();
    let mut rng = Rng(seed);
    // The model: the tree after each history point.
    let mut states: BTreeMap<u64, Tree> = BTreeMap::new();
    states.insert(0, Tree::new());
    for step in 0..150 {
        random_op(&fs, &mut rng, step);
        let r = fs.store().read().unwrap();
        states.insert(r.last_seq().unwrap(), tree_of(&r));
    }
    let r = fs.store().read().unwrap();
    let points: Vec<u64> = states.keys().copied().collect();
    for _ in 0..8 {
        let seq = points[rng.below(points.len() as u64) as usize];
        let then = redbfs::tools::at_point(&r, seq, |t| Ok(tree_of(t))).unwrap();
        assert_eq!(&then, &states[&seq], "seed {seed}: state at @{seq}");
        // The same tree read through history's index, without replaying anything.
        assert_eq!(
            &tree_of(&r.past(seq).unwrap()),
            &states[&seq],
            "seed {seed}: indexed view at @{seq}"
        );
        // show of every file at that point
        for (p, content) in &states[&seq] {
            if let Some(c) = content {
                assert_eq!(
                    &redbfs::tools::show_at(&r, p, seq).unwrap(),
                    c,
                    "seed {seed}: show {p} @{seq}"
                );
            }
        }
    }
    // Every path's log, from the path index, is what a walk over every record finds, and
    // paging through it (a cursor per page) gives the same records.
    let mut all = Vec::new();
    r.for_each_record(|rec| {
        all.push(rec);
        Ok(())
    })
    .unwrap();
    all.reverse();
    let mut paths: Vec<String> = states.values().flat_map(|t| t.keys().cloned()).collect();
    paths.extend(["/", "/a", "/b", "/a/c", "/nowhere"].map(String::from));
    paths.sort();
    paths.dedup();
    for p in &paths {
        let want = log_by_walking(&all, p);
        let got: Vec<u64> = r
            .history_of(Some(p), None, usize::MAX)
            .unwrap()
            .iter()
            .map(|rec| rec.seq)
            .collect();
        assert_eq!(got, want, "seed {seed}: log of {p}");
        let mut paged = Vec::new();
        let mut cursor = LogCursor::start(Some(p));
        loop {
            let (page, next) = r.history_page(&cursor, None, 3).unwrap();
            paged.extend(page.iter().map(|rec| rec.seq));
            match next {
                Some(c) => cursor = c,
                None => break,
            }
        }
        assert_eq!(paged, want, "seed {seed}: paged log of {p}");
    }
    drop(r);

    // Rollback to a random point equals the model there; rolling back the rollback restores
    // the later state. Each is one record.
    let before = tree_of(&fs.store().read().unwrap());
    let latest = fs.store().read().unwrap().last_seq().unwrap();
    let target = points[points.len() / 3];
    fs.rollback(ME, target).unwrap();
    let r = fs.store().read().unwrap();
    assert_eq!(
        tree_of(&r),
        states[&target],
        "seed {seed}: rollback to @{target}"
    );
    assert_eq!(
        r.last_seq().unwrap(),
        latest + 1,
        "the rollback is one record"
    );
    drop(r);
    fs.rollback(ME, latest).unwrap();
    assert_eq!(
        tree_of(&fs.store().read().unwrap()),
        before,
        "seed {seed}: rollback of the rollback"
    );
    let r = fs.store().read().unwrap();
    assert_eq!(redbfs::check::invariants(&r).unwrap(), Vec::<String>::new());
    // The rollbacks brought inodes back under their old numbers: the past still reads as
    // the model at every point, those before and the two rollbacks'.
    states.insert(latest + 1, states[&target].clone());
    states.insert(latest + 2, before);
    for (seq, want) in states.iter().filter(|(s, _)| *s % 7 == 0 || **s > latest) {
        assert_eq!(
            &tree_of(&r.past(*seq).unwrap()),
            want,
            "seed {seed}: indexed view at @{seq} after the rollbacks"
        );
    }
}

#[test]
fn snapshot_at_and_cli_history_on_an_unmounted_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    {
        let store = Store::open_or_create(&path, (0, 0)).unwrap();
        store.set_keep_history(THIRTY_DAYS).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let m = fs.mkdir(ME, ROOT_INO, b"memories", 0o700, 0).unwrap();
        let (_, fh) = fs
            .create(ME, m.ino, b"plan.md", 0o600, 0, libc::O_WRONLY)
            .unwrap();
        fs.write(ME, fh, 0, b"1. ship\n2. rest\n").unwrap();
        fs.release(fh).unwrap();
        fs.mark("v1").unwrap();
        let i = fs.lookup(m.ino, b"plan.md").unwrap();
        let fh = fs
            .open(
                ME,
                i.ino,
                OpenMode {
                    write: true,
                    truncate: true,
                    ..OpenMode::default()
                },
            )
            .unwrap();
        fs.write(ME, fh, 0, b"1. ship\n2. party\n").unwrap();
        fs.release(fh).unwrap();
    }
    let p = s(&path);
    assert_eq!(
        ok(redbfs(&["show", p, "/memories/plan.md", "--at", "v1"])),
        "1. ship\n2. rest\n"
    );
    let d = redbfs(&["diff", p, "/memories/plan.md", "--from", "v1"]);
    assert_eq!(
        d.status.code(),
        Some(1),
        "diff exits 1 when the texts differ"
    );
    let d = String::from_utf8_lossy(&d.stdout);
    assert!(d.contains("-2. rest\n+2. party\n"), "{d}");
    let snap = dir.path().join("v1.redb");
    ok(redbfs(&["snapshot", p, s(&snap), "--at", "v1"]));
    assert_eq!(
        ok(redbfs(&["cat", s(&snap), "/memories/plan.md"])),
        "1. ship\n2. rest\n"
    );
    assert!(ok(redbfs(&["check", s(&snap)])).contains("clean"));
    ok(redbfs(&["revert", p, "/memories/plan.md", "--to", "v1"]));
    assert_eq!(
        ok(redbfs(&["cat", p, "/memories/plan.md"])),
        "1. ship\n2. rest\n"
    );
    let log = ok(redbfs(&["log", p, "/memories/plan.md"]));
    assert!(log.lines().next().unwrap().contains("revert"), "{log}");
    assert!(ok(redbfs(&["check", p])).contains("clean"));
}

#[test]
fn attribution_names_the_writing_process() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::create_dir(m.path("memories")).unwrap();
    let child = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys,os; open(sys.argv[1],'w').write('from python'); print(os.getpid())",
        ])
        .arg(m.path("memories/py.md"))
        .output()
        .unwrap();
    let pid: u32 = String::from_utf8_lossy(&child.stdout)
        .trim()
        .parse()
        .unwrap();
    let out = ok(redbfs(&[
        "log",
        s(&m.mountpoint),
        "/memories/py.md",
        "--json",
    ]));
    let recs: serde_json::Value = serde_json::from_str(&out).unwrap();
    // The create's record takes in the first write of the process that made the file.
    let writes: Vec<_> = recs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["op"] == "write" || r["folded"] == serde_json::json!(["write"]))
        .collect();
    assert!(!writes.is_empty(), "{out}");
    for w in writes {
        assert_eq!(w["pid"], pid);
        assert!(w["comm"].as_str().unwrap().starts_with("python"), "{w}");
        assert_eq!(w["uid"], nix::unistd::getuid().as_raw());
        assert_eq!(w["size_after"], 11);
    }
}

/// A durable create as the SDK makes it (create, write, fsync, close) reads /proc three
/// times: the creator's name for the create's record, the writer's pid, start time and name
/// in one read at its first write, and, as the write's commit folds into the create's record,
/// the start time of the thread holding the writer's tid now, which must have run since
/// before the create (a tid comes back once its thread exits). A write from another thread
/// of the same handle is told afresh: its commit names that thread.
#[test]
fn a_durable_create_reads_proc_three_times_and_its_records_name_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    let fs = Fs::new(store, Limits::default()).unwrap();
    let me = Caller {
        pid: nix::unistd::gettid().as_raw() as u32,
        ..ME
    };
    let my_name = redbfs::process::name(me.pid).unwrap();
    let reads = redbfs::process::reads_on_this_thread;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    // The first write of a thread also finds its process (its thread group's pid and start
    // time), once: that is cached while the thread lives.
    let (_, fh) = fs
        .create(me, ROOT_INO, b"first.md", 0o100600, 0, flags)
        .unwrap();
    fs.write(me, fh, 0, b"first").unwrap();
    fs.release(fh).unwrap();
    // A write folds into the create of a thread that ran a whole tick (10 ms) before it.
    std::thread::sleep(std::time::Duration::from_millis(30));
    let before = reads();
    let (_, fh) = fs
        .create(me, ROOT_INO, b"a.md", 0o100600, 0, flags)
        .unwrap();
    fs.write(me, fh, 0, b"hello").unwrap();
    fs.fsync(fh).unwrap();
    fs.flush(fh).unwrap();
    assert_eq!(
        reads() - before,
        3,
        "/proc reads of a create, write, fsync, close"
    );
    // More writes by the same thread: told already, and no create to fold into.
    fs.write(me, fh, 5, b" again").unwrap();
    fs.fsync(fh).unwrap();
    assert_eq!(reads() - before, 3);
    // Another thread (another name) writes through the same handle.
    let fs = std::sync::Arc::new(fs);
    let other = std::thread::Builder::new()
        .name("other-writer".into())
        .spawn({
            let fs = fs.clone();
            move || {
                let tid = nix::unistd::gettid().as_raw() as u32;
                fs.write(Caller { pid: tid, ..ME }, fh, 11, b"!").unwrap();
                tid
            }
        })
        .unwrap()
        .join()
        .unwrap();
    fs.fsync(fh).unwrap();
    fs.release(fh).unwrap();
    let r = fs.store().read().unwrap();
    let recs = r.history(1..=r.last_seq().unwrap()).unwrap();
    let named: Vec<(&str, usize, u32, &str)> = recs
        .iter()
        .rev()
        .filter(|h| (h.op == "create" || h.op == "write") && h.paths == ["/a.md"])
        .map(|h| (h.op.as_str(), h.folded.len(), h.pid, h.comm.as_str()))
        .collect();
    assert_eq!(
        named,
        [
            ("create", 1, me.pid, my_name.as_str()),
            ("write", 0, me.pid, my_name.as_str()),
            ("write", 0, other, "other-writer"),
        ]
    );
}

/// A tid comes back once its thread exits, and the thread holding it next may be another
/// process's, writing through a handle of its own: a write through another handle than the
/// one its tid was told through is told afresh (one read of /proc), while further writes
/// through the same handle are not.
#[test]
fn a_write_through_another_handle_is_told_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    let fs = Fs::new(store, Limits::default()).unwrap();
    let me = Caller {
        pid: nix::unistd::gettid().as_raw() as u32,
        ..ME
    };
    let reads = redbfs::process::reads_on_this_thread;
    let (inode, one) = fs
        .create(me, ROOT_INO, b"a.md", 0o100600, 0, libc::O_WRONLY)
        .unwrap();
    let write = OpenMode {
        write: true,
        ..OpenMode::default()
    };
    let two = fs.open(me, inode.ino, write).unwrap();
    // The first write is told (and finds the thread's process, cached from then on).
    let before = reads();
    fs.write(me, one, 0, b"one").unwrap();
    assert!(reads() > before);
    let before = reads();
    fs.write(me, one, 3, b"one").unwrap();
    assert_eq!(
        reads() - before,
        0,
        "the same handle's next write is not told"
    );
    fs.write(me, two, 6, b"two").unwrap();
    assert_eq!(reads() - before, 1, "another handle's write is told afresh");
    fs.write(me, two, 9, b"two").unwrap();
    assert_eq!(reads() - before, 1);
    fs.release(one).unwrap();
    fs.release(two).unwrap();
}

/// Each commit skips its look for expired records while its cutoff has not passed the
/// oldest record's time, which an earlier look remembered; once retention is shortened and
/// that time passes, the next commit drops what has expired and nothing newer.
#[test]
fn expiry_skipped_until_the_oldest_record_is_due_then_drops_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    let fs = Fs::new(store, Limits::default()).unwrap();
    let write = |name: &str| {
        let (_, fh) = fs
            .create(ME, ROOT_INO, name.as_bytes(), 0o100600, 0, libc::O_WRONLY)
            .unwrap();
        fs.write(ME, fh, 0, name.as_bytes()).unwrap();
        fs.release(fh).unwrap();
    };
    for i in 0..4 {
        write(&format!("old{i}"));
    }
    let r = fs.store().read().unwrap();
    let old = r.history(1..=r.last_seq().unwrap()).unwrap().len();
    assert!(old >= 4, "a create, with its write, each: {old}");
    drop(r);
    fs.store().set_keep_history(300_000_000).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    write("new");
    let r = fs.store().read().unwrap();
    let left = r.history(1..=r.last_seq().unwrap()).unwrap();
    let paths: Vec<&str> = left
        .iter()
        .flat_map(|h| h.paths.iter().map(String::as_str))
        .collect();
    assert_eq!(paths, ["/new"], "{left:?}");
}

/// The SDK's create (a file made with `O_EXCL`, written, fsynced, closed) is one record in
/// `log`: the create's, taking in its write. `show --at` the point before it finds no file,
/// the point after it the written bytes. A write by another process, one after a mark and
/// one after another record each keep a record of their own.
#[test]
fn an_sdk_create_is_one_record_and_what_must_not_fold_does_not() {
    if !fuse_available() {
        return;
    }
    use std::io::Write;
    let m = TestMount::new();
    std::fs::create_dir(m.path("memories")).unwrap();
    let mp = s(&m.mountpoint);
    let records = || -> Vec<serde_json::Value> {
        let out = ok(redbfs(&["log", mp, "--json"]));
        serde_json::from_str::<serde_json::Value>(&out)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    let newest = || records()[0]["seq"].as_u64().unwrap();
    let made = |name: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.path(name))
            .unwrap()
    };
    let text = b"- the user prefers short answers\n";

    let before = newest();
    let mut f = made("memories/a.md");
    f.write_all(text).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let all = records();
    let r = &all[0];
    assert_eq!(r["seq"].as_u64(), Some(before + 1), "one record: {r}");
    assert_eq!(r["op"], "create", "{r}");
    assert_eq!(r["folded"], serde_json::json!(["write"]), "{r}");
    assert_eq!(r["paths"], serde_json::json!(["/memories/a.md"]), "{r}");
    assert_eq!(r["size_after"].as_u64(), Some(text.len() as u64), "{r}");
    assert_eq!(
        r["pid"].as_u64(),
        Some(nix::unistd::gettid().as_raw() as u64),
        "{r}"
    );
    let log = ok(redbfs(&["log", mp, "/memories/a.md"]));
    let own: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("/memories/a.md"))
        .collect();
    assert_eq!(own.len(), 1, "{log}");
    assert!(
        own[0].contains(" create ") && own[0].ends_with("[with write]"),
        "{log}"
    );
    let at = |seq: u64| redbfs(&["show", mp, "/memories/a.md", "--at", &seq.to_string()]);
    let gone = at(before);
    assert!(!gone.status.success(), "no file before its create");
    assert_eq!(ok(at(before + 1)).as_bytes(), text);

    // Another process writes the file this one made.
    drop(made("memories/b.md"));
    let created = newest();
    let out = std::process::Command::new("sh")
        .args(["-c", "printf other >> \"$1\"", "sh"])
        .arg(m.path("memories/b.md"))
        .output()
        .unwrap();
    assert!(out.status.success());
    // A write after a mark naming the create's point.
    drop(made("memories/c.md"));
    let marked = newest();
    ok(redbfs(&["mark", mp, "after-c"]));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.path("memories/c.md"))
        .unwrap();
    f.write_all(b"marked").unwrap();
    f.sync_all().unwrap();
    drop(f);
    // A write after another record.
    let mut f = made("memories/d.md");
    drop(made("memories/e.md"));
    f.write_all(b"later").unwrap();
    f.sync_all().unwrap();
    drop(f);

    let all = records();
    let of = |path: &str| -> Vec<(String, bool)> {
        all.iter()
            .filter(|r| r["paths"] == serde_json::json!([path]))
            .map(|r| {
                (
                    r["op"].as_str().unwrap().to_string(),
                    r.get("folded").is_some(),
                )
            })
            .collect()
    };
    let apart = [("write".to_string(), false), ("create".to_string(), false)];
    assert_eq!(of("/memories/b.md"), apart, "another process's write");
    assert_eq!(of("/memories/c.md"), apart, "a write after a mark");
    assert_eq!(of("/memories/d.md"), apart, "a write after another record");
    let b = redbfs(&["show", mp, "/memories/b.md", "--at", &created.to_string()]);
    assert_eq!(ok(b), "");
    let c = redbfs(&["show", mp, "/memories/c.md", "--at", "after-c"]);
    assert_eq!(ok(c), "");
    assert!(marked < newest());
    assert!(ok(redbfs(&["check", mp])).contains("invariants hold"));
}

#[test]
fn retention_drops_what_is_older_and_nothing_newer() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::with_args(&["--keep-history", "2s"]);
    for i in 0..5 {
        std::fs::write(m.path(&format!("old{i}")), format!("old {i}")).unwrap();
    }
    std::fs::write(m.path("old0"), "old 0 replaced").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    for i in 0..10 {
        std::fs::write(m.path(&format!("new{i}")), format!("new {i}")).unwrap();
    }
    let out = ok(redbfs(&["log", s(&m.mountpoint), "--json"]));
    let recs: serde_json::Value = serde_json::from_str(&out).unwrap();
    let paths: Vec<String> = recs
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["paths"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().unwrap().to_string())
        })
        .collect();
    assert!(
        paths.iter().all(|p| !p.starts_with("/old")),
        "older records dropped: {paths:?}"
    );
    for i in 0..10 {
        assert!(
            paths.contains(&format!("/new{i}")),
            "newer records kept: {paths:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(m.path("old0")).unwrap(),
        "old 0 replaced"
    );
    assert!(ok(redbfs(&["check", s(&m.mountpoint)])).contains("invariants hold"));
}

#[test]
fn redact_then_compact_leaves_no_bytes_in_the_file() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    std::fs::create_dir(m.path("memories")).unwrap();
    let secret = "sk-SECRET-a1b2c3d4e5f6-do-not-keep";
    std::fs::write(m.path("memories/creds.md"), format!("api key: {secret}\n")).unwrap();
    // The agent replaces the file the way the SDK's str_replace does.
    std::fs::write(m.path("memories/.tmp-1-x"), "api key: (removed)\n").unwrap();
    std::fs::rename(m.path("memories/.tmp-1-x"), m.path("memories/creds.md")).unwrap();
    let first = ok(redbfs(&[
        "log",
        s(&m.mountpoint),
        "/memories/creds.md",
        "--json",
    ]));
    let recs: serde_json::Value = serde_json::from_str(&first).unwrap();
    // The temporary file's create and write are folded into the rename's record: the point
    // before it is the secret's.
    let replace = recs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["op"] == "rename")
        .expect("the replace is recorded");
    assert_eq!(replace["folded"], serde_json::json!(["create", "write"]));
    let secret_write = replace["seq"].as_u64().unwrap() - 1;
    ok(redbfs(&["redact", s(&m.mountpoint), "/memories/creds.md"]));
    assert_eq!(
        std::fs::read_to_string(m.path("memories/creds.md")).unwrap(),
        "api key: (removed)\n"
    );
    let err = redbfs(&[
        "show",
        s(&m.mountpoint),
        "/memories/creds.md",
        "--at",
        &secret_write.to_string(),
    ]);
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("redacted"));
    let log = ok(redbfs(&["log", s(&m.mountpoint), "/memories/creds.md"]));
    assert!(log.contains("[redacted]"), "the records stay: {log}");
    m.unmount();
    ok(redbfs(&["compact", s(&m.store)]));
    let bytes = std::fs::read(&m.store).unwrap();
    let found = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
    assert!(!found, "the secret is gone from the store file");
    assert!(ok(redbfs(&["check", s(&m.store)])).contains("clean"));
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn revert_through_the_mount_reaches_the_kernels_cache() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::new();
    std::fs::create_dir_all(m.path("memories/project")).unwrap();
    std::fs::write(m.path("memories/project/a.md"), "good a").unwrap();
    std::fs::write(m.path("memories/project/b.md"), "good b").unwrap();
    ok(redbfs(&["mark", s(&m.mountpoint), "good"]));
    // An agent session damages the directory; the kernel caches what it read.
    std::fs::write(m.path("memories/project/a.md"), "poisoned").unwrap();
    std::fs::remove_file(m.path("memories/project/b.md")).unwrap();
    std::fs::write(m.path("memories/project/c.md"), "injected").unwrap();
    assert_eq!(
        std::fs::read_to_string(m.path("memories/project/a.md")).unwrap(),
        "poisoned"
    );
    // The kernel caches the listing too (twice: the second is served from its cache).
    for _ in 0..2 {
        assert_eq!(names_in(&m.path("memories/project")), ["a.md", "c.md"]);
    }
    ok(redbfs(&[
        "revert",
        s(&m.mountpoint),
        "/memories/project",
        "--to",
        "good",
    ]));
    assert_eq!(
        std::fs::read_to_string(m.path("memories/project/a.md")).unwrap(),
        "good a"
    );
    assert_eq!(
        std::fs::read_to_string(m.path("memories/project/b.md")).unwrap(),
        "good b"
    );
    assert!(!m.path("memories/project/c.md").exists());
    assert_eq!(names_in(&m.path("memories/project")), ["a.md", "b.md"]);
    assert!(ok(redbfs(&["check", s(&m.mountpoint)])).contains("invariants hold"));
}

#[test]
fn a_kill_during_rollback_leaves_all_before_or_all_after() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    std::fs::create_dir(m.path("d")).unwrap();
    for i in 0..1500 {
        std::fs::write(m.path(&format!("d/f{i:04}")), format!("{i}")).unwrap();
    }
    ok(redbfs(&["mark", s(&m.mountpoint), "full"]));
    for i in 0..1500 {
        std::fs::remove_file(m.path(&format!("d/f{i:04}"))).unwrap();
    }
    let status = ok(redbfs(&["status", s(&m.mountpoint), "--json"]));
    let pid = serde_json::from_str::<serde_json::Value>(&status).unwrap()["pid"]
        .as_i64()
        .unwrap() as i32;
    let mut child = std::process::Command::new(common::redbfs_bin())
        .args(["rollback", s(&m.mountpoint), "--to", "full"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let delay: u64 = std::env::var("REDBFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    std::thread::sleep(std::time::Duration::from_millis(delay));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = child.wait();
    while Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z")
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    m.mount_after_crash();
    let n = std::fs::read_dir(m.path("d")).unwrap().count();
    assert!(
        n == 0 || n == 1500,
        "rollback is all or nothing: {n} files after a kill at {delay} ms"
    );
    if n == 1500 {
        assert_eq!(std::fs::read_to_string(m.path("d/f0777")).unwrap(), "777");
    }
    m.unmount();
    assert!(ok(redbfs(&["check", s(&m.store)])).contains("clean"));
}

/// `log` of a mounted store streamed 3,000-5,000 records a second: the daemon wrote each
/// page a JSON token per write(2). The log now streams, page after page on one request, and
/// must print exactly what the same command prints from the unmounted file, across several
/// pages (the first holds 100 records, the next 1,000), for the whole store, a renamed path,
/// `--since` and `-n`. A reader that goes away mid-stream, or one that stops reading, leaves
/// the daemon serving everyone else.
#[test]
fn log_through_the_daemon_equals_log_of_the_file_and_a_stalled_reader_harms_no_one() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::new();
    m.unmount();
    {
        let store = Store::open_existing(&m.store).unwrap();
        store.set_keep_history(THIRTY_DAYS).unwrap();
        let limits = Limits::stored(&store);
        let fs = Fs::new(store, limits).unwrap();
        let notes = fs.mkdir(ME, ROOT_INO, b"notes", 0o755, 0).unwrap();
        // Creates commit without a sync: 1,300 records cost little.
        for i in 0..1_300 {
            let (_, fh) = fs
                .create(
                    ME,
                    notes.ino,
                    format!("n{i}.md").as_bytes(),
                    0o644,
                    0,
                    libc::O_WRONLY,
                )
                .unwrap();
            fs.release(fh).unwrap();
            if i == 600 {
                fs.mark("half").unwrap();
            }
        }
        fs.rename(ME, ROOT_INO, b"notes", ROOT_INO, b"memories", 0)
            .unwrap();
        let memories = fs.lookup(ROOT_INO, b"memories").unwrap();
        let (_, fh) = fs
            .create(ME, memories.ino, b"late.md", 0o644, 0, libc::O_WRONLY)
            .unwrap();
        fs.write(ME, fh, 0, b"late\n").unwrap();
        fs.release(fh).unwrap();
    }
    let forms: &[&[&str]] = &[
        &[],
        &["--json"],
        &["-n", "1150"],
        &["--since", "half"],
        &["--since", "1h", "-n", "1500", "--json"],
        &["/memories/n7.md"],
        &["/memories", "-n", "2000"],
    ];
    let log = |target: &Path, form: &[&str]| -> String {
        let mut args = vec!["log", s(target)];
        args.extend_from_slice(form);
        ok(redbfs(&args))
    };
    let unmounted: Vec<String> = forms.iter().map(|f| log(&m.store, f)).collect();
    assert_eq!(
        unmounted[0].lines().count(),
        1_303,
        "{}",
        &unmounted[0][..200]
    );
    assert_eq!(unmounted[2].lines().count(), 1_150);
    assert!(unmounted[5].contains("rename"), "{}", unmounted[5]);
    assert!(unmounted[5].contains("/notes/n7.md"), "{}", unmounted[5]);
    m.mount();
    for (form, want) in forms.iter().zip(&unmounted) {
        let got = log(&m.mountpoint, form);
        assert!(
            got == *want,
            "log {form:?} through the daemon differs from the file's"
        );
    }

    // A reader that goes away after the first line: the command ends, quietly.
    let mut child = std::process::Command::new(common::redbfs_bin())
        .args(["log", s(&m.mountpoint)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut first,
    )
    .unwrap();
    assert!(first.starts_with("@1303 "), "{first}");
    let out = child.wait_with_output().unwrap();
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A client that asks for the whole log and never reads it.
    let mut sock = m.store.clone().into_os_string();
    sock.push(".sock");
    let mut stalled = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    std::io::Write::write_all(&mut stalled, b"{\"op\":\"log\",\"stream\":true}\n").unwrap();
    std::fs::write(m.path("memories/after.md"), b"written meanwhile").unwrap();
    let newest = log(&m.mountpoint, &["-n", "1"]);
    assert!(newest.contains("/memories/after.md"), "{newest}");
    // Its answer waits for it.
    let mut page = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&stalled), &mut page).unwrap();
    let page: serde_json::Value = serde_json::from_str(&page).unwrap();
    assert_eq!(page["ok"], true, "{page}");
    assert!(page["records"][0]["seq"].as_u64() >= Some(1303), "{page}");
    drop(stalled);
    assert!(ok(redbfs(&["check", s(&m.mountpoint)])).contains("invariants hold"));
}
