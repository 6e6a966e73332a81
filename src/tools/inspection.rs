//! Inspection: `ls`, `cat`, `du` and `stats` of a store (`tree` is the shared walk in
//! `common`). Read-only: each answers from one read transaction, mounted or not.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use super::common::{ContentSink, EntryInfo, Result, Walk, err, lookup_path, stream_content, tree};
use crate::store::{Kind, ROOT_INO, ReadTxn};

/// `ls`: a directory's entries, or the file itself (a listing that streams walks with
/// `Walk::dir`).
pub fn ls(r: &ReadTxn, path: &str) -> Result<Vec<EntryInfo>> {
    Walk::dir(r, path)?.map(|e| e.map(|(_, e)| e)).collect()
}

/// `cat`: one file's content, whole (see `stream_cat`).
pub fn cat(r: &ReadTxn, path: &str) -> Result<Vec<u8>> {
    let mut whole = Vec::new();
    stream_cat(r, path, &mut whole)?;
    Ok(whole)
}

/// `cat`: one file's content, into `sink` a chunk at a time, all from `r` (one version of the
/// file, whatever commits while it streams).
pub fn stream_cat(r: &ReadTxn, path: &str, sink: &mut dyn ContentSink) -> Result<()> {
    let (inode, canon) = lookup_path(r, path)?;
    if inode.kind != Kind::File {
        return Err(format!("{canon}: is a directory"));
    }
    sink.start(inode.size)?;
    stream_content(r, &inode, sink)
}

/// What `du` reports.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct DuInfo {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// The directory's quota (`redbfs quota`): content bytes allowed below it (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub quota_bytes: u64,
    /// Files and directories allowed below it (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub quota_files: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// `du`: files, directories and content bytes at and below `path`. A directory's come from
/// its aggregate (no walk) when the store keeps them, with its quota.
pub fn du(r: &ReadTxn, path: &str) -> Result<DuInfo> {
    let (inode, _) = lookup_path(r, path)?;
    if inode.kind == Kind::Dir && r.subtree_current().map_err(err)? {
        let row = r.subtree(inode.ino).map_err(err)?;
        return Ok(DuInfo {
            files: row.files,
            dirs: row.dirs + 1,
            bytes: row.bytes,
            quota_bytes: row.quota_bytes,
            quota_files: row.quota_files,
        });
    }
    let mut d = DuInfo::default();
    for (_, e) in tree(r, path)? {
        match e.kind {
            "file" => {
                d.files += 1;
                d.bytes += e.size;
            }
            _ => d.dirs += 1,
        }
    }
    Ok(d)
}

/// What `stats` reports.
#[derive(Clone, Debug, Serialize)]
pub struct StatsInfo {
    pub files: u64,
    pub dirs: u64,
    pub content_bytes: u64,
    pub store_bytes: u64,
    pub largest: Vec<(String, u64)>,
    pub last_commit_ns: Option<i64>,
    /// Every directory with a quota, with its usage.
    pub quotas: Vec<crate::fs::QuotaInfo>,
}

/// `stats`: counts, the largest files, the store file's size and the last commit time.
pub fn stats(r: &ReadTxn, store_bytes: u64) -> Result<StatsInfo> {
    let usage = r.usage().map_err(err)?;
    // The largest files, from one scan of the inodes keeping ten at a time: the first ten by
    // (size descending, inode) sit in a heap whose top is the one the next better file evicts.
    let mut top = BinaryHeap::with_capacity(STATS_LARGEST + 1);
    r.for_each_inode(None, |i, _, _| {
        if i.kind == Kind::File && i.nlink > 0 {
            top.push((Reverse(i.size), i.ino));
            if top.len() > STATS_LARGEST {
                top.pop();
            }
        }
        Ok(())
    })
    .map_err(err)?;
    let mut largest = Vec::with_capacity(STATS_LARGEST);
    for (Reverse(size), ino) in top.into_sorted_vec() {
        largest.push((path_of(r, ino)?, size));
    }
    Ok(StatsInfo {
        files: usage.files,
        dirs: usage.dirs,
        content_bytes: usage.content_bytes,
        store_bytes,
        largest,
        last_commit_ns: r.last_commit().map_err(err)?,
        quotas: quotas(r)?,
    })
}

/// How many of the largest files `stats` names.
const STATS_LARGEST: usize = 10;

/// The path of inode `ino`, from the parent pointers of its inode and theirs; a missing one
/// ends it there, and a cycle (a damaged store) ends after as many steps as there are inodes.
fn path_of(r: &ReadTxn, ino: u64) -> Result<String> {
    let most = r.inode_count().map_err(err)?;
    let mut parts = Vec::new();
    let mut cur = ino;
    while cur != ROOT_INO && (parts.len() as u64) <= most {
        match r.inode(cur).map_err(err)? {
            Some(i) => {
                parts.push(i.name);
                cur = i.parent;
            }
            None => break,
        }
    }
    parts.reverse();
    Ok(format!("/{}", parts.join("/")))
}

/// `quota STORE`: every directory with a quota and what lies below it. From the aggregates,
/// or when the store does not keep them (changed by an older build, not mounted since), by a
/// walk of each.
pub fn quotas(r: &ReadTxn) -> Result<Vec<crate::fs::QuotaInfo>> {
    let mut list = crate::fs::quotas(r).map_err(err)?;
    if !r.subtree_current().map_err(err)? {
        for q in &mut list {
            let mut d = DuInfo::default();
            for (_, e) in tree(r, &q.path)?.into_iter().skip(1) {
                match e.kind {
                    "file" => {
                        d.files += 1;
                        d.bytes += e.size;
                    }
                    _ => d.dirs += 1,
                }
            }
            q.bytes = d.bytes;
            q.files = d.files + d.dirs;
        }
    }
    Ok(list)
}
