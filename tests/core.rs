//! Core tests: `Fs` driven directly over a store in a temporary file, no mount.

use redbfs::fs::{Caller, Error, Fs, Limits, OpenMode, SetAttr, TimeSet};
use redbfs::store::{Kind, ROOT_INO, Store, wal};

mod common;

use common::core_fs::crash_copy;

const ME: Caller = Caller {
    uid: 1000,
    gid: 1000,
    pid: 1,
};

fn new_fs() -> (tempfile::TempDir, Fs) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (1000, 1000)).unwrap();
    (dir, Fs::new(store, Limits::default()).unwrap())
}

fn reopen(dir: &tempfile::TempDir, fs: Fs) -> Fs {
    drop(fs);
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    Fs::new(store, Limits::default()).unwrap()
}

fn write_file(fs: &Fs, parent: u64, name: &str, data: &[u8]) -> u64 {
    common::core_fs::write_file(fs, ME, parent, name, 0o600, data, false)
}

fn read_all(fs: &Fs, ino: u64) -> Vec<u8> {
    let fh = fs.open(ME, ino, OpenMode::default()).unwrap();
    let data = fs.read(fh, 0, u32::MAX).unwrap();
    fs.release(fh).unwrap();
    data
}

fn names(fs: &Fs, dir: u64) -> Vec<String> {
    let fh = fs.opendir(dir).unwrap();
    let e = fs.readdir(fh, 0).unwrap();
    fs.releasedir(fh).unwrap();
    e.iter().skip(2).map(|e| e.name.clone()).collect()
}

#[test]
fn create_write_read_survives_reopen() {
    let (dir, fs) = new_fs();
    let d = fs.mkdir(ME, ROOT_INO, b"memories", 0o700, 0).unwrap();
    assert_eq!(d.nlink, 2);
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
    let ino = write_file(&fs, d.ino, "notes.md", b"hello world");
    let fs = reopen(&dir, fs);
    let found = fs.lookup(d.ino, b"notes.md").unwrap();
    assert_eq!(found.ino, ino);
    assert_eq!(found.size, 11);
    assert_eq!(found.uid, 1000);
    assert_eq!(found.perm, 0o600);
    assert_eq!(read_all(&fs, ino), b"hello world");
}

#[test]
fn exclusive_create_of_existing_name_is_eexist() {
    let (_d, fs) = new_fs();
    write_file(&fs, ROOT_INO, "a", b"1");
    let e = fs
        .create(ME, ROOT_INO, b"a", 0o600, 0, libc::O_WRONLY)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EEXIST);
}

#[test]
fn holes_read_as_zeros_and_size_is_exact_while_buffered() {
    let (_d, fs) = new_fs();
    let (inode, fh) = fs
        .create(ME, ROOT_INO, b"sparse", 0o644, 0, libc::O_RDWR)
        .unwrap();
    fs.write(ME, fh, 200_000, b"end").unwrap();
    // Another handle sees the buffered size before any commit.
    let fh2 = fs.open(ME, inode.ino, OpenMode::default()).unwrap();
    assert_eq!(fs.getattr(inode.ino).unwrap().size, 200_003);
    let data = fs.read(fh2, 0, 300_000).unwrap();
    assert_eq!(data.len(), 200_003);
    assert!(data[..200_000].iter().all(|&b| b == 0));
    assert_eq!(&data[200_000..], b"end");
    fs.release(fh).unwrap();
    fs.release(fh2).unwrap();
    assert_eq!(read_all(&fs, inode.ino).len(), 200_003);
}

#[test]
fn truncate_then_grow_reads_zeros_not_old_bytes() {
    let (_d, fs) = new_fs();
    let ino = write_file(&fs, ROOT_INO, "f", &vec![7u8; 150_000]);
    fs.setattr(
        ME,
        ino,
        SetAttr {
            size: Some(70_000),
            ..SetAttr::default()
        },
    )
    .unwrap();
    fs.setattr(
        ME,
        ino,
        SetAttr {
            size: Some(140_000),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let data = read_all(&fs, ino);
    assert_eq!(data.len(), 140_000);
    assert!(data[..70_000].iter().all(|&b| b == 7));
    assert!(data[70_000..].iter().all(|&b| b == 0));
}

#[test]
fn o_trunc_is_buffered_until_close() {
    let (_d, fs) = new_fs();
    let ino = write_file(&fs, ROOT_INO, "f", b"old content");
    let fh = fs
        .open(
            ME,
            ino,
            OpenMode {
                write: true,
                truncate: true,
                ..OpenMode::default()
            },
        )
        .unwrap();
    fs.write(ME, fh, 0, b"new").unwrap();
    // The store still has the old content until the handle commits.
    let stored = fs.store().read().unwrap().inode(ino).unwrap().unwrap();
    assert_eq!(stored.size, 11);
    fs.release(fh).unwrap();
    assert_eq!(read_all(&fs, ino), b"new");
}

#[test]
fn append_writes_at_the_end() {
    let (_d, fs) = new_fs();
    let ino = write_file(&fs, ROOT_INO, "log", b"one\n");
    let fh = fs
        .open(
            ME,
            ino,
            OpenMode {
                write: true,
                append: true,
                ..OpenMode::default()
            },
        )
        .unwrap();
    fs.write(ME, fh, 0, b"two\n").unwrap();
    fs.release(fh).unwrap();
    assert_eq!(read_all(&fs, ino), b"one\ntwo\n");
}

#[test]
fn rmdir_non_empty_is_enotempty() {
    let (_d, fs) = new_fs();
    let d = fs.mkdir(ME, ROOT_INO, b"d", 0o755, 0).unwrap();
    write_file(&fs, d.ino, "x", b"1");
    assert_eq!(
        fs.rmdir(ME, ROOT_INO, b"d").unwrap_err().errno(),
        libc::ENOTEMPTY
    );
    fs.unlink(ME, d.ino, b"x").unwrap();
    fs.rmdir(ME, ROOT_INO, b"d").unwrap();
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 2);
    assert!(matches!(fs.lookup(ROOT_INO, b"d"), Err(Error::NotFound)));
}

#[test]
fn rename_replaces_files_and_moves_directories() {
    let (_d, fs) = new_fs();
    let a = fs.mkdir(ME, ROOT_INO, b"a", 0o755, 0).unwrap();
    let b = fs.mkdir(ME, ROOT_INO, b"b", 0o755, 0).unwrap();
    let src = write_file(&fs, a.ino, "src", b"new");
    write_file(&fs, a.ino, "dst", b"old");
    fs.rename(ME, a.ino, b"src", a.ino, b"dst", 0).unwrap();
    assert_eq!(names(&fs, a.ino), vec!["dst"]);
    assert_eq!(read_all(&fs, src), b"new");
    // Move a into b: nlink of both parents follows.
    fs.rename(ME, ROOT_INO, b"a", b.ino, b"a2", 0).unwrap();
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(fs.getattr(b.ino).unwrap().nlink, 3);
    assert_eq!(fs.lookup(b.ino, b"a2").unwrap().ino, a.ino);
    assert_eq!(fs.path_of(src), "/b/a2/dst");
}

#[test]
fn rename_errors() {
    let (_d, fs) = new_fs();
    let a = fs.mkdir(ME, ROOT_INO, b"a", 0o755, 0).unwrap();
    let sub = fs.mkdir(ME, a.ino, b"sub", 0o755, 0).unwrap();
    let full = fs.mkdir(ME, ROOT_INO, b"full", 0o755, 0).unwrap();
    write_file(&fs, full.ino, "x", b"1");
    write_file(&fs, ROOT_INO, "f", b"1");
    let errno = |r: Result<(), Error>| r.unwrap_err().errno();
    assert_eq!(
        errno(fs.rename(ME, ROOT_INO, b"a", sub.ino, b"a", 0)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(ME, ROOT_INO, b"a", a.ino, b"x", 0)),
        libc::EINVAL
    );
    assert_eq!(
        errno(fs.rename(ME, ROOT_INO, b"a", ROOT_INO, b"full", 0)),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno(fs.rename(ME, ROOT_INO, b"a", ROOT_INO, b"f", 0)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(fs.rename(ME, ROOT_INO, b"f", ROOT_INO, b"a", 0)),
        libc::EISDIR
    );
    assert_eq!(
        errno(fs.rename(
            ME,
            ROOT_INO,
            b"f",
            ROOT_INO,
            b"full",
            libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    assert_eq!(
        errno(fs.rename(ME, ROOT_INO, b"nope", ROOT_INO, b"x", 0)),
        libc::ENOENT
    );
}

#[test]
fn rename_exchange_swaps_atomically() {
    let (_d, fs) = new_fs();
    let d = fs.mkdir(ME, ROOT_INO, b"d", 0o755, 0).unwrap();
    let f = write_file(&fs, ROOT_INO, "f", b"file");
    fs.rename(ME, ROOT_INO, b"d", ROOT_INO, b"f", libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"f").unwrap().ino, d.ino);
    assert_eq!(fs.lookup(ROOT_INO, b"d").unwrap().ino, f);
    assert_eq!(fs.lookup(ROOT_INO, b"d").unwrap().kind, Kind::File);
}

#[test]
fn unlinked_open_file_lives_until_last_release() {
    let (dir, fs) = new_fs();
    let (inode, fh) = fs
        .create(ME, ROOT_INO, b"tmp", 0o600, 0, libc::O_RDWR)
        .unwrap();
    fs.write(ME, fh, 0, b"still here").unwrap();
    fs.flush(fh).unwrap();
    fs.unlink(ME, ROOT_INO, b"tmp").unwrap();
    assert!(matches!(fs.lookup(ROOT_INO, b"tmp"), Err(Error::NotFound)));
    fs.write(ME, fh, 10, b"!").unwrap();
    assert_eq!(fs.read(fh, 0, 100).unwrap(), b"still here!");
    assert_eq!(
        fs.store().read().unwrap().orphans().unwrap(),
        vec![inode.ino]
    );
    fs.release(fh).unwrap();
    // The kernel still holds the create's reference: the orphan stays until FORGET.
    assert_eq!(
        fs.store().read().unwrap().orphans().unwrap(),
        vec![inode.ino]
    );
    fs.forget(inode.ino, 1);
    // The daemon reclaims in batches; here, at once.
    fs.reclaim_queued();
    assert!(fs.store().read().unwrap().orphans().unwrap().is_empty());
    assert!(
        fs.store()
            .read()
            .unwrap()
            .inode(inode.ino)
            .unwrap()
            .is_none()
    );
    let fs = reopen(&dir, fs);
    assert_eq!(fs.store().read().unwrap().usage().unwrap().files, 0);
}

/// A file replaced by rename vanished for a process whose kernel had resolved the name just
/// before: the old inode was deleted at the rename, so the OPEN that followed found nothing
/// (ENOENT, where ext4 opens the old file). An inode the kernel references lives, with its
/// last content, until FORGET.
#[test]
fn a_replaced_file_serves_its_last_content_until_the_kernel_forgets_it() {
    let (_dir, fs) = new_fs();
    let old = write_file(&fs, ROOT_INO, "t.md", b"old");
    // Another process resolves t.md (a lookup reference), then the file is replaced.
    assert_eq!(fs.lookup(ROOT_INO, b"t.md").unwrap().ino, old);
    let new = write_file(&fs, ROOT_INO, ".tmp", b"new content");
    fs.rename(ME, ROOT_INO, b".tmp", ROOT_INO, b"t.md", 0)
        .unwrap();
    assert_eq!(fs.lookup(ROOT_INO, b"t.md").unwrap().ino, new);
    fs.forget(new, 1);
    // The held reference still opens, reads and stats the old inode.
    let attr = fs.getattr(old).unwrap();
    assert_eq!((attr.size, attr.nlink), (3, 0));
    assert_eq!(read_all(&fs, old), b"old");
    fs.setattr(
        ME,
        old,
        SetAttr {
            mode: Some(0o640),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fs.store().read().unwrap().orphans().unwrap(), vec![old]);
    fs.forget(old, 1);
    // The daemon reclaims in batches; here, at once.
    fs.reclaim_queued();
    assert!(fs.store().read().unwrap().orphans().unwrap().is_empty());
    assert!(matches!(fs.getattr(old), Err(Error::NotFound)));
    assert_eq!(read_all(&fs, new), b"new content");
}

/// The same for a directory removed while the kernel references it: it lists as empty
/// until FORGET, and a descriptor open on it keeps it after that.
#[test]
fn a_removed_directory_lives_while_referenced_or_open() {
    let (_dir, fs) = new_fs();
    let d = fs.mkdir(ME, ROOT_INO, b"d", 0o700, 0).unwrap().ino;
    fs.rmdir(ME, ROOT_INO, b"d").unwrap();
    assert_eq!(fs.getattr(d).unwrap().nlink, 0);
    let fh = fs.opendir(d).unwrap();
    let names: Vec<_> = fs
        .readdir(fh, 0)
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    assert_eq!(names, [".", ".."]);
    fs.forget(d, 1);
    assert!(fs.getattr(d).is_ok(), "the open descriptor keeps it");
    fs.releasedir(fh).unwrap();
    // The daemon reclaims in batches; here, at once.
    fs.reclaim_queued();
    assert!(matches!(fs.getattr(d), Err(Error::NotFound)));
    assert!(fs.store().read().unwrap().orphans().unwrap().is_empty());
}

#[test]
fn orphans_left_by_a_crash_are_reclaimed_at_open() {
    let (dir, fs) = new_fs();
    let ino = write_file(&fs, ROOT_INO, "tmp", b"content");
    // What a crash leaves when a file was unlinked while open: no name, an orphan mark.
    let mut w = fs.store().write().unwrap();
    w.remove_dirent(ROOT_INO, "tmp").unwrap();
    w.add_orphan(ino).unwrap();
    w.commit(redbfs::store::Sync::Durable).unwrap();
    let fs = reopen(&dir, fs);
    let r = fs.store().read().unwrap();
    assert!(r.inode(ino).unwrap().is_none());
    assert!(r.orphans().unwrap().is_empty());
    assert!(r.all_chunks().unwrap().is_empty());
    assert_eq!(redbfs::check::invariants(&r).unwrap(), Vec::<String>::new());
}

#[test]
fn setattr_mode_times_and_owner() {
    let (_d, fs) = new_fs();
    let ino = write_file(&fs, ROOT_INO, "f", b"x");
    let i = fs
        .setattr(
            ME,
            ino,
            SetAttr {
                mode: Some(0o100640),
                uid: Some(7),
                gid: Some(8),
                atime: Some(TimeSet::At(1_000_000_001)),
                mtime: Some(TimeSet::At(2_000_000_002)),
                ..SetAttr::default()
            },
        )
        .unwrap();
    assert_eq!((i.perm, i.uid, i.gid), (0o640, 7, 8));
    assert_eq!((i.atime, i.mtime), (1_000_000_001, 2_000_000_002));
    assert!(i.ctime > 2_000_000_002);
}

#[test]
fn setgid_directories_pass_on_their_group() {
    let (_d, fs) = new_fs();
    let d = fs.mkdir(ME, ROOT_INO, b"shared", 0o2775, 0).unwrap();
    fs.setattr(
        ME,
        d.ino,
        SetAttr {
            gid: Some(4242),
            mode: Some(0o2775),
            ..SetAttr::default()
        },
    )
    .unwrap();
    let sub = fs.mkdir(ME, d.ino, b"sub", 0o755, 0).unwrap();
    assert_eq!(sub.gid, 4242);
    assert_ne!(sub.perm & libc::S_ISGID, 0);
    let f = fs.mknod(ME, d.ino, b"f", libc::S_IFREG | 0o644, 0).unwrap();
    assert_eq!(f.gid, 4242);
}

#[test]
fn special_files_are_refused_with_eperm() {
    let (_d, fs) = new_fs();
    for kind in [libc::S_IFIFO, libc::S_IFSOCK, libc::S_IFCHR, libc::S_IFBLK] {
        let e = fs.mknod(ME, ROOT_INO, b"x", kind | 0o644, 0).unwrap_err();
        assert_eq!(e.errno(), libc::EPERM);
    }
}

#[test]
fn names_are_normalised_to_nfc() {
    let (_d, fs) = new_fs();
    write_file(&fs, ROOT_INO, "cafe\u{301}.md", b"x");
    assert_eq!(names(&fs, ROOT_INO), vec!["caf\u{e9}.md"]);
    assert!(fs.lookup(ROOT_INO, "caf\u{e9}.md".as_bytes()).is_ok());
    assert!(fs.lookup(ROOT_INO, "cafe\u{301}.md".as_bytes()).is_ok());
    let e = fs.mkdir(ME, ROOT_INO, b"bad\nname", 0o755, 0).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
}

/// An offset names the same point in every listing of a directory, whichever handle took it
/// and whenever: a read that goes on from one handle's listing with another's taken after the
/// directory changed (as the kernel's readdir cache does with two listers) lists each entry
/// that stayed exactly once. Offsets were indexes into each handle's own listing, so the
/// second listing's index 52 was another entry than the first's: names came twice or not
/// at all.
#[test]
fn readdir_offsets_mean_the_same_in_every_handle_while_the_directory_changes() {
    let (_d, fs) = new_fs();
    for i in 0..100 {
        write_file(&fs, ROOT_INO, &format!("f{i:03}"), b"");
    }
    let fh = fs.opendir(ROOT_INO).unwrap();
    let first = fs.readdir(fh, 0).unwrap();
    assert_eq!((first[0].off, first[1].off), (1, 2), ". and ..");
    assert!(first.windows(2).all(|w| w[0].off < w[1].off));
    // Half read through the first handle, then the directory changes, then a second handle
    // (its listing taken now) goes on from the same offset.
    let cut = first[52].off;
    fs.unlink(ME, ROOT_INO, b"f050").unwrap();
    for i in 0..20 {
        write_file(&fs, ROOT_INO, &format!("new{i}"), b"");
    }
    let fh2 = fs.opendir(ROOT_INO).unwrap();
    let _ = fs.readdir(fh2, 0).unwrap();
    let later = fs.readdir(fh2, cut).unwrap();
    let mut seen: Vec<&str> = first[..=52].iter().map(|e| e.name.as_str()).collect();
    seen.extend(
        later[redbfs::fs::resume_at(&later, cut)..]
            .iter()
            .map(|e| e.name.as_str()),
    );
    for i in 0..100 {
        let name = format!("f{i:03}");
        let n = seen.iter().filter(|s| **s == name).count();
        if i == 50 {
            assert!(n <= 1, "{name} listed {n} times");
        } else {
            assert_eq!(n, 1, "{name} listed {n} times");
        }
    }
    // The same offset in the first handle's own listing resumes at the same point.
    assert_eq!(
        first[redbfs::fs::resume_at(&first, cut)..]
            .first()
            .map(|e| e.off),
        first.get(53).map(|e| e.off)
    );
    fs.releasedir(fh).unwrap();
    fs.releasedir(fh2).unwrap();
}

#[test]
fn limits_refuse_with_their_errno() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    let limits = Limits {
        max_file_bytes: 1000,
        quota_bytes: 1500,
        max_files: 4,
        max_depth: 3,
        max_path_bytes: 20,
        ..Limits::default()
    };
    let fs = Fs::new(store, limits).unwrap();
    let (_, fh) = fs
        .create(ME, ROOT_INO, b"a", 0o644, 0, libc::O_WRONLY)
        .unwrap();
    assert_eq!(
        fs.write(ME, fh, 0, &[1u8; 1001]).unwrap_err().errno(),
        libc::EFBIG
    );
    fs.write(ME, fh, 0, &[1u8; 1000]).unwrap();
    fs.release(fh).unwrap();
    let (_, fh) = fs
        .create(ME, ROOT_INO, b"b", 0o644, 0, libc::O_WRONLY)
        .unwrap();
    assert_eq!(
        fs.write(ME, fh, 0, &[1u8; 600]).unwrap_err().errno(),
        libc::ENOSPC
    );
    fs.release(fh).unwrap();
    let d1 = fs.mkdir(ME, ROOT_INO, b"d1", 0o755, 0).unwrap();
    let e = fs
        .mkdir(ME, d1.ino, b"this-name-is-too-long", 0o755, 0)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENAMETOOLONG);
    assert_eq!(
        fs.mkdir(ME, d1.ino, b"d2", 0o755, 0).unwrap_err().errno(),
        libc::ENOSPC,
        "root, a, b, d1 already make 4 inodes"
    );
}

/// Guards the lock order (a content lock before the store's write lock, never the other way):
/// an unlink under the write lock once waited for a content lock held by a flush that was
/// waiting for the write lock, and the mount hung. Writers, flushers, unlinkers, renamers and
/// listers run together on a few names; the test fails if they do not finish.
#[test]
fn concurrent_writes_unlinks_and_listings_do_not_deadlock() {
    let (_d, fs) = new_fs();
    let fs = std::sync::Arc::new(fs);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for t in 0..6u64 {
        let fs = fs.clone();
        let done = done_tx.clone();
        std::thread::spawn(move || {
            for i in 0..400u64 {
                let name = format!("f{}", (i + t) % 5);
                match (t + i) % 4 {
                    0 | 1 => {
                        let fh = match fs.lookup(ROOT_INO, name.as_bytes()) {
                            Ok(inode) => fs
                                .open(
                                    ME,
                                    inode.ino,
                                    OpenMode {
                                        write: true,
                                        ..OpenMode::default()
                                    },
                                )
                                .ok(),
                            Err(_) => fs
                                .create(ME, ROOT_INO, name.as_bytes(), 0o644, 0, libc::O_RDWR)
                                .ok()
                                .map(|x| x.1),
                        };
                        if let Some(fh) = fh {
                            let _ = fs.write(ME, fh, i * 10, b"0123456789");
                            let _ = fs.flush(fh);
                            let _ = fs.read(fh, 0, 4096);
                            let _ = fs.release(fh);
                        }
                    }
                    2 => {
                        let _ = fs.unlink(ME, ROOT_INO, name.as_bytes());
                        let _ = fs.rename(ME, ROOT_INO, name.as_bytes(), ROOT_INO, b"f0", 0);
                    }
                    _ => {
                        let fh = fs.opendir(ROOT_INO).unwrap();
                        let entries = fs.readdir(fh, 0).unwrap();
                        let _ = fs.attrs(&entries);
                        fs.releasedir(fh).unwrap();
                    }
                }
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..6 {
        done_rx
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("a worker is stuck: lock-order deadlock");
    }
    let r = fs.store().read().unwrap();
    assert_eq!(redbfs::check::invariants(&r).unwrap(), Vec::<String>::new());
}

/// futimens through one descriptor while a close through another (a forked child's copy, say)
/// commits the earlier buffered write: the write came first, so the explicit time must win
/// whichever request the daemon serves first.
#[test]
fn explicit_mtime_wins_over_a_concurrent_flush_of_earlier_writes() {
    let (_d, fs) = new_fs();
    let ino = write_file(&fs, ROOT_INO, "f", b"x");
    let rw = OpenMode {
        write: true,
        ..OpenMode::default()
    };
    for i in 0..200i64 {
        let a = fs.open(ME, ino, rw).unwrap();
        let b = fs.open(ME, ino, rw).unwrap();
        fs.write(ME, a, 0, b"buffered").unwrap();
        let m = 1_000_000_000 + i;
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                fs.flush(b).unwrap();
            });
            barrier.wait();
            let set = SetAttr {
                mtime: Some(TimeSet::At(m)),
                ..SetAttr::default()
            };
            fs.setattr(ME, ino, set).unwrap();
        });
        assert_eq!(fs.getattr(ino).unwrap().mtime, m, "round {i}, while open");
        fs.release(b).unwrap();
        fs.release(a).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().mtime, m, "round {i}, after close");
    }
}

// ---- the write-ahead log ----

/// Opens the store at `path` and checks that directory `dir` holds `expected` and that the
/// store's invariants hold.
fn assert_recovered(
    path: &std::path::Path,
    dir: u64,
    expected: &std::collections::BTreeMap<String, Vec<u8>>,
) -> Fs {
    let fs = open_at(path);
    assert_eq!(&contents(&fs, dir), expected);
    let r = fs.store().read().unwrap();
    assert_eq!(redbfs::check::invariants(&r).unwrap(), Vec::<String>::new());
    drop(r);
    fs
}

fn open_at(path: &std::path::Path) -> Fs {
    Fs::new(
        Store::open_or_create(path, (0, 0)).unwrap(),
        Limits::default(),
    )
    .unwrap()
}

/// Every file of directory `dir` with its content.
fn contents(fs: &Fs, dir: u64) -> std::collections::BTreeMap<String, Vec<u8>> {
    names(fs, dir)
        .into_iter()
        .map(|n| {
            let ino = fs.lookup(dir, n.as_bytes()).unwrap().ino;
            let data = read_all(fs, ino);
            (n, data)
        })
        .collect()
}

/// Note `i`'s content: `size` bytes of "note i, " repeated.
fn note(i: usize, size: usize) -> Vec<u8> {
    format!("note {i}, ")
        .into_bytes()
        .into_iter()
        .cycle()
        .take(size)
        .collect()
}

/// 50 notes, one renamed and one deleted; returns the directory and what it holds.
fn notes(
    fs: &Fs,
    sizes: impl Fn(usize) -> usize,
) -> (u64, std::collections::BTreeMap<String, Vec<u8>>) {
    let d = fs.mkdir(ME, ROOT_INO, b"memories", 0o700, 0).unwrap().ino;
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..50 {
        let name = format!("note-{i}.md");
        let data = note(i, sizes(i));
        write_file(fs, d, &name, &data);
        expected.insert(name, data);
    }
    fs.rename(ME, d, b"note-0.md", d, b"renamed.md", 0).unwrap();
    let moved = expected.remove("note-0.md").unwrap();
    expected.insert("renamed.md".into(), moved);
    fs.unlink(ME, d, b"note-1.md").unwrap();
    expected.remove("note-1.md");
    (d, expected)
}

#[test]
fn the_log_brings_back_commits_the_store_file_had_not_made_durable() {
    let (dir, fs) = new_fs();
    fs.store().set_keep_history(86_400 * 1_000_000_000).unwrap();
    let (d, expected) = notes(&fs, |i| 100 + 37 * i);
    let history = fs.store().read().unwrap().last_seq().unwrap();
    assert!(
        history > 50,
        "history is on: the log carries its records too"
    );
    let crashed = dir.path().join("crashed.redb");
    crash_copy(&dir.path().join("s.redb"), &crashed);
    let bare = dir.path().join("bare.redb");
    std::fs::copy(&crashed, &bare).unwrap();
    drop(fs);

    // The store file alone rolls back to its last durable commit: the notes live in the log.
    let alone = open_at(&bare);
    assert!(alone.lookup(ROOT_INO, b"memories").is_err());
    drop(alone);

    let fs = assert_recovered(&crashed, d, &expected);
    assert_eq!(fs.store().read().unwrap().last_seq().unwrap(), history);
    assert!(
        !wal::path_of(&crashed).exists(),
        "the log is applied and removed at open"
    );
    // And the store goes on from there, through another crash.
    write_file(&fs, d, "after.md", b"after the crash");
    let mut expected = expected;
    expected.insert("after.md".into(), b"after the crash".to_vec());
    let again = dir.path().join("again.redb");
    crash_copy(&crashed, &again);
    drop(fs);
    assert_recovered(&again, d, &expected);
}

#[test]
fn a_torn_last_record_is_dropped_and_the_rest_applied() {
    let (dir, fs) = new_fs();
    let (d, mut expected) = notes(&fs, |i| 100 + 37 * i);
    let crashed = dir.path().join("crashed.redb");
    crash_copy(&dir.path().join("s.redb"), &crashed);
    drop(fs);
    // The last record is the unlink of note-1.md; damage its last byte, as a write torn by a
    // power cut leaves it (never acknowledged, since its fdatasync had not returned).
    let log = wal::path_of(&crashed);
    let mut bytes = std::fs::read(&log).unwrap();
    let last = bytes.iter().rposition(|&b| b != 0).unwrap();
    bytes[last] ^= 0xff;
    std::fs::write(&log, &bytes).unwrap();

    expected.insert("note-1.md".into(), note(1, 100 + 37));
    assert_recovered(&crashed, d, &expected);
}

#[test]
fn commits_past_the_log_s_capacity_and_large_files_survive_a_crash() {
    let (dir, fs) = new_fs();
    // 50 notes of up to 300 KB fill the log several times over (each time a checkpoint
    // starts it again); a 2 MiB file is too large for one record and commits as a checkpoint.
    let (d, mut expected) = notes(&fs, |i| 1000 + i * 6000);
    let big: Vec<u8> = (0..2 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    write_file(&fs, d, "big.bin", &big);
    expected.insert("big.bin".into(), big);
    write_file(&fs, d, "small.md", b"after the big one");
    expected.insert("small.md".into(), b"after the big one".to_vec());
    let crashed = dir.path().join("crashed.redb");
    crash_copy(&dir.path().join("s.redb"), &crashed);
    drop(fs);
    assert_recovered(&crashed, d, &expected);
}

#[test]
fn a_clean_close_leaves_the_store_file_complete_on_its_own() {
    let (dir, fs) = new_fs();
    let (d, expected) = notes(&fs, |i| 100 + 37 * i);
    let path = dir.path().join("s.redb");
    assert!(wal::path_of(&path).exists(), "a store in use has a log");
    drop(fs);
    assert!(
        !wal::path_of(&path).exists(),
        "closing checkpoints and removes the log"
    );
    let copy = dir.path().join("copy.redb");
    std::fs::copy(&path, &copy).unwrap();
    assert_recovered(&copy, d, &expected);
}

/// With every write over `--max-buffer`, each buffer moves to the spill file at once: reads,
/// overwrites, truncation and the commit all work from there.
#[test]
fn spilled_content_reads_writes_truncates_and_commits_as_buffered_content() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (1000, 1000)).unwrap();
    let limits = Limits {
        max_buffer_bytes: 1,
        ..Limits::default()
    };
    let fs = Fs::new(store, limits).unwrap();
    let (inode, fh) = fs
        .create(ME, ROOT_INO, b"big", 0o600, 0, libc::O_RDWR)
        .unwrap();
    let chunk = redbfs::store::CHUNK_SIZE as usize;
    let mut want = vec![0u8; 3 * chunk + 100];
    for (i, b) in want.iter_mut().enumerate() {
        *b = (i % 249) as u8;
    }
    fs.write(ME, fh, 0, &want).unwrap();
    fs.write(ME, fh, chunk as u64 + 10, b"overwrite").unwrap();
    want[chunk + 10..chunk + 19].copy_from_slice(b"overwrite");
    assert_eq!(fs.read(fh, 0, u32::MAX).unwrap(), want);
    fs.setattr(
        ME,
        inode.ino,
        SetAttr {
            size: Some(2 * chunk as u64 + 5),
            fh: Some(fh),
            ..Default::default()
        },
    )
    .unwrap();
    want.truncate(2 * chunk + 5);
    assert_eq!(fs.read(fh, 0, u32::MAX).unwrap(), want);
    // Nothing is in the store before the commit.
    assert_eq!(fs.store().read().unwrap().usage().unwrap().content_bytes, 0);
    fs.flush(fh).unwrap();
    fs.release(fh).unwrap();
    fs.forget(inode.ino, 1);
    assert_eq!(read_all(&fs, inode.ino), want);
    assert_eq!(fs.open_counts().1, 0, "no buffered memory left");
}

/// An `Fs` over a store opened read-only serves what the store holds and refuses every
/// change with EROFS, and the store file's bytes stay as they were.
#[test]
fn a_read_only_store_serves_reads_and_refuses_changes() {
    let (dir, fs) = new_fs();
    let ino = write_file(&fs, ROOT_INO, "kept.md", b"kept");
    drop(fs);
    let path = dir.path().join("s.redb");
    let before = std::fs::read(&path).unwrap();
    let fs = Fs::new(Store::open_read_only(&path).unwrap(), Limits::default()).unwrap();
    assert!(fs.is_read_only());
    assert_eq!(fs.lookup(ROOT_INO, b"kept.md").unwrap().ino, ino);
    assert_eq!(read_all(&fs, ino), b"kept");
    let erofs = |e: Error| assert_eq!(e.errno(), libc::EROFS, "{e}");
    erofs(fs.mkdir(ME, ROOT_INO, b"d", 0o755, 0).unwrap_err());
    erofs(
        fs.create(ME, ROOT_INO, b"new.md", 0o600, 0, libc::O_WRONLY)
            .unwrap_err(),
    );
    erofs(fs.unlink(ME, ROOT_INO, b"kept.md").unwrap_err());
    drop(fs);
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the store file changed"
    );
}

/// `expire` chooses files in one request and removes them in another: a file written, or
/// replaced by rename, between the two is passed over, as the cutoff it was chosen by says
/// (the daemon removed whatever was at the path then: a memory the SDK had just rewritten).
#[test]
fn expire_passes_over_a_file_used_since_it_was_chosen() {
    let (_d, fs) = new_fs();
    let long_ago = SetAttr {
        atime: Some(TimeSet::At(1_000_000_000)),
        mtime: Some(TimeSet::At(1_000_000_000)),
        ..SetAttr::default()
    };
    for name in ["rewritten", "stale"] {
        let ino = write_file(&fs, ROOT_INO, name, b"old");
        fs.setattr(ME, ino, long_ago).unwrap();
    }
    let cutoff = redbfs::store::now_ns() - 86_400 * 1_000_000_000;
    let chosen: Vec<String> = redbfs::tools::unused_since(&fs.store().read().unwrap(), "/", cutoff)
        .unwrap()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(chosen, ["/rewritten", "/stale"]);
    // Replaced the SDK's way after it was chosen.
    write_file(&fs, ROOT_INO, ".tmp-new", b"new");
    fs.rename(ME, ROOT_INO, b".tmp-new", ROOT_INO, b"rewritten", 0)
        .unwrap();
    let removed = fs.remove_files(ME, &chosen, Some(cutoff)).unwrap();
    assert_eq!(removed, ["/stale"]);
    assert_eq!(names(&fs, ROOT_INO), ["rewritten"]);
}
