//! Replication to object storage, end to end: a mount with `--replica` against a local
//! directory (`file://`) and against a real S3-protocol server (moto, from
//! tests/replica/requirements.txt, installed by tests/clients/setup.sh) on 127.0.0.1.
//!
//! Each flow records the tree after every operation. The machine is then "lost" (the daemon
//! SIGKILLed, the store and its log deleted) and `restore --from` on a fresh directory must
//! give one of the recorded trees (a prefix of what was done), no older than the last one
//! the replica had caught up with; `--at COMMIT` must give exactly the tree at that commit.
//! The S3 server is reached through a proxy the test can take down, so the mount keeps
//! serving through an outage, reports the lag, and catches up when the server is back.
//! No timing is asserted: waits for the replica are bounded polls.

mod common;

use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::fuse_available;
use common::hosts::{Host, Moto, Tree, file_replica, free_port, memory_op as op, s3_env, tree};

/// The trees after each operation, with the commit each is at.
type States = Vec<(u64, Tree)>;

/// A replicated mount holding the memory tool's `memories` directory, and the state it starts
/// in.
fn started(url: &str) -> (Host, States) {
    let m = Host::writer(url, "200ms", &[]);
    std::fs::create_dir(m.mp.join("memories")).unwrap();
    let states = vec![(m.status()["commits"].as_u64().unwrap(), tree(&m.mp))];
    (m, states)
}

/// Whether `r` is a state inside one operation from `a` to `b` (an operation may be more than
/// one commit: a create, then its content; a temporary file, then its rename).
fn between(a: &Tree, b: &Tree, r: &Tree) -> bool {
    let keys: std::collections::BTreeSet<&String> =
        a.keys().chain(b.keys()).chain(r.keys()).collect();
    keys.into_iter().all(|k| {
        let v = r.get(k);
        v == a.get(k)
            || v == b.get(k)
            || k.contains(".tmp-")
            || (v == Some(&Some(Vec::new())) && matches!(b.get(k), Some(Some(_))))
    })
}

/// Runs `n` operations from `from`; after each, the tree and the commit number it is at.
fn session(m: &Host, from: usize, n: usize, states: &mut States) {
    for i in from..from + n {
        op(&m.mp, i);
        let commits = m.status()["commits"].as_u64().unwrap();
        states.push((commits, tree(&m.mp)));
    }
}

/// The whole flow against `url`: a session, the replica caught up, more operations, the
/// machine lost, restores (latest and at a commit). `outage` runs between the two halves.
fn lose_and_restore(url: &str, env: &[(String, String)], outage: &dyn Fn(&Host, &mut States)) {
    let mut m = Host::writer(url, "200ms", env);
    std::fs::create_dir(m.mp.join("memories")).unwrap();
    let mut states = vec![(m.status()["commits"].as_u64().unwrap(), tree(&m.mp))];
    session(&m, 0, 25, &mut states);
    outage(&m, &mut states);
    let acked_commit = m.caught_up();
    let acked = states.iter().rposition(|s| s.0 <= acked_commit).unwrap();
    session(&m, 100, 10, &mut states);
    m.lose();
    let got = m.restore(url, None);
    let at = (acked..states.len()).find(|&i| {
        states[i].1 == got
            || states
                .get(i + 1)
                .is_some_and(|n| between(&states[i].1, &n.1, &got))
    });
    assert!(
        at.is_some(),
        "the restored tree is not a state at or after the last one the replica had: {got:?}"
    );
    // A point in time: the tree right after an early operation.
    let (commit, want) = &states[states.len() / 3];
    let got = m.restore(url, Some(&commit.to_string()));
    assert_eq!(&got, want, "restore --at {commit}");
    let ls = m.run(&["replica", "ls", url, "--json"]);
    assert!(ls.status.success());
    let v: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert!(!v["generations"].as_array().unwrap().is_empty(), "{v}");
}

#[test]
fn a_file_replica_restores_a_lost_machine_and_any_commit() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    lose_and_restore(&url, &[], &|_, _| {});
}

/// The stock memory tools of both SDKs (TypeScript `@anthropic-ai/sdk`, Python `anthropic`,
/// pinned in tests/clients) run their scripted sessions, unchanged, on a replicated mount;
/// once the replica has caught up the machine is lost, and the store restored on a new host
/// holds, byte for byte, the tree both sessions left.
#[test]
fn both_sdks_sessions_on_a_replicated_mount_restore_byte_for_byte() {
    if !fuse_available() {
        return;
    }
    let clients = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients");
    let session = clients.join("session.json");
    let python = clients.join(".venv/bin/python");
    assert!(
        clients.join("node_modules/@anthropic-ai/sdk").is_dir() && python.exists(),
        "the pinned SDKs are not installed: run tests/clients/setup.sh first"
    );
    let (_rep, url) = file_replica();
    let mut m = Host::writer(&url, "200ms", &[]);
    for (base, program, script) in [
        ("node", PathBuf::from("node"), "run_session.mjs"),
        ("python", python.clone(), "run_session.py"),
    ] {
        let base = m.mp.join(base);
        std::fs::create_dir(&base).unwrap();
        let out = Command::new(&program)
            .arg(clients.join(script))
            .arg(&base)
            .arg(&session)
            .current_dir(&clients)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script} on the mount: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            base.join("memories").is_dir(),
            "{script} left no memories directory"
        );
    }
    let want = tree(&m.mp);
    for base in ["node", "python"] {
        assert!(
            want.iter()
                .any(|(k, v)| k.starts_with(&format!("{base}/memories/")) && v.is_some()),
            "the {base} session left no memory file: {want:?}"
        );
    }
    m.caught_up();
    m.lose();
    assert_eq!(
        m.restore(&url, None),
        want,
        "the restored store differs from what the SDK sessions left"
    );
}

/// Killed at a random moment while it ships a stream of commits: whatever it left in the
/// replica restores, to a state the store was in.
#[test]
fn a_daemon_killed_mid_upload_leaves_a_restorable_replica() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    let mut m = Host::writer(&url, "200ms", &[]);
    std::fs::create_dir(m.mp.join("memories")).unwrap();
    let mut states = vec![(0, tree(&m.mp))];
    session(&m, 0, 5, &mut states);
    m.caught_up();
    let mp = m.mp.clone();
    let mut model = tree(&m.mp);
    let writer = std::thread::spawn(move || {
        // The only writer: each state it may leave is the one before plus its write (recorded
        // before the write, which the kill may cut short after its commit).
        let mut trees = Vec::new();
        for i in 200..100_000 {
            // Larger files, so uploads take a while.
            let rel = format!("memories/big-{}", i % 5);
            let content = vec![b'a' + (i % 26) as u8; 200_000];
            model.insert(rel.clone(), Some(content.clone()));
            trees.push(model.clone());
            if std::fs::write(mp.join(&rel), content).is_err() {
                break;
            }
        }
        trees
    });
    let seed = common::seed_or(std::process::id() as u64);
    std::thread::sleep(Duration::from_millis(500 + seed % 1500));
    m.lose();
    let trees = writer.join().unwrap();
    let got = m.restore(&url, None);
    assert!(
        states.iter().any(|s| s.1 == got) || trees.contains(&got),
        "the restored tree is no state the store was in (seed {seed})"
    );
}

/// The generations `replica ls` lists for `url`.
fn generations(m: &Host, url: &str) -> Vec<serde_json::Value> {
    let ls = m.run(&["replica", "ls", url, "--json"]);
    assert!(
        ls.status.success(),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    v["generations"].as_array().unwrap().clone()
}

/// A clean unmount ships everything, and the next mount continues the generation instead of
/// uploading a new snapshot: one generation holds both sessions, restores the latest tree,
/// and restores any commit of the first session too.
#[test]
fn a_restart_continues_the_generation() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    let (mut m, mut states) = started(&url);
    session(&m, 0, 15, &mut states);
    m.unmount();
    let first = generations(&m, &url);
    assert_eq!(first.len(), 1, "{first:?}");
    let reached = first[0]["last_commit"].as_u64().unwrap();
    assert!(
        reached >= states.last().unwrap().0,
        "the unmount shipped everything: {first:?}"
    );
    m.mount(&[]);
    let s = m.status();
    assert_eq!(s["replicas"][0]["snapshots"], 0, "no new snapshot: {s}");
    session(&m, 15, 15, &mut states);
    m.unmount();
    let gens = generations(&m, &url);
    assert_eq!(gens.len(), 1, "one generation: {gens:?}\n{}", m.log());
    assert_eq!(gens[0]["generation"], first[0]["generation"]);
    assert_eq!(m.restore(&url, None), states.last().unwrap().1);
    let (commit, want) = &states[5];
    assert_eq!(&m.restore(&url, Some(&commit.to_string())), want);
}

/// A daemon killed and mounted again: the store recovers from its log, and whether the
/// mount continues the generation (the replica had every commit the store kept) or starts a
/// new one, the replica restores the last tree and every commit before the kill.
#[test]
fn a_crash_and_remount_keep_the_replica_whole() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    let (mut m, mut states) = started(&url);
    session(&m, 0, 10, &mut states);
    m.caught_up();
    m.kill();
    m.mount(&[]);
    session(&m, 10, 10, &mut states);
    m.unmount();
    assert_eq!(m.restore(&url, None), states.last().unwrap().1);
    let (commit, want) = &states[4];
    assert_eq!(&m.restore(&url, Some(&commit.to_string())), want);
}

/// A store changed while unmounted (here by `import`) is no longer at the commit its
/// generation reaches: the next mount starts a new generation, which holds the change.
#[test]
fn an_offline_change_starts_a_new_generation() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    let (mut m, mut states) = started(&url);
    session(&m, 0, 5, &mut states);
    m.unmount();
    let src = m.dir.path().join("offline");
    std::fs::create_dir_all(src.join("memories")).unwrap();
    std::fs::write(src.join("memories/imported.md"), "added offline\n").unwrap();
    let out = m.run(&["import", src.to_str().unwrap(), m.store.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.mount(&[]);
    let want = tree(&m.mp);
    assert!(want.contains_key("memories/imported.md"));
    m.caught_up();
    m.unmount();
    let gens = generations(&m, &url);
    assert_eq!(gens.len(), 2, "{gens:?}");
    assert_eq!(m.restore(&url, None), want);
}

/// A store restored from its replica ships nowhere until told (the restore says which URLs
/// it dropped and the flag that continues them); told, it still must not append to the
/// generation it came from (the replica may hold the original store's chain): its first
/// replicated mount starts a new one.
#[test]
fn a_restored_store_starts_its_own_generation() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    let (mut m, mut states) = started(&url);
    session(&m, 0, 5, &mut states);
    m.unmount();
    let store = m.store.to_str().unwrap().to_string();
    let out = m.run(&["restore", "--from", &url, &store, "--discard-current"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("no longer ships to replica {url}"))
            && said.contains(&format!("--replica {url}")),
        "the restore names the replica it dropped and the flag that continues it: {said}"
    );
    let out = m.run(&["status", &store]);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("replica:"),
        "a restored store ships nowhere"
    );
    m.mount(&["--replica", &url]);
    assert_eq!(tree(&m.mp), states.last().unwrap().1);
    m.caught_up();
    m.unmount();
    let gens = generations(&m, &url);
    assert_eq!(gens.len(), 2, "{gens:?}\n{}", m.log());
}

/// Another store shipped to the URL meanwhile: the first store's generation is no longer the
/// newest, so its next mount starts a new one (and the restore gives its tree, not the
/// other's).
#[test]
fn another_store_on_the_url_makes_the_next_mount_start_a_new_generation() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    let mut a = Host::writer(&url, "200ms", &[]);
    std::fs::create_dir(a.mp.join("memories")).unwrap();
    let mut states = Vec::new();
    session(&a, 0, 5, &mut states);
    a.unmount();
    let mut b = Host::writer(&url, "200ms", &[]);
    std::fs::create_dir(b.mp.join("memories")).unwrap();
    std::fs::write(b.mp.join("memories/other.md"), "another store\n").unwrap();
    b.unmount();
    a.mount(&[]);
    session(&a, 5, 5, &mut states);
    a.unmount();
    assert_eq!(generations(&a, &url).len(), 3, "{}", a.log());
    assert_eq!(a.restore(&url, None), states.last().unwrap().1);
}

/// A file too large for one log record ships as one record: no new generation, and the
/// restore gives it back byte for byte.
#[test]
fn a_large_file_ships_without_a_new_generation() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    let m = Host::writer(&url, "200ms", &[]);
    std::fs::create_dir(m.mp.join("memories")).unwrap();
    m.caught_up();
    let before = m.status()["replicas"][0].clone();
    let big: Vec<u8> = (0..2u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(m.mp.join("memories/big.bin"), &big).unwrap();
    m.caught_up();
    let after = m.status()["replicas"][0].clone();
    assert_eq!(after["snapshots"], before["snapshots"], "{before}\n{after}");
    assert_eq!(after["generation"], before["generation"]);
    let got = m.restore(&url, None);
    assert_eq!(got.get("memories/big.bin"), Some(&Some(big)));
}

/// `--replica-snapshot-every` starts generations on its schedule and `--replica-keep` removes
/// the old ones, keeping the newest; what is kept still restores, latest and at a commit.
#[test]
fn old_generations_are_pruned_on_schedule() {
    if !fuse_available() {
        return;
    }
    let (_rep, url) = file_replica();
    let options = [
        "--replica",
        url.as_str(),
        "--replica-interval",
        "200ms",
        "--replica-snapshot-every",
        "2s",
        "--replica-keep",
        "3s",
    ];
    let mut m = Host::mounted(&options, &[]);
    std::fs::create_dir(m.mp.join("memories")).unwrap();
    m.caught_up();
    let mut states = Vec::new();
    let first = generations(&m, &url)[0]["generation"].clone();
    let until = Instant::now() + Duration::from_secs(120);
    let mut i = 0;
    loop {
        session(&m, i, 5, &mut states);
        i += 5;
        let gens = generations(&m, &url);
        let pruned = gens.iter().all(|g| g["generation"] != first);
        if pruned && gens.len() >= 2 {
            break;
        }
        assert!(
            Instant::now() < until,
            "never pruned: {gens:?}\n{}",
            m.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    m.caught_up();
    m.unmount();
    let gens = generations(&m, &url);
    assert!(gens.len() >= 2, "{gens:?}");
    assert_eq!(m.restore(&url, None), states.last().unwrap().1);
    let oldest = &gens[0];
    let (lo, hi) = (
        oldest["commit"].as_u64().unwrap(),
        oldest["last_commit"].as_u64().unwrap(),
    );
    let kept = states.iter().find(|s| lo <= s.0 && s.0 <= hi);
    let (commit, want) = kept.unwrap_or_else(|| panic!("no state in {lo}..={hi}: {gens:?}"));
    assert_eq!(&m.restore(&url, Some(&commit.to_string())), want);
}

// ---- S3, through moto ----

/// A TCP proxy in front of the server that the test can take down (connections refused,
/// open ones cut) and bring back on the same port.
struct Proxy {
    port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(to: u16) -> Proxy {
        let port = free_port();
        let p = Proxy {
            port,
            up: Arc::new(AtomicBool::new(true)),
            conns: Arc::new(Mutex::new(Vec::new())),
        };
        let (up, conns) = (p.up.clone(), p.conns.clone());
        std::thread::spawn(move || {
            loop {
                if !up.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
                l.set_nonblocking(true).unwrap();
                while up.load(Ordering::Acquire) {
                    match l.accept() {
                        Ok((c, _)) => pump(c, to, &conns),
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }
        });
        p
    }

    fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Release);
        if !up {
            for c in self.conns.lock().unwrap().drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }
}

fn pump(client: TcpStream, to: u16, conns: &Mutex<Vec<TcpStream>>) {
    client.set_nonblocking(false).unwrap();
    let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
        return;
    };
    conns.lock().unwrap().push(client.try_clone().unwrap());
    conns.lock().unwrap().push(server.try_clone().unwrap());
    for (mut a, mut b) in [
        (client.try_clone().unwrap(), server.try_clone().unwrap()),
        (server, client),
    ] {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut a, &mut b);
            let _ = b.shutdown(Shutdown::Write);
        });
    }
}

/// The same flow against S3, with the server out of reach for a while in the middle: the
/// mount keeps serving, `status` shows the lag and the error, one warning is logged for the
/// outage, and the replica catches up and restores completely once the server is back.
#[test]
fn an_s3_replica_rides_out_an_outage_and_restores_a_lost_machine() {
    if !fuse_available() {
        return;
    }
    let moto = Moto::start();
    moto.bucket("memory");
    let proxy = Proxy::start(moto.port);
    let env = s3_env(proxy.port);
    let outage = |m: &Host, states: &mut States| {
        m.caught_up();
        proxy.set_up(false);
        session(m, 50, 10, states);
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let s = m.status();
            let r = &s["replicas"][0];
            if r["commits_behind"].as_u64().unwrap() > 0 && !r["error"].is_null() {
                break;
            }
            assert!(Instant::now() < until, "no lag reported while down: {s}");
            std::thread::sleep(Duration::from_millis(200));
        }
        session(m, 60, 5, states);
        proxy.set_up(true);
        m.caught_up();
        let log = m.log();
        assert_eq!(
            log.matches("cannot reach the replica").count(),
            1,
            "one warning per outage:\n{log}"
        );
        assert!(log.contains("reachable again"), "{log}");
    };
    lose_and_restore("s3://memory/agents/one", &env, &outage);
}
