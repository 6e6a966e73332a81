//! Shared by `tests/crash.rs` and `tests/durability.rs` (included with `#[path]`): seeds, the
//! content generator, the model of what the workers were told is saved, journal replay,
//! verification of a mounted tree against the model, and worker processes.
//!
//! How a kill is judged: every worker runs its operations one at a time and journals each
//! operation's intent before the call and its acknowledgement after the call returned (see
//! `worker.py`). Replaying the acknowledged operations over the model gives the state the
//! store must hold at least; each worker has at most one operation in flight, which may or may
//! not have happened. So the tree under a worker's own directory must equal the model, or the
//! model with the in-flight operation applied in one of the ways the commit model allows (a
//! file created but not yet fsynced may be missing or empty; an fsynced prefix of a large write
//! may be the last acknowledged or the next fsync point; a rename is all-old or all-new; the
//! SDK's recursive delete may have removed any part of its tree). Anything else (a lost
//! acknowledged file, a truncated or mixed file, a half-done rename) is a failure.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{self, TestMount};

// ---------------------------------------------------------------------------------------------
// Seeds

pub use crate::common::Rng;

/// Mixes two values into a seed (a derived seed for kill `b` of scenario seed `a`).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut r = Rng::new(a ^ Rng::new(b).next_u64());
    r.next_u64() & ((1 << 53) - 1) // exact in JSON and JavaScript numbers
}

pub fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// `REDBFS_SEED` if set (to replay a failure), else a fresh seed.
pub fn base_seed() -> u64 {
    match std::env::var("REDBFS_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .expect("REDBFS_SEED must be an unsigned integer"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            mix(t, std::process::id() as u64)
        }
    }
}

pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name} must be an integer"))
        })
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Content

const FILL: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ+/";

/// The content generator shared with worker.py and sdk_worker.mjs: a header line
/// `#CID SIZE rev=NNNN` and then numbered 64-byte lines, cut at SIZE bytes. Every line names
/// its file and position, so a misplaced, stale or foreign chunk never passes for the right one.
pub fn content(cid: &str, size: u64, rev: u32) -> Vec<u8> {
    let size = size as usize;
    let mut out = format!("#{cid} {size} rev={rev:04}\n").into_bytes();
    out.reserve(size.saturating_sub(out.len()));
    let mut i = 0u64;
    while out.len() < size {
        let p = format!("{cid}:{i}|");
        out.extend_from_slice(p.as_bytes());
        out.extend_from_slice(&FILL[..63usize.saturating_sub(p.len())]);
        out.push(b'\n');
        i += 1;
    }
    out.truncate(size);
    out
}

/// A short description of what some bytes are, for failure messages.
pub fn describe_bytes(b: &[u8]) -> String {
    let head_end = b
        .iter()
        .position(|&c| c == b'\n')
        .unwrap_or(b.len())
        .min(80);
    format!(
        "{} bytes starting {:?}",
        b.len(),
        String::from_utf8_lossy(&b[..head_end])
    )
}

/// None if `data` is a prefix of the content its own header names.
pub fn check_prefix(data: &[u8]) -> Option<String> {
    if data.is_empty() {
        return None;
    }
    let nl = data.iter().position(|&c| c == b'\n')?;
    let head = String::from_utf8_lossy(&data[1..nl]).to_string();
    let mut it = head.split(' ');
    let (Some(cid), Some(size), Some(rev)) = (it.next(), it.next(), it.next()) else {
        return Some(format!("no content header: {head:?}"));
    };
    let (Ok(size), Ok(rev)) = (
        size.parse::<u64>(),
        rev.trim_start_matches("rev=").parse::<u32>(),
    ) else {
        return Some(format!("no content header: {head:?}"));
    };
    let want = content(cid, size, rev);
    if data.len() > want.len() {
        return Some(format!("{} bytes but the header says {size}", data.len()));
    }
    want.iter()
        .zip(data)
        .position(|(a, b)| a != b)
        .map(|at| format!("differs from content({cid}) at byte {at}"))
}

/// A file's content in the model: the first `len` bytes of `content(cid, size, rev)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    pub cid: String,
    pub size: u64,
    pub rev: u32,
    pub len: u64,
}

impl Content {
    pub fn full(cid: &str, size: u64, rev: u32) -> Content {
        Content {
            cid: cid.to_string(),
            size,
            rev,
            len: size,
        }
    }
    pub fn bytes(&self) -> Vec<u8> {
        let mut v = content(&self.cid, self.size, self.rev);
        v.truncate(self.len as usize);
        v
    }
    pub fn describe(&self) -> String {
        format!(
            "{} of {} bytes of content({}) rev {}",
            self.len, self.size, self.cid, self.rev
        )
    }
}

// ---------------------------------------------------------------------------------------------
// The model

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir(BTreeMap<String, Node>),
    File(Content),
}

impl Node {
    fn describe(&self) -> String {
        match self {
            Node::Dir(m) => format!("a directory of {} entries", m.len()),
            Node::File(c) => format!("a file holding {}", c.describe()),
        }
    }
}

/// The tree the store must hold, from the mount root.
#[derive(Clone, Debug)]
pub struct Model {
    pub root: Node,
}

impl Default for Model {
    fn default() -> Self {
        Model::new()
    }
}

fn parts(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

impl Model {
    pub fn new() -> Model {
        Model {
            root: Node::Dir(BTreeMap::new()),
        }
    }

    pub fn get(&self, path: &str) -> Option<&Node> {
        let mut cur = &self.root;
        for p in parts(path) {
            match cur {
                Node::Dir(m) => cur = m.get(p)?,
                Node::File(_) => return None,
            }
        }
        Some(cur)
    }

    fn get_mut(&mut self, path: &str) -> Option<&mut Node> {
        let mut cur = &mut self.root;
        for p in parts(path) {
            match cur {
                Node::Dir(m) => cur = m.get_mut(p)?,
                Node::File(_) => return None,
            }
        }
        Some(cur)
    }

    fn dir_mut(&mut self, path: &str) -> Result<&mut BTreeMap<String, Node>, String> {
        match self.get_mut(path) {
            Some(Node::Dir(m)) => Ok(m),
            Some(Node::File(_)) => Err(format!("{path} is a file, not a directory")),
            None => Err(format!("{path} does not exist")),
        }
    }

    /// Puts `node` at `path` (the parent must be a directory), returning what was there.
    pub fn insert(&mut self, path: &str, node: Node) -> Result<Option<Node>, String> {
        let name = parts(path)
            .last()
            .ok_or("cannot replace the root")?
            .to_string();
        Ok(self.dir_mut(parent_of(path))?.insert(name, node))
    }

    pub fn remove(&mut self, path: &str) -> Result<Node, String> {
        let name = parts(path)
            .last()
            .ok_or("cannot remove the root")?
            .to_string();
        self.dir_mut(parent_of(path))?
            .remove(&name)
            .ok_or_else(|| format!("{path} does not exist"))
    }

    pub fn mkdir(&mut self, path: &str) -> Result<(), String> {
        if self.get(path).is_some() {
            return Err(format!("{path} exists already"));
        }
        self.insert(path, Node::Dir(BTreeMap::new())).map(|_| ())
    }

    /// Every file path under `path`, depth first.
    pub fn files_under(&self, path: &str) -> Vec<String> {
        fn walk(n: &Node, at: String, out: &mut Vec<String>) {
            match n {
                Node::File(_) => out.push(at),
                Node::Dir(m) => {
                    for (k, v) in m {
                        walk(v, format!("{at}/{k}"), out);
                    }
                }
            }
        }
        let mut out = Vec::new();
        if let Some(n) = self.get(path) {
            walk(n, path.to_string(), &mut out);
        }
        out
    }

    /// Applies one operation as a filesystem would, refusing what one would refuse.
    pub fn apply(&mut self, op: &Op, len: Option<u64>) -> Result<(), String> {
        match op {
            Op::Mkdir(p) => self.mkdir(p),
            Op::Unlink(p) => match self.get(p) {
                Some(Node::File(_)) => self.remove(p).map(|_| ()),
                other => Err(format!("unlink {p}: it is {other:?}")),
            },
            Op::Rmdir(p) => match self.get(p) {
                Some(Node::Dir(m)) if m.is_empty() => self.remove(p).map(|_| ()),
                Some(n) => Err(format!("rmdir {p}: it is {}", n.describe())),
                None => Err(format!("rmdir {p}: missing")),
            },
            Op::Rmtree(p) => self.remove(p).map(|_| ()),
            Op::Rename(a, b) => {
                if a == b {
                    return Ok(());
                }
                let src = self.get(a).ok_or_else(|| format!("rename {a}: missing"))?;
                match (src, self.get(b)) {
                    (_, None) | (Node::File(_), Some(Node::File(_))) => {}
                    (Node::Dir(_), Some(Node::Dir(m))) if m.is_empty() => {}
                    (_, Some(d)) => {
                        return Err(format!("rename {a} -> {b}: the target is {}", d.describe()));
                    }
                }
                if b.starts_with(&format!("{a}/")) {
                    return Err(format!("rename {a} into itself ({b})"));
                }
                let n = self.remove(a)?;
                self.insert(b, n).map(|_| ())
            }
            Op::Write {
                path,
                cid,
                size,
                rev,
                excl,
                ..
            } => {
                let c = Content {
                    cid: cid.clone(),
                    size: *size,
                    rev: *rev,
                    len: len.unwrap_or(*size),
                };
                match self.get(path) {
                    None => {}
                    Some(Node::File(_)) if !*excl => {}
                    // Its own earlier fsync point, or the file as created.
                    Some(Node::File(old)) if old.cid == *cid => {}
                    Some(n) => return Err(format!("create {path}: it is {}", n.describe())),
                }
                self.insert(path, Node::File(c)).map(|_| ())
            }
            Op::Rev { path, from, to } => match self.get_mut(path) {
                Some(Node::File(c)) if c.rev == *from => {
                    c.rev = *to;
                    Ok(())
                }
                other => Err(format!(
                    "str_replace rev {from}->{to} of {path}: it is {other:?}"
                )),
            },
        }
    }
}

/// One operation of a worker, as journaled.
#[derive(Clone, Debug)]
pub enum Op {
    Mkdir(String),
    Unlink(String),
    Rmdir(String),
    Rmtree(String),
    Rename(String, String),
    /// Create (`excl`) or overwrite through O_TRUNC, with an fsync after each of `points`.
    Write {
        path: String,
        cid: String,
        size: u64,
        rev: u32,
        points: Vec<u64>,
        excl: bool,
    },
    /// The SDK's str_replace of `rev=FROM` by `rev=TO` (temp file, fsync, rename).
    Rev {
        path: String,
        from: u32,
        to: u32,
    },
}

impl Op {
    fn parse(v: &Value) -> Result<Op, String> {
        let s = |k: &str| {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("journal entry without {k}: {v}"))
        };
        let u = |k: &str| {
            v[k].as_u64()
                .ok_or_else(|| format!("journal entry without {k}: {v}"))
        };
        Ok(match v["op"].as_str().unwrap_or("") {
            "mkdir" => Op::Mkdir(s("path")?),
            "unlink" => Op::Unlink(s("path")?),
            "rmdir" => Op::Rmdir(s("path")?),
            "rmtree" => Op::Rmtree(s("path")?),
            "rename" => Op::Rename(s("from")?, s("to")?),
            "write" => Op::Write {
                path: s("path")?,
                cid: s("cid")?,
                size: u("size")?,
                rev: u("rev")? as u32,
                points: v["points"]
                    .as_array()
                    .ok_or("write without points")?
                    .iter()
                    .map(|p| p.as_u64().unwrap())
                    .collect(),
                excl: v["excl"].as_bool().unwrap_or(true),
            },
            "rev" => Op::Rev {
                path: s("path")?,
                from: u("from")? as u32,
                to: u("to")? as u32,
            },
            other => return Err(format!("unknown operation {other:?} in {v}")),
        })
    }

    fn paths(&self) -> Vec<&str> {
        match self {
            Op::Mkdir(p) | Op::Unlink(p) | Op::Rmdir(p) | Op::Rmtree(p) => vec![p],
            Op::Rename(a, b) => vec![a, b],
            Op::Write { path, .. } | Op::Rev { path, .. } => vec![path],
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Journals

/// The JSON lines of a journal; a last line cut short by a kill is dropped.
pub fn read_journal(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The operation a worker had in flight when it stopped.
#[derive(Clone, Debug)]
pub struct Pending {
    pub op: Op,
    /// The last fsync point acknowledged for a write.
    pub acked_len: Option<u64>,
    /// Why the call failed, if it returned at all.
    pub failed: Option<String>,
}

/// What one worker's journal says.
#[derive(Debug, Default)]
pub struct Replayed {
    pub label: String,
    pub pid: Option<u64>,
    pub ready: bool,
    pub done: bool,
    pub acked: usize,
    pub pending: Option<Pending>,
    /// Failures while the daemon was alive, reads that saw damaged content, slow calls.
    pub problems: Vec<String>,
    pub touched: BTreeSet<String>,
    pub max_ms: f64,
    pub tail: Vec<String>,
}

/// Replays a journal over `model`: every acknowledged operation (and every acknowledged fsync
/// point of a write) is applied; the operation left in flight is returned as pending.
pub fn replay(label: &str, lines: &[Value], model: &mut Model) -> Result<Replayed, String> {
    let mut r = Replayed {
        label: label.to_string(),
        ..Default::default()
    };
    r.tail = lines
        .iter()
        .rev()
        .take(6)
        .rev()
        .map(|v| v.to_string())
        .collect();
    let mut cur: Option<(u64, Pending)> = None;
    for v in lines {
        if v.get("ready").is_some() {
            r.ready = true;
            r.pid = v["pid"].as_u64();
        } else if let Some(seq) = v["b"].as_u64() {
            if let Some((s, p)) = &cur
                && p.failed.is_none()
            {
                return Err(format!(
                    "{label}: operation {seq} began while {s} ({:?}) was in flight",
                    p.op
                ));
            }
            let op = Op::parse(v)?;
            for p in op.paths() {
                r.touched.insert(p.to_string());
            }
            cur = Some((
                seq,
                Pending {
                    op,
                    acked_len: None,
                    failed: None,
                },
            ));
        } else if let Some(seq) = v["a"].as_u64() {
            let Some((s, p)) = &mut cur else {
                return Err(format!(
                    "{label}: acknowledgement of {seq} without its intent"
                ));
            };
            if *s != seq {
                return Err(format!(
                    "{label}: acknowledgement of {seq} while {s} is in flight"
                ));
            }
            match v["len"].as_u64() {
                Some(len) => {
                    model
                        .apply(&p.op, Some(len))
                        .map_err(|e| format!("{label}: acknowledged fsync point {len} of {:?} does not fit the model: {e}", p.op))?;
                    p.acked_len = Some(len);
                }
                None => {
                    // A write's final acknowledgement is its close; its content is whole.
                    let full = match &p.op {
                        Op::Write { size, .. } => Some(*size),
                        _ => None,
                    };
                    model.apply(&p.op, full).map_err(|e| {
                        format!(
                            "{label}: acknowledged {:?} does not fit the model: {e}",
                            p.op
                        )
                    })?;
                    r.acked += 1;
                    cur = None;
                }
            }
        } else if v.get("f").is_some() {
            let why = format!(
                "{} {}",
                v["errno"].as_str().unwrap_or("?"),
                v["msg"].as_str().unwrap_or("")
            );
            if !v["dead"].as_bool().unwrap_or(false) {
                r.problems.push(format!(
                    "{label}: an operation failed while the daemon was alive: {why} (in flight: {:?})",
                    cur.as_ref().map(|c| &c.1.op)
                ));
            }
            if let Some((_, p)) = &mut cur {
                p.failed = Some(why);
            }
        } else if let Some(what) = v.get("slow") {
            r.problems.push(format!(
                "{label}: a {} call took {} ms (a hang: the bound is 30,000 ms)",
                what.as_str().unwrap_or("?"),
                v["ms"]
            ));
        } else if let Some(p) = v.get("bad") {
            r.problems.push(format!(
                "{label}: read {} and got damaged content: {}",
                p.as_str().unwrap_or("?"),
                v["why"].as_str().unwrap_or("?")
            ));
        } else if v.get("done").is_some() {
            r.done = true;
            r.max_ms = v["max_ms"].as_f64().unwrap_or(0.0);
        }
    }
    r.pending = cur.map(|(_, p)| p);
    Ok(r)
}

// ---------------------------------------------------------------------------------------------
// The tree on the mount

#[derive(Clone, Debug)]
pub enum ANode {
    Dir(BTreeMap<String, ANode>),
    File { size: u64 },
}

impl ANode {
    fn describe(&self) -> String {
        match self {
            ANode::Dir(m) => format!("a directory of {} entries", m.len()),
            ANode::File { size } => format!("a file of {size} bytes"),
        }
    }

    pub fn get(&self, path: &str) -> Option<&ANode> {
        let mut cur = self;
        for p in parts(path) {
            match cur {
                ANode::Dir(m) => cur = m.get(p)?,
                ANode::File { .. } => return None,
            }
        }
        Some(cur)
    }
}

/// Reads the tree at `path` (names, kinds and sizes; contents are read on demand).
pub fn read_tree(path: &Path) -> Result<ANode, String> {
    let md = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if md.is_file() {
        return Ok(ANode::File { size: md.len() });
    }
    if !md.is_dir() {
        return Err(format!(
            "{} is neither a file nor a directory",
            path.display()
        ));
    }
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))? {
        let e = e.map_err(|e| format!("readdir {}: {e}", path.display()))?;
        let name = e.file_name().to_string_lossy().to_string();
        m.insert(name, read_tree(&e.path())?);
    }
    Ok(ANode::Dir(m))
}

/// Which file contents are read and compared (sizes and names always are).
pub struct Reader {
    pub mnt: PathBuf,
    /// Compare every file's content.
    pub all: bool,
    /// Also every file whose path is here (the paths this round of operations touched).
    pub touched: BTreeSet<String>,
    /// And this share of the others, in parts per thousand, chosen by path and `salt`.
    pub sample_per_mille: u64,
    pub salt: u64,
    cache: HashMap<String, Result<Vec<u8>, String>>,
    pub bytes_read: u64,
}

impl Reader {
    pub fn new(mnt: &Path) -> Reader {
        Reader {
            mnt: mnt.to_path_buf(),
            all: true,
            touched: BTreeSet::new(),
            sample_per_mille: 0,
            salt: 0,
            cache: HashMap::new(),
            bytes_read: 0,
        }
    }

    fn wants(&self, path: &str) -> bool {
        self.all
            || self.touched.contains(path)
            || Rng::new(hash_str(path) ^ self.salt).next_u64() % 1000 < self.sample_per_mille
    }

    fn read(&mut self, path: &str) -> Result<Vec<u8>, String> {
        if !self.cache.contains_key(path) {
            let r = std::fs::read(self.mnt.join(path)).map_err(|e| format!("read {path}: {e}"));
            if let Ok(b) = &r {
                self.bytes_read += b.len() as u64;
            }
            self.cache.insert(path.to_string(), r);
        }
        self.cache[path].clone()
    }

    /// Compares one file's content when the policy asks for it (always when `force`).
    fn file(&mut self, path: &str, want: &Content, size: u64, force: bool) -> Result<(), String> {
        if size != want.len {
            return Err(format!(
                "{path}: {size} bytes, expected {}",
                want.describe()
            ));
        }
        if !force && !self.wants(path) {
            return Ok(());
        }
        let got = self.read(path)?;
        let exp = want.bytes();
        if got == exp {
            return Ok(());
        }
        let at = exp
            .iter()
            .zip(&got)
            .position(|(a, b)| a != b)
            .unwrap_or(exp.len().min(got.len()));
        let tail = &got[at..(at + 80).min(got.len())];
        Err(format!(
            "{path}: content differs from byte {at} (got {}; at that byte {:?}), expected {}",
            describe_bytes(&got),
            String::from_utf8_lossy(tail),
            want.describe()
        ))
    }
}

/// One acceptable state of a worker's directory.
pub struct Candidate {
    pub label: String,
    pub model: Model,
    /// The SDK's recursive delete of this path was in flight: any part of it may be gone.
    pub loose: Option<String>,
    /// The SDK's str_replace was in flight: its temp file (`dir`, name prefix) may be left,
    /// empty or holding the new content.
    pub tmp: Option<(String, String, Content)>,
    /// Paths compared already (the workers' directories, when the whole tree is compared).
    pub skip: Vec<String>,
}

fn compare(
    want: &Node,
    got: &ANode,
    path: &str,
    cand: &Candidate,
    rd: &mut Reader,
) -> Result<(), String> {
    if cand.skip.iter().any(|p| p == path) {
        return Ok(());
    }
    match (want, got) {
        (Node::File(c), ANode::File { size }) => rd.file(path, c, *size, false),
        (Node::Dir(w), ANode::Dir(g)) => {
            for (name, wn) in w {
                let p = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}/{name}")
                };
                match g.get(name) {
                    Some(gn) => compare(wn, gn, &p, cand, rd)?,
                    None => {
                        let gone_ok = cand
                            .loose
                            .as_deref()
                            .is_some_and(|l| p == l || p.starts_with(&format!("{l}/")));
                        if !gone_ok {
                            return Err(format!("{p} is missing; expected {}", wn.describe()));
                        }
                    }
                }
            }
            for (name, gn) in g {
                if w.contains_key(name) {
                    continue;
                }
                let p = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}/{name}")
                };
                if let (Some((dir, prefix, new)), ANode::File { size }) = (&cand.tmp, gn)
                    && dir == path
                    && name.starts_with(prefix.as_str())
                {
                    if *size == 0 {
                        continue;
                    }
                    if rd.file(&p, new, *size, true).is_ok() {
                        continue;
                    }
                }
                return Err(format!("{p} should not exist (it is {})", gn.describe()));
            }
            Ok(())
        }
        (w, g) => Err(format!(
            "{path} is {}, expected {}",
            g.describe(),
            w.describe()
        )),
    }
}

/// The model after a match with a loose candidate: what the recursive delete left.
fn prune(want: &mut Node, got: &ANode) {
    if let (Node::Dir(w), ANode::Dir(g)) = (want, got) {
        w.retain(|k, _| g.contains_key(k));
        for (k, v) in w.iter_mut() {
            prune(v, &g[k]);
        }
    }
}

/// The states a worker's directory may be in, given the model and its operation in flight.
pub fn candidates(model: &Model, w: &Replayed) -> Vec<Candidate> {
    let plain = |label: &str, m: Model| Candidate {
        label: label.to_string(),
        model: m,
        loose: None,
        tmp: None,
        skip: Vec::new(),
    };
    let mut out = vec![plain("acknowledged operations only", model.clone())];
    let Some(p) = &w.pending else {
        return out;
    };
    let mut with = |label: &str, len: Option<u64>| {
        let mut m = model.clone();
        if m.apply(&p.op, len).is_ok() {
            out.push(plain(label, m));
        }
    };
    match &p.op {
        Op::Write {
            points, excl, size, ..
        } => {
            let next = match p.acked_len {
                None => points.first().copied(),
                Some(l) => points.iter().copied().find(|&x| x > l),
            };
            if let Some(n) = next {
                let label = if n == *size {
                    "the write in flight reached its last fsync (whole content)"
                } else {
                    "the write in flight reached its next fsync point (part of the content)"
                };
                with(label, Some(n));
            }
            if *excl && p.acked_len.is_none() {
                with(
                    "the create in flight is durable, its content not yet",
                    Some(0),
                );
            }
        }
        Op::Rmtree(path) => {
            out.push(Candidate {
                label: "the recursive delete in flight removed some of the tree".into(),
                model: model.clone(),
                loose: Some(path.clone()),
                tmp: None,
                skip: Vec::new(),
            });
        }
        Op::Rev { path, to, .. } => {
            let mut m = model.clone();
            let new = match m.get(path) {
                Some(Node::File(c)) => Some(Content {
                    rev: *to,
                    ..c.clone()
                }),
                _ => None,
            };
            let applied = m.apply(&p.op, None).is_ok();
            if let Some(new) = new {
                let tmp = Some((
                    parent_of(path).to_string(),
                    format!(".tmp-{}-", w.pid.unwrap_or(0)),
                    new,
                ));
                out[0].tmp = tmp.clone();
                if applied {
                    out.push(Candidate {
                        label: "the str_replace in flight was renamed into place".into(),
                        model: m,
                        loose: None,
                        tmp,
                        skip: Vec::new(),
                    });
                }
            }
        }
        _ => with("the operation in flight happened", None),
    }
    out
}

/// Checks the mounted tree under `root` against the candidates for worker `w`; returns the
/// model of the state found.
pub fn verify_root(
    model: &Model,
    actual: &ANode,
    root: &str,
    w: &Replayed,
    rd: &mut Reader,
) -> Result<(Model, String), String> {
    let got = actual
        .get(root)
        .ok_or_else(|| format!("{root} is missing from the mount"))?;
    let mut misses = Vec::new();
    for mut c in candidates(model, w) {
        let want = c
            .model
            .get(root)
            .ok_or_else(|| format!("{root} is missing from the model"))?
            .clone();
        match compare(&want, got, root, &c, rd) {
            Ok(()) => {
                if let Some(l) = &c.loose {
                    if let (Some(wn), Some(gn)) = (c.model.get_mut(l), actual.get(l)) {
                        prune(wn, gn);
                    } else if actual.get(l).is_none() {
                        let _ = c.model.remove(l);
                    }
                }
                let label = match &w.pending {
                    None => "nothing in flight".to_string(),
                    Some(_) => c.label.clone(),
                };
                return Ok((c.model, label));
            }
            Err(e) => misses.push(format!("  if {}: {e}", c.label)),
        }
    }
    Err(format!(
        "{root} ({}) is in no state the acknowledged operations allow.\n  acknowledged: {} operations; in flight: {}\n{}\n  journal tail:\n    {}",
        w.label,
        w.acked,
        match &w.pending {
            Some(p) => format!(
                "{:?}{}{}",
                p.op,
                p.acked_len
                    .map(|l| format!(", fsync acknowledged at {l}"))
                    .unwrap_or_default(),
                p.failed
                    .as_ref()
                    .map(|f| format!(", failed: {f}"))
                    .unwrap_or_default()
            ),
            None => "nothing".into(),
        },
        misses.join("\n"),
        w.tail.join("\n    ")
    ))
}

/// Checks the whole mount against the model, except the directories in `skip` (checked by
/// `verify_root` already).
pub fn verify_all(
    model: &Model,
    actual: &ANode,
    rd: &mut Reader,
    skip: &[String],
) -> Result<(), String> {
    let c = Candidate {
        label: "final".into(),
        model: Model::new(),
        loose: None,
        tmp: None,
        skip: skip.to_vec(),
    };
    compare(&model.root, actual, "", &c, rd)
}

// ---------------------------------------------------------------------------------------------
// Building state through the mount (the test's own operations, acknowledged as they return)

pub fn put_file(mnt: &Path, model: &mut Model, rel: &str, c: Content) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(mnt.join(rel))
        .unwrap_or_else(|e| panic!("create {rel}: {e}"));
    f.write_all(&c.bytes())
        .unwrap_or_else(|e| panic!("write {rel}: {e}"));
    f.sync_all().unwrap_or_else(|e| panic!("fsync {rel}: {e}"));
    drop(f);
    model.insert(rel, Node::File(c)).unwrap();
}

pub fn put_dir(mnt: &Path, model: &mut Model, rel: &str) {
    std::fs::create_dir(mnt.join(rel)).unwrap_or_else(|e| panic!("mkdir {rel}: {e}"));
    model.mkdir(rel).unwrap();
}

/// Removes the temp files (`.tmp-*`) workers left under `root`, through the mount.
pub fn remove_temp_files(mnt: &Path, model: &mut Model, actual: &ANode, root: &str) {
    fn walk(n: &ANode, at: &str, out: &mut Vec<String>) {
        if let ANode::Dir(m) = n {
            for (k, v) in m {
                let p = format!("{at}/{k}");
                match v {
                    ANode::File { .. } if k.starts_with(".tmp-") => out.push(p),
                    ANode::Dir(_) => walk(v, &p, out),
                    _ => {}
                }
            }
        }
    }
    let mut tmps = Vec::new();
    if let Some(n) = actual.get(root) {
        walk(n, root, &mut tmps);
    }
    for t in tmps {
        std::fs::remove_file(mnt.join(&t)).unwrap_or_else(|e| panic!("unlink {t}: {e}"));
        let _ = model.remove(&t);
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

pub fn crash_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crash")
}

/// The Python that runs worker.py (stdlib only): the system one when present, which starts
/// without a version-manager shim.
pub fn python() -> PathBuf {
    for p in ["/usr/bin/python3", "/usr/local/bin/python3"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    PathBuf::from("python3")
}

/// Whether the stock Node SDK (tests/clients, installed by setup.sh) is there to drive.
pub fn sdk_available() -> bool {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients/node_modules/@anthropic-ai/sdk/tools/memory/node.mjs");
    sdk.exists()
        && Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// worker.py
    Python,
    /// sdk_worker.mjs through the stock SDK tool (worker.py doing the same system calls when
    /// the SDK is not installed).
    Sdk,
}

#[derive(Clone, Debug)]
pub struct Spec {
    pub label: String,
    pub lang: Lang,
    pub mode: String,
    pub root: String,
    pub extra: Value,
}

impl Spec {
    pub fn new(lang: Lang, mode: &str, root: &str) -> Spec {
        Spec {
            label: format!(
                "{}:{mode}:{root}",
                if lang == Lang::Sdk { "sdk" } else { "py" }
            ),
            lang,
            mode: mode.to_string(),
            root: root.to_string(),
            extra: json!({}),
        }
    }
    pub fn extra(mut self, v: Value) -> Spec {
        self.extra = v;
        self
    }
}

pub struct Proc {
    pub spec: Spec,
    pub child: Option<Child>,
    pub journal: PathBuf,
    pub output: PathBuf,
    pub status: Option<std::process::ExitStatus>,
}

/// Worker processes; killed (by pid) and reaped when dropped.
pub struct Workers {
    pub procs: Vec<Proc>,
}

impl Workers {
    pub fn spawn(
        specs: &[Spec],
        mnt: &Path,
        dir: &Path,
        seed: u64,
        tag: &str,
        secs: Option<f64>,
    ) -> Workers {
        std::fs::create_dir_all(dir).unwrap();
        let use_sdk = sdk_available();
        let mut procs = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let journal = dir.join(format!("w{i}.journal"));
            let output = dir.join(format!("w{i}.out"));
            let cfg = json!({
                "mode": s.mode, "mount": mnt, "root": s.root, "journal": journal,
                "seed": mix(seed, i as u64), "tag": tag, "secs": secs.unwrap_or(0.0),
                "extra": s.extra,
            })
            .to_string();
            let mut cmd = if s.lang == Lang::Sdk && use_sdk {
                let mut c = Command::new("node");
                c.arg(crash_dir().join("sdk_worker.mjs"));
                c
            } else {
                let mut c = Command::new(python());
                c.arg(crash_dir().join("worker.py"));
                c
            };
            let out = std::fs::File::create(&output).unwrap();
            cmd.arg(cfg)
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out);
            let child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", s.label));
            procs.push(Proc {
                spec: s.clone(),
                child: Some(child),
                journal,
                output,
                status: None,
            });
        }
        Workers { procs }
    }

    /// Waits until every worker has journaled that it is ready.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let end = Instant::now() + timeout;
        loop {
            let mut all = true;
            for p in &mut self.procs {
                let ready = read_journal(&p.journal)
                    .iter()
                    .any(|v| v.get("ready").is_some());
                if ready {
                    continue;
                }
                all = false;
                if let Some(c) = &mut p.child
                    && let Ok(Some(st)) = c.try_wait()
                {
                    return Err(format!(
                        "worker {} exited ({st}) before it was ready:\n{}",
                        p.spec.label,
                        std::fs::read_to_string(&p.output).unwrap_or_default()
                    ));
                }
            }
            if all {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(format!("workers not ready after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `timeout` for every worker to exit on its own; kills the rest. Returns the
    /// labels of the workers that had to be killed.
    pub fn wait_exit(&mut self, timeout: Duration) -> Vec<String> {
        let end = Instant::now() + timeout;
        let mut killed = Vec::new();
        for p in &mut self.procs {
            let Some(c) = &mut p.child else { continue };
            loop {
                match c.try_wait() {
                    Ok(Some(st)) => {
                        p.status = Some(st);
                        break;
                    }
                    Ok(None) if Instant::now() < end => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    _ => {
                        let _ = c.kill();
                        p.status = c.wait().ok();
                        killed.push(p.spec.label.clone());
                        break;
                    }
                }
            }
            p.child = None;
        }
        killed
    }

    pub fn outputs(&self) -> String {
        self.procs
            .iter()
            .map(|p| {
                format!(
                    "--- {} ({:?}):\n{}\n(journal's end)\n{}",
                    p.spec.label,
                    p.status,
                    tail(
                        &std::fs::read_to_string(&p.output).unwrap_or_default(),
                        1500
                    ),
                    tail(
                        &std::fs::read_to_string(&p.journal).unwrap_or_default(),
                        600
                    )
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if let Some(c) = &mut p.child {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

pub fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Makes this test process the reaper of orphaned descendants, so a daemon it SIGKILLs
/// (daemonized by `redbfs mount`) can be waited for and does not linger as a zombie.
pub fn become_subreaper() {
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// The pid of the daemon serving `mnt`, from `redbfs status --json`.
pub fn daemon_pid(mnt: &Path) -> i32 {
    let out = common::redbfs(&["status", mnt.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "redbfs status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("status --json is JSON");
    v["pid"].as_i64().expect("status has a pid") as i32
}

/// SIGKILLs the daemon and waits until it is gone.
pub fn kill_daemon(pid: i32) {
    // SAFETY: plain kill(2)/waitpid(2) on the pid of the daemon this test started.
    unsafe {
        assert_eq!(libc::kill(pid, libc::SIGKILL), 0, "kill {pid}");
        let mut st = 0;
        if libc::waitpid(pid, &mut st, 0) == pid {
            return;
        }
    }
    // Not our child (no subreaper): wait for it to die.
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return,
            Ok(s)
                if s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z')) =>
            {
                return;
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    panic!("daemon {pid} did not die after SIGKILL");
}

/// `redbfs check STORE`: Ok when clean, the findings otherwise.
pub fn check_store(store: &Path) -> Result<(), String> {
    let out = common::redbfs(&["check", store.to_str().unwrap()]);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "redbfs check {} exited {}:\n{}{}",
            store.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The threads of process `pid` still alive, with state, name and wait channel.
pub fn threads_of(pid: i32) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .map(|e| {
            let p = e.path();
            let st = std::fs::read_to_string(p.join("status")).unwrap_or_default();
            let state = st
                .lines()
                .find(|l| l.starts_with("State:"))
                .unwrap_or("")
                .to_string();
            format!(
                "tid {} {:?} {} wchan {}",
                e.file_name().to_string_lossy(),
                std::fs::read_to_string(p.join("comm"))
                    .unwrap_or_default()
                    .trim(),
                state.trim_start_matches("State:").trim(),
                std::fs::read_to_string(p.join("wchan")).unwrap_or_default()
            )
        })
        .collect()
}

/// `redbfs unmount` through the harness, then `redbfs check`. The unmount must return only
/// once the daemon has closed the store; when check finds the store still held, this waits
/// for it (up to 30 s) so the run can go on, and returns the violation (with what the
/// daemon's threads were doing) as `Ok(Some(..))` for the caller to fail on.
pub fn unmount_and_check(tm: &mut TestMount) -> Result<Option<String>, String> {
    let pid = daemon_pid(&tm.mountpoint);
    tm.unmount();
    let mut violation = None;
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        match check_store(&tm.store) {
            Err(e) if e.contains("already open") => {
                if violation.is_none() {
                    violation = Some(format!(
                        "`redbfs unmount` returned while the daemon (pid {pid}) still held the store: `redbfs check` right after it said {:?}; the daemon's threads then: {:?}",
                        e.lines().nth(1).unwrap_or(&e),
                        threads_of(pid)
                    ));
                }
                if Instant::now() > end {
                    return Err(format!("{}; still held after 30 s", violation.unwrap()));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            other => {
                other?;
                return Ok(violation);
            }
        }
    }
}

/// After a SIGKILL: mount again (which must clear the stale mount), unmount, check the store,
/// mount again. `Ok(Some(..))` reports an unmount that returned before the store was closed
/// (see `unmount_and_check`).
pub fn recover(tm: &mut TestMount) -> Result<Option<String>, String> {
    let t = Instant::now();
    let out = common::redbfs(&[
        "mount",
        tm.mountpoint.to_str().unwrap(),
        "--store",
        tm.store.to_str().unwrap(),
        "--log-file",
        tm.log.to_str().unwrap(),
    ]);
    if !out.status.success() {
        return Err(format!(
            "mount after the kill failed (stale mount recovery): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let t_mount = t.elapsed();
    let t = Instant::now();
    let violation = unmount_and_check(tm)?;
    let t_check = t.elapsed();
    let t = Instant::now();
    tm.mount();
    RECOVERY.with(|r| {
        *r.borrow_mut() = format!(
            "mount after kill {:.1} s, unmount+check {:.1} s, mount {:.1} s",
            t_mount.as_secs_f64(),
            t_check.as_secs_f64(),
            t.elapsed().as_secs_f64()
        )
    });
    Ok(violation)
}

thread_local! {
    /// How long the steps of the last `recover` took, for the progress lines.
    pub static RECOVERY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Lines of the daemon log that must never appear: panics and errors.
pub fn log_problems(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("panicked") || l.contains(" ERROR "))
        .map(str::to_string)
        .collect()
}
