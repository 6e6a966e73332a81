//! A replica that is damaged, hostile or out of reach never restores less in silence, never
//! panics or hangs a command, and never leaks a secret. Each case starts from a real replica
//! (a mount shipped a session to a `file://` directory; copied for each case) and breaks it
//! the way the world does: a flipped byte, a missing segment, a huge or forged segment, a
//! FIFO or a symlink under an object's name, a name that is not UTF-8, the directory deleted
//! under a mount; and an S3 server (moto, behind a proxy) that answers 500 or stalls. Then
//! `restore --from`, `replica ls` and `replica verify` must say exactly where the chain
//! breaks, and a replica restored after every fault holds every commit shipped before it.
//! A mutation fuzzer drives the decoder and the apply path with mutated real segments.
//! No timing is asserted: waits are bounded polls.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::hosts::Moto;
use common::{fuse_available, redbfs_bin};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(redbfs_bin())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// `redbfs mount MP --store STORE EXTRA...` with `env` set.
fn mount(mp: &Path, store: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec![
        "mount",
        mp.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ];
    args.extend(extra);
    run(&args, env)
}

fn err_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A shipped session: the replica directory, the commits it holds, and the file contents at
/// the last one (name -> content).
struct Base {
    _dir: tempfile::TempDir,
    replica: PathBuf,
    last_commit: u64,
    files: Vec<(String, String)>,
}

/// Mounts a fresh store replicating to `replica`, writes `n` files (one commit or more each),
/// and unmounts (the unmount ships the rest).
fn ship_session(dir: &Path, replica: &Path, n: usize) -> (u64, Vec<(String, String)>) {
    let mp = dir.join("mnt");
    let store = dir.join("mnt.redb");
    let url = format!("file://{}", replica.display());
    let out = mount(
        &mp,
        &store,
        &["--replica", &url, "--replica-interval", "100ms"],
        &[],
    );
    assert!(out.status.success(), "{}", err_of(&out));
    let mut files = Vec::new();
    for i in 0..n {
        let name = format!("note-{i}.md");
        let body = format!("note {i}\n").repeat(i + 1);
        std::fs::write(mp.join(&name), &body).unwrap();
        files.push((name, body));
        // Several segments: let the shipper take each few writes apart.
        if i % 4 == 3 {
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    let out = run(&["unmount", mp.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    // A healthy replica: the unmount says so on the terminal.
    assert!(
        err_of(&out).contains(&format!("replica {url} holds every commit")),
        "{}",
        err_of(&out)
    );
    let v = ls_json(&url);
    let last = v["generations"][0]["last_commit"].as_u64().unwrap();
    (last, files)
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let replica = dir.path().join("replica");
        let (last_commit, files) = ship_session(dir.path(), &replica, 24);
        Base {
            _dir: dir,
            replica,
            last_commit,
            files,
        }
    })
}

/// A copy of the base replica to break, in a new directory (removed with the guard).
fn copy_of_base() -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("replica");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&base().replica)
        .arg(&to)
        .status()
        .unwrap();
    assert!(st.success());
    let url = format!("file://{}", to.display());
    (dir, to, url)
}

/// The object name a shipper would give segment `first..=last` in generation directory `g`:
/// with the epoch of the writer whose segments are there.
fn planted(g: &Path, first: u64, last: u64) -> PathBuf {
    let epoch = std::fs::read_dir(g.join("segments"))
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            let stem = n.strip_suffix(".seg")?.to_string();
            stem.splitn(3, '-').nth(2).map(|e| format!("-{e}"))
        })
        .next()
        .unwrap_or_default();
    g.join(format!("segments/{first:020}-{last:020}{epoch}.seg"))
}

fn ls_json(url: &str) -> serde_json::Value {
    let out = run(&["replica", "ls", url, "--json"], &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The one generation's directory and its segments (first, last, path), by commit.
fn segments(replica: &Path) -> (PathBuf, Vec<(u64, u64, PathBuf)>) {
    let gens = replica.join("generations");
    let g = std::fs::read_dir(&gens)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut out: Vec<(u64, u64, PathBuf)> = std::fs::read_dir(g.join("segments"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let n = p.file_stem().unwrap().to_str().unwrap().to_string();
            // first-last, then the writer's epoch (-e...).
            let mut parts = n.split('-');
            let (a, b) = (parts.next().unwrap(), parts.next().unwrap());
            (a.parse().unwrap(), b.parse().unwrap(), p)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 3, "the base session made several segments");
    (g, out)
}

/// Restores `url` to a new store; (output, store path, guard).
fn restore(url: &str, extra: &[&str]) -> (Output, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("host").join("memory.redb");
    let mut args = vec!["restore", "--from", url, store.to_str().unwrap()];
    args.extend(extra);
    (run(&args, &[]), store, dir)
}

/// The commit a successful `restore --from ... --json` restored.
fn commit_of(out: &Output) -> u64 {
    assert!(out.status.success(), "{}", err_of(out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["commit"].as_u64().unwrap()
}

/// Nothing a restore made is left beside the store.
fn no_leftovers(store: &Path) {
    let dir = store.parent().unwrap();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                !n.contains(".tmp") && !n.contains("restore-tmp"),
                "left behind: {n}"
            );
        }
    }
}

/// The files a store holds, through `cat`.
fn content(store: &Path, name: &str) -> String {
    let out = run(&["cat", store.to_str().unwrap(), name], &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The checks every broken chain must pass: restore fails naming `needle` and the last good
/// commit, leaving nothing; `--to-last-verified` restores exactly that commit and warns;
/// `replica ls` shows the break; `replica verify` exits 1 with it, in text and JSON.
fn refuses_and_names(url: &str, needle: &str) -> u64 {
    let (out, store, _g) = restore(url, &[]);
    let said = err_of(&out);
    assert_eq!(out.status.code(), Some(1), "fails, never panics: {said}");
    assert!(said.contains(needle), "names the fault ({needle}): {said}");
    assert!(said.contains("verifies up to commit"), "{said}");
    assert!(said.contains("--to-last-verified"), "{said}");
    assert!(!store.exists(), "nothing restored");
    no_leftovers(&store);

    let v = ls_json(url);
    let g = &v["generations"][0];
    let good = g["broken"]["last_good_commit"].as_u64().unwrap();
    assert_eq!(g["last_commit"].as_u64(), Some(good), "{v}");
    assert!(good <= base().last_commit, "{v}");
    assert!(
        g["broken"]["listed_commit"].as_u64().unwrap() > good,
        "commits listed past the break: {v}"
    );
    let text = run(&["replica", "ls", url], &[]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains(&format!("breaks after commit {good}")),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );

    let out = run(&["replica", "verify", url], &[]);
    assert_eq!(out.status.code(), Some(1));
    let lines = String::from_utf8_lossy(&out.stdout);
    assert!(lines.contains(needle), "{lines}");
    let out = run(&["replica", "verify", url, "--json"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["findings"].as_array().unwrap().len(), 1, "{v}");

    let (out, store, _g) = restore(url, &["--to-last-verified"]);
    let said = err_of(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("last verified commit only"), "{said}");
    no_leftovers(&store);
    let (out, _, _g) = restore(url, &["--to-last-verified", "--json"]);
    assert_eq!(commit_of(&out), good);
    good
}

#[test]
fn a_sound_replica_verifies_and_restores_every_commit() {
    if !fuse_available() {
        return;
    }
    let (_g, _rep, url) = copy_of_base();
    let out = run(&["replica", "verify", &url], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let (out, store, _g) = restore(&url, &["--json"]);
    assert_eq!(commit_of(&out), base().last_commit);
    for (name, body) in &base().files {
        assert_eq!(&content(&store, name), body);
    }
}

#[test]
fn a_flipped_byte_in_a_middle_segment_is_named_not_skipped() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, url) = copy_of_base();
    let (_, segs) = segments(&rep);
    let (_, _, path) = &segs[segs.len() / 2];
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    refuses_and_names(&url, name);
}

#[test]
fn a_missing_segment_is_a_gap_not_the_end() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, url) = copy_of_base();
    let (_, segs) = segments(&rep);
    let (first, _, path) = &segs[1];
    std::fs::remove_file(path).unwrap();
    let good = refuses_and_names(&url, "are missing");
    assert_eq!(good, first - 1);
}

/// A 1 GiB file (sparse: it costs no disk) planted as the next segment is refused from the
/// listing, never read; a FIFO there is refused without blocking.
#[test]
fn a_huge_segment_or_a_fifo_is_refused_unread() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, url) = copy_of_base();
    let (g, _) = segments(&rep);
    let next = base().last_commit + 1;
    let huge = planted(&g, next, next + 5);
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    refuses_and_names(&url, "over the limit");
    std::fs::remove_file(&huge).unwrap();
    let fifo = planted(&g, next, next);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    refuses_and_names(&url, "not a regular file");
}

/// A FIFO planted as the next segment of a live replica: the next mount reads the chain
/// (to continue it, and to record where its writer role continues from), refuses the FIFO
/// instead of blocking on it, and its unmount returns. The FIFO lies past the point the new
/// writer continues from, so it no longer stands: the mount continues the generation or
/// starts a new one, and the restore holds what it wrote.
#[test]
fn a_fifo_in_a_live_replica_never_hangs_the_mount() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rep = dir.path().join("replica");
    let url = format!("file://{}", rep.display());
    let (last, _) = ship_session(dir.path(), &rep, 3);
    let g = newest_generation(&rep);
    let next = last + 1;
    let fifo = planted(&g, next, next + 1);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mp = dir.path().join("mnt");
    let store = dir.path().join("mnt.redb");
    let out = mount(&mp, &store, &[], &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    std::fs::write(mp.join("after.md"), "after the fifo\n").unwrap();
    let out = run(&["unmount", mp.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    let v = ls_json(&url);
    let n = v["generations"].as_array().unwrap().len();
    assert!(n == 1 || n == 2, "{v}");
    let (out, restored, _d) = restore(&url, &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    assert_eq!(content(&restored, "after.md"), "after the fifo\n");
}

/// The newest generation's directory.
fn newest_generation(replica: &Path) -> PathBuf {
    let mut gens: Vec<PathBuf> = std::fs::read_dir(replica.join("generations"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    gens.sort();
    gens.pop().unwrap()
}

/// Records recomputed with valid checksums (the log id is in the manifest) but entries redb
/// would panic on: refused with the segment and the byte offset; no panic, nothing left.
#[test]
fn forged_segments_are_refused_with_their_offset() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, url) = copy_of_base();
    let (g, segs) = segments(&rep);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(g.join("manifest.json")).unwrap()).unwrap();
    let id = manifest["log_id"].as_u64().unwrap();
    let (first, last, path) = &segs[segs.len() / 2];
    // A record of commit `first` that puts a 3-byte key in `inodes`, then the rest as they were.
    let mut entry = vec![1u8, 6];
    entry.extend_from_slice(b"inodes");
    entry.extend_from_slice(&3u32.to_le_bytes());
    entry.extend_from_slice(&[1, 2, 3]);
    entry.extend_from_slice(&1u32.to_le_bytes());
    entry.push(0);
    let old = std::fs::read(path).unwrap();
    let mut forged = Vec::new();
    encode(&mut forged, id, *first, &entry);
    forged
        .extend_from_slice(&old[24 + u32::from_le_bytes(old[4..8].try_into().unwrap()) as usize..]);
    std::fs::write(path, &forged).unwrap();
    let _ = last;
    refuses_and_names(&url, "does not fit table inodes");
    let out = run(&["replica", "verify", &url], &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("at byte 24"));
}

/// The log's record layout: magic, length, number, FNV-1a checksum over id, number, length
/// and payload.
fn encode(buf: &mut Vec<u8>, id: u64, seq: u64, payload: &[u8]) {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let len = (payload.len() as u32).to_le_bytes();
    for b in id
        .to_le_bytes()
        .iter()
        .chain(&seq.to_le_bytes())
        .chain(&len)
        .chain(payload)
    {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    buf.extend_from_slice(b"RWAL");
    buf.extend_from_slice(&len);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&h.to_le_bytes());
    buf.extend_from_slice(payload);
}

/// A name that is not UTF-8 or not a generation's under `generations/` is skipped with one
/// warning; a generation or a snapshot that is a symlink is never followed.
#[test]
fn foreign_names_are_skipped_and_symlinks_not_followed() {
    if !fuse_available() {
        return;
    }
    use std::os::unix::ffi::OsStrExt;
    let (_g, rep, url) = copy_of_base();
    let (g, _) = segments(&rep);
    let gens = rep.join("generations");
    std::fs::create_dir(gens.join(std::ffi::OsStr::from_bytes(b"bad-\xff-name"))).unwrap();
    std::fs::write(gens.join("README"), "not a generation").unwrap();
    let out = run(&["replica", "ls", &url], &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    let said = err_of(&out);
    assert_eq!(
        said.matches("skipped").count(),
        1,
        "one warning line: {said}"
    );
    let (out, _, _d) = restore(&url, &["--json"]);
    assert_eq!(commit_of(&out), base().last_commit);

    // The snapshot replaced by a symlink to a copy of itself: not followed.
    let snap = g.join("snapshot.redb");
    let elsewhere = rep.parent().unwrap().join("elsewhere.redb");
    std::fs::rename(&snap, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &snap).unwrap();
    let (out, store, _d) = restore(&url, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", err_of(&out));
    assert!(err_of(&out).contains("symbolic link"), "{}", err_of(&out));
    no_leftovers(&store);
    // A generation directory that is a symlink: skipped, never read.
    std::fs::remove_file(&snap).unwrap();
    std::fs::rename(&elsewhere, &snap).unwrap();
    let moved = rep.parent().unwrap().join("moved-generation");
    std::fs::rename(&g, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &g).unwrap();
    let (out, _, _d) = restore(&url, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", err_of(&out));
    assert!(
        err_of(&out).contains("no complete generation"),
        "{}",
        err_of(&out)
    );
}

/// Blocks written by the children this process has waited for so far (`ru_oublock`, 512
/// bytes each: what they dirtied, page cache included).
fn children_blocks_written() -> i64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) }, 0);
    u.ru_oublock
}

/// A generation's snapshot replaced by a sparse 4 GiB object (anyone with the bucket can
/// put one) is refused before a byte of it is read: its listed size is not the manifest's.
/// It used to be downloaded whole into the restore's scratch file, filling the local disk,
/// and only then compared.
#[test]
fn a_snapshot_of_another_size_than_its_manifest_says_is_never_downloaded() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, url) = copy_of_base();
    let (g, _) = segments(&rep);
    let snap = g.join("snapshot.redb");
    std::fs::remove_file(&snap).unwrap();
    std::fs::File::create(&snap)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    let before = children_blocks_written();
    let (out, store, _d) = restore(&url, &[]);
    let written = (children_blocks_written() - before) * 512;
    assert_eq!(out.status.code(), Some(1), "{}", err_of(&out));
    assert!(
        err_of(&out).contains("holds 4294967296 bytes, its manifest says"),
        "{}",
        err_of(&out)
    );
    assert!(written < 64 << 20, "the restore wrote {written} bytes");
    no_leftovers(&store);
}

/// kill -9 in the middle of `restore --from`: the store it replaces is untouched (or wholly
/// replaced: the last step is one rename), and the next run removes what the killed one
/// left.
#[test]
fn a_killed_restore_leaves_the_target_and_nothing_else() {
    if !fuse_available() {
        return;
    }
    let (_g, _rep, url) = copy_of_base();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("memory.redb");
    let (out, _, _d) = restore(&url, &[]);
    assert!(out.status.success());
    // An older store in place: a restore of the base replica at an early commit.
    let out = run(
        &[
            "restore",
            "--from",
            &url,
            store.to_str().unwrap(),
            "--at",
            &(base().last_commit / 2).to_string(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", err_of(&out));
    let before = std::fs::read(&store).unwrap();
    let mut killed_mid_way = false;
    for _ in 0..20 {
        let mut child = Command::new(redbfs_bin())
            .args([
                "restore",
                "--from",
                &url,
                store.to_str().unwrap(),
                "--discard-current",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let scratch = format!(".memory.redb.from-replica-{}.tmp", child.id());
        let until = Instant::now() + Duration::from_secs(30);
        while !dir.path().join(&scratch).exists() && Instant::now() < until {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::yield_now();
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        let now = std::fs::read(&store).unwrap();
        if !status.success() {
            if now != before {
                // Killed after the rename: the new store is whole.
                let out = run(&["status", store.to_str().unwrap()], &[]);
                assert!(out.status.success(), "{}", err_of(&out));
            }
            if now == before && dir.path().join(&scratch).exists() {
                killed_mid_way = true;
                break;
            }
        } else {
            // It finished first: put the older store back and try again.
            std::fs::write(&store, &before).unwrap();
        }
    }
    assert!(killed_mid_way, "never caught the restore mid-way");
    assert_eq!(
        std::fs::read(&store).unwrap(),
        before,
        "the target is untouched"
    );
    let out = run(
        &[
            "restore",
            "--from",
            &url,
            store.to_str().unwrap(),
            "--discard-current",
            "--json",
        ],
        &[],
    );
    assert_eq!(commit_of(&out), base().last_commit);
    no_leftovers(&store);
}

/// The replica directory deleted under a mount: the shipper notices, says so, and starts a
/// new generation; `status` never claims a replica it cannot restore from; a restore then
/// gives everything.
#[test]
fn a_replica_deleted_under_a_mount_starts_a_new_generation() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rep = dir.path().join("replica");
    let url = format!("file://{}", rep.display());
    let mp = dir.path().join("mnt");
    let store = dir.path().join("mnt.redb");
    let log = dir.path().join("log");
    let out = mount(
        &mp,
        &store,
        &[
            "--log-file",
            log.to_str().unwrap(),
            "--replica",
            &url,
            "--replica-interval",
            "100ms",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", err_of(&out));
    assert!(
        err_of(&out).contains(&format!("replicating to {url}")),
        "{}",
        err_of(&out)
    );
    std::fs::write(mp.join("a.md"), "first\n").unwrap();
    let status = |mp: &Path| -> serde_json::Value {
        let out = run(&["status", mp.to_str().unwrap(), "--json"], &[]);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let until = Instant::now() + Duration::from_secs(60);
    while status(&mp)["replicas"][0]["commits_behind"] != 0 {
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::remove_dir_all(&rep).unwrap();
    std::fs::write(mp.join("b.md"), "after the loss\n").unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(&mp);
        let r = &s["replicas"][0];
        if r["snapshots"] == 2 && r["commits_behind"] == 0 {
            assert!(r["problem"].as_str().unwrap().contains("manifest"), "{s}");
            break;
        }
        assert!(Instant::now() < until, "no new generation: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = run(&["unmount", mp.to_str().unwrap()], &[]);
    assert!(out.status.success());
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged.matches("can no longer be restored from").count(),
        1,
        "{logged}"
    );
    let out = run(&["status", store.to_str().unwrap()], &[]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("replica:    {url} (ships when mounted)")),
        "an unmounted store lists its replicas: {said}"
    );
    let out = run(&["replica", "verify", &url], &[]);
    assert!(
        out.status.success(),
        "what was left of the lost generation went: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let (out, restored, _d) = restore(&url, &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    assert_eq!(content(&restored, "b.md"), "after the loss\n");
    assert_eq!(content(&restored, "a.md"), "first\n");
}

/// Credentials never ride in a URL: refused before the daemon starts (so never in `ps`, the
/// store, or a log), with the way to give them; an endpoint's password never shows in an
/// error.
#[test]
fn secrets_in_urls_are_refused_and_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    let store = dir.path().join("s.redb");
    for url in [
        "s3://AKIDEXAMPLE:Secret123@bucket/p",
        "s3://bucket/p?token=Secret123",
    ] {
        let out = mount(&mp, &store, &["--replica", url], &[]);
        let said = err_of(&out);
        assert!(!out.status.success());
        assert!(!said.contains("Secret123"), "{said}");
        assert!(said.contains("environment"), "{said}");
        assert!(!store.exists(), "refused before anything was made");
        let out = run(&["replica", "ls", url], &[]);
        assert!(!out.status.success() && !err_of(&out).contains("Secret123"));
    }
    let out = run(
        &["replica", "ls", "s3://bucket/p"],
        &[
            ("AWS_ENDPOINT_URL", "http://user:Hunter2pw@127.0.0.1:9"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "SecretKeyValue"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_ALLOW_HTTP", "true"),
            ("REDBFS_REPLICA_TIMEOUT", "5"),
        ],
    );
    let said = err_of(&out);
    assert!(!out.status.success());
    assert!(
        !said.contains("Hunter2pw") && !said.contains("SecretKeyValue"),
        "{said}"
    );
}

/// A replica inside the mountpoint (or reached through a symlink into it) is refused before
/// the mount, instead of a daemon writing through itself.
#[test]
fn a_replica_inside_the_mountpoint_is_refused() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&mp, &link).unwrap();
    let store = dir.path().join("s.redb");
    for url in [
        format!("file://{}/sub/replica", mp.display()),
        format!("file://{}", mp.display()),
        format!("file://{}/x", link.display()),
    ] {
        let out = mount(&mp, &store, &["--replica", &url], &[]);
        assert!(!out.status.success(), "mounted with {url}");
        assert!(
            err_of(&out).contains("inside the mountpoint"),
            "{}",
            err_of(&out)
        );
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(!mounts.contains(mp.to_str().unwrap()));
    }
}

/// The decoder and the apply path on mutated real segments: flipped, cut, grown, spliced and
/// (half the time) re-checksummed so the mutation reaches the record validation. Nothing
/// panics; what decodes applies or is refused with an error.
#[test]
fn mutated_segments_never_panic_decode_or_apply() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, _url) = copy_of_base();
    let (g, segs) = segments(&rep);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(g.join("manifest.json")).unwrap()).unwrap();
    let id = manifest["log_id"].as_u64().unwrap();
    let corpus: Vec<(u64, u64, Vec<u8>)> = segs
        .iter()
        .map(|(a, b, p)| (*a, *b, std::fs::read(p).unwrap()))
        .collect();
    let work = tempfile::tempdir().unwrap();
    // A new seed each run (REDBFS_FUZZ_SEED repeats one), named in any failure.
    let seed = std::env::var("REDBFS_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1;
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut decoded, mut applied) = (0, 0);
    // A few seconds in the suite; REDBFS_FUZZ_CASES runs longer.
    let cases: usize = std::env::var("REDBFS_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    for case in 0..cases {
        let (first, last, seg) = &corpus[next() as usize % corpus.len()];
        let mut bytes = seg.clone();
        for _ in 0..1 + next() % 4 {
            if bytes.is_empty() {
                bytes.push(next() as u8);
                continue;
            }
            let at = next() as usize % bytes.len();
            match next() % 5 {
                0 => bytes[at] ^= 1 << (next() % 8),
                1 => bytes.truncate(at),
                2 => bytes.insert(at, next() as u8),
                3 => {
                    let len = (next() % 8) as usize;
                    bytes.drain(at..(at + len).min(bytes.len()));
                }
                _ => bytes[at] = [0, 0xff, 0x7f, 0x80][next() as usize % 4],
            }
        }
        if next() % 2 == 0 {
            bytes = rechecksum(&bytes, id);
        }
        let file = work.path().join(format!("case-{case}.redb"));
        let outcome = std::panic::catch_unwind(|| {
            let Ok(records) = redbfs::store::decode_segment(id, &bytes, *first, *last) else {
                return (0, 0);
            };
            std::fs::copy(g.join("snapshot.redb"), &file).unwrap();
            let ok = redbfs::store::apply_records(&file, &records).is_ok();
            (1, ok as usize)
        });
        let Ok((d, a)) = outcome else {
            panic!("case {case} panicked (REDBFS_FUZZ_SEED={seed})");
        };
        (decoded, applied) = (decoded + d, applied + a);
        let _ = std::fs::remove_file(&file);
    }
    assert!(
        decoded > 0 && applied > 0,
        "the fuzzer reached apply: {decoded} {applied}"
    );
}

/// Recomputes every whole record's checksum, so mutated payloads pass the checksum.
fn rechecksum(bytes: &[u8], id: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 24 <= bytes.len() && &bytes[at..at + 4] == b"RWAL" {
        let len = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        let seq = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
        let Some(payload) = bytes.get(at + 24..at + 24 + len) else {
            break;
        };
        encode(&mut out, id, seq, payload);
        at += 24 + len;
    }
    out.extend_from_slice(&bytes[at..]);
    out
}

// ---- S3: a server that answers 500 or stalls ----

const PASS: u8 = 0;
const FAIL_500: u8 = 1;
const STALL: u8 = 2;

/// A proxy in front of the server whose mode the test sets: pass, answer every request 500,
/// or accept and never answer. A mode change cuts the open connections, so the next request
/// meets it.
struct FaultProxy {
    port: u16,
    mode: Arc<AtomicU8>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl FaultProxy {
    fn start(to: u16) -> FaultProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = FaultProxy {
            port: l.local_addr().unwrap().port(),
            mode: Arc::new(AtomicU8::new(PASS)),
            conns: Arc::new(Mutex::new(Vec::new())),
        };
        let (mode, conns) = (p.mode.clone(), p.conns.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { continue };
                conns.lock().unwrap().push(c.try_clone().unwrap());
                match mode.load(Ordering::Acquire) {
                    PASS => {
                        let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                            continue;
                        };
                        conns.lock().unwrap().push(server.try_clone().unwrap());
                        for (mut a, mut b) in [
                            (c.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, c),
                        ] {
                            std::thread::spawn(move || {
                                let _ = std::io::copy(&mut a, &mut b);
                                let _ = b.shutdown(Shutdown::Write);
                            });
                        }
                    }
                    FAIL_500 => {
                        std::thread::spawn(move || {
                            let mut c = c;
                            let mut head = [0u8; 4096];
                            let _ = c.read(&mut head);
                            let _ = c.write_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                            let _ = c.shutdown(Shutdown::Both);
                        });
                    }
                    // Stall: keep the connection open, answer nothing.
                    _ => {}
                }
            }
        });
        p
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::Release);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// Through 500s and a stall longer than the timeout, during writes and during unmount: the
/// mount keeps serving, `status` never says up to date while failing, the unmount returns
/// and says what it left, and a restore after it holds every commit shipped before.
#[test]
fn an_s3_replica_through_errors_and_stalls() {
    if !fuse_available() {
        return;
    }
    let moto = Moto::with_bucket("memory");
    let proxy = FaultProxy::start(moto.port);
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
        ("AWS_ALLOW_HTTP", "true"),
        ("REDBFS_REPLICA_TIMEOUT", "2"),
    ];
    let url = "s3://memory/faults";
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    let store = dir.path().join("mnt.redb");
    let log = dir.path().join("log");
    let out = mount(
        &mp,
        &store,
        &[
            "--log-file",
            log.to_str().unwrap(),
            "--replica",
            url,
            "--replica-interval",
            "100ms",
        ],
        &env,
    );
    assert!(out.status.success(), "{}", err_of(&out));
    let status = || -> serde_json::Value {
        let out = run(&["status", mp.to_str().unwrap(), "--json"], &env);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let wait_for = |what: &str, ok: &dyn Fn(&serde_json::Value) -> bool| {
        let until = Instant::now() + Duration::from_secs(90);
        loop {
            let s = status();
            if ok(&s) {
                return s;
            }
            assert!(Instant::now() < until, "{what}: {s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    std::fs::write(mp.join("kept.md"), "shipped before the faults\n").unwrap();
    wait_for("caught up", &|s| s["replicas"][0]["commits_behind"] == 0);
    for (mode, name) in [(FAIL_500, "during-500.md"), (STALL, "during-stall.md")] {
        proxy.set(mode);
        std::fs::write(mp.join(name), "written while the server fails\n").unwrap();
        let s = wait_for("the failure shows", &|s| {
            !s["replicas"][0]["error"].is_null()
        });
        assert!(
            s["replicas"][0]["commits_behind"].as_u64().unwrap() > 0,
            "{s}"
        );
        let human = run(&["status", mp.to_str().unwrap()], &env);
        assert!(!String::from_utf8_lossy(&human.stdout).contains("up to date"));
        assert_eq!(
            std::fs::read_to_string(mp.join(name)).unwrap(),
            "written while the server fails\n"
        );
    }
    // Unmount while stalled: bounded, and it says on the terminal what it left, with exit 1
    // (the mount is gone all the same).
    std::fs::write(mp.join("last.md"), "never shipped\n").unwrap();
    let shipped = status()["replicas"][0]["shipped_commit"].as_u64().unwrap();
    let out = run(&["unmount", mp.to_str().unwrap()], &env);
    let said = err_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("commits behind"), "{said}");
    let left = format!("replica {url} was left without commits {}..=", shipped + 1);
    assert!(said.contains(&left), "{said}");
    assert!(said.contains("unmounted"), "{said}");
    assert!(!mp.join("last.md").exists(), "the mount is gone");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("was left without commits"), "{logged}");
    proxy.set(PASS);
    let restored = dir.path().join("restored.redb");
    let out = run(
        &["restore", "--from", url, restored.to_str().unwrap()],
        &env,
    );
    assert!(out.status.success(), "{}", err_of(&out));
    assert_eq!(content(&restored, "kept.md"), "shipped before the faults\n");
}

/// `redbfs status MP --json` of a follower.
fn follower_status(mp: &Path) -> serde_json::Value {
    let out = run(&["status", mp.to_str().unwrap(), "--json"], &[]);
    assert!(out.status.success(), "{}", err_of(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["follower"].clone()
}

/// Polls the follower at `mp` (at most 60 s) until `done` says yes of its status.
fn follower_until(mp: &Path, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let s = follower_status(mp);
        if done(&s) {
            return s;
        }
        assert!(Instant::now() < until, "the follower never got there: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `restore --from` used to skip a generation whose manifest did not read (logging a
/// warning) and restore an older one, exit 0, while `replica verify` exited 1. A damaged
/// newest manifest now fails it, naming the generation and the `--generation` that restores
/// the older one on purpose; a follower's first mount fails the same way.
#[test]
fn a_damaged_newest_manifest_fails_restore_and_names_the_way_back() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, url) = copy_of_base();
    let old = newest_generation(&rep);
    let old_name = old.file_name().unwrap().to_str().unwrap().to_string();
    // A newer generation: the same objects under a later start time, its manifest cut short.
    let mut parts: Vec<String> = old_name.split('-').map(str::to_string).collect();
    parts[1] = format!("{:020}", parts[1].parse::<u64>().unwrap() + 1);
    let new_name = parts.join("-");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&old)
        .arg(rep.join("generations").join(&new_name))
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::write(
        rep.join("generations")
            .join(&new_name)
            .join("manifest.json"),
        "{\"version\":1,",
    )
    .unwrap();

    let (out, store, _d) = restore(&url, &[]);
    let said = err_of(&out);
    assert_eq!(out.status.code(), Some(1), "fails: {said}");
    assert!(said.contains(&new_name), "names the generation: {said}");
    assert!(said.contains("cannot be restored from"), "{said}");
    assert!(
        said.contains(&format!("--generation {old_name}")),
        "says how to restore the older one: {said}"
    );
    assert!(!store.exists(), "nothing restored");
    no_leftovers(&store);
    let out = run(&["replica", "verify", &url], &[]);
    assert_eq!(out.status.code(), Some(1));

    let (out, store, _d) = restore(&url, &["--generation", &old_name, "--json"]);
    assert_eq!(commit_of(&out), base().last_commit);
    let (name, body) = &base().files[3];
    assert_eq!(&content(&store, name), body);
    let (out, _, _d) = restore(&url, &["--generation", "e-none"]);
    assert!(
        err_of(&out).contains("holds no generation e-none"),
        "{}",
        err_of(&out)
    );

    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    let out = mount(&mp, &dir.path().join("f.redb"), &["--follow", &url], &[]);
    let said = err_of(&out);
    assert!(
        !out.status.success(),
        "a follower's first mount fails: {said}"
    );
    assert!(said.contains(&new_name), "{said}");
}

/// Rewrites every record of `seg` (log id `id`) with `from` replaced by `to` (as long), each
/// record's checksum recomputed.
fn rewrite_segment(seg: &Path, id: u64, from: &[u8], to: &[u8]) -> usize {
    let old = std::fs::read(seg).unwrap();
    let (mut at, mut out, mut hits) = (0usize, Vec::new(), 0);
    while at < old.len() {
        let len = u32::from_le_bytes(old[at + 4..at + 8].try_into().unwrap()) as usize;
        let seq = u64::from_le_bytes(old[at + 8..at + 16].try_into().unwrap());
        let mut payload = old[at + 24..at + 24 + len].to_vec();
        for i in 0..payload.len().saturating_sub(from.len() - 1) {
            if &payload[i..i + from.len()] == from {
                payload[i..i + from.len()].copy_from_slice(to);
                hits += 1;
            }
        }
        encode(&mut out, id, seq, &payload);
        at += 24 + len;
    }
    std::fs::write(seg, &out).unwrap();
    hits
}

/// A follower applied replica records with only their byte layout checked: a segment
/// rewritten so an entry's name holds '/' (checksums recomputed) was mounted and listed
/// EIO, though `restore --from` refused it. A follower's first mount now runs the checks
/// `restore --from` runs and fails naming the rule.
#[test]
fn a_follower_s_first_mount_refuses_what_restore_refuses() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, url) = copy_of_base();
    let (g, segs) = segments(&rep);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(g.join("manifest.json")).unwrap()).unwrap();
    let id = manifest["log_id"].as_u64().unwrap();
    let hits: usize = segs
        .iter()
        .map(|(_, _, p)| rewrite_segment(p, id, b"note-5.md", b"note/5.md"))
        .sum();
    assert!(hits > 0);
    let (out, _store, _d) = restore(&url, &[]);
    let said = err_of(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("name contains '/'"), "{said}");

    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    let store = dir.path().join("f.redb");
    let out = mount(&mp, &store, &["--follow", &url], &[]);
    let said = err_of(&out);
    if out.status.success() {
        let _ = run(&["unmount", mp.to_str().unwrap()], &[]);
    }
    assert!(!out.status.success(), "mounted: {said}");
    assert!(said.contains("name contains '/'"), "names the rule: {said}");
    assert!(!store.exists(), "no store was put in place");
}

/// A live follower applied a forged later segment whose one entry `(1, "x/y") -> 4` passed
/// the byte checks ("up to date"), and the root then listed EIO. The batch is now refused:
/// the follower stays at its last good commit, logs one line naming the commit and the rule,
/// and `status` says so (never "up to date"); the root lists as before.
#[test]
fn a_live_follower_refuses_a_forged_batch_and_says_so() {
    if !fuse_available() {
        return;
    }
    let (_g, rep, url) = copy_of_base();
    let g = newest_generation(&rep);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(g.join("manifest.json")).unwrap()).unwrap();
    let id = manifest["log_id"].as_u64().unwrap();
    let last = base().last_commit;
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    let log = dir.path().join("daemon.log");
    let out = mount(
        &mp,
        &dir.path().join("f.redb"),
        &[
            "--follow",
            &url,
            "--follow-interval",
            "100ms",
            "--log-file",
            log.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", err_of(&out));
    let listed = |mp: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(mp)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    follower_until(&mp, |s| s["follower_commit"].as_u64() == Some(last));
    let before = listed(&mp);

    let mut payload = vec![1u8, 7];
    payload.extend_from_slice(b"dirents");
    let key = [&1u64.to_le_bytes()[..], b"x/y"].concat();
    payload.extend_from_slice(&(key.len() as u32).to_le_bytes());
    payload.extend_from_slice(&key);
    payload.extend_from_slice(&9u32.to_le_bytes());
    payload.extend_from_slice(&4u64.to_le_bytes());
    payload.push(1);
    let mut seg = Vec::new();
    encode(&mut seg, id, last + 1, &payload);
    std::fs::write(planted(&g, last + 1, last + 1), &seg).unwrap();

    let s = follower_until(&mp, |s| {
        s["refused"].is_string() || s["follower_commit"].as_u64() != Some(last)
    });
    let shown = run(&["status", mp.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&shown.stdout).into_owned();
    let after = std::fs::read_dir(&mp).and_then(|d| {
        let mut v = d
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<Vec<_>, _>>()?;
        v.sort();
        Ok(v)
    });
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    let out = run(&["unmount", mp.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", err_of(&out));

    assert_eq!(
        s["follower_commit"].as_u64(),
        Some(last),
        "stays at its last good commit: {s}"
    );
    let refused = s["refused"].as_str().unwrap();
    assert!(refused.contains(&format!("commit {}", last + 1)), "{s}");
    assert!(refused.contains("name contains '/'"), "{s}");
    assert!(!text.contains("up to date"), "{text}");
    assert!(text.contains("refused"), "{text}");
    assert_eq!(after.ok(), Some(before), "the root lists as before");
    let lines: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("refused what the replica holds next"))
        .collect();
    assert_eq!(lines.len(), 1, "{logged}");
    assert!(
        lines[0].contains(&format!("commit {}", last + 1))
            && lines[0].contains("name contains '/'"),
        "{logged}"
    );
}
