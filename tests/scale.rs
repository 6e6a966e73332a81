//! Scale: the work a transaction does stays linear in its size. A bulk transaction (import,
//! `import --tar`, rollback, restore from a replica, a follower's batch) once cost time
//! quadratic in its blob count: the commit looked each changed blob up in the list of blobs
//! the transaction had created, one scan per blob. Timing cannot tell linear from quadratic
//! reliably on a shared machine, so the store counts its bookkeeping steps
//! (`Store::commit_work`) and the test compares the count per entry at two sizes, and the
//! count of a one-file commit before and after them.

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
    let one_before = one_transaction(&store, "one-before", 1);
    let small = one_transaction(&store, "small", 10_000);
    let large = one_transaction(&store, "large", 100_000);
    // A commit's own work does not grow with the store or its history: every commit looks
    // for expired history, and once read the oldest record (here the 10,000 entries') whole
    // to learn its time.
    let one_after = one_transaction(&store, "one-after", 1);
    assert!(
        one_after <= one_before + 2,
        "a one-file commit took {one_before} steps in an empty store, {one_after} after 110,000 entries"
    );
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

/// The history queries at a long history, for measuring (not run by the suite: `cargo test
/// --release --test scale -- --ignored --nocapture`; REDBFS_SCALE_RECORDS sets the length,
/// 1,000,000 by default). 1,000 memories rewritten one commit each; prints what each query
/// took and checks what it answered.
#[test]
#[ignore]
fn history_queries_at_a_long_history() {
    let records: u64 = std::env::var("REDBFS_SCALE_RECORDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    // REDBFS_SCALE_KEEP=PATH keeps the store there (for measuring the CLI on it).
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = match std::env::var("REDBFS_SCALE_KEEP") {
        Ok(p) => std::path::PathBuf::from(p),
        Err(_) => dir.path().join("s.redb"),
    };
    let store = Store::open_or_create(&path, (0, 0)).unwrap();
    store.set_keep_history(30 * 86_400 * 1_000_000_000).unwrap();
    let memories = 1_000u64;
    let t0 = std::time::Instant::now();
    let now = redbfs::store::now_ns();
    let file = |ino, name: &str, size| Inode {
        ino,
        kind: Kind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        size,
        nlink: 1,
        parent: ROOT_INO,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        name: name.to_string(),
    };
    let mut inos = Vec::new();
    {
        let mut w = store.write().unwrap();
        for m in 0..memories {
            let ino = w.alloc_ino().unwrap();
            let name = format!("m{m:04}.md");
            w.put_inode(&file(ino, &name, 0)).unwrap();
            w.put_dirent(ROOT_INO, &name, ino, Kind::File).unwrap();
            inos.push((ino, name));
        }
        w.commit(Sync::Durable).unwrap();
    }
    for i in 0..records {
        let (ino, name) = &inos[(i % memories) as usize];
        let text = format!("memory {name} version {i}\n");
        let mut w = store.write().unwrap();
        w.put_chunk(*ino, 0, text.as_bytes()).unwrap();
        w.put_inode(&file(*ino, name, text.len() as u64)).unwrap();
        w.describe(redbfs::store::OpInfo {
            op: "write",
            paths: vec![format!("/{name}")],
            ino: *ino,
            ..Default::default()
        });
        w.commit(Sync::Deferred).unwrap();
    }
    store.sync().unwrap();
    eprintln!("built {records} records in {:?}", t0.elapsed());
    let r = store.read().unwrap();
    let last = r.last_seq().unwrap();
    let mid = last / 2;
    let at = |f: &dyn Fn()| {
        let t = std::time::Instant::now();
        f();
        t.elapsed()
    };
    // The record at `mid` rewrote memory (mid - 2) % memories (seq 1 is the creation).
    let i = mid - 2;
    let (_, name) = &inos[(i % memories) as usize];
    let want = format!("memory {name} version {i}\n");
    let p = format!("/{name}");
    eprintln!(
        "show at the middle: {:?}",
        at(&|| assert_eq!(
            redbfs::tools::show_at(&r, &p, mid).unwrap(),
            want.as_bytes()
        ))
    );
    eprintln!(
        "diff from the middle: {:?}",
        at(&|| assert!(!redbfs::tools::diff(&r, &p, mid, None).unwrap().is_empty()))
    );
    eprintln!(
        "log of one path ({} records): {:?}",
        records / memories,
        at(&|| assert_eq!(
            r.history_of(Some(&p), None, usize::MAX).unwrap().len() as u64,
            records / memories
        ))
    );
    let all = at(&|| {
        let mut cursor = redbfs::store::LogCursor::start(None);
        let mut n = 0u64;
        loop {
            let (page, next) = r.history_page(&cursor, None, 20_000).unwrap();
            n += page.len() as u64;
            match next {
                Some(c) => cursor = c,
                None => break,
            }
        }
        assert_eq!(n, last);
    });
    eprintln!(
        "log of the store ({last} records): {all:?}, {:.0} records/s",
        last as f64 / all.as_secs_f64()
    );
}
