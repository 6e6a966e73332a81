//! A panic inside a commit. A commit takes its number from the log's sequence before it
//! appends its record; one that panicked after that left a gap (every later record, each of
//! them acknowledged, was dropped at recovery, since the scan stops at a gap) or a record for
//! a transaction that never committed. Whatever unwinds out of a commit now fails the log, and
//! a failed commit fails it before any later commit can append: later writes are refused,
//! and recovery gives exactly the acknowledged operations.
//!
//! The panics are injected at each point of a commit by the test-only fault plan, which this
//! test binary turns on with `REDBFS_FAULT_INJECTION=1` (a binary of its own, so no other
//! test runs with it).

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

mod common;

use common::core_fs::{crash_copy, root_files, try_write_file};
use redbfs::fs::{Caller, Fs, Limits};
use redbfs::store::fault::PanicAt;
use redbfs::store::{ROOT_INO, Store};

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

fn open(path: &std::path::Path) -> Fs {
    Fs::new(
        Store::open_or_create(path, (0, 0)).unwrap(),
        Limits::default(),
    )
    .unwrap()
}

#[test]
fn a_panic_anywhere_in_a_commit_fails_the_log_and_loses_nothing_acknowledged() {
    // SAFETY: set before any store opens; this binary's only test reads it.
    unsafe { std::env::set_var("REDBFS_FAULT_INJECTION", "1") };
    for at in [
        PanicAt::Numbered,
        PanicAt::Appended,
        PanicAt::Committed,
        PanicAt::Checkpoint,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let fs = open(&path);
        let mut acknowledged = BTreeMap::new();
        for i in 0..5 {
            let data = format!("note {i}\n").repeat(50).into_bytes();
            try_write_file(&fs, ME, &format!("n{i}.md"), &data).unwrap();
            acknowledged.insert(format!("n{i}.md"), data);
        }
        fs.store().inject_panic(at).unwrap();
        // A checkpoint: content too large for one log record.
        let doomed = vec![
            b'x';
            if at == PanicAt::Checkpoint {
                700_000
            } else {
                100
            }
        ];
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            try_write_file(&fs, ME, "doomed.md", &doomed)
        }));
        std::panic::set_hook(hook);
        assert!(panicked.is_err(), "{at:?}: the injected panic fired");
        // Nothing commits after the gap.
        assert!(
            try_write_file(&fs, ME, "after.md", b"after").is_err(),
            "{at:?}: a commit after the panic was acknowledged"
        );
        assert!(
            fs.mkdir(ME, ROOT_INO, b"later", 0o700, 0).is_err(),
            "{at:?}"
        );

        // A crash now: the store file and its log as they are.
        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed);
        drop(fs);
        let fs = open(&crashed);
        let mut got = root_files(&fs, ME);
        // The panicked create may or may not have reached the store (it was never
        // acknowledged), but never with partial content.
        if let Some(d) = got.remove("doomed.md") {
            assert!(d.is_empty() || d == doomed, "{at:?}: doomed.md torn");
        }
        assert_eq!(
            got, acknowledged,
            "{at:?}: recovery lost or invented an operation"
        );
        let r = fs.store().read().unwrap();
        assert_eq!(
            redbfs::check::invariants(&r).unwrap(),
            Vec::<String>::new(),
            "{at:?}"
        );
        drop(r);
        // The recovered store goes on.
        try_write_file(&fs, ME, "after.md", b"after").unwrap();
    }
}

/// The same, for a panic in an operation that shares a redb transaction with two others
/// (a batch, held open by the store's test hook): the batch is rolled back whole, the log
/// fails, the other two are told so, and recovery gives exactly the acknowledged operations.
#[test]
fn a_panic_inside_a_batch_fails_the_log_and_loses_nothing_acknowledged() {
    // SAFETY: set before any store opens; every test of this binary sets it alike.
    unsafe { std::env::set_var("REDBFS_FAULT_INJECTION", "1") };
    for at in [PanicAt::Numbered, PanicAt::Appended, PanicAt::Committed] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.redb");
        let fs = open(&path);
        let mut acknowledged = BTreeMap::new();
        for i in 0..3 {
            let data = format!("note {i}\n").repeat(50).into_bytes();
            try_write_file(&fs, ME, &format!("n{i}.md"), &data).unwrap();
            acknowledged.insert(format!("n{i}.md"), data);
        }
        let seq0 = fs.store().log_state().0;
        let numbered = |n: u64| {
            let start = std::time::Instant::now();
            while fs.store().log_state().0 < n {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(60),
                    "{at:?}"
                );
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        };
        fs.store().hold_batches(3);
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let (a, b, c) = std::thread::scope(|s| {
            let a = s.spawn(|| fs.mkdir(ME, ROOT_INO, b"a", 0o700, 0).map(drop));
            numbered(seq0 + 1);
            let b = s.spawn(|| fs.mkdir(ME, ROOT_INO, b"b", 0o700, 0).map(drop));
            numbered(seq0 + 2);
            // The third op's commit panics (at its number, or as it commits the batch).
            fs.store().inject_panic(at).unwrap();
            let c = s.spawn(|| {
                catch_unwind(AssertUnwindSafe(|| {
                    fs.mkdir(ME, ROOT_INO, b"c", 0o700, 0).map(drop)
                }))
            });
            let c = c.join().unwrap();
            fs.store().hold_batches(0);
            (a.join().unwrap(), b.join().unwrap(), c)
        });
        std::panic::set_hook(hook);
        assert!(c.is_err(), "{at:?}: the injected panic fired");
        assert!(a.is_err() && b.is_err(), "{at:?}: {a:?} {b:?}");
        assert!(
            try_write_file(&fs, ME, "after.md", b"after").is_err(),
            "{at:?}: a commit after the panic was acknowledged"
        );

        let crashed = dir.path().join("crashed.redb");
        crash_copy(&path, &crashed);
        drop(fs);
        let fs = open(&crashed);
        let mut got = root_files(&fs, ME);
        // Never acknowledged, so they may or may not be there (a panic after redb's commit
        // leaves all three), but all or none.
        let made: Vec<bool> = ["a", "b", "c"]
            .iter()
            .map(|n| fs.lookup(ROOT_INO, n.as_bytes()).is_ok())
            .collect();
        assert!(
            made.iter().all(|&m| m) || made.iter().all(|&m| !m),
            "{at:?}: {made:?}"
        );
        got.retain(|k, _| !["a", "b", "c"].contains(&k.as_str()));
        assert_eq!(got, acknowledged, "{at:?}");
        let r = fs.store().read().unwrap();
        assert_eq!(
            redbfs::check::invariants(&r).unwrap(),
            Vec::<String>::new(),
            "{at:?}"
        );
        drop(r);
        try_write_file(&fs, ME, "after.md", b"after").unwrap();
    }
}
