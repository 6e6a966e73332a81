//! Reference model: seeded random operation sequences run against `Fs` (no mount) and against
//! a `BTreeMap` model of the tree, compared after every step: each outcome (success or errno)
//! and the whole tree (kinds, sizes, contents). Every few steps the store is closed and opened
//! again, so the model also checks what was committed. A failure prints its seed;
//! `REDBFS_SEED=<seed>` replays one sequence.

mod common;

use std::collections::BTreeMap;

use common::Rng;

use redbfs::fs::{Caller, Fs, Limits, OpenMode, SetAttr};
use redbfs::store::{Kind, ROOT_INO, Store};

const ME: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 1,
};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
}

type Model = BTreeMap<String, Node>;

fn children<'a>(m: &'a Model, dir: &str) -> impl Iterator<Item = &'a String> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{dir}/")
    };
    m.keys().filter(move |k| {
        k.starts_with(&prefix) && !k[prefix.len()..].contains('/') && !k.is_empty()
    })
}

fn resolve(fs: &Fs, path: &str) -> Option<u64> {
    let mut ino = ROOT_INO;
    if path.is_empty() {
        return Some(ino);
    }
    for part in path.split('/') {
        ino = fs.lookup(ino, part.as_bytes()).ok()?.ino;
    }
    Some(ino)
}

fn snapshot(fs: &Fs, dir: u64, prefix: &str, out: &mut Model) {
    let fh = fs.opendir(dir).unwrap();
    let entries = fs.readdir(fh, 0).unwrap();
    fs.releasedir(fh).unwrap();
    for e in entries.iter().skip(2) {
        let path = if prefix.is_empty() {
            e.name.clone()
        } else {
            format!("{prefix}/{}", e.name)
        };
        match e.kind {
            Kind::Dir => {
                out.insert(path.clone(), Node::Dir);
                snapshot(fs, e.ino, &path, out);
            }
            Kind::File => {
                let fh = fs.open(ME, e.ino, OpenMode::default()).unwrap();
                let size = fs.getattr(e.ino).unwrap().size;
                let data = fs.read(fh, 0, u32::MAX).unwrap();
                fs.release(fh).unwrap();
                assert_eq!(size, data.len() as u64, "st_size of {path}");
                out.insert(path, Node::File(data));
            }
        }
    }
}

fn check_nlinks(fs: &Fs, m: &Model) {
    for dir in std::iter::once("").chain(
        m.iter()
            .filter(|(_, n)| **n == Node::Dir)
            .map(|(k, _)| k.as_str()),
    ) {
        let subdirs = children(m, dir).filter(|c| m[*c] == Node::Dir).count() as u32;
        let ino = resolve(fs, dir).unwrap();
        assert_eq!(
            fs.getattr(ino).unwrap().nlink,
            2 + subdirs,
            "nlink of /{dir}"
        );
    }
}

const NAMES: [&str; 6] = ["a", "b", "c", "notes.md", "caf\u{e9}", "dir x"];

fn pick_existing(rng: &mut Rng, m: &Model) -> Option<String> {
    if m.is_empty() {
        return None;
    }
    let i = rng.pick(m.len());
    m.keys().nth(i).cloned()
}

fn pick_dir(rng: &mut Rng, m: &Model) -> String {
    let dirs: Vec<&String> = m
        .iter()
        .filter(|(_, n)| **n == Node::Dir)
        .map(|(k, _)| k)
        .collect();
    if dirs.is_empty() || rng.pick(4) == 0 {
        String::new()
    } else {
        dirs[rng.pick(dirs.len())].clone()
    }
}

fn pick_new_path(rng: &mut Rng, m: &Model) -> String {
    let dir = pick_dir(rng, m);
    let name = NAMES[rng.pick(NAMES.len())];
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn errno<T>(r: Result<T, redbfs::fs::Error>) -> Result<(), i32> {
    r.map(|_| ()).map_err(|e| e.errno())
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

fn model_rename(m: &mut Model, src: &str, dst: &str) -> Result<(), i32> {
    let s = m.get(src).cloned().ok_or(libc::ENOENT)?;
    if src == dst {
        return Ok(());
    }
    if s == Node::Dir && (dst.starts_with(&format!("{src}/"))) {
        return Err(libc::EINVAL);
    }
    if let Some(d) = m.get(dst) {
        match (&s, d) {
            (Node::Dir, Node::File(_)) => return Err(libc::ENOTDIR),
            (Node::File(_), Node::Dir) => return Err(libc::EISDIR),
            (Node::Dir, Node::Dir) if children(m, dst).next().is_some() => {
                return Err(libc::ENOTEMPTY);
            }
            _ => {}
        }
    }
    m.remove(dst);
    let moved: Vec<String> = m
        .keys()
        .filter(|k| *k == src || k.starts_with(&format!("{src}/")))
        .cloned()
        .collect();
    for k in moved {
        let v = m.remove(&k).unwrap();
        m.insert(format!("{dst}{}", &k[src.len()..]), v);
    }
    Ok(())
}

fn run_sequence(seed: u64, steps: usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    let store = Store::open_or_create(&path, (0, 0)).unwrap();
    if seed % 2 == 1 {
        // Odd seeds keep history, so blob sharing and reference counts are checked too.
        store.set_keep_history(30 * 86_400 * 1_000_000_000).unwrap();
    }
    let mut fs = Fs::new(store, Limits::default()).unwrap();
    let mut m = Model::new();
    let mut rng = Rng(seed);
    for step in 0..steps {
        let op = rng.pick(10);
        let desc;
        let (got, want): (Result<(), i32>, Result<(), i32>) = match op {
            0 | 1 => {
                let p = pick_new_path(&mut rng, &m);
                desc = format!("mkdir {p}");
                let (dirp, name) = split(&p);
                let parent = resolve(&fs, dirp).unwrap();
                let want = if m.contains_key(&p) {
                    Err(libc::EEXIST)
                } else {
                    Ok(())
                };
                let got = errno(fs.mkdir(ME, parent, name.as_bytes(), 0o755, 0));
                if want.is_ok() {
                    m.insert(p, Node::Dir);
                }
                (got, want)
            }
            2 | 3 => {
                let p = pick_new_path(&mut rng, &m);
                let len = rng.pick(3) * 40_000 + rng.pick(300);
                let data: Vec<u8> = (0..len).map(|i| (i as u64 ^ seed) as u8).collect();
                desc = format!("create {p} ({len} bytes)");
                let (dirp, name) = split(&p);
                let parent = resolve(&fs, dirp).unwrap();
                let want = if m.contains_key(&p) {
                    Err(libc::EEXIST)
                } else {
                    Ok(())
                };
                let got = errno(
                    fs.create(ME, parent, name.as_bytes(), 0o644, 0, libc::O_WRONLY)
                        .map(|(_, fh)| {
                            fs.write(ME, fh, 0, &data).unwrap();
                            fs.release(fh).unwrap();
                        }),
                );
                if want.is_ok() {
                    m.insert(p, Node::File(data));
                }
                (got, want)
            }
            4 => {
                // Overwrite a range of an existing file, possibly past its end.
                let Some(p) = pick_existing(&mut rng, &m) else {
                    continue;
                };
                let off = rng.pick(100_000) as u64;
                let data = vec![(step % 251) as u8 + 1; rng.pick(70_000) + 1];
                desc = format!("write {p} at {off} ({} bytes)", data.len());
                let ino = resolve(&fs, &p).unwrap();
                let got = errno(
                    fs.open(
                        ME,
                        ino,
                        OpenMode {
                            write: true,
                            ..OpenMode::default()
                        },
                    )
                    .map(|fh| {
                        fs.write(ME, fh, off, &data).unwrap();
                        fs.release(fh).unwrap();
                    }),
                );
                let want = match m.get_mut(&p) {
                    Some(Node::Dir) => Err(libc::EISDIR),
                    Some(Node::File(c)) => {
                        let end = off as usize + data.len();
                        if c.len() < end {
                            c.resize(end, 0);
                        }
                        c[off as usize..end].copy_from_slice(&data);
                        Ok(())
                    }
                    None => unreachable!(),
                };
                (got, want)
            }
            5 => {
                let Some(p) = pick_existing(&mut rng, &m) else {
                    continue;
                };
                let size = rng.pick(150_000) as u64;
                desc = format!("truncate {p} to {size}");
                let ino = resolve(&fs, &p).unwrap();
                let got = errno(fs.setattr(
                    ME,
                    ino,
                    SetAttr {
                        size: Some(size),
                        ..SetAttr::default()
                    },
                ));
                let want = match m.get_mut(&p) {
                    Some(Node::Dir) => Err(libc::EISDIR),
                    Some(Node::File(c)) => {
                        c.resize(size as usize, 0);
                        Ok(())
                    }
                    None => unreachable!(),
                };
                (got, want)
            }
            6 => {
                let Some(p) = pick_existing(&mut rng, &m) else {
                    continue;
                };
                desc = format!("unlink {p}");
                let (dirp, name) = split(&p);
                let parent = resolve(&fs, dirp).unwrap();
                let got = errno(fs.unlink(ME, parent, name.as_bytes()));
                let want = match m[&p] {
                    Node::Dir => Err(libc::EISDIR),
                    Node::File(_) => {
                        m.remove(&p);
                        Ok(())
                    }
                };
                (got, want)
            }
            7 => {
                let Some(p) = pick_existing(&mut rng, &m) else {
                    continue;
                };
                desc = format!("rmdir {p}");
                let (dirp, name) = split(&p);
                let parent = resolve(&fs, dirp).unwrap();
                let got = errno(fs.rmdir(ME, parent, name.as_bytes()));
                let want = match m[&p] {
                    Node::File(_) => Err(libc::ENOTDIR),
                    Node::Dir if children(&m, &p).next().is_some() => Err(libc::ENOTEMPTY),
                    Node::Dir => {
                        m.remove(&p);
                        Ok(())
                    }
                };
                (got, want)
            }
            _ => {
                let Some(src) = pick_existing(&mut rng, &m) else {
                    continue;
                };
                let dst = if rng.pick(2) == 0 {
                    pick_existing(&mut rng, &m).unwrap()
                } else {
                    pick_new_path(&mut rng, &m)
                };
                desc = format!("rename {src} -> {dst}");
                let (sd, sn) = split(&src);
                let (dd, dn) = split(&dst);
                let sp = resolve(&fs, sd).unwrap();
                let dp = resolve(&fs, dd);
                let got = match dp {
                    Some(dp) => errno(fs.rename(ME, sp, sn.as_bytes(), dp, dn.as_bytes(), 0)),
                    None => continue,
                };
                let want = model_rename(&mut m, &src, &dst);
                (got, want)
            }
        };
        assert_eq!(got, want, "seed {seed} step {step}: {desc}");
        if step % 25 == 24 {
            drop(fs);
            fs = Fs::new(
                Store::open_or_create(&path, (0, 0)).unwrap(),
                Limits::default(),
            )
            .unwrap();
        }
        let mut actual = Model::new();
        snapshot(&fs, ROOT_INO, "", &mut actual);
        assert_eq!(
            actual, m,
            "seed {seed} step {step}: tree differs after {desc}"
        );
        check_nlinks(&fs, &m);
    }
    let r = fs.store().read().unwrap();
    assert_eq!(
        redbfs::check::invariants(&r).unwrap(),
        Vec::<String>::new(),
        "seed {seed}: check"
    );
}

#[test]
fn random_sequences_match_the_model() {
    if let Ok(seed) = std::env::var("REDBFS_SEED") {
        run_sequence(seed.parse().expect("REDBFS_SEED is a number"), 200);
        return;
    }
    let seqs: u64 = std::env::var("REDBFS_MODEL_SEQS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    for seed in 1..=seqs {
        run_sequence(seed, 150);
    }
}
