//! Scale: the work a transaction does stays linear in its size. A bulk transaction (import,
//! `import --tar`, rollback, restore from a replica, a follower's batch) once cost time
//! quadratic in its blob count: the commit looked each changed blob up in the list of blobs
//! the transaction had created, one scan per blob. Timing cannot tell linear from quadratic
//! reliably on a shared machine, so the store counts its bookkeeping steps
//! (`Store::commit_work`) and the test compares the count per entry at two sizes.

use redbfs::store::{Inode, Kind, ROOT_INO, Store, Sync};

/// Creates `files` files of a few bytes under one new directory, in one transaction, with
/// history on; returns the bookkeeping steps its commit took.
fn one_transaction(store: &Store, dir: &str, files: u64) -> u64 {
    let before = store.commit_work();
    let mut w = store.write().unwrap();
    let now = redbfs::store::now_ns();
    let inode = |ino, kind, parent, name: &str, size| Inode {
        ino,
        kind,
        perm: 0o644,
        uid: 0,
        gid: 0,
        size,
        nlink: 1,
        parent,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        name: name.to_string(),
    };
    let d = w.alloc_ino().unwrap();
    w.put_inode(&inode(d, Kind::Dir, ROOT_INO, dir, 0)).unwrap();
    w.put_dirent(ROOT_INO, dir, d, Kind::Dir).unwrap();
    for i in 0..files {
        let name = format!("memory-{i:06}.md");
        let content = format!("note {i}\n");
        let ino = w.alloc_ino().unwrap();
        w.put_inode(&inode(ino, Kind::File, d, &name, content.len() as u64))
            .unwrap();
        w.put_dirent(d, &name, ino, Kind::File).unwrap();
        w.put_chunk(ino, 0, content.as_bytes()).unwrap();
    }
    w.commit(Sync::Durable).unwrap();
    store.commit_work() - before
}

#[test]
fn a_transaction_of_100k_entries_does_linear_work() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    store.set_keep_history(30 * 86_400 * 1_000_000_000).unwrap();
    let small = one_transaction(&store, "small", 10_000);
    let large = one_transaction(&store, "large", 100_000);
    let per_entry = |work: u64, n: u64| work as f64 / n as f64;
    let (a, b) = (per_entry(small, 10_000), per_entry(large, 100_000));
    assert!(
        a > 3.0,
        "the count covers each entry's writes ({a} steps per entry)"
    );
    assert!(
        b <= a * 1.05,
        "work per entry grew with the transaction: {a:.2} steps at 10,000 entries, {b:.2} at 100,000"
    );
    // The store holds what was written.
    let r = store.read().unwrap();
    let large_dir = r.lookup(ROOT_INO, "large").unwrap().unwrap().0;
    assert_eq!(r.list(large_dir).unwrap().len(), 100_000);
    let ino = r.lookup(large_dir, "memory-099999.md").unwrap().unwrap().0;
    assert_eq!(
        r.chunks(ino, 0, 1).unwrap()[0].as_deref(),
        Some(&b"note 99999\n"[..])
    );
}
