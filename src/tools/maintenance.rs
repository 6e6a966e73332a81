//! Maintenance: expiry's choice (`unused_since`; the removal is `Fs::remove_files`, mounted
//! or not) and `check --repair`. `compact` is `Store::compact`, run by the CLI on an unmounted store.

use std::collections::{HashMap, HashSet};

use super::common::{Result, Walk, err};
use crate::store::{Inode, Kind, ROOT_INO, ReadTxn, Store, Sync};

/// Files neither read nor written since `cutoff_ns` (atime is kept within an hour, see
/// SEMANTICS.md), as (path, last use).
pub fn unused_since(r: &ReadTxn, path: &str, cutoff_ns: i64) -> Result<Vec<(String, i64)>> {
    let mut out = Vec::new();
    for e in Walk::tree(r, path)? {
        let (_, e) = e?;
        if e.kind == "file" && e.atime_ns.max(e.mtime_ns) < cutoff_ns {
            out.push((e.path, e.atime_ns.max(e.mtime_ns)));
        }
    }
    Ok(out)
}

/// `check --repair`: reclaims orphans and unreachable inodes, drops entries that point to
/// nothing, and recomputes directory link counts. Never removes a reachable file.
pub fn repair(store: &Store) -> Result<Vec<String>> {
    let r = store.read().map_err(err)?;
    let inodes: HashMap<u64, Inode> = r
        .all_inodes()
        .map_err(err)?
        .into_iter()
        .map(|i| (i.ino, i))
        .collect();
    let dirents = r.all_dirents().map_err(err)?;
    let orphans: HashSet<u64> = r.orphans().map_err(err)?.into_iter().collect();
    drop(r);
    let mut w = store.write().map_err(err)?;
    // Parents may be missing here: the per-directory counts are rebuilt whole afterwards.
    w.without_aggregates();
    let mut fixes = Vec::new();
    // Reachability from the root through entries that point to live inodes.
    let mut children: HashMap<u64, Vec<(String, u64)>> = HashMap::new();
    for (parent, e) in &dirents {
        if inodes.contains_key(&e.ino) {
            children
                .entry(*parent)
                .or_default()
                .push((e.name.clone(), e.ino));
        } else {
            w.remove_dirent(*parent, &e.name).map_err(err)?;
            fixes.push(format!(
                "removed entry {:?} in {parent}, which pointed to missing inode {}",
                e.name, e.ino
            ));
        }
    }
    let mut reachable = HashSet::from([ROOT_INO]);
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        for (_, c) in children.get(&d).into_iter().flatten() {
            if reachable.insert(*c) && inodes.get(c).is_some_and(|i| i.kind == Kind::Dir) {
                stack.push(*c);
            }
        }
    }
    for ino in inodes.keys() {
        if !reachable.contains(ino) {
            w.delete_inode(*ino).map_err(err)?;
            fixes.push(if orphans.contains(ino) {
                format!("reclaimed orphan {ino}")
            } else {
                format!("reclaimed unreachable inode {ino}")
            });
        }
    }
    for (ino, i) in &inodes {
        if i.kind == Kind::Dir && reachable.contains(ino) {
            let subdirs = children
                .get(ino)
                .into_iter()
                .flatten()
                .filter(|(_, c)| inodes.get(c).is_some_and(|x| x.kind == Kind::Dir))
                .count() as u32;
            if i.nlink != 2 + subdirs {
                let mut fixed = i.clone();
                fixed.nlink = 2 + subdirs;
                w.put_inode(&fixed).map_err(err)?;
                fixes.push(format!(
                    "directory {ino}: nlink {} -> {}",
                    i.nlink,
                    2 + subdirs
                ));
            }
        }
    }
    w.commit(Sync::Durable).map_err(err)?;
    store.rebuild_aggregates().map_err(err)?;
    Ok(fixes)
}
