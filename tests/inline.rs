//! Small files keep their content in their inode records (no blob, no filemap row): files of
//! every size around the threshold, and files growing and shrinking across it, read back the
//! same through the mount, export and import, history (show, revert, rollback, redact) and a
//! replica; a format-4 store (content all in blobs) is migrated at open with every byte kept;
//! and a flipped bit in inline content is an error that `check` names by path.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use common::{TestMount, fuse_available, ok, redbfs};
use redbfs::fs::{Caller, Fs, Limits, OpenMode};
use redbfs::store::{
    CHUNK_SIZE, INLINE_MAX, Inode, Kind, ROOT_INO, ReadTxn, Store, Sync, TreeView,
};

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 1,
};
const THIRTY_DAYS: u64 = 30 * 86_400 * 1_000_000_000;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `n` bytes that differ with `seed` and are not all one value.
fn body(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 0x20)
        .collect()
}

/// Where `name` in directory `parent` keeps its content: (chunk 0 in its record, blobs).
fn layout(r: &impl TreeView, parent: u64, name: &str) -> (bool, usize) {
    let (ino, _) = r.lookup(parent, name).unwrap().expect("the file exists");
    (
        r.inline_part_of(ino).unwrap().is_some(),
        r.filemap_of(ino).unwrap().len(),
    )
}

/// Every file of a directory tree on disk: relative path -> content.
fn files_of(root: &Path) -> BTreeMap<String, Vec<u8>> {
    common::walk_tree(root)
        .unwrap()
        .into_iter()
        .filter_map(|(rel, w)| {
            w.meta
                .is_file()
                .then(|| (rel.to_str().unwrap().to_string(), w.content.unwrap()))
        })
        .collect()
}

/// name -> (length, hash) of every file, for comparisons that print short.
fn digest(files: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, (usize, u64)> {
    files
        .iter()
        .map(|(k, v)| (k.clone(), (v.len(), common::fnv(v))))
        .collect()
}

fn clean(r: &ReadTxn) {
    let findings = redbfs::check::invariants(r).unwrap();
    assert!(findings.is_empty(), "{findings:#?}");
}

#[test]
fn files_across_the_threshold_round_trip_through_the_mount_and_export_import() {
    if !fuse_available() {
        return;
    }
    let mut tm = TestMount::new();
    let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // (name, whether chunk 0 ends in the record, blobs)
    let mut shape: Vec<(String, bool, usize)> = Vec::new();
    for (n, inline, blobs) in [
        (0, false, 0),
        (1, true, 0),
        (INLINE_MAX - 1, true, 0),
        (INLINE_MAX, true, 0),
        (INLINE_MAX + 1, false, 1),
        (CHUNK_SIZE as usize + 7, false, 2),
    ] {
        let name = format!("size-{n}.bin");
        let data = body(n, n as u8);
        std::fs::write(tm.path(&name), &data).unwrap();
        want.insert(name.clone(), data);
        shape.push((name, inline, blobs));
    }
    // Grows across the threshold by appending.
    let mut grow = body(INLINE_MAX - 10, 1);
    std::fs::write(tm.path("grow.md"), &grow).unwrap();
    let tail = body(100, 2);
    std::fs::OpenOptions::new()
        .append(true)
        .open(tm.path("grow.md"))
        .unwrap()
        .write_all(&tail)
        .unwrap();
    grow.extend_from_slice(&tail);
    want.insert("grow.md".into(), grow);
    shape.push(("grow.md".into(), false, 1));
    // Shrinks across it by a rewrite, and by a truncate to exactly the threshold.
    std::fs::write(tm.path("shrink.md"), body(INLINE_MAX + 100, 3)).unwrap();
    std::fs::write(tm.path("shrink.md"), body(50, 4)).unwrap();
    want.insert("shrink.md".into(), body(50, 4));
    shape.push(("shrink.md".into(), true, 0));
    let cut = body(INLINE_MAX + 500, 5);
    std::fs::write(tm.path("cut.md"), &cut).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(tm.path("cut.md"))
        .unwrap()
        .set_len(INLINE_MAX as u64)
        .unwrap();
    want.insert("cut.md".into(), cut[..INLINE_MAX].to_vec());
    shape.push(("cut.md".into(), true, 0));
    // Grows past it as a hole: the first bytes stay in the record, the rest reads as zeros.
    std::fs::write(tm.path("sparse.md"), body(10, 6)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(tm.path("sparse.md"))
        .unwrap()
        .set_len(INLINE_MAX as u64 + 1)
        .unwrap();
    let mut sparse = body(10, 6);
    sparse.resize(INLINE_MAX + 1, 0);
    want.insert("sparse.md".into(), sparse);
    shape.push(("sparse.md".into(), true, 0));
    // Back and forth, read through a new open and through a handle held open across the
    // rewrites (the same inode: each rewrite truncates it).
    std::fs::write(tm.path("flip.md"), b"first").unwrap();
    let held = std::fs::File::open(tm.path("flip.md")).unwrap();
    for (i, n) in [INLINE_MAX * 3, 7, INLINE_MAX + 1, INLINE_MAX]
        .into_iter()
        .enumerate()
    {
        let data = body(n, 10 + i as u8);
        std::fs::write(tm.path("flip.md"), &data).unwrap();
        assert!(same(&std::fs::read(tm.path("flip.md")).unwrap(), &data));
        let mut through_held = vec![0u8; n + 10];
        let got = std::os::unix::fs::FileExt::read_at(&held, &mut through_held, 0).unwrap();
        assert!(
            same(&through_held[..got], &data),
            "size {n} through the held handle"
        );
    }
    drop(held);
    want.insert("flip.md".into(), body(INLINE_MAX, 13));
    shape.push(("flip.md".into(), true, 0));

    for (name, data) in &want {
        assert!(same(&std::fs::read(tm.path(name)).unwrap(), data), "{name}");
    }
    tm.unmount();
    assert!(ok(redbfs(&["check", s(&tm.store)])).contains("clean"));
    {
        let store = Store::open_existing(&tm.store).unwrap();
        let r = store.read().unwrap();
        for (name, inline, blobs) in &shape {
            assert_eq!(layout(&r, ROOT_INO, name), (*inline, *blobs), "{name}");
        }
    }

    // export, import, export: the same bytes, and the imported store keeps small files inline.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    ok(redbfs(&["export", s(&tm.store), s(&out)]));
    assert_eq!(digest(&files_of(&out)), digest(&want));
    let again = dir.path().join("again.redb");
    ok(redbfs(&["import", s(&out), s(&again)]));
    assert!(ok(redbfs(&["check", s(&again)])).contains("clean"));
    let out2 = dir.path().join("out2");
    ok(redbfs(&["export", s(&again), s(&out2)]));
    assert_eq!(digest(&files_of(&out2)), digest(&want));
    let store = Store::open_existing(&again).unwrap();
    let r = store.read().unwrap();
    assert_eq!(layout(&r, ROOT_INO, "size-1.bin"), (true, 0));
    assert_eq!(layout(&r, ROOT_INO, "size-2048.bin"), (true, 0));
    assert_eq!(layout(&r, ROOT_INO, "size-2049.bin"), (false, 1));
}

/// Replaces the content of `ino` with `data` (open with O_TRUNC, write, close).
fn rewrite(fs: &Fs, ino: u64, data: &[u8]) {
    let mode = OpenMode {
        write: true,
        truncate: true,
        ..OpenMode::default()
    };
    let fh = fs.open(ME, ino, mode).unwrap();
    fs.write(ME, fh, 0, data).unwrap();
    fs.release(fh).unwrap();
}

/// The content of `name` in the root, as a reader opening it now gets it.
fn read_all(fs: &Fs, name: &str) -> Vec<u8> {
    let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
    let fh = fs.open(ME, ino, OpenMode::default()).unwrap();
    let data = fs.read(fh, 0, u32::MAX).unwrap();
    fs.release(fh).unwrap();
    data
}

/// Content compared by length and hash, so a failure prints two numbers, not the bytes.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && common::fnv(a) == common::fnv(b)
}

#[test]
fn history_shows_reverts_and_redacts_a_file_moving_between_record_and_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    let fs = Fs::new(store, Limits::default()).unwrap();
    let (attr, fh) = fs
        .create(ME, ROOT_INO, b"f.md", 0o600, 0, libc::O_WRONLY)
        .unwrap();
    fs.release(fh).unwrap();
    let ino = attr.ino;
    let versions = [
        b"FIRST-VERSION;".repeat(8),
        body(INLINE_MAX + 1000, 2),
        body(200, 3),
        body(INLINE_MAX, 4),
    ];
    let mut points = Vec::new();
    for v in &versions {
        rewrite(&fs, ino, v);
        points.push(fs.store().read().unwrap().last_seq().unwrap());
    }
    let r = fs.store().read().unwrap();
    for (v, &seq) in versions.iter().zip(&points) {
        assert!(
            same(&redbfs::tools::show_at(&r, "/f.md", seq).unwrap(), v),
            "@{seq}"
        );
        let then = r.past(seq).unwrap();
        assert_eq!(
            layout(&then, ROOT_INO, "f.md"),
            (v.len() <= INLINE_MAX, usize::from(v.len() > INLINE_MAX))
        );
    }
    drop(r);

    // Revert to the chunked version, then to an inline one, then roll everything back.
    fs.revert(ME, "/f.md", points[1]).unwrap();
    assert!(same(&read_all(&fs, "f.md"), &versions[1]));
    assert_eq!(
        layout(&fs.store().read().unwrap(), ROOT_INO, "f.md"),
        (false, 1)
    );
    fs.revert(ME, "/f.md", points[0]).unwrap();
    assert!(same(&read_all(&fs, "f.md"), &versions[0]));
    assert_eq!(
        layout(&fs.store().read().unwrap(), ROOT_INO, "f.md"),
        (true, 0)
    );
    fs.rollback(ME, points[1]).unwrap();
    assert!(same(&read_all(&fs, "f.md"), &versions[1]));
    fs.rollback(ME, points[2]).unwrap();
    assert!(same(&read_all(&fs, "f.md"), &versions[2]));
    clean(&fs.store().read().unwrap());

    // A file removed and brought back by a revert comes back with its record's content.
    fs.unlink(ME, ROOT_INO, b"f.md").unwrap();
    fs.revert(ME, "/f.md", points[3]).unwrap();
    assert!(same(&read_all(&fs, "f.md"), &versions[3]));

    // Redacting the version at a point erases that one's bytes only, wherever history holds
    // them; the current content stays.
    let erased = fs.redact("/f.md", Some(points[2])).unwrap();
    assert!(erased >= 1, "erased {erased}");
    let r = fs.store().read().unwrap();
    let err = redbfs::tools::show_at(&r, "/f.md", points[2]).unwrap_err();
    assert!(err.contains("redacted"), "{err}");
    assert!(same(
        &redbfs::tools::show_at(&r, "/f.md", points[0]).unwrap(),
        &versions[0]
    ));
    drop(r);
    assert!(same(&read_all(&fs, "f.md"), &versions[3]));
    // All of them: no earlier version's bytes remain in history.
    fs.redact("/f.md", None).unwrap();
    let r = fs.store().read().unwrap();
    assert!(
        redbfs::tools::show_at(&r, "/f.md", points[0])
            .unwrap_err()
            .contains("redacted")
    );
    let mut left = Vec::new();
    r.for_each_record(|rec| {
        for u in &rec.undo {
            if let redbfs::store::Undo::Inode { old: Some(b), .. } = u
                && b.windows(14).any(|w| w == b"FIRST-VERSION;")
            {
                left.push(rec.seq);
            }
        }
        Ok(())
    })
    .unwrap();
    assert!(
        left.is_empty(),
        "records {left:?} still hold the first version"
    );
    clean(&r);
    drop(r);
    assert!(same(&read_all(&fs, "f.md"), &versions[3]));
}

/// A store as format 4 wrote it: every file's content in blobs, and (history on) `edited`
/// rewritten once after, so history holds a before-image of it. Returns the point before
/// that rewrite.
fn format_4_store(path: &Path, files: &[(&str, Vec<u8>)], edited: &[u8]) -> u64 {
    let store = Store::open_or_create(path, (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    let mut w = store.write().unwrap();
    let root = w.inode(ROOT_INO).unwrap().unwrap();
    for (name, data) in files {
        let ino = w.alloc_ino().unwrap();
        let f = Inode {
            ino,
            kind: Kind::File,
            perm: 0o600,
            nlink: 1,
            parent: ROOT_INO,
            size: data.len() as u64,
            name: name.to_string(),
            ..root.clone()
        };
        // Chunks before the record: they go to blobs, as they all did in format 4.
        let chunks: Vec<&[u8]> = data.chunks(CHUNK_SIZE as usize).collect();
        w.put_chunks(ino, (0u64..).zip(chunks)).unwrap();
        w.put_inode(&f).unwrap();
        w.put_dirent(ROOT_INO, name, ino, Kind::File).unwrap();
    }
    w.commit(Sync::Durable).unwrap();
    let r = store.read().unwrap();
    assert_eq!(layout(&r, ROOT_INO, "one"), (false, 1), "a format-4 layout");
    let before_edit = r.last_seq().unwrap();
    drop(r);
    let fs = Fs::new(store, Limits::default()).unwrap();
    let ino = fs.lookup(ROOT_INO, b"edited").unwrap().ino;
    // Written as a blob too: chunks go to blobs only before the record exists, so the
    // rewrite removes the record first, in the same transaction.
    let mut w = fs.store().write().unwrap();
    let mut i = w.inode(ino).unwrap().unwrap();
    i.size = edited.len() as u64;
    w.delete_inode(ino).unwrap();
    w.put_chunks(ino, [(0u64, edited)]).unwrap();
    w.put_inode(&i).unwrap();
    w.put_meta("format", &4u64.to_le_bytes()).unwrap();
    w.commit(Sync::Durable).unwrap();
    before_edit
}

#[test]
fn a_format_4_store_is_migrated_at_open_keeping_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.redb");
    let files = [
        ("empty", Vec::new()),
        ("one", body(1, 1)),
        ("at-threshold", body(INLINE_MAX, 2)),
        ("over", body(INLINE_MAX + 1, 3)),
        ("two-chunks", body(CHUNK_SIZE as usize + 9, 4)),
        ("edited", body(300, 5)),
    ];
    let before_edit = format_4_store(&path, &files, &body(400, 6));
    let store = Store::open_existing(&path).unwrap();
    let r = store.read().unwrap();
    assert_eq!(
        r.meta_u64("format").unwrap(),
        Some(redbfs::store::FORMAT_VERSION as u64)
    );
    for (name, data) in &files[..5] {
        let (ino, _) = r.lookup(ROOT_INO, name).unwrap().unwrap();
        let size = r.inode(ino).unwrap().unwrap().size;
        let content: Vec<u8> = r
            .chunks(ino, 0, size.div_ceil(CHUNK_SIZE))
            .unwrap()
            .into_iter()
            .flat_map(Option::unwrap_or_default)
            .collect();
        assert!(same(&content, data), "{name}");
    }
    assert_eq!(layout(&r, ROOT_INO, "empty"), (false, 0));
    assert_eq!(layout(&r, ROOT_INO, "one"), (true, 0));
    assert_eq!(layout(&r, ROOT_INO, "at-threshold"), (true, 0));
    assert_eq!(layout(&r, ROOT_INO, "over"), (false, 1));
    assert_eq!(layout(&r, ROOT_INO, "two-chunks"), (false, 2));
    // History names the edited file: it keeps its blob, and both its versions read back.
    assert_eq!(layout(&r, ROOT_INO, "edited"), (false, 1));
    assert!(same(
        &redbfs::tools::show_at(&r, "/edited", before_edit).unwrap(),
        &body(300, 5)
    ));
    let now = r.last_seq().unwrap();
    assert!(same(
        &redbfs::tools::show_at(&r, "/edited", now).unwrap(),
        &body(400, 6)
    ));
    clean(&r);
}

#[test]
fn check_names_a_damaged_inline_file_and_reads_refuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("memories")).unwrap();
    let pattern: Vec<u8> = b"inline-guarded-"
        .iter()
        .cycle()
        .take(600)
        .copied()
        .collect();
    std::fs::write(src.join("memories/notes.md"), &pattern).unwrap();
    std::fs::write(src.join("memories/other.md"), b"untouched").unwrap();
    let store = dir.path().join("s.redb");
    ok(redbfs(&["import", s(&src), s(&store)]));
    {
        let st = Store::open_existing(&store).unwrap();
        let r = st.read().unwrap();
        let (m, _) = r.lookup(ROOT_INO, "memories").unwrap().unwrap();
        assert_eq!(layout(&r, m, "notes.md"), (true, 0));
    }
    let mut bytes = std::fs::read(&store).unwrap();
    let at = bytes
        .windows(pattern.len())
        .position(|w| w == pattern.as_slice())
        .expect("the content is in the store file")
        + 300;
    bytes[at] ^= 0x04;
    std::fs::write(&store, &bytes).unwrap();

    let out = redbfs(&["cat", s(&store), "/memories/notes.md"]);
    assert!(!out.status.success(), "cat served damaged content");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("checksum") && err.contains("redbfs check"),
        "{err}"
    );
    assert_eq!(
        ok(redbfs(&["cat", s(&store), "/memories/other.md"])),
        "untouched"
    );
    let out = redbfs(&["check", s(&store)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "check called it clean: {text}");
    assert!(
        text.contains(
            "/memories/notes.md: chunk 0 (held in its inode record) does not match its checksum"
        ),
        "{text}"
    );
}

#[test]
fn a_replica_of_files_moving_across_the_threshold_restores_every_byte() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let replica = dir.path().join("replica");
    let url = format!("file://{}", replica.display());
    let mut tm = TestMount::with_args(&["--replica", &url, "--replica-interval", "100ms"]);
    let mut want = BTreeMap::new();
    for (i, n) in [
        10,
        INLINE_MAX + 1,
        20,
        INLINE_MAX,
        0,
        CHUNK_SIZE as usize + 1,
        30,
    ]
    .into_iter()
    .enumerate()
    {
        let data = body(n, i as u8);
        std::fs::write(tm.path("moving.md"), &data).unwrap();
        std::fs::write(tm.path(&format!("kept-{i}.md")), &data).unwrap();
        want.insert(format!("kept-{i}.md"), data.clone());
        want.insert("moving.md".to_string(), data);
    }
    tm.unmount();
    let restored = dir.path().join("restored.redb");
    ok(redbfs(&["restore", "--from", &url, s(&restored)]));
    assert!(ok(redbfs(&["check", s(&restored)])).contains("clean"));
    let out = dir.path().join("out");
    ok(redbfs(&["export", s(&restored), s(&out)]));
    assert_eq!(digest(&files_of(&out)), digest(&want));
}

/// A small file's commit wrote its inode record twice, once when its content went inline and
/// again with its new size and times, so the write-ahead log carried the content twice per
/// fsync (and redb copied it twice). The record is written once now: the content is in the
/// log once, and reads back from the record.
#[test]
fn a_small_files_commit_logs_its_content_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = Store::open_or_create(&path, (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    let fs = Fs::new(store, Limits::default()).unwrap();
    let data = body(1500, 7);
    let (attr, fh) = fs
        .create(ME, ROOT_INO, b"f.md", 0o600, 0, libc::O_WRONLY)
        .unwrap();
    fs.write(ME, fh, 0, &data).unwrap();
    let (_, before) = fs.store().log_state();
    fs.fsync(fh).unwrap();
    fs.release(fh).unwrap();
    let (_, after) = fs.store().log_state();
    let log = std::fs::read(dir.path().join("s.redb.wal")).unwrap();
    let copies = log.windows(data.len()).filter(|w| *w == data).count();
    assert_eq!(copies, 1, "the content's copies in the log");
    assert!(
        after - before < 2 * data.len() as u64,
        "the commit logged {} bytes for {} of content",
        after - before,
        data.len()
    );
    assert!(same(&read_all(&fs, "f.md"), &data));
    let r = fs.store().read().unwrap();
    assert_eq!(layout(&r, ROOT_INO, "f.md"), (true, 0));
    assert_eq!(r.inode(attr.ino).unwrap().unwrap().size, 1500);
    clean(&r);
}
