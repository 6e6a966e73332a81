//! `check` names every way a store can be broken: each test builds a small clean store, breaks
//! it one way through the store's own write primitives (as a bug would), and asserts the
//! finding that names the damage. The check reads each table once in key order and joins
//! them by merges and small per-inode summaries, so these pin down that every finding the
//! joins replaced is still reported.

use redbfs::fs::{Caller, Fs, Limits, NameRules};
use redbfs::store::{CHUNK_SIZE, Kind, ROOT_INO, Store, Sync, WriteTxn};

mod common;

const ME: Caller = Caller {
    uid: 1000,
    gid: 1000,
    pid: 1,
};

/// A store holding /a/b/c.md (100 bytes), /a/big.bin (two chunks in blobs) and /d/.
struct Sample {
    _dir: tempfile::TempDir,
    fs: Fs,
    a: u64,
    b: u64,
    c: u64,
    big: u64,
    d: u64,
}

fn mkdir(fs: &Fs, parent: u64, name: &str) -> u64 {
    fs.mkdir(ME, parent, name.as_bytes(), 0o700, 0).unwrap().ino
}

fn write_file(fs: &Fs, parent: u64, name: &str, data: &[u8]) -> u64 {
    common::core_fs::write_file(fs, ME, parent, name, 0o600, data, false)
}

fn sample() -> Sample {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (1000, 1000)).unwrap();
    let fs = Fs::new(store, Limits::default()).unwrap();
    let a = mkdir(&fs, ROOT_INO, "a");
    let b = mkdir(&fs, a, "b");
    let c = write_file(&fs, b, "c.md", &[b'x'; 100]);
    let big = write_file(&fs, a, "big.bin", &vec![b'y'; CHUNK_SIZE as usize + 10]);
    let d = mkdir(&fs, ROOT_INO, "d");
    let s = Sample {
        _dir: dir,
        fs,
        a,
        b,
        c,
        big,
        d,
    };
    assert_eq!(findings(&s), Vec::<String>::new(), "the sample is clean");
    s
}

fn findings(s: &Sample) -> Vec<String> {
    redbfs::check::invariants(&s.fs.store().read().unwrap()).unwrap()
}

/// Breaks the sample with `f` in one commit, and returns what check finds.
fn broken(s: &Sample, f: impl FnOnce(&mut WriteTxn)) -> Vec<String> {
    let mut w = s.fs.store().write().unwrap();
    w.without_history();
    f(&mut w);
    w.commit(Sync::Durable).unwrap();
    findings(s)
}

#[track_caller]
fn names(findings: &[String], what: &str) {
    assert!(
        findings.iter().any(|f| f.contains(what)),
        "no finding says {what:?}: {findings:#?}"
    );
}

#[test]
fn an_entry_that_points_to_a_missing_inode() {
    let s = sample();
    let f = broken(&s, |w| {
        w.put_dirent(s.d, "ghost", 9_999, Kind::File).unwrap()
    });
    names(&f, "entry \"ghost\" in");
    names(&f, "points to missing inode 9999");
}

#[test]
fn an_entry_of_the_wrong_kind() {
    let s = sample();
    let f = broken(&s, |w| w.put_dirent(s.b, "c.md", s.c, Kind::Dir).unwrap());
    names(&f, &format!("has the wrong kind for inode {}", s.c));
    names(&f, &format!("directory {} has nlink 2 but 3 expected", s.b));
}

#[test]
fn a_record_that_names_another_entry() {
    let s = sample();
    let f = broken(&s, |w| {
        let mut i = w.inode(s.c).unwrap().unwrap();
        i.name = "other.md".into();
        w.put_inode(&i).unwrap();
    });
    names(
        &f,
        &format!(
            "inode {} records parent {} name \"other.md\", but its entry is \"c.md\" in {}",
            s.c, s.b, s.b
        ),
    );
}

#[test]
fn an_entry_in_a_file_and_an_inode_with_two_entries() {
    let s = sample();
    let f = broken(&s, |w| {
        w.put_dirent(s.big, "inside", s.c, Kind::File).unwrap();
    });
    names(
        &f,
        &format!(
            "entry \"inside\" lives in {}, which is not a directory",
            s.big
        ),
    );
    names(&f, &format!("inode {} has 2 entries", s.c));
}

#[test]
fn unreachable_inodes_and_orphans() {
    let s = sample();
    let f = broken(&s, |w| {
        w.remove_dirent(s.b, "c.md").unwrap();
        w.add_orphan(s.big).unwrap();
        w.add_orphan(77_777).unwrap();
    });
    names(
        &f,
        &format!("inode {} is unreachable and not an orphan", s.c),
    );
    names(
        &f,
        &format!("inode {} is reachable but marked orphan", s.big),
    );
    names(&f, "orphan 77777 has no inode");
}

#[test]
fn link_counts_of_directories_with_and_without_entries() {
    let s = sample();
    let f = broken(&s, |w| {
        for (ino, nlink) in [(s.a, 7), (s.d, 5)] {
            let mut i = w.inode(ino).unwrap().unwrap();
            i.nlink = nlink;
            w.put_inode(&i).unwrap();
        }
    });
    names(&f, &format!("directory {} has nlink 7 but 3 expected", s.a));
    names(&f, &format!("directory {} has nlink 5 but 2 expected", s.d));
}

#[test]
fn a_cycle_of_directories() {
    let s = sample();
    let f = broken(&s, |w| {
        // The aggregates refuse a cycle: a damaged store is made without them.
        w.without_aggregates();
        let mut i = w.inode(s.a).unwrap().unwrap();
        i.parent = s.b;
        w.put_inode(&i).unwrap();
    });
    names(&f, &format!("directory {} is in a cycle", s.a));
    names(&f, &format!("directory {} is in a cycle", s.b));
    assert!(
        !f.iter()
            .any(|f| f.contains(&format!("directory {} is in a cycle", s.d))),
        "{f:#?}"
    );
}

#[test]
fn an_inode_above_the_counter_and_a_name_not_in_nfc() {
    let s = sample();
    let f = broken(&s, |w| {
        let ino = w.alloc_ino().unwrap();
        let mut i = w.inode(s.c).unwrap().unwrap();
        i.ino = ino;
        i.parent = s.d;
        i.name = "e\u{301}.md".into();
        w.put_inode(&i).unwrap();
        w.put_dirent(s.d, "e\u{301}.md", ino, Kind::File).unwrap();
        i.ino = ino + 1_000;
        i.name = "far.md".into();
        w.put_inode(&i).unwrap();
        w.put_dirent(s.d, "far.md", ino + 1_000, Kind::File)
            .unwrap();
    });
    names(&f, "is not in NFC");
    names(&f, "is at or above the inode counter");
}

#[test]
fn chunks_beyond_a_size_of_a_directory_or_of_no_inode() {
    let s = sample();
    let f = broken(&s, |w| {
        let mut i = w.inode(s.big).unwrap().unwrap();
        i.size = 10;
        w.put_inode(&i).unwrap();
        w.put_chunks(s.d, std::iter::once((1, b"z".as_slice())))
            .unwrap();
    });
    names(
        &f,
        &format!("chunk 1 of inode {} lies beyond its size 10", s.big),
    );
    names(&f, &format!("directory {} has content chunk 1", s.d));
    let f = broken(&s, |w| {
        w.put_chunks(9_999, std::iter::once((0, b"z".as_slice())))
            .unwrap();
    });
    names(&f, "chunk 0 belongs to missing inode 9999");
}

#[test]
fn chunk_0_in_the_record_and_in_a_blob() {
    let s = sample();
    let blob = s.fs.store().read().unwrap().filemap_of(s.big).unwrap()[0].1;
    let f = broken(&s, |w| {
        w.set_filemap(s.c, 0, Some(blob)).unwrap();
    });
    names(
        &f,
        &format!(
            "chunk 0 of inode {} is held both in its record and in a blob",
            s.c
        ),
    );
}

#[test]
fn paths_and_files_over_the_limits_the_store_records() {
    let s = sample();
    let limits = Limits {
        max_depth: 2,
        max_path_bytes: 8,
        max_file_bytes: 1_000,
        max_files: 3,
        quota_bytes: 50,
        names: NameRules::Portable,
        ..Limits::default()
    };
    let f = broken(&s, |w| {
        w.put_meta(
            redbfs::store::schema::META_LIMITS,
            &serde_json::to_vec(&limits).unwrap(),
        )
        .unwrap();
        // A name that differs from /a/b only in case.
        let mut i = w.inode(s.d).unwrap().unwrap();
        i.ino = w.alloc_ino().unwrap();
        i.parent = s.a;
        i.name = "B".into();
        w.put_inode(&i).unwrap();
        w.put_dirent(s.a, "B", i.ino, Kind::Dir).unwrap();
        let mut a = w.inode(s.a).unwrap().unwrap();
        a.nlink += 1;
        w.put_inode(&a).unwrap();
    });
    names(
        &f,
        "\"/a/b/c.md\" is 3 levels deep, over the store's --max-depth 2",
    );
    names(
        &f,
        "\"/a/b/c.md\" is 9 bytes, over the store's --max-path-bytes 8",
    );
    names(
        &f,
        &format!(
            "\"/a/big.bin\" is {} bytes, over the store's --max-file-bytes 1000",
            CHUNK_SIZE + 10
        ),
    );
    names(
        &f,
        "differ only in case, under the store's --names portable",
    );
    names(&f, "over its --quota 50");
    names(&f, "over its --max-files 3");
}

#[test]
fn aggregates_that_disagree_with_what_lies_below() {
    let s = sample();
    let f = broken(&s, |w| {
        w.without_aggregates();
        let mut i = w.inode(s.c).unwrap().unwrap();
        i.size = 500;
        w.put_inode(&i).unwrap();
    });
    assert!(
        !f.iter().any(|f| f.contains("bytes below it")),
        "stale aggregates are not checked: {f:#?}"
    );
    // As if they had been kept: marked current as of the next commit, this one.
    let f = broken(&s, |w| {
        w.without_aggregates();
        let seq = w.meta_bytes("log_seq").unwrap().unwrap();
        let next = u64::from_le_bytes(seq.try_into().unwrap()) + 1;
        w.put_meta("subtree_seq", &next.to_le_bytes()).unwrap();
    });
    let big = redbfs::store::CHUNK_SIZE + 10;
    names(
        &f,
        &format!(
            "directory {} records 1 files, 0 dirs, 100 bytes below it; the records say 1, 0, 500",
            s.b
        ),
    );
    names(
        &f,
        &format!(
            "directory {} records 2 files, 1 dirs, {} bytes below it; the records say 2, 1, {}",
            s.a,
            big + 100,
            big + 500
        ),
    );
}
