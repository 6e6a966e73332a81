//! Power cuts. A SIGKILL keeps the page cache, so the kill tests never
//! lose an unsynced write; these do. The store file and its write-ahead log live on a
//! simulated disk (`redbfs::store::sim`) that keeps every write since the last sync in a
//! volatile layer: at a crash point it keeps a random subset of them, each possibly torn at
//! 512-byte boundaries, and of the names created, removed or renamed since the directory's
//! last fsync a random prefix. The store is then opened from what survived (recovery runs)
//! and judged: the tree is what the model (a `BTreeMap` of path -> content, driven through
//! `Fs` as tests/core.rs does) held after every acknowledged operation, plus at most the one
//! in flight (a create in flight may also survive empty); `check::invariants` and redb's
//! integrity check are clean.
//!
//! A crash point is "the Nth write, length change, sync or name change" of the simulated
//! disk: a workload of 20 to 50 operations runs once to count its calls, then again for each
//! chosen N. The kinds of crash point, by the low bits of the point's seed:
//!
//! - `workload` (half of them): a cut anywhere in the workload: mid-append of a log record
//!   (a torn write of the log), between append and fdatasync, inside a checkpoint (the store's
//!   writes before its sync; operations run now and then with the disk nearly full, which
//!   makes each commit a checkpoint, and at clean closes), while a log is created again after
//!   a close and reopen;
//! - `recovery`: a cut in the workload, then another while the next open replays the log,
//!   then recovery again;
//! - `after-recovery`: a cut in the workload, recovery, then a cut in the first commit after
//!   it (which creates the log again);
//! - `compact` and `restore`: a cut in `Store::compact` or in `tools::restore_on` of a store a
//!   power cut left (with its log): the store is afterwards the old one or the new one,
//!   complete.
//!
//! Run: `cargo test --test powercut` (1,024 crash points over 128 workloads, seeded; each
//! failure prints its seed). `REDBFS_SEED=N cargo test --test powercut -- --nocapture` replays
//! crash point N alone; a longer soak: `REDBFS_POWERCUTS=20000 cargo test --release --test
//! powercut` (points, rounded up to whole workloads of 8).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use redbfs::fs::{Caller, Fs, Limits, OpenMode};
use redbfs::store::disk::Disk;
use redbfs::store::sim::{Image, SimDisk};
use redbfs::store::{Kind, ROOT_INO, Store};

const ME: Caller = Caller {
    uid: 1000,
    gid: 1000,
    pid: 1,
};

/// Crash points per workload (the low bits of a point's seed choose its kind).
const PER_WORKLOAD: u64 = 8;
/// Free bytes the disk reports for a "nearly full" operation: each commit is a checkpoint.
const NEARLY_FULL: u64 = 32 * 1024 * 1024;

/// path -> content (None for a directory).
type Tree = BTreeMap<String, Option<Vec<u8>>>;

#[derive(Clone, Debug)]
enum Op {
    /// Create (or replace the content of) a file: open, write, optionally fsync, close.
    Write {
        path: String,
        data: Vec<u8>,
        fsync: bool,
    },
    Mkdir(String),
    Unlink(String),
    Rmdir(String),
    Rename(String, String),
    /// Close the store cleanly (a checkpoint, the log removed) and open it again.
    Reopen,
}

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn content(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(8) {
        0 => 0,
        1 => 70_000 + rng.below(10_000) as usize, // more than one chunk
        _ => rng.below(3000) as usize,
    };
    let b = rng.below(256) as u8;
    (0..len).map(|i| b.wrapping_add((i / 7) as u8)).collect()
}

/// A workload valid against the model: each operation succeeds on a healthy store. Returns
/// (operation, run with the disk nearly full) pairs and the model after each prefix.
fn workload(seed: u64) -> (Vec<(Op, bool)>, Vec<Tree>) {
    let mut rng = Rng::new(seed);
    let n = 20 + rng.below(31) as usize;
    let mut tree = Tree::new();
    let mut models = vec![tree.clone()];
    let mut ops = Vec::new();
    let names = ["a.md", "b.md", "c.md", ".tmp-1", "d.md"];
    let dir_names = ["m", "n", "o"];
    while ops.len() < n {
        let dirs: Vec<String> = std::iter::once(String::new())
            .chain(
                tree.iter()
                    .filter(|(_, v)| v.is_none())
                    .map(|(k, _)| k.clone()),
            )
            .collect();
        let files: Vec<String> = tree
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        let op = match rng.below(16) {
            0..=5 => {
                let path = {
                    let d: &String = rng.pick(&dirs);
                    let n: &&str = rng.pick(&names);
                    join(d, n)
                };
                if tree.get(&path).is_some_and(|v| v.is_none()) {
                    continue;
                }
                Op::Write {
                    path,
                    data: content(&mut rng),
                    fsync: rng.below(3) == 0,
                }
            }
            6 | 7 => {
                let path = rng.pick(&dir_names).to_string();
                if tree.contains_key(&path) {
                    continue;
                }
                Op::Mkdir(path)
            }
            8 | 9 if !files.is_empty() => Op::Unlink(rng.pick(&files).clone()),
            10 => {
                let empty: Vec<&String> = dirs
                    .iter()
                    .filter(|d| !d.is_empty() && !tree.keys().any(|k| parent_of(k) == *d))
                    .collect();
                if empty.is_empty() {
                    continue;
                }
                Op::Rmdir((*rng.pick(&empty)).clone())
            }
            11..=13 if !files.is_empty() => {
                let from = rng.pick(&files).clone();
                let to = {
                    let d: &String = rng.pick(&dirs);
                    let n: &&str = rng.pick(&names);
                    join(d, n)
                };
                if to == from || tree.get(&to).is_some_and(|v| v.is_none()) {
                    continue;
                }
                Op::Rename(from, to)
            }
            14 => {
                let top: Vec<&String> = dirs.iter().filter(|d| !d.is_empty()).collect();
                let to = rng.pick(&dir_names).to_string();
                if top.is_empty() || tree.contains_key(&to) {
                    continue;
                }
                Op::Rename((*rng.pick(&top)).clone(), to)
            }
            15 => Op::Reopen,
            _ => continue,
        };
        apply(&mut tree, &op);
        models.push(tree.clone());
        ops.push((op, rng.below(6) == 0));
    }
    (ops, models)
}

fn apply(tree: &mut Tree, op: &Op) {
    match op {
        Op::Write { path, data, .. } => {
            tree.insert(path.clone(), Some(data.clone()));
        }
        Op::Mkdir(p) => {
            tree.insert(p.clone(), None);
        }
        Op::Unlink(p) | Op::Rmdir(p) => {
            tree.remove(p);
        }
        Op::Rename(from, to) => {
            let moved: Vec<(String, Option<Vec<u8>>)> = tree
                .iter()
                .filter(|(k, _)| *k == from || k.starts_with(&format!("{from}/")))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (k, v) in moved {
                tree.remove(&k);
                tree.insert(format!("{to}{}", &k[from.len()..]), v);
            }
        }
        Op::Reopen => {}
    }
}

/// Where the tests keep their (simulated) files: a real, private directory, so the store's
/// checks of its directory pass; nothing is written there.
struct Place {
    _dir: tempfile::TempDir,
    store: PathBuf,
    snapshot: PathBuf,
}

fn open(disk: &Arc<SimDisk>, path: &Path) -> Result<Fs, String> {
    let store =
        Store::open_on(Disk::Sim(disk.clone()), path, (1000, 1000)).map_err(|e| e.to_string())?;
    Fs::new(store, Limits::default()).map_err(|e| format!("{e:?}"))
}

fn resolve(fs: &Fs, path: &str) -> Result<u64, String> {
    let mut ino = ROOT_INO;
    for part in path.split('/').filter(|p| !p.is_empty()) {
        let i = fs
            .lookup(ino, part.as_bytes())
            .map_err(|e| format!("{e:?}"))?;
        fs.forget(i.ino, 1);
        ino = i.ino;
    }
    Ok(ino)
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn run_op(fs: &Fs, op: &Op) -> Result<(), String> {
    let e = |e: redbfs::fs::Error| format!("{e:?}");
    match op {
        Op::Write { path, data, fsync } => {
            let (dir, name) = split(path);
            let parent = resolve(fs, dir)?;
            let fh = match fs.lookup(parent, name.as_bytes()) {
                Ok(i) => {
                    fs.forget(i.ino, 1);
                    let mode = OpenMode {
                        write: true,
                        truncate: true,
                        ..OpenMode::default()
                    };
                    fs.open(ME, i.ino, mode).map_err(e)?
                }
                Err(_) => {
                    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
                    let (i, fh) = fs
                        .create(ME, parent, name.as_bytes(), 0o600, 0, flags)
                        .map_err(e)?;
                    fs.forget(i.ino, 1);
                    fh
                }
            };
            let wrote = (|| {
                if !data.is_empty() {
                    fs.write(ME, fh, 0, data).map_err(e)?;
                }
                if *fsync {
                    fs.fsync(fh).map_err(e)?;
                }
                fs.flush(fh).map_err(e)
            })();
            let released = fs.release(fh).map_err(e);
            wrote.and(released)
        }
        Op::Mkdir(p) => {
            let (dir, name) = split(p);
            let i = fs
                .mkdir(ME, resolve(fs, dir)?, name.as_bytes(), 0o700, 0)
                .map_err(e)?;
            fs.forget(i.ino, 1);
            Ok(())
        }
        Op::Unlink(p) => {
            let (dir, name) = split(p);
            fs.unlink(ME, resolve(fs, dir)?, name.as_bytes()).map_err(e)
        }
        Op::Rmdir(p) => {
            let (dir, name) = split(p);
            fs.rmdir(ME, resolve(fs, dir)?, name.as_bytes()).map_err(e)
        }
        Op::Rename(from, to) => {
            let (fd, fname) = split(from);
            let (td, tname) = split(to);
            let (fp, tp) = (resolve(fs, fd)?, resolve(fs, td)?);
            fs.rename(ME, fp, fname.as_bytes(), tp, tname.as_bytes(), 0)
                .map_err(e)
        }
        Op::Reopen => unreachable!("run by the caller"),
    }
}

/// Runs `ops` on the store at `path`; returns how many were acknowledged (returned success)
/// before the power was cut, or an error when one failed on a healthy disk.
fn run(disk: &Arc<SimDisk>, path: &Path, ops: &[(Op, bool)]) -> Result<usize, String> {
    disk.set_phase("workload: opening");
    let mut fs = match open(disk, path) {
        Ok(fs) => Some(fs),
        Err(_) if disk.crashed() => return Ok(0),
        Err(e) => return Err(format!("opening: {e}")),
    };
    for (i, (op, squeeze)) in ops.iter().enumerate() {
        disk.set_free(if *squeeze { NEARLY_FULL } else { u64::MAX / 4 });
        let result = if let Op::Reopen = op {
            disk.set_phase("workload: clean close (a checkpoint)");
            drop(fs.take());
            disk.set_phase("workload: reopening");
            open(disk, path).map(|f| fs = Some(f))
        } else {
            disk.set_phase(if *squeeze {
                "workload: an operation whose commit is a checkpoint"
            } else {
                "workload"
            });
            run_op(fs.as_ref().unwrap(), op)
        };
        if disk.crashed() {
            // An operation that succeeded although the cut came during it was acknowledged.
            return Ok(i + result.is_ok() as usize);
        }
        if let Err(e) = result {
            return Err(format!(
                "operation {i} {op:?} failed on a healthy disk: {e}"
            ));
        }
    }
    disk.set_phase("workload: clean close (a checkpoint)");
    drop(fs);
    Ok(ops.len())
}

/// The tree of the store, read through `Fs`.
fn tree_of(fs: &Fs) -> Result<Tree, String> {
    let e = |e: redbfs::fs::Error| format!("{e:?}");
    let mut out = Tree::new();
    let mut todo = vec![(ROOT_INO, String::new())];
    while let Some((dir, prefix)) = todo.pop() {
        let fh = fs.opendir(dir).map_err(e)?;
        let entries = fs.readdir(fh, 0).map_err(e)?;
        fs.releasedir(fh).map_err(e)?;
        for entry in entries.iter().skip(2) {
            let path = join(&prefix, &entry.name);
            let i = fs.lookup(dir, entry.name.as_bytes()).map_err(e)?;
            fs.forget(i.ino, 1);
            if i.kind == Kind::Dir {
                out.insert(path.clone(), None);
                todo.push((i.ino, path));
            } else {
                let fh = fs.open(ME, i.ino, OpenMode::default()).map_err(e)?;
                let data = fs.read(fh, 0, u32::MAX).map_err(e)?;
                fs.release(fh).map_err(e)?;
                out.insert(path, Some(data));
            }
        }
    }
    Ok(out)
}

/// Opens the store the image holds (recovery runs), checks redb's integrity and the
/// filesystem invariants, and returns its tree.
fn recover(image: &Image, path: &Path, seed: u64) -> Result<(Arc<SimDisk>, Tree), String> {
    let disk = SimDisk::from_image(image, seed);
    let mut store = Store::open_on(Disk::Sim(disk.clone()), path, (1000, 1000))
        .map_err(|e| format!("recovery failed: {e}"))?;
    match store.check_integrity() {
        Ok(true) => {}
        Ok(false) => return Err("redb's integrity check had to repair the file".into()),
        Err(e) => return Err(format!("redb's integrity check failed: {e}")),
    }
    let fs = Fs::new(store, Limits::default()).map_err(|e| format!("{e:?}"))?;
    let findings = redbfs::check::invariants(&fs.store().read().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if !findings.is_empty() {
        return Err(format!("check found: {findings:?}"));
    }
    let tree = tree_of(&fs)?;
    drop(fs);
    Ok((disk, tree))
}

/// The trees a cut after `acked` acknowledged operations may leave: every acknowledged
/// operation, and the one in flight or not (a create in flight may also leave an empty file).
fn allowed(ops: &[(Op, bool)], models: &[Tree], acked: usize) -> Vec<Tree> {
    let mut ok = vec![models[acked].clone()];
    if acked < ops.len() {
        ok.push(models[acked + 1].clone());
        if let Op::Write { path, .. } = &ops[acked].0
            && !models[acked].contains_key(path)
        {
            let mut t = models[acked].clone();
            t.insert(path.clone(), Some(Vec::new()));
            ok.push(t);
        }
    }
    ok
}

fn describe(t: &Tree) -> String {
    t.iter()
        .map(|(k, v)| match v {
            None => format!("{k}/"),
            Some(d) => format!("{k}({} bytes)", d.len()),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn judge(got: &Tree, ok: &[Tree], acked: usize) -> Result<(), String> {
    if ok.contains(got) {
        return Ok(());
    }
    Err(format!(
        "after {acked} acknowledged operations the store holds [{}]; allowed: {}",
        describe(got),
        ok.iter()
            .map(|t| format!("[{}]", describe(t)))
            .collect::<Vec<_>>()
            .join(" or ")
    ))
}

/// A fresh store (cleanly closed) and a snapshot beside it holding one file.
fn base(place: &Place) -> (Image, Tree) {
    let disk = SimDisk::new(0);
    drop(open(&disk, &place.store).unwrap());
    let snap = open(&disk, &place.snapshot).unwrap();
    let op = Op::Write {
        path: "restored.md".into(),
        data: b"from the snapshot".to_vec(),
        fsync: false,
    };
    run_op(&snap, &op).unwrap();
    drop(snap);
    let mut t = Tree::new();
    apply(&mut t, &op);
    (disk.settled(), t)
}

/// What one workload's dry run found: its calls, and the state a cut at its end leaves.
struct Workload {
    ops: Vec<(Op, bool)>,
    models: Vec<Tree>,
    calls: u64,
    /// The calls on the log file: a third of the cuts in a workload come at one of them.
    log_calls: Vec<u64>,
}

fn prepare(base: &Image, place: &Place, w: u64) -> Result<Workload, String> {
    let (ops, models) = workload(w);
    let disk = SimDisk::from_image(base, w);
    let acked = run(&disk, &place.store, &ops)?;
    assert_eq!(acked, ops.len());
    Ok(Workload {
        ops,
        models,
        calls: disk.calls(),
        log_calls: disk.calls_on(".wal"),
    })
}

/// Cuts the power during call `n` of the workload (a cut after its end when `n` is past
/// it); returns what survived and how many operations were acknowledged.
fn cut_workload(
    base: &Image,
    place: &Place,
    wl: &Workload,
    n: u64,
    seed: u64,
) -> Result<(Image, usize, String), String> {
    let disk = SimDisk::from_image(base, seed);
    disk.crash_at(n);
    let acked = run(&disk, &place.store, &wl.ops)?;
    let site = disk
        .crash_site()
        .unwrap_or_else(|| "after the workload".into());
    Ok((disk.image(), acked, site))
}

/// Counts the calls `f` makes on a disk holding `image`.
fn count(image: &Image, f: impl FnOnce(&Arc<SimDisk>)) -> u64 {
    let disk = SimDisk::from_image(image, 0);
    f(&disk);
    disk.calls()
}

/// One crash point: returns its kind and where the (last) cut came.
fn point(base: &(Image, Tree), place: &Place, wl: &Workload, seed: u64) -> Result<String, String> {
    let mut rng = Rng::new(seed);
    let n = if rng.below(3) == 0 && !wl.log_calls.is_empty() {
        // Mid-append of a log record, or between the append and its fdatasync.
        *rng.pick(&wl.log_calls)
    } else {
        1 + rng.below(wl.calls + 1)
    };
    let (image, acked, site) = cut_workload(&base.0, place, wl, n, seed)?;
    let ok = allowed(&wl.ops, &wl.models, acked);
    let store = place.store.as_path();
    match seed % PER_WORKLOAD {
        0..=3 => {
            let (_, got) = recover(&image, store, seed)?;
            judge(&got, &ok, acked)?;
            Ok(format!("workload | {site}"))
        }
        4 => {
            // A second cut while recovery replays the log.
            let calls = count(&image, |d| drop(open(d, store)));
            let disk = SimDisk::from_image(&image, seed ^ 1);
            disk.set_phase("recovery");
            disk.crash_at(1 + rng.below(calls.max(1)));
            drop(open(&disk, store));
            let site = disk.crash_site().unwrap_or_else(|| "after recovery".into());
            let (_, got) = recover(&disk.image(), store, seed ^ 2)?;
            judge(&got, &ok, acked)?;
            Ok(format!("recovery | {site}"))
        }
        5 => {
            // Recovery, then a cut in the first commit after it (the log is created again).
            let op = Op::Write {
                path: "after.md".into(),
                data: b"after recovery".to_vec(),
                fsync: false,
            };
            // Calls made until the operation returned (not counting the close after it).
            let first = |d: &Arc<SimDisk>| -> u64 {
                if let Ok(fs) = open(d, store) {
                    d.set_phase("the first commit after recovery");
                    let _ = run_op(&fs, &op);
                    let calls = d.calls();
                    drop(fs);
                    return calls;
                }
                d.calls()
            };
            let before = count(&image, |d| drop(open(d, store)));
            let calls = first(&SimDisk::from_image(&image, 0));
            let disk = SimDisk::from_image(&image, seed ^ 1);
            disk.crash_at(before + 1 + rng.below((calls - before).max(1)));
            first(&disk);
            let site = disk.crash_site().unwrap_or_default();
            let (_, got) = recover(&disk.image(), store, seed ^ 2)?;
            // The recovered state, with or without the new file (empty if only its create).
            let mut recovered = ok.clone();
            for t in &ok {
                for data in [Vec::new(), b"after recovery".to_vec()] {
                    let mut t = t.clone();
                    t.insert("after.md".into(), Some(data));
                    recovered.push(t);
                }
            }
            judge(&got, &recovered, acked)?;
            Ok(format!("after-recovery | {site}"))
        }
        6 => {
            // compact on the store the cut left.
            let tool = |d: &Arc<SimDisk>| {
                d.set_phase("compact");
                if let Ok(mut s) = Store::open_existing_on(Disk::Sim(d.clone()), store) {
                    let _ = s.compact();
                }
            };
            let calls = count(&image, tool);
            let disk = SimDisk::from_image(&image, seed ^ 1);
            disk.crash_at(1 + rng.below(calls + 1));
            tool(&disk);
            let site = disk.crash_site().unwrap_or_else(|| "after compact".into());
            let (_, got) = recover(&disk.image(), store, seed ^ 2)?;
            judge(&got, &ok, acked)?;
            Ok(format!("compact | {site}"))
        }
        _ => {
            // restore of the snapshot over the store the cut left: old or new, complete.
            let tool = |d: &Arc<SimDisk>| {
                d.set_phase("restore");
                let _ =
                    redbfs::tools::restore_on(&Disk::Sim(d.clone()), &place.snapshot, store, false);
            };
            let calls = count(&image, tool);
            let disk = SimDisk::from_image(&image, seed ^ 1);
            disk.crash_at(1 + rng.below(calls + 1));
            tool(&disk);
            let site = disk.crash_site().unwrap_or_else(|| "after restore".into());
            let (_, got) = recover(&disk.image(), store, seed ^ 2)?;
            let mut either = ok.clone();
            either.push(base.1.clone());
            judge(&got, &either, acked)?;
            Ok(format!("restore | {site}"))
        }
    }
}

/// A crash site without its offsets and sizes ("workload | workload: write s.redb.wal").
fn site_class(site: &str) -> String {
    let words: Vec<&str> = site.split_whitespace().collect();
    let Some(at) = words.iter().position(|w| {
        [
            "write", "set_len", "sync", "create", "remove", "rename", "link",
        ]
        .contains(w)
    }) else {
        return site.to_string();
    };
    let file = words.get(at + 1).map_or("", |f| f.trim_end_matches(':'));
    format!("{} {} {file}", words[..at].join(" "), words[at])
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn power_cuts_lose_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let place = Place {
        store: dir.path().join("s.redb"),
        snapshot: dir.path().join("snap.redb"),
        _dir: dir,
    };
    let base = base(&place);
    let (seeds, master): (Vec<u64>, Option<u64>) = match env_u64("REDBFS_SEED") {
        Some(seed) => (vec![seed], None),
        None => {
            let master = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            let points = env_u64("REDBFS_POWERCUTS").unwrap_or(1024);
            let workloads = points.div_ceil(PER_WORKLOAD);
            let mut rng = Rng::new(master);
            let seeds = (0..workloads)
                .flat_map(|_| {
                    let w = rng.next() & !(PER_WORKLOAD - 1);
                    (0..PER_WORKLOAD).map(move |j| w | j)
                })
                .collect();
            (seeds, Some(master))
        }
    };
    if let Some(m) = master {
        eprintln!("power cuts: {} crash points, master seed {m}", seeds.len());
    }
    let started = std::time::Instant::now();
    let next = AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let kinds = std::sync::Mutex::new(BTreeMap::<String, u64>::new());
    let groups: Vec<&[u64]> = seeds.chunks(PER_WORKLOAD as usize).collect();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let g = next.fetch_add(1, Ordering::Relaxed);
                    let Some(group) = groups.get(g) else { break };
                    let w = group[0] & !(PER_WORKLOAD - 1);
                    let wl = match prepare(&base.0, &place, w) {
                        Ok(wl) => wl,
                        Err(e) => {
                            failures.lock().unwrap().push(format!("seed {w}: {e}"));
                            continue;
                        }
                    };
                    for &seed in *group {
                        match point(&base, &place, &wl, seed) {
                            Ok(site) => {
                                let key = site_class(&site);
                                *kinds.lock().unwrap().entry(key).or_default() += 1;
                                if master.is_none() {
                                    eprintln!("seed {seed}: {site}: ok");
                                }
                            }
                            Err(e) => failures.lock().unwrap().push(format!(
                                "seed {seed} (replay: REDBFS_SEED={seed} cargo test --test powercut -- --nocapture): {e}"
                            )),
                        }
                    }
                }
            });
        }
    });
    eprintln!(
        "power cuts: {} points in {:.1} s",
        seeds.len(),
        started.elapsed().as_secs_f64()
    );
    for (k, n) in kinds.lock().unwrap().iter() {
        eprintln!("  {n:5}  {k}");
    }
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} crash points failed:\n{}",
        failures.len(),
        seeds.len(),
        failures.join("\n")
    );
}

/// Writers racing in the concurrent tests below, each in a directory of its own.
const WRITERS: usize = 8;

fn writer_dir(k: usize) -> String {
    format!("w{k}")
}

/// Creates `path`, writes `data`, fsyncs and closes it, as the SDK does.
fn write_durably(fs: &Fs, path: &str, data: &[u8]) -> Result<(), String> {
    run_op(
        fs,
        &Op::Write {
            path: path.into(),
            data: data.to_vec(),
            fsync: true,
        },
    )
}

fn content_of(path: &str) -> Vec<u8> {
    format!("{path}: {}\n", "durable ".repeat(40)).into_bytes()
}

/// Group commit across writers (`store::wal`): eight writers fsync at once while the log's
/// first sync is held on the simulated disk, so every one of them has appended its record and
/// waits. Their eight durable commits must then reach the disk in at most two fdatasyncs (the
/// one held, and one more for everything that queued behind it), counted by the store, not
/// timed; and a power cut right after they return keeps every one of their files whole.
#[test]
fn concurrent_fsyncs_share_syncs_and_survive_a_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let disk = SimDisk::new(11);
    let fs = open(&disk, &path).unwrap();
    // The first commit starts the log (and syncs it): before the hold.
    for k in 0..WRITERS {
        run_op(&fs, &Op::Mkdir(writer_dir(k))).unwrap();
    }
    // A file written and fsynced, still open: its close has nothing left to sync.
    let (early, fh) = fs
        .create(
            ME,
            resolve(&fs, "w0").unwrap(),
            b"early.md",
            0o600,
            0,
            libc::O_WRONLY,
        )
        .unwrap();
    fs.forget(early.ino, 1);
    fs.write(ME, fh, 0, b"early").unwrap();
    fs.fsync(fh).unwrap();
    let before = fs.store().commit_stats();
    disk.hold_log_syncs(true);
    let queued = std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|k| {
                let fs = &fs;
                s.spawn(move || {
                    let p = format!("{}/note.md", writer_dir(k));
                    write_durably(fs, &p, &content_of(&p))
                })
            })
            .collect();
        // Every writer's durable commit is counted once its record is in the log and its
        // writer waits for a sync: then the hold ends. A bound, so a writer that never
        // queues fails the test instead of hanging it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let mut queued = 0;
        while std::time::Instant::now() < deadline {
            queued = fs.store().commit_stats().durable_commits - before.durable_commits;
            if queued >= WRITERS as u64 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // The close of the early file returns while the sync is still held: it waits for
        // no sync it does not need (bounded, so a close that waits fails instead of hanging).
        let (tx, rx) = std::sync::mpsc::channel();
        let fs_ref = &fs;
        s.spawn(move || tx.send(fs_ref.flush(fh).and_then(|()| fs_ref.release(fh))));
        let closed = rx.recv_timeout(std::time::Duration::from_secs(60));
        disk.hold_log_syncs(false);
        assert!(
            matches!(closed, Ok(Ok(()))),
            "the close of a durable file waited behind another writer's sync: {closed:?}"
        );
        for w in writers {
            w.join().unwrap().unwrap();
        }
        queued
    });
    assert_eq!(queued, WRITERS as u64, "every writer queued for the log");
    let after = fs.store().commit_stats();
    let commits = after.durable_commits - before.durable_commits;
    let syncs = after.log_syncs - before.log_syncs;
    assert_eq!(commits, WRITERS as u64);
    assert!(
        syncs <= 2 && syncs < commits,
        "{commits} concurrent durable commits took {syncs} fdatasyncs of the log"
    );
    // The power goes now: every acknowledged file is there, whole.
    let image = disk.image();
    drop(fs);
    let (_, tree) = recover(&image, &path, 12).unwrap();
    for k in 0..WRITERS {
        let p = format!("{}/note.md", writer_dir(k));
        assert_eq!(tree.get(&p), Some(&Some(content_of(&p))), "{p}");
    }
    assert_eq!(tree.get("w0/early.md"), Some(&Some(b"early".to_vec())));
}

/// Power cuts at random points while four writers create and fsync files at once: whatever
/// the interleaving, every file whose fsync and close returned is there, whole, after
/// recovery; any other file is missing, empty (its create was durable, its content not) or
/// whole, never partial.
#[test]
fn concurrent_writers_lose_nothing_acknowledged() {
    const THREADS: usize = 4;
    const FILES: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    // Calls a whole run takes, for choosing the crash points.
    let total = {
        let disk = SimDisk::new(0);
        let fs = open(&disk, &path).unwrap();
        for k in 0..THREADS {
            run_op(&fs, &Op::Mkdir(writer_dir(k))).unwrap();
        }
        let start = disk.calls();
        std::thread::scope(|s| {
            for k in 0..THREADS {
                let fs = &fs;
                s.spawn(move || {
                    for i in 0..FILES {
                        let p = format!("{}/f{i}.md", writer_dir(k));
                        write_durably(fs, &p, &content_of(&p)).unwrap();
                    }
                });
            }
        });
        disk.calls() - start
    };
    let master = env_u64("REDBFS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let mut rng = Rng::new(master);
    for round in 0..12 {
        let cut = 1 + rng.next() % total;
        let disk = SimDisk::new(rng.next());
        let fs = open(&disk, &path).unwrap();
        for k in 0..THREADS {
            run_op(&fs, &Op::Mkdir(writer_dir(k))).unwrap();
        }
        disk.crash_at(cut);
        let acked: Vec<String> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..THREADS)
                .map(|k| {
                    let fs = &fs;
                    s.spawn(move || {
                        let mut acked = Vec::new();
                        for i in 0..FILES {
                            let p = format!("{}/f{i}.md", writer_dir(k));
                            if write_durably(fs, &p, &content_of(&p)).is_err() {
                                break;
                            }
                            acked.push(p);
                        }
                        acked
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let image = disk.image();
        drop(fs);
        let why = format!("master seed {master}, round {round}, cut at call {cut} of {total}");
        let (_, tree) = recover(&image, &path, rng.next()).unwrap_or_else(|e| panic!("{why}: {e}"));
        for p in &acked {
            assert_eq!(
                tree.get(p),
                Some(&Some(content_of(p))),
                "{why}: acknowledged {p}"
            );
        }
        for (p, v) in &tree {
            if let Some(data) = v {
                assert!(
                    data.is_empty() || *data == content_of(p),
                    "{why}: {p} holds {} bytes, neither empty nor whole",
                    data.len()
                );
            }
        }
    }
}
