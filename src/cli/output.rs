//! Everything the commands print, in its two forms: for people, and `--json` (one JSON value
//! per command, on stdout, or on stderr where stdout carries data), plus the progress line.
//! Commands hand their answers here; no other file of the CLI prints.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use super::time::fmt_time;

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

/// A string field of an answer, or "".
fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// A command that failed: one line on stderr.
pub(super) fn error(e: &str) {
    eprintln!("redbfs: {e}");
}

/// What a command that changed something says it did: one line on stderr.
pub(super) fn done(what: &str) {
    eprintln!("{what}");
}

/// Data a command writes as is (a file's content, a diff, a snapshot) on stdout.
pub(super) fn data(bytes: &[u8]) -> Result<(), String> {
    std::io::stdout()
        .write_all(bytes)
        .map_err(|e| e.to_string())
}

pub(super) fn unmounted(msg: &str) {
    eprintln!("redbfs: {msg}");
}

pub(super) fn status(v: &Value, f: Format) {
    if f == Format::Json {
        println!("{v}");
        return;
    }
    let mp = v["mountpoint"].as_str().unwrap_or("(not mounted)");
    println!("store:      {}", text(&v["store"]));
    println!("mountpoint: {mp}");
    println!("format:     {}", v["format"]);
    println!("files:      {}", v["files"]);
    println!("dirs:       {}", v["dirs"]);
    println!("content:    {} bytes", v["content_bytes"]);
    println!("store file: {} bytes", v["store_bytes"]);
    if let Some(pid) = v["pid"].as_u64() {
        println!("daemon pid: {pid}");
        println!("open files: {}", v["open_handles"]);
        println!(
            "log:        {} bytes since the last checkpoint (commit {})",
            v["log_bytes"], v["commits"]
        );
        println!(
            "conflicts:  {} since mount (--lost-updates {})",
            v["conflicts"],
            text(&v["limits"]["lost_updates"])
        );
        for r in v["replicas"].as_array().into_iter().flatten() {
            replica_line(r);
        }
    }
}

/// One replica of a mount: how far behind it is, and why while it is out of reach.
fn replica_line(r: &Value) {
    let behind = r["commits_behind"].as_u64().unwrap_or(0);
    let state = if behind == 0 {
        "up to date".to_string()
    } else {
        format!(
            "{behind} commits ({}s) behind",
            r["seconds_behind"].as_f64().unwrap_or(0.0)
        )
    };
    println!(
        "replica:    {} at commit {}, {state}",
        text(&r["url"]),
        r["shipped_commit"]
    );
    if let Some(e) = r["error"].as_str() {
        println!("            unreachable: {e}");
    }
}

/// `replica ls`: one line per generation, oldest first.
pub(super) fn replica_ls(url: &str, list: &[crate::replica::restore::GenerationInfo], f: Format) {
    if f == Format::Json {
        println!("{}", json!({"url": url, "generations": list}));
        return;
    }
    if list.is_empty() {
        println!("{url}: no generations");
        return;
    }
    println!("generation                     started              commits      until");
    for g in list {
        let (Some(first), Some(last)) = (g.commit, g.last_commit) else {
            println!(
                "{:<30} {}  (incomplete: never finished uploading)",
                g.generation,
                fmt_time(g.started_ns)
            );
            continue;
        };
        println!(
            "{:<30} {}  {:>5}..{:<5} {}",
            g.generation,
            fmt_time(g.started_ns),
            first,
            last,
            g.last_time_ns.map(fmt_time).unwrap_or_default()
        );
    }
}

/// `restore --from`.
pub(super) fn restored_from(r: &crate::replica::restore::Restored, f: Format) {
    if f == Format::Json {
        println!("{}", serde_json::to_value(r).unwrap_or_default());
        return;
    }
    eprintln!(
        "restored {} from {} (generation {}): commit {} of {}, {} commits applied after its snapshot",
        r.store.display(),
        r.url,
        r.generation,
        r.commit,
        fmt_time(r.commit_time_ns),
        r.records
    );
    if let Some(k) = &r.kept {
        eprintln!("the previous store is kept as {}", k.display());
    }
}

pub(super) fn repaired(fixes: &[String]) {
    for f in fixes {
        eprintln!("repaired: {f}");
    }
}

/// `live`: checked through the daemon, without redb's page check.
pub(super) fn check(store: &Path, live: bool, findings: &[String], f: Format) {
    if f == Format::Json {
        println!(
            "{}",
            json!({"ok": findings.is_empty(), "findings": findings})
        );
    } else if findings.is_empty() {
        let how = if live {
            "invariants hold (live check through the daemon; unmount for redb's page check too)"
        } else {
            "clean"
        };
        println!("{}: {how}", store.display());
    } else {
        for f in findings {
            println!("{f}");
        }
    }
}

/// On stderr: stdout may carry the snapshot itself. `dest` is `-` for stdout.
pub(super) fn snapshot(dest: &str, v: &Value, f: Format) {
    if f == Format::Json {
        eprintln!("{v}");
        return;
    }
    eprintln!(
        "snapshot {dest}: {} entries, {} bytes, {:.3} s",
        v["entries"],
        v["file_bytes"],
        v["seconds"].as_f64().unwrap_or(0.0)
    );
}

pub(super) fn restored(store: &Path, kept: Option<&Path>) {
    match kept {
        Some(k) => eprintln!(
            "restored {}; the previous store is kept as {}",
            store.display(),
            k.display()
        ),
        None => eprintln!("restored {}", store.display()),
    }
}

pub(super) fn exported(files: u64, dirs: u64, bytes: u64) {
    eprintln!("exported {files} files, {dirs} directories, {bytes} bytes");
}

pub(super) fn imported(report: &Value, f: Format) {
    if f == Format::Json {
        println!("{report}");
        return;
    }
    for s in report["skipped"].as_array().into_iter().flatten() {
        eprintln!("skipped {}: {}", text(&s[0]), text(&s[1]));
    }
    eprintln!(
        "imported {} files, {} directories, {} bytes",
        report["files"], report["dirs"], report["bytes"]
    );
}

pub(super) fn ls(v: &Value, long: bool, f: Format) {
    if f == Format::Json {
        println!("{}", v["entries"]);
        return;
    }
    for e in v["entries"].as_array().into_iter().flatten() {
        let name = text(&e["name"]);
        if long {
            println!(
                "{} {:>10} {} {}",
                mode_string(
                    e["kind"].as_str() == Some("dir"),
                    e["mode"].as_u64().unwrap_or(0) as u32
                ),
                e["size"],
                fmt_time(e["mtime_ns"].as_i64().unwrap_or(0)),
                name
            );
        } else {
            println!("{name}");
        }
    }
}

/// A file's content: its bytes, or `{"content": ...}` (`content_hex` when not UTF-8).
pub(super) fn cat(mut v: Value, f: Format) -> Result<(), String> {
    if f == Format::Json {
        if let Some(o) = v.as_object_mut() {
            o.remove("ok");
        }
        println!("{v}");
        return Ok(());
    }
    data(&crate::tools::content_of(&v))
}

pub(super) fn tree(v: &Value, f: Format) {
    if f == Format::Json {
        println!("{}", v["tree"]);
        return;
    }
    for item in v["tree"].as_array().into_iter().flatten() {
        let depth = item["depth"].as_u64().unwrap_or(0) as usize;
        let e = &item["entry"];
        let slash = if e["kind"].as_str() == Some("dir") && e["name"] != "/" {
            "/"
        } else {
            ""
        };
        println!("{}{}{slash}", "  ".repeat(depth), text(&e["name"]));
    }
}

pub(super) fn du(v: &Value, path: &str, f: Format) {
    let d = &v["du"];
    if f == Format::Json {
        println!("{d}");
        return;
    }
    println!(
        "{}\t{path}\t({} files, {} directories){}",
        d["bytes"],
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
        println!("{list}");
        return;
    }
    let rows = list.as_array().map(Vec::as_slice).unwrap_or_default();
    if rows.is_empty() {
        eprintln!("no quotas");
        return;
    }
    println!(
        "{:>14} {:>14} {:>10} {:>10}  path",
        "bytes", "limit", "files", "limit"
    );
    for q in rows {
        let limit = |k: &str| match q[k].as_u64() {
            Some(0) | None => "-".to_string(),
            Some(n) => n.to_string(),
        };
        println!(
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
        println!("{q}");
        return;
    }
    let (b, n) = (
        q["bytes_limit"].as_u64().unwrap_or(0),
        q["files_limit"].as_u64().unwrap_or(0),
    );
    if b == 0 && n == 0 {
        done(&format!("{}: no quota", text(&q["path"])));
    } else {
        done(&format!(
            "{}: quota {} bytes, {} files (holds {} bytes, {} files)",
            text(&q["path"]),
            if b == 0 {
                "no limit of".into()
            } else {
                b.to_string()
            },
            if n == 0 {
                "no limit of".into()
            } else {
                n.to_string()
            },
            q["bytes"],
            q["files"]
        ));
    }
}

pub(super) fn stats(store: &Path, mountpoint: Option<&Path>, v: &Value, f: Format) {
    let s = &v["stats"];
    if f == Format::Json {
        println!("{s}");
        return;
    }
    println!("store:        {}", store.display());
    println!(
        "mounted at:   {}",
        mountpoint.map_or("(not mounted)".to_string(), |m| m.display().to_string())
    );
    println!("files:        {}", s["files"]);
    println!("directories:  {}", s["dirs"]);
    println!("content:      {} bytes", s["content_bytes"]);
    println!("store file:   {} bytes", s["store_bytes"]);
    println!(
        "last commit:  {}",
        s["last_commit_ns"]
            .as_i64()
            .map_or("never".into(), fmt_time)
    );
    println!("largest files:");
    for f in s["largest"].as_array().into_iter().flatten() {
        println!("  {:>12}  {}", f[1], text(&f[0]));
    }
    if s["quotas"].as_array().is_some_and(|l| !l.is_empty()) {
        println!("quotas:");
        quotas(&s["quotas"], Format::Human);
    }
}

/// The files expire removed (or would remove), with when each was last used.
pub(super) fn expired(files: &[(String, i64)], dry_run: bool, f: Format) {
    if f == Format::Json {
        println!("{}", json!({"dry_run": dry_run, "removed": files}));
        return;
    }
    let verb = if dry_run { "would remove" } else { "removed" };
    for (p, last) in files {
        println!("{verb} {p} (last used {})", fmt_time(*last));
    }
    eprintln!("{verb} {} files", files.len());
}

pub(super) fn compacted(store: &Path, before: u64, after: u64) {
    eprintln!("compacted {}: {before} -> {after} bytes", store.display());
}

pub(super) fn log(v: &Value, f: Format) {
    if f == Format::Json {
        println!("{}", v["records"]);
        return;
    }
    for r in v["records"].as_array().into_iter().flatten() {
        let paths: Vec<&str> = r["paths"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.as_str())
            .collect();
        println!(
            "@{:<6} {}  {:<9} {:<40} {:>8} -> {:<8} uid {} pid {} {}{}",
            r["seq"],
            fmt_time(r["time"].as_i64().unwrap_or(0)),
            text(&r["op"]),
            paths.join(" -> "),
            r["size_before"],
            r["size_after"],
            r["uid"],
            r["pid"],
            text(&r["comm"]),
            if r["redacted"] == true {
                "  [redacted]"
            } else {
                ""
            }
        );
        if let Some(c) = r["conflict"].as_str() {
            println!("        {c}");
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
