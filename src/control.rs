//! The daemon's control socket: a Unix socket beside the store (`<store>.sock`, mode 0600)
//! speaking one JSON request and one JSON response per line. Store tools reach a mounted
//! store through it, because the daemon owns the store file.
//!
//! Requests: `{"op":"status"}`, `{"op":"unmount"}`, `{"op":"promote"}` (a follower),
//! `{"op":"snapshot","out":PATH}`,
//! `{"op":"import","dir":DIR,"into":PATH,"strict":BOOL}` (or `"tar":FILE` for `"dir"`), the
//! changes of `tools::history_change` (`mark`, `rollback`, `revert`, `redact`, `snapshot_at`,
//! `quota`, `expire`), and the read-only queries of `tools::query` (`ls`, `cat`, `tree`, `du`, `stats`,
//! `quotas`, `check`, `unused`) with `"path"`. Every response carries `"ok"`; a failed one
//! carries `"error"` with a message for a person.
//!
//! Two requests are answered by several lines. `{"op":"log","stream":true, ...}` (the fields
//! of `tools::LogQuery`) streams the log as pages, one line each, carrying `"streamed":true`;
//! the last has `"cursor":null`. The first page is small, so its line leaves at once.
//! `{"op":"cat","path":P,"stream":true}` and `{"op":"show","path":P,"at":X,"stream":true}`
//! stream a file's content: a refusal is one `{"ok":false,...}` line as usual; otherwise
//! `{"ok":true,"streamed":true,"size":N}`, then each piece as a line `{"piece":LEN}` followed
//! by LEN bytes of content as they are (one chunk of the store, 64 KiB at most), then
//! `{"ok":true,"end":true}`, or `{"ok":false,"error":...}` if reading failed on the way. A
//! stream that closes before its end line was cut short: what came is not the whole file.
//! Without `"stream"`, `cat` and `show` answer in one line only for a file of at most
//! `tools::WHOLE_CONTENT_MAX` bytes.
//! `{"op":"ls"|"tree"|"unused",...,"stream":true}` streams a listing: a refusal is one
//! `{"ok":false,...}` line; otherwise pages, each a line `{"ok":true,"streamed":true,KEY:[...]}`
//! (KEY `entries`, `tree` or `files`; the entries as the one-line answer's array holds them,
//! about `LISTING_PAGE_BYTES` of them a page), then `{"ok":true,"end":true}`, or
//! `{"ok":false,"error":...}` if the walk failed on the way. A stream that closes before its
//! end line was cut short: what came is not the whole listing. Without `"stream"`, a listing
//! is answered in one line only up to `tools::WHOLE_LISTING_MAX` bytes of JSON.
//!
//! Limits, so no client can exhaust the daemon: `MAX_CONNECTIONS` served at once, request
//! lines of at most `MAX_LINE` bytes in UTF-8, `IDLE` seconds without a request or without
//! taking an answer, and at most `tools::STREAM_CHUNKS` chunks of a file held per streamed
//! answer. No read transaction of `log` outlives the page it reads: it ends before the page
//! is written, so a client that stops reading pins no version of the store, and is dropped
//! after `IDLE`. A content stream holds one read transaction to its end line, so its client
//! gets one version of the file; one that stops reading is dropped after `IDLE`, which ends
//! it, and so does the daemon shutting down. A listing stream likewise holds one read
//! transaction to its end line (one version of the tree: a directory renamed meanwhile is
//! listed once), and of the listing only its walk's cursors (`tools::Walk`) and one page.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fs::Fs;
use crate::store::FORMAT_VERSION;
use crate::tools;

/// The control socket of the store at `store`.
pub fn socket_path(store: &Path) -> PathBuf {
    let mut s = store.as_os_str().to_owned();
    s.push(".sock");
    PathBuf::from(s)
}

/// Where a daemon asked to unmount leaves, for the `redbfs unmount` waiting on it, what each
/// replica holds after the last upload (`<store>.unshipped`, mode 0600, JSON): the daemon
/// exits right after, so no socket could carry it.
pub fn unshipped_path(store: &Path) -> PathBuf {
    let mut s = store.as_os_str().to_owned();
    s.push(".unshipped");
    PathBuf::from(s)
}

/// What the daemon serves the socket with.
pub struct Daemon {
    /// The filesystem, until the daemon shuts down and takes it back to close the store.
    fs: std::sync::RwLock<Option<Arc<Fs>>>,
    pub mountpoint: PathBuf,
    pub store: PathBuf,
    /// Called for an unmount request; returns a message on failure.
    pub unmount: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
    /// The mount's replication, while it runs.
    replication: std::sync::Mutex<Option<Arc<crate::replica::Replication>>>,
    follower: std::sync::Mutex<Option<Arc<crate::replica::Follower>>>,
    /// An unmount request came through the socket: its client waits for `unshipped_path`.
    unmount_asked: std::sync::atomic::AtomicBool,
    /// Held while a follower is promoted: one promotion at a time.
    pub(crate) promoting: std::sync::Mutex<()>,
}

impl Daemon {
    pub fn new(
        fs: Arc<Fs>,
        mountpoint: PathBuf,
        store: PathBuf,
        unmount: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
    ) -> Daemon {
        Daemon {
            fs: std::sync::RwLock::new(Some(fs)),
            mountpoint,
            store,
            unmount,
            replication: std::sync::Mutex::new(None),
            follower: std::sync::Mutex::new(None),
            unmount_asked: std::sync::atomic::AtomicBool::new(false),
            promoting: std::sync::Mutex::new(()),
        }
    }

    /// Sets (or, with None, drops) the replication `status` reports on.
    pub fn set_replication(&self, r: Option<Arc<crate::replica::Replication>>) {
        *self.replication.lock().unwrap_or_else(|p| p.into_inner()) = r;
    }

    /// Sets (or, with None, drops) the follower `status` reports on.
    pub fn set_follower(&self, f: Option<Arc<crate::replica::Follower>>) {
        *self.follower.lock().unwrap_or_else(|p| p.into_inner()) = f;
    }

    /// The running follower, if the mount follows a replica.
    pub(crate) fn follower_handle(&self) -> Option<Arc<crate::replica::Follower>> {
        self.follower
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Takes the mount's replication (the session ended: it is stopped next).
    pub fn take_replication(&self) -> Option<Arc<crate::replica::Replication>> {
        self.replication
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn follower(&self) -> Value {
        match &*self.follower.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => f.status(),
            None => Value::Null,
        }
    }

    fn replicas(&self, commits: u64) -> Value {
        match &*self.replication.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(r) => r.status(commits),
            None => json!([]),
        }
    }

    /// Leaves what each replica holds after the last upload for the `redbfs unmount` that
    /// asked (none asked: the log has it already).
    pub fn report_unshipped(&self, replicas: &[crate::replica::ship::Unshipped]) {
        if !self.unmount_asked.load(Ordering::Acquire) {
            return;
        }
        let path = unshipped_path(&self.store);
        let _ = std::fs::remove_file(&path);
        let written = serde_json::to_vec(replicas)
            .map_err(std::io::Error::other)
            .and_then(|bytes| crate::private::create_new(&path)?.write_all(&bytes));
        if let Err(e) = written {
            tracing::warn!(error = %e, path = %path.display(), "could not leave what the replicas hold for the unmount command");
        }
    }

    /// An unmount request: the daemon leaves what the replicas hold for its client.
    fn unmount_requested(&self) -> Value {
        self.unmount_asked.store(true, Ordering::Release);
        match (self.unmount)() {
            Ok(()) => json!({"ok": true}),
            Err(e) => {
                self.unmount_asked.store(false, Ordering::Release);
                json!({"ok": false, "error": e})
            }
        }
    }

    /// Takes the filesystem back at shutdown; later requests are refused.
    pub fn take_fs(&self) -> Option<Arc<Fs>> {
        self.fs.write().unwrap_or_else(|p| p.into_inner()).take()
    }

    pub(crate) fn fs(&self) -> Result<Arc<Fs>, String> {
        self.fs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| "the daemon is shutting down".to_string())
    }

    fn status(&self) -> Value {
        let fs = match self.fs() {
            Ok(fs) => fs,
            Err(e) => return json!({"ok": false, "error": e}),
        };
        // A store that cannot be read (damaged under the daemon, or redb failed) still gets an
        // answer: the pid, the poisoned state and why, so `unmount` and the user can act.
        let usage = fs.store().read().and_then(|r| r.usage());
        let (handles, buffered) = fs.open_counts();
        let (commits, log_bytes) = fs.store().log_state();
        let (files, dirs, content_bytes, store_error) = match usage {
            Ok(u) => (json!(u.files), json!(u.dirs), json!(u.content_bytes), None),
            Err(e) => (Value::Null, Value::Null, Value::Null, Some(e.to_string())),
        };
        json!({
            "ok": true,
            "pid": std::process::id(),
            "mountpoint": self.mountpoint,
            "store": self.store,
            "format": FORMAT_VERSION,
            "files": files,
            "dirs": dirs,
            "content_bytes": content_bytes,
            "store_error": store_error,
            "store_bytes": fs.store().file_bytes(),
            "open_handles": handles,
            "buffered_bytes": buffered,
            "commits": commits,
            "log_bytes": log_bytes,
            "commit_stats": fs.store().commit_stats(),
            "poisoned": fs.is_poisoned(),
            "read_only": fs.is_read_only(),
            "read_only_why": fs.store().frozen(),
            "follower": self.follower(),
            "limits": fs.limits(),
            "history_bytes": fs.store().history_bytes_estimate(),
            "history_budget": fs.store().history_budget(),
            "conflicts": fs.conflicts(),
            "kernel_references": fs.referenced(),
            "replicas": self.replicas(commits),
        })
    }

    fn query(&self, req: &Value) -> Value {
        let answer = self.fs().and_then(|fs| {
            let r = fs.store().read().map_err(|e| e.to_string())?;
            tools::query(&r, fs.store().file_bytes(), req)
        });
        reply(answer)
    }

    /// A point-in-time copy from one read transaction; writers carry on meanwhile.
    fn snapshot(&self, req: &Value) -> Value {
        let Some(out) = req.get("out").and_then(Value::as_str) else {
            return json!({"ok": false, "error": "snapshot needs \"out\""});
        };
        let answer = self.fs().and_then(|fs| {
            let r = fs.store().read().map_err(|e| e.to_string())?;
            // No progress: the daemon's stderr is not the asking user's.
            match req.get("path").and_then(Value::as_str) {
                Some(p) => tools::snapshot_subtree(&r, p, Path::new(out), &mut |_| {}),
                None => tools::snapshot(&r, Path::new(out), &mut |_| {}),
            }
            .map(|info| json!({"snapshot": info}))
        });
        reply(answer)
    }

    /// Test-only: arms an injected I/O fault (see `store::fault`).
    fn fault(&self, req: &Value) -> Value {
        let on = match req.get("on").and_then(Value::as_str) {
            Some("write") => crate::store::fault::FaultOn::Write,
            Some("sync") => crate::store::fault::FaultOn::Sync,
            _ => return json!({"ok": false, "error": "fault needs \"on\": \"write\" or \"sync\""}),
        };
        let nth = req.get("nth").and_then(Value::as_u64).unwrap_or(1);
        let answer = self.fs().and_then(|fs| {
            fs.store()
                .inject_fault(on, nth)
                .map(|()| json!({}))
                .map_err(|e| e.to_string())
        });
        reply(answer)
    }

    fn import(&self, req: &Value) -> Value {
        // A directory, or a tar archive with "tar".
        let (dir, tar) = match (req.get("dir"), req.get("tar")) {
            (Some(Value::String(d)), None) => (d.as_str(), false),
            (None, Some(Value::String(t))) => (t.as_str(), true),
            _ => return json!({"ok": false, "error": "import needs \"dir\" or \"tar\""}),
        };
        let import = if tar {
            tools::import_tar
        } else {
            tools::import
        };
        let into = req.get("into").and_then(Value::as_str).unwrap_or("/");
        let strict = req.get("strict").and_then(Value::as_bool).unwrap_or(false);
        let answer = self.fs().and_then(|fs| {
            import(
                fs.store(),
                fs.limits(),
                Path::new(dir),
                into,
                strict,
                &mut |_| {},
            )
            .map(|mut report| {
                // The kernel may hold the listing of a directory the import added to, or a
                // lookup that found one of its new names missing: it forgets both.
                let made = std::mem::take(&mut report.made_in_existing);
                let dirs: std::collections::BTreeSet<u64> = made.iter().map(|d| d.0).collect();
                fs.invalidate(made, dirs.into_iter().collect());
                json!({"import": report})
            })
        });
        reply(answer)
    }

    fn handle(&self, req: &Value) -> Value {
        // What a tool reads through the daemon (counts, listings, a snapshot) does not count
        // inodes the kernel has let go of and the reclaimer has not reached yet.
        if let Ok(fs) = self.fs() {
            fs.reclaim_queued();
        }
        match req.get("op").and_then(Value::as_str) {
            Some("status") => self.status(),
            Some("unmount") => self.unmount_requested(),
            Some("promote") => reply(crate::mount::promote::promote(self, req)),
            Some("snapshot") => self.snapshot(req),
            Some("fault") => self.fault(req),
            Some("import") => self.import(req),
            Some(
                "mark" | "rollback" | "revert" | "redact" | "snapshot_at" | "quota" | "expire",
            ) => reply(self.fs().and_then(|fs| tools::history_change(&fs, req))),
            Some(_) => self.query(req),
            None => json!({"ok": false, "error": "a request needs an \"op\""}),
        }
    }

    /// Streams `log` as pages (see the module comment), each read in its own read
    /// transaction, ended before the page is written. Err when the client went away or
    /// stopped reading for `IDLE`.
    fn stream_log(&self, req: &Value, out: &mut UnixStream) -> std::io::Result<()> {
        let q = match serde_json::from_value::<tools::LogQuery>(req.clone()) {
            Ok(q) => q,
            Err(e) => return send(out, &json!({"ok": false, "error": format!("log: {e}")})),
        };
        let mut gone = Ok(());
        let read = |q: &tools::LogQuery| {
            let fs = self.fs()?;
            let r = fs.store().read().map_err(|e| e.to_string())?;
            tools::log_page(&r, q)
        };
        let streamed = tools::log_pages(&q, read, |page, last| {
            let line = StreamedPage {
                ok: true,
                streamed: true,
                records: &page.records,
                cursor: if last { None } else { page.cursor.as_ref() },
                since_ns: page.since_ns,
                last_seq: page.last_seq,
            };
            gone = send(out, &line);
            Ok(gone.is_ok())
        });
        gone?;
        match streamed {
            Ok(()) => Ok(()),
            Err(e) => send(out, &json!({"ok": false, "error": e})),
        }
    }

    /// Streams the content `cat` or `show` asks for (see the module comment) from one read
    /// transaction, held until the end line so that the client gets one version of the file
    /// however it is rewritten meanwhile; at most `tools::STREAM_CHUNKS` chunks of it are in
    /// memory at once. Err when the client went away or stopped reading for `IDLE`.
    fn stream_content(&self, req: &Value, out: &mut UnixStream) -> std::io::Result<()> {
        let mut pieces = ContentOut {
            daemon: self,
            out,
            frame: Vec::new(),
            gone: Ok(()),
        };
        let streamed = self.fs().and_then(|fs| {
            let r = fs.store().read().map_err(|e| e.to_string())?;
            tools::content(&r, req, &mut pieces)
        });
        pieces.gone?;
        match streamed {
            Ok(()) => send(out, &json!({"ok": true, "end": true})),
            Err(e) => send(out, &json!({"ok": false, "error": e})),
        }
    }

    /// Streams the listing `ls`, `tree` or `unused` asks for (see the module comment) in
    /// pages of at most about `LISTING_PAGE_BYTES`, from one read transaction held until the
    /// end line, so that the listing is of one version of the store (a directory renamed
    /// meanwhile is listed once, where it was); what is held besides is the walk's bounded
    /// state (`tools::Walk`) and one page. Err when the client went away or stopped reading
    /// for `IDLE`.
    fn stream_listing(&self, req: &Value, out: &mut UnixStream) -> std::io::Result<()> {
        let Some(key) = tools::listing_key(req) else {
            return send(out, &json!({"ok": false, "error": "not a listing"}));
        };
        let mut page = ListingOut {
            daemon: self,
            out,
            head: format!(r#"{{"ok":true,"streamed":true,"{key}":["#).into_bytes(),
            page: Vec::new(),
            gone: Ok(()),
        };
        let streamed = self.fs().and_then(|fs| {
            fs.reclaim_queued();
            let r = fs.store().read().map_err(|e| e.to_string())?;
            tools::listing(&r, req, &mut |item| page.item(item))?;
            page.flush()
        });
        page.gone?;
        match streamed {
            Ok(()) => send(out, &json!({"ok": true, "end": true})),
            Err(e) => send(out, &json!({"ok": false, "error": e})),
        }
    }

    /// Whether the daemon has begun to shut down (`take_fs`): a stream still running stops.
    fn shutting_down(&self) -> bool {
        self.fs.read().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Serves one connection: a request per line, no longer than `MAX_LINE`; a connection
    /// idle for `IDLE` (or a client that stops reading its answers) is closed.
    fn serve_conn(&self, stream: UnixStream) {
        let _ = stream.set_write_timeout(Some(IDLE));
        let mut out = match stream.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        };
        let mut reader = BufReader::new(LineDeadline {
            stream,
            until: Instant::now(),
        });
        loop {
            // The whole request line within `IDLE`, not each read: a client that trickles
            // a byte at a time holds one of the connections no longer.
            reader.get_mut().until = Instant::now() + IDLE;
            let mut line = Vec::new();
            match (&mut reader)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
            {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let complete = line.last() == Some(&b'\n');
            if complete {
                line.pop();
            } else if line.len() > MAX_LINE {
                crate::warn_limited!("control: request over {MAX_LINE} bytes; connection closed");
                let e = json!({"ok": false, "error": format!("request longer than {MAX_LINE} bytes; connection closed")});
                let _ = writeln!(out, "{e}");
                return;
            }
            let req = std::str::from_utf8(&line)
                .map_err(|e| format!("request is not UTF-8: {e}"))
                .and_then(|text| {
                    serde_json::from_str::<Value>(text)
                        .map_err(|e| format!("request is not JSON: {e}"))
                });
            let sent = match req {
                Ok(req) if is_log_stream(&req) => self.stream_log(&req, &mut out),
                Ok(req) if is_content_stream(&req) => self.stream_content(&req, &mut out),
                Ok(req) if is_listing_stream(&req) => self.stream_listing(&req, &mut out),
                Ok(req) if wants_keepalive(&req) => {
                    answer_with_keepalives(&mut out, KEEPALIVE, || self.handle(&req))
                }
                Ok(req) => send(&mut out, &self.handle(&req)),
                Err(e) => {
                    crate::warn_limited!(error = %e, "control: bad request");
                    send(&mut out, &json!({"ok": false, "error": e}))
                }
            };
            if sent.is_err() || !complete {
                return;
            }
        }
    }
}

/// A connection's reading end, whose reads fail once `until` has passed.
struct LineDeadline {
    stream: UnixStream,
    until: Instant,
}

impl Read for LineDeadline {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// How often a daemon working on a request that asked for it (`"keepalive":true`) says so.
pub const KEEPALIVE: Duration = Duration::from_secs(10);
/// The line it says so with; a client that asked skips it.
const KEEPALIVE_LINE: &[u8] = br#"{"working":true}"#;
/// How long a client waits for a line: an answer, a page, or (asked for) a keepalive.
pub const CLIENT_WAITS: Duration = Duration::from_secs(120);

fn wants_keepalive(req: &Value) -> bool {
    req.get("keepalive").and_then(Value::as_bool) == Some(true)
}

/// Sends the answer `work` makes, and `KEEPALIVE_LINE` every `every` until it is made: a
/// request that takes longer than the client waits for a line (a snapshot of a large store,
/// an import) is not reported as failed while it completes. The work runs to its end even
/// if the client has gone.
fn answer_with_keepalives(
    out: &mut UnixStream,
    every: Duration,
    work: impl FnOnce() -> Value + Send,
) -> std::io::Result<()> {
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let worker = std::thread::Builder::new()
            .name("control-work".into())
            .spawn_scoped(s, move || {
                let _ = tx.send(work());
            })?;
        let mut listening = Ok(());
        loop {
            match rx.recv_timeout(every) {
                Ok(answer) => return listening.and_then(|()| send(out, &answer)),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if listening.is_ok() {
                        let mut line = KEEPALIVE_LINE.to_vec();
                        line.push(b'\n');
                        listening = out.write_all(&line);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    // The work panicked: its thread is joined by the scope, which passes
                    // the panic on, as a request handled on this thread would.
                    drop(worker);
                    return Err(std::io::Error::other(
                        "the request's work ended without an answer",
                    ));
                }
            }
        }
    })
}

/// The longest request line the daemon reads (a request names paths; 1 MiB is far beyond one).
pub const MAX_LINE: usize = 1024 * 1024;
/// Control connections served at once; one more is answered with an error and closed.
pub const MAX_CONNECTIONS: usize = 16;
/// A connection that sends no request for this long, or takes no answer for this long, is
/// closed.
pub const IDLE: Duration = Duration::from_secs(30);
/// One page of a streamed `log`, as it goes on the socket.
#[derive(serde::Serialize)]
struct StreamedPage<'a> {
    ok: bool,
    streamed: bool,
    records: &'a [crate::store::HistoryRecord],
    cursor: Option<&'a crate::store::LogCursor>,
    since_ns: Option<i64>,
    last_seq: u64,
}

/// A file's content on its way to a client (see the module comment): the header line once
/// the file is found, then each piece framed in one write. A write that failed is kept in
/// `gone` and ends the stream: the client is not there to be told anything more.
struct ContentOut<'a> {
    daemon: &'a Daemon,
    out: &'a mut UnixStream,
    /// One piece's frame, reused: `{"piece":LEN}\n` and the bytes.
    frame: Vec<u8>,
    gone: std::io::Result<()>,
}

impl ContentOut<'_> {
    /// Keeps the outcome of a write; a failed one ends the stream.
    fn sent(&mut self, written: std::io::Result<()>) -> Result<(), String> {
        let outcome = match &written {
            Ok(()) => Ok(()),
            Err(e) => Err(format!("control socket: {e}")),
        };
        self.gone = written;
        outcome
    }
}

impl tools::ContentSink for ContentOut<'_> {
    fn start(&mut self, size: u64) -> Result<(), String> {
        let header = json!({"ok": true, "streamed": true, "size": size});
        let written = send(self.out, &header);
        self.sent(written)
    }

    fn piece(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.daemon.shutting_down() {
            return Err("the daemon is shutting down".into());
        }
        self.frame.clear();
        let _ = writeln!(self.frame, "{{\"piece\":{}}}", bytes.len());
        self.frame.extend_from_slice(bytes);
        let written = self.out.write_all(&self.frame);
        self.sent(written)
    }
}

/// How much JSON a page of a streamed listing holds before it is sent (one entry more at
/// most): what a listing costs the daemon beyond its walk, whatever its length.
pub const LISTING_PAGE_BYTES: usize = 64 * 1024;

/// A listing on its way to a client (see the module comment): its entries gathered into a
/// page, sent as one line when it is full and at the end. A write that failed is kept in
/// `gone` and ends the stream.
struct ListingOut<'a> {
    daemon: &'a Daemon,
    out: &'a mut UnixStream,
    /// What each page line begins with, up to its array of entries.
    head: Vec<u8>,
    /// The page being filled: `head` and the entries so far; empty when none is.
    page: Vec<u8>,
    gone: std::io::Result<()>,
}

impl ListingOut<'_> {
    fn item(&mut self, json: &[u8]) -> Result<(), String> {
        if self.page.is_empty() {
            self.page.extend_from_slice(&self.head);
        } else {
            self.page.push(b',');
        }
        self.page.extend_from_slice(json);
        if self.page.len() >= LISTING_PAGE_BYTES {
            return self.flush();
        }
        Ok(())
    }

    /// Sends the page being filled, if any.
    fn flush(&mut self) -> Result<(), String> {
        if self.page.is_empty() {
            return Ok(());
        }
        if self.daemon.shutting_down() {
            return Err("the daemon is shutting down".into());
        }
        self.page.extend_from_slice(b"]}\n");
        let written = self.out.write_all(&self.page);
        self.page.clear();
        let outcome = match &written {
            Ok(()) => Ok(()),
            Err(e) => Err(format!("control socket: {e}")),
        };
        self.gone = written;
        outcome
    }
}

fn is_listing_stream(req: &Value) -> bool {
    tools::listing_key(req).is_some() && req.get("stream").and_then(Value::as_bool) == Some(true)
}

fn is_content_stream(req: &Value) -> bool {
    matches!(req.get("op").and_then(Value::as_str), Some("cat" | "show"))
        && req.get("stream").and_then(Value::as_bool) == Some(true)
}

fn is_log_stream(req: &Value) -> bool {
    req.get("op").and_then(Value::as_str) == Some("log")
        && req.get("stream").and_then(Value::as_bool) == Some(true)
}

/// Writes one answer line in one write: a JSON value is never sent a token at a time.
fn send(out: &mut UnixStream, answer: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(answer).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)
}

fn reply(answer: Result<Value, String>) -> Value {
    match answer {
        Ok(mut v) => {
            v["ok"] = json!(true);
            v
        }
        Err(e) => json!({"ok": false, "error": e}),
    }
}

/// The lock file of the store at `store` (`<store>.lock`), held while a daemon looks at and
/// binds the control socket.
pub fn lock_path(store: &Path) -> PathBuf {
    let mut s = store.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// How long a daemon tries for the store's lock before it gives up, naming it.
pub const LOCK_WITHIN: Duration = Duration::from_secs(5);

/// `<store>.lock`, held (flock) until dropped, which removes it first. It is this user's own
/// file, mode 0600, opened without following a symlink: another user can neither open nor lock
/// it (a lock on the store's directory, which anyone who may read it can take and keep, made
/// every mount there wait forever). A name whose file is removed by its holder between the
/// open and the lock is opened again, so two daemons never hold two different files.
struct StoreLock {
    path: PathBuf,
    _file: std::fs::File,
}

impl StoreLock {
    fn take(store: &Path) -> std::io::Result<StoreLock> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let path = lock_path(store);
        let deadline = std::time::Instant::now() + LOCK_WITHIN;
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| std::io::Error::new(e.kind(), crate::private::describe(&path, e)))?;
            let held = file.metadata()?;
            let me = nix::unistd::geteuid().as_raw();
            if held.uid() != me {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!(
                        "{} belongs to uid {}, not to this user (uid {me}); remove it",
                        path.display(),
                        held.uid()
                    ),
                ));
            }
            // SAFETY: flock takes the descriptor of `file`, which this lock owns; closing it
            // releases the lock.
            let r = unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&file),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    return Err(e);
                }
                if std::time::Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        format!(
                            "{}: another process holds a lock on it (waited {} s): another \
                             redbfs daemon of this store is starting, or stuck",
                            path.display(),
                            LOCK_WITHIN.as_secs()
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            let still_there = std::fs::symlink_metadata(&path)
                .is_ok_and(|m| (m.dev(), m.ino()) == (held.dev(), held.ino()));
            if still_there {
                return Ok(StoreLock { path, _file: file });
            }
        }
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        // Removed while still locked: the next daemon makes its own file.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether the peer of `conn` may be talked to: this process's user, or root, or `also`.
/// Returns the peer's uid when it may not.
fn peer_refused(conn: &UnixStream, also: Option<u32>) -> Option<u32> {
    let uid = match nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(c) => c.uid(),
        Err(_) => return Some(u32::MAX),
    };
    let me = nix::unistd::geteuid().as_raw();
    (uid != me && uid != 0 && Some(uid) != also).then_some(uid)
}

/// Binds the socket and serves it on a background thread. A socket that answers belongs to a
/// live daemon of the same store and is never replaced (`AddrInUse`): read-only mounts share
/// the store file, so its lock alone does not keep a second daemon out. One that does not
/// answer is stale and replaced. The look and the bind happen under the store's lock file
/// (`StoreLock`), so two daemons starting at once cannot both find the name free. Only this
/// user and root are served (the socket is 0600 besides).
pub fn listen(daemon: Arc<Daemon>) -> std::io::Result<PathBuf> {
    let path = socket_path(&daemon.store);
    let _lock = StoreLock::take(&daemon.store)?;
    if std::os::unix::net::UnixStream::connect(&path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "another redbfs daemon serves this store (its control socket answers)",
        ));
    }
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // bind(2) creates the socket with 0777 less the umask, and a chmod after it would leave a
    // window and act on a path: so the socket is made under a umask that leaves it 0600. The
    // umask is the process's; every file this daemon creates meanwhile has an explicit mode
    // no wider than 0600, so the moment's umask takes nothing from it. bind never follows a
    // symlink at the path (EADDRINUSE).
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(&path);
    nix::sys::stat::umask(old);
    let listener = bound?;
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                if let Some(uid) = peer_refused(&conn, None) {
                    crate::warn_limited!("control: a connection from uid {uid} refused");
                    continue;
                }
                if live.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                    live.fetch_sub(1, Ordering::AcqRel);
                    crate::warn_limited!("control: {MAX_CONNECTIONS} connections already open; one refused");
                    let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
                    let e = json!({"ok": false, "error": format!("the daemon already serves {MAX_CONNECTIONS} control connections; try again")});
                    let _ = writeln!(conn, "{e}");
                    continue;
                }
                let d = daemon.clone();
                let count = live.clone();
                let spawned = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        d.serve_conn(conn);
                        count.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    live.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
    Ok(path)
}

/// A connection to a running daemon.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    store: PathBuf,
}

impl Client {
    /// Connects to the daemon of `store`, if the peer on its socket is one this user may
    /// believe: this user, root, or (run as root) the store file's owner. Another user who
    /// could bind a socket at that path (a directory of theirs on the way) is refused.
    pub fn connect(store: &Path) -> std::io::Result<Client> {
        let path = socket_path(store);
        let s = UnixStream::connect(&path)?;
        let owner = if nix::unistd::geteuid().is_root() {
            std::fs::metadata(store)
                .ok()
                .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        } else {
            None
        };
        if let Some(uid) = peer_refused(&s, owner) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "the control socket {} is served by uid {uid}, not by this user, root or \
                     the store's owner: not talking to it",
                    path.display()
                ),
            ));
        }
        Client::over(s, store, CLIENT_WAITS)
    }

    /// A client on a connected socket, waiting at most `waits` for each line.
    fn over(s: UnixStream, store: &Path, waits: Duration) -> std::io::Result<Client> {
        s.set_read_timeout(Some(waits))?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
            store: store.to_path_buf(),
        })
    }

    /// Sends one request and returns the response, or the daemon's error message. The
    /// daemon says it is still working every `KEEPALIVE`, so however long the request takes,
    /// only a daemon silent for `CLIENT_WAITS` fails it.
    pub fn call(&mut self, req: &Value) -> Result<Value, String> {
        let mut req = req.clone();
        req["keepalive"] = json!(true);
        self.send(&req)?;
        let line = loop {
            let line = self.answer_line().map_err(|e| unanswered(&req, e))?;
            if line != KEEPALIVE_LINE {
                break line;
            }
        };
        let v: Value = serde_json::from_slice(&line).map_err(|e| format!("bad response: {e}"))?;
        if v.get("ok").and_then(Value::as_bool) == Some(true) {
            Ok(v)
        } else {
            Err(refusal(v.get("error").and_then(Value::as_str)))
        }
    }

    /// `log`: hands `on_page` each page, newest records first, until the log ends, `q`'s
    /// limit is reached or `on_page` returns false. Pages stream on one request; a daemon
    /// that answers one page at a time is asked for each next page. The daemon drops a
    /// client that takes no answer for `IDLE` (`redbfs log | less`, left open): the log then
    /// goes on from the last page it received, on a new connection.
    pub fn log(
        &mut self,
        q: &tools::LogQuery,
        on_page: &mut dyn FnMut(&tools::LogPage) -> Result<bool, String>,
    ) -> Result<(), String> {
        // What is left to read: from the last page's cursor, with the records still wanted.
        let mut rest = q.clone();
        self.send(&log_request(&rest, true)?)?;
        let mut resumed = false;
        loop {
            let line = match self.answer_line() {
                Ok(line) => line,
                Err(_) if !resumed && rest.cursor.is_some() => {
                    *self =
                        Client::connect(&self.store).map_err(|e| format!("control socket: {e}"))?;
                    self.send(&log_request(&rest, true)?)?;
                    resumed = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let a: LogAnswer =
                serde_json::from_slice(&line).map_err(|e| format!("bad response: {e}"))?;
            if !a.ok {
                return Err(refusal(a.error.as_deref()));
            }
            let page = tools::LogPage {
                records: a.records,
                cursor: a.cursor,
                since_ns: a.since_ns,
                last_seq: a.last_seq,
            };
            resumed = false;
            let left = rest
                .limit
                .map(|l| l.saturating_sub(page.records.len() as u64));
            if !on_page(&page)? || page.cursor.is_none() || left == Some(0) {
                return Ok(());
            }
            rest = tools::LogQuery {
                limit: left,
                ..rest.after(&page, 0)
            };
            if !a.streamed {
                let page_size = left.unwrap_or(u64::MAX).min(tools::LOG_PAGE_MAX);
                let next = tools::LogQuery {
                    limit: Some(page_size),
                    ..rest.clone()
                };
                self.send(&log_request(&next, false)?)?;
            }
        }
    }

    /// `cat` or `show` (`req`, asked for as a stream): hands the file's bytes to `piece` as
    /// they arrive. A thread of its own reads the socket as fast as the daemon sends, whatever
    /// `piece` is doing (writing to a pager that waits for its reader), so this process's
    /// output never holds the daemon's read transaction open; what `piece` has not taken yet
    /// waits here, in this process's memory. Err when the daemon refuses, when reading failed
    /// on the way, or when the stream ends before its end line: what `piece` was given is
    /// then not the whole file, and the message says so.
    pub fn content(
        mut self,
        req: &Value,
        piece: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut req = req.clone();
        req["stream"] = json!(true);
        self.send(&req)?;
        let line = self.answer_line()?;
        let v: Value = serde_json::from_slice(&line).map_err(|e| format!("bad response: {e}"))?;
        if v.get("ok").and_then(Value::as_bool) != Some(true) {
            return Err(refusal(v.get("error").and_then(Value::as_str)));
        }
        if v.get("streamed").and_then(Value::as_bool) != Some(true) {
            // A daemon of an earlier release: the whole content in this one line.
            return piece(&tools::content_of(&v));
        }
        let size = v
            .get("size")
            .and_then(Value::as_u64)
            .ok_or("bad response: a content stream without its size")?;
        let mut reader = self.reader;
        let (tx, rx) = std::sync::mpsc::channel::<Result<Option<Vec<u8>>, String>>();
        std::thread::Builder::new()
            .name("content".into())
            .spawn(move || {
                let mut pass = |p: Vec<u8>| tx.send(Ok(Some(p))).map_err(|e| e.to_string());
                let ended = read_pieces(&mut reader, size, &mut pass);
                let _ = tx.send(ended.map(|()| None));
            })
            .map_err(|e| format!("a thread to read the content: {e}"))?;
        for received in rx {
            match received? {
                Some(p) => piece(&p)?,
                None => return Ok(()),
            }
        }
        Err("the thread reading the content stopped before its end".into())
    }

    /// `ls`, `tree` or `unused` (`req`, asked for as a stream): hands `item` each entry of
    /// the listing as it arrives, a page at a time, each as its one-line answer's array held
    /// it. A daemon of an earlier release answers in one line, handed on the same way. As
    /// `content` does, a thread of its own reads the socket as fast as the daemon sends, so
    /// an output that waits (a pager left open) never holds the daemon's read transaction;
    /// what `item` has not taken yet waits in this process's memory. Err when the daemon
    /// refuses, when the walk failed on the way, or when the stream ends before its end
    /// line: what `item` was given is then not the whole listing, and the message says so.
    pub fn listing(
        mut self,
        req: &Value,
        item: &mut dyn FnMut(Value) -> Result<(), String>,
    ) -> Result<(), String> {
        let key = tools::listing_key(req).ok_or("not a listing")?;
        let mut req = req.clone();
        req["stream"] = json!(true);
        self.send(&req)?;
        let mut reader = self.reader;
        let (tx, rx) = std::sync::mpsc::channel::<Result<Option<Value>, String>>();
        std::thread::Builder::new()
            .name("listing".into())
            .spawn(move || {
                let mut pass = |e: Value| tx.send(Ok(Some(e))).map_err(|e| e.to_string());
                let ended = read_listing(&mut reader, key, &mut pass);
                let _ = tx.send(ended.map(|()| None));
            })
            .map_err(|e| format!("a thread to read the listing: {e}"))?;
        for received in rx {
            match received? {
                Some(e) => item(e)?,
                None => return Ok(()),
            }
        }
        Err("the thread reading the listing stopped before its end".into())
    }

    fn send(&mut self, req: &Value) -> Result<(), String> {
        let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.writer
            .write_all(&line)
            .map_err(|e| format!("control socket: {e}"))
    }

    /// The next answer line (without its newline).
    fn answer_line(&mut self) -> Result<Vec<u8>, String> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                let waited = self
                    .writer
                    .read_timeout()
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                format!(
                    "control socket: the daemon said nothing for {:.1} s",
                    waited.as_secs_f64()
                )
            } else {
                format!("control socket: {e}")
            }
        })?;
        if line.pop() != Some(b'\n') {
            return Err("the daemon closed the control socket".into());
        }
        Ok(line)
    }
}

/// What a request without an answer says: a change may still be made by the daemon.
fn unanswered(req: &Value, e: String) -> String {
    let op = req.get("op").and_then(Value::as_str).unwrap_or("request");
    if matches!(
        op,
        "status" | "ls" | "cat" | "tree" | "du" | "stats" | "quotas" | "unused"
    ) {
        return e;
    }
    format!(
        "{e}: no answer to `{op}`; whether the daemon made it is not known: see `redbfs status` \
         and `redbfs log`"
    )
}

/// A `log` request for what `q` asks, streamed or one page.
fn log_request(q: &tools::LogQuery, stream: bool) -> Result<Value, String> {
    let mut req = serde_json::to_value(q).map_err(|e| e.to_string())?;
    req["op"] = json!("log");
    if stream {
        req["stream"] = json!(true);
    }
    Ok(req)
}

/// An answer to `log`, as the client reads it: a page, or a refusal.
#[derive(serde::Deserialize)]
struct LogAnswer {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    streamed: bool,
    #[serde(default)]
    records: Vec<crate::store::HistoryRecord>,
    #[serde(default)]
    cursor: Option<crate::store::LogCursor>,
    #[serde(default)]
    since_ns: Option<i64>,
    #[serde(default)]
    last_seq: u64,
}

/// The largest piece of a content stream a client takes (a daemon sends one chunk, 64 KiB).
const PIECE_MAX: u64 = 16 * 1024 * 1024;

/// One line of a content stream after its header: a piece's length, its end, or an error.
#[derive(serde::Deserialize)]
struct StreamLine {
    #[serde(default)]
    ok: Option<bool>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    piece: Option<u64>,
    #[serde(default)]
    end: bool,
}

/// Reads a content stream after its header line, handing each piece to `piece`, until its end
/// line. Err when the daemon reports an error, when the pieces do not add up to `size`, or
/// when the stream ends before its end line (cut short: the daemon went away, or dropped this
/// client): never a partial file taken for a whole one.
fn read_pieces(
    r: &mut impl BufRead,
    size: u64,
    piece: &mut dyn FnMut(Vec<u8>) -> Result<(), String>,
) -> Result<(), String> {
    let mut got = 0u64;
    loop {
        let line = stream_line(r).map_err(|e| not_whole(&e, got, size))?;
        let l: StreamLine =
            serde_json::from_slice(&line).map_err(|e| format!("bad response: {e}"))?;
        match (l.piece, l.ok, l.end) {
            (Some(len), ..) if len <= size - got && len <= PIECE_MAX => {
                let mut bytes = vec![0u8; len as usize];
                r.read_exact(&mut bytes)
                    .map_err(|e| not_whole(&format!("control socket: {e}"), got, size))?;
                got += len;
                piece(bytes)?;
            }
            (Some(len), ..) => {
                return Err(format!(
                    "bad response: a piece of {len} bytes after {got} of a file of {size}"
                ));
            }
            (None, Some(true), true) if got == size => return Ok(()),
            (None, Some(true), true) => {
                return Err(format!(
                    "bad response: the content stream ended after {got} of {size} bytes"
                ));
            }
            (None, Some(false), _) if got == 0 => return Err(refusal(l.error.as_deref())),
            (None, Some(false), _) => {
                return Err(not_whole(&refusal(l.error.as_deref()), got, size));
            }
            _ => return Err("bad response: a line of a content stream not understood".into()),
        }
    }
}

/// The next line of a content stream, without its newline; Err (why) when the stream ends or
/// fails first.
fn stream_line(r: &mut impl BufRead) -> Result<Vec<u8>, String> {
    let mut line = Vec::new();
    r.by_ref()
        .take(MAX_LINE as u64)
        .read_until(b'\n', &mut line)
        .map_err(|e| e.to_string())?;
    if line.pop() != Some(b'\n') {
        return Err("the daemon closed the control socket".into());
    }
    Ok(line)
}

/// Reads a listing's answer: its pages, each handed to `item` an entry at a time, until its
/// end line; or (a daemon of an earlier release) the whole listing in one line. Err when the
/// daemon refuses or reports an error, or when the stream ends before its end line (cut
/// short: the daemon went away, or dropped this client): never a partial listing taken for a
/// whole one.
fn read_listing(
    r: &mut impl BufRead,
    key: &str,
    item: &mut dyn FnMut(Value) -> Result<(), String>,
) -> Result<(), String> {
    let mut given = 0u64;
    let mut first = true;
    loop {
        // The first line of an earlier daemon holds the whole listing; a page is bounded.
        let line = if first {
            let mut line = Vec::new();
            r.read_until(b'\n', &mut line)
                .map_err(|e| format!("control socket: {e}"))?;
            if line.pop() != Some(b'\n') {
                return Err(not_listed("the daemon closed the control socket", given));
            }
            line
        } else {
            stream_line(r).map_err(|e| not_listed(&e, given))?
        };
        let mut v: Value =
            serde_json::from_slice(&line).map_err(|e| format!("bad response: {e}"))?;
        match v.get("ok").and_then(Value::as_bool) {
            Some(true) => {}
            _ if given == 0 => return Err(refusal(v.get("error").and_then(Value::as_str))),
            _ => {
                return Err(not_listed(
                    &refusal(v.get("error").and_then(Value::as_str)),
                    given,
                ));
            }
        }
        if v.get("end").and_then(Value::as_bool) == Some(true) {
            return Ok(());
        }
        let streamed = v.get("streamed").and_then(Value::as_bool) == Some(true);
        let Some(Value::Array(entries)) = v.get_mut(key).map(Value::take) else {
            return Err("bad response: a line of a listing not understood".into());
        };
        for e in entries {
            item(e)?;
            given += 1;
        }
        if first && !streamed {
            return Ok(());
        }
        first = false;
    }
}

/// What a listing that stopped after `given` entries says: `why`, and that what was listed
/// is not the whole listing.
pub fn not_listed(why: &str, given: u64) -> String {
    format!("{why}, after {given} entries: what was listed is not the whole listing")
}

/// What a read of a file's content that stopped after `got` of its `size` bytes says: `why`,
/// and that what was written is not the whole file.
pub fn not_whole(why: &str, got: u64, size: u64) -> String {
    format!("{why}, after {got} of the file's {size} bytes: what was written is not the whole file")
}

fn refusal(error: Option<&str>) -> String {
    error
        .unwrap_or("the daemon refused the request")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request whose work outlasts what the client waits for a line is answered, not
    /// failed: the daemon's keepalives come more often than the client's wait. Without them
    /// (`every` longer than the work) the same client gives up, saying so.
    #[test]
    fn a_request_longer_than_the_client_waits_is_answered_through_keepalives() {
        let outcome = |every: Duration| {
            let (daemon_end, client_end) = UnixStream::pair().unwrap();
            let daemon = std::thread::spawn(move || {
                let mut line = String::new();
                BufReader::new(daemon_end.try_clone().unwrap())
                    .read_line(&mut line)
                    .unwrap();
                let req: Value = serde_json::from_str(&line).unwrap();
                assert_eq!(
                    req["keepalive"],
                    json!(true),
                    "the client asks for keepalives"
                );
                let mut out = daemon_end;
                let _ = answer_with_keepalives(&mut out, every, || {
                    std::thread::sleep(Duration::from_millis(600));
                    json!({"ok": true, "done": req["op"]})
                });
            });
            let waits = Duration::from_millis(200);
            let mut c = Client::over(client_end, Path::new("s.redb"), waits).unwrap();
            let got = c.call(&json!({"op": "snapshot", "out": "x"}));
            daemon.join().unwrap();
            got
        };
        let answered = outcome(Duration::from_millis(50)).unwrap();
        assert_eq!(answered["done"], json!("snapshot"));
        let e = outcome(Duration::from_secs(5)).unwrap_err();
        assert!(
            e.contains("said nothing for 0.2 s") && e.contains("whether the daemon made it"),
            "{e}"
        );
    }

    /// A request that did not ask for keepalives gets none: a client of an older version
    /// reads its answer as the first line.
    #[test]
    fn keepalives_come_while_working_and_only_when_asked() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut out = a;
        answer_with_keepalives(&mut out, Duration::from_millis(10), || {
            std::thread::sleep(Duration::from_millis(100));
            json!({"ok": true})
        })
        .unwrap();
        drop(out);
        let mut lines = String::new();
        BufReader::new(b).read_to_string(&mut lines).unwrap();
        let n = lines
            .lines()
            .filter(|l| l.as_bytes() == KEEPALIVE_LINE)
            .count();
        assert!(n >= 2, "keepalives while working: {lines}");
        assert_eq!(lines.lines().last(), Some(r#"{"ok":true}"#));
        assert!(!wants_keepalive(&json!({"op": "status"})));
        assert!(wants_keepalive(&json!({"op": "status", "keepalive": true})));
    }

    /// `content` as a daemon streams it after the header line, `per` bytes a piece.
    fn framed(content: &[u8], per: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in content.chunks(per) {
            out.extend_from_slice(format!("{{\"piece\":{}}}\n", piece.len()).as_bytes());
            out.extend_from_slice(piece);
        }
        out.extend_from_slice(b"{\"ok\":true,\"end\":true}\n");
        out
    }

    /// What a client reading `stream` for a file of `size` bytes hands on, and its outcome.
    fn read(stream: &[u8], size: u64) -> (Vec<u8>, Result<(), String>) {
        let mut given = Vec::new();
        let outcome = read_pieces(&mut &stream[..], size, &mut |p| {
            given.extend_from_slice(&p);
            Ok(())
        });
        (given, outcome)
    }

    #[test]
    fn a_whole_stream_gives_the_whole_file() {
        let content = b"0123456789abcdef\n\xff";
        let (given, outcome) = read(&framed(content, 4), content.len() as u64);
        assert_eq!(outcome, Ok(()));
        assert_eq!(given, content);
        let (given, outcome) = read(&framed(b"", 4), 0);
        assert_eq!((given, outcome), (Vec::new(), Ok(())));
    }

    /// A stream cut at any byte before the end of its end line (the daemon killed, or this
    /// client dropped) fails, having handed on a prefix of the file: never a partial file
    /// taken for a whole one.
    #[test]
    fn a_stream_cut_anywhere_before_its_end_line_fails() {
        let content = b"0123456789";
        let stream = framed(content, 4);
        for cut in 0..stream.len() {
            let (given, outcome) = read(&stream[..cut], content.len() as u64);
            let e = outcome.expect_err(&format!("cut at {cut}"));
            assert!(e.contains("not the whole file"), "cut at {cut}: {e}");
            assert!(content.starts_with(&given), "cut at {cut}");
        }
    }

    #[test]
    fn an_error_on_the_way_fails_saying_the_output_is_not_whole() {
        let mut stream = b"{\"piece\":3}\nabc".to_vec();
        stream.extend_from_slice(b"{\"ok\":false,\"error\":\"/f: chunk 1 is damaged\"}\n");
        let (given, outcome) = read(&stream, 6);
        assert_eq!(given, b"abc");
        assert_eq!(
            outcome,
            Err(
                "/f: chunk 1 is damaged, after 3 of the file's 6 bytes: what was written is \
                 not the whole file"
                    .into()
            )
        );
    }

    /// A listing as a daemon streams it: `entries` in pages of `per`, then its end line.
    fn paged(entries: &[&str], per: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for page in entries.chunks(per) {
            let page = json!({"ok": true, "streamed": true, "entries": page});
            out.extend_from_slice(format!("{page}\n").as_bytes());
        }
        out.extend_from_slice(b"{\"ok\":true,\"end\":true}\n");
        out
    }

    /// What a client reading the listing `stream` hands on, and its outcome.
    fn listed(stream: &[u8]) -> (Vec<Value>, Result<(), String>) {
        let mut given = Vec::new();
        let outcome = read_listing(&mut &stream[..], "entries", &mut |e| {
            given.push(e);
            Ok(())
        });
        (given, outcome)
    }

    #[test]
    fn a_whole_listing_stream_gives_every_entry() {
        let names = ["a", "b", "c", "d", "e"];
        let (given, outcome) = listed(&paged(&names, 2));
        assert_eq!(outcome, Ok(()));
        assert_eq!(given, names.map(|n| json!(n)));
        assert_eq!(listed(&paged(&[], 2)), (Vec::new(), Ok(())));
        // A daemon of an earlier release: the whole listing in one line.
        let (given, outcome) = listed(b"{\"entries\":[\"a\",\"b\"],\"ok\":true}\n");
        assert_eq!((given, outcome), (vec![json!("a"), json!("b")], Ok(())));
    }

    /// A listing stream cut at any byte before the end of its end line fails, having handed
    /// on a prefix of the listing: never a partial listing taken for a whole one.
    #[test]
    fn a_listing_stream_cut_anywhere_before_its_end_line_fails() {
        let names = ["a", "b", "c", "d", "e"];
        let stream = paged(&names, 2);
        for cut in 0..stream.len() {
            let (given, outcome) = listed(&stream[..cut]);
            let e = outcome.expect_err(&format!("cut at {cut}"));
            assert!(
                e.contains("not the whole listing") || e.starts_with("bad response"),
                "cut at {cut}: {e}"
            );
            assert!(names.map(|n| json!(n)).starts_with(&given), "cut at {cut}");
        }
        // Cut at a line's end: the daemon closed the socket after whole pages.
        let last_page = stream.len() - b"{\"ok\":true,\"end\":true}\n".len();
        let (given, outcome) = listed(&stream[..last_page]);
        assert_eq!(given.len(), 5);
        assert_eq!(
            outcome,
            Err(
                "the daemon closed the control socket, after 5 entries: what was listed is \
                 not the whole listing"
                    .into()
            )
        );
    }

    #[test]
    fn an_error_in_a_listing_fails_saying_it_is_not_whole() {
        let mut stream = paged(&["a", "b"], 2);
        stream.truncate(stream.len() - b"{\"ok\":true,\"end\":true}\n".len());
        stream.extend_from_slice(b"{\"ok\":false,\"error\":\"missing inode 9\"}\n");
        let (given, outcome) = listed(&stream);
        assert_eq!(given.len(), 2);
        assert_eq!(
            outcome,
            Err(
                "missing inode 9, after 2 entries: what was listed is not the whole listing".into()
            )
        );
        let refused = listed(b"{\"ok\":false,\"error\":\"/x: no such file\"}\n");
        assert_eq!(refused, (Vec::new(), Err("/x: no such file".into())));
    }

    #[test]
    fn pieces_that_do_not_add_up_to_the_size_fail() {
        // More than the header said, and an end before all of it.
        assert!(read(&framed(b"abcdef", 4), 5).1.is_err());
        assert!(read(&framed(b"abcdef", 4), 7).1.is_err());
        // A length no daemon sends is refused before anything is allocated for it.
        let (given, outcome) = read(b"{\"piece\":18446744073709551615}\n", u64::MAX);
        assert!(given.is_empty() && outcome.is_err());
    }
}
