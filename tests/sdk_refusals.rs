//! What the model reads when redbfs refuses: the stock `BetaLocalFilesystemMemoryTool` of
//! `@anthropic-ai/sdk` 1.14.0 (TypeScript, run on Node) and of `anthropic` 2.14.0 (Python),
//! pinned in `tests/clients`, driven on a real mount into each refusal of SEMANTICS.md, "Names
//! and limits" (invalid UTF-8 excepted: a JSON tool input cannot carry it).
//!
//! The cases live in `tests/clients/refusals.json`: the mount flags that provoke the refusal,
//! what is in the store beforehand (written through the mount by this test), the one memory
//! command the model sends, the errno, the rule and path the daemon must log, and what the tool
//! itself leaves behind before the refused call (its `mkdir -p` of parents, or the empty file its
//! `open(O_CREAT|O_EXCL)` made before the refused write). For each case and each SDK, on a fresh
//! mount, the test checks that
//!
//! - the command failed (`is_error`), and its text names the errno: Node's raw error
//!   `Error: EINVAL: invalid argument, open '...'`, Python's `OSError(22, 'Invalid argument')`
//!   (the runner renders a non-`ToolError` exception with `repr`, which carries the errno number
//!   and strerror but no path). Where Node itself reports another errno than the daemon answered
//!   (its recursive mkdir), the case says which and why (`typescript_reads`);
//! - nothing was written: the tree under the mount (names, kinds, contents) and the store's own
//!   counts (`redbfs stats`) are what they were, plus exactly the case's `leaves`; once the
//!   kernel has released the runner's files nothing is open or buffered, the store is not
//!   poisoned, and the same tree is there after a remount;
//! - the daemon logged the refusal as a warn line naming the rule, the refused path (for the
//!   tool's atomic rewrite, its `.tmp-<pid>-<uuid>` file, whose pid is the runner's) and the
//!   errno. The tool may make several syscalls on a refused name (realpath, stat, open), and each
//!   is refused and logged, so a command may log that line more than once; every warn or error
//!   line the command caused must be that line.
//!
//! What each tool returned is recorded, the mount path masked as `<ROOT>` and the tool's temporary
//! file names as `.tmp-<pid>-<uuid>`, in the golden file `tests/clients/refusals.expected.txt`,
//! which the test compares against, so a change in what the model reads is caught. After an
//! intended change, regenerate it and review the diff:
//!
//!     REDBFS_BLESS=1 cargo test --test sdk_refusals
//!
//! The clients must be installed first with `bash tests/clients/setup.sh`; without them this test
//! fails and says so.

mod common;

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{TestMount, fuse_available, redbfs};
use serde_json::Value;

const SETUP: &str = "bash tests/clients/setup.sh";
const CASES: &str = "refusals.json";
const GOLDEN: &str = "refusals.expected.txt";
const BLESS: &str = "REDBFS_BLESS";

/// The errnos a refusal can carry, by the name SEMANTICS.md and Node's messages use, and
/// `ENOENT`, which Node's recursive mkdir reports in place of the refusal it met.
const ERRNOS: &[(&str, i32)] = &[
    ("EINVAL", libc::EINVAL),
    ("ENAMETOOLONG", libc::ENAMETOOLONG),
    ("ELOOP", libc::ELOOP),
    ("EFBIG", libc::EFBIG),
    ("ENOSPC", libc::ENOSPC),
    ("EDQUOT", libc::EDQUOT),
    ("ENOENT", libc::ENOENT),
];

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

fn errno_number(name: &str) -> i32 {
    ERRNOS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("{CASES}: unknown errno {name}"))
        .1
}

/// The C library's text for `errno`, as Python's `OSError` carries it ("Invalid argument").
fn strerror(errno: i32) -> String {
    let text = std::io::Error::from_raw_os_error(errno).to_string();
    let suffix = format!(" (os error {errno})");
    text.strip_suffix(&suffix).unwrap_or(&text).to_string()
}

/// A stock SDK memory tool client.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    Node,
    Python,
}

impl Client {
    const ALL: [Client; 2] = [Client::Node, Client::Python];

    fn name(self) -> &'static str {
        match self {
            Client::Node => "typescript (@anthropic-ai/sdk 1.14.0)",
            Client::Python => "python (anthropic 2.14.0)",
        }
    }

    /// Panics, naming the setup command, unless the pinned SDK is installed.
    fn require(self) {
        let dir = clients_dir();
        match self {
            Client::Node => {
                let version = dir.join("node_modules/@anthropic-ai/sdk/version.js");
                let text = std::fs::read_to_string(&version).unwrap_or_else(|e| {
                    panic!(
                        "{} is missing ({e}): the Node SDK is not installed; run `{SETUP}` first",
                        version.display()
                    )
                });
                assert!(
                    text.contains("'1.14.0'"),
                    "{} is not @anthropic-ai/sdk 1.14.0; run `{SETUP}`",
                    version.display()
                );
            }
            Client::Python => {
                let python = dir.join(".venv/bin/python");
                let out = Command::new(&python)
                    .args(["-c", "import anthropic; print(anthropic.__version__)"])
                    .output();
                let version = out
                    .as_ref()
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                    .unwrap_or_default();
                assert!(
                    version == "2.14.0",
                    "{} does not run anthropic 2.14.0 (got {version:?}); run `{SETUP}` first",
                    python.display()
                );
            }
        }
    }

    /// `run_session.mjs` or `run_session.py` on `base` with `session`.
    fn runner(self, base: &Path, session: &Path) -> Command {
        let dir = clients_dir();
        let mut cmd = match self {
            Client::Node => {
                let mut c = Command::new("node");
                c.arg(dir.join("run_session.mjs"));
                c
            }
            Client::Python => {
                let mut c = Command::new(dir.join(".venv/bin/python"));
                c.arg(dir.join("run_session.py"));
                c
            }
        };
        cmd.arg(base).arg(session).current_dir(&dir);
        cmd
    }
}

/// `{"$repeat": UNIT, "count": N, "before": A, "after": B}` -> A + UNIT*N + B, as the runners
/// expand it; a string as it is.
fn expand(v: &Value) -> String {
    if let Some(s) = v.as_str() {
        return s.to_string();
    }
    let unit = v["$repeat"].as_str().expect("a string or a $repeat object");
    let count = v["count"].as_u64().expect("$repeat count") as usize;
    format!(
        "{}{}{}",
        v["before"].as_str().unwrap_or(""),
        unit.repeat(count),
        v["after"].as_str().unwrap_or("")
    )
}

/// Where the daemon's warn line must point.
enum LogPath {
    /// The refused path itself.
    Exact(String),
    /// The tool's temporary file `.tmp-<pid>-<uuid>` in this directory (its atomic rewrite).
    TempIn(String),
}

enum Entry {
    Dir(String),
    File(String, Vec<u8>),
}

struct Case {
    id: String,
    refusal: String,
    mount: Vec<String>,
    /// `redbfs quota STORE ARGS...` run after the setup, when set.
    quota: Vec<String>,
    setup: Vec<Entry>,
    input: Value,
    /// The errno the daemon answers (and logs).
    errno: String,
    /// When the TypeScript tool reports another errno than the daemon's: that errno and why.
    typescript_reads: Option<(String, String)>,
    rule: String,
    log_path: LogPath,
    leaves: Vec<Entry>,
    leaves_why: Option<String>,
}

fn load_cases() -> Vec<Case> {
    let path = clients_dir().join(CASES);
    let text = std::fs::read_to_string(&path).expect("read the refusal cases");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("the cases are a JSON list");
    let entries = |v: &Value| -> Vec<Entry> {
        v.as_array()
            .expect("a list of entries")
            .iter()
            .map(|e| match (e.get("dir"), e.get("file")) {
                (Some(d), None) => Entry::Dir(d.as_str().unwrap().to_string()),
                (None, Some(f)) => Entry::File(
                    f.as_str().unwrap().to_string(),
                    e.get("text").map(expand).unwrap_or_default().into_bytes(),
                ),
                _ => panic!("{CASES}: an entry is {{\"dir\": P}} or {{\"file\": P, \"text\"?: T}}"),
            })
            .collect()
    };
    cases
        .iter()
        .map(|c| {
            let log = &c["log"];
            let log_path = match (log.get("path"), log.get("temp_in")) {
                (Some(p), None) => LogPath::Exact(expand(p)),
                (None, Some(d)) => LogPath::TempIn(d.as_str().unwrap().to_string()),
                _ => panic!("{CASES}: log holds either \"path\" or \"temp_in\""),
            };
            let input: serde_json::Map<String, Value> = c["input"]
                .as_object()
                .expect("input")
                .iter()
                .map(|(k, v)| {
                    let v = if v.is_object() {
                        Value::String(expand(v))
                    } else {
                        v.clone()
                    };
                    (k.clone(), v)
                })
                .collect();
            Case {
                id: c["id"].as_str().expect("id").to_string(),
                refusal: c["refusal"].as_str().expect("refusal").to_string(),
                mount: c["mount"]
                    .as_array()
                    .expect("mount")
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect(),
                quota: c
                    .get("quota")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect(),
                setup: entries(&c["setup"]),
                input: Value::Object(input),
                errno: c["errno"].as_str().expect("errno").to_string(),
                typescript_reads: c.get("typescript_reads").map(|t| {
                    (
                        t["errno"]
                            .as_str()
                            .expect("typescript_reads errno")
                            .to_string(),
                        t["why"].as_str().expect("typescript_reads why").to_string(),
                    )
                }),
                rule: log["rule"].as_str().expect("log rule").to_string(),
                log_path,
                leaves: entries(&c["leaves"]),
                leaves_why: c["leaves_why"].as_str().map(str::to_string),
            }
        })
        .collect()
}

/// What a tree entry is, for the before/after comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
    Other,
}

/// Every entry under `root` (not `root` itself), by path relative to it.
fn tree(root: &Path) -> BTreeMap<Vec<u8>, Node> {
    common::walk_tree(root)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|(rel, w)| {
            let node = match w.content {
                Some(c) => Node::File(c),
                None if w.meta.is_dir() => Node::Dir,
                None => Node::Other,
            };
            (rel.as_os_str().as_bytes().to_vec(), node)
        })
        .collect()
}

fn show_tree(t: &BTreeMap<Vec<u8>, Node>) -> String {
    t.iter()
        .map(|(k, v)| {
            let what = match v {
                Node::Dir => "dir".to_string(),
                Node::File(c) => format!("file, {} bytes", c.len()),
                Node::Other => "neither file nor directory".to_string(),
            };
            format!("    {:?}: {what}", String::from_utf8_lossy(k))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `redbfs <cmd> MOUNTPOINT --json`, parsed.
fn store_json(cmd: &str, m: &TestMount) -> Value {
    let out = redbfs(&[cmd, m.mountpoint.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "redbfs {cmd} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("redbfs --json prints JSON")
}

/// The store's own counts: files, directories, content bytes.
fn counts(m: &TestMount) -> [u64; 3] {
    let s = store_json("stats", m);
    ["files", "dirs", "content_bytes"].map(|k| s[k].as_u64().unwrap_or_else(|| panic!("{k}: {s}")))
}

/// The text as one line of ASCII: a JSON string literal with every non-ASCII character escaped
/// (so an invisible U+202E in a message shows as `\u202e`).
fn ascii_json(s: &str) -> String {
    let json = serde_json::to_string(s).unwrap();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out += &format!("\\u{u:04x}");
            }
        }
    }
    out
}

/// `input` as one line of ASCII JSON, keys in a fixed order.
fn show_input(input: &Value) -> String {
    let obj = input.as_object().unwrap();
    let mut keys: Vec<&String> = obj.keys().collect();
    let rank = |k: &str| {
        ["command", "path", "old_path", "new_path"]
            .iter()
            .position(|p| *p == k)
            .unwrap_or(4)
    };
    keys.sort_by_key(|k| (rank(k), k.as_str()));
    let fields: Vec<String> = keys
        .iter()
        .map(|k| {
            let v = match &obj[k.as_str()] {
                Value::String(s) if s.len() > 80 && k.as_str() != "path" => {
                    format!("<{} bytes>", s.len())
                }
                Value::String(s) => ascii_json(s),
                other => other.to_string(),
            };
            format!("{}: {v}", ascii_json(k))
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// Replaces the pid and uuid of the tool's temporary file names (`.tmp-<pid>-<uuid>`).
fn mask_temp_names(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find(".tmp-") {
        out += &rest[..at + 5];
        rest = &rest[at + 5..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let uuid = rest[digits..]
            .strip_prefix('-')
            .map(|r| {
                r.bytes()
                    .take_while(|b| b.is_ascii_hexdigit() || *b == b'-')
                    .count()
            })
            .unwrap_or(0);
        if digits > 0 && uuid == 36 {
            out += "<pid>-<uuid>";
            rest = &rest[digits + 1 + 36..];
        }
    }
    out + rest
}

/// Mounts a fresh store with the case's flags, writes its setup through the mount, runs the
/// case's one command with `client` and checks everything but the golden text. Returns what the
/// tool returned to the model and the number of refusal lines the daemon logged; problems go to
/// `problems`.
fn run_case(case: &Case, client: Client, problems: &mut Vec<String>) -> Option<(String, usize)> {
    let args: Vec<&str> = case.mount.iter().map(String::as_str).collect();
    let mut m = TestMount::with_args(&args);
    let what = format!("{} / {}", case.id, client.name());
    let mut fail = |msg: String| problems.push(format!("{what}: {msg}"));

    // The tool's root exists beforehand, so its own `mkdir memories` changes nothing.
    std::fs::create_dir(m.path("memories")).expect("mkdir memories");
    for e in &case.setup {
        match e {
            Entry::Dir(d) => std::fs::create_dir_all(m.path(d)).expect("setup dir"),
            Entry::File(f, text) => std::fs::write(m.path(f), text).expect("setup file"),
        }
    }
    if !case.quota.is_empty() {
        let mut args = vec!["quota", m.store.to_str().unwrap()];
        args.extend(case.quota.iter().map(String::as_str));
        let out = redbfs(&args);
        assert!(out.status.success(), "redbfs quota: {out:?}");
    }
    let before = tree(&m.mountpoint);
    let before_counts = counts(&m);
    let mut want = before.clone();
    let mut want_counts = before_counts;
    for e in &case.leaves {
        let (path, node) = match e {
            Entry::Dir(d) => (d, Node::Dir),
            Entry::File(f, _) => (f, Node::File(Vec::new())),
        };
        // [files, dirs, content bytes]: what the tool leaves is empty.
        want_counts[if node == Node::Dir { 1 } else { 0 }] += 1;
        want.insert(path.as_bytes().to_vec(), node);
    }

    let session = m.dir.path().join(format!("{}.json", case.id));
    let step = serde_json::json!([{"note": case.refusal, "ok": false, "input": case.input}]);
    std::fs::write(&session, step.to_string()).expect("write the session");
    let log_start = m.log_text().len();
    let child = client
        .runner(&m.mountpoint, &session)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the session runner");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for the runner");
    if !out.status.success() {
        let log = &m.log_text()[log_start..];
        fail(format!(
            "the runner failed: {}\nstderr:\n{}\nstdout:\n{}\ndaemon log:\n{log}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
        return None;
    }
    let stdout = String::from_utf8(out.stdout).expect("UTF-8 runner output");
    let lines: Vec<&str> = stdout.lines().collect();
    let [line] = lines[..] else {
        fail(format!("expected one output line, got:\n{stdout}"));
        return None;
    };
    let v: Value = serde_json::from_str(line).expect("the output line is JSON");
    let Some(content) = v["content"].as_str() else {
        fail(format!("the content is not text: {}", v["content"]));
        return None;
    };
    let (is_error, content) = (
        v["is_error"].as_bool().expect("is_error"),
        content.to_string(),
    );

    // The command failed, naming the errno.
    if !is_error {
        fail(format!("the command succeeded: {content}"));
    }
    let name = match (&case.typescript_reads, client) {
        (Some((reads, _)), Client::Node) => reads.as_str(),
        _ => case.errno.as_str(),
    };
    let errno = errno_number(name);
    let names_errno = match client {
        // libuv has no name for EDQUOT: Node reports "Unknown system error -122" (the model
        // reads that, recorded in the golden file).
        Client::Node if errno == libc::EDQUOT => {
            content.starts_with(&format!("Error: Unknown system error -{errno}: "))
        }
        Client::Node => content.starts_with(&format!("Error: {name}: ")),
        Client::Python => {
            content.starts_with("OSError(")
                && content.contains(&format!("({errno}, '{}')", strerror(errno)))
        }
    };
    if !names_errno {
        fail(format!("the text does not name {name}: {content}"));
    }

    // The kernel releases the runner's files after it exits, asynchronously: wait for that,
    // then nothing may be left buffered (content that a last release would commit).
    let mut status = store_json("status", &m);
    for _ in 0..500 {
        if status["open_handles"] == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        status = store_json("status", &m);
    }
    for (key, ok) in [
        ("open_handles", Value::from(0)),
        ("buffered_bytes", Value::from(0)),
        ("poisoned", Value::from(false)),
    ] {
        if status[key] != ok {
            fail(format!("status {key} is {}, expected {ok}", status[key]));
        }
    }

    // Nothing was written beyond what the tool itself made before the refused call.
    let after = tree(&m.mountpoint);
    if after != want {
        fail(format!(
            "the tree changed\n  expected:\n{}\n  found:\n{}",
            show_tree(&want),
            show_tree(&after)
        ));
    }
    let after_counts = counts(&m);
    if after_counts != want_counts {
        fail(format!(
            "the store's [files, dirs, content bytes] are {after_counts:?}, expected \
             {want_counts:?} (before the command: {before_counts:?})"
        ));
    }
    let log = m.log_text()[log_start..].to_string();
    m.remount();
    let remounted = tree(&m.mountpoint);
    if remounted != want {
        fail(format!(
            "after a remount the tree is\n{}\n  expected:\n{}",
            show_tree(&remounted),
            show_tree(&want)
        ));
    }

    // The daemon logged the refusal: the rule, the refused path and the errno, on every warn
    // line the command caused (nothing else at warn or error level).
    let errno = errno_number(&case.errno);
    let quoted = match &case.log_path {
        LogPath::Exact(p) => format!("{p:?}"),
        LogPath::TempIn(dir) => {
            let full = format!("{dir}/.tmp-{pid}-");
            let q = format!("{full:?}");
            q[..q.len() - 1].to_string() // without the closing quote
        }
    };
    let refusals: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("refused: "))
        .collect();
    let others: Vec<&str> = log
        .lines()
        .filter(|l| (l.contains(" WARN ") && !l.contains("refused: ")) || l.contains(" ERROR "))
        .collect();
    if !others.is_empty() {
        fail(format!(
            "the command also logged what is not its refusal:\n  {}\nwhole log of the \
             command:\n{log}",
            others.join("\n  ")
        ));
    }
    if refusals.is_empty() {
        fail(format!(
            "no warn line `refused: {}` naming {quoted} in the daemon log:\n{log}",
            case.rule
        ));
    }
    for l in &refusals {
        let mut missing = Vec::new();
        if !l.contains(&format!("refused: {} ", case.rule)) {
            missing.push(format!("the rule `{}`", case.rule));
        }
        if !l.contains(&quoted) {
            missing.push(format!("the refused path {quoted}"));
        }
        if !l.contains(&format!("errno={errno}")) {
            missing.push(format!("errno={errno}"));
        }
        if !missing.is_empty() {
            fail(format!(
                "a refusal line does not name {}:\n  {l}",
                missing.join(", ")
            ));
        }
    }
    let n = refusals.len();
    Some((content, n))
}

/// The golden file's text for the recorded runs.
fn golden_text(cases: &[Case], runs: &BTreeMap<(String, &'static str), String>) -> String {
    let mut out = String::from(
        "# What the stock SDK memory tools return to the model when redbfs refuses.\n\
         # Written by tests/sdk_refusals.rs from tests/clients/refusals.json; after an intended\n\
         # change, regenerate with `REDBFS_BLESS=1 cargo test --test sdk_refusals`.\n\
         # Messages are JSON strings, non-ASCII escaped; the mount is <ROOT>.\n",
    );
    for case in cases {
        let errno = errno_number(&case.errno);
        out += &format!("\n## {}: {}\n", case.id, ascii_json(&case.refusal));
        out += &format!(
            "mount: redbfs mount{}\n",
            if case.mount.is_empty() {
                " (defaults)".to_string()
            } else {
                format!(" {}", case.mount.join(" "))
            }
        );
        if !case.quota.is_empty() {
            out += &format!("quota: redbfs quota STORE {}\n", case.quota.join(" "));
        }
        out += &format!("input: {}\n", show_input(&case.input));
        out += &format!(
            "daemon errno: {} ({errno}, {})\n",
            case.errno,
            strerror(errno)
        );
        if let Some((reads, why)) = &case.typescript_reads {
            out += &format!("the typescript tool reports {reads} instead: {why}\n");
        }
        for client in Client::ALL {
            let text = runs
                .get(&(case.id.clone(), client.name()))
                .map(|c| ascii_json(c))
                .unwrap_or_else(|| "(no result)".to_string());
            out += &format!("{}: {text}\n", client.name());
        }
        let leaves: Vec<String> = case
            .leaves
            .iter()
            .map(|e| match e {
                Entry::Dir(d) => format!("{d}/ (empty directory)"),
                Entry::File(f, _) => format!("{f} (empty file)"),
            })
            .collect();
        out += &format!(
            "left behind by the tool: {}\n",
            if leaves.is_empty() {
                "nothing".to_string()
            } else {
                format!(
                    "{} -- {}",
                    leaves.join(", "),
                    case.leaves_why.as_deref().unwrap_or("")
                )
            }
        );
    }
    out
}

#[test]
fn each_refusal_as_both_sdk_tools_report_it() {
    if !fuse_available() {
        return;
    }
    for client in Client::ALL {
        client.require();
    }
    let cases = load_cases();
    let mut problems = Vec::new();
    let mut runs = BTreeMap::new();
    let mut summary = Vec::new();
    for case in &cases {
        for client in Client::ALL {
            if let Some((content, lines)) = run_case(case, client, &mut problems) {
                summary.push(format!(
                    "{:<28} {:<40} {lines} refusal line(s)",
                    case.id,
                    client.name()
                ));
                runs.insert((case.id.clone(), client.name()), mask_temp_names(&content));
            }
        }
    }
    eprintln!("{}", summary.join("\n"));

    let golden_path = clients_dir().join(GOLDEN);
    let got = golden_text(&cases, &runs);
    if std::env::var(BLESS).as_deref() == Ok("1") {
        std::fs::write(&golden_path, &got).expect("write the golden file");
        eprintln!("{BLESS}=1: wrote {}", golden_path.display());
    } else {
        let want = std::fs::read_to_string(&golden_path).unwrap_or_default();
        if got != want {
            let actual = Path::new(env!("CARGO_TARGET_TMPDIR")).join(GOLDEN);
            std::fs::write(&actual, &got).expect("write the actual text");
            let first = got
                .lines()
                .zip(want.lines())
                .position(|(g, w)| g != w)
                .unwrap_or(got.lines().count().min(want.lines().count()));
            problems.push(format!(
                "what the model reads differs from {} at line {}:\n  expected: {}\n  got:      {}\n\
                 (all of it: {}; `diff` them, and if the change is intended, run \
                 `{BLESS}=1 cargo test --test sdk_refusals`)",
                golden_path.display(),
                first + 1,
                want.lines().nth(first).unwrap_or("(end of file)"),
                got.lines().nth(first).unwrap_or("(end of file)"),
                actual.display()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}

/// Not a FUSE test: guards the case file. ASCII only, unique ids, and every errno of SEMANTICS.md,
/// "Names and limits", has a case, except `EILSEQ` (invalid UTF-8 cannot reach a tool through
/// JSON).
#[test]
fn refusal_cases_cover_every_documented_errno() {
    let text = std::fs::read_to_string(clients_dir().join(CASES)).unwrap();
    assert!(
        text.is_ascii(),
        "{CASES} must be ASCII (write Unicode as \\u escapes)"
    );
    let cases = load_cases();
    let mut ids: Vec<&str> = cases.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "{CASES}: case ids must be unique");

    let semantics =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("SEMANTICS.md"))
            .unwrap();
    let section = semantics
        .split("## Names and limits")
        .nth(1)
        .expect("SEMANTICS.md has a section \"Names and limits\"");
    let section = section.split("\n## ").next().unwrap();
    let mut documented: Vec<&str> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.len() > 2 && w.starts_with('E') && w.bytes().all(|b| b.is_ascii_uppercase()))
        .collect();
    documented.sort_unstable();
    documented.dedup();
    assert!(
        documented.contains(&"EINVAL") && documented.contains(&"ENOSPC"),
        "could not read the errnos of SEMANTICS.md: {documented:?}"
    );
    for errno in documented {
        if errno == "EILSEQ" {
            continue;
        }
        assert!(
            cases.iter().any(|c| c.errno == errno),
            "SEMANTICS.md documents {errno} for a name or limit; {CASES} has no case for it"
        );
    }
    for case in &cases {
        errno_number(&case.errno);
        assert!(
            case.input["command"].is_string(),
            "{}: input has no command",
            case.id
        );
    }
}
