//! The SDK's edit of a memory (a temporary file created, written, fsynced, then renamed over
//! the memory) made three history records: the temporary file's create, its write and the
//! rename, each with a header, undo entries and index entries, and the rename's record kept
//! the temporary file's content once more as its before-image. A 100-byte memory cost about
//! 2.3 KB of store per edit, a 1,500-byte one 5.8 KB. The rename's record now folds in the
//! create and write of its source when the same process made them just before: one record
//! per edit, each key's first before-image once. These tests hold every version to its
//! exact bytes through `show --at`, revert and rollback, the bytes per edit to a bound, the
//! cases that must not fold, and `check` to what a folded record must be.

use redbfs::fs::{Caller, Fs, Limits};
use redbfs::store::schema::{HistoryRecord, Undo};
use redbfs::store::{ROOT_INO, Store, Sync};

mod common;

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 1,
};
const OTHER: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 2,
};
const THIRTY_DAYS: u64 = 30 * 86_400 * 1_000_000_000;

fn open(path: &std::path::Path) -> Fs {
    let store = Store::open_or_create(path, (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    Fs::new(store, Limits::default()).unwrap()
}

/// A memory of `size` bytes of text whose version `v` differs from the others in 8 bytes.
fn version(size: usize, v: usize) -> Vec<u8> {
    let mut out: Vec<u8> = (0..size)
        .map(|i| b"- the user prefers short answers\n"[i % 33])
        .collect();
    let at = size / 2 - 4;
    out[at..at + 8].copy_from_slice(format!("{v:08}").as_bytes());
    out
}

fn write(fs: &Fs, who: Caller, name: &str, data: &[u8]) -> u64 {
    common::core_fs::write_file(fs, who, ROOT_INO, name, 0o644, data, true)
}

/// What the SDK's memory tool does: a temporary file, fsynced, renamed over the memory.
fn sdk_edit(fs: &Fs, name: &str, data: &[u8], i: usize) {
    let tmp = format!(".tmp-4242-{i}");
    write(fs, ME, &tmp, data);
    fs.rename(ME, ROOT_INO, tmp.as_bytes(), ROOT_INO, name.as_bytes(), 0)
        .unwrap();
}

fn read(fs: &Fs, name: &str) -> Vec<u8> {
    let r = fs.store().read().unwrap();
    let (ino, _) = r.lookup(ROOT_INO, name).unwrap().unwrap();
    let size = r.inode(ino).unwrap().unwrap().size;
    let chunks = r
        .chunks(ino, 0, size.div_ceil(redbfs::store::CHUNK_SIZE))
        .unwrap();
    chunks.into_iter().flatten().flatten().collect()
}

fn show(fs: &Fs, path: &str, seq: u64) -> Vec<u8> {
    redbfs::tools::show_at(&fs.store().read().unwrap(), path, seq).unwrap()
}

/// Every record, newest first, with its undo entries.
fn records(fs: &Fs) -> Vec<HistoryRecord> {
    let r = fs.store().read().unwrap();
    r.history_of(None, None, usize::MAX).unwrap()
}

fn last_seq(fs: &Fs) -> u64 {
    fs.store().read().unwrap().last_seq().unwrap()
}

fn assert_checks(fs: &Fs) {
    let r = fs.store().read().unwrap();
    assert_eq!(redbfs::check::invariants(&r).unwrap(), Vec::<String>::new());
}

fn one_record_per_edit(size: usize) {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    write(&fs, ME, "mem.md", &version(size, 0));
    let mut versions = vec![(last_seq(&fs), version(size, 0))];
    for v in 1..=20 {
        let before = records(&fs).len();
        sdk_edit(&fs, "mem.md", &version(size, v), v);
        let all = records(&fs);
        assert_eq!(all.len(), before + 1, "one record for edit {v}");
        let r = &all[0];
        assert_eq!(r.op, "rename");
        assert_eq!(r.folded, ["create", "write"]);
        assert_eq!(r.paths, [format!("/.tmp-4242-{v}"), "/mem.md".to_string()]);
        // The temporary file's keys are not undone one by one: it did not exist before.
        let tmp_entries = r
            .undo
            .iter()
            .filter(|u| matches!(u, Undo::Inode { ino, .. } if *ino == r.ino))
            .count();
        assert_eq!(tmp_entries, 1, "{:?}", r.undo);
        versions.push((last_seq(&fs), version(size, v)));
    }
    assert_checks(&fs);
    for (seq, want) in &versions {
        assert!(show(&fs, "/mem.md", *seq) == *want, "@{seq} reads back");
    }
    // The point before an edit has no temporary file.
    let r = fs.store().read().unwrap();
    let past = r.past(versions[5].0).unwrap();
    use redbfs::store::TreeView;
    assert_eq!(past.lookup(ROOT_INO, ".tmp-4242-6").unwrap(), None);
    assert!(past.lookup(ROOT_INO, ".tmp-4242-5").unwrap().is_none());
    drop(r);

    let (seq, want) = &versions[3];
    fs.revert(ME, "/mem.md", *seq).unwrap();
    assert!(
        read(&fs, "mem.md") == *want,
        "revert restores the exact bytes"
    );
    let (seq, want) = &versions[10];
    let latest = last_seq(&fs);
    fs.rollback(ME, *seq).unwrap();
    assert!(
        read(&fs, "mem.md") == *want,
        "rollback restores the exact bytes"
    );
    assert_eq!(
        fs.store()
            .read()
            .unwrap()
            .list(ROOT_INO)
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>(),
        ["mem.md"]
    );
    fs.rollback(ME, latest).unwrap();
    assert!(read(&fs, "mem.md") == versions[3].1, "and forward again");
    assert_checks(&fs);
}

#[test]
fn an_sdk_edit_of_a_small_memory_is_one_record_read_back_exactly() {
    one_record_per_edit(100);
}

#[test]
fn an_sdk_edit_of_a_memory_near_the_inline_limit_is_one_record_read_back_exactly() {
    one_record_per_edit(1500);
}

#[test]
fn an_sdk_edit_of_a_large_memory_is_one_record_read_back_exactly() {
    one_record_per_edit(20_000);
}

/// Store bytes per SDK edit, compacted: the difference between 220 and 20 edits.
fn bytes_per_edit(size: usize) -> u64 {
    let file = |edits: usize| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        {
            let fs = open(&path);
            write(&fs, ME, "mem.md", &version(size, 0));
            for v in 1..=edits {
                sdk_edit(&fs, "mem.md", &version(size, v), v);
            }
        }
        let mut s = Store::open_existing(&path).unwrap();
        s.compact().unwrap();
        drop(s);
        std::fs::metadata(&path).unwrap().len()
    };
    (file(220) - file(20)) / 200
}

/// 2,273 / 5,816 / 2,376 bytes per edit of a 100 / 1,500 / 20,000-byte memory before; 737
/// / 2,273 / 634 as measured with one record per edit, kept in one value with varints,
/// indexed by reference. The 1,500-byte memory's earlier version is kept whole.
#[test]
fn bytes_per_sdk_edit_are_bounded() {
    for (size, bound) in [(100, 850), (1500, 2_500), (20_000, 750)] {
        let got = bytes_per_edit(size);
        assert!(got <= bound, "{got} bytes per edit of {size} bytes");
    }
}

/// A record of another process between the write and the rename, a mark among the records,
/// or a rename by another process: the records stay as they are, and each point reads as
/// it did.
#[test]
fn what_must_not_fold_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    write(&fs, ME, "mem.md", b"first");

    write(&fs, ME, ".tmp-a", b"second");
    write(&fs, OTHER, "other.md", b"other");
    let between = last_seq(&fs);
    fs.rename(ME, ROOT_INO, b".tmp-a", ROOT_INO, b"mem.md", 0)
        .unwrap();
    assert!(records(&fs)[0].folded.is_empty());
    assert_eq!(show(&fs, "/.tmp-a", between), b"second");

    write(&fs, ME, ".tmp-b", b"third");
    let marked = fs.mark("before-rename").unwrap();
    fs.rename(ME, ROOT_INO, b".tmp-b", ROOT_INO, b"mem.md", 0)
        .unwrap();
    assert!(records(&fs)[0].folded.is_empty());
    assert_eq!(show(&fs, "/.tmp-b", marked), b"third");

    write(&fs, ME, ".tmp-c", b"fourth");
    let written = last_seq(&fs);
    fs.rename(OTHER, ROOT_INO, b".tmp-c", ROOT_INO, b"mem.md", 0)
        .unwrap();
    assert!(records(&fs)[0].folded.is_empty());
    assert_eq!(show(&fs, "/.tmp-c", written), b"fourth");

    // A rename of a file made earlier by this process, not just now: no create to fold.
    fs.rename(ME, ROOT_INO, b"other.md", ROOT_INO, b"moved.md", 0)
        .unwrap();
    assert!(records(&fs)[0].folded.is_empty());
    assert_eq!(read(&fs, "mem.md"), b"fourth");
    assert_checks(&fs);
}

/// A file created, written and fsynced by one process is one record, the create's, which
/// undoes it all: the point before has no file, rollback to it removes the file, and
/// rollback to the point after brings its bytes back. `check` accepts such a create and
/// refuses one folding anything but a write.
#[test]
fn a_create_takes_in_its_first_write_and_undoes_it() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    write(&fs, ME, "old.md", b"older");
    let before = last_seq(&fs);
    let data = version(3000, 1);
    write(&fs, ME, "mem.md", &data);
    let all = records(&fs);
    assert_eq!(all[0].seq, before + 1, "one record");
    assert_eq!(all[0].op, "create");
    assert_eq!(all[0].folded, ["write"]);
    assert_eq!(all[0].size_after, data.len() as u64);
    let after = last_seq(&fs);
    assert_eq!(after, before + 1);
    assert!(show(&fs, "/mem.md", after) == data);
    let r = fs.store().read().unwrap();
    let past = r.past(before).unwrap();
    use redbfs::store::TreeView;
    assert_eq!(past.lookup(ROOT_INO, "mem.md").unwrap(), None);
    drop(r);
    assert_checks(&fs);
    // A second write of the file is a version of its own.
    in_place(&fs, "mem.md", &version(3000, 2));
    assert_eq!(records(&fs)[0].op, "write");
    assert!(show(&fs, "/mem.md", after) == data);
    let latest = last_seq(&fs);
    fs.rollback(ME, before).unwrap();
    assert!(fs.lookup(ROOT_INO, b"mem.md").is_err(), "rolled back");
    assert_eq!(read(&fs, "old.md"), b"older");
    assert_checks(&fs);
    fs.rollback(ME, after).unwrap();
    assert!(read(&fs, "mem.md") == data, "and forward again");
    fs.rollback(ME, latest).unwrap();
    assert!(read(&fs, "mem.md") == version(3000, 2));
    assert_checks(&fs);

    let good = records(&fs)
        .into_iter()
        .find(|r| r.op == "create" && !r.folded.is_empty())
        .unwrap();
    let mut w = fs.store().write().unwrap();
    w.without_history();
    let mut bad = good.clone();
    bad.folded = vec!["chmod".into()];
    w.put_record(&bad).unwrap();
    w.commit(Sync::Durable).unwrap();
    let r = fs.store().read().unwrap();
    let found = redbfs::check::invariants(&r).unwrap();
    assert!(
        found.iter().any(|f| f.contains("only a rename folds")),
        "{found:?}"
    );
}

/// A live thread, its tid, and a way to end it.
struct Thread {
    tid: u32,
    done: std::sync::mpsc::Sender<()>,
    handle: std::thread::JoinHandle<()>,
}

impl Thread {
    fn spawn() -> Thread {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let handle = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            wait.recv().ok();
        });
        let tid = rx.recv().unwrap();
        Thread { tid, done, handle }
    }

    fn caller(&self) -> Caller {
        Caller {
            uid: 0,
            gid: 0,
            pid: self.tid,
        }
    }

    fn end(self) {
        self.done.send(()).unwrap();
        self.handle.join().unwrap();
    }
}

/// Long enough for a thread's start time (in clock ticks, 10 ms each) to fall a whole tick
/// before what follows.
fn a_few_ticks() {
    std::thread::sleep(std::time::Duration::from_millis(50));
}

/// The newest record, made by `tid` as far as it says (the case of a tid whose thread
/// exited and was handed to a thread of another process).
fn say_made_by(fs: &Fs, tid: u32) {
    let mut r = records(fs).remove(0);
    r.pid = tid;
    let mut w = fs.store().write().unwrap();
    w.without_history();
    w.put_record(&r).unwrap();
    w.commit(Sync::Durable).unwrap();
}

/// A tid comes back: a record names the thread that made it by tid alone, and a thread of
/// another process may hold that tid by the time of the next operation. A thread that holds
/// the record's tid but started after the record was made did not make it: its write does not
/// fold into the create, nor its rename take in the create and write. The same thread, running
/// since before the records, folds both.
#[test]
fn a_thread_that_started_after_a_record_did_not_make_it() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    write(&fs, ME, "mem.md", b"first");

    // Running since before: the create takes in its write, the rename both.
    let early = Thread::spawn();
    a_few_ticks();
    let before = records(&fs).len();
    write(&fs, early.caller(), ".tmp-a", b"second");
    assert_eq!(records(&fs)[0].folded, ["write"]);
    fs.rename(early.caller(), ROOT_INO, b".tmp-a", ROOT_INO, b"mem.md", 0)
        .unwrap();
    let all = records(&fs);
    assert_eq!(all.len(), before + 1);
    assert_eq!(all[0].folded, ["create", "write"]);
    early.end();

    // A create said to be made by a tid that a thread started since holds: its write keeps a
    // record of its own.
    let (inode, fh) = fs
        .create(ME, ROOT_INO, b".tmp-b", 0o644, 0, libc::O_WRONLY)
        .unwrap();
    a_few_ticks();
    let late = Thread::spawn();
    say_made_by(&fs, late.tid);
    let before = records(&fs).len();
    fs.write(late.caller(), fh, 0, b"third").unwrap();
    fs.fsync(fh).unwrap();
    fs.release(fh).unwrap();
    fs.forget(inode.ino, 1);
    let all = records(&fs);
    assert_eq!(
        all.len(),
        before + 1,
        "two records: the create and the write"
    );
    assert_eq!(
        (all[0].op.as_str(), all[1].op.as_str()),
        ("write", "create")
    );
    assert!(all[0].folded.is_empty() && all[1].folded.is_empty());
    late.end();

    // Create and write said to be made by a tid that a thread started since holds: its
    // rename keeps them apart.
    write(&fs, ME, ".tmp-c", b"fourth");
    a_few_ticks();
    let late = Thread::spawn();
    say_made_by(&fs, late.tid);
    let written = last_seq(&fs);
    let before = records(&fs).len();
    fs.rename(late.caller(), ROOT_INO, b".tmp-c", ROOT_INO, b"mem.md", 0)
        .unwrap();
    let all = records(&fs);
    assert_eq!(all.len(), before + 1);
    assert_eq!(all[0].op, "rename");
    assert!(all[0].folded.is_empty(), "{:?}", all[0].folded);
    assert_eq!(show(&fs, "/.tmp-c", written), b"fourth");
    assert_eq!(read(&fs, "mem.md"), b"fourth");
    late.end();
}

/// `check` holds a folded record to what folding makes: a rename whose source's creation
/// it undoes, each key once.
#[test]
fn check_finds_a_folded_record_that_folding_cannot_make() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    write(&fs, ME, "mem.md", b"first");
    sdk_edit(&fs, "mem.md", b"second", 1);
    assert_checks(&fs);
    let good = records(&fs).remove(0);
    let damage = |r: &HistoryRecord| {
        let mut w = fs.store().write().unwrap();
        w.without_history();
        w.put_record(r).unwrap();
        w.commit(Sync::Durable).unwrap();
        let r = fs.store().read().unwrap();
        redbfs::check::invariants(&r).unwrap()
    };
    let mut twice = good.clone();
    twice.undo.push(twice.undo[0].clone());
    let found = damage(&twice);
    assert!(
        found.iter().any(|f| f.contains("two entries for one key")),
        "{found:?}"
    );
    let mut kept = good.clone();
    kept.undo
        .retain(|u| !matches!(u, Undo::Inode { ino, old: None } if *ino == good.ino));
    let found = damage(&kept);
    assert!(
        found.iter().any(|f| f.contains("does not undo it")),
        "{found:?}"
    );
    let mut op = good.clone();
    op.op = "write".into();
    let found = damage(&op);
    assert!(
        found.iter().any(|f| f.contains("only a rename folds")),
        "{found:?}"
    );
    damage(&good);
    assert_checks(&fs);
}

/// Every record whose undo holds an image of `ino` without its content (kept as the
/// inode's after the record).
fn kept_images(fs: &Fs, ino: u64) -> usize {
    records(fs)
        .iter()
        .flat_map(|r| &r.undo)
        .filter(|u| {
            matches!(u, Undo::Inode { ino: i, old: Some(b) }
                if *i == ino && redbfs::store::content_kept(b))
        })
        .count()
}

/// A rename and a change of mode leave a small memory's content as it was: their records
/// keep the inode's other fields and the content's checksum, not the content again. Each
/// point still reads its exact bytes, rollback before them restores them exactly, and
/// redacting the version they kept erases it in every point that held it.
#[test]
fn a_rename_or_a_chmod_keeps_no_second_copy_of_a_small_memory() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    let first = version(1500, 1);
    let ino = write(&fs, ME, "a.md", &first);
    // A mark keeps the create and write apart from the rename (nothing is folded).
    let written = fs.mark("written").unwrap();
    fs.rename(ME, ROOT_INO, b"a.md", ROOT_INO, b"b.md", 0)
        .unwrap();
    let renamed = last_seq(&fs);
    let attr = redbfs::fs::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    fs.setattr(ME, ino, attr).unwrap();
    let chmodded = last_seq(&fs);
    let second = version(1500, 2);
    let fh = fs
        .open(
            ME,
            ino,
            redbfs::fs::OpenMode {
                write: true,
                ..Default::default()
            },
        )
        .unwrap();
    fs.write(ME, fh, 0, &second).unwrap();
    fs.fsync(fh).unwrap();
    fs.release(fh).unwrap();
    assert_eq!(
        kept_images(&fs, ino),
        3,
        "the rename's and the chmod's (no change), the write's (a delta)"
    );
    assert_checks(&fs);
    assert_eq!(show(&fs, "/a.md", written), first);
    assert_eq!(show(&fs, "/b.md", renamed), first);
    assert_eq!(show(&fs, "/b.md", chmodded), first);
    assert_eq!(read(&fs, "b.md"), second);
    {
        let r = fs.store().read().unwrap();
        let past = r.past(renamed).unwrap();
        use redbfs::store::TreeView;
        assert_eq!(past.inode(ino).unwrap().unwrap().perm & 0o777, 0o644);
    }

    fs.rollback(ME, written).unwrap();
    assert_eq!(
        read(&fs, "a.md"),
        first,
        "rollback restores the exact bytes"
    );
    let r = fs.store().read().unwrap();
    assert_eq!(r.inode(ino).unwrap().unwrap().perm & 0o777, 0o644);
    drop(r);
    fs.rollback(ME, chmodded).unwrap();
    assert_eq!(read(&fs, "b.md"), first);
    assert_checks(&fs);

    // Redacting the version seen at the chmod erases it at every point that kept it.
    let latest = last_seq(&fs);
    fs.rollback(ME, latest - 1).unwrap();
    fs.redact("/b.md", Some(chmodded)).unwrap();
    for seq in [renamed, chmodded] {
        let r = fs.store().read().unwrap();
        let err = redbfs::tools::show_at(&r, "/b.md", seq).unwrap_err();
        assert!(err.contains("redacted"), "@{seq}: {err}");
    }
    assert_checks(&fs);
}

/// Through FUSE the kernel still holds the memory an SDK edit renames over, so the rename
/// leaves it an orphan and its content goes at its last forget, in a reclaim record of its
/// own. The rename's record keeps the orphan's fields only; the reclaim's keeps its content.
#[test]
fn a_memory_the_kernel_holds_when_replaced_keeps_its_content_once() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    let size = 1500;
    write(&fs, ME, "mem.md", &version(size, 0));
    let mut versions = vec![(last_seq(&fs), version(size, 0))];
    let mut held = Vec::new();
    for v in 1..=5 {
        let ino = fs.lookup(ROOT_INO, b"mem.md").unwrap().ino;
        held.push(ino);
        sdk_edit(&fs, "mem.md", &version(size, v), v);
        assert_eq!(records(&fs)[0].folded, ["create", "write"]);
        assert_eq!(kept_images(&fs, ino), 1, "the rename's image of the orphan");
        versions.push((last_seq(&fs), version(size, v)));
    }
    for ino in held {
        fs.forget(ino, 2);
    }
    fs.reclaim_queued();
    assert_eq!(records(&fs)[0].op, "reclaim");
    for (seq, want) in &versions {
        assert!(show(&fs, "/mem.md", *seq) == *want, "@{seq} reads back");
    }
    assert_checks(&fs);
    fs.rollback(ME, versions[2].0).unwrap();
    assert!(read(&fs, "mem.md") == versions[2].1);
    assert_checks(&fs);
}

/// `check` reads back every before-image kept without its content: one whose checksum the
/// version after its record does not match is found.
#[test]
fn check_finds_a_kept_content_that_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    let ino = write(&fs, ME, "a.md", &version(100, 1));
    fs.mark("written").unwrap();
    fs.rename(ME, ROOT_INO, b"a.md", ROOT_INO, b"b.md", 0)
        .unwrap();
    sdk_edit(&fs, "b.md", &version(100, 2), 1);
    assert_checks(&fs);
    let mut rename = records(&fs)
        .into_iter()
        .find(|r| r.paths == ["/a.md", "/b.md"])
        .unwrap();
    for u in &mut rename.undo {
        if let Undo::Inode {
            ino: i,
            old: Some(b),
        } = u
            && *i == ino
        {
            assert!(redbfs::store::content_kept(b));
            let n = b.len();
            b[n - 1] ^= 0xff;
        }
    }
    let mut w = fs.store().write().unwrap();
    w.without_history();
    w.put_record(&rename).unwrap();
    w.commit(Sync::Durable).unwrap();
    let r = fs.store().read().unwrap();
    let found = redbfs::check::invariants(&r).unwrap();
    let seq = rename.seq;
    assert!(
        found.contains(&format!(
            "history record {seq} keeps inode {ino}'s content as the version after it, which does not match its checksum"
        )),
        "{found:?}"
    );
}

/// An edit's record is held in one value, and history's key index refers to it (empty
/// values) rather than copying each before-image: `show`, `revert` and `check` read the
/// record. An entry by reference for a key its record does not hold is found.
#[test]
fn the_key_index_refers_to_an_edit_s_record() {
    use redb::{ReadableDatabase, ReadableTable};
    const KEYS: redb::TableDefinition<(&[u8], u64), &[u8]> =
        redb::TableDefinition::new("history_keys");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let mut versions = Vec::new();
    {
        let fs = open(&path);
        write(&fs, ME, "mem.md", &version(100, 0));
        versions.push((last_seq(&fs), version(100, 0)));
        for v in 1..=5 {
            sdk_edit(&fs, "mem.md", &version(100, v), v);
            versions.push((last_seq(&fs), version(100, v)));
        }
        assert_checks(&fs);
    }
    let last = versions.last().unwrap().0;
    {
        let db = redb::Database::open(&path).unwrap();
        let r = db.begin_read().unwrap();
        let keys = r.open_table(KEYS).unwrap();
        let mut n = 0;
        for item in keys.iter().unwrap() {
            let (k, v) = item.unwrap();
            if k.value().1 > versions[0].0 {
                assert!(v.value().is_empty(), "{:?}", k.value());
                n += 1;
            }
        }
        assert!(n >= 15, "{n} entries for 5 edits");
        drop(keys);
        drop(r);
        let w = db.begin_write().unwrap();
        w.open_table(KEYS)
            .unwrap()
            .insert((undo_key_of_inode(999).as_slice(), last), b"".as_slice())
            .unwrap();
        w.commit().unwrap();
    }
    let fs = open(&path);
    for (seq, want) in &versions {
        assert!(show(&fs, "/mem.md", *seq) == *want, "@{seq} reads back");
    }
    let r = fs.store().read().unwrap();
    let found = redbfs::check::invariants(&r).unwrap();
    assert!(
        found.iter().any(|f| f.starts_with("history_keys holds ")),
        "{found:?}"
    );
}

/// `history_keys`' key of inode `ino`'s record (see `store::schema`).
fn undo_key_of_inode(ino: u64) -> Vec<u8> {
    let mut k = vec![1];
    k.extend_from_slice(&ino.to_be_bytes());
    k
}

/// Rewrites `name`'s content in place (same size: no truncate needed), fsynced.
fn in_place(fs: &Fs, name: &str, data: &[u8]) {
    let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
    let fh = fs
        .open(
            ME,
            ino,
            redbfs::fs::OpenMode {
                write: true,
                ..Default::default()
            },
        )
        .unwrap();
    fs.write(ME, fh, 0, data).unwrap();
    fs.fsync(fh).unwrap();
    fs.release(fh).unwrap();
    fs.forget(ino, 1);
}

/// Every inode before-image of every record: (whether it is kept as another version, its
/// run, its length).
fn images(fs: &Fs) -> Vec<(bool, Option<u8>, usize)> {
    use redbfs::store::schema::image_run;
    records(fs)
        .iter()
        .flat_map(|r| &r.undo)
        .filter_map(|u| match u {
            Undo::Inode { old: Some(b), .. } if redbfs::store::inline_part(b).is_some() => {
                Some((redbfs::store::content_kept(b), image_run(b), b.len()))
            }
            _ => None,
        })
        .collect()
}

/// The runs of delta images: each at most `MAX_IMAGE_RUN`, the longest reaching it, and a
/// whole image at least every `MAX_IMAGE_RUN + 1` images.
fn assert_runs_bounded(fs: &Fs, edits: usize) {
    use redbfs::store::schema::MAX_IMAGE_RUN;
    let all = images(fs);
    let runs: Vec<u8> = all.iter().filter(|i| i.0).map(|i| i.1.unwrap()).collect();
    assert!(
        runs.iter().all(|&n| (1..=MAX_IMAGE_RUN).contains(&n)),
        "{runs:?}"
    );
    assert_eq!(runs.iter().max(), Some(&MAX_IMAGE_RUN), "{runs:?}");
    let whole = all.iter().filter(|i| !i.0).count();
    assert!(
        whole >= edits / (MAX_IMAGE_RUN as usize + 1),
        "{whole} whole images of {edits}"
    );
    assert!(
        whole <= edits.div_ceil(MAX_IMAGE_RUN as usize) + 1,
        "{whole}"
    );
}

/// A small memory's earlier versions are kept as deltas against the next version (the same
/// inode's after an edit in place, the file's now at its name after an SDK edit), in runs of
/// at most `MAX_IMAGE_RUN`: every version reads back exactly through its run, after the
/// store is opened again and after the oldest records expire, and rollback to the oldest
/// point left restores its bytes.
#[test]
fn small_versions_read_back_through_bounded_runs_of_deltas() {
    use redbfs::store::schema::MAX_IMAGE_RUN;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let size = 1500;
    let fs = open(&path);
    write(&fs, ME, "mem.md", &version(size, 0));
    let mut versions = vec![(last_seq(&fs), version(size, 0))];
    let edits = 3 * MAX_IMAGE_RUN as usize;
    let edit = |fs: &Fs, v: usize| {
        if v.is_multiple_of(4) {
            in_place(fs, "mem.md", &version(size, v));
        } else {
            sdk_edit(fs, "mem.md", &version(size, v), v);
        }
    };
    for v in 1..=edits {
        edit(&fs, v);
        versions.push((last_seq(&fs), version(size, v)));
    }
    assert_runs_bounded(&fs, edits);
    // A delta holds what changed, not the memory.
    let deltas: Vec<usize> = images(&fs).iter().filter(|i| i.0).map(|i| i.2).collect();
    assert!(deltas.iter().all(|&n| n < 120), "{deltas:?}");
    for (seq, want) in &versions {
        assert!(show(&fs, "/mem.md", *seq) == *want, "@{seq} reads back");
    }
    assert_checks(&fs);

    // Opened again: the same.
    drop(fs);
    let fs = open(&path);
    for (seq, want) in &versions {
        assert!(
            show(&fs, "/mem.md", *seq) == *want,
            "@{seq} reads back after reopen"
        );
    }

    // The oldest records expire; the rest read back, and check finds nothing.
    let old = versions.len() / 2;
    fs.store().set_keep_history(1_000_000_000).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    // Each commit drops a bounded batch of what expired.
    let mut v = edits;
    while fs.store().read().unwrap().first_seq().unwrap().unwrap() <= versions[old].0 {
        v += 1;
        assert!(v < edits + 200, "expiry drops the oldest records");
        edit(&fs, v);
        versions.push((last_seq(&fs), version(size, v)));
    }
    fs.store().set_keep_history(THIRTY_DAYS).unwrap();
    for v in v + 1..=v + 10 {
        edit(&fs, v);
        versions.push((last_seq(&fs), version(size, v)));
    }
    let first = fs.store().read().unwrap().first_seq().unwrap().unwrap();
    let kept: Vec<_> = versions.iter().filter(|(s, _)| *s + 1 >= first).collect();
    assert!(kept.len() >= 10, "{}", kept.len());
    for (seq, want) in &kept {
        assert!(
            show(&fs, "/mem.md", *seq) == *want,
            "@{seq} reads back after expiry"
        );
    }
    assert_checks(&fs);
    let (seq, want) = kept[0];
    fs.rollback(ME, *seq).unwrap();
    assert!(read(&fs, "mem.md") == *want, "rollback to @{seq}");
    assert_checks(&fs);
    for (seq, want) in &kept {
        assert!(
            show(&fs, "/mem.md", *seq) == *want,
            "@{seq} after the rollback"
        );
    }
}

/// A chmod or a rename keeps a small memory's content as the version after it: an empty
/// delta, whose run counts like any other. A long series of them is capped (a whole image
/// at least every `MAX_IMAGE_RUN + 1`), and the version before it reads back, after the
/// store is opened again too, and comes back whole by rollback.
#[test]
fn a_run_of_unchanged_contents_is_capped_and_resolves() {
    use redbfs::store::schema::MAX_IMAGE_RUN;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let fs = open(&path);
    let first = version(1500, 1);
    let ino = write(&fs, ME, "a.md", &first);
    let written = fs.mark("written").unwrap();
    let edits = 2 * MAX_IMAGE_RUN as usize + 10;
    let mut points = Vec::new();
    for i in 0..edits {
        if i.is_multiple_of(2) {
            let attr = redbfs::fs::SetAttr {
                mode: Some(if i.is_multiple_of(4) { 0o600 } else { 0o644 }),
                ..Default::default()
            };
            fs.setattr(ME, ino, attr).unwrap();
        } else {
            let (from, to) = if i % 4 == 1 {
                ("a.md", "b.md")
            } else {
                ("b.md", "a.md")
            };
            fs.rename(ME, ROOT_INO, from.as_bytes(), ROOT_INO, to.as_bytes(), 0)
                .unwrap();
        }
        points.push(last_seq(&fs));
    }
    let name = if fs.lookup(ROOT_INO, b"a.md").is_ok() {
        "a.md"
    } else {
        "b.md"
    };
    in_place(&fs, name, &version(1500, 2));
    assert_runs_bounded(&fs, edits + 1);
    assert_checks(&fs);
    drop(fs);
    let fs = open(&path);
    assert_eq!(show(&fs, "/a.md", written), first);
    for seq in points {
        // The memory is at one of the two names.
        let r = fs.store().read().unwrap();
        let got = redbfs::tools::show_at(&r, "/a.md", seq)
            .or_else(|_| redbfs::tools::show_at(&r, "/b.md", seq))
            .unwrap();
        assert!(got == first, "@{seq}");
    }
    fs.rollback(ME, written).unwrap();
    assert_eq!(read(&fs, "a.md"), first);
    assert_checks(&fs);
}

/// Redacting one version of a small memory erases it wherever it is kept, a delta's too;
/// the versions after it read back exactly, and those before it read exactly or, when kept
/// against it from before the memory's last rename into its path, as redacted: never other
/// bytes. Check finds nothing.
#[test]
fn redacting_a_version_erases_it_and_damages_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    write(&fs, ME, "mem.md", &version(1500, 0));
    let mut versions = vec![(last_seq(&fs), version(1500, 0))];
    for v in 1..=6usize {
        if v.is_multiple_of(2) {
            in_place(&fs, "mem.md", &version(1500, v));
        } else {
            sdk_edit(&fs, "mem.md", &version(1500, v), v);
        }
        versions.push((last_seq(&fs), version(1500, v)));
    }
    let (gone, _) = versions[3];
    fs.redact("/mem.md", Some(gone)).unwrap();
    for (seq, want) in &versions {
        let r = fs.store().read().unwrap();
        let got = redbfs::tools::show_at(&r, "/mem.md", *seq);
        if *seq == gone {
            assert!(got.unwrap_err().contains("redacted"), "@{seq}");
        } else if *seq > gone {
            assert!(got.unwrap() == *want, "@{seq} reads back");
        } else {
            match got {
                Ok(b) => assert!(b == *want, "@{seq} reads back"),
                Err(e) => assert!(e.contains("redacted"), "@{seq}: {e}"),
            }
        }
    }
    assert_checks(&fs);
}
