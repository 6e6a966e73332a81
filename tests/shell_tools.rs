//! Stock shell tools on the mount behave as on a local directory: the same small tree (nested
//! directories, Unicode names, a dot-file, an empty file, an empty directory, a 1 MiB file,
//! fixed modes and fixed nanosecond mtimes) is built on a fresh mount and in a directory on the
//! local disk, each tool runs in both with the tree's parent as working directory, and the
//! outcomes are compared: exit status, stderr, and stdout with the root path masked. Where the
//! output order follows readdir order (find, grep -r, du -a), lines are sorted first; where it
//! holds dates or inode numbers (ls -la), only names, modes, link counts and sizes are compared.
//! du and df report allocation, which legitimately differs from ext4: they must succeed and
//! report sane numbers. After tools that change the tree, the trees are walked and compared
//! (names, kinds, modes, sizes, link counts, contents; mtimes where the tool preserves them).
//!
//! `REDBFS_SHELL_AGAINST=DIR` compares against a plain directory instead of a mount (checks the
//! harness itself).

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Both sides: the root on the local disk and the root on the mount (or a plain directory).
struct Pair {
    mount: Option<common::TestMount>,
    _local_dir: tempfile::TempDir,
    _other_dir: Option<tempfile::TempDir>,
    local: PathBuf,
    other: PathBuf,
}

impl Pair {
    fn new() -> Option<Pair> {
        let local_dir = tempfile::Builder::new()
            .prefix("redbfs-shell-local-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("local tempdir");
        let local = local_dir.path().to_path_buf();
        if let Ok(dir) = std::env::var("REDBFS_SHELL_AGAINST") {
            std::fs::create_dir_all(&dir).unwrap();
            let other_dir = tempfile::Builder::new()
                .prefix("shell-")
                .tempdir_in(&dir)
                .unwrap();
            let other = other_dir.path().to_path_buf();
            return Some(Pair {
                mount: None,
                _local_dir: local_dir,
                _other_dir: Some(other_dir),
                local,
                other,
            });
        }
        if !common::fuse_available() {
            return None;
        }
        let m = common::TestMount::new();
        let other = m.mountpoint.clone();
        Some(Pair {
            mount: Some(m),
            _local_dir: local_dir,
            _other_dir: None,
            local,
            other,
        })
    }

    /// Builds the same tree on both sides.
    fn with_tree() -> Option<Pair> {
        let pair = Pair::new()?;
        build_tree(&pair.local);
        build_tree(&pair.other);
        Some(pair)
    }

    /// Runs a tool in both roots and asserts the same status, stdout and stderr (root masked).
    fn same(&self, prog: &str, args: &[&str]) -> Run {
        let a = run(&self.local, prog, args);
        let b = run(&self.other, prog, args);
        assert_same(&self.describe(prog, args), &a, &b, self);
        b
    }

    /// As `same`, with stdout compared as a sorted set of lines.
    fn same_sorted(&self, prog: &str, args: &[&str]) -> Run {
        let mut a = run(&self.local, prog, args);
        let mut b = run(&self.other, prog, args);
        a.stdout = sort_lines(&a.stdout);
        b.stdout = sort_lines(&b.stdout);
        assert_same(&self.describe(prog, args), &a, &b, self);
        b
    }

    fn describe(&self, prog: &str, args: &[&str]) -> String {
        format!("`{prog} {}`", args.join(" "))
    }

    /// Asserts that `rel` holds the same tree on both sides.
    fn same_tree(&self, rel: &str, with_mtimes: bool) {
        let a = walk(&self.local.join(rel), with_mtimes);
        let b = walk(&self.other.join(rel), with_mtimes);
        assert_trees(&format!("tree {rel:?}"), &a, &b, self);
    }

    fn log_tail(&self) -> String {
        match &self.mount {
            Some(m) => {
                let log = m.log_text();
                let lines: Vec<&str> = log.lines().collect();
                lines[lines.len().saturating_sub(20)..].join("\n")
            }
            None => String::new(),
        }
    }
}

struct Run {
    status: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

fn replace_bytes(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    if needle.is_empty() {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    out
}

/// Runs `prog args` in `cwd` under a fixed locale and time zone; masks `cwd` in the output.
fn run(cwd: &Path, prog: &str, args: &[&str]) -> Run {
    let out = Command::new(prog)
        .args(args)
        .current_dir(cwd)
        .env("LC_ALL", "C.UTF-8")
        .env("TZ", "UTC")
        .env_remove("GREP_OPTIONS")
        .env_remove("LS_COLORS")
        .output()
        .unwrap_or_else(|e| panic!("run {prog}: {e}"));
    let root = cwd.as_os_str().as_bytes();
    Run {
        status: out.status.code(),
        stdout: replace_bytes(&out.stdout, root, b"<ROOT>"),
        stderr: String::from_utf8_lossy(&replace_bytes(&out.stderr, root, b"<ROOT>")).into_owned(),
    }
}

fn sort_lines(bytes: &[u8]) -> Vec<u8> {
    let mut lines: Vec<&[u8]> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    lines.sort();
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out
}

fn show(bytes: &[u8]) -> String {
    if bytes.len() <= 4000
        && let Ok(s) = std::str::from_utf8(bytes)
    {
        return format!("{s:?}");
    }
    format!("{} bytes (fnv {:016x})", bytes.len(), common::fnv(bytes))
}

fn assert_same(what: &str, a: &Run, b: &Run, pair: &Pair) {
    let mut problems = Vec::new();
    if a.status != b.status {
        problems.push(format!(
            "exit status: local {:?}, mount {:?}",
            a.status, b.status
        ));
    }
    if a.stdout != b.stdout {
        let line_a: Vec<&[u8]> = a.stdout.split(|c| *c == b'\n').collect();
        let line_b: Vec<&[u8]> = b.stdout.split(|c| *c == b'\n').collect();
        let first = line_a.iter().zip(line_b.iter()).position(|(x, y)| x != y);
        let detail = match first {
            Some(i) => format!(
                "first differing line {}: local {}, mount {}",
                i + 1,
                show(line_a[i]),
                show(line_b[i])
            ),
            None => format!(
                "line counts: local {}, mount {}",
                line_a.len(),
                line_b.len()
            ),
        };
        problems.push(format!(
            "stdout differs ({detail})\n  local: {}\n  mount: {}",
            show(&a.stdout),
            show(&b.stdout)
        ));
    }
    if a.stderr != b.stderr {
        problems.push(format!(
            "stderr: local {:?}, mount {:?}",
            a.stderr, b.stderr
        ));
    }
    if !problems.is_empty() {
        panic!(
            "{what} differs on the mount:\n{}\ndaemon log (tail):\n{}",
            problems.join("\n"),
            pair.log_tail()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The tree

/// 1 MiB of deterministic bytes (binary), with one "grep-me" inside.
fn big_content() -> Vec<u8> {
    let mut rng = common::Rng(0x1234_5678_9abc_def0);
    let mut v = Vec::with_capacity(1 << 20);
    while v.len() < 1 << 20 {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v[500_000..500_007].copy_from_slice(b"grep-me");
    v
}

const DIRS: &[(&str, u32)] = &[
    ("tree", 0o755),
    ("tree/docs", 0o755),
    ("tree/docs/nested", 0o755),
    ("tree/docs/nested/deeper", 0o700),
    ("tree/café", 0o700),
    ("tree/日本", 0o755),
    ("tree/empty-dir", 0o750),
];

const FILES: &[(&str, &str, u32)] = &[
    ("tree/docs/notes.md", "alpha\ngrep-me here\nomega\n", 0o600),
    ("tree/docs/日本語.txt", "こんにちは grep-me\n", 0o644),
    ("tree/docs/empty.txt", "", 0o644),
    (
        "tree/docs/nested/deeper/leaf.txt",
        "leaf grep-me\nleaf again grep-me\n",
        0o640,
    ),
    ("tree/café/menu", "crème brûlée\n", 0o644),
    ("tree/café/space name.txt", "a b c\n", 0o444),
    ("tree/日本/🦀.md", "# crab\n", 0o644),
    ("tree/.hidden", "dot file grep-me\n", 0o600),
];

fn set_times(path: &Path, sec: i64, nsec: i64) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let t = libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    };
    let times = [t, t];
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(
        r,
        0,
        "utimensat {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

fn build_tree(root: &Path) {
    for (d, _) in DIRS {
        std::fs::create_dir(root.join(d)).unwrap_or_else(|e| panic!("mkdir {d}: {e}"));
    }
    for (f, content, mode) in FILES {
        std::fs::write(root.join(f), content).unwrap_or_else(|e| panic!("write {f}: {e}"));
        chmod(&root.join(f), *mode);
    }
    std::fs::write(root.join("tree/big.bin"), big_content()).unwrap();
    for (d, mode) in DIRS {
        chmod(&root.join(d), *mode);
    }
    // Fixed times, deepest first so that no later change touches a parent's mtime.
    let mut all: Vec<&str> = DIRS
        .iter()
        .map(|d| d.0)
        .chain(FILES.iter().map(|f| f.0))
        .chain(["tree/big.bin"])
        .collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
    for (i, p) in all.iter().enumerate() {
        set_times(
            &root.join(p),
            1_600_000_000 + i as i64 * 1000,
            123_456_789 + i as i64,
        );
    }
}

#[derive(Debug, PartialEq)]
struct Entry {
    kind: char,
    perm: u32,
    size: u64,
    nlink: u64,
    mtime: Option<(i64, i64)>,
    content_hash: Option<u64>,
}

/// Every entry below `root` (not `root` itself): relative path -> what is compared.
fn walk(root: &Path, with_mtimes: bool) -> BTreeMap<String, Entry> {
    common::walk_tree(root)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|(rel, w)| {
            let md = &w.meta;
            let kind = if md.is_dir() {
                'd'
            } else if md.is_file() {
                'f'
            } else {
                '?'
            };
            let entry = Entry {
                kind,
                perm: md.mode() & 0o7777,
                size: md.size(),
                nlink: md.nlink(),
                mtime: with_mtimes.then(|| (md.mtime(), md.mtime_nsec())),
                content_hash: w.content.as_deref().map(common::fnv),
            };
            (rel.to_string_lossy().into_owned(), entry)
        })
        .collect()
}

fn assert_trees(what: &str, a: &BTreeMap<String, Entry>, b: &BTreeMap<String, Entry>, pair: &Pair) {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("  {k:?}: local {:?}, mount {:?}", a.get(k), b.get(k)))
        .collect();
    if !diffs.is_empty() {
        panic!(
            "{what} differs on the mount:\n{}\ndaemon log (tail):\n{}",
            diffs.join("\n"),
            pair.log_tail()
        );
    }
}

/// Parses `ls -laR --time-style=long-iso` into lines of "mode nlink size name" (dates and the
/// `total` block counts dropped; `..` dropped, as it is outside the compared tree).
fn ls_view(out: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(out);
    let mut v = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with("total ") {
            continue;
        }
        if line.ends_with(':') && !line.starts_with(['-', 'd', 'l']) {
            v.push(line.to_string()); // a directory header of -R
            continue;
        }
        // mode nlink user group size date time name...
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 8, "unexpected ls line {line:?}");
        let name = f[7..].join(" ");
        if name == ".." {
            continue;
        }
        v.push(format!(
            "{} {} {} {} {} {}",
            f[0], f[1], f[2], f[3], f[4], name
        ));
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn ls_la_shows_the_same_names_modes_and_sizes() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    for args in [
        &["-laR", "--time-style=long-iso", "tree"][..],
        &[
            "-la",
            "--time-style=long-iso",
            "tree/docs",
            "tree/café",
            "tree/big.bin",
        ][..],
    ] {
        let a = run(&pair.local, "ls", args);
        let b = run(&pair.other, "ls", args);
        assert_eq!(a.status, Some(0), "local ls failed: {}", a.stderr);
        assert_eq!(
            b.status,
            Some(0),
            "`ls {}` on the mount failed: {}\n{}",
            args.join(" "),
            b.stderr,
            pair.log_tail()
        );
        assert_eq!(a.stderr, b.stderr, "ls stderr");
        let (va, vb) = (ls_view(&a.stdout), ls_view(&b.stdout));
        assert_eq!(
            va,
            vb,
            "`ls {}`: local vs mount (mode nlink user group size name)",
            args.join(" ")
        );
        assert!(
            vb.iter()
                .any(|l| l.contains(" 1048576 ") && l.ends_with("big.bin")),
            "big.bin listed with its size: {vb:?}"
        );
        assert!(
            vb.iter()
                .any(|l| l.starts_with("-rw------- 1 ") && l.ends_with(" 25 notes.md")),
            "notes.md listed with mode 0600 and 25 bytes: {vb:?}"
        );
    }
    // A missing name: same status and message.
    pair.same("ls", &["-la", "tree/missing"]);
}

#[test]
fn cat_reads_the_same_bytes() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    let r = pair.same(
        "cat",
        &[
            "tree/docs/notes.md",
            "tree/big.bin",
            "tree/café/menu",
            "tree/docs/empty.txt",
            "tree/日本/🦀.md",
        ],
    );
    assert_eq!(r.status, Some(0));
    let mut expected = Vec::new();
    expected.extend_from_slice(FILES[0].1.as_bytes());
    expected.extend_from_slice(&big_content());
    expected.extend_from_slice(FILES[4].1.as_bytes());
    expected.extend_from_slice(FILES[6].1.as_bytes());
    assert!(
        r.stdout == expected,
        "cat on the mount returned {}",
        show(&r.stdout)
    );
    // Errors: a missing file and a directory.
    let r = pair.same("cat", &["tree/missing", "tree/docs"]);
    assert_eq!(r.status, Some(1));
}

#[test]
fn cp_r_copies_the_same_tree() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    let r = pair.same("cp", &["-r", "tree", "copy"]);
    assert_eq!(r.status, Some(0), "cp -r failed: {}", r.stderr);
    pair.same_tree("copy", false);
    // The copy holds what the source holds (modes aside: cp -r applies the umask).
    let src = walk(&pair.other.join("tree"), false);
    let dst = walk(&pair.other.join("copy"), false);
    let names = |t: &BTreeMap<String, Entry>| {
        t.iter()
            .map(|(k, e)| (k.clone(), e.kind, e.content_hash))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&src),
        names(&dst),
        "cp -r on the mount: copy differs from the source"
    );
    // Into an existing directory, and a single file over an existing one.
    pair.same("cp", &["-r", "tree", "copy"]);
    pair.same("cp", &["tree/big.bin", "tree/docs/notes.md"]);
    pair.same_tree("", false);
}

#[test]
fn cp_a_succeeds_without_xattrs_and_preserves_modes_and_times() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    let r = pair.same("cp", &["-a", "tree", "archive"]);
    assert_eq!(r.status, Some(0), "cp -a failed: {}", r.stderr);
    assert_eq!(r.stderr, "", "cp -a must be silent");
    pair.same_tree("archive", true);
    // On the mount the copy has the source's modes and nanosecond mtimes.
    let src = walk(&pair.other.join("tree"), true);
    let dst = walk(&pair.other.join("archive"), true);
    assert_trees("cp -a copy vs source on the mount", &src, &dst, &pair);
}

#[test]
fn mv_moves_files_and_directories() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    let steps: &[&[&str]] = &[
        &["tree/docs/notes.md", "tree/café/"], // file across directories
        &["tree/docs", "tree/empty-dir/"],     // directory across directories
        &["tree/café/menu", "tree/.hidden"],   // replaces a file
        &["tree/日本", "tree/empty-dir/docs"], // into an existing directory
        &["tree/empty-dir", "tree/empty-dir/docs/inside"], // into its own subtree: refused
        &["tree/big.bin", "tree/empty-dir/docs/nested"], // 1 MiB file into a directory
        &["tree/missing", "tree/x"],           // missing source: refused
        &["-T", "tree/café", "tree/empty-dir/docs/nested/deeper"], // over a non-empty dir: refused
        &["tree/empty-dir/docs/nested/deeper/leaf.txt", "tree/🦀 leaf"], // to a new Unicode name
        &["-T", "tree/café", "tree/empty-dir/docs/nested/deeper"], // over the now empty dir
    ];
    for args in steps {
        pair.same("mv", args);
        pair.same_tree("", false);
    }
}

#[test]
fn rm_r_removes_trees() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    let r = pair.same("rm", &["tree/café"]);
    assert_eq!(r.status, Some(1), "rm of a directory without -r must fail");
    let r = pair.same("rm", &["-r", "tree/docs"]);
    assert_eq!(r.status, Some(0), "rm -r failed: {}", r.stderr);
    pair.same_tree("", false);
    pair.same("rm", &["-rf", "tree/missing"]);
    let r = pair.same("rm", &["-r", "tree"]);
    assert_eq!(r.status, Some(0), "rm -r failed: {}", r.stderr);
    assert!(
        !pair.other.join("tree").exists(),
        "tree still exists on the mount"
    );
    pair.same_tree("", false);
}

#[test]
fn find_sees_the_same_entries() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    let r = pair.same_sorted(
        "find",
        &["tree", "-printf", "%y %m %s %n %TY-%Tm-%Td %TT %p\n"],
    );
    assert_eq!(r.status, Some(0), "find failed: {}", r.stderr);
    assert_eq!(
        r.stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count(),
        DIRS.len() + FILES.len() + 1
    );
    pair.same_sorted("find", &["tree", "-name", "*.txt"]);
    pair.same_sorted("find", &["tree", "-type", "d", "-empty"]);
    pair.same_sorted("find", &["tree", "-type", "f", "-size", "0"]);
    pair.same_sorted("find", &["tree", "-maxdepth", "1"]);
    pair.same_sorted("find", &["tree", "-newermt", "@1600005000"]);
    pair.same_sorted("find", &["tree", "-perm", "-0600", "-type", "f"]);
    pair.same_sorted("find", &["tree/missing"]);
}

#[test]
fn grep_r_finds_the_same_lines() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    let r = pair.same_sorted("grep", &["-r", "grep-me", "tree"]);
    assert_eq!(r.status, Some(0));
    let text = String::from_utf8_lossy(&r.stdout).into_owned();
    // grep 3.5+ reports a binary match on stderr.
    assert!(
        r.stderr.contains("tree/big.bin: binary file matches"),
        "grep -r must find the binary match: {:?}",
        r.stderr
    );
    assert!(
        text.contains("tree/docs/nested/deeper/leaf.txt:leaf again grep-me"),
        "{text}"
    );
    pair.same_sorted("grep", &["-rl", "grep-me", "tree"]);
    pair.same_sorted("grep", &["-rc", "grep-me", "tree"]);
    pair.same_sorted("grep", &["-r", "--include=*.txt", "-n", "grep-me", "tree"]);
    let r = pair.same_sorted("grep", &["-r", "no such text", "tree"]);
    assert_eq!(r.status, Some(1));
}

/// Parses the first number of the first line (du's output).
fn first_number(out: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(out);
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number in {text:?}"))
}

#[test]
fn du_reports_sane_sizes() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    // Apparent sizes (st_size, directories 4096 on both) are the same.
    let r = pair.same("du", &["-sb", "tree"]);
    assert_eq!(r.status, Some(0));
    let content: u64 =
        FILES.iter().map(|f| f.1.len() as u64).sum::<u64>() + (1 << 20) + DIRS.len() as u64 * 4096;
    assert_eq!(first_number(&r.stdout), content, "du -sb on the mount");
    // Allocation differs from ext4; it must cover the content and stay near it.
    let a = run(&pair.local, "du", &["-s", "tree"]);
    let b = run(&pair.other, "du", &["-s", "tree"]);
    assert_eq!(a.status, Some(0));
    assert_eq!(b.status, Some(0), "du -s on the mount failed: {}", b.stderr);
    assert_eq!(b.stderr, "");
    let kib = first_number(&b.stdout);
    assert!(
        (1024..=1024 + 256).contains(&kib),
        "du -s on the mount reports {kib} KiB for a 1 MiB tree"
    );
    // The same entries, whatever their allocation.
    let names = |r: &Run| {
        let t = String::from_utf8_lossy(&r.stdout).into_owned();
        let mut v: Vec<String> = t
            .lines()
            .map(|l| {
                l.split_once('\t')
                    .map(|x| x.1.to_string())
                    .unwrap_or_default()
            })
            .collect();
        v.sort();
        v
    };
    let a = run(&pair.local, "du", &["-a", "tree"]);
    let b = run(&pair.other, "du", &["-a", "tree"]);
    assert_eq!(b.status, Some(0));
    assert_eq!(
        names(&a),
        names(&b),
        "du -a lists other entries on the mount"
    );
}

#[test]
fn df_reports_the_mount() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    let root = pair.other.to_string_lossy().into_owned();
    let store_len = || {
        pair.mount
            .as_ref()
            .map(|m| std::fs::metadata(&m.store).expect("store file").len())
    };
    let store_before = store_len();
    let out = Command::new("df")
        .args(["-P", "-B1", &root])
        .env("LC_ALL", "C.UTF-8")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "df on the mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("df printed {text:?}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    assert!(f.len() >= 6, "df line {line:?}");
    let (total, used, avail): (u64, u64, u64) = (
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    );
    let mounted_on = f[5..].join(" ");
    let store_after = store_len();
    if let (Some(lo), Some(hi)) = (store_before, store_after) {
        // SEMANTICS.md: without --quota, used is the store file's size (sampled around df).
        let (lo, hi) = (lo.min(hi) / 4096 * 4096, lo.max(hi).div_ceil(4096) * 4096);
        assert!(
            used >= lo && used <= hi,
            "df shows {used} bytes used; the store file holds {lo}..{hi}: {line:?}"
        );
        // Inodes: every entry of the tree (and the root) is counted.
        let i = Command::new("df")
            .args(["-P", "-i", &root])
            .output()
            .unwrap();
        let i = String::from_utf8_lossy(&i.stdout).into_owned();
        let fi: Vec<u64> = i
            .lines()
            .nth(1)
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .take(3)
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        assert!(fi.len() == 3, "df -i printed {i:?}");
        let entries = (DIRS.len() + FILES.len() + 1) as u64;
        assert!(
            fi[1] > entries && fi[0] == fi[1] + fi[2],
            "df -i: {entries} entries in the tree, df says {i:?}"
        );
    }
    if pair.mount.is_some() {
        assert_eq!(
            mounted_on, root,
            "df must report the mount itself: {line:?}"
        );
        let t = Command::new("df").args(["-T", &root]).output().unwrap();
        let t = String::from_utf8_lossy(&t.stdout).into_owned();
        assert!(
            t.lines().nth(1).is_some_and(|l| l
                .split_whitespace()
                .nth(1)
                .is_some_and(|ty| ty.starts_with("fuse"))),
            "df -T: {t}"
        );
    }
    assert!(total > 0, "df total is 0: {line:?}");
    assert!(
        used <= total && avail <= total,
        "df numbers inconsistent: {line:?}"
    );
    assert!(
        used >= 1 << 20,
        "df shows {used} bytes used, but the tree holds a 1 MiB file: {line:?}"
    );
    // The local side, for symmetry.
    let r = run(&pair.local, "df", &["-P", "."]);
    assert_eq!(r.status, Some(0));
}

#[test]
fn tar_c_and_x_round_trip() {
    let Some(pair) = Pair::with_tree() else {
        return;
    };
    // Create: archives written next to the tree must be byte-identical (names sorted; gnu
    // format carries mode, size, uid, gid and whole-second mtime).
    let r = pair.same(
        "tar",
        &["--sort=name", "--format=gnu", "-cf", "tree.tar", "tree"],
    );
    assert_eq!(r.status, Some(0), "tar c failed: {}", r.stderr);
    let a = std::fs::read(pair.local.join("tree.tar")).unwrap();
    let b = std::fs::read(pair.other.join("tree.tar")).unwrap();
    assert!(
        a == b,
        "tar c archives differ: local {}, mount {}",
        show(&a),
        show(&b)
    );
    // Stream to stdout as well.
    pair.same("tar", &["--sort=name", "--format=gnu", "-cf", "-", "tree"]);
    pair.same("tar", &["-tvf", "tree.tar"]);
    // Extract the local archive on both sides: modes, sizes, contents and mtimes come back.
    let archive = pair.local.join("tree.tar").to_string_lossy().into_owned();
    for root in [&pair.local, &pair.other] {
        std::fs::create_dir(root.join("x")).unwrap();
    }
    let r = pair.same("tar", &["-xf", &archive, "-C", "x"]);
    assert_eq!(r.status, Some(0), "tar x failed: {}", r.stderr);
    assert_eq!(r.stderr, "");
    pair.same_tree("x", true);
    // Extracted content equals the source content on the mount.
    let src = walk(&pair.other.join("tree"), false);
    let dst = walk(&pair.other.join("x/tree"), false);
    assert_trees("tar x result vs source on the mount", &src, &dst, &pair);
    // Extracting over the existing files replaces them.
    let r = pair.same("tar", &["-xf", &archive, "-C", "x"]);
    assert_eq!(r.status, Some(0));
    pair.same_tree("x", true);
}

/// `mv` and `cp -a` across filesystems (copy, then unlink) into and out of the mount keep
/// names, modes, sizes, contents and nanosecond mtimes, as they do between two local
/// directories; xattr calls get ENOTSUP and must not make them fail or complain.
#[test]
fn mv_and_cp_a_across_filesystems() {
    let Some(pair) = Pair::new() else {
        return;
    };
    // A source tree outside both roots, one per side (mv consumes it).
    let outside = tempfile::Builder::new()
        .prefix("redbfs-shell-outside-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    for side in ["local", "other"] {
        std::fs::create_dir(outside.path().join(side)).unwrap();
        build_tree(&outside.path().join(side));
    }
    let src = |side: &str| {
        outside
            .path()
            .join(side)
            .join("tree")
            .to_string_lossy()
            .into_owned()
    };
    // In: mv from the local disk into the root (a rename on the local side, a copy into the
    // mount on the other).
    let a = run(&pair.local, "mv", &[&src("local"), "moved-in"]);
    let b = run(&pair.other, "mv", &[&src("other"), "moved-in"]);
    assert_same("`mv <outside>/tree moved-in`", &a, &b, &pair);
    assert_eq!(b.status, Some(0), "mv into the mount failed: {}", b.stderr);
    pair.same_tree("moved-in", true);
    // Out: cp -a and mv from the root to the local disk.
    for side in ["local", "other"] {
        std::fs::create_dir(outside.path().join(format!("out-{side}"))).unwrap();
    }
    let dst = |side: &str, name: &str| {
        outside
            .path()
            .join(format!("out-{side}"))
            .join(name)
            .to_string_lossy()
            .into_owned()
    };
    let a = run(
        &pair.local,
        "cp",
        &["-a", "moved-in", &dst("local", "copied")],
    );
    let b = run(
        &pair.other,
        "cp",
        &["-a", "moved-in", &dst("other", "copied")],
    );
    assert_same("`cp -a moved-in <outside>/copied`", &a, &b, &pair);
    let a = run(&pair.local, "mv", &["moved-in", &dst("local", "moved-out")]);
    let b = run(&pair.other, "mv", &["moved-in", &dst("other", "moved-out")]);
    assert_same("`mv moved-in <outside>/moved-out`", &a, &b, &pair);
    assert_eq!(
        b.status,
        Some(0),
        "mv out of the mount failed: {}",
        b.stderr
    );
    assert!(
        !pair.other.join("moved-in").exists(),
        "mv left the source on the mount"
    );
    for name in ["copied", "moved-out"] {
        let x = walk(&outside.path().join("out-local").join(name), true);
        let y = walk(&outside.path().join("out-other").join(name), true);
        assert_trees(&format!("{name} (copied out of the root)"), &x, &y, &pair);
    }
}
