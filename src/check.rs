//! `redbfs check`: redb's integrity check plus the filesystem invariants, on a store file.

use std::collections::{HashMap, HashSet};

use crate::fs::{Limits, Name, NameRules};
use crate::store::{CHUNK_SIZE, INLINE_MAX, Kind, ROOT_INO, ReadTxn, StoreError, SubtreeRecord};

/// Every broken invariant found, one line each; empty when the store is clean.
pub fn invariants(r: &ReadTxn) -> Result<Vec<String>, StoreError> {
    let mut findings = Vec::new();
    let inodes: HashMap<u64, _> = r.all_inodes()?.into_iter().map(|i| (i.ino, i)).collect();
    let dirents = r.all_dirents()?;
    let orphans: HashSet<u64> = r.orphans()?.into_iter().collect();
    let next_ino = r.meta_u64("next_ino")?.unwrap_or(0);

    if !inodes.get(&ROOT_INO).is_some_and(|i| i.kind == Kind::Dir) {
        findings.push("the root directory (inode 1) is missing or not a directory".to_string());
    }
    let mut seen: HashMap<u64, u32> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    for (parent, e) in &dirents {
        match inodes.get(parent) {
            Some(p) if p.kind == Kind::Dir => {}
            _ => findings.push(format!(
                "entry {:?} lives in {parent}, which is not a directory",
                e.name
            )),
        }
        match inodes.get(&e.ino) {
            None => findings.push(format!(
                "entry {:?} in {parent} points to missing inode {}",
                e.name, e.ino
            )),
            Some(i) => {
                if i.kind != e.kind {
                    findings.push(format!(
                        "entry {:?} in {parent} has the wrong kind for inode {}",
                        e.name, e.ino
                    ));
                }
                if i.parent != *parent || i.name != e.name {
                    findings.push(format!(
                        "inode {} records parent {} name {:?}, but its entry is {:?} in {parent}",
                        e.ino, i.parent, i.name, e.name
                    ));
                }
            }
        }
        if e.kind == Kind::Dir {
            *subdirs.entry(*parent).or_default() += 1;
        }
        *seen.entry(e.ino).or_default() += 1;
        match Name::parse(e.name.as_bytes(), NameRules::Linux) {
            Ok(n) if n.as_str() == e.name => {}
            Ok(_) => findings.push(format!("entry {:?} in {parent} is not in NFC", e.name)),
            Err(err) => findings.push(format!("entry {:?} in {parent}: {err}", e.name)),
        }
    }
    for (ino, i) in &inodes {
        if *ino >= next_ino {
            findings.push(format!(
                "inode {ino} is at or above the inode counter {next_ino}"
            ));
        }
        let links = seen.get(ino).copied().unwrap_or(0);
        if *ino != ROOT_INO {
            match (links, orphans.contains(ino)) {
                (0, false) => {
                    findings.push(format!("inode {ino} is unreachable and not an orphan"))
                }
                (1, true) => findings.push(format!("inode {ino} is reachable but marked orphan")),
                (n, _) if n > 1 => findings.push(format!("inode {ino} has {n} entries")),
                _ => {}
            }
        }
        if i.kind == Kind::Dir && !orphans.contains(ino) {
            let want = 2 + subdirs.get(ino).copied().unwrap_or(0);
            if i.nlink != want {
                findings.push(format!(
                    "directory {ino} has nlink {} but {want} expected",
                    i.nlink
                ));
            }
        }
    }
    for o in &orphans {
        if !inodes.contains_key(o) {
            findings.push(format!("orphan {o} has no inode"));
        }
    }
    cycles(&inodes, &orphans, &mut findings);
    chunks(r, &inodes, &mut findings)?;
    // What reads history's undo entries needs whole parts: with a part missing or damaged,
    // those checks are left for after it is dealt with.
    let parts = r.undo_part_findings()?;
    let parts_whole = parts.is_empty();
    findings.extend(parts);
    if parts_whole {
        blob_references(r, &mut findings)?;
    }
    damaged_chunks(r, parts_whole, &mut findings)?;
    findings.extend(over_limits(r, &inodes, &dirents)?);
    if parts_whole {
        findings.extend(r.history_index_findings()?);
    }
    subtrees(r, &inodes, &mut findings)?;
    let usage = r.usage()?;
    let files = inodes.values().filter(|i| i.kind == Kind::File).count() as u64;
    let dirs = inodes.values().filter(|i| i.kind == Kind::Dir).count() as u64;
    let bytes: u64 = inodes.values().map(|i| i.size).sum();
    if usage.files != files || usage.dirs != dirs || usage.content_bytes != bytes {
        findings.push(format!(
            "usage counters say {} files, {} dirs, {} bytes; the records say {files}, {dirs}, {bytes}",
            usage.files, usage.dirs, usage.content_bytes
        ));
    }
    Ok(findings)
}

/// The per-directory aggregates (when the store keeps them): every directory's counts equal
/// what lies below it, its path bounds are at least the deepest and longest path below it,
/// and a row without a directory holds only a quota.
fn subtrees(
    r: &ReadTxn,
    inodes: &HashMap<u64, crate::store::Inode>,
    findings: &mut Vec<String>,
) -> Result<(), StoreError> {
    if !r.subtree_current()? {
        return Ok(());
    }
    let placed = |i: &crate::store::Inode| i.ino != ROOT_INO && i.nlink > 0;
    let mut want: HashMap<u64, SubtreeRecord> = HashMap::new();
    for i in inodes.values().filter(|i| placed(i)) {
        let (mut depth, mut bytes) = (1u32, i.name.len() as u32 + 1);
        let mut cur = i.parent;
        for _ in 0..=inodes.len() {
            let w = want.entry(cur).or_default();
            match i.kind {
                Kind::File => {
                    w.files += 1;
                    w.bytes += i.size;
                }
                Kind::Dir => w.dirs += 1,
            }
            w.depth = w.depth.max(depth);
            w.path_bytes = w.path_bytes.max(bytes);
            match inodes.get(&cur) {
                Some(p) if cur != ROOT_INO && placed(p) => {
                    depth += 1;
                    bytes += p.name.len() as u32 + 1;
                    cur = p.parent;
                }
                // A broken chain is reported by the checks above.
                _ => break,
            }
        }
    }
    let stored: HashMap<u64, SubtreeRecord> = r.all_subtrees()?.into_iter().collect();
    for (ino, w) in &want {
        let s = stored.get(ino).copied().unwrap_or_default();
        if (s.files, s.dirs, s.bytes) != (w.files, w.dirs, w.bytes) {
            findings.push(format!(
                "directory {ino} records {} files, {} dirs, {} bytes below it; the records say {}, {}, {}",
                s.files, s.dirs, s.bytes, w.files, w.dirs, w.bytes
            ));
        }
        if s.depth < w.depth || s.path_bytes < w.path_bytes {
            findings.push(format!(
                "directory {ino} bounds its paths at {} levels and {} bytes, but one below it is {} levels and {} bytes",
                s.depth, s.path_bytes, w.depth, w.path_bytes
            ));
        }
    }
    let indexed: HashSet<u64> = r.quota_rows()?.into_iter().map(|(d, _)| d).collect();
    for (ino, s) in &stored {
        if s.has_quota() != indexed.contains(ino) {
            findings.push(format!(
                "the quota of directory {ino} and the index of quotas disagree"
            ));
        }
    }
    for ino in &indexed {
        if !stored.contains_key(ino) {
            findings.push(format!(
                "the index of quotas names directory {ino}, which has no subtree record"
            ));
        }
    }
    for (ino, s) in &stored {
        let is_dir = inodes.get(ino).is_some_and(|i| i.kind == Kind::Dir);
        if !is_dir && (s.files, s.dirs, s.bytes) != (0, 0, 0) {
            findings.push(format!(
                "a subtree record with counts exists for {ino}, which is not a directory"
            ));
        } else if !want.contains_key(ino) && s.entries() + s.bytes != 0 {
            findings.push(format!(
                "directory {ino} records {} files, {} dirs, {} bytes below it, but it is empty",
                s.files, s.dirs, s.bytes
            ));
        }
    }
    Ok(())
}

/// Every directory reaches the root by parent pointers.
fn cycles(
    inodes: &HashMap<u64, crate::store::Inode>,
    orphans: &HashSet<u64>,
    findings: &mut Vec<String>,
) {
    for (ino, i) in inodes {
        if i.kind != Kind::Dir || orphans.contains(ino) {
            continue;
        }
        let mut cur = *ino;
        let mut steps = 0;
        while cur != ROOT_INO && steps <= inodes.len() {
            cur = inodes.get(&cur).map_or(ROOT_INO, |x| x.parent);
            steps += 1;
        }
        if cur != ROOT_INO {
            findings.push(format!("directory {ino} is in a cycle"));
        }
    }
}

/// Content chunks belong to files and lie within their sizes.
fn chunks(
    r: &ReadTxn,
    inodes: &HashMap<u64, crate::store::Inode>,
    findings: &mut Vec<String>,
) -> Result<(), StoreError> {
    let mut chunk_bytes: HashMap<u64, u64> = HashMap::new();
    for (ino, idx, len) in r.all_chunks()? {
        match inodes.get(&ino) {
            None => findings.push(format!("chunk {idx} belongs to missing inode {ino}")),
            Some(i) => {
                if i.kind != Kind::File {
                    findings.push(format!("directory {ino} has content chunk {idx}"));
                }
                if idx * CHUNK_SIZE + len > i.size {
                    findings.push(format!(
                        "chunk {idx} of inode {ino} lies beyond its size {}",
                        i.size
                    ));
                }
                if len > CHUNK_SIZE {
                    findings.push(format!(
                        "chunk {idx} of inode {ino} is {len} bytes, over the chunk size"
                    ));
                }
            }
        }
        *chunk_bytes.entry(ino).or_default() += len;
    }
    let in_blobs: HashSet<u64> = r
        .all_filemap()?
        .into_iter()
        .filter(|&(_, idx, _)| idx == 0)
        .map(|(ino, _, _)| ino)
        .collect();
    for (ino, len) in r.all_inline()? {
        match inodes.get(&ino) {
            None => {}
            Some(i) if i.kind != Kind::File => {
                findings.push(format!("directory {ino} holds content in its record"));
            }
            Some(i) => {
                let len = len.unwrap_or(0);
                if len > i.size {
                    findings.push(format!(
                        "chunk 0 of inode {ino}, held in its record, lies beyond its size {}",
                        i.size
                    ));
                }
                if len > INLINE_MAX as u64 {
                    findings.push(format!(
                        "chunk 0 of inode {ino}, held in its record, is {len} bytes, over {INLINE_MAX}"
                    ));
                }
            }
        }
        if in_blobs.contains(&ino) {
            findings.push(format!(
                "chunk 0 of inode {ino} is held both in its record and in a blob"
            ));
        }
    }
    Ok(())
}

/// Blob references: each blob is counted once per filemap entry and once per history
/// before-image that keeps it; nothing else exists and nothing is missing.
fn blob_references(r: &ReadTxn, findings: &mut Vec<String>) -> Result<(), StoreError> {
    let (counts, blob_ids) = r.blob_accounting()?;
    let mut want: HashMap<u64, u64> = HashMap::new();
    for (_, _, b) in r.all_filemap()? {
        *want.entry(b).or_default() += 1;
    }
    let (deltas, rows) = r.delta_survey()?;
    for (_, base) in &deltas {
        *want.entry(*base).or_default() += 1;
    }
    r.for_each_undo(|_, u| {
        if let crate::store::Undo::Filemap { old: Some(b), .. } = u {
            *want.entry(*b).or_default() += 1;
        }
        Ok(())
    })?;
    // A blob without a blobrefs entry has exactly one reference; entries hold counts of 2+.
    let live: HashSet<u64> = blob_ids.iter().copied().collect();
    for (b, n) in &want {
        let recorded = counts
            .get(b)
            .copied()
            .or_else(|| live.contains(b).then_some(1));
        if recorded != Some(*n) {
            findings.push(format!(
                "blob {b} has {recorded:?} references recorded but {n} exist"
            ));
        }
    }
    for (b, n) in &counts {
        if !want.contains_key(b) {
            findings.push(format!(
                "blob {b} records {n} references but nothing refers to it"
            ));
        } else if *n < 2 {
            findings.push(format!(
                "blob {b} has a reference count entry of {n} (only counts of 2 or more are kept)"
            ));
        }
    }
    for b in want.keys() {
        if !live.contains(b) {
            findings.push(format!("blob {b} is referred to but missing"));
        }
    }
    delta_runs(&deltas, &rows, &live, findings);
    for b in &blob_ids {
        if !want.contains_key(b) {
            findings.push(format!("blob {b} is stored but nothing refers to it"));
        }
    }
    Ok(())
}

/// Delta blobs: each one's base exists and indexes it, the index names only deltas, and no
/// run of deltas is longer than `MAX_DELTA_RUN` (the content they rebuild is checked with
/// every other blob's, in `damaged_chunks`).
fn delta_runs(
    deltas: &[(u64, u64)],
    rows: &[(u64, u64)],
    live: &HashSet<u64>,
    findings: &mut Vec<String>,
) {
    let base_of: HashMap<u64, u64> = deltas.iter().copied().collect();
    let indexed: HashSet<(u64, u64)> = rows.iter().copied().collect();
    for (blob, base) in deltas {
        if !live.contains(base) {
            findings.push(format!(
                "blob {blob} is a delta against blob {base}, which is missing"
            ));
        }
        if !indexed.contains(&(*base, *blob)) {
            findings.push(format!(
                "blob {blob} is a delta against blob {base} but the delta index lacks it"
            ));
        }
    }
    for (base, blob) in rows {
        if base_of.get(blob) != Some(base) {
            findings.push(format!(
                "the delta index names blob {blob} as a delta against blob {base}, which it is not"
            ));
        }
    }
    let max = crate::store::schema::MAX_DELTA_RUN as usize;
    // The deltas a blob is read through: 0 for a full one, 1 more than its base's for a
    // delta; memoised along each walk.
    let mut run_of: HashMap<u64, usize> = HashMap::new();
    for (blob, _) in deltas {
        let mut path = Vec::new();
        let mut at = *blob;
        let below = loop {
            if let Some(n) = run_of.get(&at) {
                break Some(*n);
            }
            match base_of.get(&at) {
                None => break Some(0),
                Some(base) => {
                    path.push(at);
                    if path.len() > base_of.len() {
                        break None;
                    }
                    at = *base;
                }
            }
        };
        let Some(below) = below else {
            findings.push(format!("blob {blob} is in a loop of deltas"));
            for b in path {
                run_of.insert(b, 0);
            }
            continue;
        };
        for (i, b) in path.iter().rev().enumerate() {
            run_of.insert(*b, below + i + 1);
        }
        let n = run_of[blob];
        if n > max {
            findings.push(format!(
                "blob {blob} is read through {n} deltas, more than the {max} allowed"
            ));
        }
    }
}

/// Chunks whose content does not match its checksum, by path where a file holds them.
fn damaged_chunks(
    r: &ReadTxn,
    parts_whole: bool,
    findings: &mut Vec<String>,
) -> Result<(), StoreError> {
    for (ino, len) in r.all_inline()? {
        if len.is_none() {
            let path = crate::fs::path_of_inode(r, ino);
            findings.push(format!(
                "{path}: chunk 0 (held in its inode record) does not match its checksum"
            ));
        }
    }
    let mut damaged_images = HashSet::new();
    if parts_whole {
        r.for_each_undo(|_, u| {
            if let crate::store::Undo::Inode { ino, old: Some(b) } = u
                && crate::store::inline_is_damaged(b)
            {
                damaged_images.insert(*ino);
            }
            Ok(())
        })?;
    }
    for ino in damaged_images {
        findings.push(format!(
            "an earlier version of inode {ino} kept by the history does not match its checksum"
        ));
    }
    let damaged: HashSet<u64> = r.damaged_blobs()?.into_iter().collect();
    if !damaged.is_empty() {
        let mut named = HashSet::new();
        for (ino, idx, b) in r.all_filemap()? {
            if damaged.contains(&b) {
                named.insert(b);
                let path = crate::fs::path_of_inode(r, ino);
                findings.push(format!(
                    "{path}: chunk {idx} (blob {b}) does not match its checksum"
                ));
            }
        }
        for b in damaged.difference(&named) {
            findings.push(format!(
                "blob {b} (an earlier version kept by the history) does not match its checksum"
            ));
        }
    }
    Ok(())
}

/// Where the store exceeds the limits it records for itself (a store built before a limit
/// was lowered, or by a path that did not enforce it): one line per finding.
fn over_limits(
    r: &ReadTxn,
    inodes: &HashMap<u64, crate::store::Inode>,
    dirents: &[(u64, crate::store::DirEntry)],
) -> Result<Vec<String>, StoreError> {
    let Some(limits) = r
        .meta_bytes(crate::store::schema::META_LIMITS)?
        .and_then(|b| serde_json::from_slice::<Limits>(&b).ok())
    else {
        return Ok(Vec::new());
    };
    let mut findings = Vec::new();
    let mut children: HashMap<u64, Vec<&crate::store::DirEntry>> = HashMap::new();
    for (parent, e) in dirents {
        children.entry(*parent).or_default().push(e);
    }
    // Every path from the root, iteratively: (inode, path bytes, depth).
    let mut stack = vec![(ROOT_INO, String::new(), 0usize)];
    let mut visited = HashSet::new();
    while let Some((dir, path, depth)) = stack.pop() {
        if !visited.insert(dir) {
            continue;
        }
        let entries = children.get(&dir).map(Vec::as_slice).unwrap_or_default();
        let mut folded: HashMap<String, &str> = HashMap::new();
        for e in entries {
            let p = format!("{path}/{}", e.name);
            if depth + 1 > limits.max_depth {
                findings.push(format!(
                    "{p:?} is {} levels deep, over the store's --max-depth {}",
                    depth + 1,
                    limits.max_depth
                ));
            }
            if p.len() > limits.max_path_bytes {
                findings.push(format!(
                    "{p:?} is {} bytes, over the store's --max-path-bytes {}",
                    p.len(),
                    limits.max_path_bytes
                ));
            }
            if limits.names == NameRules::Portable {
                if let Err(err) = Name::parse(e.name.as_bytes(), NameRules::Portable) {
                    findings.push(format!("{p:?}: {err}"));
                }
                if let Some(other) = folded.insert(crate::fs::name::fold_case(&e.name), &e.name) {
                    findings.push(format!(
                        "{p:?} and {other:?} differ only in case, under the store's --names portable"
                    ));
                }
            }
            if let Some(i) = inodes.get(&e.ino) {
                if i.kind == Kind::File && i.size > limits.max_file_bytes {
                    findings.push(format!(
                        "{p:?} is {} bytes, over the store's --max-file-bytes {}",
                        i.size, limits.max_file_bytes
                    ));
                }
                if i.kind == Kind::Dir {
                    stack.push((e.ino, p, depth + 1));
                }
            }
        }
    }
    let content: u64 = inodes.values().map(|i| i.size).sum();
    if limits.quota_bytes > 0 && content > limits.quota_bytes {
        findings.push(format!(
            "the store holds {content} content bytes, over its --quota {}",
            limits.quota_bytes
        ));
    }
    let count = inodes.len() as u64;
    if count > limits.max_files {
        findings.push(format!(
            "the store holds {count} files and directories, over its --max-files {}",
            limits.max_files
        ));
    }
    Ok(findings)
}
