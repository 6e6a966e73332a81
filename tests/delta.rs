//! History of edits to a large memory costs what changed. Each rewrite of a file over the
//! inline threshold used to keep the whole previous chunk in history (200 edits of 8 bytes
//! to a 20 KB memory kept 4 MB); the version history alone keeps is now a delta against the
//! version that replaced it. These tests drive `Fs` without a mount, with history on, for
//! both ways a memory is rewritten (in place, and the SDK's temporary file renamed over it),
//! and hold every version to its exact bytes through `show --at`, revert, expiry, redaction
//! and `check`, which also finds a delta whose base is gone.

use redb::ReadableTable;
use redbfs::fs::{Caller, Fs, Limits, OpenMode};
use redbfs::store::{ROOT_INO, Store};

mod common;

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 1,
};
const THIRTY_DAYS: u64 = 30 * 86_400 * 1_000_000_000;
const SIZE: usize = 20_000;
const EDITS: usize = 200;

fn open(path: &std::path::Path) -> Fs {
    let store = Store::open_or_create(path, (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    Fs::new(store, Limits::default()).unwrap()
}

/// A memory of `SIZE` bytes of text; version `v` differs from the first in 8 bytes at a
/// place of its own.
fn version(v: usize) -> Vec<u8> {
    let mut out: Vec<u8> = (0..SIZE)
        .map(|i| b"the quick brown fox jumps over the lazy dog\n"[i % 44])
        .collect();
    let at = (v * 97) % (SIZE - 8);
    out[at..at + 8].copy_from_slice(format!("{v:08}").as_bytes());
    out
}

fn create(fs: &Fs, name: &str, data: &[u8]) -> u64 {
    common::core_fs::write_file(fs, ME, ROOT_INO, name, 0o644, data, true)
}

/// Open, write the whole content over the old (same length), fsync, close.
fn rewrite_in_place(fs: &Fs, ino: u64, data: &[u8]) {
    let mode = OpenMode {
        write: true,
        ..Default::default()
    };
    let fh = fs.open(ME, ino, mode).unwrap();
    fs.write(ME, fh, 0, data).unwrap();
    fs.fsync(fh).unwrap();
    fs.release(fh).unwrap();
}

/// What the SDK's memory tool does: a temporary file, fsynced, renamed over the memory.
fn rewrite_by_rename(fs: &Fs, name: &str, data: &[u8], i: usize) {
    let tmp = format!(".tmp-4242-{i}");
    create(fs, &tmp, data);
    fs.rename(ME, ROOT_INO, tmp.as_bytes(), ROOT_INO, name.as_bytes(), 0)
        .unwrap();
}

fn read(fs: &Fs, name: &str) -> Vec<u8> {
    let ino = fs.lookup(ROOT_INO, name.as_bytes()).unwrap().ino;
    let fh = fs.open(ME, ino, OpenMode::default()).unwrap();
    let data = fs.read(fh, 0, u32::MAX).unwrap();
    fs.release(fh).unwrap();
    fs.forget(ino, 1);
    data
}

fn blob_bytes(fs: &Fs) -> u64 {
    fs.store().read().unwrap().blob_bytes().unwrap().1
}

fn show(fs: &Fs, path: &str, seq: u64) -> Result<Vec<u8>, String> {
    redbfs::tools::show_at(&fs.store().read().unwrap(), path, seq)
}

fn last_seq(fs: &Fs) -> u64 {
    fs.store().read().unwrap().last_seq().unwrap()
}

fn assert_checks(fs: &Fs) {
    let r = fs.store().read().unwrap();
    assert_eq!(redbfs::check::invariants(&r).unwrap(), Vec::<String>::new());
}

/// 200 edits, each version with the point it can be seen at.
fn edit_history(fs: &Fs, in_place: bool) -> Vec<(u64, Vec<u8>)> {
    let ino = create(fs, "mem.md", &version(0));
    let mut versions = vec![(last_seq(fs), version(0))];
    for v in 1..=EDITS {
        let data = version(v);
        if in_place {
            rewrite_in_place(fs, ino, &data);
        } else {
            rewrite_by_rename(fs, "mem.md", &data, v);
        }
        versions.push((last_seq(fs), data));
    }
    versions
}

fn a_history_of_edits_costs_what_changed(in_place: bool) {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    let before = blob_bytes(&fs);
    let versions = edit_history(&fs, in_place);
    let grew = blob_bytes(&fs) - before;
    // 201 versions of 20 KB: 4 MB as full copies.
    assert!(
        grew < (SIZE + EDITS * 1024) as u64,
        "{grew} bytes of blobs for {EDITS} edits of 8 bytes"
    );
    for (seq, want) in &versions {
        assert!(
            show(&fs, "/mem.md", *seq).unwrap() == *want,
            "the version at @{seq} reads back exactly"
        );
    }
    assert_checks(&fs);

    // Revert to an old point: its exact content, and the history after it still reads.
    let (old_seq, old) = &versions[3];
    fs.revert(ME, "/mem.md", *old_seq).unwrap();
    assert!(read(&fs, "mem.md") == *old, "revert gives the old content");
    let (seq, want) = &versions[150];
    assert!(show(&fs, "/mem.md", *seq).unwrap() == *want);
    // An edit of the reverted content, which is itself a delta.
    let mut edited = old.clone();
    edited[10..18].copy_from_slice(b"REVERTED");
    if in_place {
        let ino = fs.lookup(ROOT_INO, b"mem.md").unwrap().ino;
        rewrite_in_place(&fs, ino, &edited);
        fs.forget(ino, 1);
    } else {
        rewrite_by_rename(&fs, "mem.md", &edited, 9999);
    }
    assert!(read(&fs, "mem.md") == edited);
    for (seq, want) in versions.iter().step_by(7) {
        assert!(show(&fs, "/mem.md", *seq).unwrap() == *want);
    }
    assert_checks(&fs);
}

#[test]
fn edits_in_place_keep_deltas() {
    a_history_of_edits_costs_what_changed(true);
}

#[test]
fn edits_by_rename_over_keep_deltas() {
    a_history_of_edits_costs_what_changed(false);
}

#[test]
fn expiry_keeps_the_newer_versions_readable_and_frees_the_older() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    let ino = create(&fs, "mem.md", &version(0));
    for v in 1..=60 {
        rewrite_in_place(&fs, ino, &version(v));
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    let gap = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_millis(600));
    let mut newer = Vec::new();
    for v in 61..=120 {
        rewrite_in_place(&fs, ino, &version(v));
        newer.push((last_seq(&fs), version(v)));
    }
    let (blobs_before, _) = fs.store().read().unwrap().blob_bytes().unwrap();
    // Records before the gap expire, 16 per commit.
    let keep = gap.elapsed().as_nanos() as u64;
    fs.store().set_keep_history(keep).unwrap();
    for i in 0..8 {
        create(&fs, &format!("other{i}"), b"x");
    }
    let (blobs_after, _) = fs.store().read().unwrap().blob_bytes().unwrap();
    assert!(
        blobs_after < blobs_before - 50,
        "the older versions went: {blobs_before} -> {blobs_after} blobs"
    );
    for (seq, want) in &newer[1..] {
        assert!(
            show(&fs, "/mem.md", *seq).unwrap() == *want,
            "@{seq} after expiry"
        );
    }
    assert!(read(&fs, "mem.md") == version(120));
    assert_checks(&fs);
}

#[test]
fn redacting_one_version_keeps_the_others_and_redacting_all_erases_all() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    let versions = edit_history(&fs, true);
    // One version in the middle of a run of deltas: the older ones were deltas against it.
    let (seq, _) = versions[100];
    assert!(fs.redact("/mem.md", Some(seq)).unwrap() >= 1);
    let err = show(&fs, "/mem.md", seq).unwrap_err();
    assert!(err.contains("redacted"), "{err}");
    for (s, want) in versions.iter().filter(|(s, _)| *s != seq) {
        assert!(
            show(&fs, "/mem.md", *s).unwrap() == *want,
            "@{s} after redacting @{seq}"
        );
    }
    assert_checks(&fs);
    // Every past version: none reads, the current one stays.
    fs.redact("/mem.md", None).unwrap();
    for (s, _) in &versions[..EDITS] {
        assert!(show(&fs, "/mem.md", *s).is_err(), "@{s} erased");
    }
    assert!(read(&fs, "mem.md") == version(EDITS));
    assert_checks(&fs);
}

/// A change made to the blobs table behind the store's back, given the delta index's rows.
type Corruption = dyn Fn(&mut redb::Table<u64, &[u8]>, Vec<(u64, u64)>);

#[test]
fn check_finds_a_delta_whose_base_is_gone_and_one_that_does_not_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    {
        let fs = open(&path);
        let ino = create(&fs, "mem.md", &version(0));
        for v in 1..=5 {
            rewrite_in_place(&fs, ino, &version(v));
        }
        assert_checks(&fs);
    }
    // Deltas are kept apart from full blobs, in a table of their own.
    const BLOBS: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("blob_deltas");
    const DELTAS: redb::TableDefinition<(u64, u64), ()> = redb::TableDefinition::new("deltas");
    let corrupt = |f: &Corruption| {
        let db = redb::Database::open(&path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let rows: Vec<(u64, u64)> = tx
                .open_table(DELTAS)
                .unwrap()
                .iter()
                .unwrap()
                .map(|i| i.unwrap().0.value())
                .collect();
            assert_eq!(rows.len(), 5, "each earlier version is a delta: {rows:?}");
            f(&mut tx.open_table(BLOBS).unwrap(), rows);
        }
        tx.commit().unwrap();
    };
    let findings = || {
        let store = Store::open_existing(&path).unwrap();
        redbfs::check::invariants(&store.read().unwrap()).unwrap()
    };
    // A flipped byte in a delta's middle bytes (its value's own checksum recomputed, as a
    // wrong write would leave it): the content it rebuilds does not match.
    corrupt(&|blobs, rows| {
        let (_, d) = rows[0];
        let mut v = blobs.get(d).unwrap().unwrap().value().to_vec();
        let n = v.len();
        v[n - 1] ^= 0x20;
        let sum = !crc32c::crc32c(&v[4..]);
        v[..4].copy_from_slice(&sum.to_le_bytes());
        blobs.insert(d, v.as_slice()).unwrap();
    });
    let f = findings();
    assert!(
        f.iter().any(|l| l.contains("does not match its checksum")),
        "{f:?}"
    );
    // The base of the oldest delta (itself a delta, kept by history alone) removed.
    corrupt(&|blobs, rows| {
        let (base, _) = *rows.iter().min().unwrap();
        blobs.remove(base).unwrap();
    });
    let f = findings();
    assert!(
        f.iter()
            .any(|l| l.contains("a delta against blob") && l.contains("missing")),
        "{f:?}"
    );
}

/// A format-5 store (every blob full, no tables of deltas) reads, read-only, from a migrated
/// private copy (the file left as it is), and is opened read-write after the migrations:
/// its versions stay full and read back, and the next edit keeps a delta.
#[test]
fn a_format_5_store_reads_as_it_is_and_keeps_deltas_once_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let mut versions = {
        let fs = open(&path);
        let ino = create(&fs, "mem.md", &version(0));
        let mut versions = vec![(last_seq(&fs), version(0))];
        // Wholly different contents: no deltas.
        for v in 1..=3u8 {
            let data = vec![b'a' + v; SIZE];
            rewrite_in_place(&fs, ino, &data);
            versions.push((last_seq(&fs), data));
        }
        assert!(
            fs.store()
                .read()
                .unwrap()
                .delta_survey()
                .unwrap()
                .0
                .is_empty()
        );
        versions
    };
    {
        let db = redb::Database::open(&path).unwrap();
        let tx = db.begin_write().unwrap();
        tx.delete_table(redb::TableDefinition::<(u64, u64), ()>::new("deltas"))
            .unwrap();
        tx.delete_table(redb::TableDefinition::<u64, &[u8]>::new("blob_deltas"))
            .unwrap();
        tx.open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))
            .unwrap()
            .insert("format", 5u64.to_le_bytes().as_slice())
            .unwrap();
        tx.commit().unwrap();
    }
    {
        let ro = redbfs::store::ReadOnlyStore::open(&path).unwrap();
        assert!(ro.is_private_copy());
        let r = ro.read().unwrap();
        assert_eq!(
            r.meta_u64("format").unwrap(),
            Some(redbfs::store::FORMAT_VERSION as u64)
        );
        for (seq, want) in &versions {
            assert!(redbfs::tools::show_at(&r, "/mem.md", *seq).unwrap() == *want);
        }
        assert_eq!(redbfs::check::invariants(&r).unwrap(), Vec::<String>::new());
    }
    {
        let db = redb::Database::open(&path).unwrap();
        let tx = redb::ReadableDatabase::begin_read(&db).unwrap();
        let meta = tx
            .open_table(redb::TableDefinition::<&str, &[u8]>::new("meta"))
            .unwrap();
        let format = meta.get("format").unwrap().unwrap().value().to_vec();
        assert_eq!(format, 5u64.to_le_bytes(), "the file is left as it was");
    }
    let fs = open(&path);
    assert_eq!(
        fs.store().read().unwrap().meta_u64("format").unwrap(),
        Some(redbfs::store::FORMAT_VERSION as u64)
    );
    let ino = fs.lookup(ROOT_INO, b"mem.md").unwrap().ino;
    let mut data = versions.last().unwrap().1.clone();
    data[5..13].copy_from_slice(b"migrated");
    rewrite_in_place(&fs, ino, &data);
    versions.push((last_seq(&fs), data));
    for (seq, want) in &versions {
        assert!(show(&fs, "/mem.md", *seq).unwrap() == *want);
    }
    assert_eq!(
        fs.store().read().unwrap().delta_survey().unwrap().0.len(),
        1,
        "the version the edit replaced is a delta"
    );
    assert_checks(&fs);
}

/// A memory the kernel still references when it is renamed over becomes an orphan, and its
/// content goes after its last forget, in a reclaim of its own: the version it held is
/// still kept as a delta against the file that now has its name.
#[test]
fn a_memory_replaced_while_referenced_is_kept_as_a_delta_at_its_forget() {
    let dir = tempfile::tempdir().unwrap();
    let fs = open(&dir.path().join("s.redb"));
    create(&fs, "mem.md", &version(0));
    let mut versions = vec![(last_seq(&fs), version(0))];
    for v in 1..=5 {
        let held = fs.lookup(ROOT_INO, b"mem.md").unwrap().ino;
        rewrite_by_rename(&fs, "mem.md", &version(v), v);
        versions.push((last_seq(&fs), version(v)));
        fs.forget(held, 1);
    }
    // Orphans are reclaimed in batches; this one now.
    fs.reclaim_queued();
    let deltas = fs.store().read().unwrap().delta_survey().unwrap().0.len();
    assert_eq!(deltas, 5, "each replaced version is a delta");
    for (seq, want) in &versions {
        assert!(show(&fs, "/mem.md", *seq).unwrap() == *want);
    }
    assert_checks(&fs);
}
