//! Operations of several threads sharing one redb transaction and commit (a batch): each
//! keeps its own commit number, log record and history record; the log replays to the same
//! store after a crash; an operation failing inside a batch leaves the others committed
//! exactly once (run again on their own) and itself absent.
//!
//! The batches are made deterministic with the store's test hook `hold_batches(n)`: a batch
//! commits only once it holds `n` operations, its last operation waiting for the next
//! joiner meanwhile.

use std::time::{Duration, Instant};

mod common;

use common::core_fs::{crash_copy, root_files, try_write_file};
use redbfs::fs::{Caller, Error, Fs, Limits};
use redbfs::store::{ROOT_INO, Store};

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

fn open(path: &std::path::Path) -> Fs {
    let store = Store::open_or_create(path, (0, 0)).unwrap();
    store.set_keep_history(3_600_000_000_000).unwrap();
    Fs::new(store, Limits::default()).unwrap()
}

/// The number of the last commit the store took (numbered, maybe not yet committed).
fn numbered(fs: &Fs) -> u64 {
    fs.store().log_state().0
}

/// Waits until the store's commit number reaches `n`: the operations started so far have
/// taken their numbers inside the open batch.
fn wait_numbered(fs: &Fs, n: u64) {
    let start = Instant::now();
    while numbered(fs) < n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "operations never reached commit {n}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn history_ops(fs: &Fs, after: u64) -> Vec<(u64, String, Vec<String>)> {
    let r = fs.store().read().unwrap();
    let last = r.last_seq().unwrap();
    let mut v: Vec<_> = r
        .history(after + 1..=last)
        .unwrap()
        .into_iter()
        .map(|h| (h.seq, h.op, h.paths))
        .collect();
    v.reverse();
    v
}

fn clean(fs: &Fs) {
    let r = fs.store().read().unwrap();
    assert_eq!(redbfs::check::invariants(&r).unwrap(), Vec::<String>::new());
}

/// A crash now: the store file and its log as they are, opened again (the log replayed).
fn crashed(path: &std::path::Path) -> Fs {
    let to = path.with_file_name("crashed.redb");
    crash_copy(path, &to);
    open(&to)
}

#[test]
fn operations_of_several_threads_share_one_redb_commit_each_its_own_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let fs = open(&path);
    // The log starts with the first commit.
    try_write_file(&fs, ME, "first.md", b"first").unwrap();
    let before = fs.store().commit_stats();
    let seq0 = numbered(&fs);
    let hist0 = fs.store().read().unwrap().last_seq().unwrap();
    fs.store().hold_batches(4);
    std::thread::scope(|s| {
        for i in 0..4 {
            let fs = &fs;
            s.spawn(move || fs.mkdir(ME, ROOT_INO, format!("d{i}").as_bytes(), 0o700, 0));
        }
    });
    fs.store().hold_batches(0);
    let after = fs.store().commit_stats();
    assert_eq!(after.commits - before.commits, 4);
    assert_eq!(
        after.redb_commits - before.redb_commits,
        1,
        "four operations, one redb commit"
    );
    // Contiguous numbers, each its own history record.
    assert_eq!(numbered(&fs), seq0 + 4);
    let hist = history_ops(&fs, hist0);
    assert_eq!(hist.len(), 4, "{hist:?}");
    let mut made: Vec<String> = hist
        .iter()
        .map(|(_, op, paths)| {
            assert_eq!(op, "mkdir");
            paths[0].clone()
        })
        .collect();
    made.sort();
    assert_eq!(made, ["/d0", "/d1", "/d2", "/d3"]);
    clean(&fs);

    // Files created, written and fsynced by four threads at once: creates in one batch,
    // fsyncs in another.
    fs.store().hold_batches(4);
    std::thread::scope(|s| {
        for i in 0..4 {
            let fs = &fs;
            s.spawn(move || {
                try_write_file(
                    fs,
                    ME,
                    &format!("n{i}.md"),
                    format!("note {i}\n").as_bytes(),
                )
                .unwrap()
            });
        }
    });
    fs.store().hold_batches(0);
    let last = fs.store().commit_stats();
    assert_eq!(last.commits - after.commits, 8);
    assert_eq!(last.redb_commits - after.redb_commits, 2);
    let want = root_files(&fs, ME);
    for i in 0..4 {
        assert_eq!(
            want[&format!("n{i}.md")],
            format!("note {i}\n").into_bytes()
        );
    }
    clean(&fs);

    // The log replays the batches' records one by one to the same store.
    let recovered = crashed(&path);
    assert_eq!(root_files(&recovered, ME), want);
    assert_eq!(
        recovered.store().read().unwrap().last_seq().unwrap(),
        fs.store().read().unwrap().last_seq().unwrap()
    );
    clean(&recovered);
}

#[test]
fn an_operation_failing_inside_a_batch_leaves_the_others_committed_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let fs = open(&path);
    try_write_file(&fs, ME, "first.md", b"first").unwrap();
    let seq0 = numbered(&fs);
    let hist0 = fs.store().read().unwrap().last_seq().unwrap();
    fs.store().hold_batches(3);
    std::thread::scope(|s| {
        let a = s.spawn(|| fs.mkdir(ME, ROOT_INO, b"a", 0o700, 0).map(drop));
        wait_numbered(&fs, seq0 + 1);
        let b = s.spawn(|| try_write_file(&fs, ME, "b.md", b"bee"));
        wait_numbered(&fs, seq0 + 2);
        // The third joins the batch that holds the other two, and fails.
        let c = s.spawn(|| fs.unlink(ME, ROOT_INO, b"missing.md"));
        let c = c.join().unwrap();
        fs.store().hold_batches(0);
        assert!(matches!(c, Err(Error::NotFound)), "{c:?}");
        a.join().unwrap().unwrap();
        b.join().unwrap().unwrap();
    });
    let got = root_files(&fs, ME);
    assert_eq!(got["a"], b"<dir>");
    assert_eq!(got["b.md"], b"bee");
    // Each operation committed once.
    let hist = history_ops(&fs, hist0);
    let count = |op: &str| hist.iter().filter(|(_, o, _)| o == op).count();
    assert_eq!((count("mkdir"), count("create")), (1, 1), "{hist:?}");
    assert!(
        hist.iter()
            .all(|(_, o, _)| ["mkdir", "create", "write"].contains(&o.as_str()))
    );
    clean(&fs);
    let recovered = crashed(&path);
    assert_eq!(root_files(&recovered, ME), got);
    clean(&recovered);
}

#[test]
fn an_operation_refused_after_writing_inside_a_batch_leaves_the_others_committed_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let fs = open(&path);
    fs.mkdir(ME, ROOT_INO, b"q", 0o700, 0).unwrap();
    // A directory with room for one more entry only.
    fs.set_quota("/q", 0, 1).unwrap();
    let q = fs.lookup(ROOT_INO, b"q").unwrap().ino;
    fs.forget(q, 1);
    let seq0 = numbered(&fs);
    fs.store().hold_batches(3);
    std::thread::scope(|s| {
        let a = s.spawn(|| fs.mkdir(ME, ROOT_INO, b"a", 0o700, 0).map(drop));
        wait_numbered(&fs, seq0 + 1);
        let b = s.spawn(|| fs.mkdir(ME, q, b"one", 0o700, 0).map(drop));
        wait_numbered(&fs, seq0 + 2);
        // Writes its entry, then its commit is refused by the quota the second one filled.
        // The batch is abandoned: the first two run again on their own, and so does the
        // third (what it saw of the second was never committed), so the second and the
        // third race for the last entry, as any two concurrent creates do.
        let c = s.spawn(|| fs.mkdir(ME, q, b"two", 0o700, 0).map(drop));
        let c = c.join().unwrap();
        fs.store().hold_batches(0);
        a.join().unwrap().unwrap();
        let b = b.join().unwrap();
        match (&b, &c) {
            (Ok(()), Err(Error::DirQuota { .. })) | (Err(Error::DirQuota { .. }), Ok(())) => {}
            _ => panic!("one of the two fits: {b:?} {c:?}"),
        }
    });
    let got = root_files(&fs, ME);
    assert!(got.contains_key("a"));
    let fh = fs.opendir(q).unwrap();
    let inside: Vec<String> = fs
        .readdir(fh, 0)
        .unwrap()
        .iter()
        .filter(|e| !redbfs::fs::is_dot(&e.name))
        .map(|e| e.name.clone())
        .collect();
    fs.releasedir(fh).unwrap();
    assert!(inside == ["one"] || inside == ["two"], "{inside:?}");
    assert_eq!(
        numbered(&fs),
        seq0 + 2,
        "the refused operation kept no number"
    );
    clean(&fs);
    let recovered = crashed(&path);
    assert_eq!(root_files(&recovered, ME), got);
    clean(&recovered);
}

#[test]
fn an_fsync_while_the_files_unlink_waits_in_a_batch_returns_only_once_either_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let fs = open(&path);
    let (inode, fh) = fs
        .create(ME, ROOT_INO, b"f.md", 0o600, 0, libc::O_WRONLY)
        .unwrap();
    fs.fsync(fh).unwrap();
    fs.write(ME, fh, 0, b"data").unwrap();
    let seq0 = numbered(&fs);
    fs.store().hold_batches(2);
    let durable = std::thread::scope(|s| {
        // The unlink stages the file's removal and waits, in its batch, for a second
        // operation.
        let unlink = s.spawn(|| fs.unlink(ME, ROOT_INO, b"f.md"));
        wait_numbered(&fs, seq0 + 1);
        // The fsync may neither trust the removal (its batch can still fail) nor write into
        // it: it returns once its content or the removal is durable.
        let synced = fs.fsync(fh);
        let durable = root_files(&crashed(&path), ME);
        fs.store().hold_batches(0);
        unlink.join().unwrap().unwrap();
        synced.unwrap();
        durable
    });
    match durable.get("f.md") {
        None => {}
        Some(data) => assert_eq!(
            data, b"data",
            "fsync returned before its content was durable"
        ),
    }
    fs.release(fh).unwrap();
    fs.forget(inode.ino, 1);
    assert!(!root_files(&fs, ME).contains_key("f.md"));
    clean(&fs);
}

/// Child processes that end with the test, whether it passes or fails.
struct Sleepers(Vec<std::process::Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_rename_run_again_after_its_batch_failed_counts_its_lost_update_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let fs = open(&path);
    // Two processes of their own: the tracker tells processes by pid and start time.
    let children = Sleepers(
        (0..2)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("600")
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let who = |i: usize| Caller {
        uid: 0,
        gid: 0,
        pid: children.0[i].id(),
    };
    let (a, b) = (who(0), who(1));
    try_write_file(&fs, ME, "t.md", b"v1").unwrap();
    let t = fs.lookup(ROOT_INO, b"t.md").unwrap().ino;
    // A reads t.md, then B rewrites it, then A replaces it with its own edit: B's is lost.
    let fh = fs
        .open(a, t, redbfs::fs::OpenMode::from_flags(libc::O_RDONLY))
        .unwrap();
    assert_eq!(fs.read(fh, 0, 100).unwrap(), b"v1");
    fs.release(fh).unwrap();
    let fh = fs
        .open(b, t, redbfs::fs::OpenMode::from_flags(libc::O_WRONLY))
        .unwrap();
    fs.write(b, fh, 0, b"v2").unwrap();
    fs.fsync(fh).unwrap();
    fs.release(fh).unwrap();
    fs.forget(t, 1);
    try_write_file(&fs, a, ".tmp-a", b"v3").unwrap();
    let seq0 = numbered(&fs);
    let hist0 = fs.store().read().unwrap().last_seq().unwrap();
    fs.store().hold_batches(3);
    std::thread::scope(|s| {
        let first = s.spawn(|| fs.mkdir(ME, ROOT_INO, b"d", 0o700, 0).map(drop));
        wait_numbered(&fs, seq0 + 1);
        let rename = s.spawn(|| fs.rename(a, ROOT_INO, b".tmp-a", ROOT_INO, b"t.md", 0));
        wait_numbered(&fs, seq0 + 2);
        // The third fails: the batch is abandoned and the rename runs again on its own.
        let third = fs.unlink(ME, ROOT_INO, b"missing.md");
        fs.store().hold_batches(0);
        assert!(matches!(third, Err(Error::NotFound)), "{third:?}");
        first.join().unwrap().unwrap();
        rename.join().unwrap().unwrap();
    });
    drop(children);
    assert_eq!(root_files(&fs, ME)["t.md"], b"v3");
    assert_eq!(fs.conflicts(), 1, "one lost update, counted once");
    let r = fs.store().read().unwrap();
    let noted: Vec<_> = r
        .history(hist0 + 1..=r.last_seq().unwrap())
        .unwrap()
        .into_iter()
        .filter(|h| h.conflict.is_some())
        .map(|h| h.op)
        .collect();
    assert_eq!(noted, ["rename"]);
    clean(&fs);
}

/// `commit_stats` counts the time redb's one write transaction is held, from its begin to
/// its commit or its abort, a batch's from its first operation to its commit: a write held
/// open while this thread sleeps counts at least the sleep, committed or dropped.
#[test]
fn the_write_transaction_counts_the_time_it_is_held_committed_or_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let fs = open(&path);
    try_write_file(&fs, ME, "first.md", b"first").unwrap();
    let hold = Duration::from_millis(30);
    let busy = |fs: &Fs| fs.store().commit_stats().writer_busy_ns;

    let before = busy(&fs);
    let w = fs.store().write().unwrap();
    std::thread::sleep(hold);
    w.commit(redbfs::store::Sync::Durable).unwrap();
    let committed = busy(&fs) - before;
    assert!(committed >= hold.as_nanos() as u64, "{committed} ns");

    let before = busy(&fs);
    let w = fs.store().write().unwrap();
    std::thread::sleep(hold);
    drop(w);
    let dropped = busy(&fs) - before;
    assert!(dropped >= hold.as_nanos() as u64, "{dropped} ns");

    // A batch: held from its first operation until the last one joins and commits.
    let before = busy(&fs);
    fs.store().hold_batches(2);
    let n0 = numbered(&fs);
    std::thread::scope(|s| {
        let fs = &fs;
        s.spawn(move || fs.mkdir(ME, ROOT_INO, b"a", 0o700, 0).unwrap());
        // The first operation is in the batch, which holds the transaction for the second.
        wait_numbered(fs, n0 + 1);
        std::thread::sleep(hold);
        s.spawn(move || fs.mkdir(ME, ROOT_INO, b"b", 0o700, 0).unwrap());
    });
    fs.store().hold_batches(0);
    let batched = busy(&fs) - before;
    assert!(batched >= hold.as_nanos() as u64, "{batched} ns");
    let stats = fs.store().commit_stats();
    assert!(stats.writer_busy_ns <= stats.open_ns);
}
