//! History's byte budget. The audit's bug: history had no size bound, so `--quota` bounded
//! current content only; rewriting a 1 MiB file 150 times under `--quota 2M` left a 285 MB
//! store file (`df` said 1.0M used), and a client held by a quota could fill the host's disk
//! through history. Now history past `--max-history-bytes` (by default the quota) sheds its
//! oldest records at commit: on `Fs` directly, shed points answer that they are no longer
//! kept (`show --at`, `revert`) while the newest stay and `check` finds nothing; on a real
//! mount, the store file stays within a bound derived from the budget.

mod common;

use common::{TestMount, fuse_available, ok, redbfs};
use redbfs::fs::{Caller, Fs, Limits, OpenMode};
use redbfs::store::{ROOT_INO, Store};

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 1,
};
const THIRTY_DAYS: u64 = 30 * 86_400 * 1_000_000_000;

/// Content that shares nothing with any other version (so no version is kept as a delta).
fn version(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn rewrite(fs: &Fs, ino: u64, data: &[u8]) {
    let fh = fs
        .open(
            ME,
            ino,
            OpenMode::from_flags(libc::O_WRONLY | libc::O_TRUNC),
        )
        .unwrap();
    fs.write(ME, fh, 0, data).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh).unwrap();
}

#[test]
fn shed_points_are_no_longer_kept_and_the_newest_stay() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_or_create(&dir.path().join("s.redb"), (0, 0)).unwrap();
    store.set_keep_history(THIRTY_DAYS).unwrap();
    let budget = 1 << 20;
    let limits = Limits {
        max_history_bytes: budget,
        ..Limits::default()
    };
    let fs = Fs::new(store, limits).unwrap();
    assert_eq!(fs.store().history_budget(), budget);
    let (inode, fh) = fs
        .create(ME, ROOT_INO, b"f.bin", 0o644, 0, libc::O_WRONLY)
        .unwrap();
    fs.write(ME, fh, 0, &version(0, 256 * 1024)).unwrap();
    fs.flush(fh).unwrap();
    fs.release(fh).unwrap();
    let first_point = fs.store().read().unwrap().last_seq().unwrap();
    // 40 versions of 256 KiB: 10 MiB of history without a budget.
    for i in 1..=40 {
        rewrite(&fs, inode.ino, &version(i, 256 * 1024));
    }
    let r = fs.store().read().unwrap();
    let last = r.last_seq().unwrap();
    let oldest = r.first_seq().unwrap().expect("the newest records stay");
    assert!(
        oldest > first_point + 1,
        "nothing was shed: oldest {oldest}"
    );
    assert!(
        oldest < last,
        "more than the newest record stays: {oldest} of {last}"
    );
    let kept = r.history_bytes().unwrap();
    assert!(kept <= budget, "history keeps {kept} bytes, over {budget}");
    // The newest point before the last rewrite still reads.
    assert_eq!(
        redbfs::tools::show_at(&r, "/f.bin", last - 1).unwrap(),
        version(39, 256 * 1024)
    );
    // A shed point answers that it is no longer kept, for show and revert alike.
    let e = redbfs::tools::show_at(&r, "/f.bin", first_point).unwrap_err();
    assert!(e.contains("no longer kept"), "{e}");
    let e = fs
        .revert(ME, "/f.bin", first_point)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no longer kept"), "{e}");
    assert_eq!(
        redbfs::check::invariants(&fs.store().read().unwrap()).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn a_quota_bounds_the_store_file_through_history() {
    if !fuse_available() {
        return;
    }
    let mut m = TestMount::with_args(&["--quota", "2M"]);
    let f = m.path("f.bin");
    for i in 0..100 {
        std::fs::write(&f, version(i, 1 << 20)).unwrap();
    }
    let status: serde_json::Value = serde_json::from_str(&ok(redbfs(&[
        "status",
        m.mountpoint.to_str().unwrap(),
        "--json",
    ])))
    .unwrap();
    assert_eq!(
        status["history_budget"],
        16 << 20,
        "the quota, but at least 16 MiB"
    );
    let log = ok(redbfs(&["log", m.mountpoint.to_str().unwrap()]));
    m.unmount();
    // Twice the budget (16 MiB: the 2 MiB quota, raised to the least a quota gives history;
    // history grows a quarter past it between measures, and the file keeps the pages it
    // freed for reuse) + the content (1 MiB) + the version being written while the one it
    // replaces is still held (1 MiB) + 6 MiB for redb's page and region overhead. Without
    // the budget this workload leaves about 140 MB.
    let bytes = std::fs::metadata(&m.store).unwrap().len();
    assert!(bytes < 40 << 20, "store file of {bytes} bytes");
    let newest = log.lines().next().unwrap_or_default();
    assert!(
        newest.starts_with("@100 ") && newest.contains("write") && newest.contains("/f.bin"),
        "log: {log}"
    );
    ok(redbfs(&["check", m.store.to_str().unwrap()]));
    assert!(m.log_text().contains("dropped its oldest records"));
}
