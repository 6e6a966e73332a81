//! Quotas per directory and the per-directory aggregates under them. Driven on `Fs` without a
//! mount: every path in is held (buffered writes, creates, renames and directory moves in,
//! revert of a path), nested quotas both hold, statfs inside a root reports that root, the
//! aggregates stay equal to what lies below each directory (`check`), and a directory rename
//! costs the same work at 10 and 10,000 entries while the path limits still hold. On a real
//! mount: 100 users, each with a stock SDK memory tool (both languages) whose base path is the
//! user's root, write in parallel under a quota each; the user over quota gets EDQUOT while the
//! others keep writing, each root's usage is what a walk counts, `df` inside a root reports it,
//! and a rollback of one user leaves every other user's files byte-identical.
//!
//! The mount test needs the SDK clients (`bash tests/clients/setup.sh`); without them it fails
//! and says so.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use redbfs::fs::{Caller, Fs, Limits};
use redbfs::store::{Inode, Kind, ROOT_INO, Store, Sync};

const ME: Caller = Caller {
    uid: 1000,
    gid: 1000,
    pid: 1,
};

fn new_fs(limits: Limits) -> (tempfile::TempDir, Fs) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (1000, 1000)).unwrap();
    (dir, Fs::new(store, limits).unwrap())
}

fn mkdir(fs: &Fs, parent: u64, name: &str) -> u64 {
    fs.mkdir(ME, parent, name.as_bytes(), 0o700, 0).unwrap().ino
}

/// Creates `name` with `data`: Ok, or the errno of the first step refused.
fn write_file(fs: &Fs, parent: u64, name: &str, data: &[u8]) -> Result<u64, i32> {
    let (inode, fh) = fs
        .create(ME, parent, name.as_bytes(), 0o600, 0, libc::O_WRONLY)
        .map_err(|e| e.errno())?;
    let res = fs
        .write(ME, fh, 0, data)
        .map(drop)
        .and_then(|()| fs.flush(fh));
    fs.release(fh).unwrap();
    fs.forget(inode.ino, 1);
    res.map(|()| inode.ino).map_err(|e| e.errno())
}

fn findings(fs: &Fs) -> Vec<String> {
    redbfs::check::invariants(&fs.store().read().unwrap()).unwrap()
}

fn du(fs: &Fs, path: &str) -> redbfs::tools::DuInfo {
    redbfs::tools::du(&fs.store().read().unwrap(), path).unwrap()
}

#[test]
fn a_directory_quota_holds_writes_creates_and_moves_in() {
    let (_d, fs) = new_fs(Limits::default());
    let u1 = mkdir(&fs, ROOT_INO, "u1");
    let u2 = mkdir(&fs, ROOT_INO, "u2");
    fs.set_quota("/u1", 1000, 6).unwrap();
    write_file(&fs, u1, "a", &[1; 600]).unwrap();
    // Refused at the write itself (buffered content counts), so close has nothing to lose.
    assert_eq!(write_file(&fs, u1, "b", &[2; 600]), Err(libc::EDQUOT));
    // The other user is not held by u1's quota.
    write_file(&fs, u2, "big", &[3; 5000]).unwrap();
    write_file(&fs, u1, "c", &[4; 300]).unwrap();
    assert_eq!(du(&fs, "/u1").bytes, 900);

    // A directory moving in that would overfill the target is refused whole.
    let batch = mkdir(&fs, u2, "batch");
    for i in 0..3 {
        write_file(&fs, batch, &format!("f{i}"), &[5; 50]).unwrap();
    }
    let e = fs.rename(ME, u2, b"batch", u1, b"batch", 0).unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT);
    assert!(e.to_string().contains("/u1"), "{e}");
    assert!(fs.lookup(u2, b"batch").is_ok());
    assert_eq!(du(&fs, "/u1").bytes, 900);
    // A smaller one fits; moving it out again gives the room back.
    fs.unlink(ME, batch, b"f0").unwrap();
    fs.unlink(ME, batch, b"f1").unwrap();
    fs.rename(ME, u2, b"batch", u1, b"batch", 0).unwrap();
    assert_eq!(du(&fs, "/u1").bytes, 950);
    fs.rename(ME, u1, b"batch", u2, b"batch", 0).unwrap();
    assert_eq!(du(&fs, "/u1").bytes, 900);

    // Files and directories: u1 holds a, c and b (created empty before its write was refused).
    let held = du(&fs, "/u1");
    assert_eq!(held.files + held.dirs - 1, 3);
    for i in 0..3 {
        mkdir(&fs, u1, &format!("d{i}"));
    }
    let e = fs.mkdir(ME, u1, b"one-too-many", 0o700, 0).unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT);
    // A rename inside the root changes nothing it counts.
    fs.rename(ME, u1, b"d0", u1, b"d0-renamed", 0).unwrap();
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
}

#[test]
fn nested_quotas_both_hold_and_statfs_reports_the_innermost() {
    let (_d, fs) = new_fs(Limits::default());
    let u = mkdir(&fs, ROOT_INO, "u");
    let inner = mkdir(&fs, u, "inner");
    fs.set_quota("/u", 10_000, 0).unwrap();
    fs.set_quota("/u/inner", 100, 0).unwrap();
    assert_eq!(write_file(&fs, inner, "x", &[1; 200]), Err(libc::EDQUOT));
    write_file(&fs, u, "y", &[1; 200]).unwrap();
    write_file(&fs, inner, "z", &[1; 80]).unwrap();
    // The outer quota holds for what the inner one would allow.
    fs.set_quota("/u", 400, 0).unwrap();
    assert_eq!(write_file(&fs, u, "w", &[1; 150]), Err(libc::EDQUOT));

    let s = fs.statfs_at(inner).unwrap();
    assert_eq!(s.blocks, 1, "100 bytes is one 4K block");
    let s = fs.statfs_at(u).unwrap();
    assert_eq!(s.blocks, 1);
    // A file's statfs is its directory's; the root's is the store's.
    let y = fs.lookup(u, b"y").unwrap().ino;
    assert_eq!(fs.statfs_at(y).unwrap().blocks, 1);
    assert!(fs.statfs_at(ROOT_INO).unwrap().blocks > 1);
    fs.set_quota("/u", 0, 0).unwrap();
    fs.set_quota("/u", 1 << 30, 50).unwrap();
    let s = fs.statfs_at(u).unwrap();
    assert_eq!(s.blocks, (1u64 << 30) / 4096);
    assert_eq!(s.files, 50);
    assert_eq!(s.files_free, 50 - 5);
    let listed = redbfs::fs::quotas(&fs.store().read().unwrap()).unwrap();
    let paths: Vec<&str> = listed.iter().map(|q| q.path.as_str()).collect();
    assert_eq!(paths, ["/u", "/u/inner"]);
    assert_eq!(listed[0].bytes, 200 + 80 + 150 - 150);
}

#[test]
fn a_quota_set_below_usage_refuses_growth_but_not_removal() {
    let (_d, fs) = new_fs(Limits::default());
    let u = mkdir(&fs, ROOT_INO, "u");
    write_file(&fs, u, "a", &[1; 500]).unwrap();
    write_file(&fs, u, "b", &[1; 500]).unwrap();
    fs.set_quota("/u", 600, 0).unwrap();
    assert_eq!(write_file(&fs, u, "c", &[1; 10]), Err(libc::EDQUOT));
    fs.unlink(ME, u, b"a").unwrap();
    fs.unlink(ME, u, b"c").unwrap();
    write_file(&fs, u, "c", &[1; 90]).unwrap();
    assert_eq!(du(&fs, "/u").bytes, 590);
}

#[test]
fn revert_of_a_user_keeps_its_quota_and_is_held_by_it() {
    let (_d, fs) = new_fs(Limits::default());
    fs.store().set_keep_history(3600 * 1_000_000_000).unwrap();
    let u = mkdir(&fs, ROOT_INO, "u");
    let other = mkdir(&fs, ROOT_INO, "other");
    write_file(&fs, u, "big", &[7; 3000]).unwrap();
    write_file(&fs, other, "keep", b"untouched").unwrap();
    let point = fs.store().read().unwrap().last_seq().unwrap();
    fs.unlink(ME, u, b"big").unwrap();
    write_file(&fs, other, "later", b"also untouched").unwrap();
    fs.set_quota("/u", 1000, 0).unwrap();
    // Bringing back 3000 bytes under a 1000-byte quota is refused whole.
    let e = fs.revert(ME, "/u", point).unwrap_err();
    assert_eq!(e.errno(), libc::EDQUOT, "{e}");
    assert_eq!(du(&fs, "/u").bytes, 0);
    fs.set_quota("/u", 5000, 0).unwrap();
    fs.revert(ME, "/u", point).unwrap();
    assert_eq!(du(&fs, "/u").bytes, 3000);
    assert_eq!(
        du(&fs, "/u").quota_bytes,
        5000,
        "the quota came back with /u"
    );
    assert_eq!(du(&fs, "/other").files, 2);
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
}

/// A revert or rollback keeps the limits a change through the mount keeps: a tree copied
/// back by reverting its old path after moving it away may not take the store past
/// `--max-files` or `--quota`, nor bring back a name that clashes by case under `--names
/// portable`, nor a rollback re-add entries past a limit lowered since. Each refusal leaves
/// the store as it was.
#[test]
fn revert_and_rollback_keep_the_store_wide_limits_and_the_name_rules() {
    let limits = Limits {
        max_files: 30,
        quota_bytes: 100_000,
        names: redbfs::fs::NameRules::Portable,
        ..Limits::default()
    };
    let (_d, fs) = new_fs(limits.clone());
    fs.store().set_keep_history(3600 * 1_000_000_000).unwrap();
    let d = mkdir(&fs, ROOT_INO, "d");
    for i in 0..10 {
        write_file(&fs, d, &format!("f{i}"), &[i as u8; 4000]).unwrap();
    }
    let base = fs.store().read().unwrap().last_seq().unwrap();
    // Moved away and reverted: a second copy (11 more entries, 40 KB more content).
    fs.rename(ME, ROOT_INO, b"d", ROOT_INO, b"e1", 0).unwrap();
    fs.revert(ME, "/d", base).unwrap();
    // A third copy would make 34 entries: over --max-files 30.
    fs.rename(ME, ROOT_INO, b"d", ROOT_INO, b"e2", 0).unwrap();
    let before = fs.store().read().unwrap().usage().unwrap();
    let e = fs.revert(ME, "/d", base).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert_eq!(
        fs.store().read().unwrap().usage().unwrap(),
        before,
        "nothing changed"
    );
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));

    // Under the quota: 80 KB held, and a copy of 40 KB more would pass 100 KB.
    let (_d2, fs) = new_fs(Limits {
        max_files: 1000,
        ..limits
    });
    fs.store().set_keep_history(3600 * 1_000_000_000).unwrap();
    let d = mkdir(&fs, ROOT_INO, "d");
    for i in 0..10 {
        write_file(&fs, d, &format!("f{i}"), &[i as u8; 4000]).unwrap();
    }
    let base = fs.store().read().unwrap().last_seq().unwrap();
    fs.rename(ME, ROOT_INO, b"d", ROOT_INO, b"e1", 0).unwrap();
    fs.revert(ME, "/d", base).unwrap();
    fs.rename(ME, ROOT_INO, b"d", ROOT_INO, b"e2", 0).unwrap();
    let e = fs.revert(ME, "/d", base).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(e.to_string().contains("--quota"), "{e}");
    assert_eq!(
        fs.store().read().unwrap().usage().unwrap().content_bytes,
        80_000
    );

    // A name that now clashes by case with another is not brought back.
    let foo = fs.store().read().unwrap().last_seq().unwrap();
    mkdir(&fs, ROOT_INO, "Foo");
    let with_foo = fs.store().read().unwrap().last_seq().unwrap();
    fs.rmdir(ME, ROOT_INO, b"Foo").unwrap();
    mkdir(&fs, ROOT_INO, "foo");
    let e = fs.revert(ME, "/Foo", with_foo).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    let r = fs.store().read().unwrap();
    assert!(r.lookup(ROOT_INO, "Foo").unwrap().is_none());
    drop(r);
    // A rollback to a point with fewer entries is within every limit.
    fs.rollback(ME, foo).unwrap();
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
    // With --max-files lowered below what the store held at `base`, a rollback there would
    // re-add entries past it: refused.
    let after = fs.store().read().unwrap().last_seq().unwrap();
    for name in ["e1", "e2"] {
        let (ino, _) = fs
            .store()
            .read()
            .unwrap()
            .lookup(ROOT_INO, name)
            .unwrap()
            .unwrap();
        for i in 0..10 {
            fs.unlink(ME, ino, format!("f{i}").as_bytes()).unwrap();
        }
        fs.rmdir(ME, ROOT_INO, name.as_bytes()).unwrap();
    }
    drop(fs);
    let store = Store::open_or_create(&_d2.path().join("s.redb"), (1000, 1000)).unwrap();
    let fs = Fs::new(
        store,
        Limits {
            max_files: 5,
            ..limits
        },
    )
    .unwrap();
    let e = fs.rollback(ME, after).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert_eq!(fs.store().read().unwrap().usage().unwrap().files, 0);
}

#[test]
fn redact_under_a_user_erases_past_versions_but_never_current_content() {
    let (_d, fs) = new_fs(Limits::default());
    fs.store().set_keep_history(3600 * 1_000_000_000).unwrap();
    let u = mkdir(&fs, ROOT_INO, "u");
    write_file(&fs, u, "a", b"first").unwrap();
    let point = fs.store().read().unwrap().last_seq().unwrap();
    fs.unlink(ME, u, b"a").unwrap();
    write_file(&fs, u, "a", b"second").unwrap();
    write_file(&fs, u, "b", b"gone soon").unwrap();
    fs.unlink(ME, u, b"b").unwrap();
    // "first" is current again, and also a past version in the history.
    fs.revert(ME, "/u/a", point).unwrap();
    assert!(fs.redact("/u", None).unwrap() >= 2);
    let r = fs.store().read().unwrap();
    assert_eq!(redbfs::tools::cat(&r, "/u/a").unwrap(), b"first");
    drop(r);
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
}

#[test]
fn an_import_into_a_user_is_held_by_its_quota_and_refused_whole() {
    let (_d, fs) = new_fs(Limits::default());
    mkdir(&fs, ROOT_INO, "u");
    fs.set_quota("/u", 1000, 0).unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("a.md"), [1u8; 600]).unwrap();
    std::fs::write(src.path().join("b.md"), [2u8; 600]).unwrap();
    let e = redbfs::tools::import(
        fs.store(),
        fs.limits(),
        src.path(),
        "/u",
        false,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(e.contains("/u would exceed its quota of 1000"), "{e}");
    assert_eq!(du(&fs, "/u").files, 0);
    std::fs::remove_file(src.path().join("b.md")).unwrap();
    redbfs::tools::import(
        fs.store(),
        fs.limits(),
        src.path(),
        "/u",
        false,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(du(&fs, "/u").bytes, 600);
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
}

/// An import counts what open files have buffered against the store's `--quota`, as a write
/// does: a file held open with 600 bytes written and not yet closed, under a 1,000-byte quota,
/// leaves no room for an imported 600-byte file (it is skipped and listed), and the close
/// then commits within the quota.
#[test]
fn an_import_counts_what_open_files_have_buffered_against_the_quota() {
    let limits = Limits {
        quota_bytes: 1000,
        ..Limits::default()
    };
    let (_d, fs) = new_fs(limits);
    let (_, fh) = fs
        .create(ME, ROOT_INO, b"held.md", 0o644, 0, libc::O_WRONLY)
        .unwrap();
    fs.write(ME, fh, 0, &[1u8; 600]).unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("in.md"), [2u8; 600]).unwrap();
    let report =
        redbfs::tools::import(fs.store(), fs.limits(), src.path(), "/", false, &mut |_| {})
            .unwrap();
    assert_eq!(report.files, 0, "{report:?}");
    assert!(
        report
            .skipped
            .iter()
            .any(|(p, why)| p.ends_with("in.md") && why.contains("--quota")),
        "{report:?}"
    );
    fs.flush(fh).unwrap();
    fs.release(fh).unwrap();
    assert_eq!(du(&fs, "/").bytes, 600);
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
    // Nothing held now: the import fits.
    std::fs::write(src.path().join("in.md"), [2u8; 400]).unwrap();
    let report =
        redbfs::tools::import(fs.store(), fs.limits(), src.path(), "/", false, &mut |_| {})
            .unwrap();
    assert_eq!(report.files, 1, "{report:?}");
    assert_eq!(fs.store().quota_held(), 0);
}

/// An import stages no more than the store could ever hold: a source of 60 files of 100 bytes
/// (30 of them in a directory), into a store of at most 12 entries and 1,000 content bytes,
/// never has more than 12 entries staged (progress hears the count staged) nor more than
/// 1,000 bytes, both as a directory and as a tar archive. What is past the limits is skipped
/// with the limit's reason, and the store stays within both. Before, staging held every entry
/// the source offered: 400,000 empty tar entries against `--max-files 10` took 270 MB.
#[test]
fn an_import_stages_no_more_entries_or_bytes_than_the_limits_allow() {
    let src = tempfile::tempdir().unwrap();
    let sub = src.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    for i in 0..30 {
        std::fs::write(src.path().join(format!("f{i:02}")), [b'a'; 100]).unwrap();
        std::fs::write(sub.join(format!("g{i:02}")), [b'b'; 100]).unwrap();
    }
    let archive = tempfile::tempdir().unwrap();
    let tar_path = archive.path().join("all.tar");
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", src.path()).unwrap();
    std::fs::write(&tar_path, b.into_inner().unwrap()).unwrap();
    let bounded = |limits: Limits| {
        for tar in [false, true] {
            let (_d, fs) = new_fs(limits.clone());
            let mut most = 0;
            let import = if tar {
                redbfs::tools::import_tar
            } else {
                redbfs::tools::import
            };
            let from: &Path = if tar { &tar_path } else { src.path() };
            let report = import(fs.store(), fs.limits(), from, "/", false, &mut |n| {
                most = most.max(n)
            })
            .unwrap();
            let staged_most = limits.max_files.min(if limits.quota_bytes > 0 {
                limits.quota_bytes / 100 + 1 // the files that fit and the directory `sub`
            } else {
                u64::MAX
            });
            assert!(most <= staged_most, "tar {tar}: {most} staged, {report:?}");
            let du = du(&fs, "/");
            assert!(du.files + du.dirs <= limits.max_files, "{du:?}");
            if limits.quota_bytes > 0 {
                assert!(du.bytes <= limits.quota_bytes, "{du:?}");
                assert!(
                    report
                        .skipped
                        .iter()
                        .any(|(_, w)| w.contains("over --quota"))
                );
            } else {
                assert!(
                    report
                        .skipped
                        .iter()
                        .any(|(_, w)| w.contains("over --max-files 12"))
                );
            }
            assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
        }
    };
    bounded(Limits {
        max_files: 12,
        ..Limits::default()
    });
    bounded(Limits {
        quota_bytes: 1000,
        ..Limits::default()
    });
}

/// An import lists the first 10,000 entries it skips and counts the rest, so a source of
/// millions of symlinks costs no memory for each; `--strict` names the whole count.
#[test]
fn an_import_lists_the_first_ten_thousand_skipped_entries_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let tar_path = dir.path().join("links.tar");
    let mut b = tar::Builder::new(Vec::new());
    for i in 0..12_345 {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, format!("l{i}"), "target").unwrap();
    }
    std::fs::write(&tar_path, b.into_inner().unwrap()).unwrap();
    let (_d, fs) = new_fs(Limits::default());
    let import = |strict| {
        redbfs::tools::import_tar(fs.store(), fs.limits(), &tar_path, "/", strict, &mut |_| {})
    };
    let report = import(false).unwrap();
    assert_eq!(report.skipped.len(), 10_000);
    assert_eq!(report.skipped_unlisted, 2_345);
    assert_eq!(report.skipped_count(), 12_345);
    assert_eq!(report.skipped[0].0, "l0");
    let e = import(true).unwrap_err();
    assert!(e.contains("(12345 entries would be skipped)"), "{e}");
}

/// A commit that did not keep the aggregates (as an older release's would not) leaves them
/// stale; the next open rebuilds them in one pass, keeping the quotas.
#[test]
fn a_store_changed_without_the_aggregates_gets_them_rebuilt_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    {
        let store = Store::open_or_create(&path, (0, 0)).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let u = mkdir(&fs, ROOT_INO, "u");
        write_file(&fs, u, "a", &[1; 100]).unwrap();
        fs.set_quota("/u", 1000, 0).unwrap();
        let mut w = fs.store().write().unwrap();
        w.without_aggregates();
        let ino = w.alloc_ino().unwrap();
        let mut f = w.inode(u).unwrap().unwrap();
        f.ino = ino;
        f.kind = Kind::File;
        f.size = 0;
        f.nlink = 1;
        f.parent = u;
        f.name = "b".into();
        w.put_inode(&f).unwrap();
        w.put_dirent(u, "b", ino, Kind::File).unwrap();
        w.commit(Sync::Durable).unwrap();
        let r = fs.store().read().unwrap();
        assert!(!r.subtree_current().unwrap());
        // Tools answer from a walk meanwhile.
        assert_eq!(redbfs::tools::du(&r, "/u").unwrap().files, 2);
    }
    let store = Store::open_or_create(&path, (0, 0)).unwrap();
    assert!(store.read().unwrap().subtree_current().unwrap());
    let fs = Fs::new(store, Limits::default()).unwrap();
    let d = du(&fs, "/u");
    assert_eq!((d.files, d.bytes, d.quota_bytes), (2, 100, 1000));
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
}

/// Builds `n` files in a directory `name` under the root, in one transaction of the store.
fn build_dir(store: &Store, name: &str, n: u64) -> u64 {
    let mut w = store.write().unwrap();
    let mut root = w.inode(ROOT_INO).unwrap().unwrap();
    let dir = w.alloc_ino().unwrap();
    let now = redbfs::store::now_ns();
    let inode = |ino, kind, parent, name: &str| Inode {
        ino,
        kind,
        perm: 0o700,
        uid: 0,
        gid: 0,
        size: 0,
        nlink: if kind == Kind::Dir { 2 } else { 1 },
        parent,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        name: name.to_string(),
    };
    w.put_inode(&inode(dir, Kind::Dir, ROOT_INO, name)).unwrap();
    w.put_dirent(ROOT_INO, name, dir, Kind::Dir).unwrap();
    root.nlink += 1;
    w.put_inode(&root).unwrap();
    for i in 0..n {
        let ino = w.alloc_ino().unwrap();
        let f = format!("note-{i:05}.md");
        w.put_inode(&inode(ino, Kind::File, dir, &f)).unwrap();
        w.put_dirent(dir, &f, ino, Kind::File).unwrap();
    }
    w.commit(Sync::Durable).unwrap();
    dir
}

/// The work (store operations) of renaming `/name` to a longer name one level deeper.
fn rename_work(fs: &Fs, name: &str, into: u64) -> u64 {
    let before = fs.store().subtree_work();
    let longer = format!("{name}-renamed-to-a-much-longer-name");
    fs.rename(ME, ROOT_INO, name.as_bytes(), into, longer.as_bytes(), 0)
        .unwrap();
    fs.store().subtree_work() - before
}

#[test]
fn a_directory_move_between_quota_roots_costs_the_same_at_10_and_10000_entries() {
    let limits = Limits {
        max_path_bytes: 120,
        max_depth: 4,
        ..Limits::default()
    };
    let (_d, fs) = new_fs(limits);
    build_dir(fs.store(), "small", 10);
    build_dir(fs.store(), "large", 10_000);
    // Into another user's directory with a quota: a move between quota roots.
    let deeper = mkdir(&fs, ROOT_INO, "deeper");
    fs.set_quota("/deeper", 1 << 30, 20_000).unwrap();
    let small = rename_work(&fs, "small", deeper);
    let large = rename_work(&fs, "large", deeper);
    assert_eq!(du(&fs, "/deeper").files, 10_010);
    eprintln!("rename work: {small} operations at 10 entries, {large} at 10,000");
    assert_eq!(small, large, "work of the rename, 10 vs 10,000 entries");
    assert!(large < 50, "an O(depth) rename did {large} operations");
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
}

#[test]
fn the_path_limits_still_hold_on_every_entry_a_rename_moves() {
    let limits = Limits {
        max_path_bytes: 60,
        max_depth: 3,
        ..Limits::default()
    };
    let (_d, fs) = new_fs(limits);
    let a = mkdir(&fs, ROOT_INO, "a");
    let b = mkdir(&fs, a, "b");
    write_file(&fs, b, "a-long-file-name-of-thirty-bytes", b"x").unwrap();
    let target = mkdir(&fs, ROOT_INO, "t");
    // /t/a/b/file is 4 levels: over --max-depth 3.
    let e = fs.rename(ME, ROOT_INO, b"a", target, b"a", 0).unwrap_err();
    assert_eq!(e.errno(), libc::ELOOP);
    // /a-longer-name-of-twenty-five/b/a-long-... is 63 bytes: over 60.
    let e = fs
        .rename(
            ME,
            ROOT_INO,
            b"a",
            ROOT_INO,
            b"a-longer-name-of-twenty-five",
            0,
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENAMETOOLONG);

    // The deep entry goes: the bound stays loose until a walk finds it so and tightens it.
    fs.unlink(ME, b, b"a-long-file-name-of-thirty-bytes")
        .unwrap();
    let before = fs.store().subtree_work();
    fs.rename(
        ME,
        ROOT_INO,
        b"a",
        ROOT_INO,
        b"a-longer-name-of-twenty-five",
        0,
    )
    .unwrap();
    let walked = fs.store().subtree_work() - before;
    let before = fs.store().subtree_work();
    fs.rename(
        ME,
        ROOT_INO,
        b"a-longer-name-of-twenty-five",
        ROOT_INO,
        b"a-longer-name-of-twenty-six",
        0,
    )
    .unwrap();
    let bounded = fs.store().subtree_work() - before;
    assert!(bounded < walked, "tightened: {bounded} vs {walked}");
    // RENAME_EXCHANGE is held by the same rule: /t/x/b/c would be 4 levels.
    mkdir(&fs, b, "c");
    let x = mkdir(&fs, target, "x");
    mkdir(&fs, x, "y");
    let e = fs
        .rename(
            ME,
            ROOT_INO,
            b"a-longer-name-of-twenty-six",
            target,
            b"x",
            libc::RENAME_EXCHANGE,
        )
        .unwrap_err();
    assert_eq!(e.errno(), libc::ELOOP);
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
}

#[test]
fn the_aggregates_survive_reopen_and_match_a_walk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    {
        let store = Store::open_or_create(&path, (0, 0)).unwrap();
        let fs = Fs::new(store, Limits::default()).unwrap();
        let u = mkdir(&fs, ROOT_INO, "u");
        let v = mkdir(&fs, u, "v");
        write_file(&fs, v, "f", &[1; 70_000]).unwrap();
        write_file(&fs, u, "g", b"12345").unwrap();
        fs.set_quota("/u", 1 << 20, 100).unwrap();
    }
    let store = Store::open_or_create(&path, (0, 0)).unwrap();
    let fs = Fs::new(store, Limits::default()).unwrap();
    let d = du(&fs, "/u");
    assert_eq!((d.files, d.dirs, d.bytes), (2, 2, 70_005));
    assert_eq!((d.quota_bytes, d.quota_files), (1 << 20, 100));
    assert!(findings(&fs).is_empty(), "{:?}", findings(&fs));
}

// ---------------------------------------------------------------------------------------------
// One mount, many users

const USERS: usize = 100;
const FILES: usize = 8;
const BYTES: usize = 1500;
/// Room for every user's notes and edits.
const QUOTA: &str = "64K";
/// A hog's quota: refused within its first few notes.
const HOG_QUOTA: u64 = 8 * 1024;

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// A runner of `tests/clients/users.*` for `users`, the first of them the hog.
fn users_runner(node: bool, users_dir: &Path, users: &[String]) -> Command {
    let dir = clients_dir();
    let mut c = if node {
        let mut c = Command::new("node");
        c.arg(dir.join("users.mjs"));
        c
    } else {
        let python = dir.join(".venv/bin/python");
        assert!(
            python.exists(),
            "{} is missing: run `bash tests/clients/setup.sh` first",
            python.display()
        );
        let mut c = Command::new(python);
        c.arg(dir.join("users.py"));
        c
    };
    assert!(
        dir.join("node_modules/@anthropic-ai/sdk").exists(),
        "the Node SDK is not installed: run `bash tests/clients/setup.sh` first"
    );
    c.current_dir(&dir)
        .arg(users_dir)
        .arg(FILES.to_string())
        .arg(BYTES.to_string())
        .arg(&users[0])
        .args(users);
    c
}

fn store_json(m: &common::TestMount, args: &[&str]) -> serde_json::Value {
    let mut all = vec![args[0], m.store.to_str().unwrap()];
    all.extend(&args[1..]);
    all.push("--json");
    let out = common::redbfs(&all);
    assert!(out.status.success(), "redbfs {all:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn run_ok(m: &common::TestMount, args: &[&str]) {
    let mut all = vec![args[0], m.store.to_str().unwrap()];
    all.extend(&args[1..]);
    let out = common::redbfs(&all);
    assert!(out.status.success(), "redbfs {all:?}: {out:?}");
}

/// Every file under `root` by relative path, with its content.
fn files_below(root: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    common::walk_tree(root)
        .unwrap()
        .into_iter()
        .map(|(p, w)| (p, w.content))
        .collect()
}

#[test]
fn a_hundred_users_with_sdk_tools_each_held_by_their_own_quota() {
    if !common::fuse_available() {
        return;
    }
    let m = common::TestMount::new();
    let users: Vec<String> = (0..USERS).map(|i| format!("u{i:03}")).collect();
    let users_dir = m.path("users");
    for u in &users {
        std::fs::create_dir_all(users_dir.join(u)).unwrap();
    }
    // Four processes of 25 users each, two per SDK; the first user of each is a hog.
    let groups: Vec<&[String]> = users.chunks(USERS / 4).collect();
    let hogs: Vec<&String> = groups.iter().map(|g| &g[0]).collect();
    for u in &users {
        let limit = if hogs.contains(&u) {
            HOG_QUOTA.to_string()
        } else {
            QUOTA.to_string()
        };
        run_ok(&m, &["quota", &format!("/users/{u}"), "--bytes", &limit]);
    }
    let children: Vec<_> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            users_runner(i % 2 == 0, &users_dir, g)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a users runner")
        })
        .collect();
    let mut report = serde_json::Map::new();
    for (i, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "runner {i}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        report.extend(v.as_object().unwrap().clone());
    }
    assert_eq!(report.len(), USERS);
    for (i, g) in groups.iter().enumerate() {
        let node = i % 2 == 0;
        for u in g.iter() {
            let r = &report[u.as_str()];
            let errors: Vec<&str> = r["errors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e.as_str().unwrap())
                .collect();
            if hogs.contains(&u) {
                assert!(!errors.is_empty(), "{u} was never refused: {r}");
                // What each SDK's tool tells the model (see tests/clients/refusals.expected.txt).
                let says = if node {
                    "Unknown system error -122"
                } else {
                    "OSError(122, 'Disk quota exceeded')"
                };
                for e in &errors {
                    assert!(e.contains(says), "{u}: {e}");
                }
            } else {
                assert!(errors.is_empty(), "{u}: {errors:?}");
                assert_eq!(r["ok"], FILES + 2, "{u}: {r}");
            }
        }
    }
    // Each root's usage is what a walk of it counts; the hogs stayed within their quota.
    let listed = store_json(&m, &["quota"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), USERS);
    for q in listed {
        let u = q["path"].as_str().unwrap().trim_start_matches("/users/");
        let walked = common::walk_tree(&users_dir.join(u)).unwrap();
        let bytes: u64 = walked
            .values()
            .map(|w| w.content.as_ref().map_or(0, |c| c.len() as u64))
            .sum();
        assert_eq!(q["bytes"].as_u64(), Some(bytes), "{u}: {q}");
        assert_eq!(q["files"].as_u64(), Some(walked.len() as u64), "{u}: {q}");
        if hogs.iter().any(|h| h.as_str() == u) {
            assert!(bytes <= HOG_QUOTA, "{u}: {bytes}");
        }
        let du = store_json(&m, &["du", &format!("/users/{u}")]);
        assert_eq!(du["bytes"].as_u64(), Some(bytes), "{u}: {du}");
    }
    // df inside a root: that root's quota and usage.
    let hog_dir = users_dir.join(hogs[0].as_str());
    let s = nix::sys::statvfs::statvfs(&hog_dir).unwrap();
    assert_eq!(s.blocks() * s.fragment_size(), HOG_QUOTA);
    let used = (s.blocks() - s.blocks_free()) * s.fragment_size();
    assert!(used > 0 && used <= HOG_QUOTA, "{used}");
    let s = nix::sys::statvfs::statvfs(&users_dir.join("u001")).unwrap();
    assert_eq!(s.blocks() * s.fragment_size(), 64 * 1024);

    // A rollback of one user leaves every other user's files byte-identical.
    let mark = store_json(&m, &["log", "-n", "1"]);
    let point = mark
        .as_array()
        .and_then(|a| a.first())
        .map(|r| r["seq"].clone())
        .unwrap();
    let victim = users_dir.join("u010/memories");
    let then = files_below(&users_dir.join("u010"));
    std::fs::remove_file(victim.join("note-1.md")).unwrap();
    std::fs::write(victim.join("note-0.md"), b"overwritten").unwrap();
    std::fs::write(victim.join("new.md"), b"new").unwrap();
    std::fs::write(users_dir.join("u011/memories/later.md"), b"after the point").unwrap();
    let others: BTreeMap<&String, _> = users
        .iter()
        .filter(|u| u.as_str() != "u010")
        .map(|u| (u, files_below(&users_dir.join(u))))
        .collect();
    run_ok(
        &m,
        &[
            "rollback",
            "--path",
            "/users/u010",
            "--to",
            &point.to_string(),
        ],
    );
    assert_eq!(files_below(&users_dir.join("u010")), then);
    for (u, before) in &others {
        assert_eq!(&files_below(&users_dir.join(u)), before, "{u} changed");
    }
    assert_eq!(
        store_json(&m, &["du", "/users/u010"])["quota_bytes"].as_u64(),
        Some(64 * 1024),
        "the user's quota stays"
    );

    // Expiry under one user: one transaction, the others untouched.
    let before_expiry = files_below(&users_dir.join("u098"));
    let n = files_below(&users_dir.join("u099/memories")).len();
    run_ok(
        &m,
        &["expire", "--path", "/users/u099", "--before", "2099-01-01"],
    );
    assert!(files_below(&users_dir.join("u099/memories")).is_empty());
    assert_eq!(files_below(&users_dir.join("u098")), before_expiry);
    // The files the kernel still referenced were orphaned, and reclaimed after.
    let last = store_json(&m, &["log", "-n", "3"]);
    let expiries: Vec<&serde_json::Value> = last
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["op"] == "expire")
        .collect();
    assert_eq!(expiries.len(), 1, "{last}");
    assert_eq!(expiries[0]["paths"].as_array().unwrap().len(), n, "{last}");
    assert_eq!(store_json(&m, &["du", "/users/u099"])["bytes"], 0);

    // One user's memories alone: a store of that subtree, and an export of it.
    let out = m.dir.path().join("u003.redb");
    run_ok(
        &m,
        &["snapshot", out.to_str().unwrap(), "--path", "/users/u003"],
    );
    let cat = common::redbfs(&["cat", out.to_str().unwrap(), "/memories/note-3.md"]);
    assert_eq!(
        cat.stdout,
        std::fs::read(users_dir.join("u003/memories/note-3.md")).unwrap()
    );
    assert!(
        common::redbfs(&["check", out.to_str().unwrap()])
            .status
            .success()
    );
    let exported = m.dir.path().join("u003-export");
    let out = common::redbfs(&[
        "export",
        m.store.to_str().unwrap(),
        exported.to_str().unwrap(),
        "--path",
        "/users/u003",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(files_below(&exported), files_below(&users_dir.join("u003")));
    let check = common::redbfs(&["check", m.store.to_str().unwrap()]);
    assert!(check.status.success(), "{check:?}");
}
