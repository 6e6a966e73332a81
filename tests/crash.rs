//! Kill tests: the daemon is SIGKILLed at a random (seeded) moment in the middle of a
//! workload, and what every client was told is saved must still be there.
//!
//! Each scenario runs on one store. Per kill: worker processes start (see tests/crash/), the
//! test waits a seeded delay, SIGKILLs the daemon (its pid from `redbfs status --json`), lets
//! the workers fail and exit, then mounts again (which must clear the stale mount), unmounts,
//! runs `redbfs check` (must be clean), mounts and compares the tree with the model built from
//! the workers' journals of acknowledged operations (see tests/crash/support.rs for what each
//! in-flight operation may have left). The verified tree is the model for the next kill.
//!
//! Scenarios: memories created through the stock SDK tool by 4 processes; str_replace loops
//! (temp file, fsync, close, replacing rename; Python syscalls and the SDK's str_replace); a
//! directory of 10,000 files renamed back and forth; recursive deletes (per-call and the SDK's
//! fs.rm); large files written with fsync points and overwritten through O_TRUNC (with
//! `--keep-history 0`, so 30 days of replaced 12 MiB files do not grow the store by gigabytes;
//! the other scenarios keep the default history).
//!
//! Knobs: REDBFS_KILLS (total kills over the five scenarios, default 100), REDBFS_SEED (replay
//! the seeds of a failed run; each scenario prints its seed and each kill its derived seed).
//! Timing cannot be replayed exactly, the seeded choices and delays can.
//!
//!     cargo test --test crash                       # all scenarios, 100 kills
//!     REDBFS_KILLS=1000 cargo test --test crash     # soak
//!     REDBFS_SEED=123 cargo test --test crash kill_dir_rename

mod common;
#[path = "crash/support.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{TestMount, fuse_available};
use serde_json::json;
use support::*;

const SCENARIOS: u64 = 5;

fn kills_per_scenario() -> u64 {
    env_u64("REDBFS_KILLS", 100).div_ceil(SCENARIOS).max(1)
}

struct Scenario {
    name: &'static str,
    workers: Vec<Spec>,
    /// The kill comes this long (uniform, seeded) after every worker is ready.
    delay_ms: (u64, u64),
    /// Share of untouched files whose content is compared after each kill (all after the last).
    sample_per_mille: u64,
    /// Extra `redbfs mount` options.
    mount_args: &'static [&'static str],
}

fn run(sc: Scenario, setup: impl FnOnce(&Path, &mut Model)) {
    if !fuse_available() {
        return;
    }
    become_subreaper();
    let base = base_seed();
    let seed = mix(base, hash_str(sc.name));
    let kills = kills_per_scenario();
    println!(
        "[{}] seed {seed} (REDBFS_SEED={base}), {kills} kills, SDK tool {}",
        sc.name,
        if sdk_available() {
            "@anthropic-ai/sdk (node)"
        } else {
            "NOT INSTALLED: Python workers do the SDK's system calls instead (run tests/clients/setup.sh)"
        }
    );
    let started = Instant::now();
    let mut tm = TestMount::with_args(sc.mount_args);
    let mut model = Model::new();
    let t = Instant::now();
    setup(&tm.mountpoint, &mut model);
    println!("[{}] setup took {:?}", sc.name, t.elapsed());
    macro_rules! fail {
        ($k:expr, $kseed:expr, $what:expr) => {
            panic!(
                "[{}] kill {} (kill seed {}; scenario seed {seed}; replay with REDBFS_SEED={base} cargo test --test crash {}): {}",
                sc.name, $k, $kseed, sc.name, $what
            )
        };
    }
    let mut acked_total = 0;
    let mut unmount_bugs: Vec<String> = Vec::new();
    let mut states: std::collections::BTreeMap<String, u64> = Default::default();
    for k in 0..kills {
        let kseed = mix(seed, k);
        let mut rng = Rng::new(kseed);
        let delay = rng.range(sc.delay_ms.0, sc.delay_ms.1);
        let dir = tm.dir.path().join(format!("kill{k}"));
        let t_start = Instant::now();
        let pid = daemon_pid(&tm.mountpoint);
        let mut workers = Workers::spawn(
            &sc.workers,
            &tm.mountpoint,
            &dir,
            kseed,
            &format!("k{k}"),
            None,
        );
        if let Err(e) = workers.wait_ready(Duration::from_secs(60)) {
            fail!(k, kseed, e);
        }
        let t_ready = t_start.elapsed();
        std::thread::sleep(Duration::from_millis(delay));
        kill_daemon(pid);
        let killed = workers.wait_exit(Duration::from_secs(5));
        let t_recover = Instant::now();
        match recover(&mut tm) {
            Ok(None) => {}
            Ok(Some(v)) => {
                println!("[{}] kill {k}: DAEMON BUG: {v}", sc.name);
                unmount_bugs.push(format!("kill {k}: {v}"));
            }
            Err(e) => fail!(
                k,
                kseed,
                format!("{e}\ndaemon log:\n{}", tail(&tm.log_text(), 3000))
            ),
        }

        let t_recover = t_recover.elapsed();
        let t_verify = Instant::now();
        let actual = match read_tree(&tm.mountpoint) {
            Ok(a) => a,
            Err(e) => fail!(k, kseed, format!("walking the mount: {e}")),
        };
        let mut m = model.clone();
        let mut reps = Vec::new();
        for p in &workers.procs {
            match replay(&p.spec.label, &read_journal(&p.journal), &mut m) {
                Ok(r) => reps.push(r),
                Err(e) => fail!(k, kseed, e),
            }
        }
        let mut problems: Vec<String> = reps.iter().flat_map(|r| r.problems.clone()).collect();
        for p in &workers.procs {
            let failed = p.status.is_some_and(|s| !s.success());
            if failed && !killed.contains(&p.spec.label) {
                problems.push(format!(
                    "worker {} exited with {:?} (not a clean stop after the kill)",
                    p.spec.label, p.status
                ));
            }
        }
        if !problems.is_empty() {
            fail!(
                k,
                kseed,
                format!("{}\n{}", problems.join("\n"), workers.outputs())
            );
        }
        let mut rd = Reader::new(&tm.mountpoint);
        rd.all = k + 1 == kills;
        rd.sample_per_mille = sc.sample_per_mille;
        rd.salt = kseed;
        rd.touched = reps.iter().flat_map(|r| r.touched.clone()).collect();
        for (p, r) in workers.procs.iter().zip(&reps) {
            match verify_root(&m, &actual, &p.spec.root, r, &mut rd) {
                Ok((next, found)) => {
                    m = next;
                    *states.entry(found).or_insert(0) += 1;
                }
                Err(e) => fail!(k, kseed, format!("after {delay} ms: {e}")),
            }
        }
        let roots: Vec<String> = sc.workers.iter().map(|w| w.root.clone()).collect();
        if let Err(e) = verify_all(&m, &actual, &mut rd, &roots) {
            fail!(k, kseed, format!("outside the workers' directories: {e}"));
        }
        for p in &workers.procs {
            remove_temp_files(&tm.mountpoint, &mut m, &actual, &p.spec.root);
        }
        model = m;
        let acked: usize = reps.iter().map(|r| r.acked).sum();
        acked_total += acked;
        let pending = reps.iter().filter(|r| r.pending.is_some()).count();
        println!(
            "[{}] kill {k}: seed {kseed}, after {delay} ms: {acked} operations acknowledged, {pending} in flight, {} KiB compared{}: ok (workers ready {:.1} s, recovery {:.1} s: {}; verification {:.1} s)",
            sc.name,
            rd.bytes_read / 1024,
            if killed.is_empty() {
                String::new()
            } else {
                format!(" (killed hung workers {killed:?})")
            },
            t_ready.as_secs_f64(),
            t_recover.as_secs_f64(),
            RECOVERY.with(|r| r.borrow().clone()),
            t_verify.elapsed().as_secs_f64()
        );
        let problems = log_problems(&tm.log_text());
        if !problems.is_empty() {
            fail!(k, kseed, format!("daemon log:\n{}", problems.join("\n")));
        }
        if acked == 0 && k > 0 && k % 5 == 0 && acked_total == 0 {
            fail!(
                k,
                kseed,
                "no operation was ever acknowledged: the workers do not run"
            );
        }
        drop(workers);
        let _ = std::fs::remove_dir_all(&dir);
    }
    match unmount_and_check(&mut tm) {
        Ok(None) => {}
        Ok(Some(v)) => unmount_bugs.push(format!("final unmount: {v}")),
        Err(e) => panic!("[{}] final check: {e}", sc.name),
    }
    assert!(
        unmount_bugs.is_empty(),
        "[{}] every kill verified, but `redbfs unmount` returned before the store was closed {} times (seed {seed}):\n{}",
        sc.name,
        unmount_bugs.len(),
        unmount_bugs.join("\n")
    );
    assert!(
        acked_total > 0,
        "[{}] no operation was acknowledged in {kills} kills",
        sc.name
    );
    println!(
        "[{}] {kills} kills, {acked_total} acknowledged operations verified in {:?}; store {} MiB; states found for the operation in flight:",
        sc.name,
        started.elapsed(),
        std::fs::metadata(&tm.store).map_or(0, |m| m.len() >> 20)
    );
    for (s, n) in &states {
        println!("[{}]   {n:5} x {s}", sc.name);
    }
}

fn memories(mnt: &Path, model: &mut Model, roots: &[&str]) {
    put_dir(mnt, model, "memories");
    for r in roots {
        put_dir(mnt, model, &format!("memories/{r}"));
    }
}

#[test]
fn kill_sdk_create() {
    let roots = ["c0", "c1", "c2", "c3"];
    run(
        Scenario {
            name: "kill_sdk_create",
            workers: roots
                .iter()
                .map(|r| Spec::new(Lang::Sdk, "create", &format!("memories/{r}")))
                .collect(),
            delay_ms: (0, 1000),
            sample_per_mille: 100,
            mount_args: &[],
        },
        |mnt, model| memories(mnt, model, &roots),
    );
}

#[test]
fn kill_str_replace() {
    let notes = ["notes0.md", "notes1.md"];
    run(
        Scenario {
            name: "kill_str_replace",
            workers: vec![
                Spec::new(Lang::Python, "replace", "memories/w0"),
                Spec::new(Lang::Python, "replace", "memories/w1"),
                Spec::new(Lang::Sdk, "rev", "memories/s0").extra(json!({"files": notes})),
                Spec::new(Lang::Sdk, "rev", "memories/s1").extra(json!({"files": notes})),
            ],
            delay_ms: (0, 800),
            sample_per_mille: 1000,
            mount_args: &[],
        },
        |mnt, model| {
            memories(mnt, model, &["w0", "w1", "s0", "s1"]);
            for (i, s) in ["s0", "s1"].iter().enumerate() {
                for (j, n) in notes.iter().enumerate() {
                    let size = [3_000, 70_000][(i + j) % 2];
                    put_file(
                        mnt,
                        model,
                        &format!("memories/{s}/{n}"),
                        Content::full(&format!("{s}.{n}"), size, 0),
                    );
                }
            }
        },
    );
}

const BIG_FILES: usize = 10_000;

#[test]
fn kill_dir_rename() {
    let places = ["memories/r0/d1/A", "memories/r0/d1/B", "memories/r0/d2/C"];
    run(
        Scenario {
            name: "kill_dir_rename",
            workers: vec![
                Spec::new(Lang::Python, "dirrename", "memories/r0")
                    .extra(json!({"places": places})),
            ],
            delay_ms: (0, 600),
            sample_per_mille: 5,
            mount_args: &[],
        },
        |mnt, model| {
            memories(mnt, model, &["r0"]);
            put_dir(mnt, model, "memories/r0/d1");
            put_dir(mnt, model, "memories/r0/d2");
            put_dir(mnt, model, places[0]);
            // Empty files are created without a durable commit each; the first close of a
            // batch makes the whole batch durable. Every 500th file holds content.
            for batch in (0..BIG_FILES).collect::<Vec<_>>().chunks(1000) {
                let mut open = Vec::new();
                for &i in batch {
                    let rel = format!("{}/f{i:05}", places[0]);
                    if i % 500 == 0 {
                        put_file(
                            mnt,
                            model,
                            &rel,
                            Content::full(&format!("big.{i}"), 200 + i as u64, 0),
                        );
                        continue;
                    }
                    let f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(mnt.join(&rel))
                        .unwrap_or_else(|e| panic!("create {rel}: {e}"));
                    open.push(f);
                    model
                        .insert(&rel, Node::File(Content::full("", 0, 0)))
                        .unwrap();
                }
                if let Some(f) = open.first() {
                    f.sync_all().expect("fsync");
                }
            }
            assert_eq!(
                std::fs::read_dir(mnt.join(places[0])).unwrap().count(),
                BIG_FILES
            );
        },
    );
}

#[test]
fn kill_recursive_delete() {
    run(
        Scenario {
            name: "kill_recursive_delete",
            workers: vec![
                Spec::new(Lang::Python, "rmtree", "memories/t0"),
                Spec::new(Lang::Python, "rmtree", "memories/t1"),
                Spec::new(Lang::Sdk, "rmtree", "memories/n0"),
            ],
            delay_ms: (0, 800),
            sample_per_mille: 1000,
            mount_args: &[],
        },
        |mnt, model| {
            memories(mnt, model, &["t0", "t1", "n0"]);
            // A tree for each to start by deleting.
            for r in ["t0", "t1", "n0"] {
                let top = format!("memories/{r}/start");
                put_dir(mnt, model, &top);
                for d in 0..3 {
                    put_dir(mnt, model, &format!("{top}/s{d}"));
                    for f in 0..4 {
                        put_file(
                            mnt,
                            model,
                            &format!("{top}/s{d}/f{f}.md"),
                            Content::full(&format!("{r}.start.{d}.{f}"), 100 + 300 * f, 0),
                        );
                    }
                }
            }
        },
    );
}

#[test]
fn kill_large_writes() {
    run(
        Scenario {
            name: "kill_large_writes",
            workers: vec![
                Spec::new(Lang::Python, "large", "memories/L0"),
                Spec::new(Lang::Python, "large", "memories/L1"),
            ],
            delay_ms: (0, 2500),
            sample_per_mille: 1000,
            // History keeps every replaced 1-12 MiB file for 30 days by default; here that
            // would grow the store by gigabytes per run (and redb's verification after each
            // kill and `check` with it). Content durability is what this scenario is about;
            // the other scenarios run with history on.
            mount_args: &["--keep-history", "0"],
        },
        |mnt, model| memories(mnt, model, &["L0", "L1"]),
    );
}

// ---- unlinked while open ----

fn status(target: &Path) -> serde_json::Value {
    let out = common::redbfs(&["status", target.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "redbfs status {}: {}",
        target.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn unlinked_while_open_stays_readable_until_close() {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;
    if !fuse_available() {
        return;
    }
    let mut tm = TestMount::new();
    let path = tm.path("doomed.md");
    let data = content("doomed", 300_000, 0);
    std::fs::write(&path, &data).unwrap();
    let before = status(&tm.mountpoint);

    let mut r = std::fs::File::open(&path).unwrap();
    let mut w = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        std::fs::metadata(&path).map_err(|e| e.kind()).unwrap_err(),
        std::io::ErrorKind::NotFound,
        "the name is gone after unlink"
    );
    assert!(std::fs::read_dir(tm.path("")).unwrap().next().is_none());
    assert_eq!(
        r.metadata().unwrap().nlink(),
        0,
        "fstat of the open file: nlink 0"
    );
    assert_eq!(r.metadata().unwrap().len(), data.len() as u64);
    let mut got = Vec::new();
    r.read_to_end(&mut got).unwrap();
    assert!(
        got == data,
        "content read after unlink: {}",
        describe_bytes(&got)
    );

    // Writing through a handle still works and is seen by the other handle.
    w.seek(SeekFrom::Start(100_000)).unwrap();
    w.write_all(b"still here").unwrap();
    w.sync_all().expect("fsync of an unlinked open file");
    let mut got = Vec::new();
    r.seek(SeekFrom::Start(0)).unwrap();
    r.read_to_end(&mut got).unwrap();
    let mut want = data.clone();
    want[100_000..100_010].copy_from_slice(b"still here");
    assert!(
        got == want,
        "content after a write through the other handle"
    );
    drop(w);
    let mut got = Vec::new();
    r.seek(SeekFrom::Start(0)).unwrap();
    r.read_to_end(&mut got).unwrap();
    assert!(got == want, "content after the writer closed");
    let during = status(&tm.mountpoint);
    assert_eq!(
        during["files"], before["files"],
        "still counted while open: {during}"
    );
    drop(r);

    // Reclaimed at the last close.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let after = status(&tm.mountpoint);
        if after["files"].as_u64() == Some(before["files"].as_u64().unwrap() - 1) {
            assert_eq!(after["content_bytes"].as_u64(), Some(0), "{after}");
            break;
        }
        assert!(
            Instant::now() < end,
            "not reclaimed after the last close: {after}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    tm.unmount();
    check_store(&tm.store).unwrap();
    let problems = log_problems(&tm.log_text());
    assert!(problems.is_empty(), "daemon log: {problems:?}");
}

#[test]
fn unlinked_while_open_is_reclaimed_after_kill() {
    use std::io::Read;
    if !fuse_available() {
        return;
    }
    become_subreaper();
    let mut tm = TestMount::new();
    std::fs::write(tm.path("keep.md"), content("keep", 5_000, 0)).unwrap();
    let path = tm.path("doomed.md");
    let data = content("doomed", 200_000, 0);
    std::fs::write(&path, &data).unwrap();
    let mut r = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut got = Vec::new();
    r.read_to_end(&mut got).unwrap();
    assert!(got == data, "readable after unlink");
    // A directory removed while a process has it as its working directory: the kernel
    // references it, so it lives on as an orphan too.
    std::fs::create_dir(tm.path("held")).unwrap();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .current_dir(tm.path("held"))
        .spawn()
        .unwrap();
    std::fs::remove_dir(tm.path("held")).unwrap();

    kill_daemon(daemon_pid(&tm.mountpoint));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    drop(r); // the close fails against the dead mount; nothing to do with it
    tm.unmount(); // clears the stale mount

    // The orphan is recorded in the store: a valid state, check is clean.
    check_store(&tm.store).unwrap_or_else(|e| panic!("check with the orphan still recorded: {e}"));
    let s = status(&tm.store);
    assert_eq!(
        s["files"], 2,
        "the orphan is still in the store before the next mount: {s}"
    );

    tm.mount();
    assert!(
        tm.log_text()
            .contains("reclaimed files unlinked while open"),
        "the next mount reclaims the orphan; log:\n{}",
        tm.log_text()
    );
    let s = status(&tm.mountpoint);
    assert_eq!(s["files"], 1, "{s}");
    assert_eq!(s["content_bytes"], 5_000, "{s}");
    assert_eq!(
        std::fs::read(tm.path("keep.md")).unwrap(),
        content("keep", 5_000, 0)
    );
    let names: Vec<_> = std::fs::read_dir(tm.path(""))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("keep.md")]);
    tm.unmount();
    check_store(&tm.store).unwrap();
    let problems = log_problems(&tm.log_text());
    assert!(problems.is_empty(), "daemon log: {problems:?}");
}

// ---- the verifier itself ----

/// The checks above are only worth something if they fail on damage: a truncated, mixed,
/// missing or extra file must each be caught (damage done through the mount by the test).
#[test]
fn verifier_catches_damage() {
    use std::io::{Seek, SeekFrom, Write};
    if !fuse_available() {
        return;
    }
    let tm = TestMount::new();
    let mnt = tm.mountpoint.clone();
    let mut model = Model::new();
    memories(&mnt, &mut model, &["v0"]);
    put_file(
        &mnt,
        &mut model,
        "memories/v0/big.md",
        Content::full("big", 300_000, 0),
    );
    let spec = vec![Spec::new(Lang::Python, "create", "memories/v0")];
    let dir = tm.dir.path().join("v");
    let mut w = Workers::spawn(&spec, &mnt, &dir, 42, "v", None);
    w.wait_ready(Duration::from_secs(30)).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    w.wait_exit(Duration::ZERO); // killed mid-run: one operation may be in flight
    let mut m = model.clone();
    let r = replay("v0", &read_journal(&w.procs[0].journal), &mut m).unwrap();
    assert!(
        r.acked > 3,
        "the worker acknowledged {} operations",
        r.acked
    );
    let verify = |m: &Model| -> Result<(), String> {
        let actual = read_tree(&mnt)?;
        let mut rd = Reader::new(&mnt);
        let (next, _) = verify_root(m, &actual, "memories/v0", &r, &mut rd)?;
        verify_all(&next, &actual, &mut rd, &["memories/v0".to_string()])
    };
    verify(&m).expect("the undamaged tree passes");
    let victim = m
        .files_under("memories/v0")
        .into_iter()
        .find(|p| p.ends_with(".md") && !p.ends_with("big.md"))
        .unwrap();
    let original = std::fs::read(mnt.join(&victim)).unwrap();

    // Truncated.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join(&victim))
        .unwrap();
    f.set_len(original.len() as u64 / 2).unwrap();
    drop(f);
    let e = verify(&m).expect_err("a truncated file must be caught");
    assert!(e.contains(&victim), "{e}");
    std::fs::write(mnt.join(&victim), &original).unwrap();
    verify(&m).expect("restored");

    // Mixed: one 64 KiB chunk of the big file replaced by a same-size chunk of other content.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("memories/v0/big.md"))
        .unwrap();
    f.seek(SeekFrom::Start(65_536)).unwrap();
    f.write_all(&content("bog", 300_000, 0)[65_536..131_072])
        .unwrap();
    drop(f);
    let e = verify(&m).expect_err("a mixed file must be caught");
    assert!(e.contains("big.md") && e.contains("differs"), "{e}");
    std::fs::write(mnt.join("memories/v0/big.md"), content("big", 300_000, 0)).unwrap();
    verify(&m).expect("restored");

    // Missing.
    std::fs::remove_file(mnt.join(&victim)).unwrap();
    let e = verify(&m).expect_err("a lost file must be caught");
    assert!(e.contains(&victim) && e.contains("missing"), "{e}");
    std::fs::write(mnt.join(&victim), &original).unwrap();

    // Extra, inside and outside the worker's directory.
    std::fs::write(mnt.join("memories/v0/ghost.md"), b"boo").unwrap();
    let e = verify(&m).expect_err("an extra file must be caught");
    assert!(e.contains("ghost.md"), "{e}");
    std::fs::remove_file(mnt.join("memories/v0/ghost.md")).unwrap();
    std::fs::create_dir(mnt.join("memories/stray")).unwrap();
    let e = verify(&m).expect_err("an extra directory must be caught");
    assert!(e.contains("memories/stray"), "{e}");
    std::fs::remove_dir(mnt.join("memories/stray")).unwrap();
    verify(&m).expect("restored");

    // A directory rename in flight: all-old or all-new passes; both, neither or split fails.
    let mut d = Model::new();
    for p in ["memories", "memories/x", "memories/x/A"] {
        d.mkdir(p).unwrap();
    }
    for i in 0..4 {
        let c = Content::full(&format!("f{i}"), 100, 0);
        d.insert(&format!("memories/x/A/f{i}"), Node::File(c))
            .unwrap();
    }
    let rep = Replayed {
        label: "renamer".into(),
        pending: Some(Pending {
            op: Op::Rename("memories/x/A".into(), "memories/x/B".into()),
            acked_len: None,
            failed: None,
        }),
        ..Default::default()
    };
    let dir_of = |names: &[usize]| {
        ANode::Dir(
            names
                .iter()
                .map(|i| (format!("f{i}"), ANode::File { size: 100 }))
                .collect(),
        )
    };
    let tree = |x: Vec<(&str, ANode)>| {
        let x = ANode::Dir(x.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
        ANode::Dir(
            [(
                "memories".to_string(),
                ANode::Dir([("x".to_string(), x)].into()),
            )]
            .into(),
        )
    };
    let mut rd = Reader::new(&mnt);
    rd.all = false;
    let check = |a: &ANode, rd: &mut Reader| verify_root(&d, a, "memories/x", &rep, rd).map(|_| ());
    check(&tree(vec![("A", dir_of(&[0, 1, 2, 3]))]), &mut rd).expect("all old");
    check(&tree(vec![("B", dir_of(&[0, 1, 2, 3]))]), &mut rd).expect("all new");
    check(
        &tree(vec![
            ("A", dir_of(&[0, 1, 2, 3])),
            ("B", dir_of(&[0, 1, 2, 3])),
        ]),
        &mut rd,
    )
    .expect_err("in both places");
    check(&tree(vec![]), &mut rd).expect_err("in neither place");
    check(
        &tree(vec![("A", dir_of(&[0, 1])), ("B", dir_of(&[2, 3]))]),
        &mut rd,
    )
    .expect_err("split between the two");
    check(&tree(vec![("B", dir_of(&[0, 1, 2]))]), &mut rd).expect_err("renamed but a file lost");
}
