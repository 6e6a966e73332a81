//! Several processes and threads at once, on the mount and on a local ext4 directory.
//!
//! A file replaced by rename vanished for concurrent readers: the daemon deleted the old
//! inode at the rename while the kernel still held a reference to it from a lookup made just
//! before, so the OPEN that followed found nothing (2,416 of 8,000 opens failed with ENOENT;
//! none on ext4). `seeded_races_match_ext4` runs seeded random mixes of replace-by-rename,
//! open/read, stat, chmod, readdir, unlink and create by three processes of two threads each
//! (`tests/concurrency/worker.py`) on the mount and on ext4: every error a process sees must
//! be one the same race can produce on ext4, and every read of a replaced file one complete
//! version. `REDBFS_SEED=N` replays one seed; `REDBFS_CONCURRENCY_RUNS` sets how many.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{TestMount, fuse_available};
use serde_json::Value;

const PROCESSES: usize = 3;
const THREADS: usize = 2;
const OPS: usize = 80;

fn worker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/concurrency/worker.py")
}

/// Lays out the shared namespace in a fresh `dir`: the replace-only names exist from the start.
fn prepare(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..4 {
        let name = format!("r{i}");
        std::fs::write(dir.join(&name), format!("V|{name}|init|0||END\n")).unwrap();
    }
}

/// Runs the workers on `dir` at once; returns every failure they report.
fn race(dir: &Path, seed: u64) -> Vec<Value> {
    prepare(dir);
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            Command::new("python3")
                .arg(worker())
                .arg(dir)
                .args([seed, p as u64, THREADS as u64, OPS as u64].map(|n| n.to_string()))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start python3 worker.py")
        })
        .collect();
    let mut failures = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "seed {seed}: worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("worker output");
        assert_eq!(v["ops"], THREADS * OPS, "seed {seed}: every operation ran");
        failures.extend(v["failures"].as_array().unwrap().iter().cloned());
    }
    failures
}

#[test]
fn seeded_races_match_ext4() {
    if !fuse_available() {
        return;
    }
    let seeds: Vec<u64> = match std::env::var("REDBFS_SEED") {
        Ok(s) => vec![s.parse().expect("REDBFS_SEED is a number")],
        Err(_) => {
            let runs = std::env::var("REDBFS_CONCURRENCY_RUNS")
                .ok()
                .and_then(|s| s.parse().ok())
                // 20 seeded races keep the suite's cost down (each runs on the mount and on
                // ext4); REDBFS_CONCURRENCY_RUNS=200 explores more.
                .unwrap_or(20u64);
            (0..runs).collect()
        }
    };
    let plain = tempfile::Builder::new()
        .prefix("concurrency-plain-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let m = TestMount::new();
    for seed in seeds {
        let on_ext4 = race(&plain.path().join(seed.to_string()), seed);
        assert!(
            on_ext4.is_empty(),
            "seed {seed}: the test itself is wrong, ext4 failed it: {on_ext4:?}"
        );
        let on_mount = race(&m.path(&seed.to_string()), seed);
        assert!(
            on_mount.is_empty(),
            "seed {seed} (replay with REDBFS_SEED={seed}): the mount failed where ext4 did not: {on_mount:?}\nlog:\n{}",
            m.log_text()
        );
    }
    let out = common::redbfs(&["check", m.mountpoint.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "check: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A lone agent (read, replace, read, replace ...) is never refused, and a process that never
/// read a file may replace it, even with `--lost-updates refuse`.
#[test]
fn a_lone_agent_and_a_blind_writer_are_never_refused() {
    if !fuse_available() {
        return;
    }
    let m = TestMount::with_args(&["--lost-updates", "refuse"]);
    let t = m.path("t.md");
    std::fs::write(&t, "v0\n").unwrap();
    for i in 0..50 {
        let text = std::fs::read_to_string(&t).unwrap();
        let tmp = m.path(&format!(".tmp-{i}"));
        std::fs::write(&tmp, format!("{text}v{}\n", i + 1)).unwrap();
        std::fs::rename(&tmp, &t).unwrap_or_else(|e| panic!("edit {i} refused: {e}"));
    }
    assert_eq!(std::fs::read_to_string(&t).unwrap().lines().count(), 51);
    // Another process that never read t.md replaces it.
    let script = format!(
        "import os; open({tmp:?}, 'w').write('blind\\n'); os.replace({tmp:?}, {t:?})",
        tmp = m.path(".tmp-blind").to_str().unwrap(),
        t = t.to_str().unwrap()
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And now this process, whose last read is older than that write, is refused (reading
    // t.md first would make the replace legitimate).
    std::fs::write(m.path(".tmp-late"), "late\n").unwrap();
    let e = std::fs::rename(m.path(".tmp-late"), &t)
        .map(|()| panic!("a lost update is not refused; log:\n{}", m.log_text()))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
    assert_eq!(
        std::fs::read_to_string(&t).unwrap(),
        "blind\n",
        "nothing changed"
    );
}

/// Lists `dir` `rounds` times while one thread creates and unlinks other names in it and
/// another lists it too; how many listings had one of the 500 names that never change twice
/// or not at all.
fn listings_while_names_change(dir: &Path, rounds: usize) -> usize {
    use std::sync::atomic::{AtomicBool, Ordering};
    std::fs::create_dir_all(dir).unwrap();
    let stable: std::collections::BTreeSet<String> = (0..500).map(|i| format!("s{i:04}")).collect();
    for n in &stable {
        std::fs::write(dir.join(n), "").unwrap();
    }
    let stop = AtomicBool::new(false);
    let names = |d: &Path| -> Vec<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let p = dir.join(format!("a{:03}", i % 50));
                if std::fs::remove_file(&p).is_err() {
                    std::fs::write(&p, "").unwrap();
                }
                i += 1;
            }
        });
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                names(dir);
            }
        });
        let mut wrong = 0;
        for _ in 0..rounds {
            let mut seen: Vec<String> = names(dir)
                .into_iter()
                .filter(|n| n.starts_with('s'))
                .collect();
            seen.sort();
            let unique: std::collections::BTreeSet<String> = seen.iter().cloned().collect();
            if seen.len() != unique.len() || unique != stable {
                wrong += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        wrong
    })
}

/// Two processes listing a directory while a third creates and unlinks other names in it
/// each see every name that stays exactly once, as on ext4. The kernel keeps one cached
/// listing per directory and continues it with whichever handle reads next: offsets that
/// were indexes into each handle's own listing put names in it twice or left them out
/// (28 of 300 listings; 1 in 400 for an SDK-shaped workload of replace-by-rename).
#[test]
fn listings_while_other_names_change_list_each_name_that_stays_once() {
    if !fuse_available() {
        return;
    }
    let plain = tempfile::Builder::new()
        .prefix("listing-plain-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    assert_eq!(
        listings_while_names_change(plain.path(), 100),
        0,
        "the test itself is wrong: ext4 failed it"
    );
    let m = TestMount::new();
    let wrong = listings_while_names_change(&m.path("listed"), 300);
    assert_eq!(wrong, 0, "{wrong} of 300 listings wrong\n{}", m.log_text());
}
