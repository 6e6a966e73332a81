//! Everything the commands print, in its two forms: for people, and `--json` (one JSON value
//! per command, on stdout, or on stderr where stdout carries data), plus the progress line.
//! Commands hand their answers here; no other file of the CLI prints.
//!
//! Two rules hold for every line: what came from outside (names, paths, process names, a
//! daemon's or a bucket's messages) is printed with control characters escaped (`\x1b`), as
//! `--json` escapes them, so nothing printed can move the cursor or rewrite the screen; and a
//! reader that goes away (`redbfs log STORE | head -1`) ends the command as SIGPIPE ends any
//! other tool, quietly (status 141), never with a panic or an error line.

use std::fmt;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use super::time::fmt_time;
use crate::store::HistoryRecord;

/// How a command prints its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Format {
    Human,
    Json,
}

impl Format {
    /// The form a command's `--json` flag asks for.
    pub fn of(json: bool) -> Format {
        if json { Format::Json } else { Format::Human }
    }
}

/// One line on stdout (`println!` that survives a closed pipe).
macro_rules! outln {
    ($($arg:tt)*) => { line(&mut std::io::stdout().lock(), format_args!($($arg)*)) };
}

/// One line on stderr.
macro_rules! errln {
    ($($arg:tt)*) => { line(&mut std::io::stderr().lock(), format_args!($($arg)*)) };
}

fn line(w: &mut dyn Write, args: fmt::Arguments<'_>) {
    if let Err(e) = w.write_fmt(args).and_then(|()| w.write_all(b"\n")) {
        output_failed(e);
    }
}

/// The end of a command whose output cannot be written: quietly when the reader went away;
/// otherwise (a full disk under a redirection) with the reason and status 1, since the
/// command did less than asked.
fn output_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        reader_gone();
    }
    let _ = writeln!(std::io::stderr(), "redbfs: writing the output: {e}");
    std::process::exit(1)
}

/// Ends the command as SIGPIPE ends any other tool whose reader went away: no message, status
/// 141 (128 + SIGPIPE) to the shell.
pub(super) fn reader_gone() -> ! {
    // SAFETY: restores the default action of SIGPIPE and raises it; nothing runs after.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}

/// Set once stdout's reader has gone away: the command unwinds (removing what it made, as on
/// any error) and then ends through `reader_gone`.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether a write to stdout found its reader gone.
pub(super) fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// Stdout for data written as is (a file, a snapshot, a tar archive, a man page). A closed pipe
/// is an error like any other here, so the command unwinds, and is remembered
/// (`stdout_closed`) so that it ends quietly.
pub(super) struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().write(buf).inspect_err(note_closed)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush().inspect_err(note_closed)
    }
}

fn note_closed(e: &std::io::Error) {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// A field from outside (a name, a path, a process name, a URL) made safe to print: control
/// and invisible characters escaped (`private::escape_controls`), a line break among them.
pub(super) fn shown(s: &str) -> String {
    crate::private::escape_controls(s)
}

/// A message that may quote such fields: escaped line by line, so its own line breaks stay.
fn shown_lines(s: &str) -> String {
    s.split('\n')
        .map(crate::private::escape_controls)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A path, escaped as `shown`; one that is not UTF-8 as `private::escape` shows it (its bytes
/// as `\xNN`, a backslash doubled).
pub(super) fn shown_path(p: &Path) -> String {
    match p.to_str() {
        Some(s) => shown(s),
        None => crate::private::escape(p.as_os_str().as_bytes()),
    }
}

/// A string field of an answer, escaped, or "".
fn text(v: &Value) -> String {
    shown(v.as_str().unwrap_or(""))
}

/// A command that failed: one line on stderr.
pub(super) fn error(e: &str) {
    errln!("redbfs: {}", shown_lines(e));
}

/// What a command that changed something says it did: one line on stderr.
pub(super) fn done(what: &str) {
    errln!("{}", shown_lines(what));
}

/// Data a command writes as is (a file's content, a diff, a snapshot) on stdout.
pub(super) fn data(bytes: &[u8]) -> Result<(), String> {
    Stdout
        .write_all(bytes)
        .and_then(|()| Stdout.flush())
        .map_err(|e| format!("stdout: {e}"))
}

pub(super) fn unmounted(msg: &str) {
    errln!("redbfs: {}", shown_lines(msg));
}

pub(super) fn status(v: &Value, f: Format) {
    if f == Format::Json {
        outln!("{v}");
        return;
    }
    let mp = v["mountpoint"]
        .as_str()
        .map_or("(not mounted)".to_string(), shown);
    outln!("store:      {}", text(&v["store"]));
    outln!("mountpoint: {mp}");
    outln!("format:     {}", v["format"]);
    if let Some(e) = v["store_error"].as_str() {
        outln!(
            "files:      unknown: the store cannot be read ({})",
            shown(e)
        );
    } else {
        outln!("files:      {}", v["files"]);
        outln!("dirs:       {}", v["dirs"]);
        outln!("content:    {} bytes", v["content_bytes"]);
    }
    outln!("store file: {} bytes", v["store_bytes"]);
    if let Some(pid) = v["pid"].as_u64() {
        outln!("daemon pid: {pid}");
        outln!("open files: {}", v["open_handles"]);
        outln!(
            "log:        {} bytes since the last checkpoint (commit {})",
            v["log_bytes"],
            v["commits"]
        );
        if let Some(durable) = v["commit_stats"]["durable_commits"].as_u64() {
            outln!(
                "syncs:      {} fdatasyncs of the log for {durable} durable commits since mount",
                v["commit_stats"]["log_syncs"]
            );
        }
        if let Some(commits) = v["commit_stats"]["commits"].as_u64() {
            outln!(
                "batches:    {} redb commits for {commits} commits since mount",
                v["commit_stats"]["redb_commits"]
            );
        }
        if let (Some(busy), Some(open)) = (
            v["commit_stats"]["writer_busy_ns"].as_u64(),
            v["commit_stats"]["open_ns"].as_u64(),
        ) {
            outln!(
                "writer:     the one write transaction held {:.1} s of {:.1} s since mount ({:.0}%)",
                busy as f64 / 1e9,
                open as f64 / 1e9,
                100.0 * busy as f64 / open.max(1) as f64
            );
        }
        outln!(
            "conflicts:  {} since mount (--lost-updates {})",
            v["conflicts"],
            text(&v["limits"]["lost_updates"])
        );
        for r in v["replicas"].as_array().into_iter().flatten() {
            replica_line(r);
        }
        if v["follower"].is_object() {
            follower_line(&v["follower"]);
        }
        if let Some(why) = v["read_only_why"].as_str() {
            outln!("read-only:  {}", shown(why));
        }
        if v["poisoned"] == true {
            outln!(
                "failed:     a commit or read of the store failed; writes get EIO until \
                 `redbfs unmount` and a new mount recover it"
            );
        }
    }
    for u in v["replica_urls"].as_array().into_iter().flatten() {
        outln!("replica:    {} (ships when mounted)", text(u));
    }
}

/// A follower: the writer's last shipped commit, the follower's, and how far behind it is.
fn follower_line(f: &Value) {
    let behind = f["commits_behind"].as_u64().unwrap_or(0);
    let state = if f["refused"].is_string() {
        "held there: what the replica holds next is refused".to_string()
    } else if behind == 0 && f["error"].is_string() {
        "not known to be up to date".to_string()
    } else if behind == 0 {
        "up to date".to_string()
    } else {
        format!(
            "{behind} commits ({}s) behind",
            f["seconds_behind"].as_f64().unwrap_or(0.0)
        )
    };
    outln!(
        "follows:    {} (generation {}): writer shipped commit {}, follower at {}, {state}",
        text(&f["url"]),
        text(&f["generation"]),
        f["writer_commit"],
        f["follower_commit"]
    );
    if let Some(e) = f["refused"].as_str() {
        outln!("            refused: {}", shown(e));
    } else if let Some(e) = f["error"].as_str() {
        outln!("            cannot follow now: {}", shown(e));
    }
}

/// One replica of a mount: how far behind it is, and why while it is out of reach.
fn replica_line(r: &Value) {
    let behind = r["commits_behind"].as_u64().unwrap_or(0);
    let state = if !r["error"].is_null() {
        format!("{behind} commits behind, failing")
    } else if behind == 0 {
        "up to date".to_string()
    } else {
        format!(
            "{behind} commits ({}s) behind",
            r["seconds_behind"].as_f64().unwrap_or(0.0)
        )
    };
    outln!(
        "replica:    {} at commit {}, {state}",
        text(&r["url"]),
        r["shipped_commit"]
    );
    if let Some(e) = r["error"].as_str() {
        outln!("            unreachable: {}", shown(e));
    }
    if let Some(p) = r["problem"].as_str() {
        outln!("            started a new generation: {}", shown(p));
    }
    if let Some(e) = r["fenced"].as_str() {
        outln!("            {}", shown(e));
    }
}

/// A mount just made: the replicas it ships to.
pub(super) fn replicating(status: &Value) {
    for r in status["replicas"].as_array().into_iter().flatten() {
        errln!("replicating to {}", text(&r["url"]));
    }
}

/// Before an unmount: the replicas that do not hold every commit yet.
pub(super) fn replicas_before_unmount(status: &Value) {
    for r in status["replicas"].as_array().into_iter().flatten() {
        let behind = r["commits_behind"].as_u64().unwrap_or(0);
        if behind > 0 || !r["error"].is_null() {
            errln!(
                "replica {} is {behind} commits behind{}; the daemon makes one last bounded upload",
                text(&r["url"]),
                r["error"]
                    .as_str()
                    .map(|e| format!(" ({})", shown(e)))
                    .unwrap_or_default()
            );
        }
    }
}

/// A follower promoted: the replica it now writes to, from which commit, in which epoch.
pub(super) fn promoted(mp: &std::path::Path, v: &Value) {
    errln!(
        "promoted {}: it writes to replica {} from commit {} on (epoch {}); the previous writer is fenced at its next upload",
        shown(&mp.display().to_string()),
        text(&v["url"]),
        v["commit"],
        v["epoch"]
    );
}

/// After an unmount: what each replica holds; whether every one holds every commit.
pub(super) fn replicas_after_unmount(list: &[crate::replica::ship::Unshipped]) -> bool {
    let mut whole = true;
    for r in list {
        let url = shown(&r.url);
        match r.missing() {
            // Taken over: whatever it holds, this store is no longer the one it follows.
            _ if r.fenced => {
                whole = false;
                let left = r.missing().map_or(String::new(), |m| {
                    format!(
                        "; commits {}..={} stay in this store only (mount it with --replica none to recover them)",
                        m.start(),
                        m.end()
                    )
                });
                errln!(
                    "replica {url} was taken over by another writer: it holds this store's commits up to {} at most, and goes on from there without this store{left}",
                    r.shipped_commit
                );
            }
            None => errln!("replica {url} holds every commit"),
            Some(m) => {
                whole = false;
                errln!(
                    "replica {url} was left without commits {}..={} (the next mount starts a new generation)",
                    m.start(),
                    m.end()
                );
            }
        }
    }
    whole
}

/// After an unmount whose daemon replicated but did not say what its replicas hold.
pub(super) fn replicas_unreported() {
    errln!(
        "the daemon ended without saying what its replicas hold; its log says what it shipped, and `redbfs replica verify URL` what a replica holds"
    );
}

/// `restore`: the replica URLs the restored store no longer ships to.
pub(super) fn replicas_dropped(urls: &[String]) {
    if urls.is_empty() {
        return;
    }
    for u in urls {
        errln!("the restored store no longer ships to replica {}", shown(u));
    }
    let flags: Vec<String> = urls.iter().map(|u| format!("--replica {u}")).collect();
    errln!(
        "(a restored store ships nowhere until told: mount it with {} to continue)",
        shown(&flags.join(" "))
    );
}

/// `replica verify`: one line per finding (on stdout), or `ok` lines; whether all verified.
pub(super) fn replica_verified(
    url: &str,
    list: &[crate::replica::restore::GenerationInfo],
    f: Format,
) -> bool {
    let all = crate::replica::restore::findings(list);
    let sound = all.is_empty() && !list.is_empty();
    if f == Format::Json {
        let found: Vec<String> = all.iter().map(|(g, l)| format!("{g}: {l}")).collect();
        outln!(
            "{}",
            json!({"url": url, "ok": sound, "findings": found, "generations": list})
        );
        return sound;
    }
    if list.is_empty() {
        outln!("{}: no generations", shown(url));
    }
    for g in list {
        let found: Vec<String> = all
            .iter()
            .filter(|f| f.0 == g.generation)
            .map(|(g, l)| format!("{g}: {l}"))
            .collect();
        if found.is_empty() && g.commit.is_none() {
            outln!(
                "{}: an upload that never finished (no manifest)",
                shown(&g.generation)
            );
        } else if found.is_empty() {
            outln!(
                "{}: ok, commits {}..={} verify",
                shown(&g.generation),
                g.commit.unwrap_or(0),
                g.last_commit.unwrap_or(0)
            );
        }
        for line in found {
            outln!("{}", shown(&line));
        }
    }
    sound
}

/// `replica ls`: one line per generation, oldest first.
pub(super) fn replica_ls(url: &str, list: &[crate::replica::restore::GenerationInfo], f: Format) {
    if f == Format::Json {
        outln!("{}", json!({"url": url, "generations": list}));
        return;
    }
    if list.is_empty() {
        outln!("{}: no generations", shown(url));
        return;
    }
    outln!("generation                     started              commits      until");
    for g in list {
        let (Some(first), Some(last)) = (g.commit, g.last_commit) else {
            outln!(
                "{:<30} {}  (cannot be restored from: {})",
                shown(&g.generation),
                fmt_time(g.started_ns),
                shown(g.problem.as_deref().unwrap_or("incomplete"))
            );
            continue;
        };
        outln!(
            "{:<30} {}  {:>5}..{:<5} {}",
            shown(&g.generation),
            fmt_time(g.started_ns),
            first,
            last,
            g.last_time_ns.map(fmt_time).unwrap_or_default()
        );
        if let Some(p) = &g.problem {
            outln!("{:<30} cannot be restored from: {}", "", shown(p));
        }
        if let Some(b) = &g.broken {
            outln!(
                "{:<30} breaks after commit {}: {} (the replica lists up to commit {})",
                "",
                b.last_good_commit,
                shown(
                    &b.segment
                        .as_deref()
                        .map_or(b.reason.clone(), |s| format!("{s}: {}", b.reason))
                ),
                b.listed_commit
            );
        }
    }
}

/// `restore --from`.
pub(super) fn restored_from(r: &crate::replica::restore::Restored, f: Format) {
    if f == Format::Json {
        outln!("{}", serde_json::to_value(r).unwrap_or_default());
        return;
    }
    errln!(
        "restored {} from {} (generation {}): commit {} of {}, {} commits applied after its snapshot",
        shown_path(&r.store),
        shown(&r.url),
        shown(&r.generation),
        r.commit,
        fmt_time(r.commit_time_ns),
        r.records
    );
    if let Some(k) = &r.kept {
        errln!("the previous store is kept as {}", shown_path(k));
    }
    if let Some(b) = &r.broken {
        errln!(
            "warning: restored to the last verified commit only ({} commits listed past it were not restored): {}",
            b.listed_commit.saturating_sub(b.last_good_commit),
            shown(&b.to_string())
        );
    }
    replicas_dropped(&r.dropped_replicas);
}

pub(super) fn repaired(fixes: &[String]) {
    for f in fixes {
        errln!("repaired: {}", shown(f));
    }
}

/// `live`: checked through the daemon, without redb's page check.
pub(super) fn check(store: &Path, live: bool, findings: &[String], f: Format) {
    if f == Format::Json {
        outln!(
            "{}",
            json!({"ok": findings.is_empty(), "findings": findings})
        );
    } else if findings.is_empty() {
        let how = if live {
            "invariants hold (live check through the daemon; unmount for redb's page check too)"
        } else {
            "clean"
        };
        outln!("{}: {how}", shown_path(store));
    } else {
        for f in findings {
            outln!("{}", shown(f));
        }
    }
}

/// On stderr: stdout may carry the snapshot itself. `dest` is `-` for stdout.
pub(super) fn snapshot(dest: &str, v: &Value, f: Format) {
    if f == Format::Json {
        errln!("{v}");
        return;
    }
    errln!(
        "snapshot {}: {} entries, {} bytes, {:.3} s",
        shown(dest),
        v["entries"],
        v["file_bytes"],
        v["seconds"].as_f64().unwrap_or(0.0)
    );
}

pub(super) fn restored(store: &Path, kept: Option<&Path>) {
    match kept {
        Some(k) => errln!(
            "restored {}; the previous store is kept as {}",
            shown_path(store),
            shown_path(k)
        ),
        None => errln!("restored {}", shown_path(store)),
    }
}

pub(super) fn exported(files: u64, dirs: u64, bytes: u64) {
    errln!("exported {files} files, {dirs} directories, {bytes} bytes");
}

pub(super) fn imported(report: &Value, f: Format) {
    if f == Format::Json {
        outln!("{report}");
        return;
    }
    let listed = report["skipped"].as_array().map_or(&[][..], Vec::as_slice);
    for s in listed {
        errln!("skipped {}: {}", text(&s[0]), text(&s[1]));
    }
    if let Some(n) = report["skipped_unlisted"].as_u64().filter(|&n| n > 0) {
        errln!(
            "skipped {n} more entries, not listed (an import lists the first {})",
            listed.len()
        );
    }
    errln!(
        "imported {} files, {} directories, {} bytes",
        report["files"],
        report["dirs"],
        report["bytes"]
    );
}

/// What a listing prints (`ls`, `ls -l`, `tree`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Listing {
    Ls { long: bool },
    Tree,
}

/// A listing's output, written as its entries arrive: a line each, or with `--json` the
/// array its one-line answer held (the entries as that array held them, in order), written an
/// entry at a time: the same bytes as when the answer came whole, none of it held here.
/// Nothing is written before the first entry, so a refused listing prints nothing.
pub(super) struct ListingWriter {
    out: std::io::BufWriter<std::io::Stdout>,
    what: Listing,
    format: Format,
    written: u64,
}

impl ListingWriter {
    pub fn new(what: Listing, format: Format) -> ListingWriter {
        ListingWriter {
            out: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout()),
            what,
            format,
            written: 0,
        }
    }

    /// Writes one entry.
    pub fn entry(&mut self, e: &Value) {
        let written = if self.format == Format::Json {
            let sep: &[u8] = if self.written == 0 { b"[" } else { b"," };
            self.out
                .write_all(sep)
                .and_then(|()| write!(self.out, "{e}"))
        } else {
            match self.what {
                Listing::Ls { long } => ls_line(&mut self.out, e, long),
                Listing::Tree => tree_line(&mut self.out, e),
            }
        };
        if let Err(e) = written {
            output_failed(e);
        }
        self.written += 1;
    }

    /// The end of a whole listing: the array closed with `--json`, and everything flushed.
    pub fn finish(mut self) {
        let mut end = || {
            if self.format == Format::Json {
                if self.written == 0 {
                    self.out.write_all(b"[")?;
                }
                self.out.write_all(b"]\n")?;
            }
            self.out.flush()
        };
        if let Err(e) = end() {
            output_failed(e);
        }
    }
}

fn ls_line(out: &mut dyn Write, e: &Value, long: bool) -> std::io::Result<()> {
    let name = text(&e["name"]);
    if long {
        writeln!(
            out,
            "{} {:>10} {} {}",
            mode_string(
                e["kind"].as_str() == Some("dir"),
                e["mode"].as_u64().unwrap_or(0) as u32
            ),
            e["size"],
            fmt_time(e["mtime_ns"].as_i64().unwrap_or(0)),
            name
        )
    } else {
        writeln!(out, "{name}")
    }
}

fn tree_line(out: &mut dyn Write, item: &Value) -> std::io::Result<()> {
    let depth = item["depth"].as_u64().unwrap_or(0) as usize;
    let e = &item["entry"];
    let slash = if e["kind"].as_str() == Some("dir") && e["name"] != "/" {
        "/"
    } else {
        ""
    };
    writeln!(out, "{}{}{slash}", "  ".repeat(depth), text(&e["name"]))
}

/// `cat --json`: `{"content": ...}`, or `{"content_hex": ...}` when the bytes are not UTF-8
/// (known only once all are read), written as it is escaped, with no second copy of them.
pub(super) fn cat_json(bytes: Vec<u8>) {
    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
    let written = match String::from_utf8(bytes) {
        Ok(text) => w
            .write_all(b"{\"content\":")
            .and_then(|()| serde_json::to_writer(&mut w, &text).map_err(std::io::Error::from)),
        Err(e) => w.write_all(b"{\"content_hex\":\"").and_then(|()| {
            e.as_bytes()
                .chunks(32 * 1024)
                .try_for_each(|part| w.write_all(hex(part).as_bytes()))
                .and_then(|()| w.write_all(b"\""))
        }),
    };
    if let Err(e) = written
        .and_then(|()| w.write_all(b"}\n"))
        .and_then(|()| w.flush())
    {
        output_failed(e);
    }
}

/// Bytes in lower-case hex, two digits each.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

pub(super) fn du(v: &Value, path: &str, f: Format) {
    let d = &v["du"];
    if f == Format::Json {
        outln!("{d}");
        return;
    }
    outln!(
        "{}\t{}\t({} files, {} directories){}",
        d["bytes"],
        shown(path),
        d["files"],
        d["dirs"],
        quota_note(d)
    );
}

/// ", quota 10485760 bytes, 1000 files" for a directory with a quota; empty otherwise.
fn quota_note(d: &Value) -> String {
    let mut out = String::new();
    for (key, unit) in [("quota_bytes", "bytes"), ("quota_files", "files")] {
        if let Some(n) = d[key].as_u64().filter(|n| *n > 0) {
            out.push_str(&format!(", quota {n} {unit}"));
        }
    }
    out
}

/// `quota STORE`: one line per directory with a quota: used/limit bytes, used/limit files.
pub(super) fn quotas(list: &Value, f: Format) {
    if f == Format::Json {
        outln!("{list}");
        return;
    }
    let rows = list.as_array().map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        errln!("no quotas");
        return;
    }
    outln!(
        "{:>14} {:>14} {:>10} {:>10}  path",
        "bytes",
        "limit",
        "files",
        "limit"
    );
    for q in rows {
        let limit = |k: &str| match q[k].as_u64() {
            Some(0) | None => "-".to_string(),
            Some(n) => n.to_string(),
        };
        outln!(
            "{:>14} {:>14} {:>10} {:>10}  {}",
            q["bytes"],
            limit("bytes_limit"),
            q["files"],
            limit("files_limit"),
            text(&q["path"])
        );
    }
}

pub(super) fn quota_set(q: &Value, f: Format) {
    if f == Format::Json {
        outln!("{q}");
        return;
    }
    let (b, n) = (
        q["bytes_limit"].as_u64().unwrap_or(0),
        q["files_limit"].as_u64().unwrap_or(0),
    );
    if b == 0 && n == 0 {
        done(&format!("{}: no quota", text(&q["path"])));
        return;
    }
    let limit = |n: u64, unit: &str| {
        if n == 0 {
            format!("no {unit} limit")
        } else {
            format!("{n} {unit}")
        }
    };
    done(&format!(
        "{}: quota {}, {} (holds {} bytes, {} files and directories)",
        text(&q["path"]),
        limit(b, "bytes"),
        limit(n, "files"),
        q["bytes"],
        q["files"]
    ));
}

pub(super) fn stats(store: &Path, mountpoint: Option<&Path>, v: &Value, f: Format) {
    let s = &v["stats"];
    if f == Format::Json {
        outln!("{s}");
        return;
    }
    outln!("store:        {}", shown_path(store));
    outln!(
        "mounted at:   {}",
        mountpoint.map_or("(not mounted)".to_string(), shown_path)
    );
    outln!("files:        {}", s["files"]);
    outln!("directories:  {}", s["dirs"]);
    outln!("content:      {} bytes", s["content_bytes"]);
    outln!("store file:   {} bytes", s["store_bytes"]);
    outln!(
        "last commit:  {}",
        s["last_commit_ns"]
            .as_i64()
            .map_or("never".into(), fmt_time)
    );
    outln!("largest files:");
    for f in s["largest"].as_array().into_iter().flatten() {
        outln!("  {:>12}  {}", f[1], text(&f[0]));
    }
    if s["quotas"].as_array().is_some_and(|l| !l.is_empty()) {
        outln!("quotas:");
        quotas(&s["quotas"], Format::Human);
    }
}

/// The files expire removed (or would remove), with when each was last used.
pub(super) fn expired(files: &[(String, i64)], dry_run: bool, f: Format) {
    if f == Format::Json {
        outln!("{}", json!({"dry_run": dry_run, "removed": files}));
        return;
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    for (p, last) in files {
        outln!("{verb} {} (last used {})", shown(p), fmt_time(*last));
    }
    errln!("{verb} {} files", files.len());
}

pub(super) fn compacted(store: &Path, before: u64, after: u64) {
    errln!("compacted {}: {before} -> {after} bytes", shown_path(store));
}

/// `log`'s output, written as the pages of records arrive: through one buffer, flushed
/// after each page (the first line shows at once), as a JSON array with `--json`.
pub(super) struct LogWriter {
    out: std::io::BufWriter<std::io::Stdout>,
    format: Format,
    written: u64,
    /// The last second printed and its date: consecutive records mostly share one.
    second: Option<(i64, String)>,
}

/// A record as `log --json` prints it: every field but the undo entries, keys in order.
#[derive(serde::Serialize)]
struct LogJson<'a> {
    comm: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    conflict: Option<&'a str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    folded: &'a [String],
    gid: u32,
    ino: u64,
    op: &'a str,
    paths: &'a [String],
    pid: u32,
    redacted: bool,
    seq: u64,
    size_after: u64,
    size_before: u64,
    time: i64,
    uid: u32,
}

impl LogWriter {
    pub fn new(format: Format) -> LogWriter {
        LogWriter {
            out: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout()),
            format,
            written: 0,
            second: None,
        }
    }

    /// Writes one page of records; false when the reader has gone (a closed pipe).
    pub fn records(&mut self, records: &[HistoryRecord]) -> Result<bool, String> {
        let r = self.write_page(records).and_then(|()| self.out.flush());
        match r {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(format!("writing the log: {e}")),
        }
    }

    fn write_page(&mut self, records: &[HistoryRecord]) -> std::io::Result<()> {
        for r in records {
            if self.format == Format::Json {
                self.out
                    .write_all(if self.written == 0 { b"[" } else { b"," })?;
                let line = LogJson {
                    comm: &r.comm,
                    conflict: r.conflict.as_deref(),
                    folded: &r.folded,
                    gid: r.gid,
                    ino: r.ino,
                    op: &r.op,
                    paths: &r.paths,
                    pid: r.pid,
                    redacted: r.redacted,
                    seq: r.seq,
                    size_after: r.size_after,
                    size_before: r.size_before,
                    time: r.time,
                    uid: r.uid,
                };
                serde_json::to_writer(&mut self.out, &line)?;
                self.written += 1;
                continue;
            }
            self.written += 1;
            let paths: Vec<String> = r.paths.iter().map(|p| shown(p)).collect();
            let second = r.time.div_euclid(1_000_000_000);
            if self.second.as_ref().is_none_or(|(s, _)| *s != second) {
                self.second = Some((second, fmt_time(r.time)));
            }
            let date = self.second.as_ref().map_or("", |(_, d)| d.as_str());
            writeln!(
                self.out,
                "@{:<6} {date}  {:<9} {:<40} {} -> {} uid {} pid {} {}{}{}",
                r.seq,
                shown(&r.op),
                paths.join(" -> "),
                r.size_before,
                r.size_after,
                r.uid,
                r.pid,
                shown(&r.comm),
                match (r.folded.is_empty(), r.op == "rename") {
                    (true, _) => String::new(),
                    (false, true) =>
                        format!("  [with {} of the source]", shown(&r.folded.join(", "))),
                    (false, false) => format!("  [with {}]", shown(&r.folded.join(", "))),
                },
                if r.redacted { "  [redacted]" } else { "" }
            )?;
            if let Some(c) = &r.conflict {
                writeln!(self.out, "        {}", shown(c))?;
            }
        }
        Ok(())
    }

    /// Ends the output (closes the JSON array).
    pub fn finish(mut self) -> Result<(), String> {
        let r = if self.format == Format::Json {
            let open = if self.written == 0 { "[" } else { "" };
            writeln!(self.out, "{open}]").and_then(|()| self.out.flush())
        } else {
            self.out.flush()
        };
        match r {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(format!("writing the log: {e}"))
            }
            _ => Ok(()),
        }
    }
}

/// `drwx------`-style permissions.
fn mode_string(dir: bool, mode: u32) -> String {
    let mut s = String::from(if dir { "d" } else { "-" });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// The progress line of a long operation on stderr: drawn only when stderr is a terminal
/// (indicatif hides it otherwise) and never with `--json`; cleared when dropped.
pub(super) struct Progress(indicatif::ProgressBar);

impl Progress {
    pub fn new(what: &'static str, f: Format) -> Progress {
        use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
        if f == Format::Json {
            return Progress(ProgressBar::hidden());
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{prefix}: {pos} records ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_prefix(what);
        Progress(bar)
    }

    /// `done` records so far (indicatif limits how often the line is redrawn).
    pub fn update(&self, done: u64) {
        self.0.set_position(done);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::mode_string;

    #[test]
    fn modes() {
        assert_eq!(mode_string(true, 0o700), "drwx------");
        assert_eq!(mode_string(false, 0o644), "-rw-r--r--");
    }
}
